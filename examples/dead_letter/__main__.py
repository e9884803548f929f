"""``python -m examples.dead_letter``: orders among poison records, a flaky payment service, and
a dead-letter topic read back at the end.

Produces orders as JSON, keyed by customer. A few are poison: an amount the payment service
refuses (the handler raises `InvalidOrder`, a `NonRetryable`), or bytes that are not JSON at all
(the value deserializer fails). The service also times out now and then on a first attempt. One
`GroupConsumer` charges every order: timeouts are retried after a backoff, poison records go to
`<topic>.dlq` with their raw bytes and `weir.dlq.*` headers, and the run checks that every good
order was charged, every poison record dead-lettered, and the group's committed offsets reached
the end of every partition. Exit code 0 only then. See README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer
from confluent_kafka import TopicPartition as TP
from pydantic import BaseModel, Field

from examples._kafka import broker, client, create_topics, delete_topics
from weir import (
    Context,
    FailurePolicy,
    GroupConsumer,
    Handler,
    NonRetryable,
    Record,
    RetryPolicy,
)
from weir.serde import pydantic_deserializer

PARTITIONS = 3
CUSTOMERS = 20


class Order(BaseModel):
    order_id: str
    customer: str
    amount: float = Field(allow_inf_nan=False)


class InvalidOrder(NonRetryable):
    """The payment service refuses the order: retrying cannot help."""


def is_invalid(i: int) -> bool:
    return i % 50 == 17  # an amount of zero or less


def is_garbage(i: int) -> bool:
    return i % 97 == 42  # not JSON


def times_out(i: int) -> bool:
    return i % 7 == 3  # the first attempt times out


def order_value(i: int) -> bytes:
    if is_garbage(i):
        return b"\x00\x01 not an order"
    amount = -5.0 if is_invalid(i) else round(10 + i % 90 + 0.5, 2)
    order = {"order_id": f"o-{i:05d}", "customer": f"c-{i % CUSTOMERS:02d}", "amount": amount}
    return json.dumps(order).encode()


class Payments(Handler):
    """Charges orders (runs on worker threads). The handler sees the validated `Order` in
    `record.deserialized_value`; `record.value` stays the raw bytes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.charged: Counter[str] = Counter()
        self.timeouts = 0

    def handle(self, record: Record, ctx: Context) -> None:
        order: Order = record.deserialized_value
        if order.amount <= 0:
            raise InvalidOrder(f"amount {order.amount:g} of {order.order_id} is not positive")
        if times_out(int(order.order_id[2:])) and ctx.attempt == 1:
            with self.lock:
                self.timeouts += 1
            raise TimeoutError(f"payment service timed out charging {order.order_id}")
        time.sleep(0.001)  # the call to the payment service
        with self.lock:
            self.charged[order.order_id] += 1


@dataclass
class Letter:
    """A dead letter read back: where the record came from, its raw value, weir's headers."""

    partition: int
    offset: int
    value: bytes | None
    headers: dict[str, str]


@dataclass
class Summary:
    produced: int = 0
    # (partition, offset) -> order number, from the producer's delivery reports
    placed: dict[tuple[int, int], int] = field(default_factory=dict)
    poison: set[tuple[int, int]] = field(default_factory=set)
    charged: int = 0
    duplicates: int = 0
    missing: list[str] = field(default_factory=list)
    retries: int = 0
    letters: list[Letter] = field(default_factory=list)
    committed: list[int | None] = field(default_factory=list)
    end: list[int] = field(default_factory=list)
    elapsed_s: float = 0.0
    failure: str | None = None

    @property
    def letters_ok(self) -> bool:
        """Every poison record dead-lettered once, with its raw bytes, and nothing else."""
        places = [(letter.partition, letter.offset) for letter in self.letters]
        return (
            len(places) == len(set(places))
            and set(places) == self.poison
            and all(
                letter.value == order_value(self.placed[(letter.partition, letter.offset)])
                for letter in self.letters
            )
        )

    @property
    def ok(self) -> bool:
        return (
            self.failure is None
            and not self.missing
            and self.letters_ok
            and self.committed == self.end
            and len(self.end) == PARTITIONS
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m examples.dead_letter",
        description="Poison orders to a dead-letter topic, flaky calls retried (see README.md).",
    )
    ap.add_argument("--bootstrap", help="use this Kafka instead of starting an embedded broker")
    ap.add_argument("--orders", type=int, default=300, help="orders to produce (default 300)")
    ap.add_argument("--timeout", type=float, default=60.0, help="give up after this many seconds")
    return ap.parse_args(argv)


def produce(bootstrap: str, topic: str, n: int, summary: Summary) -> None:
    """The orders, keyed by customer; notes where each landed and each partition's end."""
    producer = Producer(client(bootstrap, **{"enable.idempotence": True, "linger.ms": 5}))
    summary.end = [0] * PARTITIONS
    errors: list[str] = []

    def delivered(i: int, err: KafkaError | None, msg: Message) -> None:
        partition, offset = msg.partition(), msg.offset()
        if err is not None or partition is None or offset is None:
            errors.append(f"order {i}: {err}")
            return
        summary.placed[(partition, offset)] = i
        if is_invalid(i) or is_garbage(i):
            summary.poison.add((partition, offset))
        summary.end[partition] = max(summary.end[partition], offset + 1)

    for i in range(n):
        producer.produce(
            topic,
            key=f"c-{i % CUSTOMERS:02d}".encode(),
            value=order_value(i),
            on_delivery=functools.partial(delivered, i),
        )
        producer.poll(0)
    if producer.flush(30) or errors:
        raise RuntimeError(f"orders not delivered: {errors[:3] or 'timed out'}")
    summary.produced = n


