"""Async handlers without a broker (the in-memory fake client): which handlers are async, where
their coroutines run, `max_in_flight`, failures, the blocked-loop watchdog, async hooks, and the
asyncio lifecycle (`run_async`, `async with`, `loop=`). Broker behaviour (revoke, lost, commits)
is in tests/integration/test_async_handlers.py."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

import pytest
from pydantic import ValidationError
from tests.fake_members import FAKE_LOOP
from tests.waiting import wait_until

from weir import (
    BatchContext,
    BatchHandler,
    CommitEvent,
    ConsumerConfig,
    Context,
    FlowConfig,
    GroupConsumer,
    Handler,
    HandlerError,
    Partition,
    Record,
    State,
)
from weir.testing import capture_events
from weir.testing.fake import FakeConsumer

pytestmark = pytest.mark.timeout(60)

TOPIC = "t"
P0 = (TOPIC, 0)
P1 = (TOPIC, 1)
WAIT = 5.0
SETTINGS: dict[str, Any] = dict(FAKE_LOOP)


def last_commit(fake: FakeConsumer, tp: tuple[str, int]) -> int | None:
    commits = fake.commits_for(tp)
    return commits[-1][0] if commits else None


def fake_with(records: dict[tuple[str, int], int], keys: int = 5) -> FakeConsumer:
    fake = FakeConsumer()
    for (topic, p), n in records.items():
        fake.produce_many(topic, p, range(n), key=lambda o: b"k%d" % (o % keys))
    fake.script_assign(list(records))
    return fake


class Seen:
    def __init__(self) -> None:
        self.offsets: list[tuple[int, int]] = []
        self.threads: set[str] = set()

    def add(self, r: Record) -> None:
        self.offsets.append((r.partition, r.offset))
        self.threads.add(threading.current_thread().name)


# -- which handlers are async, and where they run -----------------------------------------


class AsyncProbe(Handler):
    def __init__(self) -> None:
        self.seen = Seen()
        self.contexts: list[Context] = []

    async def handle(self, record: Record, ctx: Context) -> None:
        await asyncio.sleep(0)
        self.contexts.append(ctx)
        self.seen.add(record)


class AsyncCallable:
    def __init__(self) -> None:
        self.seen = Seen()

    async def __call__(self, record: Record) -> None:
        await asyncio.sleep(0)
        self.seen.add(record)


def async_function() -> tuple[Callable[[Record], Awaitable[None]], Seen]:
    seen = Seen()

    async def handle(record: Record) -> None:
        await asyncio.sleep(0)
        seen.add(record)

    return handle, seen


@pytest.mark.parametrize("kind", ["function", "callable", "handler"])
def test_async_handlers_of_every_kind_run_on_weirs_event_loop(
    members: list[GroupConsumer], kind: str
) -> None:
    """An `async def` function, a callable object with `async def __call__` and a `Handler`
    whose `handle` is `async def` are all chosen as async handlers: their coroutines run on the
    loop thread, every record is handled, and the commits reach the end."""
    fake = fake_with({P0: 30, P1: 30})
    handler: Any
    if kind == "function":
        handler, seen = async_function()
    elif kind == "callable":
        handler = AsyncCallable()
        seen = handler.seen
    else:
        handler = AsyncProbe()
        seen = handler.seen
    gc = GroupConsumer(handler, consumer_factory=fake.factory, **SETTINGS)
    members.append(gc)
    gc.start()
    wait_until(lambda: len(seen.offsets) == 60, "60 handled")
    wait_until(lambda: last_commit(fake, P0) == 30 and last_commit(fake, P1) == 30, "commits")
    gc.stop()
    gc.join(WAIT)
    assert sorted(seen.offsets) == [(p, o) for p in (0, 1) for o in range(30)]
    assert seen.threads == {"weir-loop"}
    if isinstance(handler, AsyncProbe):
        assert {c.attempt for c in handler.contexts} == {1}
        assert not any(c.cancelled for c in handler.contexts)
        assert handler.contexts[0].event_id.startswith("t/")


def test_max_in_flight_bounds_the_records_running_at_once(members: list[GroupConsumer]) -> None:
    fake = fake_with({P0: 200})
    running = [0, 0]

    async def handle(record: Record) -> None:
        running[0] += 1
        running[1] = max(running[1], running[0])
        await asyncio.sleep(0.002)
        running[0] -= 1

    gc = GroupConsumer(
        handle, consumer_factory=fake.factory, ordering="unordered", max_in_flight=7, **SETTINGS
    )
    members.append(gc)
    gc.start()
    wait_until(lambda: last_commit(fake, P0) == 200, "all committed")
    assert running[1] == 7


def test_a_failed_async_record_holds_its_key_and_the_member_commits_below_it(
    members: list[GroupConsumer],
) -> None:
    """Key mode: records of other keys go on past a failed record (a task's lanes run at once),
    records of its key do not, and the member stops with HandlerError after committing the
    watermark below the failure."""
    fake = fake_with({P0: 40}, keys=4)
    seen = Seen()
    boom = asyncio.Event()

    async def handle(record: Record) -> None:
        if record.offset == 5:  # key k1
            raise ValueError("poison")
        if record.key == b"k1" and record.offset > 5:
            boom.set()  # never: a later record of the failed key ran
        await asyncio.sleep(0)
        seen.add(record)

    gc = GroupConsumer(handle, consumer_factory=fake.factory, **SETTINGS)
    members.append(gc)
    gc.start()
    with pytest.raises(HandlerError) as info:
        gc.join(WAIT)
    assert info.value.record.offset == 5
    assert isinstance(info.value.__cause__, ValueError)
    assert not boom.is_set()
    assert last_commit(fake, P0) == 5
    assert {o for _, o in seen.offsets} >= {0, 1, 2, 3, 4}


def test_a_handler_that_blocks_the_event_loop_is_reported_by_name(
    members: list[GroupConsumer],
) -> None:
    """A synchronous sleep inside `async def` stops every coroutine on the loop: the watchdog
    warns while it lasts, naming the handler, and counts it in stats."""
    fake = fake_with({P0: 5})

    async def blocking_handler(record: Record) -> None:
        if record.offset == 2:
            time.sleep(0.6)  # the mistake: a blocking call on the loop

    with capture_events() as logs:
        gc = GroupConsumer(blocking_handler, consumer_factory=fake.factory, **SETTINGS)
        members.append(gc)
        gc.start()
        wait_until(lambda: last_commit(fake, P0) == 5, "all committed")
        wait_until(lambda: gc.stats().loop_blocked >= 1, "stats published")
    # Once per blocked spell (a starved machine may add a spell of its own: not asserted).
    blocked = [
        e
        for e in logs
        if e["event"] == "event_loop_blocked" and str(e["handler"]).endswith("blocking_handler")
    ]
    assert len(blocked) == 1, blocked
    assert "blocking_handler" in blocked[0]["where"]  # the innermost Python frame: time.sleep is C
    assert blocked[0]["log_level"] == "warning"
    assert blocked[0]["blocked_s"] >= 0.2


# -- hooks ---------------------------------------------------------------------------------


class AsyncHooks(Handler):
    def __init__(self, hang: bool = False) -> None:
        self.hang = hang
        self.calls: list[tuple[str, str]] = []

    async def handle(self, record: Record, ctx: Context) -> None:
        pass

    async def on_assigned(self, partitions: Sequence[Partition]) -> None:
        if self.hang:
            await asyncio.sleep(3600)
        self.calls.append(("assigned", threading.current_thread().name))

    async def on_revoked(self, partitions: Sequence[Partition]) -> None:
        self.calls.append(("revoked", threading.current_thread().name))

    async def on_shutdown(self) -> None:
        await asyncio.sleep(0)
        self.calls.append(("shutdown", threading.current_thread().name))


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "deserialized"])
def test_async_hooks_run_on_the_loop_and_the_owner_waits_for_them(
    members: list[GroupConsumer], wrapped: bool
) -> None:
    """`wrapped`: behind a value deserializer, whose wrapper once called the async hooks from
    plain methods: each coroutine was dropped unrun."""
    fake = fake_with({P0: 3})
    hooks = AsyncHooks()
    extra: dict[str, Any] = {"value_deserializer": bytes} if wrapped else {}
    gc = GroupConsumer(hooks, consumer_factory=fake.factory, **SETTINGS, **extra)
    members.append(gc)
    gc.start()
    wait_until(lambda: last_commit(fake, P0) == 3, "all committed")
    gc.stop()
    gc.join(WAIT)
    assert hooks.calls == [
        ("assigned", "weir-loop"),
        ("revoked", "weir-loop"),
        ("shutdown", "weir-loop"),
    ]


def test_an_async_hook_that_hangs_is_cut_off_and_the_member_goes_on(
    members: list[GroupConsumer],
) -> None:
    fake = fake_with({P0: 3})
    hooks = AsyncHooks(hang=True)
    with capture_events() as logs:
        gc = GroupConsumer(
            hooks, consumer_factory=fake.factory, **{**SETTINGS, "revoke_timeout_s": 0.3}
        )
        members.append(gc)
        gc.start()
        wait_until(lambda: last_commit(fake, P0) == 3, "all committed")
    failed = [e for e in logs if e["event"] == "callback_failed"]
    assert len(failed) == 1 and "did not finish within 0.3s" in failed[0]["error"]
    assert gc.stats().callback_failures == 1


# -- refusals ------------------------------------------------------------------------------


class SyncHandleAsyncHook(Handler):
    def handle(self, record: Record, ctx: Context) -> None:
        pass

    async def on_revoked(self, partitions: Sequence[Partition]) -> None:
        pass


def test_an_async_hook_on_a_thread_handler_is_refused() -> None:
    with pytest.raises(TypeError, match=r"SyncHandleAsyncHook.on_revoked is async def"):
        GroupConsumer(SyncHandleAsyncHook(), consumer_factory=FakeConsumer().factory, **SETTINGS)


def test_loop_is_refused_for_a_thread_handler() -> None:
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(TypeError, match="loop= runs async handlers"):
            GroupConsumer(lambda r: None, loop=loop, **SETTINGS)
    finally:
        loop.close()


def test_an_async_commit_listener_is_refused() -> None:
    handler, _ = async_function()
    gc = GroupConsumer(handler, consumer_factory=FakeConsumer().factory, **SETTINGS)

    async def listener(event: CommitEvent) -> None:
        pass

    with pytest.raises(TypeError, match="is async def"):
        gc.add_commit_listener(listener)  # type: ignore[arg-type]


def test_run_on_the_thread_of_the_handlers_loop_is_refused() -> None:
    """It would block the loop the handlers need, for ever."""
    handler, _ = async_function()

    async def main() -> None:
        gc = GroupConsumer(
            handler,
            consumer_factory=FakeConsumer().factory,
            loop=asyncio.get_running_loop(),
            **SETTINGS,
        )
        with pytest.raises(RuntimeError, match="run_async"):
            gc.run()

    asyncio.run(main())


# -- the asyncio lifecycle ------------------------------------------------------------------


def test_run_async_runs_handlers_on_the_callers_loop_and_cancelling_it_stops_gracefully() -> None:
    fake = fake_with({P0: 50})
    seen: list[int] = []
    loops: set[int] = set()

    async def handle(record: Record) -> None:
        loops.add(id(asyncio.get_running_loop()))
        await asyncio.sleep(0.001)
        seen.append(record.offset)

    async def main() -> GroupConsumer:
        gc = GroupConsumer(handle, consumer_factory=fake.factory, **SETTINGS)
        task = asyncio.create_task(gc.run_async())
        ticks = 0
        while len(seen) < 50:
            await asyncio.sleep(0.005)  # the loop is not blocked by the member
            ticks += 1
        assert ticks > 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert loops == {id(asyncio.get_running_loop())}
        return gc

    gc = asyncio.run(main())
    assert gc.state is State.STOPPED
    assert last_commit(fake, P0) == 50


def test_async_with_starts_and_stops_the_member_and_reraises_its_failure() -> None:
    fake = fake_with({P0: 10})

    async def handle(record: Record) -> None:
        if record.offset == 7:
            raise RuntimeError("poison")

    async def main() -> None:
        async with GroupConsumer(handle, consumer_factory=fake.factory, **SETTINGS) as gc:
            while gc.failure is None:
                await asyncio.sleep(0.005)

    with pytest.raises(HandlerError) as info:
        asyncio.run(main())
    assert info.value.record.offset == 7
    assert last_commit(fake, P0) == 7


def test_an_applications_loop_on_its_own_thread_runs_the_handlers(
    members: list[GroupConsumer],
) -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="app-loop", daemon=True)
    thread.start()
    try:
        fake = fake_with({P0: 20})
        handler, seen = async_function()
        gc = GroupConsumer(handler, consumer_factory=fake.factory, loop=loop, **SETTINGS)
        members.append(gc)
        gc.start()
        wait_until(lambda: last_commit(fake, P0) == 20, "all committed")
        gc.stop()
        gc.join(WAIT)
        assert seen.threads == {"app-loop"}
        assert loop.is_running(), "weir does not stop a loop it did not start"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(WAIT)
        loop.close()


def test_the_record_budget_of_async_handlers_scales_with_max_in_flight() -> None:
    """Left out, `flow` gets 16 records of budget per coroutine that may run at once (the byte
    marks unchanged); a `flow` given is kept as it is, and thread handlers keep the defaults."""
    handler, _ = async_function()
    gc = GroupConsumer(handler, **SETTINGS)
    assert (gc.config.flow.pause_records, gc.config.flow.resume_records) == (4096, 1638)
    assert gc.config.flow.capacity_records == 4915
    assert gc.config.flow.capacity_bytes == FlowConfig().capacity_bytes
    small = GroupConsumer(handler, max_in_flight=10, **SETTINGS)
    assert small.config.flow == FlowConfig()  # never below the thread defaults
    given = FlowConfig(capacity_records=60, pause_records=50, resume_records=10)
    assert GroupConsumer(handler, flow=given, **SETTINGS).config.flow == given
    assert GroupConsumer(lambda r: None, **SETTINGS).config.flow == FlowConfig()


def test_the_async_flow_is_validated_with_the_rest_of_the_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The flow an async handler's member runs with replaces the default after the settings
    were validated: every rule that reads the flow must hold for it too. No rule today can fail
    on the flow async_flow makes, so a smaller one stands in for a rule that one day might:
    max_batch_records=150 fits the default headroom of 200 and not this one's 100. The replacement
    used to be a model_copy, which validates nothing: the member was built."""
    small = FlowConfig(capacity_records=1100, pause_records=1000, resume_records=400)
    monkeypatch.setattr("weir.config.async_flow", lambda max_in_flight: small)
    monkeypatch.setattr("weir.consumer.async_flow", lambda max_in_flight: small, raising=False)
    handler, _ = async_function()
    with pytest.raises(ValidationError) as raised:
        GroupConsumer(handler, max_batch_records=150, **SETTINGS)
    assert [e["loc"] for e in raised.value.errors()] == [("max_batch_records",)]
    message = raised.value.errors()[0]["msg"]
    assert "max_batch_records (150) is larger than the flow headroom" in message
    assert "flow was not given, and an async handler's is async_flow(max_in_flight=256)" in message
    assert "pass flow=FlowConfig(...) to choose it" in message
    # Refused with a ConsumerConfig too, which was valid as built.
    config = ConsumerConfig(max_batch_records=150, **SETTINGS)
    with pytest.raises(ValidationError, match="async_flow"):
        GroupConsumer(handler, config)
    # Within the headroom it runs with that flow; a thread handler keeps the default.
    assert GroupConsumer(handler, max_batch_records=100, **SETTINGS).config.flow == small
    assert (
        GroupConsumer(lambda r: None, max_batch_records=150, **SETTINGS).config.flow == FlowConfig()
    )


def test_a_cancelled_error_of_the_handlers_own_is_a_failure_not_a_stall(
    members: list[GroupConsumer],
) -> None:
    """A handler that awaits a future someone else cancelled raises CancelledError although
    weir cancelled nothing: it fails the record (the member stops, commits below it) instead of
    leaving it unfinished for ever while the partition goes on."""
    fake = fake_with({P0: 6})

    async def handle(record: Record) -> None:
        if record.offset == 3:
            fut = asyncio.get_running_loop().create_future()
            fut.cancel()
            await fut

    gc = GroupConsumer(handle, consumer_factory=fake.factory, **SETTINGS)
    members.append(gc)
    gc.start()
    with pytest.raises(HandlerError) as info:
        gc.join(WAIT)
    assert info.value.record.offset == 3
    assert isinstance(info.value.__cause__, asyncio.CancelledError)
    assert last_commit(fake, P0) == 3


@pytest.mark.parametrize("finishes", [True, False], ids=["drained", "cancelled"])
def test_shutdown_drains_coroutines_in_flight_then_cancels_them(
    members: list[GroupConsumer], finishes: bool
) -> None:
    """stop(): a coroutine in flight that finishes within `shutdown_timeout_s` is waited for
    and committed past; one that does not is cancelled when the budget runs out (it saw
    `ctx.cancelled`), and the final commit stays below it."""
    fake = fake_with({P0: 5})
    entered = threading.Event()
    seen: list[tuple[str, bool]] = []

    class Slow(Handler):
        async def handle(self, record: Record, ctx: Context) -> None:
            if record.offset == 2:
                entered.set()
                try:
                    await asyncio.sleep(0.3 if finishes else 3600)
                except asyncio.CancelledError:
                    seen.append(("cancelled", ctx.cancelled))
                    raise
                seen.append(("finished", ctx.cancelled))

    gc = GroupConsumer(
        Slow(), consumer_factory=fake.factory, **{**SETTINGS, "shutdown_timeout_s": 1.0}
    )
    members.append(gc)
    gc.start()
    assert entered.wait(WAIT)
    wait_until(lambda: last_commit(fake, P0) == 2, "the records before it committed")
    t0 = time.monotonic()
    gc.stop()
    gc.join(WAIT)
    took = time.monotonic() - t0
    if finishes:
        assert seen == [("finished", False)]
        assert last_commit(fake, P0) == 5
        assert took < 1.0
    else:
        assert seen == [("cancelled", True)]
        assert last_commit(fake, P0) == 2
        assert 1.0 <= took < 3.0


def run_over_four_partitions(
    members: list[GroupConsumer],
    handler: Callable[[Record], Any],
    ordering: Literal["partition", "key"],
    *,
    keyed: bool = False,
) -> FakeConsumer:
    """60 records on each of 4 partitions (`keyed`: one key per partition), a budget of 20
    records, until every partition is committed to its end; the member is left running."""
    fake = FakeConsumer()
    parts = [(TOPIC, p) for p in range(4)]
    for _, p in parts:
        fake.produce_many(TOPIC, p, range(60), key=b"k%d" % p if keyed else None)
    fake.script_assign(parts)
    flow = FlowConfig(capacity_records=20, pause_records=10, resume_records=4, read_ahead_records=0)
    gc = GroupConsumer(
        handler,
        consumer_factory=fake.factory,
        ordering=ordering,
        max_batch_records=10,
        flow=flow,
        **SETTINGS,
    )
    members.append(gc)
    gc.start()
    for tp in parts:

        def at_end(tp: tuple[str, int] = tp) -> bool:
            return last_commit(fake, tp) == 60

        wait_until(at_end, f"{tp} committed to its end")
    return fake


def test_partition_mode_shares_the_budget_across_partitions_with_async_handlers(
    members: list[GroupConsumer],
) -> None:
    """Partition mode runs one record at a time per partition, so the budget must hold records
    of every partition, not of the one or two the client hands out first: the handler time
    measured on the loop (1 ms, summed per record, not a task's wall time) makes a partition's
    share worth sharing, and partitions are paused alone once they hold their share. Before,
    async partition mode never shared (a concurrent task is 500 records long) and ran 2.2k
    records/s on 16 partitions where 16k are possible (benchmarks/README.md)."""
    running: dict[int, int] = {}
    most = [0]

    async def handle(record: Record) -> None:
        running[record.partition] = running.get(record.partition, 0) + 1
        most[0] = max(most[0], sum(1 for n in running.values() if n))
        await asyncio.sleep(0.001)
        running[record.partition] -= 1

    fake = run_over_four_partitions(members, handle, "partition")
    single = [tps for op, tps in fake.pause_calls if op == "pause" and len(tps) == 1]
    assert single, "no partition was ever paused for holding its share"
    assert most[0] >= 3, f"at most {most[0]} partitions ran at once"


@pytest.mark.parametrize("kind", ["async", "thread"])
def test_the_budget_shared_event_of_an_async_member_names_no_workers(
    members: list[GroupConsumer], kind: str
) -> None:
    """Regression: an async member, which runs no worker threads, logged budget_shared with
    reason 'workers idle while the budget waits behind a few busy keys'."""

    async def handle_async(record: Record) -> None:
        await asyncio.sleep(0.001)

    def handle_thread(record: Record) -> None:
        time.sleep(0.001)

    with capture_events() as logs:
        # One key per partition: the budget fills with one partition's records, behind one key.
        run_over_four_partitions(
            members, handle_async if kind == "async" else handle_thread, "key", keyed=True
        )
    [shared] = [e for e in logs if e["event"] == "budget_shared"]
    if kind == "async":
        assert "worker" not in shared["reason"]
        assert shared["reason"] == (
            "fewer records run than max_in_flight allows while the budget waits behind a few "
            "busy keys"
        )
    else:
        assert shared["reason"] == "workers idle while the budget waits behind a few busy keys"


def test_workers_given_for_an_async_handler_is_reported_unused() -> None:
    handler, _ = async_function()
    with capture_events() as logs:
        GroupConsumer(handler, workers=32, **SETTINGS)
        GroupConsumer(handler, max_in_flight=32, **SETTINGS)
        GroupConsumer(lambda r: None, workers=32, **SETTINGS)
    unused = [e for e in logs if e["event"] == "workers_unused"]
    assert [(e["workers"], e["log_level"]) for e in unused] == [(32, "warning")]


def test_max_in_flight_given_for_a_thread_handler_is_reported_unused() -> None:
    """The mirror of `workers_unused`: a thread handler (one record or a batch a call) never
    reads `max_in_flight`, so setting it says nothing unless the member says so."""
    handler, _ = async_function()

    class Bulk(BatchHandler):
        def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
            pass

    with capture_events() as logs:
        GroupConsumer(lambda r: None, max_in_flight=32, **SETTINGS)
        GroupConsumer(Bulk(), max_in_flight=8, **SETTINGS)
        GroupConsumer(lambda r: None, workers=32, **SETTINGS)
        GroupConsumer(handler, max_in_flight=32, **SETTINGS)
    unused = [e for e in logs if e["event"] == "max_in_flight_unused"]
    assert [(e["max_in_flight"], e["log_level"]) for e in unused] == [
        (32, "warning"),
        (8, "warning"),
    ]
    assert unused[0]["reason"].endswith("workers bounds the records running at once")
    assert unused[1]["reason"].endswith("workers bounds the handle_batch calls running at once")


def test_async_records_feed_the_latency_histograms_and_each_partitions_recovery_time(
    members: list[GroupConsumer],
) -> None:
    """`stats()` sees the records of async handlers as it sees thread handlers': their
    handler latency, an end-to-end sample (the records carry a timestamp) and each partition's
    recovery time, from its first finished record."""
    fake = FakeConsumer()
    now_ms = int(time.time() * 1000)
    for p in (0, 1):
        for i in range(20):
            fake.produce(TOPIC, p, b"v%d" % i, b"k%d" % (i % 4), timestamp=now_ms)
    fake.script_assign([P0, P1])

    async def handle(record: Record) -> None:
        await asyncio.sleep(0.001)

    gc = GroupConsumer(handle, consumer_factory=fake.factory, **SETTINGS)
    members.append(gc)
    gc.start()
    wait_until(lambda: last_commit(fake, P0) == 20 and last_commit(fake, P1) == 20, "commits")
    wait_until(lambda: gc.stats().processed == 40, "40 in the stats")
    wait_until(lambda: gc.stats().handler_latency.count == 40, "their handler latency")
    st = gc.stats()
    assert st.end_to_end_latency.count >= 1
    assert [p.recovery_s is not None for p in st.partitions] == [True, True]


# -- an async handler that returns its work un-awaited --------------------------------------


async def _save(x: object) -> None:
    _SAVED.append(x)


_SAVED: list[object] = []


async def _returns_save(record: Record) -> object:
    return _save(record)  # the await left out


class _ReturnsSave(Handler):
    async def handle(self, record: Record, ctx: Context) -> object:  # type: ignore[override]
        return _save(record)


class _BatchReturnsSave(BatchHandler):
    async def handle_batch(  # type: ignore[override]
        self, records: list[Record], ctx: BatchContext
    ) -> object:
        return _save(records)


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("function", "_returns_save"),
        ("handle", "_ReturnsSave.handle"),
        ("handle_batch", "_BatchReturnsSave.handle_batch"),
        ("route", "_returns_save"),
        ("deserialized", "_returns_save"),
    ],
)
def test_an_async_handler_that_returns_a_coroutine_stops_the_member(
    members: list[GroupConsumer], kind: str, name: str
) -> None:
    """`return save(record)` in an `async def` handler (the await left out): the coroutine
    never ran, the record counted finished and was committed, and at most a RuntimeWarning
    said so. Its record fails, unretried, and the member stops, as a thread handler's does."""
    _SAVED.clear()
    fake = fake_with({P0: 3})
    settings = {k: v for k, v in SETTINGS.items() if k != "topics"}
    handler: Any = {
        "function": _returns_save,
        "handle": _ReturnsSave(),
        "handle_batch": _BatchReturnsSave(),
        "deserialized": _returns_save,
    }.get(kind)
    if kind == "route":
        gc = GroupConsumer(routes={TOPIC: _returns_save}, consumer_factory=fake.factory, **settings)
    else:
        extra: dict[str, Any] = {"value_deserializer": bytes} if kind == "deserialized" else {}
        gc = GroupConsumer(
            handler, consumer_factory=fake.factory, topics=[TOPIC], **settings, **extra
        )
    members.append(gc)
    gc.start()
    with pytest.raises(HandlerError) as info:
        gc.join(WAIT)
    assert f"async handler {name} (" in str(info.value), info.value
    assert "returned a coroutine instead of awaiting it" in str(info.value)
    assert _SAVED == []
    assert last_commit(fake, P0) in (None, 0)
