"""Batch handlers (`weir.BatchHandler`) on the scripted FakeConsumer: what a batch may hold in
each ordering mode, its size and wait, partial success, and the commit after it."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Literal

import pytest
from tests.accumulators import Accumulator
from tests.consumer_overrides import Overrides
from tests.fake_members import SETTINGS
from tests.waiting import wait_until
from typing_extensions import Unpack

from weir import (
    BatchContext,
    BatchHandler,
    CommitEvent,
    Context,
    FailurePolicy,
    FencedError,
    FlowConfig,
    GroupConsumer,
    Handler,
    HandlerError,
    Record,
    RetryPolicy,
)
from weir.config import ConsumerSettings
from weir.records import FlushContext, Ordering, Partition, is_async_handler
from weir.serde import Deserializer, json_deserializer
from weir.testing import capture_events
from weir.testing.fake import FakeConsumer
from weir.testing.fake_broker import FakeBroker

pytestmark = pytest.mark.timeout(60)

TOPIC = "t"
P0 = (TOPIC, 0)
P1 = (TOPIC, 1)
WAIT = 5.0

Key = tuple[int, int]  # (partition, offset)


def committed(fake: FakeConsumer, tp: tuple[str, int]) -> int:
    return max((off for off, _ in fake.commits_for(tp)), default=-1)


def one_partition(n: int) -> FakeConsumer:
    """A fake with `n` records in P0, to be assigned."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(n))
    fake.script_assign([P0])
    return fake


def two_partitions(n0: int, n1: int) -> FakeConsumer:
    """A fake with `n0` records in P0 and `n1` in P1, both to be assigned."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(n0))
    fake.produce_many(TOPIC, 1, range(n1))
    fake.script_assign([P0, P1])
    return fake


class Collector(BatchHandler):
    """Records every batch it is given; `action(records, ctx)` runs inside the call (on a
    worker thread)."""

    def __init__(self, action: Callable[[list[Record], BatchContext], None] | None = None) -> None:
        self.lock = threading.Lock()
        self.batches: list[list[Key]] = []
        self.action = action
        self.running = 0
        self.max_running = 0

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> Awaitable[None] | None:
        self.collect(records, ctx)
        return None

    def collect(self, records: list[Record], ctx: BatchContext) -> None:
        with self.lock:
            self.batches.append([(r.partition, r.offset) for r in records])
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        try:
            if self.action is not None:
                self.action(records, ctx)
        finally:
            with self.lock:
                self.running -= 1

    def handled(self) -> list[Key]:
        with self.lock:
            return [k for b in self.batches for k in b]


class AsyncCollector(Collector):
    """`Collector` with an `async def handle_batch` (run on the event loop): the action, which
    may block (a gate, a sleep), runs on a thread the coroutine awaits."""

    async def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        await asyncio.to_thread(self.collect, records, ctx)


Kind = Literal["threads", "async"]
Make = Callable[..., Collector]


@pytest.fixture(params=["threads", "async"])
def kind(request: pytest.FixtureRequest) -> Kind:
    """The batch handler's kind: `def handle_batch` on worker threads, or `async def` on the
    event loop. The tests that take it hold for both."""
    k: Kind = request.param
    return k


@pytest.fixture
def collector(kind: Kind) -> Make:
    return Collector if kind == "threads" else AsyncCollector


Start = Callable[..., GroupConsumer]


def settings_for(handler: Handler, kw: Overrides) -> ConsumerSettings:
    """SETTINGS with `kw`; for an async handler the `workers` asked for are its `max_in_flight`
    (the calls at once), and the thread default is left out."""
    settings: ConsumerSettings = {**SETTINGS, **kw}
    if is_async_handler(handler):
        del settings["workers"]
        if "workers" in kw:
            settings["max_in_flight"] = kw["workers"]
    return settings


@pytest.fixture
def start(members: list[GroupConsumer]) -> Iterator[Start]:
    def go(handler: Handler, fake: FakeConsumer, **kw: Unpack[Overrides]) -> GroupConsumer:
        settings = settings_for(handler, kw)
        fake.given_committed()
        gc = GroupConsumer(handler, consumer_factory=fake.factory, **settings)
        members.append(gc)
        gc.start()
        assert gc.wait_started(WAIT)
        return gc

    yield go


# -- what a batch holds ----------------------------------------------------------------------


def test_records_arrive_in_batches_of_at_most_batch_max_records_and_are_committed(
    start: Start, collector: Make
) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(300), key=lambda o: b"k%d" % (o % 7))
    fake.produce_many(TOPIC, 1, range(300), key=lambda o: b"k%d" % (o % 5))
    fake.script_assign([P0, P1])
    h = collector()
    start(h, fake, batch_max_records=100, max_batch_records=200)
    wait_until(lambda: committed(fake, P0) == 300 and committed(fake, P1) == 300, "all committed")
    handled = h.handled()
    assert sorted(handled) == [(p, o) for p in (0, 1) for o in range(300)]  # each once
    assert max(map(len, h.batches)) == 100
    # Fewer calls than records: records really came in batches (a poll brings up to 200).
    assert len(h.batches) < 60, [len(b) for b in h.batches]


@pytest.mark.parametrize("max_bytes", [None, 40], ids=["", "max-bytes"])
@pytest.mark.parametrize("delay", [0.005, 0.0], ids=["slow", "fast"])
def test_key_mode_never_has_one_key_in_two_batches_at_once_and_keeps_offset_order(
    start: Start, delay: float, collector: Make, max_bytes: int | None
) -> None:
    """Key mode under parallelism (4 workers): a key's records are in one batch at a time, in
    offset order inside it and across batches. Slow batches: different keys of a partition run
    side by side; fast ones go out a partition at a time (its whole lane). With
    `batch_max_bytes` (about ten records) the groups of several keys are cut, and the records
    of a key cut off wait behind its batch."""
    fake = FakeConsumer()
    for p in (0, 1):
        fake.produce_many(TOPIC, p, range(400), key=lambda o: b"k%d" % (o % 13))
    fake.script_assign([P0, P1])
    running: dict[tuple[int, bytes | None], int] = defaultdict(int)
    seen: dict[tuple[int, bytes | None], list[int]] = defaultdict(list)
    overlaps: list[Any] = []
    lock = threading.Lock()

    def action(records: list[Record], ctx: BatchContext) -> None:
        lanes = {(r.partition, r.key) for r in records}
        with lock:
            overlaps.extend(lane for lane in lanes if running[lane])
            for lane in lanes:
                running[lane] += 1
            for r in records:
                seen[(r.partition, r.key)].append(r.offset)
        time.sleep(delay)
        with lock:
            for lane in lanes:
                running[lane] -= 1

    h = collector(action)
    start(h, fake, batch_max_records=20, batch_max_wait_s=0.0, workers=4, batch_max_bytes=max_bytes)
    wait_until(lambda: committed(fake, P0) == 400 and committed(fake, P1) == 400, "committed")
    assert not overlaps, overlaps[:5]
    if max_bytes is not None:
        assert max(map(len, h.batches)) <= max_bytes // 3  # "k%d" and "v": 3 or 4 bytes
    for lane, offsets in seen.items():
        assert offsets == sorted(offsets), lane
        assert len(offsets) == len(set(offsets)), lane
    if delay:
        assert h.max_running > 1  # batches really ran side by side


def test_slow_batches_of_one_partition_run_side_by_side_in_key_mode(
    start: Start, collector: Make
) -> None:
    """A slow bulk write (20 ms a batch) on one partition: its keys go out in several batches at
    once, not one batch for the whole partition at a time."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(200), key=lambda o: b"k%d" % (o % 40))
    fake.script_assign([P0])
    h = collector(lambda records, ctx: time.sleep(0.02))
    start(h, fake, batch_max_records=10, batch_max_wait_s=0.0, workers=4, max_batch_records=10)
    wait_until(lambda: committed(fake, P0) == 200, "committed")
    assert h.max_running > 1


