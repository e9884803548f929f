"""Lanes per ordering mode, tasks, the worker pool and the completion queue.

The hand-off unit is a *task*: records of one assignment that one worker runs in order. Lanes
(a key, or the whole partition) are owner-side state: a lane is busy while one task holds it,
and its later records wait until that task comes back, so workers never share ordering state.
Tasks are sized from the measured handler time: a no-op handler gets whole batches (one queue
round trip per batch instead of per record), a slow one gets small tasks spread over every
worker.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Literal

import structlog

from weir.records import Context, Handler, Partition, Record, _FunctionHandler, offset_of, size_of
from weir.tracking import BatchProgress

__all__ = ["DONE", "FAILED", "FENCED", "HELD", "Assignment", "Scheduler", "Task"]

log = structlog.get_logger(__name__)

Ordering = Literal["key", "partition", "unordered"]

# Per-record outcomes in `Task.outcomes` (a bytearray; None there means every record is DONE).
FENCED = 0  # not run: its assignment stopped dispatching before the worker reached it
DONE = 1
FAILED = 2
HELD = 3  # not run: an earlier record of its lane failed in the same task

# Records of *different* lanes share a task only up to about this much handler time: enough to
# make the queue round trip (two thread wake-ups, several microseconds each on a busy machine)
# small next to fast handlers, and never so much that a slow record holds up other keys while a
# worker is free (with 1 ms handlers every lane gets a task of its own).
_TASK_SECONDS = 0.0005
# Records of *one* lane run one after another anyway, so more of them in a task cost no
# parallelism. About this much handler time per single-lane task hides the owner round trip
# between a lane's records (wake the owner, hand the next record out, wake a worker: 0.3-0.7 ms
# on a busy 2-core machine), which otherwise idles the worker of every lane when there are about
# as many lanes as workers (partition mode, 1 ms handlers: 0.65x of the ideal with one record
# per task, 0.84x with 5 ms tasks, 3-5% more with 20 ms, 1% more with 40 ms: half the owner's
# turns per record, 0.36-0.40 -> 0.29-0.31 s of its CPU in a 40k-record run). Such a task counts
# its finished records as it goes (see `Task.report`), so the watermark still moves while it runs.
_LANE_SECONDS = 0.04
# A task never holds more records than this: a long task delays its lanes' later records.
_MAX_TASK = 500
# Handler time assumed before the first task comes back: slow, so the first tasks spread.
_FIRST_GUESS = 0.001
# The lane of a whole partition in key and unordered mode, while the handler is so fast that a
# polled batch fits in one task (see `Scheduler._whole_lane`), and a task holds at least
# `_WHOLE_TASK` records: a small batch alone (one record, taken while throttled) says nothing of
# the handler, and serialising a partition of 1 ms records cost unordered mode 80% of its rate.
_WHOLE = ("weir", "whole partition")
_WHOLE_TASK = 100


class Assignment:
    """One partition's ownership by this member, from assign to revoke/lost.

    Workers read `dispatching` before each record they run: once the owner clears it, the rest
    of the task is fenced without running. `cancel` is what `Context.cancelled` reads.
    """

    __slots__ = ("cancel", "dispatching", "token", "tp")

    def __init__(self, tp: Partition, token: int) -> None:
        self.tp = tp
        self.token = token
        self.dispatching = True
        self.cancel = threading.Event()

    def __repr__(self) -> str:
        return f"Assignment({self.tp}, token={self.token}, dispatching={self.dispatching})"


class Task:
    """Records of one assignment run in order by one worker; `batches[i]` tracks `records[i]`."""

    __slots__ = (
        "advanced",
        "assignment",
        "attempt",
        "batch",
        "batches",
        "errors",
        "finished",
        "lanes",
        "nbytes",
        "outcomes",
        "records",
        "report",
        "reported",
        "reported_bytes",
        "seconds",
        "started",
    )

    def __init__(
        self,
        assignment: Assignment,
        records: list[Record],
        batches: list[BatchProgress],
        lanes: list[Hashable] | None,
        attempt: int = 1,
    ) -> None:
        self.assignment = assignment
        self.records = records
        self.batches = batches
        self.lanes = lanes  # the lanes this task holds busy (None: unordered)
        # The one batch every record belongs to, when there is one (the common case): the owner
        # then marks the whole task finished in one call.
        self.batch: BatchProgress | None = None
        if batches and batches.count(batches[0]) == len(batches):
            self.batch = batches[0]
        self.nbytes = sum(map(size_of, records))
        self.attempt = attempt
        # When a worker took it (`time.perf_counter()`; 0.0 before), set before the fence check:
        # a revoke waits only for tasks some worker has taken, not for ones still in the ready
        # queue, and the owner reads the progress of long tasks only once they ran a while.
        self.started = 0.0
        self.outcomes: bytearray | None = None
        self.errors: dict[int, BaseException] | None = None
        self.seconds = 0.0
        self.advanced = False
        # Progress of long tasks (one lane's records, or a deep unordered batch): with `report`
        # set, the worker counts its finished records in `finished` as it goes, and the owner
        # reads the count whenever it wakes (`Scheduler.reporting`); it has accounted for
        # `reported` records.
        self.report = False
        self.finished = 0
        self.reported = 0
        self.reported_bytes = 0

    def __repr__(self) -> str:
        first = self.records[0].offset if self.records else None
        return f"Task({self.assignment.tp}, first={first}, records={len(self.records)})"


class _Lane:
    """A busy lane's records waiting for the task that holds it (parallel lists)."""

    __slots__ = ("batches", "held", "records")

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.batches: list[BatchProgress] = []
        self.held = False  # a failed record waits at the front: nothing is released

    def take(self, limit: int | None = None) -> tuple[list[Record], list[BatchProgress]]:
        """Take the lane's first `limit` waiting records (all by default), returning them; the
        lane itself stays busy. A long lane gives one task's worth at a time: taking all and
        putting the rest back cost a copy of the whole lane per task (quadratic in its length:
        a fifth of the owner's samples with 2,500 records waiting per lane)."""
        if limit is None or limit >= len(self.records):
            taken = self.records, self.batches
            self.records, self.batches = [], []
            return taken
        taken = self.records[:limit], self.batches[:limit]
        del self.records[:limit], self.batches[:limit]
        return taken

    def push_front(self, records: list[Record], batches: list[BatchProgress]) -> None:
        """Put records back ahead of the waiting ones (they come earlier in the lane)."""
        self.records[:0] = records
        self.batches[:0] = batches


