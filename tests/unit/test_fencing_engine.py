"""The fence in GroupConsumer, on the scripted FakeConsumer and a real database (a SQLite file,
and the throwaway PostgreSQL server): epochs acquired on assignment before the first record,
`ctx.epoch`, a `FencedError` from a handler making the partition lost, and a fence that fails."""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from tests import waiting

from weir import (
    CommitEvent,
    Context,
    GroupConsumer,
    Handler,
    HandlerError,
    Partition,
    Record,
    State,
)
from weir.config import ConsumerSettings
from weir.errors import FencedError
from weir.fencing import (
    Fence,
    FencedHandler,
    FencePruner,
    FenceUnavailableError,
    NoEpochError,
    SqliteFence,
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

SETTINGS: ConsumerSettings = {
    "bootstrap_servers": "fake:9092",
    "group_id": GROUP,
    "topics": [TOPIC],
    "poll_timeout_s": 0.01,
    "commit_interval_s": 0.01,
    "commit_every_records": 1,
    "revoke_timeout_s": 2.0,
    "shutdown_timeout_s": 5.0,
    "startup_timeout_s": 1.0,
    "workers": 4,
}

T = TypeVar("T")


def wait_until(pred: Callable[[], T], what: str, timeout: float = WAIT) -> T:
    return waiting.wait_until(pred, what, timeout, every=0.005)


@dataclass
class Db:
    """One database for one test: fences on it, and a plain connection for checks."""

    name: str
    prefix: str
    make: Callable[..., Fence[Any]]
    connect: Callable[[], Any]
    fences: list[Fence[Any]] = field(default_factory=list)

    def fence(self, **kwargs: Any) -> Fence[Any]:
        kwargs.setdefault("table_prefix", self.prefix)
        fence = self.make(**kwargs)
        self.fences.append(fence)
        return fence

    def sql(self, text: str) -> str:
        text = text.replace("{p}", self.prefix)
        return text if self.name == "sqlite" else text.replace("?", "%s")

    def rows(self, text: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        conn = self.connect()
        try:
            return [tuple(r) for r in conn.execute(self.sql(text), params).fetchall()]
        finally:
            conn.close()

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


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Db]:
    prefix = f"e{uuid.uuid4().hex[:12]}"
    if request.param == "sqlite":
        path = tmp_path / "fence.db"

        def make(**kwargs: Any) -> Fence[Any]:
            return SqliteFence(path, **kwargs)

        def connect() -> Any:
            return sqlite3.connect(path, isolation_level=None, timeout=10)

    else:
        import psycopg

        from weir.fencing import PostgresFence

        dsn: str = request.getfixturevalue("postgres_dsn")

        def make(**kwargs: Any) -> Fence[Any]:
            return PostgresFence(dsn, **kwargs)

        def connect() -> Any:
            return psycopg.connect(dsn, autocommit=True)

    found = Db(request.param, prefix, make, connect)
    conn = found.connect()
    conn.execute(found.sql("CREATE TABLE {p}_sink (event_id TEXT NOT NULL, v TEXT)"))
    conn.close()
    yield found
    for fence in found.fences:
        fence.close()
    if found.name == "postgres":
        conn = found.connect()
        for table in ("sink", "epochs", "applied"):
            conn.execute(found.sql(f"DROP TABLE IF EXISTS {{p}}_{table}"))
        conn.close()


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


def test_without_a_fence_ctx_epoch_is_none(members: list[GroupConsumer]) -> None:
    timeline = Timeline()
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(2))
    fake.script_assign([P0])
    launch(members, Observer(timeline), fake, None)
    wait_until(lambda: len(timeline.of("handle")) == 2, "2 records")
    handled = timeline.of("handle")
    assert [epoch for _, _, epoch, _ in handled] == [None, None]


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


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_fence_that_cannot_open_its_database_fails_the_start(tmp_path: Path) -> None:
    path = tmp_path / "not-a-database.db"
    path.write_bytes(b"this is not a SQLite database file, " * 100)
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(2))
    fake.script_assign([P0])
    timeline = Timeline()
    gc = GroupConsumer(
        Observer(timeline), consumer_factory=fake.factory, fence=SqliteFence(path), **SETTINGS
    )
    with pytest.raises(FenceUnavailableError, match="could not open the database"):
        gc.run()
    assert fake.subscription is None  # failed before joining the group
    assert timeline.events == []


