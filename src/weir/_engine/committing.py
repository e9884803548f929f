"""What to commit and when: per-partition monotonic offsets, async results, sync hand-offs.

librdkafka may deliver async results out of order and retries internally, so the guard lives here:
an offset is sent only if it is above everything sent for that partition, and a failure re-opens
the partition only when no newer offset was confirmed since.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Literal

from weir._engine.clock import SYSTEM, Clock
from weir._engine.tasks import Assignment
from weir.logs import get_logger
from weir.records import CommitEvent, Partition

__all__ = ["CommitEvent", "Committer"]

log = get_logger(__name__)


# The unconfirmed commits kept per partition for their age: past this many the two oldest are
# merged (the older send time with the higher offset), which can only make the age older.
_UNCONFIRMED_KEPT = 8


# Errors the group protocol itself answers a commit with while the member's epoch or the
# coordinator moves (a KIP-848 member's epoch bumps when its assignment changes, e.g. when a
# subscribed pattern matches a new topic): the next commit carries the new epoch, so they are
# part of a rebalance's normal course, not something an operator acts on. Logged at info
# (`commit_retriable`); the commit failure count and the unconfirmed commit's age still show
# them (a steady stream is the `WeirCommitFailures` alert).
RETRIED_QUIETLY = frozenset(
    {
        "STALE_MEMBER_EPOCH",
        "REBALANCE_IN_PROGRESS",
        "NOT_COORDINATOR",
        "COORDINATOR_LOAD_IN_PROGRESS",
    }
)


class _State:
    __slots__ = ("confirmed", "highest", "sent", "unconfirmed")

    def __init__(self) -> None:
        self.sent: int | None = None
        # The highest offset ever sent in this state (`sent` comes back down after a failure):
        # a result above it answers a commit sent before the state began.
        self.highest: int | None = None
        self.confirmed: int | None = None
        # (offset, when sent) of every commit no confirmation covers yet, oldest first: sent and
        # waiting for its answer, or failed with no newer offset confirmed since.
        self.unconfirmed: list[tuple[int, float]] = []


class Committer:
    """Owner thread only. `emit` gets every `CommitEvent` (the engine passes them to the
    application's commit listeners)."""

    def __init__(
        self,
        interval_s: float,
        every: int,
        emit: Callable[[CommitEvent], None] | None = None,
        *,
        clock: Clock = SYSTEM,
    ) -> None:
        self._interval = interval_s
        self._every = every
        self._state: dict[Partition, _State] = {}
        self._last = clock.monotonic()
        self._finished_since = 0
        self._emit = emit or _ignore

    def opened(self, a: Assignment) -> None:
        self.track(a.tp)

    def closed(self, a: Assignment) -> None:
        self.forget([a.tp])

    def track(self, tp: Partition) -> None:
        # A new assignment starts clean: the broker's committed offset may have moved while
        # another member owned the partition.
        self._state[tp] = _State()

    def restart(self, tp: Partition) -> None:
        """`tp` was sought (`weir._engine.seeking`): what was sent before no longer bounds what
        is sent next, so an offset below it (a seek back) is committed too. A late result of an
        offset sent before is ignored (`result`)."""
        if tp in self._state:
            self._state[tp] = _State()

    def forget(self, tps: Iterable[Partition]) -> None:
        for tp in tps:
            self._state.pop(tp, None)

    def finished(self, n: int = 1) -> None:
        self._finished_since += n

    def due(self, now: float) -> bool:
        # The interval alone also makes a commit due: the read position can move past trailing
        # transaction markers without any record finishing.
        return self._finished_since >= self._every or now - self._last >= self._interval

    def to_send(
        self, committable: Mapping[Partition, int | None], *, unconfirmed: bool = False
    ) -> dict[Partition, int]:
        """Offsets above what was already sent, for tracked partitions only.

        With `unconfirmed=True` (the synchronous commit of a hand-off or shutdown) the bar is what
        the broker confirmed instead: an async commit still in flight may yet fail, and the
        hand-off commit is the last chance to store the offset.
        """
        out: dict[Partition, int] = {}
        for tp, off in committable.items():
            st = self._state.get(tp)
            if st is None or off is None:
                continue
            bar = st.confirmed if unconfirmed else st.sent
            if bar is None or off > bar:
                out[tp] = off
        return out

    def sent(self, offsets: Mapping[Partition, int], now: float, *, sync: bool = False) -> None:
        for tp, off in offsets.items():
            st = self._state.get(tp)
            if st is not None:
                if st.sent is None or off > st.sent:
                    st.sent = off
                if st.highest is None or off > st.highest:
                    st.highest = off
                if st.confirmed is None or off > st.confirmed:
                    pending = st.unconfirmed
                    pending.append((off, now))
                    if len(pending) > _UNCONFIRMED_KEPT:
                        (_, first), (second, _) = pending[0], pending[1]
                        pending[:2] = [(second, first)]
            self._emit(CommitEvent(tp, off, sync, "sent"))
        self._last = now
        self._finished_since = 0

    def result(
        self, tp: Partition, offset: int, error: str | None, *, sync: bool, code: str | None = None
    ) -> None:
        st = self._state.get(tp)
        if st is not None and (st.highest is None or offset > st.highest):
            # Sent before the partition was sought or assigned again (`restart`, `track`): it
            # says nothing about what was sent since.
            st = None
        if st is not None:
            if error is None:
                if st.confirmed is None or offset > st.confirmed:
                    st.confirmed = offset
                    st.unconfirmed = [u for u in st.unconfirmed if u[0] > offset]
            elif st.sent == offset and (st.confirmed is None or st.confirmed < offset):
                # The newest offset failed: allow it (or a later one) to be sent again. An older
                # failure after a newer success changes nothing.
                st.sent = st.confirmed
        if error is None:
            log.debug("commit", tp=str(tp), offset=offset, sync=sync)
        elif code in RETRIED_QUIETLY:
            log.info("commit_retriable", tp=str(tp), offset=offset, sync=sync, error=error)
        else:
            log.warning("commit_failed", tp=str(tp), offset=offset, sync=sync, error=error)
        status: Literal["committed", "failed"] = "committed" if error is None else "failed"
        self._emit(CommitEvent(tp, offset, sync, status, error, code))

    def confirmed(self, tp: Partition) -> int | None:
        st = self._state.get(tp)
        return None if st is None else st.confirmed

    def unconfirmed_since(self, tp: Partition) -> float | None:
        """When the oldest commit of `tp` that no confirmation covers was sent (None: every
        commit sent is confirmed). Its age is how long the partition's progress has gone
        unconfirmed: a commit waiting behind a classic rebalance, or commits that fail."""
        st = self._state.get(tp)
        return None if st is None or not st.unconfirmed else st.unconfirmed[0][1]

    def sent_offset(self, tp: Partition) -> int | None:
        st = self._state.get(tp)
        return None if st is None else st.sent


def _ignore(event: CommitEvent) -> None:
    pass
