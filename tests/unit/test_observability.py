"""stats(), health() and the metrics behind them, on the scripted FakeConsumer and in isolation.

The numbers against a real broker (lag while paused, the group's committed offset, the exporter
over HTTP) are in tests/integration/test_observability.py.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from pydantic import ValidationError
from tests.fake_members import SETTINGS as FAKE_SETTINGS
from tests.fake_members import started
from tests.logged import events
from tests.waiting import wait_until

from weir import ConsumerConfig, GroupConsumer, Partition, Record
from weir._engine.engine import Engine
from weir._engine.lifecycle import Lifecycle, State
from weir._engine.metrics import Histogram, Metrics, PartitionMetrics
from weir._engine.tasks import Assignment, Task
from weir._engine.tracking import PartitionProgress
from weir._engine.watermarks import WatermarkRefresher
from weir.health import check
from weir.records import CommitEvent, as_handler
from weir.stats import BUCKETS, EMPTY, ConsumerStats, LatencyHistogram, PartitionStats
from weir.testing.fake import FakeConsumer

pytestmark = pytest.mark.timeout(60)

TOPIC = "t"
P0 = Partition(TOPIC, 0)
WAIT = 5.0
SETTINGS: dict[str, Any] = {**FAKE_SETTINGS, "workers": 2}


@pytest.fixture
def launch(members: list[GroupConsumer]) -> Callable[..., GroupConsumer]:
    def go(handler: Callable[[Record], object], fake: FakeConsumer, **kw: Any) -> GroupConsumer:
        return started(members, fake, handler, SETTINGS, WAIT, **kw)

    return go


# -- histograms ----------------------------------------------------------------------------------


def test_buckets_are_four_per_decade_from_10_us_to_10_000_s() -> None:
    assert BUCKETS[0] == 1e-5 and BUCKETS[-1] == 1e4
    assert len(BUCKETS) == 37
    assert list(BUCKETS) == sorted(BUCKETS)
    for low, high in itertools.pairwise(BUCKETS):
        assert 1.7 < high / low < 1.85


def test_an_observation_on_a_bound_counts_in_that_bucket() -> None:
    h = Histogram()
    h.observe(0.001)  # a bound: le="0.001"
    h.observe(0.00101)  # just above: the next bucket
    i = BUCKETS.index(0.001)
    assert h.counts[i] == 1 and h.counts[i + 1] == 1
    h.observe(1e9)  # past every bound
    h.observe(-3.0)  # a producer clock ahead of ours: 0
    assert h.counts[-1] == 1 and h.counts[0] == 1
    assert h.count == 4


def test_weighted_observations_count_each_record() -> None:
    h = Histogram()
    h.observe(0.002, 200)  # a task of 200 records that took 0.4 s
    snap = h.snapshot()
    assert snap.count == 200
    assert snap.sum == pytest.approx(0.4)
    assert snap.mean == pytest.approx(0.002)


def test_quantiles_interpolate_inside_the_bucket_that_holds_them() -> None:
    h = Histogram()
    for _ in range(90):
        h.observe(0.001)
    for _ in range(10):
        h.observe(2.0)
    snap = h.snapshot()
    i = BUCKETS.index(0.001)
    # 90 of 100 at 1 ms: the median lies in (BUCKETS[i-1], 1 ms], half way up the bucket's 90.
    assert snap.p50 is not None and BUCKETS[i - 1] < snap.p50 <= 0.001
    assert snap.p50 == pytest.approx(BUCKETS[i - 1] + (0.001 - BUCKETS[i - 1]) * 50 / 90)
    # The p95 and p99 fall among the 2 s records: in the bucket (1.78, 3.16].
    j = BUCKETS.index(3.16)
    for q in (snap.p95, snap.p99):
        assert q is not None and BUCKETS[j - 1] < q <= BUCKETS[j]
    assert LatencyHistogram().p50 is None
    with pytest.raises(ValueError, match="between 0 and 1"):
        snap.quantile(1.0)


def test_the_rate_covers_the_window_and_forgets_what_is_older() -> None:
    m = Metrics(rate_window_s=10.0)
    assert m.rate(0, 100.0) == (0.0, 0.0)
    assert m.rate(500, 105.0) == (100.0, 5.0)
    rate, window = m.rate(2500, 110.0)
    assert (rate, window) == (250.0, 10.0)
    # Samples older than the window drop out: the rate covers the last 10 s or a little more.
    m.rate(3000, 120.0)
    rate, window = m.rate(3000, 131.0)
    assert window == pytest.approx(11.0) and rate == 0.0


# -- partition numbers ---------------------------------------------------------------------------


def _part(**kw: Any) -> PartitionStats:
    base: dict[str, Any] = {
        "tp": P0,
        "token": 1,
        "in_flight": 0,
        "in_flight_bytes": 0,
        "committable": None,
        "committed": None,
        "paused": False,
    }
    return PartitionStats(**{**base, **kw})


def test_lag_and_backlogs_from_committed_position_and_high_watermark() -> None:
    p = _part(committed=100, position=130, high_watermark=175, log_start=0)
    assert (p.lag, p.in_app_backlog, p.broker_backlog) == (75, 30, 45)
    # Never committed: counted from the log start, as `weir lag` does.
    p = _part(committed=None, position=None, high_watermark=50, log_start=20)
    assert (p.lag, p.in_app_backlog, p.broker_backlog) == (30, None, None)
    assert _part(committed=3).lag is None  # no high watermark yet
    stats = ConsumerStats(**{**_stats_fields(), "partitions": (p, _part(high_watermark=5))})
    assert stats.lag is None  # one partition's lag is unknown
    stats = ConsumerStats(
        **{**_stats_fields(), "partitions": (p, _part(committed=1, high_watermark=5))}
    )
    assert stats.lag == 34


def _stats_fields() -> dict[str, Any]:
    return {
        "at": time.monotonic(),
        "running": True,
        "processed": 0,
        "failed": 0,
        "in_flight": 0,
        "in_flight_bytes": 0,
        "peak_in_flight": 0,
        "peak_in_flight_bytes": 0,
        "throttled": False,
        "throttles": 0,
        "paused": False,
        "pauses": 0,
        "rebalances": 0,
    }


def test_budget_use_is_the_fuller_of_records_and_bytes() -> None:
    fields = _stats_fields()
    fields.update(capacity_records=1000, capacity_bytes=1000, in_flight=250, in_flight_bytes=100)
    assert ConsumerStats(**fields).budget_use == 0.25
    fields.update(read_ahead_bytes=400)
    assert ConsumerStats(**fields).budget_use == 0.5


def test_the_oldest_unfinished_run_gives_both_ages_and_finished_runs_are_pruned() -> None:
    progress = PartitionProgress(1)
    pm = PartitionMetrics(now=100.0, wall=time.time())
    first = progress.add_batch([0, 1, 2], 3)
    second = progress.add_batch([3, 4], 5)
    stamp = int((time.time() - 30) * 1000)
    pm.runs.append((first, 100.0, stamp))
    pm.runs.append((second, 101.0, None))
    fetched, age = pm.oldest_ages(104.0)
    assert fetched == 4.0 and age is not None and 29.0 < age < 32.0
    first.completed_many([0, 1, 2], first.token)
    assert pm.oldest_ages(104.0) == (3.0, None)  # the second run: no timestamp
    assert len(pm.runs) == 1
    second.completed_many([3, 4], second.token)
    assert pm.oldest_ages(104.0) == (None, None)


def test_a_watermark_stalls_only_while_work_is_in_flight() -> None:
    pm = PartitionMetrics(now=0.0, wall=0.0)
    assert pm.watermark(5, True, 1.0) == 0.0  # moved (from unknown)
    assert pm.watermark(5, True, 4.0) == 3.0
    assert pm.watermark(5, False, 6.0) == 0.0  # nothing in flight: not stalled
    assert pm.watermark(5, True, 7.0) == 1.0
    assert pm.watermark(6, True, 9.0) == 0.0


def test_commit_results_are_kept_per_partition_and_failures_counted() -> None:
    m = Metrics()
    m.assigned([P0], 1.0)
    m.commit_result(CommitEvent(P0, 7, False, "sent"))
    assert m.parts[P0].last_commit_time is None
    m.commit_result(CommitEvent(P0, 7, False, "failed", "REBALANCE_IN_PROGRESS"))
    m.commit_result(CommitEvent(Partition(TOPIC, 9), 1, False, "failed", "x"))  # not owned
    pm = m.parts[P0]
    assert (pm.last_commit_offset, pm.last_commit_error) == (7, "REBALANCE_IN_PROGRESS")
    assert m.commit_failures == 2
    m.commit_result(CommitEvent(P0, 8, True, "committed"))
    assert (pm.last_commit_offset, pm.last_commit_error) == (8, None)
    assert pm.last_commit_time is not None and pm.last_commit_time <= time.time()


# -- health ---------------------------------------------------------------------------------------


def _running(polled_ago: float, *, joined: bool = True, now: float = 1000.0) -> Lifecycle:
    life = Lifecycle()
    life.begin()
    life.running()
    life.polled_at = now - polled_ago
    life.joined = joined
    return life


def test_live_and_ready_when_running_joined_and_polling() -> None:
    h = check(_running(1.0), EMPTY, max_poll_interval_s=300, stuck_after_s=60, now=1000.0)
    assert (h.live, h.ready, h.reasons, h.state) == (True, True, (), "running")
    assert h.poll_age_s == 1.0


def test_not_ready_before_an_assignment_and_not_live_past_max_poll_interval() -> None:
    h = check(
        _running(1.0, joined=False), EMPTY, max_poll_interval_s=300, stuck_after_s=60, now=1000.0
    )
    assert (h.live, h.ready) == (True, False)
    assert h.reasons == ("no assignment from the group yet",)
    h = check(_running(301.0), EMPTY, max_poll_interval_s=300, stuck_after_s=60, now=1000.0)
    assert (h.live, h.ready) == (False, False)
    assert "has not polled for 301.0 s" in h.reasons[0]


def test_failed_and_stopped_members_are_not_live() -> None:
    life = _running(0.0)
    life.fail(RuntimeError("boom"))
    life.end()
    h = check(life, EMPTY, max_poll_interval_s=300, stuck_after_s=60, now=1000.0)
    assert (h.live, h.ready, h.state) == (False, False, "failed")
    assert "boom" in h.reasons[0]
    life = _running(0.0)
    life.end()
    assert check(life, EMPTY, max_poll_interval_s=300, stuck_after_s=60).live is False
    starting = Lifecycle()
    starting.begin()
    h = check(starting, EMPTY, max_poll_interval_s=300, stuck_after_s=60)
    assert (h.live, h.ready, h.poll_age_s) == (True, False, None)
    assert h.reasons[0] == "not running (starting)"


def test_a_partition_stalled_with_work_in_flight_is_stuck_from_stuck_after_s() -> None:
    life = _running(0.0)
    stalled = _part(in_flight=3, stalled_s=50.0)
    idle = _part(tp=Partition(TOPIC, 1), in_flight=0, stalled_s=0.0)
    stats = ConsumerStats(**{**_stats_fields(), "at": 990.0, "partitions": (stalled, idle)})
    # Snapshot 10 s old: 50 s then, 60 s now.
    h = check(life, stats, max_poll_interval_s=300, stuck_after_s=61, now=1000.0)
    assert h.ready is True
    h = check(life, stats, max_poll_interval_s=300, stuck_after_s=60, now=1000.0)
    assert (h.live, h.ready, h.stuck) == (True, False, (P0,))
    assert "t[0]" in h.reasons[-1]
    assert h.as_dict()["stuck"] == ["t[0]"]


def test_not_ready_once_no_broker_answered_for_broker_down_unready_s() -> None:
    life = _running(0.0)
    life.brokers_down(990.0)
    life.brokers_down(995.0)  # the outage goes on: it began at the first report

    def at(now: float, unready_s: float | None) -> Any:
        return check(
            life, EMPTY, max_poll_interval_s=300, stuck_after_s=60,
            broker_down_unready_s=unready_s, now=now,
        )  # fmt: skip

    h = at(1000.0, 10.5)
    assert (h.live, h.ready, h.brokers_down_s) == (True, True, 10.0)
    h = at(1000.0, 10)
    assert (h.live, h.ready) == (True, False)
    assert h.reasons == (
        "no broker has answered for 10.0 s since all were reported down (broker_down_unready_s 10)",
    )
    assert h.as_dict()["brokers_down_s"] == 10.0
    assert at(1000.0, None).ready, "None leaves readiness alone"
    assert life.broker_answered(1001.0) == 11.0
    h = at(1002.0, 10)
    assert (h.ready, h.brokers_down_s, h.as_dict()["brokers_down_s"]) == (True, None, None)


def test_a_broker_is_asked_once_a_second_only_while_all_are_down() -> None:
    life = _running(0.0)
    assert not life.broker_probe_due(1000.0)
    life.brokers_down(1000.0)
    assert not life.broker_probe_due(1000.5)
    assert life.broker_probe_due(1001.0)
    assert not life.broker_probe_due(1001.9)
    assert life.broker_probe_due(1002.0)
    life.broker_answered(1002.1)
    assert not life.broker_probe_due(1010.0)


# -- configuration ------------------------------------------------------------------------------


def test_the_new_settings_are_checked() -> None:
    base: dict[str, Any] = {"bootstrap_servers": "x:1", "group_id": "g", "topics": ["t"]}
    cfg = ConsumerConfig(**base)
    assert (cfg.stuck_after_s, cfg.watermark_refresh_s, cfg.broker_down_unready_s) == (
        60.0,
        5.0,
        10.0,
    )
    assert ConsumerConfig(**base, watermark_refresh_s=None).watermark_refresh_s is None
    assert ConsumerConfig(**base, broker_down_unready_s=None).broker_down_unready_s is None
    bads: list[dict[str, Any]] = [
        {"stuck_after_s": 0},
        {"stuck_after_s": "5"},
        {"watermark_refresh_s": 0.01},
        {"broker_down_unready_s": 0.5},  # below the once-a-second probe
        {"broker_down_unready_s": float("inf")},
    ]
    for bad in bads:
        with pytest.raises(ValidationError, match=next(iter(bad))):
            ConsumerConfig(**base, **bad)


# -- the engine ---------------------------------------------------------------------------------


def test_one_rebalance_per_assignment_not_per_callback(
    launch: Callable[..., GroupConsumer],
) -> None:
    fake = FakeConsumer()
    fake.script_assign([P0])
    gc = launch(lambda r: None, fake)
    wait_until(lambda: gc.stats().joined and gc.stats().rebalances == 1, "the first assignment")
    assert gc.health().ready
    # A revoke and the assign that follows it are one rebalance (cooperative: an empty assign).
    fake.script_revoke([P0])
    done = fake.script_assign([])
    assert done.done.wait(WAIT)
    wait_until(lambda: gc.stats().rebalances == 2, "the second rebalance")
    time.sleep(0.1)
    st = gc.stats()
    assert st.rebalances == 2 and not st.rebalancing
    assert st.rebalance_last_s is not None and st.rebalance_last_s >= 0
    assert st.rebalance_seconds >= st.rebalance_last_s
    # Lost: not joined (not ready) until the assignment that ends the rebalance.
    fake.script_lost([])
    lost = fake.script_call(lambda f: None)
    assert lost.done.wait(WAIT)
    wait_until(lambda: not gc.health().ready, "not ready once lost")
    assert "no assignment from the group yet" in gc.health().reasons
    fake.script_assign([P0])
    wait_until(lambda: gc.stats().rebalances == 3 and gc.health().ready, "joined again")


def test_readiness_follows_a_broker_outage(
    launch: Callable[..., GroupConsumer], caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: readiness stayed true through an outage of every broker (`all_brokers_down`
    logged at ERROR, the member doing nothing): now it turns false after
    `broker_down_unready_s` with no broker answering, and back at the first answer. An outage
    shorter than that leaves it alone."""
    caplog.set_level(logging.INFO, logger="weir.engine")
    fake = FakeConsumer()
    fake.script_assign([P0])
    gc = launch(lambda r: None, fake, broker_down_unready_s=2.0)
    wait_until(lambda: gc.health().ready, "ready", WAIT)
    down = KafkaException(KafkaError(KafkaError._TRANSPORT, "Connection refused"))
    all_down = KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")

    # A short outage: a broker answers the probe within a second, readiness never drops.
    fake.unreachable = down
    fake.raise_error_cb(all_down)
    wait_until(lambda: gc.health().brokers_down_s is not None, "the outage noticed", WAIT)
    fake.unreachable = None
    seen = []
    deadline = time.monotonic() + WAIT
    while gc.health().brokers_down_s is not None and time.monotonic() < deadline:
        seen.append(gc.health().ready)
        time.sleep(0.01)
    assert gc.health().brokers_down_s is None, "the broker's answer ended the outage"
    assert seen and all(seen)
    # The owner logs the answer right after it ended the outage: wait for the line.
    wait_until(lambda: len(events(caplog, "brokers_reachable")) == 1, "brokers_reachable", WAIT)

    # A long one: not ready from broker_down_unready_s on, live throughout; ready at the answer.
    fake.unreachable = down
    began = time.monotonic()
    fake.raise_error_cb(all_down)
    wait_until(lambda: not gc.health().ready, "not ready", WAIT)
    assert time.monotonic() - began >= 2.0
    h = gc.health()
    assert h.live and h.brokers_down_s is not None and h.brokers_down_s >= 2.0
    assert "no broker has answered for" in h.reasons[-1]
    fake.unreachable = None
    wait_until(lambda: gc.health().ready, "ready again", WAIT)
    # The owner logs the answer right after it made the member ready: wait for the line too.
    wait_until(lambda: len(events(caplog, "brokers_reachable")) == 2, "brokers_reachable", WAIT)
    (_, back) = events(caplog, "brokers_reachable")
    assert back["down_s"] >= 2.0
    assert gc.health().brokers_down_s is None


