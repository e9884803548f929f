"""Scheduler lanes, task packing, the worker pool, the completion queue and the Assignment fence,
without a consumer.

Two ways of driving a scheduler:
- never started: `dispatch` only fills the ready queue; `queued` takes the tasks out of it (standing
  in for a worker that ran them all successfully) so the owner-side bookkeeping can be checked
  step by step;
- started: real workers, synchronised with `threading.Event` gates in the handler (waits are
  bounded by WAIT, never sleeps-as-synchronisation).

Task size depends on the measured handler time (`_per_record`, an EWMA that starts at
`_FIRST_GUESS`): tests that need a given size pin `s._per_record` directly, so the size does not
depend on how fast this machine happens to run the handler.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Literal, Protocol

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir._engine import scheduling
from weir._engine.scheduling import (
    _FIRST_GUESS,
    _MAX_TASK,
    _TASK_SECONDS,
    RULES,
    ByKey,
    ByPartition,
    Lane,
    LaneKey,
    Ordering,
    OrderingRule,
    Scheduler,
    Unordered,
    lane_of,
)
from weir._engine.tasks import DONE, FAILED, FENCED, HELD, Assignment, Task
from weir._engine.tracking import BatchProgress
from weir._engine.workers import ThreadWorkers
from weir.records import Context, Handler, Partition, Record, as_handler

WAIT = 5.0


def scheduler(
    handler: Handler, ordering: Ordering, workers: int = 4, *, whole: bool = True
) -> Scheduler:
    """A scheduler over a pool of `workers` threads (not started)."""
    return Scheduler(ThreadWorkers(handler, workers, lane_of(ordering)), ordering, whole=whole)


def pool(s: Scheduler) -> ThreadWorkers:
    assert isinstance(s.workers, ThreadWorkers)
    return s.workers


KeyFn = Callable[[int], bytes | None]

# Pinned per-record handler times (see the module docstring):
FAST = 1e-9  # task size capped at _MAX_TASK
SIZE_3 = 0.0002  # int(0.0005 / 0.0002) + 1 == 3


def size_for(per_record: float) -> int:
    return min(_MAX_TASK, int(_TASK_SECONDS / per_record) + 1)


def no_key(offset: int) -> bytes | None:
    return None


def rec(partition: int, offset: int, key: bytes | None = None, topic: str = "t") -> Record:
    return Record(
        topic=topic,
        partition=partition,
        offset=offset,
        key=key,
        value=b"v",
        headers=(),
        timestamp=None,
        leader_epoch=None,
        size=1 + (len(key) if key else 0),
    )


def submit(
    s: Scheduler, a: Assignment, offsets: list[int], key: KeyFn = no_key
) -> tuple[BatchProgress, list[Record]]:
    """Submit one batch of `a` with these offsets; `key(offset)` gives each record's key."""
    batch = BatchProgress(offsets, offsets[-1] + 1, a.token)
    recs = [rec(a.tp.partition, o, key(o), a.tp.topic) for o in offsets]
    s.submit(a, batch, recs)
    return batch, recs


def offsets(task: Task) -> list[int]:
    return [r.offset for r in task.records]


def queued(s: Scheduler) -> list[Task]:
    """The tasks in the ready queue of a scheduler that was never started, in dispatch order.

    Each is stamped as if its records ran in exactly the current estimate, so returning it
    leaves `per_record_seconds` (and with it the task size) where the test pinned it.
    """
    out: list[Task] = []
    while True:
        try:
            t = pool(s)._ready.get_nowait()
        except queue.Empty:
            return out
        assert t is not None
        t.seconds = s.per_record_seconds * len(t.records)
        out.append(t)


def settle(s: Scheduler, task: Task) -> None:
    """What the owner does with a task that came back."""
    s.returned(task)
    s.advance(task)


def next_task(s: Scheduler) -> Task:
    """The next task that came back."""
    return pool(s).completions.get(timeout=WAIT)


def retried(s: Scheduler, recorder: Recorder, a: Assignment, key: LaneKey) -> Task:
    """A retry: failures stop, the held lane is released, and its records go out as one task,
    which comes back with every record done."""
    recorder.fail.clear()
    s.release(a, key)
    assert s.dispatch() == 1
    t = next_task(s)
    assert t.outcomes is None
    return t


def no_task(s: Scheduler, wait: float = 0.05) -> None:
    with pytest.raises(queue.Empty):
        item = pool(s).completions.get(timeout=wait)
        raise AssertionError(f"a task came back: {item}")


def pump(s: Scheduler, records: int) -> list[Task]:
    """Play the owner until tasks holding `records` records came back: settle each one and
    dispatch what it released. (Counted in records: how they are packed depends on timing.)"""
    got: list[Task] = []
    while sum(len(t.records) for t in got) < records:
        t = next_task(s)
        settle(s, t)
        s.dispatch()
        got.append(t)
    return got


class Idle(Handler):
    """For schedulers whose workers never run a handler."""

    def handle(self, record: Record, ctx: Context) -> None:
        raise AssertionError("not run")


