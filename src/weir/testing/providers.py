"""Where a test's Kafka comes from: an existing cluster, a Docker container, or the embedded JVM.

``select_provider`` picks one from the environment so the same suite runs on a laptop with Docker,
on a CI runner with only Java, or against a shared cluster.
"""

from __future__ import annotations

import abc
import importlib.util
import os
import shutil
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar

from weir.logs import get_logger
from weir.testing.broker import TEST_BROKER_DEFAULTS, EmbeddedKafka
from weir.testing.errors import BrokerUnavailableError
from weir.testing.jars import cached_jars

log = get_logger(__name__)

ENV_BOOTSTRAP = "WEIR_BOOTSTRAP_SERVERS"
ENV_BROKER = "WEIR_BROKER"
ENV_IMAGE = "WEIR_KAFKA_IMAGE"
# cp-kafka 8.1 ships Apache Kafka 4.1, the version the embedded broker runs (KIP-848 needs 8.x).
DEFAULT_IMAGE = "confluentinc/cp-kafka:8.1.0"
_DOCKER_PROBE_TIMEOUT_S = 0.5


class BrokerProvider(abc.ABC):
    """Something that can hand out a bootstrap address and later release what it started."""

    name: ClassVar[str]

    def __init__(self) -> None:
        self._bootstrap: str | None = None

    @abc.abstractmethod
    def start(self) -> str:
        """Make a broker available and return its bootstrap servers."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Release whatever ``start`` created; safe to call twice or without ``start``."""

    @property
    def bootstrap_servers(self) -> str:
        """What `start` returned; a RuntimeError before it."""
        if self._bootstrap is None:
            raise RuntimeError(f"{type(self).__name__} has not been started")
        return self._bootstrap

    def __enter__(self) -> BrokerProvider:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} bootstrap={self._bootstrap!r}>"


class ExternalBroker(BrokerProvider):
    """A cluster someone else runs; we neither start nor stop it."""

    name = "external"

    def __init__(self, bootstrap_servers: str) -> None:
        super().__init__()
        self._external = bootstrap_servers

    def start(self) -> str:
        """The address given: nothing is started."""
        self._bootstrap = self._external
        return self._external

    def stop(self) -> None:
        """Nothing: the broker is not this provider's to stop."""


class EmbeddedBroker(BrokerProvider):
    """The harness's own single-node broker (Java 17 + Maven, no Docker)."""

    name = "embedded"

    def __init__(self, **options: Any) -> None:
        """``options`` are passed to ``EmbeddedKafka`` (overrides, workdir, keep, ...)."""
        super().__init__()
        self._options = options
        self.kafka: EmbeddedKafka | None = None

    def start(self) -> str:
        """Start an `EmbeddedKafka` with this provider's options (once) and return its
        bootstrap servers."""
        if self.kafka is None:
            self.kafka = EmbeddedKafka(**self._options)
        self._bootstrap = self.kafka.start().bootstrap_servers
        return self._bootstrap

    def stop(self) -> None:
        """Stop the embedded broker, if one was started."""
        if self.kafka is not None:
            self.kafka.stop()


class TestcontainersBroker(BrokerProvider):
    """A cp-kafka container in KRaft mode via testcontainers-python.

    Not exercised in our own CI (those machines have no Docker engine); kept small on purpose.
    """

    name = "testcontainers"
    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, image: str | None = None, env: Mapping[str, str] | None = None) -> None:
        super().__init__()
        env = os.environ if env is None else env
        self.image = image or env.get(ENV_IMAGE) or DEFAULT_IMAGE
        self._container: Any = None

    def start(self) -> str:
        """Start a KRaft container of `image` with `TEST_BROKER_DEFAULTS` and return its
        bootstrap servers."""
        try:
            from testcontainers.community.kafka import KafkaContainer
        except ImportError:  # testcontainers < 4.10 keeps it at the old path
            from testcontainers.kafka import KafkaContainer
        container = KafkaContainer(self.image).with_kraft()
        # cp-kafka maps KAFKA_FOO_BAR env vars to foo.bar broker settings.
        for key, value in TEST_BROKER_DEFAULTS.items():
            container.with_env("KAFKA_" + key.upper().replace(".", "_"), value)
        container.start()
        self._container = container
        self._bootstrap = str(container.get_bootstrap_server())
        return self._bootstrap

    def stop(self) -> None:
        """Stop and remove the container, if one was started."""
        if self._container is not None:
            self._container.stop()
            self._container = None


