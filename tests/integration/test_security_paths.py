"""The member's paths over SASL_SSL with SCRAM-SHA-512 and client certificates (mTLS: the
session's secured broker requires them), as `alice`, held to ACLs: a rebalance between two
members, a dead letter, exactly-once. (Consuming and committing, and `weir lag`, are in
test_security_broker.py.)
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from confluent_kafka.admin import AdminClient

from tests.integration.secured import Forward, member
from tests.waiting import wait_until
from weir import FailurePolicy, NonRetryable, Record, RetryPolicy
from weir.testing.broker import EmbeddedKafka
from weir.testing.pytest_plugin import (
    SECURE_USER,
    allow,
    consume_all,
    create_topic,
    produce,
    records_as_text,
    wait_for_committed,
)
from weir.testing.security import ClientSettings

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

WAIT_S = 30.0


def new_topic(kafka: EmbeddedKafka, partitions: int = 1, name: str | None = None) -> str:
    return create_topic(kafka.internal_bootstrap_servers, name, partitions=partitions)


def test_two_members_hand_partitions_over_and_commit_everything(
    kafka_secure_broker: EmbeddedKafka,
    kafka_secure_admin: AdminClient,
    kafka_secure_client: ClientSettings,
    alice: ClientSettings,
    group: str,
) -> None:
    assert alice.mechanism == "SCRAM-SHA-512" and alice.cert_file is not None  # and mTLS
    topic = new_topic(kafka_secure_broker, partitions=4)
    allow(kafka_secure_admin, SECURE_USER, topics=[topic], groups=[group])
    conf = kafka_secure_client.config()
    handled: Counter[str] = Counter()
    by: dict[str, set[int]] = {"a": set(), "b": set()}
    lock = threading.Lock()

    def handler(name: str) -> object:
        def handle(record: Record) -> None:
            with lock:
                handled[record.value.decode()] += 1  # type: ignore[union-attr]
                by[name].add(record.partition)

        return handle

    def batch(prefix: str) -> list[tuple[str, str]]:
        return [(f"k{i}", f"{prefix}{i}") for i in range(40)]

    first, second = batch("a"), batch("b")
    produce(kafka_secure_client.bootstrap_servers, topic, first, config=conf)
    a = member(alice, handler("a"), group_id=group, topics=[topic], commit_interval_s=0.2)
    b = member(alice, handler("b"), group_id=group, topics=[topic], commit_interval_s=0.2)
    a.start()
    try:
        wait_until(lambda: len(handled) == len(first), "a handled the first batch", WAIT_S)
        b.start()
        # The group hands b a share: a revokes, commits and keeps the rest.
        wait_until(
            lambda: b.stats().partitions and len(a.stats().partitions) < 4,
            "partitions handed from a to b",
            WAIT_S,
        )
        produce(kafka_secure_client.bootstrap_servers, topic, second, config=conf)
        wait_for_committed(kafka_secure_admin, group, topic, timeout=WAIT_S)
        assert b.stats().rebalances >= 1 and a.stats().rebalances >= 2
    finally:
        a.stop()
        b.stop()
        a.join(30)
        b.join(30)
    assert set(handled) == {v for _, v in first + second}  # nothing lost
    assert by["b"], "b handled records"


def test_a_failed_record_is_dead_lettered_and_committed_past(
    kafka_secure_broker: EmbeddedKafka,
    kafka_secure_admin: AdminClient,
    kafka_secure_client: ClientSettings,
    alice: ClientSettings,
    group: str,
) -> None:
    topic = new_topic(kafka_secure_broker)
    dlq = new_topic(kafka_secure_broker, name=f"{topic}.dlq")
    allow(kafka_secure_admin, SECURE_USER, topics=[topic], groups=[group])
    allow(kafka_secure_admin, SECURE_USER, topics=[dlq], operations=["WRITE", "DESCRIBE"])
    conf = kafka_secure_client.config()
    records = [("k0", "ok"), ("k1", "bad"), ("k2", "ok")]
    produce(kafka_secure_client.bootstrap_servers, topic, records, config=conf)

    def handle(record: Record) -> None:
        if record.value == b"bad":
            raise NonRetryable("bad record")

    gc = member(
        alice, handle, group_id=group, topics=[topic],
        failure=FailurePolicy(retry=RetryPolicy(max_attempts=1), final="dead_letter"),
    )  # fmt: skip
    gc.start()
    try:
        wait_for_committed(kafka_secure_admin, group, topic, {0: 3}, timeout=WAIT_S)
    finally:
        gc.stop()
        gc.join(30)
    letters = consume_all(kafka_secure_client.bootstrap_servers, dlq, expected=1, config=conf)
    assert records_as_text(letters) == [("k1", "bad")]
    headers = dict(letters[0].headers)
    assert headers["weir.dlq.offset"] == b"1" and headers["weir.dlq.group"] == group.encode()


def test_exactly_once_commits_outputs_and_offsets_together(
    kafka_secure_broker: EmbeddedKafka,
    kafka_secure_admin: AdminClient,
    kafka_secure_client: ClientSettings,
    alice: ClientSettings,
    group: str,
) -> None:
    topic = new_topic(kafka_secure_broker, partitions=2)
    output = new_topic(kafka_secure_broker, partitions=2)
    tid = f"tx-{group}"
    allow(kafka_secure_admin, SECURE_USER, topics=[topic], groups=[group])
    allow(kafka_secure_admin, SECURE_USER, topics=[output], operations=["WRITE"])
    allow(
        kafka_secure_admin, SECURE_USER, transactional_ids=[tid], operations=["WRITE", "DESCRIBE"]
    )
    conf = kafka_secure_client.config()
    records = [(f"k{i}", f"v{i}") for i in range(20)]
    produce(kafka_secure_client.bootstrap_servers, topic, records, config=conf)
    gc = member(alice, Forward(output), group_id=group, topics=[topic], transactional_id=tid)
    gc.start()
    try:
        wait_for_committed(kafka_secure_admin, group, topic, timeout=WAIT_S)
    finally:
        gc.stop()
        gc.join(30)
    got = consume_all(kafka_secure_client.bootstrap_servers, output, expected=20, config=conf)
    assert sorted(records_as_text(got)) == sorted(records)  # read_committed: each once
