"""What carries a trace context across weir without importing OpenTelemetry: the hook
`Context.produce` asks for an output's headers, and the headers a failed record's exception
carries to its dead letter. `weir.tracing` sets both; with tracing off neither is ever set, and
what reads them costs a context-variable read (a produce) or an attribute read (a dead letter).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextvars import ContextVar

__all__ = ["OUTPUT_HEADERS", "carried_by", "carry", "merged"]

Headers = Sequence[tuple[str, bytes | str | None]]

# Set by the tracing wrapper around one handler call, on the call's own thread or asyncio task:
# the trace headers of what is current there, for `ctx.produce` outputs.
OUTPUT_HEADERS: ContextVar[Callable[[], list[tuple[str, bytes]]] | None] = ContextVar(
    "weir_output_headers", default=None
)

# The attribute of a handler's exception holding the trace headers of the span it failed in:
# the dead letter, written later by the owner thread, carries them.
_ATTR = "_weir_trace_headers"


def carry(error: BaseException, headers: list[tuple[str, bytes]]) -> None:
    """Let `error` carry `headers` to its record's dead letter (the last attempt's win)."""
    # An exception that takes no attributes: its dead letter keeps the record's own headers.
    with contextlib.suppress(AttributeError, TypeError):
        setattr(error, _ATTR, headers)


def carried_by(error: BaseException) -> list[tuple[str, bytes]] | None:
    headers: list[tuple[str, bytes]] | None = getattr(error, _ATTR, None)
    return headers


def merged(
    headers: Headers | None, trace: list[tuple[str, bytes]], *, replace: bool
) -> list[tuple[str, bytes | str | None]]:
    """`headers` with the trace headers `trace`: where a name is in both, `replace` takes the
    trace's (a dead letter: the record's own traceparent is its producer's, not weir's), else
    keeps the given one (an output whose handler set its own traceparent meant it)."""
    names = {k.lower() for k, _ in trace}
    given = list(headers or ())
    if replace:
        return [*(h for h in given if h[0].lower() not in names), *trace]
    present = {k.lower() for k, _ in given}
    return [*given, *(h for h in trace if h[0].lower() not in present)]
