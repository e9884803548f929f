"""What a handler sees: an immutable record, its context, and the handler protocol."""

from __future__ import annotations

import functools
import inspect
import math
import operator
import threading
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Generic,
    Literal,
    NamedTuple,
    Protocol,
    TypeVar,
    runtime_checkable,
)

from typing_extensions import Self
from typing_extensions import TypeVar as DefaultTypeVar

from weir._serializing import RAW, serialized
from weir._topics import topic_name_problem
from weir._trace_carrier import OUTPUT_HEADERS, merged

__all__ = [
    "BatchContext",
    "BatchHandler",
    "CommitEvent",
    "Context",
    "FlushContext",
    "Handler",
    "HandlerFunc",
    "Ordering",
    "Partition",
    "Record",
]

Ordering = Literal["key", "partition", "unordered"]
"""What may run at once within a partition (docs/workers-and-ordering.md)."""


class Partition(NamedTuple):
    """A topic's partition: how stats, pauses, seeks and errors name one. `str()` gives
    "topic[n]"; a plain `(topic, partition)` tuple is equal to it."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


# Headers as a record keeps them: a delivered record's as the client gave them, a record built
# by hand's as a tuple; `Record.headers` makes the (name, bytes) tuple when asked.
_RawHeaders = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None]

_FIELDS = (
    "topic",
    "partition",
    "offset",
    "key",
    "value",
    "headers",
    "timestamp",
    "leader_epoch",
    "size",
)


# What a record's value deserializes to (`Record[Order]`). Covariant, as only the read-only
# `deserialized_value` gives it out; defaulting to Any (PEP 696) so that a bare `Record`, as all
# code before it was written, means what it meant and passes `mypy --strict` unchanged.
V_co = DefaultTypeVar("V_co", covariant=True, default=Any)


def _getter(slot: str, doc: str) -> Any:
    """A read-only property that reads `slot` in C."""
    return property(operator.attrgetter(slot), doc=doc)


class Record(Generic[V_co]):
    """One delivered record: an immutable, typed view of what the broker delivered.

    `Record[Order]` types `deserialized_value` as an `Order`, for a handler whose member (or
    route) deserializes values into one (`pydantic_deserializer(Order)`); a bare `Record` is
    `Record[Any]`. The parameter is for the type checker only: nothing checks it at run time.

    The owner thread builds one per record, the one thread every record passes, so the view is
    cheap to build: every field is a slot store, headers kept as the client gave them until
    asked for. A record keeps no reference to the client's message: the message dies with the
    consume call's list, so a record in flight is one object for Python's cyclic collector to
    walk, not two (benchmarks/README.md). Equal records have equal fields; a record pickles and
    copies by its fields. Its fields are read-only.
    """

    # Private slots behind read-only properties: a plain slot store is what makes building a
    # record cheap (`weir._engine.intake` builds them without calling `__init__`), and no
    # `__setattr__` override is needed to keep the public fields read-only.
    __slots__ = (
        "_dkey",
        "_dvalue",
        "_headers",
        "_key",
        "_leader_epoch",
        "_offset",
        "_partition",
        "_size",
        "_timestamp",
        "_topic",
        "_value",
    )
    # The raw key and value when the record is made; a deserializer replaces them on a worker
    # thread before the handler runs (`weir.serde.DeserializingHandler`).
    _dkey: Any
    _dvalue: V_co

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] | Mapping[str, bytes | None] = (),
        timestamp: int | None = None,
        leader_epoch: int | None = None,
        size: int | None = None,
    ) -> None:
        # Records a test or a tool builds by hand: a wrong type is named here, not met later
        # as a handler's or a deserializer's puzzle (the owner builds delivered records
        # without this constructor).
        _check_int("partition", partition)
        _check_int("offset", offset)
        if not isinstance(topic, str) or not topic:
            raise TypeError(f"Record topic must be a non-empty str, got {topic!r}")
        _check_bytes("key", key)
        _check_bytes("value", value)
        pairs = tuple(_checked_headers(headers))
        for name, n in (("timestamp", timestamp), ("leader_epoch", leader_epoch)):
            if n is not None and (not isinstance(n, int) or isinstance(n, bool)):
                raise TypeError(f"Record {name} must be an int or None, got {n!r}")
        if size is not None:
            _check_int("size", size)
        if size is None:
            size = (len(key) if key else 0) + (len(value) if value else 0)
            size += header_bytes(pairs)
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._key = self._dkey = key
        self._value = value
        self._dvalue = value  # type: ignore[assignment]  # raw until a deserializer runs
        self._size = size
        # As the client gives them (None, or a list of pairs): `headers` makes the tuple.
        self._headers: _RawHeaders | None = pairs
        self._timestamp = timestamp
        self._leader_epoch = leader_epoch

    if TYPE_CHECKING:

        @property
        def topic(self) -> str:
            """The topic the record was read from."""

        @property
        def partition(self) -> int:
            """The partition of `topic` it was read from."""

        @property
        def offset(self) -> int:
            """Its offset in the partition."""

        @property
        def key(self) -> bytes | None:
            """The key's raw bytes, None for a null key (`deserialized_key` for the object)."""

        @property
        def value(self) -> bytes | None:
            """The value's raw bytes, None for a null value (a tombstone); `deserialized_value`
            for the object."""

        @property
        def size(self) -> int:
            """Bytes of key + value + headers: what the flow-control byte budget counts."""

        @property
        def deserialized_key(self) -> Any:
            """The key as the consumer's key deserializer made it (`key_deserializer`); the raw
            bytes when there is none."""

        @property
        def deserialized_value(self) -> V_co:
            """The value as the consumer's value deserializer made it (`value_deserializer`);
            the raw bytes when there is none (a `Record[V]` then promised more than the member
            gives)."""

    else:
        # C-level getters: handlers read these once or more per record, and a Python property
        # function costs half as much again as the read itself.
        topic = _getter("_topic", "The topic the record was read from.")
        partition = _getter("_partition", "The partition of `topic` it was read from.")
        offset = _getter("_offset", "Its offset in the partition.")
        key = _getter(
            "_key", "The key's raw bytes, None for a null key (`deserialized_key` for the object)."
        )
        value = _getter(
            "_value",
            "The value's raw bytes, None for a null value (a tombstone); `deserialized_value` for "
            "the object.",
        )
        size = _getter(
            "_size", "Bytes of key + value + headers: what the flow-control byte budget counts."
        )
        # Slots that always hold a value: a read that fell back on AttributeError took 16 times
        # as long as one of `value` when no deserializer had run.
        deserialized_key = _getter(
            "_dkey",
            "The key as the consumer's key deserializer made it (`key_deserializer`); the raw "
            "bytes when there is none.",
        )
        deserialized_value = _getter(
            "_dvalue",
            "The value as the consumer's value deserializer made it (`value_deserializer`); the "
            "raw bytes when there is none (a `Record[V]` then promised more than the member "
            "gives).",
        )

    @property
    def headers(self) -> tuple[tuple[str, bytes | None], ...]:
        """The record's headers as (name, value) pairs in the order produced; a name may repeat,
        and a value is None for a header without one."""
        raw = self._headers
        if not raw:
            return ()
        items = raw.items() if isinstance(raw, Mapping) else raw
        return tuple((k, v.encode() if isinstance(v, str) else v) for k, v in items)

    @property
    def timestamp(self) -> int | None:
        """Milliseconds since the epoch, or None when the broker gave none."""
        return self._timestamp

    @property
    def leader_epoch(self) -> int | None:
        """The partition leader's epoch when the record was written, None when the broker gave
        none."""
        return self._leader_epoch

    @property
    def event_id(self) -> str:
        """Stable across redeliveries: use it to make external writes idempotent."""
        return f"{self._topic}/{self._partition}/{self._offset}"

    @property
    def tp(self) -> Partition:
        """`Partition(topic, partition)`: the key of the record's partition in stats, pauses
        and seeks."""
        return Partition(self._topic, self._partition)

    def fields(self) -> tuple[object, ...]:
        """Every field, in the constructor's order."""
        return tuple(getattr(self, name) for name in _FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return self is other or self.fields() == other.fields()

    def __hash__(self) -> int:
        return hash((self._topic, self._partition, self._offset))

    def __reduce__(self) -> tuple[type[Record], tuple[object, ...]]:
        return (Record, self.fields())

    def __copy__(self) -> Record:
        return self  # immutable

    def __deepcopy__(self, memo: dict[int, object]) -> Record:
        return Record(*self.fields())  # type: ignore[arg-type]

    def __repr__(self) -> str:
        pairs = zip(_FIELDS, self.fields(), strict=True)
        return "Record(" + ", ".join(f"{n}={v!r}" for n, v in pairs) + ")"


def _check_int(name: str, n: object) -> None:
    if not isinstance(n, int) or isinstance(n, bool):
        raise TypeError(f"Record {name} must be an int, got {n!r}")
    if n < 0:
        raise ValueError(f"Record {name} must be >= 0, got {n}")


def _check_bytes(name: str, b: object) -> None:
    if b is not None and not isinstance(b, bytes):
        hint = f": encode it ({name}={b!r}.encode())" if isinstance(b, str) else ""
        raise TypeError(f"Record {name} must be bytes or None, got {type(b).__name__}{hint}")


def header_bytes(
    headers: Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None],
) -> int:
    items = headers.items() if isinstance(headers, Mapping) else headers
    return sum(len(k) + (len(v) if v else 0) for k, v in items)


