"""Handlers whose work is one fenced write per record or per batch, and the pruning of applied
event ids."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from weir.errors import FencedError, FenceUnavailableError, NoEpochError
from weir.fencing.base import Fence, check_group, check_seconds, refuse_unrun
from weir.logs import get_logger
from weir.records import (
    BatchContext,
    BatchHandler,
    CommitEvent,
    Context,
    Handler,
    Partition,
    Record,
)

__all__ = ["FencePruner", "FencedBatchHandler", "FencedHandler", "NoEpochError"]

log = get_logger(__name__)

ConnT = TypeVar("ConnT")


def _check_fence(fence: object) -> None:
    if not isinstance(fence, Fence):
        raise TypeError(
            f"fence must be a weir.fencing fence (SqliteFence, PostgresFence), got "
            f"{type(fence).__name__}"
        )


def _check_write(handler: object, base: type, write: object, takes: str) -> None:
    """``write`` given, or a subclass of ``base`` overriding its ``write`` method."""
    if write is None and type(handler).write is base.write:  # type: ignore[attr-defined]
        raise TypeError(f"pass write=function({takes}), or subclass and override write()")
    if write is not None and not callable(write):
        raise TypeError(f"write must be a callable taking ({takes}), got {write!r}")
    fn = write if write is not None else type(handler).write  # type: ignore[attr-defined]
    refuse_unrun(fn)


def _no_epoch(record: Record) -> NoEpochError:
    return NoEpochError(
        f"{record.event_id}: no partition epoch in the handler's context: run the consumer "
        "with the same fence, GroupConsumer(..., fence=fence)"
    )


class FencedHandler(Handler, Generic[ConnT]):
    """Runs ``write(conn, record)`` for each record through ``fence.apply``: in one database
    transaction that checks the partition's epoch (``ctx.epoch``) and records the event id.

    Give the consumer the same fence and group id, so that it acquires the epochs::

        fence = SqliteFence("ledger.db")
        handler = FencedHandler(fence, "ledger", apply_transfer)
        GroupConsumer(handler, fence=fence, group_id="ledger", ...)

    ``write`` gets the fence's connection inside its transaction and the record; it must not
    commit or roll back. Pass it, or subclass and override ``write``. A replay (the record's
    event id was applied before) does not call it. ``FencedError`` (another member owns the
    partition now) propagates: the consumer treats the partition as lost. Other errors of
    ``write`` propagate after the rollback and go through the failure policy like any
    handler's; so does ``FenceUnavailableError`` (retrying it is safe: the event id makes a
    write that did commit a no-op).

    ``applied`` and ``replayed`` count this handler's calls that wrote and that were replays.
    """

    def __init__(
        self,
        fence: Fence[ConnT],
        group_id: str,
        write: Callable[[ConnT, Record], object] | None = None,
    ) -> None:
        _check_fence(fence)
        self.group_id = check_group(group_id)
        _check_write(self, FencedHandler, write, "conn, record")
        self.fence = fence
        self._write = write
        self._lock = threading.Lock()
        self.applied = 0
        self.replayed = 0

    def write(self, conn: ConnT, record: Record) -> object:
        """The record's database writes, on ``conn`` inside the fenced transaction."""
        assert self._write is not None
        return self._write(conn, record)

    def handle(self, record: Record, ctx: Context) -> None:
        """Runs `apply(record, ctx)`: the fenced `write` of a record not applied before.
        Subclasses override `write`."""
        self.apply(record, ctx)

    def apply(self, record: Record, ctx: Context) -> bool:
        """The fenced write of ``record``: True if it was written, False for a replay."""
        epoch = ctx.epoch
        if epoch is None:
            raise _no_epoch(record)
        applied = self.fence.apply(
            self.group_id, record, epoch, lambda conn: self.write(conn, record)
        )
        with self._lock:
            if applied:
                self.applied += 1
            else:
                self.replayed += 1
        return applied

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.fence!r}, group_id={self.group_id!r})"


