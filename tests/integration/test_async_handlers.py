"""Async handlers on a real broker: every record processed before its offset is committed, key
order and the watermark under random latencies, and revoke / lost with coroutines in flight."""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence

import pytest

from tests.consumer_overrides import Ordering, Overrides
from tests.integration.kafka_helpers import committed, end_offsets, member, produce, wait_until
from weir import CommitEvent, Context, Handler, Partition, Record
from weir.testing import capture_events

pytestmark = pytest.mark.broker


def _group() -> str:
    return f"g-{uuid.uuid4().hex[:10]}"


class Ledger:
    """What the handlers finished (written on the event loop), and every commit sent checked
    against it (on the owner thread): a commit at offset X needs every delivered record below X
    finished first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.finished: dict[int, set[int]] = defaultdict(set)
        self.order: dict[bytes | None, list[int]] = defaultdict(list)
        self.bad: list[str] = []
        self.first: dict[int, int] = {}

    def done(self, r: Record) -> None:
        with self.lock:
            self.finished[r.partition].add(r.offset)
            self.order[r.key].append(r.offset)
            self.first.setdefault(r.partition, r.offset)

    def count(self) -> int:
        with self.lock:
            return sum(map(len, self.finished.values()))

    def check(self, event: CommitEvent) -> None:
        if event.status != "sent":
            return
        with self.lock:
            done = self.finished[event.tp.partition]
            start = self.first.get(event.tp.partition, event.offset)
            missing = [o for o in range(start, event.offset) if o not in done]
        if missing:
            self.bad.append(f"{event.tp} committed {event.offset} before {missing[:5]} finished")


def test_an_async_handler_processes_every_record_before_its_offset_is_committed(
    kafka_bootstrap: str, make_topic: Callable[[int], str]
) -> None:
    """The silent loss: an `async def` handler was called from a worker thread, its coroutine
    never ran, and every record was committed unprocessed. Now the coroutine runs on an event
    loop, and no commit passes a record whose coroutine has not finished."""
    topic = make_topic(4)
    n = produce(kafka_bootstrap, topic, [(b"k%d" % (i % 37), b"v%d" % i) for i in range(800)])
    ledger = Ledger()

    async def handle(r: Record) -> None:
        await asyncio.sleep(random.random() * 0.004)
        ledger.done(r)

    group = _group()
    gc = member(handle, kafka_bootstrap, group, [topic], commit_interval_s=0.05)
    gc.add_commit_listener(ledger.check)
    with gc:
        wait_until(lambda: ledger.count() >= n, 60, "every record handled")
        ends = end_offsets(kafka_bootstrap, topic, 4)
        wait_until(
            lambda: [p.committed for p in gc.stats().partitions] == ends, 30, "commits to the end"
        )
    assert ledger.bad == []
    assert committed(kafka_bootstrap, group, topic, 4) == ends
    assert sum(len(s) for s in ledger.finished.values()) == n


@pytest.mark.parametrize("ordering", ["key", "partition", "unordered"])
def test_order_and_the_watermark_hold_under_random_async_latencies(
    kafka_bootstrap: str, make_topic: Callable[[int], str], ordering: Ordering
) -> None:
    """Key mode: records of one key run one at a time, in offset order, while up to
    `max_in_flight` coroutines of other keys wait at once. Partition mode: one record of a
    partition at a time, in offset order. Unordered: any record at any time. In every mode slow
    records finish long after fast ones behind them, and the commit never passes one of them."""
    topic = make_topic(3)
    n = produce(kafka_bootstrap, topic, [(b"k%d" % (i % 50), b"v") for i in range(1500)])
    ledger = Ledger()
    running: dict[object, int] = defaultdict(int)
    overlap: list[object] = []
    by_partition: dict[int, list[int]] = defaultdict(list)
    peak = [0, 0]  # now, most

    async def handle(r: Record) -> None:
        lane = r.partition if ordering == "partition" else (r.partition, r.key)
        running[lane] += 1  # the loop's thread only: no lock needed
        peak[0] += 1
        peak[1] = max(peak[1], peak[0])
        if running[lane] > 1:
            overlap.append(lane)
        by_partition[r.partition].append(r.offset)
        slow = random.random() < 0.02
        await asyncio.sleep(0.05 if slow else random.random() * 0.003)
        running[lane] -= 1
        peak[0] -= 1
        ledger.done(r)

    group = _group()
    gc = member(handle, kafka_bootstrap, group, [topic], ordering=ordering, max_in_flight=64)
    gc.add_commit_listener(ledger.check)
    with gc:
        wait_until(lambda: ledger.count() >= n, 60, "every record handled")
        ends = end_offsets(kafka_bootstrap, topic, 3)
        wait_until(
            lambda: [p.committed for p in gc.stats().partitions] == ends, 30, "commits to the end"
        )
    assert ledger.bad == []
    assert committed(kafka_bootstrap, group, topic, 3) == ends
    if ordering == "partition":
        assert overlap == [], f"records of one partition ran at once: {overlap[:5]}"
        assert peak[1] <= 3, f"{peak[1]} coroutines at most"
        for partition, offsets in by_partition.items():
            assert offsets == sorted(offsets), f"partition {partition} ran out of order"
        return
    assert 10 < peak[1] <= 64, f"{peak[1]} coroutines at most"
    if ordering == "key":
        assert overlap == [], f"records of one key ran at once: {overlap[:5]}"
        with ledger.lock:
            for key, offsets in ledger.order.items():
                assert offsets == sorted(offsets), f"key {key!r} ran out of order"


class Gate(Handler):
    """Async handler: the first delivery of records at `slow` offsets of partition 0 waits on the
    loop (for `delay` seconds, or until cancelled); everything else is fast."""

    def __init__(self, slow: set[int], delay: float | None = None) -> None:
        self.slow = set(slow)
        self.delay = delay
        self.waiting: set[int] = set()
        self.finished: dict[tuple[int, int], float] = {}
        self.cancelled: list[tuple[int, bool]] = []  # (offset, ctx.cancelled when cancelled)
        self.cancelled_at: list[float] = []
        self.revoked: list[float] = []
        self.lost: list[float] = []
        self.hook_threads: list[str] = []

    async def handle(self, record: Record, ctx: Context) -> None:
        if record.partition == 0 and record.offset in self.slow:
            self.slow.discard(record.offset)
            self.waiting.add(record.offset)
            try:
                await asyncio.sleep(3600 if self.delay is None else self.delay)
            except asyncio.CancelledError:
                self.cancelled.append((record.offset, ctx.cancelled))
                self.cancelled_at.append(time.monotonic())
                raise
            finally:
                self.waiting.discard(record.offset)
        self.finished[(record.partition, record.offset)] = time.monotonic()

    async def on_revoked(self, partitions: Sequence[Partition]) -> None:
        self.hook_threads.append(threading.current_thread().name)
        self.revoked.append(time.monotonic())

    async def on_lost(self, partitions: Sequence[Partition]) -> None:
        self.hook_threads.append(threading.current_thread().name)
        self.lost.append(time.monotonic())


class Commits:
    """Commits sent, with the time they were sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, int, float]] = []

    def __call__(self, event: CommitEvent) -> None:
        if event.status == "sent":
            self.sent.append((event.tp.partition, event.offset, time.monotonic()))

    def highest(self, partition: int, until: float) -> int:
        return max(off for p, off, at in self.sent if p == partition and at <= until)


