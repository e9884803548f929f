"""``python -m examples.bulk_postgres --postgres``: a topic of events loaded into PostgreSQL with
``COPY`` in batches, every event exactly once through a rebalance and a SIGKILL. See README.md.

Members of one consumer group, each a process with a `BulkLoader` (a `FencedBatchHandler`) on
one worker, load a topic of events (4 partitions) into a table. The run: m1 loads the first
third alone; m2 joins (a rebalance) and loads part of the second third without committing, and
is SIGKILLed; m3 joins while m2's session runs out, and m2's partitions go to m1 and m3, which
get m2's records again: their event ids are in the fence's table, so those records are left out
of the COPY (replays). The table must hold every event exactly once.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from examples.bulk_postgres import SCHEMA, Event, events
from examples.fenced_ledger.__main__ import run_demo
from examples.fenced_ledger.member import Members

PARTITIONS = 4
KAFKA_LOG = logging.getLogger("examples.bulk_postgres.kafka")
KAFKA_LOG.setLevel(logging.ERROR)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m examples.bulk_postgres",
        description="A topic of events loaded into PostgreSQL with COPY in batches, exact under "
        "a rebalance and a SIGKILL (see README.md).",
    )
    ap.add_argument("--bootstrap", help="use this Kafka instead of starting an embedded broker")
    ap.add_argument(
        "--postgres",
        nargs="?",
        const="embedded",
        default="embedded",
        metavar="CONNINFO",
        help="load into the PostgreSQL at this connection string; without one (the default) a "
        "throwaway server started from the installed binaries",
    )
    ap.add_argument("--events", type=int, default=6000, help="events to produce (6000)")
    ap.add_argument("--batch", type=int, default=500, help="records per batch at most (500)")
    ap.add_argument("--timeout", type=float, default=120.0, help="give up after this long (s)")
    ap.add_argument("--summary-json", type=Path, help="also write the summary here as JSON")
    ap.add_argument(
        "--keep", action="store_true", help="keep the table and the members' journals and logs"
    )
    args = ap.parse_args(argv)
    if args.events < 300 or args.batch < 1:
        ap.error("--events must be at least 300 and --batch at least 1")
    return args


class Demo:
    def __init__(self, args: argparse.Namespace, bootstrap: str, conninfo: str) -> None:
        run = uuid.uuid4().hex[:8]
        self.args = args
        self.bootstrap = bootstrap
        self.conninfo = conninfo
        self.topic = f"events-{run}"
        self.group = f"loader-{run}"
        self.table = f"events_{run}"
        self.started = time.monotonic()
        self.deadline = self.started + args.timeout
        self.workdir = Path(tempfile.mkdtemp(prefix="weir-bulk-"))
        self.members = Members(
            self.workdir,
            [
                *("--bootstrap", bootstrap, "--topic", self.topic, "--group", self.group),
                *("--postgres", conninfo, "--table", self.table, "--batch", str(args.batch)),
            ],
            module="examples.bulk_postgres.member",
        )
        self.produced: list[Event] = []
        self.created = False  # the table
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "logger": KAFKA_LOG}
        )

    def say(self, text: str) -> None:
        print(f"{time.monotonic() - self.started:6.1f}s  {text}", flush=True)

    # -- set-up and helpers ---------------------------------------------------------------

    @contextlib.contextmanager
    def db(self) -> Iterator[Any]:
        import psycopg

        try:
            conn = psycopg.connect(self.conninfo, autocommit=True)
        except psycopg.Error as exc:
            raise RuntimeError(f"cannot connect to PostgreSQL: {exc}") from None
        with conn:
            yield conn

    def set_up(self) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.create_topics([NewTopic(self.topic, PARTITIONS, 1)]).values():
            future.result(30)
        with self.db() as conn:
            conn.execute(SCHEMA.format(table=self.table))
        self.created = True

    def produce(self, n: int) -> None:
        batch = events(n, start=len(self.produced))
        for e in batch:
            self.producer.produce(self.topic, key=e.user.encode(), value=e.to_json())
        if self.producer.flush(30):
            raise RuntimeError("events not delivered within 30 s")
        self.produced.extend(batch)

    def rows(self) -> Counter[str]:
        """How many times each event id is in the table."""
        with self.db() as conn:
            return Counter(e for (e,) in conn.execute(f"SELECT event_id FROM {self.table}"))

    def loaded(self) -> int:
        with self.db() as conn:
            row = conn.execute(f"SELECT count(*) FROM {self.table}").fetchone()
        return int(row[0])

    def journal(self) -> list[dict[str, Any]]:
        return self.members.events()

    def wait_for(self, what: str, found: Callable[[], Any]) -> Any:
        while True:
            failed = [e for e in self.journal() if e["ev"] == "failed"]
            if failed:
                raise RuntimeError(f"member {failed[0]['m']} failed: {failed[0]['error']}")
            value = found()
            if value:
                return value
            if time.monotonic() > self.deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            time.sleep(0.1)

    def owned(self, member: str) -> set[int]:
        """The member's partitions now, from its journal."""
        mine: set[int] = set()
        for e in self.journal():
            if e["m"] != member:
                continue
            if e["ev"] == "assigned":
                mine.update(e["ps"])
            elif e["ev"] in ("revoked", "lost"):
                mine.difference_update(e["ps"])
        return mine

    def offsets(self) -> tuple[list[int], list[int]]:
        """The group's committed offsets and the topic's end offsets, per partition."""
        c = Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": self.group, "logger": KAFKA_LOG}
        )
        try:
            tps = [TopicPartition(self.topic, p) for p in range(PARTITIONS)]
            committed = [r.offset for r in c.committed(tps, timeout=10)]
            ends = [c.get_watermark_offsets(tp, timeout=10)[1] for tp in tps]
            return committed, ends
        finally:
            c.close()

    # -- the scenario -----------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        third = self.args.events // 3
        self.set_up()
        self.say(
            f"topic {self.topic} ({PARTITIONS} partitions), table {self.table}, batches of up "
            f"to {self.args.batch} records, COPY in one fenced transaction each"
        )

        # 1. m1 loads the first third alone.
        self.members.start("m1")
        self.wait_for("m1 to be assigned", lambda: self.owned("m1"))
        self.produce(third)
        self.wait_for("m1 to load the first third", lambda: self.loaded() >= third)
        self.say(f"m1 loaded {third} events in {len(batches(self.journal(), 'm1'))} batches")

        # 2. A rebalance: m2 joins, takes partitions, loads without committing (it commits only
        # at a hand-off, which it will not get) and is killed.
        self.members.start("m2", "--commit-interval", "300")
        moved = self.wait_for("m2 to take partitions", lambda: self.owned("m2"))
        self.say(f"rebalance: m2 joined and took partitions {sorted(moved)} from m1")
        self.produce(third)
        self.wait_for("m2 to load a batch", lambda: written(self.journal(), "m2") > 0)
        self.members.signal("m2", signal.SIGKILL)
        evs = self.journal()
        self.say(
            f"kill: m2 loaded {written(evs, 'm2')} events in {len(batches(evs, 'm2'))} batches, "
            "committed none: SIGKILL"
        )

        # 3. m3 joins while m2's session runs out; m2's partitions move, and its records
        # come again: replays, left out of the COPY.
        self.members.start("m3")
        self.say("rebalance: m3 joins; m2's partitions move once its session expires (3 s)")
        # Before the last third: m1 alone could load it while m3's process still starts up, and
        # the stop would then reach m3 before its member (and its signal handling) existed.
        taken = self.wait_for("m3 to take partitions", lambda: self.owned("m3"))
        self.say(f"rebalance: m3 took partitions {sorted(taken)}")
        self.produce(self.args.events - 2 * third)
        self.wait_for("every event to be loaded", lambda: self.loaded() >= len(self.produced))
        self.wait_for("the group's commits to reach the end", self.caught_up)
        evs = self.journal()
        by = {m: sum(b["replayed"] for b in batches(evs, m)) for m in ("m1", "m3")}
        self.say(
            f"replay: m2's uncommitted records came again to m1 ({by['m1']}) and m3 "
            f"({by['m3']}): in the fence's table already, left out of the COPY"
        )
        codes = self.members.stop_all()
        self.say("every event loaded and committed; members stopped")
        return self.summary(codes)

    def caught_up(self) -> bool:
        committed, ends = self.offsets()
        return committed == ends

    def summary(self, codes: dict[str, int]) -> dict[str, Any]:
        evs = self.journal()
        rows = self.rows()
        ids = {e.id for e in self.produced}
        done = batches(evs)
        s: dict[str, Any] = {
            "events": len(self.produced),
            "rows": sum(rows.values()),
            "loaded_twice": sorted(e for e, n in rows.items() if n > 1),
            "missing": sorted(ids - set(rows)),
            "unknown": sorted(set(rows) - ids),
            "batches": len(done),
            "mean_batch": round(sum(b["n"] for b in done) / max(1, len(done)), 1),
            "replayed": replayed(evs),
            "refused": sum(b["refused"] for b in done),
            "by_member": {m: written(evs, m) for m in sorted(self.members.procs)},
            "member_exit_codes": codes,
            "elapsed_s": round(time.monotonic() - self.started, 1),
        }
        s["ok"] = (
            s["rows"] == s["events"]
            and not s["loaded_twice"]
            and not s["missing"]
            and not s["unknown"]
            and s["replayed"] > 0
            # m2 was SIGKILLed; the others stop cleanly.
            and all(code == 0 for name, code in codes.items() if name != "m2")
        )
        return s

    def close(self, keep: bool) -> None:
        self.members.stop_all(10)
        if keep:
            table = f"table {self.table} kept; " if self.created else ""
            print(f"{table}journals and logs kept in {self.workdir}")
            return
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self.created:
            with contextlib.suppress(Exception), self.db() as conn:
                conn.execute(f"DROP TABLE IF EXISTS {self.table}")