# C-level field readers for the owner's per-record loops (a generator costs twice as much); the
# slot itself, as a property adds a second call.
offset_of = operator.attrgetter("_offset")
size_of = operator.attrgetter("_size")


class Output:
    """A record a handler produced with `Context.produce`: written into the member's Kafka
    transaction when its input record is marked finished (`transactional_id`), else produced
    when the call returns and confirmed by the broker before its input counts as finished."""

    __slots__ = ("headers", "key", "partition", "topic", "value")

    def __init__(
        self,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None,
        headers: Sequence[tuple[str, bytes | str | None]] | None,
        partition: int | None,
    ) -> None:
        self.topic = topic
        self.value = value
        self.key = key
        self.headers = headers
        self.partition = partition

    def __repr__(self) -> str:
        return f"Output({self.topic!r}, key={self.key!r}, value={self.value!r})"


def pause_seconds(for_s: object) -> float | None:
    """A pause's length, checked in the caller's thread: None (until resumed) or seconds."""
    if for_s is None:
        return None
    if not isinstance(for_s, int | float) or isinstance(for_s, bool):
        raise TypeError(f"for_s must be seconds (a number) or None, got {for_s!r}")
    if not (0 < for_s < math.inf):
        raise ValueError(f"for_s must be more than 0 and finite, got {for_s!r}")
    return float(for_s)


