"""At-least-once outputs: what handlers produce (`ctx.produce`) in a member without
`transactional_id`, written by one idempotent producer and confirmed before their record counts.

A record whose call returned with outputs is not finished when the call returns: its outputs are
produced then (owner thread, when the call's result is settled), and the record stays below the
watermark until the broker confirmed every one of them (delivery reports, served by `poll` on the
owner thread). Then it is finished like any handled record. A failed delivery (after the
producer's own retries, within `output_timeout_s`) fails the record into the failure policy: a
retry runs the handler again and produces its outputs again, so an output whose delivery report
was lost, or whose sibling failed, is written twice (at-least-once). The producer is idempotent
with `acks=all`: the producer's own retries add no duplicates.

While it waits for the broker a record leaves the in-flight budget (`send` says so), up to
16 x `capacity_records` records and `capacity_bytes` bytes of them at once: the broker's
acknowledgement takes tens of milliseconds, and records held in the budget that long left too
few for the workers. Past that allowance they wait in the budget as before, so a stalled broker
still pauses fetching. A record whose delivery failed comes back into the budget
(`Settlement._confirmed`), held by the failure policy.

Outputs belong to an assignment: a revoke's drain waits for them within its budget (`pending`);
a lost or revoked partition's outputs still in flight are forgotten (`forget`) and their records
run again at the next owner, which produces them again. The producer follows the dead-letter
producer's handling (`weir._engine.deadletter.OwnedProducer`, which both use): the member's
cluster and log settings, a fatal error fails what it holds and replaces it at the next output.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from weir._engine.client import ProducerClient, ProducerFactory
from weir._engine.deadletter import OwnedProducer, fatal_error, shared_settings
from weir._engine.tasks import Assignment
from weir.config import ConsumerConfig
from weir.errors import OutputError
from weir.logs import get_logger
from weir.records import Output

__all__ = ["Outputs"]

log = get_logger(__name__)

# How long `send` waits for room in the producer's queue (it is served meanwhile) before the
# record fails: the budget bounds what is in flight, so a full queue is a stalled broker.
_QUEUE_WAIT_S = 1.0

# How many times the budget's records may wait for their outputs outside it. The records waiting
# are the rate times the broker's acknowledgement, 0.3-1 s on 2 loaded cores at 10,000 records/s;
# with one budget's worth (1,200) the 1 ms benchmark handlers kept 0.51-0.72x of the same
# handlers producing nothing, with 16 budgets 0.71-1.00x (benchmarks/README.md, alo+ctx). Their
# bytes stay bounded by `capacity_bytes`: the records' own memory, beside a small object each.
_ALLOWANCE = 16

Confirmed = Callable[[list[OutputError | None], bool], None]
"""Called on the owner thread once every output of a group of records was answered: for each
record, None (all its outputs confirmed) or the first failure of one of them; and whether the
group waited outside the in-flight budget (what `send` returned)."""


class _Pending:
    """The outputs of a group of records (those of one task's settlement): finished together,
    so that the watermark moves once per group, not once per record."""

    __slots__ = ("assignment", "done", "errors", "free", "left", "nbytes")

    def __init__(
        self,
        assignment: Assignment,
        records: int,
        nbytes: int,
        left: int,
        done: Confirmed,
        free: bool,
    ) -> None:
        self.assignment = assignment
        self.nbytes = nbytes  # the records' own (`Record.size`)
        self.left = left
        self.done = done
        self.free = free  # waits outside the in-flight budget
        self.errors: list[OutputError | None] = [None] * records


class Outputs:
    """Owner thread only."""

    def __init__(
        self, cfg: ConsumerConfig, factory: ProducerFactory, logger: object | None = None
    ) -> None:
        self._cfg = cfg
        self._logger = logger
        self._producer = OwnedProducer(
            factory, self.producer_config, self._serve, self._failed_for_good
        )
        self._records: dict[int, _Pending] = {}  # by sequence number: a record's outputs
        self._seq = itertools.count()
        self._results: list[tuple[int, int, KafkaError | None]] = []
        self._closed = False
        self._fatal: KafkaError | None = None
        # Records waiting for their outputs outside the in-flight budget, their bytes, and how
        # many records and bytes may (`_ALLOWANCE`; as many bytes as the budget holds).
        self._free = self._free_bytes = 0
        self._allowance = _ALLOWANCE * cfg.flow.capacity_records
        self._allowance_bytes = cfg.flow.capacity_bytes

    @classmethod
    def of(
        cls, cfg: ConsumerConfig, factory: ProducerFactory, logger: object | None
    ) -> Outputs | None:
        """A member's outputs, if it is not transactional (a transaction writes them then)."""
        return None if cfg.transactional_id is not None else cls(cfg, factory, logger)

    def producer_config(self) -> dict[str, Any]:
        cfg = self._cfg
        conf = shared_settings(cfg, self._logger)
        timeout_ms = max(1, round(cfg.output_timeout_s * 1000))
        conf.update(
            {
                "bootstrap.servers": cfg.bootstrap_servers,
                "enable.idempotence": True,
                "acks": "all",
                # Outputs hold their records below the watermark until confirmed, not the
                # workers: batching the outputs of concurrent calls into fewer requests costs the
                # loaded broker less than it delays the commit.
                "linger.ms": 5,
                "message.timeout.ms": timeout_ms,
                "request.timeout.ms": min(30_000, timeout_ms),
            }
        )
        return conf

    @property
    def pending(self) -> int:
        """Groups of records whose outputs are not all confirmed yet."""
        return len(self._records)

    def pending_of(self, assignments: Collection[Assignment]) -> int:
        return sum(len(p.errors) for p in self._records.values() if p.assignment in assignments)

    @property
    def waiting_outside(self) -> int:
        """Records waiting for their outputs outside the in-flight budget."""
        return self._free

    def send(
        self, a: Assignment, outputs: Sequence[Sequence[Output]], nbytes: int, done: Confirmed
    ) -> bool:
        """Produce the outputs of records of `a` (`outputs[j]`: those of the j-th record;
        `nbytes`: the records' size); `done` gets the outcome of each record on a later `poll`.
        True if the records leave the in-flight budget while they wait (the caller releases
        them; `done` is told so too)."""
        seq = next(self._seq)
        free = (
            self._free + len(outputs) <= self._allowance
            and self._free_bytes + nbytes <= self._allowance_bytes
        )
        if free:
            self._free += len(outputs)
            self._free_bytes += nbytes
        pending = _Pending(a, len(outputs), nbytes, sum(map(len, outputs)), done, free)
        self._records[seq] = pending
        producer = self._producer.get()
        for j, outs in enumerate(outputs):

            def delivered(err: KafkaError | None, msg: Any, j: int = j) -> None:
                if not self._closed:
                    self._results.append((seq, j, err))

            for k, out in enumerate(outs):
                try:
                    self._produce(producer, out, delivered)
                except (KafkaException, BufferError) as exc:
                    fatal = fatal_error(exc)
                    if fatal is not None:
                        self._fatal = fatal  # failed at the next poll: never inside a settlement
                        return free
                    err = exc.args[0] if exc.args else None
                    reason = err if isinstance(err, KafkaError) else exc
                    # This record fails (its later outputs are not sent); it runs again.
                    self._results.append((seq, j, _as_kafka_error(reason)))
                    self._results.extend((seq, j, None) for _ in range(len(outs) - k - 1))
                    break
        return free

    def _produce(self, producer: ProducerClient, out: Output, delivered: Any) -> None:
        deadline = time.monotonic() + _QUEUE_WAIT_S
        while True:
            try:
                kwargs: dict[str, Any] = {"on_delivery": delivered}
                if out.headers is not None:
                    kwargs["headers"] = list(out.headers)
                if out.partition is not None:
                    kwargs["partition"] = out.partition
                producer.produce(out.topic, out.value, out.key, **kwargs)
                return
            except BufferError:
                # The producer's queue is full: serve it, then try again until the deadline.
                if time.monotonic() >= deadline:
                    raise
                self._producer.serve(lambda p: p.poll(0.01))

    def _serve(self) -> None:
        results, self._results = self._results, []
        for seq, j, err in results:
            p = self._records.get(seq)
            if p is None:
                continue  # forgotten (revoked, lost) or failed already
            if err is not None and p.errors[j] is None:
                text = f"output not confirmed by the broker: {err.str()}"
                p.errors[j] = OutputError(text, err.name())
            p.left -= 1
            if p.left > 0:
                continue
            self._done(seq, p)
            p.done(p.errors, p.free)

    def _failed_for_good(self, err: KafkaError) -> None:
        """The producer hit a fatal error: every record it holds fails (and runs again through
        the failure policy); a new producer is made at the next output."""
        log.error("output_producer_failed", code=err.name(), error=err.str(), pending=self.pending)
        records, self._records = self._records, {}
        self._results = []
        self._free = self._free_bytes = 0
        failure = OutputError(f"the output producer failed for good: {err.str()}", err.name())
        for p in records.values():
            p.done([failure] * len(p.errors), p.free)

    def poll(self) -> None:
        """Serve delivery reports (owner thread, every turn) and the producer's log lines."""
        if self._fatal is not None:
            err, self._fatal = self._fatal, None
            self._producer.fail(err)
        if self._producer.poll(bool(self._records)) or self._results:
            self._serve()

    def flush(self, timeout: float) -> int:
        """Wait up to `timeout` for the outputs in flight; returns the records still waiting."""
        if self._records:
            self._producer.serve(lambda p: p.flush(max(0.0, timeout)))
            self._serve()
        return self.pending

    def forget(self, assignments: Collection[Assignment]) -> None:
        """Revoked or lost: their records run again at the next owner; reports that come for
        them later are ignored."""
        for seq in [s for s, p in self._records.items() if p.assignment in assignments]:
            self._done(seq, self._records[seq])

    def _done(self, seq: int, p: _Pending) -> None:
        del self._records[seq]
        if p.free:
            self._free -= len(p.errors)
            self._free_bytes -= p.nbytes

    def close(self) -> None:
        """The member stopped: outputs still in flight are dropped (the final commit stayed
        below their records)."""
        self._closed = True
        self._records = {}
        self._results = []
        self._free = self._free_bytes = 0
        self._producer.close()


def _as_kafka_error(reason: KafkaError | BaseException) -> KafkaError:
    if isinstance(reason, KafkaError):
        return reason
    return KafkaError(KafkaError._FAIL, f"{type(reason).__name__}: {reason}")
