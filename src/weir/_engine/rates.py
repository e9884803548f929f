"""Rate limits: at most `max_records_per_s` records handed to handlers per second, for the
member and per topic (`max_records_per_s_by_topic`).

A token bucket per limit, with debt: a group of runnable records goes out while its buckets are
above zero and takes its whole size from them, and the next waits until the refill has paid the
debt back. The scheduler cuts a limited topic's groups to `GROUP_S` of its rate (`group_cap`),
as it cuts them for `batch_max_bytes`, so over any span longer than a second the rate holds to
within a few percent. The bucket holds at most one
second's worth: a member idle for a minute does not then run a minute's records at once.

Records that wait for the rate stay in the scheduler's queue, in order; the partitions whose
rate held records back are not fetched until it lets them go (fetch reason `rate`), so they do
not fill the in-flight budget that other topics need, and the member keeps polling (it never
leaves its group for a rate limit). Every turn of the owner loop dispatches (after draining the
completions), so a waiting group goes out in the first turn after its buckets refill.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from weir._engine.clock import Clock
from weir.records import Partition

if TYPE_CHECKING:  # the scheduler imports this module, and the budget imports the scheduler
    from weir._engine.budget import Budget
    from weir._engine.fetching import FetchControl
    from weir.config import ConsumerConfig

__all__ = ["RateLimits"]

BURST_S = 1.0
# A group holds at most this long's worth of records at the lowest rate: the most one dispatch
# may take a bucket below zero.
GROUP_S = 0.02


class _Bucket:
    __slots__ = ("rate", "tokens", "updated")

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self.tokens = rate * BURST_S
        self.updated = now

    def refill(self, now: float) -> None:
        self.tokens = min(self.rate * BURST_S, self.tokens + (now - self.updated) * self.rate)
        self.updated = now


class RateLimits:
    """Owner thread only."""

    def __init__(self, member: float | None, by_topic: Mapping[str, float], clock: Clock) -> None:
        now = clock.monotonic()
        self._clock = clock
        self._member = None if member is None else _Bucket(member, now)
        self._topics = {t: _Bucket(r, now) for t, r in by_topic.items()}
        # What the last dispatch held back: the whole member, or these topics. Their partitions
        # are not fetched meanwhile (`holds`), so records that wait for a rate do not fill the
        # in-flight budget that other topics need.
        self._member_held = False
        self._held_topics: set[str] = set()

    @classmethod
    def of(cls, cfg: ConsumerConfig, clock: Clock) -> RateLimits | None:
        """The member's limits, if it has any."""
        if cfg.max_records_per_s is None and not cfg.max_records_per_s_by_topic:
            return None
        return cls(cfg.max_records_per_s, cfg.max_records_per_s_by_topic, clock)

    def hold_fetches(self, fetch: FetchControl, budget: Budget) -> None:
        """Each turn: fetch control holds (reason `rate`) the partitions `holds` names."""
        parts, total = budget.parts, budget.records
        fetch.follow(
            list(parts),
            "rate",
            lambda tp: self.holds(tp, parts[tp].records + parts[tp].ahead_records, total),
        )

    def start(self) -> float:
        """The time of a dispatch (one reading for all its groups), buckets refilled to it."""
        now = self._clock.monotonic()
        if self._member is not None:
            self._member.refill(now)
        for bucket in self._topics.values():
            bucket.refill(now)
        self._member_held = False
        self._held_topics.clear()
        return now

    def take(self, topic: str, n: int) -> bool:
        """May a group of `n` records of `topic` go out now? If so, its size is taken."""
        member = self._member
        bucket = self._topics.get(topic)
        if member is not None and member.tokens <= 0:
            self._member_held = True
            return False
        if bucket is not None and bucket.tokens <= 0:
            self._held_topics.add(topic)
            return False
        if member is not None:
            member.tokens -= n
        if bucket is not None:
            bucket.tokens -= n
        return True

    def group_cap(self, topic: str) -> int | None:
        """The most records of `topic` one group may hold (None: no limit on it)."""
        rates = [b.rate for b in (self._member, self._topics.get(topic)) if b is not None]
        return max(1, int(min(rates) * GROUP_S)) if rates else None

    def holds(self, tp: Partition, backlog: int, member_backlog: int) -> bool:
        """Is `tp` not to be fetched? While the last dispatch held back records of its rate, or
        while more of it waits (`backlog`: fetched, not finished; `member_backlog`: the
        member's) than its rate runs in `BURST_S`: a limited topic fetched on at full speed
        would fill the in-flight budget that the other topics need."""
        if self._member_held or tp.topic in self._held_topics:
            return True
        member = self._member
        if member is not None and member_backlog >= member.rate * BURST_S:
            return True
        bucket = self._topics.get(tp.topic)
        return bucket is not None and backlog >= bucket.rate * BURST_S
