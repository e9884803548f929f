"""Secrets in settings: which names hold one, and how their values are kept out of sight.

A secret is masked wherever a configuration is shown (reprs, logs, errors, the CLI's refusals),
and wrapped in `SecretStr` before any validation rule can fail on it, because a pydantic error
carries its raw input. The one callable setting, the OAUTHBEARER token provider
(``kafka["oauth_cb"]``), is wrapped in `SecretCallback` likewise: what it is made of (a
`functools.partial`'s arguments, a client secret among them) is never shown, and what it hands
out (a token) never logged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import GetCoreSchemaHandler, SecretStr
from pydantic_core import CoreSchema, core_schema

__all__ = [
    "MASK",
    "OAUTH_CB",
    "SECRET_CALLBACKS",
    "SENSITIVE_ALIASES",
    "SENSITIVE_KEYS",
    "NotScalarSecret",
    "SecretCallback",
    "is_secret_key",
    "mask_secrets",
    "masked",
    "wrap_secret",
]

# librdkafka's own list: the properties flagged _RK_SENSITIVE in the property table of its
# src/rdkafka_conf.c, for librdkafka 2.16.0 (the build confluent-kafka 2.16 bundles). librdkafka
# redacts exactly these in its own dump of a configuration; tests/unit/test_config_secrets.py
# checks this list against the installed library. `ssl_key` is internal: it is set through
# rd_kafka_conf_set_ssl_cert(), never by name, and is listed for completeness.
SENSITIVE_KEYS: frozenset[str] = frozenset(
    {
        "ssl.key.location",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl_key",
        "ssl.ca.pem",
        "ssl.keystore.password",
        "sasl.username",
        "sasl.password",
        "sasl.oauthbearer.config",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.assertion.private.key.file",
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "sasl.oauthbearer.assertion.private.key.pem",
    }
)
# Aliases librdkafka resolves to a sensitive property (the alias itself carries no flag).
SENSITIVE_ALIASES = frozenset({"sasl.oauthbearer.client.credentials.client.secret"})
# confluent-kafka's OAUTHBEARER token provider: called by librdkafka for each token.
OAUTH_CB = "oauth_cb"
# Settings that take a callable, kept out of sight as secrets are.
SECRET_CALLBACKS = frozenset({OAUTH_CB})
# The fallback for names not in the list (a newer librdkafka's, a plugin's): masking a harmless
# value costs a line of debugging, showing a secret costs the secret.
_SECRET_WORDS = (
    "password",
    "passwd",
    "passphrase",
    "secret",
    "private",
    "credential",
    "token",
    "jaas",
    "pem",
    "apikey",
    "api.key",
    "api_key",
)

MASK = "***"


def is_secret_key(key: str) -> bool:
    """Whether the value of setting `key` is masked: librdkafka's sensitive properties, their
    aliases, a plugin's copy of one (`<prefix>.sasl.password`), or a name with a secret word."""
    k = key.lower()
    if k in SENSITIVE_KEYS or k in SENSITIVE_ALIASES or k in SECRET_CALLBACKS:
        return True
    if any(k.endswith("." + s) for s in SENSITIVE_KEYS):
        return True
    return any(word in k for word in _SECRET_WORDS)


def mask_secrets(conf: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (MASK if is_secret_key(k) else v) for k, v in conf.items()}


class NotScalarSecret(SecretStr):
    """A secret given as something other than a scalar: masked like any secret, then refused."""


def wrap_secret(value: Any) -> SecretStr:
    if isinstance(value, SecretStr):
        return value
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return SecretStr(str(value))
    return NotScalarSecret("")


def masked(value: Any) -> Any:
    """`value` with every entry of a secret name wrapped, recursively through mappings."""
    if isinstance(value, Mapping):
        return {k: _masked_entry(k, v) for k, v in value.items()}
    return value


def _masked_entry(key: Any, value: Any) -> Any:
    if not isinstance(key, str) or not is_secret_key(key):
        return masked(value)
    if key in SECRET_CALLBACKS and (callable(value) or isinstance(value, SecretCallback)):
        return SecretCallback.of(value)
    return wrap_secret(value)


class SecretCallback:
    """A callable setting (``kafka["oauth_cb"]``), shown masked wherever the configuration is."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    @classmethod
    def of(cls, value: Any) -> SecretCallback:
        return value if isinstance(value, SecretCallback) else cls(value)

    def __repr__(self) -> str:
        return f"SecretCallback({MASK!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretCallback) and other.fn is self.fn

    def __hash__(self) -> int:
        return id(self.fn)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        # As SecretStr: itself in Python, masked in JSON.
        return core_schema.is_instance_schema(
            cls,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda value: MASK, when_used="json"
            ),
        )
