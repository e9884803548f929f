"""`FakeBroker`: an in-memory Kafka cluster for tests, and the factory of its clients.

A `weir.testing.fake_cluster.Cluster` (topics, transactions, committed offsets, groups) that
makes the fake clients sharing it: consumers (`consumer_factory`) and producers
(`producer_factory`). `weir.testing.fake` has the whole picture.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from weir.testing.fake_cluster import Cluster, FakeMessage, FakeTransaction
from weir.testing.fake_consumer import FakeConsumer
from weir.testing.fake_producer import FakeProducer

__all__ = ["FakeBroker", "FakeMessage", "FakeTransaction"]


class FakeBroker(Cluster):
    """An in-memory Kafka cluster for tests: topics, consumer groups, committed offsets.

    Thread-safe: produce from the test thread while `GroupConsumer`s consume on theirs. Pass
    `consumer_factory` as `GroupConsumer(..., consumer_factory=broker.consumer_factory)`, and
    `producer_factory` for a member's producers (exactly-once, dead letters); every client it
    makes shares this broker's state.

    `auto_create_topics` creates a one-partition topic on the first produce to it (the real
    broker's `auto.create.topics.enable`); consumers never create topics.
    `offset_metadata_max_bytes` is the broker's `offset.metadata.max.bytes`."""

    def __init__(
        self, *, auto_create_topics: bool = False, offset_metadata_max_bytes: int = 4096
    ) -> None:
        super().__init__(
            auto_create_topics=auto_create_topics,
            offset_metadata_max_bytes=offset_metadata_max_bytes,
        )
        self.consumers: list[FakeConsumer] = []
        """Every consumer `consumer_factory` made, in order."""
        self.producers: list[FakeProducer] = []
        """Every producer `producer_factory` made, in order."""

    def consumer_factory(self, conf: dict[str, Any]) -> FakeConsumer:
        """Make a consumer on this broker from a client configuration (the `consumer_factory`
        of `GroupConsumer`). It joins `conf['group.id']` when it subscribes."""
        consumer = FakeConsumer(conf, broker=self)
        with self._lock:
            self.consumers.append(consumer)
        return consumer

    def producer_factory(self, conf: dict[str, Any]) -> FakeProducer:
        """Make a producer on this broker from a client configuration (the `producer_factory`
        of `GroupConsumer`): transactional with `conf['transactional.id']`, else plain."""
        producer = FakeProducer(conf, broker=self)
        with self._lock:
            self.producers.append(producer)
        return producer


if TYPE_CHECKING:
    from weir._engine.client import ClientFactory, ProducerFactory, TransactionalProducerFactory

    # mypy proves the factories fit where GroupConsumer takes the real clients'
    # (weir._engine.client).
    _broker_factory: ClientFactory = FakeBroker().consumer_factory
    _producer_factory: ProducerFactory = FakeBroker().producer_factory
    _transactional_factory: TransactionalProducerFactory = FakeBroker().producer_factory
