"""GroupConsumer's owner loop driven by the deterministic FakeConsumer.

These tests pin the engine's protocol with the client (what it commits, when, pause/resume,
rebalance hand-offs). The fake is a test helper: behaviour of Kafka itself is covered by the
integration tests on a real broker.
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Sequence
from typing import Any, Literal, Protocol, TypeVar

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from tests.consumer_overrides import Overrides
from tests.fake_members import SETTINGS
from tests.waiting import wait_until
from typing_extensions import TypedDict, Unpack

from weir import (
    BatchContext,
    BatchHandler,
    BrokerUnreachableError,
    CallbackError,
    CommitEvent,
    Context,
    FailurePolicy,
    FlowConfig,
    GroupConsumer,
    Handler,
    HandlerError,
    KafkaFatalError,
    OffsetResetError,
    Partition,
    Record,
    RetryPolicy,
    State,
)
from weir._engine import settlement as settlement_module
from weir._engine.budget import Budget
from weir._engine.engine import Engine
from weir._engine.lifecycle import Lifecycle
from weir._engine.scheduling import _TASK_SECONDS, Ordering
from weir.config import ConsumerSettings
from weir.errors import GeneratorReturned
from weir.records import HOOKS
from weir.testing.fake import CommitCall, FakeConsumer, FakeMessage

pytestmark = pytest.mark.timeout(60)

TOPIC = "t"
P0 = (TOPIC, 0)
P1 = (TOPIC, 1)
WAIT = 5.0

Key = tuple[tuple[str, int], int]


T = TypeVar("T")


def settle(fake: FakeConsumer, steps: int = 5) -> None:
    """Let the owner loop run `steps` more turns (each drains the completion queue)."""
    start = fake.consume_calls
    wait_until(lambda: fake.consume_calls >= start + steps, f"{steps} loop turns")


def events(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """weir's structured events among the captured records (`record.msg` is the event dict)."""
    return [dict(r.msg) for r in caplog.records if isinstance(r.msg, dict)]


def offsets_committed(fake: FakeConsumer, tp: tuple[str, int]) -> list[int]:
    return [off for off, _ in fake.commits_for(tp)]


class Probe(Handler):
    """A handler that records what ran, when, how concurrently, and can be scripted per record
    with `actions[(tp, offset)] = fn(record, ctx)` (run inside the handler)."""

    def __init__(self, lane: Callable[[Record], Hashable] | None = None) -> None:
        self.lock = threading.Lock()
        self.lane = lane or (lambda r: (r.topic, r.partition, r.key))
        # An action's return value is ignored: a lambda may return what its last call does.
        self.actions: dict[Key, Callable[[Record, Context], object]] = {}
        self.started: list[Key] = []
        self.finished: list[Key] = []
        self.records: list[Record] = []
        self.contexts: dict[Key, list[Context]] = defaultdict(list)
        self._entered: dict[Key, threading.Event] = {}
        self.running = 0
        self.max_running = 0
        self.running_by: dict[Hashable, int] = defaultdict(int)
        self.max_running_by: dict[Hashable, int] = defaultdict(int)
        self.running_by_tp: dict[tuple[str, int], int] = defaultdict(int)
        self.max_running_by_tp: dict[tuple[str, int], int] = defaultdict(int)
        self.assigned: list[list[Partition]] = []
        self.revoked: list[list[Partition]] = []
        self.lost: list[list[Partition]] = []
        self.shutdowns = 0
        self.hook_log: list[str] = []
        self.observe: Callable[[], None] | None = None
        self.delay = 0.0

    def entered(self, k: Key) -> threading.Event:
        with self.lock:
            ev = self._entered.get(k)
            if ev is None:
                ev = self._entered[k] = threading.Event()
            return ev

    def handle(self, record: Record, ctx: Context) -> None:
        tp = (record.topic, record.partition)
        k = (tp, record.offset)
        lane = self.lane(record)
        with self.lock:
            self.started.append(k)
            self.records.append(record)
            self.contexts[k].append(ctx)
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            self.running_by[lane] += 1
            self.max_running_by[lane] = max(self.max_running_by[lane], self.running_by[lane])
            self.running_by_tp[tp] += 1
            self.max_running_by_tp[tp] = max(self.max_running_by_tp[tp], self.running_by_tp[tp])
            action = self.actions.get(k)
        self.entered(k).set()
        try:
            if self.observe is not None:
                self.observe()
            if self.delay:
                time.sleep(self.delay)
            if action is not None:
                action(record, ctx)
        finally:
            with self.lock:
                self.running -= 1
                self.running_by[lane] -= 1
                self.running_by_tp[tp] -= 1
                self.finished.append(k)

    def on_assigned(self, partitions: Sequence[Partition]) -> None:
        self.assigned.append(list(partitions))
        self.hook_log.append("assigned")

    def on_revoked(self, partitions: Sequence[Partition]) -> None:
        self.revoked.append(list(partitions))
        self.hook_log.append("revoked")

    def on_lost(self, partitions: Sequence[Partition]) -> None:
        self.lost.append(list(partitions))
        self.hook_log.append("lost")

    def on_shutdown(self) -> None:
        self.shutdowns += 1
        self.hook_log.append("shutdown")

    # helpers for tests
    def did_start(self, k: Key) -> bool:
        with self.lock:
            return k in self.started

    def did_finish(self, k: Key) -> bool:
        with self.lock:
            return k in self.finished

    def started_offsets(self, tp: tuple[str, int]) -> list[int]:
        with self.lock:
            return [o for t, o in self.started if t == tp]

    def finished_count(self) -> int:
        with self.lock:
            return len(self.finished)


def gated(event: threading.Event) -> Callable[[Record, Context], None]:
    def action(record: Record, ctx: Context) -> None:
        if not event.wait(WAIT):
            raise TimeoutError("gate never opened")

    return action


def until_cancelled(
    seen: dict[Key, bool], then: Callable[[], None] | None = None
) -> Callable[[Record, Context], None]:
    def action(record: Record, ctx: Context) -> None:
        deadline = time.monotonic() + WAIT
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.002)
        seen[((record.topic, record.partition), record.offset)] = ctx.cancelled
        if then is not None:
            then()

    return action


class Quiet(TypedDict):
    commit_interval_s: float
    commit_every_records: int


QUIET: Quiet = {"commit_interval_s": 60.0, "commit_every_records": 1_000_000}
NO_RETRY = FailurePolicy(retry=RetryPolicy(max_attempts=1))
"""Today's stop policy with no retries: the first failure stops the member."""
"""No async commits at all: every commit the engine makes is a hand-off (sync) commit."""


class Launch(Protocol):
    """Starts a member on `fake` with SETTINGS and `overrides`; stopped after the test. The
    group has committed the first offset of every partition produced to so far (a group that
    ran before): the commits a test sees are its member's, not a new group's start commits
    (`weir._engine.starts`, tested in test_starts.py)."""

    def __call__(
        self,
        handler: Handler | Callable[[Record], object],
        fake: FakeConsumer,
        **overrides: Unpack[Overrides],
    ) -> GroupConsumer: ...


@pytest.fixture
def launch(members: list[GroupConsumer]) -> Launch:
    def go(
        handler: Handler | Callable[[Record], object],
        fake: FakeConsumer,
        **kw: Unpack[Overrides],
    ) -> GroupConsumer:
        settings: ConsumerSettings = {**SETTINGS, **kw}
        fake.given_committed()
        gc = GroupConsumer(handler, consumer_factory=fake.factory, **settings)
        members.append(gc)
        gc.start()
        assert gc.wait_started(WAIT)
        return gc

    return go


# -- watermark --------------------------------------------------------------------------------


def test_out_of_order_completion_commits_exactly_the_contiguous_prefix(launch: Launch) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(5))
    fake.script_assign([P0])
    probe = Probe()
    gates = {off: threading.Event() for off in range(5)}
    for off, ev in gates.items():
        probe.actions[(P0, off)] = gated(ev)
    gc = launch(probe, fake, ordering="unordered", workers=5)
    for off in range(5):
        wait_until(probe.entered((P0, off)).is_set, f"offset {off} running")
    # Release out of order; after each, the watermark is the first unfinished offset.
    for n, (off, expected) in enumerate([(4, 0), (2, 0), (0, 1), (1, 3), (3, 5)], start=1):
        gates[off].set()

        def processed(n: int = n) -> bool:
            return gc.stats().processed >= n

        wait_until(processed, f"{n} records processed")
        committed = offsets_committed(fake, P0)
        assert max(committed, default=0) == expected, (off, committed)
    sent = offsets_committed(fake, P0)
    assert sent == sorted(sent), sent  # never backwards
    assert set(sent) <= {0, 1, 3, 5}
    assert {1, 3, 5} <= set(sent)
    # An offset is sent again only with a new offset map (more finished above it).
    calls = [c for c in fake.commit_log() if P0 in c.offsets]
    for prev, cur in itertools.pairwise(calls):
        if prev.offsets[P0] == cur.offsets[P0]:
            assert prev.metadata.get(P0) != cur.metadata.get(P0), (prev, cur)


def _lane_task_held_at_1(launch: Launch) -> tuple[FakeConsumer, threading.Event, GroupConsumer]:
    """Partition mode, offsets 0-2 in one lane task (the handler time is first guessed at
    1 ms), offset 1 running until the returned gate is set."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3))
    fake.script_assign([P0])
    probe = Probe()
    gate = threading.Event()
    probe.actions[(P0, 1)] = gated(gate)
    gc = launch(probe, fake, ordering="partition", workers=2)
    wait_until(probe.entered((P0, 1)).is_set, "offset 1 running")
    return fake, gate, gc


def test_a_long_lane_task_moves_the_watermark_record_by_record(launch: Launch) -> None:
    """Partition mode hands a slow partition's records to one worker several at a time (the
    handler time is first guessed at 1 ms): each finished record still leaves the budget and
    moves the watermark at once, not when its task ends."""
    fake, gate, gc = _lane_task_held_at_1(launch)
    wait_until(lambda: 1 in offsets_committed(fake, P0), "commit of 1 while 1 runs")
    stats = gc.stats()
    assert stats.processed == 1 and stats.in_flight == 2
    gate.set()
    wait_until(lambda: 3 in offsets_committed(fake, P0), "committed to the end")
    wait_until(lambda: gc.stats().processed == 3, "3 processed")
    assert gc.stats().in_flight == 0
    sent = offsets_committed(fake, P0)
    assert sent == sorted(set(sent)), sent


def test_progress_is_read_only_once_a_task_has_run_a_while(
    launch: Launch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lane task of a slow handler comes back soon enough on its own: the owner reads its
    finished count only once it has run `_REPORT_AFTER` (reading 16 such counts every 5 ms was a
    tenth of the owner's time with 1 ms handlers)."""
    monkeypatch.setattr(settlement_module, "_REPORT_AFTER", 3600.0)
    fake, gate, gc = _lane_task_held_at_1(launch)
    time.sleep(20 * settlement_module._REPORT_WAIT)  # many report turns: none may read the count
    assert (gc.stats().processed, gc.stats().in_flight) == (0, 3)
    monkeypatch.setattr(settlement_module, "_REPORT_AFTER", 0.0)  # now it has run long enough
    wait_until(lambda: gc.stats().processed == 1, "offset 0 read while 1 runs")
    assert gc.stats().in_flight == 2
    gate.set()
    wait_until(lambda: 3 in offsets_committed(fake, P0), "committed to the end")


