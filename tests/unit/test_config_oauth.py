"""The OAUTHBEARER token provider (``kafka["oauth_cb"]``) as a setting: taken with the settings it
needs, never called by the validation, never shown, and what goes wrong with it said without
its words."""

from __future__ import annotations

import functools
import json
import logging
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from pydantic import ValidationError

from weir import AuthenticationError, ConsumerConfig, GroupConsumer
from weir._engine.refusals import token_refusal
from weir._secrets import SecretCallback

BASE: dict[str, Any] = {"bootstrap_servers": "broker:9093", "group_id": "g", "topics": ["t"]}
SASL: dict[str, Any] = {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}
SECRET = "client-S3CRET-value"
TOKEN = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhbGljZSJ9."


def fetch_token(config: str | None, *, client_secret: str) -> tuple[str, float]:
    return TOKEN, time.time() + 60


def provider(calls: list[str | None] | None = None) -> Any:
    """A token provider whose repr shows its client secret, as a partial's does."""
    made = functools.partial(fetch_token, client_secret=SECRET)
    if calls is None:
        return made

    def counting(config: str | None) -> tuple[str, float]:
        calls.append(config)
        return made(config)

    return counting


def test_a_token_provider_is_taken_unseen_and_reaches_the_client() -> None:
    calls: list[str | None] = []
    oauth_cb = provider()
    began = time.monotonic()
    cfg = ConsumerConfig(**BASE, kafka={**SASL, "oauth_cb": oauth_cb, "client.id": "visible"})
    # librdkafka's probe builds no client with it: that would call it, and wait a second.
    assert time.monotonic() - began < 0.9
    texts = [
        repr(cfg),
        str(cfg),
        repr(cfg.model_dump()),
        json.dumps(cfg.model_dump(mode="json")),
        cfg.model_dump_json(),
        repr(GroupConsumer(print, cfg)),
    ]
    for text in texts:
        assert SECRET not in text and "fetch_token" not in text, text
    assert "visible" in repr(cfg)
    # Validated again (as an async handler's member does): the same provider, wrapped once.
    assert cfg == ConsumerConfig(**{name: getattr(cfg, name) for name in cfg.model_fields_set})
    client_cb = cfg.librdkafka_config()["oauth_cb"]
    token, expires = client_cb("principal=alice")
    assert token == TOKEN and expires > time.time()

    counted = ConsumerConfig(**BASE, kafka={**SASL, "oauth_cb": provider(calls)})
    assert calls == []  # validation called nothing
    counted.librdkafka_config()["oauth_cb"](None)
    assert calls == [None]


@pytest.mark.parametrize(
    ("kafka", "said"),
    [
        (
            {**SASL, "oauth_cb": "not-callable"},
            "kafka['oauth_cb'] must be a callable: the OAUTHBEARER token provider, called as "
            "oauth_cb(sasl.oauthbearer.config) -> (token, expiry_s[, principal, extensions])",
        ),
        (
            {"security.protocol": "SSL"},
            "kafka['oauth_cb'] is the OAUTHBEARER token provider: it needs "
            "kafka['security.protocol'] 'SASL_SSL' (or 'SASL_PLAINTEXT') and "
            "kafka['sasl.mechanism'] 'OAUTHBEARER', not 'ssl' and 'GSSAPI' (every client would "
            "wait 10 s for a token, and fail)",
        ),
        (
            {**SASL, "enable.sasl.oauthbearer.unsecure.jwt": True},
            "kafka['oauth_cb'] and kafka['enable.sasl.oauthbearer.unsecure.jwt'] both make the "
            "tokens: set one (librdkafka refuses both)",
        ),
        (
            {**SASL, "sasl.oauthbearer.method": "oidc"},
            "kafka['oauth_cb'] and kafka['sasl.oauthbearer.method'] 'oidc' both fetch the "
            "tokens: set one",
        ),
    ],
)
def test_a_token_provider_without_what_it_needs_is_refused(
    kafka: dict[str, Any], said: str
) -> None:
    kafka = {"oauth_cb": provider(), **kafka}
    with pytest.raises(ValidationError) as raised:
        ConsumerConfig(**BASE, kafka=kafka)
    err = raised.value
    assert said in str(err)
    for text in (str(err), repr(err), err.json(), repr(err.errors())):
        assert SECRET not in text and "fetch_token" not in text


def test_another_callable_setting_is_still_refused() -> None:
    with pytest.raises(ValidationError, match=r"the one callable is the OAUTHBEARER token"):
        ConsumerConfig(**BASE, kafka={"ssl.certificate.verify_cb": print})


