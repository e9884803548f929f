"""The client's errors: what they mean for the member, said once, counted after.

librdkafka reports errors through `error_cb` (served inside the owner's consume) and inside
consumed messages. Here each is classified: fatal (the member stops), every broker down
(readiness, `Lifecycle.brokers_down`), a broker refusing the client (authentication, TLS), its
ACLs refusing the member's group or topic (before the member's first assignment its start
fails with `AuthorizationError`; after it the member is not ready until the refusal ends, as
for the refusals of commits and dead letters the engine hands to `refused`), an offset reset
the application forbade (`OffsetResetError`), or one of the errors the client retries by
itself. The first of a run of the same error is logged, the rest counted
(`Repeats`): a broker that is down repeats its refusal every 50 ms. `check_reachable` waits
for a broker at start and names why none answered.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from weir._engine.client import ConsumerClient, KafkaMessage
from weir._engine.lifecycle import Lifecycle
from weir._engine.refusals import (
    ALL_BROKERS_DOWN_CODE,
    MEMBER_NEEDS,
    Denied,
    authorization_error,
    closed_unasked,
    denied_of,
    denied_topics,
    refusal_error,
    refusal_of,
    sasl_expected,
    startup_refusal,
    topics_denied_error,
)
from weir.config import ConsumerConfig
from weir.errors import BrokerUnreachableError, KafkaFatalError, OffsetResetError
from weir.logs import (
    Burst,
    Repeats,
    client_error_cause,
    get_logger,
    timestamp,
    without_retry_details,
)
from weir.records import CommitEvent, Partition

__all__ = ["ClientErrors"]

log = get_logger(__name__)

# While waiting for a broker at start, the longest metadata request before the client's queue is
# served: its errors and log lines are handled within this long of happening.
_STARTUP_SLICE = 0.25
# How many of the client's distinct errors a BrokerUnreachableError names.
_CAUSES = 3


class ClientErrors:
    """Owner thread only (the client's callbacks run there)."""

    def __init__(self, cfg: ConsumerConfig, life: Lifecycle, repeats: Repeats) -> None:
        self._cfg = cfg
        self._life = life
        self._repeats = repeats
        # What the client's errors said while `check_reachable` waited (None otherwise).
        self._causes: dict[str, tuple[str, str]] | None = None

    def check_reachable(self, client: ConsumerClient) -> Any:
        """Wait up to startup_timeout_s for a broker to answer a metadata request.

        The wait is cut into short requests with the client's queue served in between, so its
        errors and log lines are handled when they happen rather than all at once at close,
        and the error names what they said (a name that does not resolve, a refused
        connection) instead of the metadata request's "Broker transport failure". A broker
        that refused the client's credentials or its TLS ends the wait as soon as no broker is
        left to try, with `AuthenticationError` or `TlsError`: waiting longer changes nothing.
        A named topic the broker's ACLs hide from the client is an `AuthorizationError`.
        A stop request (a signal, `stop()`) ends the wait within a slice: None, nothing
        answered and nothing is wrong, the member stops as asked.
        """
        timeout = self._cfg.startup_timeout_s
        deadline = time.monotonic() + timeout
        self._causes = {}
        try:
            while True:
                began = time.monotonic()
                wait = max(min(_STARTUP_SLICE, deadline - began), 0.001)
                try:
                    meta = client.list_topics(timeout=wait)
                except KafkaException as exc:
                    failed = exc
                else:
                    cfg = self._cfg
                    left = max(deadline - time.monotonic(), _STARTUP_SLICE)
                    denied = denied_topics(client, cfg.topics, meta, left)
                    if denied:
                        raise topics_denied_error(denied, cfg.group_id)
                    return meta
                # Nothing is subscribed yet: this only serves error_cb and the log lines.
                client.consume(1, 0)
                if self._life.failure is not None:
                    raise self._life.failure  # a fatal client error (on_error)
                if self._life.stop_requested.is_set():
                    return None
                refusal = startup_refusal(self._causes)
                now = time.monotonic()
                # A request that failed before its time was refused, not left unanswered.
                if refusal is not None or now >= deadline or now - began < wait / 2:
                    break
            causes = [
                cause for cause, (code, _) in self._causes.items() if code != ALL_BROKERS_DOWN_CODE
            ][:_CAUSES]
            closed = closed_unasked(self._causes)
        finally:
            self._causes = None
        conf = self._cfg.librdkafka_config()
        if refusal is not None:
            raise refusal_error(refusal, conf) from None
        # A broker that closed the connection unasked is only logged, or said as a send that
        # failed on the closed socket, whichever comes first: ask the broker.
        sasl = sasl_expected(conf) if closed else None
        if sasl is not None:
            raise sasl from None
        # One error, not a chain: the metadata request's own ("Broker transport failure") is
        # only the fallback, for when the client said nothing more.
        error = failed.args[0] if failed.args else failed
        said = error.str() if isinstance(error, KafkaError) else str(error)
        raise BrokerUnreachableError(
            f"no Kafka broker answered at {self._cfg.bootstrap_servers!r} within "
            f"{timeout:g}s (startup_timeout_s): {'; '.join(causes) or said}"
        ) from None

    def on_error(self, err: KafkaError) -> None:
        code, text = err.code(), err.str()
        if self._causes is not None:
            self._causes.setdefault(client_error_cause(text), (err.name(), text))
        refused = refusal_of(err.name(), text)
        if self._authorization(err, None):
            pass
        elif err.fatal():
            log.error("kafka_fatal_error", code=err.name(), error=text)
            self._life.fail(KafkaFatalError(str(err) + _protocol_hint(text)))
        elif code == KafkaError._ALL_BROKERS_DOWN:
            self._life.brokers_down(time.monotonic())
            if self._first("all_brokers_down", err):
                log.error("all_brokers_down", code=err.name(), error=text)
        elif refused is not None:
            # Retried by the client, but into success only once its settings or the broker's
            # change: an error, not a warning.
            authentication = refused.kind == "authentication"
            if self._first(
                "kafka_authentication_failed" if authentication else "kafka_tls_failed", err
            ):
                log.error(
                    "kafka_authentication_failed" if authentication else "kafka_tls_failed",
                    code=err.name(),
                    error=text,
                )
        elif self._first("kafka_error", err):
            log.warning("kafka_error", code=err.name(), error=text)

    # -- the broker's ACLs ---------------------------------------------------------------------

    def _authorization(self, err: KafkaError, topic: str | None) -> bool:
        """An ACL refusal of the consumer's requests (the group's, or a fetch of `topic`):
        before the member's first assignment its start fails, after it the member lives with
        it. False for any other error."""
        denied = denied_of(err.name(), "READ", topic=topic, group=self._cfg.group_id)
        if denied is None:
            return False
        if self._life.ever_joined:
            self.refused(denied, err.str())
            return True
        error = authorization_error(
            denied, client_error_cause(err.str()), MEMBER_NEEDS.format(group=self._cfg.group_id)
        )
        if self._life.fail(error):
            _log_refused(denied, err.str(), running=False)
        return True

    def refused(self, denied: Denied, error: str) -> None:
        """The broker's ACLs refused `denied` while the member runs (a fetch, a commit, a dead
        letter): logged at its first time (repeats counted), not ready until `allowed`."""
        self._life.refuse(denied, time.monotonic())
        key = ("kafka_authorization_failed", denied.code, str(denied))
        if self._repeats.seen(key, self._repeated):
            _log_refused(denied, error, running=True)

    def fetched(self, topic: str) -> None:
        """A record of `topic` was fetched: a refusal to read it has ended."""
        if self._life.refusals:
            self.allowed(_reading(topic))

    def commit_result(self, event: CommitEvent) -> None:
        """A commit's result: refused by the ACLs (the group's READ, or the topic's), or done,
        which ends a refusal of the group and of reading its topic."""
        if event.status == "failed" and event.code is not None:
            group = self._cfg.group_id
            denied = denied_of(event.code, "READ", topic=event.tp.topic, group=group)
            if denied is not None:
                self.refused(denied, event.error or event.code)
        elif event.status == "committed" and self._life.refusals:
            reading = _reading(event.tp.topic)
            self.allowed(lambda d: d.resource_type == "group" or reading(d))

    def allowed(self, match: Callable[[Denied], bool], *, asked: bool = True) -> None:
        """What the broker refused and `match` names was done since: the refusal has ended
        (logged). `asked=False`: nothing asks for it any more (the records a dead letter held
        were revoked or skipped): it ends unlogged, the ACL is no less missing."""
        if not self._life.refusals:
            return
        ended = self._life.allow(match, time.monotonic())
        if not asked:
            return
        for denied, seconds in ended.items():
            log.info(
                "kafka_authorization_allowed",
                resource_type=denied.resource_type,
                resource=denied.resource,
                operation=denied.operation,
                refused_s=round(seconds, 3),
            )

    def _first(self, event: str, err: KafkaError) -> bool:
        """Whether `err` is the first of a run of the same error (log it); later ones are
        counted and reported by `_repeated`."""
        text, suppressed = without_retry_details(err.str())
        return self._repeats.seen((event, err.name(), text), self._repeated, 1 + suppressed)

    def _repeated(self, key: object, burst: Burst, ongoing: bool) -> None:
        assert isinstance(key, tuple)
        event, code, text = key
        log.warning(
            "error_repeated",
            of=event,
            code=code,
            error=text,
            count=burst.count,
            first=timestamp(burst.first),
            last=timestamp(burst.last),
            ongoing=ongoing,
        )

    def on_message_error(self, err: KafkaError, msg: KafkaMessage) -> None:
        if self._authorization(err, msg.topic()):
            return
        if err.fatal():
            self.on_error(err)
        elif err.code() == KafkaError._MAX_POLL_EXCEEDED:
            log.error("max_poll_interval_exceeded", code=err.name(), error=err.str())
        elif err.code() == KafkaError._AUTO_OFFSET_RESET:
            # auto_offset_reset="error" and no valid committed offset: nothing can be read
            # without a decision the application made not to let weir take.
            topic, partition = msg.topic(), msg.partition()
            tp = None if topic is None or partition is None else Partition(topic, partition)
            failure = self._life.failure
            if isinstance(failure, OffsetResetError):
                failure.add(tp)
            elif self._life.fail(OffsetResetError(err.str(), tp)):
                log.error("offset_reset_failed", tp=str(tp), error=err.str())
        elif self._first("consume_error", err):
            log.warning("consume_error", code=err.name(), error=err.str())


def _protocol_hint(text: str) -> str:
    """What to do when the broker refuses KIP-848's heartbeat: a Kafka 4 broker lists the API
    even with the consumer protocol turned off, so `group_protocol="auto"` can choose it."""
    if "ConsumerGroupHeartbeat" not in text:
        return ""
    return (
        ": the broker refuses the consumer group protocol (KIP-848), though it may list its "
        "API; set group_protocol='classic', or enable it on the broker "
        "(group.coordinator.rebalance.protocols, the group.version feature)"
    )


def _log_refused(denied: Denied, error: str, *, running: bool) -> None:
    log.error(
        "kafka_authorization_failed",
        resource_type=denied.resource_type,
        resource=denied.resource,
        operation=denied.operation,
        code=denied.code,
        error=error,
        running=running,
    )


def _reading(topic: str) -> Callable[[Denied], bool]:
    """Whether a refusal is of reading `topic` (ended by a record of it fetched, or committed)."""
    return lambda d: d.resource_type == "topic" and d.operation == "READ" and d.resource == topic
