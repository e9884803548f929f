"""Fetch control: the one owner of which partitions the client fetches, and why not.

Several parts of weir want a partition not fetched, each for a reason of its own; a partition is
paused in the client while any reason holds it, and resumed when the last one is released:

| reason | held by | while |
|---|---|---|
| `fenced` | the engine | a fence refused a write for it: until the group moves it |
| `shutdown` | the engine | the member drains and stops |
| `blocked` | `Failures` | a failed record blocks it (policy `block`, a dead letter not written) |
| `app` | `AppPauses` | the application paused it or its topic (`pause`, `ctx.pause_partition`) |
| `rate` | `RateLimits` | its topic's rate (or the member's) holds records back at dispatch |
| `start_offset_unknown` | `Starts` | its committed offset is read, or its reset position resolved |
| `start_committing` | `Starts` | the reset position is committed, until the broker confirms it |
| `capacity` | `Budget` | the in-flight budget is full: every partition |
| `share` | `Budget` | the partition holds its share of the budget in reserve |

`pause_reason` (stats) is the first that holds it, in this order. A hold applies at once (a
pause only sets a flag in the client, allowed inside a rebalance callback); a release is applied
at the next `turn` of the owner loop, never inside a rebalance callback, because resuming also
wakes the partition's fetcher, and confluent-kafka aborts the process on a nested blocking call.

librdkafka keeps a partition's pause flag across unassign and assign: new partitions get weir's
state stated explicitly (`assigned`), whichever way the client left them.

librdkafka also pauses every assigned partition while an incremental rebalance (cooperative-sticky
or KIP-848) waits for its callback, and resumes them when the callback returns; the partitions
the member keeps are woken at the next `turn` (`rebalanced`), as after weir's own resumes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import get_args

from confluent_kafka import KafkaException, TopicPartition

from weir._engine.client import ConsumerClient, topic_partitions
from weir._engine.tasks import Assignment
from weir.logs import get_logger
from weir.records import Partition
from weir.stats import PauseReason as Reason

__all__ = ["FetchControl", "Reason"]

log = get_logger(__name__)

# The order stats name them in: the first that holds a partition is its `pause_reason`.
_ORDER: tuple[Reason, ...] = get_args(Reason)


class FetchControl:
    """Owner thread only."""

    def __init__(
        self,
        client: Callable[[], ConsumerClient],
        read_position: Callable[[Partition], int | None],
    ) -> None:
        self._client = client
        # Where weir expects the next batch of a partition (after a seek the client does not
        # know its position until it hands out a message).
        self._read_position = read_position
        self._why: dict[Partition, set[Reason]] = {}
        self.paused: set[Partition] = set()  # paused in the client, as weir asked it
        self._releasing: set[Partition] = set()  # to resume at the next turn
        self._waking: set[Partition] = set()  # resumed by the client in a rebalance: to wake

    def reason(self, tp: Partition) -> Reason | None:
        """Why `tp` is not fetched (the first reason that holds it), or None."""
        why = self._why.get(tp)
        if not why:
            return None
        return next(r for r in _ORDER if r in why)

    def holds(self, tp: Partition, reason: Reason) -> bool:
        return reason in self._why.get(tp, ())

    def hold(self, tps: Iterable[Partition], reason: Reason) -> None:
        """Stop fetching `tps` for `reason` (now)."""
        newly = []
        for tp in tps:
            self._why.setdefault(tp, set()).add(reason)
            self._releasing.discard(tp)
            if tp not in self.paused:
                newly.append(tp)
        self._set(newly, True, reason)

    def release(self, tps: Iterable[Partition], reason: Reason) -> None:
        """`reason` no longer holds `tps`; those nothing else holds resume at the next turn."""
        for tp in tps:
            why = self._why.get(tp)
            if why is None or reason not in why:
                continue
            why.discard(reason)
            if not why:
                del self._why[tp]
                if tp in self.paused:
                    self._releasing.add(tp)

    def follow(
        self, tps: Iterable[Partition], reason: Reason, wanted: Callable[[Partition], bool]
    ) -> None:
        """Hold or release `reason` on each of `tps` as `wanted` says."""
        held: list[Partition] = []
        freed: list[Partition] = []
        for tp in tps:
            (held if wanted(tp) else freed).append(tp)
        self.hold([tp for tp in held if not self.holds(tp, reason)], reason)
        self.release(freed, reason)

    def assigned(self, tps: Sequence[Partition]) -> None:
        """New partitions: weir's state for them stated to the client, both ways (librdkafka
        keeps its own flag from an earlier assignment)."""
        held = [tp for tp in tps if self._why.get(tp)]
        self._set(held, True, "assignment")
        self._set([tp for tp in tps if not self._why.get(tp)], False, "assignment")

    def opened(self, a: Assignment) -> None:
        pass  # stated to the client once every reason for it is known (`assigned`)

    def closed(self, a: Assignment) -> None:
        """A partition that left this member: nothing of it is kept."""
        self.forget([a.tp])

    def forget(self, tps: Iterable[Partition]) -> None:
        """Nothing of these partitions is kept (also of one fenced, held after it left this
        member's ownership until the group takes it)."""
        for tp in tps:
            self._why.pop(tp, None)
            self.paused.discard(tp)
            self._releasing.discard(tp)
            self._waking.discard(tp)

    def rebalanced(self, owned: Iterable[Partition]) -> None:
        """A rebalance callback is being served. Under an incremental protocol librdkafka paused
        every assigned partition when it queued the callback and resumes them when it returns;
        its fetcher may have gone to sleep meanwhile (`_wake`). The partitions owned now that
        the member keeps are woken at the next `turn`; those it gives up are forgotten first."""
        self._waking.update(owned)

    def turn(self) -> None:
        """Owner loop, never inside a rebalance callback: resume what was released, and wake
        the fetchers of what a rebalance paused and resumed."""
        resumed: list[Partition] = []
        if self._releasing:
            resumed = [tp for tp in self._releasing if tp in self.paused and not self._why.get(tp)]
            self._releasing.clear()
            if resumed:
                self._resume(resumed)
        if self._waking:
            # One weir holds stays paused in the client: it is woken when released.
            skip = self.paused.union(resumed)
            waking = [tp for tp in self._waking if tp not in skip]
            self._waking.clear()
            if waking:
                log.debug("fetchers_woken", partitions=[str(tp) for tp in waking])
                self._wake(waking)

    def _set(self, tps: Sequence[Partition], paused: bool, reason: str) -> None:
        if not tps:
            return
        log.debug(
            "partitions_paused" if paused else "partitions_resumed",
            partitions=[str(tp) for tp in tps],
            reason=reason,
        )
        try:
            if paused:
                self._client().pause(topic_partitions(tps))
                self.paused.update(tps)
            else:
                self._client().resume(topic_partitions(tps))
                self.paused.difference_update(tps)
        except KafkaException as exc:
            log.warning("pause_resume_failed", paused=paused, error=str(exc))

    def _resume(self, tps: list[Partition]) -> None:
        """Resume and get the fetches going at once (`_wake`)."""
        self._set(tps, False, "released")
        self._wake(tps)

    def _wake(self, tps: list[Partition]) -> None:
        """Get the fetches of these fetchable partitions going at once.

        librdkafka's resume only clears a flag: a broker thread that went idle because all its
        partitions were paused sleeps on (up to 1 s, `rd_kafka_max_block_ms`). A seek restarts
        the partition's fetch state, which wakes the broker thread of its leader. Each partition
        is sought to where the resume would fetch from anyway, the client's position (its last
        handed-out offset + 1; after an earlier seek, before anything new was handed out, the
        read position weir tracked): no request, no skip, no replay. Only when no partition has
        a position yet (nothing consumed) does a metadata request wake the broker that answers
        it."""
        client = self._client()
        woken = 0
        try:
            positions = client.position(topic_partitions(tps))
        except KafkaException as exc:
            log.debug("position_failed", error=str(exc))
            positions = []
        for r in positions:
            at = r.offset if r.offset >= 0 else self._read_position(Partition(r.topic, r.partition))
            if at is None or at < 0:
                continue
            try:
                client.seek(TopicPartition(r.topic, r.partition, at))
                woken += 1
            except KafkaException as exc:
                log.debug("resume_seek_failed", tp=f"{r.topic}[{r.partition}]", error=str(exc))
        if not woken:
            self._wake_fetcher(tps[0].topic)

    def _wake_fetcher(self, topic: str) -> None:
        """Any request to a broker wakes its thread; a metadata request is the cheapest one the
        Python client exposes (2 to 5 ms here, blocking the owner). Only the broker that
        answers is woken."""
        try:
            self._client().list_topics(topic, timeout=1.0)
        except KafkaException as exc:
            log.debug("wake_fetcher_failed", error=str(exc))
