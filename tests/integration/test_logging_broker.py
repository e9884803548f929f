"""weir's logs on a real broker: through stdlib logging, librdkafka's lines included, and what
the shutdown's revoke says it committed."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import textwrap
import threading
import uuid
from typing import Any

import pytest

from tests.integration.kafka_helpers import committed, member, produce
from tests.logged import events
from weir import Record
from weir.testing.pytest_plugin import TopicFactory

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

RECORDS = 10


def consume_all_then_stop(
    bootstrap: str, topic: str, group: str, kafka: dict[str, Any] | None = None, **kw: Any
) -> None:
    seen = threading.Semaphore(0)

    def handle(record: Record) -> None:
        seen.release()

    gc = member(handle, bootstrap, group, [topic], kafka=kafka or {}, **kw)
    with gc:
        for _ in range(RECORDS):
            assert seen.acquire(timeout=30), "not every record was handled"
    assert gc.failure is None


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_shutdown_revoke_reports_the_committed_offsets(
    kafka_bootstrap: str, make_topic: TopicFactory, caplog: pytest.LogCaptureFixture, protocol: str
) -> None:
    """Regression: the revoke that close() serves after shutdown's final commit logged
    `committed={}` on every shutdown, as if nothing had been committed."""
    caplog.set_level(logging.INFO, logger="weir")
    topic = make_topic(2)
    produce(kafka_bootstrap, topic, [(None, b"v%d" % i) for i in range(RECORDS)], partition=0)
    group = f"g-{uuid.uuid4().hex[:10]}"
    consume_all_then_stop(kafka_bootstrap, topic, group, group_protocol=protocol)
    # Partition 1 had no record: only its start, committed when it was assigned (a new group:
    # weir.starts commits where auto_offset_reset put it before any record).
    assert committed(kafka_bootstrap, group, topic, 2) == [RECORDS, 0]
    *_, revoked = events(caplog, "partitions_revoked")
    assert revoked["partitions"] == [f"{topic}[0]", f"{topic}[1]"]
    assert revoked["committed"] == {f"{topic}[0]": RECORDS, f"{topic}[1]": 0}
    assert revoked["sent"] == {}  # shutdown had committed it already


def test_librdkafka_lines_go_to_the_weir_librdkafka_logger(
    kafka_bootstrap: str,
    make_topic: TopicFactory,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Regression: librdkafka wrote its lines straight to stderr (no `logger` was set)."""
    caplog.set_level(logging.DEBUG, logger="weir.librdkafka")
    topic = make_topic(1)
    produce(kafka_bootstrap, topic, [(None, b"v%d" % i) for i in range(RECORDS)])
    consume_all_then_stop(
        kafka_bootstrap, topic, f"g-{uuid.uuid4().hex[:10]}", kafka={"debug": "consumer"}
    )
    err = capfd.readouterr().err
    assert not re.search(r"(?m)^%\d\|", err), err[:2000]  # librdkafka's own stderr format
    lines = [r for r in caplog.records if r.name == "weir.librdkafka"]
    assert len(lines) > 20, "debug=consumer makes librdkafka log its consumer's steps"
    assert {r.levelno for r in lines} >= {logging.DEBUG}
    assert any(" [rdkafka#consumer-" in r.getMessage() for r in lines)
    # confluent-kafka's format: "FACILITY [client] message"
    assert all(re.match(r"\S+ \[rdkafka#consumer-\d+\] ", r.getMessage()) for r in lines)


def test_basic_config_shows_weir_events_with_their_fields(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    """Regression: `logging.basicConfig(level=DEBUG)` changed nothing: weir's events bypassed
    stdlib logging and went to stdout in structlog's default format."""
    topic = make_topic(1)
    produce(kafka_bootstrap, topic, [(None, b"v%d" % i) for i in range(RECORDS)])
    group = f"g-{uuid.uuid4().hex[:10]}"
    child = textwrap.dedent(
        """
        import logging, sys, threading
        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
        from weir import GroupConsumer
        done = threading.Semaphore(0)
        gc = GroupConsumer(
            lambda record: done.release(),
            bootstrap_servers=sys.argv[1], group_id=sys.argv[2], topics=[sys.argv[3]],
            commit_interval_s=0.2,
        )
        with gc:
            for _ in range(int(sys.argv[4])):
                assert done.acquire(timeout=30)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", child, kafka_bootstrap, group, topic, str(RECORDS)],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert (
        f"INFO weir.engine: consumer_started group_id={group} topics={[topic]!r} "
        "ordering=key workers=8 protocol=classic"
    ) in lines, lines[:20]
    commit = f"DEBUG weir.committing: commit tp={topic}[0] offset={RECORDS} sync="
    assert any(line.startswith(commit) for line in lines), lines
    assert any(line.startswith("INFO weir.ownership: partitions_assigned ") for line in lines)
    assert "INFO weir.engine: consumer_stopped processed=10" in lines
    # Every line is a stdlib record: weir's events, and librdkafka's under weir.librdkafka.
    assert not [line for line in lines if not re.match(r"(DEBUG|INFO|WARNING|ERROR) weir\.", line)]
