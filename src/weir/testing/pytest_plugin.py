"""pytest plugin (entry point ``weir``): real-Kafka fixtures plus produce/consume helpers.

Loaded by every pytest run in an environment where weir is installed, so importing it must stay
cheap and start nothing: brokers start only when a test requests a fixture below.

librdkafka's own log lines from the clients made here (a refused connection, a coordinator still
loading) go to the Python logger ``weir.testing.kafka`` instead of stderr, so pytest shows them
with a failing test's captured logs rather than in the middle of the run's output.

Fixtures:
    kafka_broker          session; the selected ``BrokerProvider`` (``.bootstrap_servers``)
    kafka_bootstrap       session; its bootstrap servers string
    kafka_admin           session; a confluent_kafka AdminClient for it
    make_topic            function; ``make_topic(partitions=1, *, config=None, name_prefix=None)``
    kafka_cluster_session session; a 3-node ``EmbeddedKafkaCluster``, started on first use
    kafka_cluster         function; the same cluster; nodes a test stopped are restarted after it
    kafka_secure_broker   session; an ``EmbeddedKafka`` with a SASL_SSL listener (SCRAM-SHA-512 and
                          PLAIN users ``admin``, a super user, and ``alice``, who may do nothing
                          without ACLs; OAUTHBEARER with unsecured tokens, any principal; a CA
                          made at start; client certificates required; the
                          ``StandardAuthorizer``; and an SSL listener where the client
                          certificate is the login: ``client_settings(name,
                          mechanism="SSL")``, any principal)
    kafka_secure_client   session; ``ClientSettings`` of ``admin`` on it: bootstrap servers, CA
                          file, user, password, and ``.config()`` for a client
    kafka_secure_admin    session; an AdminClient on its PLAINTEXT listener (a super user there),
                          for setting up topics and ACLs
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import pytest

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

    from weir.testing.broker import EmbeddedKafka
    from weir.testing.cluster import EmbeddedKafkaCluster
    from weir.testing.providers import BrokerProvider
    from weir.testing.security import ClientSettings

TOPIC_READY_TIMEOUT_S = 30.0
PRODUCE_TIMEOUT_S = 30.0
CONSUME_TIMEOUT_S = 30.0
COMMIT_TIMEOUT_S = 30.0

# Where librdkafka's log lines from the helpers' clients go (confluent-kafka's `logger` setting):
# at their own levels (librdkafka errors as ERROR, warnings as WARNING), never straight to stderr.
KAFKA_LOG = logging.getLogger("weir.testing.kafka")

_BROKER_FIXTURES = frozenset(
    {
        "kafka_broker",
        "kafka_bootstrap",
        "kafka_admin",
        "make_topic",
        "kafka_secure_broker",
        "kafka_secure_client",
        "kafka_secure_admin",
    }
)
# The secured session broker's users: a super user, and one the authorizer holds to its ACLs.
SECURE_SUPER_USER = "admin"
SECURE_USER = "alice"
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
    return admin_client(kafka_bootstrap)


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


@pytest.fixture(scope="session")
def kafka_secure_broker() -> Iterator[EmbeddedKafka]:
    """A broker that clients reach as in production: TLS with a CA made at start and client
    certificates, SASL users (SCRAM-SHA-512 and PLAIN) and OAUTHBEARER (unsecured tokens: any
    principal), the ``StandardAuthorizer``; and an SSL listener where the client certificate
    is the login (``client_settings(name, mechanism="SSL")``: any principal).
    ``client_settings(user)`` says how to connect; ``internal_bootstrap_servers`` is the
    harness's own way in."""
    from weir.testing.broker import EmbeddedKafka
    from weir.testing.security import BrokerSecurity

    kafka = EmbeddedKafka(
        security=BrokerSecurity(
            users=(SECURE_SUPER_USER, SECURE_USER),
            super_users=(SECURE_SUPER_USER,),
            authorizer=True,
            mtls=True,
            oauthbearer=True,
            ssl_listener=True,
        )
    )
    try:
        kafka.start()
        yield kafka
    finally:
        kafka.stop()


@pytest.fixture(scope="session")
def kafka_secure_client(kafka_secure_broker: EmbeddedKafka) -> ClientSettings:
    return kafka_secure_broker.client_settings(SECURE_SUPER_USER)


@pytest.fixture(scope="session")
def kafka_secure_admin(kafka_secure_broker: EmbeddedKafka) -> AdminClient:
    return admin_client(kafka_secure_broker.internal_bootstrap_servers)


@pytest.fixture
def kafka_cluster(kafka_cluster_session: EmbeddedKafkaCluster) -> Iterator[EmbeddedKafkaCluster]:
    """The shared 3-node cluster; nodes a test stopped or killed are restarted afterwards."""
    yield kafka_cluster_session
    # Together, not one by one: a node cannot start without a majority of the controllers.
    kafka_cluster_session.start_brokers()


