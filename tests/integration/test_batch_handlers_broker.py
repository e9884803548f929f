"""Batch handlers on a real broker: the consume-commit path with `handle_batch`."""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict

from tests.integration.kafka_helpers import committed, end_offsets, keyed_orders, member, produce
from tests.integration.kafka_helpers import wait_until as wait_for
from weir import BatchContext, BatchHandler, Record
from weir.testing.pytest_plugin import TopicFactory


class Collect(BatchHandler):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sizes: list[int] = []
        self.seen: dict[tuple[int, bytes | None], list[int]] = defaultdict(list)

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        with self.lock:
            self.sizes.append(len(records))
            for r in records:
                self.seen[(r.partition, r.key)].append(r.offset)

    def count(self) -> int:
        with self.lock:
            return sum(map(len, self.seen.values()))


def test_a_batch_handler_consumes_in_key_order_and_commits_every_partition(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    topic = make_topic(3)
    produce(kafka_bootstrap, topic, keyed_orders(1500, 40))
    group = f"g-{uuid.uuid4().hex[:10]}"
    ends = end_offsets(kafka_bootstrap, topic, 3)
    h = Collect()
    gc = member(h, kafka_bootstrap, group, [topic], batch_max_records=200, workers=4)
    with gc:
        wait_for(lambda: h.count() >= 1500, 60, "every record handled")
        wait_for(
            lambda: (
                [p.committed for p in sorted(gc.stats().partitions, key=lambda p: p.tp)] == ends
            ),
            30,
            "commits at the end offsets",
        )
    assert committed(kafka_bootstrap, group, topic, 3) == ends
    assert h.count() == 1500  # each once: no record handled twice without a failure
    for lane, offsets in h.seen.items():
        assert offsets == sorted(offsets), lane
    assert max(h.sizes) <= 200
    assert len(h.sizes) < 300  # batches, not record by record
