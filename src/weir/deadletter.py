"""Dead letters: a failed record written to a dead-letter topic, confirmed before it counts.

The record's original key, value and headers go to the dead-letter topic (`<topic>.dlq` unless
configured), with headers saying where it came from and why (`HEADERS`). The producer is
idempotent with `acks=all`, owned by the owner thread (its delivery callbacks are served by
`poll`/`flush` there), and never creates topics by itself: a dead-letter topic deleted while
the member runs makes the write fail, and the partition blocks rather than skips.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from weir.client import ProducerClient, ProducerFactory
from weir.config import ConsumerConfig
from weir.errors import WeirError
from weir.logs import get_logger
from weir.records import Record

__all__ = ["HEADERS", "DeadLetterError", "DeadLetters", "shared_settings"]

log = get_logger(__name__)

# The headers a dead letter carries besides the record's own (values are UTF-8 text).
HEADERS = (
    "weir.dlq.topic",
    "weir.dlq.partition",
    "weir.dlq.offset",
    "weir.dlq.timestamp",  # the record's timestamp, ms since the epoch ("" if it had none)
    "weir.dlq.attempts",
    "weir.dlq.exception",  # the exception's type, module-qualified
    "weir.dlq.message",  # str(exception), cut to FailurePolicy.max_error_chars
    "weir.dlq.group",
    "weir.dlq.failed_at",  # when the last attempt failed, ms since the epoch
)

# librdkafka settings of the consumer that the producer shares: how to reach and authenticate
# with the cluster. Consumer-only settings would only make the producer log warnings.
_SHARED_PREFIXES = (
    "security.",
    "ssl.",
    "ssl_",
    "sasl.",
    "client.",
    "socket.",
    "broker.",
    "reconnect.",
    "connections.",
    "metadata.",
    "api.version",
    "enable.ssl",
    "resolve.",
    "client.dns",
)
# With no write pending the producer is still served this often: its log lines (a broker
# outage) reach the logger within a second, without a call that lets go of the interpreter
# lock at every turn of the owner loop.
_SERVE_EVERY_S = 1.0


def shared_settings(cfg: ConsumerConfig, logger: object | None = None) -> dict[str, Any]:
    """The consumer's librdkafka settings a producer of the same member shares: how to reach
    and authenticate with the cluster (consumer-only settings would only make it warn), and
    the member's `logger` for librdkafka's lines (weir.librdkafka)."""
    conf = {k: v for k, v in cfg.librdkafka_config().items() if k.startswith(_SHARED_PREFIXES)}
    if logger is not None:
        conf["logger"] = logger
    return conf


Result = Callable[[str | None], None]
"""Called on the owner thread with None once the broker confirmed the write, else the error."""


class DeadLetterError(WeirError):
    """A dead-letter topic is missing and could not be created (checked at start)."""


class DeadLetters:
    """Owner thread only."""

    def __init__(
        self,
        cfg: ConsumerConfig,
        factory: ProducerFactory,
        admin_factory: Callable[[dict[str, Any]], Any] | None = None,
        logger: object | None = None,
    ) -> None:
        self._cfg = cfg
        self._factory = factory
        self._logger = logger
        self._admin_factory = admin_factory
        self._producer: ProducerClient | None = None
        # Dead-letter topics known to exist: those of the named topics are checked at start,
        # those of topics a regex subscription matched before their first dead letter.
        self._checked: set[str] = set()
        self.pending = 0
        self.written = 0
        self._next_serve = 0.0
        self._closed = False

    def producer_config(self) -> dict[str, Any]:
        cfg = self._cfg
        # The member's logger too: its librdkafka lines go to weir.librdkafka, not stderr.
        conf = shared_settings(cfg, self._logger)
        timeout_ms = max(1, round(cfg.failure.dead_letter_timeout_s * 1000))
        conf.update(
            {
                "bootstrap.servers": cfg.bootstrap_servers,
                "enable.idempotence": True,
                "acks": "all",
                # A dead letter is one record, written when a record gave up: no batching wait.
                "linger.ms": 0,
                "message.timeout.ms": timeout_ms,
                "request.timeout.ms": min(30_000, timeout_ms),
                # A deleted dead-letter topic must fail the write (the partition blocks), not
                # come back with the broker's default settings.
                "allow.auto.create.topics": False,
            }
        )
        return conf

    def start(self, topics: Iterable[str], partitions: Mapping[str, int]) -> None:
        """Build the producer and make sure the dead-letter topics of `topics` exist: created
        with their source topic's partition count when allowed, else a `DeadLetterError`."""
        self._producer = self._factory(self.producer_config())
        timeout = self._cfg.startup_timeout_s
        missing: dict[str, int] = {}
        for topic in topics:
            policy = self._cfg.policy_for(topic)
            dlq = policy.dead_letter_for(topic)
            if self._exists(dlq, timeout):
                self._checked.add(dlq)
                continue
            if not policy.create_dead_letter_topic:
                raise DeadLetterError(
                    f"dead-letter topic {dlq!r} of {topic!r} does not exist "
                    "(create_dead_letter_topic=False)"
                )
            missing[dlq] = partitions.get(topic, 1)
        if missing:
            self._create(missing, timeout)
            self._checked.update(missing)

    def _ensure(self, source: str, dlq: str) -> str | None:
        """Make sure of a dead-letter topic not checked at start (that of a topic a regex
        subscription matched) before its first dead letter: without it, the producer (which
        never creates topics) would time out on every write, and the partition block for good.
        Blocks the owner thread, once per topic, for a metadata request and, if needed, a topic
        creation, within `dead_letter_timeout_s`. Returns the error, or None."""
        policy = self._cfg.policy_for(source)
        timeout = self._cfg.failure.dead_letter_timeout_s
        try:
            if not self._exists(dlq, timeout):
                if not policy.create_dead_letter_topic:
                    return (
                        f"dead-letter topic {dlq!r} of {source!r} does not exist "
                        "(create_dead_letter_topic=False)"
                    )
                self._create({dlq: self._partitions(source, timeout)}, timeout)
        except DeadLetterError as exc:
            return str(exc)
        self._checked.add(dlq)
        return None

    def _exists(self, topic: str, timeout: float) -> bool:
        assert self._producer is not None
        try:
            meta = self._producer.list_topics(topic, timeout=timeout)
        except KafkaException as exc:
            raise DeadLetterError(f"could not look up dead-letter topic {topic!r}: {exc}") from exc
        found = meta.topics.get(topic)
        return found is not None and found.error is None

    def _partitions(self, topic: str, timeout: float) -> int:
        """The partition count of a source topic (1 if it cannot be read)."""
        assert self._producer is not None
        try:
            found = self._producer.list_topics(topic, timeout=timeout).topics.get(topic)
        except KafkaException:
            return 1
        return len(found.partitions) if found is not None and found.partitions else 1

    def _create(self, topics: Mapping[str, int], timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        conf = shared_settings(self._cfg, self._logger)
        conf["bootstrap.servers"] = self._cfg.bootstrap_servers
        admin = (self._admin_factory or AdminClient)(conf)
        try:
            self._create_with(admin, topics, timeout)
        finally:
            admin.poll(0)  # an admin client hands its log lines over in poll() only

    def _create_with(self, admin: Any, topics: Mapping[str, int], timeout: float) -> None:
        from confluent_kafka.cimpl import NewTopic

        futures = admin.create_topics(
            [NewTopic(t, num_partitions=n, replication_factor=-1) for t, n in topics.items()],
            operation_timeout=timeout,
            request_timeout=timeout,
        )
        for topic, future in futures.items():
            try:
                future.result(timeout=timeout)
            except FutureTimeout:
                raise DeadLetterError(
                    f"dead-letter topic {topic!r} is missing and was not created within "
                    f"{timeout:g}s"
                ) from None
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue
                raise DeadLetterError(
                    f"dead-letter topic {topic!r} is missing and could not be created: {exc}"
                ) from exc
            log.info("dead_letter_topic_created", topic=topic, partitions=topics[topic])

    def send(
        self,
        record: Record,
        attempts: int,
        error: BaseException,
        failed_at: float,
        done: Result,
    ) -> None:
        """Write `record` to its dead-letter topic (`failed_at`: when its last attempt failed,
        `time.time()`); `done` gets the outcome on a later `poll` (or at once, with the error,
        if the client refused the write)."""
        assert self._producer is not None, "start() first"
        policy = self._cfg.policy_for(record.topic)
        topic = policy.dead_letter_for(record.topic)
        if topic not in self._checked:
            problem = self._ensure(record.topic, topic)
            if problem is not None:
                done(problem)
                return
        message = str(error)
        if len(message) > policy.max_error_chars:
            message = message[: policy.max_error_chars - 1] + "…"
        kind = type(error)
        extra = {
            "weir.dlq.topic": record.topic,
            "weir.dlq.partition": str(record.partition),
            "weir.dlq.offset": str(record.offset),
            "weir.dlq.timestamp": "" if record.timestamp is None else str(record.timestamp),
            "weir.dlq.attempts": str(attempts),
            "weir.dlq.exception": f"{kind.__module__}.{kind.__qualname__}",
            "weir.dlq.message": message,
            "weir.dlq.group": self._cfg.group_id,
            "weir.dlq.failed_at": str(int(failed_at * 1000)),
        }
        headers = [*record.headers, *((k, v.encode()) for k, v in extra.items())]

        def delivered(err: KafkaError | None, msg: Any) -> None:
            if self._closed:
                return  # served by close(): the member has stopped, its commit is done
            self.pending -= 1
            if err is None:
                self.written += 1
                done(None)
            else:
                done(str(err))

        try:
            self._producer.produce(
                topic, record.value, record.key, headers=headers, on_delivery=delivered
            )
        except (KafkaException, BufferError) as exc:
            done(str(exc.args[0] if exc.args else exc))
            return
        self.pending += 1

    def poll(self) -> None:
        """Serve delivery results (owner thread, every turn) and the producer's log lines
        (librdkafka queues them until the producer is polled)."""
        producer = self._producer
        if producer is None:
            return
        now = time.monotonic()
        if self.pending or now >= self._next_serve:
            self._next_serve = now + _SERVE_EVERY_S
            producer.poll(0)

    def close(self) -> None:
        """The member stopped: let the producer go now, not whenever the garbage collector
        breaks the engine's reference cycles (until then it kept its broker connections and
        threads). Writes still pending are dropped: the final commit stayed below them. The
        log lines it still holds are handed over first."""
        producer, self._producer = self._producer, None
        self._closed = True
        if producer is not None:
            # Best effort: the shutdown steps after this one must run whatever it raises.
            with contextlib.suppress(Exception):
                producer.poll(0)

    def flush(self, timeout: float) -> int:
        """Wait up to `timeout` for pending writes; returns how many are still pending."""
        if self._producer is None or not self.pending:
            return 0
        self._producer.flush(max(0.0, timeout))
        return self.pending
