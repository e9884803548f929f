"""Lanes per ordering mode, and packing runnable records into tasks (owner thread only).

Lanes are owner-side state: a lane (a key, or the whole partition) is busy while one task holds
it, and its later records wait until that task comes back, so workers never share ordering
state. Each ordering mode is an `OrderingRule` (`ByKey`, `ByPartition`, `Unordered`): the lane
a record holds, how a batch's records enter the lanes, and what a long task may give up. The
`Scheduler` makes one at construction (one per ordering when routes have orderings of their own,
each topic following its route's: `Orderings`) and does the rest alike for every mode: busy and
waiting lanes, whole-partition lanes, held failures, stale tasks, packing.

Tasks are sized from the measured handler time: a no-op handler gets whole batches (one queue
round trip per batch instead of per record), a slow one gets small tasks spread over every
worker. `weir._engine.workers` runs the tasks.

Concurrent workers (an event loop, `weir._engine.aio`) run every lane of a task at once and report
its records as they finish, in any order. Their tasks are as large as a task may be (a task costs
the owner a hand-off, and packing costs no parallelism there), and a lane of a running task is
freed as soon as its records in the task are done (`progressed`), so a slow record holds only its
own lane, never the other lanes it was packed with.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import groupby
from typing import ClassVar

from weir._engine.rates import RateLimits
from weir._engine.tasks import DONE, FAILED, HELD, Assignment, Lane, LaneKey, Task
from weir._engine.tracking import BatchProgress
from weir._engine.workers import BatchLimits, LaneOf, Workers
from weir.records import Ordering, Partition, Record, offset_of, size_of

__all__ = [
    "RULES",
    "ByKey",
    "ByPartition",
    "Lane",
    "LaneKey",
    "Ordering",
    "OrderingRule",
    "Orderings",
    "Scheduler",
    "Unordered",
    "lane_of",
]


# Records of *different* lanes share a task only up to about this much handler time: enough to
# make the queue round trip (two thread wake-ups, several microseconds each on a busy machine)
# small next to fast handlers, and never so much that a slow record holds up other keys while a
# worker is free (with 1 ms handlers every lane gets a task of its own).
_TASK_SECONDS = 0.0005
# Records of *one* lane run one after another anyway, so more of them in a task cost no
# parallelism. About this much handler time per single-lane task hides the owner round trip
# between a lane's records (wake the owner, hand the next record out, wake a worker), which
# otherwise idles the worker of every lane when there are about as many lanes as workers
# (partition mode, or a few hot keys); longer tasks also halve the owner's turns per record
# (benchmarks/README.md has the measurements). Such a task counts its finished records as it
# goes (see `Task.report`), so the watermark still moves while it runs.
_LANE_SECONDS = 0.04
# A task never holds more records than this: a long task delays its lanes' later records.
_MAX_TASK = 500
# Handler time assumed before the first task comes back: slow, so the first tasks spread.
_FIRST_GUESS = 0.001
# The lane of a whole partition in key and unordered mode, while the handler is so fast that a
# polled batch fits in one task (see `Scheduler._whole_lane`), and a task holds at least
# `_WHOLE_TASK` records: a small batch alone (one record, taken while throttled) says nothing of
# the handler, and serialising a partition of 1 ms records cost unordered mode 80% of its rate.
_WHOLE = Lane.WHOLE
_WHOLE_TASK = 100


class _Lane:
    """What waits in a busy lane: its records, waiting for the task that holds it (parallel
    lists), a failed record held at the front, or an earlier assignment's task."""

    __slots__ = ("batches", "held", "records", "stale")

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.batches: list[BatchProgress] = []
        self.held = False  # a failed record waits at the front: nothing is released
        # Tasks of an earlier assignment of the partition still running in this lane (a revoke
        # past its budget, or lost): nothing is released until they return.
        self.stale = 0

    def take(self, limit: int | None = None) -> tuple[list[Record], list[BatchProgress]]:
        """Take the lane's first `limit` waiting records (all by default), returning them; the
        lane itself stays busy. A long lane gives one task's worth at a time: taking all and
        putting the rest back cost a copy of the whole lane per task (quadratic in its length:
        most of the owner's time once thousands of records waited per lane)."""
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


# An assignment's busy lanes, each mapped to the key list of the group that made it busy (its
# identity tells key mode's intake which keys joined the group it is building: `_submit_keys`).
_Lanes = dict[LaneKey, list[LaneKey]]
# The busy lanes of an assignment that something waits in (`_Lane`), a subset of its `_Lanes`:
# only keys that really wait get one, so with distinct keys a record costs a few dict operations.
_Waiting = dict[LaneKey, _Lane]


# A runnable group: its assignment, the lanes it holds busy (None: unordered, split anywhere),
# its records in order and the batch of each record.
_Group = tuple[Assignment, list[LaneKey] | None, list[Record], list[BatchProgress]]


def _joined(
    a: Assignment, keys: list[LaneKey], recs: list[Record], batches: list[BatchProgress]
) -> _Group:
    """A group of several freed lanes, in offset order: each lane keeps its order, and the
    records of one batch sit together, so the owner marks them finished in one call per batch."""
    if len(keys) > 1:
        order = sorted(range(len(recs)), key=list(map(offset_of, recs)).__getitem__)
        recs = [recs[i] for i in order]
        batches = [batches[i] for i in order]
    return (a, keys, recs, batches)


