"""Secrets in the configuration: every setting librdkafka marks sensitive is masked in every text
form of a ConsumerConfig and of its validation errors, and still reaches the client."""

from __future__ import annotations

import json
import re
from typing import Any

import confluent_kafka
import pytest
from pydantic import ValidationError
from tests.librdkafka import librdkafka_properties

from weir import ConsumerConfig, GroupConsumer
from weir._secrets import SENSITIVE_ALIASES, SENSITIVE_KEYS, is_secret_key

BASE: dict[str, Any] = {"bootstrap_servers": "broker:9092", "group_id": "g", "topics": ["t"]}
SECRET = "hunter2-S3CRET-value"
# Set through rd_kafka_conf_set_ssl_cert() only: librdkafka refuses it by name.
NOT_SETTABLE = {"ssl_key"}
SETTABLE = sorted((SENSITIVE_KEYS - NOT_SETTABLE) | SENSITIVE_ALIASES)


def texts(cfg: ConsumerConfig) -> dict[str, str]:
    return {
        "repr": repr(cfg),
        "str": str(cfg),
        "format": f"{cfg}",
        "model_dump": repr(cfg.model_dump()),
        "model_dump json mode": json.dumps(cfg.model_dump(mode="json")),
        "model_dump_json": cfg.model_dump_json(),
        "GroupConsumer": repr(GroupConsumer(print, cfg)),
    }


@pytest.mark.parametrize("key", SETTABLE)
def test_every_sensitive_setting_is_masked_and_still_reaches_the_client(key: str) -> None:
    cfg = ConsumerConfig(**BASE, kafka={key: SECRET, "client.id": "visible-id"})
    leaks = [name for name, text in texts(cfg).items() if SECRET in text]
    assert leaks == []
    assert key in repr(cfg)
    assert "visible-id" in repr(cfg)  # masking is per key, not a blanket
    assert cfg.librdkafka_config()[key] == SECRET


@pytest.mark.parametrize("key", sorted(SENSITIVE_KEYS | SENSITIVE_ALIASES))
def test_every_sensitive_setting_is_masked_in_validation_errors(key: str) -> None:
    for overrides in (
        {"workers": 0},  # a field error
        {"max_batch_records": 10_000},  # a rule across fields
        {"kafka": {key: SECRET, "no.such.property": 1}},  # librdkafka refuses another key
        {"kafka": {key: [SECRET]}},  # the secret itself has the wrong type
    ):
        settings = {**BASE, "kafka": {key: SECRET}, **overrides}
        with pytest.raises(ValidationError) as info:
            ConsumerConfig(**settings)
        err = info.value
        for text in (str(err), repr(err), err.json(), repr(err.errors())):
            assert SECRET not in text, overrides


def test_a_sensitive_setting_librdkafka_refuses_is_masked_in_its_reason() -> None:
    # ssl_key can only be set through rd_kafka_conf_set_ssl_cert(): librdkafka refuses the name.
    with pytest.raises(ValidationError) as info:
        ConsumerConfig(**BASE, kafka={"ssl_key": SECRET})
    assert "ssl_key" in str(info.value)
    assert SECRET not in str(info.value) + info.value.json()


def test_a_secret_in_a_misspelled_setting_is_masked() -> None:
    with pytest.raises(ValidationError) as info:
        # Both names are wrong on purpose: what the type checker refuses, validation must too.
        ConsumerConfig(**BASE, kafak={"sasl.password": SECRET}, sasl_password=SECRET)  # type: ignore[call-arg]
    err = info.value
    assert {e["loc"] for e in err.errors()} == {("kafak",), ("sasl_password",)}
    for text in (str(err), repr(err), err.json(), repr(err.errors())):
        assert SECRET not in text


