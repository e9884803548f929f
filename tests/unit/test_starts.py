"""Where a new partition starts (`weir._engine.starts`), on the fake: every partition at an explicit
offset, the reset position of a partition with nothing committed committed before its first
record, and committed offsets that could not be read read again from the loop."""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from pydantic import ValidationError
from tests.fake_members import started
from tests.waiting import wait_until

from weir import ConsumerConfig, GroupConsumer, Record
from weir.config import ConsumerSettings
from weir.testing import FakeBroker, FakeConsumer

TOPIC = "t"
P0 = (TOPIC, 0)
WAIT = 10.0

SETTINGS: ConsumerSettings = {
    "bootstrap_servers": "fake:9092",
    "group_id": "g",
    "topics": [TOPIC],
    "poll_timeout_s": 0.01,
    "commit_interval_s": 60.0,
    "commit_every_records": 1_000_000,
    "startup_timeout_s": 1.0,
    "shutdown_timeout_s": 2.0,
    "workers": 2,
    "ordering": "partition",
}


class Handled:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.offsets: list[int] = []
        self.first_at: float | None = None

    def __call__(self, record: Record) -> None:
        with self.lock:
            if self.first_at is None:
                self.first_at = time.monotonic()
            self.offsets.append(record.offset)


def run(
    members: list[GroupConsumer], fake: FakeConsumer, handler: Handled, **settings: Any
) -> GroupConsumer:
    return started(members, fake, handler, SETTINGS, WAIT, **settings)


def pause_reason(gc: GroupConsumer) -> object:
    parts = gc.stats().partitions
    return parts[0].pause_reason if parts else "unassigned"


