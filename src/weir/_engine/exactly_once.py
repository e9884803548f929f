"""Exactly-once beside the engine: transaction boundaries, what an abort rewinds, recovery.

`Transactions` speaks to the transactional producer; this module decides, with the engine's
components, what goes into a boundary (every owned partition's watermark and offset map, with a
fresh group metadata), what a boundary's outcome means (`Outcome`: committed, aborted, or
unknown after a producer was replaced) and which partitions start over then (`rewind`, through
`Starts`). The engine calls `turn` every loop turn, `commit` for a hand-off, and `abort_all`
when partitions were lost or fenced. docs/exactly-once.md argues the invariant.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from weir._engine.client import ConsumerClient
from weir._engine.clock import SYSTEM, Clock
from weir._engine.commit_requests import CommitPath
from weir._engine.committing import Committer
from weir._engine.failures import Failures
from weir._engine.lifecycle import Lifecycle
from weir._engine.ownership import Ownership
from weir._engine.starts import Starts
from weir._engine.transactions import Outcome, Transactions
from weir.records import Partition

__all__ = ["ExactlyOnce"]


class ExactlyOnce:
    """Owner thread only."""

    def __init__(
        self,
        txn: Transactions,
        *,
        client: Callable[[], ConsumerClient],
        own: Ownership,
        commits: CommitPath,
        committer: Committer,
        starts: Starts,
        failures: Failures,
        life: Lifecycle,
        clock: Clock = SYSTEM,
    ) -> None:
        self._clock = clock
        self.txn = txn
        self._client = client
        self._own = own
        self._commits = commits
        self._committer = committer
        self._starts = starts
        self._failures = failures
        self._life = life

    def turn(self, now: float, flush: Callable[[], object]) -> bool:
        """A loop turn: recover a replaced producer, or end the transaction when a boundary is
        due: `flush` first (the handler's flush hook, `Flushing.flush`), so that the records it
        makes durable are marked finished, and their outputs written, into this transaction.
        True if a boundary was taken (the engine publishes its stats)."""
        if not self.txn.ready:
            self.txn.recover(now)  # a replaced producer: its partitions wait meanwhile
            return False
        if self.txn.due(now):
            flush()
            self.commit(())
            return True
        return False

    def abort_all(self) -> None:
        """Partitions were lost or fenced: the open transaction holds their outputs, whose
        offsets this member may no longer commit. It is aborted, and every partition still
        owned starts over from its committed offset."""
        self.txn.abort()
        self.rewind(list(self._own.partitions))

    def commit(self, handing_off: Iterable[Partition]) -> dict[Partition, int]:
        """Send the watermark of every owned partition (and its offset map) into the open
        transaction and commit it: the outputs written so far are exactly those of the
        records below these watermarks and in their maps. If it aborted, every owned partition
        but those `handing_off` starts over from its committed offset."""
        txn = self.txn
        if txn.fatal is not None and not self._life.should_run:
            return {}  # the member stops with it: nothing can be committed any more
        if not txn.ready:
            # The producer is being replaced: every owned partition was rewound then and waits
            # for its committed offset; nothing was marked finished since.
            return {}
        commits = self._commits
        commits.catch_up_positions()
        offsets = {tp: off for tp, off in commits.committable().items() if off is not None}
        _, metadata = commits.with_maps(offsets, dict(offsets))
        gone = set(handing_off)
        if (
            txn.empty
            and not gone
            and all(
                self._starts.committed.get(tp) == (off, metadata.get(tp) or None)
                for tp, off in offsets.items()
            )
        ):
            # Nothing finished and nothing moved since the last commit: no transaction (an
            # idle member would otherwise send its offsets and commit every interval). A
            # hand-off commits even so: an idle member writes nothing else, and this is how it
            # learns that a newer producer with its transactional id fenced it (that producer
            # fences before it joins the group, so its join is what started this hand-off).
            txn.opened_at = self._clock.monotonic()
            return {}
        outcome = txn.commit(offsets, metadata, self._client().consumer_group_metadata())
        if outcome is Outcome.COMMITTED:
            now = self._clock.monotonic()
            for tp, off in offsets.items():
                self._starts.committed[tp] = (off, metadata.get(tp) or None)
            commits.sent(offsets, metadata, now, sync=True)
            for tp, off in offsets.items():
                self._committer.result(tp, off, None, sync=True)
            return offsets
        staying = [tp for tp in self._own.partitions if tp not in gone]
        self.rewind(staying, reread=outcome is Outcome.UNKNOWN)
        return {}

    def rewind(self, tps: list[Partition], *, reread: bool = False) -> None:
        """After an aborted transaction: these partitions start over locally, and their
        records are dropped until the client is back at their committed offsets. The committed
        offset map comes back with the offset: the records it lists had their outputs
        committed, and must not run again. `reread`: the commit's fate is unknown (the
        producer was replaced during it), so the committed offsets are read from the broker
        again, once the new producer has resolved that transaction."""
        for a in self._own.reset(tps):
            self._starts.rewind(a.tp, reread=reread)
