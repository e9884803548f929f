"""What only the SQLite fence has: a database file (or a connect function) and its mistakes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from weir import Partition, Record
from weir.fencing import FenceUnavailableError, SqliteFence

GROUP = "orders-app"
T0 = Partition("orders", 0)


@pytest.mark.parametrize("database", ["", ":memory:", "file::memory:?cache=shared"])
def test_an_in_memory_database_is_refused_at_construction(database: str) -> None:
    with pytest.raises(ValueError, match="each thread opens its own connection"):
        SqliteFence(database)


def test_a_path_in_a_missing_directory_is_refused_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        SqliteFence(tmp_path / "nowhere" / "fence.db")


def test_a_directory_is_refused_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is a directory"):
        SqliteFence(tmp_path)


def test_a_database_argument_of_another_type_is_refused() -> None:
    with pytest.raises(TypeError, match="database must be a file path or a function"):
        SqliteFence(42)  # type: ignore[arg-type]


def test_a_file_that_is_not_a_database_gives_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"this is not a SQLite database, it is a shopping list\n" * 100)
    fence = SqliteFence(path)
    with pytest.raises(FenceUnavailableError, match=r"notes\.txt") as caught:
        fence.prepare()
    assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)
    assert path.read_bytes().startswith(b"this is not")  # untouched
    fence.close()


def test_a_connect_function_returning_an_in_memory_database_is_refused() -> None:
    fence = SqliteFence(lambda: sqlite3.connect(":memory:"))
    with pytest.raises(ValueError, match="in memory"):
        fence.acquire(GROUP, [T0])
    fence.close()


def test_a_connect_function_returning_something_else_is_refused(tmp_path: Path) -> None:
    fence = SqliteFence(lambda: str(tmp_path))  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match=r"sqlite3\.Connection"):
        fence.prepare()
    fence.close()


def test_a_connect_function_gets_the_fences_settings(tmp_path: Path) -> None:
    path = tmp_path / "custom.db"
    opened: list[sqlite3.Connection] = []

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(path, check_same_thread=False)  # sqlite3's implicit transactions
        opened.append(conn)
        return conn

    fence = SqliteFence(connect, table_prefix="app_fence", timeout_s=2.5)
    epoch = fence.acquire(GROUP, [T0])[T0]

    def write(conn: sqlite3.Connection) -> None:
        assert conn.in_transaction  # the fence's BEGIN IMMEDIATE, not an implicit one
        conn.execute("CREATE TABLE IF NOT EXISTS sink (k TEXT PRIMARY KEY)")
        conn.execute("INSERT INTO sink VALUES ('a')")

    assert fence.apply(GROUP, Record("orders", 0, 1), epoch, write) is True
    [conn] = opened
    assert conn.isolation_level is None
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert conn.execute("PRAGMA busy_timeout").fetchone() == (2500,)
    fence.close()
    check = sqlite3.connect(path)
    assert check.execute("SELECT k FROM sink").fetchall() == [("a",)]
    assert check.execute("SELECT epoch FROM app_fence_epochs").fetchall() == [(1,)]
    check.close()


def test_repr_names_the_file(tmp_path: Path) -> None:
    fence = SqliteFence(tmp_path / "fence.db", table_prefix="x")
    assert repr(fence) == f"SqliteFence({tmp_path / 'fence.db'}, table_prefix='x')"


def test_a_fence_starts_while_another_process_holds_the_write_lock(tmp_path: Path) -> None:
    """Existing tables need no write lock: a member starting (prepare) while another holds
    SQLite's one write lock — a long write, or a member frozen inside one — is not refused.
    Its acquire still waits for the lock, and times out if it is never released."""
    path = tmp_path / "fence.db"
    SqliteFence(path).prepare()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    fence = SqliteFence(path, timeout_s=0.2)
    try:
        fence.prepare()
        with pytest.raises(FenceUnavailableError, match="stayed locked"):
            fence.acquire(GROUP, [T0])
        holder.execute("COMMIT")
        assert fence.acquire(GROUP, [T0]) == {T0: 1}
    finally:
        holder.close()
        fence.close()
