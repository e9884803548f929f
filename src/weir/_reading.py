"""Reading a topic from a chosen position without a consumer group: what `weir tail`, `weir dlq`
and `weir.deadletters` share.

The reader assigns partitions itself: it never joins a group and never commits (librdkafka
insists on a `group.id` even so; a throwaway one is set, and the broker never learns of it,
since only a join or a commit creates a group).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from weir._slices import in_slices
from weir.errors import ReadError

__all__ = ["ISOLATIONS", "Position", "ReadError", "Reader", "parse_datetime", "refused"]

ISOLATIONS = ("read_committed", "read_uncommitted")
# The group id librdkafka requires of every consumer; it is never joined nor committed to.
_UNJOINED_PREFIX = "weir-unjoined-"
_POLL_S = 0.5
_FETCH_WAIT_MS = 100


@dataclass(frozen=True, slots=True)
class Position:
    """Where reading starts, in every partition read."""

    kind: Literal["beginning", "end", "offset", "time"]
    offset: int = 0
    """For "offset": the offset (below 0: that many offsets before the end; a
    transaction's marker takes an offset too)."""
    time_ms: int = 0
    """For "time": ms since the epoch; the first record at or after it."""

    @classmethod
    def at_time(cls, when: datetime) -> Position:
        return cls("time", time_ms=round(when.timestamp() * 1000))


def parse_datetime(text: str) -> datetime:
    """An ISO 8601 date or date-time; without a zone it is the local time, as the
    `kafka-consumer-groups` tool reads it."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"expected an ISO 8601 date-time such as 2026-12-03T10:15:00Z, got {text!r}"
        ) from None
    return when if when.tzinfo is not None else when.astimezone()


class Reader:
    """An assigned consumer over some partitions of one topic (`open`), read with `messages`."""

    def __init__(self, consumer: Any, topic: str, partitions: Sequence[int]) -> None:
        self._consumer = consumer
        self.topic = topic
        self.partitions = tuple(partitions)
        self.clamped: list[str] = []
        """Start offsets outside the log, moved to its nearest end, in words."""

    @classmethod
    def open(
        cls,
        config: Mapping[str, Any],
        topic: str,
        position: Position,
        *,
        partitions: Sequence[int] | None = None,
        isolation: str = "read_committed",
        timeout: float = 10.0,
    ) -> Reader:
        """Assign `partitions` of `topic` (default: all) at `position`. `config` holds the
        connection settings (bootstrap.servers, security); the reader sets its own group,
        commit and isolation settings over them."""
        from confluent_kafka import Consumer, KafkaException

        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
        conf = {
            **config,
            "group.id": f"{_UNJOINED_PREFIX}{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            # An idle partition's fetch waits this long before the broker answers, and the end
            # of a partition is known only then: a snapshot read stops that much sooner.
            "fetch.wait.max.ms": _FETCH_WAIT_MS,
        }
        try:
            consumer = Consumer(conf)
        except (KafkaException, ValueError, TypeError) as exc:
            raise ReadError(refused(exc, config)) from None
        reader = cls(consumer, topic, ())
        try:
            reader.partitions = reader._partitions(partitions, timeout)
            reader._assign(position, timeout)
        except BaseException:
            reader.close()
            raise
        return reader

    def _partitions(self, wanted: Sequence[int] | None, timeout: float) -> tuple[int, ...]:
        meta = self._metadata(timeout)
        found = meta.topics.get(self.topic)
        if found is None or found.error is not None or not found.partitions:
            why = "" if found is None or found.error is None else f" ({found.error.str()})"
            raise ReadError(f"topic {self.topic!r} does not exist{why}")
        have = sorted(found.partitions)
        if wanted is None:
            return tuple(have)
        missing = [p for p in wanted if p not in found.partitions]
        if missing:
            raise ReadError(
                f"topic {self.topic!r} has no partition {missing[0]} "
                f"(it has {len(have)}: 0 to {have[-1]})"
            )
        return tuple(dict.fromkeys(wanted))

    def _metadata(self, timeout: float) -> Any:
        """The topic's metadata, asked in short requests (`in_slices`) so that a Ctrl-C is
        raised between them, not at the end of the timeout."""
        from confluent_kafka import KafkaException

        consumer, topic = self._consumer, self.topic
        try:
            return in_slices(lambda wait: consumer.list_topics(topic, timeout=wait), timeout)
        except KafkaException as exc:
            raise ReadError(
                f"could not read the metadata of topic {topic!r} within {timeout:g} s "
                f"({_words(exc)}); check the bootstrap servers, or allow more time"
            ) from None

    def _assign(self, position: Position, timeout: float) -> None:
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaException, TopicPartition

        tps = [TopicPartition(self.topic, p) for p in self.partitions]
        try:
            if position.kind == "beginning":
                for tp in tps:
                    tp.offset = OFFSET_BEGINNING
            elif position.kind == "end":
                for tp in tps:
                    tp.offset = OFFSET_END
            elif position.kind == "time":
                for tp in tps:
                    tp.offset = position.time_ms
                found = self._consumer.offsets_for_times(tps, timeout=timeout)
                # No record at or after the time: -1, which is the end.
                tps = [
                    TopicPartition(
                        self.topic, tp.partition, OFFSET_END if tp.offset < 0 else tp.offset
                    )
                    for tp in found
                ]
            else:
                tps = [self._offset(tp, position.offset, timeout) for tp in tps]
        except KafkaException as exc:
            raise ReadError(
                f"could not find the start offsets of {self.topic!r} within {timeout:g} s: "
                f"{_words(exc)}"
            ) from None
        self._consumer.assign(tps)

    def _offset(self, tp: Any, offset: int, timeout: float) -> Any:
        low, high = self._consumer.get_watermark_offsets(tp, timeout=timeout, cached=False)
        wanted = high + offset if offset < 0 else offset
        start = min(max(wanted, low), high)
        # Fewer records than the last N asked for is no surprise (as `tail -n`): no note.
        if start != wanted and not (offset < 0 and start == low):
            edge = "its first" if start == low else "its end"
            self.clamped.append(
                f"partition {tp.partition}: offset {wanted} is outside the log "
                f"({low} to {high}), reading from {edge}, {start}"
            )
        tp.offset = start
        return tp

    def messages(self, *, follow: bool, count: int | None = None) -> Iterator[Any]:
        """The records read, in the order they arrive (per partition, in offset order): at most
        `count`, and without `follow` only up to each partition's end (for read_committed, the
        last stable offset) as it is when reached."""
        if count is not None and count <= 0:
            return
        at_end: set[int] = set()
        seen = 0
        while follow or len(at_end) < len(self.partitions):
            msg = self._consumer.poll(_POLL_S)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == _partition_eof():
                    at_end.add(msg.partition())
                    continue
                if error.code() == _group_refused():
                    # librdkafka looks up the coordinator of the throwaway group.id anyway: a
                    # client without a group ACL is refused that, which a reader never needs.
                    continue
                raise ReadError(f"reading {self.topic!r} failed: {error.str()}")
            yield msg
            seen += 1
            if count is not None and seen >= count:
                return

    def close(self) -> None:
        # An assigned consumer with nothing to commit: close leaves no group behind.
        self._consumer.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def refused(exc: Exception, config: Mapping[str, Any]) -> str:
    """librdkafka's reason for refusing a client's settings, without the value of a secret
    (it quotes an invalid value back)."""
    from weir._secrets import is_secret_key

    reason = _words(exc)
    for prefix in ("Failed to create consumer: ", "Failed to create producer: "):
        reason = reason.removeprefix(prefix)
    for key, value in config.items():
        if is_secret_key(key) and isinstance(value, str) and value:
            reason = reason.replace(value, "***")
    return f"the client refuses its settings: {reason}"


def _partition_eof() -> int:
    from confluent_kafka import KafkaError

    return int(KafkaError._PARTITION_EOF)


def _group_refused() -> int:
    from confluent_kafka import KafkaError

    return int(KafkaError.GROUP_AUTHORIZATION_FAILED)


def _words(exc: Exception) -> str:
    from weir.lag import error_text

    return error_text(exc)
