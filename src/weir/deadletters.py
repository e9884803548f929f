"""Dead letters read back, and sent back: what `weir dlq show` and `weir dlq redrive` do, for
Python callers too.

A dead letter is the failed record with weir's `weir.dlq.*` headers appended (docs/failures.md).
`DeadLetter.of` reads one from a consumed message; `read_dead_letters` reads a dead-letter
topic; `plan_redrive` chooses what a redrive would send and `redrive` sends it.

A redrive is idempotent per target topic: every record it sends carries `REDRIVEN_FROM`
(`<dead-letter topic>/<partition>/<offset>`), and before it sends, it reads the target topics
(read_committed) for records that carry it already, and leaves those dead letters out. The
records go in one transaction of a producer whose `transactional.id` is named after the
dead-letter topic (`weir-redrive.<topic>`): starting it aborts what an earlier run that crashed
left open and fences a run still going, so neither can add records after the scan. The
guarantee's limits are in docs/failures.md ("Redriving dead letters").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from weir._engine.deadletter import HEADERS
from weir._reading import Position, Reader, refused
from weir.errors import RedriveError
from weir.logs import get_logger

__all__ = [
    "HEADERS",
    "REDRIVEN_FROM",
    "DeadLetter",
    "RedriveError",
    "RedrivePlan",
    "Redriven",
    "Selection",
    "plan_redrive",
    "read_dead_letters",
    "redrive",
    "redrive_transactional_id",
]

log = get_logger(__name__)

REDRIVEN_FROM = "weir.redriven-from"
"""The header a redriven record carries: `<dead-letter topic>/<partition>/<offset>`."""
# The scan of a target topic starts this long before the earliest selected dead letter was
# written: room for a clock that stamps the redrive behind the one that stamped the dead letter.
SCAN_MARGIN_S = 600.0
_WEIR_HEADERS = frozenset(HEADERS)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One record of a dead-letter topic, with weir's failure headers read."""

    topic: str
    """The dead-letter topic, and where in it: `partition`, `offset`."""
    partition: int
    offset: int
    timestamp_ms: int | None
    """When the dead letter was written (its record's timestamp)."""
    key: bytes | None
    """The failed record's key, as it was."""
    value: bytes | None
    """The failed record's value, as it was."""
    headers: tuple[tuple[str, bytes | None], ...]
    """All its headers, the record's own first, weir's last."""
    source_topic: str | None = None
    """Where the failed record was (None: not a weir dead letter, no `weir.dlq.topic`)."""
    source_partition: int | None = None
    """The failed record's partition in `source_topic`."""
    source_offset: int | None = None
    """The failed record's offset there."""
    attempts: int | None = None
    """Attempts made before it was dead-lettered."""
    exception: str | None = None
    """The last exception's type, module-qualified."""
    message: str | None = None
    """The last exception's message, cut to `FailurePolicy.max_error_chars`."""
    group: str | None = None
    """The consumer group whose member wrote it."""
    failed_at_ms: int | None = None
    """When the last attempt failed, in ms since the epoch."""

    @classmethod
    def of(cls, msg: Any) -> DeadLetter:
        """The dead letter in a consumed confluent-kafka message. Missing or malformed weir
        headers leave their fields None: the record is still shown, and never redriven."""
        headers = tuple(msg.headers() or ())
        weir = {k: _text(v) for k, v in headers if k in _WEIR_HEADERS}
        kind, stamp = msg.timestamp()
        return cls(
            topic=msg.topic(),
            partition=msg.partition(),
            offset=msg.offset(),
            timestamp_ms=stamp if kind else None,
            key=msg.key(),
            value=msg.value(),
            headers=headers,
            source_topic=weir.get("weir.dlq.topic") or None,
            source_partition=_int(weir.get("weir.dlq.partition")),
            source_offset=_int(weir.get("weir.dlq.offset")),
            attempts=_int(weir.get("weir.dlq.attempts")),
            exception=weir.get("weir.dlq.exception") or None,
            message=weir.get("weir.dlq.message"),
            group=weir.get("weir.dlq.group") or None,
            failed_at_ms=_int(weir.get("weir.dlq.failed_at")),
        )

    @property
    def is_weir(self) -> bool:
        """Whether it says where it came from (weir wrote it): only those can be redriven."""
        return (
            self.source_topic is not None
            and self.source_partition is not None
            and self.source_offset is not None
        )

    @property
    def error(self) -> str:
        """`ExceptionType: message`, with the type's module left out."""
        name = (self.exception or "").rpartition(".")[2]
        if not name:
            return self.message or ""
        return f"{name}: {self.message}" if self.message else name

    @property
    def marker(self) -> str:
        """The `REDRIVEN_FROM` value of its redrive: `<topic>/<partition>/<offset>`."""
        return f"{self.topic}/{self.partition}/{self.offset}"

    def original_headers(self) -> list[tuple[str, bytes | None]]:
        """The failed record's own headers: weir's block (appended last) and an earlier
        redrive's marker left out."""
        headers = list(self.headers)
        while headers and headers[-1][0] in _WEIR_HEADERS:
            headers.pop()
        return [(k, v) for k, v in headers if k != REDRIVEN_FROM]