def batches(evs: list[dict[str, Any]], member: str | None = None) -> list[dict[str, Any]]:
    return [e for e in evs if e["ev"] == "batch" and (member is None or e["m"] == member)]


def written(evs: list[dict[str, Any]], member: str) -> int:
    return sum(b["written"] for b in batches(evs, member))


def replayed(evs: list[dict[str, Any]]) -> int:
    return sum(b["replayed"] for b in batches(evs))


def print_summary(s: dict[str, Any]) -> None:
    def mark(ok: bool) -> str:
        return "ok" if ok else "FAIL"

    print()
    print("summary")
    print(f"  events produced              {s['events']}")
    print(f"  rows in the table            {s['rows']}  {mark(s['rows'] == s['events'])}")
    twice = len(s["loaded_twice"])
    print(f"  events loaded twice          {twice}  {mark(not twice)}")
    print(f"  events missing               {len(s['missing'])}  {mark(not s['missing'])}")
    print(f"  batches (one COPY each)      {s['batches']}, {s['mean_batch']} records on average")
    print(f"  records replayed (no-ops)    {s['replayed']}  {mark(s['replayed'] > 0)}")
    print(f"  records refused (fenced)     {s['refused']}")
    by = ", ".join(f"{m} {n}" for m, n in s["by_member"].items())
    print(f"  loaded by member             {by}")
    print(f"  elapsed                      {s['elapsed_s']} s")
    print("PASS: every event exactly once in the table" if s["ok"] else "FAIL")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def make(bootstrap: str, conninfo: str | None) -> Demo:
        assert conninfo is not None  # --postgres defaults to a throwaway server
        return Demo(args, bootstrap, conninfo)

    return run_demo(args, make, print_summary)


if __name__ == "__main__":
    sys.exit(main())
