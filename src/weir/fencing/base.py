"""What every fence shares: the protocol, argument checks and per-thread connections."""

from __future__ import annotations

import math
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Generic, Protocol, TypeGuard, TypeVar, runtime_checkable

from weir.errors import FencedError, FenceUnavailableError
from weir.logs import get_logger
from weir.records import Partition, Record, dropped_unrun, runs_nothing

__all__ = ["Fence", "FenceUnavailableError"]

log = get_logger(__name__)

ConnT = TypeVar("ConnT")
ConnT_co = TypeVar("ConnT_co", covariant=True)

DEFAULT_TABLE_PREFIX = "weir_fence"
DEFAULT_TIMEOUT_S = 10.0
# PostgreSQL truncates identifiers at 63 bytes; the longest suffix is "_applied".
_PREFIX = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,54}")


@runtime_checkable
class Fence(Protocol[ConnT_co]):
    """Partition-ownership epochs kept in a database, and fenced, idempotent writes.

    ``acquire`` is called by a new owner before the first record of a partition; ``apply`` runs
    one record's writes in one database transaction that checks the epoch and the record's event
    id, ``apply_batch`` a batch's (of one or more partitions). ``ConnT_co`` is the connection
    type they hand to the write function.
    """

    def prepare(self) -> None:
        """Connect and create the tables now (otherwise the first ``acquire`` or ``apply`` does)."""
        ...

    def acquire(self, group_id: str, partitions: Iterable[Partition]) -> dict[Partition, int]:
        """Increment and return the epoch of each partition of ``group_id`` in one transaction.

        After it returns, no write holding an older epoch of these partitions can commit.
        """
        ...

    def apply(
        self, group_id: str, record: Record, epoch: int, write: Callable[[ConnT_co], object]
    ) -> bool:
        """Run ``write(conn)`` for ``record`` in one transaction, fenced by ``epoch``.

        True: the write ran and committed together with the record's event id. False: the event
        id was already applied (a replay); ``write`` was not called and nothing changed. Raises
        ``weir.errors.FencedError`` (after rolling back) when the partition's stored epoch is not
        ``epoch``; an exception from ``write`` rolls back and propagates unchanged.
        """
        ...

    def apply_batch(
        self,
        group_id: str,
        records: Sequence[Record],
        epochs: Mapping[Partition, int],
        write: Callable[[ConnT_co, list[Record]], object],
    ) -> list[Record]:
        """Run ``write(conn, fresh)`` for a batch in one transaction, fenced by ``epochs`` (the
        epoch held for each partition of ``records``).

        ``fresh`` is the batch's records whose event ids were not applied before, in batch
        order; they are recorded together with the write. Returns ``fresh``; empty when every
        record was a replay (``write`` was not called and nothing changed). Raises
        ``weir.errors.FencedError`` for the first partition (in sorted order) whose stored
        epoch is not the one held: nothing of the batch remains, of any partition. An exception
        from ``write`` rolls back and propagates unchanged.
        """
        ...

    def prune(self, group_id: str, partition: Partition, before_offset: int) -> int:
        """Forget the applied event ids of ``partition`` below ``before_offset`` (a committed
        offset: those records are never delivered again); returns how many were removed."""
        ...

    def close(self) -> None:
        """Close every connection the fence opened. The fence cannot be used afterwards."""
        ...


class FenceBase(Fence[ConnT]):
    """``apply`` and ``apply_batch`` of a fence: their arguments checked, then one fenced
    transaction (``_fenced``, the database's own) for one record or a batch alike."""

    def apply(
        self, group_id: str, record: Record, epoch: int, write: Callable[[ConnT], object]
    ) -> bool:
        group = check_group(group_id)
        record = check_record(record)
        held = {Partition(record.topic, record.partition): check_epoch(epoch)}
        check_write(write)
        fresh = self._fenced(
            group,
            [record],
            held,
            ran(lambda conn, _fresh: write(conn), write),
            f"write {record.event_id}",
        )
        return bool(fresh)

    def apply_batch(
        self,
        group_id: str,
        records: Sequence[Record],
        epochs: Mapping[Partition, int],
        write: Callable[[ConnT, list[Record]], object],
    ) -> list[Record]:
        group = check_group(group_id)
        batch, held = check_batch(records, epochs)
        check_write(write)
        if not batch:
            return []
        what = f"write a batch of {len(batch)} records from {batch[0].event_id}"
        return self._fenced(group, batch, held, ran(write, write), what)

    def _fenced(
        self,
        group: str,
        batch: list[Record],
        held: dict[Partition, int],
        write: Callable[[ConnT, list[Record]], object],
        what: str,
    ) -> list[Record]:
        """One transaction: check the epoch of each partition of ``held`` (sorted) against the
        stored one, claim the event ids of ``batch``, ``write`` the records claimed (none: a
        replay, nothing changes), commit; returns the records claimed and written."""
        raise NotImplementedError


