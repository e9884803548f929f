"""Prometheus' own checker on the shipped alert rules (`weir.ops`): `promtool check rules` loads
them as Prometheus would (PromQL parsed, templates compiled), and `promtool test rules` runs the
cases in promtool/weir-alerts.test.yml (lag growing fires, a stalled watermark fires, a blocked
partition fires, a dead-letter rate fires, and their quiet counterparts do not). The
dashboard's panel queries are parsed the same way, as recording rules.

promtool is a Go program: `make promtool` builds it into ~/.cache/weir/tools/<version>/ from
the Go module proxy (`.ci/run` does, when Go is installed). These tests use the one on PATH, else
the newest built there, and skip without either.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from weir.ops import read

TOOLS = Path.home() / ".cache" / "weir" / "tools"
CASES = Path(__file__).resolve().parent / "promtool" / "weir-alerts.test.yml"


def _promtool() -> str | None:
    on_path = shutil.which("promtool")
    if on_path:
        return on_path
    built = sorted(TOOLS.glob("*/promtool"))
    return str(built[-1]) if built else None


PROMTOOL = _promtool()

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        PROMTOOL is None,
        reason="promtool is not on PATH nor in ~/.cache/weir/tools: `make promtool` builds it "
        "(needs Go and the Go module proxy)",
    ),
]


def _promtool_run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def _layout(tmp_path: Path, rules: str) -> Path:
    (tmp_path / "weir-alerts.yml").write_text(rules)
    shutil.copy(CASES, tmp_path / CASES.name)
    return tmp_path


def test_promtool_loads_the_rules(tmp_path: Path) -> None:
    _layout(tmp_path, read("alerts"))
    done = _promtool_run("check", "rules", "weir-alerts.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 9 rules found" in done.stdout + done.stderr


def test_the_alerts_fire_when_they_should_and_not_otherwise(tmp_path: Path) -> None:
    _layout(tmp_path, read("alerts"))
    done = _promtool_run("test", "rules", CASES.name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_a_stall_threshold_planted_wrong_fails_the_cases(tmp_path: Path) -> None:
    """The cases can fail: a stall alert that waits ten times longer does not fire at 10m."""
    rules = read("alerts")
    planted = rules.replace("(weir_partition_watermark_stalled_seconds) > 300", "(...) > 3000")
    planted = planted.replace("(...)", "(weir_partition_watermark_stalled_seconds)")
    assert planted != rules
    _layout(tmp_path, planted)
    done = _promtool_run("test", "rules", CASES.name, cwd=tmp_path)
    assert done.returncode != 0
    assert "WeirWatermarkStalled" in done.stdout + done.stderr


def test_promtool_refuses_a_broken_expression(tmp_path: Path) -> None:
    """`check rules` parses the PromQL that the unit tests only scan for names."""
    broken = read("alerts").replace("sum by (group) (rate(", "sum by (group) (rate((", 1)
    _layout(tmp_path, broken)
    done = _promtool_run("check", "rules", "weir-alerts.yml", cwd=tmp_path)
    assert done.returncode != 0
    out = done.stdout + done.stderr
    assert '"WeirDeadLetterRate": could not parse expression' in out, out


def test_every_dashboard_query_parses_as_promql(tmp_path: Path) -> None:
    """Each panel query of the shipped dashboard, as a recording rule promtool parses (Grafana's
    interval variables given a value, as Grafana does before it sends the query)."""
    dashboard = json.loads(read("dashboard"))
    exprs = [
        t["expr"].replace("$__rate_interval", "1m")
        for p in dashboard["panels"]
        if p["type"] != "row"
        for t in p["targets"]
    ]
    assert len(exprs) > 20
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"weir_dashboard:q{i}", "expr": e} for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    (tmp_path / "dashboard-queries.yml").write_text(json.dumps(rules))  # JSON is YAML
    done = _promtool_run("check", "rules", "dashboard-queries.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in done.stdout + done.stderr
