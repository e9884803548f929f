"""Broker processes never outlive their owner, and the `weir broker` CLI manages one."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from confluent_kafka import OFFSET_INVALID, Consumer, TopicPartition

from tests.processes import run_weir
from weir.cli import main
from weir.testing.broker import EmbeddedKafka, kafka_answers
from weir.testing.cluster import EmbeddedKafkaCluster
from weir.testing.errors import WorkdirInUseError
from weir.testing.pytest_plugin import (
    commit_offsets,
    consume_all,
    create_topic,
    produce,
    records_as_text,
)

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120), pytest.mark.usefixtures("quick_jvm")]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.slow  # the launcher's fault runs: make integration
def test_broker_dies_with_a_sigkilled_parent(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys, time
        from weir.testing.broker import EmbeddedKafka
        kafka = EmbeddedKafka(workdir=sys.argv[1]).start()
        print("JAVA_PID", kafka.pid, flush=True)
        time.sleep(300)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    java_pid = None
    try:
        assert parent.stdout is not None
        for line in parent.stdout:  # structlog also writes here; bounded by the test timeout
            if line.startswith("JAVA_PID "):
                java_pid = int(line.split()[1])
                break
        assert java_pid is not None, f"no pid from the child (exit {parent.poll()})"
        assert "kafka.Kafka" in " ".join(psutil.Process(java_pid).cmdline())

        parent.send_signal(signal.SIGKILL)  # no atexit, no finally: only PDEATHSIG can help
        parent.wait(10)
        assert wait_gone(java_pid, 10), f"java {java_pid} outlived its SIGKILLed parent"
    finally:
        parent.kill()
        if java_pid is not None and not gone(java_pid):
            os.kill(java_pid, signal.SIGKILL)


def test_cli_background_start_status_stop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = str(tmp_path / "broker.json")
    workdir = tmp_path / "work"
    assert main(["broker", "start", "--state", state, "--dir", str(workdir)]) == 0
    bootstrap = capsys.readouterr().out.strip().splitlines()[-1]
    port = int(bootstrap.rsplit(":", 1)[1])
    pid = None
    try:
        assert bootstrap.startswith("127.0.0.1:")
        assert kafka_answers(port)
        pid = int(json.loads(Path(state).read_text())["pid"])

        assert main(["broker", "start", "--state", state]) == 0  # idempotent
        assert "already running" in capsys.readouterr().out

        assert main(["broker", "status", "--state", state]) == 0
        out = capsys.readouterr().out
        assert bootstrap in out and "reachable" in out and "not reachable" not in out

        assert main(["broker", "stop", "--state", state]) == 0
        assert wait_gone(pid, 10)
        assert not Path(state).exists()
        assert (workdir / "kafka.log").is_file()  # --dir is the user's: kept

        assert main(["broker", "status", "--state", state]) == 1
        assert main(["broker", "stop", "--state", state]) == 0
    finally:
        if pid is not None and not gone(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow  # 20 s or more: make integration
def test_cli_foreground_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    state = tmp_path / "broker.json"
    command = ["broker", "start", "--foreground", "--state", str(state)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "weir.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    java_pid = None
    try:
        assert proc.stdout is not None
        bootstrap = proc.stdout.readline().strip()
        assert bootstrap.startswith("127.0.0.1:"), f"got {bootstrap!r}, exit {proc.poll()}"
        java_pid = int(json.loads(state.read_text())["pid"])
        workdir = Path(json.loads(state.read_text())["workdir"])

        proc.send_signal(signal.SIGINT)
        assert proc.wait(40) == 0
        assert gone(java_pid)
        assert not state.exists()
        assert not workdir.exists()  # temp work dir removed on a clean stop
    finally:
        proc.kill()
        if java_pid is not None and not gone(java_pid):
            os.kill(java_pid, signal.SIGKILL)


def controller_port(workdir: Path) -> int:
    config = (workdir / "server.properties").read_text()
    listeners = next(line for line in config.splitlines() if line.startswith("listeners="))
    return int(listeners.split("CONTROLLER://", 1)[1].split(",")[0].rsplit(":", 1)[1])


@pytest.mark.slow  # the launcher's fault runs: make integration
def test_cli_restart_on_the_same_dir_keeps_data_and_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: every `weir broker start --dir D` wiped D/data (topics and offsets gone) and
    took a new port."""
    state = str(tmp_path / "broker.json")
    workdir = tmp_path / "work"
    group = "weir-restart-group"

    def start() -> str:
        assert main(["broker", "start", "--state", state, "--dir", str(workdir)]) == 0
        return capsys.readouterr().out.strip().splitlines()[-1]

    def stop() -> None:
        pid = int(json.loads(Path(state).read_text())["pid"])
        assert main(["broker", "stop", "--state", state]) == 0
        assert wait_gone(pid, 10)

    def check(bootstrap: str, topic: str) -> None:
        assert records_as_text(consume_all(bootstrap, topic, expected=6, timeout=30)) == [
            (f"k{i}", f"v{i}") for i in range(6)
        ]
        probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        try:
            got = probe.committed([TopicPartition(topic, p) for p in range(3)], timeout=15)
        finally:
            probe.close()
        assert [tp.offset for tp in got] == [2, 1, OFFSET_INVALID]

    first = start()
    try:
        topic = create_topic(first, partitions=3)
        assert produce(first, topic, [(f"k{i}", f"v{i}") for i in range(6)], partition=0) == 6
        commit_offsets(first, group, topic, {0: 2, 1: 1})
        stop()

        second = start()
        check(second, topic)
        assert second == first  # the port was free, so it is the same address
        stop()

        # The last run's ports are taken now: the broker moves, the data does not.
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", int(first.rsplit(":", 1)[1])))
            b.bind(("127.0.0.1", controller_port(workdir)))
            a.listen(1)
            b.listen(1)
            third = start()
            assert third != first
            check(third, topic)
    finally:
        main(["broker", "stop", "--state", state])


