"""Read-only snapshots of the engine's state, published by the owner thread.

A snapshot is built on the owner thread and swapped in whole, so other threads read a consistent
object without touching engine state. The words follow the budget's vocabulary
(`weir._engine.budget`): *throttled* (polls take one record at a time) and *paused* (the client
stops fetching a partition, with a reason). docs/observability.md says what each number means, how
it is measured and what is sampled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from weir.records import Partition

__all__ = ["BUCKETS", "ConsumerStats", "LatencyHistogram", "PartitionStats", "PauseReason"]

# Upper bounds (seconds, inclusive) of the latency histograms: four log-scale buckets per decade
# from 10 microseconds to 10,000 seconds, then +Inf. Fixed, so a histogram is a list of counts and
# an observation is one bisect; a quantile read from them is exact to within a bucket (a factor
# of 10**0.25 = 1.78 between neighbouring bounds), interpolated inside it.
BUCKETS: tuple[float, ...] = tuple(float(f"{10 ** (k / 4):.3g}") for k in range(-20, 17))


PauseReason = Literal[
    "fenced",
    "shutdown",
    "blocked",
    "app",
    "rate",
    "start_offset_unknown",
    "start_committing",
    "capacity",
    "share",
]
"""Why the client does not fetch a partition, in the order `pause_reason` names the first."""


@dataclass(frozen=True, slots=True)
class LatencyHistogram:
    """Counts of observations per bucket of `BUCKETS` (`counts[i]`: at most `BUCKETS[i]` and
    above the bound before; the last count is above every bound), their number and their sum."""

    counts: tuple[int, ...] = (0,) * (len(BUCKETS) + 1)
    count: int = 0
    sum: float = 0.0

    def quantile(self, q: float) -> float | None:
        """The `q` quantile (0 < q < 1), interpolated linearly inside its bucket as Prometheus'
        histogram_quantile does; None without observations. Past the last bound, the last bound."""
        if not 0 < q < 1:
            raise ValueError(f"q must be between 0 and 1, got {q}")
        if not self.count:
            return None
        rank = q * self.count
        seen = 0
        for i, n in enumerate(self.counts):
            if n and seen + n >= rank:
                if i == len(BUCKETS):
                    return BUCKETS[-1]
                low = 0.0 if i == 0 else BUCKETS[i - 1]
                return low + (BUCKETS[i] - low) * (rank - seen) / n
            seen += n
        return BUCKETS[-1]  # pragma: no cover - rank <= count always lands above

    @property
    def p50(self) -> float | None:
        """The median in seconds (`quantile(0.5)`); None without observations."""
        return self.quantile(0.5)

    @property
    def p95(self) -> float | None:
        """The 95th percentile in seconds (`quantile(0.95)`); None without observations."""
        return self.quantile(0.95)

    @property
    def p99(self) -> float | None:
        """The 99th percentile in seconds (`quantile(0.99)`); None without observations."""
        return self.quantile(0.99)

    @property
    def mean(self) -> float | None:
        """The mean in seconds (`sum / count`, exact); None without observations."""
        return self.sum / self.count if self.count else None


@dataclass(frozen=True, slots=True)
class PartitionStats:
    """One owned partition in a `ConsumerStats` snapshot: its offsets, its records in the budget,
    why it is not fetched, stalls and its last commit (docs/observability.md has every field)."""

    tp: Partition
    """The partition."""
    token: int
    """Its assignment's token (`ctx.token`): a new one at every assignment."""
    in_flight: int
    """Records registered and not finished, in the lanes or running (not the read-ahead)."""
    in_flight_bytes: int
    """Their key + value + header bytes."""
    committable: int | None
    """The watermark now: the offset a commit would send."""
    committed: int | None
    """The group's committed offset: the last one this member's commits had confirmed, else the
    one read from the broker when the partition was assigned (None: the group never committed
    here, or the read failed)."""
    paused: bool
    """The client is not fetching this partition (see `pause_reason`)."""
    pause_reason: PauseReason | None = None
    """Why (`weir._engine.fetching`): the first of these that holds it."""
    read_ahead: int = 0
    """Records read ahead of the partition's share of the budget (flow-control.md): registered,
    so the watermark waits for them, but not yet in the lanes."""
    offset_map_bytes: int = 0
    """Size of the offset map sent with the last commit (0: nothing finished above it)."""
    position: int | None = None
    """The client's fetch position: the next offset it hands to weir (None before the first)."""
    high_watermark: int | None = None
    """The partition's log end offset, from the client's last fetch response or the background
    refresh, whichever is newer (None until known)."""
    log_start: int | None = None
    """The partition's first offset, as the client last heard it (None until known)."""
    throttled: bool = False
    """Fetching is throttled (the whole budget is at its high mark: every partition)."""
    blocked: bool = False
    """A failure policy holds the partition until a retry succeeds or the record is skipped."""
    oldest_age_s: float | None = None
    """Now - the record timestamp of the oldest unfinished record (see docs: read from the first
    record of the fetched batch that holds it). None when nothing is unfinished."""
    oldest_fetched_s: float | None = None
    """Now - when the oldest unfinished record was fetched (exact: a batch is fetched at once)."""
    stalled_s: float = 0.0
    """How long the watermark has not moved while work is in flight (0 when none is)."""
    silent_s: float | None = None
    """Set while the stall watchdog finds the partition stalled: fetched (no pause), records on
    the broker past its position, and nothing delivered for `partition_stall_s` or more; the
    seconds since it last delivered (None: it is not stalled)."""
    last_commit_time: float | None = None
    """`time.time()` of this assignment's last commit result (None before the first)."""
    last_commit_offset: int | None = None
    """The offset of this assignment's last commit result (None before the first)."""
    last_commit_error: str | None = None
    """The last commit result's error (None: it succeeded, or there was none yet)."""
    assigned_time: float = 0.0
    """`time.time()` when this member was assigned the partition."""
    recovery_s: float | None = None
    """Assignment to the first finished record (None until one finished)."""
    unconfirmed_commit_s: float | None = None
    """Now - when the oldest commit of this partition that the broker has not confirmed was sent:
    one waiting for its answer, or one that failed with no newer offset confirmed since (None:
    every commit sent is confirmed). It stays below the commit interval plus a round trip while
    commits work; it grows while a classic rebalance holds them or commits fail."""

    @property
    def lag(self) -> int | None:
        """High watermark - committed offset: what the group has not committed as done yet.
        Without a committed offset, high watermark - log start, as `weir lag` counts it."""
        if self.high_watermark is None:
            return None
        base = self.committed if self.committed is not None else self.log_start
        return None if base is None else max(0, self.high_watermark - base)

    @property
    def in_app_backlog(self) -> int | None:
        """Position - committed: records handed to weir and not committed as done yet (in the
        lanes, running, read ahead, or finished above an unfinished one)."""
        if self.position is None or self.committed is None:
            return None
        return max(0, self.position - self.committed)

    @property
    def broker_backlog(self) -> int | None:
        """High watermark - position: records not handed to weir yet (in the client's prefetch
        or still on the broker)."""
        if self.high_watermark is None or self.position is None:
            return None
        return max(0, self.high_watermark - self.position)

    @property
    def last_commit_ok(self) -> bool | None:
        """Whether the last commit answered for this partition succeeded; None before any."""
        if self.last_commit_time is None:
            return None
        return self.last_commit_error is None


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """A snapshot of the member that the owner thread publishes and `GroupConsumer.stats()`
    returns: counts since start, the budget's state, latencies, rebalances, and one
    `PartitionStats` per owned partition (docs/observability.md has every field)."""

    at: float
    """time.monotonic() when the owner thread built this snapshot."""
    running: bool
    """The owner thread is running (False in the final snapshot)."""
    processed: int
    """Records finished since the start."""
    failed: int
    """Handler calls that raised since the start."""
    in_flight: int
    """Records registered and not finished, in the lanes or running (not the read-ahead)."""
    in_flight_bytes: int
    """Their key + value + header bytes."""
    peak_in_flight: int
    """The most records in the budget at once since the start."""
    peak_in_flight_bytes: int
    """The most bytes in the budget at once since the start."""
    throttled: bool
    """At the high mark: polls take at most one record."""
    throttles: int
    """How many times the throttle went on."""
    paused: bool
    """At the capacity: every partition is paused in the client."""
    pauses: int
    """How many times the capacity paused every partition."""
    rebalances: int
    """Rebalances this member took part in: one per assignment it received (the assign callback
    that ends each), however many revoke or lost callbacks came before it."""
    partitions: tuple[PartitionStats, ...] = field(default=())
    """One `PartitionStats` per partition this member owns."""
    read_ahead: int = 0
    """Records read ahead of their partitions' shares, not counted in `in_flight`."""
    read_ahead_bytes: int = 0
    """Their bytes: `in_flight_bytes` leaves them out, the byte budget counts them."""
    callback_failures: int = 0
    """User callbacks (commit listeners, handler hooks) that raised (callbacks are isolated)."""
    workers_replaced: int = 0
    """Worker threads replaced (async handlers: handler coroutines cancelled) because a handler
    call outlived its partition's hand-off."""
    loop_blocked: int = 0
    """Async handlers: times the event loop was found blocked (`event_loop_blocked` logged)."""
    retries: int = 0
    """Retries scheduled after handler failures (`FailurePolicy.retry`)."""
    waiting_retry: int = 0
    """Failed records waiting for their next attempt, or blocked, now."""
    dead_lettered: int = 0
    """Records written to a dead-letter topic (confirmed by the broker)."""
    skipped: int = 0
    """Failed records skipped by the operator (`GroupConsumer.skip`)."""
    blocked: tuple[Partition, ...] = ()
    """Partitions blocked by a failure policy now."""
    offset_map_truncations: int = 0
    """Commits whose offset map was cut to fit `offset_map_max_bytes` (the rest is replayed)."""
    replay_skipped: int = 0
    """Records not handled again because a committed offset map says they were finished."""
    partition_stall_recoveries: int = 0
    """Stalled partitions the watchdog sought (or assigned) again (`partition_stall_s`)."""
    commit_failures: int = 0
    """Partition commits that came back failed (each is retried by a later commit)."""
    rate: float = 0.0
    """Records finished per second over the last `rate_window_s` seconds (or since the start)."""
    rate_window_s: float = 0.0
    """The seconds `rate` covers."""
    handler_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    """Handler time per record: each task's handler time over its records, once per record."""
    end_to_end_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    """Record timestamp → finished, sampled: the first record of a task (or of a progress
    report of a long task) as the owner settles it, at most once a millisecond."""
    rebalance_last_s: float | None = None
    """How long the last rebalance took, from its first callback to the end of its assign."""
    rebalance_seconds: float = 0.0
    """Seconds spent in rebalances in all."""
    rebalancing: bool = False
    """A revoke or lost callback came and the assignment that ends the rebalance did not yet."""
    joined: bool = False
    """This member has an assignment from the group (received, and not lost since)."""
    capacity_records: int = 0
    """The budget's hard bounds (`FlowConfig.capacity_*`), to read `in_flight` against."""
    capacity_bytes: int = 0
    """The budget's hard bound in bytes, to read `in_flight_bytes` against."""
    oldest_unconfirmed_commit_s: float | None = None
    """The largest `unconfirmed_commit_s` of the owned partitions (None: every commit sent is
    confirmed): how long this member's progress has gone without the broker's confirmation."""

    @property
    def paused_partitions(self) -> tuple[Partition, ...]:
        """The partitions the client is not fetching now, for whatever `pause_reason`."""
        return tuple(p.tp for p in self.partitions if p.paused)

    @property
    def stalled_partitions(self) -> tuple[Partition, ...]:
        """Partitions the stall watchdog finds stalled now (`PartitionStats.silent_s`)."""
        return tuple(p.tp for p in self.partitions if p.silent_s is not None)

    @property
    def lag(self) -> int | None:
        """The sum of the owned partitions' lag (None while one of them is unknown)."""
        total = 0
        for p in self.partitions:
            lag = p.lag
            if lag is None:
                return None
            total += lag
        return total

    @property
    def budget_use(self) -> float:
        """The larger of in-flight records and bytes (read-ahead bytes included) over their
        capacity: 1.0 is a full budget."""
        use = 0.0
        if self.capacity_records:
            use = self.in_flight / self.capacity_records
        if self.capacity_bytes:
            use = max(use, (self.in_flight_bytes + self.read_ahead_bytes) / self.capacity_bytes)
        return use


EMPTY = ConsumerStats(
    at=0.0,
    running=False,
    processed=0,
    failed=0,
    in_flight=0,
    in_flight_bytes=0,
    peak_in_flight=0,
    peak_in_flight_bytes=0,
    throttled=False,
    throttles=0,
    paused=False,
    pauses=0,
    rebalances=0,
)
