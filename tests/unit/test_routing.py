"""Routes: several topics, several handlers, one member (`GroupConsumer(routes=...)`), on the
scripted FakeConsumer."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from tests.fake_members import FAKE_LOOP
from tests.unit.test_scheduling import SLOW, Idle, offsets, rec, running_now, submit
from tests.waiting import wait_until

from weir import (
    BatchContext,
    BatchHandler,
    ConsumerConfig,
    Context,
    FailurePolicy,
    GroupConsumer,
    Handler,
    Partition,
    Record,
    RetryPolicy,
    Route,
    State,
)
from weir._engine.scheduling import (
    ByKey,
    ByPartition,
    Lane,
    Orderings,
    Scheduler,
    Unordered,
    lane_of,
)
from weir._engine.tasks import Assignment
from weir._engine.workers import ThreadWorkers
from weir.records import Ordering
from weir.serde import json_deserializer
from weir.testing.fake import FakeConsumer

pytestmark = pytest.mark.timeout(60)

WAIT = 10.0
SETTINGS: dict[str, Any] = {k: v for k, v in FAKE_LOOP.items() if k != "topics"}
ORDERS, REFUNDS, AUDIT = Partition("orders", 0), Partition("refunds", 0), Partition("audit-eu", 0)


class Seen(Handler):
    def __init__(self) -> None:
        self.records: list[tuple[str, int, Any]] = []
        self.assigned: list[Partition] = []
        self.lock = threading.Lock()

    def handle(self, record: Record, ctx: Context) -> None:
        with self.lock:
            self.records.append((record.topic, record.offset, record.deserialized_value))

    def on_assigned(self, partitions: Sequence[Partition]) -> None:
        self.assigned.extend(partitions)


class Offsets:
    def __init__(self) -> None:
        self.offsets: list[int] = []

    def append_offset(self, record: Record) -> None:
        self.offsets.append(record.offset)


def committed(fake: FakeConsumer, tp: Partition) -> int:
    return max((off for off, _ in fake.commits_for(tp)), default=-1)


def start(members: list[GroupConsumer], gc: GroupConsumer) -> GroupConsumer:
    members.append(gc)
    gc.start()
    assert gc.wait_started(WAIT)
    return gc


def test_each_topic_goes_to_its_route_with_its_deserializer_and_filter(
    members: list[GroupConsumer],
) -> None:
    fake = FakeConsumer()
    fake.produce_many("orders", 0, range(3), value=lambda o: json.dumps({"n": o}).encode())
    fake.produce_many("refunds", 0, range(4), value=lambda o: b"skip" if o % 2 else b"r")
    fake.produce_many("audit-eu", 0, range(2))
    fake.script_assign([ORDERS, REFUNDS, AUDIT])
    orders, audit = Seen(), Seen()
    refunds = Offsets()
    gc = GroupConsumer(
        routes={
            "orders": Route(orders, value_deserializer=json_deserializer()),
            "refunds": Route(refunds.append_offset, filter=lambda r: r.value != b"skip"),
            re.compile("audit-.*"): audit,
        },
        consumer_factory=fake.factory,
        **SETTINGS,
    )
    assert gc.config.topics == ["orders", "refunds", "^audit-.*"]
    start(members, gc)
    for tp, end in ((ORDERS, 3), (REFUNDS, 4), (AUDIT, 2)):
        wait_until(lambda: committed(fake, tp) == end, f"{tp} committed")  # noqa: B023
    assert orders.records == [("orders", o, {"n": o}) for o in range(3)]
    assert refunds.offsets == [0, 2]  # the filtered records count finished, unhandled
    assert [(t, o) for t, o, _ in audit.records] == [("audit-eu", 0), ("audit-eu", 1)]
    # Each route's hook hears of its own partitions only.
    assert orders.assigned == [ORDERS] and audit.assigned == [AUDIT]


def test_a_routes_failure_policy_applies_to_its_topic_alone(members: list[GroupConsumer]) -> None:
    fake = FakeConsumer()
    fake.produce_many("orders", 0, range(3))
    fake.produce_many("refunds", 0, range(3))
    fake.script_assign([ORDERS, REFUNDS])

    def refund(record: Record) -> None:
        if record.offset == 1:
            raise RuntimeError("poison")

    block = FailurePolicy(retry=RetryPolicy(max_attempts=1), final="block")
    gc = start(
        members,
        GroupConsumer(
            routes={"orders": lambda r: None, "refunds": Route(refund, failure=block)},
            consumer_factory=fake.factory,
            **SETTINGS,
        ),
    )
    # The member's own policy is `stop`: without the route's, the poison would stop it.
    wait_until(lambda: gc.stats().blocked == (REFUNDS,), "refunds blocked by its route's policy")
    fake.produce_many("orders", 0, range(3, 6))
    wait_until(lambda: committed(fake, ORDERS) == 6, "orders flows on")
    assert gc.state is State.RUNNING and committed(fake, REFUNDS) == 1
    assert gc.config.policy_for("refunds") == block
    assert gc.config.policy_for("orders") == gc.config.failure


def test_a_pattern_routes_policy_covers_every_topic_it_matches() -> None:
    block = FailurePolicy(final="block")
    cfg = ConsumerConfig(
        **SETTINGS, topics=["orders", "^audit-.*"], failure_by_topic={"^audit-.*": block}
    )
    assert cfg.policy_for("audit-eu") == block
    assert cfg.policy_for("orders") == cfg.failure


async def _async_seen(record: Record) -> None:
    pass


def test_async_routes_run_on_the_loop(members: list[GroupConsumer]) -> None:
    fake = FakeConsumer()
    fake.produce_many("orders", 0, range(3))
    fake.produce_many("refunds", 0, range(2))
    fake.script_assign([ORDERS, REFUNDS])
    seen: list[tuple[str, int]] = []

    class Orders(Handler):
        async def handle(self, record: Record, ctx: Context) -> None:
            seen.append((record.topic, record.offset))

    async def refunds(record: Record) -> None:
        seen.append((record.topic, record.offset))

    start(
        members,
        GroupConsumer(
            routes={"orders": Orders(), "refunds": refunds},
            consumer_factory=fake.factory,
            **SETTINGS,
        ),
    )
    wait_until(lambda: committed(fake, ORDERS) == 3 and committed(fake, REFUNDS) == 2, "all")
    assert sorted(seen) == [
        ("orders", 0),
        ("orders", 1),
        ("orders", 2),
        ("refunds", 0),
        ("refunds", 1),
    ]


class Batch(BatchHandler):
    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        pass


BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"routes": {}}, TypeError, "routes must be a non-empty mapping"),
    ({"routes": [("orders", print)]}, TypeError, "routes must be a non-empty mapping"),
    ({"routes": {"": print}}, ValueError, "a topic name must be non-empty"),
    ({"routes": {"^orders": print}}, ValueError, "for a pattern use re.compile"),
    ({"routes": {5: print}}, TypeError, "a route's key must be a topic name"),
    ({"routes": {"orders": print}, "topics": ["orders", "other"]}, ValueError,
     "no route for the subscribed 'other'"),
    ({"routes": {"orders": print}, "topics": ["^orders-.*"]}, ValueError,
     "no route for the subscribed '^orders-.*'"),
    ({"routes": {"orders": print, "refunds": _async_seen}}, TypeError,
     "the routes mix async def and thread handlers"),
    ({"routes": {"orders": Batch()}}, TypeError, "a batch handler cannot be routed yet"),
    ({"routes": {"orders": Route(print, filter=5)}}, TypeError,  # type: ignore[arg-type]
     "filter must be a function"),
    ({"routes": {"orders": Route(print, failure=FailurePolicy(final="block"))},
      "failure_by_topic": {"orders": FailurePolicy()}}, ValueError,
     "failure_by_topic and the routes both set a policy for orders"),
    ({"routes": {"orders": Seen}}, TypeError, "pass an instance"),
    ({}, TypeError, "GroupConsumer needs a handler, or routes="),
]  # fmt: skip


@pytest.mark.parametrize(("given", "error", "said"), BAD)
def test_bad_routes_are_refused_where_the_member_is_built(
    given: dict[str, Any], error: type[Exception], said: str
) -> None:
    with pytest.raises(error) as info:
        GroupConsumer(consumer_factory=FakeConsumer().factory, **{**SETTINGS, **given})
    assert said in str(info.value)


def test_a_handler_and_routes_together_are_refused() -> None:
    with pytest.raises(TypeError, match="pass a handler or routes=, not both"):
        GroupConsumer(print, routes={"orders": print}, **SETTINGS)


def test_the_scheduler_asks_a_topics_ordering_once_and_holds_it() -> None:
    """The route table resolves a topic's ordering the first time a partition of it is
    assigned; the scheduler holds the rule from then on (no lookup per record, nor per later
    assignment), and packs each topic's records by its own rule."""
    asked: list[str] = []
    table = {"orders": "key", "refunds": "partition", "audit-eu": "unordered"}

    def of(topic: str) -> Ordering:
        asked.append(topic)
        return table[topic]  # type: ignore[return-value]

    orderings = Orderings(of, frozenset({"key", "partition", "unordered"}))
    s = Scheduler(ThreadWorkers(Idle(), 4, lane_of("key", orderings)), "key", orderings=orderings)
    s._per_record = SLOW  # one record per task where the lanes allow
    a_orders, a_refunds, a_audit = (Assignment(Partition(t, 0), 1) for t in table)
    for a in (a_orders, a_refunds, a_audit):
        s.assigned(a)
    assert asked == ["orders", "refunds", "audit-eu"]
    for a in (a_orders, a_refunds, a_audit):
        submit(s, a, [0, 1, 2, 3], key=lambda o: b"k%d" % (o % 2))
        submit(s, a, [4, 5], key=lambda o: b"k%d" % (o % 2))
    later = Assignment(Partition("orders", 0), 2)  # assigned again: its topic's rule is held
    s.assigned(later)
    assert asked == ["orders", "refunds", "audit-eu"]
    assert [type(s.rule_of(a)) for a in (a_orders, a_refunds, a_audit, later)] == [
        ByKey,
        ByPartition,
        Unordered,
        ByKey,
    ]
    tasks = running_now(s)
    by_topic: dict[str, list[list[int]]] = {}
    for t in tasks:
        by_topic.setdefault(t.assignment.tp.topic, []).append(offsets(t))
    assert sorted(by_topic["orders"]) == [[0], [1]]  # a key at a time
    # The partition's one lane: the first batch in one task, the second waits behind it.
    assert by_topic["refunds"] == [[0, 1, 2, 3]] and s.waiting_in(a_refunds, None) == 2
    assert sorted(by_topic["audit-eu"]) == [[o] for o in range(6)]  # everything at once
    assert asked == ["orders", "refunds", "audit-eu"]
    assert lane_of("key", orderings) is not None
    lanes = lane_of("key", orderings)
    assert lanes is not None
    r = rec(0, 0, b"k", "audit-eu")
    assert lanes(r) != lanes(r)  # an unordered record holds a lane of its own, in workers too
    assert lanes(rec(0, 0, b"k", "orders")) == b"k"
    assert lanes(rec(0, 0, b"k", "refunds")) is None
    assert s.lane_key(r) is Lane.NONE