class Recorder(Handler):
    """Handler that records calls, with optional per-(partition, offset) gates and failures.

    `run` is the same thing as a plain function (no Context), for `as_handler`.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[int, int, bytes | None]] = []
        self.contexts: list[Context] = []
        self.gates: dict[tuple[int, int], threading.Event] = {}
        self.entered: dict[tuple[int, int], threading.Event] = {}
        self.fail: set[tuple[int, int]] = set()
        self.error: Callable[[Record], BaseException] = lambda r: RuntimeError(f"boom {r.offset}")
        # Handler calls in progress per (partition, key) and per partition, and the most seen at
        # once.
        self.active: dict[tuple[int, bytes | None], int] = {}
        self.max_active: dict[tuple[int, bytes | None], int] = {}
        self.active_p: dict[int, int] = {}
        self.max_active_p: dict[int, int] = {}

    def gate(self, partition: int, offset: int) -> threading.Event:
        self.entered[partition, offset] = threading.Event()
        gate = self.gates[partition, offset] = threading.Event()
        return gate

    def open_all(self) -> None:
        for g in self.gates.values():
            g.set()

    def handle(self, record: Record, ctx: Context) -> None:
        with self.lock:
            self.contexts.append(ctx)
        self.run(record)

    def run(self, record: Record) -> None:
        at = (record.partition, record.offset)
        lane = (record.partition, record.key)
        with self.lock:
            self.calls.append((record.partition, record.offset, record.key))
            self.active[lane] = self.active.get(lane, 0) + 1
            self.max_active[lane] = max(self.max_active.get(lane, 0), self.active[lane])
            p = record.partition
            self.active_p[p] = self.active_p.get(p, 0) + 1
            self.max_active_p[p] = max(self.max_active_p.get(p, 0), self.active_p[p])
        try:
            if at in self.entered:
                self.entered[at].set()
            if at in self.gates:
                assert self.gates[at].wait(WAIT), f"gate {at} never opened"
            if at in self.fail:
                raise self.error(record)
        finally:
            with self.lock:
                self.active[lane] -= 1
                self.active_p[record.partition] -= 1

    def offsets(self, partition: int = 0, key: object = ...) -> list[int]:
        with self.lock:
            return [o for p, o, k in self.calls if p == partition and (key is ... or k == key)]


HandlerKind = Literal["handler", "function"]


def wrap(recorder: Recorder, kind: HandlerKind) -> Handler:
    """The worker has two loops: Handler.handle with a Context, or a plain function."""
    return recorder if kind == "handler" else as_handler(recorder.run)


class Factory(Protocol):
    def __call__(
        self,
        handler: Handler,
        ordering: Ordering,
        workers: int = 4,
        *,
        start: bool = True,
        whole: bool = False,
    ) -> Scheduler: ...


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def make(recorder: Recorder, monkeypatch: pytest.MonkeyPatch) -> Iterator[Factory]:
    """Schedulers that are stopped (after opening every gate) when the test ends.

    Single-lane tasks are normally forty times longer than tasks of several lanes; here both
    are one size, so a test pins one size with `_per_record`. Tests of the longer single-lane
    tasks use `lane_tasks` to get them back. Whole-partition lanes (fast handlers in key and
    unordered mode) are off unless a test asks for them with `whole=True`: most tests pin fast
    handlers to get large tasks of key lanes."""
    monkeypatch.setattr(scheduling, "_LANE_SECONDS", _TASK_SECONDS)
    made: list[Scheduler] = []

    def factory(
        handler: Handler,
        ordering: Ordering,
        workers: int = 4,
        *,
        start: bool = True,
        whole: bool = False,
    ) -> Scheduler:
        s = scheduler(handler, ordering, workers, whole=whole)
        if start:
            s.workers.start()
        made.append(s)
        return s

    yield factory
    recorder.open_all()
    for s in made:
        assert s.workers.stop(WAIT)


@pytest.fixture
def lane_tasks(make: Factory, monkeypatch: pytest.MonkeyPatch) -> Factory:
    """`make`, with single-lane tasks as long as in production."""
    monkeypatch.setattr(scheduling, "_LANE_SECONDS", LANE_SECONDS)
    return make


LANE_SECONDS = scheduling._LANE_SECONDS


def assignment(partition: int = 0, token: int = 1) -> Assignment:
    return Assignment(Partition("t", partition), token)


def alternate(offset: int) -> bytes:
    return b"A" if offset % 2 == 0 else b"B"


# -- tasks and lanes (owner side, no workers) ---------------------------------------------------


def test_task_fields(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    s._per_record = FAST
    a = assignment(2, 7)
    batch, recs = submit(s, a, [10, 11, 12], key=lambda o: b"A" if o != 11 else b"BB")
    assert s.dispatch() == 1
    (t,) = queued(s)
    assert t.assignment is a
    # Lanes that are free share one task in offset order (earlier offsets finish first).
    assert t.records == recs
    assert t.batches == [batch, batch, batch]
    assert t.lanes == [b"A", b"BB"]
    assert t.nbytes == sum(r.size for r in recs) == 2 + 2 + 3
    assert t.started == 0.0
    assert t.outcomes is None
    assert t.errors is None
    assert repr(t) == "Task(t[2], first=10, records=3)"
    fresh = Task(a, [recs[0]], [batch], None)
    assert (fresh.seconds, fresh.lanes) == (0.0, None)


def test_first_guess_gives_every_lane_a_task_of_its_own(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    assert s.per_record_seconds == _FIRST_GUESS
    assert size_for(_FIRST_GUESS) == 1
    a = assignment()
    submit(s, a, list(range(6)), key=alternate)
    assert s.lanes == 2
    assert s.dispatch() == 2
    tasks = queued(s)
    assert [offsets(t) for t in tasks] == [[0], [1]]
    assert [t.lanes for t in tasks] == [[b"A"], [b"B"]]
    assert s.outstanding() == 2
    assert s.dispatch() == 0  # 2..5 wait in their busy lanes


def test_slow_measured_handler_keeps_tasks_one_record(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    a = assignment()
    submit(s, a, list(range(4)), key=lambda o: bytes([o]))
    assert s.dispatch() == 4
    for t in queued(s):
        t.seconds = 0.01  # 10 ms a record, well above _TASK_SECONDS
        s.returned(t)
        s.advance(t)
    assert s.per_record_seconds > _TASK_SECONDS
    submit(s, a, list(range(4, 12)), key=lambda o: bytes([o]))
    assert s.dispatch() == 8
    assert [len(t.records) for t in queued(s)] == [1] * 8


def test_lane_later_records_wait_until_advance_and_dispatch(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    a = assignment()
    b1, _ = submit(s, a, [0, 1, 2], key=lambda o: b"K")
    assert s.dispatch() == 1
    (t0,) = queued(s)
    assert offsets(t0) == [0]
    assert s.dispatch() == 0
    b2, _ = submit(s, a, [3], key=lambda o: b"K")  # the lane is busy: waits too
    assert s.dispatch() == 0
    assert queued(s) == []
    settle(s, t0)
    assert queued(s) == []  # advance only makes them runnable; dispatch hands them out
    assert s.dispatch() == 1
    (t1,) = queued(s)
    assert offsets(t1) == [1]
    # The handler turned out fast: the rest of the lane goes as one task.
    s._per_record = t1.seconds = FAST
    settle(s, t1)
    assert s.dispatch() == 1
    (t2,) = queued(s)
    assert offsets(t2) == [2, 3]
    assert t2.batches == [b1, b2]
    assert s.lanes == 1
    settle(s, t2)
    assert s.lanes == 0
    assert s.dispatch() == 0
    assert s.outstanding() == 0


def test_null_keys_share_one_lane(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    a0, a1 = assignment(0, 1), assignment(1, 2)
    submit(s, a0, [0, 1, 2])
    submit(s, a0, [3], key=lambda o: b"A")
    submit(s, a1, [0, 1])
    assert s.lanes == 3
    assert s.dispatch() == 3
    tasks = queued(s)
    assert [(t.assignment, offsets(t), t.lanes) for t in tasks] == [
        (a0, [0], [None]),
        (a0, [3], [b"A"]),
        (a1, [0], [None]),
    ]
    assert s.outstanding() == 3
    assert s.outstanding([a0]) == 2


def test_same_key_on_different_partitions_are_different_lanes(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    s._per_record = FAST
    for p in range(3):
        submit(s, assignment(p, p + 1), [0, 1], key=lambda o: b"K")
    assert s.lanes == 3
    # A task never mixes assignments, however small the records.
    assert s.dispatch() == 3
    assert [(t.assignment.tp.partition, offsets(t)) for t in queued(s)] == [
        (0, [0, 1]),
        (1, [0, 1]),
        (2, [0, 1]),
    ]


def test_partition_mode_has_one_lane_per_partition(make: Factory) -> None:
    s = make(Idle(), "partition", start=False)
    a = assignment()
    submit(s, a, [0, 1, 2], key=lambda o: bytes([o]))  # distinct keys, still one lane
    assert s.lanes == 1
    assert s.dispatch() == 1
    (t0,) = queued(s)
    assert offsets(t0) == [0]
    assert t0.lanes == [None]
    submit(s, a, [3, 4])
    assert s.dispatch() == 0
    s._per_record = t0.seconds = FAST
    settle(s, t0)
    assert s.dispatch() == 1
    (t1,) = queued(s)
    assert offsets(t1) == [1, 2, 3, 4]
    settle(s, t1)
    assert s.lanes == 0


def test_unordered_mode_has_no_lanes(make: Factory) -> None:
    s = make(Idle(), "unordered", start=False)
    a = assignment()
    submit(s, a, [0, 1, 2, 5], key=lambda o: b"K")
    assert s.lanes == 0
    assert s.dispatch() == 4
    tasks = queued(s)
    assert [offsets(t) for t in tasks] == [[0], [1], [2], [5]]
    assert all(t.lanes is None for t in tasks)
    assert s.outstanding() == 4
    for t in tasks:
        settle(s, t)
    assert s.dispatch() == 0
    assert s.outstanding() == 0


def test_fast_handler_packs_many_lanes_into_few_tasks(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    s._per_record = FAST
    assert size_for(FAST) == _MAX_TASK
    a = assignment()
    n = 2 * _MAX_TASK + 200
    submit(s, a, list(range(n)), key=lambda o: o.to_bytes(4, "big"))
    assert s.lanes == n
    assert s.dispatch() == 3
    tasks = queued(s)
    assert [len(t.records) for t in tasks] == [_MAX_TASK, _MAX_TASK, 200]
    assert [o for t in tasks for o in offsets(t)] == list(range(n))
    for t in tasks:
        assert t.lanes == [r.key for r in t.records]


def test_a_lane_longer_than_a_task_is_cut(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    s._per_record = SIZE_3
    assert size_for(SIZE_3) == 3
    a = assignment()
    submit(s, a, [0, 1, 2, 3, 4, 5, 6, 7], key=lambda o: b"J" if o == 7 else b"K")
    assert s.dispatch() == 2  # K's first three, then J (it does not fit next to them)
    t_k, t_j = queued(s)
    assert (offsets(t_k), t_k.lanes) == ([0, 1, 2], [b"K"])
    assert (offsets(t_j), t_j.lanes) == ([7], [b"J"])
    assert s.dispatch() == 0  # the rest of K waits for its task
    settle(s, t_j)
    assert s.dispatch() == 0
    settle(s, t_k)
    assert s.dispatch() == 1
    (t,) = queued(s)
    assert offsets(t) == [3, 4, 5]
    settle(s, t)
    assert s.dispatch() == 1
    (t,) = queued(s)
    assert offsets(t) == [6]
    settle(s, t)
    assert s.lanes == 0


def test_unordered_tasks_are_cut_at_the_size(make: Factory) -> None:
    s = make(Idle(), "unordered", start=False)
    s._per_record = SIZE_3
    a = assignment()
    submit(s, a, list(range(7)))
    assert s.dispatch() == 3
    assert [offsets(t) for t in queued(s)] == [[0, 1, 2], [3, 4, 5], [6]]


def test_unordered_fast_tasks_are_capped(make: Factory) -> None:
    s = make(Idle(), "unordered", start=False)
    s._per_record = FAST
    a = assignment()
    submit(s, a, list(range(_MAX_TASK + 1)))
    assert s.dispatch() == 2
    assert [len(t.records) for t in queued(s)] == [_MAX_TASK, 1]


def test_dispatch_skips_records_of_a_fenced_assignment(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    s._per_record = FAST
    fenced, live = assignment(0, 1), assignment(1, 2)
    submit(s, fenced, [0, 1], key=alternate)
    submit(s, live, [0, 1], key=alternate)
    fenced.dispatching = False
    assert s.dispatch() == 1
    (t,) = queued(s)
    assert t.assignment is live
    assert s.outstanding([fenced]) == 0


def test_outstanding_totals_and_per_assignment(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    a0, a1 = assignment(0, 1), assignment(1, 2)
    submit(s, a0, [0, 1, 2], key=lambda o: bytes([o]))
    submit(s, a1, [0, 1], key=lambda o: bytes([o]))
    assert s.outstanding() == 0  # not handed out yet
    s.dispatch()
    tasks = queued(s)
    assert s.outstanding() == 5
    assert s.outstanding([a0]) == 3
    assert s.outstanding([a1]) == 2
    assert s.outstanding([a0, a1]) == 5
    assert s.outstanding([]) == 0
    s.returned(tasks[0])
    s.returned(tasks[0])  # twice: counted once
    assert s.outstanding() == 4
    assert s.outstanding([a0]) == 2
    for t in tasks[1:]:
        s.returned(t)
    assert s.outstanding() == 0
    assert s.outstanding([a0, a1]) == 0


def test_drop_queued_returns_waiting_records_and_leaves_released_tasks(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    a0, a1 = assignment(0, 1), assignment(1, 2)
    submit(s, a0, [0, 1, 2, 3], key=lambda o: b"A" if o < 2 else b"B")
    submit(s, a1, [0, 1, 2], key=lambda o: b"A")
    assert s.dispatch() == 3  # heads: a0 0 (A) and 2 (B), a1 0
    released = queued(s)
    submit(s, a0, [4], key=lambda o: b"C")  # runnable, not dispatched yet
    dropped = s.drop_queued([a0])
    assert sorted(r.offset for r in dropped) == [1, 3, 4]
    assert all(r.partition == 0 for r in dropped)
    assert s.outstanding([a0]) == 2  # released tasks are left alone: they come back themselves
    assert s.outstanding([a1]) == 1
    assert s.dispatch() == 0
    for t in released:
        if t.assignment is a0:
            settle(s, t)
    assert s.dispatch() == 0  # nothing of a0 is left to run
    assert s.outstanding([a0]) == 0
    # a1 is untouched: its lane still releases in order.
    (t1,) = [t for t in released if t.assignment is a1]
    settle(s, t1)
    assert s.dispatch() == 1
    (t,) = queued(s)
    assert (t.assignment, offsets(t)) == (a1, [1])


def test_forget_removes_lanes_and_late_advances_are_harmless(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    p0 = Partition("t", 0)
    old = Assignment(p0, 1)
    submit(s, old, [0, 1], key=lambda o: b"K")
    assert s.dispatch() == 1
    (late,) = queued(s)
    old.dispatching = False  # how a revoke forgets: fence, drop, forget
    s.drop_queued([old])
    s.forget([old])
    assert s.lanes == 0
    # A new assignment of the same partition opens a new lane for the same key at once.
    new = Assignment(p0, 2)
    submit(s, new, [0, 1], key=lambda o: b"K")
    assert s.dispatch() == 1
    (fresh,) = queued(s)
    # Counted per assignment: the old task still out does not count against the new one.
    assert s.outstanding([old]) == 1
    assert s.outstanding([new]) == 1
    # The old task comes back late: it must not release or free the new lane.
    settle(s, late)
    assert s.lanes == 1
    assert s.dispatch() == 0
    settle(s, fresh)
    assert s.dispatch() == 1
    (t,) = queued(s)
    assert offsets(t) == [1]
    settle(s, t)
    assert s.lanes == 0
    assert s.outstanding() == 0


def test_advancing_a_task_twice_has_no_effect(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    a = assignment()
    submit(s, a, [0, 1, 2], key=lambda o: b"K")
    s.dispatch()
    (t0,) = queued(s)
    settle(s, t0)
    s.advance(t0)  # twice: must change nothing
    assert s.lanes == 1
    assert s.dispatch() == 1
    (t1,) = queued(s)
    assert offsets(t1) == [1]
    submit(s, a, [3], key=lambda o: b"K")
    assert s.dispatch() == 0  # 3 waits behind 1 and 2


def test_an_empty_submit_does_not_block_the_partition(make: Factory) -> None:
    s = make(Idle(), "partition", start=False)
    a = assignment()
    s.submit(a, BatchProgress([], 0, a.token), [])
    s.dispatch()
    submit(s, a, [0, 1])
    assert s.dispatch() == 1


def test_a_forgotten_assignment_never_dispatches_its_pending_records(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    a = assignment()
    submit(s, a, [0, 1, 2], key=lambda o: b"K")
    s.forget([a])  # still dispatching: only the lanes are gone
    assert s.dispatch() == 0
    assert s.outstanding() == 0


def test_hold_and_release_of_a_lane(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    s._per_record = FAST
    a = assignment()
    submit(s, a, [2], key=lambda o: b"L")
    assert s.dispatch() == 1
    (t_l,) = queued(s)
    batch = BatchProgress([0, 1], 2, a.token)
    s.hold(a, b"K", [rec(0, 0, b"K"), rec(0, 1, b"K")], [batch, batch])
    assert s.lanes == 2
    submit(s, a, [3, 4], key=lambda o: b"K" if o == 3 else b"M")
    assert s.dispatch() == 1  # only M: K is held
    (t_m,) = queued(s)
    assert offsets(t_m) == [4]
    s.release(a, b"X")  # unknown lane: nothing
    s.release(a, b"L")  # busy, not held: nothing
    assert s.dispatch() == 0
    s.release(a, b"K")
    assert s.dispatch() == 1
    (t_k,) = queued(s)
    assert offsets(t_k) == [0, 1, 3]  # held records first
    assert t_k.batches[:2] == [batch, batch]
    s.release(a, b"K")  # not held any more: nothing
    assert s.dispatch() == 0
    for t in (t_l, t_m, t_k):
        settle(s, t)
    assert s.lanes == 0


# -- key mode: groups of free keys, marker lanes ----------------------------------------------

# Pinned per-record times giving task sizes 1..5 (checked in the property test).
PER_RECORD_FOR_SIZE = {1: 0.001, 2: 0.0004, 3: SIZE_3, 4: 0.00015, 5: 0.00011}


def test_a_repeated_key_in_a_fresh_batch_joins_its_group(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    s._per_record = FAST
    a = assignment()
    keys = {0: b"A", 1: b"B", 2: b"A", 3: b"C", 4: b"B"}
    batch, recs = submit(s, a, [0, 1, 2, 3, 4], key=keys.__getitem__)
    assert s.lanes == 3  # one per key, however often it repeats
    assert s.dispatch() == 1
    (t,) = queued(s)
    assert t.records == recs  # offset order, the repeats in place
    assert t.batches == [batch] * 5
    assert t.lanes == [b"A", b"B", b"C"]  # each key once, first seen first
    settle(s, t)
    assert s.lanes == 0
    assert s.dispatch() == 0


def test_a_key_repeated_after_its_group_is_full_waits_for_the_group(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    s._per_record = SIZE_3
    a = assignment()
    keys = dict(enumerate([b"A", b"B", b"C", b"A", b"D"]))
    submit(s, a, [0, 1, 2, 3, 4], key=keys.__getitem__)
    assert s.lanes == 4
    assert s.dispatch() == 2
    t1, t2 = queued(s)
    assert (offsets(t1), t1.lanes) == ([0, 1, 2], [b"A", b"B", b"C"])
    assert (offsets(t2), t2.lanes) == ([4], [b"D"])  # a group of its own, not behind A
    assert t1.lanes is not None and t2.lanes is not None
    assert not set(t1.lanes) & set(t2.lanes)
    assert s.dispatch() == 0  # 3 waits for t1, which holds A
    submit(s, a, [5], key=lambda o: b"A")  # a later batch: A is still busy
    s.release(a, b"A")  # busy with records waiting, not held: nothing
    s.release(a, b"B")  # only marked busy: nothing
    assert s.dispatch() == 0
    settle(s, t1)
    assert s.lanes == 2  # B and C are free; A has records waiting, D is still out
    assert s.dispatch() == 1
    (t3,) = queued(s)
    assert (offsets(t3), t3.lanes) == ([3, 5], [b"A"])
    assert t3.lanes is not None
    assert not set(t3.lanes) & set(t2.lanes)  # both in flight now
    settle(s, t2)
    settle(s, t3)
    assert s.lanes == 0
    assert s.dispatch() == 0


def test_key_lanes_do_not_leak_across_batches(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    s._per_record = SIZE_3
    a = assignment()
    out: list[Task] = []
    done: list[int] = []
    n = 48
    # Eight records a batch over eleven keys: every batch repeats keys still busy from the last
    # one, and only the oldest task comes back between batches.
    for start in range(0, n, 8):
        submit(s, a, list(range(start, start + 8)), key=lambda o: bytes([o % 11]))
        s.dispatch()
        out += queued(s)
        t = out.pop(0)
        settle(s, t)
        done += offsets(t)
    while out:
        t = out.pop()  # newest first
        settle(s, t)
        done += offsets(t)
        s.dispatch()
        out += queued(s)
    assert sorted(done) == list(range(n))
    assert s.outstanding() == 0
    assert s.lanes == 0


def test_hold_on_a_key_only_marked_busy(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    s._per_record = FAST
    a = assignment()
    b1, recs = submit(s, a, [0, 1], key=lambda o: b"A" if o == 0 else b"B")
    assert s.dispatch() == 1
    (t,) = queued(s)
    assert isinstance(s._lanes[a][b"A"], list)  # busy, nothing waits: a marker, not a _Lane
    s.hold(a, b"A", [recs[0]], [b1])  # as if 0 failed
    b2, _ = submit(s, a, [2], key=lambda o: b"A")  # waits behind the held record
    settle(s, t)
    assert s.lanes == 1  # B is free; A stays held across the advance
    assert s.dispatch() == 0
    s.release(a, b"A")
    assert s.dispatch() == 1
    (t,) = queued(s)
    assert (offsets(t), t.lanes) == ([0, 2], [b"A"])
    assert t.batches == [b1, b2]
    settle(s, t)
    assert s.lanes == 0


def test_a_failure_holds_a_key_only_marked_busy(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    s._per_record = FAST
    a = assignment()
    submit(s, a, [0, 1, 2], key=lambda o: b"B" if o == 1 else b"A")
    assert s.dispatch() == 1
    (t,) = queued(s)
    assert isinstance(s._lanes[a][b"A"], list)
    # What a worker reports when 0 fails: 2 (same key) is held, 1 (another key) ran.
    t.outcomes = bytearray([FAILED, DONE, HELD])
    t.errors = {0: RuntimeError("boom 0")}
    submit(s, a, [3], key=lambda o: b"A")
    settle(s, t)
    assert s.lanes == 1
    assert s.dispatch() == 0
    s.release(a, b"A")
    assert s.dispatch() == 1
    (t,) = queued(s)
    assert offsets(t) == [0, 2, 3]
    settle(s, t)
    assert s.lanes == 0


def test_drop_queued_with_marker_and_waiting_lanes(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    s._per_record = SIZE_3
    a, other = assignment(0, 1), assignment(1, 2)
    keys = dict(enumerate([b"A", b"B", b"C", b"A", b"D"]))
    submit(s, a, [0, 1, 2, 3, 4], key=keys.__getitem__)  # 3 waits in A's lane
    submit(s, other, [0, 1], key=lambda o: b"A")
    assert s.dispatch() == 3
    released = queued(s)
    assert [offsets(t) for t in released] == [[0, 1, 2], [4], [0, 1]]
    keys = {5: b"B", 6: b"E", 7: b"E"}
    submit(s, a, [5, 6, 7], key=keys.__getitem__)  # 5 waits for B; E is runnable
    submit(s, other, [2], key=lambda o: b"A")  # waits for the other A lane
    dropped = s.drop_queued([a])
    assert sorted(r.offset for r in dropped) == [3, 5, 6, 7]
    assert all(r.partition == 0 for r in dropped)
    assert s.drop_queued([a]) == []  # each record dropped once
    assert s.outstanding([a]) == 4  # released tasks are left alone
    for t in released:
        settle(s, t)
    assert s.dispatch() == 1  # nothing of a: only the other assignment's lane
    (t,) = queued(s)
    assert (t.assignment, offsets(t)) == (other, [2])


def test_lanes_freed_by_one_task_go_out_as_one_group_in_offset_order(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    s._per_record = FAST
    a = assignment()
    submit(s, a, [0, 1], key=lambda o: [b"A", b"B"][o])
    assert s.dispatch() == 1
    (t0,) = queued(s)
    keys = {2: b"B", 3: b"A", 4: b"B"}
    b2, _ = submit(s, a, [2, 3, 4], key=keys.__getitem__)  # both lanes busy: all wait
    assert s.dispatch() == 0
    settle(s, t0)
    assert s.dispatch() == 1
    (t1,) = queued(s)
    assert offsets(t1) == [2, 3, 4]  # not lane by lane (B: 2, 4 then A: 3)
    assert Counter(t1.lanes or []) == Counter([b"A", b"B"])
    assert t1.batch is b2  # one batch: marked finished in one call
    settle(s, t1)
    assert s.lanes == 0


def test_a_freed_lane_longer_than_a_task_goes_alone(make: Factory) -> None:
    s = make(Idle(), "key", start=False)
    s._per_record = SIZE_3
    a = assignment()
    submit(s, a, [0, 1], key=lambda o: [b"A", b"B"][o])
    assert s.dispatch() == 1
    (t0,) = queued(s)
    submit(s, a, [2, 3, 4, 5, 6], key=lambda o: b"B" if o == 6 else b"A")
    settle(s, t0)
    assert s.dispatch() == 2
    t_a, t_b = queued(s)
    assert (offsets(t_a), t_a.lanes) == ([2, 3, 4], [b"A"])
    assert (offsets(t_b), t_b.lanes) == ([6], [b"B"])
    settle(s, t_b)
    settle(s, t_a)
    assert s.dispatch() == 1
    (t,) = queued(s)
    assert offsets(t) == [5]
    settle(s, t)
    assert s.lanes == 0


def test_a_single_lane_task_is_longer_and_reports_progress(lane_tasks: Factory) -> None:
    s = lane_tasks(Idle(), "partition", start=False)
    s._per_record = 0.001  # 1 ms handlers: tasks of 1 record, single-lane tasks of 41
    n = int(LANE_SECONDS / 0.001) + 1
    assert (s.task_size(), s.lane_task_size()) == (1, n) == (1, 41)
    a = assignment()
    submit(s, a, list(range(n + 3)))
    assert s.dispatch() == 1
    (t,) = queued(s)
    assert offsets(t) == list(range(n))
    # Longer than a task of several lanes: its worker counts finished records for the owner.
    assert t.report and list(s.reporting) == [t]
    settle(s, t)
    assert not s.reporting
    assert s.dispatch() == 1
    (t,) = queued(s)
    assert (offsets(t), t.report, list(s.reporting)) == ([n, n + 1, n + 2], True, [t])
    settle(s, t)
    assert s.lanes == 0
    assert not s.reporting


def test_tasks_of_several_lanes_stay_short_and_report_nothing(lane_tasks: Factory) -> None:
    s = lane_tasks(Idle(), "key", start=False)
    s._per_record = 0.0002  # tasks of 3, single-lane tasks of 26
    a = assignment()
    submit(s, a, list(range(6)), key=lambda o: bytes([o]))
    assert s.dispatch() == 2
    tasks = queued(s)
    assert [offsets(t) for t in tasks] == [[0, 1, 2], [3, 4, 5]]
    assert [t.report for t in tasks] == [0, 0]


def test_unordered_packs_a_deep_batch_into_longer_tasks(lane_tasks: Factory) -> None:
    """Unordered records of a batch that gives every worker two tasks or more go out in tasks of
    up to a single-lane task's length: fewer hand-offs, and no worker left without work."""
    s = lane_tasks(Idle(), "unordered", workers=4, start=False)
    s._per_record = 0.001  # tasks of 1 record, single-lane tasks of 6
    a = assignment()
    submit(s, a, list(range(48)))  # 48 // (2 * 4) = 6 per task
    assert s.dispatch() == 8
    tasks = queued(s)
    assert [len(t.records) for t in tasks] == [6] * 8
    assert [t.report for t in tasks] == [1] * 8  # finished records still go back one by one
    submit(s, a, list(range(48, 64)))  # 16 // 8 = 2 per task
    assert s.dispatch() == 8
    assert [offsets(t) for t in queued(s)] == [[48 + 2 * i, 49 + 2 * i] for i in range(8)]


