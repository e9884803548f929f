"""The state of an in-memory Kafka cluster: topics and their logs, transactions, committed
offsets and the group coordinator.

`Cluster` is what the fake clients share: `weir.testing.fake_consumer.FakeConsumer` reads,
commits and joins groups through it. `weir.testing.fake_broker.FakeBroker` is the public face, a
`Cluster` that also makes those clients (`consumer_factory`); `weir.testing.fake` has the whole
picture. How the coordinator serves rebalances is modelled on the client's observed behaviour and
checked by the contract suite (tests/contract/ in weir's repository) against a real broker.
"""

from __future__ import annotations

import itertools
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Protocol

from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin._metadata import (
    BrokerMetadata,
    ClusterMetadata,
    PartitionMetadata,
    TopicMetadata,
)

__all__ = ["Cluster", "FakeGroupMetadata", "FakeMessage", "FakeTransaction", "GroupClient"]

TP = tuple[str, int]
TPLike = TP | TopicPartition
HeadersIn = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None] | None

_EARLIEST = frozenset({"smallest", "earliest", "beginning"})
_LATEST = frozenset({"largest", "latest", "end"})
_STRATEGIES = frozenset({"range", "roundrobin", "cooperative-sticky"})
_ASSIGNORS = frozenset({"uniform", "range"})


def _tp(x: TPLike) -> TP:
    if isinstance(x, TopicPartition):
        return (x.topic, x.partition)
    topic, partition = x
    return (topic, partition)


def _invalid(message: str) -> KafkaException:
    return KafkaException(KafkaError(KafkaError._INVALID_ARG, message))


def _bytes(x: str | bytes | None, what: str) -> bytes | None:
    if x is None or isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode()
    raise TypeError(f"{what} must be str, bytes or None, not {type(x).__name__}")


def _headers(headers: HeadersIn) -> list[tuple[str, bytes | None]] | None:
    # On the wire header values are bytes: a str sent by a producer is read back encoded.
    if headers is None:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(str(name), _bytes(value, "a header value")) for name, value in items]


class FakeMessage:
    """Stands in for `confluent_kafka.Message`: a record in a fake log, or an error event."""

    __slots__ = (
        "_control",
        "_error",
        "_headers",
        "_key",
        "_leader_epoch",
        "_offset",
        "_partition",
        "_timestamp",
        "_topic",
        "_txn",
        "_value",
    )

    def __init__(
        self,
        topic: str | None,
        partition: int | None,
        offset: int | None,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
        timestamp: int | None = None,
        error: KafkaError | None = None,
        leader_epoch: int | None = None,
    ) -> None:
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._key = key
        self._value = value
        self._headers = None if headers is None else list(headers)
        self._timestamp = timestamp
        self._error = error
        self._leader_epoch = leader_epoch
        self._control = False
        self._txn: FakeTransaction | None = None

    @property
    def control(self) -> bool:
        """A transaction marker: occupies an offset, is never returned by consume()."""
        return self._control

    @property
    def transaction(self) -> FakeTransaction | None:
        """The transaction that produced this record, if any."""
        return self._txn

    @classmethod
    def error_event(
        cls, error: KafkaError, topic: str | None = None, partition: int | None = None
    ) -> FakeMessage:
        """An event message, as `consume()` returns for consumer errors."""
        return cls(topic, partition, None, error=error)

    def topic(self) -> str | None:
        """`Message.topic`."""
        return self._topic

    def partition(self) -> int | None:
        """`Message.partition`."""
        return self._partition

    def offset(self) -> int | None:
        """`Message.offset`."""
        return self._offset

    def key(self) -> bytes | None:
        """`Message.key`."""
        return self._key

    def value(self) -> bytes | None:
        """`Message.value`."""
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        """`Message.headers`: a new list each call, None for a message without headers."""
        return None if self._headers is None else list(self._headers)

    def timestamp(self) -> tuple[int, int]:
        """`Message.timestamp`: (TIMESTAMP_CREATE_TIME, ms), or (TIMESTAMP_NOT_AVAILABLE, 0)."""
        if self._timestamp is None:
            return (TIMESTAMP_NOT_AVAILABLE, 0)
        return (TIMESTAMP_CREATE_TIME, self._timestamp)

    def error(self) -> KafkaError | None:
        """`Message.error`: the error of an error event, None for a record."""
        return self._error

    def leader_epoch(self) -> int | None:
        """`Message.leader_epoch`."""
        return self._leader_epoch

    def __len__(self) -> int:
        return len(self._value) if self._value else 0

    def __repr__(self) -> str:
        if self._error is not None:
            return f"FakeMessage(error={self._error!r})"
        return f"FakeMessage({self._topic}[{self._partition}]@{self._offset}, key={self._key!r})"


