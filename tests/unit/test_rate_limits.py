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


def run_and_check(s: Stepped, handled: Any, n: int, rate: float) -> float:
    """Step until `n` are handled, checking the rate's bound at every step; the run's time
    (from the clock's start: the limits were made after it)."""
    start = s.clock.start
    try:
        while handled() < n:
            s.clock.advance(0.01)  # simulated time goes faster than the steps' own ticks
            s.engine.step()
            assert s.life.failure is None, repr(s.life.failure)
            elapsed = s.clock.now - start
            assert handled() <= rate * (1.0 + elapsed) + SLACK, (handled(), elapsed)
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


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"max_records_per_s": 0}, "greater than 0"),
        ({"max_records_per_s": "5"}, "valid number"),
        ({"max_records_per_s_by_topic": {"t": "5"}}, "a rate is records per second"),
        ({"max_records_per_s_by_topic": {"t": True}}, "got True"),
        ({"max_records_per_s_by_topic": {"nope": 5}}, "not a subscribed topic"),
        ({"max_records_per_s_by_topic": {5: 5}}, "a key is a topic name"),
    ],
)
def test_a_bad_rate_is_refused_where_the_member_is_built(settings: Any, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        GroupConsumer(print, **{**SETTINGS, **settings})