def test_partition_mode_runs_one_batch_per_partition_at_a_time(
    start: Start, collector: Make
) -> None:
    fake = FakeConsumer()
    for p in (0, 1):
        fake.produce_many(TOPIC, p, range(200), key=lambda o: b"k%d" % (o % 9))
    fake.script_assign([P0, P1])
    running: dict[int, int] = defaultdict(int)
    overlaps: list[int] = []
    order: dict[int, list[int]] = defaultdict(list)
    lock = threading.Lock()

    def action(records: list[Record], ctx: BatchContext) -> None:
        parts = {r.partition for r in records}
        with lock:
            overlaps.extend(p for p in parts if running[p])
            for p in parts:
                running[p] += 1
            for r in records:
                order[r.partition].append(r.offset)
        time.sleep(0.005)
        with lock:
            for p in parts:
                running[p] -= 1

    h = collector(action)
    start(h, fake, ordering="partition", batch_max_records=30, batch_max_wait_s=0.0, workers=4)
    wait_until(lambda: committed(fake, P0) == 200 and committed(fake, P1) == 200, "committed")
    assert not overlaps
    assert order[0] == list(range(200)) and order[1] == list(range(200))


def test_a_batch_spans_partitions_and_each_partition_commits_its_own_offsets(
    start: Start, collector: Make
) -> None:
    """One call holds both partitions' records; while it runs neither commits past it, and
    after it each partition's commit is its own next offset."""
    fake = two_partitions(5, 3)
    gate = threading.Event()
    entered = threading.Event()

    def action(records: list[Record], ctx: BatchContext) -> None:
        if {r.partition for r in records} == {0, 1}:
            entered.set()
            assert gate.wait(WAIT)

    h = collector(action)
    start(h, fake, batch_max_records=50, batch_max_wait_s=0.3, workers=1)
    assert entered.wait(WAIT), h.batches
    time.sleep(0.05)
    assert committed(fake, P0) <= 0 and committed(fake, P1) <= 0
    gate.set()
    wait_until(lambda: committed(fake, P0) == 5 and committed(fake, P1) == 3, "committed")


def test_a_batch_that_is_not_full_waits_batch_max_wait_s_for_more_records(
    start: Start, collector: Make
) -> None:
    """Records of other keys join the waiting batch (a key's later records wait for the batch
    that holds the key)."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(2), key=lambda o: b"k%d" % o)
    fake.script_assign([P0])
    h = collector()
    t0 = time.monotonic()
    first_call: list[float] = []
    h.action = lambda records, ctx: first_call.append(time.monotonic()) if not first_call else None
    start(h, fake, batch_max_records=100, batch_max_wait_s=0.6)
    time.sleep(0.15)
    fake.produce_many(TOPIC, 0, range(2, 4), key=lambda o: b"k%d" % o)  # joins the batch
    wait_until(lambda: committed(fake, P0) == 4, "committed")
    assert h.batches[0] == [(0, 0), (0, 1), (0, 2), (0, 3)], h.batches
    assert first_call[0] - t0 >= 0.5  # it waited, not full


def test_batch_max_wait_s_zero_runs_what_is_there(start: Start, collector: Make) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(2))
    fake.script_assign([P0])
    h = collector()
    start(h, fake, batch_max_records=100, batch_max_wait_s=0.0)
    wait_until(lambda: committed(fake, P0) == 2, "first two committed")
    fake.produce_many(TOPIC, 0, range(2, 4))
    wait_until(lambda: committed(fake, P0) == 4, "committed")
    assert h.batches == [[(0, 0), (0, 1)], [(0, 2), (0, 3)]]


def test_a_batch_runs_without_its_wait_once_the_budget_is_full(
    start: Start, collector: Make
) -> None:
    """The first poll brings one record of each of the three keys: every later record waits
    behind the gathered batch's keys, so the batch can get no more records. Once the budget
    is at its pause mark it runs, instead of waiting out its 5 s."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(300), key=lambda o: b"k%d" % (o % 3))
    fake.script_assign([P0])
    calls: list[float] = []
    h = collector(lambda records, ctx: calls.append(time.monotonic()))
    t0 = time.monotonic()
    start(
        h,
        fake,
        batch_max_records=50,
        batch_max_wait_s=5.0,
        max_batch_records=3,
        flow=FlowConfig(capacity_records=150, pause_records=100, resume_records=40),
    )
    wait_until(lambda: len(h.batches) >= 2, "two batches", 10)
    assert h.batches[0] == [(0, 0), (0, 1), (0, 2)]
    assert calls[0] - t0 < 2.5  # not the 5 s wait


def live_records(topic: str) -> int:
    """Records of `topic` still reachable (walks every tracked object: slow, tests only). Cycles
    nothing reaches are collected first: an earlier test's stopped member on the same topic,
    left for the collector, is not a record some worker keeps."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Record and o.topic == topic)


@pytest.mark.parametrize("ordering", ["key", "unordered"])
def test_no_worker_keeps_the_records_of_a_batch_once_it_is_settled(
    start: Start, collector: Make, ordering: Ordering
) -> None:
    """A worker that finished a batch and waits for the next holds none of its records: 16
    idle workers each holding their last batch of 500 kept 8,000 records (and their bytes)
    alive beyond the in-flight budget, and every one of them on the cyclic collector's walks."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(300), key=lambda o: b"k%d" % (o % 7))
    fake.script_assign([P0])
    h = collector()
    start(h, fake, batch_max_records=100, max_batch_records=100, workers=4, ordering=ordering)
    wait_until(lambda: committed(fake, P0) == 300, "all committed")
    assert len(h.handled()) == 300
    wait_until(lambda: live_records(TOPIC) == 0, "no record of a settled batch kept", 3)


def test_no_worker_keeps_the_records_of_a_task_once_it_is_settled(start: Start) -> None:
    """The same for a per-record handler: a worker waiting for its next task holds none of the
    records of the last one."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(300), key=lambda o: b"k%d" % (o % 7))
    fake.script_assign([P0])
    seen: list[int] = []
    start(lambda r: seen.append(r.offset), fake, max_batch_records=100, workers=4)
    wait_until(lambda: committed(fake, P0) == 300, "all committed")
    assert sorted(seen) == list(range(300))
    wait_until(lambda: live_records(TOPIC) == 0, "no record of a settled task kept", 3)


# -- partial success ---------------------------------------------------------------------------

RETRY_ONCE = FailurePolicy(retry=RetryPolicy(max_attempts=2, backoff_initial_s=0.0, jitter=0.0))


class Boom(Exception):
    pass


@pytest.mark.parametrize("reorder", [False, True], ids=["", "list-reordered"])
def test_ctx_fail_fails_one_record_and_the_rest_are_finished(
    start: Start, collector: Make, reorder: bool
) -> None:
    """`list-reordered`: the context knows the batch's records by their place in the batch as
    it was handed out, so a handler that reverses its list in place before it marks still
    fails the record it names, and no other."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(10), key=lambda o: b"k%d" % o)
    fake.script_assign([P0])
    attempts: dict[int, list[int]] = defaultdict(list)

    def action(records: list[Record], ctx: BatchContext) -> None:
        if reorder:
            records.reverse()
        for r in records:
            attempts[r.offset].append(ctx.attempt(r))
            if r.offset == 4 and ctx.attempt(r) == 1:
                ctx.fail(r, Boom("row 4 refused"))

    h = collector(action)
    start(h, fake, ordering="unordered", failure=RETRY_ONCE, batch_max_wait_s=0.05)
    wait_until(lambda: committed(fake, P0) == 10, "committed")
    assert attempts[4] == [1, 2]
    assert all(attempts[o] == [1] for o in range(10) if o != 4), attempts
    assert h.batches[-1] == [(0, 4)]


