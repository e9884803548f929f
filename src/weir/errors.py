"""Exceptions raised by weir: every one of its errors is defined here, once.

The modules that raise them import them from here; the documented import paths elsewhere
(`weir`, `weir.policy.NonRetryable`, `weir.fencing`'s, `weir.lag`'s) name these same classes. The
test harness's own errors (no Java, a broker that did not start, ...) are in `weir.testing.errors`.
"""

from __future__ import annotations

from weir.records import Partition, Record

__all__ = [
    "AuthenticationError",
    "AuthorizationError",
    "AwaitableReturned",
    "BrokerRefusedError",
    "BrokerUnreachableError",
    "CallbackError",
    "DeadLetterError",
    "DeserializationError",
    "FenceUnavailableError",
    "FencedError",
    "GeneratorReturned",
    "GroupActiveError",
    "GroupNotFoundError",
    "HandlerError",
    "KafkaFatalError",
    "LagError",
    "NoEpochError",
    "NonRetryable",
    "OffsetResetError",
    "OffsetsError",
    "OutputError",
    "ReadError",
    "RedriveError",
    "SeekError",
    "TlsError",
    "TopicNotFoundError",
    "TransactionError",
    "WeirError",
]


class WeirError(Exception):
    """Base class of weir's own errors."""


class NonRetryable(Exception):
    """Raise it (or a subclass) from a handler when retrying cannot help: the record goes
    straight to the final policy."""


class HandlerError(WeirError):
    """A handler raised. The record was not marked done: the committed offset stays at or below it,
    so the next owner (or a restart) processes it again."""

    def __init__(self, record: Record, cause: BaseException) -> None:
        super().__init__(f"handler failed on {record.event_id}: {type(cause).__name__}: {cause}")
        self.record = record
        self.__cause__ = cause


class BrokerUnreachableError(WeirError):
    """No broker answered in time: a member's within `startup_timeout_s`, a `weir.lag` call's
    within its `timeout`. `timeout` is that time in seconds and `reason` librdkafka's word for
    what happened, where the raiser knows them."""

    def __init__(self, message: str, *, timeout: float | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.timeout = timeout
        self.reason = reason


class BrokerRefusedError(BrokerUnreachableError):
    """A broker answered and refused the client: no request can be made until the client's
    security settings change. A `BrokerUnreachableError`, so code that handles a broker it
    cannot use handles this too; the message says what was refused and what to check."""


class AuthenticationError(BrokerRefusedError):
    """The broker refused the client's SASL credentials (a wrong password, an unknown user, a
    mechanism the user has no credentials for)."""


class AuthorizationError(BrokerRefusedError):
    """The broker's ACLs do not allow the client's principal what it needs: the message says
    which operation on which resource, and what ACLs the caller needs. `resource_type`
    ("topic", "group", "transactional id", "cluster"), `resources` (their names) and
    `operation` (Kafka's name: "READ", "WRITE", "DESCRIBE", ...) say it for a program, where
    the raiser knows them."""

    def __init__(
        self,
        message: str,
        *,
        resource_type: str | None = None,
        resources: tuple[str, ...] = (),
        operation: str | None = None,
    ) -> None:
        super().__init__(message)
        self.resource_type = resource_type
        self.resources = resources
        self.operation = operation


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
        """Name one more partition found without a valid offset (once; None adds nothing)."""
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


class OutputError(WeirError):
    """An output a handler produced (`ctx.produce`, at-least-once) was not confirmed by the
    broker: its record fails into the failure policy, and a retry produces its outputs again.
    `code` is the client's error name (`MSG_SIZE_TOO_LARGE`, `_MSG_TIMED_OUT`, ...)."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


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


class SeekError(WeirError):
    """`GroupConsumer.seek` (or `seek_to_beginning` / `seek_to_end`) was not done, and nothing
    changed: the partition is not assigned to this member when the owner thread serves the
    seek (`not_assigned`), the broker did not say where the target is, or, in exactly-once
    mode, the open transaction could not be committed first. Raised by the seek's future."""

    def __init__(self, message: str, *, not_assigned: bool = False) -> None:
        super().__init__(message)
        self.not_assigned = not_assigned


class AwaitableReturned(TypeError):
    """A handler returned a coroutine (or another awaitable) instead of awaiting it: a thread
    handler, or an `async def` one with the `await` left out. Its work never ran."""


class GeneratorReturned(TypeError):
    """A handler returned a generator: its body runs only when iterated, and nothing iterates
    it, so its work never ran."""


class DeadLetterError(WeirError):
    """A dead-letter topic is missing and could not be created (checked at start)."""


class FenceUnavailableError(WeirError):
    """The fence's database failed it: unreachable, a lock not granted within ``timeout_s``, or
    an error in the fence's own statements (not in a write function: those propagate as raised).

    The transaction was rolled back, unless the failure hid the outcome of its commit; the
    message says so then, and the event id makes a retry safe. The driver's error is chained as
    ``__cause__``.
    """


class NoEpochError(NonRetryable, RuntimeError):
    """A fenced handler got a record without an epoch: the consumer runs without a fence. Not
    retried: the record goes to the final failure policy (by default the member stops)."""


class LagError(WeirError):
    """A `weir.lag` call could not read the lag; the message says why, for a person. No broker
    answering, or one refusing the client, is a `BrokerUnreachableError` instead."""


class GroupNotFoundError(LagError):
    """The group has no members and no committed offsets: Kafka does not know it."""


class TopicNotFoundError(LagError):
    """A topic asked for does not exist."""


class OffsetsError(LagError):
    """A `weir.admin` reset that cannot be planned, a saved-offsets file that cannot be used, or
    a change the broker refused; the message says which partition and why."""


class GroupActiveError(LagError):
    """The group has members: its offsets can be changed, or the group deleted, only while it
    is empty. ``members`` holds ``(member_id, client_id, host)`` of each, as the message names
    them."""

    def __init__(self, message: str, members: tuple[tuple[str, str, str], ...] = ()) -> None:
        super().__init__(message)
        self.members = members


class ReadError(WeirError):
    """A topic could not be read: it does not exist, a partition is out of range, the broker
    did not answer or refused."""


class RedriveError(WeirError):
    """A redrive could not be planned or sent; nothing of this run was committed."""
