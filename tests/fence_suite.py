"""weir.fencing on a real database, every test of it: tests/unit/test_fencing.py runs them on
SQLite (a file), tests/integration/test_fencing_postgres.py on PostgreSQL (a throwaway server
started by weir.testing.postgres). Each test takes a `backend` fixture (a `Backend`) those
modules define."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fence_databases import FenceDb, postgres_database, sqlite_database
from weir import Partition, Record
from weir.errors import FencedError
from weir.fencing import Fence, FenceUnavailableError

GROUP = "orders-app"
T0 = Partition("orders", 0)
T1 = Partition("orders", 1)


def rec(tp: Partition, offset: int) -> Record:
    return Record(tp.topic, tp.partition, offset, b"key", b"value")


class Backend(FenceDb):
    """One database for one test, with the tables of `CREATE`."""

    def upsert(self, key: str, value: str, epoch: int) -> Callable[[Any], None]:
        """A handler's write: set the sink row ``key``."""

        def write(conn: Any) -> None:
            self.execute(
                conn,
                "INSERT INTO {p}_sink (k, v, epoch) VALUES (?, ?, ?) "
                "ON CONFLICT (k) DO UPDATE SET v = excluded.v, epoch = excluded.epoch",
                (key, value, epoch),
            )

        return write

    def sink(self) -> dict[str, tuple[str, int]]:
        return {k: (v, e) for k, v, e in self.rows("SELECT k, v, epoch FROM {p}_sink")}

    def applied(self) -> list[tuple[str, int, int, int]]:
        return self.rows(
            "SELECT topic, partition, record_offset, epoch FROM {p}_applied "
            "ORDER BY topic, partition, record_offset"
        )

    def epochs(self, group: str = GROUP) -> dict[Partition, int]:
        rows = self.rows(
            "SELECT topic, partition, epoch FROM {p}_epochs WHERE group_id = ?", (group,)
        )
        return {Partition(t, p): e for t, p, e in rows}


# The tables a handler writes to (`<prefix>_sink`: one row per key; `<prefix>_counter`: one row).
CREATE = [
    "CREATE TABLE {p}_sink (k TEXT PRIMARY KEY, v TEXT, epoch INTEGER)",
    "CREATE TABLE {p}_counter (n INTEGER NOT NULL)",
    "INSERT INTO {p}_counter (n) VALUES (0)",
]
TABLES = ["sink", "counter"]


def sqlite_backend(tmp_path: Path) -> Iterator[Backend]:
    """The body of a `backend` fixture on a SQLite file."""
    yield from sqlite_database(Backend, tmp_path, CREATE, TABLES)


def postgres_backend(dsn: str) -> Iterator[Backend]:
    """The body of a `backend` fixture on the PostgreSQL server at `dsn`."""
    yield from postgres_database(Backend, dsn, CREATE, TABLES)


# --- epochs ----------------------------------------------------------------------------------


def test_acquire_increments_the_epoch_per_group_topic_and_partition(backend: Backend) -> None:
    fence = backend.fence()
    assert isinstance(fence, Fence)
    assert fence.acquire(GROUP, [T0, T1]) == {T0: 1, T1: 1}
    assert fence.acquire(GROUP, [T0]) == {T0: 2}
    assert fence.acquire(GROUP, [T1, T0, T1]) == {T0: 3, T1: 2}  # a repeat counts once
    assert fence.acquire("other-group", [T0]) == {T0: 1}
    assert fence.acquire(GROUP, [Partition("payments", 0)]) == {Partition("payments", 0): 1}
    assert fence.acquire(GROUP, []) == {}
    assert backend.epochs() == {T0: 3, T1: 2, Partition("payments", 0): 1}
    assert backend.epochs("other-group") == {T0: 1}


def test_two_fences_on_one_database_share_the_epochs(backend: Backend) -> None:
    first, second = backend.fence(), backend.fence()
    assert first.acquire(GROUP, [T0]) == {T0: 1}
    assert second.acquire(GROUP, [T0]) == {T0: 2}
    assert first.acquire(GROUP, [T0]) == {T0: 3}


# --- fenced, idempotent writes ---------------------------------------------------------------