def test_a_raising_batch_keeps_the_records_marked_done(start: Start, collector: Make) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(6), key=lambda o: b"k%d" % o)
    fake.script_assign([P0])
    runs: dict[int, int] = defaultdict(int)

    def action(records: list[Record], ctx: BatchContext) -> None:
        for r in records:
            runs[r.offset] += 1
            if r.offset < 3:
                ctx.done(r)
        if ctx.attempt(records[0]) == 1 and records[0].offset == 0:
            raise Boom("the bulk write failed after the first three rows")

    h = collector(action)
    start(h, fake, failure=RETRY_ONCE)
    wait_until(lambda: committed(fake, P0) == 6, "committed")
    assert [runs[o] for o in range(6)] == [1, 1, 1, 2, 2, 2]


def test_key_mode_a_failed_record_takes_its_keys_later_records_with_it(
    start: Start, collector: Make
) -> None:
    """The handler finished A@1 and A@2 after failing A@0: they run again after A@0, so A's
    records still finish in offset order; B's are not run again."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(6), key=lambda o: b"A" if o % 2 == 0 else b"B")
    fake.script_assign([P0])
    order: list[tuple[bytes | None, int]] = []

    def action(records: list[Record], ctx: BatchContext) -> None:
        for r in records:
            order.append((r.key, r.offset))
            if r.offset == 0 and ctx.attempt(r) == 1:
                ctx.fail(r, Boom("A@0"))

    h = collector(action)
    start(h, fake, failure=RETRY_ONCE)
    wait_until(lambda: committed(fake, P0) == 6, "committed")
    a = [o for k, o in order if k == b"A"]
    b = [o for k, o in order if k == b"B"]
    assert a == [0, 2, 4, 0, 2, 4]
    assert b == [1, 3, 5]


def test_marks_are_checked(start: Start, collector: Make) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(2))
    fake.script_assign([P0])
    problems: list[BaseException] = []
    stranger = Record(TOPIC, 0, 99, None, b"x")

    def action(records: list[Record], ctx: BatchContext) -> None:
        try:
            ctx.done(stranger)
        except ValueError as exc:
            problems.append(exc)
        try:
            ctx.fail(records[0], "not an exception")  # type: ignore[arg-type]
        except TypeError as exc:
            problems.append(exc)
        ctx.done(records[0])
        try:
            ctx.fail(records[0], Boom())
        except ValueError as exc:
            problems.append(exc)

    start(collector(action), fake)
    wait_until(lambda: committed(fake, P0) == 2, "committed")
    assert [type(p) for p in problems] == [ValueError, TypeError, ValueError]
    assert "not a record of this batch" in str(problems[0])
    assert "both done and failed" in str(problems[2])


# -- hand-offs ---------------------------------------------------------------------------------


def test_a_lost_partitions_records_in_a_running_batch_never_count(
    start: Start, collector: Make
) -> None:
    fake = two_partitions(3, 3)
    gate = threading.Event()
    entered = threading.Event()
    seen_cancel: list[bool] = []

    def action(records: list[Record], ctx: BatchContext) -> None:
        if records[0].offset == 0:
            entered.set()
            assert gate.wait(WAIT)
            seen_cancel.append(ctx.cancelled)

    h = collector(action)
    start(h, fake, batch_max_wait_s=0.2, workers=1)
    assert entered.wait(WAIT)
    assert {p for p, _ in h.batches[0]} == {0, 1}
    before = len(fake.commit_log())
    lost = fake.script_lost([P0])
    assert lost.done.wait(WAIT)
    gate.set()
    wait_until(lambda: committed(fake, P1) == 3, "P1 committed")
    assert seen_cancel == [False]  # P1 was still owned
    assert all(Partition(*P0) not in c.offsets for c in fake.commit_log()[before:])


def test_a_revoke_waits_for_the_running_batch_and_commits_after_it(
    start: Start, collector: Make
) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(4))
    fake.script_assign([P0])
    gate = threading.Event()
    entered = threading.Event()

    def action(records: list[Record], ctx: BatchContext) -> None:
        entered.set()
        assert gate.wait(WAIT)

    start(collector(action), fake, commit_interval_s=60.0, commit_every_records=1_000_000)
    assert entered.wait(WAIT)
    timer = threading.Timer(0.1, gate.set)
    revoke = fake.script_revoke([P0], before=timer.start)
    assert revoke.done.wait(WAIT)
    during = [c for c in fake.commit_log() if c.in_callback == "revoke"]
    assert [c.offsets for c in during] == [{P0: 4}]


def test_a_revoke_does_not_wait_for_a_batch_still_gathering(start: Start, collector: Make) -> None:
    """A revoked partition's records in a batch that is still gathering (a 5 s wait) come back
    at once, unrun: the revoke neither waits for the wait nor commits past them."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(2), key=lambda o: b"k%d" % o)
    fake.script_assign([P0])
    h = collector()
    start(h, fake, batch_max_wait_s=5.0, commit_interval_s=60.0, commit_every_records=1_000_000)
    time.sleep(0.2)  # gathered by now
    revoke = fake.script_revoke([P0])
    assert revoke.done.wait(WAIT)
    assert revoke.seconds is not None and revoke.seconds < 2.0
    during = [c for c in fake.commit_log() if c.in_callback == "revoke"]
    assert [c.offsets for c in during] in ([{P0: 0}], [])
    time.sleep(0.1)
    assert h.batches == []


# -- settings and shapes -----------------------------------------------------------------------


class Rows(BatchHandler):
    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        pass


def test_batch_settings_with_a_per_record_handler_are_refused() -> None:
    settings: ConsumerSettings = {**SETTINGS, "batch_max_records": 10}
    with pytest.raises(ValueError, match="batch_max_records configures a batch handler"):
        GroupConsumer(lambda r: None, **settings)


def test_batch_max_records_above_the_pause_mark_is_refused() -> None:
    settings: ConsumerSettings = {
        **SETTINGS,
        "flow": FlowConfig(capacity_records=300, pause_records=200, resume_records=100),
        "batch_max_records": 201,
        "max_batch_records": 100,
    }
    with pytest.raises(ValueError, match=r"larger than flow\.pause_records \(200\)"):
        GroupConsumer(Rows(), **settings)
    # Without a flow, a batch handler's budget is made for its batches.
    big: ConsumerSettings = {**SETTINGS, "batch_max_records": 2000}
    gc = GroupConsumer(Rows(), **big)
    assert gc.config.flow.pause_records == 16_000
    assert gc.config.flow.resume_records == 6_400
    assert GroupConsumer(lambda r: None, **SETTINGS).config.flow == FlowConfig()


class AsyncRows(BatchHandler):
    async def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        pass


async def one_at_a_time(record: Record) -> None:
    pass