@pytest.mark.parametrize("within_budget", [True, False], ids=["drained", "cancelled"])
def test_revoke_drains_coroutines_in_flight_within_its_budget_then_cancels_them(
    kafka_bootstrap: str, make_topic: Callable[[int], str], within_budget: bool
) -> None:
    """A second member joins (eager protocol: everything is revoked) while coroutines of
    partition 0 are in flight. They either finish within `revoke_timeout_s` (the revoke waits
    for them and commits past them) or are cancelled when it runs out (the revoke commits below
    them, and the handler saw `ctx.cancelled`). The async `on_revoked` runs on the loop."""
    topic = make_topic(2)
    produce(kafka_bootstrap, topic, [(None, b"v")] * 20, partition=0)
    produce(kafka_bootstrap, topic, [(None, b"v")] * 20, partition=1)
    gate = Gate(slow={5, 6}, delay=3.0 if within_budget else None)
    group = _group()
    settings: Overrides = {
        "ordering": "unordered",
        "assignment_strategy": "range",
        "revoke_timeout_s": 10.0 if within_budget else 1.5,
        "session_timeout_s": 3.0,
        "heartbeat_interval_s": 0.2,
    }
    commits = Commits()
    a = member(gate, kafka_bootstrap, group, [topic], **settings)
    a.add_commit_listener(commits)
    b = member(lambda r: None, kafka_bootstrap, group, [topic], **settings)
    with a, capture_events() as logs:
        wait_until(lambda: gate.waiting == {5, 6} and len(gate.finished) == 38, 30, "2 waiting")
        with b:
            wait_until(lambda: bool(gate.revoked), 30, "the revoke")
    # What this member committed for partition 0 up to the end of its revoke (it may get the
    # partition back afterwards).
    revoke_commit = commits.highest(0, until=gate.revoked[0])
    assert gate.hook_threads and all(n == "weir-loop" for n in gate.hook_threads)
    if within_budget:
        assert gate.cancelled == []
        # The revoke waited for them: they finished before it committed and called on_revoked.
        assert gate.finished[(0, 5)] < gate.revoked[0]
        assert revoke_commit == 20
    else:
        assert sorted(gate.cancelled) == [(5, True), (6, True)], "cancelled, with ctx.cancelled"
        # Never finished before the revoke (this member may get partition 0 back afterwards
        # and run them again, from the committed 5).
        for offset in (5, 6):
            assert gate.finished.get((0, offset), float("inf")) > gate.revoked[0]
        assert revoke_commit == 5
        assert a.stats().workers_replaced == 2
        cancelled = [e for e in logs if e["event"] == "handler_cancelled"]
        assert sorted(e["offset"] for e in cancelled) == [5, 6]