def test_a_write_with_the_current_epoch_applies(backend: Backend) -> None:
    fence = backend.fence()
    epoch = fence.acquire(GROUP, [T0])[T0]
    assert fence.apply(GROUP, rec(T0, 41), epoch, backend.upsert("a", "one", epoch)) is True
    assert backend.sink() == {"a": ("one", 1)}
    assert backend.applied() == [("orders", 0, 41, 1)]


def test_the_old_owners_write_is_fenced_and_changes_nothing(backend: Backend) -> None:
    old, new = backend.fence(), backend.fence()
    held = old.acquire(GROUP, [T0])[T0]
    assert new.acquire(GROUP, [T0]) == {T0: 2}
    called = []

    def write(conn: Any) -> None:
        called.append(True)
        backend.upsert("a", "zombie", held)(conn)

    with pytest.raises(FencedError) as caught:
        old.apply(GROUP, rec(T0, 7), held, write)
    assert (caught.value.partition, caught.value.held, caught.value.stored) == (T0, 1, 2)
    assert caught.value.group_id == GROUP
    assert "orders[0]" in str(caught.value)
    assert "epoch 1" in str(caught.value) and "epoch 2" in str(caught.value)
    assert called == []  # refused before the write function ran
    assert backend.sink() == {}
    assert backend.applied() == []
    # The partition's other owner is untouched: the new owner's write of the same record applies.
    assert new.apply(GROUP, rec(T0, 7), 2, backend.upsert("a", "owner", 2)) is True
    assert backend.sink() == {"a": ("owner", 2)}


def test_a_write_for_a_partition_never_acquired_is_fenced(backend: Backend) -> None:
    fence = backend.fence()
    fence.acquire(GROUP, [T0])
    with pytest.raises(FencedError, match="holds no epoch") as caught:
        fence.apply(GROUP, rec(T1, 0), 1, backend.upsert("a", "x", 1))
    assert caught.value.stored is None
    assert backend.sink() == {}


def test_a_replayed_event_id_is_a_no_op(backend: Backend) -> None:
    first, second = backend.fence(), backend.fence()
    e1 = first.acquire(GROUP, [T0])[T0]
    calls: list[str] = []

    def write(value: str, epoch: int) -> Callable[[Any], None]:
        def run(conn: Any) -> None:
            calls.append(value)
            backend.upsert("a", value, epoch)(conn)
            backend.execute(conn, "UPDATE {p}_counter SET n = n + 1")

        return run

    assert first.apply(GROUP, rec(T0, 5), e1, write("first", e1)) is True
    assert first.apply(GROUP, rec(T0, 5), e1, write("again", e1)) is False
    # The next owner gets the record again (the commit did not happen before the hand-off): the
    # write that already applied is not repeated, whoever replays it.
    e2 = second.acquire(GROUP, [T0])[T0]
    assert second.apply(GROUP, rec(T0, 5), e2, write("next owner", e2)) is False
    assert second.apply(GROUP, rec(T0, 6), e2, write("next record", e2)) is True
    assert calls == ["first", "next record"]
    assert backend.rows("SELECT n FROM {p}_counter") == [(2,)]
    assert backend.applied() == [("orders", 0, 5, 1), ("orders", 0, 6, 2)]


def test_event_ids_are_per_group(backend: Backend) -> None:
    fence = backend.fence()
    epochs = {g: fence.acquire(g, [T0])[T0] for g in ("app-a", "app-b")}
    for group, epoch in epochs.items():
        assert fence.apply(group, rec(T0, 3), epoch, backend.upsert(group, "v", epoch)) is True
    assert sorted(backend.sink()) == ["app-a", "app-b"]


def test_a_failing_write_rolls_back_everything_and_a_retry_applies(backend: Backend) -> None:
    fence = backend.fence()
    epoch = fence.acquire(GROUP, [T0])[T0]

    def failing(conn: Any) -> None:
        backend.upsert("a", "half", epoch)(conn)
        raise ValueError("downstream said no")

    with pytest.raises(ValueError, match="downstream said no"):
        fence.apply(GROUP, rec(T0, 9), epoch, failing)
    assert backend.sink() == {}
    assert backend.applied() == []
    assert fence.apply(GROUP, rec(T0, 9), epoch, backend.upsert("a", "whole", epoch)) is True
    assert backend.sink() == {"a": ("whole", 1)}


