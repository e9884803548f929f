"""A topic of events loaded into PostgreSQL with ``COPY``, in batches, exact under kills and
rebalances.

Each record is an event ``{"id": ..., "user": ..., "amount": ..., "note": ...}`` (about 100
bytes). `BulkLoader` is a `weir.fencing.FencedBatchHandler`: weir hands it up to
``batch_max_records`` records at a time, and it writes them with one ``COPY`` in one database
transaction that also checks the epochs of the batch's partitions and records its event ids
(``fence.apply_batch``), so a replayed record is left out and a member that lost a partition
writes nothing of it. See README.md; ``python -m examples.bulk_postgres --postgres`` runs the
demo.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from weir import Record
from weir.fencing import Fence, FencedBatchHandler

__all__ = ["COLUMNS", "SCHEMA", "BulkLoader", "Event", "events"]

# One row per load of an event, deliberately without a unique key: an event loaded twice would
# show here (the fence's table of applied event ids is what prevents it).
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS {table} (event_id text NOT NULL, user_id text NOT NULL, "
    "amount integer NOT NULL, note text NOT NULL, kafka_partition integer NOT NULL, "
    "kafka_offset bigint NOT NULL, member text NOT NULL)"
)
COLUMNS = "event_id, user_id, amount, note, kafka_partition, kafka_offset, member"
_TABLE = re.compile(r"[a-z_][a-z0-9_]{0,62}")


@dataclass(frozen=True)
class Event:
    id: str
    user: str
    amount: int
    note: str

    def to_json(self) -> bytes:
        return json.dumps(
            {"id": self.id, "user": self.user, "amount": self.amount, "note": self.note}
        ).encode()

    @classmethod
    def from_record(cls, record: Record) -> Event:
        v = json.loads(record.value or b"{}")
        return cls(str(v["id"]), str(v["user"]), int(v["amount"]), str(v["note"]))


def events(n: int, start: int = 0) -> list[Event]:
    """`n` events with ids ``e-<start>`` on, about 100 bytes each as JSON."""
    return [
        Event(f"e-{i:07d}", f"u-{i * 7919 % 1000:03d}", i * 37 % 10_000, "x" * 30)
        for i in range(start, start + n)
    ]


class BulkLoader(FencedBatchHandler[Any]):
    """A batch of events, one fenced transaction, one ``COPY``.

    ``FencedBatchHandler.handle_batch`` calls ``write`` through ``fence.apply_batch``: the
    fence claims the batch's event ids and checks its partitions' epochs in the same
    transaction, and ``write`` gets only the records not loaded before. A partition another
    member acquired since is refused, and the rest of the batch is written without it.
    """

    def __init__(
        self, fence: Fence[Any], group_id: str, member: str, table: str = "events"
    ) -> None:
        super().__init__(fence, group_id)
        if not _TABLE.fullmatch(table):
            raise ValueError(f"table must be a lower-case SQL identifier, got {table!r}")
        self.member = member
        self.copy_sql = f"COPY {table} ({COLUMNS}) FROM STDIN"

    def write(self, conn: Any, records: list[Record]) -> None:
        with conn.cursor() as cur, cur.copy(self.copy_sql) as copy:
            for record in records:
                e = Event.from_record(record)
                copy.write_row(
                    (e.id, e.user, e.amount, e.note, record.partition, record.offset, self.member)
                )
