"""Deserializers for record keys and values: plain callables from bytes to whatever the
handler wants, run on the worker right before the handler (or over a batch, before
`handle_batch`).

A deserializer that raises makes the record fail with `DeserializationError`, which goes to the
final failure policy without retries (the bytes will not change); a dead letter keeps the raw
bytes. The handler reads `record.deserialized_key` / `record.deserialized_value`; `key` and
`value` stay the raw bytes. A batch handler is given the records of its batch that deserialized;
one that did not fails alone, and in key and partition mode the later records of its lane wait
for it (they run again after it, in offset order), as after `BatchContext.fail`.

Built in: `json_deserializer()` and `pydantic_deserializer(Model)`. Avro, Protobuf and JSON
Schema through a schema registry: wrap one of confluent-kafka's schema-registry deserializers
with `schema_registry_deserializer` (docs/failures.md shows how; it needs
`pip install "kafka-weir[avro]"` or the protobuf / json-schema extras).

Serializers are the mirror, for the outputs of `ctx.produce` (`GroupConsumer(value_serializer=
..., key_serializer=...)`, docs/producing.md): `json_serializer()`, `pydantic_serializer(Model)`
and `schema_registry_serializer`, each called in the handler's thread.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from weir._serializing import OUTPUT_SERIALIZERS, OutputSerializers, for_topic
from weir._wrapping import Wrapper, await_plain, call_plain
from weir.errors import DeserializationError
from weir.records import (
    BatchContext,
    BatchHandler,
    Context,
    Handler,
    Record,
    is_async_handler,
    runs_nothing,
)

__all__ = [
    "AsyncDeserializingBatchHandler",
    "AsyncDeserializingHandler",
    "Deserializer",
    "DeserializingBatchHandler",
    "DeserializingHandler",
    "Serializer",
    "json_deserializer",
    "json_serializer",
    "pydantic_deserializer",
    "pydantic_serializer",
    "schema_registry_deserializer",
    "schema_registry_serializer",
]

Deserializer = Callable[[bytes | None], Any]
"""Raw bytes (None for a null key or value) to the object the handler reads."""

M = TypeVar("M", bound=BaseModel)

Serializer = Callable[[Any], bytes | None]
"""An object to the bytes of an output's key or value (`ctx.produce`); the mirror of a
`Deserializer`. Called in the handler's thread: what it raises fails the record there."""

Serializers = Serializer | Mapping[str, Serializer]
"""What `GroupConsumer(value_serializer=..., key_serializer=...)` takes: one serializer for
every output topic, or a mapping of output topic to serializer."""


def json_serializer(*, allow_null: bool = True) -> Callable[[object], bytes | None]:
    """Python objects to UTF-8 JSON (what `json_deserializer` reads); None stays a null key
    or value unless `allow_null` is False (then it raises)."""

    def serialize(obj: object) -> bytes | None:
        if obj is None:
            if allow_null:
                return None
            raise ValueError("None where JSON was expected")
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()

    return serialize


def pydantic_serializer(model: type[M]) -> Callable[[M], bytes]:
    """`model` instances to JSON (what `pydantic_deserializer(model)` reads); anything else
    is refused with a TypeError naming what it got."""

    def serialize(obj: M) -> bytes:
        if not isinstance(obj, model):
            raise TypeError(f"expected a {model.__name__}, got {type(obj).__name__}")
        return obj.model_dump_json().encode()

    return serialize


def json_deserializer(*, allow_null: bool = True) -> Deserializer:
    """UTF-8 JSON to Python objects; a null key or value stays None unless `allow_null` is
    False (then it is a failure)."""

    def deserialize(data: bytes | None) -> Any:
        if data is None:
            if allow_null:
                return None
            raise ValueError("null where JSON was expected")
        return json.loads(data)

    return deserialize


def pydantic_deserializer(model: type[M]) -> Callable[[bytes | None], M]:
    """JSON validated into `model` (pydantic v2); a null is a failure."""

    def deserialize(data: bytes | None) -> M:
        if data is None:
            raise ValueError(f"null where a {model.__name__} was expected")
        return model.model_validate_json(data)

    return deserialize


def schema_registry_deserializer(
    deserializer: Callable[[bytes | None, Any], Any], topic: str, field: str = "value"
) -> Deserializer:
    """Adapt a confluent-kafka schema-registry deserializer (AvroDeserializer,
    ProtobufDeserializer, JSONDeserializer: called with the bytes and a SerializationContext)
    for records of `topic`. Use a mapping of topic to deserializer for several topics."""
    ctx = _serialization_context("schema_registry_deserializer", deserializer, topic, field)
    return lambda data: deserializer(data, ctx)


def schema_registry_serializer(
    serializer: Callable[[Any, Any], bytes | None],
    topic: str,
    field: Literal["key", "value"] = "value",
) -> Serializer:
    """Adapt a confluent-kafka schema-registry serializer (AvroSerializer, ProtobufSerializer,
    JSONSerializer: called with the object and a SerializationContext) for outputs to `topic`
    (`value_serializer=`, or `key_serializer=` with `field="key"`); the mirror of
    `schema_registry_deserializer`. What it raises (confluent-kafka's SerializationError for
    an object the schema refuses, a registry that does not answer) fails the handler's record.
    Use a mapping of output topic to serializer for several topics."""
    ctx = _serialization_context("schema_registry_serializer", serializer, topic, field)
    return lambda obj: serializer(obj, ctx)


