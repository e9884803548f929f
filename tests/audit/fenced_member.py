"""One member whose handler adds each record's amount to a counter through a fence, run as its
own process by the zombie tests (tests/integration/test_fencing_zombie.py).

Each record's value is ``{"k": key, "n": amount}``; the write adds ``n`` to the ``counters`` row of
``k`` and inserts a row into ``applications`` (no unique key: a record applied twice would show).
Every attempt and its outcome go to the member's audit file (``attempt``: ``applied``, ``replay``,
``fenced`` or ``error``, with the epoch it held). ``--hold-at OFFSET`` makes the handler stop at
that record, ``before`` its fenced transaction or ``inside`` it (after the counter update), write
a ``holding`` event and wait until the ``--go`` file exists: the test freezes the process there.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.audit import AuditWriter
from tests.audit.member import settings
from weir import Context, GroupConsumer, Partition, Record
from weir.errors import FencedError
from weir.fencing import Fence, FencedHandler, SqliteFence

_PR_SET_PDEATHSIG = 1


def tables(prefix: str) -> tuple[str, str]:
    """The names of the counters and applications tables of one test."""
    return f"{prefix}_counters", f"{prefix}_applications"


def schema(prefix: str) -> list[str]:
    counters, applications = tables(prefix)
    return [
        f"CREATE TABLE {counters} (k TEXT PRIMARY KEY, total BIGINT NOT NULL)",
        f"CREATE TABLE {applications} (event_id TEXT NOT NULL, member TEXT NOT NULL)",
    ]


class CounterHandler(FencedHandler[Any]):
    def __init__(
        self,
        fence: Fence[Any],
        args: argparse.Namespace,
        audit: AuditWriter,
    ) -> None:
        super().__init__(fence, args.group)
        self.audit = audit
        self.member = args.member
        self.counters, self.applications = tables(args.prefix)
        self.mark = "?" if args.backend == "sqlite" else "%s"
        self.hold_at: int = args.hold_at
        self.hold_where: str = args.hold_where
        self.go: Path | None = args.go
        self._held = threading.Event()

    def handle(self, record: Record, ctx: Context) -> None:
        if self.hold_where == "before" and self._hold_here(record):
            self._hold(record)
        a = self.audit
        try:
            applied = self.apply(record, ctx)
        except FencedError as exc:
            a.write("attempt", o=record.offset, epoch=ctx.epoch, outcome="fenced", now=exc.stored)
            raise
        except Exception as exc:
            a.write("attempt", o=record.offset, epoch=ctx.epoch, outcome="error", error=repr(exc))
            raise
        a.write(
            "attempt", o=record.offset, epoch=ctx.epoch, outcome="applied" if applied else "replay"
        )

    def write(self, conn: Any, record: Record) -> None:
        value = json.loads(record.value or b"{}")
        m = self.mark
        conn.execute(
            f"UPDATE {self.counters} SET total = total + {m} WHERE k = {m}",
            (value["n"], value["k"]),
        )
        if self.hold_where == "inside" and self._hold_here(record):
            self._hold(record)
        conn.execute(
            f"INSERT INTO {self.applications} (event_id, member) VALUES ({m}, {m})",
            (record.event_id, self.member),
        )

    def _hold_here(self, record: Record) -> bool:
        return record.offset == self.hold_at and not self._held.is_set()

    def _hold(self, record: Record) -> None:
        self._held.set()
        self.audit.write("holding", o=record.offset, where=self.hold_where)
        assert self.go is not None
        while not self.go.exists():
            time.sleep(0.01)
        self.audit.write("resumed", o=record.offset)

    def on_assigned(self, partitions: Sequence[Partition]) -> None:
        self.audit.write("assigned", ps=[tp.partition for tp in partitions])

    def on_revoked(self, partitions: Sequence[Partition]) -> None:
        self.audit.write("revoked", ps=[tp.partition for tp in partitions])

    def on_lost(self, partitions: Sequence[Partition]) -> None:
        self.audit.write("lost", ps=[tp.partition for tp in partitions])


def make_fence(args: argparse.Namespace) -> Fence[Any]:
    if args.backend == "sqlite":
        return SqliteFence(args.db, table_prefix=args.prefix, timeout_s=args.fence_timeout)
    from weir.fencing import PostgresFence

    return PostgresFence(args.db, table_prefix=args.prefix, timeout_s=args.fence_timeout)


def die_with_parent() -> None:
    """A member left behind by a killed test run dies with it (Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--protocol", choices=["eager", "cooperative", "consumer"], required=True)
    ap.add_argument("--member", required=True)
    ap.add_argument("--audit", type=Path, required=True)
    ap.add_argument("--backend", choices=["sqlite", "postgres"], required=True)
    ap.add_argument("--db", required=True, help="the SQLite file, or a PostgreSQL conninfo")
    ap.add_argument("--prefix", required=True, help="of the fence's and the test's tables")
    ap.add_argument("--fence-timeout", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--commit-interval", type=float, default=0.2)
    ap.add_argument("--session-timeout", type=float, default=4.0)
    ap.add_argument("--hold-at", type=int, default=-1)
    ap.add_argument("--hold-where", choices=["before", "inside"], default="before")
    ap.add_argument("--go", type=Path, default=None)
    args = ap.parse_args(argv)
    die_with_parent()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    audit = AuditWriter(args.audit, args.member)
    fence = make_fence(args)
    protocol = settings(args.protocol)
    if protocol["group_protocol"] == "classic":
        protocol["session_timeout_s"] = args.session_timeout
        protocol["heartbeat_interval_s"] = 0.5
    gc = GroupConsumer(
        CounterHandler(fence, args, audit),
        fence=fence,
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        topics=[args.topic],
        ordering="key",
        workers=args.workers,
        commit_interval_s=args.commit_interval,
        revoke_timeout_s=5.0,
        shutdown_timeout_s=8.0,
        auto_offset_reset="earliest",
        **protocol,
    )
    gc.add_commit_listener(audit.commit)
    audit.write("member_start")
    try:
        gc.run()
    except Exception as exc:
        audit.write("member_failed", error=repr(exc))
        raise
    finally:
        audit.write("member_stop")
        audit.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