def test_a_write_function_may_not_end_the_fences_transaction(backend: Backend) -> None:
    fence = backend.fence()
    epoch = fence.acquire(GROUP, [T0])[T0]

    def commits(conn: Any) -> None:
        backend.upsert("a", "v", epoch)(conn)
        conn.commit()

    if backend.name == "sqlite":
        # sqlite3 cannot forbid it: the fence notices afterwards and says so.
        with pytest.raises(RuntimeError, match="ended the fence's transaction"):
            fence.apply(GROUP, rec(T0, 1), epoch, commits)
    else:
        import psycopg

        # psycopg forbids commit() inside the fence's transaction block: nothing is written.
        with pytest.raises(psycopg.ProgrammingError, match="commit"):
            fence.apply(GROUP, rec(T0, 1), epoch, commits)
        assert backend.sink() == {}
    # The thread's connection is usable afterwards.
    assert fence.apply(GROUP, rec(T0, 2), epoch, backend.upsert("b", "v", epoch)) is True


async def _async_write(conn: Any, records: Any = None) -> None:
    pass


def test_a_write_that_runs_nothing_when_called_records_nothing(backend: Backend) -> None:
    """An `async def` write function was called inside the transaction and never awaited: the
    transaction committed the event id with none of the writes, `apply` said True, and the
    replay then skipped the record for good. Refused before the transaction; a write that only
    returns a coroutine rolls back and raises."""
    fence = backend.fence()
    epoch = fence.acquire(GROUP, [T0])[T0]
    with pytest.raises(TypeError, match=r"write _async_write is async def or has a yield"):
        fence.apply(GROUP, rec(T0, 1), epoch, _async_write)
    with pytest.raises(TypeError, match=r"write _async_write is async def or has a yield"):
        fence.apply_batch(GROUP, [rec(T0, 1)], {T0: epoch}, _async_write)

    def returns_coroutine(conn: Any) -> Any:
        return _async_write(conn)

    with pytest.raises(TypeError, match=r"returns_coroutine returned a coroutine"):
        fence.apply(GROUP, rec(T0, 1), epoch, returns_coroutine)
    assert backend.applied() == []
    assert fence.apply(GROUP, rec(T0, 1), epoch, backend.upsert("a", "v", epoch)) is True
    assert backend.sink() == {"a": ("v", 1)}


def test_a_fence_call_inside_a_write_function_is_refused(backend: Backend) -> None:
    fence = backend.fence()
    epoch = fence.acquire(GROUP, [T0])[T0]

    def nested(conn: Any) -> None:
        fence.apply(GROUP, rec(T0, 2), epoch, backend.upsert("b", "v", epoch))

    with pytest.raises(RuntimeError, match="inside a write function"):
        fence.apply(GROUP, rec(T0, 1), epoch, nested)
    assert backend.applied() == []


def test_prune_forgets_applied_event_ids_below_an_offset(backend: Backend) -> None:
    fence = backend.fence()
    epoch = fence.acquire(GROUP, [T0, T1])[T0]
    fence.acquire(GROUP, [T1])
    for offset in range(10):
        assert fence.apply(GROUP, rec(T0, offset), epoch, backend.upsert("a", "v", epoch))
    assert fence.apply(GROUP, rec(T1, 0), 2, backend.upsert("b", "v", 2))
    assert fence.prune(GROUP, T0, 6) == 6
    assert [row[2] for row in backend.applied() if row[1] == 0] == [6, 7, 8, 9]
    assert len([row for row in backend.applied() if row[1] == 1]) == 1  # other partition kept
    assert fence.apply(GROUP, rec(T0, 7), epoch, backend.upsert("a", "again", epoch)) is False
    assert fence.prune(GROUP, T0, 6) == 0


# --- fenced batches --------------------------------------------------------------------------


def batch_writer(backend: Backend, calls: list[list[str]]) -> Callable[[Any, list[Record]], None]:
    """A batch's write: a sink row per record and the counter by the batch's size; each call's
    event ids noted in `calls`."""

    def write(conn: Any, records: list[Record]) -> None:
        calls.append([r.event_id for r in records])
        for r in records:
            backend.upsert(r.event_id, "v", 0)(conn)
        backend.execute(conn, "UPDATE {p}_counter SET n = n + ?", (len(records),))

    return write


