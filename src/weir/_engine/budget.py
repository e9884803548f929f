"""The in-flight budget: the one owner of every count of records registered and not finished.

Records count from registration to the end of their last attempt: queued in a lane, running,
waiting for a retry, read ahead. The budget holds the global and the per-partition counts and
bytes, the records read ahead of a partition's share, and the decisions that follow from them.
Every change goes through a method here, so `records == sum of the partitions' records` and
`bytes == sum of their bytes and read-ahead bytes` hold by construction (`check` verifies it).

Vocabulary, the same in code, stats, logs and docs (flow-control.md):
- *throttled*: at the high mark (`pause_records` / `pause_bytes`) each poll takes at most one
  record. Nothing is paused in the client, which keeps its prefetched data.
- *paused*: the client stops fetching a partition (librdkafka's pause, which drops that
  partition's prefetch). Reasons: `capacity` (the budget is full: every partition), `share`
  (the partition holds its share of a shared budget in reserve), `blocked` (a failure policy
  holds it, `weir._engine.failures`: a blocked record, or one waiting for a retry whose lane would
  otherwise fill the budget).
Both lift once the counts are below their low marks (`resume_*`): hysteresis, no flapping.

A blocked partition's records are *parked*: they stay registered (the watermark waits for them)
but leave every decision above, since the paused partition cannot add to them, and counted
they would hold the others throttled for as long as the block lasts. Memory then holds the
capacity for the other partitions plus what the blocked ones had when they blocked.

Shared budgets: librdkafka hands out one partition's data at a time, so with one lane per
partition the budget filled from one to three partitions and only as many workers ran.
Partition mode therefore shares the budget between partitions while handlers are slow
(`begin_turn`), key mode once it sees few keys hold it (`_check_starved`). While sharing, a
partition's lanes hold at most its share; what a consume call returns beyond it waits *read
ahead*: registered with its batch (the watermark waits for it), out of the lanes, its bytes in
the byte budget. A partition holding its part of `flow.read_ahead_records` is paused alone and
resumed by the owner loop once its reserve runs low.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Literal

from weir._engine.scheduling import Scheduler
from weir._engine.tasks import Assignment
from weir._engine.tracking import BatchProgress
from weir.config import ConsumerConfig
from weir.logs import get_logger
from weir.records import Partition, Record, size_of

__all__ = ["Budget", "PartitionBudget", "PauseReason"]

log = get_logger(__name__)

PauseReason = Literal["capacity", "share", "blocked"]


class PartitionBudget:
    """One owned partition's part of the budget."""

    __slots__ = (
        "ahead",
        "ahead_bytes",
        "ahead_records",
        "assignment",
        "blocked",
        "bytes",
        "over_share",
        "records",
    )

    def __init__(self, assignment: Assignment) -> None:
        self.assignment = assignment
        self.records = 0  # registered, in the lanes or running, not finished
        self.bytes = 0
        # Read ahead while partitions share the budget: registered with their batches (so the
        # watermark waits for them), not yet in the lanes. Their bytes count in the budget.
        self.ahead: deque[tuple[BatchProgress, list[Record]]] = deque()
        self.ahead_records = 0
        self.ahead_bytes = 0
        self.over_share = False  # paused alone: it holds a share in reserve
        self.blocked = False  # paused by a failure policy until a retry succeeds or a skip


