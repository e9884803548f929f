"""Broker provider selection: every branch, with the environment probes injected."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.stand_ins import write_script

from weir.testing import providers
from weir.testing.errors import BrokerUnavailableError
from weir.testing.providers import (
    DEFAULT_IMAGE,
    EmbeddedBroker,
    ExternalBroker,
    TestcontainersBroker,
    docker_reachable,
    java_toolchain_available,
    select_provider,
)

pytestmark = pytest.mark.timeout(30)


def yes() -> bool:
    return True


def no() -> bool:
    return False


def must_not_probe() -> bool:
    raise AssertionError("this probe should not run")


def select(
    env: dict[str, str],
    *,
    docker: Callable[[], bool] = no,
    java: Callable[[], bool] = no,
    testcontainers: Callable[[], bool] = yes,
) -> providers.BrokerProvider:
    return select_provider(
        env, docker_available=docker, java_available=java, testcontainers_installed=testcontainers
    )


# --- selection -----------------------------------------------------------------------------------


def test_bootstrap_servers_win_without_probing() -> None:
    provider = select(
        {"WEIR_BOOTSTRAP_SERVERS": "kafka:9092"}, docker=must_not_probe, java=must_not_probe
    )
    assert isinstance(provider, ExternalBroker)
    assert provider.start() == "kafka:9092"
    assert provider.bootstrap_servers == "kafka:9092"
    provider.stop()


def test_docker_is_preferred_over_java() -> None:
    provider = select({}, docker=yes, java=yes)
    assert isinstance(provider, TestcontainersBroker)
    assert provider.image == DEFAULT_IMAGE


def test_image_comes_from_the_environment() -> None:
    provider = select({"WEIR_KAFKA_IMAGE": "confluentinc/cp-kafka:8.0.1"}, docker=yes)
    assert isinstance(provider, TestcontainersBroker)
    assert provider.image == "confluentinc/cp-kafka:8.0.1"


def test_docker_without_testcontainers_falls_back_to_java() -> None:
    provider = select({}, docker=yes, java=yes, testcontainers=no)
    assert isinstance(provider, EmbeddedBroker)


def test_java_when_no_docker() -> None:
    assert isinstance(select({}, docker=no, java=yes), EmbeddedBroker)


def test_nothing_available_names_every_way_out() -> None:
    with pytest.raises(BrokerUnavailableError) as info:
        select({}, docker=no, java=no)
    message = str(info.value)
    for hint in ("Java 17", "Maven", "Docker", "WEIR_BOOTSTRAP_SERVERS"):
        assert hint in message


def test_blank_bootstrap_is_ignored() -> None:
    assert isinstance(select({"WEIR_BOOTSTRAP_SERVERS": "  "}, java=yes), EmbeddedBroker)


@pytest.mark.parametrize("value", ["embedded", "EMBEDDED", " embedded "])
def test_forced_embedded_beats_bootstrap_and_docker(value: str) -> None:
    env = {"WEIR_BROKER": value, "WEIR_BOOTSTRAP_SERVERS": "kafka:9092"}
    # Forced embedded does not probe: EmbeddedKafka.start() explains exactly what is missing.
    provider = select(env, docker=must_not_probe, java=must_not_probe)
    assert isinstance(provider, EmbeddedBroker)


def test_forced_external() -> None:
    env = {"WEIR_BROKER": "external", "WEIR_BOOTSTRAP_SERVERS": "a:1,b:2"}
    provider = select(env, docker=must_not_probe, java=must_not_probe)
    assert isinstance(provider, ExternalBroker)
    assert provider.start() == "a:1,b:2"


def test_forced_external_needs_bootstrap() -> None:
    with pytest.raises(BrokerUnavailableError, match="WEIR_BOOTSTRAP_SERVERS"):
        select({"WEIR_BROKER": "external"}, docker=yes, java=yes)


def test_forced_testcontainers() -> None:
    provider = select({"WEIR_BROKER": "testcontainers"}, docker=yes, java=must_not_probe)
    assert isinstance(provider, TestcontainersBroker)


def test_forced_testcontainers_without_docker() -> None:
    with pytest.raises(BrokerUnavailableError, match="no Docker engine"):
        select({"WEIR_BROKER": "testcontainers"}, docker=no, java=yes)


def test_forced_testcontainers_without_package() -> None:
    with pytest.raises(BrokerUnavailableError, match="not installed"):
        select({"WEIR_BROKER": "testcontainers"}, docker=yes, testcontainers=no)


def test_auto_is_the_default_behaviour() -> None:
    assert isinstance(select({"WEIR_BROKER": "auto"}, java=yes), EmbeddedBroker)


def test_invalid_choice_lists_the_valid_ones() -> None:
    with pytest.raises(BrokerUnavailableError) as info:
        select({"WEIR_BROKER": "docker"}, docker=must_not_probe, java=must_not_probe)
    message = str(info.value)
    assert "'docker'" in message
    for choice in ("auto", "external", "testcontainers", "embedded"):
        assert choice in message


def test_unstarted_provider_has_no_bootstrap() -> None:
    with pytest.raises(RuntimeError, match="not been started"):
        _ = ExternalBroker("x:1").bootstrap_servers


def test_embedded_stop_before_start_is_harmless() -> None:
    EmbeddedBroker().stop()


# --- the Docker probe ----------------------------------------------------------------------------


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # AF_UNIX paths are limited to ~107 bytes; pytest's tmp_path can be longer.
    import tempfile

    with tempfile.TemporaryDirectory(prefix="weir-") as name:
        yield Path(name)


def serve_unix(path: Path, reply: bytes) -> threading.Thread:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def answer() -> None:
        with server:
            conn, _ = server.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(reply)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return thread


def test_docker_probe_pings_the_engine(short_tmp: Path) -> None:
    sock = short_tmp / "docker.sock"
    serve_unix(sock, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK")
    assert docker_reachable({"DOCKER_HOST": f"unix://{sock}"}) is True


def test_docker_probe_rejects_a_socket_that_is_not_docker(short_tmp: Path) -> None:
    sock = short_tmp / "docker.sock"
    serve_unix(sock, b"HTTP/1.1 404 Not Found\r\n\r\n")
    assert docker_reachable({"DOCKER_HOST": f"unix://{sock}"}) is False


def test_docker_probe_is_quick_when_nothing_listens(short_tmp: Path) -> None:
    started = time.monotonic()
    assert docker_reachable({"DOCKER_HOST": f"unix://{short_tmp}/missing.sock"}) is False
    assert docker_reachable({"DOCKER_HOST": "ssh://user@host"}) is False
    assert time.monotonic() - started < 1.0


def test_docker_probe_over_tcp() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        assert docker_reachable({"DOCKER_HOST": f"tcp://127.0.0.1:{port}"}) is True
    assert docker_reachable({"DOCKER_HOST": f"tcp://127.0.0.1:{port}"}) is False


def test_docker_probe_default_locations_answer_quickly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    started = time.monotonic()
    docker_reachable({})  # result depends on the machine; it must just not hang
    assert time.monotonic() - started < 2.0


# --- the Java probe ------------------------------------------------------------------------------


def executable(path: Path) -> None:
    write_script(path.parent, path.name, "exit 0\n")


def test_java_probe_needs_java(toolchain: Path) -> None:
    executable(toolchain / "mvn")
    assert java_toolchain_available() is False


def test_java_probe_needs_maven_until_jars_are_cached(toolchain: Path, tmp_path: Path) -> None:
    executable(toolchain / "java")
    assert java_toolchain_available() is False
    libs = tmp_path / "cache" / "kafka-4.1.1" / "libs"
    libs.mkdir(parents=True)
    (libs / ".weir-complete").write_text("4.1.1\n")
    assert java_toolchain_available() is True


def test_java_probe_with_java_and_maven(toolchain: Path) -> None:
    executable(toolchain / "java")
    executable(toolchain / "mvn")
    assert java_toolchain_available() is True
