"""Routes on a real broker: two named topics and a pattern's topics in one member, each record
handled by its own route, the filter's skipped records committed over, every partition
committed to its end."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from typing import Any

import pytest

from tests.integration.kafka_helpers import Seen, committed, produce, wait_until
from weir import BatchContext, BatchHandler, GroupConsumer, Record, Route
from weir.serde import json_deserializer
from weir.testing.pytest_plugin import TopicFactory

pytestmark = pytest.mark.broker

N = 200


def test_one_member_routes_named_and_pattern_topics(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    prefix = f"route-{uuid.uuid4().hex[:6]}-"
    orders = make_topic(2, name_prefix=prefix + "orders")
    audits = [make_topic(1, name_prefix=prefix + "audit-") for _ in range(2)]
    produce(kafka_bootstrap, orders, [(b"k%d" % (i % 7), json.dumps(i).encode()) for i in range(N)])
    for topic in audits:
        produce(kafka_bootstrap, topic, [(None, b"skip" if i % 4 == 0 else b"a") for i in range(N)])
    got_orders, got_audit = Seen(), Seen()
    values: list[int] = []

    def order(record: Record) -> None:
        values.append(record.deserialized_value)
        got_orders.add(record)

    gc = GroupConsumer(
        routes={
            orders: Route(order, value_deserializer=json_deserializer()),
            # Names of letters, digits and '-': the pattern needs no escaping.
            re.compile(prefix + "audit-.*"): Route(
                got_audit.add, filter=lambda r: r.value != b"skip"
            ),
        },
        bootstrap_servers=kafka_bootstrap,
        group_id=f"routes-{uuid.uuid4().hex[:8]}",
        commit_interval_s=0.2,
        startup_timeout_s=15.0,
    )
    assert gc.config.topics == [orders, f"^{prefix}audit-.*"]
    group = gc.config.group_id
    with gc:
        wait_until(
            lambda: sum(committed(kafka_bootstrap, group, orders, 2)) == N, 60, "orders committed"
        )
        for topic in audits:
            wait_until(
                lambda: committed(kafka_bootstrap, group, topic, 1) == [N],  # noqa: B023
                60,
                f"{topic} committed",
            )
    assert sorted(values) == list(range(N))
    assert len(got_audit.calls) == 2 * (N - N // 4)  # the skipped ones were never handled
    assert {c[3] for c in got_audit.calls} == {b"a"}


class Lanes:
    """Records in flight per topic and per (topic, partition, key), and the order each key's
    records started in. The first audit records wait (up to a second) until two of the topic's
    are in flight: records that may run side by side surely do."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.now: dict[object, int] = {}
        self.most: dict[object, int] = {}
        self.started: dict[tuple[str, int, bytes | None], list[int]] = {}

    def _count(self, lanes: tuple[object, ...], by: int) -> None:
        for lane in lanes:
            n = self.now[lane] = self.now.get(lane, 0) + by
            self.most[lane] = max(self.most.get(lane, 0), n)

    def run(self, record: Record) -> None:
        key = (record.topic, record.partition, record.key)
        lanes = (record.topic, key)
        with self.lock:
            self._count(lanes, 1)
            self.started.setdefault(key, []).append(record.offset)
            self.lock.notify_all()
            if record.topic.endswith("audit") and record.offset < 10:
                self.lock.wait_for(lambda: self.most[record.topic] >= 2, timeout=1.0)
        time.sleep(0.0005)
        with self.lock:
            self._count(lanes, -1)


