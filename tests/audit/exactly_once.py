"""Input → transform → output, and the exactly-once check of what a transactional group wrote.

Every input record (partition p, offset o, key k, value v) has exactly one expected output:
key k, value ``b"p:o:" + v[::-1]``. `check_outputs` reads the input and the output topic with
read_committed and compares the two as multisets: every input exactly once (count), each
output the transform of its input (content).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, TopicPartition

from tests.audit import AuditedHandler, AuditWriter
from weir import BatchContext, BatchHandler, Context, Handler, Record
from weir.testing.pytest_plugin import ConsumedRecord, consume_all

Output = tuple[bytes | None, bytes]


def transform(partition: int, offset: int, key: bytes | None, value: bytes | None) -> Output:
    return key, b"%d:%d:" % (partition, offset) + (value or b"")[::-1]


class Transform(Handler):
    """Produces the transform of each record into `output` (ctx.produce); `sleep_s` per record,
    `before` called first (a test's hook: count calls, raise, block)."""

    def __init__(
        self,
        output: str,
        sleep_s: float = 0.0,
        before: Callable[[Record, Context], None] | None = None,
    ) -> None:
        self.output = output
        self.sleep_s = sleep_s
        self.before = before

    def handle(self, record: Record, ctx: Context) -> None:
        if self.before is not None:
            self.before(record, ctx)
        if self.sleep_s:
            time.sleep(self.sleep_s)
        key, value = transform(record.partition, record.offset, record.key, record.value)
        ctx.produce(self.output, value, key)


class AuditedTransform(AuditedHandler):
    """`AuditedHandler` (every call audited, the same per-offset sleep) that produces the
    transform of each record into `output`."""

    def __init__(self, audit: AuditWriter, output: str, slow_ms: float = 0.0) -> None:
        super().__init__(audit, slow_ms)
        self.output = output

    def handle(self, record: Record, ctx: Context) -> None:
        super().handle(record, ctx)
        key, value = transform(record.partition, record.offset, record.key, record.value)
        ctx.produce(self.output, value, key)


class AuditedBatchTransform(BatchHandler, AuditedHandler):
    """`AuditedTransform` as a batch handler: each `handle_batch` call audits its records,
    sleeps the sum of their per-offset times, and produces the transform of each record into
    `output`, attributed to that record (`BatchContext.produce`)."""

    def __init__(self, audit: AuditWriter, output: str, slow_ms: float = 0.0) -> None:
        AuditedHandler.__init__(self, audit, slow_ms)
        self.output = output

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        a = self.audit
        for r in records:
            a.write("start", p=r.partition, o=r.offset, tok=ctx.token(r))
        if self.slow:
            time.sleep(sum(self.slow * (0.25 + (r.offset * 7919 % 100) / 100) for r in records))
        for r in records:
            key, value = transform(r.partition, r.offset, r.key, r.value)
            ctx.produce(r, self.output, value, key)
            a.write("done", p=r.partition, o=r.offset, tok=ctx.token(r))


Key = tuple[int, int]  # (partition, offset)


class ProduceThenFailBatch(BatchHandler):
    """A batch handler that produces one output per record into `output` (`value(record, ctx)`:
    its key and value; the transform by default) before anything fails. Records `fail_once`
    says yes to are then marked failed (`ctx.fail`) on their first attempt; a call that holds
    a `poison` (partition, offset) raises, after producing for all its records. `calls` keeps
    what each call held."""

    def __init__(
        self,
        output: str,
        *,
        value: Callable[[Record, BatchContext], Output] | None = None,
        fail_once: Callable[[Record], bool] = lambda r: False,
        poison: frozenset[Key] = frozenset(),
    ) -> None:
        self.output = output
        self.value = value or (lambda r, ctx: transform(r.partition, r.offset, r.key, r.value))
        self.fail_once = fail_once
        self.poison = poison
        self.lock = threading.Lock()
        self.calls: list[list[Key]] = []

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> Awaitable[None] | None:
        self.run(records, ctx)
        return None

    def run(self, records: list[Record], ctx: BatchContext) -> None:
        with self.lock:
            self.calls.append([(r.partition, r.offset) for r in records])
        for r in records:
            key, value = self.value(r, ctx)
            ctx.produce(r, self.output, value, key)
        for r in records:
            if ctx.attempt(r) == 1 and self.fail_once(r):
                ctx.fail(r, RuntimeError(f"record {r.offset} fails once, after producing"))
        if self.poison.intersection((r.partition, r.offset) for r in records):
            raise RuntimeError("the batch holds a poison record")


class AsyncProduceThenFailBatch(ProduceThenFailBatch):
    async def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        await asyncio.sleep(0.001)
        self.run(records, ctx)


@dataclass
class OutputReport:
    inputs: int
    outputs: int
    missing: list[Output] = field(default_factory=list)
    duplicates: list[Output] = field(default_factory=list)
    unexpected: list[Output] = field(default_factory=list)

    @property
    def exactly_once(self) -> bool:
        return not (self.missing or self.duplicates or self.unexpected)

    def summary(self) -> str:
        return (
            f"inputs={self.inputs} outputs={self.outputs} missing={len(self.missing)} "
            f"duplicates={len(self.duplicates)} unexpected={len(self.unexpected)}"
            + (f" first missing={self.missing[:3]}" if self.missing else "")
            + (f" first duplicates={self.duplicates[:3]}" if self.duplicates else "")
            + (f" first unexpected={self.unexpected[:3]}" if self.unexpected else "")
        )


def compare(inputs: list[ConsumedRecord], outputs: list[ConsumedRecord]) -> OutputReport:
    expected = Counter(transform(r.partition, r.offset, r.key, r.value) for r in inputs)
    got = Counter((r.key, r.value or b"") for r in outputs)
    report = OutputReport(inputs=len(inputs), outputs=len(outputs))
    for out, n in expected.items():
        have = got.get(out, 0)
        if have < n:
            report.missing.append(out)
        elif have > n:
            report.duplicates.append(out)
    report.unexpected = [out for out in got if out not in expected]
    return report


def wait_for_no_open_transaction(bootstrap: str, topic: str, timeout: float) -> None:
    """Wait until no transaction is open on any partition of `topic` (its last stable offset,
    what a read_committed reader reads up to, is its end): a member killed with a transaction
    open holds the outputs written after that transaction's first one until the broker aborts
    it (transaction_timeout_s), and a reader that stopped at the stable offset would miss them.
    """
    probes = {
        level: Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"probe-{uuid.uuid4().hex}",
                "isolation.level": level,
            }
        )
        for level in ("read_committed", "read_uncommitted")
    }
    try:
        meta = probes["read_committed"].list_topics(topic, timeout=15).topics[topic]
        tps = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
        deadline = time.monotonic() + timeout
        while True:
            open_ = [
                tp.partition
                for tp in tps
                if probes["read_committed"].get_watermark_offsets(tp, timeout=15)[1]
                != probes["read_uncommitted"].get_watermark_offsets(tp, timeout=15)[1]
            ]
            if not open_:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions {open_} still have a transaction open")
            time.sleep(0.2)
    finally:
        for c in probes.values():
            c.close()


def check_outputs(
    bootstrap: str, input_topic: str, output_topic: str, *, timeout: float = 60
) -> OutputReport:
    """Read both topics to their end with read_committed, once no transaction is open on them,
    and compare them."""
    for topic in (input_topic, output_topic):
        wait_for_no_open_transaction(bootstrap, topic, timeout)
    inputs = consume_all(bootstrap, input_topic, timeout=timeout)
    outputs = consume_all(bootstrap, output_topic, timeout=timeout)
    return compare(inputs, outputs)
