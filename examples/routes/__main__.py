"""``python -m examples.routes``: one member for three kinds of topic, each with its own handler,
producing its outputs without transactions, with a circuit breaker and a rate limit.

- ``orders-<id>``: priced into a ``ledger-<id>`` topic with ``ctx.produce`` (at-least-once: an
  order counts finished only once the broker confirmed its ledger entry). The ledger is down for
  a second once: the handler pauses its partition (``ctx.pause_partition``, a circuit breaker)
  and raises, and the order is retried after a backoff.
- ``refunds-<id>``: at most ``--refund-rate`` records a second (``max_records_per_s_by_topic``),
  while the orders run at full speed.
- every ``audit-<id>-*`` topic, through a pattern route with an ordering of its own
  (unordered, where the member's is key): debug events skipped by a filter before they are
  deserialized (their offsets are committed like the others').

The run checks every order is in the ledger, the refunds kept to their rate, only the audit
events above debug were handled, the pause was seen in stats, and the group's commits reached
the end of every input partition. Exit code 0 only then. See README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka import TopicPartition as TP
from pydantic import BaseModel

from examples._kafka import broker, client, create_topics, delete_topics
from weir import (
    Context,
    FailurePolicy,
    GroupConsumer,
    Handler,
    Partition,
    Record,
    RetryPolicy,
    Route,
)
from weir.serde import json_deserializer, json_serializer, pydantic_deserializer

PARTITIONS = {"orders": 3, "refunds": 2, "audit-a": 2, "audit-b": 1, "ledger": 3}
CUSTOMERS = 12
DOWN_AT = 200  # the ledger goes down when the order with this number is priced
DOWN_S = 1.0


class Order(BaseModel):
    order_id: str
    customer: str
    amount: float


class LedgerDown(ConnectionError):
    """The ledger refused a write: retried after the failure policy's backoff."""


