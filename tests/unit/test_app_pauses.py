"""The application's pauses (`GroupConsumer.pause/resume`, `ctx.pause_partition`): a paused
partition is not fetched until resumed or its time is up, records already fetched still run,
and neither the app's pause nor weir's flow-control pauses lift the other's."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from tests.fake_members import SETTINGS
from tests.stepped import Stepped
from tests.waiting import wait_until

from weir import (
    BatchContext,
    BatchHandler,
    Context,
    GroupConsumer,
    Handler,
    Partition,
    Record,
    State,
)
from weir._engine.app_pauses import AppPauses
from weir._engine.fetching import FetchControl
from weir.testing.clock import ManualClock
from weir.testing.fake import FakeConsumer

pytestmark = pytest.mark.timeout(60)

TOPIC = "t"
P0, P1 = Partition(TOPIC, 0), Partition(TOPIC, 1)
WAIT = 10.0


@pytest.fixture
def stepped() -> Iterator[list[Stepped]]:
    made: list[Stepped] = []
    yield made
    for s in made:
        s.stop()


def started(stepped: list[Stepped], fake: FakeConsumer, handler: Any = None) -> Stepped:
    s = Stepped(fake, handler or (lambda r: None))
    stepped.append(s)
    return s


def fetched(fake: FakeConsumer, tp: Partition) -> int:
    return len(fake.delivered_offsets(tp))


def ask(s: Stepped, kind: str, *args: Any) -> bool:
    """A request as `GroupConsumer.pause/resume` sends it, served by the next turns."""
    future = s.life.request(kind, *args)
    s.step_until(future.done, f"{kind} served")
    return bool(future.result())


def test_a_paused_partition_is_not_fetched_until_resumed(stepped: list[Stepped]) -> None:
    fake = FakeConsumer()
    fake.script_assign([P0, P1])
    s = started(stepped, fake)
    s.step_until(lambda: s.engine.own.partitions.keys() == {P0, P1}, "assigned")
    assert ask(s, "pause", P0, None) is True
    assert P0 in fake.paused_set() and P1 not in fake.paused_set()
    fake.produce_many(TOPIC, 0, range(5))
    fake.produce_many(TOPIC, 1, range(5))
    s.step_until(lambda: fetched(fake, P1) == 5, "P1 fetched")
    s.steps(20)
    assert fetched(fake, P0) == 0
    assert s.engine.fetch.reason(P0) == "app"
    assert ask(s, "resume", P0) is True
    s.step_until(lambda: fetched(fake, P0) == 5, "P0 fetched after the resume")
    assert ask(s, "resume", P0) is False  # nothing left to resume


def test_a_pause_for_some_seconds_ends_by_itself(stepped: list[Stepped]) -> None:
    fake = FakeConsumer()
    fake.script_assign([P0])
    s = started(stepped, fake)
    s.step_until(lambda: P0 in s.engine.own.partitions, "assigned")
    assert ask(s, "pause", P0, 30.0) is True
    fake.produce_many(TOPIC, 0, range(3))
    s.clock.advance(29.0)
    s.steps(20)
    assert fetched(fake, P0) == 0 and P0 in fake.paused_set()
    s.clock.advance(1.5)
    s.step_until(lambda: fetched(fake, P0) == 3, "fetched once the 30 s are up")


def test_a_later_pause_of_the_same_partition_replaces_its_end(stepped: list[Stepped]) -> None:
    fake = FakeConsumer()
    fake.script_assign([P0])
    s = started(stepped, fake)
    s.step_until(lambda: P0 in s.engine.own.partitions, "assigned")
    ask(s, "pause", P0, 10.0)
    s.clock.advance(8.0)
    ask(s, "pause", P0, 10.0)  # a circuit breaker that trips again
    fake.produce_many(TOPIC, 0, range(3))
    s.clock.advance(8.0)
    s.steps(20)
    assert fetched(fake, P0) == 0
    s.clock.advance(3.0)
    s.step_until(lambda: fetched(fake, P0) == 3, "fetched once the second pause ended")


def test_a_paused_topic_holds_partitions_assigned_later_and_after_a_rebalance(
    stepped: list[Stepped],
) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3))
    fake.produce_many(TOPIC, 1, range(3))
    s = started(stepped, fake)
    assert ask(s, "pause", TOPIC, None) is False  # nothing of it owned yet
    fake.script_assign([P0, P1])
    s.step_until(lambda: s.engine.own.partitions.keys() == {P0, P1}, "assigned")
    s.steps(20)
    assert {P0, P1} <= fake.paused_set()
    assert fetched(fake, P0) == fetched(fake, P1) == 0
    fake.script_revoke([P1])
    s.step_until(lambda: P1 not in s.engine.own.partitions, "P1 revoked")
    fake.script_assign([P1])
    s.step_until(lambda: P1 in s.engine.own.partitions, "P1 back")
    s.steps(20)
    assert fetched(fake, P1) == 0 and P1 in fake.paused_set()
    # A partition's own resume does not lift its topic's pause.
    assert ask(s, "resume", P0) is False
    s.steps(20)
    assert fetched(fake, P0) == 0
    assert ask(s, "resume", TOPIC) is True
    s.step_until(lambda: fetched(fake, P0) == fetched(fake, P1) == 3, "both fetched")


class _Client:
    """The two calls fetch control makes, recorded."""

    def __init__(self) -> None:
        self.paused: set[Partition] = set()

    def pause(self, tps: Any) -> None:
        self.paused.update(Partition(t.topic, t.partition) for t in tps)

    def resume(self, tps: Any) -> None:
        self.paused.difference_update(Partition(t.topic, t.partition) for t in tps)

    def position(self, tps: Any) -> list[Any]:
        return []

    def list_topics(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_flow_control_and_the_app_do_not_lift_each_others_pauses() -> None:
    client = _Client()
    fetch = FetchControl(lambda: client, lambda tp: None)  # type: ignore[arg-type, return-value]
    pauses = AppPauses(fetch, lambda: [P0], ManualClock())
    fetch.hold([P0], "capacity")
    pauses.pause(P0, None)
    fetch.release([P0], "capacity")  # the budget has room again
    fetch.turn()
    assert P0 in client.paused and fetch.reason(P0) == "app"
    fetch.hold([P0], "capacity")
    pauses.resume(P0)
    fetch.turn()
    assert P0 in client.paused and fetch.reason(P0) == "capacity"
    fetch.release([P0], "capacity")
    fetch.turn()
    assert P0 not in client.paused


class Breaker(Handler):
    """Trips on a record whose value is b"down" the first time: pauses its partition, then
    fails it (its retry, after the pause, succeeds)."""

    def handle(self, record: Record, ctx: Context) -> None:
        if record.value == b"down" and ctx.attempt == 1:
            ctx.pause_partition(30.0)
            raise ConnectionError("the downstream is down")


class BatchBreaker(BatchHandler):
    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        for record in records:
            if record.value == b"down" and ctx.attempt(record) == 1:
                ctx.pause_partition(record, 30.0)
                ctx.fail(record, ConnectionError("the downstream is down"))


@pytest.mark.parametrize("handler", [Breaker(), BatchBreaker()], ids=["record", "batch"])
def test_a_handler_pauses_its_partition_as_a_circuit_breaker(
    stepped: list[Stepped], handler: Handler | BatchHandler
) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3), value=lambda off: b"down" if off == 1 else b"v")
    fake.script_assign([P0, P1])
    s = started(stepped, fake, handler)
    s.step_until(lambda: P0 in fake.paused_set(), "P0 paused by its handler")
    assert s.engine.fetch.reason(P0) == "app"
    fake.produce_many(TOPIC, 0, range(3, 6))
    fake.produce_many(TOPIC, 1, range(3))
    s.step_until(lambda: fetched(fake, P1) == 3, "P1 goes on")
    s.steps(20)
    assert max(fake.delivered_offsets(P0)) == 2  # nothing fetched after the trip
    s.clock.advance(31.0)
    s.step_until(lambda: 5 in fake.delivered_offsets(P0), "fetched again after 30 s")


BAD_PAUSES: list[tuple[Any, Any, type[Exception], str]] = [
    ("", None, ValueError, "a topic to pause must be a non-empty name"),
    (("t", -1), None, ValueError, "the partition number must not be negative"),
    (("t",), None, TypeError, "(topic, partition) tuple"),
    (b"t", None, TypeError, "(topic, partition) tuple"),
    ("t", 0, ValueError, "for_s must be more than 0 and finite, got 0"),
    ("t", -5.0, ValueError, "for_s must be more than 0"),
    ("t", math.nan, ValueError, "got nan"),
    ("t", math.inf, ValueError, "got inf"),
    ("t", "30", TypeError, "for_s must be seconds (a number) or None, got '30'"),
    ("t", True, TypeError, "got True"),
]


@pytest.mark.parametrize(("target", "for_s", "error", "said"), BAD_PAUSES)
def test_a_bad_pause_raises_in_the_caller_and_the_member_runs_on(
    members: list[GroupConsumer], target: Any, for_s: Any, error: type[Exception], said: str
) -> None:
    fake = FakeConsumer()
    fake.script_assign([P0])
    gc = GroupConsumer(lambda r: None, consumer_factory=fake.factory, **SETTINGS)
    members.append(gc)
    gc.start()
    assert gc.wait_started(WAIT)
    with pytest.raises(error) as info:
        gc.pause(target, for_s=for_s)
    assert said in str(info.value)
    assert gc.pause(P0, for_s=60).result(WAIT) is True
    assert gc.resume(("t", 0)).result(WAIT) is True
    fake.produce_many(TOPIC, 0, range(3))
    wait_until(lambda: fetched(fake, P0) == 3, "fetched after the good calls")
    assert gc.state is State.RUNNING and gc.failure is None
