"""The owner thread's loop: the only code that calls the Kafka client.

One thread polls, registers batches, dispatches records into lanes, drains the completion queue,
commits, pauses and resumes, and serves the rebalance callbacks. Workers only run handlers.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import groupby
from typing import TYPE_CHECKING, Any

import structlog
from confluent_kafka import (
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from weir.committing import Committer
from weir.errors import BrokerUnreachableError, HandlerError, KafkaFatalError
from weir.flow import FlowControl
from weir.intake import Run, runs_of
from weir.metrics import ConsumerStats, PartitionStats
from weir.rebalance import Ownership, PartitionState
from weir.records import Partition, Record, offset_of, size_of
from weir.scheduling import DONE, FAILED, FENCED, Assignment, Scheduler, Task
from weir.sharing import Shares
from weir.tracking import BatchProgress

if TYPE_CHECKING:
    from weir.consumer import GroupConsumer

__all__ = ["Loop"]

log = structlog.get_logger(__name__)

# How long the owner waits on the completion queue when work is in flight and nothing was fetched:
# short enough that new records are picked up promptly, long enough not to spin.
_IDLE_WAIT = 0.01
# The longest the owner sleeps while long tasks run: their finished records are read, not sent
# (`Task.report`), and leave the budget and move the watermark when the owner looks.
_REPORT_WAIT = 0.005
# ... once a task has run this long: longer than a lane task's 40 ms of records
# (`scheduling._LANE_SECONDS`), which comes back soon enough on its own. Reading the progress of
# 16 lane tasks every 5 ms was a tenth of the owner's time with 1 ms handlers (2,200 reads a
# second), each read holding the interpreter lock while workers woke from their sleeps
# (partition mode 0.885-0.895x -> 0.90-0.91x of the ideal). A task that runs long, a slow record
# or a misjudged handler time, still reports every 5 ms.
_REPORT_AFTER = 0.05


class Loop:
    """The state of one run: lives on the owner thread only."""

    def __init__(self, gc: GroupConsumer) -> None:
        self.gc = gc
        cfg = gc.config
        self.cfg = cfg
        self.scheduler = Scheduler(gc._handler, cfg.ordering, cfg.workers)
        self.committer = Committer(cfg.commit_interval, cfg.commit_every)
        self.committer.listeners.extend(gc._commit_listeners)
        self.flow = FlowControl(cfg.flow, cfg.max_batch)
        self.own = Ownership(
            gc._handler, self.scheduler, self.committer, self.flow, cfg.revoke_timeout
        )
        self.shares = Shares(cfg, self.flow, self.scheduler, self.own.partitions)
        self.paused: set[Partition] = set()
        self._last_poll = 0.0
        self._next_report = 0.0
        self.processed = 0
        self.failed = 0
        self.client: Any = None

    # -- lifecycle -------------------------------------------------------------------------

    def run(self) -> None:
        gc = self.gc
        conf = self.cfg.librdkafka_config()
        conf["on_commit"] = self._on_commit
        conf["error_cb"] = self._on_error
        try:
            self.client = gc._factory(conf)
            self._check_reachable()
            self.client.subscribe(
                list(self.cfg.topics),
                on_assign=self._guard(self._on_assign),
                on_revoke=self._guard(self._on_revoke),
                on_lost=self._guard(self._on_lost),
            )
            self.scheduler.start()
            log.info(
                "consumer_started",
                group_id=self.cfg.group_id,
                topics=self.cfg.topics,
                ordering=self.cfg.ordering,
                workers=self.cfg.workers,
                protocol=self.cfg.group_protocol,
            )
            gc._started.set()
            while not gc._stop.is_set() and gc._failure is None:
                self._step()
        except BaseException as exc:
            if gc._failure is None:
                gc._failure = exc
        finally:
            gc._started.set()
            self._shutdown()

    def _check_reachable(self) -> None:
        timeout = self.cfg.startup_timeout
        try:
            self.client.list_topics(timeout=timeout)
        except KafkaException as exc:
            raise BrokerUnreachableError(
                f"no Kafka broker answered at {self.cfg.bootstrap_servers!r} within "
                f"{timeout:g}s (startup_timeout): {exc.args[0] if exc.args else exc}"
            ) from exc

    def _shutdown(self) -> None:
        gc = self.gc
        client = self.client
        deadline = time.monotonic() + self.cfg.shutdown_timeout
        if client is None:
            self.scheduler.stop(0)
            return
        log.info("consumer_stopping", reason=repr(gc._failure) if gc._failure else "stop")
        try:
            self.own.deadline_cap = deadline
            self.own.stop_dispatch()
            self._set_paused(list(self.own.partitions), True)
            while self.scheduler.running(self.own.assignments()) and time.monotonic() < deadline:
                self._drain(0.05)
                # Keep serving the group while handlers finish; nothing new is dispatched.
                self.client.consume(1, 0)
            self._drain(0)
            left = self.scheduler.running(self.own.assignments())
            if left:
                self.own.cancel_all()
                log.warning("shutdown_budget_exceeded", unfinished=left)
            self._commit_sync(self._committable())
            self.own.fence_progress()
            self._publish(running=False)
            if self.cfg.group_instance_id is None:
                # Leave the group now so partitions move at once. A static member keeps its
                # partitions for the session timeout instead, so a restart gets them back.
                client.unsubscribe()
        except BaseException as exc:
            log.exception("shutdown_failed")
            if gc._failure is None:
                gc._failure = exc
        finally:
            try:
                client.close()
            except Exception:
                log.exception("close_failed")
            try:
                gc._handler.on_shutdown()
            except Exception:
                log.exception("handler_hook_failed", hook="on_shutdown")
            self.scheduler.stop(max(0.0, deadline - time.monotonic()))
            log.info("consumer_stopped", processed=self.processed)

    # -- one turn of the loop --------------------------------------------------------------

    def _step(self) -> None:
        flow = self.flow
        shares = self.shares
        sharing = shares.update()
        busy = self.scheduler.outstanding() > 0
        if flow.paused:
            # Throttled: poll once per poll_timeout (callbacks, max.poll.interval.ms) taking at
            # most one record, and otherwise wait for completions. The client keeps its prefetch.
            wait = self._last_poll + self.cfg.poll_timeout - time.monotonic()
            if wait > 0:
                self._drain(wait)
                msgs = []
            else:
                self._last_poll = time.monotonic()
                msgs = self.client.consume(1, 0)
        else:
            msgs = self.client.consume(flow.fetch_size(), 0 if busy else self.cfg.poll_timeout)
        if msgs:
            self._register(msgs)
        if busy and not msgs:
            self._drain(_IDLE_WAIT)
        else:
            self._drain(0)
        if shares.starved and flow.records < self.cfg.flow.capacity_records:
            shares.admit_starved()
        now = time.monotonic()
        if self.committer.due(now):
            self._commit_async(now)
        action = flow.update(sharing)
        if action is not None:
            log.debug("flow_" + action, in_flight=flow.records, bytes=flow.bytes)
            if action == "pause" and self.cfg.ordering == "key" and not shares.shared:
                shares.check_starved()
        parts = self.own.partitions
        if flow.full and not flow.client_paused:
            flow.client_paused = True
            self._set_paused(list(parts), True)
        elif action == "resume" and flow.client_paused:
            flow.client_paused = False
            shares.resume.clear()
            for st in parts.values():
                if st.over_share and shares.reserve_low(st):
                    st.over_share = False  # drained during the global pause
            self._resume([tp for tp, st in parts.items() if not st.over_share])
        elif shares.resume and not flow.client_paused:
            ready = [tp for tp in shares.resume if tp in parts and parts[tp].over_share]
            shares.resume.clear()
            for tp in ready:
                parts[tp].over_share = False
            self._resume(ready)

    def _register(self, msgs: list[Message]) -> None:
        """Hand what one consume call returned to the lanes: one batch per run (one partition,
        offsets increasing: a rewind mid-call starts a new run)."""
        partitions = self.own.partitions
        full = []
        for run in runs_of(msgs, self._on_message_error):
            tp = Partition(run.topic, run.partition)
            if self._register_run(partitions.get(tp), run):
                full.append(tp)
        # One call for all: each pause waits for librdkafka's broker thread while holding the
        # interpreter lock (confluent-kafka does not release it there).
        self._set_paused(full, True)
        self.scheduler.dispatch()

    def _register_run(self, st: PartitionState | None, run: Run) -> bool:
        """Register one run; True if its partition now holds a full reserve and must pause."""
        if st is None or not st.assignment.dispatching:
            return False  # fetched before a revoke or lost: the next owner reads them again
        recs, offsets, total = run.records, run.offsets, run.nbytes
        try:
            batch = st.progress.add_batch(offsets, offsets[-1] + 1)
        except ValueError:
            log.warning("partition_rewound", tp=str(st.assignment.tp), offset=offsets[0])
            self.flow.remove(0, st.drop_ahead())
            st.rewind()
            batch = st.progress.add_batch(offsets, offsets[-1] + 1)
        if st.ahead or self.shares.active:
            return self.shares.hold(st, batch, recs, total)
        self.scheduler.submit(st.assignment, batch, recs)
        st.records += len(recs)
        st.bytes += total
        self.flow.add(len(recs), total)
        return False

    def _drain(self, wait: float) -> int:
        """Settle the tasks that came back (waiting up to `wait` for the first) and the
        progress of long tasks still running; returns the tasks settled."""
        sched = self.scheduler
        q = sched.completions
        reporting = sched.reporting
        if reporting and wait > _REPORT_WAIT:
            wait = _REPORT_WAIT
        n = 0
        try:
            t = q.get(timeout=wait) if wait > 0 else q.get_nowait()
            while True:
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
        sched.dispatch()  # freed lanes, and records admitted from a partition's reserve
        return n

    def _drain_until(self, deadline: float, assignments: list[Assignment]) -> None:
        while self.scheduler.running(assignments):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._drain(min(remaining, 0.05))

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

    def _complete(self, t: Task) -> None:
        self.scheduler.returned(t)
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
        self._finish(st, hi - lo, nbytes)
        if not t.assignment.cancel.is_set():
            whole = lo == 0 and hi == len(t.records)
            recs = t.records if whole else t.records[lo:hi]
            self._mark_done(recs, t.batches if whole else t.batches[lo:hi], t.batch)

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

    def _complete_mixed(self, t: Task, st: PartitionState | None) -> None:
        """A task with failures or fenced records. Failed records stay unfinished and in the
        budget (waiting for retry counts); the scheduler holds their lanes. Records already
        reported as progress were accounted for then."""
        assert t.outcomes is not None
        count = nbytes = done = 0
        ok = st is not None and not t.assignment.cancel.is_set()
        for i in range(t.reported, len(t.outcomes)):
            code = t.outcomes[i]
            rec = t.records[i]
            if code in (DONE, FENCED):
                count += 1
                nbytes += rec.size
                b = t.batches[i]
                if code == DONE and ok and b.completed(rec.offset, b.token):
                    done += 1
            elif code == FAILED:
                self.failed += 1
                # No failure policy decides otherwise yet: the member stops after committing
                # what is below the failed record.
                if st is not None and self.gc._failure is None:
                    error = (t.errors or {})[i]
                    self.gc._failure = HandlerError(rec, error)
                    log.error("handler_failed", event_id=rec.event_id, error=repr(error))
        if st is not None:
            self._finish(st, count, nbytes)
        self.processed += done
        self.committer.finished(done)

    def _finish(self, st: PartitionState, count: int, nbytes: int) -> None:
        st.records -= count
        st.bytes -= nbytes
        self.flow.remove(count, nbytes)
        if st.ahead or st.over_share:
            self.shares.finished(st)

    # -- commits ---------------------------------------------------------------------------

    def _committable(self) -> dict[Partition, int | None]:
        return {tp: st.progress.committable() for tp, st in self.own.partitions.items()}

    def _catch_up_positions(self) -> None:
        owned = [tp for tp, st in self.own.partitions.items() if st.assignment.dispatching]
        if not owned:
            return
        try:
            positions = self.client.position(_parts(owned))
        except KafkaException as exc:
            log.debug("position_failed", error=str(exc))
            return
        for r in positions:
            st = self.own.partitions.get(Partition(r.topic, r.partition))
            if st is not None and r.offset >= 0:
                st.progress.advance_to(r.offset)

    def _commit_async(self, now: float) -> None:
        self._catch_up_positions()
        send = self.committer.to_send(self._committable())
        if send:
            try:
                self.client.commit(offsets=_tps(send), asynchronous=True)
            except KafkaException as exc:
                log.warning("commit_request_failed", error=str(exc))
                send = {}
        self.committer.sent(send, now)
        self._publish(running=True)

    def _commit_sync(self, committable: Mapping[Partition, int | None]) -> None:
        send = self.committer.to_send(committable, unconfirmed=True)
        if not send:
            return
        self.committer.sent(send, time.monotonic(), sync=True)
        try:
            results = self.client.commit(offsets=_tps(send), asynchronous=False)
        except KafkaException as exc:
            # A failed hand-off commit means replay, never loss: the next owner starts lower.
            for tp, off in send.items():
                self.committer.result(tp, off, str(exc.args[0] if exc.args else exc), sync=True)
            return
        for r in results or ():
            self.committer.result(
                Partition(r.topic, r.partition),
                r.offset,
                None if r.error is None else str(r.error),
                sync=True,
            )

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        for r in partitions:
            error = r.error or err
            if (
                error is not None
                and getattr(error, "code", lambda: None)() == KafkaError._NO_OFFSET
            ):
                continue
            self.committer.result(
                Partition(r.topic, r.partition),
                r.offset,
                None if error is None else str(error),
                sync=False,
            )

    # -- rebalance callbacks (owner thread, inside consume) --------------------------------

    def _guard(self, fn: Callable[[Any, list[TopicPartition]], None]) -> Callable[..., None]:
        def wrapped(client: Any, tps: list[TopicPartition]) -> None:
            try:
                fn(client, tps)
            except BaseException as exc:
                log.exception("rebalance_callback_failed", callback=fn.__name__)
                if self.gc._failure is None:
                    self.gc._failure = exc

        return wrapped

    def _on_assign(self, client: Any, tps: list[TopicPartition]) -> None:
        if tps:
            # Assign here rather than after the callback so the pause state set below applies
            # to partitions that are really assigned.
            if self.cfg.incremental:
                client.incremental_assign(tps)
            else:
                client.assign(tps)
        self.own.assign([Partition(t.topic, t.partition) for t in tps], self._set_paused)

    def _on_revoke(self, client: Any, tps: list[TopicPartition]) -> None:
        self.own.revoke(
            [Partition(t.topic, t.partition) for t in tps], self._drain_until, self._commit_sync
        )
        self.paused.difference_update(Partition(t.topic, t.partition) for t in tps)

    def _on_lost(self, client: Any, tps: list[TopicPartition]) -> None:
        self.own.lost([Partition(t.topic, t.partition) for t in tps])
        self.paused.difference_update(Partition(t.topic, t.partition) for t in tps)

    def _set_paused(self, tps: Sequence[Partition], paused: bool) -> None:
        if not tps:
            return
        try:
            if paused:
                self.client.pause(_parts(tps))
                self.paused.update(tps)
            else:
                self.client.resume(_parts(tps))
                self.paused.difference_update(tps)
        except KafkaException as exc:
            log.warning("pause_resume_failed", paused=paused, error=str(exc))

    def _resume(self, tps: list[Partition]) -> None:
        """Resume from the owner loop (never inside a rebalance callback) and get the fetches
        going at once.

        librdkafka's resume only clears a flag: a broker thread that went idle because all its
        partitions were paused sleeps on (up to 1 s, `rd_kafka_max_block_ms`; measured 0.97 to
        1.0 s from resume to the next record). A seek restarts the partition's fetch state,
        which wakes the broker thread of its leader. Each resumed partition is sought to where
        the resume would fetch from anyway, the client's position (its last handed-out offset
        + 1; after an earlier seek, before anything new was handed out, the read position weir
        tracked): no request, no skip, no replay. Only when no partition has a position yet
        (nothing consumed) does a metadata request wake the broker that answers it."""
        if not tps:
            return
        self._set_paused(tps, False)
        parts = self.own.partitions
        woken = 0
        try:
            positions = self.client.position(_parts(tps))
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
        if err.fatal():
            log.error("kafka_fatal_error", error=str(err))
            if self.gc._failure is None:
                self.gc._failure = KafkaFatalError(str(err))
        elif err.code() == KafkaError._ALL_BROKERS_DOWN:
            log.error("all_brokers_down", error=str(err))
        else:
            log.warning("kafka_error", error=str(err))

    def _on_message_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._on_error(err)
        elif err.code() == KafkaError._MAX_POLL_EXCEEDED:
            log.error("max_poll_interval_exceeded", error=str(err))
        else:
            log.warning("consume_error", error=str(err))

    # -- observability ---------------------------------------------------------------------

    def _publish(self, *, running: bool) -> None:
        parts = tuple(
            PartitionStats(
                tp=tp,
                token=st.assignment.token,
                in_flight=st.records,
                in_flight_bytes=st.bytes,
                committable=st.progress.committable(),
                committed=self.committer.confirmed(tp),
                paused=tp in self.paused,
                read_ahead=st.ahead_records,
            )
            for tp, st in sorted(self.own.partitions.items())
        )
        f = self.flow
        ahead_bytes = sum(st.ahead_bytes for st in self.own.partitions.values())
        self.gc._stats = ConsumerStats(
            at=time.monotonic(),
            running=running,
            processed=self.processed,
            failed=self.failed,
            in_flight=f.records,
            in_flight_bytes=f.bytes - ahead_bytes,
            peak_in_flight=f.peak_records,
            peak_in_flight_bytes=f.peak_bytes,
            paused=f.paused,
            pauses=f.pauses,
            rebalances=self.own.rebalances,
            partitions=parts,
            read_ahead=sum(p.read_ahead for p in parts),
            read_ahead_bytes=ahead_bytes,
        )


def _tps(offsets: Mapping[Partition, int]) -> list[TopicPartition]:
    return [TopicPartition(tp.topic, tp.partition, off) for tp, off in offsets.items()]


def _parts(tps: Iterable[Partition]) -> list[TopicPartition]:
    return [TopicPartition(tp.topic, tp.partition) for tp in tps]
