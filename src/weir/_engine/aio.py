"""Async handlers: an event loop runs the records of each task as coroutines.

`AsyncWorkers` implements the `Workers` protocol for `async def` handlers. The owner thread stays
the only caller of the Kafka client; what changes is who runs the records: instead of worker
threads, one event loop (a thread of weir's own, or the application's loop) with at most
`max_in_flight` records running at once.

- **Hand-offs are batched.** The owner appends tasks to an inbox and wakes the loop once per
  batch (`call_soon_threadsafe` only when no wake-up is pending). The loop splits each task into
  its lanes: the records of one lane run one after another, lanes run at once.
- **Runners, not a coroutine per record.** Up to `max_in_flight` runner coroutines take lanes
  from a ready queue and await the handler for each record; a runner lives while there is work,
  so a record costs one handler coroutine and nothing else of asyncio's.
- **Progress in bulk, out of order.** A finished record's index is appended to `Task.done`; once
  per turn of the loop the tasks with news go back to the owner as one `Progress` notice, and
  tasks that ended as themselves. The owner settles them in bulk, and frees each lane of a task
  as soon as its records are done (`Scheduler.progressed`): a slow record holds its own lane and
  its own offset in the watermark, nothing else.
- **Cancellation.** `abandon` (a revoke past its budget, or lost) cancels the coroutines running
  records of those assignments (`asyncio.Task.cancel()`); a cancelled record is never finished,
  and `ctx.cancelled` is already True for it. `stop` cancels every runner.
- **A blocked loop is reported.** A handler that blocks the loop (a synchronous sleep or call
  inside `async def`) starves every partition. A heartbeat on the loop and a watchdog thread
  notice a loop that has not turned for `lag_warn_s`; the warning names the handler coroutine
  running at that moment and where it is stuck.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Hashable, Sequence
from types import CodeType, FrameType
from typing import Any

from weir._engine.tasks import DONE, FAILED, HELD, Assignment, Task
from weir._engine.workers import (
    BatchLimits,
    BatchResult,
    Gathering,
    LaneOf,
    Progress,
    _refuse_awaitable,
    batch_calls,
    per_record,
    runs_calls_of,
)
from weir.errors import FencedError
from weir.logs import get_logger
from weir.records import (
    RETURNED,
    BatchContext,
    BatchHandler,
    Context,
    Handler,
    Output,
    Record,
    _AsyncFunctionHandler,
)

__all__ = ["AsyncBatchWorkers", "AsyncWorkers", "hook_caller"]

log = get_logger(__name__)

# How long the loop may go without turning before the watchdog warns: the threshold asyncio's
# own debug mode uses for a slow callback is 0.1 s; the heartbeat itself may be late by a few
# milliseconds on a busy machine, and a blocked loop is worth a warning well before it costs a
# rebalance.
LAG_WARN_S = 0.2
_BEAT_S = 0.05
# The least time `stop` gives the cancelled coroutines to end: a coroutine that lets its
# CancelledError through ends at once; one that does not is left behind after this.
CANCEL_GRACE_S = 0.5


class _TaskRun:
    """Loop-side state of one task: its lanes not finished yet, records held behind a failure."""

    __slots__ = ("held", "left", "task")

    def __init__(self, task: Task) -> None:
        self.task = task
        self.left = 0
        self.held: list[int] = []


class _Runner:
    """One runner coroutine: the task and record it awaits now (task None between records)."""

    __slots__ = ("aio", "record", "task")

    def __init__(self) -> None:
        self.task: Task | None = None
        self.record: Record | None = None
        self.aio: asyncio.Task[None] | None = None


_Lane = tuple[_TaskRun, Sequence[int]]


class AsyncWorkers:
    """Runs tasks on an event loop, at most `max_in_flight` records at once.

    `loop`: the application's event loop (it must be running, on another thread than the owner's,
    while the member runs); None starts a loop on a thread of weir's own.
    """

    concurrent = True

    def __init__(
        self,
        handler: Handler,
        max_in_flight: int,
        lane_of: LaneOf | None,
        loop: asyncio.AbstractEventLoop | None = None,
        *,
        lag_warn_s: float = LAG_WARN_S,
        outputs: bool = False,
    ) -> None:
        self._handler = handler
        self._outputs = outputs  # handlers may produce (a transactional member)
        self._fn: Callable[[Record], Awaitable[object]] | None = (
            handler._fn if type(handler) is _AsyncFunctionHandler else None
        )
        self._handle: Callable[[Record, Context], Awaitable[object]] = handler.handle  # type: ignore[assignment]
        self._max = max_in_flight
        self._lane_of = lane_of
        self._own_loop = loop is None
        self._loop = loop if loop is not None else asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._done: queue.SimpleQueue[Task | Progress] = queue.SimpleQueue()
        self._inbox: deque[Task] = deque()
        self._signalled = False
        self._ready: deque[_Lane] = deque()
        self._runners: set[_Runner] = set()
        self._progressed: set[Task] = set()
        self._ended: list[Task] = []
        self._flush_due = False
        self._closing = False
        self._started = False
        self._cancelled = 0
        # The watchdog: the loop stamps `_beat` every _BEAT_S; a thread checks it.
        self._lag_warn = lag_warn_s
        self._beat = 0.0
        self._loop_ident: int | None = None
        self._watch_stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.loop_blocked = 0  # times the watchdog found the loop blocked

    # -- owner thread ----------------------------------------------------------------------

    @property
    def completions(self) -> queue.SimpleQueue[Task | Progress]:
        return self._done

    @property
    def slots(self) -> int:
        return self._max

    @property
    def replaced(self) -> int:
        """Handler coroutines cancelled because their partition was handed off (revoke past
        its budget, or lost)."""
        return self._cancelled

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        if self._own_loop:
            self._thread = threading.Thread(target=self._serve, name="weir-loop", daemon=True)
            self._thread.start()
        self._beat = time.monotonic()
        self._loop.call_soon_threadsafe(self._heartbeat)
        self._watcher = threading.Thread(target=self._watch, name="weir-loop-watch", daemon=True)
        self._watcher.start()

    def submit(self, task: Task) -> None:
        self._inbox.append(task)
        if not self._signalled:
            # One wake-up of the loop per batch of tasks: the loop clears the flag before it
            # empties the inbox, so a task appended after that gets a wake-up of its own.
            self._signalled = True
            self._loop.call_soon_threadsafe(self._take)

    def abandon(self, assignments: Collection[Assignment]) -> int:
        """Cancel the handler coroutines running records of these assignments: their partition
        was lost, or revoked past its budget. They see `ctx.cancelled` already; the
        cancellation itself happens on the loop, before its next turn."""
        targets = set(assignments)
        n = sum(
            1 for r in list(self._runners) if r.task is not None and r.task.assignment in targets
        )
        with contextlib.suppress(RuntimeError):  # a closed loop runs nothing any more
            self._loop.call_soon_threadsafe(self._cancel, targets)
        return n

    def stop(self, timeout: float) -> bool:
        """Cancel every runner and, for weir's own loop, stop it and end its thread. The
        cancellations are waited for at least `CANCEL_GRACE_S`, even past `timeout` (a shutdown
        passes what is left of its budget, often nothing): stopping the loop before they were
        delivered would leave the handlers' coroutines suspended for ever instead of
        cancelled, and their `finally` blocks unrun."""
        self._watch_stop.set()
        if not self._started:
            if self._own_loop and not self._loop.is_closed():
                self._loop.close()
            return True
        deadline = time.monotonic() + max(timeout, CANCEL_GRACE_S)
        ok = True
        try:
            fut = asyncio.run_coroutine_threadsafe(self._close(), self._loop)
        except RuntimeError:
            fut = None  # the application closed its loop: nothing runs there any more
        if fut is not None:
            try:
                fut.result(max(0.0, deadline - time.monotonic()))
            except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
                fut.cancel()
                ok = False
        if self._own_loop and self._thread is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(max(0.0, deadline - time.monotonic()))
            if self._thread.is_alive():
                ok = False
            elif not self._loop.is_closed():
                self._loop.close()
        return ok

    def call(self, fn: Callable[..., Awaitable[object]], *args: Any, timeout: float) -> object:
        """Run the coroutine `fn(*args)` on the loop and wait for it, at most `timeout` seconds
        (then it is cancelled and TimeoutError raised). For async hooks, from the owner."""
        self.start()
        fut = asyncio.run_coroutine_threadsafe(_awaited(fn(*args)), self._loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            name = getattr(fn, "__qualname__", repr(fn))
            raise TimeoutError(f"{name} did not finish within {timeout:g}s") from None

    # -- the loop --------------------------------------------------------------------------

    def _serve(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            except Exception:  # pragma: no cover - best effort at exit
                log.debug("shutdown_asyncgens_failed", exc_info=True)

    def _take(self) -> None:
        """Split the tasks handed over into lanes and start runners for them."""
        self._signalled = False
        inbox = self._inbox
        ready = self._ready
        key_of = self._lane_of
        while inbox:
            task = inbox.popleft()
            run = _TaskRun(task)
            lanes = task.lanes
            n = len(task.records)
            if n == 1 or (lanes is not None and len(lanes) == 1):
                run.left = 1
                ready.append((run, range(n)))  # one lane: the task's records in order
            elif lanes is None or len(lanes) == n or key_of is None:
                run.left = n  # unordered, or a lane per record
                ready.extend([(run, (i,)) for i in range(n)])
            else:
                seqs: dict[Hashable, list[int]] = {}
                for i, rec in enumerate(task.records):
                    k = key_of(rec)
                    seq = seqs.get(k)
                    if seq is None:
                        seqs[k] = [i]
                    else:
                        seq.append(i)
                run.left = len(seqs)
                ready.extend([(run, seq) for seq in seqs.values()])
        self._spawn()

    def _spawn(self) -> None:
        want = min(len(self._ready), self._max - len(self._runners))
        create = self._loop.create_task
        for _ in range(want):
            runner = _Runner()
            self._runners.add(runner)
            runner.aio = create(self._run(runner))

    async def _run(self, runner: _Runner) -> None:
        """Take lanes from the ready queue and run their records in order, until none is left."""
        runs_calls_of(self)
        ready = self._ready
        fn = self._fn
        handle = self._handle
        clock = time.perf_counter
        try:
            while ready:
                run, idxs = ready.popleft()
                task = run.task
                a = task.assignment
                recs = task.records
                done = task.done
                assert done is not None
                if not task.started:
                    task.started = clock()
                for pos, i in enumerate(idxs):
                    if not a.dispatching:
                        break  # revoked, lost or stopping: the rest of the lane stays FENCED
                    rec = recs[i]
                    runner.task = task
                    runner.record = rec
                    t0 = clock()
                    try:
                        if fn is not None:
                            result = await fn(rec)
                        else:
                            attempts = a.attempts
                            attempt = attempts.get(rec.offset, 1) if attempts else 1
                            out: list[Output] | None = [] if self._outputs else None
                            ctx = Context(
                                a.token, attempt, rec.event_id, a.cancel, a.epoch, out, a.pause
                            )
                            try:
                                result = await handle(rec, ctx)
                            finally:
                                ctx._outputs = RETURNED  # a later ctx.produce raises
                            if out:
                                if task.outputs is None:
                                    task.outputs = {}
                                task.outputs[i] = out
                        if result is not None:
                            _refuse_awaitable(fn or handle, result, awaited=True)
                    except BaseException as exc:
                        if isinstance(exc, asyncio.CancelledError):
                            runner.task = None
                            if self._closing:
                                raise
                            if _cancelled_by_us(a):
                                # By `abandon`: the record is not finished, and the rest of
                                # its lane is fenced (its assignment no longer dispatches).
                                _uncancel()
                                break
                            # Else the handler's own CancelledError (an awaited future was
                            # cancelled): a failure like any other, never a silent stall.
                        if isinstance(exc, FencedError):
                            # Another member owns the partition now: nothing more of it runs
                            # with this stale epoch (the owner makes the partition lost).
                            a.dispatching = False
                        # A failed record holds its lane: the rest of it in this task is HELD;
                        # the task's other lanes go on.
                        if task.errors is None:
                            task.errors = {}
                        task.errors[i] = exc
                        run.held.extend(idxs[pos + 1 :])
                        break
                    # The sum of the records' handler times (lanes run at once: not the wall
                    # time), which the owner's measure of the handler time reads.
                    task.seconds += clock() - t0
                    done.append(i)
                    self._progressed.add(task)
                    if not self._flush_due:
                        self._flush_due = True
                        self._loop.call_soon(self._flush)
                runner.task = None
                run.left -= 1
                if not run.left:
                    self._end(run)
        finally:
            runner.task = None
            self._runners.discard(runner)

    def _end(self, run: _TaskRun) -> None:
        task = run.task
        done = task.done
        assert done is not None
        n = len(task.records)
        if len(done) != n:
            out = bytearray(n)  # FENCED unless said otherwise
            for i in done:
                out[i] = DONE
            for i in run.held:
                out[i] = HELD
            for i in task.errors or ():
                out[i] = FAILED
            task.outcomes = out
        self._ended.append(task)
        if not self._flush_due:
            self._flush_due = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Once per turn of the loop: what finished goes back to the owner, in bulk."""
        self._flush_due = False
        put = self._done.put
        if self._progressed:
            progressed, self._progressed = self._progressed, set()
            put(Progress(progressed))
        if self._ended:
            ended, self._ended = self._ended, []
            for task in ended:
                put(task)

    def _cancel(self, targets: set[Assignment]) -> None:
        for runner in list(self._runners):
            task, rec = runner.task, runner.record
            if task is None or rec is None or task.assignment not in targets:
                continue
            if runner.aio is not None:
                runner.aio.cancel()
                self._cancelled += 1
                log.warning(
                    "handler_cancelled",
                    tp=str(task.assignment.tp),
                    offset=rec.offset,
                    reason="its partition was handed off while the record ran",
                )

    async def _close(self) -> None:
        self._closing = True
        runners = [r.aio for r in self._runners if r.aio is not None]
        for t in runners:
            t.cancel()
        if runners:
            await asyncio.gather(*runners, return_exceptions=True)

    # -- the watchdog ----------------------------------------------------------------------

    def _heartbeat(self) -> None:
        if self._loop_ident is None:
            self._loop_ident = threading.get_ident()
        self._beat = time.monotonic()
        if not self._watch_stop.is_set():
            self._loop.call_later(_BEAT_S, self._heartbeat)

    def _watch(self) -> None:
        warned = False
        while not self._watch_stop.wait(_BEAT_S):
            lag = time.monotonic() - self._beat - _BEAT_S
            if lag < self._lag_warn:
                warned = False
                continue
            if warned:
                continue
            warned = True
            self.loop_blocked += 1
            handler, where = self._blocker()
            log.warning(
                "event_loop_blocked",
                handler=handler,
                where=where,
                blocked_s=round(lag, 3),
                reason="a coroutine blocks the event loop (a synchronous call inside async "
                "def?): no record of any partition runs meanwhile",
            )

    def _blocker(self) -> tuple[str | None, str | None]:
        """The weir handler running on the loop thread now, and the innermost frame."""
        ident = self._loop_ident
        frame = sys._current_frames().get(ident) if ident is not None else None
        if frame is None:
            return None, None
        where = f"{_name(frame.f_code)} ({frame.f_code.co_filename}:{frame.f_lineno})"
        f: FrameType | None = frame
        while f is not None:
            back = f.f_back
            if back is not None and back.f_code in _RUN_CODES:
                return _name(f.f_code), where
            f = back
        return None, where


