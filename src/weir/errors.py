"""Exceptions raised by weir."""

from __future__ import annotations

from weir.policy import NonRetryable
from weir.records import Partition, Record

__all__ = [
    "AuthenticationError",
    "AuthorizationError",
    "BrokerRefusedError",
    "BrokerUnreachableError",
    "CallbackError",
    "DeserializationError",
    "FencedError",
    "HandlerError",
    "KafkaFatalError",
    "OffsetResetError",
    "TlsError",
    "TransactionError",
    "WeirError",
]


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


class BrokerRefusedError(BrokerUnreachableError):
    """A broker answered and refused the client: no request can be made until the client's
    security settings change. A `BrokerUnreachableError`, so code that handles a broker it
    cannot use at start handles this too; the message says what was refused."""


class AuthenticationError(BrokerRefusedError):
    """The broker refused the client's SASL credentials (a wrong password, an unknown user, a
    mechanism the user has no credentials for)."""


class AuthorizationError(BrokerRefusedError):
    """The broker's ACLs do not allow the client's principal what the member needs (to
    describe and read its topics)."""


class TlsError(BrokerRefusedError):
    """The TLS connection to the broker failed: its certificate is not signed by a CA the
    client trusts, does not name the host the client connected to, or the handshake failed
    otherwise. Verification is never turned off to get past it."""


class KafkaFatalError(WeirError):
    """The client reported a fatal error (e.g. fenced static member); the member cannot go on."""


class CallbackError(WeirError):
    """A user callback (a commit listener or a handler hook) raised and the member was told to
    stop on callback errors (`callback_errors="stop"`), or it raised a `BaseException` such as
    `KeyboardInterrupt`. The member still drained, committed and closed."""

    def __init__(self, callback: str, cause: BaseException) -> None:
        super().__init__(f"callback {callback} failed: {type(cause).__name__}: {cause}")
        self.callback = callback
        self.__cause__ = cause


class OffsetResetError(WeirError):
    """`auto_offset_reset="error"` and a partition has no valid committed offset (a new group,
    or the committed offset is out of range): the member stops rather than guess where to
    start. Commit an offset for the partitions (e.g. with `kafka-consumer-groups
    --reset-offsets`) or choose "earliest" / "latest"."""

    def __init__(self, reason: str, partition: Partition | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.partitions: list[Partition] = []
        self.add(partition)

    def add(self, partition: Partition | None) -> None:
        if partition is not None and partition not in self.partitions:
            self.partitions.append(partition)

    def __str__(self) -> str:
        where = ", ".join(map(str, self.partitions)) or "a partition"
        return (
            f"no valid offset to start from for {where} and auto_offset_reset='error' "
            f"({self.reason}): commit an offset for them, or choose 'earliest' or 'latest'"
        )


class FencedError(WeirError):
    """A fenced write was refused: another member acquired the partition since this one did.

    The database transaction was rolled back, so nothing of the write remains. The member must
    treat the partition as lost: commit nothing for it and stop working on it.
    ``stored`` is None when the database holds no epoch for the partition at all (never acquired,
    or the fence's tables were cleared).
    """

    def __init__(self, group_id: str, partition: Partition, held: int, stored: int | None) -> None:
        if stored is None:
            found = (
                "the database holds no epoch for it (never acquired, or the tables were cleared)"
            )
        else:
            found = f"the database holds epoch {stored}: another member acquired it since"
        super().__init__(
            f"{partition} of group {group_id!r} is fenced: this member holds epoch {held} but "
            f"{found}; the write was rolled back"
        )
        self.group_id = group_id
        self.partition = partition
        self.held = held
        self.stored = stored


class DeserializationError(NonRetryable, WeirError):
    """A record's key or value could not be deserialized. It goes to the final failure policy
    without retries (the bytes will not change), and a dead letter keeps its raw bytes."""

    def __init__(self, record: Record, field: str, cause: BaseException) -> None:
        super().__init__(
            f"could not deserialize the {field} of {record.event_id}: "
            f"{type(cause).__name__}: {cause}"
        )
        self.record = record
        self.field = field
        self.__cause__ = cause


class TransactionError(WeirError):
    """The transactional producer failed in a way the member cannot ride out: it was fenced (a
    newer producer with the same transactional id, or a newer group generation), or the
    broker refused it for good (for example its authorization). The member stops; nothing of
    its open transaction is committed. `step` names the call that failed ("adding the offsets
    to the transaction", "committing the transaction", ...), `fenced` says whether it was a
    fence."""

    def __init__(self, message: str, *, step: str = "", fenced: bool = False) -> None:
        super().__init__(message)
        self.step = step
        self.fenced = fenced
