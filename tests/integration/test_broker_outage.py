"""The only broker goes away for a while and comes back: what a member says meanwhile.

These tests stop and start a broker of their own (on the same data directory, so topics and
committed offsets survive), never the session's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import waiting
from tests.logged import events
from weir import FailurePolicy, GroupConsumer, Record
from weir.prometheus import serve
from weir.testing.broker import EmbeddedKafka
from weir.testing.cluster import FAST_START_JVM_ARGS
from weir.testing.pytest_plugin import create_topic

pytestmark = [pytest.mark.broker, pytest.mark.timeout(240)]

WAIT = 60.0
RAW_LIBRDKAFKA = re.compile(r"(?m)^%\d\|")  # librdkafka's own stderr format


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    workdir: Path = tmp_path_factory.mktemp("outage-broker")
    # Started three times: the fast-start options of short-lived test brokers.
    broker = EmbeddedKafka(workdir=workdir, jvm_args=FAST_START_JVM_ARGS)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def outage(kafka: EmbeddedKafka) -> contextlib.AbstractContextManager[None]:
    """The broker is stopped inside the block and started again (same port, same data)
    after it."""

    @contextlib.contextmanager
    def down() -> Iterator[None]:
        kafka.node.stop()
        try:
            yield
        finally:
            kafka.node.start()

    return down()


def ignore(record: Record) -> None:
    pass


def member_of(kafka: EmbeddedKafka, **settings: Any) -> GroupConsumer:
    """A member of a new group on a new topic of `kafka`."""
    bootstrap = kafka.bootstrap_servers
    return GroupConsumer(
        ignore,
        bootstrap_servers=bootstrap,
        group_id=f"g-{uuid.uuid4().hex[:10]}",
        topics=[create_topic(bootstrap, partitions=1)],
        startup_timeout_s=30.0,
        **settings,
    )


def probe(url: str) -> tuple[int, dict[str, Any]]:
    """A health endpoint's status and body."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def brokers_down_metric(url: str) -> float:
    """`weir_brokers_down_seconds` as /metrics has it."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    families = text_string_to_metric_families(text)
    (family,) = [f for f in families if f.name == "weir_brokers_down_seconds"]
    (sample,) = family.samples
    return float(sample.value)


@pytest.mark.slow  # 20 s or more: make integration
def test_readyz_turns_503_in_an_outage_of_the_only_broker_and_200_after(
    kafka: EmbeddedKafka, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: /readyz stayed 200 through a 30 s outage of the only broker while
    `all_brokers_down` was logged at ERROR. With the default `broker_down_unready_s` (10 s) it
    answers 503 once no broker has answered for that long (the member stays live), and 200
    again once the broker is back."""
    caplog.set_level(logging.INFO, logger="weir.engine")
    gc = member_of(kafka)
    assert gc.config.broker_down_unready_s == 10.0
    with gc, serve(gc, port=0, host="127.0.0.1") as server:
        ready, live = server.url + "/readyz", server.url + "/healthz"
        waiting.wait_until(lambda: probe(ready)[0] == 200, "ready", WAIT, every=0.1)
        with outage(kafka):
            waiting.wait_until(
                lambda: events(caplog, "all_brokers_down"), "all_brokers_down", WAIT, every=0.1
            )
            waiting.wait_until(lambda: probe(ready)[0] == 503, "/readyz 503", 30, every=0.1)
            status, body = probe(ready)
            assert status == 503
            assert body["brokers_down_s"] >= 10.0 and body["live"], body
            assert any("no broker has answered" in r for r in body["reasons"]), body
            assert probe(live)[0] == 200, "live throughout"
            assert brokers_down_metric(server.url) >= 10.0
        waiting.wait_until(lambda: probe(ready)[0] == 200, "/readyz 200 again", WAIT, every=0.1)
        assert probe(ready)[1]["brokers_down_s"] is None
        assert brokers_down_metric(server.url) == 0
    (back,) = events(caplog, "brokers_reachable")
    assert back["down_s"] >= 10.0


def test_the_dead_letter_producer_logs_through_weir_in_an_outage(
    kafka: EmbeddedKafka,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Regression: in an outage of the only broker the dead-letter producer printed its
    librdkafka lines raw to stderr (43 in one outage), the member's other clients none."""
    caplog.set_level(logging.INFO, logger="weir.librdkafka")
    gc = member_of(kafka, failure=FailurePolicy(final="dead_letter"))
    with gc:
        waiting.wait_until(lambda: gc.stats().joined, "joined", WAIT)
        capfd.readouterr()

        def producer_lines() -> list[str]:
            return [
                r.getMessage()
                for r in caplog.records
                if r.name == "weir.librdkafka" and "[rdkafka#producer-" in r.getMessage()
            ]

        with outage(kafka):
            # Served while the member runs, not only when it closes.
            waiting.wait_until(producer_lines, "the dead-letter producer's lines, logged", WAIT)
    err = capfd.readouterr().err
    assert not RAW_LIBRDKAFKA.search(err), err[:3000]
    assert "rdkafka" not in err, err[:3000]