def test_handler_latency_counts_every_record_and_end_to_end_is_sampled(
    launch: Callable[..., GroupConsumer],
) -> None:
    fake = FakeConsumer()
    old = int((time.time() - 120) * 1000)
    for i in range(20):
        fake.produce(TOPIC, 0, b"v%d" % i, timestamp=old)
    fake.script_assign([P0])
    gc = launch(lambda r: time.sleep(0.002), fake, ordering="unordered")
    wait_until(lambda: gc.stats().processed == 20, "20 processed")
    wait_until(lambda: gc.stats().handler_latency.count == 20, "20 latencies")
    st = gc.stats()
    h = st.handler_latency
    assert h.sum >= 20 * 0.002
    assert h.p50 is not None and 0.001 < h.p50 < 0.02
    e2e = st.end_to_end_latency
    assert 1 <= e2e.count <= 20  # the first record of each task
    assert e2e.sum / e2e.count >= 120
    p = st.partitions[0]
    assert p.recovery_s is not None and 0 < p.recovery_s < WAIT
    assert p.assigned_time <= time.time()
    assert p.oldest_age_s is None and p.oldest_fetched_s is None  # nothing unfinished
    assert st.rate > 0


def test_a_held_record_ages_stalls_the_watermark_and_makes_the_member_not_ready(
    launch: Callable[..., GroupConsumer],
) -> None:
    fake = FakeConsumer()
    stamp = int((time.time() - 60) * 1000)
    for i in range(5):
        fake.produce(TOPIC, 0, b"v%d" % i, timestamp=stamp)
    fake.script_assign([P0])
    release = threading.Event()

    def handle(r: Record) -> None:
        if r.offset == 2:
            assert release.wait(30)

    gc = launch(handle, fake, ordering="partition", stuck_after_s=0.5, commit_interval_s=0.05)
    wait_until(lambda: gc.stats().processed == 2, "offsets 0 and 1")
    first = gc.stats().partitions[0]
    assert first.committable == 2 and first.in_flight == 3
    wait_until(lambda: not gc.health().ready, "not ready: stuck")
    h = gc.health()
    assert h.live and h.stuck == (P0,)
    later = gc.stats().partitions[0]
    assert later.stalled_s >= 0.4
    assert first.oldest_fetched_s is not None and later.oldest_fetched_s is not None
    assert later.oldest_fetched_s > first.oldest_fetched_s
    assert later.oldest_age_s is not None and later.oldest_age_s >= 60
    release.set()
    wait_until(lambda: gc.stats().processed == 5, "all 5")
    wait_until(lambda: gc.health().ready, "ready again")
    assert gc.stats().partitions[0].stalled_s == 0.0


