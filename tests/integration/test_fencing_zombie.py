"""A zombie's late writes are refused by the fence, on SQLite and PostgreSQL, with real members.

Member A (its own process, `tests.audit.fenced_member`) holds the only partition and stops at a
known record, in the middle of its write; the test freezes it there with SIGSTOP. Its session
expires, B joins, acquires the partition's epoch, replays what A applied but never committed
(no-ops, by event id) and applies the rest. Then A is resumed with SIGCONT and finishes its
write with the epoch it held: the database refuses it (`FencedError`, rolled back). At the end
the counters equal exactly one application of every record, and no record was applied twice.

Where A stops: PostgreSQL, inside the fenced transaction, after its write changed the counter
(B's write of the same record waits for A's claim on the event id; A's write is then refused
by the epoch check under the row lock and rolled back). SQLite, just before the transaction:
SQLite has one write lock, and a process frozen inside a write transaction keeps it, so no
other member could acquire or write at all; the last case shows that such a write is not late
(it commits before the new owner's acquire, which waits for it) and still applies once.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from examples.fenced_ledger.member import wait_stopped

from tests.audit import read
from tests.audit.fenced_member import schema, tables
from tests.integration.kafka_helpers import committed, produce
from weir.testing.pytest_plugin import TopicFactory

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
RECORDS = 40
HOLD = 12  # the record A stops at; its key is its own, so only it waits behind A in B
KEYS = ("a", "b", "c", "d")
WAIT = 60.0


def key_of(offset: int) -> str:
    return "hold" if offset == HOLD else KEYS[offset % len(KEYS)]


def expected_totals() -> dict[str, int]:
    totals = dict.fromkeys([*KEYS, "hold"], 0)
    for offset in range(RECORDS):
        totals[key_of(offset)] += offset + 1
    return totals


@dataclass
class Database:
    backend: str
    target: str  # the SQLite file, or the PostgreSQL conninfo
    prefix: str

    def connect(self) -> Any:
        if self.backend == "sqlite":
            return sqlite3.connect(self.target, isolation_level=None, timeout=30)
        import psycopg

        return psycopg.connect(self.target, autocommit=True)

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        conn = self.connect()
        try:
            return [tuple(r) for r in conn.execute(sql).fetchall()]
        finally:
            conn.close()

    def create(self) -> None:
        counters, _ = tables(self.prefix)
        conn = self.connect()
        try:
            for statement in schema(self.prefix):
                conn.execute(statement)
            for key in expected_totals():
                conn.execute(f"INSERT INTO {counters} (k, total) VALUES ('{key}', 0)")
        finally:
            conn.close()

    def drop(self) -> None:
        conn = self.connect()
        try:
            for table in (*tables(self.prefix), f"{self.prefix}_epochs", f"{self.prefix}_applied"):
                conn.execute(f"DROP TABLE IF EXISTS {table}")
        finally:
            conn.close()

    def totals(self) -> dict[str, int]:
        counters, _ = tables(self.prefix)
        return {k: int(t) for k, t in self.rows(f"SELECT k, total FROM {counters}")}

    def applications(self) -> list[tuple[str, str]]:
        _, applications = tables(self.prefix)
        return [(e, m) for e, m in self.rows(f"SELECT event_id, member FROM {applications}")]

    def applied_epochs(self, group: str) -> dict[int, int]:
        return {
            int(o): int(e)
            for o, e in self.rows(
                f"SELECT record_offset, epoch FROM {self.prefix}_applied WHERE group_id = '{group}'"
            )
        }

    def lock_waiters(self) -> int:
        """PostgreSQL sessions of the fences waiting for a lock now."""
        return int(
            self.rows(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = 'weir-fence' AND wait_event_type = 'Lock'"
            )[0][0]
        )


class Processes:
    """Fenced members, each a process of its own with its audit file and log in `workdir`."""

    def __init__(self, workdir: Path, common: list[str]) -> None:
        self.workdir = workdir
        self.common = common
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *extra: str) -> None:
        log = (self.workdir / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            [
                *(sys.executable, "-m", "tests.audit.fenced_member", *self.common),
                *("--member", name, "--audit", str(self.workdir / f"audit-{name}.jsonl")),
                *extra,
            ],
            cwd=REPO,
            stdout=log,
            stderr=log,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )

    def signal(self, name: str, sig: signal.Signals) -> None:
        proc = self.procs[name]
        proc.send_signal(sig)
        if sig == signal.SIGSTOP:
            # The kernel stops the process when it next runs, not at once: on a busy machine
            # it may go on for tens of milliseconds, past whatever is done next on the
            # assumption that it is frozen (the resume file). Wait until it is.
            wait_stopped(proc.pid)

    def events(self) -> list[dict[str, Any]]:
        return read(sorted(self.workdir.glob("audit-*.jsonl")))

    def wait_for(
        self, pred: Callable[[list[dict[str, Any]]], object], what: str, timeout: float = WAIT
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise AssertionError(
                        f"member {name} exited with {p.returncode}:\n{self.tail(name)}"
                    )
            evs = self.events()
            if pred(evs):
                return evs
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.1)

    def stop(self, name: str, timeout: float = 30) -> int:
        p = self.procs.pop(name)
        p.send_signal(signal.SIGCONT)
        p.send_signal(signal.SIGTERM)
        return p.wait(timeout)

    def tail(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")[-3000:]

    def close(self) -> None:
        for p in self.procs.values():
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait(10)
        self.procs.clear()


def attempts(evs: list[dict[str, Any]], member: str) -> list[dict[str, Any]]:
    return [e for e in evs if e["m"] == member and e["ev"] == "attempt"]


def outcomes(evs: list[dict[str, Any]], member: str) -> dict[int, str]:
    """The last outcome of each record `member` attempted."""
    return {e["o"]: e["outcome"] for e in attempts(evs, member)}


@dataclass
class Outcome:
    events: list[dict[str, Any]]
    zombie_epoch: int
    db: Database
    group: str
    topic: str

    def check_exactly_once(self) -> None:
        """The final table is one application of every record, and nothing was applied twice."""
        applied = Counter(event_id for event_id, _ in self.db.applications())
        assert applied == Counter(f"{self.topic}/0/{o}" for o in range(RECORDS)), applied
        assert self.db.totals() == expected_totals()
        assert sorted(self.db.applied_epochs(self.group)) == list(range(RECORDS))


@pytest.fixture(
    params=[
        pytest.param(("sqlite", "before"), id="sqlite"),
        pytest.param(("postgres", "inside"), id="postgres", marks=pytest.mark.postgres),
    ]
)
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Database, str]]:
    backend, where = request.param
    prefix = f"z{uuid.uuid4().hex[:10]}"
    if backend == "sqlite":
        db = Database(backend, str(tmp_path / "ledger.db"), prefix)
    else:
        db = Database(backend, request.getfixturevalue("postgres_dsn"), prefix)
    db.create()
    yield db, where
    if backend == "postgres":
        db.drop()


def sole_owner_is_new(bootstrap: str, group: str, since: float) -> bool:
    """The group has one member, holding partition 0, and A (frozen at ``since``) is gone:
    its session timeout passed."""
    from weir.testing.pytest_plugin import admin_client

    if time.monotonic() - since < 3.0:
        return False
    admin = admin_client(bootstrap)
    [future] = admin.describe_consumer_groups([group], request_timeout=5).values()
    try:
        described = future.result(timeout=10)
    except Exception:
        return False
    members = list(described.members)
    return len(members) == 1 and any(
        tp.partition == 0 for tp in members[0].assignment.topic_partitions
    )


def has(ev: str, member: str) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda evs: any(e["ev"] == ev and e["m"] == member for e in evs)


def run_zombie(
    bootstrap: str,
    topic: str,
    workdir: Path,
    db: Database,
    where: str,
    protocol: str = "eager",
) -> Outcome:
    """The scenario of the module docstring; returns what happened, for the checks."""
    group = f"zombie-{uuid.uuid4().hex[:8]}"
    produce(
        bootstrap,
        topic,
        [
            (key_of(o).encode(), json.dumps({"k": key_of(o), "n": o + 1}).encode())
            for o in range(RECORDS)
        ],
        partition=0,
    )
    go = workdir / "go"
    common = [
        *("--bootstrap", bootstrap, "--group", group, "--topic", topic),
        *("--protocol", protocol, "--backend", db.backend, "--db", db.target),
        *("--prefix", db.prefix, "--session-timeout", "3", "--fence-timeout", "30"),
    ]
    lock_held = db.backend == "sqlite" and where == "inside"
    members = Processes(workdir, common)
    try:
        # A: one worker, and no commit before the freeze, so B replays what A applied.
        hold = ("--hold-at", str(HOLD), "--hold-where", where, "--go", str(go))
        members.start("A", "--workers", "1", "--commit-interval", "300", *hold)
        evs = members.wait_for(has("holding", "A"), f"A to stop at record {HOLD}")
        zombie_epoch = int(attempts(evs, "A")[-1]["epoch"])
        members.signal("A", signal.SIGSTOP)
        frozen = time.monotonic()
        go.touch()  # A goes on as soon as it runs again
        members.start("B", "--workers", "4")
        if lock_held:
            # B's acquire waits for the write lock that A holds, frozen. It runs in B's
            # assignment callback, before on_assigned: what shows the assignment meanwhile is
            # the group (A, frozen past its session timeout, is out of it).
            deadline = time.monotonic() + 60
            while not sole_owner_is_new(bootstrap, group, frozen):
                assert time.monotonic() < deadline, "B was never given the partition"
                time.sleep(0.2)
            time.sleep(1.0)
            assert "assigned" not in [e["ev"] for e in members.events() if e["m"] == "B"]
        else:
            # B applies everything but what waits for A: with PostgreSQL, the record whose
            # event id A claimed inside its open transaction.
            waits_for_a = {HOLD} if where == "inside" else set()
            members.wait_for(
                lambda e: set(outcomes(e, "B")) >= set(range(RECORDS)) - waits_for_a,
                "B to apply the records",
            )
            if waits_for_a:
                assert db.lock_waiters() >= 1  # B's write of HOLD waits for the zombie's claim
                assert HOLD not in outcomes(members.events(), "B")
        print(f"A frozen for {time.monotonic() - frozen:.1f} s")
        members.signal("A", signal.SIGCONT)
        members.wait_for(lambda e: HOLD in outcomes(e, "A"), "A's write of the held record")
        members.wait_for(
            lambda e: set(outcomes(e, "B")) == set(range(RECORDS)), "B to finish every record"
        )
        members.wait_for(
            lambda e: committed(bootstrap, group, topic, 1) == [RECORDS],
            "the group's commit to reach the end",
        )
        assert members.stop("B") == 0, members.tail("B")
        assert members.stop("A") == 0, members.tail("A")
        return Outcome(members.events(), zombie_epoch, db, group, topic)
    finally:
        members.close()


def check_late_writes_refused(out: Outcome) -> None:
    """A applied some records before it stopped; every write it attempted with its old epoch
    after the freeze was refused; B, with a newer epoch, replayed A's records as no-ops (A had
    committed none) and applied the rest, the held record included."""
    evs, old = out.events, out.zombie_epoch
    held_at = next(e["t"] for e in evs if e["ev"] == "holding")
    a = attempts(evs, "A")
    before = [e for e in a if e["t"] < held_at]
    assert {(e["epoch"], e["outcome"]) for e in before} == {(old, "applied")}, before
    by_a = {e["o"] for e in before}
    late = [e for e in a if e["t"] > held_at and e["epoch"] == old]
    assert late and late[0]["o"] == HOLD, late
    assert {e["outcome"] for e in late} == {"fenced"}, late
    b = attempts(evs, "B")
    assert min(e["epoch"] for e in b) > old
    first_b: dict[int, str] = {}
    for e in b:
        first_b.setdefault(e["o"], e["outcome"])
    assert first_b == {o: "replay" if o in by_a else "applied" for o in range(RECORDS)}
    applied_by = dict(out.db.applications())
    assert applied_by[f"{out.topic}/0/{HOLD}"] == "B"
    assert out.db.applied_epochs(out.group)[HOLD] > old


def test_a_zombies_late_write_is_refused_and_every_record_applies_once(
    kafka_bootstrap: str,
    make_topic: TopicFactory,
    tmp_path: Path,
    case: tuple[Database, str],
) -> None:
    db, where = case
    out = run_zombie(kafka_bootstrap, make_topic(1), tmp_path, db, where)
    check_late_writes_refused(out)
    out.check_exactly_once()


def test_sqlite_a_write_frozen_inside_its_transaction_commits_before_the_new_owner_acquires(
    kafka_bootstrap: str, make_topic: TopicFactory, tmp_path: Path
) -> None:
    """SQLite's one write lock, held by the frozen process: B's acquire waits for it, so A's
    write of the held record is not late. It commits with A's epoch, before B's, and B's
    replay of it is a no-op.

    Cooperative-sticky, not range: B has the records after the held one still to apply when A
    resumes, and A, back from its expired session, rejoins the group at once. Range gives the
    one partition to whichever member id sorts first: when that was A and B was slow (1 run in
    10 on a loaded machine), A took the partition back with a newer epoch and applied the rest,
    and B never finished. Sticky keeps it with B, its owner."""
    db = Database("sqlite", str(tmp_path / "ledger.db"), "z")
    db.create()
    out = run_zombie(kafka_bootstrap, make_topic(1), tmp_path, db, "inside", "cooperative")
    evs, old = out.events, out.zombie_epoch
    held = next(e for e in attempts(evs, "A") if e["o"] == HOLD)
    assert (held["epoch"], held["outcome"]) == (old, "applied")
    b = attempts(evs, "B")
    assert min(e["epoch"] for e in b) > old
    assert next(e["outcome"] for e in b if e["o"] == HOLD) == "replay"
    assert dict(db.applications())[f"{out.topic}/0/{HOLD}"] == "A"
    out.check_exactly_once()
