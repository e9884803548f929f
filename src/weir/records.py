"""What a handler sees: an immutable record, its context, and the handler protocol."""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

__all__ = ["Context", "Handler", "HandlerFunc", "Partition", "Record"]


class Partition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


class Record(NamedTuple):
    """One delivered record: immutable, typed, and cheap to build (a tuple; the owner thread
    builds one per record, and a frozen dataclass cost ten times as much)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int | None
    """Milliseconds since the epoch, or None when the broker gave none."""
    leader_epoch: int | None
    size: int
    """Bytes of key + value + headers: what the flow-control byte budget counts."""

    @property
    def event_id(self) -> str:
        """Stable across redeliveries: use it to make external writes idempotent."""
        return f"{self.topic}/{self.partition}/{self.offset}"

    @property
    def tp(self) -> Partition:
        return Partition(self.topic, self.partition)


# C-level field readers for the owner's per-record loops (a generator costs twice as much).
offset_of = operator.attrgetter("offset")
size_of = operator.attrgetter("size")


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
