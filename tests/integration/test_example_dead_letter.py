"""examples/dead_letter end to end on the session's broker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_the_dead_letter_example_passes(kafka_bootstrap: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "examples.dead_letter", "--bootstrap", kafka_bootstrap],
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
    assert "charged              291  ok" in lines, output
    assert "dead-lettered        9 of 9 poison  ok" in lines, output
    assert "retried              42 (payment service timeouts)" in lines, output
    assert sum("DeserializationError" in line for line in lines) == 3, output
    assert sum("InvalidOrder" in line for line in lines) == 6, output
