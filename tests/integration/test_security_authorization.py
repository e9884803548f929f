"""The broker's ACLs refusing a member, on the secured broker: each refusal is one error or event
that names the operation and the resource, nothing is lost, and nothing is committed past
unfinished work.

Each test logs in as a principal of its own (OAUTHBEARER with unsecured tokens: any principal),
so that no ACL another test granted changes what the broker refuses it: an idempotent producer,
for one, gets its producer id from WRITE on any topic at all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from confluent_kafka.admin import AdminClient

from tests.integration.secured import Forward, cli, member
from tests.waiting import wait_until
from weir import (
    AuthorizationError,
    FailurePolicy,
    NonRetryable,
    Record,
    RetryPolicy,
    TransactionError,
)
from weir.testing.broker import EmbeddedKafka
from weir.testing.pytest_plugin import (
    allow,
    commit_offsets,
    consume_all,
    create_topic,
    produce,
    records_as_text,
    revoke,
    wait_for_committed,
)
from weir.testing.security import ClientSettings

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

# A refusal at start is named as soon as the broker answers: well within this.
NAMED_WITHIN_S = 5.0
WAIT_S = 30.0


@pytest.fixture
def topic(kafka_secure_broker: EmbeddedKafka) -> str:
    return create_topic(kafka_secure_broker.internal_bootstrap_servers, partitions=1)


def counting() -> tuple[list[str], Callable[[Record], None]]:
    seen: list[str] = []
    lock = threading.Lock()

    def handle(record: Record) -> None:
        with lock:
            seen.append(record.value.decode())  # type: ignore[union-attr]

    return seen, handle


def committed(admin: AdminClient, group: str, topic: str) -> int | None:
    return wait_for_committed(admin, group, topic, {0: 0}, timeout=10)[0]


def test_a_group_the_acls_refuse_fails_the_start(
    kafka_secure_admin: AdminClient, who: ClientSettings, principal: str, topic: str, group: str
) -> None:
    """Regression: the member warned `consume_error code=GROUP_AUTHORIZATION_FAILED` and ran
    on, never assigned, never ready, naming no ACL."""
    allow(kafka_secure_admin, principal, topics=[topic])
    gc = member(who, lambda record: None, group_id=group, topics=[topic])
    began = time.monotonic()
    with pytest.raises(AuthorizationError) as raised:
        gc.run()
    assert time.monotonic() - began < NAMED_WITHIN_S
    text = str(raised.value)
    assert text.startswith(
        f"authorization failed: the broker's ACLs do not allow this client READ on group "
        f"{group!r} (GROUP_AUTHORIZATION_FAILED: "
    ), text
    assert text.endswith(
        f"): a member needs DESCRIBE and READ on its topics and READ on its group {group!r}"
    ), text
    assert raised.value.operation == "READ" and raised.value.resources == (group,)
    assert not gc.health().live


def test_refusals_while_running_are_named_and_the_member_is_not_ready_until_they_end(
    kafka_secure_admin: AdminClient,
    kafka_secure_client: ClientSettings,
    who: ClientSettings,
    principal: str,
    topic: str,
    group: str,
) -> None:
    """READ on the topic, then on the group, taken back while the member runs: it names each,
    is not ready meanwhile, commits nothing past what it handled, and goes on at once when
    they are granted again (no restart). Regression: it stayed ready throughout; a refused
    fetch was one `consume_error` warning, a refused commit a `commit_failed` warning at every
    commit turn."""
    admin, boot = kafka_secure_admin, kafka_secure_client.bootstrap_servers
    conf = kafka_secure_client.config()
    allow(admin, principal, topics=[topic], groups=[group])
    produce(boot, topic, [(None, f"a{i}") for i in range(3)], config=conf)
    seen, handle = counting()
    gc = member(who, handle, group_id=group, topics=[topic], commit_interval_s=0.2)
    gc.start()
    try:
        wait_for_committed(admin, group, topic, {0: 3}, timeout=WAIT_S)
        assert gc.health().ready

        revoke(admin, principal, topics=[topic], operations=["READ"])
        produce(boot, topic, [(None, f"b{i}") for i in range(3)], config=conf)
        refused = (f"READ on topic {topic!r}",)
        wait_until(lambda: gc.health().refused == refused, "the fetch refused", WAIT_S)
        health = gc.health()
        assert health.live and not health.ready
        assert health.reasons[0].startswith(
            f"the broker's ACLs refuse READ on topic {topic!r} (TOPIC_AUTHORIZATION_FAILED) for "
        ), health.reasons
        allow(admin, principal, topics=[topic], operations=["READ"])
        wait_for_committed(admin, group, topic, {0: 6}, timeout=WAIT_S)
        wait_until(lambda: gc.health().ready, "ready again", WAIT_S)

        revoke(admin, principal, groups=[group], operations=["READ"])
        produce(boot, topic, [(None, f"c{i}") for i in range(3)], config=conf)
        refused = (f"READ on group {group!r}",)
        wait_until(lambda: gc.health().refused == refused, "the commit refused", WAIT_S)
        assert len(seen) == 9  # handled, not committed
        assert committed(admin, group, topic) == 6
        allow(admin, principal, groups=[group], operations=["READ"])
        wait_for_committed(admin, group, topic, {0: 9}, timeout=WAIT_S)
        wait_until(lambda: gc.health().ready, "ready again", WAIT_S)
    finally:
        gc.stop()
        gc.join(30)
    assert sorted(seen) == sorted(f"{x}{i}" for x in "abc" for i in range(3))


def failing_on_bad(record: Record) -> None:
    if record.value == b"bad":
        raise NonRetryable("bad record")


@pytest.mark.parametrize(
    "writes_elsewhere", [False, True], ids=["no-write-acl", "write-acl-elsewhere"]
)
def test_a_refused_dead_letter_blocks_its_partition_until_the_acl_is_granted(
    kafka_secure_broker: EmbeddedKafka,
    kafka_secure_admin: AdminClient,
    kafka_secure_client: ClientSettings,
    who: ClientSettings,
    principal: str,
    topic: str,
    group: str,
    writes_elsewhere: bool,
) -> None:
    """No WRITE on the dead-letter topic: the dead letter fails and blocks its partition as
    any failed dead letter does, named, never skipped; granted WRITE, the next try writes it
    (a new producer: the one refused a producer id failed for good). Without WRITE on any
    topic the broker refuses the idempotent producer an id (CLUSTER_AUTHORIZATION_FAILED, a
    fatal error): regression, that error escaped the producer's poll and stopped the member
    with a bare KafkaException."""
    admin = kafka_secure_admin
    dlq = create_topic(kafka_secure_broker.internal_bootstrap_servers, name=f"{topic}.dlq")
    allow(admin, principal, topics=[topic], groups=[group])
    allow(admin, principal, topics=[dlq], operations=["DESCRIBE"])
    if writes_elsewhere:
        allow(admin, principal, topics=[f"elsewhere-{principal}"], operations=["WRITE"])
    conf = kafka_secure_client.config()
    produce(
        kafka_secure_client.bootstrap_servers, topic, [("k", "bad"), ("k", "good")], config=conf
    )
    seen, handle = counting()

    def handler(record: Record) -> None:
        handle(record)
        failing_on_bad(record)

    policy = FailurePolicy(
        retry=RetryPolicy(max_attempts=1), final="dead_letter", block_retry_s=1.0
    )
    gc = member(
        who, handler, group_id=group, topics=[topic], failure=policy, ordering="partition",
        commit_interval_s=0.2,
    )  # fmt: skip
    gc.start()
    try:
        refused = (f"WRITE on topic {dlq!r}",)
        wait_until(lambda: gc.health().refused == refused, "the dead letter refused", WAIT_S)
        assert not gc.health().ready
        # The stats are a snapshot, published at every commit turn.
        wait_until(lambda: gc.stats().blocked, "the partition blocked", WAIT_S)
        assert [(p.topic, p.partition) for p in gc.stats().blocked] == [(topic, 0)]
        assert seen == ["bad"]  # the partition waits behind it: "good" has not run
        assert committed(admin, group, topic) in (None, 0)
        allow(admin, principal, topics=[dlq], operations=["WRITE"])
        wait_for_committed(admin, group, topic, {0: 2}, timeout=WAIT_S)
        wait_until(lambda: gc.health().ready, "ready once the dead letter is written", WAIT_S)
    finally:
        gc.stop()
        gc.join(30)
    letters = consume_all(kafka_secure_client.bootstrap_servers, dlq, expected=1, config=conf)
    assert records_as_text(letters) == [("k", "bad")]
    assert seen[-1] == "good"


@pytest.mark.slow  # 20 s or more: make integration
def test_a_dead_letter_topic_the_acls_hide_fails_the_start(
    kafka_secure_broker: EmbeddedKafka,
    kafka_secure_admin: AdminClient,
    who: ClientSettings,
    principal: str,
    topic: str,
    group: str,
) -> None:
    """Regression: "DeadLetterError: dead-letter topic '<t>.dlq' is missing and could not be
    created: ... TOPIC_AUTHORIZATION_FAILED" for a topic that exists."""
    dlq = create_topic(kafka_secure_broker.internal_bootstrap_servers, name=f"{topic}.dlq")
    allow(kafka_secure_admin, principal, topics=[topic], groups=[group])
    gc = member(
        who, failing_on_bad, group_id=group, topics=[topic],
        failure=FailurePolicy(final="dead_letter"),
    )  # fmt: skip
    with pytest.raises(AuthorizationError) as raised:
        gc.run()
    assert str(raised.value) == (
        f"authorization failed: the broker's ACLs do not allow this client DESCRIBE on topic "
        f"{dlq!r} (TOPIC_AUTHORIZATION_FAILED: the dead-letter topic of {topic!r}; Kafka says "
        "so also of a topic that does not exist, to a client that may not describe it): a "
        "member that dead-letters needs DESCRIBE and WRITE on its dead-letter topics (and "
        "CREATE, for weir to create a missing one)"
    )