class Ledger:
    """Stands in for the downstream the ledger entries go to: down for `DOWN_S` once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.down_until = 0.0

    def check(self, order_number: int) -> None:
        with self.lock:
            now = time.monotonic()
            if order_number == DOWN_AT and not self.down_until:
                self.down_until = now + DOWN_S
            if now < self.down_until:
                raise LedgerDown(f"ledger unavailable for {self.down_until - now:.1f} s more")


class Pricing(Handler):
    """Orders into ledger entries (worker threads)."""

    def __init__(self, ledger_topic: str) -> None:
        self.ledger_topic = ledger_topic
        self.ledger = Ledger()
        self.lock = threading.Lock()
        self.breaker_trips = 0

    def handle(self, record: Record[Order], ctx: Context) -> None:
        order = record.deserialized_value  # an Order: mypy checks what the handler reads of it
        try:
            self.ledger.check(int(order.order_id[2:]))
        except LedgerDown:
            # Circuit breaker: stop fetching this partition while the ledger is down; the
            # records already fetched still come here and wait for their retries too.
            ctx.pause_partition(DOWN_S)
            with self.lock:
                self.breaker_trips += 1
            raise
        entry = {"order_id": order.order_id, "cents": round(order.amount * 100)}
        ctx.produce(self.ledger_topic, entry, key=order.customer)  # JSON: value_serializer


class Refunds:
    """Notes when each refund was handled (the rate limit's check)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.at: list[float] = []

    def __call__(self, record: Record) -> None:
        with self.lock:
            self.at.append(time.monotonic())

    def rate_after_burst(self, burst: int) -> float:
        """Refunds per second after the first `burst` (the bucket starts full)."""
        at = sorted(self.at)
        if len(at) <= burst + 1:
            return 0.0
        return (len(at) - burst - 1) / (at[-1] - at[burst])


class Audit:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.levels: Counter[str] = Counter()

    def __call__(self, record: Record) -> None:
        with self.lock:
            self.levels[record.deserialized_value["level"]] += 1


def not_debug(record: Record) -> bool:
    """Runs on the raw bytes, before deserializing: a skipped record costs almost nothing."""
    return not (record.value or b"").startswith(b'{"level": "debug"')


@dataclass
class Summary:
    orders: int = 0
    refunds: int = 0
    audit: Counter[str] = field(default_factory=Counter)
    ledger: Counter[str] = field(default_factory=Counter)
    breaker_trips: int = 0
    paused_seen: set[Partition] = field(default_factory=set)
    retries: int = 0
    refund_rate: float = 0.0
    refund_limit: float = 0.0
    audit_handled: Counter[str] = field(default_factory=Counter)
    committed: dict[Partition, int | None] = field(default_factory=dict)
    end: dict[Partition, int] = field(default_factory=dict)
    elapsed_s: float = 0.0
    failure: str | None = None

    @property
    def ledger_ok(self) -> bool:
        return len(self.ledger) == self.orders

    @property
    def rate_ok(self) -> bool:
        return 0.8 * self.refund_limit <= self.refund_rate <= 1.05 * self.refund_limit

    @property
    def audit_ok(self) -> bool:
        return self.audit_handled == Counter({k: v for k, v in self.audit.items() if k != "debug"})

    @property
    def ok(self) -> bool:
        return (
            self.failure is None
            and self.ledger_ok
            and self.rate_ok
            and self.audit_ok
            and self.breaker_trips > 0
            and bool(self.paused_seen)
            and self.committed == self.end
        )


def produce(bootstrap: str, topics: dict[str, str], args: argparse.Namespace, s: Summary) -> None:
    producer = Producer(client(bootstrap, **{"enable.idempotence": True, "linger.ms": 5}))
    for i in range(args.orders):
        customer = f"c-{i % CUSTOMERS:02d}"
        order = {"order_id": f"o-{i:05d}", "customer": customer, "amount": i % 90}
        producer.produce(topics["orders"], json.dumps(order), key=customer)
        producer.poll(0)
    for i in range(args.refunds):
        producer.produce(topics["refunds"], json.dumps({"order_id": f"o-{i:05d}"}))
    for i in range(args.audit):
        level = ("debug", "info", "debug", "warning")[i % 4]
        s.audit[level] += 1
        topic = topics["audit-a"] if i % 3 else topics["audit-b"]
        producer.produce(topic, json.dumps({"level": level, "n": i}))
    if producer.flush(30):
        raise RuntimeError("the input records were not delivered within 30 s")
    s.orders, s.refunds = args.orders, args.refunds


def end_offsets(bootstrap: str, topics: list[str]) -> dict[Partition, int]:
    reader = Consumer(client(bootstrap, **{"group.id": f"ends-{uuid.uuid4().hex}"}))
    try:
        ends = {}
        for topic in topics:
            for p in reader.list_topics(topic, timeout=10).topics[topic].partitions:
                ends[Partition(topic, p)] = reader.get_watermark_offsets(TP(topic, p), 10)[1]
        return ends
    finally:
        reader.close()


def read_ledger(bootstrap: str, topic: str, expected: int, timeout: float) -> Counter[str]:
    """The ledger topic from the beginning, without joining a group: order id -> entries."""
    reader = Consumer(client(bootstrap, **{"group.id": f"ledger-reader-{uuid.uuid4().hex}"}))
    try:
        reader.assign([TP(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS["ledger"])])
        seen: Counter[str] = Counter()
        deadline = time.monotonic() + timeout
        while sum(seen.values()) < expected and time.monotonic() < deadline:
            msg = reader.poll(0.2)
            if msg is not None and msg.error() is None:
                seen[json.loads(msg.value() or b"null")["order_id"]] += 1
        return seen
    finally:
        reader.close()


def consume(bootstrap: str, topics: dict[str, str], args: argparse.Namespace, s: Summary) -> None:
    pricing, refunds, audit = Pricing(topics["ledger"]), Refunds(), Audit()
    audit_pattern = re.compile(f"audit-{topics['id']}-.*")
    member = GroupConsumer(
        routes={
            topics["orders"]: Route(
                pricing,
                value_deserializer=pydantic_deserializer(Order),
                failure=FailurePolicy(
                    retry=RetryPolicy(max_attempts=20, backoff_initial_s=0.2, backoff_max_s=0.5),
                    final="block",
                ),
            ),
            topics["refunds"]: refunds,
            audit_pattern: Route(
                audit,
                value_deserializer=json_deserializer(),
                filter=not_debug,
                ordering="unordered",  # audit events need no order: any of them side by side
            ),
        },
        value_serializer=json_serializer(),  # what ctx.produce writes, unless bytes or str
        max_records_per_s_by_topic={topics["refunds"]: args.refund_rate},
        bootstrap_servers=bootstrap,
        group_id=f"billing-{topics['id']}",
        ordering="key",
        workers=8,
        commit_interval_s=0.2,
        group_protocol="auto",  # KIP-848 where the broker offers it (Kafka 4 does)
    )
    s.refund_limit = args.refund_rate
    inputs = [topics[t] for t in ("orders", "refunds", "audit-a", "audit-b")]
    s.end = end_offsets(bootstrap, inputs)
    started = time.monotonic()
    member.start()
    try:
        deadline = started + args.timeout
        while time.monotonic() < deadline and member.failure is None:
            stats = member.stats()
            s.paused_seen |= {p.tp for p in stats.partitions if p.pause_reason == "app"}
            s.committed = {p.tp: p.committed for p in stats.partitions}
            if s.committed == s.end:
                break
            time.sleep(0.05)
    finally:
        member.stop()
        with contextlib.suppress(Exception):
            member.join(30)
    s.elapsed_s = time.monotonic() - started
    stats = member.stats()
    s.committed = {p.tp: p.committed for p in stats.partitions}
    s.failure = None if member.failure is None else repr(member.failure)
    s.retries = stats.retries
    s.breaker_trips = pricing.breaker_trips
    s.refund_rate = refunds.rate_after_burst(int(args.refund_rate))
    s.audit_handled = audit.levels
    s.ledger = read_ledger(bootstrap, topics["ledger"], s.orders, timeout=20)


def print_summary(s: Summary) -> None:
    def mark(ok: bool) -> str:
        return "ok" if ok else "WRONG"

    twice = sum(n - 1 for n in s.ledger.values())
    print(f"orders               {s.orders}")
    ledger = f"{len(s.ledger)} orders, {twice} written twice"
    print(f"ledger               {ledger}  {mark(s.ledger_ok)}")
    paused = ", ".join(f"{tp.topic.split('-')[0]}[{tp.partition}]" for tp in sorted(s.paused_seen))
    print(
        f"circuit breaker      tripped {s.breaker_trips} times, {s.retries} retries, "
        f"paused (app): {paused or 'never seen'}  {mark(s.breaker_trips > 0 and bool(paused))}"
    )
    print(
        f"refunds              {s.refunds} at {s.refund_rate:.0f}/s after the first second "
        f"(limit {s.refund_limit:g}/s)  {mark(s.rate_ok)}"
    )
    handled = ", ".join(f"{level} {n}" for level, n in sorted(s.audit_handled.items()))
    print(
        f"audit                {sum(s.audit.values())} events, {s.audit['debug']} debug skipped, "
        f"handled: {handled}  {mark(s.audit_ok)}"
    )
    behind = sum((s.end[tp] - (s.committed.get(tp) or 0)) for tp in s.end)
    print(
        f"committed            {len(s.end)} input partitions, {behind} records short of the end"
        f"  {mark(s.committed == s.end)}"
    )
    if s.failure:
        print(f"member failed: {s.failure}")
    print(f"elapsed              {s.elapsed_s:.1f} s")
    print("PASS" if s.ok else "FAIL")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m examples.routes",
        description="Routes, outputs, a circuit breaker and a rate limit (see README.md).",
    )
    ap.add_argument("--bootstrap", help="use this Kafka instead of starting an embedded broker")
    ap.add_argument("--orders", type=int, default=600, help="orders to price (default 600)")
    ap.add_argument("--refunds", type=int, default=300, help="refunds (default 300)")
    ap.add_argument("--refund-rate", type=float, default=100.0, help="refunds/s (default 100)")
    ap.add_argument("--audit", type=int, default=400, help="audit events (default 400)")
    ap.add_argument("--timeout", type=float, default=60.0, help="give up after this many seconds")
    args = ap.parse_args(argv)
    if args.orders <= DOWN_AT:
        ap.error(f"--orders must be more than {DOWN_AT}: the ledger goes down at that order")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    run_id = uuid.uuid4().hex[:8]
    topics: dict[str, Any] = {"id": run_id}
    for name in PARTITIONS:
        prefix, _, suffix = name.partition("-")  # the audit topics: audit-<id>-a, audit-<id>-b
        topics[name] = f"{prefix}-{run_id}" + (f"-{suffix}" if suffix else "")
    with contextlib.ExitStack() as stack:
        bootstrap = broker(stack, args.bootstrap)
        if bootstrap is None:
            return 1
        summary = Summary()
        create_topics(bootstrap, {topics[name]: n for name, n in PARTITIONS.items()})
        try:
            produce(bootstrap, topics, args, summary)
            consume(bootstrap, topics, args, summary)
        finally:
            delete_topics(bootstrap, [topics[name] for name in PARTITIONS])
        print_summary(summary)
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