# --- argument checks ----------------------------------------------------------------------------


def check_group(group_id: object) -> str:
    if not isinstance(group_id, str) or not group_id:
        raise ValueError(f"group_id must be a non-empty string, got {group_id!r}")
    return group_id


def check_partitions(partitions: Iterable[Partition]) -> list[Partition]:
    """The distinct partitions, sorted: every acquirer locks rows in the same order, so two
    members acquiring overlapping sets at once cannot deadlock."""
    if isinstance(partitions, (str, bytes, Partition)):
        raise TypeError(f"partitions must be an iterable of Partition, got {partitions!r}")
    out: set[Partition] = set()
    for item in partitions:
        if (
            not isinstance(item, tuple)
            or len(item) != 2
            or not isinstance(item[0], str)
            or not item[0]
            or not _is_int(item[1])
            or item[1] < 0
        ):
            raise ValueError(
                f"partitions: each must be a Partition(topic, partition) with a non-empty topic "
                f"and a partition >= 0, got {item!r}"
            )
        out.add(Partition(item[0], item[1]))
    return sorted(out)


def check_partition(partition: object) -> Partition:
    if not isinstance(partition, tuple):
        raise ValueError(f"partition must be a Partition(topic, partition), got {partition!r}")
    return check_partitions([partition])[0]  # type: ignore[list-item]


def check_epoch(epoch: object) -> int:
    if not _is_int(epoch) or epoch < 1:
        raise ValueError(f"epoch must be an int >= 1 returned by acquire(), got {epoch!r}")
    return epoch


def check_record(record: object) -> Record:
    if not isinstance(record, Record):
        raise TypeError(f"record must be a weir.Record, got {type(record).__name__}")
    if record.offset < 0:
        raise ValueError(f"record must have an offset >= 0, got {record.offset}")
    return record


def check_batch(records: object, epochs: object) -> tuple[list[Record], dict[Partition, int]]:
    """The batch's records, and the epoch held for each of their partitions, sorted."""
    if isinstance(records, (str, bytes, Record)) or not isinstance(records, Iterable):
        raise TypeError(f"records must be a sequence of weir.Record, got {records!r}")
    if not isinstance(epochs, Mapping):
        raise TypeError(
            f"epochs must be a mapping of Partition to the epoch held, got {type(epochs).__name__}"
        )
    batch = [check_record(r) for r in records]
    held: dict[Partition, int] = {}
    seen: set[tuple[str, int, int]] = set()
    for r in batch:
        where = (r.topic, r.partition, r.offset)
        if where in seen:
            raise ValueError(f"records: {r.event_id} is in the batch twice")
        seen.add(where)
        tp = Partition(r.topic, r.partition)
        if tp not in held:
            if tp not in epochs:
                raise ValueError(f"epochs: no epoch for {tp}, the partition of {r.event_id}")
            held[tp] = check_epoch(epochs[tp])
    return batch, dict(sorted(held.items()))


def check_offset(name: str, offset: object) -> int:
    if not _is_int(offset) or offset < 0:
        raise ValueError(f"{name} must be an int >= 0, got {offset!r}")
    return offset


def check_write(write: object) -> None:
    if not callable(write):
        raise TypeError(f"write must be a callable taking the connection, got {write!r}")
    refuse_unrun(write)


def refuse_unrun(write: object) -> None:
    """A write whose call runs none of its body (`async def`, or one with a `yield`): the fence
    would commit the records' event ids without its writes."""
    if runs_nothing(write):
        raise TypeError(
            f"write {getattr(write, '__qualname__', write)} is async def or has a yield: the "
            "fence calls it inside its transaction and never awaits or iterates it, so the "
            "transaction would commit the record's event id without its writes"
        )