def test_routes_with_mixed_ordering(kafka_bootstrap: str, make_topic: TopicFactory) -> None:
    """`orders` in key order (the member's), `audit` unordered: every record committed to the
    end of both topics, a key's orders one at a time in offset order, and one key's audit
    records side by side."""
    prefix = f"route-{uuid.uuid4().hex[:6]}-"
    orders = make_topic(2, name_prefix=prefix + "orders")
    audit = make_topic(1, name_prefix=prefix + "audit")
    produce(kafka_bootstrap, orders, [(b"k%d" % (i % 5), b"o") for i in range(N)])
    produce(kafka_bootstrap, audit, [(b"same", b"a") for _ in range(N)])
    seen = Lanes()
    gc = GroupConsumer(
        routes={orders: seen.run, audit: Route(seen.run, ordering="unordered")},
        bootstrap_servers=kafka_bootstrap,
        group_id=f"routes-{uuid.uuid4().hex[:8]}",
        commit_interval_s=0.2,
        startup_timeout_s=15.0,
        workers=4,
    )
    assert gc.config.ordering == "key"
    group = gc.config.group_id
    with gc:
        wait_until(
            lambda: sum(committed(kafka_bootstrap, group, orders, 2)) == N, 60, "orders committed"
        )
        wait_until(lambda: committed(kafka_bootstrap, group, audit, 1) == [N], 60, "audit")
    with seen.lock:
        assert seen.most[audit] >= 2, "one key's audit records never ran side by side"
        keys = [k for k in seen.started if k[0] == orders]
        assert max(seen.most[k] for k in keys) == 1, "a key's orders ran side by side"
        assert sum(len(seen.started[k]) for k in keys) == N  # each once: no failure, no rebalance
        for k in keys:
            assert seen.started[k] == sorted(seen.started[k]), f"{k} out of offset order"


class KeyedBatches(BatchHandler):
    """Batch calls in flight per (topic, partition, key) at once, and each key's offsets in the
    order the calls held them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now: dict[tuple[str, int, bytes | None], int] = {}
        self.most = 0
        self.order: dict[tuple[str, int, bytes | None], list[int]] = {}
        self.values: list[Any] = []

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        keys = {(r.topic, r.partition, r.key) for r in records}
        with self.lock:
            for k in keys:
                self.now[k] = self.now.get(k, 0) + 1
                self.most = max(self.most, self.now[k])
            for r in records:
                self.order.setdefault((r.topic, r.partition, r.key), []).append(r.offset)
                self.values.append(r.deserialized_value)
        time.sleep(0.002)
        with self.lock:
            for k in keys:
                self.now[k] -= 1


def test_batch_routes_with_mixed_ordering(kafka_bootstrap: str, make_topic: TopicFactory) -> None:
    """Batch handlers as routes: `orders` in key order with a JSON deserializer, `audit`
    unordered; every record handled once and committed to the end of both topics, and a key's
    orders in one batch at a time, in offset order."""
    prefix = f"route-{uuid.uuid4().hex[:6]}-"
    orders = make_topic(2, name_prefix=prefix + "orders")
    audit = make_topic(1, name_prefix=prefix + "audit")
    produce(kafka_bootstrap, orders, [(b"k%d" % (i % 5), json.dumps(i).encode()) for i in range(N)])
    produce(kafka_bootstrap, audit, [(b"same", b"a") for _ in range(N)])
    keyed, audited = KeyedBatches(), KeyedBatches()
    gc = GroupConsumer(
        routes={
            orders: Route(keyed, value_deserializer=json_deserializer()),
            audit: Route(audited, ordering="unordered"),
        },
        bootstrap_servers=kafka_bootstrap,
        group_id=f"routes-{uuid.uuid4().hex[:8]}",
        commit_interval_s=0.2,
        startup_timeout_s=15.0,
        workers=4,
        batch_max_records=20,
    )
    group = gc.config.group_id
    with gc:
        wait_until(
            lambda: sum(committed(kafka_bootstrap, group, orders, 2)) == N, 60, "orders committed"
        )
        wait_until(lambda: committed(kafka_bootstrap, group, audit, 1) == [N], 60, "audit")
    assert sorted(keyed.values) == list(range(N))  # each once, deserialized
    assert len(audited.values) == N
    assert keyed.most == 1, "a key's orders were in two batches at once"
    for k, offsets in keyed.order.items():
        assert offsets == sorted(offsets), f"{k} out of offset order"
