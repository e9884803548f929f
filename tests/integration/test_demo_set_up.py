"""What `make demo` shows a new user while it sets up: one line per step, not pip's commands; and
what the demos say on a machine without Java.

A stand-in for python (a shell script that records how it was called, and makes a "venv" of
copies of itself) lets the Makefile's set-up run in a second, without pip or a network.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(30)

STAND_IN = """#!/bin/sh
echo "$0 $*" >> "{log}"
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; fi
"""


def make_demo(tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """`make demo` as a user types it, with the stand-in python; returns what it printed and
    the commands the stand-in ran."""
    log = tmp_path / "calls.log"
    python = tmp_path / "python3"
    python.write_text(STAND_IN.format(log=log))
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    # As typed in a shell: run from `make test`, the outer make's MAKELEVEL and MAKEFLAGS would
    # make this one print "make[1]: Entering directory ..." around its output.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    result = subprocess.run(
        ["make", "demo", f"VENV={tmp_path / 'venv'}", f"PYTHON={python}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    calls = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return result, calls


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_demo_says_what_each_set_up_step_does(tmp_path: Path) -> None:
    """Regression: a cold `make demo` printed only its commands (pip quiet) and then nothing for
    a minute while pip installed."""
    venv = tmp_path / "venv"
    result, calls = make_demo(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"creating the virtualenv {venv} ({tmp_path / 'python3'} -m venv)...",
        f"installing kafka-weir and its dependencies into {venv} with uv "
        "(half a minute or so the first time)...",
        f"installed: {venv}/bin/python, {venv}/bin/weir",
        "running the orders demo (examples/orders/README.md; Ctrl-C stops it)...",
    ]
    assert result.stderr == ""
    python = f"{venv}/bin/python"
    assert calls == [
        f"{tmp_path / 'python3'} -m venv {venv}",
        f"{python} -m pip install -q uv",
        f"{python} -m uv pip install -q --python {python} "
        "-e .[test,cli,prometheus,dev,postgres,avro,json-schema,protobuf]",
        f"{python} -m examples.orders",
    ]

    # Set up already: straight to the demo.
    again, calls = make_demo(tmp_path)
    assert again.stdout.splitlines() == [
        "running the orders demo (examples/orders/README.md; Ctrl-C stops it)..."
    ]
    assert calls == [f"{python} -m examples.orders"]


@pytest.mark.parametrize("example", ["examples.orders", "examples.dead_letter"])
def test_no_java_is_said_in_a_line_not_a_traceback(example: str, tmp_path: Path) -> None:
    """Regression: `make demo` on a machine without Java ended with a JavaNotFoundError
    traceback."""
    env = {**os.environ, "PATH": str(tmp_path / "no-bin")}
    env.pop("JAVA_HOME", None)
    result = subprocess.run(
        [sys.executable, "-m", example],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=25,
        check=False,
    )
    assert result.returncode == 1
    assert result.stdout.splitlines() == ["starting embedded Kafka..."]
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    error, hint = lines
    assert error.startswith("cannot start the embedded Kafka broker: No `java` on PATH.")
    assert "--bootstrap HOST:PORT" in hint
