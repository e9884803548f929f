"""Budget: the in-flight counts by number and bytes, throttle and pause with hysteresis, shares
and read-ahead, with its invariants checked after every step."""

from __future__ import annotations

import itertools
import queue
import random
from collections.abc import Collection
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir._engine.budget import Budget
from weir._engine.scheduling import Scheduler
from weir._engine.tasks import Assignment, Task
from weir._engine.tracking import BatchProgress
from weir.config import ConsumerConfig, FlowConfig
from weir.records import Partition, Record

MiB = 1024 * 1024
TOPIC = "t"
P0 = Partition(TOPIC, 0)

Event = Literal["throttled", "throttle_lifted"] | None


class HeldWorkers:
    """Workers that never run anything: submitted tasks stay out, so the budget is driven by
    the test alone."""

    def __init__(self, slots: int = 4) -> None:
        self.submitted: list[Task] = []
        self._done: queue.SimpleQueue[Task] = queue.SimpleQueue()
        self._slots = slots

    @property
    def completions(self) -> queue.SimpleQueue[Task]:
        return self._done

    @property
    def slots(self) -> int:
        return self._slots

    @property
    def replaced(self) -> int:
        return 0

    concurrent = False

    def start(self) -> None:
        pass

    def submit(self, task: Task) -> None:
        self.submitted.append(task)

    def abandon(self, assignments: Collection[Assignment]) -> int:
        return 0

    def stop(self, timeout: float) -> bool:
        return True


def records_cfg() -> FlowConfig:
    return FlowConfig(capacity_records=20, pause_records=10, resume_records=4)


def bytes_cfg() -> FlowConfig:
    # Count marks far away: only bytes decide.
    return FlowConfig(
        capacity_records=10_000,
        pause_records=9_000,
        resume_records=8_000,
        capacity_bytes=3 * MiB,
        pause_bytes=2 * MiB,
        resume_bytes=1 * MiB,
    )