def docker_reachable(env: Mapping[str, str] | None = None) -> bool:
    """Whether a Docker engine answers, checked in well under a second.

    A `docker` CLI on PATH proves nothing (CI images often have the CLI and no engine), so probe the
    engine's socket: connect and ask `/_ping` for unix sockets, TCP connect for tcp:// hosts.
    """
    env = os.environ if env is None else env
    host = env.get("DOCKER_HOST", "")
    if host.startswith("tcp://"):
        address = host.removeprefix("tcp://").split("/")[0]
        hostname, _, port = address.rpartition(":")
        try:
            with socket.create_connection(
                (hostname or "127.0.0.1", int(port or 2375)), timeout=_DOCKER_PROBE_TIMEOUT_S
            ):
                return True
        except (OSError, ValueError):
            return False
    if host.startswith("unix://"):
        candidates = [host.removeprefix("unix://")]
    elif host:
        return False  # ssh:// and friends: no cheap probe, assume unusable
    else:
        candidates = ["/var/run/docker.sock", str(Path.home() / ".docker/run/docker.sock")]
        if env.get("XDG_RUNTIME_DIR"):
            candidates.append(str(Path(env["XDG_RUNTIME_DIR"]) / "docker.sock"))
    return any(_docker_socket_answers(path) for path in candidates)


def _docker_socket_answers(path: str) -> bool:
    if not os.path.exists(path):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(_DOCKER_PROBE_TIMEOUT_S)
            sock.connect(path)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            return b" 200 " in sock.recv(256)
    except OSError:
        return False


def java_toolchain_available() -> bool:
    """Whether the embedded broker can plausibly start: java, plus mvn unless jars are cached.

    Only looks at PATH; version problems surface at start with a precise error.
    """
    java_home = os.environ.get("JAVA_HOME")
    has_java = bool(
        (java_home and os.access(Path(java_home) / "bin" / "java", os.X_OK)) or shutil.which("java")
    )
    return has_java and (cached_jars() is not None or shutil.which("mvn") is not None)


def _testcontainers_installed() -> bool:
    return importlib.util.find_spec("testcontainers") is not None


_CHOICES = ("external", "testcontainers", "embedded")
_HOW_TO_GET_A_BROKER = (
    "install Java 17+ and Maven (the harness then runs Kafka itself), or run a Docker engine "
    f"(with testcontainers installed), or set {ENV_BOOTSTRAP} to an existing cluster"
)


def select_provider(
    env: Mapping[str, str] = os.environ,
    docker_available: Callable[[], bool] = docker_reachable,
    java_available: Callable[[], bool] = java_toolchain_available,
    testcontainers_installed: Callable[[], bool] = _testcontainers_installed,
) -> BrokerProvider:
    """Choose a provider.

    WEIR_BROKER forces one; else WEIR_BOOTSTRAP_SERVERS wins; else a reachable Docker engine;
    else Java (+ Maven or cached jars).
    """
    bootstrap = env.get(ENV_BOOTSTRAP, "").strip()
    forced = env.get(ENV_BROKER, "").strip().lower()
    if forced and forced not in (*_CHOICES, "auto"):
        raise BrokerUnavailableError(
            f"{ENV_BROKER}={env[ENV_BROKER]!r} is not one of: auto, {', '.join(_CHOICES)}"
        )
    if forced == "external" or (forced in ("", "auto") and bootstrap):
        if not bootstrap:
            raise BrokerUnavailableError(f"{ENV_BROKER}=external needs {ENV_BOOTSTRAP}=host:port")
        return ExternalBroker(bootstrap)
    if forced == "testcontainers":
        if not testcontainers_installed():
            raise BrokerUnavailableError(
                f"{ENV_BROKER}=testcontainers but the testcontainers package is not installed"
            )
        if not docker_available():
            raise BrokerUnavailableError(
                f"{ENV_BROKER}=testcontainers but no Docker engine answers (DOCKER_HOST or "
                "/var/run/docker.sock)"
            )
        return TestcontainersBroker(env=env)
    if forced == "embedded":
        return EmbeddedBroker()  # its start() explains precisely what is missing, if anything
    if testcontainers_installed() and docker_available():
        return TestcontainersBroker(env=env)
    if java_available():
        return EmbeddedBroker()
    raise BrokerUnavailableError(f"No Kafka broker available for tests: {_HOW_TO_GET_A_BROKER}.")