def test_a_failure_after_progress_keeps_what_was_reported(launch: Launch) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(4))
    fake.script_assign([P0])
    probe = Probe()
    gate = threading.Event()

    def fail(record: Record, ctx: Context) -> None:
        # Longer than the wait below: the commit of 2 must come while 2 still runs.
        gate.wait(3 * WAIT)
        raise RuntimeError("boom")

    probe.actions[(P0, 2)] = fail
    gc = launch(probe, fake, ordering="partition", workers=2, failure=NO_RETRY)
    wait_until(probe.entered((P0, 2)).is_set, "offset 2 running")
    wait_until(lambda: 2 in offsets_committed(fake, P0), "commit of 2 while 2 runs")
    gate.set()
    with pytest.raises(HandlerError):
        gc.join(WAIT)
    # 0 and 1 were reported before the failure and counted once; 3 never ran.
    assert gc.stats().processed == 2
    assert max(offsets_committed(fake, P0)) == 2
    assert [off for _, off in probe.started] == [0, 1, 2]


@pytest.mark.parametrize("fetch_chunk", [None, 2])
def test_gaps_in_offsets_never_block(launch: Launch, fetch_chunk: int | None) -> None:
    fake = FakeConsumer(fetch_chunk=fetch_chunk)
    offsets = [100, 103, 107, 108, 120, 135]
    fake.produce_many(TOPIC, 0, offsets, key=lambda o: bytes([o % 3]))
    fake.script_assign([P0])
    probe = Probe()
    launch(probe, fake)
    wait_until(lambda: 136 in offsets_committed(fake, P0), "commit of 136")
    assert sorted(probe.started_offsets(P0)) == offsets
    assert max(offsets_committed(fake, P0)) == 136


def test_trailing_transaction_markers_do_not_leave_the_watermark_behind(launch: Launch) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, [0, 1, 2])
    fake.produce_marker(TOPIC, 0)  # offset 3: a commit marker, never delivered
    fake.script_assign([P0])
    launch(Probe(), fake)
    wait_until(lambda: 4 in offsets_committed(fake, P0), "commit past the marker (4)")


def test_rewind_inside_an_assignment_never_moves_commits_backwards(launch: Launch) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(10))
    fake.script_assign([P0])
    probe = Probe()
    launch(probe, fake)
    wait_until(lambda: 10 in offsets_committed(fake, P0), "commit of 10")
    fake.rewind(P0, 5)  # the client re-delivers 5..9 (an offset reset or a seek)
    wait_until(lambda: len(probe.started_offsets(P0)) == 15, "re-delivered records processed")
    fake.produce_many(TOPIC, 0, [10, 11])
    wait_until(lambda: 12 in offsets_committed(fake, P0), "commit of 12")
    sent = offsets_committed(fake, P0)
    assert sent == sorted(sent), sent
    assert sorted(probe.started_offsets(P0)) == sorted([*range(12), *range(5, 10)])


# -- handler failure --------------------------------------------------------------------------


class Boom(Exception):
    pass


def failing_key_setup(probe: Probe) -> FakeConsumer:
    """Keys A@0 B@1 A@2 A@3 B@4 B@5; A@2 raises once B@1 has finished."""
    fake = FakeConsumer()
    keys = {0: b"A", 1: b"B", 2: b"A", 3: b"A", 4: b"B", 5: b"B"}
    fake.produce_many(TOPIC, 0, range(6), key=keys.__getitem__)
    fake.given_committed()
    fake.script_assign([P0])

    def fail(record: Record, ctx: Context) -> None:
        wait_until(lambda: probe.did_finish((P0, 1)), "B@1 finished")
        raise Boom("A@2 failed")

    probe.actions[(P0, 2)] = fail
    return fake


def check_failure_outcome(probe: Probe, fake: FakeConsumer, err: HandlerError) -> None:
    assert err.record.offset == 2
    assert err.record.key == b"A"
    assert isinstance(err.__cause__, Boom)
    # Nothing of lane A ran after the failed record.
    assert not probe.did_start((P0, 3))
    commits = fake.commit_log()
    # One final commit, at the failed offset: it will be processed again.
    assert [c.offsets for c in commits] == [{P0: 2}], commits
    assert fake.committed == {P0: 2}
    names = fake.call_names()
    assert names.index("commit") < names.index("close")
    assert names[-1] == "close"


def test_handler_exception_stops_the_member_and_join_raises(launch: Launch) -> None:
    probe = Probe()
    fake = failing_key_setup(probe)
    gc = launch(probe, fake, ordering="key", **QUIET)
    with pytest.raises(HandlerError) as info:
        gc.join(WAIT)
    check_failure_outcome(probe, fake, info.value)
    assert gc.failure is info.value


def test_handler_exception_is_raised_by_run(members: list[GroupConsumer]) -> None:
    probe = Probe()
    fake = failing_key_setup(probe)
    quiet: ConsumerSettings = {**SETTINGS, **QUIET}
    gc = GroupConsumer(probe, consumer_factory=fake.factory, **quiet)
    members.append(gc)
    with pytest.raises(HandlerError) as info:
        gc.run(handle_signals=False)
    check_failure_outcome(probe, fake, info.value)


# -- lost -------------------------------------------------------------------------------------


def test_lost_partition_is_never_committed_and_running_handlers_are_cancelled(
    launch: Launch,
) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(5), key=b"A")
    fake.produce_many(TOPIC, 1, range(3))
    fake.script_assign([P0, P1])
    probe = Probe()
    seen: dict[Key, bool] = {}

    def late_failure() -> None:
        raise Boom("failure of a record whose partition was lost")

    probe.actions[(P0, 0)] = until_cancelled(seen, then=late_failure)
    gc = launch(probe, fake)
    wait_until(probe.entered((P0, 0)).is_set, "P0@0 running")
    wait_until(lambda: 3 in offsets_committed(fake, P1), "P1 committed")
    before: list[int] = []
    lost = fake.script_lost([P0], before=lambda: before.append(len(fake.commit_log())))
    assert lost.done.wait(WAIT)
    wait_until(lambda: seen.get((P0, 0)), "ctx.cancelled seen by the running handler")
    wait_until(lambda: probe.did_finish((P0, 0)), "lost handler returned")
    fake.produce_many(TOPIC, 1, [3, 4])
    wait_until(lambda: 5 in offsets_committed(fake, P1), "P1 keeps committing")
    gc.stop()
    gc.join(WAIT)  # the late failure of the lost partition is not the member's failure
    after = fake.commit_log()[before[0] :]
    assert all(P0 not in c.offsets for c in after), after
    assert probe.started_offsets(P0) == [0]  # queued records of the lost partition never ran
    assert probe.lost == [[Partition(TOPIC, 0)]]
    assert all(Partition(TOPIC, 0) not in revoked for revoked in probe.revoked)


# -- revoke -----------------------------------------------------------------------------------


def test_revoke_drops_queued_waits_for_in_flight_and_commits_once_synchronously(
    launch: Launch,
) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(10), key=b"A")  # one lane: 1..9 are queued behind 0
    fake.produce_many(TOPIC, 1, range(2))
    fake.script_assign([P0, P1])
    probe = Probe()
    release = threading.Event()
    probe.actions[(P0, 0)] = gated(release)
    gc = launch(probe, fake, **QUIET)
    wait_until(probe.entered((P0, 0)).is_set, "P0@0 running")
    wait_until(lambda: probe.did_finish((P1, 1)), "P1 processed")
    timer = threading.Timer(0.15, release.set)
    revoke = fake.script_revoke([P0], before=timer.start)
    assert revoke.done.wait(WAIT)
    assert revoke.seconds is not None and revoke.seconds >= 0.1  # it waited for P0@0
    during = [c for c in fake.commit_log() if c.in_callback == "revoke"]
    assert len(during) == 1, during
    assert during[0].asynchronous is False
    assert during[0].offsets == {P0: 1}  # the finished watermark: only offset 0 ran
    assert probe.started_offsets(P0) == [0]
    assert probe.revoked == [[Partition(TOPIC, 0)]]
    assert probe.hook_log.count("revoked") == 1
    gc.stop()
    gc.join(WAIT)
    final = fake.commit_log()[-1]
    assert P0 not in final.offsets
    assert final.offsets == {P1: 2}
    assert sum(P0 in c.offsets for c in fake.commit_log()) == 1


def test_revoke_commits_the_watermark_synchronously_even_if_an_async_commit_is_unconfirmed(
    launch: Launch,
) -> None:
    """The hand-off commit must be confirmed before the partition moves. An async commit of the
    same offset that is still in flight is not a hand-off: if it fails, the next owner replays."""
    fake = FakeConsumer()
    fake.hold_commit_results = True
    fake.produce_many(TOPIC, 0, range(3))
    fake.script_assign([P0])
    probe = Probe()
    launch(probe, fake)
    wait_until(lambda: probe.finished_count() == 3, "the three records")
    wait_until(lambda: fake.pending_commit_seqs(), "an async commit in flight")
    assert fake.commit_log()[-1].asynchronous
    revoke = fake.script_revoke([P0])
    assert revoke.done.wait(WAIT)
    during = [c for c in fake.commit_log() if c.in_callback == "revoke"]
    assert [(c.offsets, c.asynchronous) for c in during] == [({P0: 3}, False)]


def finished_member(
    launch: Launch, records: int, **overrides: Unpack[Overrides]
) -> tuple[FakeConsumer, Probe, GroupConsumer]:
    """A member on P0 with no commit turns (QUIET) that finished all `records` records."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(records))
    fake.script_assign([P0])
    probe = Probe()
    quiet: Overrides = {**QUIET, **overrides}
    gc = launch(probe, fake, **quiet)
    wait_until(lambda: probe.finished_count() == records, f"{records} processed")
    return fake, probe, gc


def test_stop_commits_at_once_while_an_async_commit_waits_for_its_answer(
    launch: Launch,
) -> None:
    """The shutdown's commit is the partitions' last from this member: it goes whatever
    request is still waiting for its answer, and the stop waits for its own answer."""
    fake = FakeConsumer()
    fake.hold_commit_results = True
    fake.produce_many(TOPIC, 0, range(3))
    fake.script_assign([P0])
    probe = Probe()
    gc = launch(probe, fake)
    wait_until(lambda: probe.finished_count() == 3, "the three records")
    wait_until(lambda: fake.pending_commit_seqs(), "an async commit in flight")
    assert 3 not in offsets_committed(fake, P0)
    gc.stop()
    wait_until(lambda: 3 in offsets_committed(fake, P0), "3 sent by the stop")
    assert gc.state is not State.STOPPED  # waiting for the answer
    fake.deliver_commit_results([(seq, None) for seq in fake.pending_commit_seqs()])
    gc.join(WAIT)
    assert fake.committed.get(P0) == 3


def test_a_failed_final_commit_goes_again(launch: Launch) -> None:
    """A rebalance that ends while the stop waits fails its commit (ILLEGAL_GENERATION); sent
    again, it carries the new generation."""
    fake, _, gc = finished_member(launch, 3)
    fake.hold_commit_results = True
    gc.stop()
    wait_until(lambda: offsets_committed(fake, P0) == [3], "3 sent by the stop")
    generation = KafkaError(KafkaError.ILLEGAL_GENERATION, "the join ended")
    fake.deliver_commit_results([(fake.pending_commit_seqs()[0], generation)])
    wait_until(lambda: offsets_committed(fake, P0) == [3, 3], "3 sent again")
    fake.deliver_commit_results([(fake.pending_commit_seqs()[0], None)])
    gc.join(WAIT)
    assert fake.committed.get(P0) == 3


def test_the_final_commit_is_only_for_the_assignments_that_finished_the_work(
    launch: Launch,
) -> None:
    """A rebalance served while the stop waits for its commit's answer may revoke a partition
    and hand it back: the new assignment's committed offset may have moved on meanwhile (another
    member owned it), so the old assignment's offset is never sent for it again."""
    fake, _, gc = finished_member(launch, 3)
    fake.hold_commit_results = True
    gc.stop()
    wait_until(lambda: offsets_committed(fake, P0) == [3], "3 sent by the stop")
    assert fake.script_revoke([P0]).done.wait(WAIT)
    assert fake.script_assign([P0]).done.wait(WAIT)
    reassigned = len(fake.commit_log())
    fake.deliver_commit_results(
        [(fake.pending_commit_seqs()[0], KafkaError(KafkaError.REQUEST_TIMED_OUT))]
    )
    gc.join(WAIT)
    assert fake.commit_log()[reassigned:] == []


