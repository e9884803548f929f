"""group_protocol="auto" on the embedded broker (Kafka 4.1, which offers KIP-848): the broker's
API versions are read through librdkafka's debug lines, and the member runs the consumer
protocol. The classic choice and the reasons are tested on the fake (tests/unit)."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest

from tests.integration.kafka_helpers import Seen, committed, member, produce, wait_until
from tests.logged import events
from weir import GroupConsumer, State
from weir._engine.protocols import offers_consumer_protocol
from weir.testing.pytest_plugin import TopicFactory

pytestmark = pytest.mark.broker


def test_the_embedded_broker_offers_the_consumer_protocol(kafka_bootstrap: str) -> None:
    began = time.monotonic()
    assert offers_consumer_protocol({"bootstrap.servers": kafka_bootstrap}, 5.0) is True
    assert time.monotonic() - began < 2.0


def test_no_broker_no_answer() -> None:
    began = time.monotonic()
    assert offers_consumer_protocol({"bootstrap.servers": "127.0.0.1:1"}, 0.5) is None
    assert time.monotonic() - began < 2.0


def test_a_stop_while_an_auto_member_asks_for_the_protocol_ends_the_ask() -> None:
    """No broker answering: the probe waited all of its 5 s in one request, deaf to a stop (a
    signal at `run()`), before the start's own wait for a broker could see it."""
    gc = GroupConsumer(
        lambda r: None,
        bootstrap_servers="127.0.0.1:1",
        group_id="g",
        topics=["t"],
        group_protocol="auto",
    )
    asked: list[float] = []

    def stop() -> None:
        asked.append(time.monotonic())
        gc.stop()

    threading.Timer(0.5, stop).start()
    gc.run(handle_signals=False)
    assert time.monotonic() - asked[0] < 1.5
    assert gc.state is State.STOPPED


def test_an_auto_member_runs_the_consumer_protocol_and_says_so(
    kafka_bootstrap: str, make_topic: TopicFactory, caplog: pytest.LogCaptureFixture
) -> None:
    topic = make_topic(2)
    produce(kafka_bootstrap, topic, [(None, b"v%d" % i) for i in range(20)])
    group = f"auto-{uuid.uuid4().hex[:8]}"
    seen = Seen()
    gc = member(seen.add, kafka_bootstrap, group, [topic], group_protocol="auto")
    with caplog.at_level(logging.INFO, logger="weir"):
        gc.start()
        try:
            assert seen.wait_for(20, 30)
            wait_until(
                lambda: sum(committed(kafka_bootstrap, group, topic, 2)) == 20, 30, "commits"
            )
        finally:
            gc.stop()
            gc.join(30)
    [chosen] = events(caplog, "group_protocol_chosen")
    assert chosen["protocol"] == "consumer"
    [started] = events(caplog, "consumer_started")
    assert started["protocol"] == "consumer"
    assert not events(caplog, "classic_protocol_without_static_membership")


def test_a_classic_dynamic_member_on_the_real_client_is_warned(
    kafka_bootstrap: str, make_topic: TopicFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning of commits held behind a classic JoinGroup reaches a member weir builds the
    real client of (a member on the fake is not warned: tests/unit/test_join_commits.py)."""
    topic = make_topic(1)
    gc = member(lambda record: None, kafka_bootstrap, f"warn-{uuid.uuid4().hex[:8]}", [topic])
    with caplog.at_level(logging.WARNING, logger="weir"):
        gc.start()
        try:
            assert gc.wait_started(30)
        finally:
            gc.stop()
            gc.join(30)
    [warned] = events(caplog, "classic_protocol_without_static_membership")
    assert warned["commit_interval_s"] == 0.2