_Outputs = TypeVar("_Outputs", list[Output], dict[int, list[Output]])


# Where a context's outputs and marks point once its call returned (or raised): the engine has
# taken what the call left, so an output or a mark made later, by a thread, callback or task the
# call left running, would be read by nobody. Such a call raises (`_late`) instead.
RETURNED: Final[list[Output]] = []
_RETURNED_BATCH: Final[dict[int, list[Output]]] = {}
_RETURNED_MARKS: Final[dict[int, BaseException | None]] = {}


def _late(what: str) -> RuntimeError:
    return RuntimeError(
        f"{what} after the handler's call returned: its records were settled then, and what "
        "comes later would be read by nobody. Do it inside the call: wait there for the "
        "thread, callback or task that does it"
    )


def _producing(outputs: _Outputs | None) -> _Outputs:
    """Where a context keeps its outputs; refused by a context not built by a member, and by
    one whose call returned."""
    if outputs is None:
        raise RuntimeError(
            "ctx.produce needs a context built by a GroupConsumer (this one takes no outputs): "
            "docs/producing.md"
        )
    if outputs is RETURNED or outputs is _RETURNED_BATCH:
        raise _late("ctx.produce")
    return outputs


def _checked_headers(headers: object) -> list[tuple[str, bytes | str | None]]:
    """An output's headers as the producer takes them, checked in the handler's thread: the
    producer refusing them later, on the owner thread, would stop the member. A copy, so the
    handler may reuse its list."""
    if isinstance(headers, Mapping):
        headers = list(headers.items())
    if not isinstance(headers, list | tuple):
        raise TypeError(
            f"headers are a list of (name, value) pairs or a dict, got {type(headers).__name__}"
        )
    out: list[tuple[str, bytes | str | None]] = []
    for pair in headers:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"headers are (name, value) pairs, got {pair!r}")
        name, value = pair
        if not isinstance(name, str):
            raise TypeError(f"a header name is a str, got {name!r}")
        if not isinstance(value, RAW):
            raise TypeError(
                f"header {name!r}: a value is bytes, str or None, got {type(value).__name__}"
            )
        out.append((name, value))
    return out


@functools.lru_cache(maxsize=1024)
def _output_topic_problem(topic: str) -> str | None:
    """Checked in the handler's thread: the broker refuses the name only at delivery, after the
    call returned (a transaction then aborts). Cached: a handler writes to a few topics, over
    and over."""
    return topic_name_problem(topic)


