"""Leaving and coming back: graceful leave hands partitions over at once; a static member that
restarts within the session timeout gets its partitions back without a rebalance."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence

import pytest

from tests.audit.member import settings
from tests.integration.kafka_helpers import member, wait_until
from weir import Context, Handler, Partition, Record
from weir.testing.pytest_plugin import TopicFactory

pytestmark = pytest.mark.broker


class Watch(Handler):
    def __init__(self) -> None:
        self.assigned: list[tuple[float, list[int]]] = []
        self.revoked: list[tuple[float, list[int]]] = []
        self.lost: list[list[int]] = []
        self.changed = threading.Event()

    def handle(self, record: Record, ctx: Context) -> None:
        pass

    def on_assigned(self, partitions: Sequence[Partition]) -> None:
        self.assigned.append((time.monotonic(), sorted(p.partition for p in partitions)))
        self.changed.set()

    def on_revoked(self, partitions: Sequence[Partition]) -> None:
        self.revoked.append((time.monotonic(), sorted(p.partition for p in partitions)))
        self.changed.set()

    def on_lost(self, partitions: Sequence[Partition]) -> None:
        self.lost.append(sorted(p.partition for p in partitions))

    def owned(self) -> set[int]:
        events = sorted(
            [(t, 1, ps) for t, ps in self.assigned] + [(t, -1, ps) for t, ps in self.revoked]
        )
        out: set[int] = set()
        for _, sign, ps in events:
            (out.update if sign > 0 else out.difference_update)(ps)
        return out


@pytest.mark.parametrize("protocol", ["eager", "roundrobin", "cooperative", "consumer"])
def test_graceful_leave_hands_partitions_over_well_before_the_session_timeout(
    kafka_bootstrap: str, make_topic: TopicFactory, protocol: str
) -> None:
    topic = make_topic(4)
    group = f"leave-{uuid.uuid4().hex[:8]}"
    a, b = Watch(), Watch()
    kw = settings(protocol)
    ga = member(a, kafka_bootstrap, group, [topic], **kw).start()
    gb = member(b, kafka_bootstrap, group, [topic], **kw).start()
    try:
        wait_until(
            lambda: len(a.owned()) + len(b.owned()) == 4 and a.owned() and b.owned(),
            60,
            "both members to own partitions",
        )
        t0 = time.monotonic()
        ga.stop()
        ga.join(30)
        wait_until(lambda: len(b.owned()) == 4, 30, "b to own all partitions")
        handover = time.monotonic() - t0
    finally:
        gb.stop()
        gb.join(30)
    # The session timeout is 6 s on the test broker: a leave that waited for it would take longer.
    assert handover < 4.0, f"hand-over took {handover:.1f}s"
    assert not a.lost and not b.lost


@pytest.mark.parametrize("protocol", ["cooperative", "consumer"])
def test_static_member_restart_gets_its_partitions_back_without_a_rebalance(
    kafka_bootstrap: str, make_topic: TopicFactory, protocol: str
) -> None:
    topic = make_topic(4)
    group = f"static-{uuid.uuid4().hex[:8]}"
    kw = settings(protocol)
    a1, b = Watch(), Watch()
    ga = member(a1, kafka_bootstrap, group, [topic], group_instance_id="a", **kw).start()
    gb = member(b, kafka_bootstrap, group, [topic], group_instance_id="b", **kw).start()
    try:
        wait_until(
            lambda: len(a1.owned()) + len(b.owned()) == 4 and a1.owned() and b.owned(),
            60,
            "both static members to own partitions",
        )
        time.sleep(1.0)
        before_a, before_b = a1.owned(), b.owned()
        b_events = len(b.assigned) + len(b.revoked)
        ga.stop()
        ga.join(30)
        a2 = Watch()
        ga2 = member(a2, kafka_bootstrap, group, [topic], group_instance_id="a", **kw).start()
        try:
            wait_until(lambda: a2.owned() == before_a, 20, "the restarted member's old partitions")
            time.sleep(1.0)
            after_b = b.owned()
            b_changes = len(b.assigned) + len(b.revoked) - b_events
        finally:
            ga2.stop()
            ga2.join(30)
    finally:
        gb.stop()
        gb.join(30)
    assert after_b == before_b
    assert b_changes == 0, f"b was rebalanced while a restarted: {b.assigned} {b.revoked}"
    assert not b.lost and not a2.lost