def test_unordered_keeps_short_tasks_for_a_shallow_batch(lane_tasks: Factory) -> None:
    s = lane_tasks(Idle(), "unordered", workers=4, start=False)
    s._per_record = 0.001
    a = assignment()
    submit(s, a, list(range(7)))  # fewer than two records per worker: one record per task
    assert s.dispatch() == 7
    assert [offsets(t) for t in queued(s)] == [[o] for o in range(7)]


_KEYS: dict[int, bytes | None] = {0: None, 1: b"1", 2: b"2", 3: b"3", 4: b"4", 5: b"5"}


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_key_lanes_dispatch_each_record_once_in_key_order(data: st.DataObject) -> None:
    assert {n: size_for(p) for n, p in PER_RECORD_FOR_SIZE.items()} == {n: n for n in range(1, 6)}
    s = scheduler(as_handler(lambda r: None), "key", 1, whole=False)  # never started
    assigns = [assignment(0, 1), assignment(1, 2)]
    next_offset = [0, 0]
    submitted: set[tuple[int, int]] = set()
    dispatched: set[tuple[int, int]] = set()
    last: dict[tuple[int, bytes | None], int] = {}
    out: list[Task] = []
    # Task sizes at which groups were formed (submits, and advances joining freed lanes) since the
    # last dispatch.
    submit_sizes: list[int] = []

    # Task sizes while the steps run, then the order and sizes of the final settling: drawn
    # from a seeded Random to keep the number of draws (and the run time) small.
    drain = data.draw(st.randoms(use_true_random=False), label="drain")
    draining = False

    def pin() -> int:
        size = drain.randint(1, 5) if draining else data.draw(st.integers(1, 5), label="size")
        s._per_record = PER_RECORD_FOR_SIZE[size]
        return size

    def dispatch() -> None:
        size = pin()
        lane_size = s.lane_task_size()
        s.dispatch()
        # A task holds at most a task of records, or one group formed at a larger size; a task
        # of a single lane at most a single-lane task.
        bound = max([size, *submit_sizes])
        submit_sizes.clear()
        busy = {(t.assignment.tp.partition, k) for t in out for k in t.lanes or ()}
        for t in queued(s):
            p = t.assignment.tp.partition
            assert t.lanes is not None
            assert len(t.lanes) == len(set(t.lanes))
            assert set(t.lanes) == {r.key for r in t.records}
            limit = bound if len(t.lanes) > 1 else max(bound, lane_size)
            assert 1 <= len(t.records) <= limit
            lanes = {(p, k) for k in t.lanes}
            assert not lanes & busy, f"a key in two outstanding tasks: {lanes & busy}"
            busy |= lanes
            for r in t.records:
                at = (p, r.offset)
                assert at in submitted and at not in dispatched
                dispatched.add(at)
                assert last.get((p, r.key), -1) < r.offset, f"{at} out of key order"
                last[p, r.key] = r.offset
            out.append(t)

    def settle_one() -> None:
        if draining:
            i = drain.randrange(len(out))
        else:
            i = data.draw(st.integers(0, len(out) - 1), label="settle")
        submit_sizes.append(size_for(s._per_record))
        settle(s, out.pop(i))

    for _ in range(data.draw(st.integers(0, 20), label="steps")):
        op = data.draw(st.sampled_from(["submit", "dispatch", "settle"]), label="op")
        if op == "submit":
            i = data.draw(st.integers(0, 1), label="assignment")
            ks = data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=8), label="keys")
            offs = list(range(next_offset[i], next_offset[i] + len(ks)))
            next_offset[i] += len(ks)
            key_of = {o: _KEYS[k] for o, k in zip(offs, ks, strict=True)}
            submit_sizes.append(pin())
            submit(s, assigns[i], offs, key=key_of.__getitem__)
            submitted.update((i, o) for o in offs)
        elif op == "dispatch":
            dispatch()
        elif out:
            settle_one()
    draining = True
    while True:  # settle everything, releasing what waits
        dispatch()
        if not out:
            break
        settle_one()
    assert dispatched == submitted
    assert s.outstanding() == 0
    assert s.lanes == 0


