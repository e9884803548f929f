"""Batch handlers and the flush hook as the owner thread runs them.

What runs a handler's calls (`BatchWorkers`, or `AsyncBatchWorkers` for an `async def
handle_batch`), the gathered batch run
at once when nothing more can join it (a throttle, a revoke, the shutdown), and the handler's
`on_flush` before every commit: what `Settlement.flush` makes of its outcome, and the partitions
a failed flush starts over.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Collection
from functools import partial

from weir._engine.aio import AsyncBatchWorkers, AsyncWorkers
from weir._engine.bounded import CallAbandoned, call_within
from weir._engine.callbacks import Callbacks, callback_name
from weir._engine.ownership import Ownership
from weir._engine.scheduling import Orderings, lane_of
from weir._engine.settlement import Settlement
from weir._engine.starts import Starts
from weir._engine.workers import BatchLimits, BatchWorkers, ThreadWorkers, Workers
from weir.config import ConsumerConfig
from weir.logs import get_logger
from weir.records import BatchHandler, FlushContext, Handler, Partition, is_async_handler

__all__ = ["Flushing", "batch_limits", "workers_for"]

log = get_logger(__name__)

Hook = Callable[..., object]


def workers_for(
    handler: Handler,
    cfg: ConsumerConfig,
    loop: asyncio.AbstractEventLoop | None,
    orderings: Orderings | None = None,
) -> Workers:
    """What runs the handler's calls: an async handler's event loop, or a pool of worker
    threads; a `BatchHandler`'s workers join its records into `handle_batch` calls (on the
    loop, at most `max_in_flight` calls at once, for an `async def handle_batch`)."""
    outputs = True  # ctx.produce: into the transaction, or confirmed outputs (at-least-once)
    lanes = lane_of(cfg.ordering, orderings)
    if isinstance(handler, BatchHandler):
        limits = BatchLimits(cfg.batch_max_records, cfg.batch_max_bytes, cfg.batch_max_wait_s)
        if is_async_handler(handler):
            return AsyncBatchWorkers(
                handler, cfg.max_in_flight, lanes, loop, limits=limits, outputs=outputs
            )
        return BatchWorkers(handler, cfg.workers, lanes, limits=limits, outputs=outputs)
    if is_async_handler(handler):
        return AsyncWorkers(handler, cfg.max_in_flight, lanes, loop, outputs=outputs)
    return ThreadWorkers(handler, cfg.workers, lanes, outputs=outputs)


def batch_limits(workers: Workers) -> BatchLimits | None:
    """What one task may hold: a batch's limits, for batch workers (`Scheduler`); None
    otherwise."""
    return workers.limits if isinstance(workers, BatchWorkers | AsyncBatchWorkers) else None


class Flushing:
    """Owner thread only."""

    def __init__(
        self,
        handler: Handler,
        workers: Workers,
        settle: Settlement,
        own: Ownership,
        starts: Starts,
        callbacks: Callbacks,
        hook: Callable[[Hook, float], Hook],
        *,
        timeout_s: float,
        interrupt: threading.Event,
    ) -> None:
        self._batch = workers if isinstance(workers, BatchWorkers | AsyncBatchWorkers) else None
        self._settle = settle
        self._own = own
        self._starts = starts
        self._hook = hook
        self._timeout = timeout_s
        self._limit = timeout_s  # this flush's: less at the end of a revoke or a shutdown
        self._interrupt = interrupt
        flush = handler._flush_hook()
        if flush is not None:
            name = callback_name(flush)
            settle.flush_with(
                lambda ctx: callbacks.call(name, self._call, flush, name, ctx, hook_name="on_flush")
            )

    def run_gathered(self) -> None:
        """Batch workers: the batch being gathered runs now, not at the end of its wait."""
        if self._batch is not None:
            self._batch.run_now()

    def flush(self, leaving: Collection[Partition] = (), within: float | None = None) -> None:
        """Before a commit: the handler's flush hook, if it has one (`Settlement.flush`), for at
        most `flush_timeout_s` and `within` (what is left of a drain's budget). The partitions
        whose records a failed flush was to cover start over from their committed offset
        (their records run again), but those `leaving` (a hand-off): they are committed
        without them."""
        self._limit = self._timeout if within is None else max(0.0, min(self._timeout, within))
        unflushed = [tp for tp in self._settle.flush() if tp not in leaving]
        if unflushed:
            for a in self._own.reset(unflushed):
                self._starts.rewind(a.tp, reread=True)

    def _call(self, flush: Hook, name: str, ctx: FlushContext) -> None:
        """The hook under weir's deadline: a hook that hangs must not hold the owner (no
        commit, no poll past max.poll, no shutdown). An async one is cancelled on its loop at
        the deadline (`AsyncWorkers.call`); a plain one cannot be, and is left on its thread."""
        limit, run = self._limit, self._hook(flush, self._limit)
        if inspect.iscoroutinefunction(flush):  # on the loop: only async handlers have async hooks
            run(ctx)
            return
        try:
            call_within(partial(run, ctx), limit, "on_flush", interrupt=self._interrupt)
        except CallAbandoned as exc:
            log.warning(
                "flush_abandoned",
                callback=name,
                waited_s=round(exc.waited_s, 3),
                limit_s=limit,
                interrupted=exc.interrupted,
                reason="on_flush did not return within its deadline: it goes on alone on its "
                "thread, and none of the records it was to cover count (they run again)",
            )
            raise
