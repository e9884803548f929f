"""Settling: the one way records become finished, and what comes back from the workers.

Workers hand every task back on one completion queue (and long tasks report their finished
records as they go); the owner drains it here (`drain`) and settles what it finds. Records are
finished in exactly one place, `_finished`, whichever way they got there:

- **handled**: a handler returned for them (a task's progress, or its end);
- **given up**: a failure policy finished them without success (a confirmed dead letter, an
  operator's `skip`);
- **replayed**: an earlier owner finished them (its committed offset map): they never run here.

Finishing does the same for every way:

1. they leave the budget (replayed records never entered it);
2. they move their batch's watermark, if their assignment is still the partition's and not
   cancelled: a late completion of a revoked, lost or rewound assignment moves nothing;
3. they count toward the next commit (`Committer.finished`) and toward the open transaction's
   record bound (`transaction_max_records`): every record whose offset the next commit covers;
4. `processed` counts the handled and the given up (what this member decided); replayed
   records are counted by `ReplayMaps.skipped`;
5. handled records only: their outputs go into the open transaction, their latency into the
   metrics, and their assignment's failure state learns that a retry succeeded.

Records that leave the budget without being finished: fenced ones (their assignment was
cancelled while they ran) are released (`_released`); failed ones stay in the budget, held by
the failure policy, until it finishes them (`given_up`) or runs them again. Records waiting for
their at-least-once outputs may leave it before they are finished (`weir._engine.outputs`).
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterable, Sequence
from itertools import groupby
from typing import Literal

from weir._engine.budget import Budget
from weir._engine.clock import SYSTEM, Clock
from weir._engine.committing import Committer
from weir._engine.failures import Failed, Failures
from weir._engine.metrics import Metrics
from weir._engine.outputs import Outputs
from weir._engine.ownership import Ownership, PartitionState
from weir._engine.scheduling import Scheduler
from weir._engine.tasks import DONE, FAILED, FENCED, Assignment, Task
from weir._engine.tracking import BatchProgress
from weir._engine.transactions import Transactions
from weir._engine.workers import Progress, Workers
from weir.errors import FencedError
from weir.logs import get_logger
from weir.records import FlushContext, Partition, Record, offset_of, size_of

__all__ = ["Settlement"]

log = get_logger(__name__)

How = Literal["handled", "flushed", "given_up", "replayed"]
# Records a handler returned, waiting for the flush hook: their assignment, the records, their
# batches, what writes their outputs.
_Buffered = tuple[
    Assignment, Sequence[Record], Sequence[BatchProgress] | BatchProgress, Callable[[], None] | None
]

# The longest the owner sleeps while long tasks run: their finished records are read, not sent
# (`Task.report`), and leave the budget and move the watermark when the owner looks.
_REPORT_WAIT = 0.005
# ... once a task has run this long: longer than a lane task's 40 ms of records
# (`scheduling._LANE_SECONDS`), which comes back soon enough on its own. Reading the progress of
# every running lane task at each wake-up held the interpreter lock while workers woke from
# their sleeps (CHANGELOG.md has the figures). A task that runs long, a slow record or a
# misjudged handler time, still reports every 5 ms.
_REPORT_AFTER = 0.05
# A task whose worker has been on it this long gives the records it has not reached to other
# workers (`Scheduler.take_unstarted`): a slow record then holds only what its ordering
# requires, not the unrelated records packed behind it. Longer than a lane task's 40 ms, which
# would only be cut into more hand-offs.
_MOVE_AFTER = 0.1


class Settlement:
    """Owner thread only."""

    def __init__(
        self,
        own: Ownership,
        scheduler: Scheduler,
        workers: Workers,
        budget: Budget,
        committer: Committer,
        metrics: Metrics,
        failures: Callable[[], Failures],
        txn: Transactions | None,
        on_fenced: Callable[[Assignment, FencedError], None],
        *,
        clock: Clock = SYSTEM,
        outputs: Outputs | None = None,
    ) -> None:
        self._clock = clock
        self._alo = outputs  # at-least-once outputs (a member without transactional_id)
        self._own = own
        self._scheduler = scheduler
        self._workers = workers
        self._budget = budget
        self._committer = committer
        self._metrics = metrics
        # Failures calls back into `given_up`: built after this object.
        self._failures = failures
        self._txn = txn
        self._on_fenced = on_fenced
        self.processed = 0  # records handled or given up by this member
        self.failed = 0  # handler calls that failed
        self._next_report = 0.0
        self._next_move = 0.0
        # The handler's flush hook (None: a handler's return finishes its records), called
        # through the engine's hook runner; False when it raised.
        self._flush: Callable[[FlushContext], bool] | None = None
        self._buffered: list[_Buffered] = []
        self.buffered = 0  # records returned and waiting for a flush

    # -- the one path -----------------------------------------------------------------------

    def _finished(
        self,
        a: Assignment,
        recs: Sequence[Record],
        batches: Sequence[BatchProgress] | BatchProgress,
        how: How,
        outputs: Callable[[], None] | None = None,
    ) -> int:
        """`recs` (of assignment `a`, each in its batch: one batch for all, or one each) are
        finished; returns how many moved a watermark. The caller has checked that `a` is the
        partition's current assignment, and released the budget (`_released`)."""
        if a.cancel.is_set() or not recs:
            return 0
        if how == "handled" and self._flush is not None:
            # Returned, not yet durable: finished by the flush that covers it (`flush`). It
            # counts toward the next commit, whose flush will cover it.
            self._buffered.append((a, recs, batches, outputs))
            self.buffered += len(recs)
            self._committer.finished(len(recs))
            return 0
        offsets = list(map(offset_of, recs))
        if isinstance(batches, BatchProgress):
            done = batches.completed_many(offsets, batches.token)
        else:
            # Records of a batch sit next to each other (a lane's waiting records come in read
            # order): one call per run of the same batch.
            done = i = 0
            for b, run in groupby(batches):
                n = len(list(run))
                done += b.completed_many(offsets[i : i + n], b.token)
                i += n
        if how != "replayed":
            self.processed += done
        if how != "flushed":  # counted when buffered
            self._committer.finished(done)
        if self._txn is not None:
            self._txn.records += done
        if how in ("handled", "flushed"):
            if outputs is not None:
                outputs()
            self._metrics.settled(a.tp, recs[0])
            if a.attempts:  # some record of this assignment is being retried
                self._failures().settled(a, list(recs))
        return done

    # -- the flush hook ------------------------------------------------------------------------

    def flush_with(self, flush: Callable[[FlushContext], bool]) -> None:
        """The handler keeps a buffer: records count finished only after `flush` returns True
        for them."""
        self._flush = flush

    def flush(self) -> list[Partition]:
        """Before a commit: the flush hook makes durable what handlers returned since the last
        flush, then those records are finished (the watermark and the offset map take them).
        Records of an assignment that is gone (lost, revoked, reset) are dropped unflushed: the
        hook is told whose records it may write (`FlushContext.owns`). Returns the partitions
        whose records it was to cover if it raised: none of them count."""
        if self._flush is None or not self._buffered:
            return []
        pending, self._buffered = self._buffered, []
        self.buffered = 0
        live = [b for b in pending if self._owner_of(b[0]) is not None]
        if not live:
            return []
        owned = {
            tp: st.assignment.token
            for tp, st in self._own.partitions.items()
            if not st.assignment.cancel.is_set()
        }
        if not self._flush(FlushContext(owned)):
            return sorted({b[0].tp for b in live})
        for a, recs, batches, outputs in live:
            self._finished(a, recs, batches, "flushed", outputs)
        return []

    def _released(self, a: Assignment, count: int, nbytes: int) -> None:
        self._budget.finished(a.tp, count, nbytes)

    def _owner_of(self, a: Assignment) -> PartitionState | None:
        st = self._own.partitions.get(a.tp)
        if st is None or st.assignment is not a:
            return None  # revoked or lost: its budget was released, its batches are fenced
        return st

    # -- the ways in --------------------------------------------------------------------------

    def replayed(self, st: PartitionState, batch: BatchProgress, recs: Sequence[Record]) -> None:
        """Records of a batch just registered that an earlier owner finished (its offset map):
        finished now, never run, never in the budget."""
        self._finished(st.assignment, recs, batch, "replayed")

    def given_up(self, f: Failed) -> None:
        """A failed record is done with (dead-lettered, or skipped): it leaves the budget, moves
        the watermark, and its lane runs on (the failure policy's callback)."""
        a, rec = f.assignment, f.record
        if self._owner_of(a) is None:
            return
        self._released(a, 1, rec.size)
        self._finished(a, [rec], f.batch, "given_up")
        if self._scheduler.rule_of(a).ordered:
            self._scheduler.finish_held(a, f.lane, rec)
        self._scheduler.dispatch()

    def _progress(self, t: Task, upto: int) -> None:
        """A long task (one lane's records, or a deep unordered batch) finished its records up
        to `upto` and goes on: they leave the budget and move the watermark now, not when the
        task ends."""
        lo = t.reported
        if upto <= lo:
            return
        nbytes = sum(map(size_of, t.records[lo:upto]))
        t.reported, t.reported_bytes = upto, t.reported_bytes + nbytes
        self._settle_range(t, lo, upto, nbytes)

    def _progress_done(self, t: Task) -> None:
        """A task of concurrent workers finished more records, in any order (`Task.done`):
        they leave the budget and move the watermark now, and the lanes the task no longer
        needs are freed."""
        done = t.done
        assert done is not None
        lo, hi = t.reported, len(done)
        if hi <= lo:
            return
        idx = done[lo:hi]
        recs = t.records
        picked = [recs[i] for i in idx]
        nbytes = sum(map(size_of, picked))
        t.reported, t.reported_bytes = hi, t.reported_bytes + nbytes
        a = t.assignment
        if self._owner_of(a) is not None:
            if self._alo is not None and t.outputs:
                self._handled(t, idx)
            else:
                self._released(a, hi - lo, nbytes)
                batches = t.batch if t.batch is not None else [t.batches[i] for i in idx]
                self._finished(a, picked, batches, "handled", self._outputs_of(t, idx))
        self._scheduler.progressed(t, idx)

    def _settle_range(self, t: Task, lo: int, hi: int, nbytes: int) -> None:
        """Records `lo:hi` of `t` finished. A handler may return early once ctx.cancelled is
        set: its record is not known to be finished, so it never moves the watermark."""
        a = t.assignment
        if self._owner_of(a) is None:
            return
        if self._alo is not None and t.outputs:
            self._handled(t, range(lo, hi))
            return
        self._released(a, hi - lo, nbytes)
        whole = lo == 0 and hi == len(t.records)
        recs = t.records if whole else t.records[lo:hi]
        batches: Sequence[BatchProgress] | BatchProgress = (
            t.batch if t.batch is not None else t.batches if whole else t.batches[lo:hi]
        )
        self._finished(a, recs, batches, "handled", self._outputs_of(t, range(lo, hi)))

    def _complete(self, t: Task) -> None:
        self._scheduler.returned(t)
        self._metrics.task_done(t)
        if t.done is not None:
            # Concurrent workers: whatever finished since the last notice, then the rest.
            self._progress_done(t)
            if t.outcomes is not None:
                self._complete_mixed(t)
        elif t.outcomes is None:
            self._settle_range(t, t.reported, len(t.records), t.nbytes - t.reported_bytes)
        else:
            self._complete_mixed(t)
        self._scheduler.advance(t)

    def _complete_mixed(self, t: Task) -> None:
        """A task with failures or fenced records. Failed records stay unfinished and in the
        budget; the scheduler holds their lanes. Records already reported as progress were
        accounted for then."""
        assert t.outcomes is not None
        a = t.assignment
        owned = self._owner_of(a) is not None
        leaving = nbytes = 0
        finished: list[int] = []
        # Concurrent workers' finished records were all settled as progress (`Task.done`);
        # records moved to other tasks (`Scheduler.take_unstarted`) are theirs to settle.
        settled = t.done is not None
        for i in range(0 if settled else t.reported, len(t.outcomes) - t.moved):
            code = t.outcomes[i]
            if settled and code == DONE:
                continue
            if code in (DONE, FENCED):
                leaving += 1
                nbytes += t.records[i].size
                if code == DONE:
                    finished.append(i)
            elif code == FAILED:
                self.failed += 1
                error = (t.errors or {}).get(i)
                if isinstance(error, FencedError):
                    self._on_fenced(a, error)
                elif owned:
                    self._failures().failed(t, i)  # retry, or the final policy
        if owned:
            if finished and self._alo is not None and t.outputs:
                held = [i for i in finished if t.outputs.get(i)]
                for i in held:  # leave the budget when their outputs are confirmed
                    leaving -= 1
                    nbytes -= t.records[i].size
                self._released(a, leaving, nbytes)
                self._handled(t, finished, released=True)
                return
            self._released(a, leaving, nbytes)
            if finished:
                self._finished(
                    a,
                    [t.records[i] for i in finished],
                    [t.batches[i] for i in finished],
                    "handled",
                    self._outputs_of(t, finished),
                )

    def _handled(self, t: Task, indexes: Sequence[int], *, released: bool = False) -> None:
        """At-least-once: records `indexes` of `t` returned, some with outputs. Those without
        are finished now; those with outputs are produced now and stay below the watermark
        until the broker confirmed them all (`_confirmed`), outside the budget while the
        outputs' allowance has room (`Outputs.send`). `released`: the
        caller released the budget of those without."""
        assert self._alo is not None and t.outputs is not None
        a, outputs, recs = t.assignment, t.outputs, t.records
        now: list[int] = []
        held: list[int] = []
        for i in indexes:
            out = outputs.get(i)
            if not out or (t.batch or t.batches[i]).revoked:  # rewound: it runs again
                now.append(i)
            else:
                held.append(i)
        if held:
            group = [recs[i] for i in held]
            batches = [t.batch or t.batches[i] for i in held]
            nbytes = sum(map(size_of, group))
            if self._alo.send(
                a,
                [outputs[i] for i in held],
                nbytes,
                lambda errors, free: self._confirmed(a, group, batches, errors, free),
            ):
                self._released(a, len(group), nbytes)
        if not now:
            return
        picked = [recs[i] for i in now]
        if not released:
            self._released(a, len(now), sum(map(size_of, picked)))
        self._finished(
            a, picked, t.batch if t.batch is not None else [t.batches[i] for i in now], "handled"
        )

    def _confirmed(
        self,
        a: Assignment,
        recs: list[Record],
        batches: list[BatchProgress],
        errors: Sequence[BaseException | None],
        free: bool,
    ) -> None:
        """The broker answered for every output of `recs`: those whose outputs were all
        confirmed (`errors[j]` None) are finished now; the others failed, into the failure
        policy as if their call had raised, and a retry produces their outputs again (those
        already written are written twice). `free`: they waited outside the budget, which
        takes the failed ones back."""
        if self._owner_of(a) is None or a.cancel.is_set():
            return  # revoked or lost: its budget went with the assignment
        ok = [j for j, e in enumerate(errors) if e is None]
        if ok:
            done = recs if len(ok) == len(recs) else [recs[j] for j in ok]
            if not free:
                self._released(a, len(done), sum(map(size_of, done)))
            self._finished(a, done, batches if len(ok) == len(recs) else [batches[j] for j in ok],
                           "handled")  # fmt: skip
        for j, error in enumerate(errors):
            if error is None:
                continue
            rec = recs[j]
            if free:
                self._budget.readmitted(a.tp, 1, rec.size)
            self.failed += 1
            log.warning("output_failed", event_id=rec.event_id, error=str(error))
            t = Task(a, [rec], [batches[j]], None)
            t.outcomes, t.errors = bytearray([FAILED]), {0: error}
            # Its lane ran on while its outputs were in flight: it is retried by itself, and
            # its lane does not wait for it (docs/producing.md: order across a failed delivery).
            self._failures().failed(t, 0, alone=True)

    def _outputs_of(self, t: Task, indexes: Iterable[int]) -> Callable[[], None] | None:
        """Outputs of records of `t` being marked finished: into the open transaction, which
        will commit them with these records' offsets, or abort them with them. A record of a
        batch that can no longer move its watermark (its partition was rewound: it will be
        read and run again) is not marked finished, so its outputs are dropped too."""
        if not t.outputs or self._txn is None:
            return None
        txn, outputs, batch = self._txn, t.outputs, t.batch

        def write() -> None:
            for i in indexes:
                out = outputs.get(i)
                if out and not (batch or t.batches[i]).revoked:
                    txn.produce(out)

        return write

    # -- the completion queue ---------------------------------------------------------------

    def drain(self, wait: float) -> int:
        """Settle the tasks that came back (waiting up to `wait` for the first) and the
        progress of long tasks still running; returns the tasks settled."""
        sched = self._scheduler
        q = self._workers.completions
        reporting = sched.reporting
        if reporting and wait > _REPORT_WAIT:
            wait = _REPORT_WAIT
        n = 0
        try:
            # Never on the main thread (`GroupConsumer` runs the engine on a thread of its
            # own), where a signal could interrupt this wait (Python 3.10-3.12 then waited
            # forever with a negative timeout).
            t = q.get_nowait() if wait <= 0 else q.get(timeout=wait)
            while True:
                if isinstance(t, Progress):
                    for p in t:
                        self._progress_done(p)
                else:
                    self._complete(t)
                n += 1
                t = q.get_nowait()
        except queue.Empty:
            pass
        if reporting:
            now = self._clock.monotonic()
            if now >= self._next_report:
                self._next_report = now + _REPORT_WAIT
                ran_long = self._clock.perf_counter() - _REPORT_AFTER
                for t in reporting:
                    if t.finished > t.reported and t.started <= ran_long:
                        self._progress(t, t.finished)
        if sched.outstanding():
            now = self._clock.monotonic()
            if now >= self._next_move:
                self._next_move = now + _MOVE_AFTER / 2
                for t in sched.running_long(self._clock.perf_counter() - _MOVE_AFTER):
                    moved = sched.take_unstarted(t)
                    if moved:
                        log.debug("records_moved", tp=str(t.assignment.tp), records=moved)
                # Any task that runs long (a slow record among fast ones, not only a long
                # task): the records it finished ahead of the slow one move the watermark and
                # go into the offset map now, not when the slow one ends.
                ran_long = self._clock.perf_counter() - _REPORT_AFTER
                for t in sched.started():
                    if t.finished > t.reported and t.started <= ran_long:
                        self._progress(t, t.finished)
        sched.dispatch()  # freed lanes, and records admitted from a partition's reserve
        return n

    def settle_started(self, assignments: list[Assignment]) -> None:
        """Before a hand-off commit: what tasks still running finished ahead of the record
        they are on counts as finished, so the commit and its offset map include it (the next
        owner would handle it again otherwise). Before any cancel: a handler that returns
        because it was cancelled may not have finished its record."""
        for t in self._scheduler.started(assignments):
            if t.finished > t.reported:
                self._progress(t, t.finished)
