"""Partitions a member keeps through an incremental rebalance keep flowing, on a real broker.

librdkafka pauses every assigned partition while an incremental rebalance waits for its callback
and resumes them when the callback returns; a broker thread that saw them all paused meanwhile
sleeps on for up to 1 s (`rd_kafka_max_block_ms`), because a resume does not wake it. weir wakes
the fetchers of the partitions it keeps after each rebalance callback (`FetchControl.rebalanced`).
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence

import pytest

from tests.audit.cluster import SteadyProducer
from tests.audit.member import ProtocolSettings, settings
from tests.integration.kafka_helpers import member, wait_until
from weir import Context, Handler, Partition, Record
from weir.testing.pytest_plugin import TopicFactory

# A bound in time on a real broker: on a loaded machine (make test runs three brokers on two
# cores) a starved process shows the same gap as a sleeping fetcher, so it runs in make chaos,
# on a quieter machine. The fast guard is test_consumer_loop's wake test.
pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.chaos]

PARTITIONS = 6
# Work a handler does in its revoke hook. It also makes sure the callback outlasts a fetch
# round trip (fetch.wait.max.ms is 10 ms), so librdkafka's broker thread sees every partition
# of the member paused and goes idle, as it does in practice whenever a revoke drains and
# commits.
HOOK_S = 0.05


Stalls = tuple[dict[int, tuple[float, float]], list[float], float]


class Timeline(Handler):
    """When each record finished, and when partitions were assigned and revoked."""

    def __init__(self) -> None:
        self.done: dict[int, list[float]] = defaultdict(list)
        self.changes: list[tuple[float, str, list[int]]] = []
        self._lock = threading.Lock()

    def handle(self, record: Record, ctx: Context) -> None:
        with self._lock:
            self.done[record.partition].append(time.monotonic())

    def on_assigned(self, partitions: Sequence[Partition]) -> None:
        self.changes.append((time.monotonic(), "assigned", [p.partition for p in partitions]))

    def on_revoked(self, partitions: Sequence[Partition]) -> None:
        self.changes.append((time.monotonic(), "revoked", [p.partition for p in partitions]))
        time.sleep(HOOK_S)

    def flowing_since(self, t: float) -> bool:
        with self._lock:
            return all(self.done[p] and self.done[p][-1] > t for p in range(PARTITIONS))

    def owned(self, until: float = float("inf")) -> set[int]:
        out: set[int] = set()
        for t, kind, ps in list(self.changes):
            if t <= until:
                (out.update if kind == "assigned" else out.difference_update)(ps)
        return out

    def longest_gap(self, partition: int, start: float, end: float) -> tuple[float, float]:
        """The longest time without a finished record of `partition` between `start` and
        `end`, and when it began (seconds after `start`)."""
        with self._lock:
            ts = [t for t in self.done[partition] if start <= t <= end]
        a, b = max(itertools.pairwise([start, *ts, end]), key=lambda ab: ab[1] - ab[0])
        return round(b - a, 3), round(a - start, 3)


def _join(a: Timeline, bootstrap: str, group: str, topic: str, kw: ProtocolSettings) -> Stalls:
    """Once `a` owns every partition and each is flowing, a member joins for 2 s after its
    first record, then leaves. Each partition `a` kept: its longest gap after the join and
    when it began; when `a`'s partitions changed (seconds after the join); and the longest gap
    of the kept partitions in the 1.5 s before the join, at rest."""
    wait_until(lambda: len(a.owned()) == PARTITIONS, 60, "a to own every partition")
    since = time.monotonic()
    wait_until(lambda: a.flowing_since(since), 30, "every partition flowing at a")
    time.sleep(1.5)  # at rest, for the figures in the failure message
    b = Timeline()
    joined = time.monotonic()
    gb = member(b, bootstrap, group, [topic], **kw).start()
    try:
        wait_until(lambda: any(b.done.values()), 60, "b's first record")
        time.sleep(2)
        end = time.monotonic()
    finally:
        gb.stop()
        gb.join(30)
    kept = sorted(a.owned(until=end))
    assert 0 < len(kept) < PARTITIONS, a.changes
    changed = [round(t - joined, 3) for t, _, _ in a.changes if t > joined]
    rest = max(a.longest_gap(p, joined - 1.5, joined)[0] for p in kept)
    return {p: a.longest_gap(p, joined, end) for p in kept}, changed, rest


@pytest.mark.parametrize("protocol", ["cooperative", "consumer"])
def test_kept_partitions_do_not_stall_when_a_member_joins(
    kafka_bootstrap: str, make_topic: TopicFactory, protocol: str
) -> None:
    """A member joins and leaves again, three times. How long librdkafka's fetcher would sleep
    depends on where its 1 s wait stands when the rebalance pauses it; over three joins it
    stalled the kept partitions for 0.6 to 1.2 s at least once in every run without the wake."""
    topic = make_topic(PARTITIONS)
    group = f"stall-{uuid.uuid4().hex[:8]}"
    producer = SteadyProducer(kafka_bootstrap, topic, rate=300)  # 50 records/s a partition
    producer.start()
    a = Timeline()
    kw = settings(protocol)
    ga = member(a, kafka_bootstrap, group, [topic], **kw).start()
    try:
        stalls = [_join(a, kafka_bootstrap, group, topic, kw) for _ in range(3)]
    finally:
        ga.stop()
        ga.join(30)
        producer.finish()
    # At rest a partition's records finish every ~20 ms, fetched every 10 ms or so; a fetcher
    # left asleep after the revoke shows as a gap of up to 1 s.
    worst = max(gap for gaps, _, _ in stalls for gap, _ in gaps.values())
    assert worst < 0.5, f"kept partitions stalled: {stalls}"
