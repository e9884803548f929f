"""Dead letters: a failed record written to a dead-letter topic, confirmed before it counts.

The record's original key, value and headers go to the dead-letter topic (`<topic>.dlq` unless
configured), with headers saying where it came from and why (`HEADERS`). The producer is
idempotent with `acks=all`, owned by the owner thread (its delivery callbacks are served by
`poll`/`flush` there), and never creates topics by itself: a dead-letter topic deleted while
the member runs makes the write fail, and the partition blocks rather than skips. A dead-letter
topic weir creates takes its source topic's largest record (`max.message.bytes`), and a dead
letter refused as too large says so, with its size and the topic's limit (`WriteFailure`).
A dead letter the broker's ACLs refuse says which ACL (`WriteFailure.denied`), and blocks its
partition like any failed write. A producer that failed for good (a fatal error: the broker
refused it an idempotent producer id, which needs WRITE on some topic) fails its pending
writes and is replaced at the next dead letter, so an ACL granted later takes effect without
a restart.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from weir._engine.client import ProducerClient, ProducerFactory
from weir._engine.refusals import Denied, authorization_error, denied_of
from weir._trace_carrier import carried_by, merged
from weir.config import ConsumerConfig
from weir.errors import DeadLetterError
from weir.logs import get_logger
from weir.policy import FailurePolicy
from weir.records import Record, header_bytes

__all__ = [
    "HEADERS",
    "DeadLetterError",
    "DeadLetters",
    "WriteFailure",
    "header_room",
    "shared_settings",
]

log = get_logger(__name__)

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
"""The headers a dead letter carries after the record's own, values UTF-8 text: its source
topic, partition, offset and timestamp (ms), the attempts made, the exception's type and
message, the group, and when the last attempt failed (ms since the epoch)."""

# librdkafka settings of the consumer that the producer shares: how to reach and authenticate
# with the cluster (OAUTHBEARER's token provider, unsecured tokens and token endpoint too),
# and how much to log. Consumer-only settings would only make the producer log warnings.
_SHARED_PREFIXES = (
    "security.",
    "ssl.",
    "ssl_",
    "sasl.",
    "enable.sasl.",
    "https.",
    "oauth_cb",
    "debug",
    "log_level",
    "log.connection.close",
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
# librdkafka's largest `message.max.bytes` for the producer (its default is 1,000,000): the
# producer refuses no dead letter itself, the broker holds each to its topic's max.message.bytes.
_PRODUCER_MAX_BYTES = 1_000_000_000
# What weir's headers add to a record, besides the exception's message and the group id: their
# names, the numbers, the source topic's name (249 bytes at most), the exception's type, framing.
_HEADER_ROOM_BYTES = 2048
# The longest the owner waits for a topic's configuration when a dead letter was too large.
_DESCRIBE_TIMEOUT_S = 5.0
# What a member that dead-letters needs of the broker's ACLs.
_NEEDS = (
    "a member that dead-letters needs DESCRIBE and WRITE on its dead-letter topics (and "
    "CREATE, for weir to create a missing one)"
)
_MAX_BYTES = "max.message.bytes"


def shared_settings(cfg: ConsumerConfig, logger: object | None = None) -> dict[str, Any]:
    """The consumer's librdkafka settings a producer of the same member shares: how to reach
    and authenticate with the cluster (consumer-only settings would only make it warn), and
    the member's `logger` for librdkafka's lines (weir.librdkafka)."""
    conf = {k: v for k, v in cfg.librdkafka_config().items() if k.startswith(_SHARED_PREFIXES)}
    if logger is not None:
        conf["logger"] = logger
    return conf


class OwnedProducer:
    """A producer weir owns (the dead-letter producer; the at-least-once outputs' one in
    `weir._engine.outputs`): made at its first use, served on the owner thread, and replaced
    when it fails for good. A fatal error raised by a poll or a flush (`serve`), or found by
    its owner (`fail`), drops it: `served` first hands on what it confirmed before it failed,
    then `failed` fails what it still held; the next `get` makes a new one. Owner thread only."""

    __slots__ = ("_config", "_factory", "_failed", "_next_serve", "_served", "current")

    def __init__(
        self,
        factory: ProducerFactory,
        config: Callable[[], dict[str, Any]],
        served: Callable[[], None],
        failed: Callable[[KafkaError], None],
    ) -> None:
        self._factory = factory
        self._config = config
        self._served = served
        self._failed = failed
        self._next_serve = 0.0
        self.current: ProducerClient | None = None

    def get(self) -> ProducerClient:
        """The producer, a new one if there is none yet or the last failed for good."""
        if self.current is None:
            self.current = self._factory(self._config())
        return self.current

    def serve(self, call: Callable[[ProducerClient], object]) -> None:
        """`call(producer)` (a poll or a flush), which raises a fatal error of the producer."""
        producer = self.current
        if producer is None:
            return
        try:
            call(producer)
        except KafkaException as exc:
            err = fatal_error(exc)
            if err is None:
                raise
            self._served()  # what the producer confirmed before it failed
            self.fail(err)

    def fail(self, err: KafkaError) -> None:
        """The producer hit a fatal error: it is dropped, and what it held fails."""
        self.current = None
        self._failed(err)

    def poll(self, busy: bool) -> bool:
        """Serve delivery reports and log lines: at every call while `busy` (writes wait for
        the broker), else at most once per `_SERVE_EVERY_S`. True if it was served."""
        if self.current is None:
            return False
        now = time.monotonic()
        if not busy and now < self._next_serve:
            return False
        self._next_serve = now + _SERVE_EVERY_S
        self.serve(lambda p: p.poll(0))
        return True

    def close(self) -> None:
        """The member stopped: let the producer go now, not whenever the garbage collector
        breaks the engine's reference cycles (until then it kept its broker connections and
        threads). The log lines it still holds are handed over first."""
        producer, self.current = self.current, None
        if producer is not None:
            # Best effort: the shutdown steps after this one must run whatever it raises.
            with contextlib.suppress(Exception):
                producer.poll(0)


def fatal_error(exc: BaseException) -> KafkaError | None:
    """The fatal error a producer's call raised, if it was one (the producer is done for)."""
    err = exc.args[0] if exc.args else None
    return err if isinstance(err, KafkaError) and err.fatal() else None