def read_dead_letters(
    config: Mapping[str, Any],
    topic: str,
    position: Position | None = None,
    *,
    partitions: Sequence[int] | None = None,
    count: int | None = None,
    timeout: float = 10.0,
) -> Iterator[DeadLetter]:
    """The dead letters of `topic` from `position` (default: its beginning) to its end
    (read_committed), at most `count`. `config`: the connection settings (bootstrap.servers,
    security)."""
    start = position or Position("beginning")
    with Reader.open(config, topic, start, partitions=partitions, timeout=timeout) as reader:
        for msg in reader.messages(follow=False, count=count):
            yield DeadLetter.of(msg)


@dataclass(frozen=True, slots=True)
class Selection:
    """Which dead letters a redrive takes: those matching every field given (None: any)."""

    source_topic: str | None = None
    source_partitions: frozenset[int] | None = None
    first_offset: int | None = None
    """Source offsets from this one ..."""
    last_offset: int | None = None
    """... to this one, both included."""
    error_contains: str | None = None
    """A part of `DeadLetter.error` (the exception's type or message), any case."""

    def __post_init__(self) -> None:
        if (
            self.first_offset is not None
            and self.last_offset is not None
            and self.first_offset > self.last_offset
        ):
            raise ValueError(
                f"the offset range {self.first_offset}-{self.last_offset} is empty "
                "(its first offset is past its last)"
            )

    def matches(self, letter: DeadLetter) -> bool:
        """Whether `letter` is one of weir's dead letters and every field given holds for it."""
        if not letter.is_weir:
            return False
        offset = letter.source_offset
        assert offset is not None  # is_weir
        return (
            (self.source_topic is None or letter.source_topic == self.source_topic)
            and (
                self.source_partitions is None or letter.source_partition in self.source_partitions
            )
            and (self.first_offset is None or offset >= self.first_offset)
            and (self.last_offset is None or offset <= self.last_offset)
            and (
                self.error_contains is None
                or self.error_contains.casefold() in letter.error.casefold()
            )
        )


@dataclass(frozen=True, slots=True)
class Redriven:
    """One selected dead letter and where its redrive goes."""

    letter: DeadLetter
    target_topic: str
    target_partition: int | None
    """The source partition when it goes back to its source topic; None: the key decides."""
    already: bool
    """A record with its `REDRIVEN_FROM` is in the target topic already: it is not sent."""


@dataclass(slots=True)
class RedrivePlan:
    """What a redrive of `dead_letter_topic` sends: from `plan_redrive`, and returned by
    `redrive` (whose `to_send` it sent)."""

    dead_letter_topic: str
    items: list[Redriven] = field(default_factory=list)
    not_weir: int = 0
    """Records of the dead-letter topic without weir's headers: never redriven."""

    @property
    def to_send(self) -> list[Redriven]:
        """The selected dead letters not yet in their target topic: what a redrive sends."""
        return [item for item in self.items if not item.already]

    @property
    def already_sent(self) -> list[Redriven]:
        """The selected dead letters an earlier redrive sent already: left out."""
        return [item for item in self.items if item.already]


def redrive_transactional_id(dead_letter_topic: str) -> str:
    """The `transactional.id` of the producer that redrives `dead_letter_topic`: one per
    dead-letter topic, so that a redrive fences another one of the same topic. An ACL must allow
    WRITE and DESCRIBE on it."""
    return f"weir-redrive.{dead_letter_topic}"


def plan_redrive(
    config: Mapping[str, Any],
    dead_letter_topic: str,
    selection: Selection | None = None,
    *,
    to: str | None = None,
    timeout: float = 10.0,
) -> RedrivePlan:
    """What a redrive of `dead_letter_topic` would send: the dead letters `selection` takes,
    each to its source topic (its own partition) or to `to`, and which of them a record in the
    target topic shows as redriven already. Reads; sends nothing."""
    plan = RedrivePlan(dead_letter_topic)
    chosen: list[DeadLetter] = []
    for letter in read_dead_letters(config, dead_letter_topic, timeout=timeout):
        if not letter.is_weir:
            plan.not_weir += 1
        elif selection is None or selection.matches(letter):
            chosen.append(letter)
    targets = {to or str(letter.source_topic) for letter in chosen}
    partitions = {topic: _partition_count(config, topic, timeout) for topic in targets}
    done = _redriven_already(config, dead_letter_topic, chosen, targets, timeout)
    for letter in chosen:
        target = to or str(letter.source_topic)
        partition = None
        if to is None and letter.source_partition is not None:
            if letter.source_partition >= partitions[target]:
                raise RedriveError(
                    f"dead letter {letter.marker} came from partition {letter.source_partition} "
                    f"of {target!r}, which has {partitions[target]} partitions now; "
                    "send it elsewhere with --to"
                )
            partition = letter.source_partition
        plan.items.append(Redriven(letter, target, partition, (target, letter.marker) in done))
    return plan


