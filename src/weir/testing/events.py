"""`capture_events`: weir's structured log events in a test, as dicts.

weir logs through the standard library (the `weir.*` loggers, docs/logging.md), so
`structlog.testing.capture_logs` does not see its events; this does, without configuring
anything globally beyond the `weir` logger's level while the block runs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["capture_events"]


class _Collect(logging.Handler):
    def __init__(self, events: list[dict[str, Any]], level: int) -> None:
        super().__init__(level)
        self.events = events

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, dict):
            event = dict(record.msg)
            event.setdefault("log_level", record.levelname.lower())
            event.setdefault("logger", record.name)
            self.events.append(event)


@contextmanager
def capture_events(
    level: int = logging.DEBUG, logger: str = "weir"
) -> Iterator[list[dict[str, Any]]]:
    """Collect the events weir logs at `level` or above while the block runs: each a dict
    with `event`, its fields, `log_level` and `logger`."""
    events: list[dict[str, Any]] = []
    target = logging.getLogger(logger)
    handler = _Collect(events, level)
    old = target.level
    if old == logging.NOTSET or old > level:
        target.setLevel(level)
    target.addHandler(handler)
    try:
        yield events
    finally:
        target.removeHandler(handler)
        target.setLevel(old)