def _output(
    topic: str,
    value: object,
    key: object,
    headers: Sequence[tuple[str, bytes | str | None]] | None,
    partition: int | None,
) -> Output:
    if not isinstance(topic, str) or not topic:
        raise TypeError(f"topic must be a non-empty str, got {topic!r}")
    problem = _output_topic_problem(topic)
    if problem is not None:
        raise ValueError(problem)
    if not isinstance(value, RAW) or not isinstance(key, RAW):
        value, key = serialized(topic, value, key)  # the member's serializers, in this thread
    if headers is not None:
        headers = _checked_headers(headers)
    if partition is not None:
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise TypeError(f"partition is an int (or None), got {partition!r}")
        if partition < -1:
            # -1 is the producer's own "unassigned" (confluent-kafka's default): the partitioner.
            raise ValueError(
                f"partition is >= 0, or None (or -1) for the partitioner, got {partition}"
            )
    trace = OUTPUT_HEADERS.get()
    if trace is not None:  # tracing on (weir.tracing): the output joins the current trace
        headers = merged(headers, trace(), replace=False)
    return Output(topic, value, key, headers, partition)


class Context:
    """Per-call context handed to `Handler.handle`.

    `token` is weir's local assignment token for the record's partition: a new one every time the
    partition is assigned to this member. It protects local bookkeeping only; a handler that writes
    elsewhere must fence (`epoch`, with `weir.fencing`) or write idempotently by `event_id`.
    """

    __slots__ = ("_cancel", "_outputs", "_pause", "attempt", "epoch", "event_id", "token")

    def __init__(
        self,
        token: int,
        attempt: int,
        event_id: str,
        cancel: threading.Event,
        epoch: int | None = None,
        outputs: list[Output] | None = None,
        pause: Callable[[float | None], None] | None = None,
    ) -> None:
        self.token = token
        self.attempt = attempt
        self.event_id = event_id
        self._cancel = cancel
        self.epoch = epoch
        """The partition's ownership epoch from the member's fence (`GroupConsumer(...,
        fence=...)`), acquired before its first record was dispatched; None without a fence."""
        self._outputs = outputs
        self._pause = pause

    def pause_partition(self, for_s: float | None = None) -> None:
        """Stop fetching this record's partition for `for_s` seconds (None: until
        `GroupConsumer.resume`): a circuit breaker for a downstream that is down. Records
        already fetched still run (raise to send this one to the failure policy); nothing is
        skipped. Served by the owner thread within a turn; a bad `for_s` raises here."""
        for_s = pause_seconds(for_s)
        if self._pause is not None:
            self._pause(for_s)

    def produce(
        self,
        topic: str,
        value: object = None,
        key: object = None,
        *,
        headers: Sequence[tuple[str, bytes | str | None]] | None = None,
        partition: int | None = None,
    ) -> None:
        """Produce an output record: `value` and `key` are bytes, str (UTF-8) or None as they
        are, and any other object goes through the member's `value_serializer` /
        `key_serializer` for `topic`, here (what it raises fails this record; an object with
        no serializer for `topic` is a TypeError). With `transactional_id` it goes into the
        member's Kafka transaction when this handler's record is marked finished, with the
        input's offset: committed together or not at all. Without, it is produced when the call
        returns, by the member's idempotent producer, and the record counts as finished only
        once the broker confirmed all its outputs; a failed delivery fails the record into the
        failure policy (at-least-once: a retry writes them again, docs/producing.md). Outputs of
        a call that raises are dropped (a retry produces them again)."""
        _producing(self._outputs).append(_output(topic, value, key, headers, partition))

    @property
    def cancelled(self) -> bool:
        """True once the partition was lost, or revoked past its drain budget, or weir is stopping
        past its budget: the result will be discarded, so long work may give up early."""
        return self._cancel.is_set()

    def __repr__(self) -> str:
        return (
            f"Context(token={self.token}, attempt={self.attempt}, event_id={self.event_id!r}, "
            f"epoch={self.epoch}, cancelled={self.cancelled})"
        )


@runtime_checkable
class HandlerFunc(Protocol):
    def __call__(self, record: Record, /) -> object: ...


