"""The broker's ACLs refusing the member, named per resource and operation.

Before the member's first assignment a refusal of its group or topic is its start failing
(`AuthorizationError`); after it, a refused fetch or commit is a `kafka_authorization_failed`
error and the member is not ready until the refusal ends. Driven here with a FakeConsumer;
the real broker's refusals are in tests/integration/test_security_authorization.py.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError
from tests.fake_members import FAKE_LOOP
from tests.waiting import wait_until

from weir import AuthorizationError, ConsumerConfig, GroupConsumer
from weir._engine.client_errors import ClientErrors
from weir._engine.lifecycle import Lifecycle
from weir._engine.refusals import Denied, denied_of
from weir.config import ConsumerSettings
from weir.logs import Repeats
from weir.testing.fake import FakeConsumer

pytestmark = pytest.mark.timeout(30)

WAIT = 10.0
GROUP_REFUSED = KafkaError(
    KafkaError.GROUP_AUTHORIZATION_FAILED, "JoinGroup failed: Broker: Group authorization failed"
)
FETCH_REFUSED = KafkaError(
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    "Fetch from broker 1 failed: Broker: Topic authorization failed",
)


def member(fake: FakeConsumer) -> GroupConsumer:
    # Commits 0.2 s apart: a refusal lasts long enough to be seen.
    settings: ConsumerSettings = {**FAKE_LOOP, "commit_interval_s": 0.2}
    return GroupConsumer(lambda record: None, consumer_factory=fake.factory, **settings)


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    return [
        dict(r.msg)
        for r in caplog.records
        if isinstance(r.msg, dict) and dict(r.msg).get("event") == name
    ]


def test_a_denial_names_the_operation_and_the_resource() -> None:
    assert str(denied_of("GROUP_AUTHORIZATION_FAILED", "READ", group="g")) == "READ on group 'g'"
    topic = denied_of("TOPIC_AUTHORIZATION_FAILED", "WRITE", topic="out")
    assert topic == Denied("topic", "out", "WRITE", "TOPIC_AUTHORIZATION_FAILED")
    assert str(topic) == "WRITE on topic 'out'"
    tid = denied_of("TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "READ", transactional_id="tx")
    assert str(tid) == "WRITE on transactional id 'tx'"
    cluster = denied_of("CLUSTER_AUTHORIZATION_FAILED", "WRITE")
    assert str(cluster) == "IDEMPOTENT_WRITE on the cluster"
    assert denied_of("REQUEST_TIMED_OUT", "READ", group="g") is None


def test_a_group_refused_before_the_first_assignment_fails_the_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Regression: the member warned `consume_error code=GROUP_AUTHORIZATION_FAILED` and ran
    on, never assigned and never ready, with nothing saying which ACL was missing."""
    caplog.set_level(logging.ERROR, logger="weir")
    fake = FakeConsumer()
    fake.inject_error(GROUP_REFUSED)
    gc = member(fake)
    gc.start()
    with pytest.raises(AuthorizationError) as raised:
        gc.join(WAIT)
    error = raised.value
    assert str(error) == (
        "authorization failed: the broker's ACLs do not allow this client READ on group 'g' "
        "(GROUP_AUTHORIZATION_FAILED: JoinGroup failed: Broker: Group authorization failed): a "
        "member needs DESCRIBE and READ on its topics and READ on its group 'g'"
    )
    assert (error.resource_type, error.resources, error.operation) == ("group", ("g",), "READ")
    assert not gc.health().live
    [logged] = events(caplog, "kafka_authorization_failed")
    assert logged["resource"] == "g" and logged["operation"] == "READ" and not logged["running"]


def test_a_commit_refused_while_running_makes_the_member_not_ready_until_one_passes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Regression: a commit the group's ACLs refused was a `commit_failed` warning at every
    commit turn, and the member stayed ready."""
    caplog.set_level(logging.INFO, logger="weir")
    fake = FakeConsumer()
    fake.produce("t", 0, b"v")
    fake.script_assign([("t", 0)])
    refused = KafkaError(
        KafkaError.GROUP_AUTHORIZATION_FAILED, "Broker: Group authorization failed"
    )
    fake.fail_next_commits(refused, count=3)
    gc = member(fake)
    gc.start()
    try:
        wait_until(lambda: "READ on group 'g'" in gc.health().refused, "the refusal seen", WAIT)
        health = gc.health()
        assert health.live and not health.ready
        assert any(
            r.startswith("the broker's ACLs refuse READ on group 'g' (GROUP_AUTHORIZATION_FAILED)")
            for r in health.reasons
        ), health.reasons
        assert fake.committed == {}  # nothing committed while refused
        fake.produce("t", 0, b"w")  # a new watermark: the next commit passes
        wait_until(lambda: gc.health().ready, "ready again once a commit passed", WAIT)
    finally:
        gc.stop()
        gc.join(WAIT)
    [failed] = events(caplog, "kafka_authorization_failed")
    assert (failed["resource_type"], failed["operation"], failed["running"]) == (
        "group",
        "READ",
        True,
    )
    [allowed] = events(caplog, "kafka_authorization_allowed")
    assert allowed["resource"] == "g" and allowed["refused_s"] >= 0


def test_a_fetch_refused_while_running_is_named_until_a_record_comes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="weir")
    fake = FakeConsumer()
    fake.script_assign([("t", 0)])
    gc = member(fake)
    gc.start()
    try:
        # Ready, and the start's commit made (a commit of the topic ends a refusal to read it).
        wait_until(lambda: gc.health().ready and len(fake.committed) == 1, "started", WAIT)
        fake.inject_error(FETCH_REFUSED, "t", 0)
        wait_until(lambda: gc.health().refused == ("READ on topic 't'",), "refused", WAIT)
        assert not gc.health().ready and gc.health().live
        fake.produce("t", 0, b"v")
        wait_until(lambda: gc.health().ready, "ready once a record was fetched", WAIT)
    finally:
        gc.stop()
        gc.join(WAIT)
    assert [e["resource"] for e in events(caplog, "kafka_authorization_failed")] == ["t"]
    assert not events(caplog, "consume_error")


def test_a_refusal_is_one_whatever_code_says_it_and_ends_unlogged_when_nothing_asks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A dead letter refused for want of a producer id (CLUSTER_AUTHORIZATION_FAILED), then,
    with WRITE granted elsewhere, by its topic's ACL (TOPIC_AUTHORIZATION_FAILED), is one
    refusal (each cause logged once): no "allowed" between the two. The records it held
    revoked, it ends unlogged."""
    caplog.set_level(logging.INFO, logger="weir")
    life = Lifecycle()
    errors = ClientErrors(ConsumerConfig(**FAKE_LOOP), life, Repeats())
    write = Denied("topic", "t.dlq", "WRITE", "CLUSTER_AUTHORIZATION_FAILED")
    errors.refused(write, "refused a producer id")
    errors.refused(Denied("topic", "t.dlq", "WRITE", "TOPIC_AUTHORIZATION_FAILED"), "refused")
    assert list(life.refusals) == [write]
    errors.allowed(lambda d: d == write, asked=False)
    assert not life.refusals
    codes = [e["code"] for e in events(caplog, "kafka_authorization_failed")]
    assert codes == ["CLUSTER_AUTHORIZATION_FAILED", "TOPIC_AUTHORIZATION_FAILED"]
    assert events(caplog, "kafka_authorization_allowed") == []