# -- workers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["handler", "function"])
def test_the_worker_counts_each_finished_record_of_a_long_lane_task(
    recorder: Recorder, lane_tasks: Factory, kind: HandlerKind
) -> None:
    gate = recorder.gate(0, 1)
    s = lane_tasks(wrap(recorder, kind), "partition", workers=1)
    s._per_record = 0.001
    a = assignment()
    submit(s, a, [0, 1, 2])
    assert s.dispatch() == 1
    (t,) = s.reporting
    assert recorder.entered[0, 1].wait(WAIT)
    assert t.finished == 1  # record 0 is done, record 1 still running
    no_task(s)  # counting sends nothing: the owner reads the count when it wakes
    gate.set()
    assert next_task(s) is t
    assert t.finished == 3
    assert t.outcomes is None


def test_function_handler_receives_just_the_record(make: Factory) -> None:
    seen: list[tuple[object, ...]] = []

    def fn(*args: object) -> None:
        seen.append(args)

    s = make(as_handler(fn), "unordered", workers=1)
    a = assignment(3, 17)
    _, recs = submit(s, a, [5, 6])
    assert s.dispatch() == 2
    tasks = [next_task(s), next_task(s)]
    assert sorted(o for t in tasks for o in offsets(t)) == [5, 6]
    assert all(t.outcomes is None and t.errors is None and t.started for t in tasks)
    assert all(t.seconds >= 0 for t in tasks)
    assert len(seen) == 2
    assert set(seen) == {(r,) for r in recs}