class OrderingRule(ABC):
    """One ordering mode: the lane each record holds, which says what may run at once (records
    of one lane one at a time, in offset order; records of different lanes, or of none, side by
    side), and how the scheduler's lanes take records as they arrive and as a long task gives
    up the records its worker has not reached. The `Scheduler` makes one at construction (one
    per ordering its topics have) and asks an assignment's wherever the modes differ; a rule
    works on that scheduler's lanes."""

    ordering: ClassVar[Ordering]
    # Records hold lanes: a failed record holds its lane until it is retried (`Scheduler.hold`,
    # `release`). A failed record of no lane is submitted again instead (`Scheduler.resubmit`).
    ordered: ClassVar[bool] = True
    # While the handler is fast, a partition's records may go out behind one lane for the whole
    # partition (`_WHOLE`, see `Scheduler._whole_lane`).
    whole: ClassVar[bool] = True

    def __init__(self, scheduler: Scheduler) -> None:
        self._s = scheduler

    @staticmethod
    @abstractmethod
    def lane_of(record: Record) -> LaneKey:
        """The lane `record` holds in its assignment while it runs or waits (`Lane.NONE`:
        none, it may run beside any record)."""

    @abstractmethod
    def submit(
        self, a: Assignment, lanes: _Lanes, batch: BatchProgress, records: list[Record]
    ) -> None:
        """Records of one batch, in offset order, that no whole-partition lane takes: runnable
        ones go to `Scheduler._pending`, the rest join their busy lane."""

    @abstractmethod
    def move(self, task: Task, lanes: _Lanes) -> int:
        """`Scheduler.take_unstarted`: the records that `task`'s worker has not reached go to
        other workers, as far as the lanes allow; returns how many moved."""

    def task_size(self, size: int, lane_size: int, groups: list[_Group]) -> int:
        """Records per task when `dispatch` packs `groups`, from the usual `size` and that of
        a single lane's task."""
        return size


class ByKey(OrderingRule):
    """`ordering="key"`: a key's records one at a time, in offset order; different keys of a
    partition side by side. Null keys share one lane: they have no identity to parallelise
    by."""

    ordering = "key"

    @staticmethod
    def lane_of(record: Record) -> LaneKey:
        return record.key

    def submit(
        self, a: Assignment, lanes: _Lanes, batch: BatchProgress, records: list[Record]
    ) -> None:
        self._s._submit_keys(a, lanes, batch, records)

    def move(self, task: Task, lanes: _Lanes) -> int:
        """Other keys' records move with their lanes; the running key's later records go to
        the front of its lane, behind the running one, and so do those of a key whose record
        failed earlier in the task (its worker would have held them back)."""
        s = self._s
        rest, batches, whole = s._unreached(task, lanes)
        if not rest:
            self._free_finished_keys(task, lanes)
            return 0
        a = task.assignment
        at = len(task.records) - len(rest)
        lane_of = self.lane_of
        running = lane_of(task.records[at - 1]) if at else None
        held = self._failed_keys(task) - {running}
        if task.lanes is None:  # from a whole lane: keep the running and failed keys' lanes
            task.lanes = [running, *held]
            for k in task.lanes:
                lanes[k] = task.lanes
        behind: dict[LaneKey, tuple[list[Record], list[BatchProgress]]] = {}
        groups: dict[LaneKey, tuple[list[Record], list[BatchProgress]]] = {}
        for rec, batch in zip(rest, batches, strict=True):
            key = lane_of(rec)
            stay = key == running or key in held
            recs, bs = (behind if stay else groups).setdefault(key, ([], []))
            recs.append(rec)
            bs.append(batch)
        for key, waits in behind.items():
            s._wait(a, key).push_front(*waits)
        # The task keeps the running record's lane and those of failed records: keys whose
        # records it finished, and keys moved below, no longer wait for it.
        done_keys = [k for k in task.lanes if k != running and k not in held and k not in groups]
        task.lanes = [k for k in task.lanes if k == running or k in held]
        s._free(a, lanes, done_keys)
        if groups:
            keys = list(groups)
            waiting = s._waiting[a]
            for k in keys:
                if k not in waiting:
                    lanes[k] = keys  # busy with the new group (a waiting lane stays as is)
            recs = [r for k in keys for r in groups[k][0]]
            bs = [b for k in keys for b in groups[k][1]]
            s._pending.append(_joined(a, keys, recs, bs))
        if whole is not None and whole.records:
            s._submit_again(a, lanes, *whole.take())
        return len(rest)

    def _failed_keys(self, task: Task) -> set[LaneKey]:
        """Keys of the task's records that failed so far: their worker holds the rest of each
        key back, and the owner, which has not heard of the failure yet, must too."""
        errors = task.errors  # written by the worker: list() copies its keys atomically
        records = task.records
        return {self.lane_of(records[i]) for i in list(errors)} if errors else set()

    def _free_finished_keys(self, task: Task, lanes: _Lanes) -> None:
        """Its worker is on the task's last record: the task's other keys, whose records it
        finished, no longer wait for it (their later records waited behind a slow record of
        another key until the task came back). A failed record's key stays held until the
        owner hears of the failure."""
        keys = task.lanes
        if keys is None or len(keys) < 2 or keys[0] is _WHOLE:
            return
        keep = self._failed_keys(task) | {self.lane_of(task.records[-1])}
        task.lanes = [k for k in keys if k in keep]
        self._s._free(task.assignment, lanes, [k for k in keys if k not in keep])


class ByPartition(OrderingRule):
    """`ordering="partition"`: a partition's records one at a time, in offset order; partitions
    side by side."""

    ordering = "partition"
    whole = False  # its one lane already takes the whole partition

    @staticmethod
    def lane_of(record: Record) -> LaneKey:
        return None

    def submit(
        self, a: Assignment, lanes: _Lanes, batch: BatchProgress, records: list[Record]
    ) -> None:
        self._s._submit_lane(a, lanes, None, batch, records)

    def move(self, task: Task, lanes: _Lanes) -> int:
        return 0  # the partition is one lane: the rest would wait for the running record anyway