@pytest.mark.parametrize(("reset", "start"), [("latest", 50), ("earliest", 0)])
def test_the_reset_position_is_committed_before_the_first_record(
    members: list[GroupConsumer], reset: str, start: int
) -> None:
    """Nothing committed: weir resolves auto_offset_reset itself and commits that position at
    once. While the broker has not confirmed it, the partition stays paused and no record is
    handed out; once confirmed, the partition starts exactly there."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(50))
    fake.script_assign([P0])
    fake.hold_commit_results = True
    handled = Handled()
    gc = run(members, fake, handled, auto_offset_reset=reset)
    wait_until(lambda: bool(fake.commit_log()), "the start commit")
    (first,) = fake.commit_log()
    assert first.offsets == {P0: start} and first.asynchronous
    fake.produce_many(TOPIC, 0, range(50, 60))
    wait_until(lambda: pause_reason(gc) == "start_committing", "the stats to say why")
    time.sleep(0.3)
    assert handled.offsets == [], "nothing runs before the start is confirmed"
    assert P0 in fake.paused
    fake.deliver_commit_results([(first.seq, None)])
    fake.hold_commit_results = False
    wait_until(lambda: len(handled.offsets) == 60 - start, "the records from the start on")
    assert handled.offsets == list(range(start, 60))


def test_a_start_commit_that_fails_is_sent_again_and_nothing_runs_meanwhile(
    members: list[GroupConsumer],
) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(5))
    fake.script_assign([P0])
    fake.fail_next_commits(count=2)
    handled = Handled()
    run(members, fake, handled, auto_offset_reset="latest")
    wait_until(lambda: len(fake.commit_log()) >= 3, "the start commit sent three times")
    fake.produce_many(TOPIC, 0, range(5, 8))
    wait_until(lambda: len(handled.offsets) == 3, "the records after the start")
    assert handled.offsets == [5, 6, 7]
    assert [c.offsets for c in fake.commit_log()[:3]] == [{P0: 5}] * 3


def test_a_committed_offset_is_assigned_explicitly_with_no_start_commit(
    members: list[GroupConsumer],
) -> None:
    """A committed offset is where the partition is assigned, in the assign call itself (never
    librdkafka's own fetch), and nothing is committed for it at the start."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(10))
    fake.given_committed({P0: 4})
    fake.script_assign([P0])
    handled = Handled()
    run(members, fake, handled, auto_offset_reset="latest")
    wait_until(lambda: len(handled.offsets) == 6, "offsets 4-9")
    assert handled.offsets == list(range(4, 10))
    assert fake.assigned_at == [{P0: 4}], "assigned at the offset weir read, not -1001"
    assert fake.commit_log() == []


@pytest.mark.parametrize("reset", ["earliest", "latest"])
def test_the_placeholder_is_the_log_start_so_a_fetch_before_the_pause_is_in_range(
    members: list[GroupConsumer], reset: str
) -> None:
    """A partition whose start waits is paused only after the assign (librdkafka ignores a pause
    before it), so the client may fetch its placeholder first. Below the log's start (here
    offsets 0-4 are gone) that fetch is out of range, and librdkafka resets it by
    auto.offset.reset: a logical lookup, the race the absolute placeholder avoids. So it is the
    log start, read in the callback."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(5, 10))
    fake.script_assign([P0])
    handled = Handled()
    run(members, fake, handled, auto_offset_reset=reset)
    if reset == "earliest":
        wait_until(lambda: len(handled.offsets) == 5, "offsets 5-9")
    else:
        wait_until(lambda: fake.commits_for(P0), "the start committed")
    assert fake.assigned_at[0] == {P0: 5}, "placed below the log start, or at a logical offset"


@pytest.mark.parametrize("committed", ["nothing", "unreadable"])
def test_an_unsettled_start_is_assigned_at_an_absolute_placeholder_and_paused(
    members: list[GroupConsumer], committed: str
) -> None:
    """Regression (1,000 partitions in key mode crawling, one run in three): a partition whose
    start is not settled in the assign callback was assigned at OFFSET_END and paused after.
    librdkafka looks a logical offset up at once; the pause (and later weir's seek) made that
    reply outdated, and an outdated reply re-arms the lookup 500 ms later in whatever state the
    partition is by then: weir's seek to the start was undone, the partition jumped to the log
    end and its records never came. Now it is assigned at an absolute offset: nothing for
    librdkafka to look up; and held (paused) from the assign on."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(10))
    if committed == "unreadable":
        fake.given_committed({P0: 7})
        fake.committed = Flaky(fake, failures=3)  # type: ignore[assignment]
    fake.script_assign([P0])
    handled = Handled()
    start = 7 if committed == "unreadable" else 0
    run(members, fake, handled, auto_offset_reset="earliest")
    wait_until(lambda: len(handled.offsets) == 10 - start, "every record from the start")
    assert handled.offsets == list(range(start, 10))
    (at,) = fake.assigned_at
    assert at[P0] >= 0, f"assigned at the logical offset {at[P0]}: librdkafka looks it up"
    calls = fake.call_names()
    assign = next(i for i, name in enumerate(calls) if name.endswith("assign"))
    paused = [tps for name, tps in fake.calls[assign:] if name == "pause"]
    assert any(P0 in tps for tps in paused), f"not paused after the assign: {calls}"


class Flaky:
    """`committed()` that fails (a coordinator that moved) the first `failures` times."""

    def __init__(self, fake: FakeConsumer, failures: int) -> None:
        self.real = fake.committed
        self.failures = failures
        self.calls = 0

    def __call__(self, partitions: list[TopicPartition], timeout: float = -1) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaException(
                KafkaError(KafkaError.NOT_COORDINATOR, "Failed to get committed offsets")
            )
        return self.real(partitions, timeout)


def test_committed_offsets_that_cannot_be_read_are_read_again_from_the_loop(
    members: list[GroupConsumer],
) -> None:
    """librdkafka never retries an OffsetFetch that met NOT_COORDINATOR, and the partition stays
    assigned and silent. weir reads the offsets itself: the partition waits paused and is read
    again (every 0.5 s) until it can start at its committed offset."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(10))
    fake.given_committed({P0: 7})
    flaky = Flaky(fake, failures=3)
    fake.committed = flaky  # type: ignore[assignment]
    fake.script_assign([P0])
    handled = Handled()
    gc = run(members, fake, handled)
    wait_until(lambda: pause_reason(gc) == "start_offset_unknown", "the stats to say why")
    wait_until(lambda: len(handled.offsets) == 3, "offsets 7-9", timeout=WAIT)
    assert handled.offsets == [7, 8, 9]
    assert flaky.calls >= 4


def test_a_member_that_dies_before_its_first_commit_leaves_its_start_committed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression (issue 23.2): member A joins a new group at the log end (`latest`), is handed
    100 records, handles 28 and goes (here: its session expires, so it commits nothing more)
    before its first commit. Member B used to find nothing committed, reset to `latest` again
    and skip the other 72. Now A committed where it started, and B starts there."""
    broker = FakeBroker()
    broker.create_topic(TOPIC, 1)
    for i in range(50):
        broker.produce(TOPIC, value=f"old-{i}", partition=0)
    settings: ConsumerSettings = {**SETTINGS, "auto_offset_reset": "latest"}
    gate = threading.Event()
    a_handled = Handled()

    def a_handle(record: Record) -> None:
        if len(a_handled.offsets) >= 28:
            gate.wait(WAIT)
            return
        a_handled(record)

    a = GroupConsumer(a_handle, consumer_factory=broker.consumer_factory, **settings)
    b_handled = Handled()
    b = GroupConsumer(b_handled, consumer_factory=broker.consumer_factory, **settings)
    a.start()
    try:
        wait_until(
            lambda: any(p.paused is False for p in a.stats().partitions), "A to start fetching"
        )
        for i in range(100):
            broker.produce(TOPIC, value=f"new-{i}", partition=0)
        wait_until(lambda: len(a_handled.offsets) == 28, "A's 28 records")
        # A is gone without another commit. A dead process does not rejoin: the fake's expired
        # member would on its next consume(), and one partition in two members is then A's
        # about one time in five.
        gone = broker.consumers[0]

        def dead(*args: object, **kwargs: object) -> list[object]:
            time.sleep(0.01)
            return []

        monkeypatch.setattr(gone, "consume", dead)
        broker.expire(gone)
        b.start()
        # A wait, not a speed check: a rebalance of the fake on a loaded machine.
        wait_until(lambda: len(b_handled.offsets) >= 100, "B's records", timeout=30.0)
        assert b_handled.offsets[:100] == list(range(50, 150))
    finally:
        gate.set()
        for gc in (a, b):
            gc.stop()
        for gc in (a, b):
            with contextlib.suppress(Exception):
                gc.join(WAIT)
    assert a_handled.offsets == list(range(50, 78))


BASE = datetime(2026, 1, 1, tzinfo=timezone.utc)


def stamped(fake: FakeConsumer, n: int) -> None:
    """Records 0..n-1 of partition 0, one a second from BASE on."""
    ms = int(BASE.timestamp() * 1000)
    for i in range(n):
        fake.produce(TOPIC, 0, b"v", offset=i, timestamp=ms + i * 1000)


@pytest.mark.parametrize(
    ("start_at", "start"),
    [
        (BASE + timedelta(seconds=4), 4),
        (BASE + timedelta(seconds=3, milliseconds=1), 4),
        (BASE - timedelta(days=1), 0),
        (BASE + timedelta(days=1), 10),  # past the log end: the end
    ],
)
def test_start_at_is_where_a_partition_with_nothing_committed_starts(
    members: list[GroupConsumer], start_at: datetime, start: int
) -> None:
    """With nothing committed, the first record at or after `start_at` (auto_offset_reset
    says otherwise: latest) is the start, committed before the first record like a reset."""
    fake = FakeConsumer()
    stamped(fake, 10)
    fake.script_assign([P0])
    handled = Handled()
    run(members, fake, handled, auto_offset_reset="latest", start_at=start_at)
    wait_until(lambda: bool(fake.commit_log()), "the start commit")
    assert fake.commit_log()[0].offsets == {P0: start}
    fake.produce(TOPIC, 0, b"v", offset=10)
    wait_until(lambda: 10 in handled.offsets, "the records from the start on")
    assert handled.offsets == list(range(start, 11))


def test_a_committed_offset_wins_over_start_at(members: list[GroupConsumer]) -> None:
    fake = FakeConsumer()
    stamped(fake, 10)
    fake.given_committed({P0: 2})
    fake.script_assign([P0])
    handled = Handled()
    run(members, fake, handled, start_at=BASE + timedelta(seconds=7))
    wait_until(lambda: len(handled.offsets) == 8, "offsets 2-9")
    assert handled.offsets == list(range(2, 10))
    assert fake.commit_log() == []


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"start_at": datetime(2026, 1, 1)}, "start_at must be timezone-aware, got the naive"),
        ({"start_at": "2026-01-01T00:00:00Z"}, "Input should be a valid datetime"),
        ({"start_at": 1767225600}, "Input should be a valid datetime"),
        (
            {"start_at": BASE, "auto_offset_reset": "error"},
            "auto_offset_reset='error' says to stop there instead",
        ),
    ],
)
def test_a_bad_start_at_is_refused_when_the_configuration_is_built(
    settings: dict[str, Any], said: str
) -> None:
    with pytest.raises(ValidationError) as info:
        ConsumerConfig(**{**SETTINGS, **settings})
    assert said in str(info.value)