def test_lost_cancels_coroutines_in_flight_at_once(
    kafka_bootstrap: str, make_topic: Callable[[int], str]
) -> None:
    """The owner thread is held (a commit listener that blocks) past `max_poll_interval_s`:
    librdkafka gives the partition up, and at the owner's next poll it is lost. The coroutine
    still waiting on it is cancelled then, without a drain, and saw `ctx.cancelled`; nothing is
    committed for it. The async `on_lost` runs on the loop."""
    topic = make_topic(1)
    produce(kafka_bootstrap, topic, [(None, b"v")] * 10, partition=0)
    gate = Gate(slow={3})
    group = _group()
    block = threading.Event()

    def stall(event: CommitEvent) -> None:
        if block.is_set() and event.status == "sent":
            block.clear()
            time.sleep(3.0)  # past max.poll.interval.ms: the owner does not poll meanwhile

    gc = member(
        gate,
        kafka_bootstrap,
        group,
        [topic],
        ordering="unordered",
        session_timeout_s=1.0,
        heartbeat_interval_s=0.3,
        max_poll_interval_s=1.0,
        revoke_timeout_s=0.4,
        commit_interval_s=0.1,
    )
    gc.add_commit_listener(stall)
    with gc:
        wait_until(lambda: gate.waiting == {3} and len(gate.finished) == 9, 30, "3 waiting")
        block.set()
        # A commit to stall on: the one of the nine finished records may have gone out before
        # the block was set (then nothing changes, and no commit is sent again). A tenth record
        # grows the offset map above 3, and its commit is sent once it finishes.
        produce(kafka_bootstrap, topic, [(None, b"v")], partition=0)
        wait_until(lambda: bool(gate.lost), 30, "the partition lost")
        wait_until(lambda: bool(gate.cancelled), 5, "the coroutine cancelled")
        # Redelivered to the rejoined member (the first delivery was the slow one).
        wait_until(lambda: (0, 3) in gate.finished, 30, "offset 3 handled again")
    assert gate.cancelled == [(3, True)]
    # At once: no drain budget is spent on a lost partition (on_lost runs after the cancel).
    assert gate.cancelled_at[0] <= gate.lost[0]
    assert gate.hook_threads and all(n == "weir-loop" for n in gate.hook_threads)
