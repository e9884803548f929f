"""A multi-node Kafka cluster (each node broker + controller) on loopback, for replication tests."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from weir.logs import get_logger
from weir.testing.broker import (
    DEFAULT_START_TIMEOUT_S,
    LOOPBACK,
    TEST_BROKER_DEFAULTS,
    KafkaNode,
    WorkdirLock,
    check_host,
    new_cluster_id,
    pick_free_ports,
    register_at_exit,
    resolve_workdir,
    stop_nodes,
    unregister_at_exit,
)
from weir.testing.errors import BrokerStartError
from weir.testing.jars import KAFKA_VERSION, ensure_kafka_jars, require_java
from weir.testing.security import (
    SCRAM,
    BrokerSecurity,
    ClientSettings,
    PreparedSecurity,
    SecureListener,
    client_settings_of,
    prepare_security,
)

log = get_logger(__name__)

_PORT_ATTEMPTS = 3
# Three JVMs warming up at once on a 2-core runner starve each other: C1-only JIT and the serial
# collector cut cluster start-up from ~12 s to ~8 s and RSS by ~60 MB per node. Peak throughput
# suffers, which replication tests do not measure.
FAST_START_JVM_ARGS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
_METADATA_TIMEOUT_S = 30.0
KAFKA_LOG = logging.getLogger("weir.testing.kafka")  # the pytest plugin's helpers use it too


def cluster_defaults(size: int) -> dict[str, str]:
    """Test broker settings with production-like durability for internal topics.

    Internal topics get RF = size (3) and the transaction log min.insync.replicas 2, so losing one
    node is survivable but not invisible — the point of a cluster test. User topics default to
    RF = size; min.insync.replicas stays at Kafka's 1 and tests set 2 per topic where they need it.
    """
    replicas = str(size)
    return {
        **TEST_BROKER_DEFAULTS,
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": str(min(2, size)),
        "default.replication.factor": replicas,
        # Notice a stopped/killed broker within seconds rather than 9 s (defaults 2 s / 9 s).
        "broker.heartbeat.interval.ms": "500",
        "broker.session.timeout.ms": "3000",
    }


class EmbeddedKafkaCluster:
    """``size`` Kafka nodes forming one cluster with a static 3-voter (or ``size``-voter) quorum.

    Nodes are addressed by index 0..size-1 (their node.id is index + 1). ``stop_broker`` and
    ``start_broker`` restart a node on the same ports and storage; ``kill_broker`` is a crash.

    Every node is a controller, and a node's broker only starts once a majority of the
    controllers elected a leader. So a node cannot start while fewer than a majority of the
    others run: ``start_broker`` refuses that at once, and ``start_brokers`` starts several
    stopped nodes together (``start()`` does the same for a stopped cluster).

    ``hosts`` (one IPv4 address per node, loopback by default) is where each node's listeners
    bind and what they advertise; ``netns`` (one Linux network namespace name or None per node)
    runs a node's JVM in that namespace (``ip netns exec``, as root), which must have the node's
    host address and reach the others': the network-fault tests cut one node off that way.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        overrides: Mapping[str, str] | None = None,
        workdir: str | Path | None = None,
        keep: bool | None = None,
        start_timeout: float = DEFAULT_START_TIMEOUT_S,
        stop_timeout: float = 20.0,
        heap: str = "384m",
        jvm_args: Sequence[str] = FAST_START_JVM_ARGS,
        kafka_version: str = KAFKA_VERSION,
        security: BrokerSecurity | None = None,
        hosts: Sequence[str] | None = None,
        netns: Sequence[str | None] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one node")
        self._hosts = [check_host(h) for h in hosts] if hosts is not None else [LOOPBACK] * size
        self._netns = list(netns) if netns is not None else [None] * size
        for name, given in (("hosts", self._hosts), ("netns", self._netns)):
            if len(given) != size:
                raise ValueError(f"{name} needs one entry per node ({size}), got {len(given)}")
        self.size = size
        self._security = security
        self._prepared: PreparedSecurity | None = None
        self._overrides = dict(overrides or {})
        self._requested_workdir = workdir
        self._keep = keep
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._heap = heap
        self._jvm_args = tuple(jvm_args)
        self.kafka_version = kafka_version
        self.cluster_id = new_cluster_id()
        self.nodes: list[KafkaNode] = []
        self._workdir: Path | None = None
        self._remove_workdir = False
        self._lock: WorkdirLock | None = None

    # -- lifecycle --

    def start(self) -> EmbeddedKafkaCluster:
        """Start every node and wait until all brokers serve clients; returns itself (a no-op
        while it runs). A cluster stopped with its storage kept starts again as the same one."""
        if self.nodes and all(node.running for node in self.nodes):
            return self
        if self.nodes and self._workdir is not None and all(n.formatted for n in self.nodes):
            # Stopped with its storage kept: the same cluster again, not a new one.
            self.start_brokers()
            return self
        java = require_java()
        jars = ensure_kafka_jars(self.kafka_version)
        started = time.monotonic()
        self._workdir, self._remove_workdir = resolve_workdir(
            self._requested_workdir, self._keep, "weir-kafka-cluster-"
        )
        self._lock = WorkdirLock(self._workdir)
        try:
            self._lock.acquire()
        except BaseException:
            self._lock = None
            if self._requested_workdir is None:
                shutil.rmtree(self._workdir, ignore_errors=True)
            raise
        register_at_exit(self, self.stop)
        try:
            self._start_nodes(java, jars, time.monotonic() + self.start_timeout)
            self._wait_for_brokers(time.monotonic() + _METADATA_TIMEOUT_S)
        except BaseException:
            # A temp dir of a failed start holds nothing worth keeping, even with keep=True: the
            # error carries the log's last lines. A directory the caller named stays theirs.
            if self._requested_workdir is None:
                self._remove_workdir = True
            self.stop()
            raise
        self._lock.record(pid=os.getpid(), bootstrap_servers=self.bootstrap_servers)
        log.info(
            "kafka_cluster_started",
            bootstrap_servers=self.bootstrap_servers,
            seconds=round(time.monotonic() - started, 2),
        )
        return self

    def _start_nodes(self, java: str, jars: Path, deadline: float) -> None:
        assert self._workdir is not None
        if self._security is not None:
            # Every node is formatted anew, with the users of this start.
            self._prepared = prepare_security(self._security, self._workdir, formatted=False)
        per_node = 2 if self._security is None else 4 if self._security.ssl_listener else 3
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            self.nodes = self._make_nodes(java, jars, pick_free_ports(per_node * self.size))
            for node in self.nodes:
                # No --standalone: the static controller.quorum.voters list defines the quorum.
                node.prepare(self.cluster_id, standalone=False)
            # All at once: no node becomes ready before a quorum of controllers is up.
            for node in self.nodes:
                node.launch()
            try:
                for node in self.nodes:
                    node.wait_ready(deadline)
            except BrokerStartError:
                bind_race = any(node.bind_failed() for node in self.nodes)
                for node in self.nodes:
                    node.kill()
                if not bind_race or attempt == _PORT_ATTEMPTS:
                    raise
                log.info("kafka_node_port_taken", attempt=attempt)
                continue
            return

    def _make_nodes(self, java: str, jars: Path, ports: list[int]) -> list[KafkaNode]:
        assert self._workdir is not None
        client_ports, controller_ports = ports[: self.size], ports[self.size : 2 * self.size]
        secure_ports = ports[2 * self.size : 3 * self.size]
        ssl_ports: list[int | None] = [*ports[3 * self.size :]] or [None] * self.size
        voters = ",".join(
            f"{index + 1}@{self._hosts[index]}:{port}"
            for index, port in enumerate(controller_ports)
        )
        properties = {**cluster_defaults(self.size), **self._overrides}
        nodes = []
        for index in range(self.size):
            node_dir = self._workdir / f"node-{index + 1}"
            shutil.rmtree(node_dir, ignore_errors=True)
            nodes.append(
                KafkaNode(
                    node_id=index + 1,
                    workdir=node_dir,
                    port=client_ports[index],
                    controller_port=controller_ports[index],
                    quorum={"controller.quorum.voters": voters},
                    properties=properties,
                    java=java,
                    jars=jars,
                    heap=self._heap,
                    jvm_args=self._jvm_args,
                    lock=self._lock,
                    secure=None
                    if self._prepared is None
                    else SecureListener(self._prepared, secure_ports[index], ssl_ports[index]),
                    host=self._hosts[index],
                    netns=self._netns[index],
                )
            )
        return nodes

    def _wait_for_brokers(self, deadline: float) -> None:
        """Client ports open per node; wait until metadata also lists every broker, so topics with
        RF = size can be created right away."""
        from confluent_kafka.admin import AdminClient

        # Its refused connections while nodes come up go to the helpers' logger, not to stderr.
        admin = AdminClient(
            {"bootstrap.servers": self.internal_bootstrap_servers}, logger=KAFKA_LOG
        )
        seen = 0
        try:
            while time.monotonic() < deadline:
                try:
                    seen = len(admin.list_topics(timeout=5).brokers)
                except Exception:  # KafkaException while the cluster settles; retried
                    seen = 0
                if seen >= self.size:
                    return
                time.sleep(0.2)
        finally:
            admin.poll(0)
        raise BrokerStartError(f"only {seen} of {self.size} brokers registered in time")

    def stop(self) -> None:
        """Stop every node; kill them outright when their storage is deleted next anyway.

        A clean shutdown of the whole quorum takes 5-10 s on a small machine (the last brokers wait
        for controllers that are going away) and preserves nothing we keep.
        """
        unregister_at_exit(self)
        try:
            if self._remove_workdir:
                for node in self.nodes:
                    node.kill()
            else:
                stop_nodes(self.nodes, self.stop_timeout)
        finally:
            if self._workdir is not None and self._remove_workdir:
                shutil.rmtree(self._workdir, ignore_errors=True)
                self._remove_workdir = False
            if self._lock is not None:
                self._lock.release()
        log.info("kafka_cluster_stopped")

    def stop_broker(self, index: int, timeout: float | None = None) -> None:
        """Clean shutdown of one node (controlled shutdown moves its leaderships first).

        The last node of a quorum cannot shut down cleanly: it waits for controllers that are
        gone until ``timeout`` and is then killed. Stop the last ones together (``stop_brokers``).
        """
        self.nodes[index].stop(self.stop_timeout if timeout is None else timeout)

    def stop_brokers(
        self, indexes: Sequence[int] | None = None, timeout: float | None = None
    ) -> None:
        """Stop several nodes (default: all) in parallel, keeping their storage.

        Usually done in ~6 s for all three; a node whose controllers left first may wait for
        them until ``timeout`` (default ``stop_timeout``) and is then killed, which its restart
        recovers from like a crash.
        """
        chosen = range(self.size) if indexes is None else indexes
        nodes = [self.nodes[index] for index in chosen]
        stop_nodes(nodes, self.stop_timeout if timeout is None else timeout)

    def kill_broker(self, index: int) -> None:
        """SIGKILL one node: the others notice after broker.session.timeout.ms."""
        self.nodes[index].kill()

    def start_broker(self, index: int, timeout: float | None = None) -> None:
        """Restart a stopped node on its old ports and storage.

        Raises ``BrokerStartError`` at once if the node could not join a controller majority
        (use ``start_brokers`` to start several stopped nodes together).
        """
        self.start_brokers([index], timeout)

    def start_brokers(
        self, indexes: Sequence[int] | None = None, timeout: float | None = None
    ) -> None:
        """Restart stopped nodes (default: every stopped one) together on their ports and storage.

        Launched at once, because a node's broker waits for a controller majority: one by one,
        the first node of a stopped 3-node cluster would wait for a quorum that its own start
        blocks, and its broker gives up after ``initial.broker.registration.timeout.ms`` (60 s,
        "Shutting down because we were unable to register with the controller quorum").
        """
        if indexes is None:
            indexes = [i for i, node in enumerate(self.nodes) if not node.running]
        starting = [self.nodes[i] for i in indexes if not self.nodes[i].running]
        if not starting:
            return
        running = sum(node.running for node in self.nodes)
        majority = self.size // 2 + 1
        if running + len(starting) < majority:
            names = ", ".join(str(node.node_id) for node in starting)
            raise BrokerStartError(
                f"node(s) {names} cannot start: with {running} of {self.size} controllers "
                f"running they would be {running + len(starting)}, and the quorum needs "
                f"{majority}. Start stopped nodes together: start_brokers() starts all of them."
            )
        if self._lock is not None:
            self._lock.acquire()  # again after stop(); the nodes pass on the new hold
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        for node in starting:
            node.launch()
        try:
            for node in starting:
                node.wait_ready(deadline)
        except BaseException:
            for node in starting:
                node.kill()
            raise
        register_at_exit(self, self.stop)  # again: stop() unregistered it

    def __enter__(self) -> EmbeddedKafkaCluster:
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
    def bootstrap_servers(self) -> str:
        """Every node's client address, so clients bootstrap even while one node is down: the
        secured listeners of a secured cluster."""
        return ",".join(
            node.secure_bootstrap_servers or node.bootstrap_servers for node in self.nodes
        )

    @property
    def internal_bootstrap_servers(self) -> str:
        """Every node's PLAINTEXT listener, also on a secured cluster: the brokers' own and the
        harness's (a super user there). Never hand it to the code under test."""
        return ",".join(node.bootstrap_servers for node in self.nodes)

    @property
    def security(self) -> PreparedSecurity | None:
        """A secured cluster's users (with their passwords) and TLS files, once started."""
        return self._prepared

    @property
    def ssl_bootstrap_servers(self) -> str | None:
        """Every node's SSL listener (client certificates as logins) of a cluster secured with
        ``ssl_listener=True``; else None."""
        found = [node.ssl_bootstrap_servers for node in self.nodes]
        addresses = [address for address in found if address is not None]
        return ",".join(addresses) if found and len(addresses) == len(found) else None

    def client_settings(self, user: str | None = None, mechanism: str = SCRAM) -> ClientSettings:
        """How a client logs in to the secured listeners as ``user`` (default: the first);
        ``mechanism="SSL"``: to the SSL listeners, with ``user``'s certificate as its login."""
        return client_settings_of(
            self._prepared,
            "cluster",
            self.bootstrap_servers,
            user,
            mechanism,
            self.ssl_bootstrap_servers,
        )

    @property
    def running(self) -> bool:
        """Whether every node's JVM is alive."""
        return bool(self.nodes) and all(node.running for node in self.nodes)

    @property
    def workdir(self) -> Path:
        """The directory holding every node's own; a RuntimeError before `start`."""
        if self._workdir is None:
            raise RuntimeError("EmbeddedKafkaCluster has not been started")
        return self._workdir