class Handler(ABC):
    """Subclass and define `handle`; the lifecycle hooks are optional.

    `handle` is either a plain method, run on worker threads, or `async def`, run as a coroutine
    on an event loop (docs/handlers.md). It is abstract: a subclass without it cannot be
    instantiated (a TypeError where it is built, not a failure of every record). The hooks run
    on the owner thread, inside the rebalance callback: keep them short, and never call back
    into the consumer from them. With an async `handle` the rebalance hooks may be `async def`
    too: they run on the loop, and the owner waits for them (at most `revoke_timeout_s`).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        # The ABC's own refusal names the method; this one says how to write it too.
        if "handle" in cls.__abstractmethods__:
            raise TypeError(
                f"{cls.__qualname__} does not define handle(): a Handler subclass must, as "
                "def handle(self, record, ctx) (run on worker threads) or async def "
                "handle(self, record, ctx) (run on an event loop)"
            )
        return super().__new__(cls)

    # The hooks' return type admits a coroutine so that `async def` overrides type-check; the
    # base methods return None.
    @abstractmethod
    def handle(self, record: Record, ctx: Context) -> Awaitable[None] | None:
        """Process one record; return (or, `async def`, finish) once it is done. Raising fails
        it: the failure policy decides what follows."""

    def on_assigned(self, partitions: Sequence[Partition]) -> Awaitable[None] | None:
        """Called after weir has set up state for newly assigned partitions."""
        return None

    def on_revoked(self, partitions: Sequence[Partition]) -> Awaitable[None] | None:
        """Called after the revoked partitions were drained and their offsets committed."""
        return None

    def on_lost(self, partitions: Sequence[Partition]) -> Awaitable[None] | None:
        """Called when ownership was lost without a hand-off: nothing was committed for them."""
        return None

    def on_shutdown(self) -> Awaitable[None] | None:
        """Called once, last: after the final commit, after the member left the group (its
        `on_revoked` for the final hand-off has run) and the client was closed."""
        return None

    def on_flush(self, ctx: FlushContext) -> Awaitable[None] | None:
        """Optional: define it when `handle` (or `handle_batch`) keeps records in a buffer of
        the handler's own instead of writing them before it returns. weir then counts a record
        finished only once an `on_flush` that began after its call returned has returned, so no
        commit passes a record that is only in memory. It runs on the owner thread before each
        commit, before a revoked partition's commit and before the final commit, whenever
        records were returned since the last one: write the buffer (the records of the
        assignments `ctx.owns`) and return once it is durable (docs/handlers.md#the-flush-hook).
        If it raises, none of the records it was to cover count: their partitions start over
        from their last commit (new tokens), and they run again."""
        return None

    def _flush_hook(self) -> Callable[[FlushContext], Awaitable[None] | None] | None:
        """The flush hook, if this handler defines one."""
        return self.on_flush if type(self).on_flush is not Handler.on_flush else None


class BatchContext:
    """Per-call context handed to `BatchHandler.handle_batch`: the batch's records may come from
    several partitions, so what differs per partition is asked per record.

    Partial success: `done(record)` and `fail(record, error)` mark single records, whatever the
    call then does. A call that returns finishes every record not marked failed; a call that
    raises fails every record not marked done, as one batch failure (docs/handlers.md).
    `produce(record, topic, ...)` records an output of one record of the batch: it is written
    when that record is marked finished, with its offset in a transactional member, else
    produced then and confirmed before the record counts as finished (docs/producing.md).
    """

    __slots__ = ("_index", "_marks", "_outputs", "_parts", "_records")

    def __init__(
        self,
        records: Sequence[Record],
        parts: Mapping[Partition, _PartContext],
        *,
        outputs: bool = False,
    ) -> None:
        # The batch's order, whatever the handler then does to its list: marks are by position.
        self._records = tuple(records)
        # Built on the first mark (`_position`): a batch nothing marks never pays for it (it
        # cost about as much as the rest of a no-op batch call).
        self._index: dict[int, int] | None = None
        self._parts = parts
        # Index into the batch -> None (done) or the record's own error (failed).
        self._marks: dict[int, BaseException | None] = {}
        # Index into the batch -> the outputs produced for that record in this call; None in a
        # context not built by a member (`produce` refuses).
        self._outputs: dict[int, list[Output]] | None = {} if outputs else None

    def _position(self, record: Record, doing: str = "mark") -> int:
        index = self._index
        if index is None:
            index = self._index = {id(r): i for i, r in enumerate(self._records)}
        i = index.get(id(record))
        if i is None or self._records[i] is not record:
            raise ValueError(
                f"{record!r} is not a record of this batch: {doing} only the records "
                "handle_batch was given"
            )
        return i

    def _returned(
        self,
    ) -> tuple[dict[int, BaseException | None], dict[int, list[Output]] | None]:
        """The call returned (or raised): its marks and outputs, for the engine. A `done`,
        `fail` or `produce` after it raises (`_late`)."""
        marks, outputs = self._marks, self._outputs
        self._marks = _RETURNED_MARKS
        if outputs is not None:
            self._outputs = _RETURNED_BATCH
        return marks, outputs

    def _mark(self, record: Record, error: BaseException | None) -> None:
        if self._marks is _RETURNED_MARKS:
            raise _late("ctx.fail" if error is not None else "ctx.done")
        i = self._position(record)
        before = self._marks.get(i, error)
        if (before is None) != (error is None):
            raise ValueError(
                f"{record!r} is marked both done and failed in this batch: mark it once"
            )
        self._marks[i] = error

    def done(self, record: Record) -> None:
        """`record` is finished, even if the call raises afterwards."""
        self._mark(record, None)

    def _finish_unmarked(self, records: Iterable[Record]) -> None:
        """Mark done those of `records` nothing marked (a router's routes that returned,
        when another raised)."""
        for record in records:
            self._marks.setdefault(self._position(record), None)

    def fail(self, record: Record, error: BaseException) -> None:
        """`record` failed with `error`, even if the call returns: it goes to the failure policy
        alone. In key and partition mode the records after it in its lane (its key's, its
        partition's) are not finished either: they run again after it, in offset order."""
        if not isinstance(error, BaseException):
            raise TypeError(f"error must be an exception instance, got {error!r}")
        self._mark(record, error)

    def produce(
        self,
        record: Record,
        topic: str,
        value: object = None,
        key: object = None,
        *,
        headers: Sequence[tuple[str, bytes | str | None]] | None = None,
        partition: int | None = None,
    ) -> None:
        """Produce an output of `record` (a record of this batch). It is written when `record`
        is marked finished (in a transactional member in the same transaction as its offset;
        else confirmed by the broker before `record` counts as finished), and only then: the
        outputs of a record that fails (marked `fail`, held behind a failed record of its lane,
        or in a call that raised without being marked `done`) are dropped, and the call that
        finishes it on a retry produces them again (docs/exactly-once.md#batch-handlers).
        `value` and `key` as in `Context.produce`: objects go through the member's serializers,
        here."""
        outputs = _producing(self._outputs)
        if not isinstance(record, Record):
            raise TypeError(
                f"BatchContext.produce takes the record the output belongs to first, got "
                f"{record!r}: ctx.produce(record, topic, value, key)"
            )
        out = _output(topic, value, key, headers, partition)
        outputs.setdefault(self._position(record, "produce for"), []).append(out)

    def attempt(self, record: Record) -> int:
        """The attempt `record` is on: 1 the first time, more when it is retried."""
        part = self._parts[Partition(record.topic, record.partition)]
        return part.attempts.get(record.offset, 1) if part.attempts else 1

    def token(self, record: Record) -> int:
        """weir's assignment token of `record`'s partition (`Context.token`): what a handler
        that buffers keeps with the record, for `FlushContext.owns`."""
        return self._parts[Partition(record.topic, record.partition)].token

    def epoch(self, record: Record) -> int | None:
        """The ownership epoch of `record`'s partition from the member's fence (`Context.epoch`);
        None without a fence."""
        return self._parts[Partition(record.topic, record.partition)].epoch

    def pause_partition(self, record: Record, for_s: float | None = None) -> None:
        """Stop fetching `record`'s partition for `for_s` seconds (None: until
        `GroupConsumer.resume`), as `Context.pause_partition`."""
        for_s = pause_seconds(for_s)
        self._parts[Partition(record.topic, record.partition)].pause(for_s)

    @property
    def cancelled(self) -> bool:
        """True once every partition of the batch was lost, or revoked past its drain budget,
        or weir is stopping past its budget: nothing of the batch will count, so long work may
        give up early. While some partition is still owned, returning early would finish its
        records unprocessed: raise instead."""
        return all(p.cancel.is_set() for p in self._parts.values())

    def __repr__(self) -> str:
        return f"BatchContext(records={len(self._records)}, partitions={len(self._parts)})"


class _PartContext(NamedTuple):
    """What a batch's records of one partition share: its assignment's state."""

    token: int
    cancel: threading.Event
    attempts: dict[int, int]
    epoch: int | None
    pause: Callable[[float | None], None]


class FlushContext:
    """What `Handler.on_flush` is handed: which assignments this member still owns. A handler
    that buffers keeps each record's `ctx.token` with it, writes the records `owns` says yes to,
    and drops the others: their partition was lost or started over, and they will run again
    where it is owned now."""

    __slots__ = ("_owned",)

    def __init__(self, owned: Mapping[Partition, int]) -> None:
        self._owned = owned

    def owns(self, partition: tuple[str, int], token: int) -> bool:
        """True while the assignment `token` of `partition` (topic, partition) is this
        member's: its buffered records may be written."""
        return self._owned.get(Partition(*partition)) == token

    @property
    def partitions(self) -> list[Partition]:
        """The partitions owned now."""
        return sorted(self._owned)

    def __repr__(self) -> str:
        return f"FlushContext(partitions={len(self._owned)})"


class BatchHandler(Handler):
    """Subclass and define `handle_batch`: records arrive in lists, not one by one (a bulk
    write: a multi-row insert, a COPY, an HTTP batch API). The lifecycle hooks are `Handler`'s.

    A batch holds up to `batch_max_records` records, gathered for at most `batch_max_wait_s`;
    it may span partitions. What it may hold follows the ordering
    mode: in key mode a key's records are in one batch at a time, in offset order; in partition
    mode a partition's; unordered, any (docs/handlers.md#batch-handlers). `batch_max_bytes`
    bounds its bytes too. A plain `handle_batch` runs on worker threads, an `async def` one on
    the event loop (at most `max_in_flight` calls at once).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        if "handle_batch" in cls.__abstractmethods__:
            raise TypeError(
                f"{cls.__qualname__} does not define handle_batch(): a BatchHandler subclass "
                "must, as def handle_batch(self, records, ctx) (run on worker threads) or async "
                "def handle_batch(self, records, ctx) (run on the event loop)"
            )
        return super().__new__(cls)

    @abstractmethod
    def handle_batch(self, records: list[Record], ctx: BatchContext) -> Awaitable[None] | None:
        """Process the records; return once they are done. Raising fails the batch (but the
        records marked `ctx.done`); `ctx.fail` fails single records."""

    def handle(self, record: Record, ctx: Context) -> None:
        """Not called on a batch handler: weir calls `handle_batch`. A TypeError if called."""
        raise TypeError(
            f"{type(self).__qualname__} is a BatchHandler: weir calls handle_batch, not handle"
        )


class _FunctionHandler(Handler):
    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[[Record], object]) -> None:
        self._fn = fn

    def handle(self, record: Record, ctx: Context) -> None:
        self._fn(record)

    def __repr__(self) -> str:
        return f"FunctionHandler({getattr(self._fn, '__qualname__', self._fn)!r})"


class _AsyncFunctionHandler(Handler):
    """An `async def` function (or a callable object with `async def __call__`)."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[[Record], Awaitable[object]]) -> None:
        self._fn = fn

    async def handle(self, record: Record, ctx: Context) -> None:
        result = await self._fn(record)
        if result is not None:  # an awaitable left un-awaited is refused, naming the function
            from weir._engine.workers import _refuse_awaitable

            _refuse_awaitable(self._fn, result, awaited=True)

    def __repr__(self) -> str:
        return f"AsyncFunctionHandler({getattr(self._fn, '__qualname__', self._fn)!r})"


HOOKS = ("on_assigned", "on_revoked", "on_lost", "on_shutdown", "on_flush")


def is_async_handler(handler: Handler | Callable[[Record], object]) -> bool:
    """An `async def` function, a callable object with `async def __call__`, or a `Handler` whose
    `handle` is `async def`."""
    if isinstance(handler, BatchHandler):
        return inspect.iscoroutinefunction(handler.handle_batch)
    if isinstance(handler, Handler):
        return inspect.iscoroutinefunction(handler.handle)
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - the method, not callability
    )


def as_handler(handler: Handler | Callable[[Record], object]) -> Handler:
    if isinstance(handler, type):
        raise TypeError(
            f"handler must be a Handler instance or a callable taking a Record, got the class "
            f"{handler.__qualname__}: pass an instance, {handler.__qualname__}()"
        )
    _check_not_a_generator(handler)
    if isinstance(handler, Handler):
        _check_flush(handler)
        if not is_async_handler(handler):
            # A coroutine hook of a thread handler would be called from the owner thread and
            # never run: there is no event loop of weir's to run it on.
            for name in HOOKS:
                if inspect.iscoroutinefunction(getattr(handler, name)):
                    raise TypeError(
                        f"{type(handler).__qualname__}.{name} is async def but "
                        f"{type(handler).__qualname__}.handle is not: async hooks run on the "
                        "event loop of an async handler; make handle async def too, or the "
                        "hook a plain method"
                    )
        return handler
    if callable(handler):
        _check_takes_a_record(handler)
    if is_async_handler(handler):
        return _AsyncFunctionHandler(handler)  # type: ignore[arg-type]
    if callable(handler):
        return _FunctionHandler(handler)
    raise TypeError(f"handler must be a Handler or a callable taking a Record, got {handler!r}")


def _check_not_a_generator(handler: object) -> None:
    """A generator function (`yield` in its body) runs nothing when called: it returns a
    generator, and every record would count finished unprocessed. Refused at construction (one
    that merely returns a generator fails its first record, `GeneratorReturned`)."""
    fn: object
    if isinstance(handler, BatchHandler):
        fn, name = handler.handle_batch, f"{type(handler).__qualname__}.handle_batch"
    elif isinstance(handler, Handler):
        fn, name = handler.handle, f"{type(handler).__qualname__}.handle"
    else:
        fn = getattr(handler, "__call__", None)  # noqa: B004 - the method, not callability
        if not inspect.isfunction(handler) and not inspect.ismethod(handler):
            name = f"{type(handler).__qualname__}.__call__"
        else:
            fn, name = handler, getattr(handler, "__qualname__", repr(handler))
    if _is_generator_function(fn):
        raise TypeError(
            f"handler {name} is a generator function (it has a yield): calling it runs none of "
            "its body, so every record would count finished unprocessed. Remove the yield and "
            "do the work in the call"
        )
    if isinstance(handler, Handler):
        # A hook is called and its result dropped: a generator hook would never run, and an
        # `on_flush` that never runs lets every commit pass records still only in its buffer.
        for hook in HOOKS:
            if _is_generator_function(getattr(handler, hook)):
                raise TypeError(
                    f"{type(handler).__qualname__}.{hook} is a generator function (it has a "
                    "yield): weir calls it and nothing iterates the generator, so none of its "
                    "body would run. Remove the yield"
                )


def _is_generator_function(fn: object) -> bool:
    return inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn)


