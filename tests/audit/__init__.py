"""Audit harness for rebalance and chaos tests.

Each member process appends JSON lines to its own file: every handler start and finish, every
commit sent and every commit result, and every assign/revoke/lost, with the member, partition,
offset and assignment token. `check()` reads all files back and verifies the hand-off invariants.
A SIGKILLed member may leave a torn last line; the reader skips it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weir import CommitEvent, ConsumerStats, Context, Handler, Partition, Record


class AuditWriter:
    def __init__(self, path: Path, member: str) -> None:
        self._f = path.open("a", buffering=1, encoding="utf-8")
        self._member = member
        self._lock = threading.Lock()

    def write(self, ev: str, **fields: Any) -> None:
        fields.update(ev=ev, m=self._member, t=time.time())
        line = json.dumps(fields, separators=(",", ":"))
        with self._lock:
            self._f.write(line + "\n")

    def commit(self, e: CommitEvent) -> None:
        self.write("commit_" + e.status, p=e.tp.partition, o=e.offset, sync=e.sync, err=e.error)

    def stats(self, s: ConsumerStats) -> None:
        """The offset map's figures: records skipped thanks to a restored map, commits whose
        map was cut, and each partition's map size."""
        self.write(
            "stats",
            skipped=s.replay_skipped,
            truncations=s.offset_map_truncations,
            map_bytes={str(p.tp.partition): p.offset_map_bytes for p in s.partitions},
        )

    def close(self) -> None:
        self._f.close()


class AuditedHandler(Handler):
    """Records every call; sleeps a random-ish time to make hand-offs land mid-work.

    A record in `hold` (partition, offset) is held: its handler waits until weir cancels it
    (a revoke or shutdown past its budget) and returns unfinished, audited as "abandoned".
    With `stall_every` N, every Nth offset of a partition takes `stall_ms` instead: a slow
    record that the records after it overtake."""

    def __init__(
        self,
        audit: AuditWriter,
        slow_ms: float = 0.0,
        hold: frozenset[tuple[int, int]] = frozenset(),
        stall_every: int = 0,
        stall_ms: float = 0.0,
    ) -> None:
        self.audit = audit
        self.slow = slow_ms / 1000.0
        self.hold = hold
        self.stall_every = stall_every
        self.stall = stall_ms / 1000.0

    def handle(self, record: Record, ctx: Context) -> None:
        a = self.audit
        a.write("start", p=record.partition, o=record.offset, tok=ctx.token)
        if (record.partition, record.offset) in self.hold:
            while not ctx.cancelled:
                time.sleep(0.01)
            a.write("abandoned", p=record.partition, o=record.offset, tok=ctx.token)
            return
        if self.stall_every and record.offset % self.stall_every == self.stall_every - 1:
            time.sleep(self.stall)
        elif self.slow:
            # Deterministic per offset, so a replay has the same cost.
            time.sleep(self.slow * (0.25 + (record.offset * 7919 % 100) / 100))
        a.write("done", p=record.partition, o=record.offset, tok=ctx.token)

    def on_assigned(self, partitions: Sequence[Partition]) -> None:
        self.audit.write("assigned", ps=[tp.partition for tp in partitions])

    def on_revoked(self, partitions: Sequence[Partition]) -> None:
        self.audit.write("revoked", ps=[tp.partition for tp in partitions])

    def on_lost(self, partitions: Sequence[Partition]) -> None:
        self.audit.write("lost", ps=[tp.partition for tp in partitions])


def read(paths: Iterable[Path]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # torn last line of a killed member
    events.sort(key=lambda e: e["t"])
    return events


@dataclass
class Report:
    produced: int
    handled: int
    distinct: int
    duplicates: int
    commits: int
    rebalances: int
    violations: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"produced={self.produced} handled={self.handled} distinct={self.distinct} "
            f"duplicates={self.duplicates} commits={self.commits} "
            f"rebalance_events={self.rebalances} violations={len(self.violations)}"
        )


