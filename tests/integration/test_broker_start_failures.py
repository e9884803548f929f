"""EmbeddedKafka start-ups that fail in a JVM: an invalid override, a broker refusing its
settings, a JVM that dies, a port taken before Java binds it, a start that times out. Each fails
within seconds, and none leaves a temp dir behind (they need Java 17 and the jars, like the rest
of the suite)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from weir.cli import main
from weir.testing import broker as broker_module
from weir.testing.broker import EmbeddedKafka
from weir.testing.cluster import EmbeddedKafkaCluster
from weir.testing.errors import BrokerStartError, HarnessError

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("quick_jvm")]


def test_invalid_override_fails_fast_with_the_log_tail(tmp_path: Path) -> None:
    kafka = EmbeddedKafka(overrides={"process.roles": "nonsense"}, start_timeout=30)
    with pytest.raises(BrokerStartError) as info:
        kafka.start()
    message = str(info.value)
    assert "Formatting Kafka storage" in message
    assert "Invalid value nonsense for configuration process.roles" in info.value.log_tail
    assert "last lines of the broker log" in message
    assert not kafka.running
    assert not kafka.workdir.exists()  # temp dir cleaned even on failure


def test_broker_rejecting_kip848_settings_is_reported(tmp_path: Path) -> None:
    kafka = EmbeddedKafka(
        overrides={"group.consumer.heartbeat.interval.ms": "7000"}, workdir=tmp_path, keep=True
    )
    with pytest.raises(BrokerStartError) as info:
        kafka.start()
    assert "must be less than group.consumer.session.timeout.ms" in info.value.log_tail
    assert (tmp_path / "kafka.log").is_file()  # keep=True leaves the evidence


def test_jvm_dying_during_start_is_reported_not_waited_for(tmp_path: Path) -> None:
    kafka = EmbeddedKafka(jvm_args=["-XX:+WeirNoSuchOption"], start_timeout=30)
    with pytest.raises(BrokerStartError, match="exited with code 1 during start-up") as info:
        kafka.start()
    assert "Unrecognized VM option" in info.value.log_tail


@pytest.mark.slow  # the launcher's fault runs wait out its retries: make integration
def test_bind_race_is_retried_with_new_ports(
    occupied_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Simulate another process grabbing the picked client port before Java binds it."""
    real_pick = broker_module.pick_free_ports
    picks: list[list[int]] = []

    def pick(count: int) -> list[int]:
        ports = real_pick(count)
        if not picks:
            ports[0] = occupied_port
        picks.append(ports)
        return ports

    monkeypatch.setattr(broker_module, "pick_free_ports", pick)
    with EmbeddedKafka(start_timeout=60) as kafka:
        assert len(picks) == 2
        assert kafka.port == picks[1][0] != occupied_port
        assert "Address already in use" in kafka.log_path.read_text()
        assert kafka.running


# --- a failed start leaves no temp dir ------------------------------------------------------------


@pytest.fixture
def temp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where tempfile.mkdtemp() puts the broker's temp work dir during this test."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.mark.parametrize(
    "failure",
    [
        "invalid override",
        "jvm dies",
        "timeout",
        pytest.param("bind retries exhausted", marks=pytest.mark.slow),  # make integration
        "no java",
    ],
)
def test_failed_start_leaves_no_temp_dir(
    failure: str, temp_root: Path, occupied_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: with keep=True (what `weir broker start` uses) a failed start left its temp dir.

    keep=True means "keep it after stop()"; a start that failed has nothing worth keeping, and
    the error already carries the log's last lines. (keep=None removed it already.)
    """
    options: dict[str, Any] = {"keep": True, "start_timeout": 30}
    if failure == "invalid override":
        options["overrides"] = {"process.roles": "nonsense"}
    elif failure == "jvm dies":
        options["jvm_args"] = ["-XX:+WeirNoSuchOption"]
    elif failure == "timeout":
        options["start_timeout"] = 0.5
    elif failure == "bind retries exhausted":
        real_pick = broker_module.pick_free_ports
        # Every attempt's client port is taken by the time Java binds it; two attempts (each a
        # JVM start) take the same path as three.
        monkeypatch.setattr(broker_module, "_PORT_ATTEMPTS", 2)
        monkeypatch.setattr(
            broker_module, "pick_free_ports", lambda count: [occupied_port, *real_pick(count)[1:]]
        )
    else:
        monkeypatch.setenv("PATH", str(temp_root.parent / "no-bin"))
        monkeypatch.delenv("JAVA_HOME", raising=False)
    kafka = EmbeddedKafka(**options)
    with pytest.raises(HarnessError) as info:
        kafka.start()
    if failure == "bind retries exhausted":
        assert "Address already in use" in str(info.value)
    assert not kafka.running
    assert list(temp_root.iterdir()) == []


def test_failed_cli_start_leaves_no_temp_dir(
    temp_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "broker.json"
    assert main(["broker", "start", "--state", str(state), "--override", "process.roles=x"]) == 1
    assert "Invalid value x for configuration process.roles" in capsys.readouterr().err
    assert list(temp_root.iterdir()) == []
    assert not state.exists()


def test_failed_cluster_start_leaves_no_temp_dir(temp_root: Path) -> None:
    cluster = EmbeddedKafkaCluster(size=1, keep=True, overrides={"process.roles": "nonsense"})
    with pytest.raises(BrokerStartError):
        cluster.start()
    assert list(temp_root.iterdir()) == []