def dropped_unrun(result: object) -> bool:
    """Whether `result` is a call's work left undone (a coroutine or another awaitable, or a
    generator); such a result is closed here, so no "never awaited" warning follows the error
    its caller raises."""
    if not (
        inspect.isawaitable(result) or inspect.isgenerator(result) or inspect.isasyncgen(result)
    ):
        return False
    close = getattr(result, "close", None)
    if close is not None:
        close()
    return True


def runs_nothing(fn: object) -> bool:
    """A function whose call runs none of its body: `async def`, or one with a `yield`. Where
    weir calls a function and uses its result at once (a filter, a deserializer, a fence's
    write), such a function would hand back a coroutine or a generator instead of its work."""
    return inspect.iscoroutinefunction(fn) or _is_generator_function(fn)


def _check_flush(handler: Handler) -> None:
    """An `on_flush` that cannot take the `FlushContext` would fail at every commit, and the
    records it was to cover would never count."""
    hook = handler._flush_hook()
    if hook is None:
        return
    try:
        sig = inspect.signature(hook)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(None)
    except TypeError:
        params = ", ".join(["self", *sig.parameters])
        name = f"{type(handler).__qualname__}.on_flush({params})"
        raise TypeError(
            f"{name}: weir's flush hook is called as on_flush(ctx) before each commit, and "
            "records count finished only after it (docs/handlers.md#the-flush-hook): take the "
            "FlushContext"
        ) from None


