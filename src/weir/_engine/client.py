"""The typed boundary between weir and the Kafka client: the calls weir makes, nothing more.

`confluent_kafka.Consumer` satisfies `ConsumerClient` (mypy checks it below, against the
client's own stubs), and so does the in-memory fake in `weir.testing.fake`; the engine talks to
this protocol only. Only the owner thread may call a client: from confluent-kafka 2.16 calls on
one consumer are serialised without a timeout, so a worker calling it while the owner waits for
that worker would deadlock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

from confluent_kafka import KafkaError, TopicPartition

from weir.records import Partition

__all__ = [
    "ClientFactory",
    "ConsumerClient",
    "DeliveryCallback",
    "KafkaMessage",
    "ProducerClient",
    "ProducerFactory",
    "RebalanceCallback",
    "TransactionalProducer",
    "TransactionalProducerFactory",
    "offsets_to_commit",
    "topic_partitions",
]

Headers = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None]


class KafkaMessage(Protocol):
    """What weir reads of a consumed message (`confluent_kafka.Message`)."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> Headers | None: ...
    def timestamp(self) -> tuple[int, int]: ...
    def leader_epoch(self) -> int | None: ...
    def error(self) -> KafkaError | None: ...


RebalanceCallback = Callable[[Any, list[TopicPartition]], None]


class ConsumerClient(Protocol):
    """The consumer calls weir makes, all from its owner thread."""

    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = ...,
        on_revoke: RebalanceCallback | None = ...,
        on_lost: RebalanceCallback | None = ...,
    ) -> None: ...
    def unsubscribe(self) -> None: ...
    def close(self) -> None: ...
    def consume(self, num_messages: int = ..., timeout: float = ...) -> Sequence[KafkaMessage]: ...
    def list_topics(self, topic: str | None = ..., timeout: float = ...) -> Any: ...
    @overload
    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[True] = ...
    ) -> None: ...
    @overload
    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[False]
    ) -> list[TopicPartition]: ...
    def committed(
        self, partitions: list[TopicPartition], timeout: float = ...
    ) -> list[TopicPartition]: ...
    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]: ...
    def offsets_for_times(
        self, partitions: list[TopicPartition], timeout: float = ...
    ) -> list[TopicPartition]: ...
    def seek(self, partition: TopicPartition) -> None: ...
    def pause(self, partitions: list[TopicPartition]) -> None: ...
    def resume(self, partitions: list[TopicPartition]) -> None: ...
    def assign(self, partitions: list[TopicPartition]) -> None: ...
    def unassign(self) -> None: ...
    def incremental_assign(self, partitions: list[TopicPartition]) -> None: ...
    def incremental_unassign(self, partitions: list[TopicPartition]) -> None: ...
    def assignment(self) -> list[TopicPartition]: ...
    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = ..., cached: bool = ...
    ) -> tuple[int, int]: ...
    def consumer_group_metadata(self) -> Any: ...
    def memberid(self) -> str: ...


ClientFactory = Callable[[dict[str, Any]], ConsumerClient]
"""Builds a client from the librdkafka configuration dict (with weir's callbacks in it)."""

DeliveryCallback = Callable[[KafkaError | None, Any], None]


class ProducerClient(Protocol):
    """The producer calls weir makes (dead letters; transactions), all from its owner thread:
    delivery callbacks are served by `poll` and `flush` there."""

    def produce(
        self,
        topic: str,
        value: str | bytes | None = ...,
        key: str | bytes | None = ...,
        partition: int = ...,
        callback: DeliveryCallback | None = ...,
        on_delivery: DeliveryCallback | None = ...,
        timestamp: int = ...,
        headers: Any = ...,
    ) -> None: ...
    def poll(self, timeout: float = ...) -> int: ...
    def flush(self, timeout: float = ...) -> int: ...
    def list_topics(self, topic: str | None = ..., timeout: float = ...) -> Any: ...
    def __len__(self) -> int: ...


class TransactionalProducer(ProducerClient, Protocol):
    """A producer a transactional member uses: `ProducerClient` and the transaction calls."""

    def init_transactions(self, timeout: float = ...) -> None: ...
    def begin_transaction(self) -> None: ...
    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = ...
    ) -> None: ...
    def commit_transaction(self, timeout: float = ...) -> None: ...
    def abort_transaction(self, timeout: float = ...) -> None: ...


ProducerFactory = Callable[[dict[str, Any]], ProducerClient]
TransactionalProducerFactory = Callable[[dict[str, Any]], TransactionalProducer]


def topic_partitions(tps: Iterable[Partition]) -> list[TopicPartition]:
    """The client's form of `tps` (pause, resume, position, committed)."""
    return [TopicPartition(tp.topic, tp.partition) for tp in tps]


def offsets_to_commit(
    offsets: Mapping[Partition, int], metadata: Mapping[Partition, str] | None = None
) -> list[TopicPartition]:
    """The client's form of offsets to commit, each with its metadata (the offset map) where
    it has one: for a consumer commit and for a transaction's send_offsets_to_transaction."""
    meta = metadata or {}
    return [
        TopicPartition(tp.topic, tp.partition, off, meta[tp])
        if meta.get(tp)
        else TopicPartition(tp.topic, tp.partition, off)
        for tp, off in offsets.items()
    ]


if TYPE_CHECKING:
    import confluent_kafka

    # mypy proves the real client satisfies the boundary: a changed signature in a new
    # confluent-kafka release fails the type check, not a production run.
    def _real_consumer(consumer: confluent_kafka.Consumer) -> ConsumerClient:
        return consumer

    def _real_message(message: confluent_kafka.Message) -> KafkaMessage:
        return message

    _real_factory: ClientFactory = confluent_kafka.Consumer

    def _real_producer(producer: confluent_kafka.Producer) -> TransactionalProducer:
        return producer

    _real_producer_factory: ProducerFactory = confluent_kafka.Producer
