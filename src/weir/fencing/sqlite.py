"""The fence on SQLite (stdlib ``sqlite3``): one connection per thread, WAL, BEGIN IMMEDIATE."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from weir.errors import FenceUnavailableError
from weir.fencing.base import (
    DEFAULT_TABLE_PREFIX,
    DEFAULT_TIMEOUT_S,
    FenceBase,
    PerThread,
    Using,
    WriteProgress,
    check_epochs,
    check_group,
    check_offset,
    check_partition,
    check_partitions,
    check_prefix,
    check_seconds,
)
from weir.logs import get_logger
from weir.records import Partition, Record

__all__ = ["SqliteFence"]

log = get_logger(__name__)

_MEMORY_HINT = (
    "each thread opens its own connection, so an in-memory database would be a different, empty "
    "database per thread; use a file"
)


class SqliteFence(FenceBase[sqlite3.Connection]):
    """A fence whose epochs and applied event ids live in a SQLite database file.

    ``database`` is a file path (its directory must exist; the file is created) or a function
    returning a new ``sqlite3.Connection`` for custom settings; it is called once per thread.
    Every transaction of the fence is ``BEGIN IMMEDIATE``: it takes SQLite's single write lock
    before it reads the epoch, so an ``acquire`` waits for a write in progress to commit or roll
    back, and a write that starts later sees the new epoch. Waits for that lock last at most
    ``timeout_s`` (SQLite's busy timeout), then raise ``FenceUnavailableError``.

    The database is switched to WAL mode (readers do not block the writer). Writes of all
    threads are serialised by SQLite itself; the fence adds no lock of its own.
    """

    def __init__(
        self,
        database: str | os.PathLike[str] | Callable[[], sqlite3.Connection],
        *,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self._prefix = check_prefix(table_prefix)
        timeout = check_seconds("timeout_s", timeout_s)
        assert timeout is not None
        self._timeout_s = timeout
        self._path: Path | None = None
        self._connect: Callable[[], sqlite3.Connection]
        if isinstance(database, (str, os.PathLike)):
            self._path = _check_path(database)
            path = self._path
            self._connect = lambda: sqlite3.connect(
                path, timeout=timeout, isolation_level=None, check_same_thread=False
            )
        elif callable(database):
            self._connect = database
        else:
            raise TypeError(
                "database must be a file path or a function returning a sqlite3.Connection, got "
                f"{type(database).__name__}"
            )
        self._epochs = f"{self._prefix}_epochs"
        self._applied = f"{self._prefix}_applied"
        self._conns = PerThread(repr(self), self._open, _close_quietly, lambda _conn: True)
        self._ready = False
        self._ready_lock = threading.Lock()

    def __repr__(self) -> str:
        where = str(self._path) if self._path is not None else "connect=<function>"
        return f"SqliteFence({where}, table_prefix={self._prefix!r})"

    # -- the Fence protocol --

    def prepare(self) -> None:
        """Connect and create the tables now (otherwise the first `acquire` or `apply` does)."""
        with self._using("prepare()"):
            pass

    def acquire(self, group_id: str, partitions: Iterable[Partition]) -> dict[Partition, int]:
        """Increment and return the epoch of each partition of `group_id` in one transaction:
        after it returns, no write holding an older epoch of these partitions can commit."""
        group = check_group(group_id)
        wanted = check_partitions(partitions)
        if not wanted:
            return {}
        epochs: dict[Partition, int] = {}
        with self._using("acquire()") as conn, self._immediate(conn, f"acquire {group!r}"):
            for tp in wanted:
                conn.execute(
                    f"INSERT INTO {self._epochs} (group_id, topic, partition, epoch) "
                    "VALUES (?, ?, ?, 1) ON CONFLICT (group_id, topic, partition) "
                    "DO UPDATE SET epoch = epoch + 1",
                    (group, tp.topic, tp.partition),
                )
                stored = self._stored(conn, group, tp)
                assert stored is not None  # just written, under the write lock
                epochs[tp] = stored
        log.info("fence_acquired", group_id=group, epochs={str(k): v for k, v in epochs.items()})
        return epochs

    def prune(self, group_id: str, partition: Partition, before_offset: int) -> int:
        """Forget the applied event ids of `partition` below `before_offset` (a committed
        offset); returns how many were removed."""
        group = check_group(group_id)
        tp = check_partition(partition)
        below = check_offset("before_offset", before_offset)
        with self._using("prune()") as conn, self._immediate(conn, f"prune {tp}"):
            removed = conn.execute(
                f"DELETE FROM {self._applied} WHERE group_id = ? AND topic = ? AND partition = ? "
                "AND record_offset < ?",
                (group, tp.topic, tp.partition, below),
            ).rowcount
        return removed

    def close(self) -> None:
        """Close every connection the fence opened; it cannot be used afterwards."""
        self._conns.close_all()

    # -- internals --

    def _fenced(
        self,
        group: str,
        batch: list[Record],
        held: dict[Partition, int],
        write: Callable[[sqlite3.Connection, list[Record]], object],
        what: str,
    ) -> list[Record]:
        """One transaction for the records of ``batch`` (one record: ``apply``): check every
        partition's epoch, claim the event ids, ``write`` the fresh records, commit."""
        progress = WriteProgress()
        fresh: list[Record] = []
        try:
            # IMMEDIATE: the write lock is ours before the epochs are read and until COMMIT, so
            # no acquire can bump an epoch between this check and the commit.
            with self._using(what) as conn, self._immediate(conn, what, progress):
                stored = {tp: self._stored(conn, group, tp) for tp in held}
                check_epochs(group, batch, held, stored)
                for r in batch:
                    claimed = conn.execute(
                        f"INSERT INTO {self._applied} "
                        "(group_id, topic, partition, record_offset, epoch) "
                        "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                        (
                            group,
                            r.topic,
                            r.partition,
                            r.offset,
                            held[Partition(r.topic, r.partition)],
                        ),
                    ).rowcount
                    if claimed:
                        fresh.append(r)
                if not fresh:
                    raise _Replay
                progress.called = progress.in_write = True
                write(conn, fresh)
                progress.in_write = False
                if not conn.in_transaction:
                    raise RuntimeError(
                        f"the write function ({what}) ended the fence's transaction "
                        "(commit or rollback): leave that to the fence, or its writes are no "
                        "longer fenced or recorded together with the event ids"
                    )
        except _Replay:
            return []
        return fresh

    def _stored(self, conn: sqlite3.Connection, group: str, tp: Partition) -> int | None:
        row = conn.execute(
            f"SELECT epoch FROM {self._epochs} WHERE group_id = ? AND topic = ? AND partition = ?",
            (group, tp.topic, tp.partition),
        ).fetchone()
        return None if row is None else int(row[0])

    @contextlib.contextmanager
    def _using(self, what: str) -> Iterator[sqlite3.Connection]:
        with Using(self._conns.slot(), what) as conn:
            self._create_tables(conn)
            yield conn

    @contextlib.contextmanager
    def _immediate(
        self, conn: sqlite3.Connection, what: str, progress: WriteProgress | None = None
    ) -> Iterator[None]:
        """One BEGIN IMMEDIATE … COMMIT transaction. SQLite's errors become
        FenceUnavailableError, except those raised by a write function, which are the caller's."""
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            if "locked" in str(exc):
                why = f"the database stayed locked for {self._timeout_s} s ({exc})"
            else:
                why = str(exc)
            raise FenceUnavailableError(f"{self!r}: could not {what}: {why}") from exc
        try:
            yield
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error) and not (progress is not None and progress.in_write):
                raise FenceUnavailableError(f"{self!r}: could not {what}: {exc}") from exc
            raise

    def _open(self) -> sqlite3.Connection:
        try:
            conn = self._connect()
        except sqlite3.Error as exc:
            raise FenceUnavailableError(f"{self!r}: could not open the database: {exc}") from exc
        if not isinstance(conn, sqlite3.Connection):
            raise TypeError(
                f"the database function must return a sqlite3.Connection, got {type(conn).__name__}"
            )
        try:
            # The fence issues BEGIN/COMMIT itself; sqlite3's implicit transactions would begin
            # DEFERRED ones, which read the epoch without holding the write lock.
            conn.isolation_level = None
            row = conn.execute("SELECT file FROM pragma_database_list WHERE name = 'main'")
            if not row.fetchone()[0]:
                conn.close()
                raise ValueError(f"{self!r}: the database is in memory; {_MEMORY_HINT}")
            conn.execute(f"PRAGMA busy_timeout = {round(self._timeout_s * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.Error as exc:
            conn.close()
            raise FenceUnavailableError(f"{self!r}: could not open the database: {exc}") from exc
        return conn

    def _create_tables(self, conn: sqlite3.Connection) -> None:
        if self._ready:
            return
        with self._ready_lock:
            if self._ready:
                return
            # Existing tables need no write lock (a read, which WAL never blocks): a member can
            # start while another holds SQLite's one write lock, in a long write or frozen in it.
            try:
                found = conn.execute(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN (?, ?)",
                    (self._epochs, self._applied),
                ).fetchone()[0]
            except sqlite3.Error as exc:
                raise FenceUnavailableError(
                    f"{self!r}: could not read the fence tables: {exc}"
                ) from exc
            if found == 2:
                self._ready = True
                return
            with self._immediate(conn, "create the fence tables"):
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {self._epochs} ("
                    "group_id TEXT NOT NULL, topic TEXT NOT NULL, partition INTEGER NOT NULL, "
                    "epoch INTEGER NOT NULL, PRIMARY KEY (group_id, topic, partition))"
                )
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {self._applied} ("
                    "group_id TEXT NOT NULL, topic TEXT NOT NULL, partition INTEGER NOT NULL, "
                    "record_offset INTEGER NOT NULL, epoch INTEGER NOT NULL, "
                    "PRIMARY KEY (group_id, topic, partition, record_offset))"
                )
            self._ready = True


class _Replay(Exception):
    """The event id was applied before: roll back, report False."""


def _check_path(database: str | os.PathLike[str]) -> Path:
    text = os.fspath(database)
    if text in ("", ":memory:") or text.startswith("file:"):
        raise ValueError(
            f"database must be a file path, got {text!r}: {_MEMORY_HINT} (for a URI or other "
            "settings pass a function returning a sqlite3.Connection)"
        )
    path = Path(text).expanduser()
    if not path.parent.is_dir():
        raise ValueError(f"database: the directory of {str(path)!r} does not exist")
    if path.is_dir():
        raise ValueError(f"database: {str(path)!r} is a directory, not a database file")
    return path


def _close_quietly(conn: sqlite3.Connection) -> None:
    with contextlib.suppress(sqlite3.Error):
        conn.close()