def test_a_fence_that_cannot_connect_fails_the_start() -> None:
    pytest.importorskip("psycopg")
    from weir.fencing import PostgresFence

    fence = PostgresFence(
        f"host=127.0.0.1 port={_closed_port()} user=app password=s3cret dbname=x", timeout_s=2
    )
    fake = FakeConsumer()
    fake.script_assign([P0])
    timeline = Timeline()
    gc = GroupConsumer(Observer(timeline), consumer_factory=fake.factory, fence=fence, **SETTINGS)
    started = time.monotonic()
    with pytest.raises(FenceUnavailableError, match="could not connect") as info:
        gc.run()
    assert time.monotonic() - started < 10
    assert "s3cret" not in str(info.value)
    assert "127.0.0.1" in str(info.value)
    assert fake.subscription is None
    assert timeline.events == []


def test_an_acquire_that_fails_stops_the_member_before_any_record_of_it_runs(
    tmp_path: Path, members: list[GroupConsumer]
) -> None:
    """The database's write lock is held elsewhere when the partitions are assigned: acquire
    gives up after timeout_s, and the member stops with that error; no record ran without an
    epoch."""
    path = tmp_path / "fence.db"
    fence = SqliteFence(path, timeout_s=0.2)
    timeline = Timeline()
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3))
    gc = launch(members, Observer(timeline), fake, fence)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        fake.script_assign([P0])
        with pytest.raises(FenceUnavailableError, match="stayed locked"):
            gc.join(WAIT)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert timeline.events == []


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


def test_fenced_handler_without_an_epoch_is_a_clear_non_retryable_error(tmp_path: Path) -> None:
    fence = SqliteFence(tmp_path / "f.db")
    rec = _rec(0)
    with pytest.raises(NoEpochError, match=r"GroupConsumer\(\.\.\., fence=fence\)"):
        FencedHandler(fence, GROUP, lambda conn, r: None).handle(rec, _ctx(rec, None))
    fence.close()


def test_fenced_handler_checks_its_arguments(tmp_path: Path) -> None:
    fence = SqliteFence(tmp_path / "f.db")
    with pytest.raises(TypeError, match="fence must be"):
        FencedHandler(object(), GROUP, lambda conn, r: None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group_id"):
        FencedHandler(fence, "", lambda conn, r: None)
    with pytest.raises(TypeError, match="override write"):
        FencedHandler(fence, GROUP)
    with pytest.raises(TypeError, match="write must be"):
        FencedHandler(fence, GROUP, "INSERT")  # type: ignore[arg-type]
    fence.close()


def test_a_fenced_handler_without_a_fence_on_the_consumer_stops_the_member(
    tmp_path: Path, members: list[GroupConsumer]
) -> None:
    fence = SqliteFence(tmp_path / "f.db")
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(2))
    fake.script_assign([P0])
    gc = launch(members, FencedHandler(fence, GROUP, lambda conn, r: None), fake, None)
    with pytest.raises(HandlerError, match="fence=fence") as info:
        gc.join(WAIT)
    assert isinstance(info.value.__cause__, NoEpochError)
    assert not any(P0 in c.offsets and c.offsets[P0] > 0 for c in fake.commit_log())
    fence.close()


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


def test_pruner_checks_its_arguments(tmp_path: Path) -> None:
    fence = SqliteFence(tmp_path / "f.db")
    with pytest.raises(TypeError, match="fence must be"):
        FencePruner(object(), GROUP)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group_id"):
        FencePruner(fence, "")
    with pytest.raises(ValueError, match="interval_s"):
        FencePruner(fence, GROUP, interval_s=0)
    fence.close()


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
