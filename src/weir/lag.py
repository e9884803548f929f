"""How far behind a consumer group is: its committed offsets against the partitions' log ends.

Read with confluent-kafka's AdminClient, so it works for any group (weir's or not) and joins
nothing. Used by ``weir lag`` / ``weir groups`` and by the test helper ``wait_for_committed``.

Committed offsets of known partitions are read with a consumer that joins nothing when the admin
client was made by ``admin_client`` (it keeps its configuration): librdkafka's admin
ListConsumerGroupOffsets kills the process (SIGSEGV) when the coordinator answers
NOT_COORDINATOR, as a group's coordinator may on first use after a broker start (librdkafka
issue 5040: its OffsetFetch handler asks the client's consumer-group object, which an admin client
has not, to look the coordinator up again). The consumer's own fetch retries that.
Every call takes one deadline for all its requests: a broker that does not answer costs the
caller ``timeout`` seconds, not one timeout per request. A broker that refuses the client's
credentials or TLS (`weir._engine.refusals`) ends the call as soon as no broker is left to try, with
``AuthenticationError`` or ``TlsError``, when the admin client was made by ``admin_client``:
the client reports those only to its error callback, while its requests just time out. A
request the broker's ACLs refuse is an ``AuthorizationError`` naming the group or topic the
client may not DESCRIBE. (Kafka leaves out of a group's committed offsets, and of the list of
groups, what the client may not describe, without a word: those cannot be named.)

Every failure is a ``weir.WeirError`` (catch that for "the lag could not be read"): a
``LagError`` for what the call found (``GroupNotFoundError``, ``TopicNotFoundError``, a
refused request), a ``BrokerUnreachableError`` when no broker answered in time, or its
``BrokerRefusedError`` (``AuthenticationError``, ``TlsError``, ``AuthorizationError``) when one
refused the client. They
are the classes of ``weir.errors``, importable from here too.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from weir.errors import (
    AuthenticationError,
    AuthorizationError,
    BrokerRefusedError,
    BrokerUnreachableError,
    GroupNotFoundError,
    LagError,
    TlsError,
    TopicNotFoundError,
    WeirError,
)

__all__ = [
    "AuthenticationError",
    "AuthorizationError",
    "BrokerRefusedError",
    "BrokerUnreachableError",
    "GroupLag",
    "GroupNotFoundError",
    "LagError",
    "PartitionLag",
    "TlsError",
    "TopicNotFoundError",
    "TopicPartitionKey",
    "admin_client",
    "all_groups_lag",
    "committed_as_text",
    "committed_offsets",
    "error_text",
    "group_lag",
    "lag_as_dict",
    "log_end_offsets",
    "topic_partitions",
]

if TYPE_CHECKING:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient

TopicPartitionKey = tuple[str, int]
# What the resource a request is about: ("group", id) or ("topic", name).
Subject = tuple[str, str]
_NEEDS = "reading a group's lag needs DESCRIBE on the group and on its topics"


def admin_client(config: Mapping[str, Any]) -> AdminClient:
    """An AdminClient for the functions here that keeps ``config``, so that committed offsets
    of known partitions are read with a consumer (see the module's doc), and records the
    errors its client reports, so that a refusal is named (an ``error_cb`` in ``config`` is
    still called)."""
    from confluent_kafka.admin import AdminClient

    class _ConfiguredAdmin(AdminClient):
        def __init__(self, config: Mapping[str, Any]) -> None:
            self.weir_client_config = dict(config)
            self.weir_errors: dict[str, tuple[str, str]] = {}
            super().__init__(_recording_errors(config, self.weir_errors))

    return _ConfiguredAdmin(config)


def _recording_errors(
    config: Mapping[str, Any], errors: dict[str, tuple[str, str]]
) -> dict[str, Any]:
    """`config` with an error callback that keeps each distinct error (code name and text, by
    cause) in `errors`, then calls the one `config` had. An `error_cb` that is no function is
    left for the client to refuse, as it refuses any bad setting."""
    from weir.logs import client_error_cause

    then = config.get("error_cb")
    if then is not None and not callable(then):
        return dict(config)

    def on_error(err: KafkaError) -> None:
        text = err.str()
        errors.setdefault(client_error_cause(text), (err.name(), text))
        if then is not None:
            then(err)

    return {**config, "error_cb": on_error}


# librdkafka's "nobody answered" codes: a timeout, a refused or dropped connection, no broker up,
# an address that does not resolve.
_UNREACHABLE = frozenset({"_TIMED_OUT", "_TRANSPORT", "_ALL_BROKERS_DOWN", "_RESOLVE"})


@dataclass(frozen=True)
class PartitionLag:
    """One partition as the group sees it. ``committed`` is None when the group committed
    nothing there; ``log_start``/``log_end`` are None when the partition's leader did not answer."""

    topic: str
    partition: int
    committed: int | None
    log_start: int | None
    log_end: int | None
    member_id: str | None = None
    client_id: str | None = None
    host: str | None = None

    @property
    def lag(self) -> int | None:
        """Records between the committed offset and the log end; from the log start when the
        group never committed here (what a consumer with auto.offset.reset=earliest would read)."""
        if self.log_end is None:
            return None
        if self.committed is not None:
            return self.log_end - self.committed
        if self.log_start is None:
            return None
        return self.log_end - self.log_start


@dataclass(frozen=True)
class GroupLag:
    """A group's state and the lag of every partition of every topic it consumes."""

    group_id: str
    state: str
    group_type: str
    simple: bool
    members: int
    partitions: tuple[PartitionLag, ...]

    @property
    def total_lag(self) -> int:
        return sum(p.lag or 0 for p in self.partitions)

    def topic_lag(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for p in self.partitions:
            totals[p.topic] = totals.get(p.topic, 0) + (p.lag or 0)
        return totals

    @property
    def hottest(self) -> PartitionLag | None:
        """The partition with the largest lag, if any partition lags at all."""
        lagging = [p for p in self.partitions if (p.lag or 0) > 0]
        return max(lagging, key=lambda p: p.lag or 0, default=None)


# --- reading -------------------------------------------------------------------------------------


# How often a wait for an answer serves the client's error callback to look for a refusal.
_REFUSAL_CHECK_S = 0.2


class _Deadline:
    """One call's deadline, and the client whose refusals end it early."""

    def __init__(self, timeout: float, admin: AdminClient | None = None) -> None:
        self.timeout = timeout
        self.end = time.monotonic() + timeout
        self._admin = admin
        # The admin client's own record when it keeps one (an empty dict is falsy: not `or`),
        # emptied: an earlier call's refusal must not outlive the broker's change of mind.
        recorded = getattr(admin, "weir_errors", None)
        self.errors: dict[str, tuple[str, str]] = {} if recorded is None else recorded
        self.errors.clear()

    def remaining(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise self.unreachable()
        return left

    def unreachable(self, reason: str = "") -> BrokerUnreachableError:
        """What "no answer in time" means: a refusal the client reported, or one it could not
        report (`sasl_expected`), else unreachable."""
        from weir._engine.refusals import closed_unasked, sasl_expected

        refused = self.refused()
        if refused is None and closed_unasked(self.errors):
            refused = sasl_expected(getattr(self._admin, "weir_client_config", {}))
        return refused if refused is not None else _unreachable(self.timeout, reason)

    def refused(self) -> BrokerRefusedError | None:
        from weir._engine.refusals import refusal_error, startup_refusal

        if self._admin is not None:
            self._admin.poll(0)  # serves the error callback
        refusal = startup_refusal(self.errors)
        if refusal is None:
            return None
        return refusal_error(refusal, getattr(self._admin, "weir_client_config", {}))


def _unreachable(timeout: float, reason: str = "") -> BrokerUnreachableError:
    reason = reason or "no answer"
    return BrokerUnreachableError(
        f"no broker answered within {timeout:g} s ({reason})", timeout=timeout, reason=reason
    )


def group_lag(
    admin: AdminClient,
    group_id: str,
    *,
    topics: Sequence[str] | None = None,
    timeout: float = 10.0,
) -> GroupLag:
    """The lag of ``group_id`` on ``topics`` (default: every topic it committed to or is assigned).

    Every partition of those topics is listed, also those the group never committed to.
    Raises ``GroupNotFoundError`` for a group Kafka does not know, ``TopicNotFoundError`` for a
    missing topic in ``topics``, ``BrokerUnreachableError`` when nothing answers in ``timeout``.
    """
    deadline = _Deadline(timeout, admin)
    lags = _groups_lag(admin, [group_id], topics, deadline)
    lag = lags[group_id]
    if (
        lag.state in ("dead", "unknown")
        and lag.members == 0
        and not any(p.committed is not None for p in lag.partitions)
    ):
        raise GroupNotFoundError(
            f"group {group_id!r} does not exist: no members and no committed offsets"
        )
    return lag


def all_groups_lag(admin: AdminClient, *, timeout: float = 10.0) -> list[GroupLag]:
    """Every group the cluster knows, with its lag, sorted by group id."""
    deadline = _Deadline(timeout, admin)
    listing = _result(admin.list_consumer_groups(request_timeout=deadline.remaining()), deadline)
    errors = list(listing.errors or ())
    if errors and not listing.valid:
        raise _as_lag_error(errors[0], deadline)
    ids = sorted(group.group_id for group in listing.valid)
    if not ids:
        return []
    lags = _groups_lag(admin, ids, None, deadline)
    return [lags[group_id] for group_id in ids]


def committed_offsets(
    admin: AdminClient,
    group_id: str,
    partitions: Iterable[TopicPartitionKey] | None = None,
    *,
    timeout: float = 10.0,
) -> dict[TopicPartitionKey, int | None]:
    """The group's committed offsets (None: nothing committed), for ``partitions`` or for every
    partition the group committed to."""
    return _committed(admin, [group_id], partitions, _Deadline(timeout, admin))[group_id]


def log_end_offsets(
    admin: AdminClient, partitions: Iterable[TopicPartitionKey], *, timeout: float = 10.0
) -> dict[TopicPartitionKey, int]:
    """Each partition's log end offset (the high watermark)."""
    ends = _log_offsets(admin, list(partitions), _offset_spec("latest"), _Deadline(timeout, admin))
    return {key: value for key, value in ends.items() if value is not None}


def topic_partitions(
    admin: AdminClient, topic: str, *, timeout: float = 10.0
) -> list[TopicPartitionKey]:
    """Every partition of ``topic``; ``TopicNotFoundError`` if it does not exist."""
    return _partitions(admin, [topic], _Deadline(timeout, admin))[topic]


def _groups_lag(
    admin: AdminClient,
    group_ids: list[str],
    topics: Sequence[str] | None,
    deadline: _Deadline,
) -> dict[str, GroupLag]:
    descriptions = _describe(admin, group_ids, deadline)
    committed = _committed(admin, group_ids, None, deadline)
    owners: dict[str, dict[TopicPartitionKey, Any]] = {
        group_id: {
            (tp.topic, tp.partition): member
            for member in description.members
            for tp in member.assignment.topic_partitions
        }
        for group_id, description in descriptions.items()
    }
    wanted: dict[str, list[str]] = {}
    for group_id in group_ids:
        if topics is not None:
            wanted[group_id] = list(dict.fromkeys(topics))
        else:
            touched = {topic for topic, _ in committed[group_id]} | {
                topic for topic, _ in owners[group_id]
            }
            wanted[group_id] = sorted(touched)
    all_topics = sorted({topic for names in wanted.values() for topic in names})
    # A topic the group committed to may have been deleted since: only asked-for topics must exist.
    partitions = _partitions(admin, all_topics, deadline, missing_ok=topics is None)
    every = sorted({key for names in partitions.values() for key in names})
    ends = _log_offsets(admin, every, _offset_spec("latest"), deadline)
    starts = _log_offsets(admin, every, _offset_spec("earliest"), deadline)

    lags: dict[str, GroupLag] = {}
    for group_id in group_ids:
        description = descriptions[group_id]
        keys = [key for topic in wanted[group_id] for key in partitions.get(topic, [])]
        # Committed offsets of deleted topics still show, with unknown log offsets.
        if topics is None:
            keys += [key for key in committed[group_id] if key[0] not in partitions]
        rows = []
        for key in sorted(set(keys)):
            owner = owners[group_id].get(key)
            rows.append(
                PartitionLag(
                    topic=key[0],
                    partition=key[1],
                    committed=committed[group_id].get(key),
                    log_start=starts.get(key),
                    log_end=ends.get(key),
                    member_id=owner.member_id if owner is not None else None,
                    client_id=owner.client_id if owner is not None else None,
                    host=owner.host if owner is not None else None,
                )
            )
        lags[group_id] = GroupLag(
            group_id=group_id,
            state=_enum_name(getattr(description, "state", None)),
            group_type=_enum_name(getattr(description, "type", None)),
            simple=bool(description.is_simple_consumer_group),
            members=len(description.members),
            partitions=tuple(rows),
        )
    return lags


# A group's coordinator is not ready yet: on a new cluster the first group call creates
# __consumer_offsets, and a coordinator that moved or is loading answers these for a while.
# (Also what `weir.testing.commit_offsets` asks again on.)
_COORDINATOR_NOT_READY = frozenset(
    {"NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE"}
)
_COORDINATOR_RETRY_S = 0.2


def _describe(admin: AdminClient, group_ids: list[str], deadline: _Deadline) -> dict[str, Any]:
    found: dict[str, Any] = {}
    asked = list(group_ids)
    while asked:
        futures = admin.describe_consumer_groups(asked, request_timeout=deadline.remaining())
        again = []
        for group_id, future in futures.items():
            try:
                found[group_id] = _result(future, deadline, ("group", group_id))
            except LagError as exc:
                code = _code(exc.__cause__)
                if code == "GROUP_ID_NOT_FOUND":
                    raise GroupNotFoundError(f"group {group_id!r} does not exist") from exc
                if code not in _COORDINATOR_NOT_READY or deadline.end - time.monotonic() < 1:
                    raise
                again.append(group_id)
        if again:
            time.sleep(_COORDINATOR_RETRY_S)
        asked = again
    return found


def _committed(
    admin: AdminClient,
    group_ids: list[str],
    partitions: Iterable[TopicPartitionKey] | None,
    deadline: _Deadline,
) -> dict[str, dict[TopicPartitionKey, int | None]]:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    asked = None if partitions is None else [TopicPartition(t, p) for t, p in partitions]
    config = getattr(admin, "weir_client_config", None)
    if asked is not None and config is not None:
        return {g: _committed_by_consumer(config, g, asked, deadline) for g in group_ids}
    # The API takes one group per request: send them all, then collect.
    futures = {
        group_id: admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group_id, asked)],
            request_timeout=deadline.remaining(),
        )[group_id]
        for group_id in group_ids
    }
    out: dict[str, dict[TopicPartitionKey, int | None]] = {}
    for group_id, future in futures.items():
        found = _result(future, deadline, ("group", group_id))
        out[group_id] = _offsets_of(found.topic_partitions or ())
    return out


