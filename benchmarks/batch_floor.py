"""The floor under issue 27's no-op batch goal (>= 0.6x the raw loop): the least a threaded
pipeline of batch calls does, without anything else of weir, against the raw loop in the same run.

Not weir: one owner thread consumes (`consume(500)`), hands each call's records to 4 worker
threads through a queue, 8 batches in flight at most, and counts what comes back; each worker
calls a no-op batch handler that touches every record once, as `throughput.py`'s does. No
budget, scheduler, progress tracking, commits or stats. Three ways to hand records over:

* ``records``: the owner builds a `Record` per message (`weir._engine.intake.runs_of`, as weir
  does) and hands the list over;
* ``worker-records``: the owner keeps columns only (offsets, sizes: what the budget and the
  watermark need) and hands the client's messages over; the worker builds the `Record`s;
* ``messages``: no `Record` at all; the handler touches the client's messages.

    .venv/bin/python benchmarks/batch_floor.py [--bootstrap HOST:PORT] [--rounds 3]

The raw loop is `throughput.py`'s: `consume(500)`, each message's error checked, a no-op call.
"""

from __future__ import annotations

import argparse
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from _common import add_broker_args, broker_from, create_topic, delete_topics, produce, unique
from confluent_kafka import Consumer, KafkaError, Message

from weir._engine.intake import runs_of

_IN_FLIGHT = 4000  # 8 batches of 500: a batch handler's default budget
_WORKERS = 4
# The fetch settings of throughput.py's raw loop (weir's).
_FETCH = {"fetch.wait.max.ms": 100, "fetch.queue.backoff.ms": 1}
WAYS = ("records", "worker-records", "messages")


def _consumer(bootstrap: str, topic: str) -> Consumer:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("batch-floor"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **_FETCH,
        }
    )
    c.subscribe([topic])
    return c


def _records(msgs: list[Message]) -> list[Any]:
    """A `Record` per message, as weir's intake makes them (error events dropped before)."""
    return [r for run in runs_of(msgs, _ignore) for r in run.records]


def _ignore(err: KafkaError, msg: Any) -> None:
    pass


def raw(bootstrap: str, topic: str, records: int) -> float:
    """Records/s from the first record to the last."""
    c = _consumer(bootstrap, topic)
    count = [0]

    def handle(m: Message) -> None:
        count[0] += 1

    started: float | None = None
    try:
        while count[0] < records:
            for m in c.consume(500, 0.1):
                if m.error() is not None:
                    continue
                if started is None:
                    started = time.perf_counter()
                handle(m)
    finally:
        c.close()
    return records / (time.perf_counter() - (started or 0.0))


def pipeline(bootstrap: str, topic: str, records: int, way: str) -> float:
    """Records/s through the owner, the queue and the workers, `way` as the module says."""
    c = _consumer(bootstrap, topic)
    work: queue.SimpleQueue[list[Any] | None] = queue.SimpleQueue()
    done: queue.SimpleQueue[int] = queue.SimpleQueue()

    def handle_batch(items: Sequence[Any], touch: Callable[[Any], object]) -> None:
        for item in items:
            touch(item)

    def worker() -> None:
        while (items := work.get()) is not None:
            if way == "messages":
                handle_batch(items, Message.offset)
            else:
                if way == "worker-records":
                    items = _records(items)
                handle_batch(items, _offset)
            done.put(len(items))

    threads = [threading.Thread(target=worker) for _ in range(_WORKERS)]
    for t in threads:
        t.start()
    in_flight = finished = 0
    held: deque[tuple[list[int | None], int]] = deque()
    started: float | None = None
    error, offset = Message.error, Message.offset
    try:
        while finished < records:
            if in_flight < _IN_FLIGHT:
                msgs = c.consume(500, 0.0 if in_flight else 0.1)
                if msgs:
                    if started is None:
                        started = time.perf_counter()
                    if any(map(error, msgs)):
                        msgs = [m for m in msgs if m.error() is None]
                    items: list[Any]
                    if way == "records":
                        items = _records(msgs)
                    else:
                        # The owner keeps columns of what is in flight: offsets for the
                        # watermark, sizes for the budget.
                        held.append((list(map(offset, msgs)), sum(map(len, msgs))))
                        items = msgs
                    work.put(items)
                    in_flight += len(items)
            try:
                n = done.get(timeout=0.001) if in_flight >= _IN_FLIGHT else done.get_nowait()
                while True:
                    in_flight -= n
                    finished += n
                    if held:
                        held.popleft()
                    n = done.get_nowait()
            except queue.Empty:
                pass
        return records / (time.perf_counter() - (started or 0.0))
    finally:
        for _ in threads:
            work.put(None)
        for t in threads:
            t.join()
        c.close()


def _offset(record: Any) -> object:
    return record.offset


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_broker_args(p)
    p.add_argument("--records", type=int, default=500_000)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    with broker_from(args) as bk:
        topic = unique("batch-floor")
        create_topic(bk.bootstrap, topic, args.partitions)
        try:
            produce(
                bk.bootstrap,
                topic,
                args.records,
                value_size=100,
                partitions=args.partitions,
                keys=1000,
            )
            for n in range(1, args.rounds + 1):
                base = raw(bk.bootstrap, topic, args.records)
                rates = {w: pipeline(bk.bootstrap, topic, args.records, w) for w in WAYS}
                line = ", ".join(f"{w} {r:,.0f}/s = {r / base:.2f}x" for w, r in rates.items())
                print(f"round {n}: raw loop {base:,.0f}/s; {line}", flush=True)
        finally:
            if args.bootstrap:
                delete_topics(bk.bootstrap, [topic])


if __name__ == "__main__":
    main()