def _waiting(lanes: dict[Hashable, _Lane | list[Hashable]], key: Hashable) -> _Lane:
    """The waiting list of a busy lane: a key only marked busy by its group gets one."""
    lane = lanes.get(key)
    if type(lane) is not _Lane:
        lane = lanes[key] = _Lane()
    return lane


# A runnable group: its assignment, the lanes it holds busy (None: unordered, split anywhere),
# its records in order and the batch of each record.
_Group = tuple[Assignment, list[Hashable] | None, list[Record], list[BatchProgress]]


def _joined(
    a: Assignment, keys: list[Hashable], recs: list[Record], batches: list[BatchProgress]
) -> _Group:
    """A group of several freed lanes, in offset order: each lane keeps its order, and the
    records of one batch sit together, so the owner marks them finished in one call per batch."""
    if len(keys) > 1:
        order = sorted(range(len(recs)), key=list(map(offset_of, recs)).__getitem__)
        recs = [recs[i] for i in order]
        batches = [batches[i] for i in order]
    return (a, keys, recs, batches)


def _key_of(ordering: Ordering) -> Callable[[Record], Hashable] | None:
    if ordering == "key":
        # Null keys share one lane per partition: they have no identity to parallelise by.
        return lambda r: r.key
    if ordering == "partition":
        return lambda r: None
    return None