def test_a_batch_over_two_partitions_applies_in_one_transaction(backend: Backend) -> None:
    fence = backend.fence()
    epochs = fence.acquire(GROUP, [T0, T1])
    calls: list[list[str]] = []
    batch = [rec(T0, 3), rec(T1, 0), rec(T0, 4), rec(T1, 1)]
    assert fence.apply_batch(GROUP, batch, epochs, batch_writer(backend, calls)) == batch
    assert calls == [["orders/0/3", "orders/1/0", "orders/0/4", "orders/1/1"]]  # batch order
    assert backend.rows("SELECT n FROM {p}_counter") == [(4,)]
    assert backend.applied() == [
        ("orders", 0, 3, 1),
        ("orders", 0, 4, 1),
        ("orders", 1, 0, 1),
        ("orders", 1, 1, 1),
    ]
    assert fence.apply_batch(GROUP, [], epochs, batch_writer(backend, calls)) == []
    assert len(calls) == 1


def test_a_replayed_batch_is_a_no_op(backend: Backend) -> None:
    first, second = backend.fence(), backend.fence()
    epochs = first.acquire(GROUP, [T0, T1])
    calls: list[list[str]] = []
    batch = [rec(tp, offset) for offset in range(5) for tp in (T0, T1)]
    assert first.apply_batch(GROUP, batch, epochs, batch_writer(backend, calls)) == batch
    # The same batch again: nothing is written, the write function is not called.
    assert first.apply_batch(GROUP, batch, epochs, batch_writer(backend, calls)) == []
    # The next owner replays part of it with new records: only the new records are written.
    epochs = second.acquire(GROUP, [T0, T1])
    replay = [rec(T0, 4), rec(T0, 5), rec(T1, 4), rec(T1, 5), rec(T1, 6)]
    fresh = second.apply_batch(GROUP, replay, epochs, batch_writer(backend, calls))
    assert [r.event_id for r in fresh] == ["orders/0/5", "orders/1/5", "orders/1/6"]
    # A record applied one at a time is a replay in a batch, and the other way round.
    assert second.apply(GROUP, rec(T0, 7), epochs[T0], backend.upsert("single", "v", 2))
    fresh = second.apply_batch(
        GROUP, [rec(T0, 7), rec(T0, 8)], epochs, batch_writer(backend, calls)
    )
    assert [r.event_id for r in fresh] == ["orders/0/8"]
    assert second.apply(GROUP, rec(T0, 8), epochs[T0], backend.upsert("single", "x", 2)) is False
    assert calls == [
        [r.event_id for r in batch],
        ["orders/0/5", "orders/1/5", "orders/1/6"],
        ["orders/0/8"],
    ]
    assert backend.rows("SELECT n FROM {p}_counter") == [(14,)]
    assert len(backend.sink()) == 15  # 14 records of batches, one applied alone
    assert len(backend.applied()) == 15


def test_a_batch_with_a_stale_epoch_is_refused_whole(backend: Backend) -> None:
    old, new = backend.fence(), backend.fence()
    held = old.acquire(GROUP, [T0, T1])
    assert new.acquire(GROUP, [T1]) == {T1: 2}  # T1 moved on; T0 is still the old owner's
    calls: list[list[str]] = []
    batch = [rec(T0, 0), rec(T1, 0), rec(T0, 1), rec(T1, 1)]
    with pytest.raises(FencedError) as caught:
        old.apply_batch(GROUP, batch, held, batch_writer(backend, calls))
    assert (caught.value.partition, caught.value.held, caught.value.stored) == (T1, 1, 2)
    assert calls == []  # refused before the write function ran
    assert backend.sink() == {} and backend.applied() == []
    assert backend.rows("SELECT n FROM {p}_counter") == [(0,)]
    # A partition never acquired is refused the same way.
    other = Partition("payments", 0)
    with pytest.raises(FencedError, match="holds no epoch"):
        old.apply_batch(
            GROUP, [rec(T0, 0), rec(other, 0)], {**held, other: 1}, batch_writer(backend, calls)
        )
    assert backend.applied() == []
    # The partition still held is written once the stale one is left out.
    assert old.apply_batch(GROUP, batch[::2], held, batch_writer(backend, calls)) == batch[::2]
    assert backend.applied() == [("orders", 0, 0, 1), ("orders", 0, 1, 1)]