@pytest.mark.parametrize(
    "key",
    [
        "confluent.monitoring.interceptor.sasl.password",  # a plugin's copy of a sensitive one
        "my.plugin.api.key",
        "some.private.key",
        "x.client.secret",
        "sasl.jaas.config",
        "ssl.keystore.passphrase",
    ],
)
def test_names_outside_librdkafkas_list_are_masked_by_pattern(key: str) -> None:
    assert is_secret_key(key)
    with pytest.raises(ValidationError) as info:  # librdkafka knows none of these
        ConsumerConfig(**BASE, kafka={key: SECRET})
    assert key in str(info.value)
    assert SECRET not in str(info.value) + info.value.json()


@pytest.mark.parametrize("key", ["client.id", "fetch.min.bytes", "sasl.mechanism", "group.id"])
def test_ordinary_settings_are_not_masked(key: str) -> None:
    assert not is_secret_key(key)


# -- the list against the installed librdkafka --------------------------------------------------


class _Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, level: int, fmt: str, *args: object) -> None:
        self.lines.append(fmt % args)


def test_the_list_is_what_the_installed_librdkafka_redacts() -> None:
    """librdkafka's debug dump of a configuration (debug=conf) shows `[redacted]` for exactly its
    sensitive properties. Each string property (librdkafka only redacts strings) is set alone
    and its dump line read; a new sensitive property in a librdkafka upgrade fails here."""
    properties = librdkafka_properties()
    assert "sasl.password" in properties
    redacted, probed = set(), set()
    for name, description in properties.items():
        if "*Type: string*" not in description or "Alias for" in description:
            continue
        lines = _Lines()
        try:
            client = confluent_kafka.Consumer(
                {"group.id": "g", "debug": "conf", name: "x", "logger": lines}
            )
        except confluent_kafka.KafkaException:
            continue  # "x" is no value for it (a path that must exist, a plugin)
        client.close()
        dumped = [line for line in lines.lines if re.search(rf":\s+{re.escape(name)} = ", line)]
        if dumped:
            probed.add(name)
            if any(line.endswith("= [redacted]") for line in dumped):
                redacted.add(name)
    assert redacted == SENSITIVE_KEYS - NOT_SETTABLE
    assert probed >= SENSITIVE_KEYS - NOT_SETTABLE
    aliases = {
        name
        for name, description in properties.items()
        if (target := re.search(r"Alias for `([^`]+)`", description))
        and target.group(1) in SENSITIVE_KEYS
    }
    assert aliases == SENSITIVE_ALIASES


INVALID_WITH_SECRET: list[dict[str, Any]] = [
    {"kafka": {"sasl.password": SECRET, "enable.auto.commit": True}},
    {"kafka": {"sasl.password": SECRET, "group.id": "other"}},
    {"kafka": {"sasl.password": SECRET, "queued.max.messages.kbytes": 10**9}},
    {"kafka": {"sasl.password": SECRET, "client.id": ["not", "scalar"]}},
    {"kafka": {"sasl.password": [SECRET]}},
    {"kafka": {"sasl.password": SECRET, "logger": print}},
    {"kafka": {"sasl.password": SECRET, "security.protocol": "sasl_plaintext"}},
    {"kafka": {"sasl.password": SECRET}, "max_batch_records": 10_000},
    {"kafka": {"sasl.password": SECRET}, "revoke_timeout_s": 1_000.0},
    {"kafka": {"sasl.password": SECRET}, "workers": 0},
]


@pytest.mark.parametrize("overrides", INVALID_WITH_SECRET)
def test_secrets_never_appear_in_validation_error_text_or_json(overrides: dict[str, Any]) -> None:
    """`ValidationError.json()` is the text form web frameworks and log shippers emit; it
    carries each error's raw `input`, which for the kafka mapping or a model-level rule is the
    mapping with the password in clear."""
    with pytest.raises(ValidationError) as info:
        ConsumerConfig(**{**BASE, **overrides})
    err = info.value
    for text in (str(err), repr(err), err.json(), repr(err.errors())):
        assert SECRET not in text
