"""FlowControl: in-flight budget by count and bytes, pause/resume with hysteresis."""

from __future__ import annotations

import itertools
import random

import pytest

from weir.config import FlowConfig
from weir.flow import FlowControl

MiB = 1024 * 1024


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


def test_completion_by_completion_trace_has_one_pause_and_one_resume() -> None:
    f = FlowControl(records_cfg(), max_batch=10)
    trace: list[tuple[int, str | None]] = []
    f.add(10, 10)
    trace.append((f.records, f.update()))
    for _ in range(10):
        f.remove(1, 1)
        trace.append((f.records, f.update()))
    assert trace == [
        (10, "pause"),
        (9, None),
        (8, None),
        (7, None),
        (6, None),
        (5, None),
        (4, None),  # resume_records is exclusive: still paused at the low mark itself
        (3, "resume"),
        (2, None),
        (1, None),
        (0, None),
    ]


def test_pause_exactly_at_the_high_mark_not_before() -> None:
    f = FlowControl(records_cfg(), max_batch=10)
    actions = []
    for _ in range(10):
        f.add(1, 1)
        actions.append((f.records, f.update()))
    assert actions[:-1] == [(n, None) for n in range(1, 10)]
    assert actions[-1] == (10, "pause")
    assert f.paused and f.pauses == 1


def test_no_flapping_between_the_marks() -> None:
    """Records oscillating between the marks change nothing, paused or not."""
    f = FlowControl(records_cfg(), max_batch=10)
    f.add(7, 7)
    for _ in range(50):  # unpaused, wandering in [5, 9]
        f.add(2, 2)
        assert f.update() is None
        f.remove(2, 2)
        assert f.update() is None
    f.add(3, 3)
    assert f.update() == "pause"
    for _ in range(50):  # paused, wandering in [4, 10]
        f.remove(6, 6)
        assert f.update() is None
        f.add(6, 6)
        assert f.update() is None
    assert f.pauses == 1


def test_simulated_loop_pauses_once_and_resumes_once_per_cycle() -> None:
    """The owner's rhythm: fetch while unpaused, then completions one by one."""
    cfg = records_cfg()
    f = FlowControl(cfg, max_batch=10)
    rng = random.Random(7)
    backlog = 500
    events: list[tuple[str, int]] = []
    while backlog or f.records:
        if not f.paused and backlog:
            n = min(f.fetch_size(), backlog)
            backlog -= n
            f.add(n, n)
            assert f.records <= cfg.capacity_records
        else:
            done = min(f.records, rng.randint(1, 2))
            f.remove(done, done)
        action = f.update()
        if action is not None:
            events.append((action, f.records))
    kinds = [k for k, _ in events]
    assert kinds[0] == "pause"
    assert all(a != b for a, b in itertools.pairwise(kinds)), kinds  # alternate
    assert all(n >= cfg.pause_records for k, n in events if k == "pause")
    assert all(n < cfg.resume_records for k, n in events if k == "resume")
    assert f.pauses == kinds.count("pause") >= 5
    assert f.peak_records <= cfg.capacity_records


def test_counting_by_bytes_pauses_and_resumes() -> None:
    f = FlowControl(bytes_cfg(), max_batch=100)
    size = 256 * 1024
    actions = []
    for _ in range(8):
        f.add(1, size)
        actions.append(f.update())
    assert actions == [None] * 7 + ["pause"]  # 8 x 256 KiB = 2 MiB
    trace = []
    for _ in range(8):
        f.remove(1, size)
        trace.append((f.bytes // 1024, f.update()))
    assert trace == [
        (1792, None),
        (1536, None),
        (1280, None),
        (1024, None),  # exactly at the low mark: still paused
        (768, "resume"),
        (512, None),
        (256, None),
        (0, None),
    ]
    assert f.peak_bytes == 2 * MiB


def test_resume_needs_both_counts_below_their_marks() -> None:
    cfg = FlowConfig(
        capacity_records=20,
        pause_records=10,
        resume_records=4,
        capacity_bytes=3 * MiB,
        pause_bytes=2 * MiB,
        resume_bytes=1 * MiB,
    )
    f = FlowControl(cfg, max_batch=10)
    f.add(10, 10)
    assert f.update() == "pause"
    f.remove(8, 0)  # records low...
    f.add(0, int(1.5 * MiB))  # ...bytes still above the low mark
    assert f.update() is None
    f.remove(0, int(1.5 * MiB))
    assert f.update() == "resume"
    f.add(0, 2 * MiB)  # bytes alone reach the pause mark
    assert f.update() == "pause"
    f.add(5, 0)
    f.remove(0, 2 * MiB)  # bytes low, records (7) still above the low mark
    assert f.update() is None


@pytest.mark.parametrize(
    ("records", "expected"),
    [(0, 10), (5, 10), (10, 10), (11, 9), (15, 5), (19, 1), (20, 1), (25, 1)],
)
def test_fetch_size_never_passes_capacity_and_is_at_least_one(records: int, expected: int) -> None:
    f = FlowControl(records_cfg(), max_batch=10)
    f.add(records, 0)
    assert f.fetch_size() == expected


def test_peaks_are_kept_after_removal() -> None:
    f = FlowControl(records_cfg(), max_batch=10)
    f.add(3, 300)
    f.add(4, 100)
    f.remove(7, 400)
    assert (f.records, f.bytes) == (0, 0)
    assert (f.peak_records, f.peak_bytes) == (7, 400)


def test_shared_budget_counts_throttle_at_the_capacity_and_lift_below_the_pause_mark() -> None:
    """While partitions hold shares of the record budget, each with its own marks, the count
    marks move up: throttle at the capacity, lift below the pause mark (with the usual marks
    every partition would stop until the total fell to the resume mark)."""
    f = FlowControl(records_cfg(), max_batch=10)
    trace: list[tuple[int, str | None]] = []
    for n in (10, 5, 5):
        f.add(n, n)
        trace.append((f.records, f.update(shared=True)))
    for n in (5, 5, 1):
        f.remove(n, n)
        trace.append((f.records, f.update(shared=True)))
    assert trace == [(10, None), (15, None), (20, "pause"), (15, None), (10, None), (9, "resume")]


def test_shared_budget_keeps_the_byte_marks() -> None:
    f = FlowControl(bytes_cfg(), max_batch=10)
    f.add(1, 2 * MiB)
    assert f.update(shared=True) == "pause"
    f.remove(0, MiB)
    assert f.update(shared=True) is None
    f.remove(0, 1)
    assert f.update(shared=True) == "resume"
