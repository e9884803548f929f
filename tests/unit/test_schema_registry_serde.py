"""Schema-registry serializers and deserializers through weir's wrappers, with confluent-kafka's
own Avro, JSON Schema and Protobuf serdes against its in-memory registry (`mock://`): what
`schema_registry_serializer` writes, `schema_registry_deserializer` reads back, through a
member's `ctx.produce` too. They skip only where the optional extras are not installed
(`kafka-weir[avro]`, `[json-schema]`, `[protobuf]`; `make test` installs all three)."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.test_output_serializers import header, member, out_messages
from tests.unit.test_outputs import DLQ, IN, OUT, broker_with
from tests.waiting import wait_until

from weir import Context, GroupConsumer, Handler, Record
from weir.serde import schema_registry_deserializer, schema_registry_serializer

pytestmark = pytest.mark.timeout(60)

ORDER_AVRO = """
{"type": "record", "name": "Order",
 "fields": [{"name": "id", "type": "long"}, {"name": "total", "type": "double"}]}
"""
ORDER_JSON = """
{"type": "object", "title": "Order", "required": ["id", "total"],
 "properties": {"id": {"type": "integer"}, "total": {"type": "number"}}}
"""
KEY_AVRO = '{"type": "record", "name": "Key", "fields": [{"name": "p", "type": "int"}]}'


def registry(name: str) -> Any:
    """confluent-kafka's in-memory registry: its own subjects and ids, per name."""
    pytest.importorskip("confluent_kafka.schema_registry.avro", reason="kafka-weir[avro]")
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient.new_client({"url": f"mock://{name}"})


def test_avro_round_trips_through_the_wrappers_under_the_topics_subjects() -> None:
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer

    client = registry("avro-round-trip")
    write = schema_registry_serializer(AvroSerializer(client, ORDER_AVRO), "orders.out")
    write_key = schema_registry_serializer(AvroSerializer(client, KEY_AVRO), "orders.out", "key")
    read = schema_registry_deserializer(AvroDeserializer(client), "orders.out")
    read_key = schema_registry_deserializer(AvroDeserializer(client), "orders.out", "key")
    data, key = write({"id": 7, "total": 2.5}), write_key({"p": 1})
    assert isinstance(data, bytes) and data[:1] == b"\x00"  # the registry's framing
    assert read(data) == {"id": 7, "total": 2.5}
    assert read_key(key) == {"p": 1}
    assert sorted(client.get_subjects()) == ["orders.out-key", "orders.out-value"]


def test_json_schema_round_trips_and_refuses_what_the_schema_does_not_allow() -> None:
    pytest.importorskip("jsonschema", reason="kafka-weir[json-schema]")
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
    from confluent_kafka.serialization import SerializationError

    client = registry("json-round-trip")
    write = schema_registry_serializer(JSONSerializer(ORDER_JSON, client), "audit")
    read = schema_registry_deserializer(
        JSONDeserializer(ORDER_JSON, schema_registry_client=client), "audit"
    )
    assert read(write({"id": 1, "total": 9.75})) == {"id": 1, "total": 9.75}
    with pytest.raises(SerializationError, match="'x' is not of type 'integer'"):
        write({"id": "x", "total": 1.0})
    assert client.get_subjects() == ["audit-value"]


class ProducesOrders(Handler):
    """An Avro output per record: its offset and value's length, keyed by its partition; the
    record whose value is b"bad" gives an id the schema refuses."""

    def handle(self, record: Record, ctx: Context) -> None:
        value = record.value or b""
        order_id: object = "bad" if value == b"bad" else record.offset
        ctx.produce(OUT, {"id": order_id, "total": float(len(value))}, {"p": record.partition})


def test_a_members_outputs_are_avro_that_the_deserializer_reads_back(
    members: list[GroupConsumer],
) -> None:
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer

    client = registry("avro-member")
    broker = broker_with(6)
    gc = member(
        broker,
        ProducesOrders(),
        members,
        value_serializer={OUT: schema_registry_serializer(AvroSerializer(client, ORDER_AVRO), OUT)},
        key_serializer=schema_registry_serializer(AvroSerializer(client, KEY_AVRO), OUT, "key"),
    )
    broker.produce(IN, key="k", value="bad", partition=0)
    ends = {(IN, 0): 4, (IN, 1): 3}
    wait_until(lambda: broker.committed_offsets("g", IN) == ends, "all committed", 20)
    read = schema_registry_deserializer(AvroDeserializer(client), OUT)
    read_key = schema_registry_deserializer(AvroDeserializer(client), OUT, "key")
    got = sorted((read_key(m.key())["p"], read(m.value())["id"]) for m in out_messages(broker))
    assert got == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert {read(m.value())["total"] for m in out_messages(broker)} == {2.0}  # b"v0" ... b"v5"
    # The object the schema refuses fails its record (retried, then dead-lettered).
    [letter] = out_messages(broker, DLQ)
    assert header(letter, "weir.dlq.message") == "an integer is required on field id"
    # stats() is the owner's last published snapshot, which may predate the commit just seen.
    wait_until(lambda: gc.stats().dead_lettered == 1, "the dead letter in the stats", 5)