class Unordered(OrderingRule):
    """`ordering="unordered"`: records hold no lane, any of them may run side by side (the
    watermark still commits only the contiguous finished prefix)."""

    ordering = "unordered"
    ordered = False

    @staticmethod
    def lane_of(record: Record) -> LaneKey:
        return Lane.NONE

    def submit(
        self, a: Assignment, lanes: _Lanes, batch: BatchProgress, records: list[Record]
    ) -> None:
        s = self._s
        if s._stale:
            records = s._park_stale(a, batch, records)
        s._pending.append((a, None, records, [batch] * len(records)))

    def move(self, task: Task, lanes: _Lanes) -> int:
        """All of them move, cut anywhere."""
        s = self._s
        rest, batches, whole = s._unreached(task, lanes)
        if rest:
            s._pending.append((task.assignment, None, rest, batches))
            if whole is not None and whole.records:
                s._pending.append((task.assignment, None, *whole.take()))
        return len(rest)

    def task_size(self, size: int, lane_size: int, groups: list[_Group]) -> int:
        # A batch that gives every worker two tasks or more goes out in tasks of up to a lane
        # task's length; longer tasks idle no worker then, and each hand-off saved is owner
        # time under the interpreter lock that workers wait for.
        runnable = sum(len(g[2]) for g in groups)
        return max(size, min(lane_size, runnable // (2 * self._s._workers)))


RULES: dict[Ordering, type[OrderingRule]] = {r.ordering: r for r in (ByKey, ByPartition, Unordered)}


def _one(record: Record) -> int:
    return 1


@dataclass(frozen=True, slots=True)
class Orderings:
    """A member whose routes differ in ordering (docs/routing.md): `of` gives a topic's
    ordering (its route's, else the member's), `modes` every ordering some topic may get.
    The route table resolves it (`weir.routing`); the `Scheduler` asks once per topic and
    holds the answer."""

    of: Callable[[str], Ordering]
    modes: frozenset[Ordering]
    # Each subscribed name or `^` pattern with its route's ordering: what logs and reprs show.
    shown: Mapping[str, Ordering] = field(default_factory=dict)


def _own_lane(record: Record) -> object:
    return object()  # a lane of its own: nothing waits behind an unordered record


def lane_of(ordering: Ordering, orderings: Orderings | None = None) -> LaneOf | None:
    """The lane a record waits in under `ordering` (None: unordered, no lanes), for workers
    that hold back a failed record's lane. With `orderings`, the lane under the record's
    topic's ordering; an unordered topic's record is a lane of its own."""
    if orderings is None:
        rule = RULES[ordering]
        return rule.lane_of if rule.ordered else None
    lanes = {m: RULES[m].lane_of if RULES[m].ordered else _own_lane for m in orderings.modes}
    of = orderings.of

    def lane(record: Record) -> Hashable:
        return lanes[of(record.topic)](record)

    return lane


class Scheduler:
    """Owner-side lanes; packs runnable records into tasks and submits them to `workers`.

    `submit` and `advance` collect runnable records, `dispatch` packs them into tasks; each task
    comes back once on the workers' completion queue, with its outcomes. The long tasks in
    `reporting` count their finished records (`Task.finished`) while they run.
    """

    def __init__(
        self,
        workers: Workers,
        ordering: Ordering,
        *,
        orderings: Orderings | None = None,
        whole: bool = True,
        batch: BatchLimits | None = None,
        rates: RateLimits | None = None,
    ) -> None:
        self.workers = workers
        # Rate limits hold groups back at dispatch (`weir._engine.rates`): they wait at the
        # front of `_pending`, in order, their lanes still busy.
        self._rates = rates
        self._submit_task = workers.submit
        # Concurrent workers run a task's lanes at once: a whole-partition lane would serialise
        # the partition, and the handler time says nothing of the cost of a hand-off.
        self._concurrent = workers.concurrent
        # Batch workers (`BatchWorkers`) join whole tasks into one handler call: a task is as
        # large as a batch may be, and its records run in one call: none moves. With
        # `batch_max_bytes` no task holds more bytes than a batch may (`_cut`).
        self._batch = None if batch is None else batch.records
        self._batch_bytes = None if batch is None else batch.nbytes
        # The member's rule; with `orderings` (routes of different orderings), a rule per mode
        # and each topic's, resolved once per topic when its first partition is assigned
        # (`assigned`), in `_rules`.
        self._rule = RULES[ordering](self)
        self.orderings = orderings
        self.modes = frozenset({ordering}) if orderings is None else orderings.modes
        self._by_mode = {m: self._rule if m == ordering else RULES[m](self) for m in self.modes}
        self._rules: dict[str, OrderingRule] = {}
        # A rate per key needs each key in a lane of its own (`_per_key`).
        per_key = rates is not None and rates.per_key is not None
        self._whole = whole and not self._concurrent and not per_key  # and the rule's `whole`
        self._workers = workers.slots
        self._lanes: dict[Assignment, _Lanes] = {}
        self._waiting: dict[Assignment, _Waiting] = {}
        self._pending: list[_Group] = []
        # Outstanding tasks whose workers count their finished records (`Task.report`). Tasks
        # are kept in dicts, not sets (hashed by address): they are walked in the order they
        # were handed out, the same in every run.
        self.reporting: dict[Task, None] = {}
        # Tasks handed to workers and not yet back, per assignment (not per partition: work
        # left over from an earlier assignment of the same partition must not hold up this one).
        self._outstanding: dict[Assignment, dict[Task, None]] = {}
        self._out_records = 0
        self._per_record = _FIRST_GUESS  # smoothed handler seconds per record
        # Tasks of forgotten assignments that a worker is still running, per partition: a new
        # assignment of the partition must not run their records, or their lanes, at the same
        # time (`_hold_stale`). In unordered mode their offsets are what is held: records at
        # those offsets wait in `_parked`.
        self._stale: dict[Partition, list[Task]] = {}
        self._parked: dict[Assignment, list[tuple[Record, BatchProgress]]] = {}

    # -- owner thread ----------------------------------------------------------------------

    def submit(self, assignment: Assignment, batch: BatchProgress, records: list[Record]) -> None:
        """Records of one batch, in offset order: runnable ones wait for `dispatch`, the rest
        join their busy lane."""
        if not records:
            return  # an empty group would mark its lane busy with nothing to release it
        lanes = self._lanes.get(assignment)
        if lanes is None:
            lanes = self._lanes[assignment] = {}
            self._waiting[assignment] = {}
            if assignment.tp in self._stale:
                self._hold_stale(assignment)
        rule = self._rule if self.orderings is None else self.rule_of(assignment)
        if self._whole and rule.whole and self._whole_lane(lanes, len(records)):
            self._submit_lane(assignment, lanes, _WHOLE, batch, records)
        else:
            rule.submit(assignment, lanes, batch, records)

    def _submit_lane(
        self,
        assignment: Assignment,
        lanes: _Lanes,
        key: LaneKey,
        batch: BatchProgress,
        records: list[Record],
    ) -> None:
        """Records of one lane that takes a whole partition (partition mode, or `_WHOLE`): they
        wait behind it while it is busy, else they go out as a group that marks it busy."""
        n = len(records)
        if key in lanes:
            behind = self._wait(assignment, key)
            behind.records.extend(records)
            behind.batches.extend([batch] * n)
        else:
            lanes[key] = [key]
            self._pending.append((assignment, [key], records, [batch] * n))

    def _whole_lane(self, lanes: _Lanes, n: int) -> bool:
        """Key and unordered mode, while a polled batch fits in one task: the records go out per
        partition, behind one lane for the whole partition, so in partition order and in key
        order too. Such a task runs its batch on one worker anyway, and fewer, longer tasks
        leave the owner more of the interpreter lock (benchmarks/README.md). An assignment
        takes or leaves the whole lane only while none of its lanes is busy."""
        if _WHOLE in lanes:
            return True
        size = self.task_size()
        # Batch workers: a task is a batch's size whatever the handler time, which alone says
        # whether the handler is fast (a slow bulk write wants a partition's keys in several
        # batches at once, not one batch per partition).
        fast = size if self._batch is None else self.turn_size()
        return not lanes and n <= size and fast >= _WHOLE_TASK

    def _submit_keys(
        self,
        assignment: Assignment,
        lanes: _Lanes,
        batch: BatchProgress,
        records: list[Record],
    ) -> None:
        """Key mode, the owner's per-record hot path. Records whose key is free form groups of
        up to one task's size; a free key is marked busy with its group's key list, so a later
        record of the same key joins that group, or its lane once the group is full. Only keys
        that really wait get a `_Lane`: with distinct keys this is a few dict operations per
        record."""
        pending = self._pending
        waiting = self._waiting[assignment]
        size = self.task_size()
        keys: list[LaneKey] = []
        group: list[Record] = []
        for rec in records:
            key = rec._key  # the slot, not the property: this loop runs once per record
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
                behind = waiting.get(key)
                if behind is None:
                    behind = waiting[key] = _Lane()  # busy with an earlier group: now it waits
                behind.records.append(rec)
                behind.batches.append(batch)
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
        failed: dict[LaneKey, tuple[list[Record], list[BatchProgress]]] = {}
        rule = self.rule_of(a) if task.errors else None
        if rule is not None and rule.ordered:
            lane_of = rule.lane_of
            for i, code in enumerate(task.outcomes or ()):
                if code in (FAILED, HELD):
                    rec = task.records[i]
                    held_recs, held_batches = failed.setdefault(lane_of(rec), ([], []))
                    held_recs.append(rec)
                    held_batches.append(task.batches[i])
            if task.lanes == [_WHOLE]:
                # A failed record holds its own lane (key mode: its key), not the whole
                # partition: the partition leaves its whole lane, and what waited behind it
                # goes to its own lanes again.
                self._split_whole(a, lanes, failed)
                return
        # A concurrent task's lanes that were freed while it ran are not its to free any more.
        keys_of_task = task.lanes if task.lane_left is None else list(task.lane_left)
        for key in failed:
            self.hold(a, key, *failed[key])
        if failed:
            keys_of_task = [k for k in keys_of_task if k not in failed]
        self._free(a, lanes, keys_of_task)

    def _free(
        self,
        a: Assignment,
        lanes: _Lanes,
        freed: Iterable[LaneKey],
    ) -> None:
        """These lanes of `a` are no longer busy: their waiting records become runnable."""
        # Lanes freed together go out together: one group of several lanes (up to a task),
        # not a group per lane. A lane longer than a task goes alone (dispatch cuts it).
        pending = self._pending
        waiting = self._waiting[a]
        size = self.task_size()
        lane_size = self.lane_task_size()
        group: list[LaneKey] = []
        recs: list[Record] = []
        batches: list[BatchProgress] = []
        for key in freed:
            lane = waiting.get(key)
            if lane is None:
                lanes.pop(key, None)  # nothing waits: free
            elif lane.held or lane.stale:
                continue
            elif lane.records:
                if len(lane.records) > size:
                    pending.append((a, [key], *lane.take(lane_size)))
                    continue
                if len(recs) + len(lane.records) > size:
                    pending.append(_joined(a, group, recs, batches))
                    group, recs, batches = [], [], []
                lane_recs, lane_batches = lane.take()
                group.append(key)
                recs += lane_recs
                batches += lane_batches
            else:
                del lanes[key], waiting[key]
        if recs:
            pending.append(_joined(a, group, recs, batches))

    def _split_whole(
        self,
        a: Assignment,
        lanes: _Lanes,
        failed: dict[LaneKey, tuple[list[Record], list[BatchProgress]]],
    ) -> None:
        """Key mode: a whole-partition task came back with failures. The failed keys are held
        with their records; every record that waited behind the whole lane is submitted again
        by key, in offset order, so other keys go on while the failed ones wait."""
        lanes.pop(_WHOLE, None)
        whole = self._waiting[a].pop(_WHOLE, None)
        for key, (recs, batches) in failed.items():
            self.hold(a, key, recs, batches)
        if whole is not None:
            self._submit_again(a, lanes, *whole.take())

    def _submit_again(
        self, a: Assignment, lanes: _Lanes, records: list[Record], batches: list[BatchProgress]
    ) -> None:
        """Records that waited behind a whole lane, now gone, go to their own lanes, batch by
        batch in offset order."""
        i = 0
        rule = self.rule_of(a)
        for batch, run in groupby(batches):
            n = len(list(run))
            rule.submit(a, lanes, batch, records[i : i + n])
            i += n

    def running_long(self, since: float) -> list[Task]:
        """Tasks a worker took at or before `since` (`time.perf_counter()`) that still hold
        records it has not reached, and whose records could go elsewhere. Concurrent workers
        start every lane of a task at once and free each as it ends: nothing to move."""
        if self._concurrent or self._batch is not None:
            return []
        out = []
        for tasks in self._outstanding.values():
            for t in tasks:
                started = t.started
                if not started or started > since or t.moved or len(t.records) < 2:
                    continue
                lanes = t.lanes
                if lanes is not None and len(lanes) == 1 and lanes[0] is not _WHOLE:
                    # One key's records (in partition mode every task's): they would wait for
                    # the running one anyway.
                    continue
                out.append(t)
        return out

    def started(self, assignments: Iterable[Assignment] | None = None) -> list[Task]:
        """Tasks a worker has taken and not given back yet (of these assignments, or all)."""
        outstanding = self._outstanding
        groups = (
            outstanding.values()
            if assignments is None
            else [outstanding.get(a, ()) for a in assignments]
        )
        return [t for tasks in groups for t in tasks if t.started]

    def take_unstarted(self, task: Task) -> int:
        """`task` has run long on one record: the records its worker has not reached go to
        other workers, as far as ordering allows, so a slow record holds only what its
        ordering requires. Returns how many moved.

        Partition mode moves nothing (the partition is one lane). Unordered mode moves them
        all. Key mode moves other keys' records with their lanes, and puts the running key's
        later records at the front of its lane, behind the running one; a whole-partition
        task leaves its whole lane first. Only for a task a worker took (`Task.it` set) of a
        dispatching assignment. What moves is the rule's (`OrderingRule.move`)."""
        a = task.assignment
        lanes = self._lanes.get(a)
        if task.it is None or task.moved or lanes is None or not a.dispatching or self._concurrent:
            return 0
        return self.rule_of(a).move(task, lanes)

    def _unreached(
        self, task: Task, lanes: _Lanes
    ) -> tuple[list[Record], list[BatchProgress], _Lane | None]:
        """For `OrderingRule.move`: the records of `task` its worker has not reached leave it,
        with their batches (none: nothing is left). A whole-partition task leaves its whole
        lane too: what waited behind it is returned, to go out after the moved records (they
        come first in offset order)."""
        assert task.it is not None
        rest = list(task.it)  # atomic: its worker will never see these records
        if not rest:
            return rest, [], None
        task.moved = len(rest)
        batches = task.batches[len(task.records) - len(rest) :]
        self._out_records -= len(rest)
        whole = None
        if task.lanes == [_WHOLE]:
            lanes.pop(_WHOLE, None)
            whole = self._waiting[task.assignment].pop(_WHOLE, None)
            task.lanes = None
        return rest, batches, whole

    def assigned(self, assignment: Assignment) -> None:
        """A partition was assigned: with routes of different orderings, its topic's rule is
        asked of the route table now if this is the topic's first assignment."""
        if self.orderings is not None:
            self._topic_rule(assignment.tp.topic)

    def rule_of(self, assignment: Assignment) -> OrderingRule:
        """The ordering rule `assignment`'s records follow: the member's, or with routes of
        different orderings its topic's, asked of the route table the first time a partition
        of the topic is assigned (`assigned`, or here for one that was not), and held from then
        on (routes do not change)."""
        if self.orderings is None:
            return self._rule
        return self._topic_rule(assignment.tp.topic)

    def _topic_rule(self, topic: str) -> OrderingRule:
        rule = self._rules.get(topic)
        if rule is None:
            assert self.orderings is not None
            ordering = self.orderings.of(topic)
            rule = self._by_mode.get(ordering)
            if rule is None:  # not a route's (an unrouted topic fails in the router anyway)
                rule = self._by_mode[ordering] = RULES[ordering](self)
            self._rules[topic] = rule
        return rule

    def lane_key(self, record: Record) -> LaneKey:
        """The lane a failed record holds (`Lane.NONE` in unordered mode)."""
        if self.orderings is None:
            return self._rule.lane_of(record)
        return self._topic_rule(record.topic).lane_of(record)

    def waiting_in(self, assignment: Assignment, key: LaneKey) -> int:
        """Records waiting in the lane `key` of `assignment` (0 if it has no waiting list)."""
        lane = self._waiting.get(assignment, {}).get(key)
        return 0 if lane is None else len(lane.records)

    def resubmit(self, assignment: Assignment, batch: BatchProgress, record: Record) -> None:
        """Unordered mode: a failed record runs again (a retry); it held no lane."""
        if self._lanes.get(assignment) is not None:
            self._pending.append((assignment, None, [record], [batch]))

    def finish_held(self, assignment: Assignment, key: LaneKey, record: Record) -> None:
        """The failed record at the front of a held lane is done with (dead-lettered, or skipped
        by the operator): it leaves the lane, and the lane runs on from the next record."""
        lane = self._waiting.get(assignment, {}).get(key)
        if lane is None or not lane.records or lane.records[0] is not record:
            return
        del lane.records[0], lane.batches[0]
        if lane.held:
            self.release(assignment, key)

    def hold(
        self,
        assignment: Assignment,
        key: LaneKey,
        records: list[Record],
        batches: list[BatchProgress],
    ) -> None:
        """Put a failed record (and the ones behind it) back at the front of its lane and stop
        the lane: nothing of it runs until `release`."""
        if assignment not in self._lanes:
            return
        lane = self._wait(assignment, key)
        lane.push_front(records, batches)
        lane.held = True

    def release(self, assignment: Assignment, key: LaneKey) -> None:
        """Let a held lane run again from its front record (a retry)."""
        lane = self._waiting.get(assignment, {}).get(key)
        if lane is None or not lane.held:
            return
        lane.held = False
        if lane.stale:
            return  # still behind an earlier assignment's running task
        if lane.records:
            self._pending.append((assignment, [key], *lane.take()))
        else:
            del self._lanes[assignment][key], self._waiting[assignment][key]  # the lane is free

    def dispatch(self) -> int:
        """Pack the runnable records into tasks and hand them to the workers; returns tasks."""
        groups = self._pending
        if not groups:
            return 0
        self._pending = []
        max_bytes = self._batch_bytes
        if max_bytes is not None:
            groups = self._cut(groups, lambda a: max_bytes, size_of)
        rates = self._rates
        held: list[_Group] = []
        if rates is not None:
            groups = self._cut(groups, lambda a: rates.group_cap(a.tp.topic), _one)
            rates.start()
            if rates.per_key is not None:
                groups = self._per_key(groups, rates, held)
        lane_size = self.lane_task_size()
        size = self.task_size()
        # Routes of different orderings: each topic's rule sizes its own groups' tasks.
        sizes = None if self.orderings is None else self._sizes(size, lane_size, groups)
        if sizes is None:
            size = self._rule.task_size(size, lane_size, groups)
        tasks = 0
        cur: Assignment | None = None
        recs: list[Record] = []
        batches: list[BatchProgress] = []
        keys: list[LaneKey] | None = None
        nbytes = 0  # of `recs`, counted only with a byte bound
        for a, gkeys, grecs, gbatches in groups:
            if not a.dispatching:
                continue  # revoked, lost or stopping since: these would come back fenced
            if sizes is not None:
                size = sizes[self.rule_of(a)]
            if gkeys is not None:
                lanes = self._lanes.get(a)
                if lanes is None:
                    continue  # forgotten while still dispatching: nothing may run it now
                if len(grecs) > lane_size and len(gkeys) == 1:
                    # One lane's records: the rest wait in the lane, so the lane's later records
                    # are never tied to one worker for long. Groups of several lanes are never
                    # longer than a task when submitted.
                    self._wait(a, gkeys[0]).push_front(grecs[lane_size:], gbatches[lane_size:])
                    grecs, gbatches = grecs[:lane_size], gbatches[:lane_size]
            if rates is not None:
                if not rates.take(a.tp.topic, len(grecs)):
                    held.append((a, gkeys, grecs, gbatches))
                    continue
                if rates.per_key is not None:
                    rates.take_keys(a.tp.topic, grecs)
            gbytes = 0 if max_bytes is None else sum(map(size_of, grecs))
            if recs and (
                a is not cur
                or len(recs) + len(grecs) > size
                or (keys is None) != (gkeys is None)
                or (max_bytes is not None and nbytes + gbytes > max_bytes)
            ):
                self._release(Task(cur, recs, batches, keys))  # type: ignore[arg-type]
                tasks += 1
                recs, batches, nbytes = [], [], 0
            if not recs:
                cur = a
                keys = None if gkeys is None else []
            if gkeys is None:
                # Unordered: cut anywhere, one task per `size` records.
                i = 0
                while i < len(grecs):
                    take = size - len(recs)
                    chunk = grecs[i : i + take]
                    recs += chunk
                    batches += gbatches[i : i + take]
                    if max_bytes is not None:
                        nbytes += sum(map(size_of, chunk))
                    i += take
                    if len(recs) >= size:
                        self._release(Task(a, recs, batches, None))
                        tasks += 1
                        recs, batches, nbytes = [], [], 0
                continue
            recs += grecs
            batches += gbatches
            nbytes += gbytes
            assert keys is not None
            keys += gkeys
        if recs:
            self._release(Task(cur, recs, batches, keys))  # type: ignore[arg-type]
            tasks += 1
        if held:
            self._pending[:0] = held
        return tasks

    def _sizes(self, size: int, lane_size: int, groups: list[_Group]) -> dict[OrderingRule, int]:
        by_rule: dict[OrderingRule, list[_Group]] = {}
        for g in groups:
            by_rule.setdefault(self.rule_of(g[0]), []).append(g)
        return {rule: rule.task_size(size, lane_size, gs) for rule, gs in by_rule.items()}

    def _per_key(self, groups: list[_Group], rates: RateLimits, held: list[_Group]) -> list[_Group]:
        """Key mode with a rate per key: a group's records of keys whose bucket is empty leave
        it as a group of their own that waits (into `held`), so its other keys run on; of a key
        that may run, at most `key_cap` records go and the rest wait at the front of its lane.
        Both parts keep their records in offset order."""
        out: list[_Group] = []
        cap = rates.key_cap
        for group in groups:
            a, gkeys, grecs, gbatches = group
            lanes = self._lanes.get(a)
            if gkeys is None or lanes is None or not a.dispatching:
                out.append(group)  # dispatch drops it
                continue
            if self.rule_of(a).ordering != "key":
                out.append(group)  # a route of another ordering: its keys have no lanes
                continue
            topic = a.tp.topic
            stop: set[LaneKey] = {
                k for k in gkeys if isinstance(k, bytes) and not rates.key_open(topic, k)
            }
            if len(stop) == len(gkeys):
                held.append(group)
                continue
            counts: dict[LaneKey, int] = {}
            go_recs: list[Record] = []
            go_batches: list[BatchProgress] = []
            wait_recs: list[Record] = []
            wait_batches: list[BatchProgress] = []
            behind: dict[LaneKey, tuple[list[Record], list[BatchProgress]]] = {}
            for rec, batch in zip(grecs, gbatches, strict=True):
                key = rec._key
                if key in stop:
                    wait_recs.append(rec)
                    wait_batches.append(batch)
                elif key is not None and counts.get(key, 0) >= cap:
                    recs, batches = behind.setdefault(key, ([], []))
                    recs.append(rec)
                    batches.append(batch)
                else:
                    if key is not None:
                        counts[key] = counts.get(key, 0) + 1
                    go_recs.append(rec)
                    go_batches.append(batch)
            if not stop and not behind:
                out.append(group)
                continue
            go_keys: list[LaneKey] = [k for k in gkeys if k not in stop]
            for lane in go_keys:
                lanes[lane] = go_keys
            for lane, (recs, batches) in behind.items():
                self._wait(a, lane).push_front(recs, batches)
            out.append((a, go_keys, go_recs, go_batches))
            if wait_recs:
                wait_keys: list[LaneKey] = [k for k in gkeys if k in stop]
                for lane in wait_keys:
                    lanes[lane] = wait_keys
                held.append((a, wait_keys, wait_recs, wait_batches))
        return out

    def _cut(
        self,
        groups: list[_Group],
        limit_of: Callable[[Assignment], int | None],
        measure: Callable[[Record], int],
    ) -> list[_Group]:
        """Groups cut so that none measures more than its assignment's limit (None: any), but a
        single record larger than that, alone: batch workers with `batch_max_bytes` measure
        `Record.size` (a batch is made of whole tasks, so this keeps a batch within the bound);
        rate limits count records (`RateLimits.group_cap`). The first records that fit stay in
        the group; of the rest, unordered records form the next group, a lane's records wait at
        the front of their lane (behind the group, in offset order), and in key mode the
        records of keys not in the cut group form the next group."""
        out: list[_Group] = []
        for a, keys, recs, batches in groups:
            limit = limit_of(a)
            if limit is None or (measure is _one and len(recs) <= limit):
                out.append((a, keys, recs, batches))
                continue
            while True:
                n = total = 0
                for rec in recs:
                    total += measure(rec)
                    if total > limit and n:
                        break
                    n += 1
                lanes = self._lanes.get(a)
                if n == len(recs) or (keys is not None and (lanes is None or not a.dispatching)):
                    out.append((a, keys, recs, batches))  # fits, or dispatch drops it
                    break
                head, head_batches = recs[:n], batches[:n]
                recs, batches = recs[n:], batches[n:]
                if keys is None:
                    out.append((a, None, head, head_batches))
                    continue  # unordered: the rest is the next group
                assert lanes is not None
                if len(keys) == 1:
                    self._wait(a, keys[0]).push_front(recs, batches)
                    out.append((a, keys, head, head_batches))
                    break
                lane_of = self.rule_of(a).lane_of
                head_keys = list(dict.fromkeys(map(lane_of, head)))
                taken = set(head_keys)
                behind: dict[LaneKey, tuple[list[Record], list[BatchProgress]]] = {}
                rest: list[Record] = []
                rest_batches: list[BatchProgress] = []
                for rec, batch in zip(recs, batches, strict=True):
                    key = lane_of(rec)
                    if key in taken:
                        wait_recs, wait_batches = behind.setdefault(key, ([], []))
                        wait_recs.append(rec)
                        wait_batches.append(batch)
                    else:
                        rest.append(rec)
                        rest_batches.append(batch)
                for key, (wait_recs, wait_batches) in behind.items():
                    self._wait(a, key).push_front(wait_recs, wait_batches)
                for key in head_keys:
                    lanes[key] = head_keys
                out.append((a, head_keys, head, head_batches))
                if not rest:
                    break
                keys = list(dict.fromkeys(map(lane_of, rest)))
                for key in keys:
                    lanes[key] = keys  # busy with the next group
                recs, batches = rest, rest_batches
        return out

    def lane_task_size(self) -> int:
        """Records per task of a single lane: about `_LANE_SECONDS` of measured handler time."""
        if self._batch is not None:
            return self._batch
        if self._concurrent:
            return _MAX_TASK
        return min(_MAX_TASK, int(_LANE_SECONDS / self._per_record) + 1)

    def task_size(self) -> int:
        """Records per task: about `_TASK_SECONDS` of measured handler time (concurrent workers:
        as many as a task may hold, as their lanes run at once and are freed one by one)."""
        if self._batch is not None:
            return self._batch
        if self._concurrent:
            return _MAX_TASK
        return self.turn_size()

    def turn_size(self) -> int:
        """Records one lane runs in about `_TASK_SECONDS` of measured handler time: a thread
        task's size, and what the budget compares a partition's share with (a share that takes
        a lane longer than that is worth sharing), whatever the workers."""
        return min(_MAX_TASK, int(_TASK_SECONDS / self._per_record) + 1)

    def _release(self, task: Task) -> None:
        if self._concurrent:
            task.done = []  # its workers list finished records here, in any order
        elif len(task.records) > self.task_size():
            task.report = True  # a long task: its finished records count before it ends
            self.reporting[task] = None
        a = task.assignment
        out = self._outstanding.get(a)
        if out is None:
            self._outstanding[a] = {task: None}
        else:
            out[task] = None
        self._out_records += len(task.records)
        self._submit_task(task)

    def returned(self, task: Task) -> None:
        """A task came back: it no longer counts as outstanding; its time tunes task sizes."""
        a = task.assignment
        if self._stale and a.tp in self._stale:
            self._stale_returned(task)
        self.reporting.pop(task, None)
        out = self._outstanding.get(a)
        if out is not None and task in out:
            out.pop(task, None)
            self._out_records -= len(task.records) - task.moved
            if not out:
                del self._outstanding[a]
        # A concurrent task's `seconds` is the sum of its records' handler times, not its wall
        # time (its lanes ran at once): the mean is a record's time either way.
        ran = len(task.records) if task.outcomes is None else task.outcomes.count(DONE)
        if ran:
            self._per_record = 0.8 * self._per_record + 0.2 * max(task.seconds / ran, 1e-7)

    def outstanding(self, assignments: Iterable[Assignment] | None = None) -> int:
        """Records handed to workers and not back yet (started or still in the ready queue)."""
        if assignments is None:
            return self._out_records
        return sum(
            len(t.records) - t.moved for a in assignments for t in self._outstanding.get(a, ())
        )

    def waiting(self) -> int:
        """Records waiting in busy lanes: registered, but not runnable until a task returns."""
        return sum(
            len(lane.records) for waiting in self._waiting.values() for lane in waiting.values()
        ) + sum(map(len, self._parked.values()))

    def tasks_out(self) -> int:
        """Tasks handed to workers and not back yet: fewer than the workers means idle ones."""
        return sum(map(len, self._outstanding.values()))

    def running(self, assignments: Iterable[Assignment]) -> int:
        """Records of these assignments in tasks a worker has taken: what a revoke or shutdown
        waits for. Tasks still in the ready queue of a fenced assignment come back without
        running."""
        return sum(
            len(t.records) - t.moved - (t.reported if t.done is not None else 0)
            for a in assignments
            for t in self._outstanding.get(a, ())
            if t.started
        )

    def progressed(self, task: Task, finished: list[int]) -> None:
        """Concurrent workers: records `finished` (indices into `task.records`) of a task that
        still runs are done. A lane whose records in the task are all done is freed now, so a
        slow record holds only its own lane: the task's other lanes take their waiting records
        at once instead of when the whole task comes back."""
        if task.lanes is None or task.advanced:
            return
        lanes = self._lanes.get(task.assignment)
        if lanes is None:
            return  # forgotten: revoked or lost (a stale task keeps the lanes it holds now)
        left = task.lane_left
        recs = task.records
        if left is None:
            if len(task.lanes) == 1:
                left = {task.lanes[0]: len(recs)}
            else:
                key_of = self.rule_of(task.assignment).lane_of
                left = {}
                for r in recs:
                    k = key_of(r)
                    left[k] = left.get(k, 0) + 1
            task.lane_left = left
        freed: list[LaneKey] = []
        if len(left) == 1:
            ((key, n),) = left.items()
            n -= len(finished)
            if n > 0:
                left[key] = n
            else:
                del left[key]
                freed.append(key)
        else:
            key_of = self.rule_of(task.assignment).lane_of
            for i in finished:
                key = key_of(recs[i])
                n = left[key] - 1
                if n:
                    left[key] = n
                else:
                    del left[key]
                    freed.append(key)
        if freed:
            self._free(task.assignment, lanes, freed)

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
            for lane in self._waiting.get(a, {}).values():
                dropped += lane.take()[0]
            dropped += [r for r, _ in self._parked.pop(a, ())]
        return dropped

    def forget(self, assignments: Iterable[Assignment]) -> None:
        """Remove every lane of these assignments (their late completions are ignored). Tasks
        of theirs that a worker is still running are remembered until they return: a new
        assignment of the partition waits for their lanes."""
        for a in assignments:
            self._lanes.pop(a, None)
            self._waiting.pop(a, None)
            self._parked.pop(a, None)
            for t in self._outstanding.get(a, ()):
                if t.started:
                    self._stale.setdefault(a.tp, []).append(t)

    def _hold_stale(self, a: Assignment) -> None:
        """A new assignment of a partition whose earlier assignment still runs tasks: the
        lanes those tasks hold start busy (their offsets, in unordered mode)."""
        for t in self._stale.get(a.tp, ()):
            for key in _busy_lanes(t):
                self._wait(a, key).stale += 1

    def _wait(self, a: Assignment, key: LaneKey) -> _Lane:
        """What waits in lane `key` of `a`, which is busy from now on if it was not."""
        waiting = self._waiting[a]
        lane = waiting.get(key)
        if lane is None:
            lane = waiting[key] = _Lane()
            lanes = self._lanes[a]
            if key not in lanes:
                lanes[key] = [key]
        return lane

    def _park_stale(
        self, a: Assignment, batch: BatchProgress, records: list[Record]
    ) -> list[Record]:
        """Unordered mode: records at offsets a stale task still runs wait; returns the rest."""
        held = self._stale_offsets(a.tp)
        if not held:
            return records
        parked = self._parked.setdefault(a, [])
        free = []
        for rec in records:
            if rec.offset in held:
                parked.append((rec, batch))
            else:
                free.append(rec)
        return free

    def _stale_offsets(self, tp: Partition) -> set[int]:
        return {r.offset for t in self._stale.get(tp, ()) if t.lanes is None for r in t.records}

    def _stale_returned(self, task: Task) -> None:
        tp = task.assignment.tp
        stale = self._stale[tp]
        if task not in stale:
            return
        stale.remove(task)
        if not stale:
            del self._stale[tp]
        cur = next((a for a in self._lanes if a.tp == tp and a.dispatching), None)
        if cur is None:
            return
        if task.lanes is None:
            parked = self._parked.get(cur)
            if parked:
                held = self._stale_offsets(tp)
                free = [(r, b) for r, b in parked if r.offset not in held]
                self._parked[cur] = [(r, b) for r, b in parked if r.offset in held]
                if free:
                    self._pending.append((cur, None, [r for r, _ in free], [b for _, b in free]))
            return
        lanes, waiting = self._lanes[cur], self._waiting[cur]
        for key in _busy_lanes(task):
            lane = waiting.get(key)
            if lane is None or not lane.stale:
                continue
            lane.stale -= 1
            if lane.stale or lane.held:
                continue
            if lane.records:
                self._pending.append((cur, [key], *lane.take()))
            else:
                del lanes[key], waiting[key]

    @property
    def lanes(self) -> int:
        return sum(len(lanes) for lanes in self._lanes.values())

    @property
    def per_record_seconds(self) -> float:
        return self._per_record


def _busy_lanes(task: Task) -> list[LaneKey]:
    """The lanes a task still holds: all of them, less those a concurrent task freed as their
    records finished (frozen once its assignment is forgotten)."""
    if task.lane_left is not None:
        return list(task.lane_left)
    return task.lanes or []