def test_health_after_stop_and_after_a_failure(launch: Callable[..., GroupConsumer]) -> None:
    fake = FakeConsumer()
    fake.script_assign([P0])
    gc = launch(lambda r: None, fake)
    wait_until(lambda: gc.health().ready, "ready")
    gc.stop()
    gc.join(WAIT)
    h = gc.health()
    assert (h.live, h.ready, h.state) == (False, False, "stopped")
    assert gc.state is State.STOPPED

    fake = FakeConsumer()
    fake.produce(TOPIC, 0, b"x")
    fake.script_assign([P0])

    def fail(r: Record) -> None:
        raise ValueError("bad record")

    gc = launch(fail, fake)
    wait_until(lambda: gc.state is State.FAILED, "failed")
    h = gc.health()
    assert (h.live, h.ready) == (False, False)
    assert "bad record" in h.reasons[0]


class _ReportedWorkers:
    """Runs each task on a thread of its own and, for a long task, waits until the owner has
    read every record as progress before handing it back: the race the thread pool wins now
    and then (the last record's count is stored just before the task goes back)."""

    concurrent = False

    def __init__(self) -> None:
        self._done: queue.SimpleQueue[Task] = queue.SimpleQueue()
        self.fully_reported = 0

    @property
    def completions(self) -> queue.SimpleQueue[Task]:
        return self._done

    @property
    def slots(self) -> int:
        return 1

    @property
    def replaced(self) -> int:
        return 0

    def start(self) -> None:
        pass

    def submit(self, task: Task) -> None:
        threading.Thread(target=self._run, args=(task,), daemon=True).start()

    def _run(self, task: Task) -> None:
        task.started = time.perf_counter() - 1.0  # long running: the owner reads its progress
        task.finished = len(task.records)
        deadline = time.monotonic() + WAIT
        while task.report and task.reported < len(task.records):
            if time.monotonic() > deadline:
                break
            time.sleep(0.001)
        if task.report and task.reported == len(task.records):
            self.fully_reported += 1
        task.seconds = 0.001 * len(task.records)
        self._done.put(task)

    def abandon(self, assignments: Collection[Assignment]) -> int:
        return 0

    def stop(self, timeout: float) -> bool:
        return True


