"""OpenTelemetry tracing (`tracing=True` / `tracer_provider=`, docs/tracing.md) on the FakeBroker:
the spans and their attributes, the parent from a record's `traceparent`, retries and failures,
the context carried into outputs and dead letters, async handlers, batch spans with links. Every
test passes a TracerProvider of its own with an in-memory exporter: the global one is never
set."""

from __future__ import annotations

import asyncio
import builtins
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.propagators.textmap import DefaultGetter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from tests.fake_members import FAKE_LOOP

from weir import (
    BatchContext,
    BatchHandler,
    Context,
    FailurePolicy,
    GroupConsumer,
    Handler,
    Record,
    RetryPolicy,
)
from weir.testing import capture_events
from weir.testing.fake_broker import FakeBroker

pytestmark = pytest.mark.timeout(60)

TOPIC = "t"
# A producer's span upstream of weir: trace 0af7..., span b7ad...
TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
SETTINGS: dict[str, Any] = {**FAKE_LOOP, "auto_offset_reset": "earliest", "workers": 2}


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    p = TracerProvider()
    p.add_span_processor(SimpleSpanProcessor(exporter))
    yield p
    p.shutdown()


def broker_with(*records: dict[str, Any], topics: tuple[str, ...] = (TOPIC,)) -> FakeBroker:
    broker = FakeBroker()
    for t in topics:
        broker.create_topic(t)
    for r in records:
        broker.produce(TOPIC, **r)
    return broker


def run(
    broker: FakeBroker,
    handler: Any,
    provider: TracerProvider,
    members: list[GroupConsumer],
    **settings: Any,
) -> GroupConsumer:
    gc = GroupConsumer(
        handler,
        consumer_factory=broker.consumer_factory,
        producer_factory=broker.producer_factory,
        tracer_provider=provider,
        **{**SETTINGS, **settings},
    )
    members.append(gc)
    gc.start()
    broker.wait_until_committed("g", [TOPIC], timeout=10)
    gc.stop()
    gc.join(10)
    return gc


def process_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("process")]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def trace_header(headers: Any) -> tuple[int, int]:
    """(trace id, span id) of the traceparent in `headers`."""
    carrier = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in headers or ()}
    ctx = TraceContextTextMapPropagator().extract(carrier, getter=DefaultGetter())
    sc = trace.get_current_span(ctx).get_span_context()
    assert sc.is_valid, headers
    return sc.trace_id, sc.span_id


def test_a_span_per_record_with_the_kafka_conventions(
    provider: TracerProvider, exporter: InMemorySpanExporter, members: list[GroupConsumer]
) -> None:
    broker = broker_with({"key": "k1", "value": "v"}, {"key": b"\xff", "value": None})
    run(broker, lambda r: None, provider, members)
    first, second = sorted(
        process_spans(exporter), key=lambda s: attrs(s)["messaging.kafka.offset"]
    )
    assert first.name == "process t" and first.kind is SpanKind.CONSUMER
    assert dict(first.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.consumer.group.name": "g",
        "messaging.destination.name": "t",
        "messaging.destination.partition.id": "0",
        "messaging.kafka.offset": 0,
        "messaging.kafka.message.key": "k1",
        "weir.attempt": 1,
    }
    assert first.status.status_code is StatusCode.UNSET
    # A key with no string form is left out; a null value is a tombstone.
    assert "messaging.kafka.message.key" not in (second.attributes or {})
    assert (second.attributes or {})["messaging.kafka.message.tombstone"] is True


def test_the_parent_is_the_records_traceparent_and_user_spans_nest(
    provider: TracerProvider, exporter: InMemorySpanExporter, members: list[GroupConsumer]
) -> None:
    broker = broker_with(
        {"value": "a", "headers": [("traceparent", PARENT)]},
        {"value": "b"},  # no traceparent: a trace of its own
    )
    tracer = provider.get_tracer("app")

    def handle(record: Record) -> None:
        with tracer.start_as_current_span("app work"):
            pass

    run(broker, handle, provider, members)
    spans = process_spans(exporter)
    traced = {attrs(s)["messaging.kafka.offset"]: s for s in spans}
    a, b = traced[0], traced[1]
    assert a.context.trace_id == TRACE_ID
    assert a.parent is not None and a.parent.span_id == 0xB7AD6B7169203331 and a.parent.is_remote
    assert b.context.trace_id != TRACE_ID and b.parent is None
    app = {s.context.trace_id: s for s in exporter.get_finished_spans() if s.name == "app work"}
    for span, process in ((app[TRACE_ID], a), (app[b.context.trace_id], b)):
        assert span.parent is not None and span.parent.span_id == process.context.span_id


