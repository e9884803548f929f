"""Commits behind a rebalance: what a survivor has finished and not committed while a killed and
restarted member's rebalance waits, and what a kill of that survivor then makes others redo.

Three audited members on six partitions under a steady producer (weir's default commit
interval, 1 s). Member m3 is SIGKILLed (no LeaveGroup) and restarted at once, as a supervisor
would. Under the classic protocol a dynamic member's restart joins as a new member, and the
rebalance it starts waits for the dead one's session to expire: the survivors' commits queue
behind their own parked JoinGroup and fail (docs/rebalances.md). A sampler reads the audit
files and the group's committed offsets every 0.5 s and counts each survivor's finished records
at or above the committed offset of the partitions it owns. Inside the window (at 0.6 of the
session timeout after the kill) the survivor with the most such records is SIGKILLed too and
restarted; the records it had finished that anyone starts again after its kill are its
re-handled records.

Run per protocol and setting: the classic protocol with librdkafka's default 45 s session
timeout and with 6 s, dynamic and static (`group_instance_id`: the restart takes the dead
member's place, no rebalance), and the consumer protocol (KIP-848; the test broker's session
timeout is 6 s). Each prints one line and, with WEIR_RESULTS_DIR set, writes it as JSON.

The goal (issue 25): with static membership and under the consumer protocol a kill re-handles no
more than the records finished within one commit interval before it (plus what was running).
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.audit import check
from tests.audit.cluster import Members, SteadyProducer, handled_by
from weir.testing.pytest_plugin import TopicFactory

PARTITIONS = 6
RATE = 300
COMMIT_INTERVAL = 1.0
# Commit turn → the broker's answer, on a loaded 2-core machine: added to the interval when the
# goal bounds what a kill may re-handle.
COMMIT_LATENCY = 0.5
SAMPLE_EVERY = 0.5


@dataclass(frozen=True)
class Setting:
    name: str
    protocol: str
    session_s: float  # the session timeout in effect (the consumer protocol: the broker's)
    session_flag: float | None  # --session-timeout (0: librdkafka's default)
    static: bool
    goal: bool  # the bound must hold


SETTINGS = [
    Setting("classic-45s", "cooperative", 45.0, 0, static=False, goal=False),
    Setting("classic-6s", "cooperative", 6.0, 6.0, static=False, goal=False),
    Setting("classic-static-45s", "cooperative", 45.0, 0, static=True, goal=True),
    Setting("classic-static-6s", "cooperative", 6.0, 6.0, static=True, goal=True),
    Setting("consumer", "consumer", 6.0, None, static=False, goal=True),
    Setting("auto", "auto", 6.0, None, static=False, goal=True),
]


class Tail:
    """Reads what the members appended to their audit files since the last call."""

    def __init__(self, workdir: Path) -> None:
        self._dir = workdir
        self._pos: dict[Path, int] = {}
        self._rest: dict[Path, bytes] = {}

    def new(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for path in sorted(self._dir.glob("audit-*.jsonl")):
            with path.open("rb") as f:
                f.seek(self._pos.get(path, 0))
                data = self._rest.get(path, b"") + f.read()
                self._pos[path] = f.tell()
            *lines, self._rest[path] = data.split(b"\n")
            for line in lines:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # torn line of a killed member
        out.sort(key=lambda e: e["t"])
        return out


@dataclass
class Uncommitted:
    """Per member: what it finished in its current assignment of each partition it owns."""

    owner: dict[int, str] = field(default_factory=dict)
    done: dict[tuple[str, int], set[int]] = field(default_factory=lambda: defaultdict(set))

    def feed(self, events: list[dict[str, Any]]) -> None:
        for e in events:
            kind, m = e["ev"], e["m"]
            if kind == "assigned":
                for p in e["ps"]:
                    self.owner[p] = m
                    self.done[(m, p)] = set()
            elif kind in ("revoked", "lost"):
                for p in e["ps"]:
                    if self.owner.get(p) == m:
                        del self.owner[p]
            elif kind == "member_start":
                # A restarted member's partitions start over (it may get the same ones back).
                for p, owner in list(self.owner.items()):
                    if owner == m:
                        del self.owner[p]
            elif kind == "done" and self.owner.get(e["p"]) == m:
                self.done[(m, e["p"])].add(e["o"])

    def count(self, committed: list[int]) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for p, m in self.owner.items():
            out[m] += sum(1 for o in self.done[(m, p)] if o >= committed[p])
        return dict(out)


class Sampler(threading.Thread):
    """Every SAMPLE_EVERY: each member's finished-but-uncommitted records."""

    def __init__(self, workdir: Path, bootstrap: str, group: str, topic: str) -> None:
        super().__init__(daemon=True)
        self._tail = Tail(workdir)
        self._state = Uncommitted()
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        self._tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self.samples: list[tuple[float, dict[str, int]]] = []

    def sample(self) -> dict[str, int]:
        with self._lock:
            committed = [max(r.offset, 0) for r in self._consumer.committed(self._tps, timeout=10)]
            self._state.feed(self._tail.new())
            counts = self._state.count(committed)
            self.samples.append((time.time(), counts))
            return counts

    def run(self) -> None:
        while not self._halt.wait(SAMPLE_EVERY):
            self.sample()

    def finish(self) -> None:
        self._halt.set()
        self.join(30)
        self._consumer.close()


