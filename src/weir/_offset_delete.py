"""Kafka's OffsetDelete (KIP-496) through librdkafka's C API.

confluent-kafka (2.16) wraps librdkafka's DeleteConsumerGroupOffsets in no Python call, and an
offset cannot be removed with a commit (AlterConsumerGroupOffsets refuses a negative offset). So
this calls the librdkafka that confluent-kafka itself loads, through ctypes, with a client of its
own made from the same settings: one request, its answer, and the client destroyed. The settings
go over as text; callbacks and the Python logger stay with the Python client (an oauth_cb is
refused: the token would be missing); librdkafka's log is off (its lines would go to stderr).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from weir._engine.refusals import authorization_error, denied_of
from weir.errors import BrokerUnreachableError, LagError

_ERRSTR = 512


class _Partition(ctypes.Structure):
    _fields_ = [
        ("topic", ctypes.c_char_p),
        ("partition", ctypes.c_int32),
        ("offset", ctypes.c_int64),
        ("metadata", ctypes.c_void_p),
        ("metadata_size", ctypes.c_size_t),
        ("opaque", ctypes.c_void_p),
        ("err", ctypes.c_int),
        ("_private", ctypes.c_void_p),
    ]


class _PartitionList(ctypes.Structure):
    _fields_ = [
        ("cnt", ctypes.c_int),
        ("size", ctypes.c_int),
        ("elems", ctypes.POINTER(_Partition)),
    ]


_lib: Any = None


def _library() -> Any:
    """The librdkafka confluent-kafka uses: the copy its wheel bundles, else the system's (the
    search that runs ldconfig only when the plain names fail)."""
    global _lib
    if _lib is None:
        _lib = _load([*_bundled(), "librdkafka.so.1", "librdkafka.1.dylib"])
    if _lib is None:
        found = ctypes.util.find_library("rdkafka")
        _lib = _load([found] if found else [])
    if _lib is None:
        raise LagError(
            "deleting a group's offsets needs librdkafka 1.6 or later, and none was found "
            "where confluent-kafka keeps it"
        )
    return _lib


def _bundled() -> list[str]:
    import confluent_kafka

    here = os.path.dirname(os.path.abspath(confluent_kafka.__file__))
    return sorted(glob.glob(os.path.join(here, os.pardir, "confluent_kafka.libs", "librdkafka*")))


def _load(paths: list[str]) -> Any:
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            lib.rd_kafka_DeleteConsumerGroupOffsets_new  # noqa: B018 (present since 1.6)
        except (OSError, AttributeError):
            continue
        _declare(lib)
        return lib
    return None


def _declare(lib: Any) -> None:
    p, c, i, s = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t
    signatures: dict[str, tuple[Any, list[Any]]] = {
        "rd_kafka_conf_new": (p, []),
        "rd_kafka_conf_set": (i, [p, c, c, c, s]),
        "rd_kafka_conf_set_log_cb": (None, [p, p]),
        "rd_kafka_conf_destroy": (None, [p]),
        "rd_kafka_new": (p, [i, p, c, s]),
        "rd_kafka_destroy": (None, [p]),
        "rd_kafka_queue_new": (p, [p]),
        "rd_kafka_queue_destroy": (None, [p]),
        "rd_kafka_queue_poll": (p, [p, i]),
        "rd_kafka_topic_partition_list_new": (ctypes.POINTER(_PartitionList), [i]),
        "rd_kafka_topic_partition_list_add": (
            p,
            [ctypes.POINTER(_PartitionList), c, ctypes.c_int32],
        ),
        "rd_kafka_topic_partition_list_destroy": (None, [ctypes.POINTER(_PartitionList)]),
        "rd_kafka_DeleteConsumerGroupOffsets_new": (p, [c, ctypes.POINTER(_PartitionList)]),
        "rd_kafka_DeleteConsumerGroupOffsets_destroy": (None, [p]),
        "rd_kafka_DeleteConsumerGroupOffsets": (None, [p, ctypes.POINTER(p), s, p, p]),
        "rd_kafka_AdminOptions_new": (p, [p, i]),
        "rd_kafka_AdminOptions_destroy": (None, [p]),
        "rd_kafka_AdminOptions_set_request_timeout": (i, [p, i, c, s]),
        "rd_kafka_event_error": (i, [p]),
        "rd_kafka_event_error_string": (c, [p]),
        "rd_kafka_event_destroy": (None, [p]),
        "rd_kafka_event_DeleteConsumerGroupOffsets_result": (p, [p]),
        "rd_kafka_DeleteConsumerGroupOffsets_result_groups": (
            ctypes.POINTER(p),
            [p, ctypes.POINTER(s)],
        ),
        "rd_kafka_group_result_error": (p, [p]),
        "rd_kafka_group_result_partitions": (ctypes.POINTER(_PartitionList), [p]),
        "rd_kafka_error_name": (c, [p]),
        "rd_kafka_error_string": (c, [p]),
        "rd_kafka_err2name": (c, [i]),
        "rd_kafka_err2str": (c, [i]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes


_RD_KAFKA_PRODUCER = 0
_ADMIN_OP_ANY = 0
_TIMED_OUT = -185  # RD_KAFKA_RESP_ERR__TIMED_OUT


def delete_offsets(
    config: Mapping[str, Any],
    group_id: str,
    partitions: Sequence[tuple[str, int]],
    timeout: float,
) -> None:
    """Delete ``group_id``'s committed offsets of ``partitions``; raises ``LagError`` naming
    what the broker refused, ``BrokerUnreachableError`` when it did not answer in time."""
    lib = _library()
    if config.get("oauth_cb") is not None:
        raise LagError(
            "deleting offsets cannot use an oauth_cb (a Python callback its C client cannot "
            "call): give the token by librdkafka settings (sasl.oauthbearer.method=oidc)"
        )
    errstr = ctypes.create_string_buffer(_ERRSTR)
    conf = lib.rd_kafka_conf_new()
    for key, value in _c_settings(config).items():
        if lib.rd_kafka_conf_set(conf, key.encode(), value.encode(), errstr, _ERRSTR) != 0:
            lib.rd_kafka_conf_destroy(conf)
            raise LagError(f"the client refuses the setting {key}")
    lib.rd_kafka_conf_set_log_cb(conf, None)
    rk = lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, errstr, _ERRSTR)
    if not rk:  # conf is still ours on failure
        lib.rd_kafka_conf_destroy(conf)
        raise LagError(f"cannot make a client: {errstr.value.decode(errors='replace')}")
    queue = options = request = event = None
    tps = lib.rd_kafka_topic_partition_list_new(len(partitions))
    try:
        for topic, partition in partitions:
            lib.rd_kafka_topic_partition_list_add(tps, topic.encode(), partition)
        request = lib.rd_kafka_DeleteConsumerGroupOffsets_new(group_id.encode(), tps)
        queue = lib.rd_kafka_queue_new(rk)
        options = lib.rd_kafka_AdminOptions_new(rk, _ADMIN_OP_ANY)
        millis = max(1, int(timeout * 1000))
        lib.rd_kafka_AdminOptions_set_request_timeout(options, millis, errstr, _ERRSTR)
        requests = (ctypes.c_void_p * 1)(request)
        lib.rd_kafka_DeleteConsumerGroupOffsets(rk, requests, 1, options, queue)
        end = time.monotonic() + timeout + 1.0
        while not event:
            left = end - time.monotonic()
            if left <= 0:
                raise BrokerUnreachableError(
                    f"no broker answered within {timeout:g} s", timeout=timeout
                )
            # Short polls: Ctrl-C is seen between them.
            event = lib.rd_kafka_queue_poll(queue, int(min(left, 0.2) * 1000))
        _check(lib, event, group_id, timeout)
    finally:
        for destroy, handle in (
            (lib.rd_kafka_event_destroy, event),
            (lib.rd_kafka_DeleteConsumerGroupOffsets_destroy, request),
            (lib.rd_kafka_AdminOptions_destroy, options),
            (lib.rd_kafka_queue_destroy, queue),
        ):
            if handle:
                destroy(handle)
        lib.rd_kafka_topic_partition_list_destroy(tps)
        lib.rd_kafka_destroy(rk)


def _c_settings(config: Mapping[str, Any]) -> dict[str, str]:
    """The settings as librdkafka's text; callbacks and the Python logger are left out (the
    error, stats and throttle callbacks only report)."""
    out = {}
    for key, value in config.items():
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, (str, int, float)):
            out[key] = str(value)
    return out


_NEEDS = "deleting a group's offsets needs DELETE on the group and READ on the topic"


def _error(name: str, text: str, group_id: str) -> Exception:
    """librdkafka's error `name` for the request: an ACL refusal says what it refused."""
    denied = denied_of(name, "DELETE", group=group_id)
    if denied is not None:
        return authorization_error(denied, text, _NEEDS)
    return LagError(f"{name}: {text}")


