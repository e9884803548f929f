"""An operator's seek: an owned partition reads on from another offset, on the owner thread.

`GroupConsumer.seek` (and `seek_to_beginning` / `seek_to_end`) checks its arguments in the
caller's thread and sends the request here (`weir._engine.requests`). The owner resolves
the target to an offset inside the log (a time with ListOffsets; an offset past either end to
that end), then starts the partition over locally (`Ownership.reset`): its records in flight are
fenced and cancelled (a late completion marks nothing), its queued and gathered records dropped,
its retries, budget and watermark forgotten, and the offset map of the old position with them.
The seek position is committed at once and the client sought there once the broker confirmed it
(`Starts.seek_to`); records fetched from the old position meanwhile are dropped. Nothing is
committed above the seek position before a record from there has finished.

In exactly-once mode the open transaction is committed first (the partition's finished outputs,
those of running tasks' finished records too, and its watermark, with every other partition's):
a seek never reaches into a transaction. If it aborts, the seek is not done (`SeekError`), and
the partitions start over from their committed offsets as after any abort.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Literal

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaException

from weir._engine.client import ConsumerClient
from weir._engine.clock import SYSTEM, Clock
from weir._engine.committing import Committer
from weir._engine.exactly_once import ExactlyOnce
from weir._engine.ownership import Ownership
from weir._engine.replay import ReplayMaps
from weir._engine.starts import Starts, epoch_ms, resolve_offsets
from weir._engine.tasks import Assignment
from weir.errors import SeekError
from weir.logs import get_logger
from weir.records import Partition

__all__ = ["Seeks", "Target"]

log = get_logger(__name__)

Target = int | datetime | Literal["beginning", "end"]
"""Where a seek goes: an offset, the first record at or after a (timezone-aware) time, or the
log's start or end."""

# The longest the owner waits for the broker to say where a target is (ListOffsets).
_RESOLVE_TIMEOUT = 5.0


class Seeks:
    """Owner thread only."""

    def __init__(
        self,
        *,
        client: Callable[[], ConsumerClient],
        own: Ownership,
        starts: Starts,
        committer: Committer,
        replay: ReplayMaps,
        eos: ExactlyOnce | None,
        settle_started: Callable[[list[Assignment]], None],
        clock: Clock = SYSTEM,
    ) -> None:
        self._client = client
        self._own = own
        self._starts = starts
        self._committer = committer
        self._replay = replay
        self._eos = eos
        self._settle_started = settle_started
        self._clock = clock

    def seek(self, tp: Partition, target: Target) -> int:
        """Seek `tp` to `target`; returns the offset it reads from next. Raises `SeekError`
        (nothing changed) if it cannot be done."""
        st = self._own.partitions.get(tp)
        if st is None or not st.assignment.dispatching:
            raise SeekError(
                f"{tp} is not assigned to this member (now): a member seeks only the "
                "partitions the group gave it; see on_assigned / stats().partitions",
                not_assigned=True,
            )
        offset = self._resolve(tp, target)
        if self._eos is not None:
            self._commit_first(tp)
        read = st.progress.read_position
        unfinished = st.progress.pending
        self._own.reset([tp], quiet=True)
        self._replay.forget([tp])  # the old position's map: every record from here runs
        self._committer.restart(tp)  # a seek back commits the lower offset too
        self._starts.seek_to(tp, offset, self._clock.monotonic())
        log.info(
            "partition_sought",
            tp=str(tp),
            offset=offset,
            target=target.isoformat() if isinstance(target, datetime) else target,
            read_position=read,
            dropped=unfinished,
        )
        return offset

    def _resolve(self, tp: Partition, target: Target) -> int:
        """`target` as an offset inside the log now."""
        client = self._client()

        def at(spec: int) -> int:
            try:
                found = resolve_offsets(client, [tp], spec, _RESOLVE_TIMEOUT)
            except KafkaException as exc:
                raise SeekError(f"could not find where to seek {tp}: {exc}") from None
            if tp not in found:
                raise SeekError(f"the broker did not say where to seek {tp}")
            return found[tp]

        if isinstance(target, datetime):
            return at(epoch_ms(target))
        if target == "beginning":
            return at(OFFSET_BEGINNING)
        if target == "end":
            return at(OFFSET_END)
        # An offset past the log's end would be committed as the group's position (records
        # produced up to it skipped); one below its start is gone.
        return min(max(target, at(OFFSET_BEGINNING)), at(OFFSET_END))

    def _commit_first(self, tp: Partition) -> None:
        """Exactly-once: the open transaction holds outputs of `tp`'s finished records; it is
        committed (with every owned partition's watermark) before the seek moves the partition."""
        assert self._eos is not None
        if not self._eos.txn.ready:
            raise SeekError(
                f"{tp} not sought: the transactional producer is being replaced (the open "
                "transaction's fate is unknown yet); seek again in a moment"
            )
        before = self._own.partitions[tp]
        # What running tasks finished ahead of the record they are on counts, outputs and all
        # (`Settlement.settle_started`): the seek fences their results.
        self._settle_started([before.assignment])
        self._eos.commit(())
        if self._own.partitions.get(tp) is not before:
            raise SeekError(
                f"{tp} not sought: the open transaction aborted, and the partitions start "
                "over from their committed offsets; seek again"
            )