def failing(exc: BaseException) -> Any:
    def oauth_cb(config: str | None) -> Any:
        raise exc

    return oauth_cb


@pytest.mark.parametrize(
    ("oauth_cb", "reason"),
    [
        (
            failing(RuntimeError(f"401 from https://idp/token?secret={SECRET}")),
            "the token provider kafka['oauth_cb'] raised RuntimeError",
        ),
        (
            lambda config: (TOKEN,),
            "the token provider kafka['oauth_cb'] returned a tuple of 1, not (token, expiry_s) "
            "or (token, expiry_s, principal, extensions)",
        ),
        (
            lambda config: (TOKEN, time.time() - 30),
            "the token provider kafka['oauth_cb'] returned a token that expired 30 s ago "
            "(expiry_s is seconds since the epoch)",
        ),
        (
            lambda config: (TOKEN, "soon"),
            "the token provider kafka['oauth_cb'] returned an expiry_s that is str, not seconds "
            "since the epoch",
        ),
    ],
)
def test_what_goes_wrong_with_a_token_provider_is_logged_without_its_words(
    caplog: pytest.LogCaptureFixture, oauth_cb: Any, reason: str
) -> None:
    """Regression: confluent-kafka drops what the provider raises or a result it cannot use
    without a word (PyErr_Clear), and the client only times out 10 s later: "OAuth token not
    set within 10 seconds timeout"."""
    caplog.set_level(logging.ERROR, logger="weir")
    cfg = ConsumerConfig(**BASE, kafka={**SASL, "oauth_cb": oauth_cb})
    with pytest.raises(Exception):  # noqa: B017 (what confluent-kafka then drops)
        cfg.librdkafka_config()["oauth_cb"]("principal=alice")
    [logged] = [r.msg for r in caplog.records if isinstance(r.msg, dict)]
    assert logged == {"event": "oauth_token_failed", "reason": reason} | {
        k: v for k, v in logged.items() if k not in ("event", "reason")
    }
    assert SECRET not in caplog.text and TOKEN not in caplog.text


def test_a_client_that_got_no_token_is_an_authentication_error() -> None:
    """What confluent-kafka raises when the token provider set no token in 10 s."""
    exc = KafkaException(
        KafkaError(
            KafkaError.SASL_AUTHENTICATION_FAILED, "OAuth token not set within 10 seconds timeout"
        )
    )
    error = token_refusal(exc, {"oauth_cb": SecretCallback(print)})
    assert isinstance(error, AuthenticationError)
    assert str(error) == (
        "authentication failed: the OAUTHBEARER token provider kafka['oauth_cb'] handed the "
        "client no token (OAuth token not set within 10 seconds timeout): it raised, or "
        "returned what a client cannot use; the oauth_token_failed error logged before this "
        "says which"
    )
    assert token_refusal(exc, {}) is None


@pytest.mark.parametrize(
    ("oauth_cb", "said"),
    [
        (
            failing(ConnectionError(f"the identity provider is down, secret={SECRET}")),
            "raised ConnectionError (its words are not shown: log them there)",
        ),
        (
            lambda config: (TOKEN, time.time() - 30),
            "returned a token that expired 30 s ago (expiry_s is seconds since the epoch)",
        ),
    ],
)
def test_a_member_whose_token_provider_fails_says_so_at_once(
    caplog: pytest.LogCaptureFixture, oauth_cb: Any, said: str
) -> None:
    """Regression: confluent-kafka waited 10 s for a first token, then called the member's
    error callback with its KafkaException pending: the start failed with "SystemError:
    <method 'code' of 'confluent_kafka.cimpl.KafkaError' objects> returned a result with an
    exception set", or the owner thread died of a KafkaError raised as an exception (seen on
    the secured broker), and what the provider raised was said nowhere. The provider is now
    asked for a token before the client is built."""
    caplog.set_level(logging.ERROR, logger="weir")
    gc = GroupConsumer(
        lambda record: None,
        bootstrap_servers="127.0.0.1:1",
        group_id="g",
        topics=["t"],
        kafka={**SASL, "oauth_cb": oauth_cb},
    )
    began = time.monotonic()
    with pytest.raises(AuthenticationError) as raised:
        gc.run()
    assert time.monotonic() - began < 2
    assert str(raised.value) == (
        "authentication failed: the OAUTHBEARER token provider kafka['oauth_cb'], asked for a "
        f"first token before the member's client is built, {said}"
    )
    assert [dict(r.msg)["event"] for r in caplog.records if isinstance(r.msg, dict)] == [
        "oauth_token_failed"
    ]
    assert SECRET not in caplog.text + str(raised.value)
