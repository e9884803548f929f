"""Rate limits on a real broker: the member's rate holds within 5 % over a window, while the
member keeps its place in the group (one assignment, no rebalance)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from tests.integration.kafka_helpers import member, produce, wait_until
from weir import Record
from weir.testing.pytest_plugin import TopicFactory

pytestmark = pytest.mark.broker

RATE = 400.0


def held_rate(kafka_bootstrap: str, topic: str, window_s: float) -> tuple[float, int]:
    """Records handled per second over `window_s`, after the first second's burst."""
    stamps: list[float] = []
    lock = threading.Lock()

    def handle(record: Record) -> None:
        with lock:
            stamps.append(time.monotonic())

    gc = member(
        handle,
        kafka_bootstrap,
        f"rate-{uuid.uuid4().hex[:8]}",
        [topic],
        ordering="unordered",
        max_records_per_s=RATE,
    )
    with gc:
        wait_until(lambda: len(stamps) > 0, 30, "the first record")
        time.sleep(window_s + 1.5)
        rebalances = gc.stats().rebalances
    with lock:
        start = stamps[0] + 1.0  # past the first second's burst
        n = sum(1 for s in stamps if start <= s < start + window_s)
    return n / window_s, rebalances


def test_the_member_rate_holds_within_5_percent(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    topic = make_topic(3)
    produce(kafka_bootstrap, topic, [(None, b"x")] * 6_000)
    rate, rebalances = held_rate(kafka_bootstrap, topic, 6.0)
    assert abs(rate - RATE) <= 0.05 * RATE, rate
    assert rebalances == 1


@pytest.mark.slow
def test_the_member_rate_holds_within_5_percent_over_a_minute(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    topic = make_topic(3)
    produce(kafka_bootstrap, topic, [(None, b"x")] * 30_000)
    rate, rebalances = held_rate(kafka_bootstrap, topic, 60.0)
    assert abs(rate - RATE) <= 0.05 * RATE, rate
    assert rebalances == 1
