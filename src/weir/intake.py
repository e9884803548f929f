"""From what one consume call returned to runs of `Record`s, one run per partition stretch.

This runs on the owner thread once per record, the one thread every record passes: the `Record`
is built inline with `tuple.__new__`, from the fields the engine needs (topic, partition, offset,
key, size) and the value; the rest stays in the client's message until a handler asks. Reading
every field column by column (`map` over the client's method descriptors, then `zip`) measured
no faster once the error, null and run checks were added, so there is one path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from confluent_kafka import KafkaError

from weir.records import Record, header_bytes

__all__ = ["Run", "runs_of"]

# tuple.__new__ skips NamedTuple's keyword handling.
_new_record = tuple.__new__


class Run(NamedTuple):
    """Records of one partition with strictly increasing offsets, in delivery order."""

    topic: str
    partition: int
    records: list[Record]
    offsets: list[int]
    nbytes: int


def runs_of(msgs: list[Any], on_error: Callable[[KafkaError], None]) -> list[Run]:
    """Split one consume call's messages into runs (a new run at every change of partition and
    at every rewind); error messages go to `on_error` and are left out."""
    runs: list[Run] = []
    recs: list[Record] = []
    offsets: list[int] = []
    nbytes = 0
    topic = ""
    part = last = -1
    for m in msgs:
        err = m.error()
        if err is not None:
            on_error(err)
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
        recs.append(_new_record(Record, (t, p, off, key, value, size, m)))
        offsets.append(off)
        nbytes += size
        last = off
    if recs:
        runs.append(Run(topic, part, recs, offsets, nbytes))
    return runs
