"""Small broker-side helpers shared by the integration tests."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from typing_extensions import Unpack

from tests.consumer_overrides import Overrides
from weir import GroupConsumer, Handler, Record
from weir._engine.client import ClientFactory
from weir.config import ConsumerSettings
from weir.lag import _COORDINATOR_NOT_READY


def produce(
    bootstrap: str,
    topic: str,
    items: Iterable[tuple[bytes | None, bytes]],
    *,
    partition: int | None = None,
) -> int:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    n = 0
    for key, value in items:
        if partition is None:
            p.produce(topic, key=key, value=value)
        else:
            p.produce(topic, key=key, value=value, partition=partition)
        n += 1
        if n % 10_000 == 0:
            p.poll(0)
    left = p.flush(30)
    assert left == 0, f"{left} records not delivered"
    return n


def keyed_orders(n: int, keys: int) -> list[tuple[bytes, bytes]]:
    """n records over `keys` keys; each value carries its sequence number within its key."""
    seq = [0] * keys
    out = []
    for i in range(n):
        k = i % keys
        out.append((f"k{k}".encode(), json.dumps({"key": k, "seq": seq[k]}).encode()))
        seq[k] += 1
    return out


def wait_until(pred: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def committed(
    bootstrap: str, group: str, topic: str, partitions: int, *, timeout: float = 15.0
) -> list[int]:
    """The group's committed offsets of `topic`'s partitions (negative: none), asked again while
    the coordinator moves or loads, up to `timeout`."""
    deadline = time.monotonic() + timeout
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        while True:
            try:
                left = max(0.1, deadline - time.monotonic())
                return [r.offset for r in c.committed(tps, timeout=left)]
            except KafkaException as exc:
                # The coordinator moves or loads (a broker just started, or busy): the next
                # request may find it.
                if exc.args[0].name() not in _COORDINATOR_NOT_READY or time.monotonic() > deadline:
                    raise
            time.sleep(0.1)
    finally:
        c.close()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex}"})
    try:
        return [
            c.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1]
            for p in range(partitions)
        ]
    finally:
        c.close()


@dataclass
class Seen:
    """Thread-safe log of handler calls."""

    calls: list[tuple[int, int, bytes | None, bytes | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    changed: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    def add(self, r: Record) -> None:
        with self.changed:
            self.calls.append((r.partition, r.offset, r.key, r.value))
            self.changed.notify_all()

    def wait_for(self, n: int, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: len({c[:2] for c in self.calls}) >= n, timeout)

    def offsets(self, partition: int | None = None) -> set[tuple[int, int]]:
        with self.lock:
            return {c[:2] for c in self.calls if partition is None or c[0] == partition}


def member(
    handler: Handler | Callable[[Record], object],
    bootstrap: str,
    group: str,
    topics: Sequence[str],
    *,
    consumer_factory: ClientFactory | None = None,
    **kw: Unpack[Overrides],
) -> GroupConsumer:
    settings: ConsumerSettings = {
        "bootstrap_servers": bootstrap,
        "group_id": group,
        "topics": list(topics),
        "commit_interval_s": 0.2,
        "shutdown_timeout_s": 10.0,
        "revoke_timeout_s": 5.0,
        "startup_timeout_s": 15.0,
        **kw,
    }
    return GroupConsumer(handler, consumer_factory=consumer_factory, **settings)


def commit(
    bootstrap: str, group: str, topic: str, offsets: Mapping[int, tuple[int, str | None]]
) -> None:
    """Commit offsets (with metadata where given) without joining the group."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    tps = [
        TopicPartition(topic, p, o) if m is None else TopicPartition(topic, p, o, metadata=m)
        for p, (o, m) in offsets.items()
    ]
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                consumer.commit(offsets=tps, asynchronous=False)
                return
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        consumer.close()
