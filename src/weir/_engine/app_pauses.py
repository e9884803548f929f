"""The application's pauses: partitions and topics it asked weir not to fetch.

`GroupConsumer.pause(target, for_s=)` (any thread, through the owner's requests) and a handler's
`ctx.pause_partition(for_s)` (a circuit breaker: the downstream is down) name a partition or a
whole topic, until `resume` or for `for_s` seconds. The pause is the application's intent for
this member, not a property of one assignment: a paused topic's partitions assigned later start
paused, and a paused partition that comes back in a rebalance is paused again while the pause
lasts.

Fetch control holds the partitions for the reason `app`; weir's own reasons (flow control,
starts, blocks) hold and release theirs independently, so neither lifts the other's pause.
Records already fetched still run: a pause stops fetching, it skips nothing and cancels nothing.
"""

from __future__ import annotations

import functools
import queue
from collections.abc import Callable, Iterable

from weir._engine.clock import Clock
from weir._engine.fetching import FetchControl
from weir._engine.tasks import Assignment
from weir.logs import get_logger
from weir.records import Partition

__all__ = ["AppPauses", "Target"]

log = get_logger(__name__)

Target = Partition | str
"""A partition, or every partition of a topic (its name)."""


class AppPauses:
    """Owner thread only, except `ask` (any thread)."""

    def __init__(
        self, fetch: FetchControl, owned: Callable[[], Iterable[Partition]], clock: Clock
    ) -> None:
        self._fetch = fetch
        self._owned = owned
        self._clock = clock
        self._until: dict[Target, float | None] = {}  # target -> monotonic end, None: resume
        # Pauses handlers asked for, from worker threads or the event loop: served at a turn.
        self._asked: queue.SimpleQueue[tuple[Partition, float | None]] = queue.SimpleQueue()

    def ask(self, tp: Partition, for_s: float | None) -> None:
        """Any thread: pause `tp` at the owner's next turn (a handler's `ctx.pause_partition`;
        the member may be stopping, when it is simply never served)."""
        self._asked.put((tp, for_s))

    def pause(self, target: Target, for_s: float | None) -> bool:
        """Pause `target` until `resume`, or for `for_s` seconds from now (a later pause of the
        same target replaces the end). True if it holds a partition this member owns now."""
        self._until[target] = None if for_s is None else self._clock.monotonic() + for_s
        held = [tp for tp in self._owned() if _covers(target, tp)]
        self._fetch.hold([tp for tp in held if not self._fetch.holds(tp, "app")], "app")
        log.info("app_paused", target=str(target), for_s=for_s, partitions=[str(tp) for tp in held])
        return bool(held)

    def resume(self, target: Target) -> bool:
        """Lift the pause of `target` (exactly this target: a partition of a paused topic stays
        paused until the topic is resumed). True if `target` was paused."""
        if target not in self._until:
            return False
        del self._until[target]
        log.info("app_resumed", target=str(target), ended="resume")
        self._release_uncovered()
        return True

    def paused(self) -> dict[Target, float | None]:
        """Each paused target with the seconds left (None: until resumed)."""
        now = self._clock.monotonic()
        return {t: None if end is None else max(0.0, end - now) for t, end in self._until.items()}

    def turn(self, now: float) -> None:
        """Serve the handlers' pauses, and end the pauses whose time is up. Every turn of the
        owner loop: with no pause asked for or held it looks at two empty containers."""
        asked = self._asked
        while not asked.empty():  # only the owner takes from it: empty() cannot race a get
            tp, for_s = asked.get_nowait()
            self.pause(tp, for_s)
        if not self._until:
            return
        ended = [t for t, end in self._until.items() if end is not None and end <= now]
        if not ended:
            return
        for target in ended:
            del self._until[target]
            log.info("app_resumed", target=str(target), ended="for_s")
        self._release_uncovered()

    def opened(self, a: Assignment) -> None:
        """A partition assigned (or started over): paused again if a pause still covers it, and
        its handlers given the way to ask for one."""
        a.pause = functools.partial(self.ask, a.tp)
        if self._covered(a.tp) and not self._fetch.holds(a.tp, "app"):
            self._fetch.hold([a.tp], "app")

    def closed(self, a: Assignment) -> None:
        pass  # the pause outlives the assignment: it is the application's, not the partition's

    def _covered(self, tp: Partition) -> bool:
        return tp in self._until or tp.topic in self._until

    def _release_uncovered(self) -> None:
        self._fetch.release([tp for tp in self._owned() if not self._covered(tp)], "app")


def _covers(target: Target, tp: Partition) -> bool:
    return tp == target if isinstance(target, Partition) else tp.topic == target
