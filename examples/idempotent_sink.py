"""Writing elsewhere safely: the assignment token only protects weir's local bookkeeping.

A member that froze past its session timeout can still finish a handler after the new owner has
processed the same record. Two ways to make that harmless, shown with SQLite:

1. idempotent writes keyed by `record.event_id` (a replay rewrites the same row);
2. fencing at write time: each partition's newest owner token is stored, and a write from an older
   token is refused in the same transaction as the write.

Run: `python -m examples.idempotent_sink` (uses an in-memory database; no broker needed).
"""

from __future__ import annotations

import sqlite3
import threading

from weir import Context, Handler, Record

SCHEMA = """
create table if not exists orders (event_id text primary key, value blob);
create table if not exists owners (partition text primary key, token integer);
"""


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


class FencedSink(IdempotentSink):
    """Option 2: refuse writes from an owner older than the newest one seen for the partition.

    Tokens are local to one process; across processes use a monotonically increasing value that
    all owners agree on (e.g. a fencing row updated in `on_assigned` with a database sequence).
    """

    def handle(self, record: Record, ctx: Context) -> None:
        part = f"{record.topic}/{record.partition}"
        with self.lock, self.db:
            row = self.db.execute("select token from owners where partition = ?", (part,))
            newest = row.fetchone()
            if newest is not None and newest[0] > ctx.token:
                raise StaleOwnerError(f"{record.event_id}: token {ctx.token} < {newest[0]}")
            self.db.execute(
                "insert into owners(partition, token) values (?, ?) "
                "on conflict(partition) do update set token = max(token, excluded.token)",
                (part, ctx.token),
            )
            self.db.execute(
                "insert into orders(event_id, value) values (?, ?) "
                "on conflict(event_id) do update set value = excluded.value",
                (record.event_id, record.value),
            )


class StaleOwnerError(RuntimeError):
    pass


def main() -> None:
    db = sqlite3.connect(":memory:", check_same_thread=False)
    db.executescript(SCHEMA)
    rec = Record("orders", 0, 41, b"k", b"v1", (), None, None, 4)
    new_owner, zombie = Context(7, 1, rec.event_id, threading.Event()), None
    sink = FencedSink(db)
    sink.handle(rec, new_owner)
    sink.handle(rec, new_owner)  # a replay by the same owner: the same row, no duplicate
    zombie = Context(3, 1, rec.event_id, threading.Event())
    try:
        sink.handle(rec, zombie)
    except StaleOwnerError as exc:
        print("refused:", exc)
    print("rows:", db.execute("select count(*) from orders").fetchone()[0])


if __name__ == "__main__":
    main()
