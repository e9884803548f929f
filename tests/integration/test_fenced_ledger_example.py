"""The fenced ledger example (`python -m examples.fenced_ledger`) end to end, on the session's
broker, with a SQLite file and with PostgreSQL (a database of its own on the test server)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.broker, pytest.mark.timeout(150)]


def run_example(bootstrap: str, tmp_path: Path, *extra: str) -> dict[str, object]:
    summary_path = tmp_path / "summary.json"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "examples.fenced_ledger", "--bootstrap", bootstrap),
            *("--transfers", "300", "--timeout", "90", "--summary-json", str(summary_path)),
            *extra,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=130,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0 and summary_path.exists(), output
    summary: dict[str, object] = json.loads(summary_path.read_text())
    assert summary["ok"] is True, output
    assert summary["transfers"] == summary["applied"] == 300, output
    assert summary["applied_twice"] == [] and summary["missing"] == [], output
    assert summary["balances_match"] is True, output
    assert summary["total"] == summary["expected_total"], output
    assert isinstance(summary["replays"], int) and summary["replays"] > 0, output
    assert summary["refused_late_writes"] == 1, output
    # What a reader sees.
    assert "m3 finished its transfer with epoch" in output and "refused" in output
    assert "PASS" in output
    return summary


@pytest.mark.slow  # make integration; make test runs the example on PostgreSQL
def test_the_ledger_is_exact_on_sqlite(kafka_bootstrap: str, tmp_path: Path) -> None:
    assert run_example(kafka_bootstrap, tmp_path)["database"] == "sqlite"


@pytest.mark.postgres
def test_the_ledger_is_exact_on_postgres(
    kafka_bootstrap: str, tmp_path: Path, postgres_dsn: str
) -> None:
    import psycopg
    from psycopg.conninfo import make_conninfo

    name = f"ledger_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        dsn = make_conninfo(postgres_dsn, dbname=name)
        summary = run_example(kafka_bootstrap, tmp_path, "--postgres", dsn)
        assert summary["database"] == "postgresql"
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