# --- helpers for tests ---------------------------------------------------------------------------


def client_config(bootstrap: str, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A confluent-kafka config for ``bootstrap`` whose log lines go to ``KAFKA_LOG``.

    An AdminClient only hands its log lines over in ``poll()``: the helpers here poll it.
    """
    return {"bootstrap.servers": bootstrap, "logger": KAFKA_LOG, **(config or {})}


def admin_client(bootstrap: str, config: Mapping[str, Any] | None = None) -> AdminClient:
    from weir.lag import admin_client as configured_admin

    # It keeps its configuration: `weir.lag` then reads committed offsets with a consumer.
    return configured_admin(client_config(bootstrap, config))


def _admin(admin_or_bootstrap: AdminClient | str) -> AdminClient:
    if isinstance(admin_or_bootstrap, str):
        return admin_client(admin_or_bootstrap)
    return admin_or_bootstrap


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
    from confluent_kafka.cimpl import NewTopic

    admin = _admin(admin_or_bootstrap)
    topic = name or f"{name_prefix or 'weir-test'}-{uuid.uuid4().hex[:12]}"
    new_topic = NewTopic(
        topic,
        num_partitions=partitions,
        replication_factor=-1 if replication_factor is None else replication_factor,
        config=dict(config or {}),
    )
    future = admin.create_topics([new_topic], operation_timeout=timeout, request_timeout=timeout)
    try:
        # The request's own timeout error usually comes first; this one only guards the wait.
        try:
            future[topic].result(timeout=timeout + 5)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"creating topic {topic} took over {timeout} s") from None
        wait_for_leaders(admin, topic, partitions, timeout=timeout)
    finally:
        admin.poll(0)  # hand its queued log lines to KAFKA_LOG
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

    producer = Producer(client_config(bootstrap, {"acks": "all", **(config or {})}))
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
        client_config(
            bootstrap,
            {
                # librdkafka insists on a group id even for assign(); never joined or committed.
                "group.id": f"weir-consume-all-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": isolation_level,
                **(config or {}),
            },
        )
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


def commit_offsets(
    bootstrap: str,
    group_id: str,
    topic: str,
    offsets: Mapping[int, int],
    *,
    config: Mapping[str, Any] | None = None,
    timeout: float = COMMIT_TIMEOUT_S,
) -> None:
    """Commit ``offsets`` (partition -> next offset to read) for ``group_id`` without joining it.

    Retried while the group's coordinator is not ready (the first group on a fresh broker creates
    ``__consumer_offsets`` and commits fail with NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS).
    """
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    # A fresh group's coordinator answers these while __consumer_offsets is created and loaded;
    # librdkafka does not mark all of them retriable on a commit.
    from weir.lag import _COORDINATOR_NOT_READY as not_ready

    consumer = Consumer(
        client_config(
            bootstrap, {"group.id": group_id, "enable.auto.commit": False, **(config or {})}
        )
    )
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                consumer.commit(
                    offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()],
                    asynchronous=False,
                )
                return
            except KafkaException as exc:
                error = exc.args[0]
                retry = error.retriable() or error.name() in not_ready
                if not retry or time.monotonic() > deadline:
                    raise
            time.sleep(0.1)
    finally:
        consumer.close()


def wait_for_committed(
    admin_or_bootstrap: AdminClient | str,
    group_id: str,
    topic: str,
    expected: Mapping[int, int] | Sequence[int] | Literal["end"] = "end",
    *,
    timeout: float = COMMIT_TIMEOUT_S,
    interval: float = 0.1,
) -> dict[int, int | None]:
    """Wait until ``group_id``'s committed offsets on ``topic`` reach ``expected``.

    ``expected``: ``"end"`` (every partition's log end offset, read again each round), a sequence
    indexed by partition, or a mapping partition -> offset (other partitions are not checked).
    Reached means committed >= expected; a partition expected at 0 needs no commit. Reads with
    the admin API, so it joins nothing and works for any group. Returns the committed offsets
    by partition (None: nothing committed); raises TimeoutError showing committed vs expected.
    """
    from weir.errors import WeirError
    from weir.lag import (
        committed_as_text,
        committed_offsets,
        log_end_offsets,
        topic_partitions,
    )

    admin = _admin(admin_or_bootstrap)
    deadline = time.monotonic() + timeout
    committed: dict[int, int | None] = {}
    target: dict[int, int] = {}
    last_error: WeirError | None = None
    try:
        while True:
            step = max(0.5, min(10.0, deadline - time.monotonic()))
            try:
                if expected == "end":
                    keys = topic_partitions(admin, topic, timeout=step)
                    target = {
                        p: o for (_, p), o in log_end_offsets(admin, keys, timeout=step).items()
                    }
                elif isinstance(expected, Mapping):
                    target = dict(expected)
                else:
                    target = dict(enumerate(expected))
                found = committed_offsets(
                    admin, group_id, [(topic, p) for p in target], timeout=step
                )
                committed = {p: found.get((topic, p)) for p in target}
                last_error = None
                if all((committed[p] or 0) >= offset for p, offset in target.items()):
                    return committed
            except WeirError as exc:  # the lag could not be read: try again
                last_error = exc
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"group {group_id} on {topic}: committed {committed_as_text(committed)}, "
                    f"expected {committed_as_text(dict(target))} after {timeout:g} s"
                    + (f" (last error: {last_error})" if last_error is not None else "")
                )
            time.sleep(interval)
    finally:
        admin.poll(0)


def allow(
    admin_or_bootstrap: AdminClient | str,
    user: str,
    *,
    topics: Iterable[str] = (),
    groups: Iterable[str] = (),
    transactional_ids: Iterable[str] = (),
    operations: Iterable[str] = ("READ", "DESCRIBE"),
    timeout: float = TOPIC_READY_TIMEOUT_S,
) -> None:
    """Allow ``user`` the ``operations`` (``AclOperation`` names) on ``topics``, ``groups`` and
    ``transactional_ids`` (literal names, from any host), on a broker with the
    ``StandardAuthorizer``; returns once the broker applies them. Use an admin client of a
    super user (``kafka_secure_admin``)."""
    bindings = _acl_bindings(user, topics, groups, transactional_ids, operations)
    _change_acls(admin_or_bootstrap, bindings, timeout, present=True)


def revoke(
    admin_or_bootstrap: AdminClient | str,
    user: str,
    *,
    topics: Iterable[str] = (),
    groups: Iterable[str] = (),
    transactional_ids: Iterable[str] = (),
    operations: Iterable[str] = ("READ", "DESCRIBE"),
    timeout: float = TOPIC_READY_TIMEOUT_S,
) -> None:
    """Take back what `allow` allowed (the same arguments); returns once the broker applies
    it: what a test needs to see a running client refused."""
    bindings = _acl_bindings(user, topics, groups, transactional_ids, operations)
    _change_acls(admin_or_bootstrap, bindings, timeout, present=False)


def _change_acls(
    admin_or_bootstrap: AdminClient | str, bindings: list[Any], timeout: float, *, present: bool
) -> None:
    """Create (`present`) or delete `bindings`, and wait until the broker applies it."""
    if not bindings:
        return
    admin = _admin(admin_or_bootstrap)
    try:
        if present:
            futures = list(admin.create_acls(bindings, request_timeout=timeout).values())
        else:
            filters = [_acl_filter(b) for b in bindings]
            futures = list(admin.delete_acls(filters, request_timeout=timeout).values())
        for future in futures:
            future.result(timeout=timeout + 5)
        _wait_for_acls(admin, bindings, timeout, present=present)
    finally:
        admin.poll(0)


def _acl_bindings(
    user: str,
    topics: Iterable[str],
    groups: Iterable[str],
    transactional_ids: Iterable[str],
    operations: Iterable[str],
) -> list[Any]:
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    resources = (
        [(ResourceType.TOPIC, t) for t in topics]
        + [(ResourceType.GROUP, g) for g in groups]
        + [(ResourceType.TRANSACTIONAL_ID, t) for t in transactional_ids]
    )
    return [
        AclBinding(
            kind,
            name,
            ResourcePatternType.LITERAL,
            f"User:{user}",
            "*",
            AclOperation[operation.upper()],
            AclPermissionType.ALLOW,
        )
        for kind, name in resources
        for operation in operations
    ]


def _acl_filter(b: Any) -> Any:
    from confluent_kafka.admin import AclBindingFilter

    return AclBindingFilter(
        b.restype,
        b.name,
        b.resource_pattern_type,
        b.principal,
        b.host,
        b.operation,
        b.permission_type,
    )


def _wait_for_acls(
    admin: AdminClient, bindings: Sequence[Any], timeout: float, *, present: bool
) -> None:
    """CreateAcls and DeleteAcls return once the controller committed them; the broker's
    authorizer applies them a moment later. Describing them asks the broker's authorizer
    itself."""
    deadline = time.monotonic() + timeout
    for b in bindings:
        query = _acl_filter(b)
        while (
            bool(admin.describe_acls(query, request_timeout=timeout).result(timeout=timeout + 5))
            != present
        ):
            if time.monotonic() > deadline:
                shown = "show" if present else "drop"
                raise TimeoutError(f"the broker does not {shown} the ACL {b} after {timeout:g} s")
            time.sleep(0.05)


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
    "KAFKA_LOG",
    "SECURE_SUPER_USER",
    "SECURE_USER",
    "ConsumedRecord",
    "TopicFactory",
    "admin_client",
    "allow",
    "client_config",
    "commit_offsets",
    "consume_all",
    "create_topic",
    "produce",
    "records_as_text",
    "revoke",
    "wait_for_committed",
    "wait_for_leaders",
]
