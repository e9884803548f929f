"""The orders demo (`make demo`) end to end, reduced: 600 orders on the session's broker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
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
    summary_path = tmp_path / "summary.json"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "examples.orders", "--bootstrap", kafka_bootstrap),
            # 10 s of production: m4's join and m2's leave both land while orders still flow.
            *("--records", "600", "--rate", "60", "--quick", "--timeout", "60"),
            *("--summary-json", str(summary_path)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    output = result.stdout + result.stderr
    assert summary_path.exists(), output
    s = json.loads(summary_path.read_text())

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
    # What a reader sees: the running commentary and the verdict.
    assert "m4 joins the group" in output
    assert "m2 gets SIGTERM" in output
    assert "PASS" in output
    assert _leftover_members(s["topic"]) == []