class FakeTransaction:
    """A producer transaction on a `FakeBroker` (`broker.transaction()`).

    Its records take offsets at once but are invisible to `read_committed` consumers, which
    stop before the first of them, until `commit()`; after `abort()` those consumers skip them.
    Either writes a marker into every partition the transaction wrote to, as Kafka's
    transaction coordinator does: markers occupy offsets and are never delivered. As a context
    manager it commits on success and aborts on an exception.

    A `FakeProducer`'s transactions are of this class too (`FakeProducer.transactions`), with
    the offsets it sent to them."""

    def __init__(self, broker: Cluster, transactional_id: str | None = None) -> None:
        self._broker = broker
        self.transactional_id = transactional_id
        """The `transactional.id` of the producer that began it (None: `broker.transaction()`)."""
        self.state: Literal["open", "committed", "aborted"] = "open"
        self.partitions: list[TP] = []
        self.records: list[FakeMessage] = []
        """What it wrote, in order."""
        self.offsets: dict[str, dict[TP, tuple[int, str | None]]] = {}
        """Offsets and metadata sent to it (`send_offsets_to_transaction`) per group: committed
        for that group with the transaction, dropped if it aborts. A scripted consumer's
        private broker keeps every group's under "" (its one store)."""
        # When each offset was sent, in the order of the broker's offset writes: a plain commit
        # made after it wins over it.
        self._sent: dict[tuple[str, TP], int] = {}

    def produce(
        self,
        topic: str,
        key: str | bytes | None = None,
        value: str | bytes | None = None,
        *,
        partition: int | None = None,
        headers: HeadersIn = None,
        timestamp: int | None = None,
    ) -> FakeMessage:
        """Write one record in the transaction and return it (its offset is taken at once); a
        KafkaException `_STATE` once the transaction ended."""
        if self.state != "open":
            raise KafkaException(
                KafkaError(KafkaError._STATE, f"the transaction is already {self.state}")
            )
        return self._broker._produce(topic, key, value, partition, headers, timestamp, self)

    def commit(self) -> None:
        """Commit: read_committed consumers now read the records, past a marker in each
        partition. A KafkaException `_STATE` if it already ended."""
        self._broker._end_transaction(self, "committed")

    def abort(self) -> None:
        """Abort: read_committed consumers skip the records, and a marker follows them in each
        partition. A KafkaException `_STATE` if it already ended."""
        self._broker._end_transaction(self, "aborted")

    def __enter__(self) -> FakeTransaction:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.state == "open":
            if exc_type is None:
                self.commit()
            else:
                self.abort()


# -- the group coordinator -------------------------------------------------------------------


@dataclass(frozen=True)
class FakeGroupMetadata:
    """What `consumer_group_metadata()` returns: opaque on the real client, readable here.
    `generation` is that of the member's last assignment (-1 before one): offsets sent to a
    transaction with it are refused once the member is assigned again (ILLEGAL_GENERATION) or
    has left the group (UNKNOWN_MEMBER_ID)."""

    group_id: str
    member_id: str
    generation: int = -1


class GroupClient(Protocol):
    """What the group coordinator reads and sets on a member's client (a `FakeConsumer`)."""

    _member: _Member | None
    _protocol: tuple[str, str]
    _injected: deque[FakeMessage]
    subscription: list[str] | None

    def _group_key(self) -> str: ...
    def _conf_value(self, key: str, default: Any) -> Any: ...


@dataclass(eq=False)
class _Member:
    consumer: GroupClient
    member_id: str
    topics: tuple[str, ...]
    group: _Group
    active: bool = True
    """Takes part in assignments (not leaving, not expired)."""
    leaving: bool = False
    owned: set[TP] | None = None
    """What the group handed this member and it has not yet given back; None: never assigned
    (eager members that were assigned, even nothing, get a revoke on the next rebalance)."""
    steps: deque[tuple[str, tuple[TP, ...]]] = field(default_factory=deque)
    needs_revoke: bool = False
    awaiting: bool = True
    """Eager: waiting for an assignment (new, or revoked everything in this rebalance)."""
    assigned_gen: int = 0
    synced_round: int = 0
    pending_lost: tuple[TP, ...] | None = None
    serving: bool = False
    """A rebalance callback of this member's is running."""
    generation: int | None = None
    """The group's generation when the member was last served an assignment (its metadata
    carries it); None before that, and once it expired."""


@dataclass(eq=False)
class _TransactionalId:
    epoch: int = -1
    """The producer epoch of the latest `init_transactions` with this id: older ones are fenced."""
    open: FakeTransaction | None = None
    """The transaction of the latest epoch that holds writes or offsets, until it ends."""


class _Group:
    def __init__(self, group_id: str, protocol: str, assignor: str) -> None:
        self.group_id = group_id
        self.protocol = protocol  # "eager" | "cooperative" | "consumer"
        self.assignor = assignor
        self.members: dict[str, _Member] = {}
        self.generation = 0
        self.round = 0
        self.target: dict[str, set[TP]] = {}
        self.revoking: set[str] = set()
        self.round_revoked = False

    def active(self) -> list[_Member]:
        return [m for m in self.members.values() if m.active]

    def owner(self, tp: TP) -> _Member | None:
        for m in self.members.values():
            if m.owned and tp in m.owned:
                return m
        return None


