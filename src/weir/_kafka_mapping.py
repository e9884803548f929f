"""The `kafka` mapping of librdkafka settings: what weir owns of it, and what it refuses in it.

Settings weir exposes as typed fields, commits it alone makes, and callbacks it sets itself
cannot be set here; every other entry must reach librdkafka as it was typed (`weir._ids`), and
librdkafka itself judges the rest (`weir._librdkafka_probe`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import SecretStr

from weir._ids import text_problem
from weir._secrets import NotScalarSecret
from weir.logs import LIBRDKAFKA_LOGGER

__all__ = ["FORCED_OFF", "TYPED_KEYS", "KafkaValue", "value_problems"]

KafkaValue = str | int | float | bool


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
    "is a callable: kafka takes librdkafka settings, each a str, int, float or bool "
    "(an OAUTHBEARER token callback is not supported: use sasl.oauthbearer.method='oidc')"
)


_TERMINATION_SIGNAL = (
    "kafka['internal.termination.signal'] must stay 0: librdkafka installs a handler for that "
    "signal in the whole process whenever a client is built (as validating this configuration "
    "does) and sends it to its own threads on close, so SIGKILL or SIGSTOP would kill or stop "
    "the process, and any other signal loses its handling (SIGINT: KeyboardInterrupt and "
    "weir's graceful stop)"
)


def _entry_problems(key: str, value: KafkaValue | SecretStr) -> list[str]:
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
        elif callable(value) and not isinstance(value, SecretStr):
            problems.append(f"kafka[{key!r}] {_CALLABLE_HINT}")
        elif isinstance(value, NotScalarSecret) or not isinstance(
            value, str | int | float | bool | SecretStr
        ):
            problems.append(f"kafka[{key!r}] must be a str, int, float or bool")
        else:
            problems.extend(_entry_problems(key, value))
    return problems
