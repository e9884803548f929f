"""Lanes per ordering mode, the worker pool and the completion queue.

Lane state is touched only by the owner thread: a lane's next record is released when the owner
drains the completion of the one before it, so workers never share mutable ordering state. Workers
see only the ready queue, the handler and the per-assignment fence.
"""

from __future__ import annotations

import enum
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import Literal

import structlog

from weir.records import Context, Handler, Partition, Record
from weir.tracking import BatchProgress

__all__ = ["Assignment", "Completion", "Outcome", "Scheduler", "Work"]

log = structlog.get_logger(__name__)

Ordering = Literal["key", "partition", "unordered"]


class Assignment:
    """One partition's ownership by this member, from assign to revoke/lost.

    Workers read `dispatching` before they run a record: once the owner clears it, queued records
    of that assignment are fenced without running. `cancel` is what `Context.cancelled` reads.
    """

    __slots__ = ("cancel", "dispatching", "token", "tp")

    def __init__(self, tp: Partition, token: int) -> None:
        self.tp = tp
        self.token = token
        self.dispatching = True
        self.cancel = threading.Event()

    def __repr__(self) -> str:
        return f"Assignment({self.tp}, token={self.token}, dispatching={self.dispatching})"


class Outcome(enum.Enum):
    DONE = "done"
    FAILED = "failed"
    FENCED = "fenced"  # not run: its assignment stopped dispatching before a worker took it


class Work:
    __slots__ = ("assignment", "attempt", "batch", "lane", "record", "registered_at", "started")

    def __init__(
        self, record: Record, batch: BatchProgress, assignment: Assignment, registered_at: float
    ) -> None:
        self.record = record
        self.batch = batch
        self.assignment = assignment
        self.attempt = 1
        self.lane: Hashable | None = None
        self.registered_at = registered_at
        # Set by the worker that takes it, before the fence check: the owner waits at a revoke
        # only for records some worker has taken, not for ones still in the ready queue.
        self.started = False


class Completion:
    __slots__ = ("duration", "error", "outcome", "work")

    def __init__(
        self, work: Work, outcome: Outcome, error: BaseException | None, duration: float
    ) -> None:
        self.work = work
        self.outcome = outcome
        self.error = error
        self.duration = duration


def _lane_of(ordering: Ordering) -> Callable[[Record], Hashable | None]:
    if ordering == "key":
        # Null keys share one lane per partition: they have no identity to parallelise by.
        return lambda r: (r.topic, r.partition, r.key)
    if ordering == "partition":
        return lambda r: (r.topic, r.partition)
    return lambda r: None


class Scheduler:
    """Owner-side lanes plus a pool of worker threads feeding one completion queue."""

    def __init__(self, handler: Handler, ordering: Ordering, workers: int) -> None:
        self._handler = handler
        self._lane_of = _lane_of(ordering)
        self._lanes: dict[Hashable, deque[Work]] = {}
        self._ready: queue.SimpleQueue[Work | None] = queue.SimpleQueue()
        self.completions: queue.SimpleQueue[Completion] = queue.SimpleQueue()
        # Records handed to workers and not yet back, per assignment (not per partition: work
        # left over from an earlier assignment of the same partition must not hold up this one).
        self._outstanding: dict[Assignment, set[Work]] = {}
        self._threads = [
            threading.Thread(target=self._worker, name=f"weir-worker-{i}", daemon=True)
            for i in range(workers)
        ]
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            for t in self._threads:
                t.start()

    def stop(self, timeout: float) -> bool:
        """Ask every worker to exit; True if all did within `timeout`. Never blocks longer: a
        handler stuck past the budget is left behind on its daemon thread."""
        for _ in self._threads:
            self._ready.put(None)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            if t.is_alive():
                t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    # -- owner thread ----------------------------------------------------------------------

    def submit(self, work: Work) -> None:
        lane = self._lane_of(work.record)
        if lane is None:
            self._release(work)
            return
        work.lane = lane
        waiting = self._lanes.get(lane)
        if waiting is None:
            self._lanes[lane] = deque((work,))
            self._release(work)
        else:
            waiting.append(work)

    def _release(self, work: Work) -> None:
        a = work.assignment
        out = self._outstanding.get(a)
        if out is None:
            self._outstanding[a] = {work}
        else:
            out.add(work)
        self._ready.put(work)

    def returned(self, work: Work) -> None:
        """A completion came back: it no longer counts as outstanding."""
        a = work.assignment
        out = self._outstanding.get(a)
        if out is not None:
            out.discard(work)
            if not out:
                del self._outstanding[a]

    def advance(self, work: Work) -> None:
        """The record is finished (or fenced): release the next one of its lane."""
        if work.lane is None:
            return
        waiting = self._lanes.get(work.lane)
        if waiting is None or not waiting or waiting[0] is not work:
            return
        waiting.popleft()
        if waiting:
            self._release(waiting[0])
        else:
            del self._lanes[work.lane]

    def resubmit(self, work: Work) -> None:
        """Run a held lane head again (a retry) without giving up its place."""
        self._release(work)

    def outstanding(self, assignments: Iterable[Assignment] | None = None) -> int:
        """Records handed to workers and not back yet (started or still in the ready queue)."""
        if assignments is None:
            return sum(len(s) for s in self._outstanding.values())
        return sum(len(self._outstanding.get(a, ())) for a in assignments)

    def running(self, assignments: Iterable[Assignment]) -> int:
        """Outstanding records of these assignments that a worker has taken: what a revoke or
        shutdown waits for. Records still in the ready queue of a fenced assignment come back
        without running."""
        return sum(1 for a in assignments for w in self._outstanding.get(a, ()) if w.started)

    def drop_queued(self, tps: set[Partition]) -> list[Work]:
        """Remove records of `tps` that no worker has been handed yet; lane heads already
        released stay (they come back fenced or finished). Returns what was dropped."""
        dropped: list[Work] = []
        for waiting in self._lanes.values():
            if waiting[0].assignment.tp in tps:
                while len(waiting) > 1:
                    dropped.append(waiting.pop())
        return dropped

    def forget(self, tps: set[Partition]) -> None:
        """Remove every lane of `tps` (their late completions are ignored by the fence)."""
        for lane in [k for k, w in self._lanes.items() if w[0].assignment.tp in tps]:
            del self._lanes[lane]

    @property
    def lanes(self) -> int:
        return len(self._lanes)

    # -- worker threads --------------------------------------------------------------------

    def _worker(self) -> None:
        handler = self._handler
        ready = self._ready
        done = self.completions
        clock = time.perf_counter
        while True:
            work = ready.get()
            if work is None:
                return
            work.started = True
            a = work.assignment
            if not a.dispatching:
                done.put(Completion(work, Outcome.FENCED, None, 0.0))
                continue
            rec = work.record
            ctx = Context(a.token, work.attempt, rec.event_id, a.cancel)
            t0 = clock()
            try:
                handler.handle(rec, ctx)
            except BaseException as exc:
                done.put(Completion(work, Outcome.FAILED, exc, clock() - t0))
            else:
                done.put(Completion(work, Outcome.DONE, None, clock() - t0))
