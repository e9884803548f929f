"""Scheduler lanes, worker pool, completion queue and the Assignment fence, without a consumer."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

import pytest

from weir.records import Context, Handler, Partition, Record
from weir.scheduling import Assignment, Completion, Outcome, Scheduler, Work
from weir.tracking import BatchProgress

WAIT = 5.0


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
        size=1,
    )


class Recorder(Handler):
    """Handler that records calls; optional per-offset gates and failures."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[int, int, bytes | None]] = []
        self.contexts: list[Context] = []
        self.gates: dict[int, threading.Event] = {}
        self.entered: dict[int, threading.Event] = {}
        self.fail: set[int] = set()

    def gate(self, offset: int) -> threading.Event:
        self.entered[offset] = threading.Event()
        self.gates[offset] = threading.Event()
        return self.gates[offset]

    def handle(self, record: Record, ctx: Context) -> None:
        with self.lock:
            self.calls.append((record.partition, record.offset, record.key))
            self.contexts.append(ctx)
        if record.offset in self.entered:
            self.entered[record.offset].set()
        if record.offset in self.gates:
            assert self.gates[record.offset].wait(WAIT)
        if record.offset in self.fail:
            raise RuntimeError(f"boom {record.offset}")

    def offsets(self) -> list[int]:
        with self.lock:
            return [o for _, o, _ in self.calls]


def make_works(
    assignment: Assignment, offsets: list[int], key: Callable[[int], bytes | None]
) -> list[Work]:
    batch = BatchProgress(offsets, offsets[-1] + 1, assignment.token)
    tp = assignment.tp
    return [Work(rec(tp.partition, o, key(o), tp.topic), batch, assignment, 0.0) for o in offsets]


def next_completion(s: Scheduler) -> Completion:
    return s.completions.get(timeout=WAIT)


def no_completion(s: Scheduler, wait: float = 0.05) -> None:
    with pytest.raises(queue.Empty):
        s.completions.get(timeout=wait)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def started(handler: Handler, ordering: str, workers: int = 4) -> Scheduler:
    s = Scheduler(handler, ordering, workers)  # type: ignore[arg-type]
    s.start()
    return s


# -- lanes ------------------------------------------------------------------------------------


def test_key_mode_releases_only_the_lane_head() -> None:
    s = Scheduler(Recorder(), "key", 4)  # not started: inspect the ready queue's effect
    a = Assignment(Partition("t", 0), 1)
    works = make_works(a, [0, 1, 2, 3], key=lambda o: b"A" if o % 2 == 0 else b"B")
    for w in works:
        s.submit(w)
    # Heads of lane A (0) and lane B (1) are released; 2 and 3 wait behind them.
    assert s.outstanding() == 2
    assert s.lanes == 2
    s.returned(works[0])
    s.advance(works[0])
    assert s.outstanding() == 2  # 1 still out, 2 released
    s.returned(works[1])
    s.advance(works[1])
    assert s.outstanding() == 2  # 2 and 3
    for w in works[2:]:
        s.returned(w)
        s.advance(w)
    assert s.outstanding() == 0
    assert s.lanes == 0


def test_null_keys_share_one_lane_per_partition() -> None:
    s = Scheduler(Recorder(), "key", 4)
    a0 = Assignment(Partition("t", 0), 1)
    a1 = Assignment(Partition("t", 1), 2)
    for w in make_works(a0, [0, 1, 2], key=lambda o: None):
        s.submit(w)
    for w in make_works(a1, [0, 1], key=lambda o: None):
        s.submit(w)
    assert s.lanes == 2
    assert s.outstanding() == 2
    assert s.outstanding([a0]) == 1


def test_same_key_on_different_partitions_are_different_lanes() -> None:
    s = Scheduler(Recorder(), "key", 4)
    for p in range(3):
        a = Assignment(Partition("t", p), p + 1)
        for w in make_works(a, [0, 1], key=lambda o: b"K"):
            s.submit(w)
    assert s.lanes == 3
    assert s.outstanding() == 3


def test_partition_mode_has_one_lane_per_partition() -> None:
    s = Scheduler(Recorder(), "partition", 4)
    a = Assignment(Partition("t", 0), 1)
    works = make_works(a, [0, 1, 2], key=lambda o: bytes([o]))  # distinct keys, one lane
    for w in works:
        s.submit(w)
    assert s.lanes == 1
    assert s.outstanding() == 1


def test_unordered_mode_releases_everything() -> None:
    s = Scheduler(Recorder(), "unordered", 4)
    a = Assignment(Partition("t", 0), 1)
    for w in make_works(a, [0, 1, 2, 5], key=lambda o: b"K"):
        s.submit(w)
    assert s.lanes == 0
    assert s.outstanding() == 4


