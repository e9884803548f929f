"""OpenTelemetry tracing of handlers (docs/tracing.md): `pip install "kafka-weir[otel]"`, then
`GroupConsumer(..., tracing=True)` (the globally configured tracer provider) or
`GroupConsumer(..., tracer_provider=provider)`.

A span per handler call, `process <topic>` of kind CONSUMER, with the messaging semantic
conventions for Kafka; its parent is the trace context in the record's headers (`traceparent`,
`tracestate`, read by the globally configured propagator), so a record without one starts a new
trace. The span is current while the handler runs (on its worker thread, or in its asyncio
task), so the application's own spans nest under it. A batch handler's call gets one span, with a
link to each record's context. `ctx.produce` outputs carry the context current where they are
produced, and a dead letter that of the span its record last failed in.

weir sets no global state: it reads the configured propagator and tracer provider, never sets
them. With tracing off this module is never imported and no handler is wrapped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from types import TracebackType
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.context import Context as OtelContext
    from opentelemetry.propagators.textmap import Getter
    from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, TracerProvider
except ModuleNotFoundError as exc:  # pragma: no cover - shown by a test that hides the package
    raise ModuleNotFoundError(
        "tracing (tracing=True or tracer_provider=) needs the OpenTelemetry API: "
        "pip install 'kafka-weir[otel]'",
        name=exc.name,
    ) from exc

from weir._trace_carrier import OUTPUT_HEADERS, carry
from weir._wrapping import Wrapper, await_plain, call_plain
from weir.logs import get_logger
from weir.records import BatchContext, BatchHandler, Context, Handler, Record, is_async_handler

__all__ = ["TracingBatchHandler", "TracingHandler", "traced"]

log = get_logger(__name__)

Headers = Sequence[tuple[str, bytes | None]]


class _HeaderGetter(Getter[Headers]):
    """A propagator's view of a record's headers: names compared without case, values UTF-8."""

    def get(self, carrier: Headers, key: str) -> list[str] | None:
        key = key.lower()
        found = [
            v.decode("utf-8", "replace") for k, v in carrier if v is not None and k.lower() == key
        ]
        return found or None

    def keys(self, carrier: Headers) -> list[str]:
        return [k for k, _ in carrier]


_GETTER = _HeaderGetter()


def _error_type(exc: BaseException) -> str:
    kind = type(exc)
    return f"{kind.__module__}.{kind.__qualname__}"


class _Tracer:
    """What the wrappers share: the tracer, the group, and the propagation both ways."""

    def __init__(self, provider: TracerProvider | None, group_id: str) -> None:
        from weir import __version__

        # The global provider through a proxy when none is given: one set after this member
        # was built is used from then on.
        self._tracer = trace.get_tracer("weir", __version__, tracer_provider=provider)
        self._group = group_id
        self._warned: set[str] = set()

    def _propagation_failed(self, where: str, exc: Exception) -> None:
        """A propagator that raises loses a record's trace context, never the record."""
        if where in self._warned:
            log.debug("trace_propagation_failed_again", where=where, error=repr(exc))
            return
        self._warned.add(where)
        log.warning("trace_propagation_failed", where=where, error=repr(exc))

    def extract(self, headers: Headers) -> OtelContext:
        """The trace context in `headers`, on an empty context: a record without one starts a
        new trace, whatever is current on the thread that runs it."""
        if not headers:
            return OtelContext()
        try:
            return propagate.extract(headers, context=OtelContext(), getter=_GETTER)
        except Exception as exc:
            self._propagation_failed("extract", exc)
            return OtelContext()

    def inject(self, context: OtelContext | None = None) -> list[tuple[str, bytes]]:
        """The headers of `context` (None: the current one)."""
        carrier: dict[str, str] = {}
        try:
            propagate.inject(carrier, context=context)
        except Exception as exc:
            self._propagation_failed("inject", exc)
            return []
        return [(k, v.encode()) for k, v in carrier.items()]

    def span(
        self,
        name: str,
        parent: OtelContext,
        attributes: dict[str, Any],
        links: Sequence[Link] | None = None,
    ) -> _Active:
        """`name`'s span, current (with the rest of `parent`: baggage) while the body runs."""
        span = self._tracer.start_span(
            name,
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
            record_exception=False,
            set_status_on_exception=False,
        )
        return _Active(self, span, trace.set_span_in_context(span, parent))

    @staticmethod
    def failed(span: Span, exc: BaseException) -> None:
        span.record_exception(exc)
        span.set_attribute("error.type", _error_type(exc))
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))

    def attributes(self, topic: str | None, partition: int | None) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.consumer.group.name": self._group,
        }
        if topic is not None:
            attrs["messaging.destination.name"] = topic
        if partition is not None:
            attrs["messaging.destination.partition.id"] = str(partition)
        return attrs

    def record(self, record: Record, attempt: int) -> _Active:
        attrs = self.attributes(record.topic, record.partition)
        attrs["messaging.kafka.offset"] = record.offset
        key = record.key
        if key is not None:
            # A key with no canonical string form is left out, as the conventions say.
            with contextlib.suppress(UnicodeDecodeError):
                attrs["messaging.kafka.message.key"] = key.decode()
        if record.value is None:
            attrs["messaging.kafka.message.tombstone"] = True
        attrs["weir.attempt"] = attempt
        active = self.span(f"process {record.topic}", self.extract(record.headers), attrs)
        if attempt > 1:
            active.span.add_event("weir.retry", {"weir.attempt": attempt})
        return active

    @contextlib.contextmanager
    def batch(self, records: list[Record], ctx: BatchContext) -> Iterator[Span]:
        topics = {r.topic for r in records}
        topic = next(iter(topics)) if len(topics) == 1 else None
        parts = {r.partition for r in records}
        partition = next(iter(parts)) if topic is not None and len(parts) == 1 else None
        attrs = self.attributes(topic, partition)
        attrs["messaging.batch.message_count"] = len(records)
        links = []
        for r in records:
            linked = trace.get_current_span(self.extract(r.headers)).get_span_context()
            if linked.is_valid:
                links.append(Link(linked))
        name = "process" if topic is None else f"process {topic}"
        with self.span(name, OtelContext(), attrs, links) as span:
            for r in records:
                attempt = ctx.attempt(r)
                if attempt > 1:
                    span.add_event(
                        "weir.retry",
                        {
                            "weir.attempt": attempt,
                            "messaging.destination.partition.id": str(r.partition),
                            "messaging.kafka.offset": r.offset,
                        },
                    )
            try:
                yield span
            finally:
                self._carry_marked(ctx)

    def _carry_marked(self, ctx: BatchContext) -> None:
        """Records the call failed one by one (`ctx.fail`) carry the batch's span to their dead
        letters too (the span is current here)."""
        errors = [e for e in ctx._marks.values() if isinstance(e, Exception)]
        if errors:
            headers = self.inject()
            for error in errors:
                carry(error, headers)


