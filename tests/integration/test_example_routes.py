"""examples/routes end to end on the session's broker."""

from __future__ import annotations

import pytest

from tests.integration.example_runs import run_passing


@pytest.mark.timeout(120)
def test_the_routes_example_passes(kafka_bootstrap: str) -> None:
    lines = run_passing("examples.routes", kafka_bootstrap)
    shown = "\n".join(lines)
    assert "ledger               600 orders, 0 written twice  ok" in lines, shown
    assert any(
        line.startswith("circuit breaker") and "paused (app): orders[" in line for line in lines
    ), shown
    audit = "audit                400 events, 200 debug skipped, handled: info 100, warning 100  ok"
    assert audit in lines, shown
