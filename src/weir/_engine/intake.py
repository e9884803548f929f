"""From what one consume call returned to runs of `Record`s, one run per partition stretch.

This runs on the owner thread once per record, the one thread every record passes: the `Record`
is built inline, without calling its `__init__` (slot stores only), from the fields the engine
needs (topic, partition, offset, key, size) and the value; the rest stays in the client's
message until a handler asks. Reading every field column by column (`map` over the client's
method descriptors, then `zip`) measured no faster once the error, null and run checks were
added, so there is one path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol, cast

from confluent_kafka import KafkaError

from weir._engine.client import KafkaMessage
from weir.records import Record, header_bytes

__all__ = ["Run", "runs_of"]

_new = object.__new__


class _Delivered(KafkaMessage, Protocol):
    """A message that is not an error event: it has a place in a partition."""

    def topic(self) -> str: ...
    def partition(self) -> int: ...
    def offset(self) -> int: ...


class Run(NamedTuple):
    """Records of one partition with strictly increasing offsets, in delivery order."""

    topic: str
    partition: int
    records: list[Record]
    offsets: list[int]
    nbytes: int


def runs_of(
    msgs: Sequence[KafkaMessage], on_error: Callable[[KafkaError, KafkaMessage], None]
) -> list[Run]:
    """Split one consume call's messages into runs (a new run at every change of partition and
    at every rewind); error events go to `on_error` (with their message, which may name a
    partition) and are left out."""
    delivered = cast("Sequence[_Delivered]", msgs)  # error events are skipped before any use
    runs: list[Run] = []
    recs: list[Record] = []
    offsets: list[int] = []
    nbytes = 0
    topic = ""
    part = last = -1
    for m in delivered:
        err = m.error()
        if err is not None:
            on_error(err, m)
            continue
        t, p, off = m.topic(), m.partition(), m.offset()
        if p != part or off <= last or t != topic:
            if recs:
                runs.append(Run(topic, part, recs, offsets, nbytes))
            recs, offsets, nbytes = [], [], 0
            topic, part = t, p
        key, value = m.key(), m.value()
        size = (len(key) if key else 0) + (len(value) if value else 0)
        headers = m.headers()
        if headers:
            size += header_bytes(headers)
        rec = _new(Record)
        rec._topic = t
        rec._partition = p
        rec._offset = off
        rec._key = key
        rec._value = value
        rec._size = size
        rec._src = m
        recs.append(rec)
        offsets.append(off)
        nbytes += size
        last = off
    if recs:
        runs.append(Run(topic, part, recs, offsets, nbytes))
    return runs