@pytest.mark.parametrize("wrap", [schema_registry_serializer, schema_registry_deserializer])
@pytest.mark.parametrize(
    ("args", "error", "says"),
    [
        ((lambda o, c: b"", "orders", "keys"), ValueError, 'field must be "key" or "value"'),
        ((lambda o, c: b"", "", "value"), TypeError, "topic must be a topic name"),
        (("AvroSerializer", "orders", "value"), TypeError, "wraps a confluent-kafka"),
    ],
)
def test_bad_arguments_are_refused_where_the_wrapper_is_built(
    wrap: Any, args: tuple[Any, ...], error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        wrap(*args)


def proto_order() -> Any:
    """A Protobuf message class `weirtest.Order {int64 id = 1; double total = 2;}`, built from
    its descriptor (no protoc) in a pool of its own."""
    pytest.importorskip("confluent_kafka.schema_registry.protobuf", reason="kafka-weir[protobuf]")
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="weirtest/order.proto", package="weirtest", syntax="proto3"
    )
    order = proto.message_type.add(name="Order")
    order.field.add(name="id", number=1, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    order.field.add(name="total", number=2, type=field.TYPE_DOUBLE, label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("weirtest.Order"))


PROTO_CONF = {"use.deprecated.format": False}


def test_protobuf_round_trips_through_the_wrappers_under_the_topics_subject() -> None:
    order = proto_order()
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer

    client = registry("protobuf-round-trip")
    write = schema_registry_serializer(ProtobufSerializer(order, client, PROTO_CONF), "orders.out")
    read = schema_registry_deserializer(ProtobufDeserializer(order, PROTO_CONF), "orders.out")
    data = write(order(id=7, total=2.5))
    assert isinstance(data, bytes) and data[:1] == b"\x00"  # the registry's framing
    assert read(data) == order(id=7, total=2.5)
    assert client.get_subjects() == ["orders.out-value"]


class ProducesProtoOrders(Handler):
    """A Protobuf output per record (its offset and value's length); the record whose value is
    b"bad" gives a dict, which the serializer refuses."""

    def __init__(self, order: Any) -> None:
        self.order = order

    def handle(self, record: Record, ctx: Context) -> None:
        value = record.value or b""
        total = float(len(value))
        out = {"id": 1} if value == b"bad" else self.order(id=record.offset, total=total)
        ctx.produce(OUT, out)


def test_a_members_outputs_are_protobuf_that_the_deserializer_reads_back(
    members: list[GroupConsumer],
) -> None:
    order = proto_order()
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer

    client = registry("protobuf-member")
    broker = broker_with(6)
    write = schema_registry_serializer(ProtobufSerializer(order, client, PROTO_CONF), OUT)
    gc = member(broker, ProducesProtoOrders(order), members, value_serializer=write)
    broker.produce(IN, key="k", value="bad", partition=0)
    ends = {(IN, 0): 4, (IN, 1): 3}
    wait_until(lambda: broker.committed_offsets("g", IN) == ends, "all committed", 20)
    read = schema_registry_deserializer(ProtobufDeserializer(order, PROTO_CONF), OUT)
    got = [read(m.value()) for m in out_messages(broker)]
    assert sorted(o.id for o in got) == [0, 0, 1, 1, 2, 2]
    assert {o.total for o in got} == {2.0}  # b"v0" ... b"v5"
    # The object the serializer refuses fails its record (retried, then dead-lettered).
    [letter] = out_messages(broker, DLQ)
    assert header(letter, "weir.dlq.message") == (
        "message must be of type <class 'Order'> not <class 'dict'>"
    )
    wait_until(lambda: gc.stats().dead_lettered == 1, "the dead letter in the stats", 5)