@pytest.mark.parametrize(
    "handler",
    [Rows(), AsyncRows(), one_at_a_time],
    ids=["handle_batch", "async handle_batch", "async per record"],
)
def test_max_batch_records_is_held_to_the_budget_the_member_runs_with(
    handler: Handler | Callable[[Record], Awaitable[None]],
) -> None:
    """Regression: `max_batch_records` was checked against the default flow's headroom (200)
    before a batch or async handler's larger budget replaced it, so a batch handler with the
    issue's 500-record consume calls was refused though its budget (8 batches of 500: headroom
    800) holds them. Checked against the member's own budget, it is refused past that one."""

    def consume_calls_of(n: int) -> ConsumerSettings:
        return {**SETTINGS, "max_batch_records": n}

    flow = GroupConsumer(handler, **consume_calls_of(500)).config.flow
    headroom = flow.capacity_records - flow.pause_records
    assert headroom >= 500
    with pytest.raises(ValueError, match=rf"larger than the flow headroom .* \({headroom}\)"):
        GroupConsumer(handler, **consume_calls_of(headroom + 1))
    # A thread handler per record runs with the default flow, and is held to its headroom.
    with pytest.raises(ValueError, match=r"larger than the flow headroom .* \(200\)"):
        GroupConsumer(lambda r: None, **consume_calls_of(500))


@pytest.mark.parametrize("rows", [Rows, AsyncRows])
def test_a_batch_handler_is_built_with_a_transaction(rows: type[BatchHandler]) -> None:
    """It used to be refused: batch outputs join the transaction now
    (tests/unit/test_batch_exactly_once.py)."""
    settings: ConsumerSettings = {**SETTINGS, "transactional_id": "tx"}
    assert GroupConsumer(rows(), **settings).config.transactional_id == "tx"


def test_an_async_batch_handler_gets_the_batch_budget_and_warns_of_workers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An async handle_batch is built (it used to be refused): its budget is made for its
    batches, as a thread batch handler's, not scaled with max_in_flight; `workers` is a thread
    setting, and is said to be unused."""
    settings: ConsumerSettings = {**SETTINGS, "batch_max_records": 100}
    gc = GroupConsumer(AsyncRows(), **settings)
    assert gc.config.flow == GroupConsumer(Rows(), **settings).config.flow
    assert gc.config.flow.pause_records == 1_000
    assert "max_in_flight bounds the handle_batch calls" in caplog.text


def test_a_batch_handler_without_handle_batch_cannot_be_built() -> None:
    class Empty(BatchHandler):
        pass

    with pytest.raises(TypeError, match=r"does not define handle_batch\(\)"):
        Empty()  # type: ignore[abstract]
    with pytest.raises(TypeError, match="weir calls handle_batch"):
        Rows().handle(Record(TOPIC, 0, 0, None, b""), Context(1, 1, "e", threading.Event()))


# -- the failure policy per batch ---------------------------------------------------------------


class BulkWrite(BatchHandler):
    """A bulk write that fails as a whole while it holds a poison record; `flaky` more calls
    fail whatever they hold (a transient outage)."""

    def __init__(self, poison: set[int], flaky: int = 0) -> None:
        self.poison = poison
        self.flaky = flaky
        self.lock = threading.Lock()
        self.calls: list[list[int]] = []
        self.written: list[int] = []

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> Awaitable[None] | None:
        self.write(records)
        return None

    def write(self, records: list[Record]) -> None:
        offsets = [r.offset for r in records]
        with self.lock:
            self.calls.append(offsets)
            if self.flaky:
                self.flaky -= 1
                raise Boom("the database is restarting")
        if self.poison.intersection(offsets):
            raise Boom("a row violates a constraint")
        with self.lock:
            self.written += offsets


class AsyncBulkWrite(BulkWrite):
    async def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        await asyncio.sleep(0)
        self.write(records)


def bulk_write(kind: Kind, poison: set[int], flaky: int = 0) -> BulkWrite:
    return (BulkWrite if kind == "threads" else AsyncBulkWrite)(poison, flaky)


def poisoned_member(
    broker: FakeBroker,
    handler: BatchHandler,
    members: list[GroupConsumer],
    value_deserializer: Deserializer | None = None,
    **kw: Unpack[Overrides],
) -> GroupConsumer:
    settings: ConsumerSettings = {
        "bootstrap_servers": "fake:9092",
        "group_id": "g",
        "topics": ["orders"],
        "auto_offset_reset": "earliest",
        "commit_interval_s": 0.05,
        "batch_max_records": 500,
        "batch_max_wait_s": 0.3,
        "failure": FailurePolicy(
            retry=RetryPolicy(max_attempts=2, backoff_initial_s=0.01, jitter=0.0),
            final="dead_letter",
        ),
        **kw,
    }
    gc = GroupConsumer(
        handler,
        consumer_factory=broker.consumer_factory,
        producer_factory=broker.producer_factory,
        value_deserializer=value_deserializer,
        **settings,
    )
    members.append(gc)
    gc.start()
    return gc


@pytest.mark.parametrize("ordering", ["key", "partition", "unordered"])
def test_a_poison_record_in_a_batch_of_500_is_isolated_and_dead_lettered_alone(
    members: list[GroupConsumer], ordering: Ordering, kind: Kind
) -> None:
    """The batch is retried under the policy (2 attempts), then split in halves until the
    record that fails alone is found: it alone is dead-lettered, every other record is written,
    and the partition commits to the end."""
    broker = FakeBroker()
    broker.create_topic("orders", partitions=1)
    broker.create_topic("orders.dlq", partitions=1)
    for i in range(500):
        broker.produce("orders", key=f"k{i}", value=f"row-{i}", partition=0)
    h = bulk_write(kind, poison={317})
    gc = poisoned_member(broker, h, members, ordering=ordering)
    wait_until(lambda: broker.committed_offsets("g").get(("orders", 0)) == 500, "committed", 20)
    dead = broker.messages("orders.dlq")
    assert [m.value() for m in dead] == [b"row-317"]
    assert sorted(set(h.written)) == [o for o in range(500) if o != 317]
    if ordering != "partition":  # there the partition's first poll runs before the rest
        assert len(h.calls[0]) == 500, [len(c) for c in h.calls]  # one batch of 500 at first
    assert [317] in h.calls  # found failing alone
    # Two attempts of the batch, then about two calls per halving: nowhere near 500.
    assert len(h.calls) < 40, [len(c) for c in h.calls]
    # Stats are published on their own schedule, not with each commit.
    wait_until(lambda: gc.stats().dead_lettered == 1, "the dead letter counted", 10)


def test_a_batch_that_fails_and_then_succeeds_is_retried_whole_and_never_split(
    members: list[GroupConsumer], caplog: pytest.LogCaptureFixture, kind: Kind
) -> None:
    broker = FakeBroker()
    broker.create_topic("orders", partitions=1)
    broker.create_topic("orders.dlq", partitions=1)
    for i in range(100):
        broker.produce("orders", key=f"k{i}", value=f"row-{i}", partition=0)
    h = bulk_write(kind, poison=set(), flaky=1)
    with caplog.at_level(logging.INFO, logger="weir"):
        poisoned_member(broker, h, members, ordering="unordered")
        wait_until(lambda: broker.committed_offsets("g").get(("orders", 0)) == 100, "committed", 20)
    assert not broker.messages("orders.dlq")
    assert [sorted(c) for c in h.calls] == [list(range(100))] * 2
    assert "batch_split" not in caplog.text


class JsonRows(BatchHandler):
    """Keeps (offset, deserialized value) of every record it is given, per call."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[list[tuple[int, Any]]] = []

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> Awaitable[None] | None:
        self.keep(records)
        return None

    def keep(self, records: list[Record]) -> None:
        with self.lock:
            self.calls.append([(r.offset, r.deserialized_value) for r in records])

    def handled(self) -> list[int]:
        with self.lock:
            return [off for call in self.calls for off, _ in call]