def _serialization_context(what: str, fn: object, topic: object, field: object) -> Any:
    """The SerializationContext a schema-registry (de)serializer is called with: the subject it
    registers or looks up is named after `topic` and `field`."""
    if not callable(fn):
        raise TypeError(f"{what} wraps a confluent-kafka schema-registry callable, got {fn!r}")
    if not isinstance(topic, str) or not topic:
        raise TypeError(f"{what}: topic must be a topic name (a non-empty str), got {topic!r}")
    if field not in ("key", "value"):
        raise ValueError(f'{what}: field must be "key" or "value", got {field!r}')
    from confluent_kafka.serialization import MessageField, SerializationContext

    return SerializationContext(topic, MessageField.KEY if field == "key" else MessageField.VALUE)


Deserializers = Deserializer | Mapping[str, Deserializer]


class _Deserializing(Wrapper):
    """The deserializers around the application's handler, whose hooks it passes on."""

    def __init__(
        self,
        inner: Handler,
        key: Deserializers | None = None,
        value: Deserializers | None = None,
    ) -> None:
        super().__init__(inner)
        self._key = key
        self._value = value

    def _deserialize(self, record: Record) -> None:
        kd = for_topic(self._key, record.topic)
        vd = for_topic(self._value, record.topic)
        if kd is not None:
            try:
                record._dkey = kd(record.key)
            except Exception as exc:
                raise DeserializationError(record, "key", exc) from exc
        if vd is not None:
            try:
                record._dvalue = vd(record.value)
            except Exception as exc:
                raise DeserializationError(record, "value", exc) from exc


class DeserializingHandler(_Deserializing):
    """Runs the deserializers, then the application's handler."""

    def handle(self, record: Record, ctx: Context) -> None:
        """Deserialize the record, then call the inner handler's `handle`; a
        `DeserializationError` if the key or value does not deserialize."""
        self._deserialize(record)
        call_plain(self.inner.handle, record, ctx)


class AsyncDeserializingHandler(DeserializingHandler):
    """The same, for an async handler: deserializes, then awaits it."""

    async def handle(self, record: Record, ctx: Context) -> None:  # type: ignore[override]
        """Deserialize the record, then await the inner handler's `handle`; a
        `DeserializationError` if the key or value does not deserialize."""
        self._deserialize(record)
        handle: Callable[[Record, Context], Awaitable[object]] = self.inner.handle  # type: ignore[assignment]
        await await_plain(handle, record, ctx)


class DeserializingBatchHandler(_Deserializing, BatchHandler):
    """Runs the deserializers over a batch, then the application's batch handler with the
    records that deserialized. One that does not is failed alone through `ctx.fail`
    (`DeserializationError`: never retried); in key and partition mode the later records of its
    lane are left out too: weir holds them back and runs them again after it, in offset order.
    `lane_of` is the ordering mode's lane of a record within its partition (None: unordered)."""

    def __init__(
        self,
        inner: BatchHandler,
        key: Deserializers | None = None,
        value: Deserializers | None = None,
        *,
        lane_of: Callable[[Record], Hashable] | None = None,
    ) -> None:
        super().__init__(inner, key, value)
        self._batch = inner
        self._lane_of = lane_of

    def hold_lanes(self, lane_of: Callable[[Record], Hashable] | None) -> None:
        """The lanes to hold back, once the member's orderings are known (a routed batch
        handler's wrapper is built before the member's config)."""
        self._lane_of = lane_of

    def _deserialized(self, records: list[Record], ctx: BatchContext) -> list[Record]:
        lane_of = self._lane_of
        held: set[tuple[str, int, Hashable]] = set()
        out: list[Record] = []
        for record in records:
            lane = None if lane_of is None else (record.topic, record.partition, lane_of(record))
            if lane is not None and lane in held:
                continue
            try:
                self._deserialize(record)
            except DeserializationError as exc:
                ctx.fail(record, exc)
                if lane is not None:
                    held.add(lane)
                continue
            out.append(record)
        return out

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        """Deserialize each record, then call the inner handler's `handle_batch` with those
        that deserialized; one that did not is failed in `ctx` with `DeserializationError`, and
        the later records of its lane are left out to run after it."""
        good = self._deserialized(records, ctx)
        if good:
            call_plain(self._batch.handle_batch, good, ctx)


class AsyncDeserializingBatchHandler(DeserializingBatchHandler):
    """The same, for an `async def handle_batch`: deserializes, then awaits it."""

    async def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:  # type: ignore[override]
        """Deserialize each record, then await the inner handler's `handle_batch` with those
        that deserialized; one that did not is failed in `ctx` with `DeserializationError`, and
        the later records of its lane are left out to run after it."""
        good = self._deserialized(records, ctx)
        if good:
            handle_batch: Callable[[list[Record], BatchContext], Awaitable[object]] = (
                self._batch.handle_batch  # type: ignore[assignment]
            )
            await await_plain(handle_batch, good, ctx)


