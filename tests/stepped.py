"""An engine on the test thread, stepped one owner-loop turn at a time on a `ManualClock`: for
tests of what the owner decides at which turn, with no thread to wait for."""

from __future__ import annotations

from collections.abc import Callable

from tests.fake_members import SETTINGS
from tests.waiting import wait_until
from weir import ConsumerConfig, Record
from weir._engine.engine import Engine
from weir._engine.lifecycle import Lifecycle
from weir._engine.protocols import ProtocolProbe
from weir.records import Handler, as_handler
from weir.testing.clock import ManualClock
from weir.testing.fake import FakeConsumer


class Stepped:
    """An engine on the test thread: `step()` is one turn of its owner loop."""

    def __init__(
        self,
        fake: FakeConsumer,
        handler: Callable[[Record], object] | Handler,
        config: ConsumerConfig | None = None,
        probe: ProtocolProbe | None = None,
    ) -> None:
        self.clock = ManualClock(tick=0.001)
        self.fake = fake
        self.life = Lifecycle()
        self.life.begin()
        fake.given_committed()
        self.engine = Engine(
            config or ConsumerConfig(**SETTINGS),
            as_handler(handler),
            fake.factory,
            self.life,
            protocol_probe=probe,
            clock=self.clock,
        )
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
        self.fake.hold_commit_results = False  # the answers held come with the next poll
        self.life.request_stop()
        self.engine.shutdown()
