"""The failure policies at work (owner thread only): retry timers, dead letters, blocked
partitions, and the operator's `retry_now` / `skip`.

A failed record stays unfinished and in the budget until it succeeds, is dead-lettered (confirmed
by the broker), or is skipped by the operator; its lane stays held meanwhile (`Scheduler.hold`),
so only what its ordering requires waits: its key's later records (key mode), its partition's
(partition mode), or nothing but the watermark (unordered mode). Waiting costs no worker: a
record due for another attempt is handed out again by `turn`. A failed record's lane fills
with the records that wait for it; fetched on, they could fill the budget the other partitions
share and hold them too. So its partition is paused and its records parked (`Budget.block`), as
for a block, until the record is done with: in partition mode from its first failure (nothing
of the partition runs before it), in key mode once its key's waiting records reach a share of
the budget (a hot key; other keys of the partition then wait too). Everything here belongs to an
assignment and is dropped with it (revoke, lost): the next owner starts from the committed
watermark.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Literal

from weir._engine.budget import Budget
from weir._engine.clock import SYSTEM, Clock
from weir._engine.deadletter import DeadLetters, WriteFailure
from weir._engine.fetching import FetchControl
from weir._engine.lifecycle import Lifecycle
from weir._engine.outputs import Outputs
from weir._engine.refusals import Denied, RefusalSink
from weir._engine.scheduling import Scheduler
from weir._engine.tasks import HELD, Assignment, Lane, LaneKey, Task
from weir._engine.tracking import BatchProgress
from weir._engine.workers import AwaitableReturned, GeneratorReturned
from weir.config import ConsumerConfig
from weir.errors import DeserializationError, HandlerError
from weir.logs import get_logger
from weir.policy import FailurePolicy
from weir.records import Partition, Record

__all__ = ["Failed", "Failures"]

log = get_logger(__name__)

# The longest the owner sleeps while outputs wait for their delivery reports.
_OUTPUT_WAIT = 0.002
# The longest single flush of the final wait for writes: a second stop request is looked at
# between them.
_FLUSH_SLICE_S = 0.25
_UNORDERED = Lane.NONE  # the lane of a record in unordered mode: it holds none

State = Literal["retry", "running", "dead_letter", "blocked"]


@dataclass(eq=False, slots=True)
class Failed:
    """A record whose handler failed, until it succeeds or is dead-lettered or skipped."""

    assignment: Assignment
    record: Record
    batch: BatchProgress
    lane: LaneKey
    attempt: int  # the attempt that failed last
    first_failed: float
    error: BaseException
    state: State = "retry"
    due: float = 0.0
    dead_letter_failed: bool = False  # blocked because the dead-letter write failed
    denied: Denied | None = None  # ... refused by the broker's ACLs
    failed_at: float = 0.0  # when the last attempt failed: time.time(), for the dead letter
    parked: bool = False  # its partition is paused and parked until it is done with
    final: bool = False  # the final policy applied: a blocked record that fails stays blocked
    # Blocked once, it blocks its partition until it is done with: while it runs again and while
    # its dead letter is written again too (its `state` then says "running", "dead_letter").
    blocking: bool = False


Finish = Callable[[Failed], None]


class Failures:
    def __init__(
        self,
        cfg: ConsumerConfig,
        scheduler: Scheduler,
        budget: Budget,
        fetch: FetchControl,
        life: Lifecycle,
        finish: Finish,
        dead_letters: DeadLetters | None,
        *,
        clock: Clock = SYSTEM,
        refusals: RefusalSink | None = None,
        outputs: Outputs | None = None,
    ) -> None:
        self._clock = clock
        # At-least-once outputs: served with the dead letters (both hold records until the
        # broker confirms them).
        self.outputs = outputs
        self._refusals = refusals
        self._cfg = cfg
        self._scheduler = scheduler
        self._budget = budget
        self._fetch = fetch
        self._life = life
        self._finish = finish
        self.dead_letters = dead_letters
        self._due: list[tuple[float, int, Failed]] = []
        self._seq = itertools.count()
        self._failed: dict[tuple[Assignment, int], Failed] = {}
        self._rng = random.Random()
        self._blocked_logged: set[Partition] = set()  # logged as blocked, not yet unblocked
        self.retries = 0
        self.dead_lettered = 0
        self.skipped = 0

    # -- from the engine -----------------------------------------------------------------

    def failed(self, task: Task, index: int, *, alone: bool = False) -> None:
        """Record `index` of `task` failed (its outcome FAILED). Called before the scheduler
        holds the record's lane. `alone`: it holds no lane (its output failed after its lane
        ran on): it is retried by itself, as in unordered mode."""
        a = task.assignment
        if not a.dispatching or a.cancel.is_set():
            return  # revoked, lost or stopping: its state goes with the assignment
        rec = task.records[index]
        error = (task.errors or {})[index]
        now = self._clock.monotonic()
        attempt = a.attempts.get(rec.offset, 1)
        key = (a, rec.offset)
        f = self._failed.get(key)
        if f is None:
            # An unordered topic's record holds no lane: its lane key is `_UNORDERED`.
            lane = _UNORDERED if alone else self._scheduler.lane_key(rec)
            f = self._failed[key] = Failed(a, rec, task.batches[index], lane, attempt, now, error)
        else:
            f.attempt, f.error = attempt, error
        f.failed_at = time.time()
        if isinstance(error, AwaitableReturned | GeneratorReturned):
            # The handler, not the record, is wrong: every record would fail the same way, so
            # no retry, dead letter or block can help. The member stops at the first.
            f.final = True
            self._stop(f)
            return
        policy = self._cfg.policy_for(rec.topic)
        if f.final:
            self._block(f, policy, now, reason="still failing")
            return
        delay = self._retry_delay(policy, f, now)
        behind: list[int] = []
        if task.shared is not None and index in task.shared:
            # Its whole batch failed: the error is not known to be this record's, nor to be
            # none of its lane's records behind it (a batch handler ran them too): they were
            # attempted as often as it was.
            behind = self._held_behind(task, index, f.lane)
            for off in behind:
                a.attempts[off] = attempt + 1
        if delay is None and task.shared is not None and index in task.shared:
            # Before any final policy, its next batch is split until what fails alone is found.
            delay = 0.0
            a.isolate.add(rec.offset)
            a.isolate.update(behind)
            log.info(
                "batch_split",
                event_id=rec.event_id,
                attempt=attempt + 1,
                error=_describe(error),
                reason="its batch failed through its retries: the next failure is split to "
                "find the records that fail alone",
            )
        if delay is not None:
            f.state = "retry"
            a.attempts[rec.offset] = attempt + 1
            self._at(f, now + delay)
            if self._scheduler.rule_of(a).ordering == "partition":
                self._park(f)
            self.retries += 1
            log.info(
                "retry_scheduled",
                event_id=rec.event_id,
                attempt=attempt + 1,
                delay_s=round(delay, 3),
                error=_describe(error),
            )
            return
        self._final(policy, f, now)

    def _held_behind(self, task: Task, index: int, lane: LaneKey) -> list[int]:
        """Offsets of the records of `task` held behind its failed record `index` in its lane."""
        if task.outcomes is None or lane is _UNORDERED:
            return []
        lane_key = self._scheduler.lane_key
        return [
            r.offset
            for r, code in zip(task.records[index + 1 :], task.outcomes[index + 1 :], strict=True)
            if code == HELD and lane_key(r) == lane
        ]

    def settled(self, a: Assignment, records: Collection[Record]) -> None:
        """Records of `a` finished (only called while some record of `a` is being retried):
        their failure state ends, and a partition blocked by one of them runs again."""
        for rec in records:
            if a.attempts.pop(rec.offset, None) is None:
                continue
            a.isolate.discard(rec.offset)
            f = self._failed.pop((a, rec.offset), None)
            if f is not None:
                log.info("retry_succeeded", event_id=rec.event_id, attempt=f.attempt + 1)
                self._unblock(a.tp)

    def turn(self, now: float) -> bool:
        """Once per owner turn: dead-letter results, and records whose next attempt is due.
        True if some record was handed out again."""
        if self.dead_letters is not None:
            self.dead_letters.poll()
        if self.outputs is not None:
            self.outputs.poll()
        if self._failed and "key" in self._scheduler.modes:
            self._park_long_lanes()
        due = self._due
        rerun = False
        while due and due[0][0] <= now:
            at, _, f = heapq.heappop(due)
            if f.due != at or self._failed.get((f.assignment, f.record.offset)) is not f:
                continue  # rescheduled, or done with
            if not f.assignment.dispatching:
                continue
            if f.dead_letter_failed:
                self._send_dead_letter(f)
            else:
                self._rerun(f)
                rerun = True
        return rerun

    def _park_long_lanes(self) -> None:
        """Key mode: a failed record whose key's waiting records reached a share of the budget
        parks its partition (a hot key would otherwise fill the budget while it waits)."""
        share = self._budget.share_size()
        rule_of = self._scheduler.rule_of
        for f in self._failed.values():
            if f.parked or rule_of(f.assignment).ordering != "key":
                continue
            if self._scheduler.waiting_in(f.assignment, f.lane) >= share:
                self._park(f)

    def wait(self, timeout: float) -> float:
        """`timeout`, cut short to when the next attempt is due: the owner must not sleep
        through it in a poll (with nothing else in flight a 50 ms backoff took 200 ms)."""
        if self.outputs is not None and self.outputs.pending:
            # Delivery reports are served by the owner's poll of the producer: a record waits
            # below the watermark, in the budget, until the owner wakes to serve its report.
            timeout = min(timeout, _OUTPUT_WAIT)
        if not self._due:
            return timeout
        return max(0.0, min(timeout, self._due[0][0] - self._clock.monotonic()))

    def opened(self, a: Assignment) -> None:
        pass

    def closed(self, a: Assignment) -> None:
        self.forget([a])

    def forget(self, assignments: Collection[Assignment]) -> None:
        """Revoked, lost, or started over in place (an abort, a seek): their retries, blocks
        and dead-letter results no longer matter, and a partition kept is no longer held for
        them (a revoked one's holds go with it)."""
        parked = set()
        for key in [k for k in self._failed if k[0] in assignments]:
            if self._failed.pop(key).parked:
                parked.add(key[0].tp)
        if self.outputs is not None:
            self.outputs.forget(assignments)
        gone = {a.tp for a in assignments}
        self._blocked_logged -= gone
        self._fetch.release(parked, "blocked")
        self._still_refused()

    def pending(self, assignments: Collection[Assignment]) -> int:
        """Dead-letter writes and records with outputs of these assignments still waiting for
        the broker."""
        outputs = 0 if self.outputs is None else self.outputs.pending_of(assignments)
        return outputs + sum(
            1 for (a, _), f in self._failed.items() if f.state == "dead_letter" and a in assignments
        )

    def poll_writes(self) -> None:
        """Serve the producers' delivery reports (a drain's wait)."""
        if self.dead_letters is not None:
            self.dead_letters.poll()
        if self.outputs is not None:
            self.outputs.poll()

    def flush_writes(self, timeout: float, hurry: threading.Event) -> None:
        """Before the final commit: confirmed dead letters and outputs count as finished. Waits
        in flushes of `_FLUSH_SLICE_S` so that `hurry` (a second stop request) ends it: one
        flush of the whole budget could not be cut short with the broker gone."""
        deadline = self._clock.monotonic() + timeout
        for writes in (self.dead_letters, self.outputs):
            while writes is not None and writes.pending and not hurry.is_set():
                left = deadline - self._clock.monotonic()
                if left <= 0:
                    return
                writes.flush(min(left, _FLUSH_SLICE_S))

    def close(self) -> None:
        for writes in (self.dead_letters, self.outputs):
            if writes is not None:
                writes.close()

    @property
    def waiting(self) -> int:
        """Records waiting for another attempt or blocked."""
        return sum(1 for f in self._failed.values() if f.state in ("retry", "blocked"))

    def blocked(self) -> list[Partition]:
        """Partitions a blocked record holds: it has not succeeded, been dead-lettered or
        skipped since it blocked."""
        return sorted({f.assignment.tp for f in self._failed.values() if f.blocking})

    # -- from the operator (through the engine's request queue) ------------------------------

    def retry_now(self, tp: Partition) -> bool:
        """Try the blocked (or waiting) records of `tp` again at once."""
        now = self._clock.monotonic()
        found = False
        for f in list(self._failed.values()):
            if f.assignment.tp == tp and f.state in ("blocked", "retry"):
                self._at(f, now)
                found = True
        if found:
            log.info("retry_requested", tp=str(tp))
        return found

    def skip(self, tp: Partition, offset: int) -> bool:
        """Give up on a failed record deliberately: it counts as finished, loudly."""
        f = next(
            (
                f
                for f in self._failed.values()
                if f.assignment.tp == tp and f.record.offset == offset
            ),
            None,
        )
        if f is None or f.state not in ("blocked", "retry"):
            return False
        a = f.assignment
        del self._failed[(a, offset)]
        a.attempts.pop(offset, None)
        a.isolate.discard(offset)
        self.skipped += 1
        self._still_refused()
        log.warning(
            "record_skipped",
            event_id=f.record.event_id,
            attempts=f.attempt,
            error=_describe(f.error),
            reason="skipped by the operator: the record counts as finished, unprocessed",
        )
        self._finish(f)
        self._unblock(tp)
        return True

    # -- inside --------------------------------------------------------------------------

    def _retry_delay(self, policy: FailurePolicy, f: Failed, now: float) -> float | None:
        retry = policy.retry
        if isinstance(f.error, DeserializationError):
            retryable = policy.deserialization_retries
        else:
            retryable = retry.retries(f.error)
        if not retryable or f.attempt >= retry.max_attempts:
            return None
        delay = retry.delay(f.attempt + 1, self._rng.random())
        if retry.max_elapsed_s is not None and now + delay - f.first_failed > retry.max_elapsed_s:
            return None
        return delay

    def _final(self, policy: FailurePolicy, f: Failed, now: float) -> None:
        f.final = True
        if policy.final == "stop":
            self._stop(f)
            return
        if policy.final == "dead_letter" and self.dead_letters is not None:
            self._send_dead_letter(f)
            return
        self._block(f, policy, now, reason="final policy block")

    def _stop(self, f: Failed) -> None:
        rec = f.record
        if self._life.fail(HandlerError(rec, f.error)):
            log.error(
                "handler_failed", event_id=rec.event_id, attempts=f.attempt,
                error=_describe(f.error),
            )  # fmt: skip

    def _send_dead_letter(self, f: Failed) -> None:
        assert self.dead_letters is not None
        f.state = "dead_letter"
        f.dead_letter_failed = False
        topic = self._cfg.policy_for(f.record.topic).dead_letter_for(f.record.topic)

        def done(failure: WriteFailure | None) -> None:
            if self._failed.get((f.assignment, f.record.offset)) is not f:
                return  # revoked or lost meanwhile: the next owner handles the record again
            if failure is None:
                del self._failed[(f.assignment, f.record.offset)]
                f.assignment.attempts.pop(f.record.offset, None)
                f.assignment.isolate.discard(f.record.offset)
                self.dead_lettered += 1
                f.denied = None
                self._still_refused(written=topic)
                log.warning(
                    "dead_lettered",
                    event_id=f.record.event_id,
                    topic=topic,
                    attempts=f.attempt,
                    error=_describe(f.error),
                )
                self._finish(f)
                self._unblock(f.assignment.tp)
            else:
                log.error(
                    "dead_letter_failed",
                    event_id=f.record.event_id,
                    error=failure.error,
                    **failure.fields,
                )
                f.dead_letter_failed = True
                f.denied = failure.denied
                if failure.denied is not None and self._refusals is not None:
                    self._refusals.refused(failure.denied, failure.error)
                policy = self._cfg.policy_for(f.record.topic)
                self._block(
                    f, policy, self._clock.monotonic(), reason=failure.reason, **failure.fields
                )

        self.dead_letters.send(f.record, f.attempt, f.error, f.failed_at, done)

    def _still_refused(self, written: str | None = None) -> None:
        """The ACL refusals of dead letters that still hold a record: a dead letter written
        to a topic (`written`) ends its refusal, and so does the last record it held going
        (skipped, revoked)."""
        if self._refusals is None:
            return
        held = {f.denied for f in self._failed.values() if f.denied is not None}

        def lettered(d: Denied) -> bool:
            # A member's other refusals are of reading (its topics, its group).
            return d.resource_type == "topic" and d.operation in ("WRITE", "DESCRIBE")

        if written is not None:
            self._refusals.allowed(lambda d: lettered(d) and d.resource == written)
        self._refusals.allowed(lambda d: lettered(d) and d not in held, asked=False)

    def _block(
        self, f: Failed, policy: FailurePolicy, now: float, *, reason: str, **detail: object
    ) -> None:
        first = f.state != "blocked"
        f.state = "blocked"
        f.blocking = True
        self._at(f, now + policy.block_retry_s)
        tp = f.assignment.tp
        self._park(f)
        if first:
            self._blocked_logged.add(tp)
            log.error(
                "partition_blocked",
                tp=str(tp),
                event_id=f.record.event_id,
                attempts=f.attempt,
                reason=reason,
                error=_describe(f.error),
                next_try_s=policy.block_retry_s,
                **detail,
            )

    def _park(self, f: Failed) -> None:
        """Pause the partition of `f` in the client and park its records out of the budget's
        marks, until `f` is done with (and every other record that parked it)."""
        f.parked = True
        tp = f.assignment.tp
        if self._budget.block(tp):
            self._fetch.hold([tp], "blocked")

    def _unblock(self, tp: Partition) -> None:
        pb = self._budget.parts.get(tp)
        if pb is None or not pb.blocked:
            return
        if any(f.assignment.tp == tp and f.parked for f in self._failed.values()):
            return
        self._budget.unblock(tp)
        if tp in self._blocked_logged:
            self._blocked_logged.discard(tp)
            log.info("partition_unblocked", tp=str(tp))
        self._fetch.release([tp], "blocked")  # applied at the loop's next turn

    def _rerun(self, f: Failed) -> None:
        a = f.assignment
        if f.state == "blocked":
            a.attempts[f.record.offset] = f.attempt + 1
        f.state = "running"
        if f.lane is _UNORDERED:
            self._scheduler.resubmit(a, f.batch, f.record)
        else:
            self._scheduler.release(a, f.lane)

    def _at(self, f: Failed, when: float) -> None:
        f.due = when
        heapq.heappush(self._due, (when, next(self._seq), f))


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
