"""Regular expression subscriptions on a real broker: a topic created after the member started is
consumed once it matches, under both group protocols."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient

from tests.consumer_overrides import GroupProtocol
from tests.integration.kafka_helpers import produce
from weir import GroupConsumer, Record
from weir.testing.pytest_plugin import create_topic

# What bounds the wait for a topic created after the start:
# - classic: librdkafka matches the pattern against its metadata, refreshed every topic_refresh_s
#   (1 s here), then the group rebalances;
# - consumer (KIP-848): the broker resolves the pattern again at a member's heartbeat once 10 s
#   have passed since the group's last resolution (Kafka's REGEX_BATCH_REFRESH_MIN_INTERVAL_MS,
#   not configurable), and the group's first resolution happened when the member joined.
WITHIN_S = {"classic": 8.0, "consumer": 20.0}


class Topics:
    """Which topics the handler saw records of, thread-safe."""

    def __init__(self) -> None:
        self.records: list[tuple[str, int, int]] = []
        self.changed = threading.Condition()

    def add(self, r: Record) -> None:
        with self.changed:
            self.records.append((r.topic, r.partition, r.offset))
            self.changed.notify_all()

    def wait_for(self, topic: str, n: int, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(
                lambda: sum(1 for t, _, _ in self.records if t == topic) >= n, timeout
            )

    def seen(self) -> set[str]:
        with self.changed:
            return {t for t, _, _ in self.records}


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_topic_created_after_start_is_consumed_when_it_matches(
    kafka_bootstrap: str, kafka_admin: AdminClient, protocol: GroupProtocol
) -> None:
    prefix = f"weir-re-{uuid.uuid4().hex[:10]}"
    topics = Topics()
    created: list[str] = []
    gc = GroupConsumer(
        topics.add,
        bootstrap_servers=kafka_bootstrap,
        group_id=f"g-{uuid.uuid4().hex[:10]}",
        topics=[f"^{prefix}-.*"],
        group_protocol=protocol,
        topic_refresh_s=1.0,
        commit_interval_s=0.2,
        shutdown_timeout_s=10.0,
        startup_timeout_s=15.0,
    )
    gc.start()
    try:
        assert gc.wait_started(30)
        assert gc.failure is None
        # Created and filled after the member subscribed: one that matches, one that only
        # shares the prefix's first characters.
        late = create_topic(kafka_admin, f"{prefix}-late", partitions=2)
        other = create_topic(kafka_admin, f"{prefix}x-other", partitions=1)
        created += [late, other]
        start = time.monotonic()
        produce(kafka_bootstrap, late, [(b"k%d" % i, b"v%d" % i) for i in range(20)])
        produce(kafka_bootstrap, other, [(None, b"not for us")])
        assert topics.wait_for(late, 20, WITHIN_S[protocol]), (
            f"{protocol}: records of {late} not consumed within {WITHIN_S[protocol]} s "
            f"of its creation (seen: {topics.seen()})"
        )
        took = time.monotonic() - start
        print(f"{protocol}: {late} consumed {took:.1f} s after it was created")
    finally:
        gc.stop()
        gc.join(30)
        if created:
            kafka_admin.delete_topics(created, operation_timeout=0)
    assert topics.seen() == {late}
