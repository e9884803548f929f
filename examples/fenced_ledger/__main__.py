"""``python -m examples.fenced_ledger``: balances from transfers, exact under rebalances, replays
and a zombie. See README.md.

A topic of transfers (2 partitions) is applied to account balances by members of one consumer
group, each a process with a `LedgerHandler` and a fence (SQLite by default, PostgreSQL with
``--postgres``). The run: m2 joins (a rebalance); m2, which never commits, is SIGKILLed, and m1
replays what m2 applied (no-ops); m3 joins, stalls inside a transfer and is frozen with SIGSTOP
until its session expires and m1 takes its partition; m3, resumed, finishes its transfer with
its old epoch and is refused. The balances must equal one application of every transfer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import random
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from examples.fenced_ledger import (
    OPENING_BALANCE,
    SCHEMA,
    Transfer,
    expected_balances,
    random_transfers,
)
from examples.fenced_ledger.member import Members

PARTITIONS = 2
KAFKA_LOG = logging.getLogger("examples.fenced_ledger.kafka")
KAFKA_LOG.setLevel(logging.ERROR)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m examples.fenced_ledger",
        description="Account balances from transfers, exact under a rebalance, a replay and a "
        "zombie (see README.md).",
    )
    ap.add_argument("--bootstrap", help="use this Kafka instead of starting an embedded broker")
    ap.add_argument(
        "--postgres",
        nargs="?",
        const="embedded",
        metavar="CONNINFO",
        help="keep the ledger in PostgreSQL: this connection string, or without one a throwaway "
        "server started from the installed binaries (default: a SQLite file)",
    )
    ap.add_argument("--transfers", type=int, default=600, help="transfers to produce (600)")
    ap.add_argument("--accounts", type=int, default=12, help="accounts (12)")
    ap.add_argument("--seed", type=int, default=None, help="seed of the random transfers")
    ap.add_argument("--timeout", type=float, default=120.0, help="give up after this long (s)")
    ap.add_argument("--summary-json", type=Path, help="also write the summary here as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the members' journals and logs")
    args = ap.parse_args(argv)
    if args.transfers < 60 or args.accounts < 2:
        ap.error("--transfers must be at least 60 and --accounts at least 2")
    return args


class Ledger:
    """The driver's own connection to the ledger database, for set-up and the checks."""

    def __init__(self, sqlite_path: Path | None, conninfo: str | None) -> None:
        self.sqlite_path = sqlite_path
        self.conninfo = conninfo

    @contextlib.contextmanager
    def connect(self) -> Iterator[Any]:
        conn: Any
        if self.conninfo is not None:
            import psycopg

            conn = psycopg.connect(self.conninfo, autocommit=True)
        else:
            conn = sqlite3.connect(self.sqlite_path or "", isolation_level=None, timeout=30)
        try:
            yield conn
        finally:
            conn.close()

    def create(self, accounts: list[str]) -> None:
        mark = "%s" if self.conninfo is not None else "?"
        with self.connect() as conn:
            for statement in SCHEMA:
                conn.execute(statement)
            conn.execute("DELETE FROM accounts")
            conn.execute("DELETE FROM postings")
            for account in accounts:
                conn.execute(
                    f"INSERT INTO accounts (id, balance) VALUES ({mark}, {mark})",
                    (account, OPENING_BALANCE),
                )

    def epoch(self, group: str, topic: str, partition: int) -> int | None:
        mark = "%s" if self.conninfo is not None else "?"
        with self.connect() as conn:
            row = conn.execute(
                f"SELECT epoch FROM weir_fence_epochs WHERE group_id = {mark} "
                f"AND topic = {mark} AND partition = {mark}",
                (group, topic, partition),
            ).fetchone()
        return None if row is None else int(row[0])

    def balances(self) -> dict[str, int]:
        with self.connect() as conn:
            return {a: int(b) for a, b in conn.execute("SELECT id, balance FROM accounts")}

    def postings(self) -> Counter[str]:
        with self.connect() as conn:
            return Counter(t for (t,) in conn.execute("SELECT transfer_id FROM postings"))


