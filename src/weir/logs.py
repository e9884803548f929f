"""How weir logs: structlog events on stdlib loggers, and librdkafka's lines on the same path.

Every module takes its logger from `get_logger(__name__)`: a structlog bound logger that hands
each event to the stdlib logger of the same name (`weir.engine`, `weir.ownership`, ...). weir
never calls `structlog.configure` nor adds a handler: what is shown, where and how is the
application's logging configuration, and with none the stdlib shows warnings and errors only.

An event reaches its `logging.LogRecord` twice over. `record.msg` is the event dict (a dict whose
`str()` is one readable line, ``consumer_started group_id=orders workers=16``), marked the way
`structlog.stdlib.ProcessorFormatter` expects, so that formatter renders it with every field (JSON,
say); and each field whose name a LogRecord does not use itself is also an attribute of the
record, for handlers that read extra attributes. The level is checked before anything else:
a disabled debug event costs a method call and a dict lookup.

librdkafka's own log lines go to the stdlib logger ``weir.librdkafka`` through `ClientLog`.
Client errors come back over and over while a broker is down (a refused connection is retried
about every 50 ms); `Repeats` keeps the first occurrence of each as it is and counts the rest.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Callable, Hashable
from datetime import datetime
from typing import Any

import structlog

__all__ = [
    "LIBRDKAFKA_LOGGER",
    "Burst",
    "ClientLog",
    "Logger",
    "Repeats",
    "client_error_cause",
    "get_logger",
    "timestamp",
    "without_retry_details",
]

LIBRDKAFKA_LOGGER = "weir.librdkafka"

# LogRecord attributes (and what formatters add): a field of the same name stays in the event
# dict only, never overwrites the record's own.
_RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
    "_logger",
    "_name",
}
# `stacklevel` for Logger.log from `_Logger._emit`: the record names the weir function that
# logged (_emit → debug/info/... → the caller), not this module.
_STACKLEVEL = 3
_PLAIN = re.compile(r"[\w.:/@+\-\[\]]+")


class _Event(dict[str, Any]):
    """An event dict as a LogRecord's `msg`: `ProcessorFormatter` copies the dict, any other
    formatter calls `str()` and gets ``event key=value ...`` on one line."""

    __slots__ = ()

    def __str__(self) -> str:
        parts = [str(self.get("event", ""))]
        for key, value in self.items():
            if key not in ("event", "exc_info"):
                parts.append(f"{key}={_value(value)}")
        return " ".join(parts)


def _value(value: object) -> str:
    if isinstance(value, str):
        return value if _PLAIN.fullmatch(value) else repr(value)
    return repr(value)


def _exc_tuple(exc_info: object) -> Any:
    if isinstance(exc_info, BaseException):
        return (type(exc_info), exc_info, exc_info.__traceback__)
    if isinstance(exc_info, tuple):
        return exc_info
    info = sys.exc_info()
    return info if info[0] is not None else None


def _to_record(logger: logging.Logger, method_name: str, event_dict: Any) -> Any:
    """The last processor: `Logger.log`'s arguments. `_logger` and `_name` are what
    `ProcessorFormatter.wrap_for_formatter` attaches; the formatter reads the dict from `msg`."""
    kwargs: dict[str, Any] = {}
    exc_info = event_dict.pop("exc_info", None)
    if exc_info:
        exc_info = _exc_tuple(exc_info)
        if exc_info is not None:
            # Resolved now: a formatter may run later, or on another thread.
            event_dict["exc_info"] = kwargs["exc_info"] = exc_info
    extra = {k: v for k, v in event_dict.items() if k not in _RESERVED and k != "exc_info"}
    extra["_logger"] = logger
    extra["_name"] = method_name
    kwargs["extra"] = extra
    return (_Event(event_dict),), kwargs


_PROCESSORS = (_to_record,)


class Logger(structlog.stdlib.BoundLogger):
    """A structlog bound logger on one stdlib logger that asks that logger's level first."""

    def debug(self, event: str | None = None, *args: Any, **kw: Any) -> None:
        if self._logger.isEnabledFor(logging.DEBUG):
            self._emit(logging.DEBUG, "debug", event, args, kw)

    def info(self, event: str | None = None, *args: Any, **kw: Any) -> None:
        if self._logger.isEnabledFor(logging.INFO):
            self._emit(logging.INFO, "info", event, args, kw)

    def warning(self, event: str | None = None, *args: Any, **kw: Any) -> None:
        if self._logger.isEnabledFor(logging.WARNING):
            self._emit(logging.WARNING, "warning", event, args, kw)

    def error(self, event: str | None = None, *args: Any, **kw: Any) -> None:
        if self._logger.isEnabledFor(logging.ERROR):
            self._emit(logging.ERROR, "error", event, args, kw)

    def exception(self, event: str | None = None, *args: Any, **kw: Any) -> None:
        if self._logger.isEnabledFor(logging.ERROR):
            kw.setdefault("exc_info", True)
            self._emit(logging.ERROR, "exception", event, args, kw)

    def critical(self, event: str | None = None, *args: Any, **kw: Any) -> None:
        if self._logger.isEnabledFor(logging.CRITICAL):
            self._emit(logging.CRITICAL, "critical", event, args, kw)

    fatal = critical

    def log(self, level: int, event: str | None = None, *args: Any, **kw: Any) -> None:
        if self._logger.isEnabledFor(level):
            self._emit(level, logging.getLevelName(level).lower(), event, args, kw)

    def _emit(
        self, level: int, method: str, event: str | None, args: tuple[Any, ...], kw: dict[str, Any]
    ) -> None:
        if args:
            kw["positional_args"] = args
        try:
            call_args, call_kw = self._process_event(method, event, kw)
        except structlog.DropEvent:
            return
        self._logger.log(level, *call_args, stacklevel=_STACKLEVEL, **call_kw)


