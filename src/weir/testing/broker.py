"""A real Apache Kafka broker (KRaft, combined broker+controller) as a Java subprocess for tests.

``KafkaNode`` is one Kafka process and is shared with the multi-node cluster in ``cluster.py``;
``EmbeddedKafka`` is the single-node broker most tests use.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import fcntl
import ipaddress
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from weir.logs import get_logger
from weir.testing.errors import (
    BrokerStartError,
    PortInUseError,
    WorkdirError,
    WorkdirInUseError,
)
from weir.testing.jars import KAFKA_VERSION, ensure_kafka_jars, require_java
from weir.testing.security import (
    LISTENER,
    SCRAM,
    SSL_LISTENER,
    BrokerSecurity,
    ClientSettings,
    PreparedSecurity,
    SecureListener,
    client_settings_of,
    prepare_security,
)

log = get_logger(__name__)

LOOPBACK = "127.0.0.1"
DEFAULT_START_TIMEOUT_S = 90.0
DEFAULT_STOP_TIMEOUT_S = 30.0
FORMAT_TIMEOUT_S = 60.0
LOG_TAIL_LINES = 40
_PORT_ATTEMPTS = 3
_BIND_FAILURE = "Address already in use"
_STARTED = "Kafka Server started"

# Settings that make a single-machine test broker fast and small. Each differs from Kafka's default
# for a reason a test can feel:
TEST_BROKER_DEFAULTS: Mapping[str, str] = {
    # Internal topics cannot get their production replication factor (3) from one broker.
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    # Fewer internal partitions: the first group/transaction creates them, and 50 take seconds.
    "offsets.topic.num.partitions": "10",
    "transaction.state.log.num.partitions": "4",
    # Kafka waits 3 s before the first classic rebalance of a new group; tests create many groups.
    "group.initial.rebalance.delay.ms": "0",
    # Classic protocol: allow clients' session.timeout.ms below the 6 s floor.
    "group.min.session.timeout.ms": "1000",
    # KIP-848: session and heartbeat are broker-side. Defaults (45 s session, 5 s heartbeat, with
    # the same minimums) make a failed consumer take 45 s to be noticed. All are atLeast(1); the
    # broker requires min <= value <= max for both pairs and heartbeat < session.
    "group.consumer.min.session.timeout.ms": "1000",
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.min.heartbeat.interval.ms": "250",
    "group.consumer.heartbeat.interval.ms": "500",
    # The log cleaner reserves this much heap up front (default 128 MiB); tests need little.
    "log.cleaner.dedupe.buffer.size": "2097152",
    # Producers may create topics on first use (Kafka's default, kept on purpose): demos and ad-hoc
    # scripts just work. Tests should still create topics explicitly to choose partition counts.
    "auto.create.topics.enable": "true",
    "num.partitions": "1",
    # Thread pools sized for a laptop/CI runner rather than a server.
    "num.io.threads": "4",
    "num.network.threads": "2",
    "background.threads": "4",
}
"""Broker settings that make a one-machine test broker fast and small: replication factors of
1, few internal partitions, no first-rebalance delay, short group session minimums, a small log
cleaner buffer, topics created on first use, and small thread pools. A broker's `overrides`
go over them."""


def check_host(host: str) -> str:
    """``host`` if it is an IPv4 address literal (where a broker's listeners bind and what they
    advertise), else a ValueError saying so."""
    try:
        ipaddress.IPv4Address(host)
    except (ipaddress.AddressValueError, TypeError):
        raise ValueError(
            f"host must be an IPv4 address of this machine such as {LOOPBACK!r}, got {host!r}"
        ) from None
    return host


def pick_free_port() -> int:
    """A loopback port nobody listens on right now (the kernel's choice for port 0).

    The port is released before Java binds it, so another process can take it in between; callers
    retry on a bind failure rather than trying to prevent that race.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def pick_free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: hold all sockets open while picking so none repeats."""
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((LOOPBACK, 0))
            ports.append(sock.getsockname()[1])
        return ports


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Java's ServerSocket sets SO_REUSEADDR, so a port in TIME_WAIT is usable: mirror that.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def require_free_port(port: int, what: str) -> None:
    if not port_is_free(port):
        raise PortInUseError(
            f"{what} port {LOOPBACK}:{port} is already in use; pass another port or leave it unset "
            "so the harness picks a free one."
        )


def port_accepts(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=timeout):
            return True
    except OSError:
        return False


def kafka_answers(port: int, timeout: float = 1.0, host: str = LOOPBACK) -> bool:
    """Whether a Kafka broker answers an ApiVersions request on the port.

    A bare TCP connect is not proof: whoever took a port between our pick and Java's bind would
    also accept connections.
    """
    correlation_id = 0x7765_6972  # "weir"
    client_id = b"weir-probe"
    # Request header v1 (api_key 18 = ApiVersions, version 0), empty v0 body.
    body = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            reply = b""
            while len(reply) < 10:  # size, correlation id, error code
                chunk = sock.recv(64)
                if not chunk:
                    return False
                reply += chunk
    except OSError:
        return False
    _size, got_id, error_code = struct.unpack(">iih", reply[:10])
    return bool(got_id == correlation_id and error_code == 0)


def new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (as Uuid.toString()).

    Generated here to save a JVM start (`StorageTool random-uuid`). Like Kafka's generator, skip ids
    starting with '-': the storage tool's command line would read them as flags.
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        if not text.startswith("-"):
            return text


# --- process lifetime ----------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
_at_exit_lock = threading.Lock()
_at_exit: dict[int, Callable[[], None]] = {}


def register_at_exit(owner: object, stop: Callable[[], None]) -> None:
    """Run ``stop`` when the interpreter exits normally, unless unregistered first."""
    with _at_exit_lock:
        _at_exit[id(owner)] = stop


def unregister_at_exit(owner: object) -> None:
    with _at_exit_lock:
        _at_exit.pop(id(owner), None)


@atexit.register
def _stop_everything() -> None:
    with _at_exit_lock:
        pending = list(_at_exit.values())
        _at_exit.clear()
    for stop in pending:
        with contextlib.suppress(Exception):
            stop()


def _die_with_parent_hook() -> Callable[[], None] | None:
    """A preexec_fn asking Linux to SIGKILL the child when its parent dies, or None if unavailable.

    atexit alone is not enough: it does not run when Python is SIGKILLed or crashes, and an
    orphaned broker keeps ports, memory and temp dirs. PR_SET_PDEATHSIG fires when the *thread*
    that forked the child exits, so it is only safe from the main thread; elsewhere we rely on
    atexit.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        log.debug(
            "broker_cleanup_atexit_only",
            reason="not on the main thread: the broker relies on atexit, not PR_SET_PDEATHSIG",
        )
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        # The parent may have died between fork() and prctl(); then nobody would ever kill us.
        if os.getppid() != parent:
            os._exit(1)

    return hook


# --- one broker per work directory ---------------------------------------------------------------

LOCK_FILE = "weir.lock"


class WorkdirLock:
    """The exclusive lock of a broker's (or a cluster's) work directory: ``flock(2)`` on
    ``<workdir>/weir.lock``, taken before anything in the directory is touched.

    A second broker on a running one's directory would rewrite its ``server.properties`` (a
    restart then takes the wrong ports), append to its log and start a JVM on its storage. The
    lock belongs to the open file, which every broker JVM launched in the directory inherits
    (``KafkaNode.launch``), so it is held while this process *or* any of those JVMs has it open:
    the broker that ``weir broker start`` leaves running when it exits keeps it, and the kernel
    drops it when the last holder dies, however it ends (``kill -9`` included). Nothing stale is
    left to clean up, and no pid is checked: a recorded pid can be reused by another process.

    The file's content only names the holder, for the next one's error message.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.path = workdir / LOCK_FILE
        self._file: IO[bytes] | None = None

    @property
    def held(self) -> bool:
        return self._file is not None

    @property
    def fd(self) -> int:
        """The lock's file descriptor, for a child process to inherit (``pass_fds``)."""
        if self._file is None:
            raise RuntimeError(f"the lock of {self.workdir} is not held")
        return self._file.fileno()

    def acquire(self) -> None:
        """Take the lock, or raise ``WorkdirInUseError`` naming who holds it. Never waits."""
        if self._file is not None:
            return
        try:
            handle = self.path.open("a+b")
        except OSError as exc:
            reason = exc.strerror or exc
            raise WorkdirError(f"cannot use {self.workdir} as a work directory: {reason}") from exc
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe_holder(handle)
            handle.close()
            raise WorkdirInUseError(
                f"another broker runs on {self.workdir}{holder}: stop it first, or use another "
                "directory"
            ) from None
        except BaseException:
            handle.close()
            raise
        self._file = handle
        self.record(pid=os.getpid(), starting=True)

    def record(self, **holder: Any) -> None:
        """Note who holds the lock (pid, bootstrap servers), for the message of the next one."""
        if self._file is None:
            return
        self._file.seek(0)
        self._file.truncate()
        self._file.write(json.dumps(holder).encode())
        self._file.flush()

    def release(self) -> None:
        """Close this process's hold; a broker JVM that inherited it still holds it while it
        runs."""
        if self._file is not None:
            self._file.close()
            self._file = None


def _describe_holder(handle: IO[bytes]) -> str:
    try:
        handle.seek(0)
        holder = json.loads(handle.read() or b"{}")
    except (OSError, ValueError):
        return ""
    if not isinstance(holder, dict):
        return ""
    if holder.get("bootstrap_servers"):
        return f" (at {holder['bootstrap_servers']}, pid {holder.get('pid')})"
    if holder.get("pid"):
        return f" (starting, launched by pid {holder['pid']})"
    return ""


# --- one Kafka process ---------------------------------------------------------------------------


class KafkaNode:
    """One Kafka JVM in KRaft combined mode (broker + controller) with its own dir, ports and log.

    The node knows its peers only through ``quorum`` (the controller.quorum.* properties).
    Restarting a stopped node reuses its storage and ports, as a real broker restart would.
    Its listeners bind and advertise ``host`` (loopback by default); with ``netns`` the JVM runs
    in that Linux network namespace (``ip netns exec``, as root), where ``host`` must be one of
    its addresses.
    """

    def __init__(
        self,
        *,
        node_id: int,
        workdir: Path,
        port: int,
        controller_port: int,
        quorum: Mapping[str, str],
        properties: Mapping[str, str],
        java: str,
        jars: Path,
        heap: str = "512m",
        jvm_args: Sequence[str] = (),
        die_with_parent: bool = True,
        lock: WorkdirLock | None = None,
        secure: SecureListener | None = None,
        host: str = LOOPBACK,
        netns: str | None = None,
    ) -> None:
        self.node_id = node_id
        self.secure = secure
        self.host = host
        self.netns = netns
        self.workdir = workdir
        self.port = port
        self.controller_port = controller_port
        self.java = java
        self.jars = jars
        self.heap = heap
        self.jvm_args = tuple(jvm_args)
        self.die_with_parent = die_with_parent
        self.lock = lock
        self.data_dir = workdir / "data"
        self.config_path = workdir / "server.properties"
        self.log_path = workdir / "kafka.log"
        self.log4j_path = workdir / "log4j2.properties"
        self.properties: dict[str, str] = {
            **self._own_properties(),
            **quorum,
            **properties,
        }
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    def _own_properties(self) -> dict[str, str]:
        own = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "listeners": (
                f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data_dir),
        }
        return {**own, **secure_listener_properties(self.secure, own, self.host)}

    @property
    def bootstrap_servers(self) -> str:
        """The PLAINTEXT listener: the harness's (on a secured node a super user's)."""
        return f"{self.host}:{self.port}"

    @property
    def secure_bootstrap_servers(self) -> str | None:
        """The SASL_SSL listener of a secured node, else None."""
        return None if self.secure is None else f"{self.host}:{self.secure.port}"

    @property
    def ssl_bootstrap_servers(self) -> str | None:
        """The SSL listener (client certificates as logins) of a node that has one, else None."""
        port = None if self.secure is None else self.secure.ssl_port
        return None if port is None else f"{LOOPBACK}:{port}"

    @property
    def pid(self) -> int | None:
        """The JVM's process id; None before it was launched."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """Whether the JVM was launched and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def formatted(self) -> bool:
        """Whether the storage holds a formatted log dir (from an earlier start)."""
        return (self.data_dir / "meta.properties").is_file()

    def prepare(self, cluster_id: str, *, standalone: bool) -> None:
        """Write the config files and format the storage.

        ``standalone`` pairs with controller.quorum.bootstrap.servers (dynamic quorum of one);
        without it the static controller.quorum.voters list is used. Kafka 4.1.1 rejects mixing
        them.
        """
        self.write_config()
        self.format_storage(cluster_id, standalone=standalone)

    def write_config(self) -> None:
        """Write the node's server.properties (its `properties`) and log4j2 configuration into
        its work directory."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(
            "".join(f"{key}={value}\n" for key, value in sorted(self.properties.items()))
        )
        self.log4j_path.write_text(
            (resources.files("weir.testing") / "log4j2.properties").read_text(encoding="utf-8")
        )

    def format_storage(self, cluster_id: str, *, standalone: bool) -> None:
        """Format the node's storage for `cluster_id` with Kafka's StorageTool (`standalone`: a
        one-controller quorum), adding the SCRAM users of a secured node. A `BrokerStartError`
        with the log's last lines if it fails or takes too long."""
        command = [
            self.java,
            "-Xmx256m",
            "-cp",
            self._classpath(),
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            cluster_id,
            "-c",
            str(self.config_path),
        ]
        if standalone:
            command.append("--standalone")
        shown = list(command)
        if self.secure is not None:
            scram = self.secure.format_arguments()
            command += scram
            # A salted password logs in as well as the password: never in the log.
            shown += ["--add-scram <SCRAM-SHA-512 credentials>"] * (len(scram) // 2)
        offset = self._log_size()
        with self.log_path.open("ab") as out:
            out.write(f"--- weir: formatting storage: {' '.join(shown)}\n".encode())
            out.flush()
            try:
                result = subprocess.run(
                    command,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=FORMAT_TIMEOUT_S,
                    check=False,
                )
            except subprocess.TimeoutExpired as exc:
                raise BrokerStartError(
                    f"Formatting Kafka storage for node {self.node_id} took over "
                    f"{FORMAT_TIMEOUT_S:.0f} s",
                    self.log_tail(since=offset),
                ) from exc
        if result.returncode != 0:
            raise BrokerStartError(
                f"Formatting Kafka storage for node {self.node_id} failed "
                f"(exit {result.returncode}); an override is probably invalid",
                self.log_tail(since=offset),
            )

    def launch(self) -> None:
        """Start the JVM without waiting for it; see ``wait_ready``."""
        if self.running:
            return
        # `ip netns exec` enters the namespace and execs Java: the same process, so signals and
        # PR_SET_PDEATHSIG still reach the broker.
        command = [
            *(["ip", "netns", "exec", self.netns] if self.netns is not None else []),
            self.java,
            f"-Xmx{self.heap}",
            "-Xms128m",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.log4j_path}",
            *self.jvm_args,
            "-cp",
            self._classpath(),
            "kafka.Kafka",
            str(self.config_path),
        ]
        self._log_offset = self._log_size()
        with self.log_path.open("ab") as out:
            out.write(f"--- weir: starting node {self.node_id}: {' '.join(command)}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                command,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                # Own session: a Ctrl-C in the terminal reaches Python, which then stops us cleanly,
                # instead of killing the broker mid-test.
                start_new_session=True,
                preexec_fn=_die_with_parent_hook() if self.die_with_parent else None,
                # The JVM holds the work directory's lock too: it outlives a launcher that exits.
                pass_fds=(self.lock.fd,) if self.lock is not None and self.lock.held else (),
            )
        log.debug("kafka_node_launched", node_id=self.node_id, pid=self._proc.pid, port=self.port)

    def wait_ready(self, deadline: float) -> None:
        """Block until this node serves clients, or raise BrokerStartError with the log tail if
        the JVM exits or time runs out.

        Ready means our JVM logged "Kafka Server started" and the client port answers a Kafka
        request: a port answering alone could be someone else who grabbed it first.
        """
        proc = self._proc
        if proc is None:
            raise BrokerStartError(f"Kafka node {self.node_id} was never launched")
        while True:
            code = proc.poll()
            if code is not None:
                raise BrokerStartError(
                    f"Kafka node {self.node_id} exited with code {code} during start-up "
                    f"(log: {self.log_path})",
                    self.log_tail(since=self._log_offset),
                )
            if _STARTED in self._read_log(self._log_offset) and kafka_answers(
                self.port, host=self.host
            ):
                return
            if time.monotonic() > deadline:
                self.kill()
                raise BrokerStartError(
                    f"Kafka node {self.node_id} did not open {self.bootstrap_servers} in time "
                    f"(log: {self.log_path})",
                    self.log_tail(since=self._log_offset),
                )
            time.sleep(0.1)

    def start(self, timeout: float = DEFAULT_START_TIMEOUT_S) -> None:
        """`launch`, then `wait_ready` for at most `timeout` seconds."""
        self.launch()
        self.wait_ready(time.monotonic() + timeout)

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        """SIGTERM (Kafka shuts down cleanly on it), then SIGKILL after ``timeout``."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("kafka_node_ignored_sigterm", node_id=self.node_id, pid=proc.pid)
                proc.kill()
                proc.wait(10)
        self._proc = None

    def terminate(self) -> None:
        """Send SIGTERM without waiting, so several nodes can shut down in parallel."""
        if self.running and self._proc is not None:
            self._proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL: a crash, as far as the rest of the cluster can tell."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        self._proc = None

    def bind_failed(self) -> bool:
        """Whether the last launch died because a port was taken between picking and binding."""
        return _BIND_FAILURE in self._read_log(self._log_offset)

    def log_tail(self, lines: int = LOG_TAIL_LINES, *, since: int = 0) -> str:
        """The last `lines` lines of the node's log from byte `since` on (what start errors
        carry)."""
        return "\n".join(self._read_log(since).splitlines()[-lines:])

    def _read_log(self, since: int) -> str:
        try:
            with self.log_path.open("rb") as handle:
                handle.seek(since)
                return handle.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def _classpath(self) -> str:
        # The JVM expands a trailing `*` itself; no need to list ~50 jars.
        return str(self.jars / "*")


def secure_listener_properties(
    secure: SecureListener | None, own: Mapping[str, str], host: str = LOOPBACK
) -> dict[str, str]:
    """A node's settings for its secured listener, added to its PLAINTEXT and CONTROLLER ones
    (``own``), which stay for the broker itself and the harness."""
    if secure is None:
        return {}
    added = {LISTENER: secure.port}
    if secure.ssl_port is not None:
        added[SSL_LISTENER] = secure.ssl_port
    listeners = "".join(f",{name}://{host}:{port}" for name, port in added.items())
    protocols = "".join(f",{name}:{name}" for name in added)
    return {
        "listeners": own["listeners"] + listeners,
        "advertised.listeners": own["advertised.listeners"] + listeners,
        "listener.security.protocol.map": own["listener.security.protocol.map"] + protocols,
        **secure.properties(),
    }


def remembered_secure_port(workdir: Path, listener: str = LISTENER) -> int | None:
    """A secured listener's port in the ``server.properties`` an earlier start wrote."""
    return _listener_ports(workdir).get(listener)


