"""The PostgreSQL fence, on the throwaway server of weir.testing.postgres: every test of
tests/fence_suite.py (the fence) and tests/fenced_consumer_suite.py (the fence in GroupConsumer),
which tests/unit runs on SQLite; and what only PostgreSQL has: connection strings, unreachable
servers, a frozen writer, connections dropped by the server, and the throwaway server itself."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fence_suite import *  # noqa: F403 (the suites' tests, collected here)
from tests.fence_suite import Backend, batch_writer, postgres_backend, rec
from tests.fenced_consumer_suite import *  # noqa: F403
from tests.fenced_consumer_suite import Db, postgres_db
from weir import Partition, Record
from weir.testing.broker import pick_free_port
from weir.testing.errors import PortInUseError
from weir.testing.postgres import (
    ENV_BINDIR,
    EmbeddedPostgres,
    PostgresNotFoundError,
    find_postgres_bindir,
)

psycopg = pytest.importorskip(
    "psycopg", reason="psycopg is not installed: pip install 'kafka-weir[postgres]'"
)

from weir.errors import FencedError  # noqa: E402
from weir.fencing import FenceUnavailableError, PostgresFence  # noqa: E402

GROUP = "orders-app"
T0 = Partition("orders", 0)
T1 = Partition("orders", 1)
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def backend(postgres_dsn: str) -> Iterator[Backend]:
    yield from postgres_backend(postgres_dsn)


@pytest.fixture
def db(postgres_dsn: str) -> Iterator[Db]:
    yield from postgres_db(postgres_dsn)


@pytest.fixture
def prefix(postgres_dsn: str) -> Iterator[str]:
    name = f"t{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for table in ("epochs", "applied", "sink"):
            conn.execute(f"DROP TABLE IF EXISTS {name}_{table}")


def sink_write(prefix: str, key: str) -> Any:
    def write(conn: Any) -> None:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {prefix}_sink (k text PRIMARY KEY)")
        conn.execute(f"INSERT INTO {prefix}_sink VALUES (%s) ON CONFLICT DO NOTHING", (key,))

    return write


def sessions(dsn: str, application_name: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            (application_name,),
        ).fetchone()
        return int(row[0])


def wait_for(predicate: Callable[[], object], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


# --- unreachable or wrong databases ------------------------------------------------------------


def test_a_malformed_conninfo_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="conninfo is not a valid PostgreSQL connection string"):
        PostgresFence("host=127.0.0.1 port")
    with pytest.raises(TypeError, match="conninfo must be"):
        PostgresFence(5432)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="idle_in_transaction_timeout_s"):
        PostgresFence("", idle_in_transaction_timeout_s=0)


def test_a_closed_port_fails_at_once_without_showing_the_password() -> None:
    port = pick_free_port()  # nobody listens there
    fence = PostgresFence(
        f"host=127.0.0.1 port={port} user=app password=s3cret-pw dbname=orders", timeout_s=5
    )
    assert "s3cret" not in repr(fence)
    assert f"port={port}" in repr(fence)
    started = time.monotonic()
    with pytest.raises(FenceUnavailableError, match="could not connect") as caught:
        fence.acquire(GROUP, [T0])
    assert time.monotonic() - started < 2
    assert "Connection refused" in str(caught.value)
    assert "s3cret" not in str(caught.value)
    fence.close()


def test_a_server_that_never_answers_fails_after_the_connect_timeout() -> None:
    with socket.socket() as listener:  # accepts TCP (the kernel's backlog), never speaks
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        fence = PostgresFence(f"host=127.0.0.1 port={port} user=app dbname=x", timeout_s=1)
        started = time.monotonic()
        with pytest.raises(FenceUnavailableError, match="timeout"):
            fence.acquire(GROUP, [T0])
        took = time.monotonic() - started
        fence.close()
    # libpq's connect_timeout counts whole seconds, 2 at least.
    assert 1.5 < took < 6


def test_an_unknown_database_is_named_in_the_error(postgres_dsn: str) -> None:
    fence = PostgresFence(postgres_dsn.replace("dbname=postgres", "dbname=no_such_db"))
    with pytest.raises(FenceUnavailableError, match='"no_such_db" does not exist'):
        fence.prepare()
    fence.close()


# --- connections -------------------------------------------------------------------------------


def test_one_session_per_thread_each_closed_when_its_thread_ends_or_the_fence_closes(
    postgres_dsn: str, prefix: str
) -> None:
    app = f"weir-test-{uuid.uuid4().hex[:8]}"
    fence = PostgresFence(f"{postgres_dsn} application_name={app}", table_prefix=prefix)
    epoch = fence.acquire(GROUP, [T0])[T0]
    assert sessions(postgres_dsn, app) == 1  # this thread's
    inside = threading.Barrier(4, timeout=30)

    def writer(offset: int) -> None:
        def write(conn: Any) -> None:
            inside.wait()  # three transactions open at once, next to the main thread's session

        fence.apply(GROUP, Record("orders", 0, offset), epoch, write)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    assert wait_for(lambda: sessions(postgres_dsn, app) == 4)
    inside.wait()
    for thread in threads:
        thread.join(10)
    assert wait_for(lambda: sessions(postgres_dsn, app) == 1)  # ended threads closed theirs
    fence.close()
    assert wait_for(lambda: sessions(postgres_dsn, app) == 0)


def test_a_connection_dropped_by_the_server_is_replaced(postgres_dsn: str, prefix: str) -> None:
    app = f"weir-test-{uuid.uuid4().hex[:8]}"
    fence = PostgresFence(f"{postgres_dsn} application_name={app}", table_prefix=prefix)
    epoch = fence.acquire(GROUP, [T0])[T0]
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (app,),
        )
    assert wait_for(lambda: sessions(postgres_dsn, app) == 0)
    # A restarted server or a reaped idle connection: the next calls reconnect by themselves.
    assert fence.acquire(GROUP, [T0]) == {T0: epoch + 1}
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (app,),
        )
    assert fence.apply(GROUP, Record("orders", 0, 1), epoch + 1, sink_write(prefix, "a")) is True
    fence.close()


def test_a_connect_function_is_called_once_per_thread(postgres_dsn: str, prefix: str) -> None:
    made: list[Any] = []

    def connect() -> Any:
        conn = psycopg.connect(postgres_dsn)  # not autocommit: the fence switches it
        made.append(conn)
        return conn

    fence = PostgresFence(connect, table_prefix=prefix)
    assert "conninfo=<function>" in repr(fence)
    epoch = fence.acquire(GROUP, [T0])[T0]
    assert fence.apply(GROUP, Record("orders", 0, 1), epoch, sink_write(prefix, "a")) is True
    assert len(made) == 1 and made[0].autocommit
    with psycopg.connect(postgres_dsn) as check:
        assert check.execute(f"SELECT k FROM {prefix}_sink").fetchall() == [("a",)]
    fence.close()
    assert made[0].closed


def test_a_frozen_writer_is_cut_off_by_the_server_and_the_new_owner_goes_on(
    postgres_dsn: str, prefix: str
) -> None:
    """A member stopped (SIGSTOP, a GC pause) in the middle of a write holds its transaction, and
    the claim on the record's event id, open. The server ends that session after
    idle_in_transaction_timeout_s; the new owner, waiting on the claim, then applies the record."""
    old = PostgresFence(postgres_dsn, table_prefix=prefix, idle_in_transaction_timeout_s=1.0)
    new = PostgresFence(postgres_dsn, table_prefix=prefix)
    held = old.acquire(GROUP, [T0])[T0]
    frozen = threading.Event()
    outcome: dict[str, Any] = {}

    def freeze(conn: Any) -> None:
        sink_write(prefix, "zombie")(conn)
        frozen.set()
        time.sleep(3)  # sends nothing to the server, like a stopped process

    def old_owner() -> None:
        try:
            old.apply(GROUP, Record("orders", 0, 5), held, freeze)
        except BaseException as exc:
            outcome["old"] = exc

    thread = threading.Thread(target=old_owner)
    thread.start()
    assert frozen.wait(10)
    epoch = new.acquire(GROUP, [T0])[T0]
    started = time.monotonic()
    assert new.apply(GROUP, Record("orders", 0, 5), epoch, sink_write(prefix, "owner")) is True
    waited = time.monotonic() - started
    thread.join(10)
    assert 0.3 < waited < 2.9  # cut off by the server's timeout, not by the zombie waking up
    assert isinstance(outcome["old"], FenceUnavailableError)
    with psycopg.connect(postgres_dsn) as check:
        assert check.execute(f"SELECT k FROM {prefix}_sink").fetchall() == [("owner",)]
        assert check.execute(f"SELECT epoch FROM {prefix}_applied").fetchall() == [(epoch,)]
    # The old fence's thread connection was ended by the server; a later write of the old epoch
    # is fenced as any other.
    with pytest.raises(FencedError):
        old.apply(GROUP, Record("orders", 0, 6), held, sink_write(prefix, "late"))
    old.close()
    new.close()


# --- the throwaway server ----------------------------------------------------------------------


def test_embedded_postgres_starts_on_a_free_port_and_leaves_nothing_behind() -> None:
    try:
        bindir = find_postgres_bindir()
    except PostgresNotFoundError as exc:
        pytest.skip(str(exc))
    server = EmbeddedPostgres(bindir=bindir)
    with server:
        assert server.running
        assert server.started_in_s is not None and server.started_in_s < 60
        with psycopg.connect(server.dsn) as conn:
            assert conn.execute("SHOW fsync").fetchone() == ("off",)
        workdir = server.workdir
        assert workdir is not None and (workdir / "data" / "PG_VERSION").exists()
        pid = server.pid
        with pytest.raises(PortInUseError):
            EmbeddedPostgres(bindir=bindir, port=server.port).start()
    assert not server.running
    assert not workdir.exists()
    assert (pid is not None and not Path(f"/proc/{pid}").exists()) or _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_a_bindir_without_postgres_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_BINDIR, str(tmp_path))
    with pytest.raises(PostgresNotFoundError, match=ENV_BINDIR):
        find_postgres_bindir()


def test_a_batch_whose_epoch_moves_during_its_write_leaves_nothing(backend: Backend) -> None:
    """Acquire does not wait for a write function, and the batch is refused at its final
    check, every partition of it. (SQLite's acquire waits for the write's commit: the suite's
    test of a write in flight during acquire.)"""
    old, new = backend.fence(), backend.fence()
    held = old.acquire(GROUP, [T0, T1])
    calls: list[list[str]] = []
    write = batch_writer(backend, calls)

    def write_then_lose_t1(conn: Any, records: list[Record]) -> None:
        write(conn, records)
        acquirer = threading.Thread(target=new.acquire, args=(GROUP, [T1]))
        acquirer.start()
        acquirer.join(10)
        assert not acquirer.is_alive()

    batch = [rec(T0, 0), rec(T1, 0), rec(T0, 1), rec(T1, 1)]
    with pytest.raises(FencedError) as caught:
        old.apply_batch(GROUP, batch, held, write_then_lose_t1)
    assert (caught.value.partition, caught.value.held, caught.value.stored) == (T1, 1, 2)
    assert len(calls) == 1  # the write ran, and none of it remains, of either partition
    assert backend.sink() == {} and backend.applied() == []
    assert backend.rows("SELECT n FROM {p}_counter") == [(0,)]
    assert backend.epochs() == {T0: 1, T1: 2}
