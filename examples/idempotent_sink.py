"""Writing elsewhere safely: the assignment token only protects weir's local bookkeeping.

A member that froze past its session timeout can still finish a handler after the new owner has
processed the same record. Two ways to make that harmless, shown with SQLite:

1. `IdempotentSink`: an upsert keyed by `record.event_id`. A replay rewrites the same row. Enough
   when each record owns its row; not when records of a partition update shared rows (a zombie's
   late write of record 41 can land after the new owner's write of 42 and set a row back).
2. `FencedSink`: `weir.fencing` (docs/fencing.md). The consumer acquires each partition's epoch
   in the database when it is assigned; every write runs in one transaction that checks the
   epoch and records the event id: a zombie's write is refused (`FencedError`), a replay is a
   no-op. Run it with `GroupConsumer(FencedSink(fence, group_id), fence=fence, ...)`.

Run: `python -m examples.idempotent_sink` (a temporary database file; no broker needed: it plays
the two owners by hand).
"""

from __future__ import annotations

import sqlite3
import tempfile
import threading
from pathlib import Path

from weir import Context, Handler, Partition, Record
from weir.errors import FencedError
from weir.fencing import FencedHandler, SqliteFence

SCHEMA = "create table if not exists orders (event_id text primary key, value blob)"


class IdempotentSink(Handler):
    """Option 1: an upsert by event id. Replays are harmless, whoever runs them."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.lock = threading.Lock()

    def handle(self, record: Record, ctx: Context) -> None:
        with self.lock, self.db:
            self.db.execute(
                "insert into orders(event_id, value) values (?, ?) "
                "on conflict(event_id) do update set value = excluded.value",
                (record.event_id, record.value),
            )


class FencedSink(FencedHandler[sqlite3.Connection]):
    """Option 2: the write runs inside the fence's transaction, on its connection."""

    def write(self, conn: sqlite3.Connection, record: Record) -> None:
        conn.execute(
            "insert into orders(event_id, value) values (?, ?)", (record.event_id, record.value)
        )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "orders.db"
        with sqlite3.connect(path) as db:
            db.execute(SCHEMA)
        group, tp = "orders-app", Partition("orders", 0)
        rec = Record("orders", 0, 41, b"k", b"v1")
        zombie_fence, owner_fence = SqliteFence(path), SqliteFence(path)
        zombie, owner = FencedSink(zombie_fence, group), FencedSink(owner_fence, group)

        # What GroupConsumer(..., fence=...) does on assignment, and hands over as ctx.epoch.
        old = zombie_fence.acquire(group, [tp])[tp]
        new = owner_fence.acquire(group, [tp])[tp]  # the partition moved: a newer epoch
        print(
            "new owner applies:",
            owner.apply(rec, Context(1, 1, rec.event_id, threading.Event(), new)),
        )
        print(
            "replay is a no-op:",
            owner.apply(rec, Context(1, 1, rec.event_id, threading.Event(), new)),
        )
        try:
            zombie.apply(rec, Context(1, 1, rec.event_id, threading.Event(), old))
        except FencedError as exc:
            print("zombie refused:", exc)
        with sqlite3.connect(path) as db:
            print("rows:", db.execute("select count(*) from orders").fetchone()[0])
        zombie_fence.close()
        owner_fence.close()


if __name__ == "__main__":
    main()