class FencedBatchHandler(BatchHandler, Generic[ConnT]):
    """Runs ``write(conn, records)`` for each batch through ``fence.apply_batch``: one database
    transaction that checks the epoch of every partition of the batch and records the event
    ids. A bulk sink (a multi-row insert, a ``COPY``) fenced and idempotent::

        fence = PostgresFence(dsn)
        handler = FencedBatchHandler(fence, "loader", copy_rows)
        GroupConsumer(handler, fence=fence, group_id="loader", batch_max_records=500, ...)

    ``write`` gets the fence's connection inside its transaction and the batch's records that
    were not applied before (a replayed record is left out; a batch of replays does not call
    it); it must not commit or roll back. Pass it, or subclass and override ``write``.

    A batch may span partitions. When one of them is fenced (another member acquired it), the
    transaction is refused whole: its records are marked failed with the ``FencedError``
    (``ctx.fail``: the consumer loses that partition only), and the batch's other records are
    written again without them, in a new transaction. Other errors propagate after the
    rollback and fail the batch under the failure policy; so does ``FenceUnavailableError``
    (a retry is safe: the event ids make a write that did commit a no-op).

    ``applied`` and ``replayed`` count the records this handler wrote and found applied.
    """

    def __init__(
        self,
        fence: Fence[ConnT],
        group_id: str,
        write: Callable[[ConnT, list[Record]], object] | None = None,
    ) -> None:
        _check_fence(fence)
        self.group_id = check_group(group_id)
        _check_write(self, FencedBatchHandler, write, "conn, records")
        self.fence = fence
        self._write = write
        self._lock = threading.Lock()
        self.applied = 0
        self.replayed = 0

    def write(self, conn: ConnT, records: list[Record]) -> object:
        """The batch's database writes, on ``conn`` inside the fenced transaction."""
        assert self._write is not None
        return self._write(conn, records)

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        """Runs `apply_batch(records, ctx)`: the fenced `write` of the records not applied
        before. Subclasses override `write`."""
        self.apply_batch(records, ctx)

    def apply_batch(self, records: list[Record], ctx: BatchContext) -> list[Record]:
        """The fenced write of the batch; returns the records written (not the replays, nor
        the records of fenced partitions, which are marked failed in ``ctx``)."""
        epochs: dict[Partition, int] = {}
        for record in records:
            tp = Partition(record.topic, record.partition)
            if tp not in epochs:
                epoch = ctx.epoch(record)
                if epoch is None:
                    raise _no_epoch(record)
                epochs[tp] = epoch
        pending = records
        while pending:
            try:
                written = self.fence.apply_batch(self.group_id, pending, epochs, self.write)
            except FencedError as exc:
                # Raised, it would fail the whole batch and lose every partition in it; the
                # others are still this member's, and nothing of them was committed.
                lost = exc.partition
                rest = []
                for record in pending:
                    if (record.topic, record.partition) == lost:
                        ctx.fail(record, exc)
                    else:
                        rest.append(record)
                pending = rest
                continue
            with self._lock:
                self.applied += len(written)
                self.replayed += len(pending) - len(written)
            return written
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.fence!r}, group_id={self.group_id!r})"


class FencePruner:
    """A commit listener that forgets the applied event ids below each confirmed commit.

    ``consumer.add_commit_listener(FencePruner(fence, group_id))``: records below a committed
    offset are never delivered to the group again, so their event ids are no longer needed,
    and without pruning the applied-ids table grows by a row per record. Listeners run on the
    consumer's owner thread, which must not wait for the database: the pruner only notes the
    offset there, and a thread of its own prunes each partition at most once per
    ``interval_s``. A failed prune is logged and tried again with the next round. The thread
    ends when a round finds nothing to do (the next commit starts one again), when the fence
    is closed (the consumer closes it when it stops), or at ``close()``.

    A partition whose offsets are reset to an earlier position (``kafka-consumer-groups
    --reset-offsets``) replays records whose event ids may have been pruned: they are applied
    again. Replays that the group does on its own (rebalances, restarts, zombies) always start
    at or above the committed offset.
    """

    def __init__(self, fence: Fence[object], group_id: str, *, interval_s: float = 5.0) -> None:
        _check_fence(fence)
        self.group_id = check_group(group_id)
        interval = check_seconds("interval_s", interval_s)
        assert interval is not None
        self.interval_s = interval
        self.fence = fence
        self.pruned = 0
        """Event ids removed so far."""
        self._due: dict[Partition, int] = {}
        self._done: dict[Partition, int] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def __call__(self, event: CommitEvent) -> None:
        if not event.ok:
            return
        with self._cond:
            if self._closed:
                return
            if event.offset > self._due.get(event.tp, self._done.get(event.tp, 0)):
                self._due[event.tp] = event.offset
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="weir-fence-pruner", daemon=True
                )
                self._thread.start()

    def close(self, timeout: float | None = None) -> None:
        """Stop the pruning thread (what is not pruned yet stays until a later run prunes it)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def prune_now(self) -> int:
        """Prune what is due now, on the calling thread; returns the event ids removed."""
        with self._cond:
            due, self._due = self._due, {}
        removed = 0
        for tp, offset in sorted(due.items()):
            try:
                n = self.fence.prune(self.group_id, tp, offset)
            except FenceUnavailableError as exc:
                log.warning("fence_prune_failed", tp=str(tp), offset=offset, error=str(exc))
                with self._cond:
                    if offset > self._due.get(tp, 0):
                        self._due[tp] = offset
                continue
            removed += n
            with self._cond:
                self._done[tp] = max(offset, self._done.get(tp, 0))
                self.pruned += n
            log.debug("fence_pruned", tp=str(tp), below=offset, removed=n)
        return removed

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed, self.interval_s)
                if self._closed or not self._due:
                    # Idle (the consumer stopped, or commits do not move): the next commit
                    # starts a thread again. No thread outlives its consumer for long.
                    self._thread = None
                    return
            try:
                self.prune_now()
            except RuntimeError as exc:
                # The fence was closed (the consumer stopped): nothing more to prune with it.
                log.debug("fence_pruner_stopped", reason=str(exc))
                with self._cond:
                    self._closed = True
                    self._thread = None
                return

    def __enter__(self) -> FencePruner:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
