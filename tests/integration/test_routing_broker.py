"""Routes on a real broker: two named topics and a pattern's topics in one member, each record
handled by its own route, the filter's skipped records committed over, every partition
committed to its end."""

from __future__ import annotations

import json
import re
import uuid

import pytest

from tests.integration.kafka_helpers import Seen, committed, produce, wait_until
from weir import GroupConsumer, Record, Route
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
