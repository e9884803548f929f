"""A deterministic, scriptable fake of the `confluent_kafka.Consumer` surface that weir uses.

Test helper only. It reproduces the contract the engine relies on (callbacks served inside
`consume()`, async commit results delivered on a later `consume()`, pause honoured, positions
moving forward) closely enough to drive `GroupConsumer` deterministically. It is never proof of
how Kafka or librdkafka behave: anything learned here must be checked against a real broker.

Typical use::

    fake = FakeConsumer()
    fake.produce_many("t", 0, range(10))
    fake.script_assign([("t", 0)])
    gc = GroupConsumer(handler, consumer_factory=fake.factory, **settings)

Everything the engine calls is recorded (`calls`, `commits`, `pause_calls`). Scripted events and
commit-result deliveries run on the thread that calls `consume()` (the engine's owner thread), as
the real client serves callbacks from inside its poll.

Modelled on purpose (from kafka-client-facts.md and librdkafka's documented contract):
- on_assign / on_revoke / on_lost run inside consume(); without on_lost, lost goes to on_revoke;
  the assignment change is applied after the callback if the app did not apply it; calling the
  wrong assign family inside a callback fails with _STATE.
- async commit results arrive through conf['on_commit'](err, partitions) on a later consume()
  (or in any order, with `hold_commit_results` + `deliver_commit_results`); sync commits return
  the TopicPartitions or raise KafkaException.
- a paused partition returns nothing; positions only move forward unless `rewind()` is used;
  transaction markers (`produce_marker`) occupy offsets that are never delivered.
- close() revokes the current assignment through on_revoke (librdkafka's consumer_close does),
  unless `revoke_on_close` is False.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    KafkaException,
    TopicPartition,
)

__all__ = [
    "CommitCall",
    "FakeConsumer",
    "FakeMessage",
    "ScriptedEvent",
]

TP = tuple[str, int]
TPLike = TP | TopicPartition


def _tp(x: TPLike) -> TP:
    if isinstance(x, TopicPartition):
        return (x.topic, x.partition)
    topic, partition = x
    return (topic, partition)


class FakeMessage:
    """Stands in for `confluent_kafka.Message` (which cannot be built from Python)."""

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

    @property
    def control(self) -> bool:
        """A transaction marker: occupies an offset, is never returned by consume()."""
        return self._control

    @classmethod
    def error_event(
        cls, error: KafkaError, topic: str | None = None, partition: int | None = None
    ) -> FakeMessage:
        """An event message, as `consume()` returns for consumer errors."""
        return cls(topic, partition, None, error=error)

    def topic(self) -> str | None:
        return self._topic

    def partition(self) -> int | None:
        return self._partition

    def offset(self) -> int | None:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return None if self._headers is None else list(self._headers)

    def timestamp(self) -> tuple[int, int]:
        if self._timestamp is None:
            return (TIMESTAMP_NOT_AVAILABLE, 0)
        return (TIMESTAMP_CREATE_TIME, self._timestamp)

    def error(self) -> KafkaError | None:
        return self._error

    def leader_epoch(self) -> int | None:
        return self._leader_epoch

    def __len__(self) -> int:
        return len(self._value) if self._value else 0

    def __repr__(self) -> str:
        if self._error is not None:
            return f"FakeMessage(error={self._error!r})"
        return f"FakeMessage({self._topic}[{self._partition}]@{self._offset}, key={self._key!r})"


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
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at


class _Metadata:
    def __init__(self, topics: dict[str, list[int]]) -> None:
        self.topics = {name: sorted(parts) for name, parts in topics.items()}
        self.brokers = {1: "fake:9092"}


class FakeConsumer:
    """A scriptable single-member stand-in for `confluent_kafka.Consumer`.

    Pass `fake.factory` as `consumer_factory`; the engine's conf dict (with its `on_commit` and
    `error_cb` callables) is kept in `fake.conf`. Rebalance mode (incremental or eager) follows
    the conf: `group.protocol=consumer` or a cooperative strategy means incremental.
    """

    def __init__(
        self, conf: dict[str, Any] | None = None, *, fetch_chunk: int | None = None
    ) -> None:
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self.fetch_chunk = fetch_chunk
        """Most messages one partition contributes per round of a consume call (None = all)."""
        self.conf: dict[str, Any] | None = None
        self.incremental = True
        self._logs: dict[TP, list[FakeMessage]] = {}
        self._log_offsets: dict[TP, list[int]] = {}
        self._positions: dict[TP, int] = {}
        # Sought partitions: their application position is unknown until the next message.
        self._app_unknown: set[TP] = set()
        self._assignment: list[TP] = []
        self.paused: set[TP] = set()
        self.committed: dict[TP, int] = {}
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
        self.topic_partitions: dict[str, set[int]] = {}
        if conf is not None:  # FakeConsumer(conf), like Consumer(conf)
            self.factory(conf)

    # -- construction ------------------------------------------------------------------------

    def factory(self, conf: dict[str, Any]) -> FakeConsumer:
        """The `consumer_factory` to hand to `GroupConsumer`: binds the conf, returns self."""
        with self._lock:
            if self.created:
                raise RuntimeError("a FakeConsumer serves one GroupConsumer run")
            for key in ("on_commit", "error_cb"):
                if key in conf and not callable(conf[key]):
                    raise TypeError(f"conf[{key!r}] must be callable")
            if conf.get("group.protocol") == "consumer":
                # The client refuses these under KIP-848 (see kafka-client-facts.md).
                for key in (
                    "session.timeout.ms",
                    "heartbeat.interval.ms",
                    "partition.assignment.strategy",
                ):
                    if key in conf:
                        raise KafkaException(
                            KafkaError(
                                KafkaError._INVALID_ARG,
                                f"`{key}` is not supported with group.protocol=consumer",
                            )
                        )
            self.created += 1
            self.conf = dict(conf)
            strategy = str(conf.get("partition.assignment.strategy", "range,roundrobin"))
            self.incremental = (
                conf.get("group.protocol") == "consumer" or "cooperative-sticky" in strategy
            )
            self._record("__init__", dict(conf))
            return self

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
            offs = self._log_offsets.setdefault(tp, [])
            if offset is None:
                offset = offs[-1] + 1 if offs else 0
            elif offs and offset <= offs[-1]:
                raise ValueError(f"offset {offset} is not above the log end {offs[-1]} of {tp}")
            msg = FakeMessage(
                topic, partition, offset, key, value, headers, timestamp, None, leader_epoch
            )
            self._logs.setdefault(tp, []).append(msg)
            offs.append(offset)
            self.topic_partitions.setdefault(topic, set()).add(partition)
            self._cond.notify_all()
            return offset

    def produce_marker(self, topic: str, partition: int, offset: int | None = None) -> int:
        """Append a transaction marker: consume() skips it, but the read position moves past
        it, as the client's does (the offset is never delivered)."""
        off = self.produce(topic, partition, None, offset=offset)
        with self._lock:
            self._logs[(topic, partition)][-1]._control = True
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

    def script_assign(
        self, partitions: Iterable[TPLike], *, before: Callable[[], None] | None = None
    ) -> ScriptedEvent:
        """On a later consume call: call on_assign with `partitions` (the new ones when
        incremental, the whole new assignment when eager)."""
        parts = tuple(_tp(p) for p in partitions)
        with self._lock:
            for topic, p in parts:
                self.topic_partitions.setdefault(topic, set()).add(p)
        return self._script(ScriptedEvent("assign", parts, before=before))

    def script_revoke(
        self, partitions: Iterable[TPLike], *, before: Callable[[], None] | None = None
    ) -> ScriptedEvent:
        return self._script(
            ScriptedEvent("revoke", tuple(_tp(p) for p in partitions), before=before)
        )

    def script_lost(
        self, partitions: Iterable[TPLike], *, before: Callable[[], None] | None = None
    ) -> ScriptedEvent:
        return self._script(ScriptedEvent("lost", tuple(_tp(p) for p in partitions), before=before))

    def script_call(self, fn: Callable[[FakeConsumer], None]) -> ScriptedEvent:
        """Run `fn(fake)` on the consuming thread, inside a later consume call."""
        return self._script(ScriptedEvent("call", fn=fn))

    def inject_error(self, error: KafkaError) -> None:
        """The next consume call returns an error event message first."""
        with self._cond:
            self._injected.append(FakeMessage.error_event(error))
            self._cond.notify_all()

    def raise_error_cb(self, error: KafkaError) -> None:
        """The next consume call calls conf['error_cb'](error)."""
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
        with self._lock:
            return [c.seq for c, _ in self._pending_results]

    def rewind(self, tp: TPLike, offset: int) -> None:
        """Move the read position back (as an offset reset or seek would)."""
        with self._cond:
            self._positions[_tp(tp)] = offset
            self._cond.notify_all()

    # -- inspection (any thread) -------------------------------------------------------------

    def commit_log(self) -> list[CommitCall]:
        with self._lock:
            return list(self.commits)

    def commits_for(self, tp: TPLike) -> list[tuple[int, bool]]:
        """(offset, asynchronous) of every commit call that included `tp`, in call order."""
        key = _tp(tp)
        with self._lock:
            return [(c.offsets[key], c.asynchronous) for c in self.commits if key in c.offsets]

    def call_names(self) -> list[str]:
        with self._lock:
            return [name for name, _ in self.calls]

    def assignment_set(self) -> set[TP]:
        with self._lock:
            return set(self._assignment)

    def delivered_offsets(self, tp: TPLike) -> list[int]:
        key = _tp(tp)
        with self._lock:
            return [off for t, off in self.delivered if t == key]

    def paused_set(self) -> set[TP]:
        with self._lock:
            return set(self.paused)

    # -- the Consumer surface (owner thread) -------------------------------------------------

    def _record(self, name: str, detail: Any) -> None:
        with self._lock:
            self.calls.append((name, detail))

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("Consumer closed")

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> _Metadata:
        self._check_open()
        if self._in_callback is not None:
            # The real client aborts the whole process here (confluent-kafka's CallState_get
            # assertion): a blocking call nested in a callback served by consume().
            raise AssertionError(f"list_topics() called inside the {self._in_callback} callback")
        self._record("list_topics", timeout)
        if self.unreachable is not None:
            raise self.unreachable
        with self._lock:
            topics = {t: sorted(p) for t, p in self.topic_partitions.items()}
        if topic is not None:
            topics = {topic: topics.get(topic, [])}
        return _Metadata(topics)

    def subscribe(
        self,
        topics: list[str],
        on_assign: Callable[..., None] | None = None,
        on_revoke: Callable[..., None] | None = None,
        on_lost: Callable[..., None] | None = None,
    ) -> None:
        self._check_open()
        if not isinstance(topics, list):
            raise TypeError("expected list of topic unicode strings")
        self._record("subscribe", list(topics))
        with self._lock:
            self.subscription = list(topics)
            self._callbacks = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}

    def unsubscribe(self) -> None:
        self._check_open()
        self._record("unsubscribe", None)
        with self._lock:
            self.subscription = None

    def close(self) -> None:
        """Like the client's close: the current assignment is revoked through on_revoke (the
        final hand-off, inside close) when `revoke_on_close` is set, then the client is dead."""
        self._record("close", None)
        if self.closed:
            return
        with self._lock:
            owned = tuple(self._assignment)
            serve = self.revoke_on_close and bool(owned) and self._callbacks.get("revoke")
        try:
            if serve:
                self._serve(ScriptedEvent("revoke", owned))
        finally:
            with self._cond:
                self.closed = True
                self._assignment = []
                self._cond.notify_all()

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[FakeMessage]:
        self._check_open()
        if not 1 <= num_messages <= 1_000_000:
            raise ValueError("num_messages must be between 1 and 1000000 (1M)")
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
        with self._cond:
            msgs = self._gather(num_messages)
            if not msgs and timeout != 0 and not self._has_work():
                self._cond.wait(timeout if timeout > 0 else 0.1)
                if not self._events:
                    msgs = self._gather(num_messages)
            if msgs:
                self.requested.append(num_messages)
                self.delivered_batches.append(tuple(msgs))
            return msgs

    def _has_work(self) -> bool:
        return bool(self._events or self._injected or self._error_cb_queue or self.closed) or (
            bool(self._pending_results) and not self.hold_commit_results
        )

    def _gather(self, limit: int) -> list[FakeMessage]:
        out: list[FakeMessage] = []
        while self._injected and len(out) < limit:
            out.append(self._injected.popleft())
        progressed = True
        while len(out) < limit and progressed:
            progressed = False
            for tp in self._assignment:
                if tp in self.paused or len(out) >= limit:
                    continue
                offs = self._log_offsets.get(tp)
                if not offs:
                    continue
                pos = self._positions.get(tp, 0)
                log = self._logs[tp]
                i = bisect.bisect_left(offs, pos)
                take = limit - len(out)
                if self.fetch_chunk is not None:
                    take = min(take, self.fetch_chunk)
                j = i
                chunk: list[FakeMessage] = []
                while j < len(log):
                    m = log[j]
                    if not m.control:
                        if len(chunk) >= take:
                            break
                        chunk.append(m)
                    j += 1
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
        if requested >= 0:
            return requested
        if tp in self.committed:
            return self.committed[tp]
        if (self.conf or {}).get("auto.offset.reset") == "latest":
            offs = self._log_offsets.get(tp)
            return offs[-1] + 1 if offs else 0
        return 0

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
        self._check_open()
        self._record("assign", [_tp(p) for p in partitions])
        with self._cond:
            self._wrong_family(False)
            self._assign_called = True
            self._replace([_tp(p) for p in partitions], {_tp(p): p.offset for p in partitions})
            self._cond.notify_all()

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
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
            self._add([_tp(p) for p in partitions], {_tp(p): p.offset for p in partitions})
            self._cond.notify_all()

    def unassign(self) -> None:
        self._check_open()
        self._record("unassign", None)
        with self._lock:
            self._wrong_family(False)
            self._unassign_called = True
            self._replace(())

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self._check_open()
        self._record("incremental_unassign", [_tp(p) for p in partitions])
        with self._lock:
            self._wrong_family(True)
            self._unassign_called = True
            self._remove([_tp(p) for p in partitions])

    def assignment(self) -> list[TopicPartition]:
        self._check_open()
        with self._lock:
            return [TopicPartition(t, p) for t, p in self._assignment]

    def pause(self, partitions: list[TopicPartition]) -> None:
        self._check_open()
        tps = tuple(_tp(p) for p in partitions)
        with self._lock:
            self._record("pause", tps)
            self.pause_calls.append(("pause", tps))
            self.paused.update(tps)

    def resume(self, partitions: list[TopicPartition]) -> None:
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
                raise KafkaException(KafkaError(KafkaError._STATE, f"{tp} is not assigned"))
            self.seeks.append((tp, partition.offset))
            self._positions[tp] = partition.offset
            self._app_unknown.add(tp)
            self._cond.notify_all()

    def committed(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        self._check_open()
        with self._lock:
            return [
                TopicPartition(p.topic, p.partition, self.committed.get(_tp(p), -1001))
                for p in partitions
            ]

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        self._check_open()
        with self._lock:
            offs = self._log_offsets.get(_tp(partition), [])
            return (offs[0], offs[-1] + 1) if offs else (0, 0)

    def memberid(self) -> str:
        return "fake-member"

    def commit(
        self,
        message: Any = None,
        offsets: list[TopicPartition] | None = None,
        asynchronous: bool = True,
    ) -> list[TopicPartition] | None:
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
            )
            self.commits.append(call)
            self._record("commit", call)
            err = self._commit_failures.popleft() if self._commit_failures else None
            if err is None and self.commit_failure_if is not None:
                err = self.commit_failure_if(call)
            if asynchronous:
                self._pending_results.append((call, err))
                return None
            if err is not None:
                raise KafkaException(err)
            self.committed.update(call.offsets)
            return [TopicPartition(t, p, off) for (t, p), off in call.offsets.items()]

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
        with self._lock:
            self.delivered_results.append((call.seq, err))
            if err is None:
                self.committed.update(call.offsets)
        on_commit = (self.conf or {}).get("on_commit")
        if on_commit is not None:
            on_commit(err, [TopicPartition(t, p, off) for (t, p), off in call.offsets.items()])
