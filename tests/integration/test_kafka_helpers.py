"""The broker-side helpers' own behaviour, on a stand-in client: no broker needed."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from tests.integration import kafka_helpers


class _Moving:
    """A client whose coordinator answers NOT_COORDINATOR twice, then the offsets."""

    answers = 0

    def __init__(self, conf: dict[str, Any]) -> None:
        pass

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        _Moving.answers += 1
        if _Moving.answers <= 2:
            raise KafkaException(KafkaError(KafkaError.NOT_COORDINATOR))
        return [TopicPartition(tp.topic, tp.partition, 7) for tp in tps]

    def close(self) -> None:
        pass


def test_committed_asks_again_while_the_coordinator_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: a broker just started (or loaded) answered the first offset fetch with
    NOT_COORDINATOR, and a test waiting for commits failed on it instead of asking again."""
    monkeypatch.setattr(kafka_helpers, "Consumer", _Moving)
    assert kafka_helpers.committed("b:9092", "g", "t", 2) == [7, 7]
    assert _Moving.answers == 3


def test_committed_raises_other_errors_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    class Refused(_Moving):
        def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
            raise KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED))

    monkeypatch.setattr(kafka_helpers, "Consumer", Refused)
    with pytest.raises(KafkaException, match="GROUP_AUTHORIZATION_FAILED"):
        kafka_helpers.committed("b:9092", "g", "t", 1)
