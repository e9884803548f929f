"""Every client a member creates connects and authenticates as its consumer does.

The consumer takes the whole `kafka` mapping; the dead-letter producer, the admin client it asks
about topics and the transactional producer take the settings of it that say how to reach the
cluster and log in (`shared_settings`); the watermark refresher takes the consumer's own.
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.librdkafka import librdkafka_properties

from weir import ConsumerConfig, FailurePolicy
from weir._engine.deadletter import _SHARED_PREFIXES, DeadLetters, shared_settings
from weir._engine.transactions import Transactions
from weir._engine.watermarks import refresher_config
from weir.logs import Repeats

OAUTHBEARER: dict[str, Any] = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "OAUTHBEARER",
    "enable.sasl.oauthbearer.unsecure.jwt": True,
    "sasl.oauthbearer.config": "principal=alice",
    "ssl.ca.location": "probe",
    "https.ca.location": "probe",
    "debug": "security",
}
# Families of librdkafka's settings about reaching the cluster and logging in.
SECURITY_FAMILIES = ("security.", "ssl", "sasl", "enable.sasl", "enable.ssl", "https.")


def config(kafka: dict[str, Any]) -> ConsumerConfig:
    return ConsumerConfig(
        bootstrap_servers="b1:9093",
        group_id="g",
        topics=["t"],
        transactional_id="tx",
        failure=FailurePolicy(final="dead_letter"),
        kafka=kafka,
    )


def unused(conf: dict[str, Any]) -> Any:
    raise AssertionError("no client is built here")


def test_the_producers_log_in_as_the_consumer_does() -> None:
    """Regression: they took `sasl.*` but not `enable.sasl.oauthbearer.unsecure.jwt`: with
    OAUTHBEARER the dead-letter producer could not log in, and the member's start failed with
    "could not look up dead-letter topic ...: Broker transport failure"."""
    cfg = config(OAUTHBEARER)
    for conf in (
        shared_settings(cfg),
        DeadLetters(cfg, unused).producer_config(),
        Transactions(cfg, unused).producer_config(),
    ):
        assert {k: conf.get(k) for k in OAUTHBEARER} == OAUTHBEARER


def test_every_client_gets_the_token_provider() -> None:
    """Regression: the watermark refresher's client dropped every callable of the consumer's
    configuration, the token provider too, and could not log in with OAUTHBEARER."""
    calls: list[str | None] = []

    def oauth_cb(config: str | None) -> tuple[str, float]:
        calls.append(config)
        return "token", 4_000_000_000.0

    kafka = {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}
    cfg = config({**kafka, "oauth_cb": oauth_cb})
    consumer = cfg.librdkafka_config()
    for conf in (
        consumer,
        DeadLetters(cfg, unused).producer_config(),
        Transactions(cfg, unused).producer_config(),
        refresher_config({**consumer, "error_cb": print}, Repeats()),
    ):
        conf["oauth_cb"]("principal=alice")
        assert "error_cb" not in conf or conf is consumer
    assert calls == ["principal=alice"] * 4


@pytest.mark.parametrize(
    "name",
    sorted(n for n in librdkafka_properties() if n.startswith(SECURITY_FAMILIES)),
)
def test_every_security_setting_of_librdkafka_is_shared(name: str) -> None:
    assert name.startswith(_SHARED_PREFIXES)
