"""Running an example end to end as a reader would (`python -m examples.<name>`), on the
session's broker, and a database of its own on the test PostgreSQL server."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_example(
    module: str, bootstrap: str, summary_path: Path, *args: str, timeout: float
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """The example's run (its output captured) and the summary it wrote to `summary_path`
    (`--summary-json`), which it must have written."""
    result = subprocess.run(
        [
            *(sys.executable, "-m", module, "--bootstrap", bootstrap),
            *("--summary-json", str(summary_path)),
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert summary_path.exists(), result.stdout + result.stderr
    summary: dict[str, Any] = json.loads(summary_path.read_text())
    return result, summary


def run_passing(module: str, bootstrap: str, timeout: float = 100) -> list[str]:
    """The lines an example printed on stdout, run on `bootstrap`; it must have exited 0 with
    `PASS` last (the whole output is the failure's message)."""
    result = subprocess.run(
        [sys.executable, "-m", module, "--bootstrap", bootstrap],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    lines = result.stdout.splitlines()
    assert lines[-1] == "PASS", output
    assert result.stderr == "", result.stderr  # the summary, and no warning either
    return lines


@contextlib.contextmanager
def scratch_database(postgres_dsn: str, prefix: str) -> Iterator[str]:
    """A database created for the caller on the server of `postgres_dsn` (its conninfo), dropped
    after, whatever connections it still has."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield make_conninfo(postgres_dsn, dbname=name)
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
