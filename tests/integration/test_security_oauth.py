"""OAUTHBEARER with a token provider (``kafka["oauth_cb"]``) on the secured broker, which takes
unsecured JWS tokens: every client a member makes logs in with it, tokens are fetched again
before they expire without a restart, and no token reaches a log line.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from tests.integration.secured import Forward, member
from tests.waiting import wait_until
from weir import (
    FailurePolicy,
    NonRetryable,
    Record,
    RetryPolicy,
)
from weir.lag import admin_client, group_lag
from weir.testing.broker import EmbeddedKafka
from weir.testing.pytest_plugin import (
    allow,
    consume_all,
    create_topic,
    produce,
    records_as_text,
    wait_for_committed,
)
from weir.testing.security import ClientSettings, UnsecuredTokens

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

WAIT_S = 30.0


@pytest.fixture
def topic(kafka_secure_broker: EmbeddedKafka) -> str:
    return create_topic(kafka_secure_broker.internal_bootstrap_servers, partitions=2)


@pytest.fixture
def every_line(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


def events(caplog: pytest.LogCaptureFixture, *names: str) -> list[dict[str, Any]]:
    return [
        dict(r.msg) for r in caplog.records if isinstance(r.msg, dict) and r.msg["event"] in names
    ]


def test_every_client_of_a_member_logs_in_with_the_token_provider(
    kafka_secure_broker: EmbeddedKafka,
    kafka_secure_admin: AdminClient,
    kafka_secure_client: ClientSettings,
    who: ClientSettings,
    principal: str,
    topic: str,
    group: str,
    every_line: pytest.LogCaptureFixture,
) -> None:
    """The consumer, the dead-letter producer, the watermark refresher's client and weir.lag's
    clients, each with the provider given in `kafka` (before: refused, "an OAUTHBEARER token
    callback is not supported"). librdkafka's debug=all lines hold no token."""
    dlq = create_topic(kafka_secure_broker.internal_bootstrap_servers, name=f"{topic}.dlq")
    allow(kafka_secure_admin, principal, topics=[topic], groups=[group])
    allow(kafka_secure_admin, principal, topics=[dlq], operations=["DESCRIBE", "WRITE"])
    records = [(f"k{i}", "bad" if i == 3 else f"v{i}") for i in range(8)]
    conf = kafka_secure_client.config()
    produce(kafka_secure_client.bootstrap_servers, topic, records, config=conf)
    tokens = UnsecuredTokens(principal)
    seen: list[str] = []
    done = threading.Event()

    def handle(record: Record) -> None:
        seen.append(record.value.decode())  # type: ignore[union-attr]
        if len(seen) == len(records):
            done.set()
        if record.value == b"bad":
            raise NonRetryable("bad record")

    gc = member(
        who, handle, {**who.token_config(tokens), "debug": "all"},
        group_id=group, topics=[topic], watermark_refresh_s=0.5,
        failure=FailurePolicy(retry=RetryPolicy(max_attempts=1), final="dead_letter"),
    )  # fmt: skip
    gc.start()
    try:
        assert done.wait(WAIT_S), seen
        wait_for_committed(kafka_secure_admin, group, topic, timeout=WAIT_S)
        # The refresher builds its client at its first round.
        wait_until(lambda: tokens.calls >= 3, "the consumer, producer and refresher", WAIT_S)
        time.sleep(1.0)  # a few of the refresher's rounds
    finally:
        gc.stop()
        gc.join(30)
    letters = consume_all(kafka_secure_client.bootstrap_servers, dlq, expected=1, config=conf)
    assert records_as_text(letters) == [("k3", "bad")]
    assert not events(every_line, "watermark_refresh_failed", "dead_letter_failed")
    assert not events(every_line, "kafka_authentication_failed", "oauth_token_failed")

    before = tokens.calls
    lag = group_lag(admin_client(who.token_config(tokens)), group, timeout=WAIT_S)
    assert lag.total_lag == 0
    assert tokens.calls > before  # weir.lag's admin client

    lines = [r.getMessage() for r in every_line.records]
    assert len(lines) > 1000 and any("OAUTHBEARER" in line for line in lines)
    everything = "\n".join(lines)
    assert not [t for t in tokens.tokens if t in everything]


def test_the_transactional_producer_logs_in_with_the_token_provider(
    kafka_secure_broker: EmbeddedKafka,
    kafka_secure_admin: AdminClient,
    kafka_secure_client: ClientSettings,
    who: ClientSettings,
    principal: str,
    topic: str,
    group: str,
) -> None:
    output = create_topic(kafka_secure_broker.internal_bootstrap_servers, partitions=2)
    tid = f"tx-{group}"
    allow(kafka_secure_admin, principal, topics=[topic], groups=[group])
    allow(kafka_secure_admin, principal, topics=[output], operations=["WRITE"])
    allow(kafka_secure_admin, principal, transactional_ids=[tid], operations=["WRITE", "DESCRIBE"])
    conf = kafka_secure_client.config()
    records = [(f"k{i}", f"v{i}") for i in range(6)]
    produce(kafka_secure_client.bootstrap_servers, topic, records, config=conf)
    tokens = UnsecuredTokens(principal)
    gc = member(
        who, Forward(output), who.token_config(tokens), group_id=group, topics=[topic],
        transactional_id=tid,
    )  # fmt: skip
    gc.start()
    try:
        wait_for_committed(kafka_secure_admin, group, topic, timeout=WAIT_S)
    finally:
        gc.stop()
        gc.join(30)
    got = consume_all(kafka_secure_client.bootstrap_servers, output, expected=6, config=conf)
    assert sorted(records_as_text(got)) == records
    assert tokens.calls >= 2


@pytest.mark.slow
def test_tokens_are_fetched_again_before_they_expire_without_a_restart(
    kafka_secure_admin: AdminClient,
    kafka_secure_client: ClientSettings,
    who: ClientSettings,
    principal: str,
    topic: str,
    group: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Tokens live 10 s and the broker ends each session when its token expires: for 25 s the
    member keeps consuming and committing, each client re-authenticating with tokens it fetched
    anew from the provider (at 80 % of their life), never refused."""
    caplog.set_level(logging.INFO, logger="weir")
    allow(kafka_secure_admin, principal, topics=[topic], groups=[group])
    conf = kafka_secure_client.config()
    tokens = UnsecuredTokens(principal, lifetime_s=10.0)
    seen: list[str] = []
    gc = member(
        who, lambda record: seen.append(record.value.decode()), who.token_config(tokens),
        group_id=group, topics=[topic], watermark_refresh_s=1.0,
    )  # fmt: skip
    gc.start()
    try:
        began = time.monotonic()
        sent = 0
        while time.monotonic() - began < 25:
            produce(kafka_secure_client.bootstrap_servers, topic, [(None, f"v{sent}")], config=conf)
            sent += 1
            time.sleep(1.0)
        wait_until(lambda: len(seen) == sent, f"{sent} records handled", WAIT_S)
        wait_for_committed(kafka_secure_admin, group, topic, timeout=WAIT_S)
        assert gc.health().ready, gc.health()
    finally:
        gc.stop()
        gc.join(30)
    # Each client fetched at least 3 tokens in 25 s of 10 s tokens: the consumer and the
    # refresher's client, 6 at the least.
    assert tokens.calls >= 6, tokens.calls
    assert not events(caplog, "kafka_authentication_failed", "oauth_token_failed"), caplog.text