def test_the_final_commit_waits_for_its_answer_within_the_shutdown_budget(
    launch: Launch, caplog: pytest.LogCaptureFixture
) -> None:
    """Under the classic protocol a commit sent while the member's JoinGroup waits for the
    other members queues behind it: a synchronous one blocked the stop for the whole join (up
    to a dead member's session timeout, 42 s by default) and then failed. The stop's commit is
    asynchronous, its answer awaited within the shutdown budget."""
    join_ended = threading.Event()

    def behind_the_join(call: CommitCall) -> None:
        if not call.asynchronous:
            join_ended.wait(WAIT)  # a sync commit returns when the join ends
        return None

    fake, _, gc = finished_member(launch, 3, shutdown_timeout_s=0.3)
    fake.hold_commit_results = True  # an async commit's answer waits for the join's end too
    fake.commit_failure_if = behind_the_join
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="weir"):
        gc.stop()
        gc.join(WAIT)
    took = time.monotonic() - t0
    join_ended.set()
    assert took < 2.5, took  # the budget, and at least a second for the answer
    unanswered = [e for e in events(caplog) if e["event"] == "shutdown_commit_unanswered"]
    assert [e["offsets"] for e in unanswered] == [{"t[0]": 3}]


def test_revoke_honours_its_budget_when_a_handler_is_stuck(launch: Launch) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3), key=b"A")
    fake.script_assign([P0])
    probe = Probe()
    seen: dict[Key, bool] = {}
    probe.actions[(P0, 0)] = until_cancelled(seen)  # returns (DONE) only once cancelled
    budget = 0.3
    launch(probe, fake, revoke_timeout_s=budget)
    wait_until(probe.entered((P0, 0)).is_set, "P0@0 running")
    revoke = fake.script_revoke([P0])
    assert revoke.done.wait(WAIT)
    assert revoke.seconds is not None
    assert budget - 0.05 <= revoke.seconds <= budget + 0.35, revoke.seconds
    wait_until(lambda: seen.get((P0, 0)), "ctx.cancelled after the budget")
    wait_until(lambda: probe.did_finish((P0, 0)), "stuck handler returned")
    settle(fake)
    # Its late DONE moves nothing: offset 0 was never finished inside the assignment.
    assert max(offsets_committed(fake, P0), default=0) == 0
    assert probe.started_offsets(P0) == [0]


def test_a_reassigned_partition_waits_for_the_previous_assignments_running_call(
    launch: Launch, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler stuck past revoke_timeout_s, then its partition assigned back to the same
    member: the landed code started a second call on the same record (same key) while the first
    still ran, and the stuck call kept its worker for good. The new assignment's records of that
    lane now wait for the old call; its worker is replaced at once, so other partitions keep a
    full pool; and the new assignment's revoke does not wait for the old call."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, [0, 1], key=b"A")
    fake.produce_many(TOPIC, 1, range(20), key=b"B")
    fake.script_assign([P0])
    probe = Probe()
    stuck = threading.Event()
    calls: list[int] = []

    def first_call_stuck(record: Record, ctx: Context) -> None:
        calls.append(1)
        if len(calls) == 1:
            stuck.wait(WAIT)  # ignores cancellation

    probe.actions[(P0, 0)] = first_call_stuck
    budget = 0.5
    gc = launch(probe, fake, revoke_timeout_s=budget, workers=1)
    try:
        wait_until(probe.entered((P0, 0)).is_set, "P0@0 running")
        first = fake.script_revoke([P0])
        assert first.done.wait(WAIT)
        fake.script_assign([P0, P1])
        # The only worker is stuck in the old call: P1 runs on its replacement.
        wait_until(lambda: len(probe.started_offsets(P1)) == 20, "P1 processed")
        wait_until(lambda: gc.stats().workers_replaced == 1, "the stuck worker replaced")
        [replaced] = [e for e in events(caplog) if e["event"] == "worker_replaced"]
        assert (replaced["tp"], replaced["first_offset"]) == (f"{TOPIC}[0]", 0), replaced
        assert [r.levelno for r in caplog.records if r.name == "weir.workers"] == [logging.WARNING]
        assert calls == [1], "the record ran again while its first call was still running"
        assert probe.max_running_by[(TOPIC, 0, b"A")] == 1
        second = fake.script_revoke([P0])
        assert second.done.wait(WAIT)
        assert second.seconds is not None and second.seconds < budget / 2, second.seconds
        fake.script_assign([P0])
        stuck.set()
        wait_until(lambda: len(calls) == 2, "offset 0 handled by the newest assignment")
        wait_until(lambda: 2 in offsets_committed(fake, P0), "P0 committed to its end")
        assert probe.max_running_by[(TOPIC, 0, b"A")] == 1
    finally:
        stuck.set()


def test_stale_completion_never_moves_a_new_assignments_watermark(launch: Launch) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(2), key=b"A")
    fake.script_assign([P0])
    probe = Probe()
    old_release, new_release = threading.Event(), threading.Event()
    calls: list[int] = []

    def offset0(record: Record, ctx: Context) -> None:
        calls.append(1)
        (old_release if len(calls) == 1 else new_release).wait(WAIT)

    probe.actions[(P0, 0)] = offset0
    launch(probe, fake, revoke_timeout_s=0.2)
    wait_until(probe.entered((P0, 0)).is_set, "old P0@0 running")
    assert fake.script_revoke([P0]).done.wait(WAIT)
    n_before = len(fake.commit_log())
    fake.script_assign([P0])
    wait_until(lambda: len(calls) == 2, "new P0@0 running")
    old_release.set()  # the old assignment's record finishes now
    wait_until(lambda: probe.finished.count((P0, 0)) == 1, "old P0@0 returned")
    settle(fake)
    after = [c.offsets[P0] for c in fake.commit_log()[n_before:] if P0 in c.offsets]
    assert max(after, default=0) == 0, after
    new_release.set()
    wait_until(lambda: 2 in offsets_committed(fake, P0), "new assignment reaches 2")


# -- pause state across assignments -----------------------------------------------------------

SMALL_FLOW = {"capacity_records": 20, "pause_records": 10, "resume_records": 4}


def test_partition_assigned_while_flow_is_paused_gets_paused(launch: Launch) -> None:
    # The client pause happens at the capacity (20); between the high mark and the capacity the
    # loop only throttles, so 20 held records are needed to pause P0.
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(20))
    probe = Probe()
    hold = threading.Event()
    for off in range(20):
        probe.actions[(P0, off)] = gated(hold)
    fake.script_assign([P0])
    launch(
        probe,
        fake,
        ordering="unordered",
        workers=10,
        max_batch_records=10,
        flow=FlowConfig(**SMALL_FLOW),
    )
    wait_until(lambda: ("pause", (P0,)) in fake.pause_calls, "flow pause")
    fake.produce_many(TOPIC, 1, range(3))
    assert fake.script_assign([P1]).done.wait(WAIT)
    assert ("pause", (P1,)) in fake.pause_calls
    assert P1 in fake.paused_set()
    settle(fake)
    assert fake.delivered_offsets(P1) == []
    hold.set()
    wait_until(lambda: 3 in offsets_committed(fake, P1), "P1 processed after resume")
    calls = fake.pause_calls
    after = calls[calls.index(("pause", (P1,))) + 1 :]
    resumes = [tps for op, tps in after if op == "resume"]
    assert resumes and set(resumes[0]) == {P0, P1}


def test_partition_assigned_while_flow_is_running_gets_resumed(launch: Launch) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 1, range(3))
    fake.paused.add(P1)  # the client kept a pause flag from an earlier assignment
    fake.script_assign([P1])
    launch(Probe(), fake)
    wait_until(lambda: 3 in offsets_committed(fake, P1), "P1 processed")
    assert ("resume", (P1,)) in fake.pause_calls
    assert not any(op == "pause" for op, _ in fake.pause_calls)


# -- flow -------------------------------------------------------------------------------------


def test_in_flight_never_exceeds_capacity_and_pause_does_not_flap(launch: Launch) -> None:
    fake = FakeConsumer()
    n = 150
    fake.produce_many(TOPIC, 0, range(n))
    fake.produce_many(TOPIC, 1, range(n))
    fake.script_assign([P0, P1])
    probe = Probe()
    probe.delay = 0.0005
    lower_bound = [0]

    def observe() -> None:
        # delivered - finished by handlers <= the engine's own in-flight count
        with fake._lock:
            delivered = len(fake.delivered)
        lower_bound[0] = max(lower_bound[0], delivered - probe.finished_count())

    probe.observe = observe
    cap = SMALL_FLOW["capacity_records"]
    gc = launch(
        probe,
        fake,
        ordering="unordered",
        workers=8,
        max_batch_records=10,
        flow=FlowConfig(**SMALL_FLOW),
    )
    wait_until(lambda: probe.finished_count() == 2 * n, "all records processed")
    settle(fake)
    ops = [op for op, _ in fake.pause_calls]  # before shutdown, which may pause everything
    gc.stop()
    gc.join(WAIT)
    stats = gc.stats()
    assert stats.processed == 2 * n
    assert SMALL_FLOW["pause_records"] <= stats.peak_in_flight <= cap
    assert lower_bound[0] <= cap
    assert max(fake.requested) <= 10
    # The high mark throttles (counted in stats.throttles); the client is paused only at the
    # capacity (stats.pauses), at most once per throttle, and pause/resume strictly alternate:
    # no flapping.
    assert stats.throttles >= 1
    assert all(a != b for a, b in itertools.pairwise(ops)), ops
    assert ops.count("pause") == stats.pauses <= stats.throttles


