"""What a member joining costs the partitions that do not move, per group protocol.

For eager, cooperative-sticky and KIP-848 in turn: two audited members consume a steady stream on
12 partitions with 10 ms handlers, a third member joins, and the audit logs give
- the join latency: the joiner's process start to its first finished record;
- the stall of unaffected partitions (owned by the same member before and after the join): the
  longest gap between two finished records in the 6 s after the join, and the same in the 5 s
  before it ("at rest");
- their throughput in the 5 s after the join relative to the 5 s before.

The control, `raw-cooperative` and `raw-consumer`: the same scenario with plain confluent-kafka
consumers (weir's librdkafka settings, no handler: a record counts as finished when `poll`
returns it, offsets auto-committed every 250 ms). What they stall is librdkafka's own.

Run from the repo root: `python benchmarks/rebalance.py [--bootstrap HOST:PORT] [--json out.json]`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from tests.audit import AuditWriter
from tests.audit.cluster import Members, SteadyProducer, handled_by
from tests.audit.member import settings

from weir import GroupConsumer
from weir.testing import EmbeddedKafka

PARTITIONS = 12
RAW = "raw-"  # the control: plain confluent-kafka consumers


class RawMembers(Members):
    """Members that are plain confluent-kafka consumers (`raw_member`), audited the same way."""

    def command(self, name: str, *extra: str) -> list[str]:
        # The audited member's command with this script in place of its module (the weir
        # member's options in `extra`, such as its handler time, do not apply).
        weir_member = super().command(name)
        return [sys.executable, str(Path(__file__).resolve()), "--raw-member", *weir_member[3:]]


def raw_member(argv: list[str]) -> int:
    """One plain confluent-kafka member with weir's librdkafka settings for the protocol, until
    SIGTERM: audits each record as finished when `poll` returns it, and each assign/revoke/lost
    with partitions."""
    ap = argparse.ArgumentParser()
    for flag in ("--bootstrap", "--group", "--topic", "--protocol", "--member", "--audit"):
        ap.add_argument(flag, required=True)
    args = ap.parse_args(argv)
    conf = GroupConsumer(
        lambda record: None,
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        topics=[args.topic],
        **settings(args.protocol),
    ).config.librdkafka_config()
    conf.update({"enable.auto.commit": True, "auto.commit.interval.ms": 250})
    conf.update({"enable.auto.offset.store": True})
    audit = AuditWriter(Path(args.audit), args.member)
    halt = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: halt.set())

    def hook(ev: str) -> Any:
        def cb(consumer: Consumer, tps: list[TopicPartition]) -> None:
            if tps:  # as weir's hooks: not called for an empty change
                audit.write(ev, ps=[tp.partition for tp in tps])

        return cb

    c = Consumer(conf)
    audit.write("member_start")
    c.subscribe(
        [args.topic], on_assign=hook("assigned"), on_revoke=hook("revoked"), on_lost=hook("lost")
    )
    try:
        while not halt.is_set():
            msg: Message | None = c.poll(0.1)
            if msg is None:
                continue
            err: KafkaError | None = msg.error()
            if err is None:
                audit.write("done", p=msg.partition(), o=msg.offset(), tok=0)
    finally:
        c.close()
        audit.write("member_stop")
        audit.close()
    return 0


def _owners(evs: list[dict[str, Any]], t: float) -> dict[int, str]:
    owned: dict[int, str] = {}
    for e in evs:
        if e["t"] > t:
            break
        if e["ev"] == "assigned":
            for p in e["ps"]:
                owned[p] = e["m"]
        elif e["ev"] in ("revoked", "lost"):
            for p in e["ps"]:
                if owned.get(p) == e["m"]:
                    del owned[p]
    return owned


def _longest_gap(ts: list[float], start: float, end: float) -> float:
    inside = [t for t in ts if start <= t <= end]
    return max(b - a for a, b in itertools.pairwise([start, *inside, end]))


def measure(bootstrap: str, protocol: str, workdir: Path) -> dict[str, Any]:
    topic = f"rb-{protocol}-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        f.result()
    raw = protocol.startswith(RAW)
    kind = RawMembers if raw else Members
    group = f"bench-{uuid.uuid4().hex[:8]}"
    members = kind(workdir, bootstrap, group, topic, protocol.removeprefix(RAW))
    producer = SteadyProducer(bootstrap, topic, rate=600)
    producer.start()
    try:
        for m in ("m1", "m2"):
            members.start(m, "--slow-ms", "10")
        members.wait_for(
            lambda e: handled_by(e, "m1") > 50 and handled_by(e, "m2") > 50,
            60,
            "two members running",
        )
        time.sleep(6)
        members.start("m3", "--slow-ms", "10")
        members.wait_for(lambda e: handled_by(e, "m3") > 0, 60, "the joiner's first record")
        time.sleep(8)
    finally:
        producer.finish()
        for name in list(members.procs):
            members.stop(name)
        members.close()
    evs = members.events()
    t_join = next(e["t"] for e in evs if e["m"] == "m3" and e["ev"] == "member_start")
    first = next(e["t"] for e in evs if e["m"] == "m3" and e["ev"] == "done")
    before, after = _owners(evs, t_join - 0.01), _owners(evs, t_join + 7)
    kept = sorted(p for p, m in before.items() if after.get(p) == m)
    done: dict[int, list[float]] = defaultdict(list)
    for e in evs:
        if e["ev"] == "done" and e["p"] in kept and e["m"] == before[e["p"]]:
            done[e["p"]].append(e["t"])
    gaps = [_longest_gap(done[p], t_join, t_join + 6) for p in kept]
    rest = [_longest_gap(done[p], t_join - 5, t_join) for p in kept]
    n_before = sum(1 for p in kept for t in done[p] if t_join - 5 <= t < t_join)
    n_after = sum(1 for p in kept for t in done[p] if t_join <= t < t_join + 5)
    return {
        "protocol": protocol,
        "join_to_first_record_s": round(first - t_join, 2),
        "unaffected_partitions": len(kept),
        "unaffected_max_stall_s": round(max(gaps), 2) if gaps else None,
        "unaffected_median_stall_s": round(statistics.median(gaps), 2) if gaps else None,
        "unaffected_rest_max_gap_s": round(max(rest), 2) if rest else None,
        "unaffected_rest_median_gap_s": round(statistics.median(rest), 2) if rest else None,
        "unaffected_throughput_after_vs_before": round(n_after / n_before, 2) if n_before else None,
    }


def main() -> int:
    if sys.argv[1:2] == ["--raw-member"]:
        return raw_member(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap")
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--protocols",
        default="eager,cooperative,consumer,raw-cooperative,raw-consumer",
        help="comma-separated, in order (default: %(default)s); raw-X: plain confluent-kafka "
        "consumers under protocol X, the control",
    )
    args = ap.parse_args()
    results = []
    broker = None if args.bootstrap else EmbeddedKafka().start()
    bootstrap = args.bootstrap or broker.bootstrap_servers  # type: ignore[union-attr]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for protocol in args.protocols.split(","):
                wd = Path(tmp) / protocol
                wd.mkdir()
                results.append(measure(bootstrap, protocol, wd))
                print(json.dumps(results[-1]), flush=True)
    finally:
        if broker is not None:
            broker.stop()
    print(
        f"\n{'protocol':<16}{'join→1st':>10}{'kept':>6}{'max stall':>11}{'median':>8}"
        f"{'at rest: max':>14}{'median':>8}{'after/before':>14}"
    )
    for r in results:
        print(
            f"{r['protocol']:<16}{r['join_to_first_record_s']:>9}s{r['unaffected_partitions']:>6}"
            f"{r['unaffected_max_stall_s']!s:>10}s{r['unaffected_median_stall_s']!s:>7}s"
            f"{r['unaffected_rest_max_gap_s']!s:>13}s{r['unaffected_rest_median_gap_s']!s:>7}s"
            f"{r['unaffected_throughput_after_vs_before']!s:>14}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
