"""The member's output serializers (`GroupConsumer(value_serializer=..., key_serializer=...)`),
as `ctx.produce` finds them: set by the serializing wrapper around each handler call, on the
call's own thread or asyncio task (as the tracing wrapper sets the output headers), and read only
for an output whose key or value is not already bytes, str or None. A member without serializers
sets nothing, and a produce of bytes never reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any, TypeVar

__all__ = ["OUTPUT_SERIALIZERS", "RAW", "OutputSerializers", "for_topic", "serialized"]

F = TypeVar("F", bound=Callable[..., Any])

# As the setting was checked (`weir.serde.Serializers`): what the function returns is checked
# at each call.
Serializer = Callable[[Any], object]
Serializers = Serializer | Mapping[str, Serializer]

# What the producer takes as it is: anything else is an object for a serializer.
RAW = (bytes, str, type(None))


class OutputSerializers:
    """A member's key and value serializers: each one function for every output topic, or a
    mapping of output topic to function, or None."""

    __slots__ = ("key", "value")

    def __init__(self, key: Serializers | None, value: Serializers | None) -> None:
        self.key = key
        self.value = value


OUTPUT_SERIALIZERS: ContextVar[OutputSerializers | None] = ContextVar(
    "weir_output_serializers", default=None
)


def for_topic(given: F | Mapping[str, F] | None, topic: str) -> F | None:
    """A (de)serializer setting's function for `topic`: the one function, or the mapping's entry
    for it (None: none)."""
    if given is None or callable(given):
        return given
    return given.get(topic)


def serialized(
    topic: str, value: object, key: object
) -> tuple[bytes | str | None, bytes | str | None]:
    """`value` and `key` of an output to `topic` as the producer takes them, in the handler's
    thread: what a serializer raises fails the handler's record there."""
    given = OUTPUT_SERIALIZERS.get()
    return (
        _one(topic, "value", value, None if given is None else given.value),
        _one(topic, "key", key, None if given is None else given.key),
    )


def _one(
    topic: str, field: str, obj: object, serializers: Serializers | None
) -> bytes | str | None:
    if isinstance(obj, RAW):
        return obj  # bytes, str and None pass through, serializer or not
    serializer = for_topic(serializers, topic)
    if serializer is None:
        if isinstance(serializers, Mapping):
            named = ", ".join(map(repr, serializers))
            why = f"{field}_serializer has no entry for {topic!r} (it has {named})"
        else:
            why = f"the member has no {field}_serializer"
        raise TypeError(
            f"ctx.produce to {topic!r}: the {field} is a {type(obj).__name__}, and {why}: pass "
            f"bytes, str or None, or set GroupConsumer({field}_serializer=...) "
            "(docs/producing.md#serializers)"
        )
    data = serializer(obj)
    if not isinstance(data, RAW):
        name = getattr(serializer, "__qualname__", repr(serializer))
        raise TypeError(
            f"the {field}_serializer {name} for {topic!r} returned a {type(data).__name__}: a "
            "serializer must return bytes, str or None"
        )
    return data