class AsyncJsonRows(JsonRows):
    async def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        await asyncio.sleep(0)
        self.keep(records)


@pytest.mark.parametrize("ordering", ["key", "partition", "unordered"])
def test_a_batch_handler_reads_deserialized_records_and_one_that_fails_is_dead_lettered_alone(
    members: list[GroupConsumer], ordering: Ordering, kind: Kind
) -> None:
    """value_deserializer runs for batch handlers: the handler reads `deserialized_value`, and a
    record that does not deserialize is failed alone (never retried, never given to the
    handler) and dead-lettered; in key and partition mode the later records of its lane wait
    for it and then run once, not also in the batch it failed in."""
    broker = FakeBroker()
    broker.create_topic("orders", partitions=1)
    broker.create_topic("orders.dlq", partitions=1)
    for i in range(30):
        value = b"not json" if i == 7 else json.dumps({"n": i}).encode()
        broker.produce("orders", key=f"k{i % 3}", value=value, partition=0)
    h = JsonRows() if kind == "threads" else AsyncJsonRows()
    gc = poisoned_member(broker, h, members, json_deserializer(), ordering=ordering)
    wait_until(lambda: broker.committed_offsets("g").get(("orders", 0)) == 30, "committed", 20)
    assert [m.value() for m in broker.messages("orders.dlq")] == [b"not json"]
    handled = h.handled()
    assert sorted(handled) == [i for i in range(30) if i != 7], handled  # each exactly once
    assert all(value == {"n": off} for call in h.calls for off, value in call)
    # stats() is the owner's last published snapshot, which may predate the commit just seen.
    wait_until(lambda: gc.stats().dead_lettered == 1, "the dead letter in the stats", 5)
    assert gc.stats().retries == 0


class ReturnsCoroutine(BatchHandler):
    """Wrong on purpose: a plain handle_batch that returns a coroutine (its work never runs)."""

    def __init__(self) -> None:
        self.ran: list[int] = []

    async def write(self, records: list[Record]) -> None:
        self.ran += [r.offset for r in records]

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> Awaitable[None] | None:
        return self.write(records)


def test_a_coroutine_returned_through_the_deserializers_stops_the_member(
    members: list[GroupConsumer],
) -> None:
    """The deserializing wrapper returns nothing to the workers, so the awaitable the wrapped
    plain handle_batch returned is refused in the wrapper: the member stops, nothing counts."""
    broker = FakeBroker()
    broker.create_topic("orders", partitions=1)
    broker.create_topic("orders.dlq", partitions=1)
    for i in range(5):
        broker.produce("orders", key=f"k{i}", value=json.dumps({"n": i}).encode(), partition=0)
    h = ReturnsCoroutine()
    gc = poisoned_member(broker, h, members, json_deserializer(), ordering="unordered")
    with pytest.raises(HandlerError, match="returned a coroutine instead of doing its work"):
        gc.join(WAIT)
    assert h.ran == []
    assert not broker.committed_offsets("g").get(("orders", 0))


# -- the flush hook ------------------------------------------------------------------------------


class BufferingRows(BatchHandler):
    """A batch handler that keeps rows across batches and writes them at flush."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: list[tuple[int, int, int]] = []
        self.handled: list[Key] = []
        self.durable: set[Key] = set()
        self.loops: set[asyncio.AbstractEventLoop | None] = set()  # where on_flush ran

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> Awaitable[None] | None:
        self.keep(records, ctx)
        return None

    def keep(self, records: list[Record], ctx: BatchContext) -> None:
        with self.lock:
            self.rows += [(r.partition, r.offset, ctx.token(r)) for r in records]
            self.handled += [(r.partition, r.offset) for r in records]

    def on_flush(self, ctx: FlushContext) -> Awaitable[None] | None:
        self.write(ctx)
        return None

    def write(self, ctx: FlushContext) -> None:
        try:
            self.loops.add(asyncio.get_running_loop())
        except RuntimeError:
            self.loops.add(None)
        with self.lock:
            rows, self.rows = self.rows, []
            self.durable.update((p, o) for p, o, t in rows if ctx.owns((TOPIC, p), t))


class AsyncBufferingRows(BufferingRows):
    """`async def handle_batch`, and a plain on_flush (on the owner thread)."""

    async def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        await asyncio.sleep(0)
        self.keep(records, ctx)


class AsyncBufferingRowsAsyncFlush(AsyncBufferingRows):
    """`async def handle_batch` and `async def on_flush` (on the handler's loop)."""

    async def on_flush(self, ctx: FlushContext) -> None:
        await asyncio.sleep(0)
        self.write(ctx)


BUFFERS = [BufferingRows, AsyncBufferingRows, AsyncBufferingRowsAsyncFlush]


def watch_commits(gc: GroupConsumer, h: Accumulator | BufferingRows, first: int = 0) -> list[str]:
    """Every commit sent is checked against what was durable then: a commit past a record that
    was only in the buffer is listed."""
    passed: list[str] = []

    def listener(event: CommitEvent) -> None:
        if event.status != "sent":
            return
        with h.lock:
            missing = [
                o for o in range(first, event.offset) if (event.tp.partition, o) not in h.durable
            ]
        if missing:
            passed.append(f"{event.tp}@{event.offset} passes {missing[:5]}")

    gc.add_commit_listener(listener)
    return passed


def test_no_commit_passes_a_record_that_is_only_in_the_handlers_buffer(start: Start) -> None:
    fake = two_partitions(300, 200)
    h = Accumulator()
    gc = start(h, fake, commit_every_records=50)
    passed = watch_commits(gc, h)
    fake.produce_many(TOPIC, 0, range(300, 400))
    wait_until(lambda: committed(fake, P0) == 400 and committed(fake, P1) == 200, "committed")
    assert not passed, passed[:3]
    assert h.flushes >= 2
    assert len(h.durable) == 600 and not h.dropped


@pytest.mark.parametrize(
    "buffering",
    [Accumulator, *BUFFERS],
    ids=["per-record", "batch-threads", "batch-async", "batch-async-flush"],
)
def test_a_revoke_flushes_before_its_commit(
    start: Start, buffering: type[Accumulator | BufferingRows]
) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(5))
    fake.script_assign([P0])
    h = buffering()
    gc = start(h, fake, commit_interval_s=60.0, commit_every_records=1_000_000)
    passed = watch_commits(gc, h)
    wait_until(lambda: len(h.handled) == 5, "all five in the buffer")
    assert not h.durable
    revoke = fake.script_revoke([P0])
    assert revoke.done.wait(WAIT)
    during = [c for c in fake.commit_log() if c.in_callback == "revoke"]
    assert [c.offsets for c in during] == [{P0: 5}]
    assert h.durable == {(0, o) for o in range(5)}
    assert not passed