def test_flow_counts_bytes_too(launch: Launch) -> None:
    kib = 1024
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(40), value=b"x" * (200 * kib))
    fake.script_assign([P0])
    probe = Probe()
    probe.delay = 0.002
    flow = {"capacity_bytes": 4096 * kib, "pause_bytes": 2048 * kib, "resume_bytes": 1024 * kib}
    max_batch_records = 5  # one consume call brings at most 1000 KiB
    gc = launch(
        probe,
        fake,
        ordering="unordered",
        workers=4,
        max_batch_records=max_batch_records,
        flow=FlowConfig(**flow),
    )
    wait_until(lambda: probe.finished_count() == 40, "all records processed")
    settle(fake)
    ops = [op for op, _ in fake.pause_calls]
    gc.stop()
    gc.join(WAIT)
    stats = gc.stats()
    assert stats.peak_in_flight < 20  # the count marks (1000) were never the reason
    assert stats.throttles >= 1
    assert flow["pause_bytes"] <= stats.peak_in_flight_bytes
    # Past the high mark records arrive one at a time, so the byte capacity is passed by at most
    # one record before the client pauses.
    assert stats.peak_in_flight_bytes <= flow["capacity_bytes"] + 200 * kib
    assert all(a != b for a, b in itertools.pairwise(ops)), ops


def test_one_slow_record_does_not_stall_other_keys_or_partitions(launch: Launch) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(6), key=lambda o: b"A" if o == 0 else b"B")
    fake.produce_many(TOPIC, 1, range(5), key=b"A")
    fake.script_assign([P0, P1])
    probe = Probe()
    release = threading.Event()
    probe.actions[(P0, 0)] = gated(release)
    launch(probe, fake, ordering="key", workers=2)
    wait_until(lambda: 5 in offsets_committed(fake, P1), "P1 fully committed")
    wait_until(lambda: all(probe.did_finish((P0, o)) for o in range(1, 6)), "P0 key B done")
    settle(fake)
    assert max(offsets_committed(fake, P0), default=0) == 0  # held by the slow A@0
    release.set()
    wait_until(lambda: 6 in offsets_committed(fake, P0), "P0 committed after the slow one")


# -- commit monotonicity ----------------------------------------------------------------------


def gated_run(
    launch: Launch, records: int
) -> tuple[FakeConsumer, Probe, dict[int, threading.Event], GroupConsumer]:
    """A member on P0 whose records (one key) each wait for their gate. Record 0 is let through
    and its commit confirmed; from then on the fake holds commit results until the test
    delivers them (`deliver_commit_results`)."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(records), key=b"A")
    fake.script_assign([P0])
    probe = Probe()
    gates = {off: threading.Event() for off in range(records)}
    for off, ev in gates.items():
        probe.actions[(P0, off)] = gated(ev)
    gc = launch(probe, fake)
    gates[0].set()
    wait_until(
        lambda: fake.committed.get(P0) == 1 and not fake.pending_commit_seqs(), "1 committed"
    )
    fake.hold_commit_results = True
    return fake, probe, gates, gc


def test_one_async_commit_waits_for_its_answer_before_the_next_is_sent(launch: Launch) -> None:
    """Under the classic protocol a member's commits queue behind its own JoinGroup while a
    rebalance waits for the other members, and all fail when it ends (docs/rebalances.md): a
    commit turn sends nothing while an earlier request has no answer, and the turn after the
    answer sends the newest offset."""
    fake, probe, gates, _ = gated_run(launch, 3)
    gates[1].set()
    wait_until(lambda: 2 in offsets_committed(fake, P0), "the commit of 2")
    gates[2].set()
    wait_until(lambda: probe.did_finish((P0, 2)), "P0@2 finished")
    settle(fake, steps=20)  # many commit turns, each due (a commit after every record)
    assert offsets_committed(fake, P0)[-1] == 2
    fake.deliver_commit_results([(seq, None) for seq in fake.pending_commit_seqs()])
    wait_until(lambda: offsets_committed(fake, P0)[-1] == 3, "3 sent once 2 was answered")


def test_the_assign_callback_sends_the_unconfirmed_watermark_at_once(launch: Launch) -> None:
    """A classic rebalance fails the commit requests a member sent while its JoinGroup waited
    for the other members: the assign callback that ends it sends what the kept partitions
    finished, not the turn after the failed answers come back."""
    fake, probe, gates, _ = gated_run(launch, 3)
    gates[1].set()
    wait_until(lambda: 2 in offsets_committed(fake, P0), "the commit of 2")
    gates[2].set()
    wait_until(lambda: probe.did_finish((P0, 2)), "P0@2 finished")
    assign = fake.script_assign([P1])
    assert assign.done.wait(WAIT)
    during = [(c.offsets, c.asynchronous) for c in fake.commit_log() if c.in_callback == "assign"]
    assert during == [({P0: 3}, True)]


def test_commits_stay_monotonic_with_failing_async_results(launch: Launch) -> None:
    fake, probe, gates, gc = gated_run(launch, 4)

    def sent(offset: int, times: int = 1) -> int:
        """The seq of the `times`-th commit of `offset`."""
        return wait_until(
            lambda: ([c.seq for c in fake.commit_log() if c.offsets.get(P0) == offset] + [0] * 2)[
                times - 1
            ],
            f"commit #{times} of {offset}",
        )

    timeout = KafkaError(KafkaError.REQUEST_TIMED_OUT, "late failure")
    gates[1].set()
    s2 = sent(2)
    gates[2].set()
    wait_until(lambda: probe.did_finish((P0, 2)), "P0@2 finished")
    # The answer to 2 fails: the next request carries everything finished since, never below.
    fake.deliver_commit_results([(s2, timeout)])
    fake.deliver_commit_results([(sent(3), None)])
    wait_until(lambda: any(p.committed == 3 for p in gc.stats().partitions), "3 confirmed in stats")
    # The newest fails while nothing newer exists: it must be sent again, never below.
    gates[3].set()
    fake.deliver_commit_results([(sent(4), timeout)])
    fake.deliver_commit_results([(sent(4, times=2), None)])
    wait_until(lambda: any(p.committed == 4 for p in gc.stats().partitions), "4 confirmed in stats")
    sent_offsets = offsets_committed(fake, P0)
    assert sent_offsets[sent_offsets.index(2) :] == [2, 3, 4, 4], sent_offsets


def test_failed_async_commit_is_retried_while_idle(launch: Launch) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3))
    fake.script_assign([P0])
    fake.commit_failure_if = lambda call: (
        KafkaError(KafkaError.REQUEST_TIMED_OUT) if len(fake.commits) <= 3 else None
    )
    launch(Probe(), fake)
    wait_until(lambda: fake.committed.get(P0) == 3, "3 committed after failures")


# -- ordering ---------------------------------------------------------------------------------


def test_key_order_holds_per_key_and_keys_run_in_parallel(launch: Launch) -> None:
    fake = FakeConsumer()
    keys = [b"A", b"B", b"C"]
    fake.produce_many(TOPIC, 0, range(60), key=lambda o: keys[o % 3])
    fake.script_assign([P0])
    probe = Probe()
    probe.delay = 0.001
    both = threading.Barrier(2, timeout=WAIT)

    def meet(record: Record, ctx: Context) -> None:
        both.wait()  # A@0 and B@1 must be running at the same time

    probe.actions[(P0, 0)] = meet
    probe.actions[(P0, 1)] = meet
    gc = launch(probe, fake, ordering="key", workers=4)
    wait_until(lambda: 60 in offsets_committed(fake, P0), "all committed")
    gc.stop()
    gc.join(WAIT)
    for i, k in enumerate(keys):
        order = [r.offset for r in probe.records if r.key == k]
        assert order == list(range(i, 60, 3))
        assert probe.max_running_by[(TOPIC, 0, k)] == 1
    assert probe.max_running >= 2


def test_partition_mode_runs_one_record_at_a_time_per_partition(launch: Launch) -> None:
    fake = FakeConsumer()
    for p in (0, 1):
        fake.produce_many(TOPIC, p, range(20), key=lambda o: bytes([o]))  # all keys distinct
    fake.script_assign([P0, P1])
    probe = Probe()
    probe.delay = 0.001
    both = threading.Barrier(2, timeout=WAIT)

    def meet(record: Record, ctx: Context) -> None:
        both.wait()  # the two partitions run in parallel

    probe.actions[(P0, 0)] = meet
    probe.actions[(P1, 0)] = meet
    gc = launch(probe, fake, ordering="partition", workers=6)
    wait_until(
        lambda: 20 in offsets_committed(fake, P0) and 20 in offsets_committed(fake, P1),
        "both partitions committed",
    )
    gc.stop()
    gc.join(WAIT)
    for tp in (P0, P1):
        assert probe.started_offsets(tp) == list(range(20))
        assert probe.max_running_by_tp[tp] == 1


def test_unordered_mode_runs_one_key_in_parallel(launch: Launch) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3), key=b"same")
    fake.script_assign([P0])
    probe = Probe()
    three = threading.Barrier(3, timeout=WAIT)
    for off in range(3):
        probe.actions[(P0, off)] = lambda r, c: three.wait()
    gc = launch(probe, fake, ordering="unordered", workers=3)
    wait_until(lambda: 3 in offsets_committed(fake, P0), "all committed")
    gc.stop()
    gc.join(WAIT)


# -- lifecycle --------------------------------------------------------------------------------


def test_stop_makes_a_final_commit_then_unsubscribes_and_closes(launch: Launch) -> None:
    fake, probe, gc = finished_member(launch, 5)
    assert fake.commit_log() == []
    gc.stop()
    gc.join(WAIT)
    commits = fake.commit_log()
    assert [c.offsets for c in commits] == [{P0: 5}]
    assert fake.committed == {P0: 5}
    names = fake.call_names()
    assert names.index("commit") < names.index("unsubscribe") < names.index("close")
    assert names[-1] == "close"
    assert fake.closed
    assert probe.shutdowns == 1
    # The fake revokes the assignment inside close(), as the client does: on_shutdown is last.
    assert probe.hook_log[-2:] == ["revoked", "shutdown"]
    assert gc.stats().running is False


def stop_with_a_cancel_aware_handler(launch: Launch) -> tuple[FakeConsumer, Probe, float, bool]:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3), key=b"A")
    fake.script_assign([P0])
    probe = Probe()
    seen: dict[Key, bool] = {}
    probe.actions[(P0, 1)] = until_cancelled(seen)  # gives up (returns) once cancelled
    gc = launch(probe, fake, shutdown_timeout_s=0.3, **QUIET)
    wait_until(probe.entered((P0, 1)).is_set, "P0@1 running")
    t0 = time.monotonic()
    gc.stop()
    gc.join(WAIT)
    seconds = time.monotonic() - t0
    # join() returns within the budget, right after the cancel flag is set: give the handler
    # thread its moment to notice and report.
    wait_until(lambda: (P0, 1) in seen, "the handler of P0@1 to return")
    return fake, probe, seconds, seen.get((P0, 1)) is True


def test_stop_honours_the_shutdown_budget_and_cancels_running_handlers(launch: Launch) -> None:
    fake, probe, seconds, cancelled = stop_with_a_cancel_aware_handler(launch)
    assert seconds < 0.3 + 0.4
    assert cancelled
    assert probe.started_offsets(P0) == [0, 1]  # nothing dispatched after stop()
    assert fake.commit_log()[0].offsets == {P0: 1}  # the final commit stops below P0@1


def test_record_given_up_at_shutdown_is_never_committed(launch: Launch) -> None:
    """`ctx.cancelled` says the result will be discarded, so a handler may return early without
    finishing. Returning must then not count as done: committing past P0@1 would lose it. The
    client serves the final revoke inside close(), after the handler gave up."""
    fake, _, _, cancelled = stop_with_a_cancel_aware_handler(launch)
    assert cancelled
    assert max(offsets_committed(fake, P0)) == 1, fake.commit_log()


def test_stop_with_a_handler_ignoring_cancellation_returns_within_the_shutdown_budget(
    launch: Launch,
) -> None:
    """The whole shutdown (drain, final commit, leaving the group, the final revoke the client
    serves inside close()) shares one budget: a stuck handler must not add a second one."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(2))
    fake.script_assign([P0])
    probe = Probe()
    stuck = threading.Event()
    probe.actions[(P0, 1)] = gated(stuck)
    budget = 0.3
    gc = launch(probe, fake, shutdown_timeout_s=budget, revoke_timeout_s=1.5, **QUIET)
    try:
        wait_until(probe.entered((P0, 1)).is_set, "P0@1 running")
        t0 = time.monotonic()
        gc.stop()
        gc.join(WAIT)
        assert time.monotonic() - t0 < budget + 0.4
    finally:
        stuck.set()


