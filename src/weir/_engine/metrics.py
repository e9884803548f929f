"""What the owner thread measures as records are fetched, finish and commit, for `stats()`.

Everything here lives on the owner thread: the engine calls in at a few points and reads it all
back when it builds a snapshot (`Engine._publish`), so nothing needs a lock and nothing is
shared with workers. The per-record hot path is left alone; measurements are taken per task, per
fetched run or per snapshot:

- handler latency: a task's handler time (`Task.seconds`, measured by its worker) over the
  records it ran, counted once per record. A task of 200 no-op records adds 200 observations of
  its mean; a slow handler's tasks hold one record each, so those are exact.
- end-to-end latency: record timestamp → finished, *sampled*: the first record of a task (or of
  a progress report of a long task) when the owner settles it, at most once a millisecond.
  Reading a record's timestamp costs about as much as a fifth of building the record, so not
  every record is read.
- the oldest unfinished record: per fetched run, when it was fetched and the timestamp of its
  first record. The oldest run not finished yet gives both ages.
- rates, ages and stalls: computed when a snapshot is built, from counters kept anyway.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable

from weir._engine.tasks import DONE, FAILED, Assignment, Task
from weir._engine.tracking import BatchProgress
from weir.records import CommitEvent, Partition, Record
from weir.stats import BUCKETS, LatencyHistogram

__all__ = ["Histogram", "Metrics", "PartitionMetrics"]

# How far back `ConsumerStats.rate` looks.
RATE_WINDOW_S = 10.0
# End-to-end latency is sampled at most this often (seconds): up to 1,000 samples a second, so
# one-record tasks (slow handlers) pay a clock read per task, not a timestamp read and a bucket.
_SAMPLE_EVERY = 0.001


class Histogram:
    """A latency histogram over the fixed `BUCKETS`: owner thread only, no locks."""

    __slots__ = ("count", "counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, seconds: float, n: int = 1) -> None:
        """`n` observations of `seconds` each."""
        if seconds < 0:
            seconds = 0.0  # a producer clock ahead of ours: the record is as fresh as it gets
        self.counts[bisect_left(BUCKETS, seconds)] += n
        self.count += n
        self.sum += seconds * n

    def snapshot(self) -> LatencyHistogram:
        return LatencyHistogram(tuple(self.counts), self.count, self.sum)


class PartitionMetrics:
    """One assignment of one partition, as measured."""

    __slots__ = (
        "assigned_at",
        "assigned_time",
        "committable",
        "group_committed",
        "last_commit_error",
        "last_commit_offset",
        "last_commit_time",
        "moved_at",
        "recovery_s",
        "runs",
    )

    def __init__(self, now: float, wall: float) -> None:
        self.assigned_at = now
        self.assigned_time = wall
        self.recovery_s: float | None = None
        # The group's committed offset read at assignment (None: none, or the read failed).
        self.group_committed: int | None = None
        # Fetched runs not known to be finished: (batch, monotonic fetch time, first record's
        # timestamp in ms or None). The head is pruned at each snapshot; a finished run behind an
        # unfinished one stays until the head finishes, as its batch does in PartitionProgress.
        self.runs: deque[tuple[BatchProgress, float, int | None]] = deque()
        self.committable: int | None = None
        self.moved_at = now  # when the watermark last moved, or work was last absent
        self.last_commit_time: float | None = None
        self.last_commit_offset: int | None = None
        self.last_commit_error: str | None = None

    def oldest_ages(self, now: float) -> tuple[float | None, float | None]:
        """How long ago the oldest run not finished was fetched (`now` is monotonic), and the
        age of its first record's timestamp; pruning the finished runs before it."""
        runs = self.runs
        while runs:
            batch, fetched, stamp = runs[0]
            if batch.all_done or batch.revoked:
                runs.popleft()
                continue
            age = None if stamp is None else max(0.0, time.time() - stamp / 1000)
            return now - fetched, age
        return None, None

    def watermark(self, committable: int | None, busy: bool, now: float) -> float:
        """Note the watermark at a snapshot; returns how long it has stood still while work
        was in flight (0 when none is)."""
        if committable != self.committable or not busy:
            self.committable = committable
            self.moved_at = now
            return 0.0
        return now - self.moved_at


