"""Commits around a rebalance, on the scripted FakeConsumer, the engine stepped on the test thread
with a `ManualClock`: one async commit waits for its answer at a time, and an overdue one stops
holding the others back.

Under the classic protocol a member's group requests share one connection, so its commits wait
behind its own JoinGroup while a rebalance waits for the other members, and fail when it ends
(docs/rebalances.md); tests/chaos/test_join_commits.py measures that on a real broker.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

import pytest
from tests.fake_members import SETTINGS
from tests.logged import events
from tests.waiting import wait_until

from weir import ConsumerConfig, Record
from weir._engine.commits import RESULT_OVERDUE_S
from weir._engine.engine import Engine
from weir._engine.lifecycle import Lifecycle
from weir.records import as_handler
from weir.testing.clock import ManualClock
from weir.testing.fake import FakeConsumer

pytestmark = pytest.mark.timeout(60)

TOPIC = "t"
P0 = (TOPIC, 0)


class Stepped:
    """An engine on the test thread: `step()` is one turn of its owner loop."""

    def __init__(self, fake: FakeConsumer, handler: Callable[[Record], object]) -> None:
        self.clock = ManualClock(tick=0.001)
        self.fake = fake
        self.life = Lifecycle()
        self.life.begin()
        fake.given_committed()
        config = ConsumerConfig(**SETTINGS)
        self.engine = Engine(config, as_handler(handler), fake.factory, self.life, clock=self.clock)
        self.engine.start()

    def step_until(self, pred: Callable[[], object], what: str) -> None:
        def turn() -> object:
            self.engine.step()
            assert self.life.failure is None, repr(self.life.failure)
            return pred()

        wait_until(turn, what, every=0)

    def steps(self, n: int) -> None:
        for _ in range(n):
            self.engine.step()

    def stop(self) -> None:
        self.life.request_stop()
        self.engine.shutdown()


@pytest.fixture
def stepped() -> Iterator[list[Stepped]]:
    made: list[Stepped] = []
    yield made
    for s in made:
        s.stop()


def sent_offsets(fake: FakeConsumer) -> list[int]:
    return [off for off, _ in fake.commits_for(P0)]


def test_an_overdue_commit_no_longer_holds_the_next_one(
    stepped: list[Stepped], caplog: pytest.LogCaptureFixture
) -> None:
    """librdkafka answers every commit request; one whose answer never came would otherwise
    stop the member's commits for good."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3), key=b"A")
    fake.script_assign([P0])
    gate = threading.Event()

    def handle(record: Record) -> None:
        if record.offset > 0:
            gate.wait(5)

    s = Stepped(fake, handle)
    stepped.append(s)
    fake.hold_commit_results = True
    s.step_until(lambda: 1 in sent_offsets(fake), "the commit of 1")
    gate.set()
    s.step_until(lambda: s.engine.settle.processed == 3, "the other two records")
    s.steps(20)
    assert sent_offsets(fake)[-1] == 1  # its answer is awaited
    s.clock.advance(RESULT_OVERDUE_S)
    with caplog.at_level(logging.WARNING, logger="weir"):
        s.step_until(lambda: sent_offsets(fake)[-1] == 3, "3 sent past the overdue answer")
    overdue = events(caplog, "commit_result_overdue")
    assert len(overdue) == 1 and overdue[0]["waited_s"] >= RESULT_OVERDUE_S