def test_unreachable_broker_fails_fast(members: list[GroupConsumer]) -> None:
    fake = FakeConsumer()
    fake.unreachable = KafkaException(KafkaError(KafkaError._TRANSPORT, "connection refused"))
    gc = GroupConsumer(Probe(), consumer_factory=fake.factory, **SETTINGS)
    members.append(gc)
    t0 = time.monotonic()
    gc.start()
    with pytest.raises(BrokerUnreachableError, match=r"fake:9092"):
        gc.join(WAIT)
    assert time.monotonic() - t0 < 1.0
    assert "subscribe" not in fake.call_names()
    assert fake.closed


def test_unreachable_broker_raises_from_run() -> None:
    fake = FakeConsumer()
    fake.unreachable = KafkaException(KafkaError(KafkaError._TRANSPORT, "connection refused"))
    gc = GroupConsumer(Probe(), consumer_factory=fake.factory, **SETTINGS)
    with pytest.raises(BrokerUnreachableError):
        gc.run(handle_signals=False)


class _SilentCluster(FakeConsumer):
    """No broker answers: a metadata request waits its whole timeout, as the real client's
    does when its broker is down or unreachable, then fails."""

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self._record("list_topics", timeout)
        time.sleep(max(timeout, 0))
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "no broker answered"))


@pytest.mark.parametrize("how", ["stop", "run"])
def test_a_stop_while_the_member_waits_for_a_broker_ends_the_wait(
    members: list[GroupConsumer], how: str
) -> None:
    """No broker answering at start: the member waited all of startup_timeout_s (30 s by
    default) before it looked at a stop request, so Ctrl-C at a member that could not reach
    its broker did nothing for half a minute, then it raised BrokerUnreachableError. A stop
    ends the wait within one of its slices, and the member stops as asked: no error."""
    fake = _SilentCluster()
    settings: Any = {**SETTINGS, "startup_timeout_s": 30.0}
    gc = GroupConsumer(Probe(), consumer_factory=fake.factory, **settings)
    members.append(gc)
    if how == "stop":
        gc.start()
        wait_until(lambda: "list_topics" in fake.call_names(), "waiting for a broker")
        t0 = time.monotonic()
        gc.stop()
        gc.join(WAIT)
    else:  # a signal handler's request, from another thread here
        stop = threading.Timer(0.3, gc.stop)
        stop.start()
        t0 = time.monotonic() + 0.3
        gc.run(handle_signals=False)
    assert time.monotonic() - t0 < 1.5
    assert gc.state is State.STOPPED
    assert "subscribe" not in fake.call_names()
    assert fake.closed


def test_fatal_client_error_stops_the_member(launch: Launch) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(2))
    fake.script_assign([P0])
    probe = Probe()
    gc = launch(probe, fake, **QUIET)
    wait_until(lambda: probe.finished_count() == 2, "processed")
    fake.raise_error_cb(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    with pytest.raises(KafkaFatalError):
        gc.join(WAIT)
    assert fake.closed


def test_non_fatal_consume_errors_are_skipped(launch: Launch) -> None:
    fake = FakeConsumer()
    fake.inject_error(KafkaError(KafkaError._MAX_POLL_EXCEEDED, "poll interval exceeded"))
    fake.produce_many(TOPIC, 0, range(3))
    fake.script_assign([P0])
    gc = launch(Probe(), fake)
    wait_until(lambda: 3 in offsets_committed(fake, P0), "processed after the error")
    assert gc.failure is None


@pytest.mark.parametrize(
    ("settings", "incremental"),
    [
        ({"assignment_strategy": "range"}, False),
        ({"assignment_strategy": "cooperative-sticky"}, True),
        ({"group_protocol": "consumer"}, True),
    ],
)
def test_assign_uses_the_protocols_family(
    launch: Launch, settings: Overrides, incremental: bool
) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(2))
    fake.produce_many(TOPIC, 1, range(2))
    fake.script_assign([P0, P1])
    probe = Probe()
    gc = launch(probe, fake, **settings)
    wait_until(lambda: 2 in offsets_committed(fake, P1), "P1 processed")
    if incremental:
        assert fake.script_revoke([P0]).done.wait(WAIT)
    else:  # eager: everything is revoked, then everything handed out again
        assert fake.script_revoke([P0, P1]).done.wait(WAIT)
        assert fake.script_assign([P1]).done.wait(WAIT)
    fake.produce_many(TOPIC, 1, [2])
    wait_until(lambda: 3 in offsets_committed(fake, P1), "P1 goes on")
    names = fake.call_names()
    assert ("incremental_assign" in names) is incremental
    assert ("assign" in names) is not incremental
    assert gc.failure is None
    assert fake.assignment_set() == {P1}


def test_records_carry_the_message_fields(launch: Launch) -> None:
    fake = FakeConsumer()
    fake.produce(
        TOPIC,
        0,
        b"value",
        b"key",
        offset=7,
        headers=[("h1", b"xy"), ("h2", None)],
        timestamp=1_700_000_000_000,
        leader_epoch=3,
    )
    fake.produce(TOPIC, 0, None, None, offset=8)
    fake.script_assign([P0])
    probe = Probe()
    launch(probe, fake)
    wait_until(lambda: probe.finished_count() == 2, "processed")
    r7, r8 = sorted(probe.records, key=lambda r: r.offset)
    assert (r7.topic, r7.partition, r7.offset) == (TOPIC, 0, 7)
    assert (r7.key, r7.value) == (b"key", b"value")
    assert r7.headers == (("h1", b"xy"), ("h2", None))
    assert r7.timestamp == 1_700_000_000_000
    assert r7.leader_epoch == 3
    assert r7.size == len(b"key") + len(b"value") + len("h1") + 2 + len("h2")
    assert r7.event_id == "t/0/7"
    assert (r8.key, r8.value, r8.headers, r8.timestamp, r8.size) == (None, None, (), None, 0)


# -- the fake itself (so a fake bug cannot make the tests above pass vacuously) ---------------


def test_fake_honours_pause_and_serves_callbacks_inside_consume() -> None:
    fake = FakeConsumer({"group.id": "g", "partition.assignment.strategy": "cooperative-sticky"})
    fake.produce_many(TOPIC, 0, [0, 2, 5])
    fake.produce_marker(TOPIC, 0)
    seen: list[tuple[str, list[tuple[str, int]]]] = []
    fake.subscribe(
        [TOPIC],
        on_assign=lambda c, tps: seen.append(("assign", [(t.topic, t.partition) for t in tps])),
        on_revoke=lambda c, tps: seen.append(("revoke", [(t.topic, t.partition) for t in tps])),
    )
    fake.script_assign([P0])
    fake.pause([_tp_obj(P0)])
    assert fake.consume(10, 0) == []
    assert seen == [("assign", [P0])]
    fake.resume([_tp_obj(P0)])
    assert [m.offset() for m in fake.consume(10, 0)] == [0, 2, 5]
    assert fake.position([_tp_obj(P0)])[0].offset == 7  # past the marker at 6
    fake.script_lost([P0])  # no on_lost registered: goes to on_revoke
    fake.consume(1, 0)
    assert seen[-1] == ("revoke", [P0])
    assert fake.assignment_set() == set()


def test_fake_delivers_async_commit_results_on_a_later_consume() -> None:
    results: list[tuple[object, list[tuple[str, int, int]]]] = []
    fake = FakeConsumer(
        {
            "group.id": "g",
            "on_commit": lambda err, tps: results.append(
                (err, [(t.topic, t.partition, t.offset) for t in tps])
            ),
        }
    )
    fake.commit(offsets=[_tp_obj(P0, 3)], asynchronous=True)
    assert results == []
    fake.fail_next_commits()
    fake.commit(offsets=[_tp_obj(P0, 4)], asynchronous=True)
    fake.consume(1, 0)
    assert results[0] == (None, [(TOPIC, 0, 3)])
    assert results[1][0] is not None
    assert fake.committed == {P0: 3}
    out = fake.commit(offsets=[_tp_obj(P0, 5)], asynchronous=False)
    assert out is not None and out[0].offset == 5 and out[0].error is None
    fake.fail_next_commits()
    with pytest.raises(KafkaException):
        fake.commit(offsets=[_tp_obj(P0, 6)], asynchronous=False)
    assert fake.committed == {P0: 5}


def test_fake_rejects_the_wrong_assign_family_inside_a_callback() -> None:
    fake = FakeConsumer({"group.id": "g", "partition.assignment.strategy": "range"})
    errors: list[BaseException] = []

    def on_assign(c: FakeConsumer, tps: list[TopicPartition]) -> None:
        try:
            c.incremental_assign(tps)
        except KafkaException as exc:
            errors.append(exc)

    fake.subscribe([TOPIC], on_assign=on_assign)
    fake.script_assign([P0])
    fake.consume(1, 0)
    assert len(errors) == 1
    assert fake.assignment_set() == {P0}  # applied by the "client" after the callback
    with pytest.raises(KafkaException):
        FakeConsumer({"group.protocol": "consumer", "session.timeout.ms": 6000})


def _tp_obj(tp: tuple[str, int], offset: int | None = None) -> TopicPartition:
    if offset is None:
        return TopicPartition(tp[0], tp[1])
    return TopicPartition(tp[0], tp[1], offset)