class Budget:
    """Owner thread only."""

    def __init__(self, cfg: ConsumerConfig, scheduler: Scheduler) -> None:
        self._cfg = cfg
        self._flow = cfg.flow
        self._max_batch = cfg.max_batch_records
        self._scheduler = scheduler
        self.parts: dict[Partition, PartitionBudget] = {}
        self.records = 0  # in the lanes (read-ahead records are not counted here)
        self.bytes = 0  # in the lanes and read ahead
        self.throttled = False
        self.paused = False  # every partition paused at the capacity
        self.throttles = 0
        self.pauses = 0
        self.peak_records = 0
        self.peak_bytes = 0
        # Routes of different orderings: shared if some topic's is partition order.
        self.shared = "partition" in scheduler.modes
        self.sharing = False  # shared budgets apply now: taken once per turn by `begin_turn`
        self._resume: set[Partition] = set()  # paused alone, reserve low: resume them
        # Insertion-ordered (dicts, not sets of objects hashed by address): the order partitions
        # are admitted in is the order they were held back in, the same in every run.
        self._blocked: dict[PartitionBudget, None] = {}  # parked by a failure policy
        self._starved: dict[PartitionBudget, None] = {}  # read-ahead the capacity held back
        self._size_for = -1
        self._size = 1
        # Records above the capacity that a partition brought back when it ran again: its parked
        # records count at once, on top of what the others took meanwhile. The budget is full
        # until they are finished; no registration adds to them.
        self.unparked = 0

    # -- membership ----------------------------------------------------------------------

    def opened(self, a: Assignment) -> None:
        self.open(a)

    def closed(self, a: Assignment) -> None:
        self.close(a.tp)

    def open(self, assignment: Assignment) -> PartitionBudget:
        pb = self.parts[assignment.tp] = PartitionBudget(assignment)
        return pb

    def close(self, tp: Partition) -> None:
        """The partition was revoked or lost: everything it held leaves the budget."""
        pb = self.parts.pop(tp, None)
        if pb is None:
            return
        self.records -= pb.records
        self.bytes -= pb.bytes + pb.ahead_bytes
        self._resume.discard(tp)
        self._blocked.pop(pb, None)
        self._starved.pop(pb, None)
        self._settle_unparked()

    # -- records -------------------------------------------------------------------------

    def register(
        self, tp: Partition, batch: BatchProgress, recs: list[Record], nbytes: int
    ) -> bool:
        """Records of one polled batch: into the lanes, or read ahead while sharing. True if
        the partition now holds a full reserve and must be paused."""
        pb = self.parts[tp]
        if pb.ahead or self.sharing or len(recs) > self._flow.capacity_records - self.live:
            # Beyond the capacity (read-ahead admitted for another partition of the same
            # consume call may have used the room this call was sized for): it waits read
            # ahead, registered, until there is room.
            return self._hold(pb, batch, recs, nbytes)
        self._scheduler.submit(pb.assignment, batch, recs)
        self._add(pb, len(recs), nbytes)
        return False

    def finished(self, tp: Partition, count: int, nbytes: int) -> None:
        """Records of `tp` left the budget (finished, dead-lettered, or fenced)."""
        pb = self.parts.get(tp)
        if pb is None:
            return  # revoked or lost since: closing the partition released them
        pb.records -= count
        pb.bytes -= nbytes
        self.records -= count
        self.bytes -= nbytes
        if self.unparked:
            self._settle_unparked()
        if pb.ahead or pb.over_share:
            self._refill(pb)

    def readmitted(self, tp: Partition, count: int, nbytes: int) -> None:
        """Records that left the budget to wait for their outputs come back into it: their
        delivery failed, and the failure policy holds them again (`weir._engine.outputs`)."""
        pb = self.parts.get(tp)
        if pb is not None:
            self._add(pb, count, nbytes)

    def dropped(self, recs: Iterable[Record]) -> None:
        """Queued records that will never run (their partition stopped dispatching)."""
        for rec in recs:
            self.finished(rec.tp, 1, rec.size)

    def rewound(self, tp: Partition) -> None:
        """The client delivered offsets below the read position: what was read ahead of the
        old position is fetched again, so it leaves the budget."""
        pb = self.parts.get(tp)
        if pb is None:
            return
        self.bytes -= pb.ahead_bytes
        pb.ahead.clear()
        pb.ahead_records = pb.ahead_bytes = 0

    # -- blocked partitions ----------------------------------------------------------------

    def block(self, tp: Partition) -> bool:
        """A failure policy blocks `tp` (the caller pauses it in the client): its records are
        parked. True if it was not blocked yet."""
        pb = self.parts.get(tp)
        if pb is None or pb.blocked:
            return False
        pb.blocked = True
        self._blocked[pb] = None
        return True

    def unblock(self, tp: Partition) -> bool:
        """`tp` runs again: its records count again. True if it was blocked."""
        pb = self.parts.get(tp)
        if pb is None or not pb.blocked:
            return False
        pb.blocked = False
        self._blocked.pop(pb, None)
        self.unparked = max(0, self.live - self._flow.capacity_records)
        return True

    def _settle_unparked(self) -> None:
        self.unparked = max(0, min(self.unparked, self.live - self._flow.capacity_records))

    @property
    def live(self) -> int:
        """Records in flight that the decisions count: all but the parked ones."""
        if not self._blocked:
            return self.records
        return self.records - sum(pb.records for pb in self._blocked)

    @property
    def live_bytes(self) -> int:
        if not self._blocked:
            return self.bytes
        return self.bytes - sum(pb.bytes + pb.ahead_bytes for pb in self._blocked)

    def _add(self, pb: PartitionBudget, count: int, nbytes: int) -> None:
        pb.records += count
        pb.bytes += nbytes
        self.records += count
        self.bytes += nbytes
        if self.records > self.peak_records:
            self.peak_records = self.records
        if self.bytes > self.peak_bytes:
            self.peak_bytes = self.bytes

    # -- one turn of the owner loop --------------------------------------------------------

    def begin_turn(self) -> None:
        """Shared budgets apply while a share is more than one task: a partition's backlog then
        outlasts its worker's turn and would keep other partitions (and idle workers) out. With
        faster handlers a pause would only make librdkafka drop the partition's prefetched
        records and fetch them again."""
        self.sharing = self.shared and self._scheduler.turn_size() < self.share_size()

    def fetch_size(self) -> int:
        """How many records one consume call may return without passing the capacity."""
        return max(1, min(self._max_batch, self._flow.capacity_records - self.live))

    @property
    def full(self) -> bool:
        """No headroom left: the client must stop handing out records (a real pause)."""
        flow = self._flow
        return self.live >= flow.capacity_records or self.live_bytes >= flow.capacity_bytes

    def admit_starved(self) -> None:
        """Read-ahead records the capacity held back, once it has room again."""
        if not self._starved or self.live >= self._flow.capacity_records:
            return
        starved, self._starved = self._starved, {}
        for pb in starved:
            if pb.ahead and self.parts.get(pb.assignment.tp) is pb:
                self._admit(pb)
        self._scheduler.dispatch()

    def end_turn(self) -> tuple[list[Partition], list[Partition]]:
        """Throttle and pause decisions after a turn's work: (partitions to pause in the
        client, partitions to resume)."""
        event = self._update_throttle()
        if event == "throttled":
            log.debug("throttled", in_flight=self.records, bytes=self.bytes, sharing=self.sharing)
            if "key" in self._scheduler.modes and not self.shared:
                self._check_starved()
        elif event == "throttle_lifted":
            log.debug(
                "throttle_lifted", in_flight=self.records, bytes=self.bytes, sharing=self.sharing
            )
        parts = self.parts
        if self.full and not self.paused:
            self.paused = True
            self.pauses += 1
            log.debug("paused", reason="capacity", in_flight=self.records, bytes=self.bytes)
            return list(parts), []
        if event == "throttle_lifted" and self.paused:
            self.paused = False
            self._resume.clear()
            for pb in parts.values():
                if pb.over_share and self._reserve_low(pb):
                    pb.over_share = False  # drained during the global pause
            return [], [tp for tp, pb in parts.items() if not pb.over_share and not pb.blocked]
        if self._resume and not self.paused:
            ready = [
                tp
                for tp in self._resume
                if tp in parts and parts[tp].over_share and not parts[tp].blocked
            ]
            self._resume.clear()
            for tp in ready:
                parts[tp].over_share = False
            return [], ready
        return [], []

    def pause_reason(self, tp: Partition) -> PauseReason | None:
        """Why the budget wants `tp` paused in the client, if it does."""
        pb = self.parts.get(tp)
        if pb is None:
            return None
        if pb.blocked:
            return "blocked"
        if self.paused:
            return "capacity"
        if pb.over_share:
            return "share"
        return None

    def _update_throttle(self) -> Literal["throttled", "throttle_lifted"] | None:
        """While sharing, the count marks move up to the capacity (throttle) and the pause
        mark (lift): a throttle at the usual marks would stop every partition until the total
        fell to the resume mark, while the shares already bound it."""
        flow = self._flow
        if not self.throttled:
            mark = flow.capacity_records if self.sharing else flow.pause_records
            if self.live >= mark or self.live_bytes >= flow.pause_bytes:
                self.throttled = True
                self.throttles += 1
                return "throttled"
        elif not self.filling():
            self.throttled = False
            return "throttle_lifted"
        return None

    def filling(self) -> bool:
        """At or past a resume mark: the budget is in use, not idle (while throttled, this is
        what keeps the throttle on)."""
        flow = self._flow
        mark = flow.pause_records if self.sharing else flow.resume_records
        return self.live >= mark or self.live_bytes >= flow.resume_bytes

    # -- shares and read-ahead -------------------------------------------------------------

    def share_size(self) -> int:
        """A share: half an even split of the record capacity, so that the partitions holding
        their shares never fill the budget while others wait (the rest of it is the room a
        partition above its share from before sharing may still hold)."""
        n = len(self.parts)
        if n != self._size_for:
            self._size_for = n
            self._size = max(1, self._flow.capacity_records // max(1, 2 * n))
        return self._size

    def _hold(
        self, pb: PartitionBudget, batch: BatchProgress, recs: list[Record], nbytes: int
    ) -> bool:
        """Registered records of `pb`, behind what it already read ahead: the lanes get its
        share."""
        pb.ahead.append((batch, recs))
        pb.ahead_records += len(recs)
        pb.ahead_bytes += nbytes
        self.bytes += nbytes
        if self.bytes > self.peak_bytes:
            self.peak_bytes = self.bytes
        self._admit(pb)
        if self.sharing and not pb.over_share and self._reserve_full(pb):
            # Stop fetching the partition until its reserve runs low. librdkafka drops its
            # prefetch of it then, and a resumed partition fetches its producer batch again
            # from the position on: the larger the reserve, the less is fetched twice
            # (flow-control.md has the measurements).
            pb.over_share = True
            return True
        return False

    def _admit(self, pb: PartitionBudget) -> None:
        """Move records read ahead into the lanes: up to the partition's share while sharing,
        all of them once sharing stopped, and never past the record capacity. (A partition can
        hold more than its share from before key mode started to share; what the capacity holds
        back waits in `_starved` for room.)"""
        if not pb.assignment.dispatching:
            return
        want = self.share_size() - pb.records if self.sharing else pb.ahead_records
        free = self._flow.capacity_records - self.live
        if want > free:
            self._starved[pb] = None
        room = min(want, free)
        ahead = pb.ahead
        while room > 0 and ahead:
            batch, recs = ahead[0]
            if len(recs) > room:
                ahead[0] = (batch, recs[room:])
                recs = recs[:room]
            else:
                ahead.popleft()
            n = len(recs)
            nbytes = sum(map(size_of, recs))
            self._scheduler.submit(pb.assignment, batch, recs)
            pb.ahead_records -= n
            pb.ahead_bytes -= nbytes
            self.bytes -= nbytes  # moved, not added: _add counts them again in the lanes
            self._add(pb, n, nbytes)
            room -= n

    def _refill(self, pb: PartitionBudget) -> None:
        """Records of `pb` left the budget: refill its lanes from its reserve at three quarters
        of a share (a quarter share at a time, not record by record, and its lane never runs
        dry between two owner turns), and resume it once the reserve runs low."""
        if pb.ahead and pb.records <= self.share_size() * 3 // 4:
            self._admit(pb)
        if pb.over_share and self._reserve_low(pb):
            self._resume.add(pb.assignment.tp)

    def _reserve_low(self, pb: PartitionBudget) -> bool:
        """A partition paused with a full reserve fetches again below half a share: the refetch
        (5-15 ms, a seek wakes the fetcher) then lands while its lane still holds its share and
        the rest of the reserve."""
        return not self.sharing or pb.ahead_records < self.share_size() // 2

    def _reserve_full(self, pb: PartitionBudget) -> bool:
        """The partition holds its part of the read-ahead (`flow.read_ahead_records`, at least
        a share), or its part of the client's byte headroom."""
        n = max(1, len(self.parts))
        flow = self._flow
        return (
            pb.ahead_records >= max(self.share_size(), flow.read_ahead_records // n)
            or pb.ahead_bytes >= flow.headroom_bytes // n
        )

    def _check_starved(self) -> None:
        """Key mode, the budget just filled up. If workers idle while most of it waits in busy
        lanes, the keys in flight are too few to run in parallel: share the budget between
        partitions from now on, for the rest of the run (the keys of a topic do not change with
        an assignment). A budget that fills with many keys keeps every worker busy or its
        records runnable, and never turns this on."""
        sched = self._scheduler
        if sched.tasks_out() >= sched.workers.slots or 2 * sched.waiting() < self.records:
            return
        self.shared = True
        idle = (
            # An async member has no worker threads: its coroutines are what is missing.
            "fewer records run than max_in_flight allows"
            if sched.workers.concurrent
            else "workers idle"
        )
        log.info(
            "budget_shared",
            reason=f"{idle} while the budget waits behind a few busy keys",
            partitions=len(self.parts),
            in_flight=self.records,
        )

    # -- reading -------------------------------------------------------------------------

    @property
    def read_ahead_records(self) -> int:
        return sum(pb.ahead_records for pb in self.parts.values())

    @property
    def read_ahead_bytes(self) -> int:
        return sum(pb.ahead_bytes for pb in self.parts.values())

    def check(self) -> None:
        """The invariants, for tests: raises AssertionError naming the one that broke."""
        parts = self.parts.values()
        records = sum(pb.records for pb in parts)
        nbytes = sum(pb.bytes + pb.ahead_bytes for pb in parts)
        if records != self.records:
            raise AssertionError(f"budget records {self.records} != partitions' {records}")
        if nbytes != self.bytes:
            raise AssertionError(f"budget bytes {self.bytes} != partitions' {nbytes}")
        for pb in parts:
            ahead = sum(len(recs) for _, recs in pb.ahead)
            ahead_bytes = sum(map(size_of, (r for _, recs in pb.ahead for r in recs)))
            if ahead != pb.ahead_records or ahead_bytes != pb.ahead_bytes:
                raise AssertionError(f"{pb.assignment.tp}: read-ahead counts drifted")
            if pb.records < 0 or pb.bytes < 0:
                raise AssertionError(f"{pb.assignment.tp}: negative counts")
        if self.live > self._flow.capacity_records + self.unparked:
            raise AssertionError(
                f"{self.live} records in flight (not parked) > capacity"
                + (f" + {self.unparked} brought back by an unblock" if self.unparked else "")
            )
        if set(self._blocked) != {pb for pb in parts if pb.blocked}:
            raise AssertionError("the parked partitions are not the blocked ones")
