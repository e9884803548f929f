"""Exactly-once for Kafka-to-Kafka: outputs and consumed offsets in one transaction.

A transactional member (`transactional_id`) owns one transactional producer. Handlers produce
with `Context.produce`; their outputs travel with their record and are written into the open
transaction by the owner thread at the moment it marks that record finished (`produce`). So a
transaction holds exactly the outputs of the records it marks finished: at a boundary, records
still running have produced nothing into it, and no barrier is needed. At each boundary (every
`transaction_interval_s` or `transaction_max_records`) the owner sends the watermark of every
owned partition (with its offset map) with a fresh consumer-group metadata
(`send_offsets_to_transaction`, KIP-447 fencing) and commits. docs/exactly-once.md argues the
invariant.

Every call that waits on the coordinator runs under a deadline weir enforces
(`weir._engine.bounded`): librdkafka's transactional calls do not always keep to their timeout. What
happens when a boundary fails is `Outcome`: an abortable error aborts the transaction (nothing
of it committed: the engine rewinds to the committed offsets it knows); a broker that went away
(a restart, a coordinator move, a call that never returned) gets the producer replaced: a new one
with the same transactional id fences the old one and resolves its open transaction, and the
engine reads the committed offsets again once it is ready (`recover`). Only a fence (a newer
producer with this id, a newer group generation) or an error the broker will repeat
(authorization) stops the member with `TransactionError`; an output its ACLs refuse does too, at
the next boundary (its open transaction aborted, nothing of it committed), rather than be
aborted and replayed for ever. A refusal's message names the ACL: WRITE on the transactional id
or an output topic, READ on the group.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from weir._engine.bounded import CallAbandoned, call_within
from weir._engine.client import (
    TransactionalProducer,
    TransactionalProducerFactory,
    offsets_to_commit,
)
from weir._engine.clock import SYSTEM, Clock
from weir._engine.deadletter import shared_settings
from weir._engine.refusals import denied_of
from weir.config import ConsumerConfig
from weir.errors import TransactionError
from weir.logs import get_logger
from weir.records import Output, Partition

__all__ = ["Outcome", "TransactionError", "Transactions"]

log = get_logger(__name__)

# A transactional call may overrun its own timeout by this much before it is abandoned.
_GRACE = 1.0
# While the producer is being replaced: one init_transactions attempt this often, each given
# this long, so that the owner keeps polling between them.
_RECOVER_EVERY = 0.5
_RECOVER_TIMEOUT = 2.0
# How long produce() waits for room in the producer's queue (a broker that takes nothing) before
# the transaction counts as failed: its boundary aborts it, rather than the owner wait forever.
_QUEUE_FULL_S = 1.0

ADD_OFFSETS = "adding the offsets to the transaction"
COMMIT = "committing the transaction"
ABORT = "aborting the transaction"
INIT = "initialising transactions"
PRODUCE = "writing an output"
# What an exactly-once member needs of the broker's ACLs, besides what any member needs.
_NEEDS = (
    "an exactly-once member needs WRITE and DESCRIBE on its transactional_id {tid!r}, WRITE "
    "on its output topics and READ on its group"
)


class Outcome(enum.Enum):
    """How a transaction boundary ended."""

    COMMITTED = "committed"
    ABORTED = "aborted"  # nothing of it was committed: rewind to the committed offsets known
    UNKNOWN = "unknown"  # the commit may or may not have happened: read the offsets again


class Transactions:
    """Owner thread only."""

    def __init__(
        self,
        cfg: ConsumerConfig,
        factory: TransactionalProducerFactory,
        logger: object | None = None,
        interrupt: threading.Event | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        # The boundaries' clock (the engine's); the waits for the producer are real ones.
        self._clock = clock
        assert cfg.transactional_id is not None
        self._cfg = cfg
        self._factory = factory
        self._logger = logger
        # Set by a second stop request: a wait for a transactional call ends at once.
        self._interrupt = interrupt
        self._producer: TransactionalProducer | None = None
        self._timeout = cfg.transaction_timeout_s
        # Ending a transaction waits on the coordinator, which may first have to finish writing
        # the markers of the one before (CONCURRENT_TRANSACTIONS while it does) or time the
        # transaction out itself: a commit or abort that timed out is retried past the
        # transaction timeout, as librdkafka asks ("retry call to resume"), rather than taken
        # for a failure on a slow broker. Half of max.poll.interval at most: the owner does
        # not poll meanwhile.
        self._end_timeout = max(self._timeout, min(3 * self._timeout, cfg.max_poll_interval_s / 2))
        self.open = False
        self.records = 0  # records marked finished in the open transaction
        self.outputs = 0  # outputs written into it
        self.opened_at = 0.0
        self.failed: str | None = None  # a produce failed: the transaction must be aborted
        # The producer hit a fatal error (fenced): nothing can be committed or aborted any more.
        self.fatal: TransactionError | None = None
        self.committed = 0
        self.aborted = 0
        self.replaced = 0  # producers replaced after a broker went away
        self.abandoned = 0  # calls left running past their deadline
        self._down_since: float | None = None  # replaced, and not ready again yet
        self._next_recover = 0.0

    def producer_config(self) -> dict[str, Any]:
        cfg = self._cfg
        conf = shared_settings(cfg, self._logger)
        conf.update(
            {
                "bootstrap.servers": cfg.bootstrap_servers,
                "transactional.id": cfg.transactional_id,
                "enable.idempotence": True,
                "acks": "all",
                # How long a transaction may stay open: a member killed mid-transaction holds
                # its partitions' committed offsets back (and read_committed readers) this long.
                "transaction.timeout.ms": max(1000, round(cfg.transaction_timeout_s * 1000)),
                "linger.ms": 5,
            }
        )
        return conf

    @property
    def producer(self) -> TransactionalProducer:
        assert self._producer is not None, "start() first"
        return self._producer

    @property
    def ready(self) -> bool:
        """A producer with an open transaction: records may be marked finished into it."""
        return self.open and self._producer is not None

    def start(self) -> None:
        """Build the producer, fence older producers with this transactional id, open the
        first transaction."""
        self._producer = self._factory(self.producer_config())
        try:
            self._step(INIT, lambda t: self.producer.init_transactions(t))
        except (KafkaException, CallAbandoned) as exc:
            raise self._fatal(INIT, exc) from exc
        self.begin()

    def begin(self) -> None:
        self.producer.begin_transaction()
        self.open = True
        self.records = self.outputs = 0
        self.failed = None
        self.opened_at = self._clock.monotonic()

    @property
    def empty(self) -> bool:
        """Nothing was marked finished or written in the open transaction, and nothing failed."""
        return (
            self.records == 0 and self.outputs == 0 and self.failed is None and self.fatal is None
        )

    def due(self, now: float) -> bool:
        """A boundary is due: the interval or the record count is reached, or the transaction
        failed (abort it now rather than fill it with work that will run again)."""
        cfg = self._cfg
        return self.open and (
            self.records >= cfg.transaction_max_records
            or now - self.opened_at >= cfg.transaction_interval_s
            or self.failed is not None
            or self.fatal is not None
        )

    def produce(self, outputs: list[Output]) -> None:
        """Outputs of a record marked finished now: into the open transaction."""
        if not self.ready:
            # The engine marks nothing finished without an open transaction; if it ever did,
            # the records' outputs must not be lost silently.
            self.failed = self.failed or "no open transaction"
            return
        producer = self.producer
        for o in outputs:
            full_since: float | None = None
            while True:
                try:
                    producer.produce(
                        o.topic,
                        o.value,
                        o.key,
                        partition=-1 if o.partition is None else o.partition,
                        headers=o.headers,
                        on_delivery=self._delivered,
                    )
                    break
                except BufferError:
                    # The local queue is full: let deliveries drain, for a while.
                    now = time.monotonic()
                    full_since = now if full_since is None else full_since
                    if now - full_since >= _QUEUE_FULL_S:
                        self.failed = self.failed or (
                            f"{PRODUCE}: the producer's queue stayed full for "
                            f"{_QUEUE_FULL_S:g} s (no broker takes the outputs)"
                        )
                        return
                    self._poll(0.05)
                except KafkaException as exc:
                    self._produce_failed(exc, o.topic)
                    break
            self.outputs += 1
        self._poll(0)

    def _poll(self, timeout: float) -> None:
        # The client raises a fatal error (fenced) from poll too: it is kept for the next
        # boundary, which stops the member, never raised in the middle of settling records.
        try:
            self.producer.poll(timeout)
        except KafkaException as exc:
            self._produce_failed(exc)

    def _produce_failed(self, exc: KafkaException, topic: str | None = None) -> None:
        self.failed = self.failed or f"{PRODUCE}: {_text(exc)}"
        err = _error(exc)
        refused = err is not None and _refused(err)
        if (_fenced(exc) or refused) and self.fatal is None:
            self.fatal = self._fatal(PRODUCE, exc, topic=topic)

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is None:
            return
        if self.failed is None:
            self.failed = f"{PRODUCE}: {err.str()}"
        if _refused(err) and self.fatal is None:
            # The broker refuses the output's topic: replaying the records would write it
            # again, into the same refusal.
            self.fatal = self._fatal(PRODUCE, KafkaException(err), topic=msg.topic())

    def commit(
        self,
        offsets: Mapping[Partition, int],
        metadata: Mapping[Partition, str],
        group_metadata: Any,
    ) -> Outcome:
        """Send the offsets with the consumer's group metadata and commit. Raises
        `TransactionError` on a fence. After `COMMITTED` and `ABORTED` a new transaction is
        open, unless the producer had to be replaced (`ready` is False until `recover`)."""
        if self.fatal is not None:
            raise self.fatal
        if self.failed is not None:
            log.warning("transaction_aborting", reason=self.failed, records=self.records)
            return self._abort_open()
        tps = offsets_to_commit(offsets, metadata)
        try:
            if tps:
                self._step(
                    ADD_OFFSETS,
                    lambda t: self.producer.send_offsets_to_transaction(tps, group_metadata, t),
                )
        except (KafkaException, CallAbandoned) as exc:
            # Nothing is committed before commit_transaction: whatever happens to this
            # producer, its transaction ends aborted.
            return self._failed(ADD_OFFSETS, exc, Outcome.ABORTED)
        try:
            self._step(COMMIT, lambda t: self.producer.commit_transaction(t), self._end_timeout)
        except (KafkaException, CallAbandoned) as exc:
            # An abortable error: the coordinator refused it; anything else may have reached
            # the coordinator first, and the next producer learns which.
            return self._failed(COMMIT, exc, Outcome.UNKNOWN)
        self.committed += 1
        log.debug(
            "transaction_committed",
            records=self.records,
            outputs=self.outputs,
            offsets={str(tp): off for tp, off in offsets.items()},
        )
        self.begin()
        return Outcome.COMMITTED

    def abort(self) -> None:
        """Abort the open transaction (if there is one) and open a new one."""
        if self.fatal is not None:
            raise self.fatal
        if self.ready:
            self._abort_open()

    def _abort_open(self) -> Outcome:
        try:
            self._step(ABORT, lambda t: self.producer.abort_transaction(t), self._end_timeout)
        except (KafkaException, CallAbandoned) as exc:
            if isinstance(exc, KafkaException) and _fenced(exc):
                raise self._fatal(ABORT, exc) from exc
            # The next producer's init aborts it.
            self._replace(ABORT, exc)
            return Outcome.ABORTED
        self.aborted += 1
        log.warning("transaction_aborted", records=self.records, outputs=self.outputs)
        self.begin()
        return Outcome.ABORTED

    def _failed(self, step: str, exc: Exception, otherwise: Outcome) -> Outcome:
        """A boundary's `step` failed: abort (the client says so), stop (a fence), or replace
        the producer (anything else: a broker that went away, a call that did not return)."""
        if isinstance(exc, KafkaException):
            err = _error(exc)
            if _fenced(exc) or (err is not None and _refused(err)):
                raise self._fatal(step, exc) from exc
            if err is not None and err.txn_requires_abort():
                log.warning(
                    "transaction_aborting", reason=f"{step}: {_text(exc)}", records=self.records
                )
                return self._abort_open()
        self._replace(step, exc)
        return otherwise

    def _replace(self, step: str, exc: Exception) -> None:
        """Let the producer go (a call of it may still be running) and try a new one now;
        `recover` goes on trying from the owner loop until one is ready."""
        abandoned = isinstance(exc, CallAbandoned)
        self.abandoned += abandoned
        self.replaced += 1
        log.warning(
            "transactional_producer_replaced",
            step=step,
            error=str(exc) if abandoned else _text(exc),
            abandoned=abandoned,
            records=self.records,
        )
        old, self._producer = self._producer, None
        self.open = False
        self.failed = None
        if old is not None and not abandoned:
            _let_go(old)
        self._down_since = self._clock.monotonic()
        self._next_recover = 0.0
        self.recover(self._clock.monotonic())

    def recover(self, now: float) -> bool:
        """While the producer is being replaced (owner loop, every turn): one bounded attempt
        to initialise a new one, at most every `_RECOVER_EVERY`. True once it is ready."""
        if self.ready:
            return True
        if self.fatal is not None or now < self._next_recover:
            return False
        if self._producer is None:
            self._producer = self._factory(self.producer_config())
        producer = self._producer
        try:
            call_within(
                lambda: producer.init_transactions(_RECOVER_TIMEOUT),
                _RECOVER_TIMEOUT + _GRACE,
                INIT,
                interrupt=self._interrupt,
            )
        except CallAbandoned as exc:
            self.abandoned += 1
            self._producer = None  # the next attempt builds another
            log.debug("transactions_recovery_pending", error=str(exc))
            return False
        except KafkaException as exc:
            err = _error(exc)
            if _fenced(exc) or (err is not None and err.fatal()):
                raise self._fatal(INIT, exc) from exc
            if err is None or not err.retriable():
                self._producer = None
                _let_go(producer)
            log.debug("transactions_recovery_pending", error=_text(exc))
            return False
        finally:
            # The owner polls between attempts: the next one is a pause away from the end of
            # this one, however long this one took.
            self._next_recover = self._clock.monotonic() + _RECOVER_EVERY
        down = now - self._down_since if self._down_since is not None else 0.0
        self._down_since = None
        self.begin()
        log.warning("transactions_recovered", seconds=round(down, 3), replaced=self.replaced)
        return True

    def _fatal(self, step: str, exc: Exception, topic: str | None = None) -> TransactionError:
        """The error that stops the member (kept: every later transactional call raises it).
        `topic`: the output's, for a write the broker refused."""
        if self.fatal is not None:
            return self.fatal
        fenced = isinstance(exc, KafkaException) and _fenced(exc)
        detail = _text(exc) if isinstance(exc, KafkaException) else str(exc)
        tid = self._cfg.transactional_id
        err = _error(exc)
        denied = None
        if err is not None:
            # Committing offsets reads the topics; every other step writes.
            operation = "READ" if step == ADD_OFFSETS else "WRITE"
            denied = denied_of(
                err.name(), operation, topic=topic, group=self._cfg.group_id, transactional_id=tid
            )
        if fenced:
            text = (
                f"{step} failed: the producer was fenced by a newer producer with "
                f"transactional_id={tid!r} (another member started with the same id, or this "
                f"one restarted): {detail}"
            )
        elif denied is not None:
            text = (
                f"{step} failed: the broker's ACLs do not allow this client {denied} "
                f"({denied.code}: {detail}): {_NEEDS.format(tid=tid)}"
            )
        else:
            text = f"{step} failed: {detail}"
        self.fatal = TransactionError(text, step=step, fenced=fenced)
        log.error("transaction_fatal", step=step, error=text, fenced=fenced)
        return self.fatal

    def close(self, timeout: float) -> None:
        """The member stopped: deliver what the producer still holds, and let it go."""
        producer, self._producer = self._producer, None
        self.open = False
        if producer is None:
            return
        try:
            call_within(
                lambda: producer.flush(max(0.0, timeout)), max(0.0, timeout) + _GRACE, "flush"
            )
        except CallAbandoned as exc:
            log.warning("transactional_flush_abandoned", error=str(exc))
        except KafkaException as exc:
            # A producer with a fatal error (fenced) raises it from flush: it delivers nothing
            # more, and its open transaction is the coordinator's to abort.
            log.debug("transactional_flush_failed", error=_text(exc))

    def _step(
        self, step: str, call: Callable[[float], object], within: float | None = None
    ) -> None:
        """A transactional call (given its timeout), retried while the client says the error
        is retriable (as librdkafka's transactional API asks), within `within` seconds (the
        transaction timeout by default). Each try is abandoned past its timeout plus a grace
        (`CallAbandoned`)."""
        deadline = time.monotonic() + (self._timeout if within is None else within)
        while True:
            t = max(0.1, deadline - time.monotonic())
            try:
                call_within(partial(call, t), t + _GRACE, step, interrupt=self._interrupt)
                return
            except KafkaException as exc:
                err = _error(exc)
                retriable = err is not None and err.retriable()
                if not retriable or time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)


def _let_go(producer: TransactionalProducer) -> None:
    """Drop a replaced producer off the owner thread: destroying a client waits for its broker
    threads, which may wait on a broker that is not there. The thread holds the last reference
    (the caller's are gone well within its pause) and drops it."""

    def drop(box: list[TransactionalProducer]) -> None:
        time.sleep(1.0)
        box.clear()

    threading.Thread(
        target=drop, args=([producer],), name="weir-producer-close", daemon=True
    ).start()


_FENCED = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)
# Refusals a new producer would meet again: the member stops rather than replace it forever.
_REFUSED = frozenset(
    {
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.INVALID_TRANSACTION_TIMEOUT,
    }
)


def _error(exc: BaseException) -> KafkaError | None:
    err = exc.args[0] if exc.args else None
    return err if isinstance(err, KafkaError) else None


def _fenced(exc: BaseException) -> bool:
    err = _error(exc)
    return err is not None and err.code() in _FENCED


def _refused(err: KafkaError) -> bool:
    return err.code() in _REFUSED


def _text(exc: BaseException) -> str:
    err = exc.args[0] if exc.args else exc
    return err.str() if isinstance(err, KafkaError) else str(err)