def _listener_ports(workdir: Path) -> dict[str, int]:
    """The port of each listener in the ``server.properties`` an earlier start wrote."""
    listeners = _read_properties(workdir / "server.properties").get("listeners", "")
    ports: dict[str, int] = {}
    for listener in listeners.split(","):
        name, sep, address = listener.strip().partition("://")
        port = address.rpartition(":")[2]
        if sep and port.isdigit():
            ports[name] = int(port)
    return ports


def stop_nodes(nodes: Sequence[KafkaNode], timeout: float) -> None:
    """Stop several nodes in parallel: SIGTERM all, then wait, then SIGKILL stragglers."""
    for node in nodes:
        node.terminate()
    deadline = time.monotonic() + timeout
    for node in nodes:
        node.stop(max(0.1, deadline - time.monotonic()))


def resolve_workdir(
    workdir: str | Path | None, keep: bool | None, prefix: str
) -> tuple[Path, bool]:
    """(directory, whether stop() should delete it).

    A directory the caller names is theirs: kept unless keep=False. A temp dir we create is removed
    unless keep=True.
    """
    if workdir is None:
        path = Path(tempfile.mkdtemp(prefix=prefix))
        return path, not keep
    path = Path(workdir).expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise WorkdirError(f"cannot use {path} as a work directory: it is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or exc
        raise WorkdirError(f"cannot use {path} as a work directory: {reason}") from exc
    return path, keep is False


@dataclass(frozen=True)
class PreviousRun:
    """What a work directory remembers of the broker that last ran in it."""

    cluster_id: str
    port: int | None
    controller_port: int | None


def read_previous_run(workdir: Path) -> PreviousRun | None:
    """The formatted storage and ports left in ``workdir`` by an earlier start, if any.

    The cluster id comes from Kafka's own ``data/meta.properties`` (Kafka refuses storage formatted
    for another id); the ports from the ``listeners`` line of the ``server.properties`` we wrote.
    """
    meta = _read_properties(workdir / "data" / "meta.properties")
    cluster_id = meta.get("cluster.id")
    if not cluster_id:
        return None
    ports = _listener_ports(workdir)
    return PreviousRun(cluster_id, ports.get("PLAINTEXT"), ports.get("CONTROLLER"))


def _read_properties(path: Path) -> dict[str, str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return {}
    found: dict[str, str] = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and not key.lstrip().startswith(("#", "!")):
            found[key.strip()] = value.strip()
    return found


def _choose_port(requested: int | None, remembered: int | None, picked: Iterator[int]) -> int:
    """The caller's port, else the last run's while it is free, else a freshly picked one."""
    if requested is not None:
        return requested
    if remembered is not None and port_is_free(remembered):
        return remembered
    return next(picked)


# --- the single broker ---------------------------------------------------------------------------


class EmbeddedKafka:
    """A single-node Kafka (KRaft combined mode) on loopback ports, for tests.

    >>> with EmbeddedKafka() as kafka:
    ...     producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})

    ``port``/``controller_port`` default to free ports picked at start; a bind race is retried
    with new ports. ``overrides`` are applied last, over ``TEST_BROKER_DEFAULTS``.
    ``start_timeout`` covers storage formatting and JVM start-up, not the one-time jar download
    (see ``jars.py``).

    A ``workdir`` that already holds formatted storage is started again as it is: topics, records
    and committed offsets survive, and the ports of the last run are reused while they are free.
    ``host`` (an IPv4 address of this machine, loopback by default) is where the listeners bind
    and what they advertise: another address lets clients in other network namespaces reach the
    broker.
    """

    def __init__(
        self,
        *,
        overrides: Mapping[str, str] | None = None,
        workdir: str | Path | None = None,
        keep: bool | None = None,
        port: int | None = None,
        controller_port: int | None = None,
        start_timeout: float = DEFAULT_START_TIMEOUT_S,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT_S,
        heap: str = "512m",
        jvm_args: Sequence[str] = (),
        kafka_version: str = KAFKA_VERSION,
        die_with_parent: bool = True,
        security: BrokerSecurity | None = None,
        secure_port: int | None = None,
        host: str = LOOPBACK,
    ) -> None:
        self._host = check_host(host)
        self._overrides = dict(overrides or {})
        self._security = security
        self._secure_port = secure_port
        self._prepared: PreparedSecurity | None = None
        self._requested_workdir = workdir
        self._keep = keep
        self._requested_ports = (port, controller_port)
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._heap = heap
        self._jvm_args = tuple(jvm_args)
        self.kafka_version = kafka_version
        self._die_with_parent = die_with_parent
        self.cluster_id = new_cluster_id()
        self._node: KafkaNode | None = None
        self._workdir: Path | None = None
        self._remove_workdir = False
        self._lock: WorkdirLock | None = None

    # -- lifecycle --

    def start(self) -> EmbeddedKafka:
        """Start the broker and wait until it serves clients; returns itself (a no-op while it
        runs). A `WorkdirInUseError` if another broker holds the directory, `BrokerStartError`
        with the log's last lines if it does not come up."""
        if self.running:
            return self
        port, controller_port = self._requested_ports
        if port is not None:
            require_free_port(port, "Client")
        if controller_port is not None:
            require_free_port(controller_port, "Controller")
        java = require_java()
        jars = ensure_kafka_jars(self.kafka_version)
        started = time.monotonic()
        self._workdir, self._remove_workdir = resolve_workdir(
            self._requested_workdir, self._keep, "weir-kafka-"
        )
        try:
            self._lock = WorkdirLock(self._workdir)
            self._lock.acquire()
            self._node = self._start_node(java, jars)
        except WorkdirInUseError:
            self._remove_workdir = False  # another broker's: never ours to delete
            self._release_workdir()
            raise
        except BaseException:
            # A temp dir of a failed start holds nothing worth keeping, even with keep=True: the
            # error carries the log's last lines. A directory the caller named stays theirs.
            if self._requested_workdir is None:
                self._remove_workdir = True
            self._release_workdir()
            raise
        self._lock.record(pid=self.pid, bootstrap_servers=self.bootstrap_servers)
        if self._die_with_parent:
            register_at_exit(self, self.stop)
        log.info(
            "kafka_started",
            bootstrap_servers=self.bootstrap_servers,
            pid=self.pid,
            seconds=round(time.monotonic() - started, 2),
            workdir=str(self._workdir),
        )
        return self

    def _start_node(self, java: str, jars: Path) -> KafkaNode:
        assert self._workdir is not None
        deadline = time.monotonic() + self.start_timeout
        fixed = self._requested_ports
        previous = read_previous_run(self._workdir)
        if previous is not None:
            self.cluster_id = previous.cluster_id
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            picked = iter(pick_free_ports(4))
            remembered = (
                (previous.port, previous.controller_port)
                if previous is not None and attempt == 1
                else (None, None)
            )
            port = _choose_port(fixed[0], remembered[0], picked)
            controller_port = _choose_port(fixed[1], remembered[1], picked)
            if previous is not None and previous.port is not None and port != previous.port:
                log.info("kafka_port_moved", was=previous.port, now=port)
            node = KafkaNode(
                node_id=1,
                workdir=self._workdir,
                port=port,
                controller_port=controller_port,
                quorum={"controller.quorum.bootstrap.servers": f"{self._host}:{controller_port}"},
                properties={**TEST_BROKER_DEFAULTS, **self._overrides},
                java=java,
                jars=jars,
                heap=self._heap,
                jvm_args=self._jvm_args,
                die_with_parent=self._die_with_parent,
                lock=self._lock,
                secure=self._secure_listener(picked, remember=attempt == 1),
                host=self._host,
            )
            node.write_config()
            if previous is None:
                # A fresh storage dir per attempt: the standalone quorum records the controller
                # port it was formatted with. Reused storage is never formatted again: that would
                # drop every topic and committed offset (a single voter accepts a new port).
                shutil.rmtree(node.data_dir, ignore_errors=True)
                node.format_storage(self.cluster_id, standalone=True)
            node.launch()
            try:
                node.wait_ready(deadline)
            except BaseException as exc:  # Ctrl-C included: never leave a half-started JVM
                node.kill()
                retry = (
                    isinstance(exc, BrokerStartError)
                    and fixed == (None, None)
                    and attempt < _PORT_ATTEMPTS
                    and node.bind_failed()
                )
                if not retry:
                    raise
                log.info("kafka_port_taken", attempt=attempt)
                continue
            return node
        raise AssertionError("unreachable: the last attempt raises")

    def _secure_listener(self, picked: Iterator[int], *, remember: bool) -> SecureListener | None:
        """The secured listener for a start attempt: users and certificates are made once (or
        found in a kept work directory), the port is the caller's, else the last run's while it
        is free, else ``picked``."""
        if self._security is None:
            return None
        workdir = self.workdir
        if self._prepared is None:
            formatted = (workdir / "data" / "meta.properties").is_file()
            self._prepared = prepare_security(self._security, workdir, formatted=formatted)
        if self._secure_port is not None:
            require_free_port(self._secure_port, "Secured client")
        remembered = remembered_secure_port(workdir) if remember else None
        port = _choose_port(self._secure_port, remembered, picked)
        if not self._security.ssl_listener:
            return SecureListener(self._prepared, port)
        remembered = remembered_secure_port(workdir, SSL_LISTENER) if remember else None
        return SecureListener(self._prepared, port, _choose_port(None, remembered, picked))

    def stop(self) -> None:
        """Stop the JVM (cleanly, killed after `stop_timeout`), then delete the work directory
        if it was a temporary one not kept, and release its lock."""
        unregister_at_exit(self)
        try:
            if self._node is not None and self._node.pid is not None:
                self._node.stop(self.stop_timeout)
                log.info("kafka_stopped", bootstrap_servers=self.bootstrap_servers)
        finally:
            self._release_workdir()

    def detach(self) -> None:
        """Leave the running broker on its own (``weir broker start`` in the background): this
        process lets go of the work directory's lock, which the broker's JVM holds until it
        exits, and does not stop the broker at exit. Started with ``die_with_parent=False``, the
        broker outlives this process; ``stop()`` still stops it from here."""
        unregister_at_exit(self)
        if self._lock is not None:
            self._lock.release()

    def _release_workdir(self) -> None:
        """Remove the work directory if it is ours to remove, then let go of its lock."""
        if self._workdir is not None and self._remove_workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._remove_workdir = False
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> EmbeddedKafka:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- state --

    @property
    def node(self) -> KafkaNode:
        """The broker's JVM; a RuntimeError before `start`."""
        if self._node is None:
            raise RuntimeError("EmbeddedKafka has not been started")
        return self._node

    @property
    def bootstrap_servers(self) -> str:
        """Where clients connect: the secured listener of a secured broker."""
        return self.node.secure_bootstrap_servers or self.node.bootstrap_servers

    @property
    def internal_bootstrap_servers(self) -> str:
        """The PLAINTEXT listener, also on a secured broker: the broker's own and the
        harness's (a super user there). Never hand it to the code under test."""
        return self.node.bootstrap_servers

    @property
    def security(self) -> PreparedSecurity | None:
        """A secured broker's users (with their passwords) and TLS files, once started."""
        return self._prepared

    @property
    def ssl_bootstrap_servers(self) -> str | None:
        """The SSL listener of a broker secured with ``ssl_listener=True``, where the client
        certificate is the login; else None."""
        return self.node.ssl_bootstrap_servers

    def client_settings(self, user: str | None = None, mechanism: str = SCRAM) -> ClientSettings:
        """How a client logs in to the secured listener as ``user`` (default: the first);
        ``mechanism="SSL"``: to the SSL listener, with ``user``'s certificate as its login
        (issued for any principal)."""
        return client_settings_of(
            self._prepared,
            "broker",
            self.bootstrap_servers,
            user,
            mechanism,
            self.node.ssl_bootstrap_servers,
        )

    @property
    def port(self) -> int:
        """The client listener's port."""
        return self.node.port

    @property
    def controller_port(self) -> int:
        """The KRaft controller listener's port."""
        return self.node.controller_port

    @property
    def log_path(self) -> Path:
        """The broker's log file (JVM output included)."""
        return self.node.log_path

    @property
    def workdir(self) -> Path:
        """The directory with the broker's storage, config and log; a RuntimeError before
        `start`."""
        if self._workdir is None:
            raise RuntimeError("EmbeddedKafka has not been started")
        return self._workdir

    @property
    def pid(self) -> int | None:
        """The JVM's process id; None before `start`."""
        return self._node.pid if self._node is not None else None

    @property
    def running(self) -> bool:
        """Whether the JVM is alive."""
        return self._node is not None and self._node.running