def test_no_blocking_client_call_inside_rebalance_callbacks(launch: Launch) -> None:
    """A resumed fetcher may be woken with a metadata request; from inside a rebalance callback
    the real client would abort the process, so assignment must never take that path."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(5))
    probe = Probe()
    fake.script_assign([P0])
    gc = launch(probe, fake, ordering="unordered")
    wait_until(lambda: probe.finished_count() == 5, "records processed")
    assert fake.script_assign([P1]).done.wait(WAIT)
    wait_until(lambda: 5 in offsets_committed(fake, P0), "P0 committed to its end")
    gc.stop()
    gc.join(WAIT)
    assert gc.failure is None


def test_partition_mode_shares_the_budget_across_partitions(launch: Launch) -> None:
    """In partition mode a partition's lanes hold at most its share (capacity / (2 x
    partitions)), and a partition holding a full reserve read ahead (here: a share) is paused
    alone and resumed once the reserve runs low, so records of other partitions get into the
    budget; nothing stalls and everything is committed to the end.

    librdkafka's resume does not wake a broker thread that went idle with every partition
    paused; a seek does. Every resume is followed by a seek of the same partitions, to where the
    resume would have fetched from: the fake honours the offset given, so a wrong one would
    replay or skip records, and neither happens."""
    gc, fake, probe = _over_four_partitions(launch, "partition")
    parts = [(TOPIC, p) for p in range(4)]
    single = [tps for op, tps in fake.pause_calls if op == "pause" and len(tps) == 1]
    assert single, "no partition was ever paused for holding more than its share"
    assert gc.stats().peak_in_flight <= SMALL_FLOW["capacity_records"]
    resumed = _resumes_and_seeks(fake)
    assert resumed, "no partition was ever resumed"
    assert all(sought for _, sought in resumed), resumed
    for tp in parts:
        assert sorted(fake.delivered_offsets(tp)) == list(range(60)), f"{tp} replayed or skipped"
    assert sorted(probe.finished) == sorted((tp, o) for tp in parts for o in range(60))


def test_partition_mode_shares_the_budget_only_while_tasks_are_shorter_than_a_share(
    launch: Launch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a fast handler a partition's share fits in one task, so pausing it would only make
    librdkafka drop its prefetch: once the handler's time is measured (the first guess is slow,
    1 ms), partition mode stops pausing single partitions and reads nothing ahead."""
    fake = FakeConsumer()
    parts = [(TOPIC, p) for p in range(8)]
    share = 40 // (2 * 8)  # at least 40 tasks to measure the handler
    fake.produce_many(TOPIC, 0, range(400))
    fake.script_assign(parts)
    sizes: list[int] = []
    consume = fake.consume

    def recording_consume(num_messages: int = 1, timeout: float = -1) -> list[FakeMessage]:
        sizes.append(num_messages)
        return consume(num_messages, timeout)

    fake.consume = recording_consume  # type: ignore[method-assign]
    # The handler time the owner's turn went by at each single pause: a task whose worker
    # waited for the interpreter lock (on a machine busy with other tests) can measure the
    # handler slow for a while, and a pause then is right.
    measured = [0.0]
    begin_turn = Budget.begin_turn

    def measuring_begin_turn(self: Budget) -> None:
        begin_turn(self)
        measured[0] = self._scheduler.per_record_seconds

    monkeypatch.setattr(Budget, "begin_turn", measuring_begin_turn)
    paused_at: list[float] = []
    pause = fake.pause

    def recording_pause(partitions: list[TopicPartition]) -> None:
        if len(partitions) == 1:
            paused_at.append(measured[0])
        pause(partitions)

    fake.pause = recording_pause  # type: ignore[method-assign]
    probe = Probe()
    flow = {"capacity_records": 40, "pause_records": 30, "resume_records": 10}
    flow["read_ahead_records"] = 0  # a share in reserve pauses a partition
    gc = launch(
        probe, fake, ordering="partition", workers=4, max_batch_records=10, flow=FlowConfig(**flow)
    )
    wait_until(lambda: probe.finished_count() == 400, "warm-up records processed")

    # While the handler still counted as slow, the partition was held to its share.
    assert paused_at
    before = len(paused_at)
    fake.produce_many(TOPIC, 0, range(400, 425))  # 12 shares, below the pause mark
    wait_until(lambda: probe.finished_count() == 425, "all records processed")
    wait_until(lambda: 425 in offsets_committed(fake, (TOPIC, 0)), "committed to the end")
    gc.stop()
    gc.join(WAIT)
    # A turn takes about _TASK_SECONDS of handler time: a share is worth pausing for only
    # while it takes more than one turn.
    fast_pauses = [s for s in paused_at[before:] if int(_TASK_SECONDS / s) + 1 >= share]
    assert not fast_pauses, "a fast partition was paused for its share"
    assert max(sizes) == 10
    assert gc.stats().read_ahead == 0


READ_AHEAD_FLOW = {
    "capacity_records": 40,
    "pause_records": 30,
    "resume_records": 10,
    "read_ahead_records": 40,
}


def read_ahead_launch(
    launch: Launch, probe: Probe, gates: Sequence[Key]
) -> tuple[GroupConsumer, FakeConsumer, threading.Event]:
    """Partition mode over P0 and P1, 40 records each, the records at `gates` held until the
    returned event is set. With a budget of 40 a share is 40 // (2 x 2) = 10 records, a
    partition reads up to 40 // 2 = 20 ahead, and consume calls take up to 10
    (max_batch_records)."""
    fake = FakeConsumer()
    for _, p in (P0, P1):
        fake.produce_many(TOPIC, p, range(40))
    fake.script_assign([P0, P1])
    gate = threading.Event()
    for k in gates:
        probe.actions[k] = gated(gate)
    gc = launch(
        probe,
        fake,
        ordering="partition",
        workers=2,
        max_batch_records=10,
        flow=FlowConfig(**READ_AHEAD_FLOW),
    )
    return gc, fake, gate


def test_partitions_read_ahead_of_their_share_and_the_watermark_waits_for_it(
    launch: Launch,
) -> None:
    """While partitions share the budget, records consumed beyond a partition's share are read
    ahead: registered (the watermark waits for them) but kept out of the lanes, and the
    partition is paused once it holds its part of `read_ahead_records`. Consume calls are not
    cut to the share, so librdkafka does not drop and refetch a producer batch once per
    share."""
    probe = Probe()
    parts = [P0, P1]
    gc, fake, gate = read_ahead_launch(launch, probe, [(P0, 0), (P1, 0)])

    def held() -> bool:
        stats = gc.stats()
        return len(stats.partitions) == 2 and all(p.read_ahead >= 20 for p in stats.partitions)

    wait_until(held, "a full reserve read ahead in each partition")
    stats = gc.stats()
    assert [p.in_flight for p in stats.partitions] == [10, 10]  # the lanes hold one share each
    assert stats.read_ahead == sum(p.read_ahead for p in stats.partitions)
    assert stats.read_ahead_bytes > 0
    assert fake.paused_set() == set(parts)  # each holds a full reserve: nothing more is fetched
    assert [p.read_ahead for p in stats.partitions] == [20, 20]
    for tp in parts:
        assert len(fake.delivered_offsets(tp)) == 10 + gc.stats().partitions[tp[1]].read_ahead
        assert max(offsets_committed(fake, tp), default=0) == 0
    gate.set()
    wait_until(lambda: probe.finished_count() == 80, "all records processed")
    for tp in parts:

        def at_end(tp: tuple[str, int] = tp) -> bool:
            return 40 in offsets_committed(fake, tp)

        wait_until(at_end, f"{tp} committed to its end")
        assert fake.delivered_offsets(tp) == list(range(40)), f"{tp} replayed or skipped"
        assert probe.started_offsets(tp) == list(range(40)), f"{tp} out of order"
    gc.stop()
    gc.join(WAIT)
    assert gc.failure is None
    assert (gc.stats().read_ahead, gc.stats().in_flight, gc.stats().in_flight_bytes) == (0, 0, 0)


def test_revoke_drops_records_read_ahead_and_commits_below_them(launch: Launch) -> None:
    """Records read ahead never ran: a revoke commits below them and gives their bytes back to
    the budget; the next owner reads them again."""
    probe = Probe()
    gc, fake, gate = read_ahead_launch(launch, probe, [(P0, 3)])
    wait_until(probe.entered((P0, 3)).is_set, "P0@3 running")
    wait_until(lambda: any(p.read_ahead for p in gc.stats().partitions if p.tp == P0), "P0 ahead")
    revoke = fake.script_revoke([P0])
    wait_until(revoke.started.is_set, "revoke started")
    gate.set()
    assert revoke.done.wait(WAIT)
    assert [c.offsets for c in fake.commit_log() if c.in_callback == "revoke"] == [{P0: 4}]
    assert probe.started_offsets(P0) == [0, 1, 2, 3]  # nothing read ahead ran after the revoke
    wait_until(lambda: probe.finished_count() == 44, "P1 processed")
    wait_until(lambda: 40 in offsets_committed(fake, P1), "P1 committed to its end")
    wait_until(lambda: gc.stats().partitions and gc.stats().in_flight == 0, "stats published")
    stats = gc.stats()
    assert (stats.read_ahead, stats.read_ahead_bytes, stats.in_flight_bytes) == (0, 0, 0)
    gc.stop()
    gc.join(WAIT)
    assert gc.failure is None


def test_a_rewind_drops_records_read_ahead(launch: Launch) -> None:
    """A rewind (seek or offset reset) re-delivers from an earlier offset: what was read ahead
    belongs to the old epoch, is dropped with its bytes, and nothing is skipped."""
    probe = Probe()
    gc, fake, gate = read_ahead_launch(launch, probe, [(P0, 0), (P1, 0)])
    wait_until(lambda: any(p.read_ahead for p in gc.stats().partitions if p.tp == P0), "P0 ahead")
    fake.resume([_tp_obj(P0)])
    fake.rewind(P0, 5)  # re-delivers 5.. while 0..4 are in the lanes and more was read ahead
    wait_until(lambda: fake.delivered_offsets(P0).count(5) == 2, "P0@5 delivered again")
    gate.set()
    wait_until(lambda: 40 in offsets_committed(fake, P0), "P0 committed to its end")
    wait_until(lambda: 40 in offsets_committed(fake, P1), "P1 committed to its end")
    started = probe.started_offsets(P0)
    # The old epoch's lanes (0..9) still run; what it read ahead (10..) never does.
    assert sorted(started) == sorted([*range(10), *range(5, 40)]), started
    assert started[-35:] == list(range(5, 40)), "the new epoch ran out of order"
    gc.stop()
    gc.join(WAIT)
    stats = gc.stats()
    assert (stats.read_ahead, stats.read_ahead_bytes, stats.in_flight_bytes) == (0, 0, 0)
    assert gc.failure is None


def _resumes_and_seeks(fake: FakeConsumer) -> list[tuple[tuple[str, int], bool]]:
    """Every partition the engine resumed, in order, and whether a seek of it followed before
    the next consume call."""
    out: list[tuple[tuple[str, int], bool]] = []
    calls = list(fake.calls)
    for i, (name, detail) in enumerate(calls):
        if name != "resume":
            continue
        after: set[tuple[str, int]] = set()
        for later, d in calls[i + 1 :]:
            if later == "consume":
                break
            if later == "seek":
                after.add(d[0])
        out.extend((tp, tp in after) for tp in detail)
    return out


