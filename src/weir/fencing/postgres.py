"""The fence on PostgreSQL (psycopg 3): one connection per thread, READ COMMITTED, row locks."""

from __future__ import annotations

import contextlib
import json
import math
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict

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

__all__ = ["PostgresFence"]

log = get_logger(__name__)

T = TypeVar("T")

DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT_S = 60.0
_SHOWN_PARAMS = ("host", "hostaddr", "port", "dbname", "user")


class PostgresFence(FenceBase[psycopg.Connection[Any]]):
    """A fence whose epochs and applied event ids live in PostgreSQL.

    ``conninfo`` is a libpq connection string or URI (empty: libpq's defaults and ``PG*``
    environment variables), or a function returning a new ``psycopg.Connection``; either is
    used once per thread. The fence sets its connections to autocommit (it issues BEGIN and
    COMMIT itself) and READ COMMITTED.

    A write locks its partitions' epoch rows ``FOR SHARE`` after the write function ran, checks
    the epochs once more and commits: an ``acquire`` (an UPDATE of such a row) waits for writes
    in that short window and is seen by every later one, while writes of one partition still run
    in parallel. The event ids are claimed first, with ``INSERT … ON CONFLICT DO NOTHING``: two
    transactions of the same record wait for each other, and only one applies. A batch
    (``apply_batch``) is one such transaction for all its records and partitions.

    Bounds: connecting, and each statement of ``acquire``, ``prune`` and the table set-up (lock
    waits included) take at most ``timeout_s`` (libpq's ``connect_timeout`` rounds it up to
    whole seconds, at least 2). ``idle_in_transaction_timeout_s`` is set on the fence's sessions
    so that the server ends a transaction whose process stopped (a frozen member) and releases
    its locks; None leaves the server's setting.
    """

    def __init__(
        self,
        conninfo: str | Callable[[], psycopg.Connection[Any]] = "",
        *,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        idle_in_transaction_timeout_s: float | None = DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT_S,
    ) -> None:
        self._prefix = check_prefix(table_prefix)
        timeout = check_seconds("timeout_s", timeout_s)
        assert timeout is not None
        self._timeout_ms = str(math.ceil(timeout * 1000))
        self._timeout_s = timeout
        idle = check_seconds(
            "idle_in_transaction_timeout_s", idle_in_transaction_timeout_s, optional=True
        )
        self._idle_ms = None if idle is None else str(math.ceil(idle * 1000))
        self._params: dict[str, Any] | None = None
        self._factory: Callable[[], psycopg.Connection[Any]] | None = None
        if isinstance(conninfo, str):
            try:
                params = conninfo_to_dict(conninfo)
            except psycopg.ProgrammingError as exc:
                raise ValueError(
                    f"conninfo is not a valid PostgreSQL connection string: {exc}"
                ) from None
            params.setdefault("connect_timeout", max(2, math.ceil(timeout)))
            params.setdefault("application_name", "weir-fence")
            self._params = params
        elif callable(conninfo):
            self._factory = conninfo
        else:
            raise TypeError(
                "conninfo must be a connection string or a function returning a "
                f"psycopg.Connection, got {type(conninfo).__name__}"
            )
        self._epochs = f"{self._prefix}_epochs"
        self._applied = f"{self._prefix}_applied"
        # Both statements of a fenced write in two forms with the same result rows: one record
        # by value, a batch as two JSON arrays, [[topic, partition, offset, epoch], ...] and
        # [[topic, partition], ...] (two text parameters whatever its size). The batch form
        # costs the server twice the one-record form's time per call (planning the JSON).
        current = (
            "current AS (SELECT topic, partition, epoch FROM {epochs} WHERE group_id = %(g)s "
            "AND {which}), "
        )
        claimed = (
            "claimed AS (INSERT INTO {applied} (group_id, topic, partition, record_offset, epoch) "
            "{rows} ON CONFLICT DO NOTHING RETURNING topic, partition, record_offset) "
            "SELECT topic, partition, epoch, NULL::bigint FROM current "
            "UNION ALL SELECT topic, partition, NULL::bigint, record_offset FROM claimed"
        )
        one = "topic = %(t)s AND partition = %(p)s"
        many = (
            "(topic, partition) IN (SELECT x->>0, (x->>1)::integer "
            "FROM jsonb_array_elements(%(ps)s::jsonb) x)"
        )
        names = {"epochs": self._epochs, "applied": self._applied}
        self._claim_one = "WITH " + (current + claimed).format(
            **names,
            which=one,
            rows="SELECT %(g)s, topic, partition, %(o)s, epoch FROM current WHERE epoch = %(e)s",
        )
        self._claim_many = "WITH " + (
            current + "wanted AS (SELECT x->>0 AS topic, (x->>1)::integer AS partition, "
            "(x->>2)::bigint AS record_offset, (x->>3)::bigint AS epoch, n "
            "FROM jsonb_array_elements(%(rs)s::jsonb) WITH ORDINALITY AS j(x, n)), " + claimed
        ).format(
            **names,
            which=many,
            rows="SELECT %(g)s, w.topic, w.partition, w.record_offset, w.epoch FROM wanted w "
            "JOIN current c ON c.topic = w.topic AND c.partition = w.partition "
            "AND c.epoch = w.epoch ORDER BY w.n",
        )
        lock = (
            f"SELECT topic, partition, epoch FROM {self._epochs} WHERE group_id = %(g)s "
            "AND {which} ORDER BY topic, partition FOR SHARE"
        )
        self._lock_one = lock.format(which=one)
        self._lock_many = lock.format(which=many)
        self._conns = PerThread(repr(self), self._open, _close_quietly, _usable)
        self._ready = False
        self._ready_lock = threading.Lock()

    def __repr__(self) -> str:
        # Never the whole conninfo: it may hold a password.
        if self._params is None:
            where = "conninfo=<function>"
        else:
            shown = [f"{k}={self._params[k]}" for k in _SHOWN_PARAMS if k in self._params]
            where = repr(" ".join(shown))
        return f"PostgresFence({where}, table_prefix={self._prefix!r})"

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

        def bump(conn: psycopg.Connection[Any]) -> dict[Partition, int]:
            epochs: dict[Partition, int] = {}
            with conn.transaction(), conn.cursor() as cur:
                self._bound(conn)
                # Sorted, one row after another: two acquirers lock overlapping rows in the same
                # order. The UPDATE waits for writes holding the row FOR SHARE (lock_timeout).
                cur.executemany(
                    f"INSERT INTO {self._epochs} AS e (group_id, topic, partition, epoch) "
                    "VALUES (%s, %s, %s, 1) ON CONFLICT (group_id, topic, partition) "
                    "DO UPDATE SET epoch = e.epoch + 1 RETURNING epoch",
                    [(group, tp.topic, tp.partition) for tp in wanted],
                    returning=True,
                )
                for tp in wanted:
                    row = cur.fetchone()
                    assert row is not None
                    epochs[tp] = int(row[0])
                    cur.nextset()
            return epochs

        # A retry after a lost COMMIT may bump twice: harmless, epochs only have to grow.
        epochs = self._run(f"acquire for group {group!r}", bump)
        log.info("fence_acquired", group_id=group, epochs={str(k): v for k, v in epochs.items()})
        return epochs

    def prune(self, group_id: str, partition: Partition, before_offset: int) -> int:
        """Forget the applied event ids of `partition` below `before_offset` (a committed
        offset); returns how many were removed."""
        group = check_group(group_id)
        tp = check_partition(partition)
        below = check_offset("before_offset", before_offset)

        def delete(conn: psycopg.Connection[Any]) -> int:
            with conn.transaction():
                self._bound(conn)
                cur = conn.execute(
                    f"DELETE FROM {self._applied} WHERE group_id = %s AND topic = %s "
                    "AND partition = %s AND record_offset < %s",
                    (group, tp.topic, tp.partition, below),
                )
                return cur.rowcount

        return self._run(f"prune {tp}", delete)

    def close(self) -> None:
        """Close every connection the fence opened; it cannot be used afterwards."""
        self._conns.close_all()

    # -- internals --

    def _fenced(
        self,
        group: str,
        batch: list[Record],
        held: dict[Partition, int],
        write: Callable[[psycopg.Connection[Any], list[Record]], object],
        what: str,
    ) -> list[Record]:
        """One transaction for the records of ``batch`` (one record: ``apply``): check every
        partition's epoch and claim the event ids, ``write`` the fresh records, lock and check
        the epochs again, commit."""
        key: dict[str, Any]
        if len(batch) == 1:
            r = batch[0]
            claim, lock = self._claim_one, self._lock_one
            key = {"g": group, "t": r.topic, "p": r.partition, "o": r.offset}
            key["e"] = held[Partition(r.topic, r.partition)]
        else:
            claim, lock = self._claim_many, self._lock_many
            # Claimed in one order by every writer: two batches holding the same records (an
            # old and a new owner) wait for each other instead of deadlocking.
            order = sorted(batch, key=lambda r: (r.topic, r.partition, r.offset))
            rows = [
                (r.topic, r.partition, r.offset, held[Partition(r.topic, r.partition)])
                for r in order
            ]
            key = {"g": group, "rs": json.dumps(rows), "ps": json.dumps(list(held))}
        progress = WriteProgress()

        def fenced_write(conn: psycopg.Connection[Any]) -> list[Record]:
            fresh: list[Record] = []
            with conn.transaction():
                # One round trip: read the epochs (no lock yet) and claim the event ids of the
                # records whose epoch matches. A concurrent claim of the same id waits for it.
                stored: dict[Partition, int] = {}
                claimed: set[tuple[str, int, int]] = set()
                for topic, partition, epoch, offset in conn.execute(claim, key):
                    if offset is None:
                        stored[Partition(topic, partition)] = int(epoch)
                    else:
                        claimed.add((topic, partition, int(offset)))
                check_epochs(group, batch, held, stored)
                fresh = [r for r in batch if (r.topic, r.partition, r.offset) in claimed]
                if not fresh:
                    raise psycopg.Rollback
                progress.called = progress.in_write = True
                write(conn, fresh)
                progress.in_write = False
                # The check that counts: FOR SHARE conflicts with acquire's UPDATE, so from here
                # to COMMIT no acquire can slip in, and one that committed first is seen. The
                # rows are locked in acquire's order (sorted), so the two cannot deadlock.
                stored = {
                    Partition(topic, partition): int(epoch)
                    for topic, partition, epoch in conn.execute(lock, key)
                }
                check_epochs(group, batch, held, stored)
            return fresh

        return self._run(what, fenced_write, progress)

    def _bound(self, conn: psycopg.Connection[Any]) -> None:
        """Bound this transaction's statements and lock waits by timeout_s (reset at its end)."""
        conn.execute(
            "SELECT set_config('lock_timeout', %(ms)s, true), "
            "set_config('statement_timeout', %(ms)s, true)",
            {"ms": self._timeout_ms},
        )

    @contextlib.contextmanager
    def _using(self, what: str) -> Iterator[psycopg.Connection[Any]]:
        with Using(self._conns.slot(), what) as conn:
            self._create_tables(conn)
            yield conn

    def _run(
        self,
        what: str,
        op: Callable[[psycopg.Connection[Any]], T],
        progress: WriteProgress | None = None,
    ) -> T:
        """``op(conn)`` on this thread's connection. The database's errors become
        FenceUnavailableError, except those raised by a write function, which are the caller's.
        A connection found dead before a write function ran (a server restart, an idle
        connection dropped) is replaced once: nothing was changed through it."""
        progress = progress or WriteProgress()
        for attempt in (1, 2):
            with self._using(what) as conn:
                try:
                    return op(conn)
                except psycopg.Error as exc:
                    if progress.in_write:
                        raise
                    if attempt == 1 and conn.broken and not progress.called:
                        log.info(
                            "fence_connection_replaced", what=what, reason="the connection was dead"
                        )
                        continue
                    raise self._unavailable(what, exc, progress.called) from exc
        raise AssertionError("unreachable")

    def _unavailable(
        self, what: str, exc: psycopg.Error, wrote: bool = False
    ) -> FenceUnavailableError:
        if isinstance(exc, psycopg.errors.LockNotAvailable):
            why = (
                f"a row stayed locked for {self._timeout_s} s (a write of the previous owner "
                "between its check and its commit?)"
            )
        elif isinstance(exc, psycopg.errors.QueryCanceled):
            why = f"a statement ran over {self._timeout_s} s"
        else:
            why = "the database failed"
        if wrote:
            why += "; if the commit was lost on the way, the event id makes a retry safe"
        return FenceUnavailableError(f"{self!r}: could not {what}: {why} ({exc})")

    @contextlib.contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        try:
            yield
        except psycopg.Error as exc:
            raise self._unavailable(what, exc) from exc

    def _open(self) -> psycopg.Connection[Any]:
        try:
            if self._params is not None:
                conn: psycopg.Connection[Any] = psycopg.Connection.connect(**self._params)
            else:
                assert self._factory is not None
                conn = self._factory()
        except psycopg.Error as exc:
            raise FenceUnavailableError(f"{self!r}: could not connect: {exc}") from exc
        if not isinstance(conn, psycopg.Connection):
            raise TypeError(
                f"the conninfo function must return a psycopg.Connection, got {type(conn).__name__}"
            )
        try:
            # The fence's transactions are explicit (conn.transaction()); READ COMMITTED makes a
            # lock wait end on the newest row version instead of a serialization failure.
            conn.autocommit = True
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            if self._idle_ms is not None:
                conn.execute(
                    "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                    (self._idle_ms,),
                )
        except psycopg.Error as exc:
            _close_quietly(conn)
            raise FenceUnavailableError(f"{self!r}: could not set up the session: {exc}") from exc
        return conn

    def _create_tables(self, conn: psycopg.Connection[Any]) -> None:
        if self._ready:
            return
        with self._ready_lock:
            if self._ready:
                return
            with self._guard("create the fence tables"), conn.transaction():
                self._bound(conn)
                row = conn.execute(
                    "SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL",
                    (self._epochs, self._applied),
                ).fetchone()
                # Existing tables need no CREATE privilege. Two members creating them at once
                # take turns on an advisory lock: CREATE TABLE IF NOT EXISTS alone can fail on
                # the catalog's unique index when it races another.
                if row is None or not row[0]:
                    conn.execute(
                        "SELECT pg_advisory_xact_lock(%s)",
                        (zlib.crc32(f"weir.fencing:{self._prefix}".encode()),),
                    )
                    conn.execute(
                        f"CREATE TABLE IF NOT EXISTS {self._epochs} ("
                        "group_id text NOT NULL, topic text NOT NULL, partition integer NOT NULL, "
                        "epoch bigint NOT NULL, PRIMARY KEY (group_id, topic, partition))"
                    )
                    conn.execute(
                        f"CREATE TABLE IF NOT EXISTS {self._applied} ("
                        "group_id text NOT NULL, topic text NOT NULL, partition integer NOT NULL, "
                        "record_offset bigint NOT NULL, epoch bigint NOT NULL, "
                        "PRIMARY KEY (group_id, topic, partition, record_offset))"
                    )
            self._ready = True


def _usable(conn: psycopg.Connection[Any]) -> bool:
    return not conn.closed


def _close_quietly(conn: psycopg.Connection[Any]) -> None:
    with contextlib.suppress(psycopg.Error):
        conn.close()
