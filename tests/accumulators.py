"""`Accumulator`: a handler that keeps records in a buffer of its own and writes them in its flush
hook, for the tests of the flush hook (fake and real broker)."""

from __future__ import annotations

import threading

from weir import Context, FlushContext, Handler, Record

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
