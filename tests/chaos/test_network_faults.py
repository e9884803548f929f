"""Faults that cross the network, not only kills: members and brokers in Linux network namespaces
(tests/audit/network.py), their links cut, healed, slowed and made lossy.

(a) member cut: a member's link is cut for twice the session timeout and healed. The member must
    come back as lost (on_lost), send no commit for a partition it no longer owns, and rejoin.
(b) coordinator cut: in a 3-broker cluster, each broker in its own namespace, the broker that
    coordinates the group is cut off from everything (members, the other brokers) and healed.
(c) slow link: 200 ms each way and 5 % of the packets lost on a member's link (a userspace relay:
    the test machines' kernel has no netem qdisc) while the group rebalances twice around it.

Each runs in three modes (at-least-once with key ordering, unordered, and exactly-once:
transactional members transform the input into an output topic) and with both group protocols
(classic with the cooperative assignor, and KIP-848's consumer protocol). Every run checks the
audit invariants (every record handled, no commit past an unfinished record, none for a
partition the member does not own, no rewind), that the group's commits reach the input's end,
and in exactly-once mode that the output (read_committed) holds every input's transform exactly
once. All need root (CAP_NET_ADMIN) and iproute2, and skip, saying why, without them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from tests.audit import Report, check, stale_commits
from tests.audit.cluster import Members, SteadyProducer, handled_by
from tests.audit.exactly_once import check_outputs
from tests.audit.network import Host, Lan, connect_seconds, unavailable
from tests.integration.kafka_helpers import committed
from weir.testing.broker import EmbeddedKafka
from weir.testing.cluster import KAFKA_LOG, EmbeddedKafkaCluster

PARTITIONS = 4
RATE = 100  # records per second: enough to keep every partition busy through each fault
SESSION_S = 6.0  # the classic members' session.timeout.ms, and the brokers' for KIP-848
CUT_S = 2 * SESSION_S
MODES: dict[str, list[str]] = {
    "at-least-once": ["--ordering", "key"],
    "unordered": ["--ordering", "unordered"],
    "exactly-once": ["--ordering", "key", "--transaction-timeout", "10"],
}
PROTOCOLS = ["cooperative", "consumer"]
EV = list[dict[str, Any]]

pytestmark = [pytest.mark.broker, pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def lan() -> Iterator[Lan]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    lan = Lan()
    try:
        yield lan
    finally:
        lan.close()


@dataclass
class Run:
    """One cell: its group, topics, members and producer, on `bootstrap`."""

    bootstrap: str
    mode: str
    protocol: str
    workdir: Path
    replication: int = 1

    def __post_init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.group = f"net-{tag}"
        self.src = f"in-{tag}"
        self.out = f"out-{tag}" if self.mode == "exactly-once" else None
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        new = [NewTopic(t, PARTITIONS, self.replication) for t in (self.src, self.out) if t]
        for f in admin.create_topics(new).values():
            f.result()
        self.members = Members(self.workdir, self.bootstrap, self.group, self.src, self.protocol)
        self.producer = SteadyProducer(self.bootstrap, self.src, rate=RATE)
        self.started = time.monotonic()

    def args(self) -> list[str]:
        extra = ["--slow-ms", "2", *MODES[self.mode]]
        return extra + (["--output", self.out] if self.out else [])

    def start(self, name: str, host: Host | None = None) -> None:
        self.members.start(name, *self.args(), netns=host.netns if host else None)

    def begin(self, b_in: Host | None = None) -> None:
        """The stream starts, and two members, a here and b in `b_in` (here if None), handle it."""
        self.producer.start()
        self.start("a")
        self.start("b", b_in)
        self.wait_handled("a", 20, "a to handle records")
        self.wait_handled("b", 20, "b to handle records")

    def wait_handled(self, name: str, more_than: int, what: str, timeout: float = 60) -> EV:
        return self.members.wait_for(lambda e: handled_by(e, name) > more_than, timeout, what)

    def finish(self, fault: str, notes: str = "") -> Report:
        """Every record handled and committed, every member stopped cleanly; then the checks."""
        ends = self.members.finish(self.producer, self.bootstrap, self.src, PARTITIONS, 120)
        evs = self.members.events()
        report = check(evs, ends)
        early = [v for v in report.violations if "was unfinished" in v]
        outputs = check_outputs(self.bootstrap, self.src, self.out) if self.out else None
        print(
            f"\n{fault} {self.mode}/{self.protocol}: produced={report.produced} "
            f"handled={report.handled} re-handled={report.handled - report.distinct} "
            f"lost={report.produced - report.distinct} early_commits={len(early)} "
            f"violations={len(report.violations)} "
            f"seconds={time.monotonic() - self.started:.0f}"
            + (f"; output: {outputs.summary()}" if outputs else "")
            + (f"; {notes}" if notes else "")
        )
        assert not report.violations, "\n".join(report.violations[:20])
        assert committed(self.bootstrap, self.group, self.src, PARTITIONS) == ends
        if outputs is not None:
            assert outputs.exactly_once, outputs.summary()
            assert outputs.outputs == sum(ends)
        return report

    def close(self) -> None:
        self.members.close()
        if self.producer.is_alive():
            self.producer.finish()


def _run(
    bootstrap: str,
    mode: str,
    protocol: str,
    workdir: Path,
    body: Callable[[Run], None],
    replication: int = 1,
) -> None:
    run = Run(bootstrap, mode, protocol, workdir, replication)
    try:
        body(run)
    finally:
        run.close()


def _since(evs: EV, member: str, kind: str, t: float) -> list[dict[str, Any]]:
    return [e for e in evs if e["m"] == member and e["ev"] == kind and e["t"] > t]


# --- (a) and (c): one broker in this namespace, on the LAN's address ---------------------------


@pytest.fixture(scope="class")
def lan_broker(lan: Lan, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    kafka = EmbeddedKafka(workdir=tmp_path_factory.mktemp("kafka"), host=lan.address).start()
    try:
        yield kafka
    finally:
        kafka.stop()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("mode", list(MODES))
class TestMemberLinks:
    def test_a_member_cut_off_past_its_session_comes_back_lost_and_rejoins(
        self, lan: Lan, lan_broker: EmbeddedKafka, tmp_path: Path, mode: str, protocol: str
    ) -> None:
        port = lan_broker.port

        def body(run: Run) -> None:
            host = lan.host(f"cut{uuid.uuid4().hex[:4]}")
            run.begin(b_in=host)
            cut = time.time()
            lan.cut(host)
            # The cut is real: nothing gets through from b's namespace to the broker.
            assert connect_seconds(host, lan.address, port, timeout=2) is None
            time.sleep(CUT_S - (time.time() - cut))
            evs = run.members.events()
            during = handled_by(evs, "a")
            lan.heal(host)
            healed = time.time()

            def back(evs: EV) -> bool:
                lost = _since(evs, "b", "lost", cut)
                return bool(
                    lost
                    and any(e["ps"] for e in _since(evs, "b", "assigned", lost[0]["t"]))
                    and _since(evs, "b", "done", healed)
                )

            evs = run.members.wait_for(back, 90, "b to come back as lost and rejoin")
            assert handled_by(evs, "a") > during or _since(evs, "a", "done", cut)
            lost = _since(evs, "b", "lost", cut)[0]
            run.finish(
                "member-cut",
                f"b lost {lost['ps']} {lost['t'] - cut:.1f} s into the cut, "
                f"rejoined {_since(evs, 'b', 'assigned', lost['t'])[0]['t'] - healed:.1f} s "
                "after the heal",
            )
            stale, attempts = stale_commits(run.members.events(), "b", cut)
            print(f"b sent {attempts} commits for partitions a owned; accepted: {len(stale)}")
            assert not stale, stale

        _run(lan_broker.bootstrap_servers, mode, protocol, tmp_path, body)

    def test_a_slow_lossy_link_through_two_rebalances(
        self, lan: Lan, lan_broker: EmbeddedKafka, tmp_path: Path, mode: str, protocol: str
    ) -> None:
        port = lan_broker.port

        def body(run: Run) -> None:
            host = lan.impaired_host(f"slow{uuid.uuid4().hex[:4]}", tmp_path)
            run.begin(b_in=host)
            impaired = time.time()
            lan.impair(host, delay_ms=200, loss=0.05)
            # Real: a connection takes a round trip, 400 ms (more when the SYN is lost).
            rtt = min(connect_seconds(host, lan.address, port, 10) or 10 for _ in range(3))
            assert rtt >= 0.4, rtt
            time.sleep(max(0.0, 4 - (time.time() - impaired)))
            # a leaves: b takes every partition over its slow link ...
            assert run.members.stop("a") == 0
            before = handled_by(run.members.events(), "b")
            run.wait_handled("b", before + 3 * RATE, "b to handle the stream alone", 90)
            # ... and gives half back to a newcomer.
            run.start("c")
            run.wait_handled("c", 20, "c to handle records", 90)
            time.sleep(4)
            lan.impair(host, delay_ms=0, loss=0)
            evs = run.members.events()
            lost = _since(evs, "b", "lost", impaired)
            run.finish(
                "slow-link",
                f"impaired {time.time() - impaired:.0f} s (connect {rtt:.2f} s); "
                f"b reported lost {len(lost)} times",
            )

        _run(lan_broker.bootstrap_servers, mode, protocol, tmp_path, body)


# --- (b): three brokers, each in its own namespace ----------------------------------------------


@dataclass
class NetCluster:
    cluster: EmbeddedKafkaCluster
    lan: Lan
    hosts: list[Host]

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap_servers


@pytest.fixture(scope="class")
def net_cluster(lan: Lan, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetCluster]:
    hosts = [lan.host(f"k{i + 1}") for i in range(3)]
    cluster = EmbeddedKafkaCluster(
        3,
        workdir=tmp_path_factory.mktemp("cluster"),
        hosts=[h.address for h in hosts],
        netns=[h.netns for h in hosts],
    ).start()
    try:
        yield NetCluster(cluster, lan, hosts)
    finally:
        cluster.stop()


def _coordinator(bootstrap: str, group: str) -> int | None:
    """The id of the broker that coordinates `group`, or None while no broker can say."""
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=KAFKA_LOG)
    try:
        described = admin.describe_consumer_groups([group], request_timeout=5)[group].result()
    except KafkaException:
        return None
    node_id: int = described.coordinator.id
    return node_id


def _replicated(bootstrap: str, timeout: float) -> None:
    """Wait until every partition's replicas are all in sync (a healed broker caught up), so the
    next cut starts from a whole cluster."""
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=KAFKA_LOG)
    deadline = time.monotonic() + timeout
    behind: list[str] = []
    while time.monotonic() < deadline:
        try:
            meta = admin.list_topics(timeout=10)
        except KafkaException:
            time.sleep(0.5)
            continue
        behind = [
            f"{t.topic}/{p.id}"
            for t in meta.topics.values()
            for p in t.partitions.values()
            if len(p.isrs) < len(p.replicas)
        ]
        if len(meta.brokers) == 3 and not behind:
            return
        time.sleep(0.5)
    raise AssertionError(f"the cluster did not heal in {timeout} s: out of sync {behind[:10]}")


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("mode", list(MODES))
class TestCoordinatorCut:
    def test_the_group_coordinators_broker_cut_off_and_healed(
        self, net_cluster: NetCluster, tmp_path: Path, mode: str, protocol: str
    ) -> None:
        bootstrap = net_cluster.bootstrap
        _replicated(bootstrap, 120)

        def body(run: Run) -> None:
            run.begin()
            node = _coordinator(bootstrap, run.group)
            assert node is not None
            lan = net_cluster.lan
            host = net_cluster.hosts[node - 1]
            others = ",".join(
                n.bootstrap_servers for n in net_cluster.cluster.nodes if n.node_id != node
            )
            cut = time.monotonic()
            lan.cut(host)
            # The fault is real: the other brokers fence the cut one (broker.session.timeout.ms,
            # 3 s; longer when it was also the active controller, whose successor is elected
            # first) and one of them takes the group over. The cut lasts until then, and CUT_S.
            moved = None
            while moved is None and time.monotonic() - cut < 3 * CUT_S:
                if _coordinator(others, run.group) not in (node, None):
                    moved = time.monotonic() - cut
                time.sleep(0.5)
            time.sleep(max(0.0, CUT_S - (time.monotonic() - cut)))
            lan.heal(host)
            assert moved is not None, f"broker {node} stayed the coordinator while cut off"
            healed = time.time()
            run.members.wait_for(
                lambda e: all(_since(e, m, "done", healed) for m in ("a", "b")),
                90,
                "both members to handle records after the heal",
            )
            after = _coordinator(bootstrap, run.group)
            run.finish(
                "coordinator-cut",
                f"coordinator broker {node} cut, moved after {moved:.1f} s, then {after}",
            )

        _run(bootstrap, mode, protocol, tmp_path, body, replication=3)
