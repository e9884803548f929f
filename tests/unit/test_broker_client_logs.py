"""librdkafka's log lines from the plugin's helpers go to Python logging, not to stderr."""

from __future__ import annotations

import logging

import pytest

from weir.testing.pytest_plugin import consume_all, create_topic, produce

pytestmark = pytest.mark.timeout(30)

NOBODY = "127.0.0.1:1"  # nothing listens on port 1: every connect is refused and logged


def assert_routed(capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    err = capfd.readouterr().err
    assert "Connection refused" not in err, err[:2000]
    assert "rdkafka" not in err, err[:2000]
    routed = [r for r in caplog.records if r.name == "weir.testing.kafka"]
    assert any("Connection refused" in r.getMessage() for r in routed), caplog.records
    assert all(r.levelno >= logging.WARNING for r in routed)


def test_admin_helper_logs_through_python_logging(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: each refused connection was printed to stderr as a raw librdkafka line."""
    with pytest.raises(Exception, match=r"(?i)timed out|transport"):
        create_topic(NOBODY, timeout=0.5)
    assert_routed(capfd, caplog)


def test_producer_helper_logs_through_python_logging(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(Exception, match=r"(?i)timed out|not delivered"):
        produce(NOBODY, "t", [("k", "v")], config={"message.timeout.ms": 500}, timeout=1)
    assert_routed(capfd, caplog)


def test_consumer_helper_logs_through_python_logging(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(Exception, match=r"(?i)transport|timed out"):
        consume_all(NOBODY, "t", timeout=0.5)
    assert_routed(capfd, caplog)
