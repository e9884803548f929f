"""Routes: several topics, several handlers, one member (`GroupConsumer(routes=...)`), on the
scripted FakeConsumer."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from tests.fake_members import FAKE_LOOP
from tests.logged import events
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
from weir.routing import router
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


class _KeepsSeen(BatchHandler):
    def __init__(self) -> None:
        self.offsets: list[int] = []

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        self.offsets += [r.offset for r in records]


@pytest.mark.parametrize("batch", [False, True], ids=["one-record", "batch"])
def test_a_filter_that_returns_none_fails_its_record_instead_of_skipping_it(
    members: list[GroupConsumer], batch: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A filter without a return (or one returning `record.key` of a record without a key)
    returned None, which counted as False: every such record was skipped and committed
    unhandled, and nothing said so. None fails the record into the failure policy."""
    fake = FakeConsumer()
    fake.produce_many("refunds", 0, range(4))
    fake.script_assign([REFUNDS])
    seen = _KeepsSeen()
    offsets = Offsets()

    def keyed_only(record: Record) -> bool:
        return None if record.offset == 1 else True  # type: ignore[return-value]

    block = FailurePolicy(retry=RetryPolicy(max_attempts=1), final="block")
    handler: Any = seen if batch else offsets.append_offset
    extra: dict[str, Any] = {"batch_max_records": 1} if batch else {}
    gc = start(
        members,
        GroupConsumer(
            routes={"refunds": Route(handler, filter=keyed_only, failure=block)},
            consumer_factory=fake.factory,
            **SETTINGS,
            **extra,
        ),
    )
    wait_until(lambda: gc.stats().blocked == (REFUNDS,), "refunds blocked at the filter's None")
    assert committed(fake, REFUNDS) == 1
    assert (seen.offsets if batch else offsets.offsets)[:1] == [0]
    [blocked] = events(caplog, "partition_blocked")
    assert blocked["event_id"] == "refunds/0/1"
    assert "keyed_only returned None for refunds/0/1" in blocked["error"], blocked


def test_a_pattern_routes_policy_covers_every_topic_it_matches() -> None:
    block = FailurePolicy(final="block")
    cfg = ConsumerConfig(
        **SETTINGS, topics=["orders", "^audit-.*"], failure_by_topic={"^audit-.*": block}
    )
    assert cfg.policy_for("audit-eu") == block
    assert cfg.policy_for("orders") == cfg.failure


