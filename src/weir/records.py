"""What a handler sees: an immutable record, its context, and the handler protocol."""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_NOT_AVAILABLE

__all__ = ["Context", "Handler", "HandlerFunc", "Partition", "Record"]


class Partition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


class _Given:
    """The lazily read fields of a record built by hand, with the client's message's methods
    for them (`headers`, `timestamp`, `leader_epoch`): a delivered record reads them from its
    message, a record built by hand from this."""

    __slots__ = ("_headers", "_leader_epoch", "_timestamp")

    def __init__(
        self,
        headers: Sequence[tuple[str, bytes | None]],
        timestamp: int | None,
        leader_epoch: int | None,
    ) -> None:
        self._headers = headers
        self._timestamp = timestamp
        self._leader_epoch = leader_epoch

    def headers(self) -> Sequence[tuple[str, bytes | None]]:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        if self._timestamp is None:
            return (TIMESTAMP_NOT_AVAILABLE, 0)
        return (TIMESTAMP_CREATE_TIME, self._timestamp)

    def leader_epoch(self) -> int | None:
        return self._leader_epoch


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


class Record(tuple):  # type: ignore[type-arg]
    """One delivered record: an immutable, typed view of what the broker delivered.

    Read it by attribute; its tuple layout is private. The owner thread builds one per record,
    the one thread every record passes, so the view is cheap to build: topic, partition,
    offset, key, value and size are stored; headers, timestamp and leader epoch are read from
    the client's message only when asked for (reading a message's timestamp alone cost a fifth
    of building the whole record). Equal records have equal fields; a record pickles and copies
    by its fields.
    """

    __slots__ = ()

    def __new__(
        cls,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] = (),
        timestamp: int | None = None,
        leader_epoch: int | None = None,
        size: int | None = None,
    ) -> Record:
        headers = tuple(headers)
        if size is None:
            size = (len(key) if key else 0) + (len(value) if value else 0)
            size += header_bytes(headers)
        source = _Given(headers, timestamp, leader_epoch)
        return tuple.__new__(cls, (topic, partition, offset, key, value, size, source))

    if TYPE_CHECKING:

        @property
        def topic(self) -> str: ...

        @property
        def partition(self) -> int: ...

        @property
        def offset(self) -> int: ...

        @property
        def key(self) -> bytes | None: ...

        @property
        def value(self) -> bytes | None: ...

        @property
        def size(self) -> int:
            """Bytes of key + value + headers: what the flow-control byte budget counts."""

    else:
        topic = property(operator.itemgetter(0))
        partition = property(operator.itemgetter(1))
        offset = property(operator.itemgetter(2))
        key = property(operator.itemgetter(3))
        value = property(operator.itemgetter(4))
        size = property(
            operator.itemgetter(5),
            doc="Bytes of key + value + headers: what the flow-control byte budget counts.",
        )

    @property
    def headers(self) -> tuple[tuple[str, bytes | None], ...]:
        raw = self[6].headers()
        return tuple(raw) if raw else ()

    @property
    def timestamp(self) -> int | None:
        """Milliseconds since the epoch, or None when the broker gave none."""
        kind, stamp = self[6].timestamp()
        return None if kind == TIMESTAMP_NOT_AVAILABLE else stamp

    @property
    def leader_epoch(self) -> int | None:
        return self[6].leader_epoch()  # type: ignore[no-any-return]

    @property
    def event_id(self) -> str:
        """Stable across redeliveries: use it to make external writes idempotent."""
        return f"{self[0]}/{self[1]}/{self[2]}"

    @property
    def tp(self) -> Partition:
        return Partition(self[0], self[1])

    def fields(self) -> tuple[object, ...]:
        """Every field, in the constructor's order."""
        return tuple(getattr(self, name) for name in _FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return self is other or self.fields() == other.fields()

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash((self[0], self[1], self[2]))

    def __reduce__(self) -> tuple[type[Record], tuple[object, ...]]:
        return (Record, self.fields())

    def __repr__(self) -> str:
        pairs = zip(_FIELDS, self.fields(), strict=True)
        return "Record(" + ", ".join(f"{n}={v!r}" for n, v in pairs) + ")"


def header_bytes(headers: Sequence[tuple[str, bytes | None]]) -> int:
    return sum(len(k) + (len(v) if v else 0) for k, v in headers)


# C-level field readers for the owner's per-record loops (a generator costs twice as much); by
# index, as a property adds a second call.
offset_of = operator.itemgetter(2)
size_of = operator.itemgetter(5)


class Context:
    """Per-call context handed to `Handler.handle`.

    `token` is weir's local assignment token for the record's partition: a new one every time the
    partition is assigned to this member. It protects local bookkeeping only; a handler that writes
    elsewhere must fence or write idempotently by `event_id`.
    """

    __slots__ = ("_cancel", "attempt", "event_id", "token")

    def __init__(self, token: int, attempt: int, event_id: str, cancel: threading.Event) -> None:
        self.token = token
        self.attempt = attempt
        self.event_id = event_id
        self._cancel = cancel

    @property
    def cancelled(self) -> bool:
        """True once the partition was lost, or revoked past its drain budget, or weir is stopping
        past its budget: the result will be discarded, so long work may give up early."""
        return self._cancel.is_set()

    def __repr__(self) -> str:
        return (
            f"Context(token={self.token}, attempt={self.attempt}, event_id={self.event_id!r}, "
            f"cancelled={self.cancelled})"
        )


@runtime_checkable
class HandlerFunc(Protocol):
    def __call__(self, record: Record, /) -> object: ...


class Handler:
    """Subclass and override `handle`; the lifecycle hooks are optional.

    `handle` runs on worker threads. The hooks run on the owner thread, inside the rebalance
    callback: keep them short, and never call back into the consumer from them.
    """

    def handle(self, record: Record, ctx: Context) -> None:
        raise NotImplementedError

    def on_assigned(self, partitions: Sequence[Partition]) -> None:
        """Called after weir has set up state for newly assigned partitions."""

    def on_revoked(self, partitions: Sequence[Partition]) -> None:
        """Called after the revoked partitions were drained and their offsets committed."""

    def on_lost(self, partitions: Sequence[Partition]) -> None:
        """Called when ownership was lost without a hand-off: nothing was committed for them."""

    def on_shutdown(self) -> None:
        """Called once, last: after the final commit, after the member left the group (its
        `on_revoked` for the final hand-off has run) and the client was closed."""


class _FunctionHandler(Handler):
    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[[Record], object]) -> None:
        self._fn = fn

    def handle(self, record: Record, ctx: Context) -> None:
        self._fn(record)

    def __repr__(self) -> str:
        return f"FunctionHandler({getattr(self._fn, '__qualname__', self._fn)!r})"


def as_handler(handler: Handler | Callable[[Record], object]) -> Handler:
    if isinstance(handler, Handler):
        return handler
    if callable(handler):
        return _FunctionHandler(handler)
    raise TypeError(f"handler must be a Handler or a callable taking a Record, got {handler!r}")
