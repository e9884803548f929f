"""Rate limits: at most `max_records_per_s` records handed to handlers per second, for the
member, per topic (`max_records_per_s_by_topic`) and per key (`max_records_per_s_per_key`).

A token bucket per limit, with debt: a group of runnable records goes out while its buckets are
above zero and takes its whole size from them, and the next waits until the refill has paid the
debt back. The scheduler cuts a limited topic's groups to `GROUP_S` of its rate (`group_cap`),
as it cuts them for `batch_max_bytes`, so over any span longer than a second the rate holds to
within a few percent. The bucket holds at most one
second's worth: a member idle for a minute does not then run a minute's records at once.

A key's limit (key mode only) is a bucket per (topic, key), made when the key first runs and
dropped once it has refilled (an idle key costs nothing). At dispatch the scheduler takes a
held key's records out of their group, which stays runnable for the other keys
(`Scheduler._per_key`): a hot key waits in its own lane, in order, and the others run on. Its
waiting records count against the in-flight budget like any other; the partition is not held
from fetching for one key, so a key far over its rate fills the budget and flow control pauses
fetching until it drains.

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
from weir.records import Partition, Record

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

    def __init__(
        self,
        member: float | None,
        by_topic: Mapping[str, float],
        clock: Clock,
        per_key: float | None = None,
    ) -> None:
        now = clock.monotonic()
        self._clock = clock
        self.per_key = per_key
        # The most records of one key a group may take at once: a key's burst, as `group_cap`.
        self.key_cap = 1 if per_key is None else max(1, int(per_key * GROUP_S))
        self._keys: dict[tuple[str, bytes], _Bucket] = {}
        self._now = now
        self._pruned = now
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
        if (
            cfg.max_records_per_s is None
            and not cfg.max_records_per_s_by_topic
            and cfg.max_records_per_s_per_key is None
        ):
            return None
        return cls(
            cfg.max_records_per_s,
            cfg.max_records_per_s_by_topic,
            clock,
            cfg.max_records_per_s_per_key,
        )

    def hold_fetches(self, fetch: FetchControl, budget: Budget) -> None:
        """Each turn: fetch control holds (reason `rate`) the partitions `holds` names."""
        if self._member is None and not self._topics:
            return  # key limits alone never hold a partition's fetches: no walk per turn
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
        self._now = now
        if self._keys and now - self._pruned >= BURST_S:
            # A refilled bucket is a new one: dropping it keeps one bucket per recent key.
            self._pruned = now
            for k, bucket in list(self._keys.items()):
                bucket.refill(now)
                if bucket.tokens >= bucket.rate * BURST_S:
                    del self._keys[k]
        return now

    def key_open(self, topic: str, key: bytes) -> bool:
        """May records of `key` in `topic` go out at this dispatch (`start`)?"""
        bucket = self._keys.get((topic, key))
        if bucket is None:
            return True
        bucket.refill(self._now)
        return bucket.tokens > 0

    def take_keys(self, topic: str, records: list[Record]) -> None:
        """These records of `topic` go out: each keyed one is taken from its key's bucket (made
        full if it had none)."""
        rate, keys, now = self.per_key, self._keys, self._now
        assert rate is not None
        for rec in records:
            key = rec._key  # the slot: once per record
            if key is None:
                continue
            bucket = keys.get((topic, key))
            if bucket is None:
                bucket = keys[(topic, key)] = _Bucket(rate, now)
            bucket.tokens -= 1

    def keys_tracked(self) -> int:
        """How many keys have a bucket now (the ones that ran within about `BURST_S`)."""
        return len(self._keys)

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
