"""pytest plugin (entry point ``weir``): real-Kafka fixtures plus produce/consume helpers.

Loaded by every pytest run in an environment where weir is installed, so importing it must stay
cheap and start nothing: brokers start only when a test requests a fixture below.

Fixtures:
    kafka_broker          session; the selected ``BrokerProvider`` (``.bootstrap_servers``)
    kafka_bootstrap       session; its bootstrap servers string
    kafka_admin           session; a confluent_kafka AdminClient for it
    make_topic            function; ``make_topic(partitions=1, *, config=None, name_prefix=None)``
    kafka_cluster_session session; a 3-node ``EmbeddedKafkaCluster``, started on first use
    kafka_cluster         function; the same cluster; nodes a test stopped are restarted after it
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pytest

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

    from weir.testing.cluster import EmbeddedKafkaCluster
    from weir.testing.providers import BrokerProvider

TOPIC_READY_TIMEOUT_S = 30.0
PRODUCE_TIMEOUT_S = 30.0
CONSUME_TIMEOUT_S = 30.0

_BROKER_FIXTURES = frozenset({"kafka_broker", "kafka_bootstrap", "kafka_admin", "make_topic"})
_CLUSTER_FIXTURES = frozenset({"kafka_cluster", "kafka_cluster_session"})

Payload = str | bytes | None


# --- plugin hooks --------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    # Same names and meaning as weir's own pyproject, so users' --strict-markers suites accept them.
    config.addinivalue_line("markers", "broker: needs a real Kafka broker (embedded by default)")
    config.addinivalue_line("markers", "cluster: needs the 3-broker cluster")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Mark by fixture use, so `-m "not broker"` deselects every test that would start a JVM even if
    # its author forgot the marker.
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & _BROKER_FIXTURES:
            item.add_marker(pytest.mark.broker)
        if used & _CLUSTER_FIXTURES:
            item.add_marker(pytest.mark.cluster)


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[BrokerProvider]:
    """The session's broker, from ``select_provider()`` (see docs/testing-with-a-real-broker.md)."""
    from weir.testing.providers import select_provider

    provider = select_provider()
    # try/finally rather than relying on yield teardown alone: a failed start must still clean up.
    try:
        provider.start()
        yield provider
    finally:
        provider.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: BrokerProvider) -> str:
    return kafka_broker.bootstrap_servers


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap: str) -> AdminClient:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": kafka_bootstrap})


class TopicFactory(Protocol):
    def __call__(
        self,
        partitions: int = 1,
        *,
        config: Mapping[str, str] | None = None,
        name_prefix: str | None = None,
        replication_factor: int | None = None,
    ) -> str: ...


@pytest.fixture
def make_topic(kafka_admin: AdminClient) -> Iterator[TopicFactory]:
    """Create uniquely named topics on the session broker; deleted after the test."""
    created: list[str] = []

    def factory(
        partitions: int = 1,
        *,
        config: Mapping[str, str] | None = None,
        name_prefix: str | None = None,
        replication_factor: int | None = None,
    ) -> str:
        name = create_topic(
            kafka_admin,
            partitions=partitions,
            config=config,
            name_prefix=name_prefix,
            replication_factor=replication_factor,
        )
        created.append(name)
        return name

    yield factory
    if created:
        # Not awaited: the embedded broker is throwaway, and an external one cleans up eventually.
        kafka_admin.delete_topics(created, operation_timeout=0)


@pytest.fixture(scope="session")
def kafka_cluster_session() -> Iterator[EmbeddedKafkaCluster]:
    from weir.testing.cluster import EmbeddedKafkaCluster

    cluster = EmbeddedKafkaCluster(size=3)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def kafka_cluster(kafka_cluster_session: EmbeddedKafkaCluster) -> Iterator[EmbeddedKafkaCluster]:
    """The shared 3-node cluster; nodes a test stopped or killed are restarted afterwards."""
    yield kafka_cluster_session
    for index, node in enumerate(kafka_cluster_session.nodes):
        if not node.running:
            kafka_cluster_session.start_broker(index)


# --- helpers for tests ---------------------------------------------------------------------------


def create_topic(
    admin_or_bootstrap: AdminClient | str,
    name: str | None = None,
    *,
    partitions: int = 1,
    replication_factor: int | None = None,
    config: Mapping[str, str] | None = None,
    name_prefix: str | None = None,
    timeout: float = TOPIC_READY_TIMEOUT_S,
) -> str:
    """Create a topic (uuid-named unless ``name``) and wait until every partition has a leader.

    ``admin_or_bootstrap``: an AdminClient or a bootstrap servers string.
    ``replication_factor=None`` uses the broker's default.replication.factor.
    """
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = (
        AdminClient({"bootstrap.servers": admin_or_bootstrap})
        if isinstance(admin_or_bootstrap, str)
        else admin_or_bootstrap
    )
    topic = name or f"{name_prefix or 'weir-test'}-{uuid.uuid4().hex[:12]}"
    new_topic = NewTopic(
        topic,
        num_partitions=partitions,
        replication_factor=-1 if replication_factor is None else replication_factor,
        config=dict(config or {}),
    )
    admin.create_topics([new_topic], operation_timeout=timeout, request_timeout=timeout)[
        topic
    ].result(timeout=timeout)
    wait_for_leaders(admin, topic, partitions, timeout=timeout)
    return topic