def _committed_gaps(
    evs: list[dict[str, Any]], members: list[str], t0: float, t1: float
) -> dict[str, Any]:
    """Per member, over [t0, t1]: the longest time without a confirmed commit, and the failed
    partition commits."""
    out: dict[str, Any] = {}
    for m in members:
        mine = [e for e in evs if e["m"] == m and t0 < e["t"] < t1]
        oks = [t0, *(e["t"] for e in mine if e["ev"] == "commit_committed"), t1]
        out[m] = {
            "longest_without_commit_s": round(max(b - a for a, b in itertools.pairwise(oks)), 1),
            "failed": sum(1 for e in mine if e["ev"] == "commit_failed"),
        }
    return out


def _rehandled(evs: list[dict[str, Any]], victim: str, killed_at: float) -> dict[str, int]:
    """The victim's records finished before its kill that anyone started again after it; those
    it was running at the kill; and those it finished within one commit interval before it."""
    before = [e for e in evs if e["m"] == victim and e["t"] < killed_at]
    done = {(e["p"], e["o"]) for e in before if e["ev"] == "done"}
    started = {(e["p"], e["o"]) for e in before if e["ev"] == "start"}
    again = {(e["p"], e["o"]) for e in evs if e["ev"] == "start" and e["t"] > killed_at}
    window = killed_at - COMMIT_INTERVAL - COMMIT_LATENCY
    recent = sum(1 for e in before if e["ev"] == "done" and e["t"] >= window)
    return {
        "rehandled": len(done & again),
        "in_flight": len(started - done),
        "finished_last_interval": recent,
    }