def header_room(cfg: ConsumerConfig, policy: FailurePolicy) -> int:
    """The most bytes weir's headers add to a dead letter: the message, cut to
    `max_error_chars` (up to 4 UTF-8 bytes a character), the group id, and the rest."""
    return _HEADER_ROOM_BYTES + len(cfg.group_id.encode()) + 4 * policy.max_error_chars


@dataclass(frozen=True, slots=True)
class WriteFailure:
    """Why a dead letter was not written."""

    error: str
    """What the client or the broker said."""
    size: int | None = None
    """Set when it was refused as too large: the dead letter's bytes (key, value, headers)."""
    limit: int | None = None
    """... and its topic's max.message.bytes (None: it could not be read)."""
    denied: Denied | None = None
    """Set when the broker's ACLs refused it: what they refused."""

    @property
    def reason(self) -> str:
        if self.denied is not None:
            return f"dead letter refused by the broker's ACLs: {self.denied} ({self.denied.code})"
        if self.size is None:
            return "dead-letter write failed"
        limit = "could not be read" if self.limit is None else f"is {self.limit}"
        return (
            f"dead letter too large: {self.size} bytes, the dead-letter topic's "
            f"max.message.bytes {limit}"
        )

    @property
    def fields(self) -> dict[str, object]:
        """Log fields of a dead letter refused as too large (none otherwise)."""
        if self.size is None:
            return {}
        return {"dead_letter_bytes": self.size, "max_message_bytes": self.limit}


