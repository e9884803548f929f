"""The `kafka` mapping of librdkafka settings: what weir owns of it, and what it refuses in it.

Settings weir exposes as typed fields, commits it alone makes, and callbacks it sets itself
cannot be set here; every other entry must reach librdkafka as it was typed (`weir._ids`), and
librdkafka itself judges the rest (`weir._librdkafka_probe`). The one callable it takes is the
OAUTHBEARER token provider, ``oauth_cb``, checked here with the settings it needs: librdkafka's
probe cannot call it (it would ask the identity provider for a token, and wait a second).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import SecretStr

from weir._ids import text_problem
from weir._secrets import OAUTH_CB, NotScalarSecret, SecretCallback
from weir.logs import LIBRDKAFKA_LOGGER

__all__ = [
    "FORCED_OFF",
    "TYPED_KEYS",
    "KafkaSetting",
    "KafkaValue",
    "TokenProvider",
    "value_problems",
]

KafkaValue = str | int | float | bool
TokenProvider = Callable[[str | None], Any]
"""``kafka["oauth_cb"]``: the OAUTHBEARER token provider, given librdkafka's
``sasl.oauthbearer.config``, returning ``(token, expiry_s)`` or ``(token, expiry_s, principal,
extensions)``."""
KafkaSetting = KafkaValue | SecretStr | SecretCallback | TokenProvider
"""What a `kafka` entry may be: a librdkafka setting, a secret one wrapped, the token provider
(wrapped before validation)."""


# librdkafka settings that weir exposes as typed fields: setting them in `kafka` would bypass the
# fields' rules (`weir.config`), so they are refused with the name of the field to use instead.
TYPED_KEYS = {
    "bootstrap.servers": "bootstrap_servers",
    "metadata.broker.list": "bootstrap_servers",
    "group.id": "group_id",
    "group.protocol": "group_protocol",
    "partition.assignment.strategy": "assignment_strategy",
    "group.remote.assignor": "remote_assignor",
    "group.instance.id": "group_instance_id",
    "session.timeout.ms": "session_timeout_s",
    "heartbeat.interval.ms": "heartbeat_interval_s",
    "max.poll.interval.ms": "max_poll_interval_s",
    "auto.offset.reset": "auto_offset_reset",
    # librdkafka sets a name it does not know globally on the default topic configuration, with
    # a "topic." prefix taken off: this one overrode auto_offset_reset without a word.
    "topic.auto.offset.reset": "auto_offset_reset",
    "topic.metadata.refresh.interval.ms": "topic_refresh_s",
}
# weir is the only committer; these would let librdkafka commit offsets of unfinished records.
FORCED_OFF = ("enable.auto.commit", "enable.auto.offset.store")

# Callbacks weir sets on the client itself, and what to use instead.
_WEIR_CALLBACKS = {
    "logger": (
        f"weir routes librdkafka's log lines to the stdlib logger {LIBRDKAFKA_LOGGER!r}: "
        f"configure that logger instead (logging.getLogger({LIBRDKAFKA_LOGGER!r})"
        ".setLevel(...), handlers), and set kafka['debug'] for more of them"
    ),
    "log_cb": f"weir routes librdkafka's log lines to the stdlib logger {LIBRDKAFKA_LOGGER!r}",
    "error_cb": (
        "weir receives the client's errors itself: it logs them (kafka_error, all_brokers_down) "
        "and stops the member with KafkaFatalError on a fatal one"
    ),
    "on_commit": (
        "weir commits and receives every commit result itself: use "
        "GroupConsumer.add_commit_listener() to see them"
    ),
    "offset_commit_cb": (
        "weir commits and receives every commit result itself: use "
        "GroupConsumer.add_commit_listener() to see them"
    ),
    "stats_cb": (
        "weir reserves librdkafka's statistics callback; GroupConsumer.stats() has the member's "
        "figures"
    ),
    "throttle_cb": "weir reserves librdkafka's throttle callback",
    "rebalance_cb": (
        "weir handles rebalances itself; a Handler's on_assigned/on_revoked/on_lost hear of them"
    ),
}
_CALLABLE_HINT = (
    "is a callable: kafka takes librdkafka settings, each a str, int, float or bool (the one "
    "callable is the OAUTHBEARER token provider, kafka['oauth_cb'])"
)
_TOKEN_PROVIDER = (
    "the OAUTHBEARER token provider, called as oauth_cb(sasl.oauthbearer.config) -> (token, "
    "expiry_s[, principal, extensions]), expiry_s in seconds since the epoch"
)


_TERMINATION_SIGNAL = (
    "kafka['internal.termination.signal'] must stay 0: librdkafka installs a handler for that "
    "signal in the whole process whenever a client is built (as validating this configuration "
    "does) and sends it to its own threads on close, so SIGKILL or SIGSTOP would kill or stop "
    "the process, and any other signal loses its handling (SIGINT: KeyboardInterrupt and "
    "weir's graceful stop)"
)


def _entry_problems(key: str, value: KafkaSetting) -> list[str]:
    """What in one `kafka` entry of the right type librdkafka would not read as given, or what
    would harm the process before librdkafka could refuse it."""
    problems = [
        problem
        for problem in (
            text_problem(f"kafka[{key!r}]: the name", key),
            text_problem(
                f"kafka[{key!r}]",
                value.get_secret_value() if isinstance(value, SecretStr) else str(value),
            ),
        )
        if problem is not None
    ]
    if key == "internal.termination.signal" and str(value).strip() != "0":
        problems.append(_TERMINATION_SIGNAL)
    return problems


def value_problems(kafka: Mapping[Any, Any]) -> list[str]:
    """One clear problem per entry of `kafka` (secrets already wrapped), before the type check
    would list every type a value is not."""
    problems = []
    for key, value in kafka.items():
        if key in _WEIR_CALLBACKS:
            problems.append(f"kafka[{key!r}] cannot be set: {_WEIR_CALLBACKS[key]}")
        elif key == OAUTH_CB:
            if not isinstance(value, SecretCallback):
                problems.append(f"kafka[{key!r}] must be a callable: {_TOKEN_PROVIDER}")
            else:
                problems.extend(_token_provider_problems(kafka))
        elif callable(value) and not isinstance(value, SecretStr):
            problems.append(f"kafka[{key!r}] {_CALLABLE_HINT}")
        elif isinstance(value, NotScalarSecret) or not isinstance(
            value, str | int | float | bool | SecretStr
        ):
            problems.append(f"kafka[{key!r}] must be a str, int, float or bool")
        else:
            problems.extend(_entry_problems(key, value))
    return problems


def _token_provider_problems(kafka: Mapping[Any, Any]) -> list[str]:
    """What the token provider needs of the other settings. Without SASL/OAUTHBEARER librdkafka
    never asks it, and confluent-kafka waits 10 s for a token at every client's start; with
    another source of tokens it is not clear which one is used."""
    protocol = str(kafka.get("security.protocol", "plaintext")).lower()
    mechanism = str(kafka.get("sasl.mechanism", kafka.get("sasl.mechanisms", "GSSAPI")))
    if not protocol.startswith("sasl_") or mechanism.upper() != "OAUTHBEARER":
        return [
            f"kafka[{OAUTH_CB!r}] is the OAUTHBEARER token provider: it needs "
            "kafka['security.protocol'] 'SASL_SSL' (or 'SASL_PLAINTEXT') and "
            f"kafka['sasl.mechanism'] 'OAUTHBEARER', not {protocol!r} and {mechanism!r} (every "
            "client would wait 10 s for a token, and fail)"
        ]
    problems = []
    if str(kafka.get("enable.sasl.oauthbearer.unsecure.jwt", "false")).lower() in ("true", "1"):
        problems.append(
            f"kafka[{OAUTH_CB!r}] and kafka['enable.sasl.oauthbearer.unsecure.jwt'] both make "
            "the tokens: set one (librdkafka refuses both)"
        )
    if str(kafka.get("sasl.oauthbearer.method", "default")).lower() == "oidc":
        problems.append(
            f"kafka[{OAUTH_CB!r}] and kafka['sasl.oauthbearer.method'] 'oidc' both fetch the "
            "tokens: set one"
        )
    return problems