def _name(code: CodeType) -> str:
    return getattr(code, "co_qualname", code.co_name)


def _cancelled_by_us(*assignments: Assignment) -> bool:
    """Whether the runner was cancelled (`abandon` cancels only records of assignments it has
    already marked cancelled); before 3.11 tasks do not say, and the marks decide."""
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    if cancelling is not None:
        return bool(cancelling())
    return all(a.cancel.is_set() for a in assignments)


def _uncancel() -> None:
    """Forget the cancellation just caught (3.11+), so structured concurrency in the handler's
    next records (`asyncio.timeout`, task groups) is not confused by it."""
    task = asyncio.current_task()
    uncancel = getattr(task, "uncancel", None)
    if uncancel is not None:
        uncancel()


async def _awaited(aw: Awaitable[object]) -> object:
    return await aw


class AsyncBatchWorkers(AsyncWorkers):
    """Runs an `async def handle_batch` on the event loop: the threaded `BatchWorkers` with
    coroutines for threads. Tasks handed over wait in a queue; one batch at a time is gathered
    from it (`Gathering`, the same rules as on threads), and runs as a coroutine of its own
    (`batch_calls`: the call, the splitting calls, the outcomes), at most `max_in_flight` of
    them at once. Each task comes back whole when its batch ends, as a thread's does (not
    `concurrent`): the scheduler holds a task's lanes until then, so the ordering mode holds
    across batches exactly as with threads.

    A batch is cancelled (`abandon`) only once every partition it holds is given up on: while
    one is still owned, its records must run to the end of the call. `stop` cancels every batch.
    """

    concurrent = False

    def __init__(
        self,
        handler: BatchHandler,
        max_batches: int,
        lane_of: LaneOf | None,
        loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: BatchLimits,
        lag_warn_s: float = LAG_WARN_S,
        outputs: bool = False,
    ) -> None:
        super().__init__(
            handler, max_batches, lane_of, loop, lag_warn_s=lag_warn_s, outputs=outputs
        )
        self._handle_batch: Callable[[list[Record], BatchContext], Awaitable[object]] = (
            handler.handle_batch  # type: ignore[assignment]
        )
        self.limits = limits
        self._queue: deque[Task] = deque()  # handed over, not in a batch yet
        self._gathering: Gathering | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._nudged = False
        self._batches: dict[asyncio.Task[None], list[Task]] = {}  # running, with their tasks
        self._abandoned: set[asyncio.Task[None]] = set()  # of those, the ones cancelled

    def run_now(self) -> None:
        """Owner thread: the batch being gathered runs now (`BatchWorkers.run_now`)."""
        if self._gathering is not None and not self._nudged:
            self._nudged = True
            with contextlib.suppress(RuntimeError):  # a closed loop runs nothing any more
                self._loop.call_soon_threadsafe(self._run_now)

    def abandon(self, assignments: Collection[Assignment]) -> int:
        targets = set(assignments)
        n = sum(1 for tasks in list(self._batches.values()) if _given_up(tasks, targets))
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._cancel, targets)
        return n

    # -- the loop --------------------------------------------------------------------------

    def _take(self) -> None:
        self._signalled = False
        inbox = self._inbox
        while inbox:
            self._queue.append(inbox.popleft())
        self._form()

    def _run_now(self) -> None:
        self._nudged = False
        if self._gathering is not None:
            self._launch()
        self._form()

    def _form(self) -> None:
        """Gather from the queue while a batch may start: a full batch, or one that cannot
        take the next task, runs at once; one that is not full runs at the end of its wait."""
        queued = self._queue
        while queued:
            batch = self._gathering
            if batch is None:
                if len(self._batches) >= self._max:
                    return  # every slot runs a batch: the next one is gathered when one ends
                batch = self._gathering = Gathering(queued.popleft(), self.limits)
            elif batch.add(queued[0]):
                queued.popleft()
            else:
                self._launch()
                continue
            if batch.full:
                self._launch()
        batch = self._gathering
        if batch is not None and self._timer is None:
            left = batch.deadline - time.perf_counter()
            if left > 0:
                self._timer = self._loop.call_later(left, self._run_now)
            else:
                self._launch()

    def _launch(self) -> None:
        batch, self._gathering = self._gathering, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if batch is not None and not self._closing:
            self._batches[self._loop.create_task(self._batch(batch.tasks))] = batch.tasks

    async def _batch(self, tasks: list[Task]) -> None:
        runs_calls_of(self)
        t0 = time.perf_counter()
        calls = batch_calls(tasks, self._lane_of, outputs=self._outputs)
        try:
            call = next(calls)
            while True:
                call = calls.send(await self._call_batch(tasks, *call))
        except StopIteration:
            pass
        except asyncio.CancelledError:
            if self._closing:
                raise
            # By `abandon`: every partition of the batch was given up on, so none of its
            # records count (FENCED); the tasks come back for the owner's bookkeeping.
            _uncancel()
            for t in tasks:
                t.outcomes = bytearray(len(t.records))
                t.finished = 0
                t.outputs = None
        finally:
            me = asyncio.current_task()
            assert me is not None
            self._batches.pop(me, None)
            self._abandoned.discard(me)
        per_record(tasks, time.perf_counter() - t0)
        self._ended += tasks
        if not self._flush_due:
            self._flush_due = True
            self._loop.call_soon(self._flush)
        self._form()  # a slot is free

    async def _call_batch(
        self, tasks: list[Task], records: list[Record], ctx: BatchContext
    ) -> BatchResult:
        """One `handle_batch` call: what it raised (None: it returned). A cancellation weir
        caused goes on up (`_batch`); the handler's own is a failure."""
        try:
            result = await self._handle_batch(records, ctx)
            if result is not None:
                _refuse_awaitable(self._handle_batch, result, awaited=True)
        except asyncio.CancelledError as exc:
            if self._closing or _cancelled_by_us(*(t.assignment for t in tasks)):
                raise
            return exc
        except BaseException as exc:
            return exc
        return None

    def _cancel(self, targets: set[Assignment]) -> None:
        for aio, tasks in list(self._batches.items()):
            if aio in self._abandoned or not _given_up(tasks, targets):
                continue
            self._abandoned.add(aio)
            aio.cancel()
            self._cancelled += 1
            log.warning(
                "batch_cancelled",
                partitions=sorted({str(t.assignment.tp) for t in tasks}),
                records=sum(len(t.records) for t in tasks),
                reason="every partition of the batch was handed off while handle_batch ran",
            )

    async def _close(self) -> None:
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batches = list(self._batches)
        for t in batches:
            t.cancel()
        if batches:
            await asyncio.gather(*batches, return_exceptions=True)


