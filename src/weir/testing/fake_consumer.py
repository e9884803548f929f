"""`FakeConsumer`: the fake Kafka consumer, scripted or a member of a `FakeBroker`'s groups.

It satisfies `weir._engine.client.ConsumerClient` (mypy checks it at the end of this module, as
`weir._engine.client` checks `confluent_kafka.Consumer`), so `GroupConsumer` runs on it unchanged;
its state is a `weir.testing.fake_cluster.Cluster`'s. `weir.testing.fake` has the whole picture.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, overload

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin._metadata import ClusterMetadata

from weir.testing.fake_cluster import (
    _EARLIEST,
    _LATEST,
    TP,
    Cluster,
    FakeGroupMetadata,
    FakeMessage,
    TPLike,
    _invalid,
    _Member,
    _protocol,
    _tp,
)

__all__ = [
    "CommitCall",
    "CommittedOffsets",
    "FakeConsumer",
    "ScriptedEvent",
]


class _PartitionResult(TopicPartition):
    """A commit result with a per-partition error, as the client reports one.
    `TopicPartition.error` cannot be set from Python; this subclass reads it from a field and
    compares by topic and partition, like `TopicPartition` itself."""

    def __init__(
        self, topic: str, partition: int, offset: int, metadata: str | None, error: KafkaError
    ) -> None:
        if metadata is None:
            super().__init__(topic, partition, offset)
        else:
            super().__init__(topic, partition, offset, metadata)
        self._error = error

    @property
    def error(self) -> KafkaError | None:  # type: ignore[override]
        return self._error

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TopicPartition):
            return NotImplemented
        return (self.topic, self.partition) == (other.topic, other.partition)

    def __hash__(self) -> int:
        return hash((self.topic, self.partition))

    def __repr__(self) -> str:
        return (
            f"TopicPartition{{topic={self.topic},partition={self.partition},"
            f"offset={self.offset},error={self._error}}}"
        )


@dataclass(frozen=True)
class CommitCall:
    """One `commit()` call as the engine made it."""

    seq: int
    offsets: dict[TP, int]
    asynchronous: bool
    at: float
    thread: str
    in_callback: str | None
    """Which rebalance callback was running when the commit was made (None outside one)."""
    metadata: dict[TP, str | None] = field(default_factory=dict)
    """The metadata string sent with each partition's offset (None when none was)."""


@dataclass
class ScriptedEvent:
    """A rebalance (or arbitrary call) served on a later `consume()` call."""

    kind: str  # "assign" | "revoke" | "lost" | "call"
    partitions: tuple[TP, ...] = ()
    fn: Callable[[FakeConsumer], None] | None = field(default=None, repr=False)
    before: Callable[[], None] | None = field(default=None, repr=False)
    started: threading.Event = field(default_factory=threading.Event, repr=False)
    done: threading.Event = field(default_factory=threading.Event, repr=False)
    started_at: float | None = None
    finished_at: float | None = None
    error: BaseException | None = None

    @property
    def seconds(self) -> float | None:
        """How long serving the event took, None until it finished."""
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at