def logger_name(module: str) -> str:
    """The stdlib logger a weir module logs to: its own name, except that the engine's private
    modules log under their public names (`weir._engine.failures` as `weir.failures`: the names
    docs/logging.md lists, and applications configure)."""
    private = "weir._engine."
    return "weir." + module[len(private) :] if module.startswith(private) else module


def get_logger(name: str) -> Logger:
    """The logger of weir module `name` (`logger_name`): structlog events on the stdlib logger,
    built without structlog's global configuration (weir neither reads nor changes it)."""
    return Logger(logging.getLogger(logger_name(name)), _PROCESSORS, {})


# -- repeated occurrences ------------------------------------------------------------------------


def timestamp(at: float) -> str:
    """Local ISO 8601 time with milliseconds and the UTC offset."""
    return datetime.fromtimestamp(at).astimezone().isoformat(timespec="milliseconds")


class Burst:
    """One run of occurrences of the same thing: when the first and the last happened (wall
    clock) and how many there were, the first included."""

    __slots__ = ("count", "first", "last", "report", "reported")

    def __init__(self, at: float, count: int, report: Callable[[Hashable, Burst, bool], None]):
        self.first = self.last = self.reported = at
        self.count = count
        self.report = report


class Repeats:
    """Collapses repeated occurrences: the first is logged in full by the caller, later ones are
    counted, and the burst is reported (count, first and last time) every `every_s` while it
    goes on, and once more when it has ended: no occurrence for `quiet_s` (seen at the next
    occurrence of anything or `tick()`), or `flush()`. The next occurrence after that is a
    first occurrence again.

    Owner thread only: the client serves its error callback and log lines on the thread that
    polls (and in close()).
    """

    def __init__(
        self,
        *,
        every_s: float = 60.0,
        quiet_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._every = every_s
        self._quiet = quiet_s
        self._clock = clock
        self._bursts: dict[Hashable, Burst] = {}

    def seen(
        self, key: Hashable, report: Callable[[Hashable, Burst, bool], None], n: int = 1
    ) -> bool:
        """Count `n` occurrences of `key`; True if they start a burst (log them in full).
        `report(key, burst, ongoing)` is called for the burst's reports."""
        now = self._clock()
        self._end_quiet(now)
        burst = self._bursts.get(key)
        if burst is None:
            self._bursts[key] = Burst(now, n, report)
            return True
        burst.count += n
        burst.last = now
        if now - burst.reported >= self._every:
            burst.reported = now
            burst.report(key, burst, True)
        return False

    def tick(self) -> None:
        """End the bursts that have been quiet for `quiet_s`."""
        if self._bursts:
            self._end_quiet(self._clock())

    def flush(self) -> None:
        """End every burst now (the client is closed: nothing more will come)."""
        bursts, self._bursts = self._bursts, {}
        for key, burst in bursts.items():
            _ended(key, burst)

    def _end_quiet(self, now: float) -> None:
        quiet = [k for k, b in self._bursts.items() if now - b.last >= self._quiet]
        for key in quiet:
            _ended(key, self._bursts.pop(key))


def _ended(key: Hashable, burst: Burst) -> None:
    if burst.count > 1:
        burst.report(key, burst, False)


# -- librdkafka's side ---------------------------------------------------------------------------

# librdkafka appends the broker's state and its own suppression count to a connection failure:
# "... Connection refused (after 0ms in state CONNECT, 3 identical error(s) suppressed)".
_RETRY_DETAILS = re.compile(
    r"\s*\(after -?\d+ms in state \w+(?:, (\d+) identical error\(s\) suppressed)?\)\s*$"
)
# ... and starts it with the broker's name: "host:9092/bootstrap: ", "sasl_ssl://host:9093/2: ".
_BROKER_PREFIX = re.compile(r"^(?:[a-z_]+://)?[^\s/]+/(?:bootstrap|\d+): ")


def without_retry_details(text: str) -> tuple[str, int]:
    """`text` without librdkafka's "(after Nms in state S...)" tail, which changes between
    otherwise identical errors, and the count of identical errors librdkafka says it
    suppressed."""
    m = _RETRY_DETAILS.search(text)
    if m is None:
        return text, 0
    return text[: m.start()], int(m.group(1) or 0)


def client_error_cause(text: str) -> str:
    """A client error as the cause of a failure: without the broker's name and retry details
    ("Failed to resolve 'x:9092': Name or service not known")."""
    return _BROKER_PREFIX.sub("", without_retry_details(text)[0])


class ClientLog:
    """The `logger` a client is configured with: confluent-kafka calls `log(level, fmt, *args)`
    on the thread that polls, with librdkafka's syslog levels already mapped to stdlib ones
    (emerg, alert, crit: CRITICAL; err: ERROR; warning: WARNING; notice, info: INFO; debug:
    DEBUG). Each line goes to the stdlib logger ``weir.librdkafka`` at that level; a warning or
    error repeated is logged once, then counted (`Repeats`) and reported as a line of the same
    level ending ``(repeated N times from T1 to T2)``, with `count`, `first`, `last` and
    `ongoing` attributes on its record."""

    def __init__(self, repeats: Repeats, logger: logging.Logger | None = None) -> None:
        self._repeats = repeats
        self.logger = logger or logging.getLogger(LIBRDKAFKA_LOGGER)

    def log(self, level: int, msg: str, *args: object) -> None:
        logger = self.logger
        if not logger.isEnabledFor(level):
            return
        if level >= logging.WARNING:
            line, suppressed = without_retry_details(msg % args if args else msg)
            if not self._repeats.seen((level, line), self._repeated, 1 + suppressed):
                return
        logger.log(level, msg, *args)

    def _repeated(self, key: Hashable, burst: Burst, ongoing: bool) -> None:
        assert isinstance(key, tuple)
        level, line = key
        first, last = timestamp(burst.first), timestamp(burst.last)
        self.logger.log(
            level,
            "%s (repeated %d times from %s to %s%s)",
            line,
            burst.count,
            first,
            last,
            ", still going on" if ongoing else "",
            extra={"count": burst.count, "first": first, "last": last, "ongoing": ongoing},
        )
