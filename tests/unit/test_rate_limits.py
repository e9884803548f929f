"""Rate limits (`max_records_per_s`, `max_records_per_s_by_topic`) on the stepped engine and its
ManualClock: no more records handed out than the rate allows at any time, and no fewer over a
run, and the member keeps polling while records wait."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from tests.fake_members import SETTINGS
from tests.stepped import Stepped

from weir import ConsumerConfig, GroupConsumer, Partition, Record
from weir._engine.rates import RateLimits
from weir.testing.clock import ManualClock
from weir.testing.fake import FakeConsumer

pytestmark = pytest.mark.timeout(120)

P0, P1 = Partition("t", 0), Partition("t", 1)
RATE = 200.0
N = 1_000
# One dispatch may take one group past the rate (groups are never split for it).
SLACK = 64


class Counted:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_topic: dict[str, int] = {}

    def __call__(self, record: Record) -> None:
        with self.lock:
            self.by_topic[record.topic] = self.by_topic.get(record.topic, 0) + 1

    def total(self) -> int:
        with self.lock:
            return sum(self.by_topic.values())


def stepped(fake: FakeConsumer, handler: Counted, **settings: Any) -> Stepped:
    cfg = ConsumerConfig(**{**SETTINGS, "max_batch_records": 50, **settings})
    return Stepped(fake, handler, cfg)


def run_and_check(s: Stepped, handled: Any, n: int, rate: float, slack: int = SLACK) -> float:
    """Step until `n` are handled, checking the rate's bound at every step; the run's time
    (from the clock's start: the limits were made after it)."""
    start = s.clock.start
    try:
        while handled() < n:
            s.clock.advance(0.01)  # simulated time goes faster than the steps' own ticks
            s.engine.step()
            assert s.life.failure is None, repr(s.life.failure)
            elapsed = s.clock.now - start
            assert handled() <= rate * (1.0 + elapsed) + slack, (handled(), elapsed)
            assert elapsed < 3 * n / rate, f"only {handled()} of {n} in {elapsed:.1f} s"
    finally:
        s.stop()
    return s.clock.now - start


def test_the_member_rate_holds_at_every_step_and_over_the_run() -> None:
    fake = FakeConsumer()
    fake.produce_many("t", 0, range(N), key=lambda o: b"k%d" % (o % 13))
    fake.produce_many("t", 1, range(N), key=lambda o: b"k%d" % (o % 13))
    fake.script_assign([P0, P1])
    handler = Counted()
    s = stepped(fake, handler, max_records_per_s=RATE)
    elapsed = run_and_check(s, handler.total, 2 * N, RATE)
    # The first second's burst, then the rate: no slower than it allows either.
    assert elapsed <= (2 * N - RATE) / RATE * 1.05 + 1.0, elapsed
    assert len(fake.delivered_offsets(P0)) == N  # fetched on while records waited


def test_a_topics_rate_holds_that_topic_and_not_the_others() -> None:
    fake = FakeConsumer()
    fake.produce_many("t", 0, range(N), key=lambda o: b"k%d" % (o % 13))
    fake.produce_many("u", 0, range(N), key=lambda o: b"k%d" % (o % 13))
    fake.script_assign([P0, Partition("u", 0)])
    handler = Counted()
    rate = RATE / 2
    s = stepped(fake, handler, topics=["t", "u"], max_records_per_s_by_topic={"t": rate})
    t_when_u_done: list[int] = []

    def t_handled() -> int:
        t = handler.by_topic.get("t", 0)
        if not t_when_u_done and handler.by_topic.get("u", 0) == N:
            t_when_u_done.append(t)
        return t

    run_and_check(s, t_handled, N, rate)
    # Records of t waiting for its rate neither pause u nor fill the budget u needs.
    assert t_when_u_done and t_when_u_done[0] < N / 2, t_when_u_done


def test_a_keys_rate_holds_at_every_step_and_over_the_run() -> None:
    """Half a partition's records have one key, limited to 100/s: at every step no more of them
    ran than the rate allows (planted: a group taking all the key's waiting records at once),
    and the run is no slower than the rate either."""
    fake = FakeConsumer()
    fake.produce_many("t", 0, range(N), key=lambda o: b"hot" if o % 2 else b"k%d" % (o % 100))
    fake.script_assign([P0])
    hot = Counted()

    def handler(record: Record) -> None:
        if record.key == b"hot":
            hot(record)

    s = stepped(fake, handler, max_records_per_s_per_key=RATE / 2)  # type: ignore[arg-type]
    elapsed = run_and_check(s, hot.total, N // 2, RATE / 2)
    assert elapsed <= (N // 2 - RATE / 2) / (RATE / 2) * 1.05 + 1.0, elapsed


def test_a_hot_key_waits_alone_and_the_other_keys_of_its_partition_run_on() -> None:
    """A rate per key of 1/s; batches of a partition arrive one after another, each one record
    of the hot key and 49 of keys of their own. The hot key's lane is free when a batch comes,
    so its record joins the others' group; once its bucket is empty it must wait alone, not hold
    the 49 others (planted: the whole group waits for the refill, a second). The hot key keeps
    to its rate at every step."""
    fake = FakeConsumer()
    fake.script_assign([P0])
    hot, others = Counted(), Counted()

    def handler(record: Record) -> None:
        (hot if record.key == b"hot" else others)(record)

    rate = 1.0
    s = stepped(fake, handler, max_records_per_s_per_key=rate)  # type: ignore[arg-type]
    start = s.clock.start
    took: list[float] = []
    try:
        for i in range(4):
            base = 50 * i
            fake.produce_many(
                "t", 0, range(base, base + 50), key=lambda o: b"hot" if o % 50 == 0 else b"k%d" % o
            )
            began = s.clock.now
            while others.total() < 49 * (i + 1):
                s.clock.advance(0.01)
                s.engine.step()
                assert s.life.failure is None, repr(s.life.failure)
                elapsed = s.clock.now - start
                assert hot.total() <= rate * (1.0 + elapsed) + 1, (hot.total(), elapsed)
                assert s.clock.now - began < 5, f"batch {i}: {others.total()} others handled"
            took.append(round(s.clock.now - began, 2))
        while hot.total() < 4:
            s.clock.advance(0.01)
            s.engine.step()
            assert hot.total() <= rate * (1.0 + s.clock.now - start) + 1
    finally:
        s.stop()
    assert max(took) < 0.3, took  # seconds each batch's other keys took
    assert s.clock.now - start >= 1.9  # the hot key did wait: 4 records, 2 of them at once


def test_a_keys_bucket_is_dropped_once_it_has_refilled() -> None:
    """One bucket per key that ran within about a second: a stream of distinct keys does not
    grow the limiter without bound."""
    clock = ManualClock()
    limits = RateLimits(None, {}, clock, per_key=10.0)
    limits.start()
    limits.take_keys("t", [Record("t", 0, o, key=b"k%d" % o) for o in range(1_000)])
    limits.take_keys("t", [Record("t", 0, o, key=b"k0") for o in range(1_000, 1_010)])
    assert limits.keys_tracked() == 1_000
    assert limits.key_open("t", b"k1") and not limits.key_open("t", b"k0")
    clock.advance(0.5)
    limits.start()
    assert limits.keys_tracked() == 1_000  # not refilled yet: they still limit their keys
    clock.advance(1.0)
    limits.start()
    assert limits.keys_tracked() == 0


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"max_records_per_s": 0}, "greater than 0"),
        ({"max_records_per_s": "5"}, "valid number"),
        ({"max_records_per_s_by_topic": {"t": "5"}}, "a rate is records per second"),
        ({"max_records_per_s_by_topic": {"t": True}}, "got True"),
        ({"max_records_per_s_by_topic": {"nope": 5}}, "not a subscribed topic"),
        ({"max_records_per_s_by_topic": {5: 5}}, "a key is a topic name"),
        ({"max_records_per_s_per_key": 0}, "greater than 0"),
        ({"max_records_per_s_per_key": float("inf")}, "finite"),
        ({"max_records_per_s_per_key": 5, "ordering": "partition"}, 'needs ordering="key"'),
        ({"max_records_per_s_per_key": 5, "ordering": "unordered"}, "this member's is 'unordered'"),
    ],
)
def test_a_bad_rate_is_refused_where_the_member_is_built(settings: Any, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        GroupConsumer(print, **{**SETTINGS, **settings})
