"""The stall watchdog: no owned partition left silent while the broker has records for it.

weir assigns every partition at an explicit offset (`weir._engine.starts`), so librdkafka's own
committed-offset fetch, which can leave a partition assigned and never started, is not used. This
watchdog covers whatever else leaves a partition silent (a fetcher librdkafka never started or
stopped, a pause weir never asked for): it looks at the owned partitions about once a second
(`turn`).

- **A suspect**: a partition weir fetches (no `FetchControl` reason holds it, the client is not
  paused on it by weir, the budget does not throttle) whose read position has not moved for
  `partition_stall_s`. A partition whose records are all delivered (in flight, finished, or read
  ahead) has nothing left to fetch and is idle, not silent.
- **Stalled**: a suspect with records past its position. The client's last fetch response tells
  most suspects apart (the log ends at their position: idle); the others' log end is asked for in
  one ListOffsets request (under read_committed the last stable offset: an open transaction holds
  a reader back, and that is no stall). A read that fails, or a partition whose position is not
  known, is looked at again a whole `partition_stall_s` later.
- **Recovered** once per stall: resumed (weir's state restated: no reason holds it) and sought to
  where it reads next, which restarts its fetcher; a partition the client never started refuses
  the seek (`_STATE`) and is assigned again at that offset instead. It stays reported stalled
  (`silent_s`, `health()`) until it delivers again (`partition_stall_ended`).

Time the owner loop spent elsewhere (a rebalance callback blocked for half of `partition_stall_s`
or more) is no silence: every partition is looked at afresh.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from confluent_kafka import OFFSET_END, KafkaException, TopicPartition

from weir._engine.budget import Budget
from weir._engine.client import ConsumerClient, topic_partitions
from weir._engine.fetching import FetchControl
from weir._engine.ownership import Ownership
from weir._engine.starts import Starts
from weir._engine.tasks import Assignment
from weir.logs import get_logger
from weir.records import Partition

__all__ = ["Stalls"]

log = get_logger(__name__)

# The longest the owner waits for the log end of the suspects.
_ASK_TIMEOUT = 0.5
# The owned partitions are looked at this often at most (seconds).
_EVERY = 1.0

_Mark = tuple[int, int | None]


class _Watch:
    """One owned partition as the watchdog sees it."""

    __slots__ = ("mark", "since", "stalled")

    def __init__(self) -> None:
        self.mark: _Mark | None = None  # its progress epoch and read position, last seen
        self.since: float | None = None  # when it last delivered, or became fetchable
        self.stalled = False  # found stalled (and recovered once) since then


class Stalls:
    """Owner thread only."""

    def __init__(
        self,
        stall_s: float | None,
        *,
        client: Callable[[], ConsumerClient],
        own: Ownership,
        fetch: FetchControl,
        budget: Budget,
        starts: Starts,
        incremental: bool,
    ) -> None:
        self._stall_s = stall_s
        self._every = _EVERY if stall_s is None else min(_EVERY, stall_s / 4)
        self._client = client
        self._own = own
        self._fetch = fetch
        self._budget = budget
        self._starts = starts
        self._incremental = incremental
        self._watch: dict[Partition, _Watch] = {}
        self._next = 0.0
        self._last: float | None = None
        self.recoveries = 0
        """Stalled partitions sought (or assigned) again."""

    def opened(self, a: Assignment) -> None:
        self._watch[a.tp] = _Watch()

    def closed(self, a: Assignment) -> None:
        self._watch.pop(a.tp, None)

    def silent_s(self, tp: Partition, now: float) -> float | None:
        """How long a partition found stalled has delivered nothing (None: it is not)."""
        w = self._watch.get(tp)
        if w is None or not w.stalled or w.since is None:
            return None
        return now - w.since

    # -- the owner loop --------------------------------------------------------------------

    def turn(self, now: float) -> None:
        stall_s = self._stall_s
        if stall_s is None or now < self._next:
            return
        away = self._last is not None and now - self._last >= stall_s / 2
        self._last = now
        self._next = now + self._every
        held = self._budget.throttled or away
        fetch = self._fetch
        suspects = []
        for tp, st in self._own.partitions.items():
            w = self._watch.get(tp)
            if w is None:
                w = self._watch[tp] = _Watch()
            mark = (st.progress.epoch, st.progress.read_position)
            if mark != w.mark:
                if w.stalled and w.mark is not None and w.since is not None:
                    log.info("partition_stall_ended", tp=str(tp), silent_s=round(now - w.since, 1))
                w.mark, w.since, w.stalled = mark, now, False
            elif held or w.since is None or tp in fetch.paused or fetch.reason(tp) is not None:
                # Not fetched by weir's own choice (or not watched): no silence.
                w.since, w.stalled = now, False
            elif not w.stalled and now - w.since >= stall_s:
                suspects.append(tp)
        if suspects:
            self._check(suspects, now)

    def _check(self, suspects: list[Partition], now: float) -> None:
        """Which suspects have records past their position: those are stalled."""
        client = self._client()
        positions = self._positions(suspects)
        ask = []
        for tp in suspects:
            pos = positions.get(tp)
            high = _cached_high(client, tp)
            if pos is None or (high is not None and high <= pos):
                self._watch[tp].since = now  # idle, or nowhere known to read from
            else:
                ask.append(tp)
        if not ask:
            return
        try:
            ends = client.offsets_for_times(
                [TopicPartition(tp.topic, tp.partition, OFFSET_END) for tp in ask],
                timeout=_ASK_TIMEOUT,
            )
        except KafkaException as exc:
            log.debug("stall_check_failed", partitions=[str(tp) for tp in ask], error=str(exc))
            ends = []
        found = {
            Partition(r.topic, r.partition): r.offset
            for r in ends
            if r.error is None and r.offset >= 0
        }
        for tp in ask:
            end = found.get(tp)
            w = self._watch[tp]
            if end is None or end <= positions[tp]:
                w.since = now
                continue
            w.stalled = True
            how = self._recover(tp, positions[tp])
            log.warning(
                "partition_stalled",
                tp=str(tp),
                silent_s=round(now - w.since, 1) if w.since is not None else None,
                position=positions[tp],
                log_end=end,
                recovery=how,
            )

    def _positions(self, tps: Iterable[Partition]) -> dict[Partition, int]:
        """Where each partition reads next: the client's position, else weir's read position,
        else the committed offset it started at (None where none is known)."""
        tps = list(tps)
        out: dict[Partition, int] = {}
        try:
            found = self._client().position(topic_partitions(tps))
        except KafkaException as exc:
            log.debug("position_failed", error=str(exc))
            found = []
        for r in found:
            if r.offset >= 0:
                out[Partition(r.topic, r.partition)] = r.offset
        for tp in tps:
            if tp in out:
                continue
            st = self._own.partitions.get(tp)
            read = None if st is None else st.progress.read_position
            committed = self._starts.committed.get(tp)
            if read is not None:
                out[tp] = read
            elif committed is not None and committed[0] >= 0:
                out[tp] = committed[0]
        return out

    # -- recovery --------------------------------------------------------------------------

    def _recover(self, tp: Partition, offset: int) -> str | None:
        """Start `tp` fetching at `offset` again: how ("seek" or "assign"), None if the client
        refused both."""
        client = self._client()
        try:
            client.resume([TopicPartition(tp.topic, tp.partition)])
            client.seek(TopicPartition(tp.topic, tp.partition, offset))
            how = "seek"
        except KafkaException as exc:
            # A partition the client never started has no fetcher to seek.
            seek_error = str(exc)
            try:
                self._reassign(tp, offset)
            except (KafkaException, _Unplaced) as exc2:
                log.warning(
                    "partition_stall_recovery_failed",
                    tp=str(tp),
                    offset=offset,
                    seek_error=seek_error,
                    error=str(exc2),
                )
                return None
            how = "assign"
        self.recoveries += 1
        return how

    def _reassign(self, tp: Partition, offset: int) -> None:
        client = self._client()
        if self._incremental:
            client.incremental_unassign([TopicPartition(tp.topic, tp.partition)])
            client.incremental_assign([TopicPartition(tp.topic, tp.partition, offset)])
            return
        # An eager member can only state its whole assignment: every other partition at the
        # position it reads next (one whose start is not settled at the placeholder it waits at,
        # as `Starts.assign` put it; paused, as librdkafka keeps its flag). Never a logical
        # offset: librdkafka's lookup of one can undo the seek to its start (`Starts`).
        owned = [p for p in self._own.partitions if p != tp]
        waiting = self._starts.pending
        positions = self._positions(p for p in owned if p not in waiting)
        at = [TopicPartition(tp.topic, tp.partition, offset)]
        for p in owned:
            pos = self._starts.placeholder(p) if p in waiting else positions.get(p)
            if pos is None:
                raise _Unplaced(f"{p} has no known position to assign it at again")
            at.append(TopicPartition(p.topic, p.partition, pos))
        client.assign(at)


class _Unplaced(Exception):
    """An eager assignment cannot be stated again: a partition's position is not known."""


def _cached_high(client: ConsumerClient, tp: Partition) -> int | None:
    """The high watermark from the client's last fetch response of `tp` (None: unknown)."""
    try:
        _, high = client.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), cached=True)
    except KafkaException:
        return None
    return high if high >= 0 else None
