"""From consumed messages to runs of records.

Real `confluent_kafka.Message` objects (the client lets tests build them), no broker.
"""

from __future__ import annotations

import copy
import gc
import pickle
import re
import sys
from itertools import pairwise
from typing import Any

import pytest
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    Message,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from weir._engine.intake import Run, runs_of
from weir.records import Record


def msg(
    offset: int,
    *,
    partition: int = 0,
    topic: str = "t",
    key: bytes | None = b"k",
    value: bytes | None = b"value",
    headers: list[tuple[str, str | bytes | None]] | None = None,
    timestamp: tuple[int, int] = (TIMESTAMP_CREATE_TIME, 1_700_000_000_000),
    leader_epoch: int | None = 3,
    error: KafkaError | None = None,
) -> Message:
    fields: dict[str, Any] = {"leader_epoch": leader_epoch} if leader_epoch is not None else {}
    return Message(
        topic=topic,
        partition=partition,
        offset=offset,
        key=key,
        value=value,
        headers=headers,
        timestamp=timestamp,
        error=error,
        **fields,  # the constructor takes no None here; left out, the message has none
    )


def test_a_record_carries_every_field_and_its_size() -> None:
    m = msg(7, partition=2, headers=[("h", b"xy"), ("n", None)], leader_epoch=5)
    (run,) = runs_of([m], lambda e, m: None)
    assert run == Run("t", 2, run.records, [7], 1 + 5 + (1 + 2) + 1)
    (rec,) = run.records
    assert type(rec) is Record
    assert rec == Record(
        topic="t",
        partition=2,
        offset=7,
        key=b"k",
        value=b"value",
        headers=(("h", b"xy"), ("n", None)),
        timestamp=1_700_000_000_000,
        leader_epoch=5,
        size=10,
    )


def test_no_timestamp_null_key_null_value() -> None:
    m = msg(0, key=None, value=None, timestamp=(TIMESTAMP_NOT_AVAILABLE, 0), leader_epoch=None)
    (run,) = runs_of([m], lambda e, m: None)
    (rec,) = run.records
    assert (rec.key, rec.value, rec.timestamp, rec.leader_epoch, rec.size) == (
        None,
        None,
        None,
        None,
        0,
    )


def test_runs_split_at_partition_changes_and_rewinds() -> None:
    msgs = [msg(5), msg(6), msg(0, partition=1), msg(1, partition=1), msg(6), msg(7)]
    runs = runs_of(msgs, lambda e, m: None)
    assert [(r.partition, r.offsets) for r in runs] == [(0, [5, 6]), (1, [0, 1]), (0, [6, 7])]
    rewound = [msg(5), msg(6), msg(4), msg(5)]  # the client went back inside one call
    assert [r.offsets for r in runs_of(rewound, lambda e, m: None)] == [[5, 6], [4, 5]]


def test_error_messages_are_reported_and_left_out() -> None:
    eof = KafkaError(KafkaError._PARTITION_EOF)
    msgs = [msg(1), msg(2, error=eof), msg(3)]
    errors: list[KafkaError] = []
    runs = runs_of(msgs, lambda e, m: errors.append(e))
    assert [r.offsets for r in runs] == [[1, 3]]
    assert [e.code() for e in errors] == [KafkaError._PARTITION_EOF]


_headers = st.none() | st.lists(
    st.tuples(st.sampled_from(["a", "bb"]), st.none() | st.binary(max_size=4)), max_size=2
)
_message = st.builds(
    lambda partition, step, key, value, headers, stamp, epoch: (
        partition,
        step,
        {"key": key, "value": value, "headers": headers, "timestamp": stamp, "leader_epoch": epoch},
    ),
    st.integers(0, 2),
    st.integers(-2, 3),  # the offset step: <= 0 is a rewind
    st.none() | st.binary(max_size=3),
    st.none() | st.binary(max_size=6),
    _headers,
    st.tuples(
        st.sampled_from(
            [TIMESTAMP_NOT_AVAILABLE, TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME]
        ),
        st.integers(0, 2**41),
    ),
    st.none() | st.integers(0, 9),
)


