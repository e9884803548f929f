"""docs/logging.md lists every event weir logs, with its logger, level and fields.

The events come from the source: every `log.<level>("event", field=...)` call in src/weir. An
event name must be a string literal (or a conditional between two), so that it can be found.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from weir.logs import logger_name

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
DOC = ROOT / "docs" / "logging.md"
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}


@dataclass
class Event:
    loggers: set[str] = field(default_factory=set)
    levels: set[str] = field(default_factory=set)
    fields: set[str] = field(default_factory=set)
    open_fields: bool = False  # the call passes **fields: more may come


def event_names(node: ast.expr, where: str) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return event_names(node.body, where) + event_names(node.orelse, where)
    raise AssertionError(f"{where}: the event name is not a string literal: {ast.unparse(node)}")


@functools.cache
def source_events() -> dict[str, Event]:
    events: dict[str, Event] = {}
    for path in sorted((SRC / "weir").rglob("*.py")):
        module = logger_name(".".join(path.relative_to(SRC).with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in LEVELS
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "log"
            ):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            assert node.args, f"{where}: a log call without an event name"
            for name in event_names(node.args[0], where):
                ev = events.setdefault(name, Event())
                ev.loggers.add(module)
                # As the table writes it: log.exception, or exc_info=, attaches the traceback.
                level = "error" if node.func.attr == "exception" else node.func.attr
                traceback = node.func.attr == "exception" or any(
                    kw.arg == "exc_info" for kw in node.keywords
                )
                ev.levels.add(f"{level} with traceback" if traceback else level)
                for kw in node.keywords:
                    if kw.arg is None:
                        ev.open_fields = True
                    elif kw.arg != "exc_info":
                        ev.fields.add(kw.arg)
    return events


@dataclass
class Row:
    loggers: set[str]
    level: str
    fields: set[str]


@functools.cache
def documented_events() -> dict[str, Row]:
    rows: dict[str, Row] = {}
    section = DOC.read_text().split("\n## Events\n", 1)[1]
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name, loggers, level, fields = cells[0], cells[1], cells[2], cells[3]
        m = re.fullmatch(r"`([a-z0-9_]+)`", name)
        assert m is not None, f"docs/logging.md: one event per row, in backticks: {line}"
        assert m.group(1) not in rows, f"docs/logging.md lists {m.group(1)} twice"
        rows[m.group(1)] = Row(
            loggers=set(re.findall(r"`([\w.]+)`", loggers)),
            level=level,
            fields=set(re.findall(r"`(\w+)`", fields)),
        )
    return rows


def test_the_source_has_events() -> None:
    events = source_events()
    # The extraction finds calls in every layer: a broken walker would pass the test below.
    assert {"consumer_started", "commit", "fence_acquired", "kafka_started"} <= set(events)
    assert len(events) > 40


def test_every_event_is_documented_and_every_documented_event_exists() -> None:
    events, rows = source_events(), documented_events()
    missing = sorted(set(events) - set(rows))
    gone = sorted(set(rows) - set(events))
    assert not missing, f"events logged but not in docs/logging.md: {missing}"
    assert not gone, f"events in docs/logging.md that nothing logs: {gone}"


@pytest.mark.parametrize("name", sorted(source_events()))
def test_an_events_logger_level_and_fields_are_documented(name: str) -> None:
    ev, row = source_events()[name], documented_events().get(name)
    if row is None:
        pytest.skip("not documented: the test above fails")
    assert row.loggers == ev.loggers, f"{name}: logged by {sorted(ev.loggers)}"
    assert {row.level} == ev.levels, f"{name}: logged at {sorted(ev.levels)}"
    if ev.open_fields:
        assert ev.fields <= row.fields, f"{name}: fields {sorted(ev.fields)}"
    else:
        assert row.fields == ev.fields, f"{name}: fields {sorted(ev.fields)}"
