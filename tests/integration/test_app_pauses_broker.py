"""The application's pause on a real broker: a paused partition is not fetched while the
budget's own pauses come and go on the other, and everything is processed and committed once
it is resumed."""

from __future__ import annotations

import logging
import time
import uuid

import pytest

from tests.integration.kafka_helpers import Seen, committed, member, produce, wait_until
from tests.logged import events
from weir import FlowConfig, Partition, Record
from weir.testing.pytest_plugin import TopicFactory

pytestmark = pytest.mark.broker

N = 300
VALUE = b"x" * 60_000  # 17 records reach the pause mark in bytes, before any share
MIB = 1024 * 1024


def test_an_app_pause_outlives_the_flow_control_pauses_and_resumes(
    kafka_bootstrap: str, make_topic: TopicFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="weir.fetching")
    topic = make_topic(2)
    group = f"app-pause-{uuid.uuid4().hex[:8]}"
    seen = Seen()

    def slow(r: Record) -> None:
        time.sleep(0.0005)
        seen.add(r)

    gc = member(
        slow,
        kafka_bootstrap,
        group,
        [topic],
        ordering="partition",
        # A budget small enough that it pauses every partition and resumes many times over N.
        flow=FlowConfig(
            capacity_bytes=2 * MIB, pause_bytes=MIB, resume_bytes=MIB // 2, read_ahead_records=0
        ),
        commit_interval_s=0.2,
    )
    p0 = Partition(topic, 0)
    with gc:
        wait_until(lambda: len(gc.stats().partitions) == 2, 30, "both partitions assigned")
        assert gc.pause(p0).result(10) is True
        produce(kafka_bootstrap, topic, [(None, VALUE)] * N, partition=0)
        produce(kafka_bootstrap, topic, [(None, VALUE)] * N, partition=1)
        wait_until(lambda: len(seen.offsets(1)) == N, 60, "partition 1 processed")
        released = [e for e in events(caplog, "partitions_resumed") if e["reason"] == "released"]
        assert len(released) >= 2, "the budget's pauses were never lifted: the test shows nothing"
        stats = gc.stats()
        assert seen.offsets(0) == set(), "a paused partition was fetched"
        (p0_stats,) = [p for p in stats.partitions if p.tp == p0]
        assert p0_stats.paused and p0_stats.pause_reason == "app"
        assert gc.resume(p0).result(10) is True
        wait_until(lambda: len(seen.offsets(0)) == N, 60, "partition 0 processed after resume")
        wait_until(
            lambda: committed(kafka_bootstrap, group, topic, 2) == [N, N], 30, "both committed"
        )
    assert len(seen.calls) == 2 * N, "a record was processed twice"