def _protocol(conf: Mapping[str, Any]) -> tuple[str, str]:
    """(protocol, assignor) from a consumer configuration, validated as the client does."""
    group_protocol = str(conf.get("group.protocol", "classic"))
    if group_protocol == "consumer":
        for key in ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"):
            if key in conf:
                raise _invalid(
                    f"Failed to create consumer: `{key}` is not supported for "
                    "`group.protocol=consumer` or share consumer. It is defined broker side"
                )
        assignor = str(conf.get("group.remote.assignor") or "uniform")
        if assignor not in _ASSIGNORS:
            raise _invalid(f'Invalid value "{assignor}" for "group.remote.assignor"')
        return "consumer", assignor
    if group_protocol != "classic":
        raise _invalid(
            f'Invalid value "{group_protocol}" for configuration property "group.protocol"'
        )
    raw = str(conf.get("partition.assignment.strategy", "range,roundrobin"))
    names = [s.strip() for s in raw.split(",") if s.strip()]
    for name in names:
        if name not in _STRATEGIES:
            raise _invalid(f'Unsupported partition.assignment.strategy "{name}"')
    if not names:
        raise _invalid("partition.assignment.strategy must name an assignor")
    cooperative = {name == "cooperative-sticky" for name in names}
    if len(cooperative) > 1:
        raise _invalid(
            f"Failed to create consumer: All partition.assignment.strategy ({raw}) assignors "
            "must have the same protocol type, online migration between assignors with "
            "different protocol types is not supported"
        )
    return ("cooperative" if True in cooperative else "eager"), names[0]


def _range(members: list[_Member], topics: Mapping[str, int]) -> dict[str, set[TP]]:
    out: dict[str, set[TP]] = {m.member_id: set() for m in members}
    for topic in sorted({t for m in members for t in m.topics if t in topics}):
        subs = sorted(m.member_id for m in members if topic in m.topics)
        per, extra = divmod(topics[topic], len(subs))
        start = 0
        for i, mid in enumerate(subs):
            count = per + (1 if i < extra else 0)
            out[mid].update((topic, p) for p in range(start, start + count))
            start += count
    return out


def _roundrobin(members: list[_Member], topics: Mapping[str, int]) -> dict[str, set[TP]]:
    out: dict[str, set[TP]] = {m.member_id: set() for m in members}
    order = sorted(members, key=lambda m: m.member_id)
    turn = itertools.cycle(order)
    names = sorted({t for m in members for t in m.topics if t in topics})
    for tp in [(t, p) for t in names for p in range(topics[t])]:
        for _ in range(len(order)):
            m = next(turn)
            if tp[0] in m.topics:
                out[m.member_id].add(tp)
                break
    return out


def _sticky(members: list[_Member], topics: Mapping[str, int]) -> dict[str, set[TP]]:
    """Balanced and sticky: members keep what they own while the counts stay within one of
    each other; only the surplus moves (cooperative-sticky and KIP-848's uniform assignor)."""
    order = sorted(m.member_id for m in members)
    eligible = {
        m.member_id: {(t, p) for t in m.topics if t in topics for p in range(topics[t])}
        for m in members
    }
    out = {
        m.member_id: {tp for tp in (m.owned or ()) if tp in eligible[m.member_id]} for m in members
    }
    taken = set().union(*out.values()) if out else set()
    for tp in sorted(set().union(*eligible.values()) - taken if eligible else set()):
        candidates = [mid for mid in order if tp in eligible[mid]]
        out[min(candidates, key=lambda mid: (len(out[mid]), order.index(mid)))].add(tp)
    moved = True
    while moved:
        moved = False
        for donor in sorted(order, key=lambda mid: (-len(out[mid]), order.index(mid))):
            for taker in sorted(order, key=lambda mid: (len(out[mid]), order.index(mid))):
                if len(out[donor]) - len(out[taker]) <= 1:
                    continue
                movable = sorted(tp for tp in out[donor] if tp in eligible[taker])
                if movable:
                    out[donor].discard(movable[-1])
                    out[taker].add(movable[-1])
                    moved = True
                    break
            if moved:
                break
    return out