def test_handler_subclass_gets_a_context(recorder: Recorder, make: Factory) -> None:
    gate = recorder.gate(3, 5)
    s = make(recorder, "unordered", workers=1)
    a = assignment(3, 17)
    submit(s, a, [5])
    s.dispatch()
    assert recorder.entered[3, 5].wait(WAIT)
    (ctx,) = recorder.contexts
    assert (ctx.token, ctx.attempt, ctx.event_id) == (17, 1, "t/3/5")
    assert ctx.cancelled is False
    a.cancel.set()
    assert ctx.cancelled is True
    assert "cancelled=True" in repr(ctx)
    gate.set()
    assert next_task(s).outcomes is None


def test_context_attempt_comes_from_the_assignment(recorder: Recorder, make: Factory) -> None:
    """The owner writes a retried record's attempt into its assignment before handing it out
    again; records never retried are attempt 1."""
    s = make(recorder, "unordered", workers=1)
    a = assignment(0, 9)
    a.attempts[4] = 3
    submit(s, a, [4, 5])
    s.dispatch()
    assert next_task(s).outcomes is None
    assert [(c.token, c.attempt, c.event_id) for c in recorder.contexts] == [
        (9, 3, "t/0/4"),
        (9, 1, "t/0/5"),
    ]


def test_key_lanes_run_in_order_and_keys_in_parallel(recorder: Recorder, make: Factory) -> None:
    """A gated key does not stop another key while a worker is free."""
    gate_a = recorder.gate(0, 0)  # lane A's first record blocks
    s = make(recorder, "key", workers=4)
    a = assignment()
    submit(s, a, list(range(8)), key=alternate)
    assert s.dispatch() == 2
    done = [o for t in pump(s, 4) for o in offsets(t)]
    assert done == [1, 3, 5, 7]  # lane B went through, in order
    assert recorder.offsets(key=b"A") == [0]  # lane A is stuck on 0
    gate_a.set()
    done = [o for t in pump(s, 4) for o in offsets(t)]
    assert done == [0, 2, 4, 6]
    assert recorder.max_active == {(0, b"A"): 1, (0, b"B"): 1}
    assert s.outstanding() == 0
    assert s.lanes == 0


def test_keys_run_concurrently(recorder: Recorder, make: Factory) -> None:
    gates = [recorder.gate(0, o) for o in range(3)]
    s = make(recorder, "key", workers=3)
    submit(s, assignment(), [0, 1, 2], key=lambda o: bytes([o]))
    assert s.dispatch() == 3
    # All three handlers are in at once: each waits for its gate, opened only after.
    for o in range(3):
        assert recorder.entered[0, o].wait(WAIT)
    for g in gates:
        g.set()
    assert sorted(o for t in pump(s, 3) for o in offsets(t)) == [0, 1, 2]


def test_partition_mode_runs_one_at_a_time_per_partition(recorder: Recorder, make: Factory) -> None:
    gate = recorder.gate(0, 0)
    s = make(recorder, "partition", workers=4)
    a0, a1 = assignment(0, 1), assignment(1, 2)
    submit(s, a0, [0, 1, 2], key=lambda o: bytes([o]))  # keys do not matter
    submit(s, a1, [0, 1, 2], key=lambda o: bytes([o]))
    assert s.dispatch() == 2
    assert recorder.entered[0, 0].wait(WAIT)
    # Partition 1 runs to the end while partition 0 is stuck on its first record.
    done = [(t.assignment, o) for t in pump(s, 3) for o in offsets(t)]
    assert done == [(a1, 0), (a1, 1), (a1, 2)]
    assert recorder.offsets(0) == [0]
    gate.set()
    done = [(t.assignment, o) for t in pump(s, 3) for o in offsets(t)]
    assert done == [(a0, 0), (a0, 1), (a0, 2)]
    assert recorder.offsets(0) == [0, 1, 2]
    assert recorder.max_active_p == {0: 1, 1: 1}  # one record at a time, whatever the keys
    assert s.lanes == 0


def test_partitions_run_concurrently_in_partition_mode(recorder: Recorder, make: Factory) -> None:
    gates = [recorder.gate(p, 0) for p in range(3)]
    s = make(recorder, "partition", workers=3)
    for p in range(3):
        submit(s, assignment(p, p + 1), [0, 1])
    assert s.dispatch() == 3
    for p in range(3):
        assert recorder.entered[p, 0].wait(WAIT)
    for g in gates:
        g.set()
    pump(s, 6)
    assert recorder.max_active_p == {0: 1, 1: 1, 2: 1}
    assert s.outstanding() == 0


def test_unordered_runs_records_in_parallel(recorder: Recorder, make: Factory) -> None:
    gates = [recorder.gate(0, o) for o in range(3)]
    s = make(recorder, "unordered", workers=3)
    submit(s, assignment(), [0, 1, 2], key=lambda o: b"same")  # one key, no lanes
    assert s.dispatch() == 3
    for o in range(3):
        assert recorder.entered[0, o].wait(WAIT)
    assert recorder.max_active_p[0] == 3
    for g in gates:
        g.set()
    assert sorted(o for t in pump(s, 3) for o in offsets(t)) == [0, 1, 2]


@pytest.mark.parametrize("kind", ["handler", "function"])
def test_fenced_tasks_in_the_ready_queue_come_back_without_running(
    recorder: Recorder, make: Factory, kind: HandlerKind
) -> None:
    s = make(wrap(recorder, kind), "unordered", workers=2, start=False)
    a = assignment()
    submit(s, a, [0, 1, 2])
    assert s.dispatch() == 3
    s._per_record = FAST
    submit(s, a, [3, 4, 5])
    assert s.dispatch() == 1  # one task of three
    a.dispatching = False
    assert s.running([a]) == 0
    s.workers.start()
    tasks = sorted((next_task(s) for _ in range(4)), key=lambda t: t.records[0].offset)
    assert [offsets(t) for t in tasks] == [[0], [1], [2], [3, 4, 5]]
    for t in tasks:
        assert t.started
        assert t.outcomes == bytearray([FENCED] * len(t.records))
        assert t.errors is None
    assert recorder.calls == []
    no_task(s)


@pytest.mark.parametrize("kind", ["handler", "function"])
def test_a_started_task_stops_between_records_once_fenced(
    recorder: Recorder, make: Factory, kind: HandlerKind
) -> None:
    gate = recorder.gate(0, 0)
    s = make(wrap(recorder, kind), "key", workers=1)
    s._per_record = FAST
    a = assignment()
    submit(s, a, [0, 1, 2], key=alternate)
    assert s.dispatch() == 1
    assert recorder.entered[0, 0].wait(WAIT)
    a.dispatching = False  # revoke while record 0 runs
    gate.set()
    t = next_task(s)
    assert offsets(t) == [0, 1, 2]
    assert t.outcomes == bytearray([DONE, FENCED, FENCED])
    assert recorder.offsets() == [0]


@pytest.mark.parametrize("kind", ["handler", "function"])
def test_failure_fails_the_record_holds_its_lane_and_runs_the_others(
    recorder: Recorder, make: Factory, kind: HandlerKind
) -> None:
    recorder.fail.add((0, 0))
    s = make(wrap(recorder, kind), "key", workers=1)
    s._per_record = FAST
    a = assignment()
    keys = {0: b"A", 1: b"B", 2: b"A", 3: b"C", 4: b"B"}
    submit(s, a, [0, 1, 2, 3, 4], key=keys.__getitem__)
    assert s.dispatch() == 1
    t = next_task(s)
    assert offsets(t) == [0, 1, 2, 3, 4]
    assert t.outcomes == bytearray([FAILED, DONE, HELD, DONE, DONE])
    assert t.errors is not None and list(t.errors) == [0]
    assert isinstance(t.errors[0], RuntimeError) and str(t.errors[0]) == "boom 0"
    assert sorted(recorder.offsets()) == [0, 1, 3, 4]  # 2 was held, not run
    settle(s, t)
    assert s.lanes == 1  # A is held; B and C are done and free
    # New records: B's run, A's wait behind the held lane.
    submit(s, a, [5, 6], key=lambda o: b"A" if o == 5 else b"B")
    assert s.dispatch() == 1
    t = next_task(s)
    assert offsets(t) == [6]
    settle(s, t)
    assert s.dispatch() == 0
    no_task(s)
    # A retry: the lane runs again from the failed record.
    t = retried(s, recorder, a, b"A")
    assert offsets(t) == [0, 2, 5]
    settle(s, t)
    assert s.lanes == 0
    assert recorder.offsets(key=b"A") == [0, 0, 2, 5]


# -- whole-partition lanes (fast handlers in key and unordered mode) ------------------------------


WHOLE = scheduling._WHOLE


def test_fast_key_records_go_out_per_partition_behind_one_lane(make: Factory) -> None:
    s = make(Idle(), "key", start=False, whole=True)
    s._per_record = FAST
    a, b = assignment(0, 1), assignment(1, 2)
    keys = {0: b"A", 1: b"B", 2: b"A", 3: b"C"}
    submit(s, a, [0, 1, 2], key=keys.__getitem__)
    submit(s, b, [0, 1], key=keys.__getitem__)
    assert s.dispatch() == 2  # partitions still run in parallel
    t0, u0 = queued(s)
    assert (offsets(t0), t0.lanes, offsets(u0), u0.lanes) == ([0, 1, 2], [WHOLE], [0, 1], [WHOLE])
    submit(s, a, [3], key=keys.__getitem__)  # a free key, but its partition's lane is busy
    assert s.dispatch() == 0
    settle(s, t0)
    assert s.dispatch() == 1
    (t1,) = queued(s)
    assert (offsets(t1), t1.lanes) == ([3], [WHOLE])
    for t in (u0, t1):
        settle(s, t)
    assert s.lanes == 0


