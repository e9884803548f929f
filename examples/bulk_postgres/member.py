"""One member of the bulk load demo: a `GroupConsumer` with a `BulkLoader` in a process of its
own.

Started by ``python -m examples.bulk_postgres``. It journals each batch (records in it, written,
replayed, refused) and its partitions to a JSON-lines file that the demo reads.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from examples.bulk_postgres import BulkLoader
from examples.fenced_ledger.member import (
    Journal,
    JournalsPartitions,
    become_member,
    member_parser,
    run_member,
)
from weir import BatchContext, Record
from weir.fencing import Fence, PostgresFence


class JournaledLoader(JournalsPartitions, BulkLoader):
    """The loader, journaling each batch. It runs on one worker (`--workers 1`), so the counters'
    change over a call is that call's."""

    def __init__(self, fence: Fence[Any], args: argparse.Namespace, journal: Journal) -> None:
        super().__init__(fence, args.group, args.id, args.table)
        self.journal = journal

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        applied, replayed = self.applied, self.replayed
        written = self.apply_batch(records, ctx)
        replays = self.replayed - replayed
        self.journal.write(
            "batch",
            n=len(records),
            written=len(written),
            replayed=replays,
            refused=len(records) - (self.applied - applied) - replays,
            ps=sorted({r.partition for r in records}),
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = member_parser("examples.bulk_postgres.member")
    ap.add_argument("--postgres", required=True, help="the PostgreSQL connection string")
    ap.add_argument("--table", required=True, help="the table the events are loaded into")
    ap.add_argument("--batch", type=int, default=500, help="batch_max_records (500)")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    become_member()
    journal = Journal(args.journal, args.id)
    fence = PostgresFence(args.postgres)
    handler = JournaledLoader(fence, args, journal)
    # ctx.epoch(record) holds each partition's epoch, acquired on assignment.
    settings: dict[str, Any] = {
        "workers": 1,
        "batch_max_records": args.batch,
        "batch_max_wait_s": 0.05,
        # Commits by time only (--commit-interval): m2, which must not commit, never reaches
        # a count either, whatever --events is.
        "commit_every_records": 1_000_000_000,
    }
    return run_member(args, journal, handler, fence, settings)


if __name__ == "__main__":
    sys.exit(main())