def test_a_transactional_id_the_acls_refuse_fails_the_start(
    kafka_secure_admin: AdminClient, who: ClientSettings, principal: str, topic: str, group: str
) -> None:
    allow(kafka_secure_admin, principal, topics=[topic], groups=[group])
    tid = f"tx-{group}"
    gc = member(who, Forward("out"), group_id=group, topics=[topic], transactional_id=tid)
    with pytest.raises(TransactionError) as raised:
        gc.run()
    text = str(raised.value)
    assert text.startswith(
        "initialising transactions failed: the broker's ACLs do not allow this client WRITE on "
        f"transactional id {tid!r} (TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "
    ), text
    assert text.endswith(
        f"): an exactly-once member needs WRITE and DESCRIBE on its transactional_id {tid!r}, "
        "WRITE on its output topics and READ on its group"
    ), text


def test_an_output_the_acls_refuse_stops_an_exactly_once_member_with_nothing_committed(
    kafka_secure_broker: EmbeddedKafka,
    kafka_secure_admin: AdminClient,
    kafka_secure_client: ClientSettings,
    who: ClientSettings,
    principal: str,
    topic: str,
    group: str,
) -> None:
    """Regression: the transaction was aborted, the records replayed and the outputs refused
    again, five times a second for ever, with the member ready."""
    admin = kafka_secure_admin
    output = create_topic(kafka_secure_broker.internal_bootstrap_servers, partitions=1)
    tid = f"tx-{group}"
    allow(admin, principal, topics=[topic], groups=[group])
    allow(admin, principal, transactional_ids=[tid], operations=["WRITE", "DESCRIBE"])
    conf = kafka_secure_client.config()
    produce(kafka_secure_client.bootstrap_servers, topic, [("k", "v")], config=conf)
    gc = member(who, Forward(output), group_id=group, topics=[topic], transactional_id=tid)
    began = time.monotonic()
    with pytest.raises(TransactionError) as raised:
        gc.run()
    assert time.monotonic() - began < 15
    text = str(raised.value)
    assert text.startswith(
        f"writing an output failed: the broker's ACLs do not allow this client WRITE on topic "
        f"{output!r} (TOPIC_AUTHORIZATION_FAILED: "
    ), text
    assert raised.value.step == "writing an output" and not raised.value.fenced
    # At most the start's own commit of where the group begins: the record is not past it.
    assert committed(admin, group, topic) in (None, 0)
    got = consume_all(kafka_secure_client.bootstrap_servers, output, config=conf)
    assert got == []