class _Active:
    """A span made current for a handler call (a class, not a generator: it is on every
    record's way). A call that raises has its exception recorded, the status set and the span's
    headers carried to the dead letter."""

    __slots__ = ("_current", "_out", "_token", "_tracer", "span")

    def __init__(self, tracer: _Tracer, span: Span, current: OtelContext) -> None:
        self._tracer = tracer
        self.span = span
        self._current = current

    def __enter__(self) -> Span:
        self._token = otel_context.attach(self._current)
        self._out = OUTPUT_HEADERS.set(self._tracer.inject)
        return self.span

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        span = self.span
        try:
            if exc is not None:
                _Tracer.failed(span, exc)
                if isinstance(exc, Exception):
                    carry(exc, self._tracer.inject(self._current))
        finally:
            OUTPUT_HEADERS.reset(self._out)
            otel_context.detach(self._token)
            span.end()


class TracingHandler(Wrapper):
    """A span around each call of the application's handler."""

    def __init__(self, inner: Handler, tracer: _Tracer) -> None:
        super().__init__(inner)
        self._t = tracer

    def handle(self, record: Record, ctx: Context) -> None:
        with self._t.record(record, ctx.attempt):
            call_plain(self.inner.handle, record, ctx)


class AsyncTracingHandler(TracingHandler):
    """The same for an async handler: the span is current in the handler's task."""

    async def handle(self, record: Record, ctx: Context) -> None:  # type: ignore[override]
        handle: Callable[[Record, Context], Awaitable[object]] = self.inner.handle  # type: ignore[assignment]
        with self._t.record(record, ctx.attempt):
            await await_plain(handle, record, ctx)


class TracingBatchHandler(Wrapper, BatchHandler):
    """A span around each call of the application's batch handler, linked to its records."""

    def __init__(self, inner: BatchHandler, tracer: _Tracer) -> None:
        super().__init__(inner)
        self._batch = inner
        self._t = tracer

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        with self._t.batch(records, ctx):
            call_plain(self._batch.handle_batch, records, ctx)


class AsyncTracingBatchHandler(TracingBatchHandler):
    async def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:  # type: ignore[override]
        handle_batch: Callable[[list[Record], BatchContext], Awaitable[object]] = (
            self._batch.handle_batch  # type: ignore[assignment]
        )
        with self._t.batch(records, ctx):
            await await_plain(handle_batch, records, ctx)


def traced(handler: Handler, group_id: str, provider: TracerProvider | None = None) -> Handler:
    """`handler` with a span around each of its calls (docs/tracing.md)."""
    if provider is not None and not isinstance(provider, TracerProvider):
        raise TypeError(
            "tracer_provider must be an OpenTelemetry TracerProvider (such as "
            f"opentelemetry.sdk.trace.TracerProvider()), got {provider!r}"
        )
    tracer = _Tracer(provider, group_id)
    is_async = is_async_handler(handler)
    if isinstance(handler, BatchHandler):
        return (AsyncTracingBatchHandler if is_async else TracingBatchHandler)(handler, tracer)
    return (AsyncTracingHandler if is_async else TracingHandler)(handler, tracer)