def check_setting(name: str, given: object, *, serializer: bool) -> None:
    """A (de)serializer setting of the member, checked where it is built: a function, or a
    mapping of topic names to functions. A pydantic model class is callable but fails every
    record (`Order(b"...")`): the function meant is refused with its name."""
    takes = "an object to bytes" if serializer else "bytes to an object"
    for where, fn in given.items() if isinstance(given, Mapping) else [(None, given)]:
        shown = name if where is None else f"{name}[{where!r}]"
        if where is not None and (not isinstance(where, str) or not where):
            raise TypeError(f"{name}: a mapping's keys must be topic names (str), got {where!r}")
        if isinstance(fn, type) and issubclass(fn, BaseModel):
            meant = f"pydantic_{'serializer' if serializer else 'deserializer'}({fn.__name__})"
            raise TypeError(
                f"{shown} must be a function from {takes}, got the pydantic model "
                f"{fn.__qualname__}: {meant}"
            )
        if not callable(fn):
            mapping = " or a mapping of topic to such a function," if where is None else ""
            raise TypeError(f"{shown} must be a function from {takes},{mapping} got {fn!r}")
        if runs_nothing(fn):
            # Called and never awaited or iterated: every record would carry a coroutine or
            # a generator where its value belongs, and no error would say so.
            kind = "async def" if inspect.iscoroutinefunction(fn) else "a generator function"
            raise TypeError(
                f"{shown} must be a plain function from {takes}: "
                f"{getattr(fn, '__qualname__', fn)} is {kind}, and weir calls it in the "
                "handler's thread without awaiting or iterating it"
            )


class _Serializing(Wrapper):
    """Makes the member's output serializers the ones `ctx.produce` uses in each call of the
    application's handler, whose hooks it passes on."""

    def __init__(self, inner: Handler, serializers: OutputSerializers) -> None:
        super().__init__(inner)
        self._serializers = serializers


class _SerializingHandler(_Serializing):
    def handle(self, record: Record, ctx: Context) -> None:
        token = OUTPUT_SERIALIZERS.set(self._serializers)
        try:
            call_plain(self.inner.handle, record, ctx)
        finally:
            OUTPUT_SERIALIZERS.reset(token)


class _AsyncSerializingHandler(_SerializingHandler):
    async def handle(self, record: Record, ctx: Context) -> None:  # type: ignore[override]
        handle: Callable[[Record, Context], Awaitable[object]] = self.inner.handle  # type: ignore[assignment]
        token = OUTPUT_SERIALIZERS.set(self._serializers)  # in this call's own task
        try:
            await await_plain(handle, record, ctx)
        finally:
            OUTPUT_SERIALIZERS.reset(token)


class _SerializingBatchHandler(_Serializing, BatchHandler):
    def __init__(self, inner: BatchHandler, serializers: OutputSerializers) -> None:
        super().__init__(inner, serializers)
        self._batch = inner

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        token = OUTPUT_SERIALIZERS.set(self._serializers)
        try:
            call_plain(self._batch.handle_batch, records, ctx)
        finally:
            OUTPUT_SERIALIZERS.reset(token)


class _AsyncSerializingBatchHandler(_SerializingBatchHandler):
    async def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:  # type: ignore[override]
        handle_batch: Callable[[list[Record], BatchContext], Awaitable[object]] = (
            self._batch.handle_batch  # type: ignore[assignment]
        )
        token = OUTPUT_SERIALIZERS.set(self._serializers)
        try:
            await await_plain(handle_batch, records, ctx)
        finally:
            OUTPUT_SERIALIZERS.reset(token)


def deserializing(
    handler: Handler,
    key: Deserializers | None,
    value: Deserializers | None,
    *,
    lane_of: Callable[[Record], Hashable] | None = None,
) -> Handler:
    """`handler` reading through `key` and `value` (checked already): the wrapper for its kind,
    batch or one record, async or not. `lane_of` is a batch handler's (`DeserializingBatchHandler`;
    None: unordered, or bound later with `hold_lanes`)."""
    is_async = is_async_handler(handler)
    if isinstance(handler, BatchHandler):
        batch = AsyncDeserializingBatchHandler if is_async else DeserializingBatchHandler
        return batch(handler, key, value, lane_of=lane_of)
    single = AsyncDeserializingHandler if is_async else DeserializingHandler
    return single(handler, key, value)


def serializing(handler: Handler, key: Serializers | None, value: Serializers | None) -> Handler:
    """`handler` with the member's output serializers (checked already) for its `ctx.produce`."""
    serializers = OutputSerializers(key, value)
    is_async = is_async_handler(handler)
    if isinstance(handler, BatchHandler):
        batch = _AsyncSerializingBatchHandler if is_async else _SerializingBatchHandler
        return batch(handler, serializers)
    single = _AsyncSerializingHandler if is_async else _SerializingHandler
    return single(handler, serializers)