def test_advance_of_a_non_head_work_is_ignored() -> None:
    s = Scheduler(Recorder(), "key", 4)
    a = Assignment(Partition("t", 0), 1)
    works = make_works(a, [0, 1, 2], key=lambda o: b"K")
    for w in works:
        s.submit(w)
    assert s.outstanding() == 1
    s.advance(works[2])  # not the head: must not pop the head nor release anything
    s.advance(works[1])
    assert s.outstanding() == 1
    s.returned(works[0])
    s.advance(works[0])
    assert s.outstanding() == 1
    s.advance(works[0])  # twice: no effect
    assert s.outstanding() == 1


def test_drop_queued_keeps_released_heads_and_other_partitions() -> None:
    s = Scheduler(Recorder(), "key", 4)
    p0, p1 = Partition("t", 0), Partition("t", 1)
    a0, a1 = Assignment(p0, 1), Assignment(p1, 2)
    w0 = make_works(a0, [0, 1, 2, 3], key=lambda o: b"A" if o < 2 else b"B")
    w1 = make_works(a1, [0, 1, 2], key=lambda o: b"A")
    for w in w0 + w1:
        s.submit(w)
    dropped = s.drop_queued({p0})
    assert sorted(w.record.offset for w in dropped) == [1, 3]
    assert all(w.assignment is a0 for w in dropped)
    # Heads of p0's lanes complete; nothing more of p0 is released after them.
    for head in (w0[0], w0[2]):
        s.returned(head)
        s.advance(head)
    assert s.outstanding([a0]) == 0
    # p1 is untouched: its lane still releases in order.
    s.returned(w1[0])
    s.advance(w1[0])
    assert s.outstanding([a1]) == 1


def test_forget_removes_lanes_and_late_advances_are_harmless() -> None:
    s = Scheduler(Recorder(), "key", 4)
    p0 = Partition("t", 0)
    a0 = Assignment(p0, 1)
    works = make_works(a0, [0, 1], key=lambda o: b"K")
    for w in works:
        s.submit(w)
    s.forget({p0})
    assert s.lanes == 0
    # A new assignment of the same partition opens a new lane for the same key at once.
    a1 = Assignment(p0, 2)
    fresh = make_works(a1, [0], key=lambda o: b"K")[0]
    s.submit(fresh)
    # Counted per assignment: the old head still out does not count against the new one.
    assert s.outstanding([a0]) == 1
    assert s.outstanding([a1]) == 1
    # The old head comes back late: it must not pop the new lane's head.
    s.returned(works[0])
    s.advance(works[0])
    assert s.lanes == 1
    s.returned(fresh)
    s.advance(fresh)
    assert s.lanes == 0
    assert s.outstanding() == 0


def test_resubmit_releases_the_head_again() -> None:
    s = Scheduler(Recorder(), "key", 4)
    a = Assignment(Partition("t", 0), 1)
    works = make_works(a, [0, 1], key=lambda o: b"K")
    for w in works:
        s.submit(w)
    s.returned(works[0])
    assert s.outstanding() == 0
    s.resubmit(works[0])
    assert s.outstanding() == 1  # the head again, not the next record


# -- workers ----------------------------------------------------------------------------------


def test_workers_run_handlers_and_report_done(recorder: Recorder) -> None:
    s = started(recorder, "unordered")
    try:
        a = Assignment(Partition("t", 3), 17)
        works = make_works(a, [5, 6], key=lambda o: None)
        for w in works:
            s.submit(w)
        got = {next_completion(s).work.record.offset: None for _ in works}
        assert set(got) == {5, 6}
        ctx = recorder.contexts[0]
        assert ctx.token == 17
        assert ctx.attempt == 1
        assert ctx.event_id in ("t/3/5", "t/3/6")
        assert ctx.cancelled is False
    finally:
        assert s.stop(WAIT)


def test_handler_exception_is_a_failed_completion(recorder: Recorder) -> None:
    recorder.fail.add(1)
    s = started(recorder, "unordered")
    try:
        a = Assignment(Partition("t", 0), 1)
        for w in make_works(a, [1], key=lambda o: None):
            s.submit(w)
        c = next_completion(s)
        assert c.outcome is Outcome.FAILED
        assert isinstance(c.error, RuntimeError)
        assert c.duration >= 0
    finally:
        assert s.stop(WAIT)


def test_base_exception_in_handler_is_caught_as_failure() -> None:
    class Exiting(Handler):
        def handle(self, record: Record, ctx: Context) -> None:
            raise SystemExit(3)

    s = started(Exiting(), "unordered", workers=1)
    try:
        a = Assignment(Partition("t", 0), 1)
        for w in make_works(a, [0, 1], key=lambda o: None):
            s.submit(w)
        # The worker survives a BaseException and runs the next record.
        outcomes = [next_completion(s).outcome for _ in range(2)]
        assert outcomes == [Outcome.FAILED, Outcome.FAILED]
    finally:
        assert s.stop(WAIT)


