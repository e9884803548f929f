"""The fence in GroupConsumer, on the scripted FakeConsumer and a real database: epochs acquired
on assignment before the first record, `ctx.epoch`, a `FencedError` from a handler making the
partition lost, FencedHandler and FencePruner. Each test takes a `db` fixture (a `Db`):
tests/unit/test_fencing_engine.py runs them on a SQLite file (with the tests that need no
database), tests/integration/test_fencing_postgres.py on the throwaway PostgreSQL server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests import waiting
from tests.fake_members import SETTINGS
from tests.fence_databases import FenceDb, postgres_database, sqlite_database
from weir import (
    BatchContext,
    CommitEvent,
    Context,
    GroupConsumer,
    Handler,
    Partition,
    Record,
    State,
)
from weir.errors import FencedError
from weir.fencing import (
    Fence,
    FencedBatchHandler,
    FencedHandler,
    FencePruner,
)
from weir.testing.fake import FakeConsumer

pytestmark = pytest.mark.timeout(60)

TOPIC = "t"
P0 = (TOPIC, 0)
P1 = (TOPIC, 1)
T0 = Partition(TOPIC, 0)
T1 = Partition(TOPIC, 1)
GROUP = "g"
WAIT = 10.0


T = TypeVar("T")


def wait_until(pred: Callable[[], T], what: str, timeout: float = WAIT) -> T:
    return waiting.wait_until(pred, what, timeout, every=0.005)


class Db(FenceDb):
    """One database for one test, with a sink table a handler writes to."""

    def stored_epoch(self, tp: Partition) -> int | None:
        rows = self.rows(
            "SELECT epoch FROM {p}_epochs WHERE group_id = ? AND topic = ? AND partition = ?",
            (GROUP, tp.topic, tp.partition),
        )
        return None if not rows else int(rows[0][0])

    def write(self, conn: Any, record: Record) -> None:
        """A handler's write: one row per application (no key: a double write would show)."""
        conn.execute(
            self.sql("INSERT INTO {p}_sink (event_id, v) VALUES (?, ?)"),
            (record.event_id, (record.value or b"").decode()),
        )

    def sink(self) -> list[str]:
        return sorted(r[0] for r in self.rows("SELECT event_id FROM {p}_sink"))


CREATE = ["CREATE TABLE {p}_sink (event_id TEXT NOT NULL, v TEXT)"]


def sqlite_db(tmp_path: Path) -> Iterator[Db]:
    """The body of a `db` fixture on a SQLite file."""
    yield from sqlite_database(Db, tmp_path, CREATE, ["sink"])


def postgres_db(dsn: str) -> Iterator[Db]:
    """The body of a `db` fixture on the PostgreSQL server at `dsn`."""
    yield from postgres_database(Db, dsn, CREATE, ["sink"])


def launch(
    members: list[GroupConsumer],
    handler: Handler,
    fake: FakeConsumer,
    fence: Fence[Any] | None,
    **overrides: Any,
) -> GroupConsumer:
    settings: dict[str, Any] = {**SETTINGS, **overrides}
    gc = GroupConsumer(handler, consumer_factory=fake.factory, fence=fence, **settings)
    members.append(gc)
    gc.start()
    assert gc.wait_started(WAIT)
    return gc


