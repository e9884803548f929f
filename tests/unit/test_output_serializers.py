"""The member's output serializers (`GroupConsumer(value_serializer=..., key_serializer=...)`) on
the in-memory FakeBroker: `ctx.produce` serializes an object in the handler's thread, through
one serializer or a mapping of output topic to serializer; bytes, str and None pass through; what
a serializer raises, or an object without a serializer, fails the record into the failure
policy, and the member goes on. Bad settings are refused where the member is built."""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import BaseModel
from tests.unit.test_outputs import DLQ, IN, OUT, broker_with
from tests.waiting import wait_until

from weir import (
    BatchContext,
    BatchHandler,
    Context,
    FailurePolicy,
    GroupConsumer,
    Handler,
    Record,
    RetryPolicy,
    State,
)
from weir.serde import json_serializer, pydantic_deserializer, pydantic_serializer
from weir.testing.fake_broker import FakeBroker, FakeMessage

pytestmark = pytest.mark.timeout(60)

AUDIT = "audit"
BASE: dict[str, Any] = {"bootstrap_servers": "fake:9092", "group_id": "g", "topics": [IN]}


class Order(BaseModel):
    id: int
    note: str


def order_of(record: Record) -> Order:
    return Order(id=record.offset, note=(record.value or b"").decode())


class Produces(Handler):
    """Produces an `Order` to OUT (keyed by a dict), the raw value to AUDIT as bytes and str,
    and records the thread each call ran on."""

    def __init__(self) -> None:
        self.threads: set[str] = set()

    def handle(self, record: Record, ctx: Context) -> None:
        self.threads.add(threading.current_thread().name)
        ctx.produce(OUT, order_of(record), {"p": record.partition})
        ctx.produce(AUDIT, record.value, record.key)
        ctx.produce(AUDIT, "text", None)


class AsyncProduces(Handler):
    async def handle(self, record: Record, ctx: Context) -> None:
        ctx.produce(OUT, order_of(record), {"p": record.partition})


class BatchProduces(BatchHandler):
    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        for record in records:
            ctx.produce(record, OUT, order_of(record), {"p": record.partition})


class AsyncBatchProduces(BatchHandler):
    async def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        for record in records:
            ctx.produce(record, OUT, order_of(record), {"p": record.partition})


class ProducesObject(Handler):
    """Produces `obj` for the record whose value is b"bad", an `Order` for the others."""

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def handle(self, record: Record, ctx: Context) -> None:
        ctx.produce(OUT, self.obj if record.value == b"bad" else order_of(record))


def member(
    broker: FakeBroker, handler: Handler, members: list[GroupConsumer], **serde: Any
) -> GroupConsumer:
    """A member on `broker` with the serializers `serde`: a record that fails twice is
    dead-lettered."""
    gc = GroupConsumer(
        handler,
        consumer_factory=broker.consumer_factory,
        producer_factory=broker.producer_factory,
        auto_offset_reset="earliest",
        commit_interval_s=0.01,
        failure=FailurePolicy(
            retry=RetryPolicy(max_attempts=2, backoff_initial_s=0.01, jitter=0.0),
            final="dead_letter",
        ),
        **serde,
        **BASE,
    )
    members.append(gc)
    gc.start()
    return gc


def out_messages(broker: FakeBroker, topic: str = OUT) -> list[FakeMessage]:
    return broker.messages(topic)


def header(message: FakeMessage, name: str) -> str:
    return (dict(message.headers() or [])[name] or b"").decode()


def committed_all(broker: FakeBroker, end: int) -> Callable[[], bool]:
    return lambda: sum(broker.committed_offsets("g", IN).values()) == end


def with_topics(broker: FakeBroker) -> FakeBroker:
    """`broker` with the AUDIT topic too."""
    broker.create_topic(AUDIT, partitions=1)
    return broker


@pytest.mark.parametrize(
    ("handler", "transactional_id"),
    [
        (Produces, None),
        (AsyncProduces, None),
        (BatchProduces, None),
        (AsyncBatchProduces, None),
        (Produces, "tx-1"),
    ],
)
def test_objects_are_serialized_and_bytes_and_str_pass_through(
    members: list[GroupConsumer], handler: type[Handler], transactional_id: str | None
) -> None:
    broker = with_topics(broker_with(10))
    h = handler()
    member(
        broker,
        h,
        members,
        value_serializer={OUT: pydantic_serializer(Order), AUDIT: json_serializer()},
        key_serializer=json_serializer(),
        transactional_id=transactional_id,
    )
    wait_until(committed_all(broker, 10), "every record committed", 20)
    tx = [p.transactional_id for p in broker.producers if p.transactional_id is not None]
    assert tx == ([transactional_id] if transactional_id else [])
    read = pydantic_deserializer(Order)
    got = sorted((read(m.value()).id, m.key()) for m in out_messages(broker))
    expected = sorted((o, f'{{"p":{p}}}'.encode()) for p in range(2) for o in range(5))
    assert got == expected
    if isinstance(h, Produces):
        # bytes, str and None are not given to the serializers (JSON would quote them)
        audit = out_messages(broker, AUDIT)
        assert sorted(m.value() or b"" for m in audit) == sorted(
            [f"v{i}".encode() for i in range(10)] + [b"text"] * 10
        )
        assert {m.key() for m in audit} == {None, *(f"k{i}".encode() for i in range(5))}
        assert not any(name.startswith("weir-owner") for name in h.threads)