def test_resume_wakes_with_a_metadata_request_when_no_position_is_known() -> None:
    """A partition resumed before anything of it was handed out has no position to seek to: the
    fetcher is woken with a metadata request instead (outside any callback)."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3))
    gc = GroupConsumer(lambda r: None, consumer_factory=fake.factory, **SETTINGS)
    engine = Engine(gc.config, gc._handler, fake.factory, Lifecycle())
    engine._client = fake.factory(gc.config.librdkafka_config())
    fake.assign([TopicPartition(TOPIC, 0)])
    engine.fetch._resume([Partition(TOPIC, 0)])
    names = [name for name, _ in fake.calls]
    assert "seek" not in names
    assert names[-1] == "list_topics"


P2 = (TOPIC, 2)


@pytest.mark.parametrize("kind", ["revoke", "lost", "assign"])
def test_partitions_kept_through_an_incremental_rebalance_wake_their_fetcher(
    launch: Launch, kind: str
) -> None:
    """librdkafka pauses every assigned partition while an incremental rebalance waits for its
    callback, and its resume does not wake a broker thread that went idle meanwhile (up to 1 s
    of silence for the partitions the member keeps). After each rebalance callback the kept
    partitions are sought to the client's position, outside the callback; a moved or new one
    is not. The fake honours the offset given: a wrong one would replay or skip records."""
    fake = FakeConsumer()
    for _, p in (P0, P1, P2):
        fake.produce_many(TOPIC, p, range(10))
    fake.script_assign([P0, P1])
    probe = Probe()
    gc = launch(probe, fake)  # cooperative-sticky: incremental
    wait_until(lambda: probe.finished_count() == 20, "P0 and P1 processed")
    mark: list[int] = []
    before = lambda: mark.append(len(fake.calls))  # noqa: E731
    if kind == "assign":
        event, kept = fake.script_assign([P2], before=before), [P0, P1]
    elif kind == "revoke":
        event, kept = fake.script_revoke([P1], before=before), [P0]
    else:
        event, kept = fake.script_lost([P1], before=before), [P0]
    assert event.done.wait(WAIT)
    settle(fake, 3)
    sought = [detail for name, detail in fake.calls[mark[0] :] if name == "seek"]
    assert sorted(sought) == sorted((tp, 10) for tp in kept)
    for tp in kept:
        fake.produce_many(TOPIC, tp[1], range(10, 15))
    wait_until(
        lambda: all(probe.started_offsets(tp)[-1:] == [14] for tp in kept), "kept ones flowing"
    )
    for tp in kept:
        assert fake.delivered_offsets(tp) == list(range(15)), f"{tp} replayed or skipped"
    gc.stop()
    gc.join(WAIT)
    assert gc.failure is None


def test_an_eager_assignment_seeks_nothing(launch: Launch) -> None:
    """An eager assignment places every partition at an explicit offset itself, also one it
    hands again to a member that owns it: no partition is woken by a seek after it."""
    fake = FakeConsumer()
    for _, p in (P0, P1):
        fake.produce_many(TOPIC, p, range(10))
    fake.script_assign([P0, P1])
    probe = Probe()
    gc = launch(probe, fake, assignment_strategy="range")
    wait_until(lambda: probe.finished_count() == 20, "P0 and P1 processed")
    assert fake.script_assign([P0, P1]).done.wait(WAIT)
    settle(fake, 3)
    assert not fake.seeks
    gc.stop()
    gc.join(WAIT)
    assert gc.failure is None


def _over_four_partitions(
    launch: Launch, ordering: Ordering, key: Callable[[int, int], bytes] | None = None
) -> tuple[GroupConsumer, FakeConsumer, Probe]:
    """60 records on each of 4 partitions (`key(partition, offset)`, or none), a 1 ms handler,
    a budget of 20 with a share's reserve (a partition that shares is paused alone once it
    holds a share read ahead), all handled and committed to the end, and the member stopped."""
    fake = FakeConsumer()
    parts = [(TOPIC, p) for p in range(4)]
    for _, p in parts:
        keys = None if key is None else (lambda o, p=p: key(p, o))
        fake.produce_many(TOPIC, p, range(60), key=keys)
    fake.script_assign(parts)
    probe = Probe()
    probe.delay = 0.001
    flow = {**SMALL_FLOW, "read_ahead_records": 0}
    gc = launch(
        probe, fake, ordering=ordering, workers=4, max_batch_records=10, flow=FlowConfig(**flow)
    )
    wait_until(lambda: probe.finished_count() == 240, "all records processed")
    for tp in parts:

        def at_end(tp: tuple[str, int] = tp) -> bool:
            return 60 in offsets_committed(fake, tp)

        wait_until(at_end, f"{tp} committed to its end")
    gc.stop()
    gc.join(WAIT)
    return gc, fake, probe


def test_key_mode_shares_the_budget_when_a_few_keys_hold_it(launch: Launch) -> None:
    """One key per partition: the budget fills with one partition's records (the client hands
    out one partition's data at a time) and all but one worker idle. Key mode then shares the
    budget between partitions as partition mode does, so every partition gets in."""
    gc, fake, probe = _over_four_partitions(launch, "key", lambda p, o: b"k%d" % p)
    single = [tps for op, tps in fake.pause_calls if op == "pause" and len(tps) == 1]
    assert single, "key mode never shared the budget"
    assert max(probe.max_running_by_tp.values()) == 1
    assert probe.max_running > 1, "the partitions never ran in parallel"
    # Partitions that held more than a share when sharing began take nothing read ahead into
    # the lanes until the capacity has room.
    assert gc.stats().peak_in_flight <= SMALL_FLOW["capacity_records"]
    for p in range(4):
        assert probe.started_offsets((TOPIC, p)) == list(range(60))


def test_key_mode_with_many_keys_never_shares_the_budget(launch: Launch) -> None:
    """Many keys per partition: a full budget still runs on every worker, so the budget is not
    shared and no partition is paused on its own."""
    gc, fake, _ = _over_four_partitions(launch, "key", lambda p, o: b"k%d" % o)
    assert gc.stats().throttles > 0, "the budget never filled up: the test shows nothing"
    single = [tps for op, tps in fake.pause_calls if op == "pause" and len(tps) == 1]
    assert not single


def test_key_mode_does_not_share_when_the_budget_is_runnable(
    launch: Launch, caplog: pytest.LogCaptureFixture
) -> None:
    """Short handlers: tasks of several records leave workers without a task while the budget is
    full, but its records are runnable, not waiting behind busy keys. That is no reason to
    share (and pause partitions alone), so the budget stays whole."""
    fake = FakeConsumer()
    parts = [(TOPIC, p) for p in range(4)]
    for _, p in parts:
        fake.produce_many(TOPIC, p, range(300), key=lambda o: b"k%d" % o)
    fake.script_assign(parts)
    probe = Probe()
    probe.delay = 0.0002
    caplog.set_level(logging.INFO, logger="weir")
    gc = launch(
        probe, fake, ordering="key", workers=8, max_batch_records=10, flow=FlowConfig(**SMALL_FLOW)
    )
    wait_until(lambda: probe.finished_count() == 1200, "all records processed")
    gc.stop()
    gc.join(WAIT)
    assert gc.stats().throttles > 0, "the budget never filled up: the test shows nothing"
    assert "consumer_stopped" in [e["event"] for e in events(caplog)]  # info events are seen
    assert not [e for e in events(caplog) if e["event"] == "budget_shared"]


# -- handlers that do not run their work -------------------------------------------------------


def test_a_handler_class_instead_of_an_instance_is_refused() -> None:
    with pytest.raises(TypeError, match=r"pass an instance, Probe\(\)"):
        GroupConsumer(Probe, consumer_factory=FakeConsumer().factory, **SETTINGS)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("config", "said"),
    [
        (dict(SETTINGS), "got dict: pass its settings as keywords, GroupConsumer(handler, **"),
        (
            {"fetch.min.bytes": 1},
            "librdkafka's own settings, such as 'fetch.min.bytes', go in kafka",
        ),
        ("localhost:9092", "got str: settings are keywords, GroupConsumer(handler, bootstrap_"),
    ],
)
def test_a_config_that_is_no_consumer_config_is_named(config: object, said: str) -> None:
    """`GroupConsumer(handle, config={...})` failed inside with "'dict' object has no attribute
    'model_fields_set'", or, with keyword settings too, said to pass one or the other."""
    no_settings: dict[str, Any] = {}
    for settings in (no_settings, SETTINGS):
        with pytest.raises(TypeError, match=r"^config must be a ConsumerConfig") as info:
            GroupConsumer(Probe(), config, consumer_factory=FakeConsumer().factory, **settings)  # type: ignore[call-overload]
        assert said in str(info.value)


def test_a_handler_without_handle_is_refused_at_construction() -> None:
    """It was accepted, and every record failed with the base method's NotImplementedError,
    which has no message ("handler failed on t/0/0: NotImplementedError: "). `handle` is
    abstract: the handler itself cannot be built, and the error says how to write it."""

    class HooksOnly(Handler):
        def on_assigned(self, partitions: Sequence[Partition]) -> None:
            pass

    with pytest.raises(
        TypeError, match=r"HooksOnly does not define handle\(\): a Handler subclass"
    ):
        HooksOnly()  # type: ignore[abstract]  # on purpose

    class Mixin:
        def handle(self, record: Record, ctx: Context) -> None:
            pass

    class FromAMixin(Mixin, Handler):
        pass

    GroupConsumer(FromAMixin(), consumer_factory=FakeConsumer().factory, **SETTINGS)


def _record_and_context(record: Record, ctx: object) -> None:
    pass


async def _async_record_and_context(record: Record, ctx: object) -> None:
    pass


@pytest.mark.parametrize("fn", [_record_and_context, _async_record_and_context])
def test_a_plain_function_that_wants_the_context_is_refused(fn: Callable[..., object]) -> None:
    """weir calls a plain function with the record alone: `def handle(record, ctx)` failed
    every record with a TypeError at run time (each one retried, then blocked) instead of at
    construction."""
    fake = FakeConsumer()
    with pytest.raises(TypeError, match=r"\(record, ctx\) must take one argument.*weir\.Handler"):
        GroupConsumer(fn, consumer_factory=fake.factory, **SETTINGS)

    # One that takes the record, or more with defaults, is fine.
    def with_a_default(record: Record, extra: object = None) -> None:
        pass

    GroupConsumer(with_a_default, consumer_factory=fake.factory, **SETTINGS)


@pytest.mark.parametrize("final", ["stop", "block"])
@pytest.mark.parametrize("fast", [True, False], ids=["function", "handler-with-context"])
def test_an_awaitable_returned_at_run_time_stops_the_member_at_once(
    launch: Launch, fast: bool, final: Literal["stop", "block"]
) -> None:
    """A plain function that returns a coroutine (`lambda r: save(r)` with `async def save`)
    cannot be told apart at construction. Its record must never count as finished, and as the
    handler, not the record, is wrong, the member stops at the first such record whatever the
    failure policy: it was retried three times and then stopped, or blocked the partition
    for good under final="block"."""
    ran: list[int] = []
    calls: list[int] = []

    async def save(record: Record) -> None:
        ran.append(record.offset)

    def returns_coroutine(record: Record) -> object:
        calls.append(record.offset)
        return save(record) if record.offset == 2 else None

    class Returns(Handler):
        def handle(self, record: Record, ctx: Context) -> None:
            # Wrong on purpose: what the engine does with a handle() that returns a value.
            return returns_coroutine(record)  # type: ignore[return-value]

    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(5))
    fake.script_assign([P0])
    policy = FailurePolicy(retry=RetryPolicy(backoff_initial_s=0.01), final=final)
    handler = returns_coroutine if fast else Returns()
    gc = launch(handler, fake, ordering="partition", failure=policy, **QUIET)
    with pytest.raises(HandlerError) as info:
        gc.join(WAIT)
    assert info.value.record.offset == 2
    assert calls.count(2) == 1, calls  # refused once, not retried
    name = "returns_coroutine" if fast else "Returns.handle"
    assert re.search(
        rf"{name} \(.*test_consumer_loop.py:\d+\) returned a coroutine instead of doing its work",
        str(info.value),
    ), info.value
    assert "Make it async def" in str(info.value)
    assert ran == []
    assert [c.offsets for c in fake.commit_log()] == [{P0: 2}]