def test_key_lanes_replace_the_whole_lane_only_once_it_is_free(make: Factory) -> None:
    """The handler turns slow while a whole-partition task runs: later records still wait
    behind the whole lane (a key lane beside it could run a key's record next to an earlier
    one), and only records that arrive once it is free go out per key."""
    s = make(Idle(), "key", start=False, whole=True)
    s._per_record = FAST
    a = assignment()
    submit(s, a, [0, 1], key=lambda o: b"A")
    assert s.dispatch() == 1
    (t0,) = queued(s)
    s._per_record = t0.seconds = 0.001
    submit(s, a, [2, 3], key=lambda o: b"A" if o == 2 else b"B")
    assert s.dispatch() == 0
    settle(s, t0)
    assert s.dispatch() == 1  # the whole lane's waiting records, one task at a time
    (t1,) = queued(s)
    assert (offsets(t1), t1.lanes) == ([2], [WHOLE])
    settle(s, t1)
    assert s.dispatch() == 1
    (t2,) = queued(s)
    assert (offsets(t2), t2.lanes) == ([3], [WHOLE])
    settle(s, t2)
    assert s.lanes == 0
    submit(s, a, [4, 5], key=lambda o: b"A" if o == 4 else b"B")
    assert s.dispatch() == 2
    assert [(offsets(t), t.lanes) for t in queued(s)] == [([4], [b"A"]), ([5], [b"B"])]


@pytest.mark.parametrize("kind", ["handler", "function"])
def test_a_failure_in_a_whole_partition_task_holds_only_its_key(
    recorder: Recorder, make: Factory, kind: HandlerKind
) -> None:
    """Key mode with fast handlers runs a partition behind one whole lane; a failure there
    holds its key only (the landed code held the whole partition): other keys go on."""
    recorder.fail.add((0, 1))
    s = make(wrap(recorder, kind), "key", workers=1, whole=True)
    s._per_record = FAST
    a = assignment()
    keys = {0: b"A", 1: b"B", 2: b"C", 3: b"B", 4: b"D"}
    submit(s, a, [0, 1, 2, 3], key=keys.__getitem__)
    assert s.dispatch() == 1
    t = next_task(s)
    assert t.lanes == [WHOLE]
    assert t.outcomes == bytearray([DONE, FAILED, DONE, HELD])
    s._per_record = t.seconds = FAST
    settle(s, t)
    submit(s, a, [4], key=keys.__getitem__)  # another key: runs while B is held
    assert s.dispatch() == 1
    t4 = next_task(s)
    assert offsets(t4) == [4] and t4.lanes == [b"D"]
    settle(s, t4)
    t = retried(s, recorder, a, b"B")
    assert offsets(t) == [1, 3]
    settle(s, t)
    assert s.lanes == 0
    assert recorder.offsets() == [0, 1, 2, 4, 1, 3]  # 1 failed once, then ran again


def test_fast_unordered_records_go_out_per_partition_and_a_failure_holds_nothing(
    recorder: Recorder, make: Factory
) -> None:
    recorder.fail.add((0, 1))
    s = make(recorder, "unordered", workers=1, whole=True)
    s._per_record = FAST
    a = assignment()
    submit(s, a, [0, 1, 2])
    assert s.dispatch() == 1
    t = next_task(s)
    assert (t.lanes, t.outcomes) == ([WHOLE], bytearray([DONE, FAILED, DONE]))
    s._per_record = t.seconds = FAST
    settle(s, t)
    assert s.lanes == 0  # as in unordered mode without the whole lane: nothing held
    submit(s, a, [3])
    assert s.dispatch() == 1
    assert offsets(next_task(s)) == [3]


@pytest.mark.parametrize("ordering", ["key", "unordered"])
@pytest.mark.parametrize("per_record", [0.001, SIZE_3])
def test_a_small_batch_of_a_slow_handler_never_takes_the_whole_lane(
    make: Factory, ordering: Ordering, per_record: float
) -> None:
    """One record (taken while throttled) fits in a task of a 1 ms handler too: a whole lane
    then would serialise the partition for as long as records keep coming (unordered mode fell
    to 0.2x of its rate). Whole lanes need tasks of `_WHOLE_TASK` records or more."""
    s = make(Idle(), ordering, start=False, whole=True)
    s._per_record = per_record
    a = assignment()
    submit(s, a, [0], key=lambda o: b"A")
    submit(s, a, [1, 2], key=lambda o: b"B")
    assert s.dispatch() >= 1
    assert all(t.lanes != [WHOLE] for t in queued(s))


def test_unordered_groups_and_a_whole_lane_never_share_a_task(make: Factory) -> None:
    """Unordered records submitted while the handler was slow hold no lane, so the whole lane
    can be taken while they still wait for dispatch: they go out in tasks of their own."""
    s = make(Idle(), "unordered", start=False, whole=True)
    a = assignment()
    s._per_record = 0.001
    submit(s, a, [0, 1])
    s._per_record = FAST
    submit(s, a, [2, 3])
    assert s.dispatch() == 2
    assert [(offsets(t), t.lanes) for t in queued(s)] == [([0, 1], None), ([2, 3], [WHOLE])]


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_whole_and_key_lanes_dispatch_each_record_once_in_key_order(data: st.DataObject) -> None:
    """Submits, dispatches and returns in any order while the handler time moves between fast
    (whole-partition lanes) and slow (key lanes): every record goes out once, a key's records
    in offset order, and never two outstanding tasks with records of one key."""
    s = scheduler(as_handler(lambda r: None), "key", 2, whole=True)  # never started
    assigns = [assignment(0, 1), assignment(1, 2)]
    next_offset = [0, 0]
    dispatched: list[Record] = []
    out: list[Task] = []

    def take() -> None:
        s.dispatch()
        busy = {(t.assignment.tp.partition, r.key) for t in out for r in t.records}
        for t in queued(s):
            mine = {(t.assignment.tp.partition, r.key) for r in t.records}
            assert not mine & busy, f"a key in two outstanding tasks: {mine & busy}"
            busy |= mine
            out.append(t)
            dispatched.extend(t.records)

    for _ in range(data.draw(st.integers(1, 30), label="steps")):
        op = data.draw(st.sampled_from(["submit", "dispatch", "settle", "speed"]), label="op")
        if op == "submit":
            p = data.draw(st.integers(0, 1), label="partition")
            n = data.draw(st.integers(1, 4), label="records")
            keys = data.draw(st.lists(st.sampled_from([b"A", b"B", None]), min_size=n, max_size=n))
            first = next_offset[p]
            next_offset[p] += n
            submit(s, assigns[p], list(range(first, first + n)), key=lambda o: keys[o - first])
        elif op == "speed":
            s._per_record = data.draw(st.sampled_from([FAST, 0.001]), label="per record")
        else:
            if op == "settle" and out:
                t = out.pop(data.draw(st.integers(0, len(out) - 1), label="which"))
                t.seconds = s.per_record_seconds * len(t.records)
                settle(s, t)
            take()
    take()
    while out:
        t = out.pop(0)
        t.seconds = s.per_record_seconds * len(t.records)
        settle(s, t)
        take()
    seen = [(r.partition, r.offset) for r in dispatched]
    assert len(seen) == len(set(seen)), "a record went out twice"
    assert sorted(seen) == sorted((p, o) for p in (0, 1) for o in range(next_offset[p]))
    for p in (0, 1):
        for k in (b"A", b"B", None):
            order = [r.offset for r in dispatched if r.partition == p and r.key == k]
            assert order == sorted(order), f"key {k!r} of partition {p} out of order"
    assert s.lanes == 0


def test_failures_in_two_lanes_of_one_task_hold_both(recorder: Recorder, make: Factory) -> None:
    recorder.fail.update({(0, 0), (0, 1)})
    s = make(recorder, "key", workers=1)
    s._per_record = FAST
    a = assignment()
    submit(s, a, [0, 1, 2, 3, 4], key=lambda o: [b"A", b"B", b"A", b"B", b"C"][o])
    s.dispatch()
    t = next_task(s)
    assert offsets(t) == [0, 1, 2, 3, 4]
    assert t.outcomes == bytearray([FAILED, FAILED, HELD, HELD, DONE])
    assert t.errors is not None and sorted(t.errors) == [0, 1]
    settle(s, t)
    assert s.lanes == 2
    assert s.dispatch() == 0
    t = retried(s, recorder, a, b"B")
    assert offsets(t) == [1, 3]


def test_failure_in_partition_mode_holds_the_rest_of_the_partition(
    recorder: Recorder, make: Factory
) -> None:
    recorder.fail.add((0, 1))
    s = make(recorder, "partition", workers=1)
    s._per_record = FAST
    a = assignment()
    submit(s, a, [0, 1, 2, 3], key=lambda o: bytes([o]))
    s.dispatch()
    t = next_task(s)
    assert t.outcomes == bytearray([DONE, FAILED, HELD, HELD])
    assert recorder.offsets() == [0, 1]
    settle(s, t)
    submit(s, a, [4])
    assert s.dispatch() == 0
    t = retried(s, recorder, a, None)
    assert offsets(t) == [1, 2, 3, 4]


def test_failure_in_unordered_mode_holds_nothing(recorder: Recorder, make: Factory) -> None:
    recorder.fail.add((0, 1))
    s = make(recorder, "unordered", workers=1)
    s._per_record = FAST
    a = assignment()
    submit(s, a, [0, 1, 2, 3], key=lambda o: b"K")
    s.dispatch()
    t = next_task(s)
    assert t.outcomes == bytearray([DONE, FAILED, DONE, DONE])
    assert t.errors is not None and list(t.errors) == [1]
    assert recorder.offsets() == [0, 1, 2, 3]
    settle(s, t)
    assert s.lanes == 0
    assert s.dispatch() == 0


