"""Assign, revoke and lost: which partitions this member owns, and the hand-off rules.

Revoke (graceful): stop dispatch, drop queued records, wait for in-flight ones under one budget
while draining completions, commit the finished watermark synchronously, then fence. Lost (the
group already moved on): fence and cancel at once, never commit. Both run on the owner thread
inside the client's rebalance callback. A handler call still running when its partition goes
(a revoke past its budget, or lost) keeps its lane: a new assignment of the same partition waits
for it (`Scheduler`), and its worker is replaced (`Workers.abandon`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Literal, Protocol

from weir._engine.budget import Budget
from weir._engine.callbacks import Callbacks, callback_name
from weir._engine.clock import SYSTEM, Clock
from weir._engine.committing import Committer
from weir._engine.scheduling import Scheduler
from weir._engine.tasks import Assignment
from weir._engine.tracking import PartitionProgress
from weir.logs import get_logger
from weir.records import Handler, Partition

__all__ = ["Ownership", "PartitionState"]

log = get_logger(__name__)

_tokens = itertools.count(1)


class PartitionState:
    """What the owner keeps for one owned partition: its assignment and its watermark."""

    __slots__ = ("assignment", "progress")

    def __init__(self, tp: Partition) -> None:
        self.assignment = Assignment(tp, next(_tokens))
        self.progress = PartitionProgress(self.assignment.token)

    def rewind(self) -> None:
        """The client delivered offsets below the read position (a seek, an offset reset, or
        messages fetched before a rebalance): start a new tracking epoch from this batch. Work of
        the old epoch may still finish, but it can no longer move the watermark."""
        self.progress.revoke()
        self.progress = PartitionProgress(next(_tokens))


class Tracker(Protocol):
    """A part of the member that keeps state per owned partition. `Ownership` alone tells it
    when a partition is opened (assigned) and closed (revoked, lost, or fenced), in the order
    the trackers were registered (`track`); no other code opens or forgets their state."""

    def opened(self, a: Assignment) -> None: ...

    def closed(self, a: Assignment) -> None: ...


Scope = Literal["partition", "assignment"]
"""How long a tracker's state lives: as long as the member owns the partition, or only as
long as one assignment of it (an aborted transaction's `reset` starts a new one in place)."""

Drain = Callable[[float, list[Assignment]], None]
CommitSync = Callable[[dict[Partition, int | None]], dict[Partition, int]]


class Ownership:
    def __init__(
        self,
        handler: Handler,
        scheduler: Scheduler,
        committer: Committer,
        budget: Budget,
        callbacks: Callbacks,
        revoke_timeout_s: float,
        *,
        hook: Callable[[Callable[..., object]], Callable[..., object]] | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        self._clock = clock
        self._handler = handler
        # Wraps a handler hook for calling (an async hook runs on the handler's event loop).
        self._hook = hook
        self._scheduler = scheduler
        self._committer = committer
        self._budget = budget
        self._callbacks = callbacks
        self._revoke_timeout = revoke_timeout_s
        self.partitions: dict[Partition, PartitionState] = {}
        # Set at shutdown: a revoke served inside close() gets what is left of the shutdown
        # budget, never a fresh revoke_timeout_s.
        self.deadline_cap: float | None = None
        self.rebalances = 0
        self.revoked_total = 0
        self.lost_total = 0
        self._trackers: list[tuple[Tracker, Scope]] = []

    def track(self, tracker: Tracker, scope: Scope = "partition") -> None:
        """Register a part that keeps state per partition (`Tracker`)."""
        self._trackers.append((tracker, scope))

    def _opened(self, a: Assignment, *, reset: bool = False) -> None:
        for tracker, scope in self._trackers:
            if not reset or scope == "assignment":
                tracker.opened(a)

    def _closed(self, a: Assignment, *, reset: bool = False) -> None:
        for tracker, scope in self._trackers:
            if not reset or scope == "assignment":
                tracker.closed(a)

    def assign(
        self,
        tps: Iterable[Partition],
        prepare: Callable[[list[Partition]], None] | None = None,
    ) -> list[Partition]:
        """New partitions get their state; `prepare(added)` runs before `on_assigned` (their
        fetch state, fence epochs, start offsets), so the hook sees them ready."""
        added = []
        for tp in tps:
            if tp in self.partitions:
                continue  # eager re-delivery of an owned partition keeps its state
            st = self.partitions[tp] = PartitionState(tp)
            self._opened(st.assignment)
            self._scheduler.assigned(st.assignment)
            added.append(tp)
        self.rebalances += 1
        log.info(
            "partitions_assigned",
            partitions=[str(tp) for tp in added],
            tokens={str(tp): self.partitions[tp].assignment.token for tp in added},
        )
        if prepare is not None and added:
            prepare(added)
        self._call_hook("on_assigned", added)
        return added

    def revoke(self, tps: Iterable[Partition], drain: Drain, commit_sync: CommitSync) -> None:
        started = self._clock.monotonic()
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
        # A partition may have gone while draining (fenced by a fence, reset by an aborted
        # transaction): only what still holds its assignment is revoked here.
        owned = {
            tp
            for tp in owned
            if tp in self.partitions and self.partitions[tp].assignment in assignments
        }
        left = self._scheduler.running(assignments)
        offsets = {tp: self.partitions[tp].progress.committable() for tp in owned}
        to_send = commit_sync(offsets)
        # What the broker has for them, as far as this member knows: the last offset it
        # confirmed, sent now or earlier (None: nothing committed during this assignment).
        committed = {str(tp): self._committer.confirmed(tp) for tp in sorted(owned)}
        gone = []
        for tp in owned:
            st = self.partitions.pop(tp)
            if left:
                st.assignment.cancel.set()
            st.progress.revoke()
            gone.append(st.assignment)
        if left:
            self._scheduler.workers.abandon(assignments)
        self._scheduler.forget(assignments)
        for a in gone:
            self._closed(a)
        self.revoked_total += len(owned)
        log.info(
            "partitions_revoked",
            partitions=sorted(str(tp) for tp in owned),
            committed=committed,
            sent={str(tp): off for tp, off in to_send.items()},
            unfinished=left,
            seconds=round(self._clock.monotonic() - started, 3),
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
            gone.append(st.assignment)
        self._scheduler.drop_queued(gone)
        if self._scheduler.running(gone):
            self._scheduler.workers.abandon(gone)
        self._scheduler.forget(gone)
        for a in gone:
            self._closed(a)
        self.lost_total += len(owned)
        log.warning("partitions_lost", partitions=sorted(str(tp) for tp in owned))
        self._call_hook("on_lost", sorted(owned))

    def reset(self, tps: Iterable[Partition], *, quiet: bool = False) -> list[Assignment]:
        """Start these owned partitions over, locally (an aborted transaction: their progress
        since the last commit did not count; an operator's seek). Their work in flight is
        fenced and cancelled, queued records dropped, their budget released; each gets a new
        assignment with a new token. No hook runs and nothing is committed: the client keeps
        the partitions. Returns the old assignments; `quiet`: the caller logs why."""
        old = []
        for tp in tps:
            st = self.partitions.get(tp)
            if st is None:
                continue
            a = st.assignment
            a.dispatching = False
            a.cancel.set()
            st.progress.revoke()
            old.append(a)
        self._budget.dropped(self._scheduler.drop_queued(old))
        if self._scheduler.running(old):
            self._scheduler.workers.abandon(old)
        self._scheduler.forget(old)
        for a in old:
            tp = a.tp
            self._closed(a, reset=True)
            st = self.partitions[tp] = PartitionState(tp)
            st.assignment.epoch = a.epoch  # the same owner, the same fence epoch
            self._opened(st.assignment, reset=True)
        if old and not quiet:
            log.warning("partitions_reset", partitions=sorted(str(a.tp) for a in old))
        return old

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
        self._budget.dropped(self._scheduler.drop_queued(assignments))

    def _call_hook(self, name: str, tps: list[Partition]) -> None:
        if not tps:
            return
        hook = getattr(self._handler, name)
        call = hook if self._hook is None else self._hook(hook)
        self._callbacks.call(
            callback_name(hook), call, tps, hook_name=name, partitions=[str(tp) for tp in tps]
        )