class Cluster:
    """An in-memory Kafka cluster: topics, transactions, consumer groups, committed offsets.
    Thread-safe. Tests use it as a `FakeBroker`, which makes its clients too.

    `auto_create_topics` creates a one-partition topic on the first produce to it (the real
    broker's `auto.create.topics.enable`); consumers never create topics.
    `offset_metadata_max_bytes` is the broker's `offset.metadata.max.bytes`."""

    def __init__(
        self, *, auto_create_topics: bool = False, offset_metadata_max_bytes: int = 4096
    ) -> None:
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self.auto_create_topics = auto_create_topics
        self.offset_metadata_max_bytes = offset_metadata_max_bytes
        self._topics: dict[str, int] = {}
        self._logs: dict[TP, list[FakeMessage]] = {}
        self._log_offsets: dict[TP, list[int]] = {}
        self._offsets: dict[str, dict[TP, tuple[int, str | None]]] = {}
        self._groups: dict[str, _Group] = {}
        self._member_seq = itertools.count(1)
        self._unkeyed: dict[str, int] = {}
        self._max_bytes: dict[str, int] = {}  # topics' max.message.bytes
        # A scripted FakeConsumer's private broker: partitions exist once produced or assigned.
        self._grow = False
        # The transaction coordinator: producer epochs per transactional.id, and the open
        # transactions that hold offsets (what a read_committed committed() waits for).
        self._transactional: dict[str, _TransactionalId] = {}
        self._holding_offsets: set[FakeTransaction] = set()
        # The order of offset writes, per (group, partition) the last one's: a transaction's
        # offsets count as written when they were sent, and apply at its commit only if nothing
        # was committed to their partition since.
        self._writes = itertools.count(1)
        self._written: dict[tuple[str, TP], int] = {}

    # -- topics --------------------------------------------------------------------------------

    def create_topic(
        self, name: str, partitions: int = 1, *, config: Mapping[str, str] | None = None
    ) -> str:
        """Create a topic with `partitions` empty partitions; returns its name. `config` may set
        `max.message.bytes`, the one topic setting the fake models: a record whose key, value
        and headers are larger is refused (MSG_SIZE_TOO_LARGE)."""
        if not isinstance(name, str) or not name:
            raise ValueError("a topic name must be a non-empty str")
        if not isinstance(partitions, int) or partitions < 1:
            raise ValueError(f"partitions must be an int >= 1, not {partitions!r}")
        limit = None
        for key, value in (config or {}).items():
            if key != "max.message.bytes":
                raise ValueError(
                    f"the fake models no topic setting {key!r}: only max.message.bytes"
                )
            if not str(value).isdigit() or int(value) < 1:
                raise ValueError(f"max.message.bytes must be a positive integer, not {value!r}")
            limit = int(value)
        with self._cond:
            if name in self._topics:
                raise KafkaException(
                    KafkaError(KafkaError.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
                )
            self._topics[name] = partitions
            if limit is not None:
                self._max_bytes[name] = limit
            self._topics_changed()
            return name

    def create_partitions(self, topic: str, total: int) -> None:
        """Grow `topic` to `total` partitions; groups subscribed to it rebalance."""
        with self._cond:
            current = self._partition_count(topic)
            if total <= current:
                raise ValueError(f"{topic} has {current} partitions; total must be more")
            self._topics[topic] = total
            self._topics_changed()

    def topics(self) -> dict[str, int]:
        """Every topic and its partition count."""
        with self._lock:
            return dict(self._topics)

    def _partition_count(self, topic: str) -> int:
        n = self._topics.get(topic)
        if n is None:
            raise KafkaException(
                KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"unknown topic {topic!r}")
            )
        return n

    def _topics_changed(self) -> None:
        for group in self._groups.values():
            if group.members:
                self._rebalance(group)
        self._cond.notify_all()

    def _ensure(self, tp: TP) -> None:
        """Scripted mode: a partition comes into being when produced to or assigned."""
        topic, partition = tp
        if self._topics.get(topic, 0) <= partition:
            self._topics[topic] = partition + 1

    # -- producing -----------------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        key: str | bytes | None = None,
        value: str | bytes | None = None,
        *,
        partition: int | None = None,
        headers: HeadersIn = None,
        timestamp: int | None = None,
    ) -> FakeMessage:
        """Append one record and return it (with its partition and offset).

        Without `partition`, a keyed record goes to crc32(key) % partitions, the real
        client's default partitioner for keyed records, and unkeyed records go round robin.
        str keys, values and header values are stored UTF-8 encoded, as the client sends them.
        `timestamp` is the create time in ms (now by default)."""
        return self._produce(topic, key, value, partition, headers, timestamp, None)

    def produce_marker(self, topic: str, partition: int) -> int:
        """Append a transaction commit marker (what a transaction that wrote nothing visible
        would leave): it takes an offset that consumers never see. Returns the offset."""
        with self._cond:
            if self._grow:
                self._ensure((topic, partition))
            self._check_partition(topic, partition)
            msg = FakeMessage(topic, partition, None)
            msg._control = True
            offset = self._append((topic, partition), msg, None)
            self._cond.notify_all()
            return offset

    def transaction(self) -> FakeTransaction:
        """Begin a producer transaction (see `FakeTransaction`)."""
        return FakeTransaction(self)

    def _check_partition(self, topic: str, partition: int) -> None:
        n = self._partition_count(topic)
        if not 0 <= partition < n:
            raise KafkaException(
                KafkaError(KafkaError._UNKNOWN_PARTITION, "Local: Unknown partition")
            )

    def _produce(
        self,
        topic: str,
        key: str | bytes | None,
        value: str | bytes | None,
        partition: int | None,
        headers: HeadersIn,
        timestamp: int | None,
        txn: FakeTransaction | None,
    ) -> FakeMessage:
        key_b = _bytes(key, "key")
        value_b = _bytes(value, "value")
        hdrs = _headers(headers)
        with self._cond:
            partition = self._place(topic, key_b, partition)
            self._check_size(topic, key_b, value_b, hdrs)
            stamp = int(time.time() * 1000) if timestamp is None else timestamp
            msg = FakeMessage(topic, partition, None, key_b, value_b, hdrs, stamp, None, 0)
            self._append((topic, partition), msg, txn)
            if txn is not None:
                txn.records.append(msg)
                if (topic, partition) not in txn.partitions:
                    txn.partitions.append((topic, partition))
            self._cond.notify_all()
            return msg

    def _place(self, topic: str, key: bytes | None, partition: int | None) -> int:
        """The partition a record goes to: `partition`, or the client's partitioners' choice
        (crc32 of the key, else round robin). An unknown topic is created with one partition
        if `auto_create_topics`; otherwise, and for an unknown partition, KafkaException."""
        with self._cond:
            if topic not in self._topics:
                if not self.auto_create_topics:
                    raise KafkaException(
                        KafkaError(
                            KafkaError.UNKNOWN_TOPIC_OR_PART,
                            f"Broker: Unknown topic or partition ({topic!r}; create it first)",
                        )
                    )
                self._topics[topic] = 1
                self._topics_changed()
            n = self._topics[topic]
            if partition is None:
                if key is not None:
                    partition = zlib.crc32(key) % n
                else:
                    partition = self._unkeyed.get(topic, 0) % n
                    self._unkeyed[topic] = partition + 1
            self._check_partition(topic, partition)
            return partition

    def _check_size(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]] | None,
    ) -> None:
        limit = self._max_bytes.get(topic)
        if limit is None:
            return
        size = len(key or b"") + len(value or b"")
        size += sum(len(name.encode()) + len(v or b"") for name, v in headers or ())
        if size > limit:
            raise KafkaException(
                KafkaError(
                    KafkaError.MSG_SIZE_TOO_LARGE,
                    f"Broker: Message size too large ({size} bytes; {topic}'s "
                    f"max.message.bytes is {limit})",
                )
            )

    def _append(
        self, tp: TP, msg: FakeMessage, txn: FakeTransaction | None, at: int | None = None
    ) -> int:
        offs = self._log_offsets.setdefault(tp, [])
        if at is None:
            at = offs[-1] + 1 if offs else 0
        elif offs and at <= offs[-1]:
            raise ValueError(f"offset {at} is not above the log end {offs[-1]} of {tp}")
        msg._offset = at
        msg._txn = txn
        self._logs.setdefault(tp, []).append(msg)
        offs.append(at)
        return at

    def _end_transaction(
        self, txn: FakeTransaction, state: Literal["committed", "aborted"]
    ) -> None:
        with self._cond:
            if txn.state != "open":
                raise KafkaException(
                    KafkaError(KafkaError._STATE, f"the transaction is already {txn.state}")
                )
            txn.state = state
            for tp in txn.partitions:
                marker = FakeMessage(tp[0], tp[1], None)
                marker._control = True
                self._append(tp, marker, txn)
            if state == "committed":
                for group, offsets in txn.offsets.items():
                    store = self._offsets.setdefault(group, {})
                    for tp, entry in offsets.items():
                        sent = txn._sent[(group, tp)]
                        if self._written.get((group, tp), 0) < sent:
                            store[tp] = entry
                            self._written[(group, tp)] = sent
            self._holding_offsets.discard(txn)
            held = self._transactional.get(txn.transactional_id or "")
            if held is not None and held.open is txn:
                held.open = None
            self._cond.notify_all()

    # -- reading -------------------------------------------------------------------------------

    def messages(
        self, topic: str, partition: int | None = None, *, committed_only: bool = True
    ) -> list[FakeMessage]:
        """The records of a topic (or one partition), in partition and offset order; markers
        are left out, and so are records of open and aborted transactions unless
        `committed_only` is False."""
        with self._lock:
            parts = range(self._partition_count(topic)) if partition is None else [partition]
            out = []
            for p in parts:
                for m in self._logs.get((topic, p), []):
                    if m._control:
                        continue
                    if committed_only and m._txn is not None and m._txn.state != "committed":
                        continue
                    out.append(m)
            return out

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """(low, high): the first offset in the log and the log end offset."""
        with self._lock:
            offs = self._log_offsets.get((topic, partition))
            return (offs[0], offs[-1] + 1) if offs else (0, 0)

    def _stable_end(self, tp: TP) -> int:
        """The last stable offset: the first offset of a still-open transaction, else the end."""
        for m in self._logs.get(tp, ()):
            if m._txn is not None and m._txn.state == "open":
                assert m._offset is not None
                return m._offset
        offs = self._log_offsets.get(tp)
        return offs[-1] + 1 if offs else 0

    def end_offsets(self, topic: str) -> dict[int, int]:
        """The log end offset of each partition of `topic`."""
        with self._lock:
            return {p: self.watermarks(topic, p)[1] for p in range(self._partition_count(topic))}

    # -- committed offsets ---------------------------------------------------------------------

    def commit(self, group: str, offsets: Iterable[TopicPartition]) -> None:
        """Store committed offsets for `group` directly (to set up a test)."""
        with self._cond:
            store = self._offsets.setdefault(group, {})
            for p in offsets:
                self._check_partition(p.topic, p.partition)
                store[(p.topic, p.partition)] = (p.offset, p.metadata)
                self._written[(group, (p.topic, p.partition))] = next(self._writes)
            self._cond.notify_all()

    def committed_offsets(self, group: str, topic: str | None = None) -> dict[TP, int]:
        """The group's committed offset of each partition (of `topic`) that has one."""
        with self._lock:
            store = self._offsets.get(group, {})
            return {tp: o for tp, (o, _) in store.items() if topic is None or tp[0] == topic}

    def committed_metadata(self, group: str, topic: str | None = None) -> dict[TP, str | None]:
        """The metadata string committed with each offset (None where none was sent)."""
        with self._lock:
            store = self._offsets.get(group, {})
            return {tp: md for tp, (_, md) in store.items() if topic is None or tp[0] == topic}

    def lag(self, group: str, topic: str) -> dict[int, int]:
        """Per partition of `topic`: records up to the last stable offset that the group has
        not committed past (from the first offset where nothing is committed)."""
        with self._lock:
            store = self._offsets.get(group, {})
            out = {}
            for p in range(self._partition_count(topic)):
                end = self._stable_end((topic, p))
                start = store.get((topic, p), (self.watermarks(topic, p)[0], None))[0]
                out[p] = max(0, end - start)
            return out

    def wait_until_committed(
        self, group: str, topics: Iterable[str] | None = None, *, timeout: float = 10.0
    ) -> None:
        """Block until `group` has committed every partition of `topics` (default: the topics
        its members subscribe to) up to its last stable offset; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                names = list(topics) if topics is not None else self._subscribed(group)
                lag = {(t, p): n for t in names for p, n in self.lag(group, t).items() if n}
                if names and not lag:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"group {group!r} did not commit up to the end within {timeout} s; "
                        f"lag {lag or 'unknown: no topics'}"
                    )
                self._cond.wait(min(left, 0.1))

    def _subscribed(self, group: str) -> list[str]:
        g = self._groups.get(group)
        if g is None:
            return []
        return sorted({t for m in g.members.values() for t in m.topics if t in self._topics})

    def _commit_errors(
        self, offsets: Mapping[TP, int], metadata: Mapping[TP, str | None]
    ) -> dict[TP, KafkaError]:
        errors = {}
        for tp in offsets:
            topic, partition = tp
            if not self._grow and not 0 <= partition < self._topics.get(topic, 0):
                errors[tp] = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
                continue
            md = metadata.get(tp)
            # The broker counts Java chars, and the Python client sends a trailing NUL.
            if md is not None and len(md.encode("utf-16-le")) // 2 + 1 > (
                self.offset_metadata_max_bytes
            ):
                errors[tp] = KafkaError(KafkaError.OFFSET_METADATA_TOO_LARGE)
        return errors

    def _store(
        self, group: str, offsets: Mapping[TP, int], metadata: Mapping[TP, str | None]
    ) -> None:
        store = self._offsets.setdefault(group, {})
        for tp, offset in offsets.items():
            store[tp] = (offset, metadata.get(tp))
            self._written[(group, tp)] = next(self._writes)
        self._cond.notify_all()

    def _store_key(self, group_id: str) -> str:
        """Where `group_id`'s offsets are kept: a scripted consumer's private broker keeps one
        store, whatever the group (`FakeConsumer._group_key`)."""
        return "" if self._grow else group_id

    def _unstable(self, group: str, tps: Iterable[TP]) -> bool:
        """Some of `tps` have offsets of `group` in an open transaction: a read_committed
        committed() waits for it to end (the broker answers UNSTABLE_OFFSET_COMMIT)."""
        wanted = set(tps)
        return any(wanted & txn.offsets.get(group, {}).keys() for txn in self._holding_offsets)

    # -- the transaction coordinator -----------------------------------------------------------

    def _init_transactions(self, transactional_id: str) -> int:
        """A producer initialises with `transactional_id`: its epoch, which fences every
        producer of an earlier one. The transaction an earlier one left open is aborted (its
        writes and offsets dropped), as the coordinator does."""
        with self._cond:
            held = self._transactional.setdefault(transactional_id, _TransactionalId())
            held.epoch += 1
            if held.open is not None and held.open.state == "open":
                self._end_transaction(held.open, "aborted")
            held.open = None
            return held.epoch

    def _fenced(self, transactional_id: str, epoch: int) -> bool:
        with self._lock:
            return self._transactional[transactional_id].epoch != epoch

    def _hold(self, txn: FakeTransaction) -> None:
        """`txn` writes to the broker: the open transaction of its transactional id."""
        assert txn.transactional_id is not None
        self._transactional[txn.transactional_id].open = txn

    def _send_offsets(
        self, txn: FakeTransaction, group: FakeGroupMetadata, offsets: Sequence[TopicPartition]
    ) -> KafkaError | None:
        """Add `offsets` to `txn` for the group of `group` (a TxnOffsetCommit): refused, with
        the abortable error the client raises, when the member's generation is over (or it is
        no member), a partition is unknown or a metadata string too large."""
        with self._cond:
            wanted = {_tp(p): p.offset for p in offsets}
            metadata = {_tp(p): p.metadata for p in offsets}
            refused = self._member_error(group)
            errors = dict.fromkeys(wanted, refused) if refused else {}
            errors = errors or self._commit_errors(wanted, metadata)
            if errors:
                topic, partition = first = min(errors)
                err = errors[first]
                return KafkaError(
                    err.code(),
                    "Failed to commit offsets to transaction on broker fake:9092/1: "
                    f"{topic}((null))[{partition}]({KafkaError(err.code()).str()})",
                    txn_requires_abort=True,
                )
            key = self._store_key(group.group_id)
            held = txn.offsets.setdefault(key, {})
            for tp, offset in wanted.items():
                held[tp] = (offset, metadata[tp])
                txn._sent[(key, tp)] = next(self._writes)
            self._hold(txn)
            self._holding_offsets.add(txn)
            return None

    def _member_error(self, meta: FakeGroupMetadata) -> KafkaError | None:
        """Why the group coordinator refuses a transaction's offsets sent with `meta`."""
        g = self._groups.get(meta.group_id)
        if g is None or not g.members:
            return None  # no member to check against
        if not meta.member_id and meta.generation < 0:
            # A client outside the group: the classic coordinator takes its offsets (as it
            # takes an admin's), KIP-848's refuses them.
            if g.protocol != "consumer":
                return None
            return KafkaError(KafkaError.UNKNOWN_MEMBER_ID)
        m = g.members.get(meta.member_id)
        if m is None or m.generation is None:
            return KafkaError(KafkaError.UNKNOWN_MEMBER_ID)
        if meta.generation != m.generation:
            return KafkaError(KafkaError.ILLEGAL_GENERATION)
        return None

    # -- groups --------------------------------------------------------------------------------

    def members(self, group: str) -> list[str]:
        """Member ids of the group's members, in join order."""
        with self._lock:
            g = self._groups.get(group)
            return [] if g is None else list(g.members)

    def assignments(self, group: str) -> dict[str, list[TP]]:
        """What the group has handed each member (and the member has not given back)."""
        with self._lock:
            g = self._groups.get(group)
            if g is None:
                return {}
            return {mid: sorted(m.owned or ()) for mid, m in g.members.items()}

    def wait_for_assignment(
        self, group: str, *, members: int | None = None, timeout: float = 10.0
    ) -> dict[str, list[TP]]:
        """Block until `group` has settled (with `members` members, if given): every member
        holds what the assignor gave it and no rebalance callback is pending. Returns the
        assignment (as `assignments`); TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                g = self._groups.get(group)
                if g is not None and g.members and self._settled(g, members):
                    return self.assignments(group)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"group {group!r} did not settle with {members or 'any'} members within "
                        f"{timeout} s: {self.assignments(group)}"
                    )
                self._cond.wait(min(left, 0.1))

    @staticmethod
    def _settled(g: _Group, members: int | None) -> bool:
        if members is not None and len(g.members) != members:
            return False
        for m in g.members.values():
            if not m.active or m.serving or m.steps or m.needs_revoke:
                return False
            if (m.owned or set()) != g.target.get(m.member_id, set()):
                return False
            if g.protocol == "cooperative" and m.synced_round < g.round:
                return False
            if g.protocol == "eager" and m.assigned_gen < g.generation:
                return False
        return True

    def expire(self, consumer: GroupClient) -> None:
        """Drop `consumer` from its group as if it missed `max.poll.interval.ms`: its
        partitions go to the other members at once; its next consume() serves on_lost (on_revoke
        without one) for them, returns a _MAX_POLL_EXCEEDED error event and rejoins."""
        with self._cond:
            m = consumer._member
            if m is None or not m.active:
                raise ValueError("expire() needs a consumer that is a member of a group")
            m.pending_lost = tuple(sorted(m.owned or ()))
            m.owned = None
            m.active = False
            m.steps.clear()
            m.needs_revoke = False
            m.awaiting = True
            m.assigned_gen = 0
            m.generation = None
            m.group.revoking.discard(m.member_id)
            self._rebalance(m.group)

    def _group_for(self, consumer: GroupClient) -> _Group:
        group_id = consumer._group_key()
        protocol, assignor = consumer._protocol
        g = self._groups.get(group_id)
        if g is None or not g.members:
            g = self._groups[group_id] = _Group(group_id, protocol, assignor)
        return g

    def _join(self, consumer: GroupClient, topics: Sequence[str]) -> None:
        g = self._group_for(consumer)
        if g.protocol != consumer._protocol[0]:
            consumer._injected.append(
                FakeMessage.error_event(
                    KafkaError(
                        KafkaError.INCONSISTENT_GROUP_PROTOCOL,
                        f"group {g.group_id!r} uses the {g.protocol} protocol",
                    )
                )
            )
            return
        m = consumer._member
        if m is None or m.group is not g:
            mid = f"fake-member-{next(self._member_seq):06d}"
            m = _Member(consumer, mid, tuple(topics), g)
            g.members[mid] = m
            consumer._member = m
        else:
            m.topics = tuple(topics)
            m.leaving = False
            m.active = m.pending_lost is None
        for topic in topics:
            if topic not in self._topics:
                consumer._injected.append(
                    FakeMessage.error_event(
                        KafkaError(
                            KafkaError.UNKNOWN_TOPIC_OR_PART,
                            f"Subscribed topic not available: {topic}: "
                            "Broker: Unknown topic or partition",
                        ),
                        topic,
                    )
                )
        self._rebalance(g)

    def _leave(self, consumer: GroupClient) -> bool:
        """Start leaving; True when a revoke must be served before the member is gone."""
        m = consumer._member
        if m is None:
            return False
        m.active = False
        m.leaving = True
        m.steps.clear()
        if m.owned or (m.group.protocol == "eager" and m.owned is not None):
            return True
        self._remove(m)
        return False

    def _remove(self, m: _Member) -> None:
        g = m.group
        g.members.pop(m.member_id, None)
        g.revoking.discard(m.member_id)
        if m.consumer._member is m:
            m.consumer._member = None
        self._rebalance(g)

    def _rebalance(self, g: _Group) -> None:
        active = g.active()
        if g.assignor == "range":
            g.target = _range(active, self._topics)
        elif g.assignor == "roundrobin":
            g.target = _roundrobin(active, self._topics)
        else:
            g.target = _sticky(active, self._topics)
        g.generation += 1
        if g.protocol == "eager":
            for m in active:
                if not m.awaiting and m.owned is not None:
                    m.needs_revoke = True
        elif g.protocol == "cooperative":
            g.round += 1
        self._cond.notify_all()

    def _next_step(self, m: _Member) -> tuple[str, tuple[TP, ...]] | None:
        """The member's next rebalance callback, if one is due (the group's view is updated
        for an assign at once, for a revoke only once the callback has run: `_step_done`)."""
        step = self._due(m)
        m.serving = step is not None
        if step is not None and step[0] == "assign":
            m.generation = m.group.generation
        return step

    def _due(self, m: _Member) -> tuple[str, tuple[TP, ...]] | None:
        g = m.group
        if m.steps:
            return m.steps.popleft()
        if m.pending_lost is not None:
            lost, m.pending_lost = m.pending_lost, None
            return ("lost", lost)
        if m.leaving:
            if m.owned or (g.protocol == "eager" and m.owned is not None):
                return ("revoke", tuple(sorted(m.owned or ())))
            return None
        if not m.active:
            return None
        target = g.target.get(m.member_id, set())
        owned = m.owned or set()
        if g.protocol == "eager":
            if m.needs_revoke:
                return ("revoke", tuple(sorted(owned)))
            if m.assigned_gen >= g.generation:
                return None
            # The join barrier: nobody gets a new assignment until every member revoked.
            if any(o.needs_revoke for o in g.active()) or any(
                g.owner(tp) not in (None, m) for tp in target
            ):
                return None
            m.owned = set(target)
            m.assigned_gen = g.generation
            m.awaiting = False
            return ("assign", tuple(sorted(target)))
        revoked = owned - target
        added = {tp for tp in target - owned if g.owner(tp) is None}
        if g.protocol == "cooperative":
            if m.synced_round >= g.round:
                return None
            m.synced_round = g.round
        elif not revoked and not added:
            return None
        m.owned = owned | added
        if revoked:
            if g.protocol == "cooperative":
                g.revoking.add(m.member_id)
                g.round_revoked = True
            m.steps.append(("assign", tuple(sorted(added))))
            return ("revoke", tuple(sorted(revoked)))
        return ("assign", tuple(sorted(added)))

    def _step_done(self, m: _Member, kind: str, parts: tuple[TP, ...]) -> None:
        g = m.group
        m.serving = False
        if kind == "revoke":
            if m.owned is not None:
                m.owned.difference_update(parts)
            if g.protocol == "eager":
                m.owned = set() if m.owned is not None else None
                m.needs_revoke = False
                m.awaiting = True
            if m.member_id in g.revoking:
                g.revoking.discard(m.member_id)
                if not g.revoking and g.round_revoked:
                    # Members that revoked rejoin: one more round hands out what they freed.
                    g.round_revoked = False
                    g.round += 1
            if m.leaving:
                self._remove(m)
        elif kind == "lost":
            interval = m.consumer._conf_value("max.poll.interval.ms", 300000)
            m.consumer._injected.append(
                FakeMessage.error_event(
                    KafkaError(
                        KafkaError._MAX_POLL_EXCEEDED,
                        f"Application maximum poll interval ({interval}ms) exceeded",
                    )
                )
            )
            if m.consumer.subscription is not None and not m.leaving:
                m.active = True  # the client rejoins on this poll
                self._rebalance(g)
        self._cond.notify_all()

    def _metadata(self, topic: str | None) -> ClusterMetadata:
        # The client's own metadata classes (their attributes are typed from None defaults).
        meta: Any = ClusterMetadata()
        meta.cluster_id = "fake-cluster"
        meta.controller_id = 1
        broker: Any = BrokerMetadata()
        broker.id, broker.host, broker.port = 1, "fake", 9092
        meta.brokers = {1: broker}
        names = [topic] if topic is not None else sorted(self._topics)
        for name in names:
            tm: Any = TopicMetadata()
            tm.topic = name
            count = self._topics.get(name)
            if count is None:
                tm.error = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
            for p in range(count or 0):
                pm: Any = PartitionMetadata()
                pm.id, pm.leader, pm.replicas, pm.isrs = p, 1, [1], [1]
                tm.partitions[p] = pm
            meta.topics[name] = tm
        out: ClusterMetadata = meta
        return out
