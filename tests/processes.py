"""weir run in a process of its own, as a user runs it: the installed `weir` command, or Python
code in a fresh interpreter (where nothing an earlier test imported, configured or started is
around). Tests that use these belong to the integration tier."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WEIR = Path(sys.executable).with_name("weir")


def ctrl_c_as_at_a_terminal() -> None:
    """`preexec_fn` for a process a test sends SIGINT: its default disposition back. A shell
    without job control starts background commands with SIGINT ignored, and the whole suite
    run that way (`bash .ci/run &`) handed that to every process it started: weir's Ctrl-C
    tests then waited for a process that never saw the signal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_weir(*argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """The installed `weir` command with `argv`: its exit code, stdout and stderr."""
    return subprocess.run(
        [str(WEIR), *argv], capture_output=True, text=True, timeout=timeout, check=False
    )


def run_python(
    code: str, *, timeout: float = 60, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`code` (dedented) in a fresh interpreter, from the repository's root."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=REPO,
    )