def check(events: list[dict[str, Any]], end_offsets: Sequence[int]) -> Report:
    """The hand-off invariants, over one topic whose offsets have no gaps."""
    v: list[str] = []
    done_at: dict[tuple[int, int], float] = {}
    handled = 0
    for e in events:
        if e["ev"] == "done":
            handled += 1
            done_at.setdefault((e["p"], e["o"]), e["t"])

    # 1. Every produced record was handled at least once.
    for p, end in enumerate(end_offsets):
        missing = [o for o in range(end) if (p, o) not in done_at]
        if missing:
            v.append(f"p{p}: {len(missing)} records never handled, first {missing[:5]}")

    # 2. No member sends a commit for a partition it has revoked or lost (until it gets it back).
    owned: dict[str, set[int]] = defaultdict(set)
    for e in events:
        m = e["m"]
        if e["ev"] == "assigned":
            owned[m].update(e["ps"])
        elif e["ev"] in ("revoked", "lost"):
            owned[m].difference_update(e["ps"])
        elif e["ev"] == "commit_sent" and e["p"] not in owned[m]:
            v.append(f"{m} sent a commit for p{e['p']}@{e['o']} it did not own")

    # 3. No commit ever passes an unfinished delivered offset: when a commit of offset o for p is
    # sent, every offset below o has been finished by someone.
    frontier: dict[int, int] = defaultdict(int)  # per partition: all offsets below are done
    done_events = sorted((t, p, o) for (p, o), t in done_at.items())
    i = 0
    finished: dict[int, set[int]] = defaultdict(set)
    for e in events:
        if e["ev"] != "commit_sent":
            continue
        while i < len(done_events) and done_events[i][0] <= e["t"]:
            _, p, o = done_events[i]
            finished[p].add(o)
            while frontier[p] in finished[p]:
                frontier[p] += 1
            i += 1
        if e["o"] > frontier[e["p"]]:
            v.append(
                f"{e['m']} committed p{e['p']}@{e['o']} while offset {frontier[e['p']]} "
                "was unfinished"
            )

    # 4. Duplicates only at hand-offs. (a) The fence: no member starts a record of a partition
    # after its own revoke/lost for it. A lost member may still start records it had queued
    # before it learned of the loss (a frozen process): that is why handlers writing elsewhere
    # must fence or be idempotent. The tolerance covers a worker that passed the dispatch check
    # just before the owner cleared it. (b) No rewind: a new owner never handles an offset
    # below what the broker had confirmed for the partition when it was assigned to it.
    tolerance = 0.05
    confirmed: dict[int, int] = defaultdict(int)
    floor: dict[tuple[str, int], int] = {}
    gone: dict[tuple[str, int], float] = {}
    starts: dict[tuple[int, int], int] = defaultdict(int)
    duplicates = 0
    for e in events:
        kind = e["ev"]
        if kind == "commit_committed":
            confirmed[e["p"]] = max(confirmed[e["p"]], e["o"])
        elif kind == "assigned":
            for p in e["ps"]:
                floor[(e["m"], p)] = confirmed[p]
                gone.pop((e["m"], p), None)
        elif kind in ("revoked", "lost"):
            for p in e["ps"]:
                gone[(e["m"], p)] = e["t"]
                floor.pop((e["m"], p), None)
        elif kind == "start":
            key = (e["p"], e["o"])
            starts[key] += 1
            duplicates += starts[key] > 1
            mp = (e["m"], e["p"])
            if mp in gone and e["t"] > gone[mp] + tolerance:
                v.append(f"{e['m']} started p{e['p']}@{e['o']} after giving the partition up")
            if mp in floor and e["o"] < floor[mp]:
                v.append(
                    f"{e['m']} handled p{e['p']}@{e['o']} below {floor[mp]}, the offset "
                    "committed when it was assigned the partition"
                )
    return Report(
        produced=sum(end_offsets),
        handled=handled,
        distinct=len(done_at),
        duplicates=duplicates,
        commits=sum(1 for e in events if e["ev"] == "commit_committed"),
        rebalances=sum(1 for e in events if e["ev"] in ("assigned", "revoked", "lost")),
        violations=v,
    )


def stale_commits(events: list[dict[str, Any]], member: str, since: float) -> tuple[list[str], int]:
    """Commits of `member` that the broker accepted although they were sent after another member
    had been assigned the partition (after `since`, when `member` was cut off) and before `member`
    got it back; and how many commits `member` sent in that time, which the broker must refuse.

    `check` cannot see these: `member` still believes it owns the partition (its loss comes
    later), so its commits are for a partition it owns as far as its own events say."""
    taken: dict[int, float] = {}  # partition -> when another member got it
    back: dict[int, float] = {}  # partition -> when `member` got it again
    for e in events:
        if e["ev"] == "assigned" and e["t"] > since:
            for p in e["ps"]:
                if e["m"] != member:
                    taken.setdefault(p, e["t"])
                elif p in taken:
                    back.setdefault(p, e["t"])

    def stale(p: int, t: float) -> bool:
        return p in taken and taken[p] < t < back.get(p, float("inf"))

    sent: dict[tuple[int, int], float] = {}
    bad: list[str] = []
    attempts = 0
    for e in events:
        if e["m"] != member:
            continue
        if e["ev"] == "commit_sent":
            sent[(e["p"], e["o"])] = e["t"]
            attempts += stale(e["p"], e["t"])
        elif e["ev"] == "commit_committed" and stale(e["p"], sent.get((e["p"], e["o"]), 0.0)):
            bad.append(f"{member} committed p{e['p']}@{e['o']} while another member owned it")
    return bad, attempts
