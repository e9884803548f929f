"""The stall watchdog (`weir._engine.stalls`) on the fake, the engine's clock in the test's hands.

A partition weir fetches that delivers nothing for `partition_stall_s` while the broker has
records past its position is reported (`partition_stalled`, stats, `health()`) and sought once
to where it reads next. Here a partition is made silent by a pause weir never asked for (the
client paused behind its back), or by a client that never started it (its seek refused); and
the partitions that must not count as stalled are checked: held by weir for any reason,
throttled, with all their records in flight, at the log end, or while the loop was away.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any, get_args

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from weir import FlowConfig, Record
from weir._engine.engine import Engine
from weir._engine.lifecycle import Lifecycle
from weir.config import ConsumerConfig
from weir.health import Health, check
from weir.records import Partition, as_handler
from weir.stats import ConsumerStats, PartitionStats, PauseReason
from weir.testing import FakeConsumer
from weir.testing.clock import ManualClock
from weir.testing.events import capture_events

TOPIC = "t"
P0, P1 = (TOPIC, 0), (TOPIC, 1)
STALL_S = 30.0
# The watchdog looks every min(1 s, partition_stall_s / 4): a stall is found within this much
# more of engine time, turned a second at a time.
CHECKED = 10
WAIT = 10.0

SETTINGS: dict[str, Any] = {
    "bootstrap_servers": "fake:9092",
    "group_id": "g",
    "topics": [TOPIC],
    "poll_timeout_s": 0.01,
    "commit_interval_s": 1.0,
    "startup_timeout_s": 1.0,
    "shutdown_timeout_s": 2.0,
    "revoke_timeout_s": 2.0,
    "workers": 2,
    "ordering": "partition",
    "partition_stall_s": STALL_S,
}


class Stubborn(FakeConsumer):
    """A client that keeps partitions paused whatever weir resumes (`stuck`), and refuses to
    seek partitions it never started (`unstarted`), as librdkafka does (`_STATE`)."""

    def __init__(self) -> None:
        super().__init__()
        self.stuck: set[tuple[str, int]] = set()
        self.unstarted: set[tuple[str, int]] = set()
        self.blind = False  # no fetch response seen: cached watermarks unknown
        self.asked: list[list[tuple[str, int]]] = []

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        if cached and self.blind:
            return (-1001, -1001)
        return super().get_watermark_offsets(partition, timeout, cached)

    def offsets_for_times(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        self.asked.append([(p.topic, p.partition) for p in partitions])
        return super().offsets_for_times(partitions, timeout)

    def resume(self, partitions: list[TopicPartition]) -> None:
        super().resume([p for p in partitions if (p.topic, p.partition) not in self.stuck])

    def seek(self, partition: TopicPartition) -> None:
        if (partition.topic, partition.partition) in self.unstarted:
            raise KafkaException(
                KafkaError(
                    KafkaError._STATE,
                    f"Failed to seek to offset {partition.offset}: Local: Erroneous state",
                )
            )
        super().seek(partition)

    def silence(self, tp: tuple[str, int]) -> None:
        """Paused behind weir's back, and kept so."""
        with self._lock:
            self.paused.add(tp)
            self.stuck.add(tp)

    def release(self, tp: tuple[str, int]) -> None:
        with self._cond:
            self.stuck.discard(tp)
            self.paused.discard(tp)
            self._cond.notify_all()