def test_concurrent_overlapping_batches_apply_each_event_exactly_once(backend: Backend) -> None:
    fence = backend.fence()
    partitions = [Partition("orders", p) for p in range(4)]
    epochs = fence.acquire(GROUP, partitions)
    events = [rec(tp, offset) for tp in partitions for offset in range(60)]
    work = events * 2  # every event in two batches, of different threads, in a random order
    random.Random(11).shuffle(work)
    batches: list[list[Record]] = []
    for i in range(0, len(work), 12):
        batch: dict[str, Record] = {}
        for r in work[i : i + 12]:
            batch.setdefault(r.event_id, r)
        batches.append(list(batch.values()))
    lock = threading.Lock()
    written: list[str] = []

    def writer(_index: int) -> None:
        while True:
            with lock:
                if not batches:
                    return
                batch = batches.pop()
            fresh = fence.apply_batch(GROUP, batch, epochs, batch_writer(backend, []))
            with lock:
                written.extend(r.event_id for r in fresh)

    run_threads(6, writer)
    assert sorted(written) == sorted(r.event_id for r in events)
    assert backend.rows("SELECT n FROM {p}_counter") == [(len(events),)]
    assert len(backend.sink()) == len(backend.applied()) == len(events)


def test_bad_batches_are_refused_naming_the_argument(backend: Backend) -> None:
    fence = backend.fence()
    epochs = fence.acquire(GROUP, [T0])
    write = batch_writer(backend, [])
    with pytest.raises(TypeError, match="records"):
        fence.apply_batch(GROUP, rec(T0, 1), epochs, write)  # type: ignore[arg-type]  # on purpose
    with pytest.raises(TypeError, match="record"):
        fence.apply_batch(GROUP, ["orders/0/1"], epochs, write)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="epochs"):
        fence.apply_batch(GROUP, [rec(T0, 1)], [1], write)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"epochs: no epoch for orders\[1\]"):
        fence.apply_batch(GROUP, [rec(T0, 1), rec(T1, 1)], epochs, write)
    with pytest.raises(ValueError, match="epoch"):
        fence.apply_batch(GROUP, [rec(T0, 1)], {T0: 0}, write)
    with pytest.raises(ValueError, match="orders/0/1 is in the batch twice"):
        fence.apply_batch(GROUP, [rec(T0, 1), rec(T0, 1)], epochs, write)
    with pytest.raises(TypeError, match="write"):
        fence.apply_batch(GROUP, [rec(T0, 1)], epochs, None)  # type: ignore[arg-type]
    assert backend.applied() == []


# --- concurrency -----------------------------------------------------------------------------


