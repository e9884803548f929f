"""Who runs tasks: a pool of worker threads that hands every task back on one queue.

The owner thread submits tasks and reads `completions`; workers only run handlers. A worker
checks its assignment's fence before each record, so the rest of a task whose partition was
revoked or lost comes back `FENCED` without running. A worker stuck in a handler past a hand-off
is replaced, so a hung call never takes capacity from the partitions that are still owned.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import queue
import threading
import time
from collections.abc import Callable, Collection, Generator, Hashable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from weir._engine.tasks import DONE, FAILED, FENCED, HELD, Assignment, Task
from weir.errors import AwaitableReturned, FencedError, GeneratorReturned
from weir.logs import get_logger
from weir.records import (
    RETURNED,
    BatchContext,
    BatchHandler,
    Context,
    Handler,
    Output,
    Partition,
    Record,
    _FunctionHandler,
    _PartContext,
    dropped_unrun,
)

__all__ = [
    "AwaitableReturned",
    "BatchCall",
    "BatchLimits",
    "BatchWorkers",
    "Completions",
    "Gathering",
    "GeneratorReturned",
    "Progress",
    "ThreadWorkers",
    "Workers",
    "batch_calls",
    "per_record",
    "runs_calls_of",
    "workers_running_here",
]

log = get_logger(__name__)

LaneOf = Callable[[Record], Hashable]

# The workers (one member's) whose handler calls run here: set by each worker thread, and by
# each coroutine that runs an async handler's calls (a task's context is its own). A handler
# that joins its own member would wait for itself (`GroupConsumer.join`, `join_async`). The
# workers, not the handler: one Handler instance may serve several members.
_running_for: ContextVar[object | None] = ContextVar("weir_running_for", default=None)


def runs_calls_of(workers: object) -> None:
    """This thread, or this asyncio task, runs the handler calls of `workers` from now on."""
    _running_for.set(workers)


def workers_running_here() -> object | None:
    return _running_for.get()


class Progress(list[Task]):
    """Concurrent workers' notice that these tasks, still running, finished more records (listed
    in `Task.done`): the owner settles them and frees the lanes they are done with. A task is
    never named in a notice after the task itself came back."""

    __slots__ = ()


class Completions(Protocol):
    """The queue tasks come back on (owner side): each task once, when it ended; with concurrent
    workers also `Progress` notices."""

    def get(self, block: bool = ..., timeout: float | None = ...) -> Task | Progress: ...
    def get_nowait(self) -> Task | Progress: ...


class Workers(Protocol):
    """Runs the tasks the owner submits and hands each back once on `completions`."""

    @property
    def completions(self) -> Completions: ...
    @property
    def slots(self) -> int:
        """How many tasks run at once."""
        ...

    @property
    def concurrent(self) -> bool:
        """False: a worker runs a task's records one after another, counting them in
        `Task.finished`. True: a task's lanes run at once, its records finish in any order and
        are listed in `Task.done`, with `Progress` notices on `completions` (an event loop)."""
        ...

    @property
    def replaced(self) -> int:
        """Workers replaced because their handler call outlived a hand-off."""
        ...

    def start(self) -> None: ...
    def submit(self, task: Task) -> None: ...
    def abandon(self, assignments: Collection[Assignment]) -> int:
        """These assignments were given up on (revoke past its budget, lost): their running
        handler calls no longer count as capacity. Returns how many were replaced."""
        ...

    def stop(self, timeout: float) -> bool:
        """Ask every worker to exit; True if all did within `timeout`. Never blocks longer."""
        ...


def _refuse_awaitable(
    fn: Callable[..., object],
    result: object,
    *,
    awaited: bool = False,
    hook: bool = False,
) -> None:
    """A handler that returns an awaitable or a generator did not do its work: the coroutine's
    body never ran, nor the generator's (it runs only when iterated). Counting the record
    finished would commit it unprocessed, so it is a failure. `awaited`: `fn` is `async def`
    and `result` is what its coroutine returned (`return save(record)`, the await left out).
    `hook`: `fn` is a plain hook, run on the owner thread."""
    generator = inspect.isgenerator(result) or inspect.isasyncgen(result)
    if not dropped_unrun(result):
        return
    name = getattr(fn, "__qualname__", repr(fn))
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is not None:  # a lambda's name alone says little
        name += f" ({code.co_filename}:{code.co_firstlineno})"
    if generator:
        raise GeneratorReturned(
            f"handler {name} returned a {type(result).__name__} instead of doing its work: a "
            "generator's body runs only when it is iterated, and weir does not iterate it. "
            "Remove the yield and do the work in the call"
        )
    if awaited:
        raise AwaitableReturned(
            f"async handler {name} returned a {type(result).__name__} instead of awaiting "
            "it, so its work never ran: await it (await save(record), not return "
            "save(record))"
        )
    if hook:
        raise AwaitableReturned(
            f"hook {name} returned a {type(result).__name__} instead of doing its work: it "
            "runs on the owner thread, where nothing awaits it. Do the work to its end inside "
            "the hook, or make the handler and its hooks async def"
        )
    raise AwaitableReturned(
        f"handler {name} returned a {type(result).__name__} instead of doing its work: "
        "it runs on worker threads, where nothing awaits it. Make it async def (weir then "
        "runs it on an event loop), or make it do the work and return None"
    )


class _Slot:
    """One worker thread: the task it runs now, and whether it leaves after that task."""

    __slots__ = ("batch", "retired", "since", "task", "thread")

    def __init__(self) -> None:
        self.task: Task | None = None
        self.batch: list[Task] = []  # batch workers: every task of the batch it runs
        self.since = 0.0
        self.retired = False
        self.thread: threading.Thread | None = None


class ThreadWorkers:
    """`count` worker threads feeding one completion queue."""

    concurrent = False

    def __init__(
        self, handler: Handler, count: int, lane_of: LaneOf | None, *, outputs: bool = False
    ) -> None:
        self._handler = handler
        self._outputs = outputs  # handlers may produce (a transactional member)
        self._fn = handler._fn if type(handler) is _FunctionHandler else None
        self._lane_of = lane_of
        self._count = count
        self._ready: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[Task] = queue.SimpleQueue()
        self._slots: list[_Slot] = []
        self._names = itertools.count()
        self._started = False
        self._replaced = 0

    @property
    def completions(self) -> queue.SimpleQueue[Task]:
        return self._done

    @property
    def slots(self) -> int:
        return self._count

    @property
    def replaced(self) -> int:
        return self._replaced

    def start(self) -> None:
        if not self._started:
            self._started = True
            for _ in range(self._count):
                self._spawn()

    def submit(self, task: Task) -> None:
        self._ready.put(task)

    def abandon(self, assignments: Collection[Assignment]) -> int:
        """A replacement thread starts for every worker running a task of these assignments;
        the stuck one leaves once its call returns (if ever)."""
        n = 0
        now = time.perf_counter()
        for slot in list(self._slots):
            task = slot.task
            if slot.retired or task is None:
                continue
            if not any(t.assignment in assignments for t in slot.batch or (task,)):
                continue
            slot.retired = True
            self._slots.remove(slot)
            rec = task.records[0]
            log.warning(
                "worker_replaced",
                tp=str(task.assignment.tp),
                first_offset=rec.offset,
                records=len(task.records),
                running_s=round(now - slot.since, 3),
                reason="its handler call outlived the partition's hand-off",
            )
            self._spawn()
            n += 1
        self._replaced += n
        return n

    def stop(self, timeout: float) -> bool:
        slots = list(self._slots)
        for _ in slots:
            self._ready.put(None)
        deadline = time.monotonic() + timeout
        for slot in slots:
            t = slot.thread
            if t is not None and t.is_alive():
                t.join(max(0.0, deadline - time.monotonic()))
        return not any(s.thread is not None and s.thread.is_alive() for s in slots)

    def _spawn(self) -> None:
        slot = _Slot()
        slot.thread = threading.Thread(
            target=self._work, args=(slot,), name=f"weir-worker-{next(self._names)}", daemon=True
        )
        self._slots.append(slot)
        slot.thread.start()

    # -- worker threads --------------------------------------------------------------------

    def _work(self, slot: _Slot) -> None:
        runs_calls_of(self)
        ready = self._ready
        while not slot.retired:
            task = ready.get()
            if task is None:
                return
            self._run(slot, task)
            # Nothing of the task stays referenced while this worker waits for the next one:
            # 16 idle workers each holding their last task kept its settled records alive.
            del task

    def _run(self, slot: _Slot, task: Task) -> None:
        """One task, then back to the owner (its records die with this frame, once settled)."""
        clock = time.perf_counter
        fn = self._fn
        handle: Callable[[Record, Context], object] = self._handler.handle
        slot.task = task
        recs = task.records
        # The records are taken one by one from an iterator the owner may empty (`Task.it`):
        # next() and list() on a list iterator are each atomic under the GIL, so a record
        # the owner moves to another worker is never run here.
        task.it = it = iter(recs)
        # Every loop counts its finished records in `task.finished` as they finish: a
        # plain store, read by the owner when it wakes (long tasks, `Task.report`) and
        # before a hand-off commit, so records finished ahead of a slow task-mate count.
        task.started = slot.since = t0 = clock()
        a = task.assignment
        i = 0
        try:
            if fn is not None and not task.report:
                # The common fast case (a plain function, no progress to count) gets a loop
                # of its own: it runs once per record.
                for rec in it:
                    if not a.dispatching:
                        break
                    result = fn(rec)
                    if result is not None:
                        _refuse_awaitable(fn, result)
                    i += 1
                    task.finished = i
            else:
                token, cancel, attempts, epoch = a.token, a.cancel, a.attempts, a.epoch
                pause = a.pause
                outputs = self._outputs
                for rec in it:
                    if not a.dispatching:
                        break
                    if fn is not None:
                        result = fn(rec)
                    else:
                        attempt = attempts.get(rec.offset, 1) if attempts else 1
                        out: list[Output] | None = [] if outputs else None
                        ctx = Context(token, attempt, rec.event_id, cancel, epoch, out, pause)
                        try:
                            result = handle(rec, ctx)
                        finally:
                            ctx._outputs = RETURNED  # a later ctx.produce raises
                        if out:
                            if task.outputs is None:
                                task.outputs = {}
                            task.outputs[i] = out
                    if result is not None:
                        _refuse_awaitable(fn or handle, result)
                    i += 1
                    task.finished = i
        except BaseException as exc:
            self._after_failure(task, i, exc)
        else:
            if i < len(recs):
                task.outcomes = bytearray(b"\x01" * i + bytes(len(recs) - i))  # rest FENCED
        task.seconds = clock() - t0
        slot.task = None
        self._done.put(task)

    def _after_failure(self, task: Task, index: int, exc: BaseException) -> None:
        """Record a failure and run the rest of the task one record at a time: records of the
        failed lane are held back, every other lane goes on."""
        recs = task.records
        out = task.outcomes = bytearray(len(recs))
        out[:index] = b"\x01" * index
        out[index] = FAILED
        task.errors = {index: exc}
        a = task.assignment
        if isinstance(exc, FencedError):
            # Another member owns the partition now: no worker runs another record of this
            # assignment (tasks already handed out included), before the owner hears of it.
            a.dispatching = False
            return  # the rest stay FENCED
        lane_of = self._lane_of
        held = set() if lane_of is None else {lane_of(recs[index])}
        handle: Callable[[Record, Context], object] = self._handler.handle
        it = task.it if task.it is not None else iter(recs[index + 1 :])
        for j, rec in enumerate(it, index + 1):
            if not a.dispatching:
                break  # the rest stay FENCED
            if lane_of is not None and lane_of(rec) in held:
                out[j] = HELD
                continue
            try:
                produced: list[Output] | None = None
                if self._fn is not None:
                    result = self._fn(rec)
                else:
                    attempt = a.attempts.get(rec.offset, 1) if a.attempts else 1
                    produced = [] if self._outputs else None
                    ctx = Context(
                        a.token, attempt, rec.event_id, a.cancel, a.epoch, produced, a.pause
                    )
                    try:
                        result = handle(rec, ctx)
                    finally:
                        ctx._outputs = RETURNED
                if result is not None:
                    _refuse_awaitable(self._fn or handle, result)
                if produced:
                    if task.outputs is None:
                        task.outputs = {}
                    task.outputs[j] = produced
            except BaseException as e:
                out[j] = FAILED
                task.errors[j] = e
                if isinstance(e, FencedError):
                    a.dispatching = False  # as above
                    break
                if lane_of is not None:
                    held.add(lane_of(rec))
            else:
                out[j] = DONE


class BatchLimits(NamedTuple):
    """What one `handle_batch` call may hold: `batch_max_records`, `batch_max_bytes` (None: no
    bound), and how long a batch that is not full waits for more (`batch_max_wait_s`)."""

    records: int
    nbytes: int | None
    wait: float


class Gathering:
    """A batch being formed of whole tasks, by either batch workers (`BatchWorkers` on threads,
    `weir._engine.aio.AsyncBatchWorkers` on an event loop): they differ only in how they wait
    for the next task. A task that would take the batch over a limit does not join it: the
    batch closes before it, and it starts the next one. A first task over a limit is a batch
    alone (the scheduler cuts tasks at the limits, so only a single record larger than
    `batch_max_bytes` is)."""

    __slots__ = ("deadline", "limits", "nbytes", "records", "tasks")

    def __init__(self, first: Task, limits: BatchLimits) -> None:
        # Taken before the fence check (`batch_calls`): a revoke waits for the tasks some
        # worker holds, and this one may run once its fence is read.
        first.started = now = time.perf_counter()
        self.limits = limits
        self.tasks = [first]
        self.records = len(first.records)
        self.nbytes = first.nbytes
        self.deadline = now + limits.wait  # `time.perf_counter()`

    @property
    def full(self) -> bool:
        limits = self.limits
        return self.records >= limits.records or (
            limits.nbytes is not None and self.nbytes >= limits.nbytes
        )

    def add(self, task: Task) -> bool:
        """`task` joins the batch; False if it would take the batch over a limit (it does not
        join: the batch is done, and `task` starts the next one)."""
        limits = self.limits
        if self.records + len(task.records) > limits.records or (
            limits.nbytes is not None and self.nbytes + task.nbytes > limits.nbytes
        ):
            return False
        task.started = time.perf_counter()
        self.tasks.append(task)
        self.records += len(task.records)
        self.nbytes += task.nbytes
        return True


# One `handle_batch` call asked for by `batch_calls`: its records and context; and what the
# call did: what it raised (None: it returned). Its marks are read from the context.
BatchCall = tuple[list[Record], BatchContext]
BatchResult = BaseException | None


def batch_calls(
    tasks: list[Task], lane_of: LaneOf | None, *, outputs: bool = False
) -> Generator[BatchCall, BatchResult, None]:
    """The `handle_batch` calls of one gathered batch, and each record's outcome, shared by the
    threaded and the async batch workers: it yields each call to make and is sent back what the
    call did. One call for the records of `tasks` whose assignment still dispatches (the others
    come back FENCED without running), then, if it failed as a batch holding a record whose
    retries are spent, the splitting calls (`_split`). At the end every task has its outcomes:
    done, failed (alone, or with its whole batch), or held behind a failed record of its lane.
    `outputs` (a transactional member): each record that is done takes the outputs produced for
    it (`BatchContext.produce`) in the call that finished it; every other output is dropped.
    """
    live: list[Task] = []
    for t in tasks:
        if t.assignment.dispatching:
            live.append(t)
        else:
            t.outcomes = bytearray(len(t.records))  # FENCED
    if not live:
        return
    records: list[Record] = []
    parts: dict[Partition, _PartContext] = {}
    for t in live:
        a = t.assignment
        records += t.records
        parts[a.tp] = _PartContext(a.token, a.cancel, a.attempts, a.epoch, a.pause)
    ctx = BatchContext(records, parts, outputs=outputs)
    error = yield records, ctx
    marks, outs = ctx._returned()
    produced: dict[int, list[Output]] = {}
    if error is None and not marks:
        at = 0
        for t in live:
            if outs:
                _outputs_of(t, outs, at)
            t.finished = len(t.records)  # after its outputs: the owner may read it at once
            at += len(t.records)
        return
    results: list[BaseException | None] = [marks.get(i, error) for i in range(len(records))]
    if outs:
        _produced(produced, outs, range(len(records)), results)
    shared: set[int] = set()
    if error is not None:
        rest = [i for i in range(len(records)) if i not in marks]
        if len(rest) > 1:
            owners = [t.assignment for t in live for _ in t.records]
            if any(records[i].offset in owners[i].isolate for i in rest):
                split = _Split(records, owners, parts, results, lane_of, outputs, produced)
                split.hold(i for i, e in marks.items() if e is not None)
                yield from split.halves(rest)
            else:
                shared.update(rest)
    at = 0
    for t in live:
        _outcomes(t, results, shared, at, lane_of, produced)
        at += len(t.records)


def _produced(
    produced: dict[int, list[Output]],
    outputs: dict[int, list[Output]],
    indexes: Sequence[int],
    results: list[BaseException | None],
) -> None:
    """The outputs one call produced for the records `indexes` of the batch (`outputs` by
    their place in the call) that it finished. A record is finished by one call at most (a
    split calls again only the records that failed), and a failed record's outputs are
    dropped: the call that finishes it produces them again."""
    for j, i in enumerate(indexes):
        if results[i] is None:
            out = outputs.get(j)
            if out:
                produced[i] = out


def _outputs_of(t: Task, outputs: dict[int, list[Output]], at: int) -> None:
    """`t`'s outputs (`Task.outputs`, by its own indexes) from the batch's, where `t`'s records
    start at `at`."""
    mine = {i - at: out for i, out in outputs.items() if at <= i < at + len(t.records)}
    if mine:
        t.outputs = mine


@dataclass(slots=True)
class _Split:
    """A batch that failed as a whole while it held a record whose retries are spent: halved
    until the records that fail alone are found (`halves`)."""

    records: list[Record]
    owners: list[Assignment]
    parts: dict[Partition, _PartContext]
    results: list[BaseException | None]
    lane_of: LaneOf | None
    outputs: bool
    # Index into the batch -> the outputs of the call that finished it (`_produced`).
    produced: dict[int, list[Output]]
    # In key and partition mode, lane -> its first record that failed on its own.
    held: dict[tuple[Partition, Hashable], int] = field(default_factory=dict)

    def hold(self, failed: Iterable[int]) -> None:
        """Records `failed` failed on their own: in key and partition mode the later records
        of their lanes must not run before them."""
        lane_of = self.lane_of
        if lane_of is not None:
            for i in sorted(failed):
                self.held.setdefault((self.owners[i].tp, lane_of(self.records[i])), i)

    def halves(self, failed: list[int]) -> Generator[BatchCall, BatchResult, None]:
        """The records `failed` (indices into the batch, in batch order) failed together: run
        each half again, and halve what fails again, until the records that fail alone are
        found. Each of those gets its own error; the others finish. A record behind one that
        failed alone in its lane is not run again: it is held behind it."""
        lane_of, held, records, owners = self.lane_of, self.held, self.records, self.owners
        mid = len(failed) // 2
        for half in (failed[:mid], failed[mid:]):
            if lane_of is not None and held:
                half = [i for i in half if held.get((owners[i].tp, lane_of(records[i])), i) >= i]
            if not half:
                continue
            call = [records[i] for i in half]
            ctx = BatchContext(call, self.parts, outputs=self.outputs)
            error = yield call, ctx
            marks, outs = ctx._returned()
            for j, i in enumerate(half):
                self.results[i] = marks.get(j, error)
            if outs is not None:
                _produced(self.produced, outs, half, self.results)
            self.hold(half[j] for j, e in marks.items() if e is not None)
            rest = [i for j, i in enumerate(half) if j not in marks]
            if error is None or not rest:
                continue
            if len(rest) == 1:
                self.hold(rest)
            else:
                yield from self.halves(rest)


def _outcomes(
    t: Task,
    results: list[BaseException | None],
    shared: set[int],
    at: int,
    lane_of: LaneOf | None,
    produced: dict[int, list[Output]],
) -> None:
    """Outcomes of `t`, whose records start at `at` in the batch. In key and partition mode
    a failed record holds its lane: its lane's later records in the task are HELD (they run
    again after it, in order), even if the handler finished them. Only DONE records keep the
    outputs produced for them."""
    n = len(t.records)
    out = bytearray(n)
    errors: dict[int, BaseException] = {}
    held: set[object] = set()
    a = t.assignment
    for i, rec in enumerate(t.records):
        error = results[at + i]
        if lane_of is not None and held and lane_of(rec) in held:
            out[i] = HELD
        elif error is None:
            out[i] = DONE
            if produced:
                outputs = produced.get(at + i)
                if outputs:
                    if t.outputs is None:
                        t.outputs = {}
                    t.outputs[i] = outputs
        else:
            out[i] = FAILED
            errors[i] = error
            if at + i in shared:
                if t.shared is None:
                    t.shared = set()
                t.shared.add(i)
            if isinstance(error, FencedError):
                # Another member owns the partition: nothing more of it runs here.
                a.dispatching = False
            if lane_of is not None:
                held.add(lane_of(rec))
    if a.dispatching is False and any(isinstance(e, FencedError) for e in errors.values()):
        for i in range(n):
            if out[i] != DONE and i not in errors:
                out[i] = FENCED
    if errors:
        t.outcomes, t.errors = out, errors
    else:
        t.finished = n  # HELD only ever follows a failure: every record is DONE


# On the ready queue of batch workers: the batch being gathered runs now (`run_now`).
_RUN_NOW = Task(Assignment(Partition("", -1), -1), [], [], None)


class BatchWorkers(ThreadWorkers):
    """Worker threads that run a `BatchHandler`: a worker gathers tasks from the ready queue
    into one batch (`Gathering`: up to the `BatchLimits`, for at most their wait after its
    first task) and calls `handle_batch` once for all of them (`batch_calls`); then every task
    goes back on the completion queue with its outcomes, to be settled as any task is.

    The batch is made of whole tasks, and a task holds its lanes until it comes back
    (`weir._engine.scheduling`), so the ordering mode holds across batches as across tasks:
    a key (key mode) or a partition (partition mode) is in one batch at a time, its records in
    offset order. One worker gathers at a time, so batches fill one after another rather than
    all workers sharing the records thinly. A task that does not fit waits for the next batch.
    """

    def __init__(
        self,
        handler: BatchHandler,
        count: int,
        lane_of: LaneOf | None,
        *,
        limits: BatchLimits,
        outputs: bool = False,
    ) -> None:
        super().__init__(handler, count, lane_of, outputs=outputs)
        self._handle_batch = handler.handle_batch
        self.limits = limits
        self._gather = threading.Lock()
        self._carry: Task | None = None  # taken from the queue, did not fit the last batch
        # A worker is gathering a batch, and whether the owner told it to run what it has.
        self._gathering = False
        self._nudged = False

    def run_now(self) -> None:
        """The owner can add nothing to the batch being gathered until records come back (its
        budget is at the pause mark: in key mode the rest wait behind the batch's own keys):
        it runs now rather than at the end of its wait."""
        if self._gathering and not self._nudged:
            self._nudged = True
            self._ready.put(_RUN_NOW)

    def _work(self, slot: _Slot) -> None:
        runs_calls_of(self)
        stop = False
        while not slot.retired and not stop:
            tasks, stop = self._take()
            if not tasks:
                return
            self._run_batch(slot, tasks)
            # Nothing of the batch stays referenced while the next one is gathered: 16 idle
            # workers holding their last batch of 500 kept 8,000 settled records alive.
            del tasks

    def _run_batch(self, slot: _Slot, tasks: list[Task]) -> None:
        """The batch's calls, then its tasks back to the owner (their records die with this
        frame, once settled)."""
        slot.batch = tasks
        slot.task = tasks[0]
        slot.since = t0 = time.perf_counter()
        calls = batch_calls(tasks, self._lane_of, outputs=self._outputs)
        with contextlib.suppress(StopIteration):
            call = next(calls)
            while True:
                call = calls.send(self._call(*call))
        per_record(tasks, time.perf_counter() - t0)
        slot.task, slot.batch = None, []
        done = self._done.put
        for t in tasks:
            done(t)

    def _take(self) -> tuple[list[Task], bool]:
        """The tasks of the next batch, and whether the pool is stopping (this worker leaves
        after the batch)."""
        clock = time.perf_counter
        ready = self._ready
        with self._gather:
            first, self._carry = self._carry, None
            while first is None or first is _RUN_NOW:
                if first is _RUN_NOW:
                    self._nudged = False  # late: no batch was gathering
                first = ready.get()
                if first is None:
                    return [], True
            batch = Gathering(first, self.limits)
            self._gathering = True
            try:
                while not batch.full:
                    left = batch.deadline - clock()
                    try:
                        t = ready.get(timeout=left) if left > 0 else ready.get_nowait()
                    except queue.Empty:
                        break
                    if t is _RUN_NOW:
                        self._nudged = False
                        break
                    if t is None:
                        return batch.tasks, True
                    if not batch.add(t):
                        self._carry = t
                        break
            finally:
                self._gathering = False
        return batch.tasks, False

    def _call(self, records: list[Record], ctx: BatchContext) -> BatchResult:
        """One `handle_batch` call: what it raised (None: it returned)."""
        try:
            result = self._handle_batch(records, ctx)
            if result is not None:
                _refuse_awaitable(self._handle_batch, result)
        except BaseException as exc:
            return exc
        return None


def per_record(tasks: list[Task], seconds: float) -> None:
    """Each task's share of a batch call's `seconds`, by its records: what tunes `Scheduler`
    (the task size, whole-partition lanes) and the stats."""
    each = seconds / max(1, sum(len(t.records) for t in tasks))
    for t in tasks:
        t.seconds = each * len(t.records)