class Member:
    """One engine on the test's thread, turned by hand: the clock moves only when the test says
    so; handlers run on real worker threads."""

    def __init__(self, fake: FakeConsumer, **settings: Any) -> None:
        self.fake = fake
        self.clock = ManualClock()
        self.lock = threading.Lock()
        self.handled: dict[tuple[str, int], list[int]] = {}
        self.gate = threading.Event()
        self.gate.set()
        self.life = Lifecycle()
        self.life.begin()
        self.config = ConsumerConfig(**{**SETTINGS, **settings})
        self.engine = Engine(
            self.config, as_handler(self._handle), fake.factory, self.life, clock=self.clock
        )
        self.engine.start()

    def _handle(self, record: Record) -> None:
        self.gate.wait(WAIT)
        with self.lock:
            self.handled.setdefault((record.topic, record.partition), []).append(record.offset)

    def offsets(self, tp: tuple[str, int]) -> list[int]:
        with self.lock:
            return list(self.handled.get(tp, []))

    def turn(self, seconds: float = 0.0) -> None:
        self.clock.advance(seconds)
        self.engine.step()
        assert self.life.failure is None, repr(self.life.failure)

    def run_for(self, seconds: float, every: float = 1.0) -> None:
        """`seconds` of engine time, one turn every `every` seconds of it."""
        for _ in range(round(seconds / every)):
            self.turn(every)

    def until(self, cond: Any, what: str) -> None:
        """Turns (no engine time passing) until `cond()`, in real time at most WAIT."""
        deadline = time.monotonic() + WAIT
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            self.turn()
            time.sleep(0.001)

    def stats(self) -> ConsumerStats:
        self.engine._publish(running=True)
        return self.life.stats

    def part(self, tp: tuple[str, int]) -> PartitionStats:
        return next(p for p in self.stats().partitions if p.tp == Partition(*tp))

    def health(self) -> Health:
        stats = self.stats()
        return check(
            self.life,
            stats,
            max_poll_interval_s=self.config.max_poll_interval_s,
            stuck_after_s=self.config.stuck_after_s,
            now=self.clock.now,
        )

    def seeks(self, tp: tuple[str, int]) -> list[int]:
        return [off for p, off in self.fake.seeks if p == tp]

    def close(self) -> None:
        self.gate.set()
        self.engine.shutdown()
        self.life.end()


@contextlib.contextmanager
def member(fake: FakeConsumer, **settings: Any) -> Iterator[Member]:
    m = Member(fake, **settings)
    try:
        yield m
    finally:
        m.close()


def started(fake: FakeConsumer, records: int = 10) -> None:
    """Two partitions with `records` records each, committed at 0, assigned."""
    for tp in (P0, P1):
        fake.produce_many(*tp, range(records))
    fake.given_committed({P0: 0, P1: 0})
    fake.script_assign([P0, P1])


def stalled_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == "partition_stalled"]


def test_a_silent_partition_with_records_to_read_is_sought_once_and_delivers_them() -> None:
    """P0 is paused behind weir's back (a pause weir never asked for) with records on the
    broker: after `partition_stall_s` without a record it is logged, resumed and sought to
    where it reads next, and its records come, each once. P1 keeps delivering meanwhile."""
    fake = Stubborn()
    started(fake)
    with capture_events() as events, member(fake) as m:
        m.until(lambda: len(m.offsets(P0)) == len(m.offsets(P1)) == 10, "the first records")
        with fake._lock:
            fake.paused.add(P0)  # once: weir's resume would undo it
        fake.produce_many(*P0, range(10, 20))
        fake.produce_many(*P1, range(10, 20))
        m.run_for(STALL_S - 1)
        assert m.offsets(P1) == list(range(20)), "the other partition is not held up"
        assert m.offsets(P0) == list(range(10))
        assert stalled_events(events) == []
        m.run_for(CHECKED)
        (ev,) = stalled_events(events)
        assert ev["tp"] == "t[0]" and ev["position"] == 10 and ev["log_end"] == 20
        assert ev["recovery"] == "seek" and ev["silent_s"] >= STALL_S
        assert ev["log_level"] == "warning" and ev["logger"] == "weir.stalls"
        assert m.seeks(P0) == [10]
        m.until(lambda: len(m.offsets(P0)) == 20, "P0's records after the seek")
        assert m.offsets(P0) == list(range(20)), "nothing skipped, nothing read twice"
        m.turn(1)
        ended = [e for e in events if e["event"] == "partition_stall_ended"]
        assert [e["tp"] for e in ended] == ["t[0]"]
        assert m.stats().partition_stall_recoveries == 1
        assert m.part(P0).silent_s is None


def test_a_partition_still_silent_after_its_recovery_stays_reported_and_is_sought_once() -> None:
    """The client keeps P0 paused whatever weir does: it is sought once, then reported stalled
    in stats and health (not ready) for as long as it is silent, and never sought again; once
    it delivers, it is no longer reported and the member is ready again."""
    fake = Stubborn()
    started(fake)
    with member(fake) as m:
        m.until(lambda: len(m.offsets(P0)) == 10, "the first records")
        fake.silence(P0)
        fake.produce_many(*P0, range(10, 20))
        m.run_for(STALL_S + CHECKED)
        assert m.seeks(P0) == [10]
        m.run_for(5 * STALL_S)
        assert m.seeks(P0) == [10], "sought once per stall"
        part = m.part(P0)
        assert part.silent_s is not None and part.silent_s >= 6 * STALL_S - 1
        assert m.stats().stalled_partitions == (Partition(*P0),)
        assert m.stats().partition_stall_recoveries == 1
        health = m.health()
        assert not health.ready and health.live
        assert health.stalled == (Partition(*P0),)
        assert any("partition_stall_s" in r for r in health.reasons), health.reasons
        assert health.as_dict()["stalled"] == ["t[0]"]
        fake.release(P0)
        m.until(lambda: len(m.offsets(P0)) == 20, "P0's records once the client lets go")
        m.turn(1)
        assert m.part(P0).silent_s is None
        assert m.health().ready, m.health().reasons


