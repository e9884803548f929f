"""librdkafka's mock cluster, in this process, with its error injection (`rdkafka_mock.h`).

The librdkafka bundled in the confluent-kafka wheel carries a mock Kafka cluster: brokers that
listen on localhost and speak enough of the protocol for producers, consumer groups (classic and
KIP-848) and offset commits. It runs on librdkafka's own threads: no JVM, no process. Its C
functions are reached with ctypes on the same library (`tests.librdkafka._library`); the mock
API is experimental upstream, so this wrapper names each function it uses with its signature.

`MockCluster(brokers=3)` makes one (on a throwaway handle of its own), `bootstrap_servers` is what
clients connect to, and `fail_requests(api_key, errors)` makes the next requests of that kind, to
any broker, fail with those errors in turn. `requests(api_key)` counts the requests of a kind
the brokers received since the cluster was made (tracking is on from the start), so a test can
tell its injected errors were met.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from tests.librdkafka import _library

__all__ = ["OFFSET_FETCH", "MockCluster", "mock_cluster"]

OFFSET_FETCH = 9
"""The OffsetFetch request's ApiKey."""

_P = ctypes.c_void_p
_RD_KAFKA_PRODUCER = 0

_SIGNATURES: dict[str, tuple[type | None, list[type]]] = {
    "rd_kafka_conf_new": (_P, []),
    "rd_kafka_conf_set": (
        ctypes.c_int,
        [_P, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t],
    ),
    "rd_kafka_new": (_P, [ctypes.c_int, _P, ctypes.c_char_p, ctypes.c_size_t]),
    "rd_kafka_destroy": (None, [_P]),
    "rd_kafka_mock_cluster_new": (_P, [_P, ctypes.c_int]),
    "rd_kafka_mock_cluster_destroy": (None, [_P]),
    "rd_kafka_mock_cluster_bootstraps": (ctypes.c_char_p, [_P]),
    "rd_kafka_mock_topic_create": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_int, ctypes.c_int]),
    "rd_kafka_mock_coordinator_set": (
        ctypes.c_int,
        [_P, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int32],
    ),
    "rd_kafka_mock_group_initial_rebalance_delay_ms": (None, [_P, ctypes.c_int32]),
    "rd_kafka_mock_set_group_consumer_heartbeat_interval_ms": (None, [_P, ctypes.c_int]),
    "rd_kafka_mock_push_request_errors_array": (
        None,
        [_P, ctypes.c_int16, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)],
    ),
    "rd_kafka_mock_start_request_tracking": (None, [_P]),
    "rd_kafka_mock_get_requests": (ctypes.POINTER(_P), [_P, ctypes.POINTER(ctypes.c_size_t)]),
    "rd_kafka_mock_request_api_key": (ctypes.c_int16, [_P]),
    "rd_kafka_mock_request_destroy_array": (None, [ctypes.POINTER(_P), ctypes.c_size_t]),
}


def _lib() -> ctypes.CDLL:
    lib = _library()
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


class MockCluster:
    def __init__(self, brokers: int = 3) -> None:
        self._lib = lib = _lib()
        errstr = ctypes.create_string_buffer(512)
        conf = lib.rd_kafka_conf_new()
        # The handle only hosts the cluster; it connects nowhere and should say nothing.
        lib.rd_kafka_conf_set(conf, b"log_level", b"0", errstr, len(errstr))
        self._rk = lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, errstr, len(errstr))
        if not self._rk:
            raise RuntimeError(f"rd_kafka_new: {errstr.value.decode()}")
        self._mc = lib.rd_kafka_mock_cluster_new(self._rk, brokers)
        if not self._mc:
            lib.rd_kafka_destroy(self._rk)
            raise RuntimeError("rd_kafka_mock_cluster_new failed")
        self.bootstrap_servers: str = lib.rd_kafka_mock_cluster_bootstraps(self._mc).decode()
        # A group's first join waits 3 s by default, a KIP-848 heartbeat interval is 3 s.
        lib.rd_kafka_mock_group_initial_rebalance_delay_ms(self._mc, 0)
        lib.rd_kafka_mock_set_group_consumer_heartbeat_interval_ms(self._mc, 100)
        lib.rd_kafka_mock_start_request_tracking(self._mc)

    def create_topic(self, name: str, partitions: int) -> None:
        err = self._lib.rd_kafka_mock_topic_create(self._mc, name.encode(), partitions, 1)
        if err:
            raise RuntimeError(f"rd_kafka_mock_topic_create({name!r}): error {err}")

    def set_coordinator(self, group: str, broker: int) -> None:
        """`group`'s coordinator is `broker` (ids from 1)."""
        err = self._lib.rd_kafka_mock_coordinator_set(self._mc, b"group", group.encode(), broker)
        if err:
            raise RuntimeError(f"rd_kafka_mock_coordinator_set: error {err}")

    def fail_requests(self, api_key: int, errors: Sequence[int]) -> None:
        """The next `len(errors)` requests of `api_key` fail with these error codes, in turn."""
        codes = (ctypes.c_int * len(errors))(*errors)
        self._lib.rd_kafka_mock_push_request_errors_array(self._mc, api_key, len(errors), codes)

    def requests(self, api_key: int) -> int:
        """How many requests of `api_key` the brokers received so far."""
        lib = self._lib
        count = ctypes.c_size_t(0)
        reqs = lib.rd_kafka_mock_get_requests(self._mc, ctypes.byref(count))
        try:
            return sum(
                1
                for i in range(count.value)
                if lib.rd_kafka_mock_request_api_key(reqs[i]) == api_key
            )
        finally:
            if reqs:
                lib.rd_kafka_mock_request_destroy_array(reqs, count.value)

    def close(self) -> None:
        """After every client of it is closed."""
        if self._mc:
            self._lib.rd_kafka_mock_cluster_destroy(self._mc)
            self._mc = None
            self._lib.rd_kafka_destroy(self._rk)


@contextmanager
def mock_cluster(brokers: int = 3) -> Iterator[MockCluster]:
    cluster = MockCluster(brokers)
    try:
        yield cluster
    finally:
        cluster.close()
