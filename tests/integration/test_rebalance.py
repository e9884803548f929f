"""Hand-offs on a real broker under each group protocol, checked on a full audit.

One scenario per protocol, with slow handlers throughout: a member joins, one leaves gracefully,
one is SIGKILLed mid-batch, one is frozen past its session timeout (its partitions are lost), and
the stream keeps flowing. Invariants: every record handled at least once; nobody commits a
partition after revoking or losing it; no commit passes an unfinished offset; duplicates only at
hand-offs; and at the end the group's committed offsets equal the end offsets.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.audit import check
from tests.audit.cluster import Members, SteadyProducer, handled_by
from tests.integration.kafka_helpers import committed
from weir.testing.pytest_plugin import TopicFactory

pytestmark = pytest.mark.broker

PARTITIONS = 6


def _first(evs: list[dict[str, Any]], member: str, ev: str) -> float | None:
    return next((e["t"] for e in evs if e["m"] == member and e["ev"] == ev), None)


def _join_metrics(evs: list[dict[str, Any]], joiner: str, others: list[str]) -> dict[str, float]:
    """Time from a member's start to its first finished record, and how much the partitions that
    did not move kept flowing meanwhile (records/s in the window vs the 3 s before)."""
    t0 = _first(evs, joiner, "member_start")
    t1 = _first(evs, joiner, "done")
    assert t0 is not None and t1 is not None
    moved = {e["p"] for e in evs if e["m"] == joiner and e["ev"] == "done"}
    kept = [e for e in evs if e["ev"] == "done" and e["m"] in others and e["p"] not in moved]
    before = sum(1 for e in kept if t0 - 3 <= e["t"] < t0) / 3
    during = sum(1 for e in kept if t0 <= e["t"] < t1) / max(t1 - t0, 1e-3)
    return {
        "join_to_first_record_s": round(t1 - t0, 3),
        "unaffected_rate_before": before,
        "unaffected_rate_during": round(during, 1),
    }


def committed_by(
    evs: list[dict[str, Any]], *names: str, after: list[dict[str, Any]] | None = None
) -> bool:
    """Every member named has had a commit confirmed since the events `after` (a member's
    earlier snapshot: the events then)."""
    since = after[-1]["t"] if after else 0.0
    done = {e["m"] for e in evs if e["ev"] == "commit_committed" and e["t"] > since}
    return done >= set(names)


def rejoined(name: str) -> Callable[[list[dict[str, Any]]], bool]:
    """`name` was assigned partitions after it last lost some."""

    def check(evs: list[dict[str, Any]]) -> bool:
        mine = [e for e in evs if e["m"] == name]
        lost = max((i for i, e in enumerate(mine) if e["ev"] == "lost"), default=None)
        return lost is not None and any(e["ev"] == "assigned" and e["ps"] for e in mine[lost + 1 :])

    return check


# One protocol in make test; the other two (about 30 s each) in make integration.
@pytest.mark.parametrize(
    "protocol",
    [
        pytest.param("eager", marks=pytest.mark.slow),
        "cooperative",
        pytest.param("consumer", marks=pytest.mark.slow),
    ],
)
def test_hand_offs_keep_every_invariant(
    kafka_bootstrap: str, make_topic: TopicFactory, tmp_path: Path, protocol: str
) -> None:
    topic = make_topic(PARTITIONS)
    group = f"rb-{protocol}-{uuid.uuid4().hex[:8]}"
    members = Members(tmp_path, kafka_bootstrap, group, topic, protocol)
    producer = SteadyProducer(kafka_bootstrap, topic, rate=300)
    producer.start()
    try:
        members.start("m1")
        members.start("m2")
        members.wait_for(
            lambda e: handled_by(e, "m1") > 20 and handled_by(e, "m2") > 20,
            60,
            "m1 and m2 to process records",
        )
        # Each hand-off below starts from commits, not from an empty group: every member in the
        # group has committed since the last change.
        members.wait_for(lambda e: committed_by(e, "m1", "m2"), 60, "m1 and m2 to commit")

        members.start("m3")  # join
        evs = members.wait_for(lambda e: handled_by(e, "m3") > 0, 60, "m3 to process a record")
        join = _join_metrics(evs, "m3", ["m1", "m2"])
        members.wait_for(lambda e: committed_by(e, "m1", "m2", "m3", after=evs), 60, "commits")

        left = members.events()
        assert members.stop("m1") == 0  # graceful leave
        members.wait_for(lambda e: committed_by(e, "m2", "m3", after=left), 60, "commits")

        members.kill("m2")  # SIGKILL mid-batch: its partitions move after the session timeout
        members.start("m4")
        members.wait_for(lambda e: handled_by(e, "m4") > 20, 60, "m4 to process records")

        # Frozen past the 6 s session timeout: the group moves on, m3 must find its partitions
        # lost and commit nothing for them.
        members.freeze("m3", 9)
        members.wait_for(
            lambda e: any(x["m"] == "m3" and x["ev"] == "lost" for x in e),
            60,
            "m3 to see its partitions lost after the freeze",
        )
        members.wait_for(rejoined("m3"), 60, "m3 to be assigned partitions again")
        ends = members.finish(producer, kafka_bootstrap, topic, PARTITIONS, timeout=90)
    finally:
        members.close()
        if producer.is_alive():
            producer.finish()

    report = check(members.events(), ends)
    print(f"\n[{protocol}] {report.summary()} join={join}")
    assert not report.violations, "\n".join(report.violations[:20])
    assert committed(kafka_bootstrap, group, topic, PARTITIONS) == ends
    assert any(e["ev"] == "lost" and e["m"] == "m3" for e in members.events())
    out = os.environ.get("WEIR_RESULTS_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"rebalance-{protocol}.json").write_text(
            json.dumps({"report": report.summary(), "join": join})
        )
