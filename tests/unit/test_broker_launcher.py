"""EmbeddedKafka's error paths that fail before a JVM starts, and its pieces that need none.

Start-ups that fail in a JVM are in tests/integration/test_broker_start_failures.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from weir.testing.broker import (
    TEST_BROKER_DEFAULTS,
    EmbeddedKafka,
    KafkaNode,
    new_cluster_id,
    pick_free_ports,
    port_is_free,
    resolve_workdir,
)
from weir.testing.cluster import EmbeddedKafkaCluster, cluster_defaults
from weir.testing.errors import JavaNotFoundError, PortInUseError

pytestmark = pytest.mark.timeout(60)


def test_requested_port_in_use_fails_before_starting_anything(occupied_port: int) -> None:
    kafka = EmbeddedKafka(port=occupied_port)
    with pytest.raises(PortInUseError, match=f"127.0.0.1:{occupied_port} is already in use"):
        kafka.start()
    assert not kafka.running and kafka.pid is None


def test_requested_controller_port_in_use(occupied_port: int) -> None:
    with pytest.raises(PortInUseError, match="Controller port"):
        EmbeddedKafka(controller_port=occupied_port).start()


def test_port_probe(occupied_port: int) -> None:
    assert port_is_free(occupied_port) is False
    assert port_is_free(pick_free_ports(1)[0]) is True


def test_picked_ports_are_distinct_loopback_ports() -> None:
    ports = pick_free_ports(6)
    assert len(set(ports)) == 6
    assert all(port_is_free(port) for port in ports)


def test_missing_java_stops_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(JavaNotFoundError):
        EmbeddedKafka(workdir=tmp_path / "work").start()
    assert not (tmp_path / "work").exists()


def test_cluster_ids_look_like_kafka_uuids() -> None:
    ids = {new_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}", i) for i in ids)


def test_kip848_defaults_satisfy_the_brokers_rules() -> None:
    # The broker refuses to start unless min <= value and heartbeat < session.
    d = {
        k.removeprefix("group.consumer."): int(v)
        for k, v in TEST_BROKER_DEFAULTS.items()
        if k.startswith("group.consumer.")
    }
    assert d["min.session.timeout.ms"] <= d["session.timeout.ms"]
    assert d["min.heartbeat.interval.ms"] <= d["heartbeat.interval.ms"]
    assert d["heartbeat.interval.ms"] < d["session.timeout.ms"]


def test_cluster_defaults_replicate_internal_topics() -> None:
    d = cluster_defaults(3)
    assert d["offsets.topic.replication.factor"] == "3"
    assert d["transaction.state.log.replication.factor"] == "3"
    assert d["transaction.state.log.min.isr"] == "2"
    assert cluster_defaults(1)["transaction.state.log.min.isr"] == "1"


def test_workdir_ownership(tmp_path: Path) -> None:
    created, remove = resolve_workdir(None, None, "weir-test-")
    try:
        assert created.is_dir() and remove is True
    finally:
        created.rmdir()
    assert resolve_workdir(tmp_path / "mine", None, "x")[1] is False
    assert resolve_workdir(tmp_path / "mine", False, "x")[1] is True
    created, remove = resolve_workdir(None, True, "weir-test-")
    created.rmdir()
    assert remove is False


@pytest.mark.parametrize("host", ["localhost", "::1", "10.0.0", "", "127.0.0.1:9092"])
def test_a_host_that_is_not_an_ipv4_address_is_refused_at_once(host: str) -> None:
    with pytest.raises(ValueError, match="host must be an IPv4 address"):
        EmbeddedKafka(host=host)
    with pytest.raises(ValueError, match="host must be an IPv4 address"):
        EmbeddedKafkaCluster(hosts=["127.0.0.1", "127.0.0.2", host])


def test_a_cluster_needs_one_host_and_one_namespace_per_node() -> None:
    with pytest.raises(ValueError, match=r"hosts needs one entry per node \(3\), got 2"):
        EmbeddedKafkaCluster(hosts=["127.0.0.1", "127.0.0.2"])
    with pytest.raises(ValueError, match=r"netns needs one entry per node \(3\), got 1"):
        EmbeddedKafkaCluster(netns=["a"])


def test_a_node_binds_advertises_and_joins_its_quorum_at_its_host(tmp_path: Path) -> None:
    node = KafkaNode(
        node_id=2,
        workdir=tmp_path,
        port=9092,
        controller_port=9093,
        quorum={},
        properties={},
        java="java",
        jars=tmp_path,
        host="10.1.2.3",
    )
    assert node.properties["listeners"] == "PLAINTEXT://10.1.2.3:9092,CONTROLLER://10.1.2.3:9093"
    assert node.properties["advertised.listeners"] == "PLAINTEXT://10.1.2.3:9092"
    assert node.bootstrap_servers == "10.1.2.3:9092"