class FailsTwice(Handler):
    def __init__(self) -> None:
        self.calls = 0

    def handle(self, record: Record, ctx: Context) -> None:
        self.calls += 1
        if ctx.attempt < 3:
            raise ValueError(f"attempt {ctx.attempt} refused")


def test_retries_are_events_and_failures_are_recorded(
    provider: TracerProvider, exporter: InMemorySpanExporter, members: list[GroupConsumer]
) -> None:
    broker = broker_with({"value": "a", "headers": [("traceparent", PARENT)]})
    retry = RetryPolicy(max_attempts=3, backoff_initial_s=0.01, backoff_max_s=0.01, jitter=0.0)
    run(broker, FailsTwice(), provider, members, failure=FailurePolicy(retry=retry))
    spans = sorted(process_spans(exporter), key=lambda s: attrs(s)["weir.attempt"])
    assert [attrs(s)["weir.attempt"] for s in spans] == [1, 2, 3]
    assert {s.context.trace_id for s in spans} == {TRACE_ID}
    first, second, third = spans
    assert first.status.status_code is StatusCode.ERROR
    assert first.status.description == "ValueError: attempt 1 refused"
    assert attrs(first)["error.type"] == "builtins.ValueError"
    (exc,) = [e for e in first.events if e.name == "exception"]
    assert dict(exc.attributes or {})["exception.message"] == "attempt 1 refused"
    assert [e.name for e in first.events] == ["exception"]
    assert [(e.name, dict(e.attributes or {})) for e in second.events] == [
        ("weir.retry", {"weir.attempt": 2}),
        ("exception", dict(second.events[1].attributes or {})),
    ]
    assert third.status.status_code is StatusCode.UNSET and "error.type" not in attrs(third)


class Produces(Handler):
    def __init__(self, tracer: trace.Tracer, own_header: bool = False) -> None:
        self.tracer = tracer
        self.own_header = own_header

    def handle(self, record: Record, ctx: Context) -> None:
        ctx.produce("out", b"direct")
        with self.tracer.start_as_current_span("inner"):
            ctx.produce("out", b"nested", headers=[("app", b"1")])
        if self.own_header:
            ctx.produce("out", b"own", headers=[("traceparent", PARENT)])


def test_outputs_carry_the_context_current_where_they_are_produced(
    provider: TracerProvider, exporter: InMemorySpanExporter, members: list[GroupConsumer]
) -> None:
    broker = broker_with({"value": "a", "headers": [("traceparent", PARENT)]}, topics=("t", "out"))
    handler = Produces(provider.get_tracer("app"), own_header=True)
    run(broker, handler, provider, members, transactional_id="tx-1")
    (span,) = process_spans(exporter)
    (inner,) = [s for s in exporter.get_finished_spans() if s.name == "inner"]
    direct, nested, own = broker.messages("out")
    nested_headers = nested.headers() or []
    assert trace_header(direct.headers()) == (TRACE_ID, span.context.span_id)
    assert trace_header(nested_headers) == (TRACE_ID, inner.context.span_id)
    assert ("app", b"1") in nested_headers
    # A traceparent the handler set itself is kept.
    assert [v for k, v in own.headers() or [] if k == "traceparent"] == [PARENT.encode()]


def test_a_dead_letter_carries_the_span_its_record_last_failed_in(
    provider: TracerProvider, exporter: InMemorySpanExporter, members: list[GroupConsumer]
) -> None:
    broker = broker_with(
        {"value": "a", "headers": [("traceparent", PARENT), ("app", b"x")]},
        topics=("t", "t.dlq"),
    )
    retry = RetryPolicy(max_attempts=2, backoff_initial_s=0.01, backoff_max_s=0.01, jitter=0.0)
    policy = FailurePolicy(retry=retry, final="dead_letter")

    def handle(record: Record) -> None:
        raise RuntimeError("no")

    run(broker, handle, provider, members, failure=policy)
    last = max(process_spans(exporter), key=lambda s: attrs(s)["weir.attempt"])
    (letter,) = broker.messages("t.dlq")
    headers = letter.headers() or []
    assert trace_header(headers) == (TRACE_ID, last.context.span_id)
    assert [k for k, _ in headers].count("traceparent") == 1  # replaced, not added
    assert ("app", b"x") in headers