Result = Callable[[WriteFailure | None], None]
"""Called on the owner thread with None once the broker confirmed the write, else why not."""


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
        self._producer = OwnedProducer(
            factory, self.producer_config, self._serve, self._failed_for_good
        )
        # Dead-letter topics known to exist: those of the named topics are checked at start,
        # those of topics a regex subscription matched before their first dead letter.
        self._checked: set[str] = set()
        self._closed = False
        # Writes sent and not confirmed, by sequence number: who to tell, and of what.
        self._inflight: dict[int, tuple[Result, FailurePolicy, str, int]] = {}
        self._seq = itertools.count()
        # Delivery results, kept by the producer's callback and handed on once its poll returned
        # (a dead letter too large for its topic asks an admin client for the topic's limit).
        self._results: list[tuple[int, KafkaError | None]] = []

    @property
    def pending(self) -> int:
        """Dead letters sent and not confirmed yet."""
        return len(self._inflight)

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
                "message.max.bytes": _PRODUCER_MAX_BYTES,
                "request.timeout.ms": min(30_000, timeout_ms),
                # A deleted dead-letter topic must fail the write (the partition blocks), not
                # come back with the broker's default settings.
                "allow.auto.create.topics": False,
            }
        )
        return conf

    def start(self, topics: Iterable[str], partitions: Mapping[str, int]) -> None:
        """Build the producer and make sure the dead-letter topics of `topics` exist: created
        when allowed (`_create`), else a `DeadLetterError`."""
        self._producer.get()
        timeout = self._cfg.startup_timeout_s
        missing: dict[str, list[str]] = {}  # dead-letter topic: its source topics
        for topic in topics:
            policy = self._cfg.policy_for(topic)
            dlq = policy.dead_letter_for(topic)
            hidden = self._hidden(dlq, timeout)
            if hidden is not None:
                raise authorization_error(
                    hidden,
                    f"the dead-letter topic of {topic!r}; Kafka says so also of a topic that does "
                    "not exist, to a client that may not describe it",
                    _NEEDS,
                )
            if self._exists(dlq, timeout):
                self._checked.add(dlq)
                continue
            if not policy.create_dead_letter_topic:
                raise DeadLetterError(
                    f"dead-letter topic {dlq!r} of {topic!r} does not exist "
                    "(create_dead_letter_topic=False)"
                )
            missing.setdefault(dlq, []).append(topic)
        if missing:
            self._create(missing, partitions, timeout)
            self._checked.update(missing)

    def _ensure(self, source: str, dlq: str) -> WriteFailure | None:
        """Make sure of a dead-letter topic not checked at start (that of a topic a regex
        subscription matched) before its first dead letter: without it, the producer (which
        never creates topics) would time out on every write, and the partition block for good.
        Blocks the owner thread, once per topic, for a metadata request and, if needed, a topic
        creation, within `dead_letter_timeout_s`. Returns the failure, or None."""
        policy = self._cfg.policy_for(source)
        timeout = self._cfg.failure.dead_letter_timeout_s
        try:
            hidden = self._hidden(dlq, timeout)
            if hidden is not None:
                return WriteFailure(
                    f"the broker's ACLs do not allow this client DESCRIBE on dead-letter topic "
                    f"{dlq!r} of {source!r} ({hidden.code}): {_NEEDS}",
                    denied=hidden,
                )
            if not self._exists(dlq, timeout):
                if not policy.create_dead_letter_topic:
                    return WriteFailure(
                        f"dead-letter topic {dlq!r} of {source!r} does not exist "
                        "(create_dead_letter_topic=False)"
                    )
                self._create({dlq: [source]}, {source: self._partitions(source, timeout)}, timeout)
        except DeadLetterError as exc:
            return WriteFailure(str(exc))
        self._checked.add(dlq)
        return None

    def _exists(self, topic: str, timeout: float) -> bool:
        found = self._metadata(topic, timeout)
        return found is not None and found.error is None

    def _hidden(self, topic: str, timeout: float) -> Denied | None:
        """DESCRIBE on `topic`, if the broker's ACLs refuse it (Kafka says so also of a topic
        that does not exist, to a client that may not describe it)."""
        found = self._metadata(topic, timeout)
        error = None if found is None else found.error
        code = error.name() if isinstance(error, KafkaError) else ""
        return denied_of(code, "DESCRIBE", topic=topic)

    def _metadata(self, topic: str, timeout: float) -> Any:
        producer = self._producer.get()
        try:
            meta = producer.list_topics(topic, timeout=timeout)
        except KafkaException as exc:
            raise DeadLetterError(f"could not look up dead-letter topic {topic!r}: {exc}") from exc
        return meta.topics.get(topic)

    def _partitions(self, topic: str, timeout: float) -> int:
        """The partition count of a source topic (1 if it cannot be read)."""
        try:
            found = self._producer.get().list_topics(topic, timeout=timeout).topics.get(topic)
        except KafkaException:
            return 1
        return len(found.partitions) if found is not None and found.partitions else 1

    @contextlib.contextmanager
    def _admin(self) -> Iterator[Any]:
        """An admin client of the member's cluster, its log lines handed over when done."""
        from confluent_kafka.admin import AdminClient

        conf = shared_settings(self._cfg, self._logger)
        conf["bootstrap.servers"] = self._cfg.bootstrap_servers
        admin = (self._admin_factory or AdminClient)(conf)
        try:
            yield admin
        finally:
            admin.poll(0)  # an admin client hands its log lines over in poll() only

    def _create(
        self, topics: Mapping[str, Collection[str]], partitions: Mapping[str, int], timeout: float
    ) -> None:
        """Create the dead-letter topics `topics` (each with its source topics): with their
        sources' partition count (the largest), and a max.message.bytes of their sources' (the
        largest) plus room for weir's headers, so that every record of a source fits as a dead
        letter. The broker's defaults for the rest (replication too)."""
        with self._admin() as admin:
            sources = {s for ss in topics.values() for s in ss}
            limits, unread = _max_message_bytes(admin, sources, timeout)
            new = [self._new_topic(t, ss, partitions, limits, unread) for t, ss in topics.items()]
            futures = admin.create_topics(new, operation_timeout=timeout, request_timeout=timeout)
            for new_topic in new:
                if _created(new_topic.topic, futures[new_topic.topic], timeout):
                    limit = new_topic.config.get(_MAX_BYTES)
                    log.info(
                        "dead_letter_topic_created",
                        topic=new_topic.topic,
                        partitions=new_topic.num_partitions,
                        max_message_bytes=None if limit is None else int(limit),
                    )

    def _new_topic(
        self,
        topic: str,
        sources: Collection[str],
        partitions: Mapping[str, int],
        limits: Mapping[str, int],
        unread: Mapping[str, str],
    ) -> Any:
        from confluent_kafka.cimpl import NewTopic

        config = {}
        known = [limits[s] for s in sources if s in limits]
        if known:
            room = max(header_room(self._cfg, self._cfg.policy_for(s)) for s in sources)
            config[_MAX_BYTES] = str(max(known) + room)
        for source in sorted(s for s in sources if s in unread):
            # Created with the broker's default then: a larger record of the source blocks its
            # partition when it is dead-lettered (and says so).
            log.warning(
                "dead_letter_topic_limit_unknown",
                topic=topic,
                source=source,
                error=unread[source],
            )
        count = max(partitions.get(s, 1) for s in sources)
        return NewTopic(topic, num_partitions=count, replication_factor=-1, config=config)

    def send(
        self,
        record: Record,
        attempts: int,
        error: BaseException,
        failed_at: float,
        done: Result,
    ) -> None:
        """Write `record` to its dead-letter topic (`failed_at`: when its last attempt failed,
        `time.time()`); `done` gets the outcome on a later `poll` (or at once, with the failure,
        if the client refused the write)."""
        policy = self._cfg.policy_for(record.topic)
        topic = policy.dead_letter_for(record.topic)
        if topic not in self._checked:
            problem = self._ensure(record.topic, topic)
            if problem is not None:
                done(problem)
                return
        producer = self._producer.get()
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
        added = [(k, v.encode()) for k, v in extra.items()]
        headers: list[tuple[str, bytes | str | None]] = [*record.headers, *added]
        trace = carried_by(error)
        if trace is not None:  # traced (weir.tracing): the last attempt's span, not the producer's
            headers = merged(headers, trace, replace=True)
        size = record.size + header_bytes(added) + header_bytes(trace or ())
        seq = next(self._seq)

        def delivered(err: KafkaError | None, msg: Any) -> None:
            if not self._closed:  # else served by close(): the member stopped, its commit is done
                self._results.append((seq, err))

        try:
            producer.produce(
                topic, record.value, record.key, headers=headers, on_delivery=delivered,
            )  # fmt: skip
        except (KafkaException, BufferError) as exc:
            fatal = fatal_error(exc)
            if fatal is not None:
                self._inflight[seq] = (done, policy, topic, size)
                self._producer.fail(fatal)
                return
            err = exc.args[0] if exc.args else None
            done(self._failure(policy, topic, size, err if isinstance(err, KafkaError) else exc))
            return
        self._inflight[seq] = (done, policy, topic, size)

    def _failure(
        self, policy: FailurePolicy, topic: str, size: int, err: KafkaError | BaseException
    ) -> WriteFailure:
        """Why the dead letter of `size` bytes to `topic` was not written: for one refused as
        too large, with the topic's max.message.bytes, read now (it may have been changed
        since the start)."""
        if isinstance(err, KafkaError):
            denied = denied_of(err.name(), "WRITE", topic=topic)
            if denied is not None:
                return WriteFailure(str(err), denied=denied)
        if not isinstance(err, KafkaError) or err.code() != KafkaError.MSG_SIZE_TOO_LARGE:
            return WriteFailure(str(err))
        timeout = min(_DESCRIBE_TIMEOUT_S, policy.dead_letter_timeout_s)
        try:
            with self._admin() as admin:
                limits, _ = _max_message_bytes(admin, [topic], timeout)
        except Exception as exc:  # the failure is known: its limit is only a detail
            log.debug("dead_letter_limit_read_failed", topic=topic, error=repr(exc))
            limits = {}
        return WriteFailure(str(err), size, limits.get(topic))

    def _serve(self) -> None:
        """Hand the delivery results the producer's callbacks kept on to their writers."""
        results, self._results = self._results, []
        for seq, err in results:
            sent = self._inflight.pop(seq, None)
            if sent is None:
                continue  # failed already, with the producer that failed for good
            done, policy, topic, size = sent
            if err is None:
                done(None)
            else:
                done(self._failure(policy, topic, size, err))

    def _failed_for_good(self, err: KafkaError) -> None:
        """The producer hit a fatal error: the writes it holds fail now (their records block
        their partitions and are written again by the next producer), and it is replaced at the
        next dead letter. Refused an idempotent producer id (CLUSTER_AUTHORIZATION_FAILED), it
        lacks WRITE on any topic: its dead-letter topics' is the ACL to grant."""
        denied_any = err.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
        text = err.str()
        log.error(
            "dead_letter_producer_failed",
            code=err.name(),
            error=text,
            pending=len(self._inflight),
        )
        inflight, self._inflight = self._inflight, {}
        for done, _, topic, _ in inflight.values():
            if denied_any:
                done(
                    WriteFailure(
                        f"the broker's ACLs refused the dead-letter producer an idempotent "
                        f"producer id ({err.name()}: {text}): it needs WRITE on its "
                        "dead-letter topics (or IDEMPOTENT_WRITE on the cluster)",
                        denied=Denied("topic", topic, "WRITE", err.name()),
                    )
                )
            else:
                done(WriteFailure(f"the dead-letter producer failed for good: {text}"))

    def poll(self) -> None:
        """Serve delivery results (owner thread, every turn) and the producer's log lines
        (librdkafka queues them until the producer is polled)."""
        if self._producer.poll(self.pending > 0):
            self._serve()

    def close(self) -> None:
        """The member stopped: the producer goes (`OwnedProducer.close`). Writes still pending
        are dropped: the final commit stayed below them."""
        self._closed = True
        self._results = []
        self._inflight = {}
        self._producer.close()

    def flush(self, timeout: float) -> int:
        """Wait up to `timeout` for pending writes; returns how many are still pending."""
        if not self.pending:
            return 0
        self._producer.serve(lambda p: p.flush(max(0.0, timeout)))
        self._serve()
        return self.pending