def _generator_fn(record: Record) -> Iterator[int]:
    yield record.offset


async def _async_generator_fn(record: Record) -> AsyncIterator[int]:
    yield record.offset


class _GeneratorHandle(Handler):
    def handle(self, record: Record, ctx: Context) -> Iterator[int]:  # type: ignore[override]
        yield record.offset


class _GeneratorBatch(BatchHandler):
    def handle_batch(  # type: ignore[override]
        self, records: list[Record], ctx: BatchContext
    ) -> Iterator[int]:
        yield len(records)


class _GeneratorCall:
    def __call__(self, record: Record) -> Iterator[int]:
        yield record.offset


@pytest.mark.parametrize(
    ("handler", "name"),
    [
        (_generator_fn, "_generator_fn"),
        (_async_generator_fn, "_async_generator_fn"),
        (_GeneratorHandle(), "_GeneratorHandle.handle"),
        (_GeneratorBatch(), "_GeneratorBatch.handle_batch"),
        (_GeneratorCall(), "_GeneratorCall.__call__"),
    ],
    ids=["function", "async-function", "handle", "handle_batch", "__call__"],
)
def test_a_generator_function_handler_is_refused(handler: Any, name: str) -> None:
    """A handler with a `yield` returns a generator and runs none of its body: every record
    counted finished and was committed unprocessed, with no error anywhere."""
    fake = FakeConsumer()
    with pytest.raises(TypeError, match=rf"handler {re.escape(name)} is a generator function"):
        GroupConsumer(handler, consumer_factory=fake.factory, **SETTINGS)


@pytest.mark.parametrize("hook", HOOKS)
def test_a_generator_function_hook_is_refused(hook: str) -> None:
    """A hook with a `yield` is called, and its generator dropped unrun: an `on_flush` written so
    flushed nothing and every commit passed the buffered records (on the fake broker: lag 0,
    nothing flushed); an `on_assigned` so never ran, and nothing said so."""

    def generator_hook(self: Handler, *args: object) -> Iterator[None]:
        yield None

    cls = type("Hooked", (Handler,), {"handle": lambda self, r, c: None, hook: generator_hook})
    with pytest.raises(TypeError, match=rf"Hooked\.{hook} is a generator function"):
        GroupConsumer(cls(), consumer_factory=FakeConsumer().factory, **SETTINGS)


def test_a_generator_returned_at_run_time_stops_the_member_at_once(launch: Launch) -> None:
    """A function that returns a generator (not one itself, so not refused at construction)
    did none of the generator's work: its record fails, unretried, and the member stops."""
    ran: list[int] = []

    def work(record: Record) -> Iterator[None]:
        ran.append(record.offset)
        yield None

    def returns_generator(record: Record) -> object:
        return work(record) if record.offset == 2 else None

    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(5))
    fake.script_assign([P0])
    policy = FailurePolicy(retry=RetryPolicy(backoff_initial_s=0.01))
    gc = launch(returns_generator, fake, ordering="partition", failure=policy, **QUIET)
    with pytest.raises(HandlerError) as info:
        gc.join(WAIT)
    assert info.value.record.offset == 2
    assert isinstance(info.value.__cause__, GeneratorReturned)
    assert "returned a generator instead of doing its work" in str(info.value), info.value
    assert ran == []
    assert [c.offsets for c in fake.commit_log()] == [{P0: 2}]


# -- user callbacks never break the commit path or the shutdown -------------------------------


def test_a_commit_listener_that_raises_loses_no_commit(
    launch: Launch, caplog: pytest.LogCaptureFixture
) -> None:
    """The landed code: a listener that raised killed the member in the middle of its commit
    path: 20 processed, 0 committed, then shutdown_failed and close_failed. Listeners are now
    isolated: logged once with their name, counted, and every commit still happens."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(20))
    fake.script_assign([P0])
    probe = Probe()
    calls: list[str] = []

    def broken_listener(event: CommitEvent) -> None:
        calls.append(event.status)
        raise ValueError("listener bug")

    gc = GroupConsumer(probe, consumer_factory=fake.factory, **SETTINGS)
    gc.add_commit_listener(broken_listener)
    gc.start()
    wait_until(lambda: probe.finished_count() == 20, "all processed")
    wait_until(lambda: 20 in offsets_committed(fake, P0), "committed to the end")
    gc.stop()
    gc.join(WAIT)  # no failure: the member stopped cleanly
    logs = events(caplog)
    assert gc.state is State.STOPPED
    assert len(calls) >= 2
    failed = [e for e in logs if e["event"] == "callback_failed"]
    assert len(failed) == 1, "logged once, not once per call"
    assert failed[0]["callback"].endswith("broken_listener")
    assert gc.stats().callback_failures == len(calls)
    assert not [e for e in logs if e["event"] in ("shutdown_failed", "close_failed")]


def test_a_fatal_callback_still_drains_commits_and_closes(launch: Launch) -> None:
    """With callback_errors="stop" a raising hook stops the member, through the normal stop:
    in-flight records finish and the final commit happens before close."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(10))
    fake.script_assign([P0])

    class Hooked(Probe):
        def on_assigned(self, partitions: Sequence[Partition]) -> None:
            super().on_assigned(partitions)
            if len(self.assigned) == 2:
                raise RuntimeError("hook bug")

    probe = Hooked()
    gc = launch(probe, fake, callback_errors="stop")
    wait_until(lambda: probe.finished_count() == 10, "all processed")
    fake.script_assign([P1])  # the second on_assigned raises
    with pytest.raises(CallbackError) as info:
        gc.join(WAIT)
    assert "on_assigned" in info.value.callback
    assert isinstance(info.value.__cause__, RuntimeError)
    assert 10 in offsets_committed(fake, P0)
    names = fake.call_names()
    assert names[-1] == "close" and "unsubscribe" in names


def test_revoke_and_lost_hooks_that_raise_are_logged_with_their_partitions_and_counted(
    launch: Launch, caplog: pytest.LogCaptureFixture
) -> None:
    """on_revoked and on_lost run after the hand-off is done (the revoke's commit, the lost
    partition's fence): a hook that raises is logged once each, with the hook and its
    partitions, counted, and the member goes on consuming (callback_errors="log")."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(5))
    fake.produce_many(TOPIC, 1, range(5))
    fake.script_assign([P0, P1])

    class Hooked(Probe):
        def on_revoked(self, partitions: Sequence[Partition]) -> None:
            raise RuntimeError("revoke hook bug")

        def on_lost(self, partitions: Sequence[Partition]) -> None:
            raise RuntimeError("lost hook bug")

    probe = Hooked()
    gc = launch(probe, fake)
    wait_until(lambda: probe.finished_count() == 10, "all processed")
    assert fake.script_revoke([P0]).done.wait(WAIT)
    assert fake.script_lost([P1]).done.wait(WAIT)
    assert 5 in offsets_committed(fake, P0), "the revoke committed before its hook raised"
    fake.script_assign([P0])
    fake.produce_many(TOPIC, 0, range(5, 8))
    wait_until(lambda: 8 in offsets_committed(fake, P0), "the member goes on after both")
    assert gc.state is State.RUNNING
    failed = {e["hook_name"]: e for e in events(caplog) if e["event"] == "callback_failed"}
    assert set(failed) == {"on_revoked", "on_lost"}, failed
    assert failed["on_revoked"]["partitions"] == [f"{TOPIC}[0]"]
    assert failed["on_lost"]["partitions"] == [f"{TOPIC}[1]"]
    assert not failed["on_lost"]["stops_member"]
    wait_until(lambda: gc.stats().callback_failures == 2, "both counted")


def test_a_listener_added_after_start_is_called(launch: Launch) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(5))
    fake.script_assign([P0])
    gc = launch(Probe(), fake)
    wait_until(lambda: 5 in offsets_committed(fake, P0), "first commits")
    events: list[CommitEvent] = []
    gc.add_commit_listener(events.append)  # the landed code copied listeners at start()
    fake.produce_many(TOPIC, 0, range(5, 8))
    wait_until(lambda: any(e.offset == 8 and e.ok for e in events), "a commit event seen")


def test_a_member_runs_once_and_says_so(members: list[GroupConsumer]) -> None:
    """The landed code: run() after a stop returned at once and processed nothing, silently."""
    fake = FakeConsumer()
    gc = GroupConsumer(Probe(), consumer_factory=fake.factory, **SETTINGS)
    members.append(gc)
    states = [gc.state]
    gc.start()
    assert gc.wait_started(WAIT)
    states.append(gc.state)
    assert states == [State.NEW, State.RUNNING]
    with pytest.raises(RuntimeError, match="already run"):
        gc.start()
    gc.stop()
    gc.join(WAIT)
    assert gc.state is State.STOPPED
    with pytest.raises(RuntimeError, match="build a new GroupConsumer"):
        gc.run(handle_signals=False)
    with pytest.raises(RuntimeError, match="already run"):
        gc.start()


def test_a_second_stop_hurries_the_drain(launch: Launch) -> None:
    """Repeated Ctrl-C used to wait the whole shutdown budget. The second request skips the
    rest of the drain, commits the finished watermark and closes."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3))
    fake.script_assign([P0])
    probe = Probe()
    release = threading.Event()
    probe.actions[(P0, 2)] = lambda r, c: release.wait(WAIT)  # ignores cancellation
    gc = launch(probe, fake, ordering="partition", shutdown_timeout_s=30.0, **QUIET)
    try:
        wait_until(probe.entered((P0, 2)).is_set, "P0@2 running")
        gc.stop()
        time.sleep(0.2)
        assert gc.state is State.STOPPING
        t0 = time.monotonic()
        gc.stop()  # the second request
        gc.join(WAIT)
        assert time.monotonic() - t0 < 2.0
        assert [c.offsets for c in fake.commit_log()] == [{P0: 2}]
        assert fake.call_names()[-1] == "close"
    finally:
        release.set()


def test_auto_offset_reset_error_fails_the_member_naming_the_partition(launch: Launch) -> None:
    """auto_offset_reset="error" with no committed offset used to sit idle for good (one
    warning, run() never returned)."""
    fake = FakeConsumer()
    fake.script_assign([P0])
    gc = launch(Probe(), fake, auto_offset_reset="error")
    err = KafkaError(
        KafkaError._AUTO_OFFSET_RESET,
        "fetch failed due to requested offset not available on the broker: Broker: Offset out of "
        "range (broker 1)",
    )
    with fake._cond:  # an error event of partition 0, as librdkafka delivers it
        fake._injected.append(FakeMessage.error_event(err, TOPIC, 0))
        fake._cond.notify_all()
    with pytest.raises(OffsetResetError) as info:
        gc.join(WAIT)
    assert info.value.partitions == [Partition(TOPIC, 0)]
    assert "t[0]" in str(info.value) and "auto_offset_reset='error'" in str(info.value)