class CommittedOffsets(Mapping[TP, int]):
    """A consumer's committed offsets, read from its broker's store for its group.

    Callable as the client's `committed(partitions, timeout)`: TopicPartitions with the
    committed offset and metadata (offset -1001 and metadata None where nothing is committed).
    Under read_committed (the default) a partition whose offsets an open transaction holds
    makes it wait for that transaction to end, and raise _TIMED_OUT if it does not within
    `timeout`, as the client does while the broker answers UNSTABLE_OFFSET_COMMIT.
    Also a read-only mapping of (topic, partition) to offset (what is committed), for
    assertions."""

    def __init__(self, consumer: FakeConsumer) -> None:
        self._consumer = consumer

    def _store(self) -> dict[TP, tuple[int, str | None]]:
        c = self._consumer
        return c._broker._offsets.get(c._group_key(), {})

    def __call__(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        c = self._consumer
        c._check_open()
        out = []
        deadline = None if timeout < 0 else time.monotonic() + timeout
        with c._cond:
            tps = [_tp(p) for p in partitions]
            while c._read_committed and c._broker._unstable(c._group_key(), tps):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise KafkaException(
                        KafkaError(
                            KafkaError._TIMED_OUT,
                            "Failed to get committed offsets: Local: Timed out",
                        )
                    )
                c._cond.wait(left)
            store = self._store()
            for p in partitions:
                offset, metadata = store.get(_tp(p), (OFFSET_INVALID, None))
                if metadata is None:
                    out.append(TopicPartition(p.topic, p.partition, offset))
                else:
                    out.append(TopicPartition(p.topic, p.partition, offset, metadata))
        return out

    def __getitem__(self, key: TP) -> int:
        with self._consumer._lock:
            return self._store()[key][0]

    def __iter__(self) -> Iterator[TP]:
        with self._consumer._lock:
            return iter(list(self._store()))

    def __len__(self) -> int:
        with self._consumer._lock:
            return len(self._store())

    def __repr__(self) -> str:
        with self._consumer._lock:
            return f"CommittedOffsets({ {tp: o for tp, (o, _) in self._store().items()}!r})"


class FakeConsumer:
    """A stand-in for `confluent_kafka.Consumer`: scripted (`FakeConsumer()`) or a member of a
    `FakeBroker`'s groups (made by `broker.consumer_factory`).

    In scripted mode pass `fake.factory` as `consumer_factory`; the engine's conf dict (with its
    `on_commit` and `error_cb` callables) is kept in `fake.conf`. Rebalance mode (incremental or
    eager) follows the conf: `group.protocol=consumer` or a cooperative strategy means
    incremental.
    """

    def __init__(
        self,
        conf: dict[str, Any] | None = None,
        *,
        fetch_chunk: int | None = None,
        broker: Cluster | None = None,
    ) -> None:
        self._scripted = broker is None
        if broker is None:
            broker = Cluster(auto_create_topics=True)
            broker._grow = True
        self._broker = broker
        self._lock = broker._lock
        self._cond = broker._cond
        self.fetch_chunk = fetch_chunk
        """Most messages one partition contributes per round of a consume call (None = all)."""
        self.conf: dict[str, Any] | None = None
        self.incremental = True
        self._protocol: tuple[str, str] = ("eager", "range")
        self._read_committed = True
        self._member: _Member | None = None
        self._positions: dict[TP, int] = {}
        # Sought partitions: their application position is unknown until the next message.
        self._app_unknown: set[TP] = set()
        self._assignment: list[TP] = []
        self.paused: set[TP] = set()
        self.committed = CommittedOffsets(self)
        """`committed(partitions)` as on the client, and a read-only mapping of the offsets."""
        self.subscription: list[str] | None = None
        self._callbacks: dict[str, Callable[..., None] | None] = {}
        self._events: deque[ScriptedEvent] = deque()
        self._injected: deque[FakeMessage] = deque()
        self._error_cb_queue: deque[KafkaError] = deque()
        self._in_callback: str | None = None
        self._assign_called = False
        self._unassign_called = False
        # commits
        self._seq = itertools.count(1)
        self.calls: list[tuple[str, Any]] = []
        self.commits: list[CommitCall] = []
        self.pause_calls: list[tuple[str, tuple[TP, ...]]] = []
        self.seeks: list[tuple[TP, int]] = []
        self.assigned_at: list[dict[TP, int]] = []
        """The offset each assign call asked for, per partition (-1001: the committed one)."""
        self._pending_results: list[tuple[CommitCall, KafkaError | None]] = []
        self._scheduled_results: deque[tuple[int, KafkaError | None]] = deque()
        self.hold_commit_results = False
        """Keep async commit results until `deliver_commit_results` schedules them."""
        self.delivered_results: list[tuple[int, KafkaError | None]] = []
        self._commit_failures: deque[KafkaError] = deque()
        self.commit_failure_if: Callable[[CommitCall], KafkaError | None] | None = None
        # lifecycle / reachability
        self.unreachable: KafkaException | None = None
        self.revoke_on_close = True
        self.closed = False
        self.created = 0
        self.consume_calls = 0
        self.requested: list[int] = []
        """`num_messages` of every consume call that returned messages."""
        self.delivered: list[tuple[TP, int]] = []
        self.delivered_batches: list[tuple[FakeMessage, ...]] = []
        if conf is not None:  # FakeConsumer(conf), like Consumer(conf)
            self.factory(conf)

    # -- construction ------------------------------------------------------------------------

    def factory(self, conf: dict[str, Any]) -> FakeConsumer:
        """The `consumer_factory` to hand to `GroupConsumer`: binds the conf, returns self."""
        with self._lock:
            if self.created:
                raise RuntimeError("a FakeConsumer serves one GroupConsumer run")
            if not self._scripted and not conf.get("group.id"):
                raise ValueError("Failed to create consumer: group.id must be set")
            for key in ("on_commit", "error_cb"):
                if key in conf and not callable(conf[key]):
                    raise _invalid(f"{key} requires a callable object")
            self._protocol = _protocol(conf)
            if not self._scripted:
                reset = str(conf.get("auto.offset.reset", "latest"))
                if reset not in _EARLIEST | _LATEST:
                    raise _invalid(
                        f'Invalid value "{reset}" for configuration property "auto.offset.reset"'
                    )
            isolation = str(conf.get("isolation.level", "read_committed"))
            if isolation not in ("read_committed", "read_uncommitted"):
                raise _invalid(
                    f'Invalid value "{isolation}" for configuration property "isolation.level"'
                )
            self._read_committed = isolation == "read_committed"
            self.created += 1
            self.conf = dict(conf)
            strategy = str(conf.get("partition.assignment.strategy", "range,roundrobin"))
            self.incremental = (
                conf.get("group.protocol") == "consumer" or "cooperative-sticky" in strategy
            )
            self._record("__init__", dict(conf))
            return self

    def restarted(self) -> FakeConsumer:
        """Scripted mode: a new consumer on this one's private broker, as a restarted process
        finds it (its logs, committed offsets, transactions and producers' epochs), with
        nothing assigned. Hand its `factory` to the next `GroupConsumer`."""
        self._scripted_only("restarted")
        fresh = FakeConsumer(fetch_chunk=self.fetch_chunk)
        fresh._broker, fresh._lock, fresh._cond = self._broker, self._lock, self._cond
        return fresh

    def _conf_value(self, key: str, default: Any) -> Any:
        return (self.conf or {}).get(key, default)

    def _group_key(self) -> str:
        # A scripted consumer is alone on its private broker: one store whatever its group id.
        return "" if self._scripted else str(self._conf_value("group.id", ""))

    # -- scripting (any thread) --------------------------------------------------------------

    def produce(
        self,
        topic: str,
        partition: int,
        value: bytes | None = b"v",
        key: bytes | None = None,
        *,
        offset: int | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
        timestamp: int | None = None,
        leader_epoch: int | None = None,
    ) -> int:
        """Append one message; `offset` may leave a gap but must be above the log end."""
        tp = (topic, partition)
        with self._cond:
            if self._broker._grow:
                self._broker._ensure(tp)
            msg = FakeMessage(
                topic, partition, offset, key, value, headers, timestamp, None, leader_epoch
            )
            offset = self._broker._append(tp, msg, None, offset)
            self._cond.notify_all()
            return offset

    def produce_marker(self, topic: str, partition: int, offset: int | None = None) -> int:
        """Append a transaction marker: consume() skips it, but the read position moves past
        it, as the client's does (the offset is never delivered)."""
        off = self.produce(topic, partition, None, offset=offset)
        with self._lock:
            self._broker._logs[(topic, partition)][-1]._control = True
        return off

    def produce_many(
        self,
        topic: str,
        partition: int,
        offsets: Iterable[int],
        *,
        key: bytes | Callable[[int], bytes | None] | None = None,
        value: bytes | Callable[[int], bytes | None] | None = b"v",
    ) -> list[int]:
        """Append messages at the given (increasing, possibly gapped) offsets."""
        out = []
        for off in offsets:
            k = key(off) if callable(key) else key
            v = value(off) if callable(value) else value
            out.append(self.produce(topic, partition, v, k, offset=off))
        return out

    def _script(self, event: ScriptedEvent) -> ScriptedEvent:
        with self._cond:
            self._events.append(event)
            self._cond.notify_all()
        return event

    def _scripted_only(self, what: str) -> None:
        if not self._scripted:
            raise RuntimeError(
                f"{what} is for a scripted FakeConsumer; a broker's consumers get their "
                "partitions from the group (FakeBroker.expire stands in for a lost member)"
            )

    def script_assign(
        self, partitions: Iterable[TPLike], *, before: Callable[[], None] | None = None
    ) -> ScriptedEvent:
        """On a later consume call: call on_assign with `partitions` (the new ones when
        incremental, the whole new assignment when eager)."""
        self._scripted_only("script_assign")
        parts = tuple(_tp(p) for p in partitions)
        with self._lock:
            for tp in parts:
                self._broker._ensure(tp)
        return self._script(ScriptedEvent("assign", parts, before=before))

    def script_revoke(
        self, partitions: Iterable[TPLike], *, before: Callable[[], None] | None = None
    ) -> ScriptedEvent:
        """On a later consume call: call on_revoke with `partitions` (after `before`, if given).
        Scripted consumers only."""
        self._scripted_only("script_revoke")
        return self._script(
            ScriptedEvent("revoke", tuple(_tp(p) for p in partitions), before=before)
        )

    def script_lost(
        self, partitions: Iterable[TPLike], *, before: Callable[[], None] | None = None
    ) -> ScriptedEvent:
        """On a later consume call: call on_lost with `partitions`, as the client does when the
        member's session expired (after `before`, if given). Scripted consumers only."""
        self._scripted_only("script_lost")
        return self._script(ScriptedEvent("lost", tuple(_tp(p) for p in partitions), before=before))

    def script_call(self, fn: Callable[[FakeConsumer], None]) -> ScriptedEvent:
        """Run `fn(fake)` on the consuming thread, inside a later consume call."""
        return self._script(ScriptedEvent("call", fn=fn))

    def inject_error(
        self, error: KafkaError, topic: str | None = None, partition: int | None = None
    ) -> None:
        """The next consume call returns an error event message first (of `topic` and
        `partition`, as the client's fetch errors are)."""
        with self._cond:
            self._injected.append(FakeMessage.error_event(error, topic, partition))
            self._cond.notify_all()

    def raise_error_cb(self, error: KafkaError) -> None:
        """The next consume call calls `conf['error_cb'](error)`."""
        with self._cond:
            self._error_cb_queue.append(error)
            self._cond.notify_all()

    def fail_next_commits(self, error: KafkaError | None = None, count: int = 1) -> None:
        """The next `count` commit calls fail: async ones through on_commit(err, ...), sync ones
        by raising KafkaException."""
        err = error or KafkaError(KafkaError.REQUEST_TIMED_OUT, "fake commit failure")
        with self._lock:
            self._commit_failures.extend([err] * count)

    def deliver_commit_results(self, plan: Sequence[tuple[int, KafkaError | None]]) -> None:
        """With `hold_commit_results`, deliver the results of the given commit calls (by
        `CommitCall.seq`), in this order, on the next consume call. An error given here
        overrides success; a scheduled failure of the call is kept unless overridden."""
        with self._cond:
            self._scheduled_results.extend(plan)
            self._cond.notify_all()

    def pending_commit_seqs(self) -> list[int]:
        """The `CommitCall.seq` of every async commit whose result is not delivered yet."""
        with self._lock:
            return [c.seq for c, _ in self._pending_results]

    def given_committed(self, offsets: Mapping[TPLike, int] | None = None) -> None:
        """Set up the group as having committed these offsets before this member started (no
        commit call is recorded). With no argument: the first offset of every partition that
        holds records and has nothing committed yet, a group that starts where the log does."""
        with self._lock:
            store = self._broker._offsets.setdefault(self._group_key(), {})
            if offsets is None:
                offsets = {
                    tp: offs[0]
                    for tp, offs in self._broker._log_offsets.items()
                    if offs and tp not in store
                }
            for tp, offset in offsets.items():
                store[_tp(tp)] = (offset, None)

    def rewind(self, tp: TPLike, offset: int) -> None:
        """Move the read position back (as an offset reset or seek would)."""
        with self._cond:
            self._positions[_tp(tp)] = offset
            self._cond.notify_all()

    # -- inspection (any thread) -------------------------------------------------------------

    def commit_log(self) -> list[CommitCall]:
        """Every commit call so far, in call order (a copy)."""
        with self._lock:
            return list(self.commits)

    def commits_for(self, tp: TPLike) -> list[tuple[int, bool]]:
        """(offset, asynchronous) of every commit call that included `tp`, in call order."""
        key = _tp(tp)
        with self._lock:
            return [(c.offsets[key], c.asynchronous) for c in self.commits if key in c.offsets]

    def call_names(self) -> list[str]:
        """The names of the client calls the engine made, in order ("subscribe", "assign",
        "pause", "commit", ...)."""
        with self._lock:
            return [name for name, _ in self.calls]

    def assignment_set(self) -> set[TP]:
        """The partitions assigned now, as (topic, partition) pairs."""
        with self._lock:
            return set(self._assignment)

    def delivered_offsets(self, tp: TPLike) -> list[int]:
        """Every offset of `tp` that consume calls handed out, in order (redeliveries too)."""
        key = _tp(tp)
        with self._lock:
            return [off for t, off in self.delivered if t == key]

    def paused_set(self) -> set[TP]:
        """The partitions paused now, as (topic, partition) pairs."""
        with self._lock:
            return set(self.paused)

    # -- the Consumer surface (owner thread) -------------------------------------------------

    def _record(self, name: str, detail: Any) -> None:
        with self._lock:
            self.calls.append((name, detail))

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("Consumer closed")

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        """`Consumer.list_topics`: the fake cluster's metadata; raises `unreachable` if set, and
        an AssertionError inside a rebalance callback, where the real client aborts."""
        self._check_open()
        if self._in_callback is not None:
            # The real client aborts the whole process here (confluent-kafka's CallState_get
            # assertion): a blocking call nested in a callback served by consume().
            raise AssertionError(f"list_topics() called inside the {self._in_callback} callback")
        self._record("list_topics", timeout)
        if self.unreachable is not None:
            raise self.unreachable
        with self._lock:
            return self._broker._metadata(topic)

    def subscribe(
        self,
        topics: list[str],
        on_assign: Callable[..., None] | None = None,
        on_revoke: Callable[..., None] | None = None,
        on_lost: Callable[..., None] | None = None,
    ) -> None:
        """`Consumer.subscribe`: keeps the rebalance callbacks and, on a broker, joins its
        group; a TypeError for anything but a list, as the client's."""
        self._check_open()
        if not isinstance(topics, list):
            raise TypeError("expected list of topic unicode strings")
        self._record("subscribe", list(topics))
        with self._cond:
            self.subscription = list(topics)
            self._callbacks = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}
            if not self._scripted:
                self._broker._join(self, topics)
            self._cond.notify_all()

    def unsubscribe(self) -> None:
        """`Consumer.unsubscribe`: on a broker, leaves the group."""
        self._check_open()
        self._record("unsubscribe", None)
        with self._cond:
            self.subscription = None
            if not self._scripted:
                self._broker._leave(self)
            self._cond.notify_all()

    def close(self) -> None:
        """Like the client's close: the current assignment is revoked through on_revoke (the
        final hand-off, inside close), then the client is dead. A scripted consumer revokes
        only when `revoke_on_close` is set; a group member then leaves its group."""
        self._record("close", None)
        if self.closed:
            return
        try:
            if self._scripted:
                with self._lock:
                    owned = tuple(self._assignment)
                    serve = self.revoke_on_close and bool(owned) and self._callbacks.get("revoke")
                if serve:
                    self._serve(ScriptedEvent("revoke", owned))
            else:
                with self._lock:
                    lost = self._member.pending_lost if self._member is not None else None
                    if self._member is not None:
                        self._member.pending_lost = None
                    leaving = self._broker._leave(self)
                    member = self._member
                if lost:
                    self._serve(ScriptedEvent("lost", lost))
                if leaving and member is not None:
                    with self._lock:
                        step = self._broker._next_step(member)
                    if step is not None:
                        try:
                            self._serve(ScriptedEvent(step[0], step[1]))
                        finally:
                            with self._lock:
                                self._broker._step_done(member, *step)
        finally:
            with self._cond:
                self.closed = True
                self._assignment = []
                self._cond.notify_all()

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[FakeMessage]:
        """`Consumer.consume`: serves due commit results, error callbacks, a scripted event and
        the group's rebalances on this thread, then returns up to `num_messages` messages of
        unpaused assigned partitions (injected errors first); waits at most 0.1 s for none
        when `timeout` is not positive."""
        self._check_open()
        if not 0 <= num_messages <= 1_000_000:
            raise ValueError("num_messages must be between 0 and 1000000 (1M)")
        with self._lock:
            self.consume_calls += 1
            results = self._take_results()
            errors = list(self._error_cb_queue)
            self._error_cb_queue.clear()
            event = self._events.popleft() if self._events else None
        # Callbacks run outside the lock, on this (the consuming) thread, like librdkafka's.
        for call, err in results:
            self._deliver_result(call, err)
        error_cb = (self.conf or {}).get("error_cb")
        for e in errors:
            if error_cb is not None:
                error_cb(e)
        if event is not None:
            self._serve(event)
        self._serve_group()
        with self._cond:
            msgs = self._gather(num_messages)
            if msgs or timeout == 0 or self._has_work():
                return self._handed_out(num_messages, msgs)
            self._cond.wait(timeout if timeout > 0 else 0.1)
            if self._events:
                return []
        self._serve_group()
        with self._cond:
            return self._handed_out(num_messages, self._gather(num_messages))

    def _handed_out(self, requested: int, msgs: list[FakeMessage]) -> list[FakeMessage]:
        if msgs:
            self.requested.append(requested)
            self.delivered_batches.append(tuple(msgs))
        return msgs

    def _serve_group(self) -> None:
        """Serve the rebalance callbacks the group has for this member, as the client serves
        queued rebalance events inside one poll."""
        for _ in range(8):
            with self._lock:
                member = self._member
                step = self._broker._next_step(member) if member is not None else None
            if member is None or step is None:
                return
            try:
                self._serve(ScriptedEvent(step[0], step[1]))
            finally:
                with self._lock:
                    self._broker._step_done(member, *step)

    def _has_work(self) -> bool:
        return bool(self._events or self._injected or self._error_cb_queue or self.closed) or (
            bool(self._pending_results) and not self.hold_commit_results
        )

    def _gather(self, limit: int) -> list[FakeMessage]:
        out: list[FakeMessage] = []
        while self._injected and len(out) < limit:
            out.append(self._injected.popleft())
        logs = self._broker._logs
        offsets = self._broker._log_offsets
        progressed = True
        while len(out) < limit and progressed:
            progressed = False
            for tp in self._assignment:
                if tp in self.paused or len(out) >= limit:
                    continue
                offs = offsets.get(tp)
                if not offs:
                    continue
                pos = self._positions.get(tp, 0)
                log = logs[tp]
                i = bisect.bisect_left(offs, pos)
                take = limit - len(out)
                if self.fetch_chunk is not None:
                    take = min(take, self.fetch_chunk)
                j = i
                chunk: list[FakeMessage] = []
                while j < len(log):
                    m = log[j]
                    txn = m._txn
                    if m.control:
                        j += 1
                        continue
                    if txn is not None and self._read_committed:
                        if txn.state == "open":
                            break  # the last stable offset: nothing past it is readable yet
                        if txn.state == "aborted":
                            j += 1
                            continue
                    chunk.append(m)
                    j += 1
                    if len(chunk) >= take:
                        # Markers after the last record handed out are passed by the next
                        # consume call, as the client's position shows.
                        break
                if j > i:
                    last = log[j - 1].offset()
                    assert last is not None
                    self._positions[tp] = last + 1
                    self._app_unknown.discard(tp)
                if chunk:
                    out.extend(chunk)
                    self.delivered.extend((tp, m.offset()) for m in chunk)  # type: ignore[misc]
                    progressed = True
        return out

    def _serve(self, event: ScriptedEvent) -> None:
        event.started_at = time.monotonic()
        event.started.set()
        try:
            if event.before is not None:
                event.before()
            if event.kind == "call":
                assert event.fn is not None
                event.fn(self)
                return
            tps = [TopicPartition(t, p) for t, p in event.partitions]
            kind = event.kind
            cb = self._callbacks.get(kind)
            if kind == "lost" and cb is None:
                cb = self._callbacks.get("revoke")  # what the client does without on_lost
            with self._lock:
                self._in_callback = kind
                self._assign_called = False
                self._unassign_called = False
            try:
                if cb is not None:
                    cb(self, tps)
            except BaseException as exc:
                event.error = exc
                raise
            finally:
                with self._lock:
                    self._in_callback = None
                    # librdkafka applies the assignment change itself when the app did not.
                    if kind == "assign" and not self._assign_called:
                        if self.incremental:
                            self._add(event.partitions)
                        else:
                            self._replace(event.partitions)
                    elif kind in ("revoke", "lost") and not self._unassign_called:
                        if self.incremental:
                            self._remove(event.partitions)
                        else:
                            self._replace(())
        finally:
            event.finished_at = time.monotonic()
            event.done.set()

    def _position_for(self, tp: TP, requested: int) -> int:
        offs = self._broker._log_offsets.get(tp)
        if requested >= 0:
            return requested
        if requested == OFFSET_BEGINNING:
            return offs[0] if offs else 0
        if requested == OFFSET_END:
            return offs[-1] + 1 if offs else 0
        stored = self._broker._offsets.get(self._group_key(), {}).get(tp)
        if stored is not None and stored[0] >= 0:
            return stored[0]
        default = "earliest" if self._scripted else "latest"
        if str(self._conf_value("auto.offset.reset", default)) in _LATEST:
            return offs[-1] + 1 if offs else 0
        return offs[0] if offs else 0

    def _add(self, parts: Iterable[TP], requested: dict[TP, int] | None = None) -> None:
        for tp in parts:
            if tp not in self._assignment:
                self._assignment.append(tp)
                self._positions[tp] = self._position_for(tp, (requested or {}).get(tp, -1001))
                self._app_unknown.add(tp)  # nothing handed out yet

    def _remove(self, parts: Iterable[TP]) -> None:
        for tp in parts:
            if tp in self._assignment:
                self._assignment.remove(tp)
                self._positions.pop(tp, None)
                self._app_unknown.discard(tp)

    def _replace(self, parts: Iterable[TP], requested: dict[TP, int] | None = None) -> None:
        self._remove(list(self._assignment))
        self._add(parts, requested)

    def _wrong_family(self, incremental_call: bool) -> None:
        if self._in_callback is not None and incremental_call != self.incremental:
            raise KafkaException(KafkaError(KafkaError._STATE, "Local: Erroneous state"))

    def assign(self, partitions: list[TopicPartition]) -> None:
        """`Consumer.assign`: replaces the assignment; each partition reads from its given
        offset, else the committed one, else `auto.offset.reset`'s. `_STATE` inside an
        incremental rebalance, as the client's."""
        self._check_open()
        self._record("assign", [_tp(p) for p in partitions])
        with self._cond:
            self._wrong_family(False)
            self._assign_called = True
            self.assigned_at.append({_tp(p): p.offset for p in partitions})
            self._replace([_tp(p) for p in partitions], {_tp(p): p.offset for p in partitions})
            self._cond.notify_all()

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        """`Consumer.incremental_assign`: adds the partitions; `_INVALID_ARG` for one already
        assigned and `_STATE` inside an eager rebalance, as the client's."""
        self._check_open()
        self._record("incremental_assign", [_tp(p) for p in partitions])
        with self._cond:
            self._wrong_family(True)
            for p in partitions:
                if _tp(p) in self._assignment:
                    raise KafkaException(
                        KafkaError(KafkaError._INVALID_ARG, f"{_tp(p)} is already assigned")
                    )
            self._assign_called = True
            self.assigned_at.append({_tp(p): p.offset for p in partitions})
            self._add([_tp(p) for p in partitions], {_tp(p): p.offset for p in partitions})
            self._cond.notify_all()

    def unassign(self) -> None:
        """`Consumer.unassign`: drops the whole assignment; `_STATE` inside an incremental
        rebalance."""
        self._check_open()
        self._record("unassign", None)
        with self._lock:
            self._wrong_family(False)
            self._unassign_called = True
            self._replace(())

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        """`Consumer.incremental_unassign`: drops the partitions; `_STATE` inside an eager
        rebalance."""
        self._check_open()
        self._record("incremental_unassign", [_tp(p) for p in partitions])
        with self._lock:
            self._wrong_family(True)
            self._unassign_called = True
            self._remove([_tp(p) for p in partitions])

    def assignment(self) -> list[TopicPartition]:
        """`Consumer.assignment`: the partitions assigned now, without offsets."""
        self._check_open()
        with self._lock:
            return [TopicPartition(t, p) for t, p in self._assignment]

    def pause(self, partitions: list[TopicPartition]) -> None:
        """`Consumer.pause`: consume hands out nothing of these until resumed (recorded in
        `pause_calls`); there is no prefetch to drop, unlike the client's."""
        self._check_open()
        tps = tuple(_tp(p) for p in partitions)
        with self._lock:
            self._record("pause", tps)
            self.pause_calls.append(("pause", tps))
            self.paused.update(tps)

    def resume(self, partitions: list[TopicPartition]) -> None:
        """`Consumer.resume` (recorded in `pause_calls`)."""
        self._check_open()
        tps = tuple(_tp(p) for p in partitions)
        with self._cond:
            self._record("resume", tps)
            self.pause_calls.append(("resume", tps))
            self.paused.difference_update(tps)
            self._cond.notify_all()

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The application position: past the last message handed out (or transaction marker
        passed); -1001 after an assignment or, as in librdkafka, a seek until the next one."""
        self._check_open()
        with self._lock:
            return [
                TopicPartition(
                    p.topic,
                    p.partition,
                    -1001 if _tp(p) in self._app_unknown else self._positions.get(_tp(p), -1001),
                )
                for p in partitions
            ]

    def seek(self, partition: TopicPartition) -> None:
        """Fetching goes on from `partition.offset` (honoured as given, so a wrong seek shows
        as replay or skip); an unassigned partition fails with _STATE, as in librdkafka."""
        self._check_open()
        tp = _tp(partition)
        with self._cond:
            self._record("seek", (tp, partition.offset))
            if tp not in self._assignment:
                raise KafkaException(
                    KafkaError(
                        KafkaError._STATE,
                        f"Failed to seek to offset {partition.offset}: Local: Erroneous state",
                    )
                )
            self.seeks.append((tp, partition.offset))
            self._positions[tp] = partition.offset
            self._app_unknown.add(tp)
            self._cond.notify_all()

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        """`Consumer.get_watermark_offsets`: the log start and end now (the last stable offset
        under read_committed); `cached` and `timeout` are ignored."""
        self._check_open()
        tp = _tp(partition)
        with self._lock:
            low, high = self._broker.watermarks(*tp)
            if self._read_committed and high:
                high = self._broker._stable_end(tp)
            return (low, high)

    def offsets_for_times(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        """Per partition: the first offset whose timestamp is at or after `offset` (a time in
        ms), or the log's start for OFFSET_BEGINNING (-2) and its end (the last stable offset
        under read_committed) for OFFSET_END (-1), as a ListOffsets request answers; -1 where
        no record is that late."""
        self._check_open()
        out = []
        with self._lock:
            for p in partitions:
                tp = _tp(p)
                low, high = self._broker.watermarks(*tp)
                if self._read_committed and high:
                    high = self._broker._stable_end(tp)
                if p.offset == OFFSET_BEGINNING:
                    found = low
                elif p.offset == OFFSET_END:
                    found = high
                else:
                    found = next(
                        (
                            m.offset() or 0
                            for m in self._broker._logs.get(tp, [])
                            if not m._control and m.timestamp()[1] >= p.offset
                        ),
                        -1,
                    )
                out.append(TopicPartition(p.topic, p.partition, found))
        return out

    def memberid(self) -> str:
        """`Consumer.memberid`: "fake-member" when scripted, else the group's id for this
        member ("" before it joins)."""
        if self._scripted:
            return "fake-member"
        with self._lock:
            return self._member.member_id if self._member is not None else ""

    def consumer_group_metadata(self) -> FakeGroupMetadata:
        """`Consumer.consumer_group_metadata`, readable: group id, member id and generation (-1
        outside a generation), for `FakeProducer.send_offsets_to_transaction`."""
        with self._lock:
            m = self._member
            generation = -1 if m is None or m.generation is None else m.generation
            return FakeGroupMetadata(
                str(self._conf_value("group.id", "")), self.memberid(), generation
            )

    @overload
    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[True] = ...
    ) -> None: ...
    @overload
    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[False]
    ) -> list[TopicPartition]: ...
    def commit(
        self,
        message: Any = None,
        offsets: list[TopicPartition] | None = None,
        asynchronous: bool = True,
    ) -> list[TopicPartition] | None:
        """`Consumer.commit` with `offsets=` only (a NotImplementedError for `message=`):
        recorded in `commits`; an async one's result goes to `on_commit` on a later consume
        call, a sync one raises KafkaException on failure."""
        self._check_open()
        if message is not None:
            raise NotImplementedError("FakeConsumer.commit supports offsets= only")
        if not offsets:
            raise KafkaException(KafkaError(KafkaError._NO_OFFSET, "Local: No offset stored"))
        with self._lock:
            call = CommitCall(
                seq=next(self._seq),
                offsets={_tp(p): p.offset for p in offsets},
                asynchronous=asynchronous,
                at=time.monotonic(),
                thread=threading.current_thread().name,
                in_callback=self._in_callback,
                metadata={_tp(p): p.metadata for p in offsets},
            )
            self.commits.append(call)
            self._record("commit", call)
            err = self._commit_failures.popleft() if self._commit_failures else None
            if err is None and self.commit_failure_if is not None:
                err = self.commit_failure_if(call)
            if asynchronous:
                if err is None and not self.hold_commit_results:
                    # The broker stores it when the request arrives; the result comes later.
                    self._apply(call)
                self._pending_results.append((call, err))
                return None
            if err is not None:
                raise KafkaException(err)
            failed = self._apply(call)
            if failed:
                code = next(iter(failed.values())).code()
                raise KafkaException(KafkaError(code, f"Commit failed: {KafkaError(code).str()}"))
            return self._result_partitions(call, {})

    def _apply(self, call: CommitCall) -> dict[TP, KafkaError]:
        """Store what the broker accepts of a commit; the per-partition errors of the rest."""
        errors = self._broker._commit_errors(call.offsets, call.metadata)
        ok = {tp: off for tp, off in call.offsets.items() if tp not in errors}
        self._broker._store(self._group_key(), ok, call.metadata)
        return errors

    @staticmethod
    def _result_partitions(
        call: CommitCall, errors: Mapping[TP, KafkaError]
    ) -> list[TopicPartition]:
        out: list[TopicPartition] = []
        for (t, p), off in call.offsets.items():
            md = call.metadata.get((t, p))
            err = errors.get((t, p))
            if err is not None:
                out.append(_PartitionResult(t, p, off, md, err))
            elif md is None:
                out.append(TopicPartition(t, p, off))
            else:
                out.append(TopicPartition(t, p, off, md))
        return out

    # -- commit results ----------------------------------------------------------------------

    def _take_results(self) -> list[tuple[CommitCall, KafkaError | None]]:
        if not self.hold_commit_results:
            out = self._pending_results
            self._pending_results = []
            return out
        out = []
        while self._scheduled_results:
            seq, override = self._scheduled_results.popleft()
            for i, (call, err) in enumerate(self._pending_results):
                if call.seq == seq:
                    del self._pending_results[i]
                    out.append((call, override if override is not None else err))
                    break
            else:
                raise AssertionError(f"commit #{seq} has no pending result")
        return out

    def _deliver_result(self, call: CommitCall, err: KafkaError | None) -> None:
        errors: dict[TP, KafkaError] = {}
        with self._lock:
            self.delivered_results.append((call.seq, err))
            if err is None:
                if self.hold_commit_results:
                    errors = self._apply(call)
                else:
                    errors = self._broker._commit_errors(call.offsets, call.metadata)
                if errors:
                    # The client reports a partly failed commit as failed for every partition
                    # in it (though the broker stored the others).
                    err = next(iter(errors.values()))
                    errors = dict.fromkeys(call.offsets, err)
        on_commit = (self.conf or {}).get("on_commit")
        if on_commit is not None:
            on_commit(err, self._result_partitions(call, errors))


if TYPE_CHECKING:
    from weir._engine.client import ClientFactory, ConsumerClient, KafkaMessage

    # mypy proves the fake satisfies the same boundary as the real client (see weir._engine.client).
    def _fake_consumer(consumer: FakeConsumer) -> ConsumerClient:
        return consumer

    def _fake_message(message: FakeMessage) -> KafkaMessage:
        return message

    _fake_factory: ClientFactory = FakeConsumer().factory