def _run(
    bootstrap: str,
    topic: str,
    workdir: Path,
    s: Setting,
    *,
    stop_after: float | None = None,
    shutdown_timeout: float = 8.0,
) -> dict[str, Any]:
    """The scenario; with `stop_after` the survivor is stopped (SIGTERM) that long after the
    first kill instead of killed at 0.6 of the session timeout."""
    group = f"jc-{s.name}-{uuid.uuid4().hex[:6]}"
    members = Members(workdir, bootstrap, group, topic, s.protocol)

    def start(name: str) -> None:
        extra = ["--commit-interval", str(COMMIT_INTERVAL), "--max-poll-ms", "60000"]
        extra += ["--shutdown-timeout", str(shutdown_timeout)]
        if s.session_flag is not None:
            extra += ["--session-timeout", str(s.session_flag)]
            extra += ["--heartbeat", "0" if s.session_flag == 0 else "1"]
        if s.static:
            extra += ["--instance-id", f"{group}-{name}"]
        members.start(name, *extra)

    producer = SteadyProducer(bootstrap, topic, rate=RATE)
    sampler = Sampler(workdir, bootstrap, group, topic)
    producer.start()
    try:
        for name in ("m1", "m2", "m3"):
            start(name)
        members.wait_for(
            lambda e: all(handled_by(e, m) > 50 for m in ("m1", "m2", "m3")),
            120,
            "every member to handle records",
        )
        time.sleep(3)  # steady state: every member committing
        sampler.start()
        time.sleep(2)
        first_kill = time.time()
        members.kill("m3")
        start("m3")  # a supervisor's restart
        second_at = first_kill + (0.6 * s.session_s if stop_after is None else stop_after)
        while time.time() < second_at:
            time.sleep(0.1)
        counts = sampler.sample()
        victim = max(("m1", "m2"), key=lambda m: counts.get(m, 0))
        uncommitted_at_kill = counts.get(victim, 0)
        second_kill = time.time()
        stop_s = None
        if stop_after is None:
            members.kill(victim)
        else:
            assert members.stop(victim, timeout=120) == 0
            stop_s = round(time.time() - second_kill, 1)
        start(victim)
        time.sleep(max(10.0, s.session_s + 5))
        sampler.finish()
        ends = members.finish(producer, bootstrap, topic, PARTITIONS, timeout=180)
    finally:
        members.close()
        if producer.is_alive():
            producer.finish()
        if sampler.is_alive():
            sampler.finish()
    evs = members.events()
    report = check(evs, ends)
    assert not report.violations, "\n".join(report.violations[:20])
    survivors = ["m1", "m2"]
    series = [
        (round(t - first_kill, 1), {m: c.get(m, 0) for m in survivors})
        for t, c in sampler.samples
        if t <= second_kill + 0.01
    ]
    window = [c for t, c in series if t >= 0]
    result = {
        "setting": s.name,
        "victim": victim,
        "uncommitted_at_kill": uncommitted_at_kill,
        "max_uncommitted": {m: max((c[m] for c in window), default=0) for m in survivors},
        **_rehandled(evs, victim, second_kill),
        "commits_until_second_kill": _committed_gaps(evs, survivors, first_kill, second_kill),
        "stop_s": stop_s,
        # The victim's commit results from its stop (or kill) until its restart's first.
        "final_commits": [
            (e["ev"], e["o"], (e["err"] or "")[:40])
            for e in evs
            if e["m"] == victim
            and e["ev"] in ("commit_committed", "commit_failed")
            and second_kill <= e["t"] <= second_kill + (stop_s or 0)
        ],
        "duplicates_total": report.duplicates,
        "produced": report.produced,
        "series": series,
    }
    return result


@pytest.mark.broker
@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("setting", SETTINGS, ids=[s.name for s in SETTINGS])
def test_a_kill_inside_a_rebalance_rehandles_what_was_not_committed(
    kafka_bootstrap: str, make_topic: TopicFactory, tmp_path: Path, setting: Setting
) -> None:
    r = _run(kafka_bootstrap, make_topic(PARTITIONS), tmp_path, setting)
    brief = {k: v for k, v in r.items() if k != "series"}
    print(f"\n[join-commits] {json.dumps(brief)}")
    print(f"[join-commits] {setting.name} series {r['series']}")
    out = os.environ.get("WEIR_RESULTS_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"join-commits-{setting.name}.json").write_text(json.dumps(r))
    if setting.goal:
        bound = r["finished_last_interval"] + r["in_flight"]
        assert r["rehandled"] <= bound, r


STOPS = [30.0, 8.0]


@pytest.mark.broker
@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("shutdown_timeout", STOPS, ids=[f"shutdown-{t:g}s" for t in STOPS])
def test_a_stop_inside_a_rebalance(
    kafka_bootstrap: str, make_topic: TopicFactory, tmp_path: Path, shutdown_timeout: float
) -> None:
    """A survivor stopped (SIGTERM) 20 s into the 45 s window of a dynamic classic member's
    restart: how long its stop takes, whether its last commit is confirmed, and what the next
    owners handle again. Its JoinGroup waits until the window ends; a synchronous last commit
    waited behind it, then failed."""
    setting = SETTINGS[0]
    r = _run(
        kafka_bootstrap,
        make_topic(PARTITIONS),
        tmp_path,
        setting,
        stop_after=20.0,
        shutdown_timeout=shutdown_timeout,
    )
    brief = {k: v for k, v in r.items() if k != "series"}
    print(f"\n[join-commits-stop] shutdown_timeout={shutdown_timeout:g} {json.dumps(brief)}")
    out = os.environ.get("WEIR_RESULTS_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        name = f"join-commits-stop-{shutdown_timeout:g}.json"
        (Path(out) / name).write_text(json.dumps(r))
