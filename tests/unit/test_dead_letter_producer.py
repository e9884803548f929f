"""The dead-letter producer and admin client on their own: where their librdkafka lines go."""

from __future__ import annotations

import logging
import re

import pytest
from confluent_kafka import Producer

from weir import FailurePolicy
from weir.config import ConsumerConfig
from weir.deadletter import DeadLetterError, DeadLetters
from weir.logs import ClientLog, Repeats

pytestmark = pytest.mark.timeout(30)

NOBODY = "127.0.0.1:1"  # nothing listens on port 1: every connect is refused and logged
RAW_LIBRDKAFKA = re.compile(r"(?m)^%\d\|")  # librdkafka's own stderr format


def config(**kw: object) -> ConsumerConfig:
    settings: dict[str, object] = {
        "bootstrap_servers": NOBODY,
        "group_id": "g",
        "topics": ["t"],
        "startup_timeout_s": 1.0,
        "failure": FailurePolicy(final="dead_letter"),
    }
    settings.update(kw)
    return ConsumerConfig(**settings)  # type: ignore[arg-type]


def test_the_dead_letter_producer_logs_through_weir_librdkafka(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: the dead-letter producer had no `logger`, so librdkafka printed each of its
    lines raw to stderr (43 in one outage), unlike the member's other clients."""
    caplog.set_level(logging.WARNING, logger="weir.librdkafka")
    letters = DeadLetters(config(), Producer, logger=ClientLog(Repeats()))
    with pytest.raises(DeadLetterError, match="could not look up"):
        letters.start(["t"], {"t": 1})
    letters.close()  # serves the lines still queued
    err = capfd.readouterr().err
    assert not RAW_LIBRDKAFKA.search(err), err[:2000]
    assert "rdkafka" not in err, err[:2000]
    lines = [r.getMessage() for r in caplog.records if r.name == "weir.librdkafka"]
    assert any("[rdkafka#producer-" in line and "Connection refused" in line for line in lines), (
        lines
    )