class Timeline:
    """What happened, in order, across the owner thread and the workers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, Any]] = []

    def add(self, kind: str, detail: Any) -> None:
        with self.lock:
            self.events.append((kind, detail))

    def of(self, kind: str) -> list[Any]:
        with self.lock:
            return [d for k, d in self.events if k == kind]

    def first(self, kind: str) -> int:
        with self.lock:
            return next(i for i, (k, _) in enumerate(self.events) if k == kind)


def recording(fence: Fence[Any], timeline: Timeline) -> Fence[Any]:
    """The fence, its acquire calls noted in the timeline (with what they returned)."""
    acquire = fence.acquire

    def noted(group_id: str, partitions: Any) -> dict[Partition, int]:
        epochs = acquire(group_id, partitions)
        timeline.add("acquire", dict(epochs))
        return epochs

    fence.acquire = noted  # type: ignore[method-assign]
    return fence


class Observer(Handler):
    """Notes each record with its ctx.epoch and the epoch the database holds at that moment."""

    def __init__(self, timeline: Timeline, db: Db | None = None) -> None:
        self.timeline = timeline
        self.db = db

    def handle(self, record: Record, ctx: Context) -> None:
        tp = Partition(record.topic, record.partition)
        stored = self.db.stored_epoch(tp) if self.db is not None else None
        self.timeline.add("handle", (tp, record.offset, ctx.epoch, stored))


# -- epochs on assignment ---------------------------------------------------------------------


def test_epochs_are_acquired_on_assignment_before_the_first_record_runs(
    db: Db, members: list[GroupConsumer]
) -> None:
    timeline = Timeline()
    fence = recording(db.fence(), timeline)
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3))
    fake.produce_many(TOPIC, 1, range(2))
    fake.script_assign([P0, P1])
    launch(members, Observer(timeline, db), fake, fence)
    wait_until(lambda: len(timeline.of("handle")) == 5, "5 records")
    handled = timeline.of("handle")
    assert timeline.of("acquire") == [{T0: 1, T1: 1}]
    assert timeline.first("acquire") < timeline.first("handle")
    for tp, _offset, epoch, stored in handled:
        # The handler holds the epoch the database has: this member acquired it.
        assert epoch == stored == 1, (tp, epoch, stored)


def test_each_new_assignment_acquires_and_kept_partitions_keep_their_epoch(
    db: Db, members: list[GroupConsumer]
) -> None:
    timeline = Timeline()
    fence = recording(db.fence(), timeline)
    db.fence().acquire(GROUP, [T0])  # an earlier owner: P0 is at epoch 1 already
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, [0])
    fake.script_assign([P0])
    launch(members, Observer(timeline), fake, fence, assignment_strategy="cooperative-sticky")
    wait_until(lambda: len(timeline.of("handle")) == 1, "P0@0")
    fake.produce_many(TOPIC, 1, [0])
    fake.produce_many(TOPIC, 0, [1])
    assert fake.script_assign([P1]).done.wait(WAIT)  # incremental: P0 stays
    wait_until(lambda: len(timeline.of("handle")) == 3, "P1@0 and P0@1")
    assert fake.script_revoke([P0]).done.wait(WAIT)
    fake.produce_many(TOPIC, 0, [2])
    assert fake.script_assign([P0]).done.wait(WAIT)
    wait_until(lambda: len(timeline.of("handle")) == 4, "P0@2")
    assert timeline.of("acquire") == [{T0: 2}, {T1: 1}, {T0: 3}]
    seen = {(tp, off): epoch for tp, off, epoch, _ in timeline.of("handle")}
    assert seen == {(T0, 0): 2, (T0, 1): 2, (T1, 0): 1, (T0, 2): 3}


# -- a fenced write loses the partition -------------------------------------------------------


class Ledger(FencedHandler[Any]):
    """A FencedHandler whose writes are noted; `before` runs ahead of a record's fenced write."""

    def __init__(self, fence: Fence[Any], db: Db, timeline: Timeline) -> None:
        super().__init__(fence, GROUP, db.write)
        self.timeline = timeline
        self.before: dict[tuple[Partition, int], Callable[[], None]] = {}
        self.lost: list[list[Partition]] = []

    def handle(self, record: Record, ctx: Context) -> None:
        tp = Partition(record.topic, record.partition)
        action = self.before.pop((tp, record.offset), None)
        if action is not None:
            action()
        try:
            applied = self.apply(record, ctx)
        except FencedError as exc:
            self.timeline.add("fenced", (tp, record.offset, exc.held, exc.stored))
            raise
        self.timeline.add("applied" if applied else "replayed", (tp, record.offset))

    def on_lost(self, partitions: Sequence[Partition]) -> None:
        self.lost.append(list(partitions))


def new_owner(db: Db) -> None:
    """Another member acquires P0 (with a fence of its own)."""
    db.fence().acquire(GROUP, [T0])


