"""`weir.prometheus.serve`'s arguments and a port already taken, without a broker (the server
answering a real member: tests/integration/test_observability.py)."""

from __future__ import annotations

import socket
import urllib.request
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from weir import GroupConsumer, Record
from weir.prometheus import serve

pytestmark = pytest.mark.timeout(30)


def member() -> GroupConsumer:
    def handle(record: Record) -> None:
        pass

    return GroupConsumer(handle, bootstrap_servers="127.0.0.1:9", group_id="g", topics=["t"])


@pytest.mark.parametrize(
    ("port", "error", "message"),
    [
        ("9100", TypeError, "port must be an int (0: any free port), got '9100'"),
        (True, TypeError, "port must be an int (0: any free port), got True"),
        (-1, ValueError, "port must be 0 to 65535 (0: any free port), got -1"),
        (65536, ValueError, "port must be 0 to 65535 (0: any free port), got 65536"),
    ],
)
def test_a_bad_port_is_named(port: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        serve(member(), port=port, host="127.0.0.1")
    assert str(info.value) == message


def test_a_taken_port_is_named_and_leaves_the_registry_as_it_was() -> None:
    """Binding failed after the member's collector went into the registry: the same call on
    another port then failed with prometheus_client's 'Duplicated timeseries'."""
    gc = member()
    registry = CollectorRegistry(auto_describe=True)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{port}: "):
            serve(gc, port=port, host="127.0.0.1", registry=registry)
    assert list(registry.collect()) == []
    with serve(gc, port=0, host="127.0.0.1", registry=registry) as server:
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            assert answer.status == 200
            assert b"weir_" in answer.read()