REASONS: tuple[PauseReason, ...] = get_args(PauseReason)


@pytest.mark.parametrize("reason", REASONS)
def test_a_partition_weir_holds_is_not_stalled(reason: PauseReason) -> None:
    """Held by weir for any `FetchControl` reason, a partition delivers nothing on purpose:
    however long, and with records waiting, it is never reported nor sought."""
    fake = Stubborn()
    started(fake)
    with capture_events() as events, member(fake) as m:
        m.until(lambda: len(m.offsets(P0)) == 10, "the first records")
        seeks = m.seeks(P0)
        m.engine.fetch.hold([Partition(*P0)], reason)
        fake.produce_many(*P0, range(10, 20))
        m.run_for(4 * STALL_S, every=5.0)
        assert stalled_events(events) == []
        assert m.seeks(P0) == seeks
        assert m.part(P0).silent_s is None
        assert m.offsets(P0) == list(range(10))


def test_a_partition_whose_records_are_all_in_flight_or_idle_is_not_stalled() -> None:
    """P0's records are all delivered and its handler is stuck on them; P1 is at the log end.
    Neither has anything to fetch: no stall however long."""
    fake = Stubborn()
    started(fake)
    with capture_events() as events, member(fake) as m:
        m.until(lambda: len(m.offsets(P1)) == 10, "P1's records")
        m.gate.clear()
        fake.produce_many(*P0, range(10, 15))
        m.until(
            lambda: m.engine.own.partitions[Partition(*P0)].progress.read_position == 15,
            "P0's new records delivered",
        )
        m.run_for(4 * STALL_S, every=5.0)
        assert stalled_events(events) == []
        assert m.part(P0).in_flight > 0
        m.gate.set()


def test_an_idle_partition_is_asked_for_its_log_end_and_not_stalled() -> None:
    """The client does not know the log end (librdkafka before a fetch response): a partition
    silent for `partition_stall_s` has its log end asked for, at most once per that time, and
    one at its log end is idle."""
    fake = Stubborn()
    started(fake)
    with capture_events() as events, member(fake) as m:
        m.until(lambda: len(m.offsets(P0)) == len(m.offsets(P1)) == 10, "the records")
        fake.blind = True
        m.run_for(4 * STALL_S, every=5.0)
        assert stalled_events(events) == []
        assert 3 <= len(fake.asked) <= 4, fake.asked
        assert all(sorted(asked) == [P0, P1] for asked in fake.asked), fake.asked


def test_a_throttled_member_has_no_stalled_partition() -> None:
    """At the high mark polls take at most one record: partitions may go without one for a
    long time. While throttled nothing is stalled; once the throttle lifts, silence counts
    again from then."""
    fake = Stubborn()
    fake.produce_many(*P1, range(10))
    fake.given_committed({P0: 0, P1: 0})
    fake.script_assign([P0, P1])
    flow = FlowConfig(capacity_records=20, pause_records=5, resume_records=2, read_ahead_records=0)
    with capture_events() as events, member(fake, flow=flow, ordering="unordered") as m:
        m.gate.clear()  # P1's records stay in flight: the budget throttles
        m.until(lambda: m.engine.budget.throttled, "the throttle")
        fake.silence(P0)
        fake.produce_many(*P0, range(10))
        m.run_for(4 * STALL_S, every=5.0)
        assert m.engine.budget.throttled
        assert stalled_events(events) == []
        m.gate.set()
        m.until(lambda: not m.engine.budget.throttled, "the throttle lifted")
        # Silence counts from the watchdog's last look while throttled: at most 10 s ago.
        m.run_for(STALL_S - 10, every=5.0)
        assert stalled_events(events) == []
        m.run_for(20, every=5.0)
        assert [e["tp"] for e in stalled_events(events)] == ["t[0]"]