# The frames that await a handler: what the watchdog looks for under a blocked loop.
_RUN_CODES: frozenset[CodeType] = frozenset(
    {AsyncWorkers._run.__code__, AsyncBatchWorkers._call_batch.__code__}
)


def _given_up(tasks: list[Task], targets: set[Assignment]) -> bool:
    """Every partition of a batch is given up on: these `targets` now, or cancelled before."""
    return all(t.assignment in targets or t.assignment.cancel.is_set() for t in tasks)


def hook_caller(
    fn: Callable[..., object], workers: object, timeout: float
) -> Callable[..., object]:
    """What calls a handler hook: the hook itself, or for an `async def` hook of an async
    handler a call that runs it on the handler's loop and waits for it, at most `timeout`.
    A result that is a coroutine or a generator (`return self.flush_async()`, the await left
    out) did none of the hook's work, so it fails like a hook that raised; for `on_flush`
    that keeps a commit from passing records still only in its buffer."""
    if not inspect.iscoroutinefunction(fn) or not isinstance(workers, AsyncWorkers):

        def plain(*args: Any) -> object:
            result = fn(*args)
            if result is not None:
                _refuse_awaitable(fn, result, hook=True)
            return result

        return plain
    on = workers

    def on_loop(*args: Any) -> object:
        result = on.call(fn, *args, timeout=timeout)
        if result is not None:
            _refuse_awaitable(fn, result, awaited=True)
        return result

    return on_loop
