"""Ids and other text settings as librdkafka and the Kafka protocol read them.

librdkafka takes every setting as a C string and trims some; the protocol caps an id's length.
What either would read other than as typed is refused with a reason, before a client is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_ID_BYTES", "id_problem", "member_id_problem", "shown", "text_problem"]


# librdkafka reads every setting as a C string: a NUL ends it there, so what follows would be
# dropped without a word (`enable.auto.commit\0` in `kafka` would set enable.auto.commit).
_NUL = "\x00"
# librdkafka left-trims string settings with C's isspace() (rd_kafka_anyconf_set): " orders" is
# group "orders" to it, and a blank group id leaves the client without a consumer group, which
# aborts the interpreter in confluent-kafka's Consumer(). Multi-byte UTF-8 never starts with one.
_C_SPACE = " \t\n\v\f\r"
# Kafka's protocol sends ids as strings with an int16 length: at most 32767 bytes of UTF-8 (the
# broker drops the connection on a longer one, and the member never joins).
MAX_ID_BYTES = 32767
# Under the classic protocol the broker names each member `<group.instance.id or client.id>-<a
# UUID>` and sends that name back: 37 more bytes that must fit too (JoinGroup fails otherwise).
_CLASSIC_MEMBER_SUFFIX = 37


def text_problem(what: str, value: str) -> str | None:
    """What keeps `value` from reaching librdkafka as typed: a NUL, or text UTF-8 cannot hold."""
    if _NUL in value:
        return (
            f"{what} contains a NUL character (\\x00): librdkafka reads it as a C string, which "
            "ends there, and would drop the rest"
        )
    try:
        value.encode()
    except UnicodeEncodeError:
        return f"{what} holds a lone surrogate, which UTF-8 cannot encode"
    return None


def id_problem(what: str, value: str, max_bytes: int = MAX_ID_BYTES, why: str = "") -> str | None:
    """Why `value` cannot be the id `what` (a group, client, instance or transactional id)."""
    allowed = (
        f"an id is any text of 1 to {max_bytes} bytes of UTF-8{why} that does not start with "
        "whitespace and has no NUL character"
    )
    problem = text_problem(what, value)
    if problem is None and value[:1] in tuple(_C_SPACE):
        stripped = value.lstrip(_C_SPACE)
        problem = (
            f"{what} {shown(value)} starts with whitespace, which librdkafka strips "
            f"({f'it would be {shown(stripped)}' if stripped else 'leaving it empty'})"
        )
    if problem is None and len(value.encode()) > max_bytes:
        problem = f"{what} is {len(value.encode())} bytes long"
    return None if problem is None else f"{problem}: {allowed}"


def member_id_problem(what: str, value: str, values: Mapping[str, Any]) -> str | None:
    """`id_problem` for the id a classic group's broker names the member after: the group
    instance id if there is one, else the client id."""
    if values.get("group_protocol") == "classic":
        why = (
            " (a classic group's broker names the member '<id>-<UUID>', which must fit in "
            f"{MAX_ID_BYTES})"
        )
        return id_problem(what, value, MAX_ID_BYTES - _CLASSIC_MEMBER_SUFFIX, why)
    return id_problem(what, value)


def shown(value: str) -> str:
    return repr(value) if len(value) <= 80 else f"{value[:80]!r}..."