def _committed_by_consumer(
    config: Mapping[str, Any], group_id: str, asked: list[Any], deadline: _Deadline
) -> dict[TopicPartitionKey, int | None]:
    return _offsets_of(_committed_partitions(config, group_id, asked, deadline))


def _committed_partitions(
    config: Mapping[str, Any], group_id: str, asked: list[Any], deadline: _Deadline
) -> list[Any]:
    """The group's committed ``TopicPartition``s of ``asked`` (offset and metadata), read by a
    consumer that never subscribes (it joins nothing). read_uncommitted: the broker answers
    with the last committed offset at once instead of waiting while a transaction holds a
    newer one."""
    from confluent_kafka import Consumer

    try:
        # A setting the admin client took can still be refused for a consumer (e.g.
        # session.timeout.ms with group.protocol=consumer).
        consumer = Consumer(
            _recording_errors(
                {
                    **config,
                    "group.id": group_id,
                    "enable.auto.commit": False,
                    "isolation.level": "read_uncommitted",
                },
                deadline.errors,
            )
        )
    except Exception as exc:
        raise LagError(f"a consumer refuses the client's configuration: {error_text(exc)}") from exc
    try:
        found = consumer.committed(asked, timeout=deadline.remaining())
    except Exception as exc:
        consumer.poll(0)  # serves the error callback: a refusal is named
        raise _as_lag_error(exc, deadline, ("group", group_id)) from exc
    finally:
        consumer.close()
    return list(found)