def run_threads(count: int, target: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def guarded(index: int) -> None:
        try:
            target(index)
        except BaseException as exc:  # reported below: a thread's failure must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive(), "a writer thread hung"
    if errors:
        raise errors[0]


def test_concurrent_writers_apply_each_event_exactly_once(backend: Backend) -> None:
    fence = backend.fence()
    partitions = [Partition("orders", p) for p in range(4)]
    epochs = fence.acquire(GROUP, partitions)
    events = [(tp, offset) for tp in partitions for offset in range(40)]
    work = events * 2  # every event twice, from different threads, in a random order
    random.Random(7).shuffle(work)
    lock = threading.Lock()
    outcomes: list[bool] = []

    def writer(_index: int) -> None:
        while True:
            with lock:
                if not work:
                    return
                tp, offset = work.pop()

            def write(conn: Any, tp: Partition = tp, offset: int = offset) -> None:
                backend.upsert(f"{tp.partition}/{offset}", "v", epochs[tp])(conn)
                backend.execute(conn, "UPDATE {p}_counter SET n = n + 1")

            outcome = fence.apply(GROUP, rec(tp, offset), epochs[tp], write)
            with lock:
                outcomes.append(outcome)

    run_threads(8, writer)
    assert outcomes.count(True) == len(events)
    assert outcomes.count(False) == len(events)
    assert backend.rows("SELECT n FROM {p}_counter") == [(len(events),)]
    assert len(backend.sink()) == len(events)
    assert len(backend.applied()) == len(events)


def test_after_acquire_returns_no_write_of_the_old_epoch_commits(backend: Backend) -> None:
    old, new = backend.fence(), backend.fence()
    held = old.acquire(GROUP, [T0])[T0]
    next_offset = iter(range(1_000_000))
    lock = threading.Lock()
    started = threading.Event()
    fenced: list[int] = []
    committed: list[int] = []

    def old_writer(index: int) -> None:
        while True:
            with lock:
                offset = next(next_offset)
                if len(committed) >= 20:
                    started.set()

            def write(conn: Any, offset: int = offset) -> None:
                backend.upsert(f"old-{offset}", "old", held)(conn)
                time.sleep(0.005)  # some work inside the transaction: acquire falls into one

            try:
                old.apply(GROUP, rec(T0, offset), held, write)
            except FencedError:
                with lock:
                    fenced.append(index)
                return
            with lock:
                committed.append(offset)
            time.sleep(0.002)

    check = backend.connect()  # opened beforehand: the count must follow acquire at once
    writers = threading.Thread(target=run_threads, args=(6, old_writer))
    writers.start()
    assert started.wait(30)
    new_epoch = new.acquire(GROUP, [T0])[T0]
    old_rows_when_acquired = check.execute(backend.sql("SELECT count(*) FROM {p}_sink")).fetchone()[
        0
    ]
    check.close()
    writers.join(60)
    assert not writers.is_alive()
    assert sorted(fenced) == list(range(6))  # every old writer ended fenced
    assert old_rows_when_acquired >= 20
    assert len(backend.sink()) == old_rows_when_acquired  # none committed after the acquire
    assert new.apply(GROUP, rec(T0, 10_000), new_epoch, backend.upsert("new", "v", new_epoch))


def test_a_write_in_flight_during_acquire_is_never_committed_after_the_new_owners_writes(
    backend: Backend,
) -> None:
    """Two members, one partition. The old owner is inside its write (row "k" written, not
    committed) when the new owner acquires and writes row "k" for the next record.

    SQLite: the old write holds the database's write lock, so acquire waits for its commit; the
    old write commits before the bump. PostgreSQL: acquire does not wait for the write function,
    and the old write is rejected at its final epoch check. Either way the new owner's row wins.
    """
    old, new = backend.fence(), backend.fence()
    held = old.acquire(GROUP, [T0])[T0]
    in_write = threading.Barrier(2, timeout=30)
    bumped = threading.Event()
    new_wrote = threading.Event()
    seen: dict[str, Any] = {}

    def old_write(conn: Any) -> None:
        backend.upsert("k", "old", held)(conn)
        in_write.wait()  # the new owner starts now
        # PostgreSQL: the new owner acquires now and then waits on row "k" (ours, uncommitted).
        # SQLite: its acquire waits for our lock. Either way this wait runs out.
        new_wrote.wait(timeout=1.0)
        seen["bumped while the old write ran"] = bumped.is_set()

    def old_owner() -> None:
        try:
            seen["old applied"] = old.apply(GROUP, rec(T0, 10), held, old_write)
        except FencedError as exc:
            seen["old fenced"] = exc

    def new_owner() -> None:
        in_write.wait()
        epoch = new.acquire(GROUP, [T0])[T0]
        bumped.set()
        seen["new applied"] = new.apply(
            GROUP, rec(T0, 11), epoch, backend.upsert("k", "new", epoch)
        )
        new_wrote.set()

    threads = [threading.Thread(target=old_owner), threading.Thread(target=new_owner)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()
    assert seen["new applied"] is True
    assert backend.sink() == {"k": ("new", 2)}
    if backend.name == "sqlite":
        assert seen["bumped while the old write ran"] is False
        assert seen["old applied"] is True
        assert backend.applied() == [("orders", 0, 10, 1), ("orders", 0, 11, 2)]
    else:
        assert seen["bumped while the old write ran"] is True
        assert isinstance(seen["old fenced"], FencedError)
        assert (seen["old fenced"].held, seen["old fenced"].stored) == (1, 2)
        assert backend.applied() == [("orders", 0, 11, 2)]


def hold_commit_window(backend: Backend) -> Any:
    """A raw transaction holding what a fenced write holds between its last check and its commit:
    SQLite's write lock, or PostgreSQL's FOR SHARE lock on the epoch row."""
    conn = backend.connect()
    if backend.name == "sqlite":
        conn.execute("BEGIN IMMEDIATE")
    else:
        conn.execute("BEGIN")
        backend.execute(conn, "SELECT epoch FROM {p}_epochs WHERE group_id = ? FOR SHARE", (GROUP,))
    return conn


def test_acquire_waits_for_a_write_in_its_commit_window(backend: Backend) -> None:
    fence = backend.fence()
    assert fence.acquire(GROUP, [T0]) == {T0: 1}
    holder = hold_commit_window(backend)
    got: dict[str, Any] = {}

    def acquire() -> None:
        started = time.monotonic()
        got["epochs"] = fence.acquire(GROUP, [T0])
        got["waited"] = time.monotonic() - started

    thread = threading.Thread(target=acquire)
    thread.start()
    time.sleep(0.5)
    assert "epochs" not in got
    holder.execute("COMMIT")
    holder.close()
    thread.join(10)
    assert got["epochs"] == {T0: 2}
    assert got["waited"] >= 0.4


def test_acquire_gives_up_after_timeout_s(backend: Backend) -> None:
    fence = backend.fence(timeout_s=0.5)
    fence.acquire(GROUP, [T0])
    holder = hold_commit_window(backend)
    try:
        started = time.monotonic()
        with pytest.raises(FenceUnavailableError, match="acquire"):
            fence.acquire(GROUP, [T0])
        assert 0.4 <= time.monotonic() - started < 5
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert backend.epochs() == {T0: 1}
    assert fence.acquire(GROUP, [T0]) == {T0: 2}


def test_each_thread_gets_its_own_connection_and_close_ends_the_fence(backend: Backend) -> None:
    fence = backend.fence()
    epoch = fence.acquire(GROUP, [T0])[T0]
    seen: list[int] = []
    alive = threading.Barrier(4, timeout=30)

    def writer(index: int) -> None:
        fence.apply(GROUP, rec(T0, index), epoch, lambda conn: seen.append(id(conn)))
        alive.wait()  # no thread ends (and frees its connection) before all have written

    run_threads(4, writer)
    assert len(set(seen)) == 4
    fence.close()
    with pytest.raises(RuntimeError, match="closed"):
        fence.acquire(GROUP, [T0])


# --- arguments -------------------------------------------------------------------------------


def test_bad_arguments_are_refused_naming_the_argument(backend: Backend) -> None:
    fence = backend.fence()
    epoch = fence.acquire(GROUP, [T0])[T0]
    write = backend.upsert("a", "v", 1)
    with pytest.raises(ValueError, match="group_id"):
        fence.acquire("", [T0])
    with pytest.raises(TypeError, match="partitions"):
        fence.acquire(GROUP, T0)  # type: ignore[arg-type]  # one partition, not a list: on purpose
    with pytest.raises(ValueError, match="partitions"):
        fence.acquire(GROUP, [("orders", -1)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="partitions"):
        fence.acquire(GROUP, [("", 0)])  # type: ignore[list-item]
    for bad in (0, -1, True, "1", 1.0):
        with pytest.raises(ValueError, match="epoch"):
            fence.apply(GROUP, rec(T0, 1), bad, write)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="record"):
        fence.apply(GROUP, "orders/0/1", epoch, write)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="write"):
        fence.apply(GROUP, rec(T0, 1), epoch, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="before_offset"):
        fence.prune(GROUP, T0, -1)
    for prefix in ("", "1abc", "x; DROP TABLE y", "a-b", "x" * 56):
        with pytest.raises(ValueError, match="table_prefix"):
            backend.fence(table_prefix=prefix)
    for timeout in (0, -1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError, match="timeout_s"):
            backend.fence(timeout_s=timeout)
    assert backend.applied() == []
    assert backend.epochs() == {T0: 1}