def _check(lib: Any, event: Any, group_id: str, timeout: float) -> None:
    code = lib.rd_kafka_event_error(event)
    if code == _TIMED_OUT:
        raise BrokerUnreachableError(
            f"no broker answered within {timeout:g} s (Local: Timed out)",
            timeout=timeout,
            reason="Local: Timed out",
        )
    if code != 0:
        text = (lib.rd_kafka_event_error_string(event) or b"").decode(errors="replace")
        raise _error(lib.rd_kafka_err2name(code).decode(), text, group_id)
    result = lib.rd_kafka_event_DeleteConsumerGroupOffsets_result(event)
    if not result:
        raise LagError("librdkafka answered the offsets deletion with another event")
    count = ctypes.c_size_t()
    groups = lib.rd_kafka_DeleteConsumerGroupOffsets_result_groups(result, ctypes.byref(count))
    for index in range(count.value):
        group = groups[index]
        error = lib.rd_kafka_group_result_error(group)
        if error:
            name = lib.rd_kafka_error_name(error).decode()
            text = lib.rd_kafka_error_string(error).decode(errors="replace")
            raise _error(name, text, group_id)
        tps = lib.rd_kafka_group_result_partitions(group)
        failed = []
        if tps:
            listed = tps.contents
            for i in range(listed.cnt):
                element = listed.elems[i]
                if element.err:
                    topic = (element.topic or b"").decode(errors="replace")
                    name = lib.rd_kafka_err2name(element.err).decode()
                    denied = denied_of(name, "READ", topic=topic)
                    if denied is not None:
                        raise authorization_error(denied, name, _NEEDS)
                    failed.append(f"{topic}[{element.partition}]: {name}")
        if failed:
            raise LagError(f"the broker kept some offsets: {'; '.join(failed)}")