class Metrics:
    """Owner thread only."""

    def __init__(self, rate_window_s: float = RATE_WINDOW_S) -> None:
        self.handler = Histogram()
        self.end_to_end = Histogram()
        self.parts: dict[Partition, PartitionMetrics] = {}
        # Partitions assigned and waiting for their first finished record.
        self._awaiting: dict[Partition, PartitionMetrics] = {}
        self.commit_failures = 0
        # Rebalances: one per assignment received; open from the first callback before it.
        self.rebalances = 0
        self.rebalance_seconds = 0.0
        self.rebalance_last_s: float | None = None
        self._rebalance_began: float | None = None
        self._window = rate_window_s
        self._next_sample = 0.0
        self._samples: deque[tuple[float, int]] = deque()

    # -- membership ----------------------------------------------------------------------

    def assigned(self, tps: Iterable[Partition], now: float) -> None:
        wall = time.time()
        for tp in tps:
            pm = self.parts[tp] = PartitionMetrics(now, wall)
            self._awaiting[tp] = pm

    def opened(self, a: Assignment) -> None:
        pass  # measured from the rebalance that assigned it (`assigned`, with its time)

    def closed(self, a: Assignment) -> None:
        self.removed([a.tp])

    def removed(self, tps: Iterable[Partition]) -> None:
        for tp in tps:
            self.parts.pop(tp, None)
            self._awaiting.pop(tp, None)

    def group_committed(self, offsets: dict[Partition, int | None]) -> None:
        for tp, off in offsets.items():
            pm = self.parts.get(tp)
            if pm is not None:
                pm.group_committed = off

    def rebalance_began(self, now: float) -> None:
        """A revoke or lost callback: a rebalance is under way (if one was not already)."""
        if self._rebalance_began is None:
            self._rebalance_began = now

    def rebalance_done(self, began: float, now: float) -> float:
        """An assign callback ended the rebalance (begun at its first callback, or at `began`,
        the assign's own start); returns its duration."""
        start = self._rebalance_began if self._rebalance_began is not None else began
        self._rebalance_began = None
        seconds = now - start
        self.rebalances += 1
        self.rebalance_seconds += seconds
        self.rebalance_last_s = seconds
        return seconds

    @property
    def rebalancing(self) -> bool:
        return self._rebalance_began is not None

    # -- records -------------------------------------------------------------------------

    def fetched(self, tp: Partition, batch: BatchProgress, first: Record, now: float) -> None:
        """A run of `tp` was registered as `batch` (one timestamp read per run)."""
        pm = self.parts.get(tp)
        if pm is not None:
            pm.runs.append((batch, now, first.timestamp))

    def task_done(self, t: Task) -> None:
        """A task came back: its handler time, spread over the records it ran. (Once per task,
        so `Histogram.observe` is inlined here and in `settled`.)"""
        out = t.outcomes
        ran = len(t.records) if out is None else out.count(DONE) + out.count(FAILED)
        if ran:
            h = self.handler
            per = t.seconds / ran
            h.counts[bisect_left(BUCKETS, per)] += ran
            h.count += ran
            h.sum += t.seconds

    def settled(self, tp: Partition, first: Record) -> None:
        """Records of `tp` finished, `first` the earliest of them: an end-to-end sample (at most
        one per `_SAMPLE_EVERY`), and the partition's recovery time if they are its first."""
        if self._awaiting:
            pm = self._awaiting.pop(tp, None)
            if pm is not None:
                pm.recovery_s = time.monotonic() - pm.assigned_at
        now = time.time()
        if now < self._next_sample:
            return
        self._next_sample = now + _SAMPLE_EVERY
        stamp = first.timestamp
        if stamp is not None:
            age = now - stamp / 1000
            if age < 0:
                age = 0.0  # a producer clock ahead of ours
            h = self.end_to_end
            h.counts[bisect_left(BUCKETS, age)] += 1
            h.count += 1
            h.sum += age

    def commit_result(self, event: CommitEvent) -> None:
        if event.status == "sent":
            return
        if event.status == "failed":
            self.commit_failures += 1
        pm = self.parts.get(event.tp)
        if pm is not None:
            pm.last_commit_time = time.time()
            pm.last_commit_offset = event.offset
            pm.last_commit_error = event.error

    # -- snapshots -----------------------------------------------------------------------

    def rate(self, processed: int, now: float) -> tuple[float, float]:
        """Records finished per second over the window, and the window it covers."""
        samples = self._samples
        samples.append((now, processed))
        while len(samples) > 2 and now - samples[1][0] >= self._window:
            samples.popleft()
        then, before = samples[0]
        span = now - then
        return ((processed - before) / span if span > 0 else 0.0), span
