"""`Accumulator` (and `AsyncBatchAccumulator`): a handler that keeps records in a buffer of its
own and writes them in its flush hook, for the tests of the flush hook (fake and real broker)."""

from __future__ import annotations

import asyncio
import threading

from tests.audit.exactly_once import transform
from weir import BatchContext, BatchHandler, Context, FlushContext, Handler, Record

Key = tuple[int, int]  # (partition, offset)


class SinkDown(Exception):
    pass


class Accumulator(Handler):
    """Keeps records in a buffer of its own; `on_flush` writes what it may (`durable`) and drops
    the rest (`dropped`). `fail_flushes` flushes raise first, keeping the buffer."""

    def __init__(self, fail_flushes: int = 0) -> None:
        self.lock = threading.Lock()
        self.buffer: list[tuple[str, int, int, int]] = []
        self.durable: set[Key] = set()
        self.dropped: list[Key] = []
        self.handled: list[Key] = []
        self.flushes = 0
        self.fail_flushes = fail_flushes

    def handle(self, record: Record, ctx: Context) -> None:
        with self.lock:
            self.handled.append((record.partition, record.offset))
            self.buffer.append((record.topic, record.partition, record.offset, ctx.token))

    def on_flush(self, ctx: FlushContext) -> None:
        with self.lock:
            self.flushes += 1
            if self.fail_flushes:
                self.fail_flushes -= 1
                raise SinkDown("the sink is down")
            taken, self.buffer = self.buffer, []
            for topic, p, off, token in taken:
                if ctx.owns((topic, p), token):
                    self.durable.add((p, off))
                else:
                    self.dropped.append((p, off))


class AsyncBatchAccumulator(BatchHandler, Accumulator):
    """`Accumulator` with an `async def handle_batch` (on the event loop): each call appends its
    records to the buffer, keeping each one's `ctx.token(record)`. A call that holds an offset
    of `slow` first sleeps `delay` seconds on the loop."""

    def __init__(
        self, fail_flushes: int = 0, slow: frozenset[int] = frozenset(), delay: float = 0.0
    ) -> None:
        Accumulator.__init__(self, fail_flushes)
        self.slow = slow
        self.delay = delay

    async def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        if self.slow.intersection(r.offset for r in records):
            await asyncio.sleep(self.delay)
        with self.lock:
            for r in records:
                self.handled.append((r.partition, r.offset))
                self.buffer.append((r.topic, r.partition, r.offset, ctx.token(r)))


class ProducingBatchAccumulator(AsyncBatchAccumulator):
    """`AsyncBatchAccumulator` in a transactional member: each record also produces its
    transform (`tests.audit.exactly_once.transform`) into `output`."""

    def __init__(self, output: str, fail_flushes: int = 0) -> None:
        super().__init__(fail_flushes)
        self.output = output

    async def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        for r in records:
            key, value = transform(r.partition, r.offset, r.key, r.value)
            ctx.produce(r, self.output, value, key)
        await super().handle_batch(records, ctx)
