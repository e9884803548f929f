"""The offset map against a real broker: its size rule is the broker's, and it comes back intact.

The codec counts a NUL after the text because the Python client sends one; this checks that the
broker's ``offset.metadata.max.bytes`` (4096 by default) really counts it, and that the largest
map the encoder writes is accepted and read back byte for byte, with the committed offset
unchanged for tools that know nothing of the map.
"""

from __future__ import annotations

import random
import time
import uuid

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from weir.offsetmap import DEFAULT_MAX_BYTES, FinishedMap, NoMap, decode_finished, encode_finished
from weir.testing.pytest_plugin import TopicFactory

pytestmark = [pytest.mark.broker, pytest.mark.timeout(90)]


def standalone(bootstrap: str, group: str) -> Consumer:
    # Commits with explicit offsets need a group id but no subscription.
    return Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )


def new_group() -> str:
    return f"weir-offsetmap-{uuid.uuid4().hex[:8]}"


def commit_error(consumer: Consumer, tp: TopicPartition) -> KafkaError | None:
    """Commit ``tp`` synchronously; its error, or None. Retriable errors (the group coordinator
    of a fresh broker still loading) are retried for a while."""
    deadline = time.monotonic() + 30
    while True:
        try:
            result = consumer.commit(offsets=[tp], asynchronous=False)
        except KafkaException as exc:  # raised when the only partition fails
            error: KafkaError | None = exc.args[0]
        else:
            assert result is not None
            error = result[0].error
        if error is None or not error.retriable() or time.monotonic() > deadline:
            return error
        time.sleep(0.2)


def test_the_broker_counts_the_nul_after_the_metadata(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    topic = make_topic(1)
    consumer = standalone(kafka_bootstrap, new_group())
    try:
        fits = TopicPartition(topic, 0, 10, metadata="x" * (DEFAULT_MAX_BYTES - 1))
        assert commit_error(consumer, fits) is None
        over = TopicPartition(topic, 0, 11, metadata="x" * DEFAULT_MAX_BYTES)
        error = commit_error(consumer, over)
        assert error is not None
        assert error.code() == KafkaError.OFFSET_METADATA_TOO_LARGE
    finally:
        consumer.close()


def test_the_largest_map_commits_and_reads_back_exactly(
    kafka_bootstrap: str, make_topic: TopicFactory, kafka_admin: AdminClient
) -> None:
    topic = make_topic(1)
    group = new_group()
    rnd = random.Random(1)
    flags = bytes(rnd.getrandbits(1) for _ in range(100_000))  # incompressible: truncated
    encoded = encode_finished(500, flags)
    assert encoded.truncated and encoded.size > DEFAULT_MAX_BYTES - 4

    consumer = standalone(kafka_bootstrap, group)
    try:
        assert commit_error(consumer, TopicPartition(topic, 0, 500, metadata=encoded.text)) is None
        [back] = consumer.committed([TopicPartition(topic, 0)], timeout=15)
        assert back.offset == 500
        assert back.metadata == encoded.text
        got = decode_finished(back.metadata, back.offset)
        assert isinstance(got, FinishedMap)
        assert got.flags == flags[: encoded.covered]

        # Tools that know nothing of the map see the committed offset as it is.
        request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])]
        listed = kafka_admin.list_consumer_group_offsets(request)[group].result(timeout=15)
        assert [tp.offset for tp in listed.topic_partitions] == [500]

        # A plain commit (no metadata) leaves no map behind for the next owner.
        assert commit_error(consumer, TopicPartition(topic, 0, 600)) is None
        [plain] = consumer.committed([TopicPartition(topic, 0)], timeout=15)
        assert plain.offset == 600
        no_map = decode_finished(plain.metadata, plain.offset)
        assert isinstance(no_map, NoMap) and no_map.cause == "empty"
    finally:
        consumer.close()