def test_a_routed_members_handlers_use_its_serializers(members: list[GroupConsumer]) -> None:
    broker = with_topics(broker_with(4))
    settings = {k: v for k, v in BASE.items() if k != "topics"}
    gc = GroupConsumer(
        routes={IN: Produces()},
        value_serializer={OUT: pydantic_serializer(Order), AUDIT: json_serializer()},
        key_serializer=json_serializer(),
        consumer_factory=broker.consumer_factory,
        producer_factory=broker.producer_factory,
        auto_offset_reset="earliest",
        commit_interval_s=0.01,
        **settings,
    )
    members.append(gc)
    gc.start()
    wait_until(committed_all(broker, 4), "every record committed", 20)
    read = pydantic_deserializer(Order)
    assert sorted(read(m.value()).id for m in out_messages(broker)) == [0, 0, 1, 1]


def test_an_object_without_a_serializer_fails_its_record_not_the_member(
    members: list[GroupConsumer],
) -> None:
    """Before serializers, an object given to produce reached the producer on the owner thread,
    whose TypeError stopped the member; now it fails the record in the handler's thread, and
    the record is dead-lettered by its policy with a message naming the topic and the
    setting."""
    broker = broker_with(0)
    gc = member(broker, ProducesObject(object()), members)
    broker.produce(IN, key="k", value="bad", partition=0)
    broker.produce(IN, key="k", value="bad", partition=1)
    wait_until(committed_all(broker, 2), "both records dead-lettered", 20)
    [letter, _] = out_messages(broker, DLQ)
    assert header(letter, "weir.dlq.exception") == "builtins.TypeError"
    message = header(letter, "weir.dlq.message")
    assert "ctx.produce to 'out': the value is a object" in message
    assert "the member has no value_serializer" in message
    # stats() is the owner's last published snapshot, which may predate the commit just seen.
    wait_until(lambda: gc.stats().dead_lettered == 2, "both dead letters in the stats", 5)
    assert gc.state is State.RUNNING
    assert out_messages(broker) == []


def test_a_mapping_without_the_topic_and_a_raising_serializer_fail_the_record(
    members: list[GroupConsumer],
) -> None:
    broker = broker_with(0)

    def refuse(obj: Any) -> bytes:
        raise ValueError(f"cannot write {obj!r}")

    gc = member(
        broker,
        ProducesObject(Order(id=-1, note="x")),
        members,
        value_serializer=refuse,
        key_serializer={"elsewhere": json_serializer()},
    )
    broker.produce(IN, key="k", value="bad", partition=0)
    wait_until(committed_all(broker, 1), "dead-lettered", 20)
    [letter] = out_messages(broker, DLQ)
    assert header(letter, "weir.dlq.exception") == "builtins.ValueError"
    assert header(letter, "weir.dlq.message").startswith("cannot write Order(id=-1")

    class KeyedObject(Handler):
        def handle(self, record: Record, ctx: Context) -> None:
            ctx.produce(OUT, b"raw", object())

    broker = broker_with(0)
    gc = member(broker, KeyedObject(), members, key_serializer={"elsewhere": json_serializer()})
    broker.produce(IN, key="k", value="v", partition=0)
    wait_until(committed_all(broker, 1), "dead-lettered", 20)
    [letter] = out_messages(broker, DLQ)
    message = header(letter, "weir.dlq.message")
    assert "key_serializer has no entry for 'out' (it has 'elsewhere')" in message
    assert gc.state is State.RUNNING


def test_a_serializer_returning_something_else_than_bytes_fails_the_record(
    members: list[GroupConsumer],
) -> None:
    broker = broker_with(0)
    member(broker, ProducesObject(Order(id=1, note="x")), members, value_serializer=lambda o: 5)
    broker.produce(IN, key="k", value="bad", partition=0)
    wait_until(committed_all(broker, 1), "dead-lettered", 20)
    [letter] = out_messages(broker, DLQ)
    message = header(letter, "weir.dlq.message")
    assert "returned a int: a serializer must return bytes, str or None" in message


async def _async_read(data: object) -> object:
    return data


def _generator_read(data: bytes | None) -> Iterator[bytes | None]:
    yield data


