"""The databases the fencing tests run on: a SQLite file (unit tier) and the throwaway PostgreSQL
server (integration tier), each with tables of its own per test (a uuid prefix).

The suites (tests/fence_suite.py, tests/fenced_consumer_suite.py) take a fixture named for their
database that yields one of these; tests/unit and tests/integration each define it for theirs.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from weir.fencing import Fence, SqliteFence


@dataclass
class FenceDb:
    """One database for one test: fences on it (closed after the test) and plain connections
    for checks. SQL is written with `{p}` for the table prefix and `?` for parameters."""

    name: str
    prefix: str
    _make: Callable[..., Fence[Any]]
    connect: Callable[[], Any]
    fences: list[Fence[Any]] = field(default_factory=list)

    def fence(self, **kwargs: Any) -> Fence[Any]:
        kwargs.setdefault("table_prefix", self.prefix)
        fence = self._make(**kwargs)
        self.fences.append(fence)
        return fence

    def sql(self, text: str) -> str:
        text = text.replace("{p}", self.prefix)
        return text if self.name == "sqlite" else text.replace("?", "%s")

    def execute(self, conn: Any, text: str, params: tuple[Any, ...] = ()) -> None:
        conn.execute(self.sql(text), params)

    def rows(self, text: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        conn = self.connect()
        try:
            return [tuple(row) for row in conn.execute(self.sql(text), params).fetchall()]
        finally:
            conn.close()


D = TypeVar("D", bound=FenceDb)


def _database(
    cls: type[D],
    name: str,
    make: Callable[..., Fence[Any]],
    connect: Callable[[], Any],
    create: Sequence[str],
    tables: Sequence[str],
) -> Iterator[D]:
    db = cls(name, f"t{uuid.uuid4().hex[:12]}", make, connect)
    conn = db.connect()
    for statement in create:
        db.execute(conn, statement)
    conn.close()
    yield db
    for fence in db.fences:
        fence.close()
    if name == "postgres":  # a SQLite file goes with the test's tmp_path
        conn = db.connect()
        for table in (*tables, "epochs", "applied"):
            db.execute(conn, f"DROP TABLE IF EXISTS {{p}}_{table}")
        conn.close()


def sqlite_database(
    cls: type[D], tmp_path: Path, create: Sequence[str], tables: Sequence[str]
) -> Iterator[D]:
    """A fixture's body: `cls` on a SQLite file in `tmp_path`, the `create` statements run."""
    path = tmp_path / "fence.db"

    def make(**kwargs: Any) -> Fence[Any]:
        return SqliteFence(path, **kwargs)

    def connect() -> Any:
        return sqlite3.connect(path, isolation_level=None, timeout=10)

    yield from _database(cls, "sqlite", make, connect, create, tables)


def postgres_database(
    cls: type[D], dsn: str, create: Sequence[str], tables: Sequence[str]
) -> Iterator[D]:
    """A fixture's body: `cls` on the PostgreSQL server at `dsn`; its `tables` (and the fence's)
    are dropped after the test."""
    import psycopg

    from weir.fencing import PostgresFence

    def make(**kwargs: Any) -> Fence[Any]:
        return PostgresFence(dsn, **kwargs)

    def connect() -> Any:
        return psycopg.connect(dsn, autocommit=True)

    yield from _database(cls, "postgres", make, connect, create, tables)
