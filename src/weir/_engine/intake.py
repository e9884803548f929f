"""From what one consume call returned to runs of `Record`s, one run per partition stretch.

This runs on the owner thread once per record, the one thread every record passes: the `Record`
is built inline, without calling its `__init__` (slot stores only), with every field read from
the client's message here. The record keeps no reference to the message: the message dies with
the consume call's list, and a record in flight is then one object for Python's cyclic garbage
collector, not two; the collector's passes over records in flight were the largest part of the
owner's time with a fast handler (benchmarks/README.md). Reading every field column by column
(`map` over the client's method descriptors, then `zip`) measured no faster once the error, null
and run checks were added, so there is one path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol, cast

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaError

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
    no_stamp = TIMESTAMP_NOT_AVAILABLE
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
        rec._key = rec._dkey = key
        rec._value = rec._dvalue = value  # raw until a deserializer runs
        rec._size = size
        rec._headers = headers
        kind, stamp = m.timestamp()
        rec._timestamp = None if kind == no_stamp else stamp
        rec._leader_epoch = m.leader_epoch()
        recs.append(rec)
        offsets.append(off)
        nbytes += size
        last = off
    if recs:
        runs.append(Run(topic, part, recs, offsets, nbytes))
    return runs