def test_fence_at_dispatch_never_runs_the_handler(recorder: Recorder) -> None:
    s = started(recorder, "unordered", workers=1)
    try:
        a = Assignment(Partition("t", 0), 1)
        a.dispatching = False
        for w in make_works(a, [0, 1, 2], key=lambda o: None):
            s.submit(w)
        outcomes = [next_completion(s).outcome for _ in range(3)]
        assert outcomes == [Outcome.FENCED] * 3
        assert recorder.calls == []
    finally:
        assert s.stop(WAIT)


def test_fence_applies_to_queued_records_of_a_running_lane(recorder: Recorder) -> None:
    gate = recorder.gate(0)
    s = started(recorder, "unordered", workers=1)
    try:
        a = Assignment(Partition("t", 0), 1)
        for w in make_works(a, [0, 1, 2], key=lambda o: None):
            s.submit(w)
        assert recorder.entered[0].wait(WAIT)
        a.dispatching = False  # revoke: 1 and 2 are waiting in the ready queue
        gate.set()
        outcomes = {next_completion(s).work.record.offset: None for _ in range(3)}
        assert set(outcomes) == {0, 1, 2}
        assert recorder.offsets() == [0]
    finally:
        assert s.stop(WAIT)


def test_key_lanes_run_in_order_and_keys_in_parallel(recorder: Recorder) -> None:
    """Driven like the owner does: release the next record only after draining the previous."""
    s = started(recorder, "key", workers=4)
    try:
        a = Assignment(Partition("t", 0), 1)
        gate_a = recorder.gate(0)  # lane A's head blocks
        works = make_works(a, list(range(8)), key=lambda o: b"A" if o % 2 == 0 else b"B")
        for w in works:
            s.submit(w)
        done: list[int] = []
        # Lane B progresses while lane A's head is blocked.
        while len(done) < 4:
            c = next_completion(s)
            s.returned(c.work)
            s.advance(c.work)
            done.append(c.work.record.offset)
        assert done == [1, 3, 5, 7]
        assert recorder.offsets().count(2) == 0
        gate_a.set()
        while len(done) < 8:
            c = next_completion(s)
            s.returned(c.work)
            s.advance(c.work)
            done.append(c.work.record.offset)
        assert done[4:] == [0, 2, 4, 6]
        assert s.outstanding() == 0
    finally:
        assert s.stop(WAIT)


def test_stop_returns_false_within_budget_when_a_handler_is_stuck(recorder: Recorder) -> None:
    gate = recorder.gate(0)
    s = started(recorder, "unordered", workers=2)
    a = Assignment(Partition("t", 0), 1)
    for w in make_works(a, [0], key=lambda o: None):
        s.submit(w)
    assert recorder.entered[0].wait(WAIT)
    t0 = time.monotonic()
    assert s.stop(0.2) is False
    assert time.monotonic() - t0 < 1.0
    gate.set()


def test_stop_is_true_when_idle(recorder: Recorder) -> None:
    s = started(recorder, "key", workers=3)
    assert s.stop(WAIT) is True


def test_context_cancelled_reads_the_assignment_event(recorder: Recorder) -> None:
    gate = recorder.gate(0)
    s = started(recorder, "unordered", workers=1)
    try:
        a = Assignment(Partition("t", 0), 5)
        for w in make_works(a, [0], key=lambda o: None):
            s.submit(w)
        assert recorder.entered[0].wait(WAIT)
        ctx = recorder.contexts[0]
        assert ctx.cancelled is False
        a.cancel.set()
        assert ctx.cancelled is True
        assert "cancelled=True" in repr(ctx)
        gate.set()
        next_completion(s)
    finally:
        assert s.stop(WAIT)


def test_running_counts_only_records_a_worker_has_taken(recorder: Recorder) -> None:
    idle = Scheduler(recorder, "unordered", 1)  # no worker threads: nothing is ever taken
    a = Assignment(Partition("t", 0), 1)
    for w in make_works(a, [0, 1], key=lambda o: None):
        idle.submit(w)
    assert idle.outstanding() == 2
    assert idle.running([a]) == 0

    gate = recorder.gate(5)
    s = started(recorder, "unordered", workers=1)
    try:
        b = Assignment(Partition("t", 1), 2)
        for w in make_works(b, [5, 6], key=lambda o: None):
            s.submit(w)
        assert recorder.entered[5].wait(WAIT)
        assert s.outstanding([b]) == 2
        assert s.running([b]) == 1  # 6 waits in the ready queue
        assert s.running([a]) == 0
        gate.set()
        for _ in range(2):
            s.returned(next_completion(s).work)
        assert s.running([b]) == 0 and s.outstanding() == 0
    finally:
        assert s.stop(WAIT)
