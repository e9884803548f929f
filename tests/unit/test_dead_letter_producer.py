"""The dead-letter producer and admin client on their own: where their librdkafka lines go, the
max.message.bytes of the dead-letter topics weir creates, and a dead letter too large."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import ConfigEntry

from weir import AuthorizationError, FailurePolicy, Record
from weir._engine.deadletter import DeadLetterError, DeadLetters, WriteFailure, header_room
from weir._engine.refusals import Denied
from weir.config import ConsumerConfig
from weir.logs import ClientLog, Repeats

pytestmark = pytest.mark.timeout(30)

NOBODY = "127.0.0.1:1"  # nothing listens on port 1: every connect is refused and logged
RAW_LIBRDKAFKA = re.compile(r"(?m)^%\d\|")  # librdkafka's own stderr format


def config(**kw: object) -> ConsumerConfig:
    settings: dict[str, object] = {
        "bootstrap_servers": NOBODY,
        "group_id": "g",
        "topics": ["t"],
        "startup_timeout_s": 1.0,
        "failure": FailurePolicy(final="dead_letter"),
    }
    settings.update(kw)
    return ConsumerConfig(**settings)  # type: ignore[arg-type]


def test_the_dead_letter_producer_logs_through_weir_librdkafka(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: the dead-letter producer had no `logger`, so librdkafka printed each of its
    lines raw to stderr (43 in one outage), unlike the member's other clients."""
    caplog.set_level(logging.WARNING, logger="weir.librdkafka")
    letters = DeadLetters(config(), Producer, logger=ClientLog(Repeats()))
    with pytest.raises(DeadLetterError, match="could not look up"):
        letters.start(["t"], {"t": 1})
    letters.close()  # serves the lines still queued
    err = capfd.readouterr().err
    assert not RAW_LIBRDKAFKA.search(err), err[:2000]
    assert "rdkafka" not in err, err[:2000]
    lines = [r.getMessage() for r in caplog.records if r.name == "weir.librdkafka"]
    assert any("[rdkafka#producer-" in line and "Connection refused" in line for line in lines), (
        lines
    )


# -- the dead-letter topic's max.message.bytes ----------------------------------------------------

SOURCE, DLQ = "t", "t.dlq"
TWO_MB = 2 * 1024 * 1024


def done_future(value: object = None, error: BaseException | None = None) -> Future[Any]:
    future: Future[Any] = Future()
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)
    return future


class Admin:
    """An admin client that knows the max.message.bytes of `limits` (other topics: access
    denied) and keeps the topics it is asked to create."""

    def __init__(self, limits: dict[str, int]) -> None:
        self.limits = limits
        self.created: list[Any] = []
        self.polls = 0

    def factory(self, conf: dict[str, Any]) -> Admin:
        return self

    def describe_configs(self, resources: list[Any], request_timeout: float) -> dict[Any, Any]:
        denied = KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied"))
        return {
            r: done_future({"max.message.bytes": ConfigEntry("max.message.bytes", str(n))})
            if (n := self.limits.get(r.name)) is not None
            else done_future(error=denied)
            for r in resources
        }

    def create_topics(
        self, topics: list[Any], operation_timeout: float, request_timeout: float
    ) -> dict[str, Future[Any]]:
        self.created.extend(topics)
        return {t.topic: done_future() for t in topics}

    def poll(self, timeout: float = 0) -> int:
        self.polls += 1
        return 0


class ScriptedProducer:
    """A producer to whom `existing` topics exist and whose writes fail with `error`."""

    def __init__(self, existing: set[str], error: KafkaError | None = None) -> None:
        self.existing = existing
        self.error = error
        self.queued: list[Callable[[], None]] = []

    def factory(self, conf: dict[str, Any]) -> Any:
        self.conf = conf
        return self

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        known = {t: SimpleNamespace(error=None, partitions={0: None}) for t in self.existing}
        return SimpleNamespace(topics=known)

    def produce(self, topic: str, value: Any, key: Any, *, headers: Any, on_delivery: Any) -> None:
        self.queued.append(lambda: on_delivery(self.error, None))

    def poll(self, timeout: float = 0) -> int:
        queued, self.queued = self.queued, []
        for deliver in queued:
            deliver()
        return len(queued)


def test_a_created_dead_letter_topic_takes_the_largest_record_of_its_source() -> None:
    """Regression: weir created the dead-letter topic with the broker's default
    max.message.bytes (1 MB), so a failing record of a source topic that takes larger ones was
    refused and blocked its partition for good."""
    admin = Admin({SOURCE: TWO_MB})
    letters = DeadLetters(config(), ScriptedProducer(set()).factory, admin_factory=admin.factory)
    letters.start([SOURCE], {SOURCE: 3})
    (created,) = admin.created
    assert (created.topic, created.num_partitions) == (DLQ, 3)
    limit = int(created.config["max.message.bytes"])
    # Room for weir's headers: the message (up to 4 bytes a character), the group id, the rest.
    assert limit == TWO_MB + header_room(config(), config().failure)
    assert limit >= TWO_MB + 4 * config().failure.max_error_chars + 1024
    assert admin.polls == 1, "its log lines were handed over"


def test_a_source_limit_that_cannot_be_read_is_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    admin = Admin({})
    letters = DeadLetters(config(), ScriptedProducer(set()).factory, admin_factory=admin.factory)
    letters.start([SOURCE], {SOURCE: 1})
    (created,) = admin.created
    assert "max.message.bytes" not in created.config  # the broker's default
    (warning,) = [r.msg for r in caplog.records if r.levelno == logging.WARNING]
    assert isinstance(warning, dict) and warning["event"] == "dead_letter_topic_limit_unknown"
    assert (warning["topic"], warning["source"]) == (DLQ, SOURCE)
    assert "denied" in warning["error"]