def weir(*argv: str) -> subprocess.CompletedProcess[str]:
    """The installed `weir` command: its process exits after a start."""
    return run_weir(*argv, timeout=150)


@pytest.mark.slow  # the launcher's fault runs: make integration
def test_a_second_start_on_a_running_dir_is_refused_until_the_broker_dies(
    tmp_path: Path,
) -> None:
    """Regression: `weir broker start --dir D --state S2` while a broker ran on D (started with
    S1) rewrote D/server.properties with new ports (the next restart of the first took them)
    and launched a second JVM on D's storage and log. The lock on D must outlive the `weir`
    process that started the broker, and go when the broker dies, even by SIGKILL."""
    workdir = tmp_path / "work"
    first_state, second_state = tmp_path / "first.json", tmp_path / "second.json"
    first = weir("broker", "start", "--dir", str(workdir), "--state", str(first_state))
    assert first.returncode == 0, first.stderr
    bootstrap = first.stdout.strip()
    pid = int(json.loads(first_state.read_text())["pid"])
    second_pid = None
    try:
        properties = (workdir / "server.properties").read_text()
        log_size = (workdir / "kafka.log").stat().st_size

        second = weir("broker", "start", "--dir", str(workdir), "--state", str(second_state))
        assert second.returncode == 1
        assert second.stderr.splitlines() == [
            f"weir: another broker runs on {workdir} (at {bootstrap}, pid {pid}): stop it "
            "first, or use another directory"
        ]
        assert (workdir / "server.properties").read_text() == properties
        assert (workdir / "kafka.log").stat().st_size == log_size  # no second JVM wrote to it
        assert not second_state.exists()
        assert kafka_answers(int(bootstrap.rsplit(":", 1)[1]))
        assert weir("broker", "status", "--state", str(first_state)).returncode == 0

        os.kill(pid, signal.SIGKILL)
        assert wait_gone(pid, 10)
        again = weir("broker", "start", "--dir", str(workdir), "--state", str(second_state))
        assert again.returncode == 0, again.stderr  # no stale lock after a kill -9
        second_pid = int(json.loads(second_state.read_text())["pid"])
        assert again.stdout.strip() == bootstrap  # its port was free again: the same broker
        stopped = weir("broker", "stop", "--state", str(second_state))
        assert stopped.returncode == 0, stopped.stderr
        assert wait_gone(second_pid, 10)
    finally:
        for java in (pid, second_pid):
            if java is not None and not gone(java):
                os.kill(java, signal.SIGKILL)


@pytest.mark.slow  # the launcher's fault runs: make integration
def test_a_cluster_holds_its_directory_also_across_a_restart(tmp_path: Path) -> None:
    workdir = tmp_path / "cluster"
    cluster = EmbeddedKafkaCluster(size=1, workdir=workdir)
    cluster.start()
    try:
        with pytest.raises(WorkdirInUseError, match=f"another broker runs on {workdir} "):
            EmbeddedKafka(workdir=workdir).start()
        cluster.stop()  # storage kept: start() restarts the same cluster, locked again
        cluster.start()
        with pytest.raises(WorkdirInUseError):
            EmbeddedKafkaCluster(size=1, workdir=workdir).start()
        assert cluster.running
    finally:
        cluster.stop()


def test_a_broker_on_another_address_binds_and_advertises_only_that(tmp_path: Path) -> None:
    """`host`: the listeners bind the given address (not loopback's 127.0.0.1) and metadata sends
    clients there; the network-fault tests give an address that other namespaces reach."""
    with EmbeddedKafka(workdir=tmp_path, host="127.0.0.2") as kafka:
        assert kafka.bootstrap_servers == f"127.0.0.2:{kafka.port}"
        assert kafka_answers(kafka.port, host="127.0.0.2")
        assert not kafka_answers(kafka.port)  # nothing on 127.0.0.1
        topic = "on-another-address"
        create_topic(kafka.bootstrap_servers, topic)
        produce(kafka.bootstrap_servers, topic, [(b"k", b"v")])
        assert [(r.key, r.value) for r in consume_all(kafka.bootstrap_servers, topic)] == [
            (b"k", b"v")
        ]
        consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "probe"})
        try:
            brokers = consumer.list_topics(timeout=10).brokers
        finally:
            consumer.close()
        assert [(b.host, b.port) for b in brokers.values()] == [("127.0.0.2", kafka.port)]
