"""The fence in GroupConsumer on the scripted FakeConsumer: every test of
tests/fenced_consumer_suite.py on a SQLite file (tests/integration/test_fencing_postgres.py runs
them on PostgreSQL), and what needs no database: no fence, a fence that cannot open or connect,
an acquire that fails, and the arguments of FencedHandler and FencePruner."""

from __future__ import annotations

import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.fake_members import SETTINGS
from tests.fenced_consumer_suite import *  # noqa: F403 (the suite's tests, collected here)
from tests.fenced_consumer_suite import (
    GROUP,
    P0,
    TOPIC,
    WAIT,
    Db,
    Observer,
    Timeline,
    _ctx,
    _rec,
    launch,
    sqlite_db,
    wait_until,
)

from weir import GroupConsumer, HandlerError
from weir.fencing import (
    FencedHandler,
    FencePruner,
    FenceUnavailableError,
    NoEpochError,
    SqliteFence,
)
from weir.testing.fake import FakeConsumer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Db]:
    yield from sqlite_db(tmp_path)


def test_without_a_fence_ctx_epoch_is_none(members: list[GroupConsumer]) -> None:
    timeline = Timeline()
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(2))
    fake.script_assign([P0])
    launch(members, Observer(timeline), fake, None)
    wait_until(lambda: len(timeline.of("handle")) == 2, "2 records")
    handled = timeline.of("handle")
    assert [epoch for _, _, epoch, _ in handled] == [None, None]


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


def test_pruner_checks_its_arguments(tmp_path: Path) -> None:
    fence = SqliteFence(tmp_path / "f.db")
    with pytest.raises(TypeError, match="fence must be"):
        FencePruner(object(), GROUP)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group_id"):
        FencePruner(fence, "")
    with pytest.raises(ValueError, match="interval_s"):
        FencePruner(fence, GROUP, interval_s=0)
    fence.close()