class Scheduler:
    """Owner-side lanes plus a pool of worker threads feeding one completion queue.

    Owner thread: `submit` and `advance` collect runnable records, `dispatch` packs them into
    tasks; `completions` yields each task back once, with its outcomes. The long tasks in
    `reporting` count their finished records (`Task.finished`) while they run.
    """

    def __init__(
        self, handler: Handler, ordering: Ordering, workers: int, *, whole: bool = True
    ) -> None:
        self._handler = handler
        self._whole = whole and ordering != "partition"
        self._fn = handler._fn if type(handler) is _FunctionHandler else None
        self._ordering = ordering
        self._key_of = _key_of(ordering)
        self._workers = workers
        # A busy lane is a `_Lane` when records wait for it, else the key list of the group
        # holding it (see `_submit_keys`).
        self._lanes: dict[Assignment, dict[Hashable, _Lane | list[Hashable]]] = {}
        self._pending: list[_Group] = []
        self._ready: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self.completions: queue.SimpleQueue[Task] = queue.SimpleQueue()
        # Outstanding tasks whose workers count their finished records (`Task.report`).
        self.reporting: set[Task] = set()
        # Tasks handed to workers and not yet back, per assignment (not per partition: work
        # left over from an earlier assignment of the same partition must not hold up this one).
        self._outstanding: dict[Assignment, set[Task]] = {}
        self._out_records = 0
        self._per_record = _FIRST_GUESS  # smoothed handler seconds per record
        self._threads = [
            threading.Thread(target=self._worker, name=f"weir-worker-{i}", daemon=True)
            for i in range(workers)
        ]
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            for t in self._threads:
                t.start()

    def stop(self, timeout: float) -> bool:
        """Ask every worker to exit; True if all did within `timeout`. Never blocks longer: a
        handler stuck past the budget is left behind on its daemon thread."""
        for _ in self._threads:
            self._ready.put(None)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            if t.is_alive():
                t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    # -- owner thread ----------------------------------------------------------------------

    def submit(self, assignment: Assignment, batch: BatchProgress, records: list[Record]) -> None:
        """Records of one batch, in offset order: runnable ones wait for `dispatch`, the rest
        join their busy lane."""
        if not records:
            return  # an empty group would mark its lane busy with nothing to release it
        lanes = self._lanes.get(assignment)
        if lanes is None:
            lanes = self._lanes[assignment] = {}
        if self._whole and self._whole_lane(lanes, len(records)):
            self._submit_lane(assignment, lanes, _WHOLE, batch, records)
        elif self._key_of is None:
            self._pending.append((assignment, None, records, [batch] * len(records)))
        elif self._ordering == "partition":
            self._submit_lane(assignment, lanes, None, batch, records)
        else:
            self._submit_keys(assignment, lanes, batch, records)

    def _submit_lane(
        self,
        assignment: Assignment,
        lanes: dict[Hashable, _Lane | list[Hashable]],
        key: Hashable,
        batch: BatchProgress,
        records: list[Record],
    ) -> None:
        """Records of one lane that takes a whole partition (partition mode, or `_WHOLE`): they
        wait behind it while it is busy, else they go out as a group that marks it busy."""
        n = len(records)
        if key in lanes:
            behind = _waiting(lanes, key)
            behind.records.extend(records)
            behind.batches.extend([batch] * n)
        else:
            lanes[key] = [key]
            self._pending.append((assignment, [key], records, [batch] * n))

    def _whole_lane(self, lanes: dict[Hashable, _Lane | list[Hashable]], n: int) -> bool:
        """Key and unordered mode, while a polled batch fits in one task: the records go out per
        partition, behind one lane for the whole partition, so in partition order and in key
        order too. Such a task runs its batch on one worker anyway, and fewer, longer tasks
        leave the owner more of the interpreter lock (no-op handlers: partition mode ran
        255k-326k records/s, key mode 219k-253k, unordered 202k-268k). An assignment takes or
        leaves the whole lane only while none of its lanes is busy."""
        if _WHOLE in lanes:
            return True
        size = self.task_size()
        return not lanes and n <= size and size >= _WHOLE_TASK

    def _submit_keys(
        self,
        assignment: Assignment,
        lanes: dict[Hashable, _Lane | list[Hashable]],
        batch: BatchProgress,
        records: list[Record],
    ) -> None:
        """Key mode, the owner's per-record hot path. Records whose key is free form groups of
        up to one task's size; a free key is marked busy with its group's key list, so a later
        record of the same key joins that group, or its lane once the group is full. Only keys
        that really wait get a `_Lane`: with distinct keys this is a few dict operations per
        record."""
        pending = self._pending
        size = self.task_size()
        keys: list[Hashable] = []
        group: list[Record] = []
        for rec in records:
            key = rec[3]  # Record.key, read by index: this loop runs once per record
            lane = lanes.get(key)
            if lane is None:
                if len(group) >= size:
                    pending.append((assignment, keys, group, [batch] * len(group)))
                    keys, group = [], []
                lanes[key] = keys
                keys.append(key)
                group.append(rec)
            elif lane is keys and len(group) < size:
                group.append(rec)
            else:
                if type(lane) is not _Lane:
                    lane = lanes[key] = _Lane()  # busy with an earlier group: now it waits
                lane.records.append(rec)
                lane.batches.append(batch)
        if group:
            pending.append((assignment, keys, group, [batch] * len(group)))

    def advance(self, task: Task) -> None:
        """`task` came back: its lanes take their waiting records, except lanes where a record
        failed: the failed record and those held behind it go back to the front, and the lane
        stays held until `release`."""
        if task.lanes is None or task.advanced:
            return
        task.advanced = True  # a second call would free lanes that a later task now holds
        a = task.assignment
        lanes = self._lanes.get(a)
        if lanes is None:
            return  # forgotten: revoked or lost
        failed: dict[Hashable, tuple[list[Record], list[BatchProgress]]] = {}
        if task.errors and self._key_of is not None:
            # A failed record of a whole-partition task holds the whole partition's lane.
            key_of = _whole if task.lanes == [_WHOLE] else self._key_of
            for i, code in enumerate(task.outcomes or ()):
                if code in (FAILED, HELD):
                    rec = task.records[i]
                    held_recs, held_batches = failed.setdefault(key_of(rec), ([], []))
                    held_recs.append(rec)
                    held_batches.append(task.batches[i])
        # Lanes freed together go out together: one group of several lanes (up to a task),
        # not a group per lane. A lane longer than a task goes alone (dispatch cuts it).
        pending = self._pending
        size = self.task_size()
        lane_size = self.lane_task_size()
        keys: list[Hashable] = []
        recs: list[Record] = []
        batches: list[BatchProgress] = []
        for key in task.lanes:
            if failed and key in failed:
                self.hold(a, key, *failed[key])
                continue
            lane = lanes.get(key)
            if lane is None:
                continue
            if type(lane) is not _Lane:
                del lanes[key]  # busy with nothing waiting
            elif lane.held:
                continue
            elif lane.records:
                if len(lane.records) > size:
                    pending.append((a, [key], *lane.take(lane_size)))
                    continue
                if len(recs) + len(lane.records) > size:
                    pending.append(_joined(a, keys, recs, batches))
                    keys, recs, batches = [], [], []
                lane_recs, lane_batches = lane.take()
                keys.append(key)
                recs += lane_recs
                batches += lane_batches
            else:
                del lanes[key]
        if recs:
            pending.append(_joined(a, keys, recs, batches))

    def hold(
        self,
        assignment: Assignment,
        key: Hashable,
        records: list[Record],
        batches: list[BatchProgress],
    ) -> None:
        """Put a failed record (and the ones behind it) back at the front of its lane and stop
        the lane: nothing of it runs until `release`."""
        lanes = self._lanes.get(assignment)
        if lanes is None:
            return
        lane = _waiting(lanes, key)
        lane.push_front(records, batches)
        lane.held = True

    def release(self, assignment: Assignment, key: Hashable) -> None:
        """Let a held lane run again from its front record (a retry)."""
        lane = self._lanes.get(assignment, {}).get(key)
        if type(lane) is not _Lane or not lane.held:
            return
        lane.held = False
        if lane.records:
            self._pending.append((assignment, [key], *lane.take()))

    def dispatch(self) -> int:
        """Pack the runnable records into tasks and hand them to the workers; returns tasks."""
        groups = self._pending
        if not groups:
            return 0
        self._pending = []
        size = self.task_size()
        lane_size = self.lane_task_size()
        if self._key_of is None:
            # Unordered: a batch that gives every worker two tasks or more goes out in tasks of
            # up to a lane task's length; longer tasks idle no worker then, and each hand-off
            # saved is owner time under the interpreter lock that workers wait for.
            size = max(size, min(lane_size, sum(len(g[2]) for g in groups) // (2 * self._workers)))
        tasks = 0
        cur: Assignment | None = None
        recs: list[Record] = []
        batches: list[BatchProgress] = []
        keys: list[Hashable] | None = None
        for a, gkeys, grecs, gbatches in groups:
            if not a.dispatching:
                continue  # revoked, lost or stopping since: these would come back fenced
            if gkeys is not None:
                lanes = self._lanes.get(a)
                if lanes is None:
                    continue  # forgotten while still dispatching: nothing may run it now
                if len(grecs) > lane_size and len(gkeys) == 1:
                    # One lane's records: the rest wait in the lane, so the lane's later records
                    # are never tied to one worker for long. Groups of several lanes are never
                    # longer than a task when submitted.
                    _waiting(lanes, gkeys[0]).push_front(grecs[lane_size:], gbatches[lane_size:])
                    grecs, gbatches = grecs[:lane_size], gbatches[:lane_size]
            if recs and (
                a is not cur or len(recs) + len(grecs) > size or (keys is None) != (gkeys is None)
            ):
                self._release(Task(cur, recs, batches, keys))  # type: ignore[arg-type]
                tasks += 1
                recs, batches = [], []
            if not recs:
                cur = a
                keys = None if gkeys is None else []
            if gkeys is None:
                # Unordered: cut anywhere, one task per `size` records.
                i = 0
                while i < len(grecs):
                    take = size - len(recs)
                    recs += grecs[i : i + take]
                    batches += gbatches[i : i + take]
                    i += take
                    if len(recs) >= size:
                        self._release(Task(a, recs, batches, None))
                        tasks += 1
                        recs, batches = [], []
                continue
            recs += grecs
            batches += gbatches
            assert keys is not None
            keys += gkeys
        if recs:
            self._release(Task(cur, recs, batches, keys))  # type: ignore[arg-type]
            tasks += 1
        return tasks

    def lane_task_size(self) -> int:
        """Records per task of a single lane: about `_LANE_SECONDS` of measured handler time."""
        return min(_MAX_TASK, int(_LANE_SECONDS / self._per_record) + 1)

    def task_size(self) -> int:
        """Records per task: about `_TASK_SECONDS` of measured handler time."""
        return min(_MAX_TASK, int(_TASK_SECONDS / self._per_record) + 1)

    def _release(self, task: Task) -> None:
        if len(task.records) > self.task_size():
            task.report = True  # a long task: its finished records count before it ends
            self.reporting.add(task)
        a = task.assignment
        out = self._outstanding.get(a)
        if out is None:
            self._outstanding[a] = {task}
        else:
            out.add(task)
        self._out_records += len(task.records)
        self._ready.put(task)

    def returned(self, task: Task) -> None:
        """A task came back: it no longer counts as outstanding; its time tunes task sizes."""
        a = task.assignment
        self.reporting.discard(task)
        out = self._outstanding.get(a)
        if out is not None and task in out:
            out.discard(task)
            self._out_records -= len(task.records)
            if not out:
                del self._outstanding[a]
        ran = len(task.records) if task.outcomes is None else task.outcomes.count(DONE)
        if ran:
            self._per_record = 0.8 * self._per_record + 0.2 * max(task.seconds / ran, 1e-7)

    def outstanding(self, assignments: Iterable[Assignment] | None = None) -> int:
        """Records handed to workers and not back yet (started or still in the ready queue)."""
        if assignments is None:
            return self._out_records
        return sum(len(t.records) for a in assignments for t in self._outstanding.get(a, ()))

    def waiting(self) -> int:
        """Records waiting in busy lanes: registered, but not runnable until a task returns."""
        return sum(
            len(lane.records)
            for lanes in self._lanes.values()
            for lane in lanes.values()
            if type(lane) is _Lane
        )

    def tasks_out(self) -> int:
        """Tasks handed to workers and not back yet: fewer than the workers means idle ones."""
        return sum(map(len, self._outstanding.values()))

    def running(self, assignments: Iterable[Assignment]) -> int:
        """Records of these assignments in tasks a worker has taken: what a revoke or shutdown
        waits for. Tasks still in the ready queue of a fenced assignment come back without
        running."""
        return sum(
            len(t.records) for a in assignments for t in self._outstanding.get(a, ()) if t.started
        )

    def drop_queued(self, assignments: Iterable[Assignment]) -> list[Record]:
        """Remove records of these assignments that no task holds yet (tasks already released
        come back fenced or finished). Returns what was dropped."""
        targets = set(assignments)
        dropped: list[Record] = []
        keep: list[_Group] = []
        for g in self._pending:
            if g[0] in targets:
                dropped += g[2]
            else:
                keep.append(g)
        self._pending = keep
        for a in targets:
            for lane in self._lanes.get(a, {}).values():
                if type(lane) is _Lane:
                    dropped += lane.take()[0]
        return dropped

    def forget(self, assignments: Iterable[Assignment]) -> None:
        """Remove every lane of these assignments (their late completions are ignored)."""
        for a in assignments:
            self._lanes.pop(a, None)

    @property
    def lanes(self) -> int:
        return sum(len(lanes) for lanes in self._lanes.values())

    @property
    def per_record_seconds(self) -> float:
        return self._per_record

    # -- worker threads --------------------------------------------------------------------

    def _worker(self) -> None:
        ready = self._ready
        done = self.completions.put
        clock = time.perf_counter
        fn = self._fn
        handle = self._handler.handle
        while True:
            task = ready.get()
            if task is None:
                return
            task.started = t0 = clock()
            a = task.assignment
            recs = task.records
            i = 0
            try:
                if fn is not None and not task.report:
                    # The common fast case (a plain function, no progress to count) gets a loop
                    # of its own: it runs once per record.
                    for rec in recs:
                        if not a.dispatching:
                            break
                        fn(rec)
                        i += 1
                else:
                    # A long task counts its finished records as they finish: a plain store,
                    # read by the owner when it wakes, costs no hand-off and no wake-up.
                    every = task.report
                    token, attempt, cancel = a.token, task.attempt, a.cancel
                    for rec in recs:
                        if not a.dispatching:
                            break
                        if fn is not None:
                            fn(rec)
                        else:
                            handle(rec, Context(token, attempt, rec.event_id, cancel))
                        i += 1
                        if every:
                            task.finished = i
            except BaseException as exc:
                self._after_failure(task, i, exc)
            else:
                if i < len(recs):
                    task.outcomes = bytearray(b"\x01" * i + bytes(len(recs) - i))  # rest FENCED
            task.seconds = clock() - t0
            done(task)

    def _after_failure(self, task: Task, index: int, exc: BaseException) -> None:
        """Record a failure and run the rest of the task one record at a time: records of the
        failed lane are held back, every other lane goes on."""
        recs = task.records
        out = task.outcomes = bytearray(len(recs))
        out[:index] = b"\x01" * index
        out[index] = FAILED
        task.errors = {index: exc}
        key_of = self._key_of
        held = set() if key_of is None else {key_of(recs[index])}
        a = task.assignment
        for j in range(index + 1, len(recs)):
            if not a.dispatching:
                break  # the rest stay FENCED
            rec = recs[j]
            if key_of is not None and key_of(rec) in held:
                out[j] = HELD
                continue
            try:
                if self._fn is not None:
                    self._fn(rec)
                else:
                    self._handler.handle(
                        rec, Context(a.token, task.attempt, rec.event_id, a.cancel)
                    )
            except BaseException as e:
                out[j] = FAILED
                task.errors[j] = e
                if key_of is not None:
                    held.add(key_of(rec))
            else:
                out[j] = DONE


def _whole(record: Record) -> Hashable:
    return _WHOLE