def test_a_task_fenced_after_a_failure_stops_there(recorder: Recorder, make: Factory) -> None:
    recorder.fail.add((0, 0))
    gate = recorder.gate(0, 1)
    s = make(recorder, "unordered", workers=1)
    s._per_record = FAST
    a = assignment()
    submit(s, a, [0, 1, 2])
    s.dispatch()
    assert recorder.entered[0, 1].wait(WAIT)
    a.dispatching = False
    gate.set()
    t = next_task(s)
    assert t.outcomes == bytearray([FAILED, DONE, FENCED])
    assert recorder.offsets() == [0, 1]


def test_base_exception_in_handler_is_a_failure_and_the_worker_survives(
    recorder: Recorder, make: Factory
) -> None:
    recorder.fail.update({(0, 0), (0, 1)})
    recorder.error = lambda r: SystemExit(3)
    s = make(recorder, "unordered", workers=1)
    submit(s, assignment(), [0, 1])
    assert s.dispatch() == 2
    for t in (next_task(s), next_task(s)):
        assert t.outcomes == bytearray([FAILED])
        assert t.errors is not None and isinstance(t.errors[0], SystemExit)
    assert recorder.offsets() == [0, 1]


def test_running_counts_only_tasks_a_worker_has_started(recorder: Recorder, make: Factory) -> None:
    idle = make(recorder, "unordered", workers=1, start=False)  # nothing is ever taken
    a = assignment(0, 1)
    submit(idle, a, [0, 1])
    idle.dispatch()
    assert idle.outstanding() == 2
    assert idle.running([a]) == 0

    gate = recorder.gate(1, 5)
    s = make(recorder, "unordered", workers=1)
    b = assignment(1, 2)
    submit(s, b, [5, 6])
    assert s.dispatch() == 2
    assert recorder.entered[1, 5].wait(WAIT)
    assert s.outstanding([b]) == 2
    assert s.running([b]) == 1  # 6 waits in the ready queue
    assert s.running([a]) == 0
    gate.set()
    for _ in range(2):
        s.returned(next_task(s))
    assert s.running([b]) == 0
    assert s.outstanding() == 0


def test_stop_returns_false_within_its_budget_when_a_handler_is_stuck(
    recorder: Recorder,
) -> None:
    gate = recorder.gate(0, 0)
    s = scheduler(recorder, "unordered", 2)
    s.workers.start()
    submit(s, assignment(), [0])
    s.dispatch()
    assert recorder.entered[0, 0].wait(WAIT)
    t0 = time.monotonic()
    assert s.workers.stop(0.2) is False
    assert time.monotonic() - t0 < 1.0
    gate.set()


def test_stop_is_true_when_idle_or_never_started(recorder: Recorder) -> None:
    s = scheduler(recorder, "key", 3)
    s.workers.start()
    s.workers.start()  # twice: harmless
    assert s.workers.stop(WAIT) is True
    assert scheduler(recorder, "key", 3).workers.stop(WAIT) is True


# -- task sizing from measured time ------------------------------------------------------------


def test_ewma_moves_per_record_seconds_toward_measured_time(make: Factory) -> None:
    s = make(Idle(), "unordered", start=False)
    a = assignment()
    submit(s, a, [0, 1, 2, 3])
    s._per_record = FAST
    s.dispatch()
    (t,) = queued(s)
    s._per_record = _FIRST_GUESS
    t.seconds = 0.004  # 1 ms a record: no change
    s.returned(t)
    assert s.per_record_seconds == pytest.approx(_FIRST_GUESS)
    t.seconds = 0.0004  # 0.1 ms a record
    s.returned(t)
    assert s.per_record_seconds == pytest.approx(0.8 * _FIRST_GUESS + 0.2 * 0.0001)
    for _ in range(50):
        s.returned(t)
    assert s.per_record_seconds == pytest.approx(0.0001, rel=1e-3)
    # Only records that ran (DONE) count; a task that ran nothing leaves the estimate alone.
    before = s.per_record_seconds
    t.outcomes = bytearray([DONE, FAILED, HELD, FENCED])
    t.seconds = 0.001
    s.returned(t)
    assert s.per_record_seconds == pytest.approx(0.8 * before + 0.2 * 0.001)
    before = s.per_record_seconds
    t.outcomes = bytearray([FENCED] * 4)
    s.returned(t)
    assert s.per_record_seconds == before


def test_a_fast_handler_settles_into_packed_tasks(make: Factory) -> None:
    s = make(as_handler(lambda r: None), "key", workers=2)
    a = assignment()
    target = _TASK_SECONDS / 10  # tasks of at least 11 records
    rounds = 0
    next_offset = 0
    # Drive real one-record tasks until the measured time has pulled the estimate down; a
    # no-op handler takes microseconds, so this settles in a handful of rounds.
    while s.per_record_seconds > target:
        rounds += 1
        assert rounds <= 500, f"estimate stuck at {s.per_record_seconds}"
        submit(s, a, [next_offset], key=lambda o: b"K")
        next_offset += 1
        assert s.dispatch() == 1
        settle(s, next_task(s))
    assert s.per_record_seconds < _FIRST_GUESS
    n = 50
    submit(s, a, list(range(next_offset, next_offset + n)), key=lambda o: o.to_bytes(4, "big"))
    tasks = s.dispatch()
    assert tasks < n / 5
    got = pump(s, n)
    assert len(got) == tasks
    assert all(t.outcomes is None for t in got)


# -- records moved off a long task --------------------------------------------------------------


def taken(task: Task, running: int) -> None:
    """As a worker does: take records from the task's iterator up to `running` (whose call
    is under way)."""
    task.it = iter(task.records)
    for _ in range(running + 1):
        next(task.it)
    task.started = 1.0


def test_unordered_records_a_long_task_has_not_reached_go_to_other_tasks(make: Factory) -> None:
    s = make(Idle(), "unordered", start=False)
    s._per_record = FAST
    a = assignment()
    submit(s, a, [0, 1, 2, 3, 4])
    s.dispatch()
    (t,) = queued(s)
    taken(t, running=1)
    assert s.take_unstarted(t) == 3
    assert t.moved == 3 and s.running([a]) == 2
    s.dispatch()
    (moved,) = queued(s)
    assert offsets(moved) == [2, 3, 4]
    assert list(t.it or ()) == []  # the worker will not see them
    assert s.take_unstarted(t) == 0  # once


def test_key_mode_moves_other_keys_and_keeps_the_running_keys_order(make: Factory) -> None:
    """A long multi-key task: other keys' records move with their lanes; the running key's
    later record waits behind it in its lane; a key whose records the task already finished
    is free at once."""
    s = make(Idle(), "key", start=False)
    s._per_record = FAST
    a = assignment()
    keys = {0: b"D", 1: b"A", 2: b"B", 3: b"A", 4: b"C", 5: b"D"}
    submit(s, a, [0, 1, 2, 3, 4, 5], key=keys.__getitem__)
    s.dispatch()
    (t,) = queued(s)
    assert t.lanes == [b"D", b"A", b"B", b"C"]
    taken(t, running=1)  # D@0 finished, A@1 runs long
    assert s.take_unstarted(t) == 4
    assert t.lanes == [b"A"]
    s.dispatch()
    (moved,) = queued(s)
    assert offsets(moved) == [2, 4, 5] and set(moved.lanes or []) == {b"B", b"C", b"D"}
    # D was finished by the long task, so its later record D@5 could move; A@3 could not.
    submit(s, a, [6], key=lambda o: b"A")
    assert s.dispatch() == 0  # A still runs: A@3 and A@6 wait behind it
    t.outcomes = bytearray([1, 1, 0, 0, 0, 0])  # D@0, A@1 done; the rest moved (FENCED)
    settle(s, t)
    s.dispatch()
    (after,) = queued(s)
    assert offsets(after) == [3, 6]


def test_a_long_task_on_its_last_record_frees_the_keys_it_finished(make: Factory) -> None:
    """Regression (a fast test that failed under load): a task of two keys whose worker sat on
    its last record, a slow one, had nothing left to move, so nothing was done, and the other
    key's later records waited for the slow record of a key not theirs until the task came
    back. Its finished keys are free now; the running key's are not, nor after a failure."""
    s = make(Idle(), "key", start=False)
    s._per_record = FAST
    a = assignment()
    keys = {0: b"A", 1: b"B", 2: b"A", 3: b"B"}
    submit(s, a, [0, 1], key=keys.__getitem__)
    s.dispatch()
    (t,) = queued(s)
    assert t.lanes == [b"A", b"B"]
    submit(s, a, [2, 3], key=keys.__getitem__)
    assert s.dispatch() == 0  # A@2 and B@3 wait behind the task
    taken(t, running=1)  # A@0 finished, B@1 runs long
    assert s.take_unstarted(t) == 0  # nothing unreached to move
    assert t.lanes == [b"B"]
    s.dispatch()
    (freed,) = queued(s)
    assert offsets(freed) == [2]  # B@3 still waits for B@1
    t.outcomes = bytearray([1, 1])
    settle(s, t)
    s.dispatch()
    (b3,) = queued(s)
    assert offsets(b3) == [3]

    # After a failure in the task, its keys stay held until the owner hears of it.
    s = make(Idle(), "key", start=False)
    s._per_record = FAST
    a = assignment()
    submit(s, a, [0, 1], key=keys.__getitem__)
    s.dispatch()
    (t,) = queued(s)
    submit(s, a, [2, 3], key=keys.__getitem__)
    taken(t, running=1)
    t.errors = {0: ValueError("A@0 failed")}
    assert s.take_unstarted(t) == 0
    assert t.lanes == [b"A", b"B"] and s.dispatch() == 0


