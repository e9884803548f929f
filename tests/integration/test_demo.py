"""The orders demo (`make demo`) end to end, reduced: 600 orders on the session's broker."""

from __future__ import annotations

import re
from pathlib import Path

import psutil
import pytest

from tests.integration.example_runs import run_example

PARTITIONS = 6

pytestmark = pytest.mark.broker


def _leftover_members(topic: str) -> list[str]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "examples.orders.member" in cmdline and topic in cmdline:
            found.append(" ".join(cmdline))
    return found


@pytest.mark.timeout(120)
def test_demo_loses_nothing_while_members_join_and_leave(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    result, s = run_example(
        "examples.orders",
        kafka_bootstrap,
        tmp_path / "summary.json",
        # 10 s of production: m4's join and m2's leave both land while orders still flow.
        *("--records", "600", "--rate", "60", "--quick", "--timeout", "60"),
        timeout=100,
    )
    output = result.stdout + result.stderr

    assert s["produced"] == 600, output
    assert s["processed"] >= s["produced"], output
    assert s["distinct"] == s["produced"], output
    assert s["missing"] == 0, output
    assert s["order_violations"] == 0, output
    assert s["member_failures"] == [], output
    assert not s["timed_out"], output
    assert len(s["end"]) == PARTITIONS
    assert sum(s["end"]) == s["produced"], output
    assert s["committed"] == s["end"], output
    assert s["ok"] and result.returncode == 0, output
    # What a reader sees: a line per step of the scenario, in order, and the verdict; nothing
    # on stderr (no warnings, no librdkafka lines: the members' logs go to their files).
    assert result.stderr == ""
    steps = [
        f"topic {s['topic']} (6 partitions), group {s['group']}",
        "members' journals and logs: ",
        "started members m1, m2, m3",
        "group formed: m",
        "producing 600 orders at 60/s",
        "+ m4 joins the group",
        "- m2 gets SIGTERM: drain, commit, leave",
        "m2 left",
        "every order is committed",
        "stopping the remaining members",
    ]
    said = [
        line.split("s ", 1)[1]
        for line in result.stdout.splitlines()
        if re.match(r" *\d+\.\ds ", line)
    ]
    where = [
        next((i for i, line in enumerate(said) if line.startswith(step)), -1) for step in steps
    ]
    assert -1 not in where and where == sorted(where), f"steps at {where}:\n{output}"
    # A progress line every 5 s, each whole on one line (regression: broken at 80 columns).
    progress = [line for line in said if line.startswith("produced ")]
    assert progress, output
    assert all(
        re.fullmatch(r"produced \d+, processed \d+, lag \d+ · .+ · members ready \d+/\d+", line)
        for line in progress
    ), output
    assert result.stdout.splitlines()[-1].startswith("PASS: every order processed")
    assert _leftover_members(s["topic"]) == []