def ran(
    write: Callable[[ConnT, list[Record]], object], given: object
) -> Callable[[ConnT, list[Record]], object]:
    """`write` (the application's `given`), refusing a result that is a coroutine or a
    generator: its body did not run, and committing would record the event ids as applied
    with nothing written. The exception rolls the transaction back."""

    def call(conn: ConnT, fresh: list[Record]) -> object:
        result = write(conn, fresh)
        if result is not None and dropped_unrun(result):
            raise TypeError(
                f"write {getattr(given, '__qualname__', given)} returned a "
                f"{type(result).__name__}, not its work done: rolled back, nothing recorded"
            )
        return result

    return call


def check_prefix(table_prefix: object) -> str:
    if not isinstance(table_prefix, str) or not _PREFIX.fullmatch(table_prefix):
        raise ValueError(
            "table_prefix must be an SQL identifier of letters, digits and underscores, not "
            f"starting with a digit, at most 55 characters; got {table_prefix!r}"
        )
    return table_prefix


def check_seconds(name: str, value: object, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    return float(value)


def check_epochs(
    group: str,
    batch: Sequence[Record],
    held: Mapping[Partition, int],
    stored: Mapping[Partition, int | None],
) -> None:
    """Refuse the write (``FencedError``, logged) at the first partition of ``held`` whose
    stored epoch (absent: never acquired) is not the one held."""
    for tp, epoch in held.items():
        found = stored.get(tp)
        if found != epoch:
            first = next(r for r in batch if (r.topic, r.partition) == tp)
            log.warning(
                "fenced_write_refused",
                group_id=group,
                event_id=first.event_id,
                held=epoch,
                stored=found,
            )
            raise FencedError(group, tp, epoch, found)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


# --- one connection per thread -------------------------------------------------------------------


class _Slot(Generic[ConnT]):
    """A thread's connection. When the thread ends, its thread-local slot is dropped and the
    finalizer closes the connection; ``close_all`` runs the same finalizers early."""

    __slots__ = ("__weakref__", "busy", "conn", "finalizer")

    def __init__(self, conn: ConnT, close: Callable[[ConnT], None]) -> None:
        self.conn = conn
        self.busy = False
        self.finalizer = weakref.finalize(self, close, conn)


class PerThread(Generic[ConnT]):
    """One connection per thread, opened on the thread's first use.

    Handlers run on many worker threads at once, and a database connection runs one transaction
    at a time: a shared connection would serialise them, or worse, mix them.
    """

    def __init__(
        self,
        name: str,
        open_conn: Callable[[], ConnT],
        close_conn: Callable[[ConnT], None],
        usable: Callable[[ConnT], bool],
    ) -> None:
        self._name = name
        self._open = open_conn
        self._close = close_conn
        self._usable = usable
        self._local = threading.local()
        self._lock = threading.Lock()
        self._slots: weakref.WeakSet[_Slot[ConnT]] = weakref.WeakSet()
        self._closed = False

    def slot(self) -> _Slot[ConnT]:
        if self._closed:
            raise RuntimeError(f"{self._name} is closed")
        slot: _Slot[ConnT] | None = getattr(self._local, "slot", None)
        if slot is not None and not slot.busy and not self._usable(slot.conn):
            slot.finalizer()  # broken (server restarted, connection dropped): open a new one
            slot = None
        if slot is None:
            slot = _Slot(self._open(), self._close)
            with self._lock:
                if self._closed:
                    slot.finalizer()
                    raise RuntimeError(f"{self._name} is closed")
                self._slots.add(slot)
            self._local.slot = slot
        return slot

    def close_all(self) -> None:
        with self._lock:
            self._closed = True
            slots = list(self._slots)
        for slot in slots:
            slot.finalizer()

    @property
    def closed(self) -> bool:
        return self._closed


class Using(Generic[ConnT]):
    """``with Using(slot, what) as conn``: marks the thread's connection busy, so a fence call made
    from inside a write function on the same thread fails clearly instead of nesting."""

    __slots__ = ("_slot", "_what")

    def __init__(self, slot: _Slot[ConnT], what: str) -> None:
        self._slot = slot
        self._what = what

    def __enter__(self) -> ConnT:
        if self._slot.busy:
            raise RuntimeError(
                f"{self._what} called from inside a write function on the same thread: the "
                "thread's connection is in the middle of that write's transaction"
            )
        self._slot.busy = True
        return self._slot.conn

    def __exit__(self, *_exc: object) -> None:
        self._slot.busy = False


class WriteProgress:
    """How far a fenced write got: whether its write function ran, and whether it runs now.
    Errors raised inside it are the caller's; a retry after it ran would run it again."""

    __slots__ = ("called", "in_write")

    def __init__(self) -> None:
        self.called = False
        self.in_write = False