@pytest.mark.parametrize("ordering", ["partition", "key", "unordered"])
def test_a_fenced_error_makes_the_partition_lost(
    db: Db, members: list[GroupConsumer], ordering: str
) -> None:
    """Another member acquires P0 while this one holds it: the write of P0@2 is refused, and
    nothing more runs or is committed for P0 here (not P0@3..5 either); P1 goes on."""
    timeline = Timeline()
    fence = db.fence()
    handler = Ledger(fence, db, timeline)
    # The new owner acquires between P0@1 and P0@2 of this member.
    handler.before[(T0, 2)] = lambda: new_owner(db)
    fake = FakeConsumer()
    # A key per record: in key order, the records after the fenced one are in other lanes,
    # which a failure of any other kind lets run on.
    fake.produce_many(TOPIC, 0, range(6), key=lambda off: b"k%d" % off)
    fake.produce_many(TOPIC, 1, range(2))
    fake.script_assign([P0, P1])
    gc = launch(members, handler, fake, fence, ordering=ordering, workers=1)
    wait_until(lambda: timeline.of("fenced"), "the fenced write")
    wait_until(lambda: handler.lost, "on_lost")
    wait_until(lambda: 2 in [o for o, _ in fake.commits_for(P1)], "P1 committed")
    fenced_at = len(fake.commit_log())
    fake.produce_many(TOPIC, 0, [6, 7])
    fake.produce_many(TOPIC, 1, [2, 3])
    wait_until(lambda: 4 in [o for o, _ in fake.commits_for(P1)], "P1 goes on")
    time.sleep(0.1)

    assert timeline.of("fenced") == [(T0, 2, 1, 2)]
    p0 = sorted(o for tp, o in timeline.of("applied") if tp == T0)
    assert p0 == [0, 1]  # nothing of P0 after the fenced record ran, here
    assert db.sink() == sorted(
        [f"{TOPIC}/0/0", f"{TOPIC}/0/1", f"{TOPIC}/1/0", f"{TOPIC}/1/1"]
        + [f"{TOPIC}/1/{o}" for o in (2, 3)]
    )
    assert handler.lost == [[T0]]
    assert all(P0 not in c.offsets for c in fake.commit_log()[fenced_at:])
    assert max((o for o, _ in fake.commits_for(P0)), default=0) <= 2
    assert P0 in fake.paused_set()
    assert gc.stats().partitions and [p.tp for p in gc.stats().partitions] == [T1]
    assert gc.state is State.RUNNING


def test_a_fenced_partition_assigned_again_gets_a_new_epoch(
    db: Db, members: list[GroupConsumer]
) -> None:
    timeline = Timeline()
    fence = db.fence()
    handler = Ledger(fence, db, timeline)
    handler.before[(T0, 1)] = lambda: new_owner(db)
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3))
    fake.script_assign([P0])
    launch(members, handler, fake, fence)
    wait_until(lambda: handler.lost, "P0 lost to the fence")
    # The group hands P0 over and back: revoked (nothing left here to revoke), then assigned.
    assert fake.script_revoke([P0]).done.wait(WAIT)
    assert fake.script_assign([P0]).done.wait(WAIT)
    wait_until(lambda: len(timeline.of("applied")) == 3, "P0@1 and P0@2 applied")
    assert timeline.of("fenced") == [(T0, 1, 1, 2)]
    assert db.stored_epoch(T0) == 3
    assert db.sink() == [f"{TOPIC}/0/{o}" for o in range(3)]


# -- a fence that fails -----------------------------------------------------------------------


# -- FencedHandler ----------------------------------------------------------------------------


def _rec(offset: int, value: bytes = b"v") -> Record:
    return Record(TOPIC, 0, offset, b"k", value)


def _ctx(rec: Record, epoch: int | None) -> Context:
    return Context(1, 1, rec.event_id, threading.Event(), epoch)


def test_fenced_handler_writes_once_per_event_id(db: Db) -> None:
    fence = db.fence()
    epoch = fence.acquire(GROUP, [T0])[T0]
    handler = FencedHandler(fence, GROUP, db.write)
    for offset in (0, 1, 0, 1, 2):
        rec = _rec(offset)
        handler.handle(rec, _ctx(rec, epoch))
    assert db.sink() == [f"{TOPIC}/0/{o}" for o in range(3)]
    assert (handler.applied, handler.replayed) == (3, 2)
    rec = _rec(3)
    assert handler.apply(rec, _ctx(rec, epoch)) is True
    assert handler.apply(rec, _ctx(rec, epoch)) is False


def test_fenced_handler_refuses_an_old_epoch_and_writes_nothing(db: Db) -> None:
    fence = db.fence()
    old = fence.acquire(GROUP, [T0])[T0]
    db.fence().acquire(GROUP, [T0])
    handler = FencedHandler(fence, GROUP, db.write)
    rec = _rec(0)
    with pytest.raises(FencedError) as info:
        handler.handle(rec, _ctx(rec, old))
    assert (info.value.held, info.value.stored) == (old, old + 1)
    assert db.sink() == []
    assert (handler.applied, handler.replayed) == (0, 0)


