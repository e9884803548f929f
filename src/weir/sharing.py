"""Shares of the record budget between partitions, and the records read ahead of them.

librdkafka hands out one partition's data at a time: with one lane per partition the budget
filled from one to three partitions and only as many workers ran. Partition mode therefore
always shares the budget between partitions (while handlers are slow: `Shares.update`), key mode
once it sees few keys hold it (`Shares.check_starved`: 16 partitions of one key each ran at 1.2k
records/s with 1 ms handlers, where 16k are possible).

While sharing, a partition's lanes hold at most its share. What a consume call returns beyond it
waits *read ahead*: registered with its batch (the watermark waits for it), out of the lanes,
its bytes in the byte budget. A partition holding its part of `flow.read_ahead_records` is
paused alone; the owner loop resumes it (never a callback, where the fetcher must not be woken)
once its reserve runs low. flow-control.md has the rules and the measurements.
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from weir.config import ConsumerConfig
from weir.flow import FlowControl
from weir.rebalance import PartitionState
from weir.records import Partition, Record, size_of
from weir.scheduling import Scheduler
from weir.tracking import BatchProgress

__all__ = ["Shares"]

log = structlog.get_logger(__name__)


class Shares:
    """Owner thread only."""

    def __init__(
        self,
        cfg: ConsumerConfig,
        flow: FlowControl,
        scheduler: Scheduler,
        partitions: Mapping[Partition, PartitionState],
    ) -> None:
        self._cfg = cfg
        self._flow = flow
        self._scheduler = scheduler
        self._partitions = partitions  # the owned partitions, kept up to date by Ownership
        self.shared = cfg.ordering == "partition"
        self.active = False  # sharing now: taken once per turn of the loop by `update`
        # Partitions paused alone whose reserve ran low: the loop resumes them.
        self.resume: set[Partition] = set()
        # Partitions with records read ahead that the record capacity held back.
        self.starved: set[PartitionState] = set()
        self._size_for = -1
        self._size = 1

    def update(self) -> bool:
        """Shared budgets apply while a share is more than one task: a partition's backlog then
        outlasts its worker's turn and would keep other partitions (and idle workers) out. With
        faster handlers a pause would only make librdkafka drop the partition's prefetched
        records and fetch them again."""
        self.active = self.shared and self._scheduler.task_size() < self.size()
        return self.active

    def size(self) -> int:
        """A share: half an even split of the record capacity, so that the partitions holding
        their shares never fill the budget while others wait (the rest of it is the room a
        partition above its share from before sharing may still hold)."""
        n = len(self._partitions)
        if n != self._size_for:
            self._size_for = n
            self._size = max(1, self._cfg.flow.capacity_records // max(1, 2 * n))
        return self._size

    def hold(
        self, st: PartitionState, batch: BatchProgress, recs: list[Record], nbytes: int
    ) -> bool:
        """Registered records of `st`, behind what it already read ahead: the lanes get its
        share. True if the partition now holds a full reserve and must be paused."""
        st.ahead.append((batch, recs))
        st.ahead_records += len(recs)
        st.ahead_bytes += nbytes
        self._flow.add(0, nbytes)
        self.admit(st)
        if self.active and not st.over_share and self._reserve_full(st):
            # Stop fetching the partition until its reserve runs low. librdkafka drops its
            # prefetch of it then, and a resumed partition fetches its producer batch again
            # from the position on: the larger the reserve, the less is fetched twice (8
            # partitions of one 1,500-record batch each: librdkafka received each record 10.9
            # times with no reserve, 4.3 with a share, 1.0 with 1,500).
            st.over_share = True
            return True
        return False

    def admit(self, st: PartitionState) -> None:
        """Move records read ahead into the lanes: up to the partition's share while sharing,
        all of them once sharing stopped, and never past the record capacity. (A partition can
        hold more than its share from before key mode started to share; what the capacity holds
        back waits in `starved` for room.)"""
        if not st.assignment.dispatching:
            return
        want = self.size() - st.records if self.active else st.ahead_records
        free = self._cfg.flow.capacity_records - self._flow.records
        if want > free:
            self.starved.add(st)
        room = min(want, free)
        ahead = st.ahead
        while room > 0 and ahead:
            batch, recs = ahead[0]
            if len(recs) > room:
                ahead[0] = (batch, recs[room:])
                recs = recs[:room]
            else:
                ahead.popleft()
            n = len(recs)
            nbytes = sum(map(size_of, recs))
            self._scheduler.submit(st.assignment, batch, recs)
            st.records += n
            st.bytes += nbytes
            st.ahead_records -= n
            st.ahead_bytes -= nbytes
            self._flow.add(n, 0)
            room -= n

    def admit_starved(self) -> None:
        """The capacity has room again: admit what it held back."""
        starved, self.starved = self.starved, set()
        for st in starved:
            if st.ahead and self._partitions.get(st.assignment.tp) is st:
                self.admit(st)
        self._scheduler.dispatch()

    def finished(self, st: PartitionState) -> None:
        """Records of `st` left the budget: refill its lanes from its reserve at three quarters
        of a share (a quarter share at a time, not record by record, and its lane never runs
        dry between two owner turns), and resume it once the reserve runs low."""
        if st.ahead and st.records <= self.size() * 3 // 4:
            self.admit(st)
        if st.over_share and self.reserve_low(st):
            self.resume.add(st.assignment.tp)

    def reserve_low(self, st: PartitionState) -> bool:
        """A partition paused with a full reserve fetches again below half a share: the refetch
        (5-15 ms, a seek wakes the fetcher) then lands while its lane still holds its share and
        the rest of the reserve."""
        return not self.active or st.ahead_records < self.size() // 2

    def _reserve_full(self, st: PartitionState) -> bool:
        """The partition holds its part of the read-ahead (`flow.read_ahead_records`, at least
        a share), or its part of the client's byte headroom."""
        n = max(1, len(self._partitions))
        flow = self._cfg.flow
        return (
            st.ahead_records >= max(self.size(), flow.read_ahead_records // n)
            or st.ahead_bytes >= flow.headroom_bytes // n
        )

    def check_starved(self) -> None:
        """Key mode, the budget just filled up. If workers idle while most of it waits in busy
        lanes, the keys in flight are too few to run in parallel: share the budget between
        partitions from now on, for the rest of the run (the keys of a topic do not change with
        an assignment). A budget that fills with many keys keeps every worker busy or its
        records runnable, and never turns this on."""
        sched = self._scheduler
        if sched.tasks_out() >= self._cfg.workers or 2 * sched.waiting() < self._flow.records:
            return
        self.shared = True
        log.info(
            "budget_shared",
            reason="workers idle while the budget waits behind a few busy keys",
            partitions=len(self._partitions),
            in_flight=self._flow.records,
        )