class AsyncNested(Handler):
    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    async def handle(self, record: Record, ctx: Context) -> None:
        await asyncio.sleep(0.01)  # others run meanwhile: the context is this task's
        with self.tracer.start_as_current_span(f"app {record.offset}"):
            await asyncio.sleep(0)


def test_async_handlers_nest_user_spans(
    provider: TracerProvider, exporter: InMemorySpanExporter, members: list[GroupConsumer]
) -> None:
    broker = broker_with(*({"key": f"k{i}", "value": "v"} for i in range(8)))
    run(broker, AsyncNested(provider.get_tracer("app")), provider, members, ordering="unordered")
    spans = {attrs(s)["messaging.kafka.offset"]: s for s in process_spans(exporter)}
    assert len(spans) == 8
    for s in exporter.get_finished_spans():
        if s.name.startswith("app "):
            mine = spans[int(s.name.split()[1])]
            assert s.parent is not None and s.parent.span_id == mine.context.span_id


class Batch(BatchHandler):
    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.lock = threading.Lock()

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        with self.lock:
            self.sizes.append(len(records))


def test_a_batch_span_links_each_records_context(
    provider: TracerProvider, exporter: InMemorySpanExporter, members: list[GroupConsumer]
) -> None:
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    broker = broker_with(
        {"value": "a", "headers": [("traceparent", PARENT)]},
        {"value": "b", "headers": [("traceparent", other)]},
        {"value": "c"},  # no context: no link
    )
    handler = Batch()
    run(broker, handler, provider, members, batch_max_wait_s=0.2, ordering="unordered")
    assert handler.sizes == [3]
    (span,) = process_spans(exporter)
    assert span.name == "process t" and span.kind is SpanKind.CONSUMER and span.parent is None
    assert (span.attributes or {})["messaging.batch.message_count"] == 3
    assert "messaging.kafka.offset" not in (span.attributes or {})
    assert {(link.context.trace_id, link.context.span_id) for link in span.links} == {
        (TRACE_ID, 0xB7AD6B7169203331),
        (0x11111111111111111111111111111111, 0x2222222222222222),
    }


def test_a_propagator_that_raises_loses_the_context_not_the_record(
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    members: list[GroupConsumer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("propagator bug")

    monkeypatch.setattr("weir.tracing.propagate.extract", broken)
    broker = broker_with(*({"value": "v", "headers": [("traceparent", PARENT)]},) * 3)
    seen: list[int] = []
    with capture_events() as logs:
        run(broker, lambda r: seen.append(r.offset), provider, members)
    assert sorted(seen) == [0, 1, 2]
    spans = process_spans(exporter)
    assert len(spans) == 3 and all(s.parent is None for s in spans)
    failed = [e for e in logs if e["event"].startswith("trace_propagation_failed")]
    assert [e["event"] for e in failed] == ["trace_propagation_failed"] + [
        "trace_propagation_failed_again"
    ] * 2
    assert failed[0]["where"] == "extract" and "propagator bug" in failed[0]["error"]


def test_tracing_asked_for_without_opentelemetry_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_import = builtins.__import__

    def no_otel(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "weir.tracing", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_otel)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'kafka-weir\[otel\]'"):
        GroupConsumer(lambda r: None, tracing=True, **SETTINGS)


def test_tracing_off_wraps_nothing_and_a_conflict_is_refused(provider: TracerProvider) -> None:
    def handle(record: Record) -> None:
        pass

    plain = GroupConsumer(handle, **SETTINGS)
    assert type(plain._handler).__name__ == "_FunctionHandler"
    on = GroupConsumer(handle, tracing=True, **SETTINGS)
    assert type(on._handler).__name__ == "TracingHandler"
    with pytest.raises(ValueError, match="tracer_provider= turns tracing on"):
        GroupConsumer(handle, tracing=False, tracer_provider=provider, **SETTINGS)
    with pytest.raises(TypeError, match="must be an OpenTelemetry TracerProvider"):
        GroupConsumer(handle, tracer_provider="jaeger", **SETTINGS)  # type: ignore[call-overload]
