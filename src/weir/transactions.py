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

An abortable error aborts the transaction and the engine rewinds every owned partition to its
committed offset (nothing of the aborted transaction is visible to read_committed readers); a
fatal one (a fenced producer) stops the member with `TransactionError`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from weir.client import TransactionalProducer, TransactionalProducerFactory, offsets_to_commit
from weir.config import ConsumerConfig
from weir.deadletter import shared_settings
from weir.errors import WeirError
from weir.logs import get_logger
from weir.records import Output, Partition

__all__ = ["TransactionError", "Transactions"]

log = get_logger(__name__)


class TransactionError(WeirError):
    """The transactional producer hit a fatal error (for example, it was fenced by a newer
    producer with the same transactional id, or by a newer group generation): the member
    stops. Nothing of its open transaction is committed."""


class Transactions:
    """Owner thread only."""

    def __init__(
        self,
        cfg: ConsumerConfig,
        factory: TransactionalProducerFactory,
        logger: object | None = None,
    ) -> None:
        assert cfg.transactional_id is not None
        self._cfg = cfg
        self._factory = factory
        self._logger = logger
        self._producer: TransactionalProducer | None = None
        self._timeout = cfg.transaction_timeout_s
        # Ending a transaction waits on the coordinator, which may first have to finish writing
        # the markers of the one before (CONCURRENT_TRANSACTIONS while it does) or time the
        # transaction out itself: a commit or abort that timed out is retried past the
        # transaction timeout, as librdkafka asks ("retry call to resume"), rather than taken
        # for a fatal error on a slow broker. Half of max.poll.interval at most: the owner does
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

    def start(self) -> None:
        """Build the producer, fence older producers with this transactional id, open the
        first transaction."""
        self._producer = self._factory(self.producer_config())
        try:
            self._retrying(lambda t: self.producer.init_transactions(t))
        except KafkaException as exc:
            raise self._fatal("could not initialise transactions", exc) from exc
        self.begin()

    def begin(self) -> None:
        self.producer.begin_transaction()
        self.open = True
        self.records = self.outputs = 0
        self.failed = None
        self.opened_at = time.monotonic()

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
        producer = self.producer
        for o in outputs:
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
                    self._poll(0.05)  # the local queue is full: let deliveries drain
                except KafkaException as exc:
                    self._produce_failed(exc)
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

    def _produce_failed(self, exc: KafkaException) -> None:
        self.failed = self.failed or _text(exc)
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.fatal() and self.fatal is None:
            self.fatal = self._fatal("the transactional producer failed", exc)

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None and self.failed is None:
            self.failed = err.str()

    def commit(
        self,
        offsets: Mapping[Partition, int],
        metadata: Mapping[Partition, str],
        group_metadata: Any,
    ) -> bool:
        """Send the offsets with the consumer's group metadata and commit. True if committed;
        False if the transaction was aborted (the caller rewinds); raises `TransactionError`
        on a fatal error. A new transaction is open afterwards either way."""
        if self.fatal is not None:
            raise self.fatal
        if self.failed is not None:
            log.warning("transaction_aborting", reason=self.failed, records=self.records)
            self.abort()
            return False
        tps = offsets_to_commit(offsets, metadata)
        try:
            if tps:
                self._retrying(
                    lambda t: self.producer.send_offsets_to_transaction(tps, group_metadata, t)
                )
            self._retrying(lambda t: self.producer.commit_transaction(t), self._end_timeout)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.txn_requires_abort():
                log.warning("transaction_aborting", reason=_text(exc), records=self.records)
                self.abort()
                return False
            raise self._fatal("transaction commit failed", exc) from exc
        self.committed += 1
        log.debug(
            "transaction_committed",
            records=self.records,
            outputs=self.outputs,
            offsets={str(tp): off for tp, off in offsets.items()},
        )
        self.begin()
        return True

    def abort(self) -> None:
        """Abort the open transaction and open a new one."""
        if self.fatal is not None:
            raise self.fatal
        try:
            self._retrying(lambda t: self.producer.abort_transaction(t), self._end_timeout)
        except KafkaException as exc:
            raise self._fatal("transaction abort failed", exc) from exc
        self.aborted += 1
        log.warning("transaction_aborted", records=self.records, outputs=self.outputs)
        self.begin()

    def _fatal(self, what: str, exc: KafkaException) -> TransactionError:
        """The error that stops the member (kept: every later transactional call raises it)."""
        if self.fatal is not None:
            return self.fatal
        err = exc.args[0] if exc.args else None
        fenced = isinstance(err, KafkaError) and err.code() in _FENCED
        text = (
            f"{what}: the producer was fenced by a newer producer with transactional_id="
            f"{self._cfg.transactional_id!r} (another member started with the same id, or "
            f"this one restarted): {_text(exc)}"
            if fenced
            else f"{what}: {_text(exc)}"
        )
        self.fatal = TransactionError(text)
        log.error("transaction_fatal", error=text, fenced=fenced)
        return self.fatal

    def close(self, timeout: float) -> None:
        """The member stopped: deliver what the producer still holds, and let it go."""
        producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            producer.flush(max(0.0, timeout))
        except KafkaException as exc:
            # A producer with a fatal error (fenced) raises it from flush: it delivers nothing
            # more, and its open transaction is the coordinator's to abort.
            log.debug("transactional_flush_failed", error=_text(exc))

    def _retrying(self, call: Callable[[float], object], within: float | None = None) -> None:
        """A transactional call (given its timeout), retried while the client says the error
        is retriable (as librdkafka's transactional API asks), within `within` seconds (the
        transaction timeout by default)."""
        deadline = time.monotonic() + (self._timeout if within is None else within)
        while True:
            try:
                call(max(0.1, deadline - time.monotonic()))
                return
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                retriable = isinstance(err, KafkaError) and err.retriable()
                if not retriable or time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)


_FENCED = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)


def _text(exc: BaseException) -> str:
    err = exc.args[0] if exc.args else exc
    return err.str() if isinstance(err, KafkaError) else str(err)