def _offsets_of(found: Iterable[Any]) -> dict[TopicPartitionKey, int | None]:
    """Committed offsets as read (None: nothing committed); a partition's error raises."""
    offsets: dict[TopicPartitionKey, int | None] = {}
    for tp in found:
        if tp.error is not None:
            raise LagError(f"committed offset of {tp.topic}[{tp.partition}]: {tp.error}")
        offsets[(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else None
    return offsets


def _partitions(
    admin: AdminClient, topics: list[str], deadline: _Deadline, *, missing_ok: bool = False
) -> dict[str, list[TopicPartitionKey]]:
    if not topics:
        return {}
    try:
        metadata = admin.list_topics(timeout=deadline.remaining())
    except Exception as exc:
        raise _as_lag_error(exc, deadline) from exc
    # A topic the client may not describe is left out of the listing of all topics, as a
    # missing one is: asked for by name, Kafka says which it is.
    from weir._engine.refusals import Denied, authorization_error, denied_topics

    hidden = denied_topics(admin, topics, metadata, deadline.remaining())
    if hidden:
        denied = Denied("topic", hidden[0], "DESCRIBE", "TOPIC_AUTHORIZATION_FAILED")
        raise authorization_error(
            denied,
            "Kafka says so also of a topic that does not exist, to a client that may not "
            "describe it",
            _NEEDS,
        )
    out: dict[str, list[TopicPartitionKey]] = {}
    for topic in topics:
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            if missing_ok:
                continue
            raise TopicNotFoundError(f"topic {topic!r} does not exist")
        out[topic] = [(topic, p) for p in sorted(found.partitions)]
    return out


def _log_offsets(
    admin: AdminClient, keys: list[TopicPartitionKey], spec: Any, deadline: _Deadline
) -> dict[TopicPartitionKey, int | None]:
    from confluent_kafka import TopicPartition

    if not keys:
        return {}
    futures = admin.list_offsets(
        {TopicPartition(t, p): spec for t, p in keys}, request_timeout=deadline.remaining()
    )
    out: dict[TopicPartitionKey, int | None] = {}
    for tp, future in futures.items():
        try:
            out[(tp.topic, tp.partition)] = _result(future, deadline, ("topic", tp.topic)).offset
        except LagError:
            out[(tp.topic, tp.partition)] = None  # e.g. no leader right now: shown as unknown
    return out


def _offset_spec(which: str) -> Any:
    from confluent_kafka.admin import OffsetSpec

    if which == "latest":
        return OffsetSpec.latest()  # type: ignore[no-untyped-call]
    return OffsetSpec.earliest()  # type: ignore[no-untyped-call]


def _result(
    future: concurrent.futures.Future[Any],
    deadline: _Deadline,
    subject: Subject | None = None,
    *,
    asking: tuple[str, str] = ("DESCRIBE", _NEEDS),
) -> Any:
    # The request carries the timeout; the extra second lets its own error arrive first.
    end = deadline.end + 1.0
    while True:
        left = end - time.monotonic()
        try:
            return future.result(timeout=max(0.0, min(_REFUSAL_CHECK_S, left)))
        except concurrent.futures.TimeoutError as exc:
            refused = deadline.refused()
            if refused is not None:
                raise refused from exc
            if left <= _REFUSAL_CHECK_S:
                raise deadline.unreachable() from exc
        except Exception as exc:
            raise _as_lag_error(exc, deadline, subject, asking=asking) from exc


def _as_lag_error(
    exc: Any,
    deadline: _Deadline,
    subject: Subject | None = None,
    *,
    asking: tuple[str, str] = ("DESCRIBE", _NEEDS),
) -> WeirError:
    """`exc` as the error of a call about `subject` (an ACL refusal names it, and what the
    request needs: `asking` is the operation and a sentence saying what it takes)."""
    from weir._engine.refusals import authorization_error, denied_of

    if isinstance(exc, WeirError):
        return exc
    code = _code(exc)
    text = error_text(exc)
    if code in _UNREACHABLE:
        return deadline.unreachable(text)
    kind, name = subject or ("", "")
    operation, needs = asking
    denied = denied_of(
        code or "",
        operation,
        topic=name if kind == "topic" else None,
        group=name if kind == "group" else None,
    )
    if denied is not None:
        return authorization_error(denied, text, needs)
    return LagError(f"{code or type(exc).__name__}: {text}")


def error_text(exc: Any) -> str:
    """The words of a KafkaException (its KafkaError's), a KafkaError, or any exception."""
    error = exc.args[0] if isinstance(exc, Exception) and exc.args else exc
    return str(error.str()) if hasattr(error, "str") else str(error)


def _code(exc: Any) -> str | None:
    """The KafkaError code name of a KafkaException (or KafkaError), else None."""
    error = exc.args[0] if isinstance(exc, Exception) and exc.args else exc
    name = getattr(error, "name", None)
    return str(name()) if callable(name) else None


def _enum_name(value: Any) -> str:
    name = getattr(value, "name", None)
    return str(name).lower() if name is not None else "unknown"


def lag_as_dict(lag: GroupLag) -> dict[str, Any]:
    """A JSON-ready view with stable keys (absent values are null, never missing)."""
    hottest = lag.hottest
    return {
        "group": lag.group_id,
        "state": lag.state,
        "type": lag.group_type,
        "simple": lag.simple,
        "members": lag.members,
        "total_lag": lag.total_lag,
        "topics": lag.topic_lag(),
        "hottest": None
        if hottest is None
        else {"topic": hottest.topic, "partition": hottest.partition, "lag": hottest.lag},
        "partitions": [
            {
                "topic": p.topic,
                "partition": p.partition,
                "committed": p.committed,
                "log_start": p.log_start,
                "log_end": p.log_end,
                "lag": p.lag,
                "member_id": p.member_id,
                "client_id": p.client_id,
                "host": p.host,
            }
            for p in lag.partitions
        ],
    }


def committed_as_text(offsets: Mapping[int, int | None]) -> str:
    """``{0: 5, 1: -}``: a committed-offset map for messages ("-" for nothing committed)."""
    return (
        "{" + ", ".join(f"{p}: {'-' if o is None else o}" for p, o in sorted(offsets.items())) + "}"
    )
