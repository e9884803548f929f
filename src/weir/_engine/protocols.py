"""The group protocol a member runs: `group_protocol="auto"` chosen at start, and the warning for
the classic protocol's commit blackout.

`"auto"` runs KIP-848 (`"consumer"`) where the broker offers it: the first broker that answers
lists the ConsumerGroupHeartbeat API (key 68) in its ApiVersions response. librdkafka shows a
broker's API versions nowhere but in its `feature` debug lines, so a throwaway producer with the
member's connection settings asks, and its lines are read. The classic protocol otherwise.

Why it matters (docs/rebalances.md): under the classic protocol a member's commits wait behind
its own JoinGroup while a rebalance waits for the other members, up to a dead member's session
timeout, and then fail; a restarted dynamic member starts such a rebalance. KIP-848 has no join
barrier, and a static member restarted within its session timeout starts none.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

from confluent_kafka import KafkaException, Producer

from weir._slices import in_slices
from weir.config import _CLIENT_SESSION_TIMEOUT_S, ConsumerConfig
from weir.logs import get_logger

__all__ = ["ProtocolProbe", "choose_protocol", "offers_consumer_protocol", "warn_commit_blackout"]

log = get_logger(__name__)

CONSUMER_GROUP_HEARTBEAT = 68
"""The API key of KIP-848's heartbeat: a broker that lists it offers the consumer protocol."""

ProtocolProbe = Callable[[Mapping[str, Any], float, Callable[[], bool]], bool | None]
"""Asks the cluster whether it offers the consumer protocol, within a timeout, giving up when
the third argument says the member was asked to stop (None: no broker answered)."""

# The longest "auto" waits at start for a broker's API versions: a broker that does not answer
# that soon leaves the member on the classic protocol (the start's own wait for a broker, up to
# startup_timeout_s, follows).
PROBE_LIMIT_S = 5.0
# librdkafka's debug line for one API of a broker's ApiVersions response.
_API_LINE = re.compile(r"ApiKey \S+ \((\d+)\) Versions (\d+)\.\.(\d+)")
# The member's settings that are no connection setting: left out of the probe's producer.
_CALLBACKS = ("on_commit", "error_cb", "logger", "stats_cb", "throttle_cb", "debug")
# The classic protocol stops a dynamic member's commits for up to its session timeout when a
# member dies and restarts: warned about when that is this many commit intervals or more.
_BLACKOUT_INTERVALS = 5


class _Lines:
    """The probe's logger: keeps librdkafka's lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, level: int, msg: str, *args: object) -> None:
        self.lines.append(msg % args if args else msg)


def api_keys(lines: list[str]) -> set[int] | None:
    """The API keys the brokers listed in librdkafka's `feature` debug lines (None: no broker's
    ApiVersions response among them)."""
    keys = {int(m.group(1)) for m in map(_API_LINE.search, lines) if m is not None}
    return keys or None


def offers_consumer_protocol(
    conf: Mapping[str, Any], timeout: float, stopped: Callable[[], bool] = lambda: False
) -> bool | None:
    """Whether the first broker that answers lists ConsumerGroupHeartbeat among its APIs, asked
    by a throwaway producer with the member's connection settings (`conf`); None when no
    broker answered within `timeout`, or the member was asked to stop first (`stopped`, looked
    at between short requests, `in_slices`: a signal must not wait for the whole timeout)."""
    lines = _Lines()
    settings = {k: v for k, v in conf.items() if k not in _CALLBACKS}
    settings.update({"debug": "feature", "logger": lines, "allow.auto.create.topics": False})
    producer = Producer(settings)
    # No answer to the metadata request: the lines say whether a broker listed its APIs.
    with contextlib.suppress(KafkaException):
        in_slices(lambda wait: producer.list_topics(timeout=wait), timeout, stopped)
    producer.poll(0)  # serves the log lines
    keys = api_keys(lines.lines)
    return None if keys is None else CONSUMER_GROUP_HEARTBEAT in keys


def choose_protocol(
    cfg: ConsumerConfig, probe: ProtocolProbe | None, stopped: Callable[[], bool]
) -> ConsumerConfig:
    """`cfg` as the member runs it: for `group_protocol="auto"`, the protocol the broker offers
    (logged with why, and the settings that do not apply to it); any other `cfg` as it is.
    `stopped`: whether the member was asked to stop (the probe then gives up)."""
    if cfg.group_protocol != "auto":
        return cfg
    limit = min(cfg.startup_timeout_s, PROBE_LIMIT_S)
    offered = None if probe is None else probe(cfg.librdkafka_config(), limit, stopped)
    protocol: Literal["classic", "consumer"] = "consumer" if offered else "classic"
    if probe is None:
        reason = "the consumer_factory given is not asked: the classic protocol"
    elif offered is None:
        reason = f"no broker listed its APIs within {limit:g} s"
    elif offered:
        reason = "the broker offers ConsumerGroupHeartbeat (API key 68)"
    else:
        reason = "the broker does not offer ConsumerGroupHeartbeat (API key 68)"
    chosen, ignored = cfg.runs(protocol)
    log.info("group_protocol_chosen", protocol=protocol, reason=reason, ignored=ignored)
    return chosen


def warn_commit_blackout(cfg: ConsumerConfig) -> None:
    """A warning at start for a member whose commits a classic rebalance can hold for many
    commit intervals: the classic cooperative protocol, a dynamic member (no
    `group_instance_id`), a session timeout of at least `_BLACKOUT_INTERVALS` commit intervals,
    and commits of its own (a transactional member sends its offsets through its producer's
    connection, which no JoinGroup holds). Eager members revoke everything before they rejoin:
    nothing of theirs finishes behind the join."""
    if (
        cfg.group_protocol != "classic"
        or not cfg.incremental
        or cfg.group_instance_id is not None
        or cfg.transactional_id is not None
    ):
        return
    session = cfg.session_timeout_s or _CLIENT_SESSION_TIMEOUT_S
    if session < _BLACKOUT_INTERVALS * cfg.commit_interval_s:
        return
    log.warning(
        "classic_protocol_without_static_membership",
        session_timeout_s=session,
        commit_interval_s=cfg.commit_interval_s,
        reason="a member that dies and is restarted holds the others' commits for up to "
        "session_timeout_s (their JoinGroup waits for its old session): a kill in that time "
        "makes the next owners redo everything finished since, not one commit interval",
        remedy="group_instance_id (static membership), or group_protocol='auto' / 'consumer' "
        "where the broker offers KIP-848 (docs/rebalances.md)",
    )
