"""Every id the configuration accepts works on a real broker, as typed: blanks inside and at the
end, control characters, unicode, punctuation, and the longest ones (32767 bytes, 32730 for the
ids a classic broker names a member after). tests/unit/test_config_ids.py has what is refused
and why; this is the other side, so the rules refuse nothing Kafka takes."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from tests.integration import kafka_helpers
from tests.integration.kafka_helpers import produce, wait_until
from weir import GroupConsumer, Record
from weir.testing.pytest_plugin import create_topic

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180)]

RECORDS = 10


def padded(prefix: str, nbytes: int) -> str:
    """`prefix`, then 'é' and 'g' up to exactly `nbytes` bytes of UTF-8."""
    left = nbytes - len(prefix.encode())
    return prefix + "é" * (left // 2) + "g" * (left % 2)


def committed(bootstrap: str, group: str, topic: str) -> int:
    """The offset the broker holds under exactly `group` (read with a consumer that joins
    nothing: librdkafka's admin ListConsumerGroupOffsets can crash the process, see weir.lag)."""
    return kafka_helpers.committed(bootstrap, group, topic, 1)[0]


def committed_by(gc: GroupConsumer) -> int | None:
    return next((p.committed for p in gc.stats().partitions), None)


def done_or_failed(gc: GroupConsumer) -> Callable[[], bool]:
    return lambda: gc.failure is not None or committed_by(gc) == RECORDS


def test_odd_and_longest_ids_consume_and_commit_as_typed(
    kafka_bootstrap: str, kafka_admin: AdminClient
) -> None:
    topic = create_topic(kafka_admin, name_prefix="weir-ids")
    produce(kafka_bootstrap, topic, [(None, b"v%d" % i) for i in range(RECORDS)])
    run = uuid.uuid4().hex[:8]
    members: dict[str, dict[str, Any]] = {
        "blanks inside and at the end": {"group_id": f"{run} a b\t "},
        "control characters and unicode": {"group_id": f"{run}\x01é日本\u00a0\x7f"},
        "punctuation": {"group_id": f"{run}/b:c*?[](){{}}$^"},
        "the longest group id": {"group_id": padded(f"{run}-long-", 32767)},
        "the longest classic instance id": {
            "group_id": f"{run}-static",
            "group_instance_id": padded(f"{run}-i-", 32730),
        },
        "the longest classic client id": {
            "group_id": f"{run}-client",
            "kafka": {"client.id": padded(f"{run}-c-", 32730)},
        },
        "an odd transactional id": {
            "group_id": f"{run}-tx",
            "transactional_id": f"{run} tx\x01é ",
        },
        "the longest transactional id": {
            "group_id": f"{run}-tx-long",
            "transactional_id": padded(f"{run}-t-", 32767),
        },
    }
    started = []
    try:
        for what, settings in members.items():
            gc = GroupConsumer(
                lambda r: None,
                bootstrap_servers=kafka_bootstrap,
                topics=[topic],
                commit_interval_s=0.2,
                startup_timeout_s=30.0,
                **settings,
            )
            gc.start()
            started.append((what, gc, settings["group_id"]))
        for what, gc, _ in started:
            wait_until(done_or_failed(gc), 60, f"{what}: all records committed")
            assert gc.failure is None, f"{what}: {gc.failure!r}"
    finally:
        for _, gc, _ in started:
            gc.stop()
        for _, gc, _ in started:
            gc.join(60)
    for what, _, group in started:
        assert committed(kafka_bootstrap, group, topic) == RECORDS, f"{what}: not under its id"


def test_a_handler_sees_records_under_a_group_id_with_a_trailing_blank(
    kafka_bootstrap: str, kafka_admin: AdminClient
) -> None:
    # The id as typed is what the broker knows: its committed offsets are not another group's.
    topic = create_topic(kafka_admin, name_prefix="weir-ids")
    produce(kafka_bootstrap, topic, [(None, b"v%d" % i) for i in range(RECORDS)])
    group = f"{uuid.uuid4().hex[:8]} "
    seen: list[int] = []

    def handle(record: Record) -> None:
        seen.append(record.offset)

    gc = GroupConsumer(
        handle, bootstrap_servers=kafka_bootstrap, group_id=group, topics=[topic]
    ).start()
    try:
        wait_until(lambda: committed_by(gc) == RECORDS, 60, "committed")
    finally:
        gc.stop()
        gc.join(60)
    assert sorted(seen) == list(range(RECORDS))
    assert committed(kafka_bootstrap, group, topic) == RECORDS
    assert committed(kafka_bootstrap, group.rstrip(), topic) < 0  # nothing under the trimmed id