def position_of(m: Message) -> int:
    offset = m.offset()
    assert offset is not None
    return offset


@settings(max_examples=200, deadline=None)
@given(st.lists(_message, min_size=1, max_size=30), st.booleans())
def test_runs_are_maximal_single_partition_stretches_in_delivery_order(
    specs: list[tuple[int, int, dict[str, Any]]], one_topic: bool
) -> None:
    position = {0: 100, 1: 200, 2: 300}
    msgs = []
    for i, (partition, step, fields) in enumerate(specs):
        position[partition] = max(0, position[partition] + step)
        topic = "t" if one_topic or i % 3 else "u"
        msgs.append(msg(position[partition], partition=partition, topic=topic, **fields))
    runs = runs_of(msgs, lambda e, m: None)
    records = [r for run in runs for r in run.records]
    # Every message once, in delivery order, with its own fields.
    assert [(r.topic, r.partition, r.offset) for r in records] == [
        (m.topic(), m.partition(), m.offset()) for m in msgs
    ]
    for m, r in zip(msgs, records, strict=True):
        stamp_type, stamp = m.timestamp()
        assert (r.key, r.value, r.leader_epoch) == (m.key(), m.value(), m.leader_epoch())
        assert r.headers == tuple(m.headers() or ())
        assert r.timestamp == (None if stamp_type == TIMESTAMP_NOT_AVAILABLE else stamp)
        assert r.size == len(r.key or b"") + len(r.value or b"") + sum(
            len(k) + len(v or b"") for k, v in r.headers
        )
    for run in runs:
        assert {(r.topic, r.partition) for r in run.records} == {(run.topic, run.partition)}
        assert run.offsets == [r.offset for r in run.records]
        assert all(a < b for a, b in pairwise(run.offsets))
        assert run.nbytes == sum(r.size for r in run.records)
    # Maximal: a run ends only where the partition changes or the offset goes back.
    for before, after in pairwise(runs):
        same = (before.topic, before.partition) == (after.topic, after.partition)
        assert not same or after.offsets[0] <= before.offsets[-1]


def test_a_record_keeps_no_reference_to_the_clients_message() -> None:
    """Every field is read at intake and the message dies with the consume call's list: a record
    in flight is one object for the cyclic garbage collector to walk, not two."""
    m = msg(4, headers=[("h", b"xy")], leader_epoch=2)
    before = sys.getrefcount(m)
    (run,) = runs_of([m], lambda e, m: None)
    (rec,) = run.records
    assert sys.getrefcount(m) == before
    assert not any(isinstance(o, Message) for o in gc.get_referents(rec))
    assert (rec.timestamp, rec.leader_epoch, rec.headers) == (1_700_000_000_000, 2, (("h", b"xy"),))


def test_the_deserialized_fields_are_the_raw_ones_until_a_deserializer_runs() -> None:
    """Read without a deserializer, `deserialized_key` / `deserialized_value` are the raw bytes,
    from a slot that holds them: reading them raised and caught an AttributeError each time
    (16 times as long as reading `value`), in every handler of a member without deserializers
    that reads them as the docs show."""
    made = runs_of([msg(4, key=b"k", value=b"v")], lambda e, m: None)[0].records[0]
    built = Record("t", 0, 4, b"k", b"v")
    raised: list[str] = []

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if event == "exception":
            raised.append(f"{frame.f_code.co_name}: {arg[0].__name__}")
        return trace

    sys.settrace(trace)
    try:
        read = [(r.deserialized_key, r.deserialized_value) for r in (made, built)]
    finally:
        sys.settrace(None)
    assert read == [(b"k", b"v"), (b"k", b"v")]
    assert raised == []


def test_a_record_is_immutable() -> None:
    (rec,) = runs_of([msg(4, headers=[("h", b"xy")])], lambda e, m: None)[0].records
    for name in ("topic", "partition", "offset", "key", "value", "headers", "timestamp", "size"):
        with pytest.raises(AttributeError):
            setattr(rec, name, None)
    with pytest.raises(AttributeError):
        rec.extra = 1  # type: ignore[attr-defined]
    assert type(rec.headers) is tuple  # the handler gets a copy, never the message's own list
    assert rec.offset == 4 and rec.headers == (("h", b"xy"),)


