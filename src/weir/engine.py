"""The owner thread's engine: the only code that calls the Kafka client.

Each turn is four steps, each calling one owner: *intake* (consume, `weir.intake` builds
records, `PartitionProgress` registers their batch, `Budget` admits them) → *schedule*
(`Scheduler` packs runnable records into tasks for the `Workers`) → *settle* (finished records
leave the `Budget` and move their batch's watermark) → *commit* (`Committer` decides, the
engine sends). Rebalance callbacks are served inside consume and go to `Ownership`.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import groupby
from typing import Any, cast

from confluent_kafka import (
    KafkaError,
    KafkaException,
    TopicPartition,
)

from weir.aio import AsyncWorkers
from weir.budget import Budget
from weir.callbacks import Callbacks, callback_name
from weir.client import (
    ClientFactory,
    ConsumerClient,
    KafkaMessage,
    ProducerClient,
    ProducerFactory,
    TransactionalProducerFactory,
    topic_partitions,
)
from weir.commits import CommitPath
from weir.committing import CommitEvent, Committer
from weir.config import ConsumerConfig
from weir.deadletter import DeadLetters
from weir.errors import BrokerUnreachableError, FencedError, KafkaFatalError, OffsetResetError
from weir.failures import Failed, Failures
from weir.fencing.base import Fence
from weir.intake import Run, runs_of
from weir.lifecycle import Lifecycle
from weir.logs import (
    Burst,
    ClientLog,
    Repeats,
    client_error_cause,
    get_logger,
    timestamp,
    without_retry_details,
)
from weir.metrics import Metrics
from weir.ownership import Ownership, PartitionState
from weir.records import Handler, Partition, Record, is_async_handler, offset_of, size_of
from weir.refusals import (
    ALL_BROKERS_DOWN_CODE,
    denied_topics,
    refusal_error,
    refusal_of,
    startup_refusal,
    topics_denied_error,
)
from weir.replay import ReplayMaps
from weir.scheduling import Scheduler, lane_of
from weir.starts import Starts
from weir.stats import ConsumerStats, PartitionStats
from weir.tasks import DONE, FAILED, FENCED, Assignment, Task
from weir.tracking import BatchProgress
from weir.transactions import Outcome, TransactionError, Transactions
from weir.watermarks import WatermarkRefresher
from weir.workers import Progress, ThreadWorkers, Workers

__all__ = ["Engine"]

log = get_logger(__name__)

# How long the owner waits on the completion queue when work is in flight and nothing was fetched:
# short enough that new records are picked up promptly, long enough not to spin.
_IDLE_WAIT = 0.01
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
# Stats are published at every commit, and at least this often.
_PUBLISH_EVERY = 1.0
# While waiting for a broker at start, the longest metadata request before the client's queue is
# served: its errors and log lines are handled within this long of happening.
_STARTUP_SLICE = 0.25
# While every broker is reported down: the longest the owner waits for one to answer, once a
# second (`Lifecycle.broker_probe_due`).
_PROBE_WAIT = 0.25
# How many of the client's distinct errors a BrokerUnreachableError names.
_CAUSES = 3


class Engine:
    """The state of one run: lives on the owner thread only."""

    def __init__(
        self,
        config: ConsumerConfig,
        handler: Handler,
        client_factory: ClientFactory,
        life: Lifecycle,
        workers: Workers | None = None,
        producer_factory: ProducerFactory | None = None,
        fence: Fence[Any] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        *,
        refresh_watermarks: bool = False,
    ) -> None:
        self.cfg = cfg = config
        self.handler = handler
        self.life = life
        self._factory = client_factory
        self.callbacks = Callbacks(cfg.callback_errors, life.fail)
        # The client's errors and librdkafka's log lines repeat while a broker is down (a
        # refused connection every 50 ms): the first of each is logged, the rest counted.
        self._repeats = Repeats()
        transactional = cfg.transactional_id is not None
        if workers is None:
            if is_async_handler(handler):
                workers = AsyncWorkers(
                    handler, cfg.max_in_flight, lane_of(cfg.ordering), loop, outputs=transactional
                )
            else:
                workers = ThreadWorkers(
                    handler, cfg.workers, lane_of(cfg.ordering), outputs=transactional
                )
        self.workers = workers
        self.scheduler = Scheduler(self.workers, cfg.ordering)
        self.committer = Committer(
            cfg.commit_interval_s, cfg.commit_every_records, self._emit_commit
        )
        self.budget = Budget(cfg, self.scheduler)
        self.own = Ownership(
            handler, self.scheduler, self.committer, self.budget, self.callbacks,
            cfg.revoke_timeout_s, hook=self._hook,
        )  # fmt: skip
        policies = [cfg.failure, *cfg.failure_by_topic.values()]
        dead_letters = None
        if any(p.final == "dead_letter" for p in policies):
            dead_letters = DeadLetters(
                cfg, producer_factory or _producer, logger=ClientLog(self._repeats)
            )
        self.failures = Failures(
            cfg, self.scheduler, self.budget, life, self._finish_failed, dead_letters
        )
        self.replay = ReplayMaps(cfg.offset_map, cfg.offset_map_max_bytes)
        self.commits = CommitPath(lambda: self.client, self.own, self.committer, self.replay)
        # Exactly-once mode: the transactional producer (a real Producer is transactional; a
        # test's producer_factory must give one too).
        self.txn = (
            Transactions(
                cfg,
                cast(TransactionalProducerFactory, producer_factory or _producer),
                logger=ClientLog(self._repeats),
                interrupt=life.hurry,
            )
            if transactional
            else None
        )
        txn = self.txn
        self.starts = Starts(
            cfg.auto_offset_reset,
            cfg.revoke_timeout_s,
            lambda: self.client,
            self.commits,
            self.committer,
            self.replay,
            ready=None if txn is None else lambda: txn.ready,
        )
        self.fence = fence
        self.paused: set[Partition] = set()  # paused in the client, as weir asked it
        self._last_poll = 0.0
        self._next_report = 0.0
        self._next_move = 0.0
        self.processed = 0
        self.failed = 0
        self._client: ConsumerClient | None = None
        # What the client's errors said while start() waited for a broker (None after).
        self._startup_causes: dict[str, tuple[str, str]] | None = None
        self.metrics = Metrics()
        # How often the high watermarks are read by a client of their own (None: not at all).
        self._refresh_s = cfg.watermark_refresh_s if refresh_watermarks else None
        self._watermarks: WatermarkRefresher | None = None
        self._next_publish = 0.0

    def _hook(
        self, fn: Callable[..., object], timeout: float | None = None
    ) -> Callable[..., object]:
        """What calls a handler hook: the hook itself, or for an `async def` hook a call that
        runs it on the handler's event loop and waits for it, at most `timeout` (default
        `revoke_timeout_s`: the owner is inside a rebalance callback)."""
        if not inspect.iscoroutinefunction(fn) or not isinstance(self.workers, AsyncWorkers):
            return fn
        workers = self.workers
        limit = self.cfg.revoke_timeout_s if timeout is None else timeout

        def on_loop(*args: Any) -> object:
            return workers.call(fn, *args, timeout=limit)

        return on_loop

    @property
    def client(self) -> ConsumerClient:
        assert self._client is not None, "no client before run()"
        return self._client

    # -- lifecycle -------------------------------------------------------------------------

    def run(self) -> None:
        """Start, turn until stopped or failed, shut down. Failures land in `life.failure`."""
        life = self.life
        try:
            self.start()
            while life.should_run:
                self.step()
        except BaseException as exc:
            life.fail(exc)
        finally:
            try:
                self.shutdown()
            finally:
                life.end()

    def start(self) -> None:
        cfg = self.cfg
        conf = cfg.librdkafka_config()
        conf["on_commit"] = self.commits.on_commit
        conf["error_cb"] = self._on_error
        conf["logger"] = ClientLog(self._repeats)  # librdkafka's lines: weir.librdkafka
        self._client = self._factory(conf)
        meta = self._check_reachable()
        if self._refresh_s is not None:
            # Its own configuration drops the member's callbacks (on_commit, error_cb, logger).
            self._watermarks = WatermarkRefresher(conf, self._refresh_s)
        if self.failures.dead_letters is not None:
            self._start_dead_letters(meta)
        if self.fence is not None:
            self.fence.prepare()  # a database that does not answer fails the start, not a record
        if self.txn is not None:
            self.txn.start()
        self.client.subscribe(
            list(cfg.topics),
            on_assign=self._guard(self._on_assign),
            on_revoke=self._guard(self._on_revoke),
            on_lost=self._guard(self._on_lost),
        )
        self.workers.start()
        self.life.polled_at = time.monotonic()  # liveness counts from here until the first poll
        log.info(
            "consumer_started",
            group_id=cfg.group_id,
            topics=cfg.topics,
            ordering=cfg.ordering,
            **(
                {"max_in_flight": cfg.max_in_flight}
                if self.workers.concurrent
                else {"workers": cfg.workers}
            ),
            protocol=cfg.group_protocol,
        )
        self.life.running()
        self.life.started.set()

    def _check_reachable(self) -> Any:
        """Wait up to startup_timeout_s for a broker to answer a metadata request.

        The wait is cut into short requests with the client's queue served in between, so its
        errors and log lines are handled when they happen rather than all at once at close,
        and the error names what they said (a name that does not resolve, a refused
        connection) instead of the metadata request's "Broker transport failure". A broker
        that refused the client's credentials or its TLS ends the wait as soon as no broker is
        left to try, with `AuthenticationError` or `TlsError`: waiting longer changes nothing.
        A named topic the broker's ACLs hide from the client is an `AuthorizationError`.
        """
        timeout = self.cfg.startup_timeout_s
        deadline = time.monotonic() + timeout
        self._startup_causes = {}
        try:
            while True:
                began = time.monotonic()
                wait = max(min(_STARTUP_SLICE, deadline - began), 0.001)
                try:
                    meta = self.client.list_topics(timeout=wait)
                except KafkaException as exc:
                    failed = exc
                else:
                    cfg = self.cfg
                    left = max(deadline - time.monotonic(), _STARTUP_SLICE)
                    denied = denied_topics(self.client, cfg.topics, meta, left)
                    if denied:
                        raise topics_denied_error(denied, cfg.group_id)
                    return meta
                # Nothing is subscribed yet: this only serves error_cb and the log lines.
                self.client.consume(1, 0)
                if self.life.failure is not None:
                    raise self.life.failure  # a fatal client error (_on_error)
                refusal = startup_refusal(self._startup_causes)
                now = time.monotonic()
                # A request that failed before its time was refused, not left unanswered.
                if refusal is not None or now >= deadline or now - began < wait / 2:
                    break
            causes = [
                cause
                for cause, (code, _) in self._startup_causes.items()
                if code != ALL_BROKERS_DOWN_CODE
            ][:_CAUSES]
        finally:
            self._startup_causes = None
        if refusal is not None:
            raise refusal_error(refusal, self.cfg.librdkafka_config()) from None
        # One error, not a chain: the metadata request's own ("Broker transport failure") is
        # only the fallback, for when the client said nothing more.
        error = failed.args[0] if failed.args else failed
        said = error.str() if isinstance(error, KafkaError) else str(error)
        raise BrokerUnreachableError(
            f"no Kafka broker answered at {self.cfg.bootstrap_servers!r} within "
            f"{timeout:g}s (startup_timeout_s): {'; '.join(causes) or said}"
        ) from None

    def _start_dead_letters(self, meta: Any) -> None:
        """The dead-letter producer, and the dead-letter topics of the topics named in the
        subscription (a regex's topics get theirs checked by their first dead letter)."""
        assert self.failures.dead_letters is not None
        cfg = self.cfg
        named = [
            t
            for t in cfg.topics
            if not t.startswith("^") and cfg.policy_for(t).final == "dead_letter"
        ]
        topics = getattr(meta, "topics", {}) or {}
        partitions = {
            t: len(topics[t].partitions) for t in named if t in topics and topics[t].partitions
        }
        self.failures.dead_letters.start(named, partitions)

    def shutdown(self) -> None:
        life = self.life
        life.stopping()
        client = self._client
        deadline = time.monotonic() + self.cfg.shutdown_timeout_s
        if client is None:
            self.workers.stop(0)
            return
        log.info("consumer_stopping", reason=repr(life.failure) if life.failure else "stop")
        try:
            self.own.deadline_cap = deadline
            self.own.stop_dispatch()
            self._set_paused(list(self.own.partitions), True, reason="shutdown")
            while (
                self.scheduler.running(self.own.assignments())
                and time.monotonic() < deadline
                and not life.hurry.is_set()
            ):
                self._drain(0.05)
                # Keep serving the group while handlers finish; nothing new is dispatched.
                client.consume(1, 0)
                life.polled_at = time.monotonic()
            self._drain(0)
            dead_letters = self.failures.dead_letters
            if dead_letters is not None and dead_letters.pending:
                # Confirmed dead letters count as finished before the final commit.
                dead_letters.flush(deadline - time.monotonic())
                self._drain(0)
            self._settle_started(self.own.assignments())
            left = self.scheduler.running(self.own.assignments())
            if left:
                self.own.cancel_all()
                log.warning(
                    "shutdown_budget_exceeded" if not life.hurry.is_set() else "shutdown_hurried",
                    unfinished=left,
                )
            self._commit_sync(self.commits.committable())
            self.own.fence_progress()
            self._publish(running=False)
            if self.cfg.group_instance_id is None:
                # Leave the group now so partitions move at once. A static member keeps its
                # partitions for the session timeout instead, so a restart gets them back.
                client.unsubscribe()
        except BaseException as exc:
            log.exception("shutdown_failed")
            life.fail(exc)
        finally:
            try:
                client.close()
            except Exception:
                log.exception("close_failed")
            if self.txn is not None:
                try:
                    self.txn.close(deadline - time.monotonic())
                except Exception:  # the steps after it (the workers' stop) must still run
                    log.exception("transactions_close_failed")
            if self.fence is not None:
                try:
                    self.fence.close()
                except Exception:
                    log.exception("fence_close_failed")
            if self.failures.dead_letters is not None:
                self.failures.dead_letters.close()
            # The closes served the last of the clients' errors and lines.
            self._repeats.flush()
            hook = self.handler.on_shutdown
            hook_s = max(1.0, deadline - time.monotonic())
            self.callbacks.call(
                callback_name(hook), self._hook(hook, hook_s), hook_name="on_shutdown"
            )
            self.workers.stop(max(0.0, deadline - time.monotonic()))
            if self._watermarks is not None:
                self._watermarks.stop(max(0.0, min(1.0, deadline - time.monotonic())))
            log.info("consumer_stopped", processed=self.processed)

    # -- one turn of the loop --------------------------------------------------------------

    def step(self) -> None:
        budget = self.budget
        budget.begin_turn()
        self._repeats.tick()
        busy = self.scheduler.outstanding() > 0
        polled = True
        if budget.throttled:
            # Throttled: poll once per poll_timeout_s (callbacks, max.poll.interval.ms) taking
            # at most one record, and otherwise wait for completions. The client keeps its
            # prefetch.
            wait = self._last_poll + self.cfg.poll_timeout_s - time.monotonic()
            msgs: Sequence[KafkaMessage]
            if wait > 0:
                self._drain(self.failures.wait(wait))
                msgs = ()
                polled = False
            else:
                self._last_poll = time.monotonic()
                msgs = self.client.consume(1, 0)
        else:
            wait = 0 if busy else self.failures.wait(self.cfg.poll_timeout_s)
            msgs = self.client.consume(budget.fetch_size(), wait)
        if msgs:
            self._register(msgs)
        if busy and not msgs:
            self._drain(_IDLE_WAIT)
        else:
            self._drain(0)
        budget.admit_starved()
        now = time.monotonic()
        if polled:
            self.life.polled_at = now
        failures = self.failures
        if failures.turn(now):
            self.scheduler.dispatch()  # retries due now go out this turn, not after a poll
        self._serve_requests()
        if self.life.broker_probe_due(now):
            self._probe_brokers()
        if self.starts.pending:
            sought = self.starts.turn(now)
            self._resume([tp for tp in sought if self._paused_for_start(tp)])
        if self.txn is not None:
            if not self.txn.ready:
                self.txn.recover(now)  # a replaced producer: its partitions wait meanwhile
            elif self.txn.due(now):
                self._commit_transaction(())
                self._publish(running=True)
        elif self.committer.due(now):
            self.commits.send_async(now)
            self._publish(running=True)
        if now >= self._next_publish:
            # Stats at least this often, however long the commit interval.
            self.commits.catch_up_positions()
            self._publish(running=True)
        pause, resume = budget.end_turn()
        blocked: list[Partition] = []
        if failures.to_pause or failures.to_resume:
            blocked = failures.to_pause
            resume = [*resume, *(tp for tp in failures.to_resume if tp in self.own.partitions)]
            failures.to_pause, failures.to_resume = [], []
        self._set_paused(pause, True, reason="capacity")
        self._set_paused(blocked, True, reason="blocked")
        self._resume(resume)

    def _probe_brokers(self) -> None:
        """Every broker was reported down, and librdkafka never reports that one is back: does
        one answer a metadata request now (waiting at most `_PROBE_WAIT`)? For one topic, an
        owned or a named one: a small answer."""
        owned = next(iter(self.own.partitions), None)
        named = (t for t in self.cfg.topics if not t.startswith("^"))
        topic = owned.topic if owned is not None else next(named, None)
        try:
            self.client.list_topics(topic, timeout=_PROBE_WAIT)
        except KafkaException:
            return
        down = self.life.broker_answered(time.monotonic())
        log.info("brokers_reachable", down_s=round(down, 1))

    def _serve_requests(self) -> None:
        """The operator's `retry_now` and `skip`, sent from other threads. Their arguments were
        checked in the caller's thread; whatever serving one raises all the same goes to that
        request's future, never to this loop (it would stop the member)."""
        for kind, args, future in self.life.take_requests():
            if not future.set_running_or_notify_cancel():
                continue
            try:
                tp = Partition(*args[0])
                if kind == "retry_now":
                    result = self.failures.retry_now(tp)
                elif kind == "skip":
                    result = self.failures.skip(tp, args[1])
                else:
                    raise ValueError(f"unknown request {kind!r}")
            except Exception as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

    def _register(self, msgs: Sequence[KafkaMessage]) -> None:
        """Hand what one consume call returned to the lanes: one batch per run (one partition,
        offsets increasing: a rewind mid-call starts a new run)."""
        partitions = self.own.partitions
        full = []
        now = time.monotonic()
        for run in runs_of(msgs, self._on_message_error):
            tp = Partition(run.topic, run.partition)
            if self._register_run(partitions.get(tp), run, now):
                full.append(tp)
        # One call for all: each pause waits for librdkafka's broker thread while holding the
        # interpreter lock (confluent-kafka does not release it there).
        self._set_paused(full, True, reason="share")
        self.scheduler.dispatch()

    def _register_run(self, st: PartitionState | None, run: Run, now: float) -> bool:
        """Register one run (fetched at `now`); True if its partition now holds a full reserve
        and must pause."""
        if st is None or not st.assignment.dispatching:
            return False  # fetched before a revoke or lost: the next owner reads them again
        if self.starts.pending and self.starts.holds(st.assignment.tp):
            return False  # fetched before its start was sought: read again from there
        offsets = run.offsets
        tp = st.assignment.tp
        try:
            batch = st.progress.add_batch(offsets, offsets[-1] + 1)
        except ValueError:
            log.warning("partition_rewound", tp=str(tp), offset=offsets[0])
            self.budget.rewound(tp)
            st.rewind()
            batch = st.progress.add_batch(offsets, offsets[-1] + 1)
        self.metrics.fetched(tp, batch, run.records[0], now)
        recs, nbytes = run.records, run.nbytes
        if self.replay.restoring:
            done = self.replay.finished_before(tp, recs)
            if done:
                # An earlier owner finished these (its offset map): finished now, not run.
                st.progress.mark_finished(batch, done)
                self.committer.finished(len(done))
                skip = set(done)
                recs = [r for r in recs if r.offset not in skip]
                nbytes = sum(map(size_of, recs))
                if not recs:
                    return False
        return self.budget.register(tp, batch, recs, nbytes)

    # -- settle: what came back from the workers -------------------------------------------

    def _drain(self, wait: float) -> int:
        """Settle the tasks that came back (waiting up to `wait` for the first) and the
        progress of long tasks still running; returns the tasks settled."""
        sched = self.scheduler
        q = self.workers.completions
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
            now = time.monotonic()
            if now >= self._next_report:
                self._next_report = now + _REPORT_WAIT
                ran_long = time.perf_counter() - _REPORT_AFTER
                for t in reporting:
                    if t.finished > t.reported and t.started <= ran_long:
                        self._progress(t, t.finished)
        if sched.outstanding():
            now = time.monotonic()
            if now >= self._next_move:
                self._next_move = now + _MOVE_AFTER / 2
                for t in sched.running_long(time.perf_counter() - _MOVE_AFTER):
                    moved = sched.take_unstarted(t)
                    if moved:
                        log.debug("records_moved", tp=str(t.assignment.tp), records=moved)
                # Any task that runs long (a slow record among fast ones, not only a long
                # task): the records it finished ahead of the slow one move the watermark and
                # go into the offset map now, not when the slow one ends.
                ran_long = time.perf_counter() - _REPORT_AFTER
                for t in sched.started():
                    if t.finished > t.reported and t.started <= ran_long:
                        self._progress(t, t.finished)
        sched.dispatch()  # freed lanes, and records admitted from a partition's reserve
        return n

    def _drain_until(self, deadline: float, assignments: list[Assignment]) -> None:
        """A revoke's drain: wait for running handlers, and for dead-letter writes of these
        partitions, within the budget."""
        failures = self.failures
        while (
            self.scheduler.running(assignments) or failures.pending(assignments)
        ) and not self.life.hurry.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._drain(min(remaining, 0.05))
            if failures.dead_letters is not None:
                failures.dead_letters.poll()
        self._settle_started(assignments)

    def _settle_started(self, assignments: list[Assignment]) -> None:
        """Before a hand-off commit: what tasks still running finished ahead of the record
        they are on counts as finished, so the commit and its offset map include it (the next
        owner would handle it again otherwise). Before any cancel: a handler that returns
        because it was cancelled may not have finished its record."""
        for t in self.scheduler.started(assignments):
            if t.finished > t.reported:
                self._progress(t, t.finished)

    def _owner_of(self, a: Assignment) -> PartitionState | None:
        st = self.own.partitions.get(a.tp)
        if st is None or st.assignment is not a:
            return None  # revoked or lost: its budget was released, its batches are fenced
        return st

    def _progress(self, t: Task, upto: int) -> None:
        """A long task (one lane's records, or a deep unordered batch) finished its records up
        to `upto` and goes on: they leave the budget and move the watermark now, not when the
        task ends."""
        lo = t.reported
        if upto <= lo:
            return
        nbytes = sum(map(size_of, t.records[lo:upto]))
        t.reported, t.reported_bytes = upto, t.reported_bytes + nbytes
        self._settle(t, self._owner_of(t.assignment), lo, upto, nbytes)

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
        st = self._owner_of(t.assignment)
        if st is not None:
            a = st.assignment
            self.budget.finished(a.tp, hi - lo, nbytes)
            if not a.cancel.is_set():
                if t.outputs:
                    self._produce_outputs(t, idx)
                batches = [] if t.batch is not None else [t.batches[i] for i in idx]
                self._mark_done(picked, batches, t.batch)
                self.metrics.settled(a.tp, picked[0])
                if a.attempts:  # some record of this assignment is being retried
                    self.failures.settled(a, picked)
        self.scheduler.progressed(t, idx)

    def _complete(self, t: Task) -> None:
        self.scheduler.returned(t)
        self.metrics.task_done(t)
        if t.done is not None:
            # Concurrent workers: whatever finished since the last notice, then the rest.
            self._progress_done(t)
            if t.outcomes is not None:
                self._complete_mixed(t, self._owner_of(t.assignment))
            self.scheduler.advance(t)
            return
        st = self._owner_of(t.assignment)
        if t.outcomes is None:
            self._settle(t, st, t.reported, len(t.records), t.nbytes - t.reported_bytes)
        else:
            self._complete_mixed(t, st)
        self.scheduler.advance(t)

    def _settle(self, t: Task, st: PartitionState | None, lo: int, hi: int, nbytes: int) -> None:
        """Records `lo:hi` of `t` finished: they leave the budget of their (still owned)
        partition and move its watermark. A handler may return early once ctx.cancelled is set:
        its record is not known to be finished, so it never moves the watermark."""
        if st is None:
            return
        a = t.assignment
        self.budget.finished(a.tp, hi - lo, nbytes)
        if not a.cancel.is_set():
            whole = lo == 0 and hi == len(t.records)
            recs = t.records if whole else t.records[lo:hi]
            if t.outputs:
                self._produce_outputs(t, range(lo, hi))
            self._mark_done(recs, t.batches if whole else t.batches[lo:hi], t.batch)
            if recs:  # none: every record of a long task was settled as progress already
                self.metrics.settled(a.tp, recs[0])
            if a.attempts:  # some record of this assignment is being retried
                self.failures.settled(a, recs)

    def _mark_done(
        self, recs: list[Record], batches: list[BatchProgress], batch: BatchProgress | None
    ) -> None:
        """Finished records move their batches' watermarks (`batch`: the one batch of all)."""
        offsets = list(map(offset_of, recs))
        if batch is not None:
            done = batch.completed_many(offsets, batch.token)
        else:
            # Records of a batch sit next to each other (a lane's waiting records come in read
            # order): one call per run of the same batch.
            done = i = 0
            for b, run in groupby(batches):
                n = len(list(run))
                done += b.completed_many(offsets[i : i + n], b.token)
                i += n
        self.processed += done
        self.committer.finished(done)
        if self.txn is not None:
            self.txn.records += done

    def _complete_mixed(self, t: Task, st: PartitionState | None) -> None:
        """A task with failures or fenced records. Failed records stay unfinished and in the
        budget; the scheduler holds their lanes. Records already reported as progress were
        accounted for then."""
        assert t.outcomes is not None
        count = nbytes = done = 0
        a = t.assignment
        ok = st is not None and not a.cancel.is_set()
        finished = []
        # Concurrent workers' finished records were all settled as progress (`Task.done`);
        # records moved to other tasks (`Scheduler.take_unstarted`) are theirs to settle.
        settled = t.done is not None
        for i in range(0 if settled else t.reported, len(t.outcomes) - t.moved):
            code = t.outcomes[i]
            if settled and code == DONE:
                continue
            rec = t.records[i]
            if code in (DONE, FENCED):
                count += 1
                nbytes += rec.size
                b = t.batches[i]
                if code == DONE and ok and b.completed(rec.offset, b.token):
                    done += 1
                    finished.append(rec)
                    if t.outputs and i in t.outputs:
                        self._produce_outputs(t, (i,))
            elif code == FAILED:
                self.failed += 1
                error = (t.errors or {}).get(i)
                if isinstance(error, FencedError):
                    self._fenced(a, error)
                elif st is not None:
                    self.failures.failed(t, i)  # retry, or the final policy
        if st is not None:
            self.budget.finished(a.tp, count, nbytes)
            if finished:
                self.metrics.settled(a.tp, finished[0])
        self.processed += done
        self.committer.finished(done)
        if self.txn is not None:
            self.txn.records += done
        if finished and a.attempts:
            self.failures.settled(a, finished)

    def _produce_outputs(self, t: Task, indexes: Iterable[int]) -> None:
        """Outputs of records of `t` marked finished now: into the open transaction, which
        will commit them with these records' offsets, or abort them with them. A record of a
        batch that can no longer move its watermark (its partition was rewound: it will be
        read and run again) is not marked finished, so its outputs are dropped too."""
        assert t.outputs is not None and self.txn is not None
        batch = t.batch
        for i in indexes:
            outputs = t.outputs.get(i)
            if outputs and not (batch or t.batches[i]).revoked:
                self.txn.produce(outputs)

    def _fenced(self, a: Assignment, error: FencedError) -> None:
        """A handler's fenced write was refused: another member owns the partition in the
        fence's database. The partition is lost for this member: nothing more is committed or
        run for it, and it is paused until the group hands it over."""
        st = self._owner_of(a)
        if st is None:
            return
        tp = a.tp
        log.error("partition_fenced", tp=str(tp), held=error.held, stored=error.stored)
        self.own.lost([tp])
        self._left([a], [tp])
        self._set_paused([tp], True, reason="fenced")
        if self.txn is not None:
            # As for a lost partition: the open transaction holds its outputs, whose offsets
            # this member may no longer commit.
            self.txn.abort()
            self._rewind(list(self.own.partitions))

    def _finish_failed(self, f: Failed) -> None:
        """A failed record is done with (dead-lettered, or skipped): it leaves the budget,
        moves the watermark, and its lane runs on."""
        a, rec = f.assignment, f.record
        st = self._owner_of(a)
        if st is None:
            return
        self.budget.finished(a.tp, 1, rec.size)
        if not a.cancel.is_set() and f.batch.completed(rec.offset, f.batch.token):
            self.processed += 1
            self.committer.finished(1)
        if self.scheduler.ordered:
            self.scheduler.finish_held(a, f.lane, rec)
        self.scheduler.dispatch()

    # -- commits ---------------------------------------------------------------------------

    def _commit_sync(self, committable: Mapping[Partition, int | None]) -> dict[Partition, int]:
        """A hand-off commit (revoke, shutdown): the watermark of these partitions, with their
        offset maps; returns what was sent."""
        if self.txn is not None:
            # The transaction holds outputs of every partition: it commits them all.
            return self._commit_transaction(committable)
        return self.commits.send_sync(committable)

    def _commit_transaction(self, handing_off: Iterable[Partition]) -> dict[Partition, int]:
        """Send the watermark of every owned partition (and its offset map) into the open
        transaction and commit it: the outputs written so far are exactly those of the
        records below these watermarks and in their maps. If it aborted, every owned partition
        but those `handing_off` starts over from its committed offset."""
        txn = self.txn
        assert txn is not None
        if txn.fatal is not None and not self.life.should_run:
            return {}  # the member stops with it: nothing can be committed any more
        if not txn.ready:
            # The producer is being replaced: every owned partition was rewound then and waits
            # for its committed offset; nothing was marked finished since.
            return {}
        commits = self.commits
        commits.catch_up_positions()
        offsets = {tp: off for tp, off in commits.committable().items() if off is not None}
        _, metadata = commits.with_maps(offsets, dict(offsets))
        gone = set(handing_off)
        if (
            txn.empty
            and not gone
            and all(
                self.starts.committed.get(tp) == (off, metadata.get(tp) or None)
                for tp, off in offsets.items()
            )
        ):
            # Nothing finished and nothing moved since the last commit: no transaction (an
            # idle member would otherwise send its offsets and commit every interval). A
            # hand-off commits even so: an idle member writes nothing else, and this is how it
            # learns that a newer producer with its transactional id fenced it (that producer
            # fences before it joins the group, so its join is what started this hand-off).
            txn.opened_at = time.monotonic()
            return {}
        outcome = txn.commit(offsets, metadata, self.client.consumer_group_metadata())
        if outcome is Outcome.COMMITTED:
            now = time.monotonic()
            for tp, off in offsets.items():
                self.starts.committed[tp] = (off, metadata.get(tp) or None)
            commits.sent(offsets, metadata, now, sync=True)
            for tp, off in offsets.items():
                self.committer.result(tp, off, None, sync=True)
            return offsets
        staying = [tp for tp in self.own.partitions if tp not in gone]
        self._rewind(staying, reread=outcome is Outcome.UNKNOWN)
        return {}

    def _rewind(self, tps: list[Partition], *, reread: bool = False) -> None:
        """After an aborted transaction: these partitions start over locally, and their
        records are dropped until the client is back at their committed offsets. The committed
        offset map comes back with the offset: the records it lists had their outputs
        committed, and must not run again. `reread`: the commit's fate is unknown (the
        producer was replaced during it), so the committed offsets are read from the broker
        again, once the new producer has resolved that transaction."""
        for a in self.own.reset(tps):
            self.failures.forget([a])
            self.starts.rewind(a.tp, reread=reread)

    def _paused_for_start(self, tp: Partition) -> bool:
        """Sought to its start: paused for that alone (not for the budget), so resume it."""
        return tp in self.paused and self.budget.pause_reason(tp) is None

    def _emit_commit(self, event: CommitEvent) -> None:
        self.metrics.commit_result(event)
        # Read at every event: a listener added after start() is called from then on.
        for listener in self.life.listeners:
            self.callbacks.call(callback_name(listener), listener, event, tp=str(event.tp))

    # -- rebalance callbacks (owner thread, inside consume) --------------------------------

    def _guard(self, fn: Callable[[Any, list[TopicPartition]], None]) -> Callable[..., None]:
        def wrapped(client: Any, tps: list[TopicPartition]) -> None:
            try:
                fn(client, tps)
            except TransactionError as exc:
                # Found by the hand-off commit and logged there (transaction_fatal); a fence is
                # an expected way for a member to stop, not a fault of weir's callback.
                log.warning(
                    "rebalance_callback_fenced"
                    if exc.fenced
                    else "rebalance_callback_transaction_failed",
                    callback=fn.__name__,
                    step=exc.step,
                    error=str(exc),
                )
                self.life.fail(exc)
            except BaseException as exc:
                log.exception("rebalance_callback_failed", callback=fn.__name__)
                self.life.fail(exc)

        return wrapped

    def _on_assign(self, client: Any, tps: list[TopicPartition]) -> None:
        """An assignment ends a rebalance: counted once, with its duration from the
        rebalance's first callback (a revoke or lost before it), however many callbacks."""
        began = time.monotonic()
        m = self.metrics
        try:
            self._assign(client, tps, began)
        finally:
            self.life.joined = True
            self._owned_changed()
            seconds = m.rebalance_done(began, time.monotonic())
            log.info(
                "rebalance_done",
                rebalances=m.rebalances,
                assigned=len(tps),
                owned=len(self.own.partitions),
                seconds=round(seconds, 3),
            )

    def _assign(self, client: Any, tps: list[TopicPartition], began: float) -> None:
        parts = [Partition(t.topic, t.partition) for t in tps]
        if tps:
            # Every partition at an explicit offset: its committed one, read here, never
            # librdkafka's own fetch (`weir.starts`). Assign here rather than after the
            # callback so the pause state set below applies to partitions really assigned.
            at = self.starts.assign(parts)
            if self.cfg.incremental:
                client.incremental_assign(at)
            else:
                client.assign(at)
        self.own.assign(parts, self._set_paused, lambda added: self._prepare(added, began))

    def _prepare(self, added: list[Partition], began: float) -> None:
        """New partitions, before `on_assigned` and before their first record: those whose
        start is not settled yet paused, fence epochs, offset maps, their metrics."""
        self.metrics.assigned(added, began)
        self._set_paused(self.starts.paused(added), True, reason="start_offset_unknown")
        known = self.starts.committed
        committed = {tp: known[tp] for tp in added if tp in known}
        # For stats: the group's committed offset until this member commits.
        self.metrics.group_committed(
            {tp: (off if off >= 0 else None) for tp, (off, _) in committed.items()}
        )
        if self.fence is not None:
            self._acquire_epochs(added)
        if self.replay.enabled:
            self.replay.restore(committed)

    def _acquire_epochs(self, added: list[Partition]) -> None:
        """A fence: this member becomes the partitions' owner in the database before their
        first record runs (`Context.epoch`)."""
        assert self.fence is not None
        epochs = self.fence.acquire(self.cfg.group_id, added)
        for tp in added:
            self.own.partitions[tp].assignment.epoch = epochs[tp]
        log.info("fence_epochs_acquired", epochs={str(tp): epochs[tp] for tp in added})

    def _on_revoke(self, client: Any, tps: list[TopicPartition]) -> None:
        self.metrics.rebalance_began(time.monotonic())
        gone = self._assignments_of(tps)
        parts = [Partition(t.topic, t.partition) for t in tps]
        self.own.revoke(parts, self._drain_until, self._commit_sync)
        self._left(gone, parts)
        self.starts.forget(parts)
        self.paused.difference_update(parts)

    def _on_lost(self, client: Any, tps: list[TopicPartition]) -> None:
        self.metrics.rebalance_began(time.monotonic())
        self.life.joined = False
        gone = self._assignments_of(tps)
        parts = [Partition(t.topic, t.partition) for t in tps]
        self.own.lost(parts)
        self._left(gone, parts)
        self.starts.forget(parts)
        if self.txn is not None and gone:
            # The open transaction holds outputs of the lost partitions, whose offsets this
            # member may no longer commit: abort it, and start the others over.
            self.txn.abort()
            self._rewind(list(self.own.partitions))
        self.paused.difference_update(parts)

    def _left(self, gone: list[Assignment], parts: list[Partition]) -> None:
        """Partitions left this member (revoked, lost, fenced): what is kept of them outside
        `Ownership` goes too, in one place for the three ways out."""
        self.failures.forget(gone)
        self.replay.forget(parts)
        self.metrics.removed(parts)
        self._owned_changed()

    def _owned_changed(self) -> None:
        self.commits.forget_unowned()
        if self._watermarks is not None:
            self._watermarks.track(self.own.partitions)

    def _assignments_of(self, tps: list[TopicPartition]) -> list[Assignment]:
        parts = self.own.partitions
        return [
            parts[tp].assignment
            for tp in (Partition(t.topic, t.partition) for t in tps)
            if tp in parts
        ]

    def _set_paused(
        self, tps: Sequence[Partition], paused: bool, *, reason: str = "assignment"
    ) -> None:
        """Pause or resume `tps` in the client. `reason` goes to the log: `capacity` (the
        budget is full), `share` (a partition holds its share read ahead), `blocked` (a failure
        policy), `budget` (a resume: below the low marks, the reserve ran low, or a block
        lifted), `assignment` (weir's state re-applied to new partitions),
        `start_offset_unknown`, `fenced`, `shutdown`."""
        if not tps:
            return
        log.debug(
            "partitions_paused" if paused else "partitions_resumed",
            partitions=[str(tp) for tp in tps],
            reason=reason,
        )
        try:
            if paused:
                self.client.pause(topic_partitions(tps))
                self.paused.update(tps)
            else:
                self.client.resume(topic_partitions(tps))
                self.paused.difference_update(tps)
        except KafkaException as exc:
            log.warning("pause_resume_failed", paused=paused, error=str(exc))

    def _resume(self, tps: list[Partition]) -> None:
        """Resume from the owner loop (never inside a rebalance callback) and get the fetches
        going at once.

        librdkafka's resume only clears a flag: a broker thread that went idle because all its
        partitions were paused sleeps on (up to 1 s, `rd_kafka_max_block_ms`). A seek restarts
        the partition's fetch state, which wakes the broker thread of its leader. Each resumed
        partition is sought to where the resume would fetch from anyway, the client's position
        (its last handed-out offset + 1; after an earlier seek, before anything new was handed
        out, the read position weir tracked): no request, no skip, no replay. Only when no
        partition has a position yet (nothing consumed) does a metadata request wake the broker
        that answers it."""
        if not tps:
            return
        self._set_paused(tps, False, reason="budget")
        parts = self.own.partitions
        woken = 0
        try:
            positions = self.client.position(topic_partitions(tps))
        except KafkaException as exc:
            log.debug("position_failed", error=str(exc))
            positions = []
        for r in positions:
            st = parts.get(Partition(r.topic, r.partition))
            at = r.offset if r.offset >= 0 else st.progress.read_position if st else None
            if at is None or at < 0:
                continue
            try:
                self.client.seek(TopicPartition(r.topic, r.partition, at))
                woken += 1
            except KafkaException as exc:
                log.debug("resume_seek_failed", tp=f"{r.topic}[{r.partition}]", error=str(exc))
        if not woken:
            self._wake_fetcher(tps[0].topic)

    def _wake_fetcher(self, topic: str) -> None:
        """Any request to a broker wakes its thread; a metadata request is the cheapest one the
        Python client exposes (2 to 5 ms here, blocking the owner). Only the broker that
        answers is woken. Never call this from a rebalance callback: confluent-kafka aborts the
        process (CallState_get assertion) on a nested blocking call."""
        try:
            self.client.list_topics(topic, timeout=1.0)
        except KafkaException as exc:
            log.debug("wake_fetcher_failed", error=str(exc))

    # -- errors ----------------------------------------------------------------------------

    def _on_error(self, err: KafkaError) -> None:
        code, text = err.code(), err.str()
        if self._startup_causes is not None:
            self._startup_causes.setdefault(client_error_cause(text), (err.name(), text))
        refused = refusal_of(err.name(), text)
        if err.fatal():
            log.error("kafka_fatal_error", code=err.name(), error=text)
            self.life.fail(KafkaFatalError(str(err)))
        elif code == KafkaError._ALL_BROKERS_DOWN:
            self.life.brokers_down(time.monotonic())
            if self._first("all_brokers_down", err):
                log.error("all_brokers_down", code=err.name(), error=text)
        elif refused is not None:
            # Retried by the client, but into success only once its settings or the broker's
            # change: an error, not a warning.
            authentication = refused.kind == "authentication"
            if self._first(
                "kafka_authentication_failed" if authentication else "kafka_tls_failed", err
            ):
                log.error(
                    "kafka_authentication_failed" if authentication else "kafka_tls_failed",
                    code=err.name(),
                    error=text,
                )
        elif self._first("kafka_error", err):
            log.warning("kafka_error", code=err.name(), error=text)

    def _first(self, event: str, err: KafkaError) -> bool:
        """Whether `err` is the first of a run of the same error (log it); later ones are
        counted and reported by `_repeated`."""
        text, suppressed = without_retry_details(err.str())
        return self._repeats.seen((event, err.name(), text), self._repeated, 1 + suppressed)

    def _repeated(self, key: object, burst: Burst, ongoing: bool) -> None:
        assert isinstance(key, tuple)
        event, code, text = key
        log.warning(
            "error_repeated",
            of=event,
            code=code,
            error=text,
            count=burst.count,
            first=timestamp(burst.first),
            last=timestamp(burst.last),
            ongoing=ongoing,
        )

    def _on_message_error(self, err: KafkaError, msg: KafkaMessage) -> None:
        if err.fatal():
            self._on_error(err)
        elif err.code() == KafkaError._MAX_POLL_EXCEEDED:
            log.error("max_poll_interval_exceeded", code=err.name(), error=err.str())
        elif err.code() == KafkaError._AUTO_OFFSET_RESET:
            # auto_offset_reset="error" and no valid committed offset: nothing can be read
            # without a decision the application made not to let weir take.
            topic, partition = msg.topic(), msg.partition()
            tp = None if topic is None or partition is None else Partition(topic, partition)
            failure = self.life.failure
            if isinstance(failure, OffsetResetError):
                failure.add(tp)
            elif self.life.fail(OffsetResetError(err.str(), tp)):
                log.error("offset_reset_failed", tp=str(tp), error=err.str())
        elif self._first("consume_error", err):
            log.warning("consume_error", code=err.name(), error=err.str())

    # -- observability ---------------------------------------------------------------------

    def _publish(self, *, running: bool) -> None:
        budget = self.budget
        m = self.metrics
        now = time.monotonic()
        self._next_publish = now + _PUBLISH_EVERY
        refreshed = self._watermarks.high() if self._watermarks is not None else {}
        parts = []
        for tp, st in sorted(self.own.partitions.items()):
            pb = budget.parts.get(tp)
            pm = m.parts.get(tp)
            committable = st.progress.committable()
            committed = self.committer.confirmed(tp)
            if committed is None and pm is not None:
                committed = pm.group_committed
            position = self.commits.positions.get(tp, st.progress.read_position)
            low, high = self._watermarks_of(tp)
            if tp in refreshed and (high is None or refreshed[tp] > high):
                high = refreshed[tp]
            in_flight = pb.records if pb else 0
            ahead = pb.ahead_records if pb else 0
            stalled = 0.0
            oldest_age = oldest_fetched = None
            if pm is not None:
                stalled = pm.watermark(committable, bool(in_flight or ahead), now)
                oldest_fetched, oldest_age = pm.oldest_ages(now)
            parts.append(
                PartitionStats(
                    tp=tp,
                    token=st.assignment.token,
                    in_flight=in_flight,
                    in_flight_bytes=pb.bytes if pb else 0,
                    committable=committable,
                    committed=committed,
                    paused=tp in self.paused,
                    pause_reason=(
                        budget.pause_reason(tp) or self.starts.pause_reason(tp)
                        if tp in self.paused
                        else None
                    ),
                    read_ahead=ahead,
                    offset_map_bytes=self.replay.sizes.get(tp, 0),
                    position=position,
                    high_watermark=high,
                    log_start=low,
                    throttled=budget.throttled,
                    blocked=pb.blocked if pb else False,
                    oldest_age_s=oldest_age,
                    oldest_fetched_s=oldest_fetched,
                    stalled_s=stalled,
                    last_commit_time=pm.last_commit_time if pm else None,
                    last_commit_offset=pm.last_commit_offset if pm else None,
                    last_commit_error=pm.last_commit_error if pm else None,
                    assigned_time=pm.assigned_time if pm else 0.0,
                    recovery_s=pm.recovery_s if pm else None,
                )
            )
        ahead_bytes = budget.read_ahead_bytes
        rate, window = m.rate(self.processed, now)
        flow = self.cfg.flow
        self.life.publish(
            ConsumerStats(
                at=now,
                running=running,
                processed=self.processed,
                failed=self.failed,
                in_flight=budget.records,
                in_flight_bytes=budget.bytes - ahead_bytes,
                peak_in_flight=budget.peak_records,
                peak_in_flight_bytes=budget.peak_bytes,
                throttled=budget.throttled,
                throttles=budget.throttles,
                paused=budget.paused,
                pauses=budget.pauses,
                rebalances=m.rebalances,
                partitions=tuple(parts),
                read_ahead=sum(p.read_ahead for p in parts),
                read_ahead_bytes=ahead_bytes,
                callback_failures=self.callbacks.failures,
                workers_replaced=self.workers.replaced,
                loop_blocked=getattr(self.workers, "loop_blocked", 0),
                retries=self.failures.retries,
                waiting_retry=self.failures.waiting,
                dead_lettered=self.failures.dead_lettered,
                skipped=self.failures.skipped,
                blocked=tuple(self.failures.blocked()),
                offset_map_truncations=self.replay.truncations,
                replay_skipped=self.replay.skipped,
                commit_failures=m.commit_failures,
                rate=rate,
                rate_window_s=window,
                handler_latency=m.handler.snapshot(),
                end_to_end_latency=m.end_to_end.snapshot(),
                rebalance_last_s=m.rebalance_last_s,
                rebalance_seconds=m.rebalance_seconds,
                rebalancing=m.rebalancing,
                joined=self.life.joined,
                capacity_records=flow.capacity_records,
                capacity_bytes=flow.capacity_bytes,
            )
        )

    def _watermarks_of(self, tp: Partition) -> tuple[int | None, int | None]:
        """The client's log start and high watermark of `tp` from its last fetch response: a
        local read, no request (None where unknown)."""
        try:
            low, high = self.client.get_watermark_offsets(
                TopicPartition(tp.topic, tp.partition), cached=True
            )
        except KafkaException:
            return None, None
        return (low if low >= 0 else None), (high if high >= 0 else None)


def _producer(conf: dict[str, Any]) -> ProducerClient:
    from confluent_kafka import Producer

    return Producer(conf)
