"""The only broker goes away for a while and comes back: what a member says meanwhile.

These tests stop and start a broker of their own (on the same data directory, so topics and
committed offsets survive), never the session's.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import waiting
from weir import FailurePolicy, GroupConsumer, Record
from weir.testing.broker import EmbeddedKafka
from weir.testing.pytest_plugin import create_topic

pytestmark = [pytest.mark.broker, pytest.mark.timeout(240)]

WAIT = 60.0
RAW_LIBRDKAFKA = re.compile(r"(?m)^%\d\|")  # librdkafka's own stderr format


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    workdir: Path = tmp_path_factory.mktemp("outage-broker")
    broker = EmbeddedKafka(workdir=workdir)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def outage(kafka: EmbeddedKafka) -> contextlib.AbstractContextManager[None]:
    """The broker is stopped inside the block and started again (same port, same data)
    after it."""

    @contextlib.contextmanager
    def down() -> Iterator[None]:
        kafka.node.stop()
        try:
            yield
        finally:
            kafka.node.start()

    return down()


def ignore(record: Record) -> None:
    pass


def test_the_dead_letter_producer_logs_through_weir_in_an_outage(
    kafka: EmbeddedKafka,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Regression: in an outage of the only broker the dead-letter producer printed its
    librdkafka lines raw to stderr (43 in one outage), the member's other clients none."""
    caplog.set_level(logging.INFO, logger="weir.librdkafka")
    bootstrap = kafka.bootstrap_servers
    topic = create_topic(bootstrap, partitions=1)
    gc = GroupConsumer(
        ignore,
        bootstrap_servers=bootstrap,
        group_id=f"g-{uuid.uuid4().hex[:10]}",
        topics=[topic],
        failure=FailurePolicy(final="dead_letter"),
        startup_timeout_s=30.0,
    )
    with gc:
        waiting.wait_until(lambda: gc.stats().joined, "joined", WAIT)
        capfd.readouterr()
        with outage(kafka):
            time.sleep(5)

        def producer_lines() -> list[str]:
            return [
                r.getMessage()
                for r in caplog.records
                if r.name == "weir.librdkafka" and "[rdkafka#producer-" in r.getMessage()
            ]

        # Served while the member runs, not only when it closes.
        waiting.wait_until(producer_lines, "the dead-letter producer's lines, logged", WAIT)
    err = capfd.readouterr().err
    assert not RAW_LIBRDKAFKA.search(err), err[:3000]
    assert "rdkafka" not in err, err[:3000]