class Demo:
    def __init__(self, args: argparse.Namespace, bootstrap: str, conninfo: str | None) -> None:
        run = uuid.uuid4().hex[:8]
        self.args = args
        self.bootstrap = bootstrap
        self.topic = f"transfers-{run}"
        self.group = f"ledger-{run}"
        self.started = time.monotonic()
        self.deadline = self.started + args.timeout
        self.workdir = Path(tempfile.mkdtemp(prefix="weir-ledger-"))
        self.rng = random.Random(args.seed)
        self.accounts = [f"acct-{i:02d}" for i in range(args.accounts)]
        sqlite_path = self.workdir / "ledger.db" if conninfo is None else None
        self.ledger = Ledger(sqlite_path, conninfo)
        db_args = (
            ["--postgres", conninfo] if conninfo is not None else ["--sqlite", str(sqlite_path)]
        )
        self.members = Members(
            self.workdir,
            ["--bootstrap", bootstrap, "--topic", self.topic, "--group", self.group, *db_args],
        )
        self.transfers: list[Transfer] = []
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "logger": KAFKA_LOG}
        )

    def say(self, text: str) -> None:
        print(f"{time.monotonic() - self.started:6.1f}s  {text}", flush=True)

    # -- set-up and helpers ---------------------------------------------------------------

    def create_topic(self) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(self.topic, PARTITIONS, 1)])
        for future in futures.values():
            future.result(30)

    def produce(self, n: int) -> None:
        batch = random_transfers(n, self.accounts, self.rng, start=len(self.transfers))
        for t in batch:
            self.producer.produce(self.topic, key=t.id.encode(), value=t.to_json())
        if self.producer.flush(30):
            raise RuntimeError("transfers not delivered within 30 s")
        self.transfers.extend(batch)

    def events(self) -> list[dict[str, Any]]:
        return self.members.events()

    def wait_for(self, what: str, pred: Callable[[list[dict[str, Any]]], object]) -> Any:
        while True:
            failed = [e for e in self.events() if e["ev"] == "failed"]
            if failed:
                raise RuntimeError(f"member {failed[0]['m']} failed: {failed[0]['error']}")
            found = pred(self.events())
            if found:
                return found
            if time.monotonic() > self.deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            time.sleep(0.1)

    def owned(self, evs: list[dict[str, Any]]) -> dict[str, set[int]]:
        """Each member's partitions, from its journal."""
        owned: dict[str, set[int]] = {}
        for e in evs:
            mine = owned.setdefault(e["m"], set())
            if e["ev"] == "assigned":
                mine.update(e["ps"])
            elif e["ev"] in ("revoked", "lost"):
                mine.difference_update(e["ps"])
        return owned

    def committed(self) -> list[int]:
        c = Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": self.group, "logger": KAFKA_LOG}
        )
        try:
            tps = [TopicPartition(self.topic, p) for p in range(PARTITIONS)]
            return [r.offset for r in c.committed(tps, timeout=10)]
        finally:
            c.close()

    def end_offsets(self) -> list[int]:
        c = Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": self.group, "logger": KAFKA_LOG}
        )
        try:
            return [
                c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                for p in range(PARTITIONS)
            ]
        finally:
            c.close()

    # -- the scenario -----------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        args = self.args
        third = args.transfers // 3
        self.create_topic()
        self.ledger.create(self.accounts)
        self.say(f"topic {self.topic} ({PARTITIONS} partitions), {len(self.accounts)} accounts")

        # 1. A rebalance: m1 applies the first third alone, then m2 joins and takes a partition.
        self.members.start("m1")
        self.wait_for("m1 to be assigned", lambda e: self.owned(e).get("m1"))
        self.produce(third)
        self.wait_for("m1 to apply the first third", lambda e: count(e, "applied") >= third)
        # m2 commits only at a hand-off: what it applies stays uncommitted until then.
        self.members.start("m2", "--commit-interval", "300")
        moved = self.wait_for("m2 to take a partition", lambda e: self.owned(e).get("m2"))
        self.say(f"rebalance: m2 joined and took partition {sorted(moved)} from m1")

        # 2. A replay: m2 applies some transfers and is killed before committing any of them.
        self.produce(third)
        self.wait_for("m2 to apply transfers", lambda e: count(e, "applied", "m2") >= 10)
        self.members.signal("m2", signal.SIGKILL)
        applied_by_m2 = count(self.events(), "applied", "m2")
        self.say(f"replay: m2 applied {applied_by_m2} transfers, committed none, got SIGKILL")
        replays = self.wait_for("m1 to replay m2's transfers", lambda e: count(e, "replay", "m1"))
        self.say(f"        m1 took its partition back and replays them: no-ops ({replays} so far)")

        # 3. A zombie: m3 joins, stalls inside a transfer and is frozen (SIGSTOP).
        resume = self.workdir / "resume"
        # One worker: with SQLite, a frozen worker inside a write transaction would hold the
        # database's only write lock (and its write would not be late: see README.md).
        self.members.start(
            *("m3", "--workers", "1", "--commit-interval", "300"),
            *("--stall-after", "3", "--resume-file", str(resume)),
        )
        self.wait_for("m3 to take a partition", lambda e: self.owned(e).get("m3"))
        self.produce(args.transfers - 2 * third)
        stalled = self.wait_for("m3 to stall", lambda e: first(e, "stalled", "m3"))
        self.members.signal("m3", signal.SIGSTOP)
        frozen_at = time.time()
        resume.touch()  # m3 goes on as soon as it runs again
        where = "inside" if self.ledger.conninfo is not None else "just before"
        self.say(
            f"zombie: m3 stalled {where} its transaction for transfer at partition "
            f"{stalled['p']} offset {stalled['o']} (epoch {self.epoch(stalled['p'])}): SIGSTOP"
        )
        self.wait_for(
            "m1 to take m3's partition",
            lambda e: any(
                x["ev"] == "assigned"
                and x["m"] == "m1"
                and stalled["p"] in x["ps"]
                and x["t"] > frozen_at
                for x in e
            ),
        )
        time.sleep(1.0)  # m1 applies m3's transfers meanwhile
        self.say(
            f"        m3's session expired; m1 took partition {stalled['p']} "
            f"(epoch {self.epoch(stalled['p'])}): SIGCONT m3"
        )
        self.members.signal("m3", signal.SIGCONT)
        fenced = self.wait_for("m3's late write", lambda e: first(e, "fenced", "m3"))
        self.say(
            f"        m3 finished its transfer with epoch {fenced['epoch']}: refused, the "
            f"database holds epoch {fenced['stored']}"
        )

        # Every transfer applied and committed, then everybody leaves.
        self.wait_for(
            "every transfer to be applied",
            lambda e: len(self.ledger.postings()) >= len(self.transfers),
        )
        ends = self.end_offsets()
        self.wait_for("the group's commits to reach the end", lambda e: self.committed() == ends)
        codes = self.members.stop_all()
        self.say("every transfer applied and committed; members stopped")
        return self.summary(codes)

    def epoch(self, partition: int) -> int | None:
        """The partition's epoch in the fence's table now."""
        return self.ledger.epoch(self.group, self.topic, partition)

    def summary(self, codes: dict[str, int]) -> dict[str, Any]:
        evs = self.events()
        postings = self.ledger.postings()
        balances = self.ledger.balances()
        expected = expected_balances(self.accounts, self.transfers)
        ids = {t.id for t in self.transfers}
        s: dict[str, Any] = {
            "database": "postgresql" if self.ledger.conninfo is not None else "sqlite",
            "transfers": len(self.transfers),
            "applied": sum(postings.values()),
            "applied_twice": sorted(t for t, n in postings.items() if n > 1),
            "missing": sorted(ids - set(postings)),
            "replays": count(evs, "replay"),
            "refused_late_writes": count(evs, "fenced"),
            "balances_match": balances == expected,
            "total": sum(balances.values()),
            "expected_total": OPENING_BALANCE * len(self.accounts),
            "member_exit_codes": codes,
            "elapsed_s": round(time.monotonic() - self.started, 1),
        }
        s["ok"] = (
            s["applied"] == s["transfers"]
            and not s["applied_twice"]
            and not s["missing"]
            and s["balances_match"]
            and s["total"] == s["expected_total"]
            and s["replays"] > 0
            and s["refused_late_writes"] > 0
            # m2 was SIGKILLed; the others stop cleanly.
            and all(code == 0 for name, code in codes.items() if name != "m2")
        )
        return s

    def close(self, keep: bool) -> None:
        self.members.stop_all(10)
        if keep:
            print(f"journals and logs kept in {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)


def count(evs: list[dict[str, Any]], ev: str, member: str | None = None) -> int:
    return sum(1 for e in evs if e["ev"] == ev and (member is None or e["m"] == member))


def first(evs: list[dict[str, Any]], ev: str, member: str) -> dict[str, Any] | None:
    return next((e for e in evs if e["ev"] == ev and e["m"] == member), None)


def print_summary(s: dict[str, Any]) -> None:
    def mark(ok: bool) -> str:
        return "ok" if ok else "FAIL"

    print()
    print(f"summary ({s['database']})")
    print(f"  transfers produced          {s['transfers']}")
    print(f"  applied                     {s['applied']}  {mark(s['applied'] == s['transfers'])}")
    print(
        f"  applied twice               {len(s['applied_twice'])}  {mark(not s['applied_twice'])}"
    )
    print(f"  missing                     {len(s['missing'])}  {mark(not s['missing'])}")
    print(f"  replays (no-ops)            {s['replays']}  {mark(s['replays'] > 0)}")
    late = s["refused_late_writes"]
    print(f"  late writes refused         {late}  {mark(late > 0)}")
    print(f"  balances = one application  {s['balances_match']}  {mark(s['balances_match'])}")
    total_ok = s["total"] == s["expected_total"]
    print(f"  money in the accounts       {s['total']} of {s['expected_total']}  {mark(total_ok)}")
    print(f"  elapsed                     {s['elapsed_s']} s")
    print("PASS" if s["ok"] else "FAIL")


@contextlib.contextmanager
def kafka(bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    from weir.testing import EmbeddedKafka

    print("starting embedded Kafka...", flush=True)
    broker = EmbeddedKafka()
    broker.start()
    try:
        yield broker.bootstrap_servers
    finally:
        broker.stop()


@contextlib.contextmanager
def postgres(conninfo: str | None) -> Iterator[str | None]:
    if conninfo != "embedded":
        yield conninfo
        return
    from weir.testing.postgres import EmbeddedPostgres

    print("starting a throwaway PostgreSQL...", flush=True)
    with EmbeddedPostgres() as pg:
        yield pg.dsn


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_demo(
        args, lambda bootstrap, conninfo: Demo(args, bootstrap, conninfo), print_summary
    )


class DemoRun(Protocol):
    def run(self) -> dict[str, Any]: ...

    def close(self, keep: bool) -> None: ...


def run_demo(
    args: argparse.Namespace,
    make: Callable[[str, str | None], DemoRun],
    show: Callable[[dict[str, Any]], None],
) -> int:
    """Run a demo on Kafka and the database (`args.bootstrap`, `args.postgres`: embedded when
    not given) and `show` its summary; the exit code (0: the summary's "ok")."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
    with kafka(args.bootstrap) as bootstrap, postgres(args.postgres) as conninfo:
        demo = make(bootstrap, conninfo)
        ok = False
        try:
            s = demo.run()
            show(s)
            ok = s["ok"]
            if args.summary_json:
                args.summary_json.write_text(json.dumps(s, indent=2))
        except (TimeoutError, RuntimeError) as exc:
            print(f"FAIL: {exc}")
        finally:
            demo.close(keep=args.keep or not ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