class Driver:
    """A budget over `partitions` partitions of one topic, with a scheduler that never runs."""

    def __init__(
        self,
        flow: FlowConfig,
        *,
        partitions: int = 1,
        ordering: Literal["key", "partition", "unordered"] = "key",
        max_batch_records: int = 10,
    ) -> None:
        cfg = ConsumerConfig(
            bootstrap_servers="x",
            group_id="g",
            topics=[TOPIC],
            ordering=ordering,
            flow=flow,
            max_batch_records=max_batch_records,
        )
        self.scheduler = Scheduler(HeldWorkers(), ordering)
        self.budget = Budget(cfg, self.scheduler)
        self.next: dict[Partition, int] = {}
        self.tokens = itertools.count(1)
        for p in range(partitions):
            self.open(Partition(TOPIC, p))

    def open(self, tp: Partition) -> None:
        self.budget.open(Assignment(tp, next(self.tokens)))
        self.next[tp] = 0

    def add(self, n: int, nbytes: int = -1, tp: Partition = P0) -> bool:
        """Register n records of `tp` whose sizes add up to `nbytes` (n bytes by default)."""
        nbytes = n if nbytes < 0 else nbytes
        first = self.next[tp]
        offsets = list(range(first, first + n))
        self.next[tp] = first + n
        sizes = [nbytes // n] * n if n else []
        if n:
            sizes[-1] += nbytes - sum(sizes)
        recs = [
            Record(TOPIC, tp.partition, o, None, None, size=s)
            for o, s in zip(offsets, sizes, strict=True)
        ]
        batch = BatchProgress(offsets, first + n, (1, first))
        pause = self.budget.register(tp, batch, recs, nbytes)
        self.budget.check()
        return pause

    def remove(self, n: int, nbytes: int = -1, tp: Partition = P0) -> None:
        self.budget.finished(tp, n, n if nbytes < 0 else nbytes)
        self.budget.check()

    def update(self) -> Event:
        before = self.budget.throttled
        self.budget.end_turn()
        self.budget.check()
        after = self.budget.throttled
        if after == before:
            return None
        return "throttled" if after else "throttle_lifted"


def test_completion_by_completion_trace_has_one_throttle_and_one_lift() -> None:
    d = Driver(records_cfg())
    trace: list[tuple[int, Event]] = []
    d.add(10)
    trace.append((d.budget.records, d.update()))
    for _ in range(10):
        d.remove(1)
        trace.append((d.budget.records, d.update()))
    assert trace == [
        (10, "throttled"),
        (9, None),
        (8, None),
        (7, None),
        (6, None),
        (5, None),
        (4, None),  # resume_records is exclusive: still throttled at the low mark itself
        (3, "throttle_lifted"),
        (2, None),
        (1, None),
        (0, None),
    ]


def test_throttle_exactly_at_the_high_mark_not_before() -> None:
    d = Driver(records_cfg())
    actions = []
    for _ in range(10):
        d.add(1)
        actions.append((d.budget.records, d.update()))
    assert actions[:-1] == [(n, None) for n in range(1, 10)]
    assert actions[-1] == (10, "throttled")
    assert d.budget.throttled and d.budget.throttles == 1
    assert not d.budget.paused


def test_no_flapping_between_the_marks() -> None:
    """Records oscillating between the marks change nothing, throttled or not."""
    d = Driver(records_cfg())
    d.add(7)
    for _ in range(50):  # not throttled, wandering in [5, 9]
        d.add(2)
        assert d.update() is None
        d.remove(2)
        assert d.update() is None
    d.add(3)
    assert d.update() == "throttled"
    for _ in range(50):  # throttled, wandering in [4, 10]
        d.remove(6)
        assert d.update() is None
        d.add(6)
        assert d.update() is None
    assert d.budget.throttles == 1


def test_simulated_loop_throttles_once_and_lifts_once_per_cycle() -> None:
    """The owner's rhythm: fetch while not throttled, then completions one by one."""
    cfg = records_cfg()
    d = Driver(cfg)
    b = d.budget
    rng = random.Random(7)
    backlog = 500
    events: list[tuple[str, int]] = []
    while backlog or b.records:
        if not b.throttled and backlog:
            n = min(b.fetch_size(), backlog)
            backlog -= n
            d.add(n)
            assert b.records <= cfg.capacity_records
        else:
            d.remove(min(b.records, rng.randint(1, 2)))
        action = d.update()
        if action is not None:
            events.append((action, b.records))
    kinds = [k for k, _ in events]
    assert kinds[0] == "throttled"
    assert all(a != b for a, b in itertools.pairwise(kinds)), kinds  # alternate
    assert all(n >= cfg.pause_records for k, n in events if k == "throttled")
    assert all(n < cfg.resume_records for k, n in events if k == "throttle_lifted")
    assert b.throttles == kinds.count("throttled") >= 5
    assert b.peak_records <= cfg.capacity_records


def test_counting_by_bytes_throttles_and_lifts() -> None:
    d = Driver(bytes_cfg(), max_batch_records=100)
    size = 256 * 1024
    actions = []
    for _ in range(8):
        d.add(1, size)
        actions.append(d.update())
    assert actions == [None] * 7 + ["throttled"]  # 8 x 256 KiB = 2 MiB
    trace = []
    for _ in range(8):
        d.remove(1, size)
        trace.append((d.budget.bytes // 1024, d.update()))
    assert trace == [
        (1792, None),
        (1536, None),
        (1280, None),
        (1024, None),  # exactly at the low mark: still throttled
        (768, "throttle_lifted"),
        (512, None),
        (256, None),
        (0, None),
    ]
    assert d.budget.peak_bytes == 2 * MiB


def test_the_throttle_lifts_only_with_both_counts_below_their_marks() -> None:
    cfg = FlowConfig(
        capacity_records=20,
        pause_records=10,
        resume_records=4,
        capacity_bytes=3 * MiB,
        pause_bytes=2 * MiB,
        resume_bytes=1 * MiB,
    )
    d = Driver(cfg)
    d.add(8, 8)
    d.add(2, int(1.5 * MiB))  # 10 records: throttled
    assert d.update() == "throttled"
    d.remove(8, 8)  # records low (2), bytes still above the low mark
    assert d.update() is None
    d.remove(2, int(1.5 * MiB))
    assert d.update() == "throttle_lifted"
    d.add(1, 2 * MiB)  # bytes alone reach the throttle mark
    assert d.update() == "throttled"
    d.add(6, 0)
    d.remove(1, 2 * MiB)  # bytes low, records (6) still above the low mark
    assert d.update() is None


@pytest.mark.parametrize(
    ("records", "expected"),
    [(0, 10), (5, 10), (10, 10), (11, 9), (15, 5), (19, 1), (20, 1)],
)
def test_fetch_size_never_passes_capacity_and_is_at_least_one(records: int, expected: int) -> None:
    d = Driver(records_cfg())
    if records:
        d.add(records)
    assert d.budget.fetch_size() == expected


def test_peaks_are_kept_after_removal() -> None:
    d = Driver(records_cfg())
    d.add(3, 300)
    d.add(4, 100)
    d.remove(7, 400)
    assert (d.budget.records, d.budget.bytes) == (0, 0)
    assert (d.budget.peak_records, d.budget.peak_bytes) == (7, 400)


def test_the_capacity_pauses_every_partition_and_the_lift_resumes_them() -> None:
    d = Driver(records_cfg(), partitions=3)
    b = d.budget
    d.add(10, tp=Partition(TOPIC, 0))
    d.add(10, tp=Partition(TOPIC, 1))
    pause, resume = b.end_turn()
    assert b.paused and b.pauses == 1
    assert sorted(pause) == [Partition(TOPIC, p) for p in range(3)] and resume == []
    assert b.pause_reason(Partition(TOPIC, 2)) == "capacity"
    assert b.end_turn() == ([], [])  # paused once, not at every turn
    d.remove(10, tp=Partition(TOPIC, 0))
    d.remove(7, tp=Partition(TOPIC, 1))
    pause, resume = b.end_turn()
    assert not b.paused and pause == []
    assert sorted(resume) == [Partition(TOPIC, p) for p in range(3)]


def test_a_blocked_partition_is_not_resumed_by_the_budget() -> None:
    d = Driver(records_cfg(), partitions=2)
    b = d.budget
    d.add(20)
    b.end_turn()
    assert b.block(Partition(TOPIC, 1))
    d.remove(20)
    _, resume = b.end_turn()
    assert resume == [P0]
    assert b.pause_reason(Partition(TOPIC, 1)) == "blocked"


def test_a_blocked_partitions_records_are_parked_out_of_the_marks() -> None:
    """A blocked partition (paused in the client, so its count cannot grow) holding more than
    the resume mark must not keep the others throttled and paused for as long as it blocks:
    its records leave the decisions until it runs again, and count again then."""
    d = Driver(records_cfg(), partitions=2, ordering="unordered")
    b = d.budget
    p1 = Partition(TOPIC, 1)
    d.add(8, tp=p1)
    d.add(12)
    assert d.update() == "throttled"
    assert b.paused  # 20: the capacity
    assert b.block(p1) and not b.block(p1)
    d.remove(12)
    assert d.update() == "throttle_lifted"  # 8 in flight, all parked: below the resume mark
    assert not b.paused and b.records == 8 and b.live == 0
    assert b.fetch_size() == 10  # the capacity is the others' again (max_batch_records 10)
    d.add(10)
    assert d.update() == "throttled" and not b.full
    d.add(10)
    assert b.full and b.records == 28, "the parked records are held on top of the capacity"
    d.remove(20)
    assert d.update() == "throttle_lifted"
    assert b.unblock(p1) and not b.unblock(p1)
    assert b.live == 8 and b.fetch_size() == 10
    d.add(4)
    assert d.update() == "throttled", "counted again once unblocked"


def test_a_partition_that_runs_again_brings_its_parked_records_back_on_top_of_the_capacity() -> (
    None
):
    """Found by the engine state machine (a CI run): a hot key's retry parked its partition, the
    others filled the capacity meanwhile, and the retry's success unblocked it: 13 records in
    flight with a capacity of 12, which `check` refused although it is the bound flow-control.md
    promises (the capacity for the others, the parked records on top). The budget is full until
    the records brought back are finished, and nothing registered adds to them."""
    d = Driver(records_cfg(), partitions=2, ordering="unordered")
    b = d.budget
    p1 = Partition(TOPIC, 1)
    d.add(8, tp=p1)
    assert b.block(p1)
    d.add(10)
    d.add(10)
    assert b.live == 20 and b.records == 28
    assert b.unblock(p1)
    b.check()
    assert (b.live, b.unparked) == (28, 8)
    pause, _ = b.end_turn()
    assert b.full and sorted(pause) == [P0, p1], "paused at the capacity until they finish"
    assert b.fetch_size() == 1
    d.remove(5)
    assert b.unparked == 3
    d.remove(10)
    assert (b.live, b.unparked) == (13, 0)
    d.add(7)
    assert b.live == 20
    d.add(3)
    assert b.live == 20, "beyond the capacity: read ahead, not in flight"


def test_shared_budget_counts_throttle_at_the_capacity_and_lift_below_the_pause_mark() -> None:
    """While partitions hold shares of the record budget, each with its own marks, the count
    marks move up: throttle at the capacity, lift below the pause mark (with the usual marks
    every partition would stop until the total fell to the resume mark)."""
    d = Driver(records_cfg(), ordering="partition")
    trace: list[tuple[int, Event]] = []
    for n in (10, 5, 5):
        d.budget.sharing = False  # straight into the lanes: shares are tested below
        d.add(n)
        d.budget.sharing = True  # as `begin_turn` decides while handlers are slow
        trace.append((d.budget.records, d.update()))
    for n in (5, 5, 1):
        d.remove(n)
        trace.append((d.budget.records, d.update()))
    assert trace == [
        (10, None),
        (15, None),
        (20, "throttled"),
        (15, None),
        (10, None),
        (9, "throttle_lifted"),
    ]


def test_records_read_ahead_wait_for_room_in_the_capacity() -> None:
    """Key mode starts to share only once the budget filled up behind a few keys: such a
    partition holds more than its share (here 30 of 40 records), and the other partitions'
    shares (5 each) would pass the capacity. What they read ahead waits for room, and goes in
    as soon as there is some, with no fetch in between."""
    flow = FlowConfig(capacity_records=40, pause_records=30, resume_records=10)
    d = Driver(flow, partitions=4, ordering="key", max_batch_records=10)
    b = d.budget
    parts = [Partition(TOPIC, p) for p in range(4)]
    d.add(30, tp=parts[0])  # before sharing: all in the lanes
    b.shared = True
    d.scheduler._per_record = 0.001  # slow handlers: a share (5) outlasts a task
    b.begin_turn()
    assert (b.sharing, b.share_size()) == (True, 5)
    for tp in parts[1:]:
        d.add(10, tp=tp)
    assert b.records == 40
    assert [b.parts[tp].records for tp in parts] == [30, 5, 5, 0]
    assert [b.parts[tp].ahead_records for tp in parts] == [0, 5, 5, 10]
    d.remove(10, tp=parts[0])  # P0 finished 10 records: room for P3's share
    b.admit_starved()
    b.check()
    assert [b.parts[tp].records for tp in parts] == [20, 5, 5, 5]
    assert b.records == 35


def test_closing_a_partition_releases_everything_it_held() -> None:
    flow = FlowConfig(capacity_records=40, pause_records=30, resume_records=10)
    d = Driver(flow, partitions=2, ordering="partition")
    b = d.budget
    d.scheduler._per_record = 0.001
    b.begin_turn()
    assert b.sharing
    d.add(10, 100, tp=P0)  # share of 10: 10 in the lanes, then read ahead
    d.add(10, 100, tp=P0)
    assert (b.parts[P0].records, b.parts[P0].ahead_records) == (10, 10)
    b.close(P0)
    b.check()
    assert (b.records, b.bytes) == (0, 0)


Step = tuple[str, int, int]


@settings(max_examples=300, deadline=None)
@given(
    ordering=st.sampled_from(["key", "partition", "unordered"]),
    slow=st.booleans(),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["add", "finish", "turn", "rewind", "revoke", "admit"]),
            st.integers(0, 2),
            st.integers(1, 12),
        ),
        max_size=60,
    ),
)
def test_invariants_hold_for_any_sequence(
    ordering: Literal["key", "partition", "unordered"], slow: bool, steps: list[Step]
) -> None:
    """Counts always equal the sum of the partitions', the lanes never hold more than the
    capacity, and a budget whose records all finished or left is back to zero. Records run as
    the engine runs them: dispatched as tasks, settled when a task comes back."""
    flow = FlowConfig(capacity_records=30, pause_records=20, resume_records=5)
    d = Driver(flow, partitions=3, ordering=ordering)
    b, sched = d.budget, d.scheduler
    workers = sched.workers
    assert isinstance(workers, HeldWorkers)
    if slow:
        sched._per_record = 0.001
    paused: set[Partition] = set()  # in the client, as the engine applies the decisions
    for op, p, n in steps:
        tp = Partition(TOPIC, p)
        if tp not in b.parts:
            d.open(tp)
            if b.paused:
                paused.add(tp)  # Ownership.assign states the pause for new partitions
        pb = b.parts[tp]
        if op == "add" and tp not in paused:  # a paused partition delivers nothing
            b.begin_turn()
            if d.add(min(n, b.fetch_size()), tp=tp):
                paused.add(tp)
            pause, resume = b.end_turn()  # every turn that consumed ends with the decisions
            paused.update(pause)
            paused.difference_update(resume)
        elif op == "finish":
            for task in [t for t in workers.submitted if t.assignment is pb.assignment][:n]:
                workers.submitted.remove(task)
                sched.returned(task)
                b.finished(tp, len(task.records), task.nbytes)
                sched.advance(task)
        elif op == "turn":
            pause, resume = b.end_turn()
            paused.update(pause)
            paused.difference_update(resume)
        elif op == "rewind":
            b.rewound(tp)
        elif op == "revoke":
            pb.assignment.dispatching = False
            b.dropped(sched.drop_queued([pb.assignment]))
            b.close(tp)
            paused.discard(tp)
            sched.forget([pb.assignment])
            workers.submitted = [t for t in workers.submitted if t.assignment is not pb.assignment]
        elif op == "admit":
            b.admit_starved()
        sched.dispatch()
        b.check()
        assert b.records <= flow.capacity_records
    for tp in list(b.parts):
        b.close(tp)
    b.check()
    assert (b.records, b.bytes) == (0, 0)