def test_fenced_handler_rolls_back_a_write_that_raises(db: Db) -> None:
    fence = db.fence()
    epoch = fence.acquire(GROUP, [T0])[T0]

    class Boom(Exception):
        pass

    def write(conn: Any, record: Record) -> None:
        db.write(conn, record)
        raise Boom(record.event_id)

    rec = _rec(0)
    with pytest.raises(Boom):
        FencedHandler(fence, GROUP, write).handle(rec, _ctx(rec, epoch))
    assert db.sink() == []
    # Nothing was recorded either: a retry applies.
    FencedHandler(fence, GROUP, db.write).handle(rec, _ctx(rec, epoch))
    assert db.sink() == [f"{TOPIC}/0/0"]


def test_fenced_handler_subclass_overrides_write(db: Db) -> None:
    fence = db.fence()
    epoch = fence.acquire(GROUP, [T0])[T0]

    class Sink(FencedHandler[Any]):
        def write(self, conn: Any, record: Record) -> None:
            db.write(conn, record)

    rec = _rec(0)
    Sink(fence, GROUP).handle(rec, _ctx(rec, epoch))
    assert db.sink() == [f"{TOPIC}/0/0"]


# -- FencedBatchHandler -----------------------------------------------------------------------


class BatchLedger(FencedBatchHandler[Any]):
    """A FencedBatchHandler writing a row per record; `before` runs ahead of the first batch."""

    def __init__(self, fence: Fence[Any], db: Db) -> None:
        super().__init__(fence, GROUP)
        self.db = db
        self.before: Callable[[], None] | None = None
        self.batches: list[list[str]] = []
        self.lost: list[list[Partition]] = []

    def write(self, conn: Any, records: list[Record]) -> None:
        self.batches.append([r.event_id for r in records])
        for r in records:
            self.db.write(conn, r)

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        before, self.before = self.before, None
        if before is not None:
            before()
        self.apply_batch(records, ctx)

    def on_lost(self, partitions: Sequence[Partition]) -> None:
        self.lost.append(list(partitions))


def test_fenced_batch_handler_loses_only_the_fenced_partition_of_a_batch(
    db: Db, members: list[GroupConsumer]
) -> None:
    """A batch of P0 and P1; another member acquired P0 before it was written. The batch's
    transaction is refused whole, then P1's records are written alone: P0 is lost, P1 goes on."""
    fence = db.fence()
    handler = BatchLedger(fence, db)
    handler.before = lambda: new_owner(db)
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(4))
    fake.produce_many(TOPIC, 1, range(4))
    fake.script_assign([P0, P1])
    gc = launch(members, handler, fake, fence, workers=1, batch_max_wait_s=0.2)
    wait_until(lambda: handler.lost, "P0 lost to the fence")
    wait_until(lambda: 4 in [o for o, _ in fake.commits_for(P1)], "P1 committed")
    fake.produce_many(TOPIC, 1, [4, 5])
    wait_until(lambda: 6 in [o for o, _ in fake.commits_for(P1)], "P1 goes on")
    assert handler.lost == [[T0]]
    assert db.sink() == [f"{TOPIC}/1/{o}" for o in range(6)]
    assert not any(e.startswith(f"{TOPIC}/0/") for b in handler.batches for e in b)
    assert max((o for o, _ in fake.commits_for(P0)), default=0) <= 0
    assert [p.tp for p in gc.stats().partitions] == [T1]
    assert (handler.applied, handler.replayed) == (6, 0)


def test_fenced_batch_handler_writes_each_event_once_across_replays(
    db: Db, members: list[GroupConsumer]
) -> None:
    """The same records delivered again (a partition revoked before its commit and assigned
    back): the replayed batch writes nothing, and new records are written."""
    fence = db.fence()
    handler = BatchLedger(fence, db)
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(5))
    fake.script_assign([P0])
    launch(members, handler, fake, fence, batch_max_wait_s=0.05, commit_interval_s=60.0)
    wait_until(lambda: len(db.sink()) == 5, "P0@0..4 written")
    before = fence.acquire(GROUP, [T0])[T0]  # as a new owner that never committed: no commit
    second = BatchLedger(db.fence(), db)
    fake2 = FakeConsumer()
    fake2.produce_many(TOPIC, 0, range(7))
    fake2.script_assign([P0])
    launch(members, second, fake2, second.fence, batch_max_wait_s=0.05)
    wait_until(lambda: second.applied == 2, "P0@5..6 written by the second member")
    assert db.stored_epoch(T0) == before + 1
    assert db.sink() == sorted(f"{TOPIC}/0/{o}" for o in range(7))
    assert (second.applied, second.replayed) == (2, 5)