def test_a_lost_partitions_buffered_records_are_dropped_never_flushed(start: Start) -> None:
    fake = two_partitions(4, 3)
    h = Accumulator()
    gc = start(h, fake, commit_interval_s=60.0, commit_every_records=1_000_000)
    wait_until(lambda: len(h.handled) == 7, "all seven in the buffer")
    before = len(fake.commit_log())
    lost = fake.script_lost([P0])
    assert lost.done.wait(WAIT)
    gc.stop()
    gc.join(WAIT)  # the final commit flushes first
    assert h.durable == {(1, o) for o in range(3)}
    assert sorted(h.dropped) == [(0, o) for o in range(4)]
    after = fake.commit_log()[before:]
    assert all(Partition(*P0) not in c.offsets for c in after)
    assert [c.offsets for c in after if Partition(*P1) in c.offsets][-1] == {P1: 3}


def test_a_failed_flush_counts_nothing_and_its_partitions_start_over(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    """The flush raised: whether its records were written is unknown, so they do not count;
    their partition starts over from its commit and they run again (a new token: the copies
    still in the buffer are dropped by the next flush)."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(10))
    fake.script_assign([P0])
    h = Accumulator(fail_flushes=1)
    gc = start(h, fake, commit_every_records=10, commit_interval_s=60.0)
    passed = watch_commits(gc, h)
    wait_until(lambda: committed(fake, P0) == 10, "committed")
    assert not passed
    assert h.handled.count((0, 0)) == 2  # ran again after the failed flush
    assert sorted(h.dropped) == [(0, o) for o in range(10)]  # the old token's copies
    assert h.durable == {(0, o) for o in range(10)}
    assert "partitions_reset" in caplog.text and "callback_failed" in caplog.text


def test_a_crash_between_the_buffer_and_the_flush_loses_nothing(
    members: list[GroupConsumer],
) -> None:
    """The first member never gets a flush through (its sink is down until it dies): nothing
    it buffered is committed, and the next member writes every record."""
    broker = FakeBroker()
    broker.create_topic("orders", partitions=2)
    for i in range(100):
        broker.produce("orders", key=f"k{i}", value=f"row-{i}", partition=i % 2)
    settings: ConsumerSettings = {
        "bootstrap_servers": "fake:9092",
        "group_id": "g",
        "topics": ["orders"],
        "auto_offset_reset": "earliest",
        "commit_interval_s": 0.02,
    }
    first = Accumulator(fail_flushes=1_000_000)
    gc = GroupConsumer(first, consumer_factory=broker.consumer_factory, **settings)
    members.append(gc)
    gc.start()
    wait_until(lambda: len(first.handled) >= 100 and first.flushes >= 3, "buffered, flushes failed")
    gc.stop()
    gc.join(WAIT)
    assert not first.durable
    assert all(off == 0 for off in broker.committed_offsets("g").values())
    second = Accumulator()
    gc2 = GroupConsumer(second, consumer_factory=broker.consumer_factory, **settings)
    members.append(gc2)
    gc2.start()
    wait_until(lambda: sum(broker.committed_offsets("g").values()) == 100, "committed", 20)
    assert {("orders", p, o) for p, o in second.durable} == {
        ("orders", m.partition(), m.offset()) for m in broker.messages("orders")
    }


@pytest.mark.parametrize("buffering", BUFFERS, ids=["threads", "async", "async-flush"])
def test_a_batch_handler_with_a_flush_hook_is_committed_only_after_its_flush(
    start: Start, buffering: type[BufferingRows]
) -> None:
    fake = two_partitions(120, 80)
    h = buffering()
    gc = start(h, fake, commit_every_records=40, batch_max_records=30)
    bad: list[str] = []

    def listener(event: CommitEvent) -> None:
        if event.status == "sent":
            with h.lock:
                if any((event.tp.partition, o) not in h.durable for o in range(event.offset)):
                    bad.append(f"{event.tp}@{event.offset}")

    gc.add_commit_listener(listener)
    wait_until(lambda: committed(fake, P0) == 120 and committed(fake, P1) == 80, "committed")
    assert not bad
    assert len(h.durable) == 200
    if buffering is AsyncBufferingRowsAsyncFlush:
        assert None not in h.loops and len(h.loops) == 1  # on the handler's loop
    else:
        assert h.loops == {None}


def test_an_async_flush_runs_on_the_async_handlers_loop(start: Start) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(6))
    fake.script_assign([P0])
    loops: list[asyncio.AbstractEventLoop] = []
    buffer: list[int] = []
    durable: list[int] = []

    class AsyncSink(Handler):
        async def handle(self, record: Record, ctx: Context) -> None:
            loops.append(asyncio.get_running_loop())
            buffer.append(record.offset)

        async def on_flush(self, ctx: FlushContext) -> None:
            loops.append(asyncio.get_running_loop())
            durable.extend(buffer)
            buffer.clear()

    start(AsyncSink(), fake)
    wait_until(lambda: committed(fake, P0) == 6, "committed")
    assert sorted(durable) == list(range(6))
    assert len(set(loops)) == 1


@pytest.mark.parametrize("routed", [False, True], ids=["handler", "route"])
@pytest.mark.parametrize("kind", ["thread", "async"])
def test_a_flush_that_returns_its_work_unawaited_counts_nothing(
    start: Start,
    members: list[GroupConsumer],
    caplog: pytest.LogCaptureFixture,
    kind: str,
    routed: bool,
) -> None:
    """An `on_flush` that returns a coroutine instead of running it (a plain one handing back
    an async writer's call, or an `async def` one with the await left out) wrote nothing,
    and the commit passed every buffered record: they were lost. It fails like a flush that
    raised: nothing counts, nothing is committed past the buffer. The same for a route's
    handler: the async router awaited the hook and dropped what its coroutine returned."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(6))
    fake.script_assign([P0])
    durable: list[int] = []

    async def write(rows: list[int]) -> None:
        durable.extend(rows)

    class ThreadSink(Handler):
        def __init__(self) -> None:
            self.buffer: list[int] = []

        def handle(self, record: Record, ctx: Context) -> None:
            self.buffer.append(record.offset)

        def on_flush(self, ctx: FlushContext) -> Any:
            rows, self.buffer = self.buffer, []
            return write(rows)

    class AsyncSink(ThreadSink):
        async def handle(self, record: Record, ctx: Context) -> None:  # type: ignore[override]
            self.buffer.append(record.offset)

        async def on_flush(self, ctx: FlushContext) -> Any:
            rows, self.buffer = self.buffer, []
            return write(rows)

    sink = ThreadSink() if kind == "thread" else AsyncSink()
    if routed:
        settings: Any = {**settings_for(sink, {"commit_interval_s": 0.05})}
        del settings["topics"]  # the routes name them
        fake.given_committed()
        gc = GroupConsumer(routes={TOPIC: sink}, consumer_factory=fake.factory, **settings)
        members.append(gc)
        gc.start()
    else:
        gc = start(sink, fake, commit_interval_s=0.05)
    wait_until(lambda: gc.stats().callback_failures >= 2, "two flushes failed")
    assert durable == []
    assert committed(fake, P0) in (None, -1, 0)
    assert "returned a coroutine" in caplog.text and "partitions_reset" in caplog.text
    said = "hook " if kind == "thread" else "async handler "  # where it ran: owner, or loop
    assert f"{said}test_a_flush_that_returns_its_work_unawaited_counts_nothing" in caplog.text


def test_an_async_flush_on_a_thread_handler_is_refused() -> None:
    class Mixed(Handler):
        def handle(self, record: Record, ctx: Context) -> None:
            pass

        async def on_flush(self, ctx: FlushContext) -> None:
            pass

    with pytest.raises(TypeError, match=r"Mixed\.on_flush is async def"):
        GroupConsumer(Mixed(), **SETTINGS)


def test_a_handlers_own_flush_method_is_left_alone(start: Start) -> None:
    """`flush` is a common method name (a client's, a buffer's): weir's hook is `on_flush`, so
    a handler's own `flush`, whatever it takes, is neither refused nor called at a commit."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(5))
    fake.script_assign([P0])
    calls: list[str] = []

    class Own(Handler):
        def handle(self, record: Record, ctx: Context) -> None:
            pass

        def flush(self, timeout: float | None = None) -> None:
            calls.append("flush")

    class OwnNoArgs(Own):
        def flush(self) -> None:  # type: ignore[override]
            calls.append("flush()")

    gc = start(Own(), fake)
    wait_until(lambda: committed(fake, P0) == 5, "committed without a flush hook")
    gc.stop()
    gc.join(WAIT)
    assert not calls
    GroupConsumer(OwnNoArgs(), **SETTINGS)  # not refused


def test_an_on_flush_that_does_not_take_the_context_is_refused() -> None:
    class Own(Handler):
        def handle(self, record: Record, ctx: Context) -> None:
            pass

        def on_flush(self) -> None:  # type: ignore[override]
            pass

    with pytest.raises(TypeError, match=r"Own\.on_flush\(self\): weir's flush hook is called"):
        GroupConsumer(Own(), **SETTINGS)


class Hangs(Accumulator):
    """An accumulator whose flushes from the `hang_from`-th on (1: the first) hang until
    `release` is set, `hang` of them (the others write as `Accumulator` does)."""

    def __init__(self, hang_from: int = 1, hang: int = 1) -> None:
        super().__init__()
        self.release = threading.Event()
        self.calls = 0
        self.hanging = 0
        self.hang_from, self.hang = hang_from, hang

    def on_flush(self, ctx: FlushContext) -> None:
        with self.lock:
            self.calls += 1
            hang = self.hang_from <= self.calls < self.hang_from + self.hang
            self.hanging += hang
        if hang:
            self.release.wait(60)
            with self.lock:
                self.hanging -= 1
            return
        super().on_flush(ctx)


@pytest.fixture
def hangs() -> Iterator[list[Hangs]]:
    handlers: list[Hangs] = []
    yield handlers
    for h in handlers:  # a flush left on its thread returns at the end of the test
        h.release.set()


def test_a_flush_that_hangs_is_abandoned_and_the_commits_go_on(
    start: Start, hangs: list[Hangs], caplog: pytest.LogCaptureFixture
) -> None:
    """The owner waits for a plain on_flush at most flush_timeout_s: the hung flush counts as
    failed (its records start over and run again), and the next flushes and commits go on
    while it still hangs."""
    fake = two_partitions(40, 30)
    h = Hangs()
    hangs.append(h)
    with caplog.at_level(logging.INFO, logger="weir"):
        gc = start(h, fake, commit_every_records=20, flush_timeout_s=0.3)
        passed = watch_commits(gc, h)
        wait_until(lambda: committed(fake, P0) == 40 and committed(fake, P1) == 30, "committed")
        assert h.hanging == 1  # the first flush still hangs
    assert not passed, passed[:3]
    assert h.durable == {(0, o) for o in range(40)} | {(1, o) for o in range(30)}
    assert "flush_abandoned" in caplog.text and "partitions_reset" in caplog.text


def test_a_flush_that_hangs_at_shutdown_is_bounded_by_the_shutdown_budget(
    start: Start, hangs: list[Hangs]
) -> None:
    """The final flush hangs: the shutdown still ends within shutdown_timeout_s, and its final
    commit does not pass the records the flush was to cover."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(10))
    fake.script_assign([P0])
    h = Hangs()
    hangs.append(h)
    gc = start(
        h, fake, commit_interval_s=60.0, commit_every_records=1_000_000, shutdown_timeout_s=1.0
    )
    wait_until(lambda: len(h.handled) == 10, "all ten in the buffer")
    began = time.monotonic()
    gc.stop()
    gc.join(WAIT)
    took = time.monotonic() - began
    assert h.hanging == 1
    assert took < 1.0 + 1.0, f"the shutdown took {took:.1f} s"
    assert committed(fake, P0) <= 0 and not h.durable


def test_an_async_flush_that_hangs_is_cancelled_at_flush_timeout_s(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    """An async on_flush is cancelled on its loop at flush_timeout_s (it used to get
    revoke_timeout_s): the flush counts as failed, its records run again, and the next flush,
    which returns, lets the commit reach the end."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(6))
    fake.script_assign([P0])
    buffer: list[int] = []
    durable: list[int] = []
    cancelled: list[float] = []

    class SlowFirst(Handler):
        calls = 0

        async def handle(self, record: Record, ctx: Context) -> None:
            buffer.append(record.offset)

        async def on_flush(self, ctx: FlushContext) -> None:
            type(self).calls += 1
            if type(self).calls == 1:
                began = time.monotonic()
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    cancelled.append(time.monotonic() - began)
                    raise
            durable.extend(buffer)
            buffer.clear()

    with caplog.at_level(logging.INFO, logger="weir"):
        start(SlowFirst(), fake, flush_timeout_s=0.3, revoke_timeout_s=5.0)
        wait_until(lambda: committed(fake, P0) == 6, "committed")
    assert len(cancelled) == 1 and cancelled[0] < 2.0, cancelled
    assert set(durable) == set(range(6))
    assert "partitions_reset" in caplog.text


def test_flush_timeout_s_stays_below_half_of_max_poll_interval() -> None:
    settings: ConsumerSettings = {**SETTINGS, "max_poll_interval_s": 60.0, "flush_timeout_s": 31.0}
    with pytest.raises(ValueError, match=r"flush_timeout_s \(31 s\) must stay below half of"):
        GroupConsumer(Accumulator(), **settings)


def test_flush_timeout_s_without_a_flush_hook_is_refused() -> None:
    settings: ConsumerSettings = {**SETTINGS, "flush_timeout_s": 5.0}
    with pytest.raises(ValueError, match=r"flush_timeout_s bounds a handler's on_flush hook"):
        GroupConsumer(Collector(), **settings)


def test_a_flush_hook_with_a_transaction_is_built() -> None:
    """It used to be refused: the flush runs before each transaction commits now
    (tests/unit/test_batch_exactly_once.py)."""
    settings: ConsumerSettings = {**SETTINGS, "transactional_id": "tx"}
    assert GroupConsumer(Accumulator(), **settings).config.transactional_id == "tx"


def test_fenced_error_loses_the_partitions_it_is_raised_for(
    start: Start, caplog: pytest.LogCaptureFixture, collector: Make
) -> None:
    """ctx.fail(record, FencedError) loses that record's partition only; raised by the call,
    it loses every partition of the batch."""
    fake = two_partitions(3, 3)
    fenced = FencedError("g", Partition(TOPIC, 0), 1, 2)

    def action(records: list[Record], ctx: BatchContext) -> None:
        for r in records:
            if r.partition == 0:
                ctx.fail(r, fenced)
                return

    start(collector(action), fake, batch_max_wait_s=0.2, workers=1)
    wait_until(lambda: committed(fake, P1) == 3, "P1 committed")
    wait_until(lambda: "partition_fenced" in caplog.text, "P0 fenced")
    assert caplog.text.count("partition_fenced") == 1
    assert committed(fake, P0) <= 0

    fake2 = two_partitions(3, 3)

    def raises(records: list[Record], ctx: BatchContext) -> None:
        raise fenced

    caplog.clear()
    start(collector(raises), fake2, batch_max_wait_s=0.2, workers=1)
    wait_until(lambda: caplog.text.count("partition_fenced") == 2, "both fenced")
    assert committed(fake2, P0) <= 0 and committed(fake2, P1) <= 0


# -- async def handle_batch: what only the event loop has ---------------------------------------


class Parked(BatchHandler):
    """An async batch handler whose calls wait (without blocking the loop) until `gate` is set,
    noting whether they were cancelled and what `ctx.cancelled` said."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.batches: list[list[Key]] = []
        self.cancelled: list[list[Key]] = []
        self.ctx_cancelled: list[bool] = []

    async def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        keys = [(r.partition, r.offset) for r in records]
        self.batches.append(keys)
        self.entered.set()
        try:
            while not self.gate.is_set():
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            self.ctx_cancelled.append(ctx.cancelled)
            self.cancelled.append(keys)
            raise


def test_an_async_batch_past_the_shutdown_budget_is_cancelled_and_not_committed(
    start: Start,
) -> None:
    fake = one_partition(5)
    h = Parked()
    gc = start(h, fake, shutdown_timeout_s=0.5, batch_max_wait_s=0.0)
    assert h.entered.wait(WAIT)
    began = time.monotonic()
    gc.stop()
    gc.join(WAIT)
    took = time.monotonic() - began
    assert h.cancelled == h.batches and h.ctx_cancelled == [True], (h.batches, h.cancelled)
    assert took < 0.5 + 1.5, f"the shutdown took {took:.1f} s"
    assert committed(fake, P0) <= 0


def test_an_async_batch_is_cancelled_only_once_every_partition_it_holds_is_lost(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch of P0 and P1: P0 lost, the call goes on (P1's records still count when it
    returns); P1 lost too, the call is cancelled, and neither partition commits after."""
    fake = two_partitions(3, 3)
    h = Parked()
    start(h, fake, batch_max_wait_s=0.3, workers=1)
    assert h.entered.wait(WAIT)
    assert {p for p, _ in h.batches[0]} == {0, 1}
    before = len(fake.commit_log())
    assert fake.script_lost([P0]).done.wait(WAIT)
    time.sleep(0.1)
    assert not h.cancelled  # P1 is still owned: its records must run to the end
    assert fake.script_lost([P1]).done.wait(WAIT)
    wait_until(lambda: len(h.cancelled) == 1, "the batch cancelled")
    assert h.ctx_cancelled == [True]
    assert caplog.text.count("batch_cancelled") == 1
    after = fake.commit_log()[before:]
    assert all(not c.offsets for c in after), after


def test_max_in_flight_bounds_the_async_batches_running_at_once(start: Start) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(120), key=lambda o: b"k%d" % (o % 40))
    fake.script_assign([P0])
    running = [0, 0]  # now, most

    class Slow(BatchHandler):
        async def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
            running[0] += 1
            running[1] = max(running)
            await asyncio.sleep(0.02)
            running[0] -= 1

    start(Slow(), fake, workers=2, batch_max_records=5, batch_max_wait_s=0.0)
    wait_until(lambda: committed(fake, P0) == 120, "committed")
    assert running[1] == 2, running


def test_an_async_batch_handlers_own_cancelled_error_is_a_failure(start: Start) -> None:
    """A CancelledError weir did not cause (an awaited future someone cancelled) fails the
    batch like any exception: it is retried, never taken for a hand-off."""
    fake = one_partition(4)
    attempts: list[int] = []

    class Unlucky(BatchHandler):
        async def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
            attempts.append(ctx.attempt(records[0]))
            if len(attempts) == 1:
                fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                fut.cancel()
                await fut

    start(Unlucky(), fake, failure=RETRY_ONCE, ordering="unordered")
    wait_until(lambda: committed(fake, P0) == 4, "committed")
    assert attempts == [1, 2]


# -- batch_max_bytes ----------------------------------------------------------------------------


def test_batch_max_bytes_is_checked_when_the_consumer_is_built() -> None:
    bound: ConsumerSettings = {**SETTINGS, "batch_max_bytes": 1000}
    with pytest.raises(ValueError, match="batch_max_bytes configures a batch handler"):
        GroupConsumer(lambda r: None, **bound)
    zero: ConsumerSettings = {**SETTINGS, "batch_max_bytes": 0}
    with pytest.raises(ValueError, match=r"batch_max_bytes\n.*greater than or equal to 1"):
        GroupConsumer(Rows(), **zero)
    assert GroupConsumer(AsyncRows(), **bound).config.batch_max_bytes == 1000
    assert GroupConsumer(Rows(), **SETTINGS).config.batch_max_bytes is None


@pytest.mark.parametrize("ordering", ["key", "partition", "unordered"])
def test_a_batch_never_holds_more_than_batch_max_bytes(
    start: Start, collector: Make, ordering: Ordering
) -> None:
    """Records of 102 bytes (key and value) and three of 3002 under a bound of 1,000 bytes:
    every batch stays within it, but a record larger than the bound, which runs alone; the
    batches still fill (not one record each), and each key's records keep their order."""
    big = {(0, 50), (0, 200), (1, 120)}

    def value(p: int) -> Callable[[int], bytes]:
        return lambda o: b"x" * (3000 if (p, o) in big else 100)

    fake = FakeConsumer()
    for p in (0, 1):
        fake.produce_many(TOPIC, p, range(300), key=lambda o: b"k%d" % (o % 7), value=value(p))
    fake.script_assign([P0, P1])
    h = collector()
    start(h, fake, ordering=ordering, batch_max_bytes=1000, workers=2, batch_max_wait_s=0.02)
    wait_until(lambda: committed(fake, P0) == 300 and committed(fake, P1) == 300, "committed")
    sizes = [sum(3002 if k in big else 102 for k in b) for b in h.batches]
    over = [b for b, n in zip(h.batches, sizes, strict=True) if n > 1000 and len(b) > 1]
    assert not over, [len(b) for b in over]
    assert sorted(b for b in h.batches if len(b) == 1 and b[0] in big) == [[k] for k in sorted(big)]
    assert max(sizes[i] for i, b in enumerate(h.batches) if len(b) > 1) > 500, sizes
    order: dict[tuple[int, int], list[int]] = defaultdict(list)
    for p, o in h.handled():
        order[(p, o % 7)].append(o)
    if ordering != "unordered":
        assert all(offsets == sorted(offsets) for offsets in order.values())
    assert sorted(h.handled()) == [(p, o) for p in (0, 1) for o in range(300)]


def test_an_async_batch_handler_that_blocks_the_loop_is_reported_by_name(start: Start) -> None:
    """The watchdog names the handle_batch coroutine that blocks the loop, as it names an async
    handle (the batch runner's frame is one of those it looks under)."""

    class Blocking(BatchHandler):
        async def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
            if records[0].offset == 0:
                time.sleep(0.6)  # the mistake: a blocking call on the loop

    fake = one_partition(5)
    with capture_events() as logs:
        gc = start(Blocking(), fake)
        wait_until(lambda: committed(fake, P0) == 5, "committed")
        wait_until(lambda: gc.stats().loop_blocked >= 1, "stats published")
    blocked = [e for e in logs if e["event"] == "event_loop_blocked"]
    assert blocked and str(blocked[0]["handler"]).endswith("Blocking.handle_batch"), blocked