def _created(topic: str, future: Any, timeout: float) -> bool:
    """Whether the creation of `topic` created it (False: it existed already), else a
    `DeadLetterError`."""
    try:
        future.result(timeout=timeout)
    except FutureTimeout:
        raise DeadLetterError(
            f"dead-letter topic {topic!r} is missing and was not created within {timeout:g}s"
        ) from None
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise DeadLetterError(
            f"dead-letter topic {topic!r} is missing and could not be created: {exc}"
        ) from exc
    return True


def _max_message_bytes(
    admin: Any, topics: Collection[str], timeout: float
) -> tuple[dict[str, int], dict[str, str]]:
    """The max.message.bytes of `topics` (their own, or the broker's default they take), and
    why it could not be read for the others."""
    from confluent_kafka.admin import ConfigResource

    if not topics:
        return {}, {}
    limits: dict[str, int] = {}
    unread: dict[str, str] = {}
    try:
        futures = admin.describe_configs(
            [ConfigResource("topic", t) for t in topics], request_timeout=timeout
        )
    except KafkaException as exc:
        return {}, dict.fromkeys(topics, str(exc))
    for resource, future in futures.items():
        topic = resource.name
        try:
            entry = future.result(timeout=timeout).get(_MAX_BYTES)
            if entry is None or entry.value is None:
                raise ValueError(f"no {_MAX_BYTES} in the topic's configuration")
            limits[topic] = int(entry.value)
        except FutureTimeout:
            unread[topic] = f"not read within {timeout:g}s"
        except (KafkaException, ValueError) as exc:
            unread[topic] = str(exc)
    return limits, unread
