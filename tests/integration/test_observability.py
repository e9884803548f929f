"""stats(), health() and the Prometheus endpoint against a real broker: each number checked
against a state the test builds (records produced, finished, held, a partition paused)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from tests.consumer_overrides import GroupProtocol
from tests.integration.kafka_helpers import member, wait_until
from weir import FlowConfig, Partition, Record
from weir.prometheus import serve
from weir.stats import BUCKETS, PartitionStats
from weir.testing.pytest_plugin import TopicFactory, commit_offsets

pytestmark = pytest.mark.timeout(120)


def _group() -> str:
    return f"g-{uuid.uuid4().hex[:10]}"


def _produce(bootstrap: str, topic: str, n: int, *, timestamp: int | None = None) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for i in range(n):
        if timestamp is None:
            p.produce(topic, value=b"v%d" % i, partition=0)
        else:
            p.produce(topic, value=b"v%d" % i, partition=0, timestamp=timestamp)
    assert p.flush(30) == 0


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_stats_and_health_match_a_known_state(
    kafka_bootstrap: str, make_topic: TopicFactory, protocol: GroupProtocol
) -> None:
    """Produce 25 records stamped a minute ago, with the group committed at 10; finish 10-24;
    hold offset 25 in a slow handler while 25 more arrive, until the budget pauses the
    partition; produce 10 more while it is paused; release."""
    topic = make_topic(1)
    tp = Partition(topic, 0)
    minute_ago = int((time.time() - 60) * 1000)
    _produce(kafka_bootstrap, topic, 25, timestamp=minute_ago)
    group = _group()
    # The group's committed offset before any member of it runs.
    commit_offsets(kafka_bootstrap, group, topic, {0: 10})
    release = threading.Event()
    held = threading.Event()

    def handle(r: Record) -> None:
        if r.offset == 25:
            held.set()
            assert release.wait(60)

    gc = member(
        handle,
        kafka_bootstrap,
        group,
        [topic],
        ordering="partition",
        workers=2,
        group_protocol=protocol,
        # Paused at 12 records in flight (or at a share of 6 read ahead while it shares).
        flow=FlowConfig(
            capacity_records=12, pause_records=8, resume_records=2, read_ahead_records=0
        ),
        max_batch_records=4,
        # No commit of this member's until the end: `committed` is the group's, read at
        # assignment. Stats are published every second anyway.
        commit_interval_s=3600.0,
        commit_every_records=1_000_000,
        stuck_after_s=2.0,
        watermark_refresh_s=0.3,
    )
    with gc:
        wait_until(lambda: gc.stats().processed == 15, 30, "offsets 10-24 finished")

        def part() -> PartitionStats:
            return gc.stats().partitions[0]

        wait_until(lambda: part().high_watermark == 25, 10, "the high watermark")
        p = part()
        assert p.tp == tp
        assert p.committed == 10, "the group's committed offset, read at assignment"
        assert (p.committable, p.position, p.lag) == (25, 25, 15)
        assert (p.in_app_backlog, p.broker_backlog, p.in_flight) == (15, 0, 0)
        assert p.oldest_age_s is None and p.oldest_fetched_s is None
        assert p.recovery_s is not None and p.recovery_s > 0
        assert p.last_commit_time is None
        st = gc.stats()
        assert (st.rebalances, st.joined, st.rebalancing) == (1, True, False)
        assert st.handler_latency.count == 15
        e2e = st.end_to_end_latency
        assert e2e.count >= 1 and e2e.sum / e2e.count >= 60
        # Every sample lies in the buckets above 56.2 s: a minute old, and then some.
        assert sum(e2e.counts[: BUCKETS.index(56.2) + 1]) == 0
        assert gc.health().ready

        # Hold offset 25; the 25 records after it queue up until the budget pauses.
        _produce(kafka_bootstrap, topic, 25, timestamp=minute_ago)
        assert held.wait(30)
        wait_until(lambda: part().paused, 20, "the partition paused by the budget")
        p = part()
        assert p.pause_reason in ("capacity", "share")
        assert p.committable == 25 and gc.stats().processed == 15
        registered = p.in_flight + p.read_ahead
        assert registered >= 6
        assert p.position == 25 + registered, "position = the held record + those behind it"
        assert p.in_app_backlog == p.position - 10
        assert p.oldest_fetched_s is not None and p.oldest_age_s is not None
        assert p.oldest_age_s >= 60

        # While it is paused the client fetches nothing: only the refresh sees these.
        _produce(kafka_bootstrap, topic, 10)
        wait_until(lambda: part().high_watermark == 60, 10, "the high watermark while paused")
        p = part()
        assert p.paused and p.lag == 50 and p.broker_backlog == 60 - (p.position or 0)

        # Held for stuck_after_s: not ready, still live; the held record keeps ageing.
        wait_until(lambda: not gc.health().ready, 10, "not ready: the partition is stuck")
        h = gc.health()
        assert h.live and h.stuck == (tp,)
        before = part().oldest_fetched_s
        time.sleep(1.2)
        after = part()
        assert before is not None and after.oldest_fetched_s is not None
        assert after.oldest_fetched_s > before
        assert after.stalled_s >= 2.0

        release.set()
        wait_until(lambda: gc.stats().processed == 50, 30, "every record finished")
        wait_until(lambda: gc.health().ready, 10, "ready again")
        p = part()
        assert (p.committable, p.lag, p.in_flight, p.paused) == (60, 50, 0, False)
        assert p.oldest_age_s is None and p.stalled_s == 0.0
        assert gc.stats().rate > 0
    # The member committed at its shutdown.
    final = gc.stats().partitions
    assert final == () or final[0].committed == 60


def _scrape(url: str, accept: str | None = None) -> tuple[int, str, str]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_exporter_serves_metrics_and_health_over_http(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    topic = make_topic(1)
    _produce(kafka_bootstrap, topic, 30)
    group = _group()
    gc = member(lambda r: None, kafka_bootstrap, group, [topic], kafka={"client.id": "m-1"})
    with gc:
        server = serve(gc, port=0, host="127.0.0.1")
        try:
            wait_until(
                lambda: gc.stats().partitions and gc.stats().partitions[0].committed == 30,
                30,
                "30 finished and committed",
            )
            wait_until(lambda: gc.stats().partitions[0].high_watermark == 30, 10, "hw")
            status, ctype, text = _scrape(server.url + "/metrics")
            assert status == 200 and ctype.startswith("text/plain")
            got = _samples(text)
            who = (("group", group), ("member", "m-1"))
            part = (*who, ("partition", "0"), ("topic", topic))
            st = gc.stats()

            def value(name: str, labels: tuple[tuple[str, str], ...] = who) -> float:
                return got[(name, tuple(sorted(labels)))]

            assert value("weir_records_processed_total") == 30 == st.processed
            assert value("weir_live") == 1 and value("weir_ready") == 1
            assert value("weir_rebalances_total") == 1
            assert value("weir_assigned_partitions") == 1
            assert value("weir_partition_committed_offset", part) == 30
            assert value("weir_partition_high_watermark_offset", part) == 30
            assert value("weir_partition_lag_records", part) == 0
            assert value("weir_partition_in_flight_records", part) == 0
            assert value("weir_partition_last_commit_success", part) == 1
            # Confirmed: at most a commit just sent waits for its answer.
            assert value("weir_partition_unconfirmed_commit_seconds", part) < 5
            assert value("weir_oldest_unconfirmed_commit_seconds") < 5
            assert value("weir_partition_recovery_seconds", part) > 0
            assert value("weir_budget_capacity_records") == st.capacity_records
            # A histogram: cumulative buckets ending in +Inf = count.
            buckets = [
                (float(dict(k[1])["le"]), v)
                for k, v in got.items()
                if k[0] == "weir_handler_latency_seconds_bucket"
            ]
            buckets.sort()
            assert len(buckets) == len(BUCKETS) + 1
            counts = [v for _, v in buckets]
            assert counts == sorted(counts)
            assert counts[-1] == value("weir_handler_latency_seconds_count") >= 30
            assert value("weir_handler_latency_seconds_sum") >= 0
            # OpenMetrics when the scraper asks for it.
            status, ctype, text = _scrape(
                server.url + "/metrics", "application/openmetrics-text; version=1.0.0"
            )
            assert status == 200 and ctype.startswith("application/openmetrics-text")
            assert text.rstrip().endswith("# EOF")

            for path in ("/healthz", "/readyz"):
                status, ctype, body = _scrape(server.url + path)
                health: dict[str, Any] = json.loads(body)
                assert (status, ctype) == (200, "application/json")
                assert health["live"] and health["ready"] and health["state"] == "running"
            assert _scrape(server.url + "/nope")[0] == 404
        except BaseException:
            server.close()
            raise
    # Stopped: neither live nor ready, and the endpoint says so until it is closed.
    with server:
        for path in ("/healthz", "/readyz"):
            status, _, body = _scrape(server.url + path)
            assert status == 503
            assert json.loads(body)["reasons"] == ["stopped"]
    with pytest.raises(OSError):
        urllib.request.urlopen(server.url + "/healthz", timeout=2)