def weir_headers(msg: Message) -> dict[str, str]:
    """A dead letter's weir.dlq.* headers as text (they are UTF-8)."""
    raw = msg.headers() or []
    items = raw.items() if isinstance(raw, dict) else raw
    out = {}
    for name, value in items:
        if name.startswith("weir.dlq."):
            out[name] = value.decode() if isinstance(value, bytes) else str(value or "")
    return out


def read_dead_letters(bootstrap: str, topic: str, expected: int, timeout: float) -> list[Letter]:
    """The dead-letter topic from the beginning, without joining a group."""
    reader = {"group.id": f"dlq-reader-{uuid.uuid4().hex}", "enable.auto.commit": False}
    consumer = Consumer(client(bootstrap, **reader))
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        consumer.assign([TP(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
        letters: list[Letter] = []
        deadline = time.monotonic() + timeout
        while len(letters) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            headers = weir_headers(msg)
            letters.append(
                Letter(
                    int(headers["weir.dlq.partition"]),
                    int(headers["weir.dlq.offset"]),
                    msg.value(),
                    headers,
                )
            )
        return letters
    finally:
        consumer.close()


def run(bootstrap: str, orders: int, timeout: float) -> Summary:
    summary = Summary()
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    group = f"payments-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, {topic: PARTITIONS})
    try:
        return consume(bootstrap, topic, group, orders, summary, timeout)
    finally:
        delete_topics(bootstrap, [topic, f"{topic}.dlq"])


def consume(
    bootstrap: str, topic: str, group: str, orders: int, summary: Summary, timeout: float
) -> Summary:
    produce(bootstrap, topic, orders, summary)
    payments = Payments()
    member = GroupConsumer(
        payments,
        value_deserializer=pydantic_deserializer(Order),
        bootstrap_servers=bootstrap,
        group_id=group,
        topics=[topic],
        ordering="key",
        workers=8,
        commit_interval_s=0.2,
        failure=FailurePolicy(
            retry=RetryPolicy(max_attempts=4, backoff_initial_s=0.1, backoff_max_s=1.0),
            final="dead_letter",  # to f"{topic}.dlq", created at start if missing
        ),
    )
    started = time.monotonic()
    member.start()
    try:
        deadline = started + timeout
        while time.monotonic() < deadline and member.failure is None:
            committed = {p.tp.partition: p.committed for p in member.stats().partitions}
            if [committed.get(p) for p in range(PARTITIONS)] == summary.end:
                break
            time.sleep(0.1)
    finally:
        member.stop()
        with contextlib.suppress(Exception):
            member.join(30)
    summary.elapsed_s = time.monotonic() - started
    stats = member.stats()
    last = {p.tp.partition: p.committed for p in stats.partitions}
    summary.committed = [last.get(p) for p in range(PARTITIONS)]
    summary.failure = None if member.failure is None else repr(member.failure)
    summary.retries = stats.retries
    good = {f"o-{i:05d}" for (p, o), i in summary.placed.items() if (p, o) not in summary.poison}
    summary.charged = len(set(payments.charged) & good)
    summary.duplicates = sum(n - 1 for n in payments.charged.values())
    summary.missing = sorted(good - set(payments.charged))
    summary.letters = read_dead_letters(bootstrap, f"{topic}.dlq", len(summary.poison), timeout=20)
    return summary


def print_summary(s: Summary) -> None:
    def mark(ok: bool) -> str:
        return "ok" if ok else "WRONG"

    missing = f"  (missing: {', '.join(s.missing[:5])})" if s.missing else ""
    print(f"orders produced      {s.produced}")
    print(f"charged              {s.charged}  {mark(not s.missing)}{missing}")
    print(f"charged twice        {s.duplicates}")
    print(f"retried              {s.retries} (payment service timeouts)")
    print(f"dead-lettered        {len(s.letters)} of {len(s.poison)} poison  {mark(s.letters_ok)}")
    for letter in sorted(s.letters, key=lambda x: (x.partition, x.offset)):
        h = letter.headers
        kind = h["weir.dlq.exception"].rsplit(".", 1)[-1]
        value = letter.value or b""
        raw = repr(value) if len(value) <= 16 else f"{value[:13]!r}..."
        print(
            f"  [{letter.partition}]@{letter.offset:<4} {h['weir.dlq.attempts']} attempt  "
            f"{kind}: {h['weir.dlq.message'][:48]}  raw {raw}"
        )
    committed = "  ".join(f"{c}/{e}" for c, e in zip(s.committed, s.end, strict=False))
    print(f"committed / end      {committed}  {mark(s.committed == s.end)}")
    if s.failure:
        print(f"member failed: {s.failure}")
    print(f"elapsed              {s.elapsed_s:.1f} s")
    print("PASS" if s.ok else "FAIL")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # weir logs a warning per dead letter (`dead_lettered`) on its stdlib loggers, which Python
    # prints to stderr while nothing configures logging: the summary lists each one already.
    logging.getLogger("weir").setLevel(logging.ERROR)
    with contextlib.ExitStack() as stack:
        bootstrap = broker(stack, args.bootstrap)
        if bootstrap is None:
            return 1
        summary = run(bootstrap, args.orders, args.timeout)
        print_summary(summary)
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
