"""Fencing for external side effects: partition-ownership epochs and idempotent writes.

weir's assignment token protects only its own bookkeeping. A member frozen past its session
timeout can still finish a handler after the new owner processed the same record. A fence keeps
the owner epoch of each (group, topic, partition) in the database the handler writes to:

- ``fence.acquire(group_id, partitions)`` increments the epochs (a new owner, before its first
  record) and returns them;
- ``fence.apply(group_id, record, epoch, write)`` runs ``write(conn)`` in one transaction that
  also checks the epoch is still ``epoch`` (else ``weir.errors.FencedError``, rolled back) and
  records ``record.event_id`` (a replay is a no-op that returns False);
- ``fence.apply_batch(group_id, records, epochs, write)`` does the same for a batch, of one or
  more partitions, in one transaction: ``write(conn, fresh)`` gets the records not applied
  before; a stale epoch of any partition refuses the whole batch;
- ``fence.prune(group_id, partition, before_offset)`` forgets the event ids below a committed
  offset.

``GroupConsumer(handler, fence=fence, ...)`` acquires the epochs of the partitions it is assigned
before their first record and hands them to the handler as ``ctx.epoch``; ``FencedHandler``
runs a ``write(conn, record)`` function through ``fence.apply`` for each record,
``FencedBatchHandler`` a ``write(conn, records)`` function through ``fence.apply_batch`` for
each batch, and
``FencePruner`` is a commit listener that prunes.

``SqliteFence`` uses the standard library; ``PostgresFence`` needs psycopg 3
(``pip install kafka-weir[postgres]``) and is imported only when asked for. See docs/fencing.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from weir.errors import FenceUnavailableError, NoEpochError
from weir.fencing.base import Fence
from weir.fencing.handler import FencedBatchHandler, FencedHandler, FencePruner
from weir.fencing.sqlite import SqliteFence

if TYPE_CHECKING:
    from weir.fencing.postgres import PostgresFence

__all__ = [
    "Fence",
    "FencePruner",
    "FenceUnavailableError",
    "FencedBatchHandler",
    "FencedHandler",
    "NoEpochError",
    "PostgresFence",
    "SqliteFence",
]


def __getattr__(name: str) -> Any:
    if name == "PostgresFence":
        from weir.fencing.postgres import PostgresFence

        return PostgresFence
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
