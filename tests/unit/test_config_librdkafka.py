"""The kafka mapping is validated by librdkafka when a ConsumerConfig is built: every refused key is
named with librdkafka's reason, and the check connects nowhere and prints nothing (that it leaves
no thread behind is checked in tests/integration/test_config_isolated.py)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from weir import ConsumerConfig

BASE: dict[str, Any] = {"bootstrap_servers": "broker:9092", "group_id": "g", "topics": ["t"]}


def refusal(**kafka: Any) -> str:
    with pytest.raises(ValidationError) as info:
        ConsumerConfig(**BASE, kafka=kafka)
    errors = info.value.errors()
    assert [e["loc"] for e in errors] == [("kafka",)]
    return str(errors[0]["msg"])


def test_an_unknown_key_fails_at_construction_naming_it() -> None:
    msg = refusal(**{"fetch.min.byte": 1})
    assert "kafka['fetch.min.byte']: librdkafka refuses it" in msg
    assert "No such configuration property" in msg


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("fetch.min.bytes", 0, "outside allowed range"),
        ("fetch.min.bytes", "lots", "Invalid value"),
        ("isolation.level", "read_everything", "Invalid value"),
        ("sasl.jaas.config", "x", "Java JAAS configuration is not supported"),
        ("ssl_key", "x", "not settable"),
    ],
)
def test_an_invalid_value_fails_at_construction_naming_the_key(
    key: str, value: Any, reason: str
) -> None:
    msg = refusal(**{key: value})
    assert f"kafka[{key!r}]" in msg
    assert reason in msg


def test_every_refused_key_is_reported_at_once() -> None:
    msg = refusal(**{"no.such.one": 1, "client.id": "fine", "fetch.wait.max.ms": -5, "nope": "x"})
    for key in ("no.such.one", "fetch.wait.max.ms", "nope"):
        assert f"kafka[{key!r}]" in msg
    assert "client.id" not in msg


def test_settings_refused_together_are_named() -> None:
    msg = refusal(**{"sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc"})
    assert "kafka['sasl.oauthbearer.method']" in msg
    assert "sasl.oauthbearer.token.endpoint.url" in msg


def test_the_sasl_mechanism_is_checked_under_a_sasl_protocol() -> None:
    msg = refusal(**{"security.protocol": "sasl_plaintext", "sasl.mechanism": "oauthbearer"})
    assert "kafka['sasl.mechanism']" in msg
    assert "Unsupported SASL mechanism: oauthbearer" in msg


def test_valid_librdkafka_settings_pass_through() -> None:
    kafka = {
        "client.id": "me",
        "fetch.min.bytes": 10,
        "debug": "cgrp",
        "security.protocol": "sasl_plaintext",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "u",
        "sasl.password": "p",
    }
    assert ConsumerConfig(**BASE, kafka=kafka).librdkafka_config().items() >= kafka.items()


@pytest.fixture
def listener() -> Iterator[tuple[str, list[float]]]:
    """A loopback port that records every connection made to it."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    accepted: list[float] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            accepted.append(time.monotonic())
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}", accepted
    done.set()
    thread.join()
    server.close()


def test_the_check_connects_nowhere(listener: tuple[str, list[float]]) -> None:
    """Neither to the brokers nor to an OIDC token endpoint: building a client with SASL/OIDC
    starts a token request at once, even with no broker, so that client leaves SASL out."""
    address, accepted = listener
    ConsumerConfig(
        **{**BASE, "bootstrap_servers": address},
        kafka={
            "security.protocol": "sasl_plaintext",
            "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.client.id": "me",
            "sasl.oauthbearer.client.secret": "secret",
            "sasl.oauthbearer.token.endpoint.url": f"http://{address}/token",
        },
    )
    time.sleep(1.0)
    assert accepted == []


def test_the_check_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    # debug=all logs plenty; linger.ms is a producer setting librdkafka warns about.
    ConsumerConfig(**BASE, kafka={"debug": "all", "linger.ms": 5})
    with pytest.raises(ValidationError):
        ConsumerConfig(**BASE, kafka={"debug": "all", "no.such.property": 1})
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
