"""The orders demo: consumer-group members come and go, and not one order is lost.

Members run in their own processes and share nothing with the parent but a *journal*: one JSON
line per event, appended to a file per member. The parent tails the journals for its live view and
reads them in full for the final check. A journal line is written before the handler returns, so a
record that weir committed is always in some journal: a missing line means a lost record.

Events (``e``): ``assigned``/``revoked``/``lost`` (``p``: partitions, ``ts``: wall time),
``rec`` (``p``, ``o``: offset, ``k``: customer, ``s``: the customer's order sequence number,
``t``: weir's assignment token), ``metrics`` (``url``: the member's Prometheus endpoint),
``shutdown`` and ``failed`` (``error``).
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Journal", "JournalReader", "Ledger", "Summary"]


class Journal:
    """A member's side: append-only, one line per event, safe from worker threads."""

    def __init__(self, path: Path) -> None:
        # Line-buffered, so a line is in the file before the handler returns and weir may commit.
        self._file = path.open("a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, event: str, **fields: Any) -> None:
        line = json.dumps({"e": event, **fields}, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()


class JournalReader:
    """The parent's side: returns the complete lines added since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        # The member may be in the middle of a line: keep the tail for the next read.
        self._partial = lines.pop()
        return [json.loads(line) for line in lines if line]


@dataclass
class Ledger:
    """Everything the journals say, folded into the views the demo shows and checks."""

    owner: dict[int, str] = field(default_factory=dict)
    last_owner: dict[int, str] = field(default_factory=dict)
    processed_by_partition: Counter[int] = field(default_factory=Counter)
    processed_by_member: Counter[str] = field(default_factory=Counter)
    seen: set[tuple[int, int]] = field(default_factory=set)
    total: int = 0
    order_violations: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    metrics_url: dict[str, str] = field(default_factory=dict)
    _owned_since: dict[int, float] = field(default_factory=dict)
    _last_seq: dict[tuple[str, int, str], int] = field(default_factory=dict)

    def apply(self, member: str, ev: dict[str, Any]) -> None:
        kind = ev["e"]
        if kind == "rec":
            self._record(member, ev)
        elif kind == "assigned":
            for p in ev["p"]:
                # Journals are read one after the other, so a newer owner's line can arrive before
                # the previous owner's: the wall-clock stamp decides who owns it now.
                if ev["ts"] >= self._owned_since.get(p, 0.0):
                    self.owner[p] = self.last_owner[p] = member
                    self._owned_since[p] = ev["ts"]
        elif kind in ("revoked", "lost"):
            for p in ev["p"]:
                if self.owner.get(p) == member:
                    del self.owner[p]
        elif kind == "shutdown":
            self.release(member)
        elif kind == "failed":
            self.failures.append(f"{member}: {ev['error']}")
        elif kind == "metrics":
            self.metrics_url[member] = ev["url"]

    def release(self, member: str) -> None:
        for p in [p for p, m in self.owner.items() if m == member]:
            del self.owner[p]

    def _record(self, member: str, ev: dict[str, Any]) -> None:
        p, offset, customer, seq = ev["p"], ev["o"], ev["k"], ev["s"]
        self.total += 1
        self.processed_by_partition[p] += 1
        self.processed_by_member[member] += 1
        self.seen.add((p, offset))
        # Key order is promised within one ownership of a partition (one token). After a hand-off
        # the next owner may legitimately replay records past the last commit.
        lane = (member, ev["t"], customer)
        last = self._last_seq.get(lane)
        if last is not None and seq <= last:
            self.order_violations.append(
                f"{member} token {ev['t']}: {customer} seq {seq} after {last} (partition {p})"
            )
        self._last_seq[lane] = seq


@dataclass
class Summary:
    topic: str
    group: str
    produced: int
    processed: int
    distinct: int
    duplicates: int
    missing: int
    order_violations: int
    committed: list[int | None]
    end: list[int]
    partitions_ok: list[bool]
    member_failures: list[str]
    elapsed_s: float
    timed_out: bool

    @property
    def ok(self) -> bool:
        return (
            self.missing == 0
            and all(self.partitions_ok)
            and self.order_violations == 0
            and not self.member_failures
            and not self.timed_out
        )