def test_weir_lag_names_the_describe_acl_it_lacks(
    kafka_secure_admin: AdminClient,
    kafka_secure_client: ClientSettings,
    who: ClientSettings,
    principal: str,
    topic: str,
    group: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Regression: "weir: GROUP_AUTHORIZATION_FAILED: Broker: Group authorization failed
    (cluster ...)" and, for a topic it may not describe, "weir: topic '...' does not exist"."""
    conf = kafka_secure_client.config()
    produce(kafka_secure_client.bootstrap_servers, topic, [("k", "v"), ("k", "w")], config=conf)
    commit_offsets(kafka_secure_client.bootstrap_servers, group, topic, {0: 1}, config=conf)
    code, out, err = cli(capsys, who, "lag", "-g", group, "--timeout", "10")
    assert (code, out) == (1, ""), err
    assert err == (
        f"weir: authorization failed: the broker's ACLs do not allow this client DESCRIBE on "
        f"group {group!r} (GROUP_AUTHORIZATION_FAILED: Broker: Group authorization failed): "
        "reading a group's lag needs DESCRIBE on the group and on its topics\n"
    )
    allow(kafka_secure_admin, principal, groups=[group], operations=["DESCRIBE"])
    code, out, err = cli(capsys, who, "lag", "-g", group, "-t", topic, "--timeout", "10")
    assert (code, out) == (1, ""), err
    [line] = err.splitlines()
    assert line.startswith(
        f"weir: authorization failed: the broker's ACLs do not allow this client DESCRIBE on "
        f"topic {topic!r} (TOPIC_AUTHORIZATION_FAILED: "
    ), line
    allow(kafka_secure_admin, principal, topics=[topic], operations=["DESCRIBE"])
    code, out, err = cli(capsys, who, "lag", "-g", group, "-t", topic, "--json", "--timeout", "10")
    assert code == 0, err
    assert '"total_lag": 1' in out
