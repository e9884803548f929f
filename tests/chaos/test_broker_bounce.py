"""A broker restart under transactional members: the only broker is stopped and started again
(same data, same port) while two members transform a steady stream, five times in a row.

Before weir enforced its own deadlines, 3 runs in 5 left a member hung for good inside
`send_offsets_to_transaction` (librdkafka waited on a condition variable whatever timeout it
was given) and in the other 2 both members stopped with TransactionError ("Failed to add offsets
to transaction: Timed out", or _TRANSPORT). Now no member may stop or hang: every member is
alive after each bounce and stops within its shutdown budget at the end, the group's commits
reach the input's end, and the output (read_committed) holds the transform of every input
exactly once.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from tests.audit.cluster import Members, SteadyProducer
from tests.audit.exactly_once import check_outputs
from tests.integration.kafka_helpers import committed, end_offsets
from weir.testing.broker import EmbeddedKafka

PARTITIONS = 4
BOUNCES = 5


def _committed(bootstrap: str, group: str, topic: str) -> list[int] | None:
    """The group's committed offsets, or None while the broker that just came back cannot say
    yet (NOT_COORDINATOR while it loads the group)."""
    try:
        return committed(bootstrap, group, topic, PARTITIONS)
    except KafkaException:
        return None


def _logged(workdir: Path, text: str) -> int:
    """How often the members' logs hold `text`."""
    return sum(p.read_text(errors="replace").count(text) for p in workdir.glob("*.log"))


@pytest.mark.broker
@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(BOUNCES * 150 + 300)
@pytest.mark.parametrize("protocol", ["cooperative", "consumer"])
def test_transactional_members_ride_out_broker_restarts(tmp_path: Path, protocol: str) -> None:
    kafka = EmbeddedKafka(workdir=tmp_path / "kafka").start()
    members: Members | None = None
    producer: SteadyProducer | None = None
    try:
        bootstrap = kafka.bootstrap_servers
        src, out = f"in-{uuid.uuid4().hex[:6]}", f"out-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for f in admin.create_topics(
            [NewTopic(src, PARTITIONS, 1), NewTopic(out, PARTITIONS, 1)]
        ).values():
            f.result()
        group = f"bounce-{uuid.uuid4().hex[:6]}"
        members = Members(tmp_path, bootstrap, group, src, protocol)
        producer = SteadyProducer(bootstrap, src, rate=300)
        producer.start()
        for name in ("a", "b"):
            members.start(name, "--output", out, "--ordering", "key", "--slow-ms", "1")
        outages = []
        seen = [0]  # the group's committed total, as last read

        def moved(_: object) -> bool:
            now = _committed(bootstrap, group, src)
            if now is None or sum(now) <= seen[0]:
                return False
            seen[0] = sum(now)
            return True

        for bounce in range(BOUNCES):
            members.wait_for(moved, 120, f"the group's commits to move before bounce {bounce + 1}")
            time.sleep(8)
            stopped = time.monotonic()
            kafka.stop()
            time.sleep(3)
            kafka.start()
            outages.append(round(time.monotonic() - stopped, 1))
            # Every member lives through it (wait_for fails on one that exited), and the group
            # commits past where it stood.
            members.wait_for(moved, 120, f"the group's commits to move after bounce {bounce + 1}")
        producer.finish()
        ends = end_offsets(bootstrap, src, PARTITIONS)
        members.wait_for(
            lambda _: _committed(bootstrap, group, src) == ends,
            120,
            "the group's commits to reach the end offsets",
        )
        for name in list(members.procs):
            assert members.stop(name, timeout=60) == 0
        report = check_outputs(bootstrap, src, out)
        replaced = _logged(tmp_path, "transactional_producer_replaced")
        abandoned = _logged(tmp_path, "abandoned=True")
        print(
            f"\nbroker bounce {protocol}: outages {outages} s; {report.summary()}; "
            f"producers replaced {replaced}, calls abandoned {abandoned}"
        )
        assert report.exactly_once, report.summary()
        assert report.outputs == sum(ends)
    finally:
        if producer is not None and producer.is_alive():
            producer.finish()
        if members is not None:
            members.close()
        kafka.stop()
