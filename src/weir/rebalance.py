"""Assign, revoke and lost: who owns which partition locally, and the hand-off rules.

Revoke (graceful): stop dispatch, drop queued records, wait for in-flight ones under one budget
while draining completions, commit the finished watermark synchronously, then fence. Lost (the group
already moved on): fence and cancel at once, never commit. Both run on the owner thread inside the
client's rebalance callback.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

import structlog

from weir.committing import Committer
from weir.flow import FlowControl
from weir.records import Handler, Partition, Record
from weir.scheduling import Assignment, Scheduler
from weir.tracking import BatchProgress, PartitionProgress

__all__ = ["Ownership", "PartitionState"]

log = structlog.get_logger(__name__)

_tokens = itertools.count(1)


class PartitionState:
    """Everything the owner keeps for one owned partition."""

    __slots__ = (
        "ahead",
        "ahead_bytes",
        "ahead_records",
        "assignment",
        "bytes",
        "over_share",
        "progress",
        "records",
    )

    def __init__(self, tp: Partition) -> None:
        self.assignment = Assignment(tp, next(_tokens))
        self.progress = PartitionProgress(self.assignment.token)
        self.records = 0  # in the lanes and not finished: this partition's share of the budget
        self.bytes = 0
        # Read ahead while partitions share the budget: registered with their batches (so the
        # watermark waits for them), not yet in the lanes. Their bytes count in the budget.
        self.ahead: deque[tuple[BatchProgress, list[Record]]] = deque()
        self.ahead_records = 0
        self.ahead_bytes = 0
        self.over_share = False  # paused alone: it holds a share in reserve

    def drop_ahead(self) -> int:
        """Forget the records read ahead (revoked, lost or rewound); returns their bytes."""
        nbytes = self.ahead_bytes
        self.ahead.clear()
        self.ahead_records = self.ahead_bytes = 0
        return nbytes

    def rewind(self) -> None:
        """The client delivered offsets below the read position (a seek, an offset reset, or
        messages fetched before a rebalance): start a new tracking epoch from this batch. Work of
        the old epoch may still finish, but it can no longer move the watermark."""
        self.progress.revoke()
        self.progress = PartitionProgress(next(_tokens))


Drain = Callable[[float, list[Assignment]], None]
CommitSync = Callable[[dict[Partition, int]], None]
Pauser = Callable[[Sequence[Partition], bool], None]


class Ownership:
    def __init__(
        self,
        handler: Handler,
        scheduler: Scheduler,
        committer: Committer,
        flow: FlowControl,
        revoke_timeout: float,
    ) -> None:
        self._handler = handler
        self._scheduler = scheduler
        self._committer = committer
        self._flow = flow
        self._revoke_timeout = revoke_timeout
        self.partitions: dict[Partition, PartitionState] = {}
        # Set at shutdown: a revoke served inside close() gets what is left of the shutdown
        # budget, never a fresh revoke_timeout.
        self.deadline_cap: float | None = None
        self.rebalances = 0
        self.revoked_total = 0
        self.lost_total = 0

    def assign(self, tps: Iterable[Partition], set_paused: Pauser) -> list[Partition]:
        added = []
        for tp in tps:
            if tp in self.partitions:
                continue  # eager re-delivery of an owned partition keeps its state
            self.partitions[tp] = PartitionState(tp)
            self._committer.track(tp)
            added.append(tp)
        self.rebalances += 1
        if added:
            # librdkafka keeps its own pause flag across rebalances: state it explicitly so a
            # partition that comes back matches weir's paused set, whichever way it was left.
            set_paused(added, self._flow.client_paused)
        log.info(
            "partitions_assigned",
            partitions=[str(tp) for tp in added],
            tokens={str(tp): self.partitions[tp].assignment.token for tp in added},
        )
        self._call_hook("on_assigned", added)
        return added

    def revoke(self, tps: Iterable[Partition], drain: Drain, commit_sync: CommitSync) -> None:
        started = time.monotonic()
        deadline = started + self._revoke_timeout
        if self.deadline_cap is not None:
            deadline = min(deadline, self.deadline_cap)
        owned = {tp for tp in tps if tp in self.partitions}
        assignments = [self.partitions[tp].assignment for tp in owned]
        self.rebalances += 1
        for a in assignments:
            a.dispatching = False
        self._drop_queued(assignments)
        drain(deadline, assignments)
        left = self._scheduler.running(assignments)
        offsets: dict[Partition, int] = {}
        for tp in owned:
            off = self.partitions[tp].progress.committable()
            if off is not None:
                offsets[tp] = off
        to_send = self._committer.to_send(offsets, unconfirmed=True)
        if to_send:
            commit_sync(to_send)
        for tp in owned:
            st = self.partitions.pop(tp)
            if left:
                st.assignment.cancel.set()
            st.progress.revoke()
            self._release(st)
        self._scheduler.forget(assignments)
        self._committer.forget(owned)
        self.revoked_total += len(owned)
        log.info(
            "partitions_revoked",
            partitions=sorted(str(tp) for tp in owned),
            committed={str(tp): off for tp, off in to_send.items()},
            unfinished=left,
            seconds=round(time.monotonic() - started, 3),
        )
        self._call_hook("on_revoked", sorted(owned))

    def lost(self, tps: Iterable[Partition]) -> None:
        owned = {tp for tp in tps if tp in self.partitions}
        self.rebalances += 1
        gone = []
        for tp in owned:
            st = self.partitions.pop(tp)
            st.assignment.dispatching = False
            st.assignment.cancel.set()
            st.progress.revoke()
            self._release(st)
            gone.append(st.assignment)
        self._scheduler.drop_queued(gone)
        self._scheduler.forget(gone)
        self._committer.forget(owned)
        self.lost_total += len(owned)
        log.warning("partitions_lost", partitions=sorted(str(tp) for tp in owned))
        self._call_hook("on_lost", sorted(owned))

    def stop_dispatch(self) -> None:
        """Shutdown: fence every queued record; running ones finish or are cancelled later."""
        for st in self.partitions.values():
            st.assignment.dispatching = False
        self._drop_queued(self.assignments())

    def cancel_all(self) -> None:
        for st in self.partitions.values():
            st.assignment.cancel.set()

    def assignments(self) -> list[Assignment]:
        return [st.assignment for st in self.partitions.values()]

    def fence_progress(self) -> None:
        """After the final shutdown commit nothing may move a watermark: the revoke that close()
        serves then commits nothing new, whatever finishes meanwhile."""
        for st in self.partitions.values():
            st.progress.revoke()

    def _drop_queued(self, assignments: list[Assignment]) -> None:
        for rec in self._scheduler.drop_queued(assignments):
            st = self.partitions.get(rec.tp)
            if st is not None:
                st.records -= 1
                st.bytes -= rec.size
                self._flow.remove(1, rec.size)

    def _release(self, st: PartitionState) -> None:
        self._flow.remove(st.records, st.bytes + st.drop_ahead())
        st.records = 0
        st.bytes = 0

    def _call_hook(self, name: str, tps: list[Partition]) -> None:
        if not tps:
            return
        try:
            getattr(self._handler, name)(tps)
        except Exception:
            # A failing hook must not break the hand-off protocol of the whole member.
            log.exception("handler_hook_failed", hook=name)
