"""Tracing on a real broker (docs/tracing.md): a producer's trace through a traced weir member to
the output it produces, the context read from the record's headers as the client delivers them
and written into the output's as the broker stores them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from opentelemetry import trace
from opentelemetry.propagators.textmap import DefaultGetter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from weir import Context, GroupConsumer, Handler, Record
from weir.testing.pytest_plugin import TopicFactory, consume_all, wait_for_committed

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


class Forward(Handler):
    def __init__(self, out: str) -> None:
        self.out = out

    def handle(self, record: Record, ctx: Context) -> None:
        ctx.produce(self.out, record.value, record.key)


def test_a_trace_goes_from_a_producer_through_weir_to_the_output(
    kafka_bootstrap: str,
    make_topic: TopicFactory,
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    src, out = make_topic(1), make_topic(1)
    propagator = TraceContextTextMapPropagator()
    carrier: dict[str, str] = {}
    with provider.get_tracer("upstream").start_as_current_span(
        f"send {src}", kind=SpanKind.PRODUCER
    ) as send:
        propagator.inject(carrier)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    producer.produce(src, key=b"k", value=b"v", headers=list(carrier.items()))
    assert producer.flush(30) == 0

    group = f"tracing-{uuid.uuid4().hex[:10]}"
    gc = GroupConsumer(
        Forward(out),
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        topics=[src],
        auto_offset_reset="earliest",
        transactional_id=f"{group}-a",
        startup_timeout_s=15.0,
        tracer_provider=provider,
    )
    gc.start()
    try:
        wait_for_committed(kafka_bootstrap, group, src, timeout=60)
    finally:
        gc.stop()
        gc.join(30)

    (process,) = [s for s in exporter.get_finished_spans() if s.name == f"process {src}"]
    upstream = send.get_span_context()
    assert process.context.trace_id == upstream.trace_id
    assert process.parent is not None and process.parent.span_id == upstream.span_id
    assert (process.attributes or {})["messaging.consumer.group.name"] == group
    (output,) = consume_all(kafka_bootstrap, out, expected=1)
    headers = {k: (v or b"").decode() for k, v in output.headers}
    sc = trace.get_current_span(propagator.extract(headers, getter=DefaultGetter()))
    assert (sc.get_span_context().trace_id, sc.get_span_context().span_id) == (
        upstream.trace_id,
        process.context.span_id,
    )
