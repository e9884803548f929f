"""Repeated client errors and librdkafka lines: the first logged, the rest counted and reported."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable, Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError

from weir import GroupConsumer, Record
from weir.logs import (
    Burst,
    ClientLog,
    Repeats,
    client_error_cause,
    timestamp,
    without_retry_details,
)
from weir.testing import FakeConsumer

pytestmark = pytest.mark.timeout(60)

RESOLVE = (
    "no-such-host.invalid:9092/bootstrap: Failed to resolve 'no-such-host.invalid:9092': "
    "Name or service not known (after 0ms in state CONNECT)"
)
REFUSED = (
    "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused "
    "(after 1ms in state CONNECT, 4 identical error(s) suppressed)"
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


Report = tuple[Hashable, int, float, float, bool]


class Reports:
    def __init__(self) -> None:
        self.calls: list[Report] = []

    def __call__(self, key: Hashable, burst: Burst, ongoing: bool) -> None:
        self.calls.append((key, burst.count, burst.first, burst.last, ongoing))


def test_librdkafka_retry_details_are_split_off() -> None:
    assert without_retry_details(RESOLVE) == (RESOLVE[: RESOLVE.index(" (after")], 0)
    assert without_retry_details(REFUSED) == (REFUSED[: REFUSED.index(" (after")], 4)
    assert without_retry_details("1/1 brokers are down") == ("1/1 brokers are down", 0)
    assert client_error_cause(RESOLVE) == (
        "Failed to resolve 'no-such-host.invalid:9092': Name or service not known"
    )
    assert client_error_cause(REFUSED) == "Connect to ipv4#127.0.0.1:1 failed: Connection refused"
    assert client_error_cause(
        "sasl_ssl://b-1.example.com:9096/bootstrap: SASL authentication error: Authentication "
        "failed (after 312ms in state AUTH_REQ)"
    ) == ("SASL authentication error: Authentication failed")


def test_the_first_occurrence_is_logged_and_the_rest_counted() -> None:
    clock, reports = Clock(), Reports()
    repeats = Repeats(every_s=60, quiet_s=30, clock=clock)
    assert repeats.seen("a", reports)
    for _ in range(9):
        clock.now += 0.05
        assert not repeats.seen("a", reports)
    assert repeats.seen("b", reports)  # another error is a first occurrence of its own
    assert reports.calls == []
    repeats.flush()
    # `b` happened once: nothing to report about it.
    [(key, count, first, last, ongoing)] = reports.calls
    assert (key, count, first, ongoing) == ("a", 10, 1_000.0, False)
    assert last == pytest.approx(1_000.45)


def test_a_long_burst_is_reported_while_it_goes_on_then_when_it_ends() -> None:
    clock, reports = Clock(), Reports()
    repeats = Repeats(every_s=60, quiet_s=30, clock=clock)
    assert repeats.seen("a", reports)
    for _ in range(150):  # one a second for 150 s
        clock.now += 1
        assert not repeats.seen("a", reports)
    assert [c[1:] for c in reports.calls] == [
        (61, 1_000.0, 1_060.0, True),
        (121, 1_000.0, 1_120.0, True),
    ]
    clock.now += 29
    repeats.tick()
    assert len(reports.calls) == 2  # quiet for 29 s: not over yet
    clock.now += 1
    repeats.tick()
    assert reports.calls[-1][1:] == (151, 1_000.0, 1_150.0, False)
    # The next one starts a new burst: logged in full again.
    assert repeats.seen("a", reports)


def test_a_burst_ends_at_the_next_occurrence_of_anything_after_the_quiet_time() -> None:
    clock, reports = Clock(), Reports()
    repeats = Repeats(every_s=60, quiet_s=30, clock=clock)
    repeats.seen("a", reports)
    repeats.seen("a", reports)
    clock.now += 31
    assert repeats.seen("b", reports)
    assert reports.calls == [("a", 2, 1_000.0, 1_000.0, False)]


def test_suppressed_counts_add_up() -> None:
    clock, reports = Clock(), Reports()
    repeats = Repeats(clock=clock)
    assert repeats.seen("a", reports, 1)
    assert not repeats.seen("a", reports, 5)  # librdkafka: "4 identical error(s) suppressed"
    repeats.flush()
    assert reports.calls[0][1] == 6


@pytest.fixture
def client_logger() -> Iterator[tuple[logging.Logger, list[logging.LogRecord]]]:
    logger = logging.getLogger("weir.tests.librdkafka")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
        logger.propagate = True


def test_client_log_collapses_repeated_warnings_and_passes_debug_lines(
    client_logger: tuple[logging.Logger, list[logging.LogRecord]],
) -> None:
    logger, records = client_logger
    clock = Clock()
    client_log = ClientLog(Repeats(clock=clock), logger)
    line = "%s [%s] %s"
    for i in range(50):
        clock.now += 0.05
        detail = f"(after {i % 3}ms in state CONNECT)"
        client_log.log(logging.ERROR, line, "FAIL", "rdkafka#consumer-1", f"refused {detail}")
        client_log.log(logging.DEBUG, line, "CONNECT", "rdkafka#consumer-1", "connecting")
    client_log._repeats.flush()
    errors = [r for r in records if r.levelno == logging.ERROR]
    debug = [r for r in records if r.levelno == logging.DEBUG]
    assert len(debug) == 50  # debug lines are asked for (kafka debug=...): all of them pass
    first, summary = errors
    assert first.getMessage() == "FAIL [rdkafka#consumer-1] refused (after 0ms in state CONNECT)"
    assert summary.getMessage() == (
        "FAIL [rdkafka#consumer-1] refused (repeated 50 times from "
        f"{timestamp(1_000.05)} to {timestamp(1_002.5)})"
    )
    assert summary.__dict__["count"] == 50 and summary.__dict__["ongoing"] is False


def test_client_log_does_nothing_below_the_loggers_level(
    client_logger: tuple[logging.Logger, list[logging.LogRecord]],
) -> None:
    logger, records = client_logger
    logger.setLevel(logging.CRITICAL)
    repeats = Repeats()
    client_log = ClientLog(repeats, logger)
    client_log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "refused")
    repeats.flush()
    assert records == []


# -- the engine: client errors during a run ------------------------------------------------------


def test_repeated_client_errors_during_a_run_are_logged_once_then_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Regression: each of a run of identical client errors was logged (581 kafka_error
    warnings for one unreachable broker)."""
    caplog.set_level(logging.INFO, logger="weir")
    fake = FakeConsumer()
    fake.produce_many("t", 0, range(3))
    fake.script_assign([("t", 0)])
    done = threading.Event()

    def handle(record: Record) -> None:
        if record.offset == 2:
            done.set()

    gc = GroupConsumer(
        handle,
        bootstrap_servers="fake:9092",
        group_id="g",
        topics=["t"],
        consumer_factory=fake.factory,
        commit_interval_s=0.05,
    )
    gc.start()
    try:
        assert done.wait(10)
        started = time.time()
        for i in range(40):
            fake.raise_error_cb(
                KafkaError(
                    KafkaError._TRANSPORT,
                    f"b:9092/1: Disconnected (after {i}ms in state UP)",
                )
            )
        fake.raise_error_cb(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
        # The owner serves them in its next consume call: wait for the one after that.
        calls = fake.consume_calls
        deadline = time.monotonic() + 10
        while fake.consume_calls < calls + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        gc.stop()
        gc.join(10)
    events = [dict(r.msg) for r in caplog.records if isinstance(r.msg, dict)]
    kafka_errors = [e for e in events if e["event"] == "kafka_error"]
    assert kafka_errors == [
        {
            "event": "kafka_error",
            "code": "_TRANSPORT",
            "error": "b:9092/1: Disconnected (after 0ms in state UP)",
        }
    ]
    assert [e["event"] for e in events].count("all_brokers_down") == 1
    [repeated] = [e for e in events if e["event"] == "error_repeated"]
    assert repeated["of"] == "kafka_error" and repeated["code"] == "_TRANSPORT"
    assert repeated["error"] == "b:9092/1: Disconnected"
    assert repeated["count"] == 40 and repeated["ongoing"] is False
    first: Any = repeated["first"]
    assert timestamp(started - 1) <= first <= repeated["last"] <= timestamp(time.time())