def wait_for_leaders(admin: AdminClient, topic: str, partitions: int, *, timeout: float) -> None:
    """CreateTopics returns before leaders are elected everywhere; producing earlier can fail."""
    deadline = time.monotonic() + timeout
    while True:
        meta = admin.list_topics(topic=topic, timeout=max(1.0, deadline - time.monotonic()))
        found = meta.topics.get(topic)
        if (
            found is not None
            and found.error is None
            and len(found.partitions) == partitions
            and all(p.leader >= 0 and p.error is None for p in found.partitions.values())
        ):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {topic} has no leader for every partition after {timeout} s")
        time.sleep(0.05)


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[Payload, Payload] | Mapping[str, Any]],
    partition: int | None = None,
    *,
    config: Mapping[str, Any] | None = None,
    timeout: float = PRODUCE_TIMEOUT_S,
) -> int:
    """Produce ``records`` and flush: (key, value) pairs or dicts (key/value/headers/partition).

    Returns how many were delivered; raises on the first delivery error or if not all are delivered
    within ``timeout``.
    """
    from confluent_kafka import KafkaException, Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", **(config or {})})
    delivered = 0
    errors: list[Any] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        nonlocal delivered
        if err is None:
            delivered += 1
        else:
            errors.append(err)

    sent = 0
    for record in records:
        fields: dict[str, Any]
        if isinstance(record, Mapping):
            fields = dict(record)
        else:
            key, value = record
            fields = {"key": key, "value": value}
        target = fields.pop("partition", partition)
        if target is not None:
            fields["partition"] = target
        while True:
            try:
                producer.produce(topic, on_delivery=on_delivery, **fields)
                break
            except BufferError:  # local queue full: let deliveries drain, then retry
                producer.poll(0.1)
        sent += 1
    remaining = producer.flush(timeout)
    if errors:
        raise KafkaException(errors[0])
    if remaining:
        raise TimeoutError(f"{remaining} of {sent} records not delivered to {topic} in {timeout} s")
    return delivered


@dataclass(frozen=True)
class ConsumedRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]]


def consume_all(
    bootstrap: str,
    topic: str,
    *,
    expected: int | None = None,
    isolation_level: str = "read_committed",
    config: Mapping[str, Any] | None = None,
    timeout: float = CONSUME_TIMEOUT_S,
) -> list[ConsumedRecord]:
    """Read ``topic`` from the beginning up to its current end, without a consumer group.

    Returns once every partition reached its end (and at least ``expected`` records, if given,
    arrived), sorted by (partition, offset). Raises TimeoutError otherwise. Commits nothing.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException
    from confluent_kafka import TopicPartition as TP

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            # librdkafka insists on a group id even for assign(); it is never joined or committed.
            "group.id": f"weir-consume-all-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation_level,
            **(config or {}),
        }
    )
    try:
        deadline = time.monotonic() + timeout
        meta = consumer.list_topics(topic, timeout=timeout).topics[topic]
        if meta.error is not None:
            raise KafkaException(meta.error)
        partitions = sorted(meta.partitions)
        consumer.assign([TP(topic, p, OFFSET_BEGINNING) for p in partitions])
        at_end: set[int] = set()
        out: list[ConsumedRecord] = []
        while len(at_end) < len(partitions) or (expected is not None and len(out) < expected):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"read {len(out)} records from {topic} in {timeout} s; "
                    f"{len(partitions) - len(at_end)} partitions not at their end"
                    + (f", expected {expected}" if expected is not None else "")
                )
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err, partition = msg.error(), msg.partition()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF and partition is not None:
                    at_end.add(partition)
                    continue
                raise KafkaException(err)
            offset = msg.offset()
            if partition is None or offset is None:
                continue  # only error events lack a position
            at_end.discard(partition)
            out.append(
                ConsumedRecord(
                    topic=topic,
                    partition=partition,
                    offset=offset,
                    key=msg.key(),
                    value=msg.value(),
                    headers=_headers(msg.headers()),
                )
            )
        return sorted(out, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def _headers(raw: Any) -> tuple[tuple[str, bytes | None], ...]:
    # librdkafka hands consumed headers back as a list of (name, bytes | None).
    items = raw.items() if isinstance(raw, Mapping) else (raw or ())
    return tuple(
        (name, value.encode() if isinstance(value, str) else value) for name, value in items
    )


def records_as_text(records: Iterable[ConsumedRecord]) -> list[tuple[str | None, str | None]]:
    """(key, value) decoded as UTF-8: the shape most assertions want."""
    return [
        (
            r.key.decode() if r.key is not None else None,
            r.value.decode() if r.value is not None else None,
        )
        for r in records
    ]


__all__ = [
    "ConsumedRecord",
    "TopicFactory",
    "consume_all",
    "create_topic",
    "produce",
    "records_as_text",
    "wait_for_leaders",
]
