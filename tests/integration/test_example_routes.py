"""examples/routes end to end on the session's broker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_the_routes_example_passes(kafka_bootstrap: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "examples.routes", "--bootstrap", kafka_bootstrap],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    lines = result.stdout.splitlines()
    assert lines[-1] == "PASS", output
    assert "ledger               600 orders, 0 written twice  ok" in lines, output
    assert any(
        line.startswith("circuit breaker") and "paused (app): orders[" in line for line in lines
    ), output
    assert (
        "audit                400 events, 200 debug skipped, handled: info 100, warning 100  ok"
        in lines
    ), output
    assert result.stderr == "", result.stderr  # nothing but the summary: no warning either
