"""The owner thread's engine: the only code that calls the Kafka client.

Each turn is four steps, each calling one owner: *intake* (consume, `weir._engine.intake` builds
records, `PartitionProgress` registers their batch, `Budget` admits them) → *schedule*
(`Scheduler` packs runnable records into tasks for the `Workers`) → *settle* (finished records
leave the `Budget` and move their batch's watermark) → *commit* (`Committer` decides, the
engine sends). Rebalance callbacks are served inside consume and go to `Ownership`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from confluent_kafka import (
    KafkaException,
    TopicPartition,
)

from weir._engine.aio import AsyncWorkers, hook_caller
from weir._engine.app_pauses import AppPauses
from weir._engine.budget import Budget
from weir._engine.callbacks import Callbacks, callback_name
from weir._engine.client import (
    ClientFactory,
    ConsumerClient,
    KafkaMessage,
    ProducerClient,
    ProducerFactory,
    TransactionalProducerFactory,
)
from weir._engine.client_errors import ClientErrors
from weir._engine.clock import SYSTEM, Clock
from weir._engine.commit_requests import CommitPath
from weir._engine.committing import Committer
from weir._engine.deadletter import DeadLetters
from weir._engine.exactly_once import ExactlyOnce
from weir._engine.failures import Failures
from weir._engine.fetching import FetchControl
from weir._engine.flushing import Flushing, batch_limits, workers_for
from weir._engine.intake import Run, runs_of
from weir._engine.lifecycle import Lifecycle
from weir._engine.metrics import Metrics
from weir._engine.outputs import Outputs
from weir._engine.ownership import Ownership, PartitionState, Scope, Tracker
from weir._engine.protocols import ProtocolProbe, choose_protocol, warn_commit_blackout
from weir._engine.rates import RateLimits
from weir._engine.refusals import first_token_refusal, token_refusal
from weir._engine.replay import ReplayMaps
from weir._engine.requests import Requests
from weir._engine.scheduling import Orderings, Scheduler
from weir._engine.seeking import Seeks
from weir._engine.settlement import Settlement
from weir._engine.snapshot import Snapshot
from weir._engine.stalls import Stalls
from weir._engine.starts import Starts
from weir._engine.tasks import Assignment
from weir._engine.transactions import TransactionError, Transactions
from weir._engine.watermarks import WatermarkRefresher
from weir._engine.workers import Workers
from weir.config import ConsumerConfig
from weir.errors import FencedError
from weir.fencing.base import Fence
from weir.logs import (
    ClientLog,
    Repeats,
    get_logger,
)
from weir.records import CommitEvent, Handler, Partition, size_of

__all__ = ["Engine"]

log = get_logger(__name__)

# How long the owner waits on the completion queue when work is in flight and nothing was fetched:
# short enough that new records are picked up promptly, long enough not to spin.
_IDLE_WAIT = 0.01
# Stats are published at a commit (at most twice per commit interval) and at least this often.
_PUBLISH_EVERY = 1.0
# While every broker is reported down: the longest the owner waits for one to answer, once a
# second (`Lifecycle.broker_probe_due`).
_PROBE_WAIT = 0.25
# The shutdown's last commit waits this long for its answer even when the drain used up the
# shutdown budget: an answer takes milliseconds unless a rebalance holds the connection.
_FINAL_COMMIT_S = 1.0


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
        protocol_probe: ProtocolProbe | None = None,
        clock: Clock = SYSTEM,
        orderings: Orderings | None = None,  # each topic's, if the routes' orderings differ
    ) -> None:
        self.cfg = cfg = config
        self.clock = clock
        self.handler = handler
        self.life = life
        self._factory = client_factory
        # group_protocol="auto": what asks the broker (None: the classic protocol).
        self._protocol_probe = protocol_probe
        self.callbacks = Callbacks(cfg.callback_errors, life.fail)
        # The client's errors and librdkafka's log lines repeat while a broker is down (a
        # refused connection every 50 ms): the first of each is logged, the rest counted.
        self._repeats = Repeats()
        self.errors = ClientErrors(cfg, life, self._repeats)
        transactional = cfg.transactional_id is not None
        if workers is None:
            workers = workers_for(handler, cfg, loop, orderings)
        self.workers = workers
        rates = self.rates = RateLimits.of(cfg, clock)
        self.scheduler = Scheduler(
            workers, cfg.ordering, orderings=orderings, batch=batch_limits(workers), rates=rates
        )
        self.committer = Committer(
            cfg.commit_interval_s, cfg.commit_every_records, self._emit_commit, clock=clock
        )
        self.budget = Budget(cfg, self.scheduler)
        self.fetch = FetchControl(lambda: self.client, self._read_position)
        self.own = Ownership(
            handler, self.scheduler, self.committer, self.budget, self.callbacks,
            cfg.revoke_timeout_s, hook=self._hook, clock=clock,
        )  # fmt: skip
        policies = [cfg.failure, *cfg.failure_by_topic.values()]
        dead_letters = None
        if any(p.final == "dead_letter" for p in policies):
            dead_letters = DeadLetters(
                cfg, producer_factory or _producer, logger=ClientLog(self._repeats)
            )
        self.failures = Failures(
            cfg,
            self.scheduler,
            self.budget,
            self.fetch,
            life,
            lambda f: self.settle.given_up(f),
            dead_letters,
            clock=clock,
            refusals=self.errors,
            outputs=Outputs.of(cfg, producer_factory or _producer, ClientLog(self._repeats)),
        )
        self.pauses = AppPauses(self.fetch, lambda: self.own.partitions, clock)
        self.replay = ReplayMaps(cfg.offset_map, cfg.offset_map_max_bytes)
        self.commits = CommitPath(
            lambda: self.client, self.own, self.committer, self.replay, clock=clock
        )
        # Exactly-once mode: the transactional producer (a real Producer is transactional; a
        # test's producer_factory must give one too).
        self.txn = (
            Transactions(
                cfg,
                cast(TransactionalProducerFactory, producer_factory or _producer),
                logger=ClientLog(self._repeats),
                interrupt=life.hurry,
                clock=clock,
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
            self.fetch,
            ready=None if txn is None else lambda: txn.ready,
            start_at=cfg.start_at,
        )
        self.stalls = Stalls(
            cfg.partition_stall_s,
            client=lambda: self.client,
            own=self.own,
            fetch=self.fetch,
            budget=self.budget,
            starts=self.starts,
            incremental=cfg.incremental,
        )
        self.eos = (
            None
            if txn is None
            else ExactlyOnce(
                txn,
                client=lambda: self.client,
                own=self.own,
                commits=self.commits,
                committer=self.committer,
                starts=self.starts,
                failures=self.failures,
                life=life,
                clock=clock,
            )
        )
        seeks = Seeks(
            client=lambda: self.client, own=self.own, starts=self.starts,
            committer=self.committer, replay=self.replay, eos=self.eos, clock=clock,
            settle_started=lambda a: self.settle.settle_started(a),
        )  # fmt: skip
        self.requests = Requests(life, self.failures, self.pauses, seeks)
        self.fence = fence
        self._last_poll = 0.0
        self._client: ConsumerClient | None = None
        self.metrics = Metrics()
        self.settle = Settlement(
            self.own,
            self.scheduler,
            self.workers,
            self.budget,
            self.committer,
            self.metrics,
            lambda: self.failures,
            self.txn,
            self._fenced,
            clock=clock,
            outputs=self.failures.outputs,
        )
        self.flushing = Flushing(
            handler, workers, self.settle, self.own, self.starts, self.callbacks, self._hook,
            timeout_s=cfg.flush_timeout_s, interrupt=life.hurry,
        )  # fmt: skip
        # Everything that keeps state per partition: opened and closed by Ownership alone, for
        # the whole time the member owns the partition or for one assignment of it.
        trackers: tuple[tuple[Tracker, Scope], ...] = (
            (self.budget, "assignment"),
            (self.failures, "assignment"),
            (self.committer, "partition"),
            (self.commits, "partition"),
            (self.replay, "partition"),
            (self.starts, "partition"),
            (self.stalls, "assignment"),
            (self.pauses, "assignment"),
            (self.fetch, "partition"),
            (self.metrics, "partition"),
        )
        for tracker, scope in trackers:
            self.own.track(tracker, scope)
        self.snapshot = Snapshot(
            client=lambda: self.client,
            own=self.own,
            budget=self.budget,
            metrics=self.metrics,
            committer=self.committer,
            commits=self.commits,
            fetch=self.fetch,
            stalls=self.stalls,
            replay=self.replay,
            settle=self.settle,
            failures=self.failures,
            callbacks=self.callbacks,
            workers=self.workers,
            life=life,
            flow=cfg.flow,
            refresher=lambda: self._watermarks,
        )
        # How often the high watermarks are read by a client of their own (None: not at all).
        self._refresh_s = cfg.watermark_refresh_s if refresh_watermarks else None
        self._watermarks: WatermarkRefresher | None = None
        self._next_publish = 0.0

    def _hook(
        self, fn: Callable[..., object], timeout: float | None = None
    ) -> Callable[..., object]:
        """What calls a handler hook (`hook_caller`); an `async def` one waits at most `timeout`
        (default `revoke_timeout_s`: the owner is inside a rebalance callback)."""
        limit = self.cfg.revoke_timeout_s if timeout is None else timeout
        return hook_caller(fn, self.workers, limit)

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
        cfg = self.cfg = choose_protocol(
            self.cfg, self._protocol_probe, self.life.stop_requested.is_set
        )
        if self._protocol_probe is not None:  # weir's own client: a fake has no JoinGroup
            warn_commit_blackout(cfg)
        conf = cfg.librdkafka_config()
        conf["on_commit"] = self.commits.on_commit
        conf["error_cb"] = self.errors.on_error
        conf["logger"] = ClientLog(self._repeats)  # librdkafka's lines: weir.librdkafka
        refused = first_token_refusal(conf)
        if refused is not None:
            raise refused
        try:
            self._client = self._factory(conf)
        except (KafkaException, SystemError) as exc:
            refused = token_refusal(exc, conf)
            if refused is None:
                raise
            raise refused from None
        meta = self.errors.check_reachable(self.client)
        if meta is None:
            return  # stopped before a broker answered: nothing to join, the shutdown follows
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
        # Liveness counts from here until the first poll.
        self.life.polled_at = self.clock.monotonic()
        log.info(
            "consumer_started",
            group_id=cfg.group_id,
            topics=cfg.topics,
            ordering=cfg.ordering,
            **({} if (o := self.scheduler.orderings) is None else {"orderings": dict(o.shown)}),
            **(
                {"max_in_flight": cfg.max_in_flight}
                if isinstance(self.workers, AsyncWorkers)
                else {"workers": cfg.workers}
            ),
            protocol=cfg.group_protocol,
        )
        self.life.running()
        self.life.started.set()

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
        deadline = self.clock.monotonic() + self.cfg.shutdown_timeout_s
        if client is None:
            self.workers.stop(0)
            return
        log.info("consumer_stopping", reason=repr(life.failure) if life.failure else "stop")
        try:
            self.own.deadline_cap = deadline
            self.own.stop_dispatch()
            self.flushing.run_gathered()
            self.fetch.hold(list(self.own.partitions), "shutdown")
            while (
                self.scheduler.running(self.own.assignments())
                and self.clock.monotonic() < deadline
                and not life.hurry.is_set()
            ):
                self.settle.drain(0.05)
                # Keep serving the group while handlers finish; nothing new is dispatched.
                client.consume(1, 0)
                life.polled_at = self.clock.monotonic()
            self.settle.drain(0)
            # Confirmed dead letters and outputs count as finished before the final commit.
            self.failures.flush_writes(deadline - self.clock.monotonic(), life.hurry)
            self.settle.drain(0)
            self.settle.settle_started(self.own.assignments())
            self.flushing.flush(self.own.partitions, deadline - self.clock.monotonic())
            left = self.scheduler.running(self.own.assignments())
            if left:
                self.own.cancel_all()
                log.warning(
                    "shutdown_budget_exceeded" if not life.hurry.is_set() else "shutdown_hurried",
                    unfinished=left,
                )
            self._commit_final(client, deadline)
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
                    self.txn.close(deadline - self.clock.monotonic())
                except Exception:  # the steps after it (the workers' stop) must still run
                    log.exception("transactions_close_failed")
            if self.fence is not None:
                try:
                    self.fence.close()
                except Exception:
                    log.exception("fence_close_failed")
            self.failures.close()
            # The closes served the last of the clients' errors and lines.
            self._repeats.flush()
            hook = self.handler.on_shutdown
            hook_s = max(1.0, deadline - self.clock.monotonic())
            self.callbacks.call(
                callback_name(hook), self._hook(hook, hook_s), hook_name="on_shutdown"
            )
            self.workers.stop(max(0.0, deadline - self.clock.monotonic()))
            if self._watermarks is not None:
                self._watermarks.stop(max(0.0, min(1.0, deadline - self.clock.monotonic())))
            log.info("consumer_stopped", processed=self.settle.processed)

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
            wait = self._last_poll + self.cfg.poll_timeout_s - self.clock.monotonic()
            msgs: Sequence[KafkaMessage]
            if wait > 0:
                self.settle.drain(self.failures.wait(wait))
                msgs = ()
                polled = False
            else:
                self._last_poll = self.clock.monotonic()
                msgs = self.client.consume(1, 0)
        else:
            wait = 0 if busy else self.failures.wait(self.cfg.poll_timeout_s)
            msgs = self.client.consume(budget.fetch_size(), wait)
        if msgs:
            self._register(msgs)
        if busy and not msgs:
            self.settle.drain(_IDLE_WAIT)
        else:
            self.settle.drain(0)
        budget.admit_starved()
        now = self.clock.monotonic()
        if polled:
            self.life.polled_at = now
        if self.failures.turn(now):
            self.scheduler.dispatch()  # retries due now go out this turn, not after a poll
        if self.rates is not None:
            self.rates.hold_fetches(self.fetch, self.budget)
        self.requests.serve()
        self.pauses.turn(now)
        if self.life.broker_probe_due(now):
            self._probe_brokers()
        if self.starts.pending:
            self.starts.turn(now)
        self.stalls.turn(now)
        if self.eos is not None:
            if self.eos.turn(now, self.flushing.flush):
                self._publish(running=True, commit=True)
        elif self.committer.due(now) and self.commits.ready(now):
            self.flushing.flush()
            self.commits.send_async(now)
            self._publish(running=True, commit=True)
        if now >= self._next_publish:
            # Stats at least this often, however long the commit interval.
            self.commits.catch_up_positions()
            self._publish(running=True)
        was_paused = budget.paused
        pause, resume = budget.end_turn()
        if budget.throttled:
            self.flushing.run_gathered()  # no more records may come for the batch gathered
        if pause or resume or budget.paused != was_paused:
            # The budget decides capacity (every partition) and share (one partition holding
            # its reserve); fetch control follows its state.
            parts = budget.parts
            self.fetch.follow(parts, "capacity", lambda tp: budget.paused)
            self.fetch.follow(parts, "share", lambda tp: parts[tp].over_share)
        self.fetch.turn()

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
        down = self.life.broker_answered(self.clock.monotonic())
        log.info("brokers_reachable", down_s=round(down, 1))

    def _register(self, msgs: Sequence[KafkaMessage]) -> None:
        """Hand what one consume call returned to the lanes: one batch per run (one partition,
        offsets increasing: a rewind mid-call starts a new run)."""
        partitions = self.own.partitions
        full = []
        now = self.clock.monotonic()
        for run in runs_of(msgs, self.errors.on_message_error):
            self.errors.fetched(run.topic)
            tp = Partition(run.topic, run.partition)
            if self._register_run(partitions.get(tp), run, now):
                full.append(tp)
        # One call for all: each pause waits for librdkafka's broker thread while holding the
        # interpreter lock (confluent-kafka does not release it there).
        self.fetch.hold(full, "share")
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
                skip = set(done)
                self.settle.replayed(st, batch, [r for r in recs if r.offset in skip])
                recs = [r for r in recs if r.offset not in skip]
                nbytes = sum(map(size_of, recs))
                if not recs:
                    return False
        return self.budget.register(tp, batch, recs, nbytes)

    # -- settle: what came back from the workers -------------------------------------------

    def _drain_until(self, deadline: float, assignments: list[Assignment]) -> None:
        """A revoke's drain: wait for running handlers, and for dead-letter writes of these
        partitions, within the budget."""
        failures = self.failures
        self.flushing.run_gathered()  # a revoked partition's records may be in it
        while (
            self.scheduler.running(assignments) or failures.pending(assignments)
        ) and not self.life.hurry.is_set():
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                break
            self.settle.drain(min(remaining, 0.05))
            failures.poll_writes()
        self.settle.settle_started(assignments)
        self.flushing.flush({a.tp for a in assignments}, deadline - self.clock.monotonic())

    def _fenced(self, a: Assignment, error: FencedError) -> None:
        """A handler's fenced write was refused: another member owns the partition in the
        fence's database. The partition is lost for this member: nothing more is committed or
        run for it, and it is paused until the group hands it over."""
        st = self.own.partitions.get(a.tp)
        if st is None or st.assignment is not a:
            return  # revoked or lost since
        tp = a.tp
        log.error("partition_fenced", tp=str(tp), held=error.held, stored=error.stored)
        self.own.lost([tp])
        self._owned_changed()
        self.fetch.hold([tp], "fenced")  # until the group moves it
        if self.eos is not None:
            # As for a lost partition: the open transaction holds its outputs, whose offsets
            # this member may no longer commit.
            self.eos.abort_all()

    # -- commits ---------------------------------------------------------------------------

    def _commit_sync(self, committable: Mapping[Partition, int | None]) -> dict[Partition, int]:
        """A hand-off commit (revoke, shutdown): the watermark of these partitions, with their
        offset maps; returns what was sent."""
        if self.eos is not None:
            # The transaction holds outputs of every partition: it commits them all.
            return self.eos.commit(committable)
        return self.commits.send_sync(committable)

    def _commit_final(self, client: ConsumerClient, deadline: float) -> None:
        """The shutdown's last commit, its answer awaited within the shutdown budget (and at
        least `_FINAL_COMMIT_S`) by serving the client."""
        committable = self.commits.committable()
        if self.eos is not None:
            self.eos.commit(committable)  # its client calls have deadlines of their own
            return

        def serve(wait: float) -> None:
            # Records it hands out are not run: their partitions are held for the shutdown.
            client.consume(1, wait)
            self.life.polled_at = self.clock.monotonic()

        until = max(deadline, self.clock.monotonic() + _FINAL_COMMIT_S)
        self.commits.send_final(committable, until, serve, self.life.hurry)

    def _read_position(self, tp: Partition) -> int | None:
        st = self.own.partitions.get(tp)
        return None if st is None else st.progress.read_position

    def _emit_commit(self, event: CommitEvent) -> None:
        self.metrics.commit_result(event)
        self.errors.commit_result(event)
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
        began = self.clock.monotonic()
        m = self.metrics
        self._rebalancing()
        try:
            self._assign(client, tps, began)
            if self.eos is None:
                self.commits.send_pending(self.clock.monotonic())
        finally:
            self.life.joined = self.life.ever_joined = True
            self.errors.allowed(lambda d: d.resource_type == "group")
            self._owned_changed()
            seconds = m.rebalance_done(began, self.clock.monotonic())
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
            # librdkafka's own fetch (`weir._engine.starts`). Assign here rather than after the
            # callback so the pause state set below applies to partitions really assigned.
            at = self.starts.assign(parts)
            if self.cfg.incremental:
                client.incremental_assign(at)
            else:
                client.assign(at)
        self.own.assign(parts, lambda added: self._prepare(added, began))

    def _prepare(self, added: list[Partition], began: float) -> None:
        """New partitions, before `on_assigned` and before their first record: those whose
        start is not settled yet paused, fence epochs, offset maps, their metrics."""
        self.metrics.assigned(added, began)
        if self.budget.paused:
            self.fetch.hold(added, "capacity")
        self.starts.hold_waiting(added)
        self.fetch.assigned(added)
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
        self.metrics.rebalance_began(self.clock.monotonic())
        self._rebalancing()
        parts = [Partition(t.topic, t.partition) for t in tps]
        self.own.revoke(parts, self._drain_until, self._commit_sync)
        self.fetch.forget(parts)  # a fenced one was held until the group took it
        self._owned_changed()

    def _on_lost(self, client: Any, tps: list[TopicPartition]) -> None:
        self.metrics.rebalance_began(self.clock.monotonic())
        self._rebalancing()
        self.life.joined = False
        gone = self._assignments_of(tps)
        parts = [Partition(t.topic, t.partition) for t in tps]
        self.own.lost(parts)
        self.fetch.forget(parts)  # a fenced one was held until the group took it
        self.commits.generation_ended()
        self._owned_changed()
        if self.eos is not None and gone:
            # The open transaction holds outputs of the lost partitions, whose offsets this
            # member may no longer commit: abort it, and start the others over.
            self.eos.abort_all()

    def _rebalancing(self) -> None:
        """Inside a rebalance callback: under an incremental protocol librdkafka paused every
        assigned partition for it, and the ones kept must be woken after (`FetchControl`)."""
        if self.cfg.incremental:
            self.fetch.rebalanced(self.own.partitions)

    def _owned_changed(self) -> None:
        if self._watermarks is not None:
            self._watermarks.track(self.own.partitions)

    def _assignments_of(self, tps: list[TopicPartition]) -> list[Assignment]:
        parts = self.own.partitions
        return [
            parts[tp].assignment
            for tp in (Partition(t.topic, t.partition) for t in tps)
            if tp in parts
        ]

    # -- observability ---------------------------------------------------------------------

    def _publish(self, *, running: bool, commit: bool = False) -> None:
        now = self.clock.monotonic()  # a snapshot is O(partitions): not each of tens of commits/s
        if commit and now < self._next_publish - _PUBLISH_EVERY + self.cfg.commit_interval_s / 2:
            return
        self._next_publish = now + _PUBLISH_EVERY
        self.life.publish(self.snapshot.take(running=running, now=now))


def _producer(conf: dict[str, Any]) -> ProducerClient:
    from confluent_kafka import Producer

    return Producer(conf)
