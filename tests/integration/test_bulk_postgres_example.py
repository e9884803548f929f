"""The bulk load example (`python -m examples.bulk_postgres`) end to end, on the session's
broker and PostgreSQL (a database of its own on the test server): every event exactly once in
the table through a rebalance and a SIGKILL."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.example_runs import run_example, scratch_database

pytestmark = [pytest.mark.broker, pytest.mark.postgres, pytest.mark.timeout(120)]


def test_every_event_is_loaded_exactly_once(
    kafka_bootstrap: str, tmp_path: Path, postgres_dsn: str
) -> None:
    with scratch_database(postgres_dsn, "bulk") as conninfo:
        result, summary = run_example(
            "examples.bulk_postgres",
            kafka_bootstrap,
            tmp_path / "summary.json",
            *("--postgres", conninfo, "--events", "3000", "--timeout", "80"),
            timeout=100,
        )
    output = result.stdout + result.stderr
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