def test_registrations_never_pass_the_capacity_when_sharing_stops() -> None:
    """Found by the engine state machine (it was in the landed sharing code too): sharing
    stops with records read ahead; one consume call (sized to the headroom) returns a record of
    that partition, whose read-ahead then fills the lanes to the capacity, and records of
    another partition that went straight into the lanes passed the capacity. They now wait read
    ahead until there is room."""
    flow = FlowConfig(capacity_records=12, pause_records=8, resume_records=2)
    d = Driver(flow, partitions=3, ordering="partition", max_batch_records=4)
    b = d.budget
    p0, p2 = Partition(TOPIC, 0), Partition(TOPIC, 2)
    d.scheduler._per_record = 0.001  # slow handlers: partition mode shares the budget
    b.begin_turn()
    assert b.sharing
    d.add(2, tp=p0)  # a share is 12 // (2 * 3) = 2: these go into the lanes
    d.add(9, tp=p0)  # ... these wait read ahead
    assert (b.records, b.parts[p0].ahead_records) == (2, 9)
    d.scheduler._per_record = 1e-7  # fast handlers now: sharing stops
    b.begin_turn()
    assert not b.sharing
    fetch = b.fetch_size()
    d.add(1, tp=p0)  # admits p0's read-ahead up to the capacity
    d.add(fetch - 1, tp=p2)  # the rest of the same consume call
    assert b.records <= flow.capacity_records
    assert b.parts[p2].ahead_records == fetch - 1  # waiting for room, registered
    d.remove(3, tp=p0)
    b.admit_starved()
    b.check()
    assert b.parts[p2].records > 0