def test_a_topic_two_patterns_match_takes_the_first_routes_policy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Routes are found by name, then by the first pattern given that matches. The policy was
    looked up apart, in `failure_by_topic`, where a pattern route without a policy of its own
    has no entry: `audit-eu-1`'s records went to the first route and failed into the second
    route's policy (here: dead-lettered instead of retried and stopped). And nothing said that
    two routes matched."""
    dead = FailurePolicy(final="dead_letter")
    block = FailurePolicy(final="block")
    gc = GroupConsumer(
        routes={
            re.compile("audit-.*"): lambda r: None,
            re.compile("audit-eu-.*"): Route(lambda r: None, failure=dead),
            re.compile("audit-eu-x$"): Route(lambda r: None, failure=block),
            "audit-eu-own": Route(lambda r: None, failure=block),
            "audit-eu-plain": lambda r: None,
            re.compile("billing-.*"): Route(lambda r: None, failure=dead),
            "billing-eu": lambda r: None,
        },
        consumer_factory=FakeConsumer().factory,
        **SETTINGS,
    )
    cfg = gc.config
    assert cfg.policy_for("audit-eu-1") == cfg.failure
    assert cfg.policy_for("audit-eu-x") == cfg.failure
    assert cfg.policy_for("audit-eu-own") == block
    # A route by name without a policy of its own: the member's, not a pattern route's.
    assert cfg.policy_for("audit-eu-plain") == cfg.failure
    assert cfg.policy_for("billing-eu") == cfg.failure
    assert cfg.policy_for("billing-us") == dead
    assert cfg.policy_for("other") == cfg.failure
    # The application's own entry for a pattern route is that route's policy, in its place:
    # it neither reaches a topic an earlier pattern takes nor hides that route's own.
    mine = FailurePolicy(final="block", retry=RetryPolicy(max_attempts=7))
    gc = GroupConsumer(
        routes={
            re.compile("audit-eu-.*"): Route(lambda r: None, failure=dead),
            re.compile("audit-.*"): lambda r: None,
        },
        failure_by_topic={"^audit-.*": mine},
        consumer_factory=FakeConsumer().factory,
        **SETTINGS,
    )
    assert gc.config.policy_for("audit-eu-1") == dead
    assert gc.config.policy_for("audit-us-1") == mine
    table = router(
        {re.compile("audit-.*"): lambda r: None, re.compile("audit-eu-.*"): lambda r: None}
    ).table
    with caplog.at_level(logging.WARNING, logger="weir"):
        found = table.find("audit-eu-1")
        table.find("audit-eu-1")  # once a topic
        table.find("audit-us-1")  # one pattern matches
    assert found is not None and found.key == re.compile("audit-.*")
    (event,) = events(caplog, "route_patterns_overlap")
    assert event["topic"] == "audit-eu-1"
    assert event["route"] == "re.compile('audit-.*')"
    assert event["also"] == ["re.compile('audit-eu-.*')"]


async def _async_filter(record: Record) -> bool:
    return False


async def _async_deserialize(data: bytes | None) -> bytes | None:
    return data


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


def test_async_routes_hold_max_batch_records_to_the_async_budget() -> None:
    """Regression: a member with routes checked `max_batch_records` against the default flow's
    headroom (200), not the async budget its routes run with (819), and refused 500."""
    member = GroupConsumer(routes={"orders": _async_seen}, **{**SETTINGS, "max_batch_records": 500})
    flow = member.config.flow
    assert member.config.max_batch_records == 500
    assert flow.capacity_records - flow.pause_records >= 500
    with pytest.raises(ValueError, match=r"larger than the flow headroom .* \(200\)"):
        GroupConsumer(routes={"orders": print}, **{**SETTINGS, "max_batch_records": 500})


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
    ({"routes": {"orders": Batch(), "refunds": print}}, TypeError,
     "the routes mix batch handlers and handlers of one record"),
    ({"routes": {"orders": Route(print, ordering="keys")}}, ValueError,  # type: ignore[arg-type]
     "route 'orders': ordering must be one of 'key', 'partition', 'unordered' or None"),
    ({"routes": {re.compile("a-.*"): Route(print, ordering=1)}}, ValueError,  # type: ignore[arg-type]
     "route re.compile('a-.*'): ordering must be one of"),
    ({"routes": {"orders": Route(print, filter=5)}}, TypeError,  # type: ignore[arg-type]
     "filter must be a function"),
    # Was accepted, and its coroutine, always true, kept every record.
    ({"routes": {"orders": Route(print, filter=_async_filter)}}, TypeError,  # type: ignore[arg-type]
     "route 'orders': filter must be a plain function returning True or False"),
    # Were accepted, and every record then failed on calling them.
    ({"routes": {"orders": Route(print, value_deserializer=5)}}, TypeError,  # type: ignore[arg-type]
     "route 'orders': value_deserializer must be a function from bytes to an object"),
    ({"routes": {"orders": Route(print, key_deserializer=_async_deserialize)}}, TypeError,
     "route 'orders': key_deserializer must be a plain function from bytes to an object: "
     "_async_deserialize is async def"),
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


# -- per-route ordering -------------------------------------------------------------------------


class Overlap:
    """Records in flight per lane (topic, partition, key): the most that ran at once per topic
    and per lane, and the order each lane's records started in. `meet`: a record of a topic in
    it waits (up to a few seconds) until that many of the topic's records are in flight, so
    records that may run side by side surely do, and records that may not show it by time."""

    def __init__(self, meet: dict[str, int] | None = None) -> None:
        self.lock = threading.Condition()
        self.meet = meet or {}
        self.topic_now: dict[str, int] = {}
        self.topic_max: dict[str, int] = {}
        self.lane_now: dict[tuple[str, int, bytes | None], int] = {}
        self.lane_max: dict[tuple[str, int, bytes | None], int] = {}
        self.started: dict[tuple[str, int, bytes | None], list[int]] = {}

    def enter(self, record: Record) -> tuple[str, int, bytes | None]:
        lane = (record.topic, record.partition, record.key)
        with self.lock:
            now = self.topic_now[record.topic] = self.topic_now.get(record.topic, 0) + 1
            self.topic_max[record.topic] = max(self.topic_max.get(record.topic, 0), now)
            n = self.lane_now[lane] = self.lane_now.get(lane, 0) + 1
            self.lane_max[lane] = max(self.lane_max.get(lane, 0), n)
            self.started.setdefault(lane, []).append(record.offset)
            self.lock.notify_all()
        return lane

    def leave(self, record: Record, lane: tuple[str, int, bytes | None]) -> None:
        with self.lock:
            self.topic_now[record.topic] -= 1
            self.lane_now[lane] -= 1

    def run(self, record: Record) -> None:
        lane = self.enter(record)
        try:
            meet = self.meet.get(record.topic)
            with self.lock:
                if meet is not None:
                    self.lock.wait_for(lambda: self.topic_max[record.topic] >= meet, timeout=1.0)
            time.sleep(0.002)  # long enough for a record that may not overlap to show it
        finally:
            self.leave(record, lane)

    def lane_most(self, topic: str) -> int:
        return max(n for (t, _, _), n in self.lane_max.items() if t == topic)


def test_routes_of_different_orderings_each_keep_their_own(members: list[GroupConsumer]) -> None:
    """`orders` in key order (the member's) and `audit-eu` unordered: a key's orders run one at
    a time in offset order while several keys run side by side, and audit records of one
    partition and one key run side by side."""
    fake = FakeConsumer()
    fake.produce_many("orders", 0, range(24), key=lambda o: b"k%d" % (o % 3))
    fake.produce_many("audit-eu", 0, range(8), key=b"same")
    fake.script_assign([ORDERS, AUDIT])
    seen = Overlap(meet={"orders": 2, "audit-eu": 3})
    gc = GroupConsumer(
        routes={"orders": seen.run, re.compile("audit-.*"): Route(seen.run, ordering="unordered")},
        consumer_factory=fake.factory,
        **SETTINGS,
        workers=4,
    )
    start(members, gc)
    wait_until(lambda: committed(fake, ORDERS) == 24, "orders committed", 20)
    wait_until(lambda: committed(fake, AUDIT) == 8, "audit committed", 20)
    assert gc.config.ordering == "key"
    assert seen.topic_max["audit-eu"] >= 3, "one key's audit records never ran side by side"
    assert seen.topic_max["orders"] >= 2, "orders of different keys never ran side by side"
    assert seen.lane_most("orders") == 1, "a key's orders ran side by side"
    for k in range(3):
        assert seen.started[("orders", 0, b"k%d" % k)] == list(range(k, 24, 3))


def test_a_partition_route_runs_one_record_at_a_time_beside_key_and_unordered_routes(
    members: list[GroupConsumer],
) -> None:
    """The member is unordered; `orders` asks for key order, `refunds` for partition order:
    each gets its own, and the unordered `audit-eu` still runs side by side."""
    fake = FakeConsumer()
    fake.produce_many("orders", 0, range(18), key=lambda o: b"k%d" % (o % 3))
    fake.produce_many("refunds", 0, range(12), key=lambda o: b"r%d" % o)
    fake.produce_many("audit-eu", 0, range(8), key=b"same")
    fake.script_assign([ORDERS, REFUNDS, AUDIT])
    seen = Overlap(meet={"orders": 2, "audit-eu": 3})
    gc = GroupConsumer(
        routes={
            "orders": Route(seen.run, ordering="key"),
            "refunds": Route(seen.run, ordering="partition"),
            re.compile("audit-.*"): seen.run,
        },
        consumer_factory=fake.factory,
        **SETTINGS,
        ordering="unordered",
        workers=4,
    )
    start(members, gc)
    for tp, end in ((ORDERS, 18), (REFUNDS, 12), (AUDIT, 8)):
        wait_until(lambda: committed(fake, tp) == end, f"{tp} committed", 20)  # noqa: B023
    assert seen.topic_max["refunds"] == 1, "a partition-ordered route ran records side by side"
    assert [o for (t, _, _), offs in seen.started.items() if t == "refunds" for o in offs] == list(
        range(12)
    )
    assert seen.lane_most("orders") == 1, "a key's orders ran side by side"
    assert seen.topic_max["orders"] >= 2
    assert seen.topic_max["audit-eu"] >= 3


def test_async_routes_of_different_orderings_each_keep_their_own(
    members: list[GroupConsumer],
) -> None:
    """The same on an event loop: a key's orders one at a time, one key's audit records at
    once."""
    fake = FakeConsumer()
    fake.produce_many("orders", 0, range(12), key=lambda o: b"k%d" % (o % 3))
    fake.produce_many("audit-eu", 0, range(8), key=b"same")
    fake.script_assign([ORDERS, AUDIT])
    seen = Overlap()

    async def run(record: Record) -> None:
        lane = seen.enter(record)
        try:
            deadline = time.monotonic() + 1.0
            while seen.topic_max[record.topic] < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.002)
        finally:
            seen.leave(record, lane)

    start(
        members,
        GroupConsumer(
            routes={"orders": run, "audit-eu": Route(run, ordering="unordered")},
            consumer_factory=fake.factory,
            **SETTINGS,
        ),
    )
    wait_until(lambda: committed(fake, ORDERS) == 12 and committed(fake, AUDIT) == 8, "all", 20)
    assert seen.topic_max["audit-eu"] >= 3, "one key's audit records never ran side by side"
    assert seen.topic_max["orders"] == 3 and seen.lane_most("orders") == 1
    for k in range(3):
        assert seen.started[("orders", 0, b"k%d" % k)] == list(range(k, 12, 3))


WARM = 300  # records that make the measured handler time small: later tasks hold many records


@pytest.mark.parametrize("member", ["key", "unordered"])
def test_a_failed_record_holds_what_its_routes_ordering_says(
    members: list[GroupConsumer], member: Ordering
) -> None:
    """A failure in the key-ordered route holds its key's later records until its retry ran;
    one in the unordered route holds nothing: records behind it run before its retry. Either
    route's ordering is the member's, the other its own. The handler is fast, so the records
    after the failed one share its task: the worker too must hold what the route says."""
    fake = FakeConsumer()
    order: list[tuple[str, int]] = []
    lock = threading.Lock()
    failed: set[tuple[str, int]] = set()

    def handle(record: Record) -> None:
        with lock:
            order.append((record.topic, record.offset))
            first = (record.topic, record.offset) not in failed
            if record.offset == WARM and first:
                failed.add((record.topic, record.offset))
                raise RuntimeError("once")

    retry = FailurePolicy(retry=RetryPolicy(max_attempts=2, backoff_initial_s=0.3, jitter=0.0))
    gc = GroupConsumer(
        routes={
            "orders": Route(handle, ordering=None if member == "key" else "key"),
            "audit-eu": Route(handle, ordering=None if member == "unordered" else "unordered"),
        },
        consumer_factory=fake.factory,
        **SETTINGS,
        ordering=member,
        failure=retry,
    )
    assert gc.config.ordering == member
    fake.script_assign([ORDERS, AUDIT])
    for tp in (ORDERS, AUDIT):
        fake.produce_many(tp.topic, 0, range(WARM), key=lambda o: b"k%d" % (o % 2))
    start(members, gc)
    wait_until(lambda: committed(fake, ORDERS) == committed(fake, AUDIT) == WARM, "warm", 20)
    end = WARM + 20
    for tp in (ORDERS, AUDIT):
        fake.produce_many(tp.topic, 0, range(WARM, end), key=lambda o: b"k%d" % (o % 2))
    wait_until(lambda: committed(fake, ORDERS) == committed(fake, AUDIT) == end, "all", 20)
    orders = [o for t, o in order if t == "orders"]
    audit = [o for t, o in order if t == "audit-eu"]
    # Key k0 waits for the retry of the failed record; nothing of it runs in between.
    k0 = [o for o in orders if o % 2 == 0]
    assert k0 == [*range(0, WARM + 1, 2), *range(WARM, end, 2)]
    # The unordered route's records of the same key ran before the failed one's retry.
    retried = len(audit) - 1 - audit[::-1].index(WARM)
    assert set(audit[audit.index(WARM) + 1 : retried]) == set(range(WARM + 1, end))


def test_a_pattern_routes_ordering_applies_to_every_topic_it_matches(
    members: list[GroupConsumer],
) -> None:
    table = router(
        {
            "orders": Route(print, ordering="partition"),
            re.compile("audit-.*"): Route(print, ordering="unordered"),
            "refunds": print,
        }
    ).table
    orderings = table.orderings("key")
    assert orderings.modes == {"key", "partition", "unordered"}
    of = orderings.of
    assert [of(t) for t in ("orders", "audit-eu", "audit-us", "refunds")] == [
        "partition",
        "unordered",
        "unordered",
        "key",
    ]
    # On a member: both audit topics (named in topics=, routed by the pattern) run unordered.
    fake = FakeConsumer()
    us = Partition("audit-us", 0)
    for tp in (AUDIT, us):
        fake.produce_many(tp.topic, 0, range(8), key=b"same")
    fake.script_assign([AUDIT, us])
    seen = Overlap(meet={"audit-eu": 3, "audit-us": 3})
    start(
        members,
        GroupConsumer(
            routes={"orders": print, re.compile("audit-.*"): Route(seen.run, ordering="unordered")},
            consumer_factory=fake.factory,
            **{**SETTINGS, "topics": ["orders", "audit-eu", "audit-us"]},
            workers=6,
        ),
    )
    for tp in (AUDIT, us):
        wait_until(lambda: committed(fake, tp) == 8, f"{tp} committed", 20)  # noqa: B023
        assert seen.topic_max[tp.topic] >= 3


def test_routes_of_one_ordering_make_it_the_members() -> None:
    gc = GroupConsumer(
        routes={
            "orders": Route(print, ordering="unordered"),
            "refunds": Route(print, ordering="unordered"),
        },
        consumer_factory=FakeConsumer().factory,
        **SETTINGS,
    )
    assert gc.config.ordering == "unordered" and gc._orderings is None
    gc = GroupConsumer(
        routes={"orders": Route(print, ordering="key"), "refunds": print},
        consumer_factory=FakeConsumer().factory,
        **SETTINGS,
        ordering="partition",
    )
    assert gc.config.ordering == "partition" and gc._orderings is not None


def test_a_member_of_mixed_orderings_shows_each_routes_in_its_repr_and_start_line(
    members: list[GroupConsumer], caplog: pytest.LogCaptureFixture
) -> None:
    """`config.ordering` is only the default of routes without one: the repr and the
    `consumer_started` line show each subscribed name's and pattern's."""
    caplog.set_level(logging.INFO, logger="weir")
    fake = FakeConsumer()
    fake.script_assign([ORDERS])
    gc = GroupConsumer(
        routes={
            "orders": print,
            "refunds": Route(print, ordering="key"),
            re.compile("audit-.*"): Route(print, ordering="unordered"),
        },
        consumer_factory=fake.factory,
        **SETTINGS,
        ordering="partition",
    )
    shown = {"orders": "partition", "refunds": "key", "^audit-.*": "unordered"}
    assert f"ordering='partition', orderings={shown!r}, state=" in repr(gc)
    start(members, gc)
    [started] = events(caplog, "consumer_started")
    assert started["ordering"] == "partition" and started["orderings"] == shown
    one = GroupConsumer(routes={"orders": print}, consumer_factory=fake.factory, **SETTINGS)
    assert "orderings" not in repr(one)


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


def test_a_retry_parks_the_partition_of_a_partition_ordered_route_only(
    members: list[GroupConsumer],
) -> None:
    """While a failed record waits for its retry, a partition-ordered route's partition is
    parked (paused, its records out of the budget's marks: nothing of it may run anyway); a
    key-ordered route's partition goes on fetching (its other keys run)."""
    fake = FakeConsumer()
    fake.produce_many("orders", 0, range(4), key=lambda o: b"k%d" % o)
    fake.produce_many("refunds", 0, range(4), key=lambda o: b"r%d" % o)
    fake.script_assign([ORDERS, REFUNDS])
    tried: set[tuple[str, int]] = set()

    def handle(record: Record) -> None:
        if record.offset == 1 and (record.topic, 1) not in tried:
            tried.add((record.topic, 1))
            raise RuntimeError("once")

    retry = FailurePolicy(retry=RetryPolicy(max_attempts=2, backoff_initial_s=1.0, jitter=0.0))
    gc = start(
        members,
        GroupConsumer(
            routes={"orders": handle, "refunds": Route(handle, ordering="partition")},
            consumer_factory=fake.factory,
            **SETTINGS,
            failure=retry,
        ),
    )

    def blocked() -> dict[Partition, bool]:
        return {p.tp: p.blocked for p in gc.stats().partitions}

    wait_until(lambda: len(tried) == 2, "both failed once")
    wait_until(lambda: blocked().get(REFUNDS), "the partition route's partition parked")
    assert blocked()[ORDERS] is False
    wait_until(lambda: committed(fake, ORDERS) == committed(fake, REFUNDS) == 4, "all", 10)
    wait_until(lambda: not any(blocked().values()), "unparked once its retry ran")


def test_a_rate_per_key_limits_the_key_ordered_routes_only(members: list[GroupConsumer]) -> None:
    """`max_records_per_s_per_key` with a key-ordered `orders` and a partition-ordered
    `refunds`, every record of one key: the orders keep to the key's rate, the refunds (no lane
    per key) run at full speed and in order. Planted: the split by key applied to the
    partition-ordered route parked its records in key lanes that nothing frees."""
    fake = FakeConsumer()
    fake.produce_many("orders", 0, range(40), key=b"hot")
    fake.produce_many("refunds", 0, range(40), key=b"hot")
    fake.script_assign([ORDERS, REFUNDS])
    done: list[tuple[str, int]] = []
    gc = GroupConsumer(
        routes={
            "orders": lambda r: done.append((r.topic, r.offset)),
            "refunds": Route(lambda r: done.append((r.topic, r.offset)), ordering="partition"),
        },
        consumer_factory=fake.factory,
        **SETTINGS,
        max_records_per_s_per_key=10.0,
    )
    start(members, gc)
    wait_until(lambda: committed(fake, REFUNDS) == 40, "every refund committed", 5)
    orders = [o for t, o in done if t == "orders"]
    assert len(orders) < 30, f"{len(orders)} orders of one key ran at once"
    assert [o for t, o in done if t == "refunds"] == list(range(40))


class BatchSeen(BatchHandler):
    """Each call's (topic, offset, deserialized value) list; raises on the offsets in `poison`
    (each once, or always with `always`)."""

    def __init__(self, poison: Sequence[int] = (), *, always: bool = False) -> None:
        self.calls: list[list[tuple[str, int, Any]]] = []
        self.poison = set(poison)
        self.always = always
        self.lock = threading.Lock()

    def _call(self, records: list[Record]) -> None:
        with self.lock:
            self.calls.append([(r.topic, r.offset, r.deserialized_value) for r in records])
        bad = self.poison & {r.offset for r in records}
        if bad:
            if not self.always:
                self.poison -= bad
            raise RuntimeError(f"poison {sorted(bad)}")

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        self._call(records)

    def handled(self) -> list[tuple[str, int, Any]]:
        with self.lock:
            return [r for call in self.calls for r in call]


class AsyncBatchSeen(BatchSeen):
    async def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        self._call(records)


BATCH_KINDS = {"handle_batch": BatchSeen, "async handle_batch": AsyncBatchSeen}


@pytest.mark.parametrize("kind", BATCH_KINDS)
def test_batch_routes_get_their_topics_records_with_their_deserializer_and_filter(
    members: list[GroupConsumer], kind: str
) -> None:
    fake = FakeConsumer()
    fake.produce_many("orders", 0, range(6), value=lambda o: json.dumps({"n": o}).encode())
    fake.produce_many("refunds", 0, range(6), value=lambda o: b"skip" if o % 2 else b"r")
    fake.script_assign([ORDERS, REFUNDS])
    orders, refunds = BATCH_KINDS[kind](), BATCH_KINDS[kind]()
    gc = start(
        members,
        GroupConsumer(
            routes={
                "orders": Route(orders, value_deserializer=json_deserializer()),
                "refunds": Route(refunds, filter=lambda r: r.value != b"skip"),
            },
            consumer_factory=fake.factory,
            **SETTINGS,
        ),
    )
    for tp in (ORDERS, REFUNDS):
        wait_until(lambda: committed(fake, tp) == 6, f"{tp} committed")  # noqa: B023
    assert sorted(orders.handled()) == [("orders", o, {"n": o}) for o in range(6)]
    # The filtered records count finished, unhandled; each call holds its own topic's only.
    assert sorted(refunds.handled()) == [("refunds", o, b"r") for o in (0, 2, 4)]
    assert all(t == "orders" for call in orders.calls for t, _, _ in call)
    assert gc.state is State.RUNNING


@pytest.mark.parametrize("kind", BATCH_KINDS)
def test_a_batch_route_that_raises_fails_its_records_alone(
    members: list[GroupConsumer], kind: str
) -> None:
    """One batch holds both routes' records (unordered, one worker, a long wait); the refunds
    route raises once: the orders records of that batch count finished, handled once, and only
    refunds run again."""
    fake = FakeConsumer()
    fake.produce_many("orders", 0, range(5))
    fake.produce_many("refunds", 0, range(5))
    fake.script_assign([ORDERS, REFUNDS])
    orders, refunds = BATCH_KINDS[kind](), BATCH_KINDS[kind](poison=[2])
    retry = FailurePolicy(retry=RetryPolicy(max_attempts=3, backoff_initial_s=0.01), final="block")
    gc = start(
        members,
        GroupConsumer(
            routes={"orders": orders, "refunds": refunds},
            consumer_factory=fake.factory,
            **{**SETTINGS, "ordering": "unordered", "workers": 1, "failure": retry,
               "batch_max_wait_s": 0.2},
        ),
    )  # fmt: skip
    for tp in (ORDERS, REFUNDS):
        wait_until(lambda: committed(fake, tp) == 5, f"{tp} committed")  # noqa: B023
    assert sorted(o for _, o, _ in orders.handled()) == list(range(5))  # once each
    again = [o for _, o, _ in refunds.handled()]
    assert set(again) == set(range(5)) and again.count(2) == 2
    assert gc.state is State.RUNNING and gc.stats().blocked == ()


def test_a_batch_route_that_does_not_deserialize_holds_its_keys_later_records(
    members: list[GroupConsumer],
) -> None:
    """Key mode: a record that does not deserialize fails alone and its key's later records
    wait for it, through the member's lanes bound into the route's deserializing wrapper."""
    fake = FakeConsumer()
    fake.produce_many("orders", 0, range(4), key=b"k", value=lambda o: b"{bad" if o == 1 else b"{}")
    fake.script_assign([ORDERS])
    orders = BatchSeen()
    gc = start(
        members,
        GroupConsumer(
            routes={"orders": Route(orders, value_deserializer=json_deserializer())},
            consumer_factory=fake.factory,
            **{**SETTINGS, "failure": FailurePolicy(final="block"), "batch_max_wait_s": 0.2},
        ),
    )
    wait_until(lambda: gc.stats().blocked == (ORDERS,), "orders blocked at the bad record")
    time.sleep(0.2)
    assert [o for _, o, _ in orders.handled()] == [0]  # 2 and 3 wait behind 1
    assert committed(fake, ORDERS) == 1
