"""The first group call on a new cluster: its coordinator is not ready (NOT_COORDINATOR while
__consumer_offsets is created), and the commands wait for it within --timeout."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from weir.cli import main
from weir.testing.broker import EmbeddedKafka
from weir.testing.pytest_plugin import create_topic, produce

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
def fresh() -> Iterator[str]:
    kafka = EmbeddedKafka()
    kafka.start()
    try:
        yield kafka.bootstrap_servers
    finally:
        kafka.stop()


def test_the_first_reset_on_a_new_cluster_waits_for_the_coordinator(
    fresh: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = create_topic(fresh, partitions=1)
    produce(fresh, topic, [(None, "a"), (None, "b")])
    argv = ["offsets", "reset", "-b", fresh, "-g", "first", "-t", topic, "--to-offset", "1"]
    code = main([*argv, "--json", "--timeout", "20"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert [row["new"] for row in json.loads(out)["partitions"]] == [1]