def test_a_dead_letter_too_large_for_its_topic_names_its_size_and_the_limit() -> None:
    too_large = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "Broker: Message size too large")
    admin = Admin({DLQ: 200})
    producer = ScriptedProducer({DLQ}, too_large)
    letters = DeadLetters(config(), producer.factory, admin_factory=admin.factory)
    letters.start([SOURCE], {SOURCE: 1})
    assert producer.conf["message.max.bytes"] == 1_000_000_000  # only the topic's limit counts
    results: list[WriteFailure | None] = []
    record = Record(SOURCE, 0, 7, b"k", b"x" * 2000, headers=[("h", b"12345")])
    letters.send(record, 3, RuntimeError("boom"), 1_700_000_000.0, results.append)
    letters.poll()
    (failure,) = results
    assert failure is not None and failure.error == str(too_large)
    assert failure.limit == 200
    # The record and weir's headers: more than the record alone, less than the room allowed.
    assert failure.size is not None
    assert record.size < failure.size < record.size + header_room(config(), config().failure)
    assert failure.reason == (
        f"dead letter too large: {failure.size} bytes, the dead-letter topic's "
        "max.message.bytes is 200"
    )
    assert failure.fields == {"dead_letter_bytes": failure.size, "max_message_bytes": 200}
    # Any other failure says what the client said, and nothing about sizes.
    producer.error = KafkaError(KafkaError._MSG_TIMED_OUT, "timed out")
    letters.send(record, 3, RuntimeError("boom"), 1_700_000_000.0, results.append)
    letters.poll()
    assert results[1] is not None and results[1].fields == {}
    assert results[1].reason == "dead-letter write failed"


# -- the broker's ACLs -------------------------------------------------------------------------


PID_REFUSED = KafkaError(
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    "Failed to acquire idempotence PID from broker b1:9093/1: Broker: Cluster authorization failed",
    fatal=True,
)


class RefusedProducer(ScriptedProducer):
    """A producer whose poll raises `fatal` once a write is queued: the broker refused it a
    producer id. Each one the factory builds is counted."""

    def __init__(self, existing: set[str], fatal: KafkaError) -> None:
        super().__init__(existing)
        self.fatal = fatal
        self.built = 0

    def factory(self, conf: dict[str, Any]) -> Any:
        self.built += 1
        return super().factory(conf)

    def poll(self, timeout: float = 0) -> int:
        if self.queued:
            self.queued = []
            raise KafkaException(self.fatal)
        return 0


def test_a_producer_refused_an_id_fails_its_writes_by_name_and_is_replaced() -> None:
    """Regression: the fatal error escaped DeadLetters.poll and stopped the member with a bare
    KafkaException (CLUSTER_AUTHORIZATION_FAILED), on the secured broker for a member allowed
    no WRITE on any topic."""
    producer = RefusedProducer({DLQ}, PID_REFUSED)
    letters = DeadLetters(config(), producer.factory)
    letters.start([SOURCE], {SOURCE: 1})
    results: list[WriteFailure | None] = []
    record = Record(SOURCE, 0, 7, b"k", b"v")
    letters.send(record, 3, RuntimeError("boom"), 1_700_000_000.0, results.append)
    assert letters.pending == 1
    letters.poll()
    (failure,) = results
    assert failure is not None and letters.pending == 0
    assert failure.denied == Denied("topic", DLQ, "WRITE", "CLUSTER_AUTHORIZATION_FAILED")
    assert failure.reason == (
        f"dead letter refused by the broker's ACLs: WRITE on topic {DLQ!r} "
        "(CLUSTER_AUTHORIZATION_FAILED)"
    )
    assert failure.error.startswith(
        "the broker's ACLs refused the dead-letter producer an idempotent producer id "
        "(CLUSTER_AUTHORIZATION_FAILED: Failed to acquire idempotence PID"
    )
    assert failure.error.endswith(
        "it needs WRITE on its dead-letter topics (or IDEMPOTENT_WRITE on the cluster)"
    )
    # The next dead letter has a new producer: an ACL granted since takes effect.
    producer.fatal = PID_REFUSED
    letters.send(record, 4, RuntimeError("boom"), 1_700_000_000.0, results.append)
    assert producer.built == 2


def test_a_write_the_acls_refuse_names_them() -> None:
    refused = KafkaError(
        KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Topic authorization failed"
    )
    letters = DeadLetters(config(), ScriptedProducer({DLQ}, refused).factory)
    letters.start([SOURCE], {SOURCE: 1})
    results: list[WriteFailure | None] = []
    letters.send(Record(SOURCE, 0, 7, b"k", b"v"), 3, RuntimeError("x"), 0.0, results.append)
    letters.poll()
    (failure,) = results
    assert failure is not None
    assert failure.denied == Denied("topic", DLQ, "WRITE", "TOPIC_AUTHORIZATION_FAILED")


class HiddenTopics(ScriptedProducer):
    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        error = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
        return SimpleNamespace(topics={topic: SimpleNamespace(error=error, partitions={})})


def test_a_dead_letter_topic_the_acls_hide_fails_the_start() -> None:
    """Regression: weir took it for missing, tried to create it and said "dead-letter topic
    't.dlq' is missing and could not be created" for a topic that may well exist."""
    letters = DeadLetters(config(), HiddenTopics(set()).factory)
    with pytest.raises(AuthorizationError) as raised:
        letters.start([SOURCE], {SOURCE: 1})
    assert str(raised.value).startswith(
        f"authorization failed: the broker's ACLs do not allow this client DESCRIBE on topic "
        f"{DLQ!r} (TOPIC_AUTHORIZATION_FAILED: the dead-letter topic of {SOURCE!r}"
    )