def test_a_key_that_failed_in_a_long_task_keeps_its_later_records_behind_it(
    make: Factory,
) -> None:
    """Regression: A@0 failed in a task whose worker then ran B@1 long; the owner, not told of
    the failure yet, moved A@2 to another worker with the other unreached records, so A@2 could
    run before A@0's retry (the task's own worker holds a failed key's later records back).
    A@2 now waits at the front of A's lane; C@3 moves."""
    s = make(Idle(), "key", start=False)
    s._per_record = FAST
    a = assignment()
    keys = {0: b"A", 1: b"B", 2: b"A", 3: b"C"}
    submit(s, a, [0, 1, 2, 3], key=keys.__getitem__)
    s.dispatch()
    (t,) = queued(s)
    taken(t, running=1)  # A@0 failed, B@1 runs long
    t.errors = {0: ValueError("A@0 failed")}
    assert s.take_unstarted(t) == 2
    assert t.lanes == [b"A", b"B"]
    s.dispatch()
    (moved,) = queued(s)
    assert offsets(moved) == [3]
    assert s.waiting_in(a, b"A") == 1


def test_a_long_whole_partition_task_leaves_its_whole_lane(make: Factory) -> None:
    s = make(Idle(), "key", start=False, whole=True)
    s._per_record = FAST
    a = assignment()
    keys = {0: b"A", 1: b"B", 2: b"A", 3: b"C", 4: b"A", 5: b"B"}
    submit(s, a, [0, 1, 2, 3], key=keys.__getitem__)
    s.dispatch()
    (t,) = queued(s)
    assert t.lanes == [WHOLE]
    submit(s, a, [4, 5], key=keys.__getitem__)  # waits behind the whole lane
    assert s.dispatch() == 0
    taken(t, running=0)  # A@0 runs long
    assert s.take_unstarted(t) == 3
    assert t.lanes == [b"A"]
    s.dispatch()
    (moved,) = queued(s)
    assert offsets(moved) == [1, 3]  # B and C moved; A@2 stays behind A@0, B@5 behind B@1
    settle(s, moved)
    s.dispatch()
    (b5,) = queued(s)
    assert offsets(b5) == [5]
    settle(s, b5)
    t.outcomes = bytearray([1, 0, 0, 0])
    settle(s, t)
    s.dispatch()
    (a_rest,) = queued(s)
    assert offsets(a_rest) == [2, 4]


# -- concurrent workers: out-of-order progress frees lanes of a running task ---------------


class ConcurrentStub:
    """Concurrent workers that never run anything: the test plays their progress."""

    concurrent = True
    slots = 8
    replaced = 0

    def __init__(self) -> None:
        self.submitted: list[Task] = []
        self.completions: queue.SimpleQueue[Task] = queue.SimpleQueue()

    def start(self) -> None:
        pass

    def submit(self, task: Task) -> None:
        self.submitted.append(task)

    def abandon(self, assignments: object) -> int:
        return 0

    def stop(self, timeout: float) -> bool:
        return True


def concurrent(ordering: Ordering) -> tuple[Scheduler, ConcurrentStub]:
    w = ConcurrentStub()
    return Scheduler(w, ordering), w


def finish(s: Scheduler, task: Task, *idx: int) -> None:
    """The workers finished these records of a running task, and said so."""
    assert task.done is not None
    task.done.extend(idx)
    task.reported = len(task.done)
    s.progressed(task, list(idx))


def test_concurrent_tasks_are_as_large_as_a_task_may_be_and_list_their_progress() -> None:
    s, w = concurrent("key")
    a = Assignment(Partition("t", 0), 1)
    submit(s, a, list(range(300)), key=lambda o: b"k%d" % (o % 50))
    s.dispatch()
    assert [len(t.records) for t in w.submitted] == [300]
    assert w.submitted[0].done == [] and not w.submitted[0].report
    assert s.task_size() == s.lane_task_size() == _MAX_TASK


@pytest.mark.parametrize("ordering", ["key", "partition"])
def test_a_lane_is_freed_once_its_records_in_a_running_task_are_done_and_not_before(
    ordering: Ordering,
) -> None:
    """Key mode: records of key a wait behind a running task that holds a twice and b once.
    They go out when both a's are done, while b still runs; not after the first a. Partition
    mode: the one lane is freed when every record of the task is done."""
    s, w = concurrent(ordering)
    a = Assignment(Partition("t", 0), 1)
    keys = {0: b"a", 1: b"b", 2: b"a", 3: b"a", 4: b"b"}
    submit(s, a, [0, 1, 2], key=keys.__getitem__)
    s.dispatch()
    (t1,) = w.submitted
    submit(s, a, [3, 4], key=keys.__getitem__)  # wait: a and b are busy
    assert s.dispatch() == 0
    finish(s, t1, 0)  # the first a: a is still busy with offset 2
    assert s.dispatch() == 0
    finish(s, t1, 2)  # both a's done
    if ordering == "key":
        assert s.dispatch() == 1
        assert offsets(w.submitted[1]) == [3]  # a's record, while b (offset 1) still runs
        assert s.outstanding([a]) == 4
        finish(s, t1, 1)
        assert s.dispatch() == 1
        assert offsets(w.submitted[2]) == [4]
    else:
        assert s.dispatch() == 0  # the partition's lane: offset 1 still runs
        finish(s, t1, 1)
        assert s.dispatch() == 1
        assert offsets(w.submitted[1]) == [3, 4]
    s.returned(t1)
    s.advance(t1)  # the freed lanes are not freed again
    assert s.dispatch() == 0


def test_a_failed_record_keeps_its_lane_held_when_its_task_returns() -> None:
    s, w = concurrent("key")
    a = Assignment(Partition("t", 0), 1)
    keys = {0: b"a", 1: b"b", 2: b"a", 3: b"b"}
    submit(s, a, [0, 1], key=keys.__getitem__)
    s.dispatch()
    (t1,) = w.submitted
    submit(s, a, [2, 3], key=keys.__getitem__)
    finish(s, t1, 1)  # b done: its waiting record goes out
    assert s.dispatch() == 1 and offsets(w.submitted[1]) == [3]
    t1.outcomes = bytearray([FAILED, DONE])
    t1.errors = {0: ValueError("x")}
    s.returned(t1)
    s.advance(t1)
    assert s.dispatch() == 0, "a is held with its failed record at the front"
    assert s.waiting() == 2  # offsets 0 (failed) and 2 wait in a


# -- the ordering rules: what may run at once ----------------------------------------------------

# Keys of one partition's records by offset: two records of A, one of B, two null keys, one of C.
RULE_KEYS: dict[int, bytes | None] = {0: b"A", 1: b"B", 2: b"A", 3: None, 4: None, 5: b"C"}
SLOW = 0.001  # 1 ms handlers: a task per record, whole-partition lanes never taken


def may_run_at_once(rule: type[OrderingRule], recs: list[Record]) -> list[int]:
    """What `rule` lets run at once of `recs` (one partition, offset order, nothing running):
    the first record of each lane, and every record that holds none."""
    taken: set[LaneKey] = set()
    out = []
    for r in recs:
        lane = rule.lane_of(r)
        if lane is Lane.NONE or lane not in taken:
            taken.add(lane)
            out.append(r.offset)
    return out


def running_now(s: Scheduler) -> list[Task]:
    """Dispatch, and the tasks that went out: their records run at once (as if on idle workers)."""
    s.dispatch()
    tasks = queued(s)
    for a, lanes in s._lanes.items():
        assert set(s._waiting[a]) <= set(lanes), "a lane with records waiting is busy"
    held = [k for t in tasks for k in t.lanes or ()]
    assert len(held) == len(set(held)), f"two tasks hold one lane: {held}"
    return tasks


@pytest.mark.parametrize(
    ("ordering", "rule", "lanes", "at_once", "beside", "next_up"),
    [
        # A key's records one at a time, keys (the null key too) side by side.
        ("key", ByKey, [b"A", b"B", b"A", None, None, b"C"], [0, 1, 3, 5], [], [2]),
        # One record of the partition at a time.
        ("partition", ByPartition, [None] * 6, [0], [], [1]),
        # Anything at once.
        ("unordered", Unordered, [Lane.NONE] * 6, [0, 1, 2, 3, 4, 5], [6], []),
    ],
)
def test_each_rule_states_what_may_run_at_once(
    make: Factory,
    ordering: Ordering,
    rule: type[OrderingRule],
    lanes: list[LaneKey],
    at_once: list[int],
    beside: list[int],
    next_up: list[int],
) -> None:
    """Through the rule's interface: the lane each record holds, and so what may run at once.
    A scheduler of that mode runs exactly that; a later batch's record of A (offset 6) runs
    `beside` them only if A's lane is not busy; and when the task holding offset 0 comes back,
    the next record of its lane (`next_up`) runs."""
    assert RULES[ordering] is rule
    recs = [rec(0, o, k) for o, k in RULE_KEYS.items()]
    assert [rule.lane_of(r) for r in recs] == lanes
    assert rule.ordered == (ordering != "unordered")
    assert rule.whole == (ordering != "partition")
    assert lane_of(ordering) == (rule.lane_of if rule.ordered else None)
    assert may_run_at_once(rule, recs) == at_once

    s = make(Idle(), ordering, start=False, whole=True)
    assert type(s._rule) is rule
    s._per_record = SLOW
    a = assignment()
    submit(s, a, list(RULE_KEYS), key=RULE_KEYS.__getitem__)
    first = running_now(s)
    assert sorted(o for t in first for o in offsets(t)) == at_once
    submit(s, a, [6], key=lambda o: b"A")
    assert [o for t in running_now(s) for o in offsets(t)] == beside
    assert s.waiting() == len(RULE_KEYS) + 1 - len(at_once) - len(beside)
    (t0,) = [t for t in first if offsets(t)[0] == 0]
    t0.seconds = SLOW
    settle(s, t0)
    assert sorted(o for t in running_now(s) for o in offsets(t)) == next_up