def _check_takes_a_record(fn: Callable[..., object]) -> None:
    """A plain callable is called with the record alone: one that needs more (the common
    `def handle(record, ctx)`) would fail on every record, so it is refused at construction."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # no signature to read (some builtins): its first call will tell
    try:
        sig.bind(None)
    except TypeError:
        name = getattr(fn, "__qualname__", repr(fn))
        params = ", ".join(sig.parameters)
        raise TypeError(
            f"handler {name}({params}) must take one argument, the Record: a plain callable is "
            "called as handler(record). For the Context too (ctx.produce, ctx.epoch, "
            "cancellation), subclass weir.Handler and define handle(self, record, ctx)"
        ) from None


@dataclass(frozen=True, slots=True)
class CommitEvent:
    """One partition's commit, as observers (audits, metrics) see it: once when the request is
    sent (`status="sent"`), once when its result arrives (`"committed"` or `"failed"`)."""

    tp: Partition
    """The partition committed to."""
    offset: int
    """The offset committed: the next one the group reads there."""
    sync: bool
    """A synchronous commit (the hand-off at a revoke, or offsets in an exactly-once
    transaction); False for the asynchronous ones."""
    status: Literal["sent", "committed", "failed"]
    """Sent, or the answer: committed or failed."""
    error: str | None = None
    """Why it failed (None unless `status="failed"`)."""
    code: str | None = None
    """The client's error code of a failure, e.g. "GROUP_AUTHORIZATION_FAILED"."""

    @property
    def ok(self) -> bool:
        """Whether the broker confirmed the commit (`status == "committed"`)."""
        return self.status == "committed"