def redrive(
    config: Mapping[str, Any],
    dead_letter_topic: str,
    selection: Selection | None = None,
    *,
    to: str | None = None,
    timeout: float = 10.0,
    commit_timeout: float = 60.0,
) -> RedrivePlan:
    """Send the dead letters `plan_redrive` would send, in one transaction; returns the plan
    (its `to_send` were sent). The transactional producer starts before the scan, so that what
    an earlier run left open is aborted and a concurrent run fenced first."""
    from confluent_kafka import KafkaException, Producer

    try:
        producer = Producer(
            {
                **config,
                "transactional.id": redrive_transactional_id(dead_letter_topic),
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
            }
        )
    except (KafkaException, ValueError, TypeError) as exc:
        raise RedriveError(refused(exc, config)) from None
    try:
        producer.init_transactions(timeout)
        plan = plan_redrive(config, dead_letter_topic, selection, to=to, timeout=timeout)
        sending = plan.to_send
        if sending:
            producer.begin_transaction()
            try:
                for item in sending:
                    _send(producer, item)
                producer.commit_transaction(commit_timeout)
            except BaseException:
                with contextlib.suppress(KafkaException):
                    producer.abort_transaction(commit_timeout)
                raise
    except KafkaException as exc:
        raise RedriveError(_failure(exc, dead_letter_topic)) from None
    finally:
        # Serves its last log lines; a producer that failed for good raises its error again.
        with contextlib.suppress(KafkaException):
            producer.flush(0)
    log.info(
        "dead_letters_redriven",
        dead_letter_topic=dead_letter_topic,
        sent=len(plan.to_send),
        already_redriven=len(plan.already_sent),
        targets=sorted({item.target_topic for item in plan.to_send}),
    )
    return plan


def _failure(exc: Exception, dead_letter_topic: str) -> str:
    from weir.lag import error_text

    error: Any = exc.args[0] if exc.args else None
    code = str(error.name()) if hasattr(error, "name") else ""
    if code.endswith("_AUTHORIZATION_FAILED"):
        return (
            f"the redrive of {dead_letter_topic!r} was refused by the broker's ACLs ({code}: "
            f"{error_text(exc)}): a redrive needs READ on the dead-letter topic and the targets, "
            f"WRITE on the targets, and WRITE and DESCRIBE on the transactional id "
            f"{redrive_transactional_id(dead_letter_topic)!r}"
        )
    # A commit that timed out may still complete: a second run finds what it committed.
    return (
        f"the redrive of {dead_letter_topic!r} failed: {error_text(exc)}; run it again, it "
        "sends nothing twice"
    )


def _send(producer: Any, item: Redriven) -> None:
    letter = item.letter
    fields: dict[str, Any] = {
        "key": letter.key,
        "value": letter.value,
        "headers": [*letter.original_headers(), (REDRIVEN_FROM, letter.marker.encode())],
    }
    if item.target_partition is not None:
        fields["partition"] = item.target_partition
    while True:
        try:
            producer.produce(item.target_topic, **fields)
            return
        except BufferError:  # the local queue is full: let deliveries drain
            producer.poll(0.1)


def _partition_count(config: Mapping[str, Any], topic: str, timeout: float) -> int:
    with Reader.open(config, topic, Position("end"), timeout=timeout) as reader:
        return len(reader.partitions)


def _redriven_already(
    config: Mapping[str, Any],
    dead_letter_topic: str,
    letters: Iterable[DeadLetter],
    targets: Iterable[str],
    timeout: float,
) -> set[tuple[str, str]]:
    """(target topic, marker) of the records in `targets` that carry a `REDRIVEN_FROM` of
    `dead_letter_topic`, from a little before the earliest of `letters` was written."""
    stamps = [letter.timestamp_ms for letter in letters]
    if not stamps:
        return set()
    known = [s for s in stamps if s is not None]
    since = Position("beginning")
    if len(known) == len(stamps):
        since = Position("time", time_ms=max(0, min(known) - round(SCAN_MARGIN_S * 1000)))
    prefix = f"{dead_letter_topic}/"
    found: set[tuple[str, str]] = set()
    for topic in targets:
        with Reader.open(config, topic, since, timeout=timeout) as reader:
            for msg in reader.messages(follow=False):
                for key, value in msg.headers() or ():
                    if key == REDRIVEN_FROM and value is not None:
                        marker = _text(value)
                        if marker.startswith(prefix):
                            found.add((topic, marker))
    return found


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else value.decode("utf-8", errors="replace")


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None