def test_fenced_batch_handler_needs_a_fence_and_a_write(db: Db) -> None:
    with pytest.raises(TypeError, match="fence must be"):
        FencedBatchHandler(object(), GROUP, lambda conn, records: None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"write=function\(conn, records\)"):
        FencedBatchHandler(db.fence(), GROUP)
    with pytest.raises(ValueError, match="group_id"):
        FencedBatchHandler(db.fence(), "", lambda conn, records: None)


# -- FencePruner ------------------------------------------------------------------------------


def _applied(db: Db) -> list[int]:
    return sorted(
        int(r[0])
        for r in db.rows(
            "SELECT record_offset FROM {p}_applied WHERE group_id = ? AND topic = ?",
            (GROUP, TOPIC),
        )
    )


def test_pruner_forgets_the_event_ids_below_each_confirmed_commit(
    db: Db, members: list[GroupConsumer]
) -> None:
    fence = db.fence()
    pruner = FencePruner(fence, GROUP, interval_s=0.05)
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(10))
    fake.script_assign([P0])
    handler = FencedHandler(fence, GROUP, db.write)
    gc = GroupConsumer(handler, consumer_factory=fake.factory, fence=fence, **SETTINGS)
    gc.add_commit_listener(pruner)
    members.append(gc)
    gc.start()
    wait_until(lambda: handler.applied == 10, "10 records applied")
    wait_until(lambda: _applied(db) == [], "the applied ids pruned")
    assert pruner.pruned == 10
    assert len(db.sink()) == 10  # the data stays
    fake.produce_many(TOPIC, 0, range(10, 13))
    wait_until(lambda: handler.applied == 13 and _applied(db) == [], "3 more, pruned")
    gc.stop()
    gc.join(WAIT)
    # Nothing more to prune (and the consumer closed the fence): the pruner's thread ends.
    wait_until(lambda: not any(t.name == "weir-fence-pruner" for t in threading.enumerate()), "")


def test_pruner_prunes_only_confirmed_commits_and_never_backwards(db: Db) -> None:
    fence = db.fence()
    epoch = fence.acquire(GROUP, [T0])[T0]
    for offset in range(6):
        fence.apply(GROUP, _rec(offset), epoch, lambda conn: None)
    with FencePruner(fence, GROUP, interval_s=60) as pruner:
        pruner(CommitEvent(T0, 5, False, "sent"))
        pruner(CommitEvent(T0, 6, False, "failed", "REBALANCE_IN_PROGRESS"))
        assert pruner.prune_now() == 0
        assert _applied(db) == list(range(6))
        pruner(CommitEvent(T0, 3, False, "committed"))
        pruner(CommitEvent(T0, 2, True, "committed"))  # older: changes nothing
        assert pruner.prune_now() == 3
        assert _applied(db) == [3, 4, 5]
        pruner(CommitEvent(T0, 3, False, "committed"))  # already pruned there
        assert pruner.prune_now() == 0


def test_on_assigned_runs_after_the_epochs_are_acquired(
    db: Db, members: list[GroupConsumer]
) -> None:
    """A hook that works with the database (sets up state for its partitions) finds this
    member's epochs there: they are acquired before `on_assigned` runs."""
    timeline = Timeline()

    class Hooked(Observer):
        def on_assigned(self, partitions: Sequence[Partition]) -> None:
            assert self.db is not None
            timeline.add("hook", {tp: self.db.stored_epoch(tp) for tp in partitions})

    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(1))
    fake.script_assign([P0, P1])
    launch(members, Hooked(timeline, db), fake, recording(db.fence(), timeline))
    wait_until(lambda: timeline.of("hook"), "the hook ran")
    assert timeline.first("acquire") < timeline.first("hook")
    assert timeline.of("hook") == [{T0: 1, T1: 1}]
