"""`FakeProducer`: the fake Kafka producer on a `weir.testing.fake_cluster.Cluster`, plain (a
dead-letter producer) or transactional (an exactly-once member's).

It satisfies `weir._engine.client.TransactionalProducer` (mypy checks it at the end of this module,
as `weir._engine.client` checks `confluent_kafka.Producer`) and does what librdkafka's producer does
as far as weir relies on it, checked against a real broker by the contract suite (tests/contract/ in
weir's repository):

- a transaction's records are written at once but read_committed consumers see them only once
  it commits, never if it aborts; offsets sent to it are committed with it, and until it ends a
  read_committed `committed()` of those partitions waits (UNSTABLE_OFFSET_COMMIT);
- `init_transactions` with a transactional id fences every older producer with that id and
  aborts the transaction it left open; the older one learns it at its next write or call to the
  coordinator (a fatal `_FENCED`, then raised by every transactional call), while a transaction
  of its that holds nothing still commits, locally;
- offsets sent with the group metadata of a member whose generation is over, or that left, are
  refused abortably (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID), and so are those of an unknown
  partition, once the call's timeout has passed (the client asks again until then);
- a record the broker refuses (too large, unknown topic) fails its delivery report and the
  transaction: commit raises an abortable error, and so does every call but abort until then;
  the next transaction that writes to that partition fails too (OUT_OF_ORDER_SEQUENCE_NUMBER),
  as librdkafka's sequence numbers have a gap there;
- delivery reports are served by `poll`, `flush`, `commit_transaction` and `abort_transaction`,
  on the thread that calls them.

For tests it also fails, hangs and refuses on request (`fail_next`, `hang_next`,
`fail_deliveries`) and keeps a log (`calls`, `transactions`, `reports`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin._metadata import ClusterMetadata

from weir.testing.fake_cluster import (
    TP,
    Cluster,
    FakeGroupMetadata,
    FakeMessage,
    FakeTransaction,
    _bytes,
    _headers,
    _invalid,
)

if TYPE_CHECKING:
    from weir._engine.client import DeliveryCallback

__all__ = ["CALLS", "FakeProducer"]

T = TypeVar("T")

CALLS = (
    "init_transactions",
    "begin_transaction",
    "produce",
    "send_offsets_to_transaction",
    "commit_transaction",
    "abort_transaction",
    "poll",
    "flush",
)
"""The calls `fail_next` and `hang_next` take."""
# The calls that reach the transaction coordinator: their effect may happen and the answer be lost.
_COORDINATOR = frozenset(
    {"init_transactions", "send_offsets_to_transaction", "commit_transaction", "abort_transaction"}
)

State = Literal["plain", "init", "ready", "in_transaction", "abortable", "fatal"]
# librdkafka's names, in its "Operation not valid in state ..." errors.
_STATE_NAMES: dict[State, str] = {
    "plain": "Init",
    "init": "Init",
    "ready": "Ready",
    "in_transaction": "InTransaction",
    "abortable": "AbortableError",
    "fatal": "FatalError",
}
_FENCING = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)
_FENCED_TEXT = "Local: This instance has been fenced by a newer instance"


@dataclass(frozen=True)
class _Fault:
    error: BaseException | KafkaError | None  # None: hang until released
    applied: bool


class FakeProducer:
    """A stand-in for `confluent_kafka.Producer` on a `Cluster` (`FakeBroker.producer_factory`,
    or `FakeProducer(conf, broker=...)`). With `transactional.id` in `conf` it is transactional:
    `init_transactions` first, then produce only inside a transaction."""

    def __init__(self, conf: Mapping[str, Any], *, broker: Cluster) -> None:
        tid = conf.get("transactional.id")
        if tid is not None and (not isinstance(tid, str) or not tid):
            raise _invalid(f'Invalid value for configuration property "transactional.id": {tid!r}')
        self.conf = dict(conf)
        """The configuration it was made with."""
        self.transactional_id: str | None = tid
        self._broker = broker
        self._lock = threading.RLock()
        self._state: State = "init" if tid else "plain"
        self._epoch = -1
        self._txn: FakeTransaction | None = None
        self._error: KafkaError | None = None  # abortable or fatal: what the calls raise
        self._raise_once: KafkaError | None = None  # a fatal error the next poll/flush raises
        self._reports: deque[tuple[DeliveryCallback | None, KafkaError | None, FakeMessage]]
        self._reports = deque()
        self._gaps: set[TP] = set()  # partitions a refused record left a sequence gap in
        self._resume: str | None = None  # a call whose effect happened but whose answer was lost
        self._faults: dict[str, deque[_Fault]] = {}
        self._refusals: deque[KafkaError | None] = deque()  # None: the record is written
        self._hang = threading.Condition()
        self._hanging = 0
        self._released = 0
        self.hangs = 0
        """How many calls began to hang (`hang_next`), ever."""
        self.calls: list[str] = []
        """The name of every call made, in order."""
        self.transactions: list[FakeTransaction] = []
        """Every transaction it began, in order, with what it wrote and the offsets sent to it."""
        self.reports: list[tuple[KafkaError | None, FakeMessage]] = []
        """Every delivery report served, in order: its error (None: written) and message."""

    def __repr__(self) -> str:
        return f"FakeProducer(transactional_id={self.transactional_id!r}, state={self._state})"

    @property
    def state(self) -> State:
        """Where its transactional state machine is: plain (not transactional), init (before
        init_transactions), ready, in_transaction, abortable (abort next), fatal."""
        with self._lock:
            return self._state

    @property
    def epoch(self) -> int:
        """The producer epoch its init_transactions got (-1 before)."""
        with self._lock:
            return self._epoch

    # -- faults (any thread) -------------------------------------------------------------------

    def fail_next(
        self,
        call: str,
        error: KafkaError | BaseException,
        *,
        count: int = 1,
        applied: bool = False,
    ) -> None:
        """The next `count` calls of `call` (a name in `CALLS`) raise `error`: a KafkaError in a
        KafkaException (one marked fatal or txn_requires_abort puts the producer in that state,
        as the client's own would), anything else as it is (BufferError: a full queue).
        `applied`: the call takes effect at the coordinator before it fails (init_transactions,
        send_offsets_to_transaction, commit_transaction, abort_transaction: a timeout or a
        broker gone after the request arrived); the same call made again returns at once, as
        librdkafka resumes a call that timed out."""
        if count < 1:
            raise ValueError(f"count must be >= 1, not {count}")
        self._plan(call, _Fault(error, applied), count)

    def hang_next(self, call: str, *, applied: bool = False) -> None:
        """The next call of `call` blocks, whatever its timeout, until `release()` (as
        librdkafka's transactional calls were seen to across a broker restart); then it goes on
        as if it had just been made, or, `applied`, returns: its effect happened before it
        blocked."""
        self._plan(call, _Fault(None, applied), 1)

    def release(self) -> None:
        """End every hang begun so far."""
        with self._hang:
            self._released = self.hangs
            self._hang.notify_all()

    @property
    def hanging(self) -> int:
        """How many of its calls are blocked now (`hang_next`)."""
        with self._hang:
            return self._hanging

    def fail_deliveries(self, error: KafkaError, count: int = 1, *, after: int = 0) -> None:
        """The broker refuses `count` records produced with `error`, the first of them `after`
        records from now: they are not written, their delivery reports carry it, and a
        transaction they were in can only abort (or, for a fencing code, the producer is
        fenced)."""
        if count < 1 or after < 0:
            raise ValueError(f"count must be >= 1 and after >= 0, not {count} and {after}")
        with self._lock:
            self._refusals.extend([None] * after + [error] * count)

    def _plan(self, call: str, fault: _Fault, count: int) -> None:
        if call not in CALLS:
            raise ValueError(f"unknown call {call!r}: one of {', '.join(CALLS)}")
        if fault.applied and call not in _COORDINATOR:
            raise ValueError(f"{call} does not reach the coordinator: applied= does not apply")
        with self._lock:
            self._faults.setdefault(call, deque()).extend([fault] * count)

    def _call(self, name: str, effect: Callable[[], T]) -> T:
        """One client call: its planned fault (before its effect, or after it when applied),
        its effect."""
        with self._lock:
            self.calls.append(name)
            planned = self._faults.get(name)
            fault = planned.popleft() if planned else None
        if fault is not None and not fault.applied:
            self._act(fault)
        result = effect()
        if fault is not None and fault.applied:
            if fault.error is not None:
                with self._lock:
                    self._resume = name
            self._act(fault)
        return result

    def _act(self, fault: _Fault) -> None:
        if fault.error is None:
            with self._hang:
                self.hangs += 1
                mine = self.hangs
                self._hanging += 1
                self._hang.notify_all()
                while self._released < mine:
                    self._hang.wait()
                self._hanging -= 1
            return
        err = fault.error
        if not isinstance(err, KafkaError):
            raise err
        with self._lock:
            if err.fatal():
                self._become_fatal(err)
            elif err.txn_requires_abort() and self._state == "in_transaction":
                self._state, self._error = "abortable", err
        raise KafkaException(err)

    # -- transactions ----------------------------------------------------------------------

    def init_transactions(self, timeout: float = -1) -> None:
        """`Producer.init_transactions`: takes the transactional id's next epoch, which fences
        an older producer with the same id."""

        def effect() -> None:
            with self._lock:
                self._transactional()
                if self._resumed("init_transactions"):
                    return
                if self._state != "init":
                    raise _not_valid(self._state)
                assert self.transactional_id is not None
                self._epoch = self._broker._init_transactions(self.transactional_id)
                self._state = "ready"

        self._call("init_transactions", effect)

    def begin_transaction(self) -> None:
        """`Producer.begin_transaction`: opens a `FakeTransaction`, kept in `transactions`."""

        def effect() -> None:
            with self._lock:
                self._transactional()
                self._resume = None
                if self._error is not None:
                    raise KafkaException(self._error)
                if self._state != "ready":
                    raise _not_valid(self._state)
                self._txn = FakeTransaction(self._broker, self.transactional_id)
                self.transactions.append(self._txn)
                self._state = "in_transaction"

        self._call("begin_transaction", effect)

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = -1
    ) -> None:
        """`Producer.send_offsets_to_transaction`: the group's offsets commit with the
        transaction. `group_metadata` must be a `FakeConsumer.consumer_group_metadata()`."""
        if not isinstance(group_metadata, FakeGroupMetadata):
            raise TypeError(
                "group_metadata must be a fake consumer's consumer_group_metadata(), not "
                f"{type(group_metadata).__name__}"
            )

        def effect() -> None:
            with self._lock:
                self._transactional()
                if self._resumed("send_offsets_to_transaction"):
                    return
                txn = self._open()
                self._check_fence("Failed to add offsets to transaction")
                # librdkafka leaves out what is no offset (OFFSET_INVALID and the like).
                offsets = [p for p in positions if p.offset >= 0]
                if not offsets:
                    return
                err = self._broker._send_offsets(txn, group_metadata, offsets)
                if err is None:
                    return
                self._state, self._error = "abortable", err
            if err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART and timeout > 0:
                time.sleep(timeout)  # the client asks again until its timeout
            raise KafkaException(err)

        self._call("send_offsets_to_transaction", effect)

    def commit_transaction(self, timeout: float = -1) -> None:
        """`Producer.commit_transaction`: serves the delivery reports first, then commits; a
        fenced producer's fails for good."""

        def effect() -> None:
            self._serve()  # librdkafka flushes, and serves the delivery reports, first
            with self._lock:
                self._transactional()
                if self._resumed("commit_transaction"):
                    return
                txn = self._open()
                self._end(txn, "committed")

        self._call("commit_transaction", effect)

    def abort_transaction(self, timeout: float = -1) -> None:
        """`Producer.abort_transaction`: serves the delivery reports first, then aborts."""

        def effect() -> None:
            self._serve()
            with self._lock:
                self._transactional()
                if self._resumed("abort_transaction"):
                    return
                if self._state not in ("in_transaction", "abortable"):
                    raise _not_valid(self._state)
                assert self._txn is not None
                self._end(self._txn, "aborted")

        self._call("abort_transaction", effect)

    def _transactional(self) -> None:
        if self.transactional_id is None:
            raise KafkaException(
                KafkaError(
                    KafkaError._NOT_CONFIGURED,
                    "The Transactional API requires transactional.id to be configured",
                )
            )
        if self._state == "fatal":
            assert self._error is not None
            raise KafkaException(self._error)

    def _resumed(self, name: str) -> bool:
        """The call before this one took effect but failed (`applied`): this one returns."""
        resumed, self._resume = self._resume == name, None
        return resumed

    def _open(self) -> FakeTransaction:
        """The open transaction a call works on; the abortable error while it must abort."""
        if self._state == "abortable":
            assert self._error is not None
            raise KafkaException(self._error)
        if self._state != "in_transaction":
            raise _not_valid(self._state)
        assert self._txn is not None
        return self._txn

    def _check_fence(self, doing: str) -> None:
        """A call that reaches the coordinator learns of a newer producer with this id."""
        assert self.transactional_id is not None
        if self._broker._fenced(self.transactional_id, self._epoch):
            err = KafkaError(KafkaError._FENCED, f"{doing}: {_FENCED_TEXT}", fatal=True)
            self._become_fatal(err)
            raise KafkaException(err)

    def _end(self, txn: FakeTransaction, state: Literal["committed", "aborted"]) -> None:
        if txn.partitions or txn.offsets:
            self._check_fence("Failed to end transaction")
            self._broker._end_transaction(txn, state)
        else:
            txn.state = state  # nothing reached the broker: librdkafka ends it locally
        self._state, self._error, self._txn = "ready", None, None

    def _become_fatal(self, err: KafkaError) -> None:
        self._state, self._error, self._raise_once = "fatal", err, err

    # -- producing ---------------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        callback: DeliveryCallback | None = None,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        """`Producer.produce`: the record is written at once, its delivery report served by the
        next `poll` or `flush`. A transactional producer produces only inside a transaction."""

        def effect() -> None:
            with self._lock:
                if self.transactional_id is not None:
                    if self._state == "fatal":
                        raise KafkaException(
                            KafkaError(
                                KafkaError._FATAL, "Unable to produce message: Local: Fatal error"
                            )
                        )
                    if self._state != "in_transaction":
                        raise KafkaException(
                            KafkaError(
                                KafkaError._STATE,
                                "Unable to produce message: Local: Erroneous state",
                            )
                        )
                key_b, value_b = _bytes(key, "key"), _bytes(value, "value")
                hdrs = _headers(headers)
                report = on_delivery or callback
                msg, err = self._write(topic, key_b, value_b, partition, hdrs, timestamp)
                self._reports.append((report, err, msg))

        self._call("produce", effect)

    def _write(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int,
        headers: list[tuple[str, bytes | None]] | None,
        timestamp: int,
    ) -> tuple[FakeMessage, KafkaError | None]:
        """Write one record, or have the broker refuse it: the message its delivery report
        carries, and the report's error."""
        broker = self._broker
        with broker._lock:
            try:
                placed = broker._place(topic, key, None if partition < 0 else partition)
            except KafkaException as exc:
                err = exc.args[0]
                if err.code() == KafkaError._UNKNOWN_PARTITION:
                    raise  # the client knows the partition count and refuses it at once
                return self._refused(topic, -1, key, value, headers, err), err
            tp = (topic, placed)
            planned = self._refusals.popleft() if self._refusals else None
            if self._txn is not None and broker._fenced(self.transactional_id or "", self._epoch):
                err = KafkaError(
                    KafkaError.INVALID_PRODUCER_EPOCH,
                    "Broker: Producer attempted an operation with an old epoch",
                )
            elif planned is not None:
                err = planned
            elif self._txn is not None and tp in self._gaps:
                self._gaps.discard(tp)
                err = KafkaError(KafkaError._PURGE_QUEUE, "Local: Purged in queue")
                self._fail_transaction(
                    KafkaError(
                        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
                        "skipped sequence numbers",
                        txn_requires_abort=True,
                    )
                )
                return self._refused(topic, placed, key, value, headers, err), err
            else:
                try:
                    broker._check_size(topic, key, value, headers)
                except KafkaException as exc:
                    err = exc.args[0]
                else:
                    if self._txn is not None:
                        broker._hold(self._txn)
                    stamp = timestamp or None
                    msg = broker._produce(topic, key, value, placed, headers, stamp, self._txn)
                    return msg, None
            return self._refused(topic, placed, key, value, headers, err), err

    def _refused(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]] | None,
        err: KafkaError,
    ) -> FakeMessage:
        """A record the broker refused: what it does to a transaction, and its report."""
        if self._txn is not None:
            if err.code() in _FENCING:
                self._become_fatal(
                    KafkaError(
                        KafkaError._FENCED,
                        f"ProduceRequest for {topic} [{partition}] with 1 message(s) failed: "
                        f"{err.str()}: transactional producer fenced by newer producer instance",
                        fatal=True,
                    )
                )
            elif err.code() != KafkaError._PURGE_QUEUE:
                if partition >= 0:
                    self._gaps.add((topic, partition))
                self._fail_transaction(
                    KafkaError(
                        err.code(),
                        f"ProduceRequest for {topic} [{partition}] with 1 message(s) failed: "
                        f"{err.str()}: current transaction must be aborted",
                        txn_requires_abort=True,
                    )
                )
        return FakeMessage(topic, partition, None, key, value, headers, error=err)

    def _fail_transaction(self, err: KafkaError) -> None:
        if self._state == "in_transaction":
            self._state, self._error = "abortable", err

    def poll(self, timeout: float = -1) -> int:
        """Serve the delivery reports due (none is ever in flight: it does not wait)."""
        return self._call("poll", self._serve)

    def flush(self, timeout: float = -1) -> int:
        """Serve the delivery reports due; 0: nothing is left in the queue."""

        def effect() -> int:
            self._serve()
            return 0

        return self._call("flush", effect)

    def _serve(self) -> int:
        """Delivery reports, on the calling thread, outside any lock; then a fatal error that
        arose is raised, once, as the client raises it from the poll that serves its event."""
        with self._lock:
            due = list(self._reports)
            self._reports.clear()
        for report, err, msg in due:
            with self._lock:
                self.reports.append((err, msg))
            if report is not None:
                report(err, msg)
        with self._lock:
            once, self._raise_once = self._raise_once, None
        if once is not None:
            raise KafkaException(once)
        return len(due)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        """`Producer.list_topics`: the fake cluster's metadata."""
        with self._broker._lock:
            return self._broker._metadata(topic)

    def __len__(self) -> int:
        """Delivery reports not served yet."""
        with self._lock:
            return len(self._reports)


def _not_valid(state: State) -> KafkaException:
    return KafkaException(
        KafkaError(KafkaError._STATE, f"Operation not valid in state {_STATE_NAMES[state]}")
    )


if TYPE_CHECKING:
    from weir._engine.client import ProducerClient, TransactionalProducer

    # mypy proves the fake satisfies the same boundary as the real client (see weir._engine.client).
    def _fake_producer(producer: FakeProducer) -> TransactionalProducer:
        return producer

    def _fake_plain_producer(producer: FakeProducer) -> ProducerClient:
        return producer
