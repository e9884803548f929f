"""Prometheus metrics and Kubernetes health probes for a `GroupConsumer` (the `prometheus` extra).

    from weir.prometheus import serve

    server = serve(consumer, port=9464)   # /metrics, /healthz, /readyz on 0.0.0.0:9464
    ...
    server.close()

`WeirCollector` is a custom collector: at each scrape it reads one `stats()` snapshot and
`health()` and turns them into metric families, so nothing is registered or updated on the
consumer's hot paths. `serve` gives it a registry of its own (the process-wide default registry
is left alone); to add weir's metrics to a registry you already serve, register a
`WeirCollector(consumer)` there. Names, units and labels: docs/observability.md.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import TYPE_CHECKING

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from weir.logs import get_logger
from weir.stats import BUCKETS, ConsumerStats, LatencyHistogram, PartitionStats

if TYPE_CHECKING:
    from weir.consumer import GroupConsumer
    from weir.health import Health

__all__ = ["MetricsServer", "WeirCollector", "member_label", "serve"]

log = get_logger(__name__)

_LABELS = ["group", "member"]
_PART_LABELS = [*_LABELS, "topic", "partition"]


def member_label(consumer: GroupConsumer) -> str:
    """The `member` label: the static member id (`group_instance_id`), else the librdkafka
    `client.id` if one was set, else host:pid. Stable across rejoins, unlike the member id the
    coordinator hands out."""
    c = consumer.config
    if c.group_instance_id:
        return c.group_instance_id
    client_id = c.kafka.get("client.id")
    if isinstance(client_id, str) and client_id:
        return client_id
    return f"{socket.gethostname()}:{os.getpid()}"


class WeirCollector(Collector):
    """The metrics of one `GroupConsumer`, read from its latest snapshot at each scrape."""

    def __init__(self, consumer: GroupConsumer, *, member: str | None = None) -> None:
        self._consumer = consumer
        self._group = consumer.config.group_id
        self._member = member if member is not None else member_label(consumer)

    def describe(self) -> Iterable[Metric]:
        return list(self.collect())

    def collect(self) -> Iterator[Metric]:
        st = self._consumer.stats()
        health = self._consumer.health()
        base = [self._group, self._member]
        yield from _consumer_metrics(st, health, base)
        yield from _partition_metrics(st.partitions, base)


def _histogram(name: str, doc: str, h: LatencyHistogram, base: list[str]) -> Metric:
    m = HistogramMetricFamily(name, doc, labels=_LABELS)
    buckets: list[tuple[str, float]] = []
    total = 0
    for bound, n in zip(BUCKETS, h.counts, strict=False):
        total += n
        buckets.append((repr(bound), total))
    buckets.append(("+Inf", h.count))
    m.add_metric(base, buckets, h.sum)
    return m


_Family = type[GaugeMetricFamily] | type[CounterMetricFamily]
_G, _C = GaugeMetricFamily, CounterMetricFamily

# (kind, name, help, reads the value from a snapshot and the health, None leaves the metric out)
_CONSUMER_METRICS: tuple[
    tuple[_Family, str, str, Callable[[ConsumerStats, Health], float | None]], ...
] = (
    (_G, "weir_live", "1 if the member is live (health check)", lambda st, h: h.live),
    (_G, "weir_ready", "1 if the member is ready (health check)", lambda st, h: h.ready),
    (
        _G,
        "weir_poll_age_seconds",
        "Seconds since the owner thread last called the Kafka client",
        lambda st, h: h.poll_age_s,
    ),
    (
        _G,
        "weir_brokers_down_seconds",
        "Seconds since the client reported every broker down, none answering since (0: one does)",
        lambda st, h: h.brokers_down_s or 0.0,
    ),
    (_G, "weir_joined", "1 while the member holds an assignment", lambda st, h: st.joined),
    (
        _G,
        "weir_assigned_partitions",
        "Partitions assigned to the member",
        lambda st, h: len(st.partitions),
    ),
    (_C, "weir_records_processed", "Records finished by the handler", lambda st, h: st.processed),
    (_C, "weir_records_failed", "Handler calls that raised", lambda st, h: st.failed),
    (_C, "weir_records_retried", "Handler calls run again by a retry", lambda st, h: st.retries),
    (
        _C,
        "weir_records_dead_lettered",
        "Records sent to the dead-letter topic and counted as finished",
        lambda st, h: st.dead_lettered,
    ),
    (_G, "weir_in_flight_records", "Records registered, not finished", lambda st, h: st.in_flight),
    (
        _G,
        "weir_in_flight_bytes",
        "Bytes of the records in flight",
        lambda st, h: st.in_flight_bytes,
    ),
    (
        _G,
        "weir_read_ahead_records",
        "Records read ahead of their partition's share",
        lambda st, h: st.read_ahead,
    ),
    (
        _G,
        "weir_read_ahead_bytes",
        "Bytes of the records read ahead",
        lambda st, h: st.read_ahead_bytes,
    ),
    (
        _G,
        "weir_budget_capacity_records",
        "Record capacity of the budget",
        lambda st, h: st.capacity_records,
    ),
    (
        _G,
        "weir_budget_capacity_bytes",
        "Byte capacity of the budget",
        lambda st, h: st.capacity_bytes,
    ),
    (
        _G,
        "weir_budget_use_ratio",
        "Larger of in-flight records and bytes over their capacity",
        lambda st, h: st.budget_use,
    ),
    (_G, "weir_throttled", "1 while fetching is throttled", lambda st, h: st.throttled),
    (_C, "weir_throttles", "Times fetching was throttled", lambda st, h: st.throttles),
    (_G, "weir_paused", "1 while the full budget pauses every partition", lambda st, h: st.paused),
    (_C, "weir_pauses", "Times the full budget paused every partition", lambda st, h: st.pauses),
    (_C, "weir_rebalances", "Rebalances the member took part in", lambda st, h: st.rebalances),
    (
        _C,
        "weir_rebalance_seconds",
        "Seconds spent in rebalances",
        lambda st, h: st.rebalance_seconds,
    ),
    (
        _G,
        "weir_rebalance_last_duration_seconds",
        "Duration of the last rebalance",
        lambda st, h: st.rebalance_last_s,
    ),
    (
        _C,
        "weir_commit_failures",
        "Partition commits that came back failed",
        lambda st, h: st.commit_failures,
    ),
    (
        _G,
        "weir_oldest_unconfirmed_commit_seconds",
        "Age of the oldest commit the broker has not confirmed (0: every commit is)",
        lambda st, h: st.oldest_unconfirmed_commit_s or 0.0,
    ),
    (
        _C,
        "weir_callback_failures",
        "User callbacks that raised",
        lambda st, h: st.callback_failures,
    ),
    (
        _C,
        "weir_workers_replaced",
        "Worker threads replaced after a handler call outlived a hand-off",
        lambda st, h: st.workers_replaced,
    ),
    (
        _C,
        "weir_event_loop_blocked",
        "Times the event loop of async handlers was found blocked",
        lambda st, h: st.loop_blocked,
    ),
    (
        _C,
        "weir_stall_recoveries",
        "Stalled partitions sought or assigned again by the stall watchdog",
        lambda st, h: st.partition_stall_recoveries,
    ),
)


def _consumer_metrics(st: ConsumerStats, health: Health, base: list[str]) -> Iterator[Metric]:
    for family, name, doc, read in _CONSUMER_METRICS:
        value = read(st, health)
        if value is not None:
            m = family(name, doc, labels=_LABELS)
            m.add_metric(base, float(value))
            yield m
    # The rate's help names its window; the histograms carry buckets, not one value.
    rate = GaugeMetricFamily(
        "weir_records_per_second",
        f"Records finished per second over the last {st.rate_window_s:.0f} s",
        labels=_LABELS,
    )
    rate.add_metric(base, st.rate)
    yield rate
    yield _histogram(
        "weir_handler_latency_seconds",
        "Handler time per record (each task's time over its records)",
        st.handler_latency,
        base,
    )
    yield _histogram(
        "weir_end_to_end_latency_seconds",
        "Record timestamp to finished, sampled: the first record of a task, at most 1000/s",
        st.end_to_end_latency,
        base,
    )


# (name, help, reads the value from a PartitionStats or None to leave the sample out)
_PARTITION_GAUGES: tuple[tuple[str, str, Callable[[PartitionStats], float | None]], ...] = (
    (
        "weir_partition_committed_offset",
        "The group's committed offset",
        lambda p: p.committed,
    ),
    (
        "weir_partition_committable_offset",
        "The watermark: the offset a commit would send now",
        lambda p: p.committable,
    ),
    (
        "weir_partition_position_offset",
        "The client's fetch position: the next offset it hands to weir",
        lambda p: p.position,
    ),
    (
        "weir_partition_high_watermark_offset",
        "The partition's high watermark (log end offset)",
        lambda p: p.high_watermark,
    ),
    ("weir_partition_lag_records", "High watermark - committed offset", lambda p: p.lag),
    (
        "weir_partition_in_app_backlog_records",
        "Position - committed: records handed to weir, not committed as done",
        lambda p: p.in_app_backlog,
    ),
    (
        "weir_partition_broker_backlog_records",
        "High watermark - position: records not handed to weir yet",
        lambda p: p.broker_backlog,
    ),
    ("weir_partition_in_flight_records", "Records in flight", lambda p: p.in_flight),
    ("weir_partition_read_ahead_records", "Records read ahead", lambda p: p.read_ahead),
    ("weir_partition_paused", "1 while the client is paused on it", lambda p: p.paused),
    ("weir_partition_blocked", "1 while a failure policy holds it", lambda p: p.blocked),
    (
        "weir_partition_oldest_unfinished_age_seconds",
        "Now - the timestamp of the oldest unfinished record",
        lambda p: p.oldest_age_s,
    ),
    (
        "weir_partition_oldest_unfinished_fetch_age_seconds",
        "Now - when the oldest unfinished record was fetched",
        lambda p: p.oldest_fetched_s,
    ),
    (
        "weir_partition_watermark_stalled_seconds",
        "How long the watermark has not moved while records are in flight",
        lambda p: p.stalled_s,
    ),
    (
        "weir_partition_silent_seconds",
        "While stalled: seconds since it delivered, with records to read (stall watchdog)",
        lambda p: p.silent_s,
    ),
    (
        "weir_partition_last_commit_timestamp_seconds",
        "Unix time of the last commit result",
        lambda p: p.last_commit_time,
    ),
    (
        "weir_partition_last_commit_success",
        "1 if the last commit succeeded, 0 if it failed",
        lambda p: p.last_commit_ok,
    ),
    (
        "weir_partition_unconfirmed_commit_seconds",
        "Age of the partition's oldest commit the broker has not confirmed (0: every commit is)",
        lambda p: p.unconfirmed_commit_s or 0.0,
    ),
    (
        "weir_partition_recovery_seconds",
        "Assignment to the first finished record",
        lambda p: p.recovery_s,
    ),
)


def _partition_metrics(parts: tuple[PartitionStats, ...], base: list[str]) -> Iterator[Metric]:
    for name, doc, read in _PARTITION_GAUGES:
        g = GaugeMetricFamily(name, doc, labels=_PART_LABELS)
        for p in parts:
            value = read(p)
            if value is not None:
                g.add_metric([*base, p.tp.topic, str(p.tp.partition)], float(value))
        yield g


# -- the HTTP endpoint --------------------------------------------------------------------------


class MetricsServer:
    """A running endpoint: `/metrics`, `/healthz`, `/readyz`. `close()` stops it."""

    def __init__(self, httpd: ThreadingHTTPServer, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread
        host, port = httpd.server_address[:2]
        self.host = str(host)
        self.port = int(port)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def serve(
    consumer: GroupConsumer,
    *,
    port: int,
    host: str = "0.0.0.0",
    registry: CollectorRegistry | None = None,
    member: str | None = None,
) -> MetricsServer:
    """Serve `consumer`'s metrics and health over HTTP on a daemon thread, from now until
    `close()`: `GET /metrics` (Prometheus text, or OpenMetrics when asked for), `GET /healthz`
    (200 while live, else 503) and `GET /readyz` (200 while ready, else 503), each health answer
    with a JSON body saying why. `port=0` takes a free port (`server.port`). `host` defaults to
    every interface, as Kubernetes probes come from outside the pod. The metrics go into
    `registry` (a new one by default: the process-wide registry is not touched). A port that
    is not free raises `OSError` naming it, and nothing is registered: the call can be made
    again with the same registry."""
    if not isinstance(port, int) or isinstance(port, bool):
        raise TypeError(f"port must be an int (0: any free port), got {port!r}")
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be 0 to 65535 (0: any free port), got {port}")
    if registry is None:
        registry = CollectorRegistry(auto_describe=True)
    try:
        httpd = ThreadingHTTPServer((host, port), _handler(consumer, registry))
    except OSError as exc:
        raise OSError(
            exc.errno, f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
        ) from exc
    try:
        registry.register(WeirCollector(consumer, member=member))
    except BaseException:
        httpd.server_close()
        raise
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, name="weir-metrics", daemon=True)
    thread.start()
    server = MetricsServer(httpd, thread)
    log.info("metrics_server_started", host=server.host, port=server.port)
    return server


def _handler(consumer: GroupConsumer, registry: CollectorRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                self._send(200, content_type, encoder(registry))
            elif path in ("/healthz", "/readyz"):
                health = consumer.health()
                ok = health.live if path == "/healthz" else health.ready
                body = json.dumps(health.as_dict()).encode()
                self._send(200 if ok else 503, "application/json", body)
            else:
                self._send(404, "text/plain; charset=utf-8", b"/metrics, /healthz, /readyz\n")

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per scrape and probe is noise; errors surface to the scraper

    return Handler