def test_time_the_loop_spent_elsewhere_is_no_silence() -> None:
    """The owner loop was away (a rebalance callback blocked) for longer than
    `partition_stall_s`: the partitions were not watched meanwhile, and silence counts from
    its return."""
    fake = Stubborn()
    started(fake)
    with capture_events() as events, member(fake) as m:
        m.until(lambda: len(m.offsets(P0)) == 10, "the first records")
        fake.silence(P0)
        fake.produce_many(*P0, range(10, 20))
        m.turn(1)
        m.turn(STALL_S + 10)
        m.turn(1)
        assert stalled_events(events) == []
        m.run_for(STALL_S - 2)
        assert stalled_events(events) == []
        m.run_for(CHECKED)
        assert [e["tp"] for e in stalled_events(events)] == ["t[0]"]


def test_no_watchdog_with_partition_stall_s_none() -> None:
    fake = Stubborn()
    started(fake)
    with capture_events() as events, member(fake, partition_stall_s=None) as m:
        m.until(lambda: len(m.offsets(P0)) == 10, "the first records")
        fake.silence(P0)
        fake.produce_many(*P0, range(10, 20))
        m.run_for(4 * STALL_S, every=5.0)
        assert stalled_events(events) == []
        assert m.seeks(P0) == []
        assert m.stats().partition_stall_recoveries == 0


def test_an_eager_reassign_keeps_a_waiting_partition_at_an_absolute_placeholder() -> None:
    """Stating an eager assignment again (a stall recovery) put a partition whose start still
    waits at OFFSET_END. librdkafka looks a logical offset up, and a reply outdated by weir's
    later seek re-arms the lookup and undoes that seek: the partition jumps to the log end
    (`weir._engine.starts`). It is stated at the absolute placeholder `Starts.assign` used."""
    fake = Stubborn()
    p2 = (TOPIC, 2)
    for tp in (P0, P1, p2):
        fake.produce_many(*tp, range(10))
    fake.given_committed({P0: 0, P1: 0})  # p2: nothing committed, its start commit held
    fake.hold_commit_results = True
    fake.script_assign([P0, P1, p2])
    with capture_events() as events, member(fake, assignment_strategy="range") as m:
        try:
            m.until(lambda: len(m.offsets(P0)) == len(m.offsets(P1)) == 10, "the first records")
            assert m.part(p2).pause_reason == "start_committing"
            with fake._lock:
                fake.paused.add(P0)
            fake.unstarted.add(P0)
            fake.produce_many(*P0, range(10, 20))
            m.run_for(STALL_S + CHECKED)
            (ev,) = stalled_events(events)
            assert ev["recovery"] == "assign"
            last = fake.assigned_at[-1]
            assert last[P0] == 10 and last[P1] == 10
            assert last[p2] >= 0, f"{p2} stated at the logical offset {last[p2]}"
            assert m.part(p2).paused
        finally:
            fake.hold_commit_results = False  # the final commit is answered: the member stops


@pytest.mark.parametrize("strategy", ["cooperative-sticky", "range"])
def test_a_partition_the_client_never_started_is_assigned_again(strategy: str) -> None:
    """The client refuses to seek a partition it never started (librdkafka: `_STATE`): it is
    assigned again at where it reads next. Alone under cooperative-sticky; under an eager
    protocol the whole assignment is stated again, every partition at its position: nothing
    skipped or read twice on either."""
    fake = Stubborn()
    started(fake)
    with capture_events() as events, member(fake, assignment_strategy=strategy) as m:
        m.until(lambda: len(m.offsets(P0)) == len(m.offsets(P1)) == 10, "the first records")
        with fake._lock:
            fake.paused.add(P0)
        fake.unstarted.add(P0)
        fake.produce_many(*P0, range(10, 20))
        fake.produce_many(*P1, range(10, 15))
        m.run_for(STALL_S + CHECKED)
        (ev,) = stalled_events(events)
        assert ev["recovery"] == "assign"
        fake.produce_many(*P1, range(15, 20))
        m.until(lambda: len(m.offsets(P0)) == len(m.offsets(P1)) == 20, "every record")
        assert m.offsets(P0) == list(range(20))
        assert m.offsets(P1) == list(range(20))
        last = fake.assigned_at[-1]
        if strategy == "range":
            assert last == {P0: 10, P1: 15}
            assert [c for c, _ in fake.calls].count("assign") == 2
        else:
            assert last == {P0: 10}
            assert ("incremental_unassign", [P0]) in fake.calls
        assert m.stats().partition_stall_recoveries == 1
