"""The fenced ledger example (`python -m examples.fenced_ledger`) end to end, on the session's
broker, with a SQLite file and with PostgreSQL (a database of its own on the test server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.example_runs import run_example, scratch_database

pytestmark = [pytest.mark.broker, pytest.mark.timeout(150)]


def exact_ledger(bootstrap: str, tmp_path: Path, *extra: str) -> dict[str, Any]:
    """The example's summary, once every check a reader would make holds."""
    result, summary = run_example(
        "examples.fenced_ledger",
        bootstrap,
        tmp_path / "summary.json",
        *("--transfers", "300", "--timeout", "90", *extra),
        timeout=130,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
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
    assert exact_ledger(kafka_bootstrap, tmp_path)["database"] == "sqlite"


@pytest.mark.postgres
def test_the_ledger_is_exact_on_postgres(
    kafka_bootstrap: str, tmp_path: Path, postgres_dsn: str
) -> None:
    with scratch_database(postgres_dsn, "ledger") as conninfo:
        summary = exact_ledger(kafka_bootstrap, tmp_path, "--postgres", conninfo)
    assert summary["database"] == "postgresql"