@pytest.mark.parametrize(
    ("setting", "given", "says"),
    [
        ("value_serializer", b"not callable", "value_serializer must be a function from an object"),
        ("key_serializer", {1: json_serializer()}, "keys must be topic names (str), got 1"),
        ("value_serializer", {"": json_serializer()}, "keys must be topic names (str), got ''"),
        ("value_serializer", {OUT: "json"}, "value_serializer['out'] must be a function"),
        ("value_serializer", Order, "got the pydantic model Order: pydantic_serializer(Order)"),
        ("value_serializer", {OUT: Order}, "value_serializer['out'] must be a function"),
        ("value_deserializer", {2: pydantic_deserializer(Order)}, "got 2"),
        ("value_deserializer", Order, "pydantic_deserializer(Order)"),
        ("key_deserializer", 3, "key_deserializer must be a function from bytes"),
        # Called and never awaited or iterated: each record carried a coroutine or a generator
        # where its value belongs, silently.
        ("value_deserializer", _async_read, "_async_read is async def"),
        ("value_serializer", {OUT: _async_read}, "value_serializer['out'] must be a plain"),
        ("key_deserializer", _generator_read, "_generator_read is a generator function"),
    ],
)
def test_bad_settings_are_refused_where_the_member_is_built(
    setting: str, given: object, says: str
) -> None:
    with pytest.raises(TypeError) as info:
        settings: dict[str, Any] = {setting: given, **BASE}
        GroupConsumer(Produces(), **settings)
    assert says in str(info.value)


def test_a_serializer_for_a_function_handler_is_refused() -> None:
    """A function handler is called with the record alone: it has no `ctx.produce` for the
    serializers to serve."""

    def handle(record: Record) -> None:
        pass

    with pytest.raises(TypeError, match=r"'.*handle' is a function, called without a Context"):
        GroupConsumer(handle, value_serializer=json_serializer(), **BASE)


class ProducesBadly(Handler):
    """For the record whose value is b"bad", produces with `bad` (keyword arguments of
    `ctx.produce`); for the others, a plain output."""

    def __init__(self, **bad: Any) -> None:
        self.bad = bad

    def handle(self, record: Record, ctx: Context) -> None:
        if record.value == b"bad":
            bad = dict(self.bad)
            ctx.produce(bad.pop("topic", OUT), b"v", **bad)
        else:
            ctx.produce(OUT, b"ok")


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ({"headers": [("h", 5)]}, "header 'h': a value is bytes, str or None, got int"),
        ({"headers": [("h",)]}, "headers are (name, value) pairs, got ('h',)"),
        ({"headers": [(b"h", b"v")]}, "a header name is a str, got b'h'"),
        ({"headers": "h=v"}, "headers are a list of (name, value) pairs or a dict, got str"),
        ({"partition": "0"}, "partition is an int (or None), got '0'"),
        ({"partition": True}, "partition is an int (or None), got True"),
        ({"partition": -2}, "partition is >= 0, or None (or -1) for the partitioner, got -2"),
        ({"topic": "bad topic!"}, "'bad topic!' is not a topic name (1-249 of A-Z a-z 0-9 . _ -"),
        ({"topic": "x" * 250}, "is not a topic name (1-249 of"),
    ],
)
def test_bad_headers_or_partition_fail_the_record_in_the_handler_not_the_member(
    members: list[GroupConsumer], bad: dict[str, Any], said: str
) -> None:
    """Regression: headers the producer refuses reached it on the owner thread, whose TypeError
    stopped the member; they are checked in `ctx.produce`, in the handler's thread, so only
    their record fails (here into its dead letter) and the member goes on. A topic name Kafka
    refuses too: it was produced, and refused by the broker only at delivery."""
    broker = broker_with(0)
    gc = member(broker, ProducesBadly(**bad), members)
    broker.produce(IN, key="k", value="bad", partition=0)
    broker.produce(IN, key="k", value="fine", partition=1)
    wait_until(committed_all(broker, 2), "both records committed", 20)
    [letter] = out_messages(broker, DLQ)
    value_error = "topic" in bad or bad.get("partition") == -2
    error = "builtins.ValueError" if value_error else "builtins.TypeError"
    assert header(letter, "weir.dlq.exception") == error
    assert said in header(letter, "weir.dlq.message")
    assert gc.state is State.RUNNING
    assert [m.value() for m in out_messages(broker)] == [b"ok"]
    assert broker.topics().keys() == {IN, OUT, DLQ}  # no topic of the bad name was made


class ProducesToPartition(Handler):
    """One output per record, keyed by the record's key, to `partition` given as is."""

    def __init__(self, partition: int | None) -> None:
        self.partition = partition

    def handle(self, record: Record, ctx: Context) -> None:
        ctx.produce(OUT, record.value, record.key, partition=self.partition)


@pytest.mark.parametrize("partition", [None, -1, 2])
def test_an_output_without_a_partition_or_with_minus_one_goes_where_its_key_hashes(
    members: list[GroupConsumer], partition: int | None
) -> None:
    """-1 is the producer's own "no partition" (confluent-kafka's default): the partitioner
    picks by the key, as for None; a partition given is kept."""
    broker = broker_with(10)
    member(broker, ProducesToPartition(partition), members)
    wait_until(committed_all(broker, 10), "every record committed", 20)
    outs = out_messages(broker)
    assert len(outs) == 10
    for m in outs:
        expected = 2 if partition == 2 else zlib.crc32(m.key() or b"") % 3
        assert m.partition() == expected
