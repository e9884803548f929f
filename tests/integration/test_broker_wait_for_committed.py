"""`wait_for_committed`: a test waits for a group's commits without joining the group."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from weir.testing.pytest_plugin import TopicFactory, commit_offsets, produce, wait_for_committed

pytestmark = [pytest.mark.broker, pytest.mark.timeout(60)]


@pytest.fixture
def three_per_partition(kafka_bootstrap: str, make_topic: TopicFactory) -> str:
    topic = make_topic(3)
    for partition in range(3):
        produce(kafka_bootstrap, topic, [(f"k{i}", f"v{i}") for i in range(3)], partition)
    return topic


def test_returns_once_the_commits_reach_the_end(
    kafka_bootstrap: str, three_per_partition: str
) -> None:
    topic, group = three_per_partition, f"weir-wait-{uuid.uuid4().hex[:8]}"
    commit_offsets(kafka_bootstrap, group, topic, {0: 1})
    later = threading.Timer(
        1.0, commit_offsets, (kafka_bootstrap, group, topic, {0: 3, 1: 3, 2: 3})
    )
    later.start()
    try:
        started = time.monotonic()
        assert wait_for_committed(kafka_bootstrap, group, topic, "end", timeout=20) == {
            0: 3,
            1: 3,
            2: 3,
        }
        assert time.monotonic() - started >= 0.9  # it did wait for the late commit
    finally:
        later.join(10)


def test_explicit_offsets(kafka_bootstrap: str, three_per_partition: str) -> None:
    topic, group = three_per_partition, f"weir-wait-{uuid.uuid4().hex[:8]}"
    commit_offsets(kafka_bootstrap, group, topic, {0: 2, 1: 3})
    assert wait_for_committed(kafka_bootstrap, group, topic, [2, 3, 0], timeout=10) == {
        0: 2,
        1: 3,
        2: None,  # expected 0: nothing to commit, nothing needed
    }
    assert wait_for_committed(kafka_bootstrap, group, topic, {1: 2}, timeout=10) == {1: 3}


def test_timeout_shows_committed_and_expected(
    kafka_bootstrap: str, three_per_partition: str
) -> None:
    topic, group = three_per_partition, f"weir-wait-{uuid.uuid4().hex[:8]}"
    commit_offsets(kafka_bootstrap, group, topic, {0: 3, 1: 1})
    started = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        wait_for_committed(kafka_bootstrap, group, topic, "end", timeout=1.5)
    assert time.monotonic() - started < 5
    message = str(info.value)
    assert f"group {group} on {topic}" in message
    assert "committed {0: 3, 1: 1, 2: -}, expected {0: 3, 1: 3, 2: 3} after 1.5 s" in message
