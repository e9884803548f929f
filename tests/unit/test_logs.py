"""weir's loggers: structlog events on stdlib loggers, no global configuration, cheap when off.

What a fresh interpreter shows (no logging configured, or basicConfig) is in
tests/integration/test_logging_defaults.py."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from weir.logs import ClientLog, Logger, Repeats, get_logger

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def stream_logger() -> Iterator[tuple[logging.Logger, io.StringIO, logging.StreamHandler[Any]]]:
    """A stdlib logger of its own with a handler writing to a string; removed after."""
    std = logging.getLogger("weir.tests.logs")
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    std.addHandler(handler)
    std.setLevel(logging.DEBUG)
    std.propagate = False
    try:
        yield std, buf, handler
    finally:
        std.removeHandler(handler)
        std.setLevel(logging.NOTSET)
        std.propagate = True


def test_an_event_reaches_the_stdlib_logger_of_its_module(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """weir's events used to go to structlog's default PrintLogger (stdout), bypassing stdlib
    logging, its levels and its handlers."""
    caplog.set_level(logging.DEBUG, logger="weir")
    log = get_logger("weir.tests.module")
    log.info("thing_happened", count=3, where="two words", tp="orders[0]")
    [record] = [r for r in caplog.records if r.name == "weir.tests.module"]
    assert record.levelno == logging.INFO
    assert record.getMessage() == "thing_happened count=3 where='two words' tp=orders[0]"
    # The fields are the record's too, for handlers that read extra attributes.
    assert record.__dict__["count"] == 3 and record.__dict__["tp"] == "orders[0]"
    assert isinstance(record.msg, dict)
    assert record.msg == {
        "event": "thing_happened",
        "count": 3,
        "where": "two words",
        "tp": "orders[0]",
    }
    # The record names the function that logged, not weir.logs.
    assert record.funcName == "test_an_event_reaches_the_stdlib_logger_of_its_module"
    assert record.filename == "test_logs.py"


def test_a_field_named_like_a_record_attribute_stays_in_the_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="weir")
    get_logger("weir.tests.module").info("named", name="mine", message="hers", args=(1,))
    [record] = [r for r in caplog.records if r.name == "weir.tests.module"]
    assert record.name == "weir.tests.module"  # not overwritten
    assert isinstance(record.msg, dict)
    assert record.msg["name"] == "mine" and record.msg["args"] == (1,)
    assert record.getMessage() == "named name=mine message=hers args=(1,)"


def test_processor_formatter_renders_json_with_every_field(
    stream_logger: tuple[logging.Logger, io.StringIO, logging.StreamHandler[Any]],
) -> None:
    std, buf, handler = stream_logger
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                structlog.processors.format_exc_info,
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.JSONRenderer(sort_keys=True),
            ]
        )
    )
    log = get_logger(std.name)
    log.warning("partitions_lost", partitions=["t[0]", "t[1]"], tokens={"t[0]": 4})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("shutdown_failed", reason="x")
    # A librdkafka line is a plain stdlib record: the same formatter renders it.
    ClientLog(Repeats(), std).log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "x")
    first, second, third = (json.loads(line) for line in buf.getvalue().splitlines())
    assert first == {
        "event": "partitions_lost",
        "level": "warning",
        "logger": "weir.tests.logs",
        "partitions": ["t[0]", "t[1]"],
        "tokens": {"t[0]": 4},
    }
    assert second["event"] == "shutdown_failed" and second["level"] == "error"
    assert second["reason"] == "x"
    assert "ValueError: boom" in second["exception"]
    assert third == {
        "event": "FAIL [rdkafka#consumer-1] x",
        "level": "error",
        "logger": "weir.tests.logs",
    }


def test_a_plain_formatter_gets_one_line_and_the_traceback(
    stream_logger: tuple[logging.Logger, io.StringIO, logging.StreamHandler[Any]],
) -> None:
    std, buf, handler = stream_logger
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    log = get_logger(std.name)
    try:
        raise KeyError("k")
    except KeyError as exc:
        log.error("callback_failed", callback="mod.fn", exc_info=exc)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "ERROR weir.tests.logs: callback_failed callback=mod.fn"
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "KeyError: 'k'"


def test_a_disabled_level_runs_no_processor(
    stream_logger: tuple[logging.Logger, io.StringIO, logging.StreamHandler[Any]],
) -> None:
    """Debug events sit on per-commit paths: below the logger's level nothing is built."""
    std, buf, _ = stream_logger
    std.setLevel(logging.INFO)
    calls: list[str] = []

    def counting(logger: Any, method: str, event_dict: Any) -> Any:
        calls.append(method)
        return event_dict["event"]

    log = Logger(std, [counting], {})
    log.debug("commit", tp="t[0]", offset=1)
    assert calls == []
    log.info("consumer_started")
    assert calls == ["info"]
    assert buf.getvalue() == "consumer_started\n"


def test_the_cli_shows_info_events_on_stderr_while_it_runs_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from weir.cli import _logging_to_stderr

    weir_log = logging.getLogger("weir")
    before = (weir_log.level, list(weir_log.handlers))
    with _logging_to_stderr():
        get_logger("weir.testing.broker").info("kafka_started", bootstrap_servers="127.0.0.1:1")
        get_logger("weir.testing.broker").debug("kafka_node_launched", node_id=1)
    get_logger("weir.testing.broker").info("kafka_stopped")
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert "[info     ] kafka_started" in line and "bootstrap_servers=127.0.0.1:1" in line
    assert (weir_log.level, list(weir_log.handlers)) == before