def test_a_long_task_settled_entirely_as_progress_completes_cleanly() -> None:
    fake = FakeConsumer()
    now_ms = int(time.time() * 1000)
    for i in range(5):
        fake.produce(TOPIC, 0, b"v%d" % i, timestamp=now_ms)
    fake.script_assign([P0])
    workers = _ReportedWorkers()
    life = Lifecycle()
    life.begin()
    config = ConsumerConfig(**{**SETTINGS, "ordering": "partition"})
    engine = Engine(config, as_handler(lambda r: None), fake.factory, life, workers=workers)
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: life.stats.processed == 5 or life.failure, "5 processed")
        assert life.failure is None, repr(life.failure)
        # The worker counts it once it sees the owner's reports (after the owner published).
        wait_until(lambda: workers.fully_reported >= 1, "a task settled entirely as progress")
        wait_until(lambda: life.stats.handler_latency.count == 5, "their handler latency")
        assert life.stats.end_to_end_latency.count >= 1
    finally:
        life.request_stop()
        thread.join(WAIT)
    assert life.failure is None, repr(life.failure)


# -- the high-watermark refresher -----------------------------------------------------------------


class _Offsets:
    """An `OffsetsClient` that answers from a dict, or fails while `fail` is set."""

    def __init__(self) -> None:
        self.high: dict[tuple[str, int], int] = {}
        self.fail: KafkaException | None = None
        self.asked: list[list[tuple[str, int, int]]] = []
        self.closed = False
        self.polls = 0

    def offsets_for_times(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        self.asked.append([(p.topic, p.partition, p.offset) for p in partitions])
        if self.fail is not None:
            raise self.fail
        return [
            TopicPartition(p.topic, p.partition, self.high.get((p.topic, p.partition), -1))
            for p in partitions
        ]

    def poll(self, timeout: float = -1) -> None:
        self.polls += 1

    def close(self) -> None:
        self.closed = True


def test_the_refresher_reads_the_latest_offsets_and_keeps_them_through_failures() -> None:
    client = _Offsets()
    confs: list[dict[str, Any]] = []

    def factory(conf: dict[str, Any]) -> _Offsets:
        confs.append(conf)
        return client

    p1 = Partition(TOPIC, 1)
    refresher = WatermarkRefresher(
        {"bootstrap.servers": "x:1", "group.id": "g", "group.instance.id": "static-1"},
        0.1,
        factory,
    )
    client.high = {(TOPIC, 0): 40, (TOPIC, 1): 7}
    try:
        refresher.track([P0, p1])
        wait_until(lambda: refresher.high() == {P0: 40, p1: 7}, "the first refresh")
        # Asked for the latest offset (-1) of each, on a client of its own: read_uncommitted,
        # without the static member id.
        assert client.asked[0] == [(TOPIC, 0, -1), (TOPIC, 1, -1)]
        assert confs[0]["isolation.level"] == "read_uncommitted"
        assert "group.instance.id" not in confs[0]
        client.fail = KafkaException(KafkaError(KafkaError._TIMED_OUT))
        client.high[(TOPIC, 0)] = 50
        wait_until(lambda: refresher.failures >= 2, "failed rounds")
        assert refresher.high() == {P0: 40, p1: 7}  # the last values stay
        client.fail = None
        refresher.track([P0])  # p1 revoked: no longer asked for, nor reported
        wait_until(lambda: refresher.high() == {P0: 50}, "the refresh after the failures")
        assert client.asked[-1] == [(TOPIC, 0, -1)]
    finally:
        refresher.stop()
    assert client.closed and len(confs) == 1
    assert client.polls >= len(client.asked)  # its queue (log lines, errors) is served


def test_commits_by_record_count_get_a_snapshot_per_half_interval_not_each(
    launch: Callable[..., GroupConsumer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot costs time in proportion to the partitions owned: a commit after every few
    records (tens a second at no-op rates) must not build one each. Stats still follow: the
    last commit shows in the snapshot taken at the next half interval."""
    from weir._engine.snapshot import Snapshot

    taken = itertools.count()
    take = Snapshot.take

    def counted(self: Snapshot, *, running: bool, now: float) -> ConsumerStats:
        next(taken)
        return take(self, running=running, now=now)

    monkeypatch.setattr(Snapshot, "take", counted)
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(400))
    fake.script_assign([(TOPIC, 0)])
    fake.fetch_chunk = 1  # one record a turn: a commit due after every second one
    gc = launch(lambda r: time.sleep(0.002), fake, commit_every_records=2, commit_interval_s=30.0)
    wait_until(lambda: gc.stats().processed == 400, "all handled in the stats", WAIT)
    commits = len(fake.commits_for((TOPIC, 0)))
    assert commits >= 20, commits
    built = next(taken)
    assert built < commits / 4, f"{built} snapshots for {commits} commits"
