"""The bulk load example (`python -m examples.bulk_postgres`) end to end, on the session's
broker and PostgreSQL (a database of its own on the test server): every event exactly once in
the table through a rebalance and a SIGKILL."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.broker, pytest.mark.postgres, pytest.mark.timeout(120)]


def test_every_event_is_loaded_exactly_once(
    kafka_bootstrap: str, tmp_path: Path, postgres_dsn: str
) -> None:
    import psycopg
    from psycopg.conninfo import make_conninfo

    name = f"bulk_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    summary_path = tmp_path / "summary.json"
    try:
        result = subprocess.run(
            [
                *(sys.executable, "-m", "examples.bulk_postgres", "--bootstrap", kafka_bootstrap),
                *("--postgres", make_conninfo(postgres_dsn, dbname=name)),
                *("--events", "3000", "--timeout", "80", "--summary-json", str(summary_path)),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=100,
            check=False,
        )
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    output = result.stdout + result.stderr
    assert summary_path.exists(), output
    summary = json.loads(summary_path.read_text())
    assert summary["events"] == summary["rows"] == 3000, output
    assert summary["loaded_twice"] == [] and summary["missing"] == [], output
    assert summary["unknown"] == [], output
    # m2 loaded records and was killed before committing them: they came again, as no-ops.
    assert summary["by_member"]["m2"] > 0 and summary["replayed"] > 0, output
    assert sum(summary["by_member"].values()) == 3000, output
    assert summary["batches"] < 3000 / 10, output  # batches, not records one by one
    assert summary["ok"] is True and result.returncode == 0, output
    # What a reader sees.
    assert "kill: m2 loaded" in output and "PASS: every event exactly once" in output
