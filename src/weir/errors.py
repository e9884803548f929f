"""Exceptions raised by weir."""

from __future__ import annotations

from weir.records import Record

__all__ = ["BrokerUnreachableError", "HandlerError", "KafkaFatalError", "WeirError"]


class WeirError(Exception):
    """Base class of weir's own errors."""


class HandlerError(WeirError):
    """A handler raised. The record was not marked done: the committed offset stays at or below it,
    so the next owner (or a restart) processes it again."""

    def __init__(self, record: Record, cause: BaseException) -> None:
        super().__init__(f"handler failed on {record.event_id}: {type(cause).__name__}: {cause}")
        self.record = record
        self.__cause__ = cause


class BrokerUnreachableError(WeirError):
    """No broker answered within the start-up timeout."""


class KafkaFatalError(WeirError):
    """The client reported a fatal error (e.g. fenced static member); the member cannot go on."""