def test_a_record_is_no_sequence() -> None:
    """Regression: `Record` was a tuple subclass, so `len(record)` was 7, iterating it yielded the
    engine's internals (the client's message among them) and `sorted()` of two records compared
    those internals, raising a TypeError only when the first fields tied. A record is a plain
    object: no length, no items, no order of its own; sort by a field."""
    first, second = runs_of([msg(4), msg(5)], lambda e, m: None)[0].records
    assert not isinstance(first, tuple)
    with pytest.raises(TypeError):
        len(first)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        iter(first)  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        sorted([second, first])  # type: ignore[type-var]
    assert sorted([second, first], key=lambda r: r.offset) == [first, second]


def test_a_delivered_record_pickles_copies_and_compares_by_its_fields() -> None:
    (rec,) = runs_of([msg(4, headers=[("h", b"xy")], leader_epoch=2)], lambda e, m: None)[0].records
    for twin in (pickle.loads(pickle.dumps(rec)), copy.copy(rec), copy.deepcopy(rec)):
        assert twin == rec and (twin != rec) is False and hash(twin) == hash(rec)
        assert twin.fields() == rec.fields()
    by_hand = Record("t", 0, 4, b"k", b"value", (("h", b"xy"),), 1_700_000_000_000, 2)
    assert by_hand == rec and by_hand.size == rec.size == 1 + 5 + 3
    assert by_hand != Record("t", 0, 4, b"k", b"other", (("h", b"xy"),), 1_700_000_000_000, 2)
    assert rec != ("t", 0, 4) and rec != rec.fields()
    assert repr(by_hand) == (
        "Record(topic='t', partition=0, offset=4, key=b'k', value=b'value', "
        "headers=(('h', b'xy'),), timestamp=1700000000000, leader_epoch=2, size=9)"
    )
    assert (rec.event_id, rec.tp) == ("t/0/4", ("t", 0))


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        (("t", 0, 0), {"value": "hello"}, TypeError, "value must be bytes or None, got str: en"),
        (("t", 0, 0), {"key": 5}, TypeError, "key must be bytes or None, got int"),
        (("t", "0", 0), {}, TypeError, "partition must be an int, got '0'"),
        (("t", True, 0), {}, TypeError, "partition must be an int, got True"),
        (("t", 0, 1.5), {}, TypeError, "offset must be an int, got 1.5"),
        (("t", 0, -1), {}, ValueError, "offset must be >= 0, got -1"),
        ((None, 0, 0), {}, TypeError, "topic must be a non-empty str, got None"),
        (("", 0, 0), {}, TypeError, "topic must be a non-empty str, got ''"),
        (("t", 0, 0), {"timestamp": "now"}, TypeError, "timestamp must be an int or None"),
        (("t", 0, 0), {"leader_epoch": 1.0}, TypeError, "leader_epoch must be an int or None"),
        (("t", 0, 0), {"size": -1}, ValueError, "size must be >= 0, got -1"),
        (("t", 0, 0), {"headers": [("h",)]}, TypeError, "(name, value) pairs, got ('h',)"),
        (("t", 0, 0), {"headers": "h=1"}, TypeError, "pairs or a dict, got str"),
        (("t", 0, 0), {"headers": [("h", 1)]}, TypeError, "a value is bytes, str or None"),
    ],
)
def test_a_record_built_by_hand_names_a_wrong_field_at_once(
    args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    """A test's or a tool's record: the wrong type is named where it was given, not met later
    as a handler's or a deserializer's puzzle."""
    with pytest.raises(error, match="^(Record )?.*" + re.escape(message)):
        Record(*args, **kwargs)


def test_a_record_built_by_hand_takes_its_headers_as_a_dict_too() -> None:
    assert Record("t", 0, 0, headers={"h": b"xy", "n": None}).headers == (("h", b"xy"), ("n", None))
    assert Record("t", 0, 0, headers={"h": b"xy"}).size == 3
