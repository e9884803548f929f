"""The session broker serves what weir needs: classic and KIP-848 groups, and transactions."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from weir.testing.providers import BrokerProvider, EmbeddedBroker
from weir.testing.pytest_plugin import TopicFactory, consume_all, produce, records_as_text

pytestmark = [pytest.mark.broker, pytest.mark.timeout(90)]

RECORDS = 40
PARTITIONS = 4


def group_config(bootstrap: str, protocol: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": f"weir-test-{protocol}-{uuid.uuid4().hex[:8]}",
        "group.protocol": protocol,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    if protocol == "classic":
        # Allowed down to 1 s by the test broker's group.min.session.timeout.ms.
        config["session.timeout.ms"] = 6000
        config["partition.assignment.strategy"] = "cooperative-sticky"
    # KIP-848: session/heartbeat/assignment are broker-side; setting them fails Consumer().
    return config


def drain_group(consumers: list[Consumer], expected: int, timeout: float) -> dict[int, list[str]]:
    """Poll every member from this one thread until ``expected`` records arrived.

    Alternating polls matter under both protocols: a member must poll to give partitions up when
    the other one joins.
    """
    seen: dict[int, list[str]] = {i: [] for i in range(len(consumers))}
    deadline = time.monotonic() + timeout
    while sum(len(v) for v in seen.values()) < expected:
        assert time.monotonic() < deadline, f"only {seen} after {timeout} s"
        for index, consumer in enumerate(consumers):
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            value = msg.value()
            assert value is not None
            seen[index].append(value.decode())
    return seen


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_group_of_two_consumes_everything_once(
    protocol: str, kafka_bootstrap: str, make_topic: TopicFactory, kafka_admin: AdminClient
) -> None:
    topic = make_topic(PARTITIONS)
    values = [f"v{i}" for i in range(RECORDS)]

    config = group_config(kafka_bootstrap, protocol)
    members = [Consumer(config), Consumer(config)]
    try:
        for member in members:
            member.subscribe([topic])
        # Both protocols converge on sharing the partitions between the two members. Records are
        # produced only after that: nothing is committed during the drain, so a partition moved
        # after its records were read would be read again by its new owner (that replay is
        # Kafka's contract, not a fault, and weir's own tests cover it with commits).
        deadline = time.monotonic() + 30
        while not all(m.assignment() for m in members):
            assert time.monotonic() < deadline, [m.assignment() for m in members]
            for member in members:
                assert member.poll(0.1) is None  # the topic is still empty
        owned = [{tp.partition for tp in m.assignment()} for m in members]
        assert owned[0].isdisjoint(owned[1])
        assert owned[0] | owned[1] == set(range(PARTITIONS))

        assert (
            produce(kafka_bootstrap, topic, [(f"k{i}", v) for i, v in enumerate(values)]) == RECORDS
        )
        seen = drain_group(members, RECORDS, timeout=45)
        assert sorted(seen[0] + seen[1]) == sorted(values)  # every record, none twice
        assert [{tp.partition for tp in m.assignment()} for m in members] == owned
        for member in members:
            if member.assignment():
                member.commit(asynchronous=False)

        group = kafka_admin.describe_consumer_groups([config["group.id"]])[config["group.id"]]
        description = group.result(timeout=10)
        assert description.type.name == protocol.upper()  # really that protocol, no fallback
        assert len(description.members) == 2

        committed = members[0].committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10
        )
        total = 0
        for tp in committed:
            _low, high = members[0].get_watermark_offsets(tp, timeout=10)
            assert tp.offset == high, tp
            total += high
        assert total == RECORDS
    finally:
        for member in members:
            member.close()


def test_transactions_hide_aborted_records(kafka_bootstrap: str, make_topic: TopicFactory) -> None:
    topic = make_topic(1)
    producer = Producer(
        {"bootstrap.servers": kafka_bootstrap, "transactional.id": f"weir-tx-{uuid.uuid4().hex}"}
    )
    producer.init_transactions(30)

    def transaction(values: list[str], *, commit: bool) -> None:
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value=value)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.flush(30)  # make sure the aborted records really reached the log
            producer.abort_transaction(30)

    transaction(["c1", "c2", "c3"], commit=True)
    transaction(["a1", "a2"], commit=False)
    transaction(["c4"], commit=True)

    committed = consume_all(kafka_bootstrap, topic, isolation_level="read_committed")
    assert [value for _key, value in records_as_text(committed)] == ["c1", "c2", "c3", "c4"]
    # Each transaction ends with a control marker that takes an offset: 3 records + marker,
    # 2 aborted + marker, then c4 at offset 7 and its marker at 8.
    assert [r.offset for r in committed] == [0, 1, 2, 7]

    everything = consume_all(kafka_bootstrap, topic, isolation_level="read_uncommitted")
    assert [value for _key, value in records_as_text(everything)] == [
        "c1",
        "c2",
        "c3",
        "a1",
        "a2",
        "c4",
    ]

    probe = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "weir-watermarks"})
    try:
        assert probe.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 9)
    finally:
        probe.close()


def test_produce_helper_reports_delivery_failures(kafka_bootstrap: str) -> None:
    missing = f"weir-missing-{uuid.uuid4().hex}"
    config = {"allow.auto.create.topics": False, "message.timeout.ms": 2000}
    with pytest.raises(Exception, match=r"UNKNOWN_TOPIC|Unknown topic|timed out"):
        produce(kafka_bootstrap, missing, [(None, "x")], partition=5, config=config, timeout=10)


def test_make_topic_waits_for_every_leader(
    kafka_bootstrap: str, make_topic: TopicFactory, kafka_admin: AdminClient
) -> None:
    topic = make_topic(6, config={"retention.ms": "60000"}, name_prefix="weir-leaders")
    assert topic.startswith("weir-leaders-")
    meta = kafka_admin.list_topics(topic=topic, timeout=10).topics[topic]
    assert sorted(meta.partitions) == list(range(6))
    assert all(p.leader >= 0 for p in meta.partitions.values())
    # Produce to the last partition right away: no "leader not available" window.
    assert produce(kafka_bootstrap, topic, [("k", "v")], partition=5) == 1
    assert records_as_text(consume_all(kafka_bootstrap, topic, expected=1)) == [("k", "v")]


def test_embedded_broker_runs_the_test_settings(
    kafka_broker: BrokerProvider, kafka_admin: AdminClient
) -> None:
    if not isinstance(kafka_broker, EmbeddedBroker):
        pytest.skip("only the embedded broker's settings are ours")
    resource = ConfigResource(ResourceType.BROKER, "1")
    configs = kafka_admin.describe_configs([resource])[resource].result(timeout=10)
    expected = {
        "group.consumer.session.timeout.ms": "6000",
        "group.consumer.heartbeat.interval.ms": "500",
        "group.consumer.min.session.timeout.ms": "1000",
        "group.min.session.timeout.ms": "1000",
        "group.initial.rebalance.delay.ms": "0",
        "offsets.topic.num.partitions": "10",
    }
    assert {key: configs[key].value for key in expected} == expected


def test_consume_all_times_out_when_records_never_come(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    topic = make_topic(1)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="expected 1"):
        consume_all(kafka_bootstrap, topic, expected=1, timeout=2)
    assert time.monotonic() - started < 10
