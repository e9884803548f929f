"""Which delivered offsets are finished, per polled batch and per partition.

The committable offset of a partition is the earliest delivered offset that is not finished, or,
when everything delivered is finished, the read position after the newest batch. Only offsets that
were actually delivered are tracked, so gaps left by compaction or transaction markers never block.
"""

from __future__ import annotations

import itertools
import operator
from collections import deque
from collections.abc import Hashable, Sequence

__all__ = ["BatchProgress", "PartitionProgress"]


def _increasing(offsets: Sequence[int]) -> bool:
    """Strictly increasing, checked at C level."""
    return all(map(operator.lt, offsets, itertools.islice(offsets, 1, None)))


class BatchProgress:
    """Completion state of one polled batch of one partition."""

    __slots__ = (
        "_base",
        "_cursor",
        "_done",
        "_index",
        "_next_position",
        "_offsets",
        "_revoked",
        "_token",
    )

    def __init__(self, offsets: Sequence[int], next_position: int, token: Hashable) -> None:
        offs = tuple(offsets)
        if not _increasing(offs):
            for prev, cur in itertools.pairwise(offs):
                if cur <= prev:
                    raise ValueError(f"offsets must be strictly increasing: {prev} then {cur}")
        if offs and offs[0] < 0:
            raise ValueError(f"offsets must be >= 0, got {offs[0]}")
        if next_position < 0:
            raise ValueError(f"next_position must be >= 0, got {next_position}")
        if offs and next_position <= offs[-1]:
            raise ValueError(
                f"next_position {next_position} must be greater than the last offset {offs[-1]}"
            )
        self._offsets = offs
        # Most batches have no gaps: an offset's index is then plain arithmetic, and the dict
        # (one entry per record) is built only for batches with gaps.
        self._base = offs[0] if offs else 0
        self._index: dict[int, int] | None = (
            None
            if not offs or offs[-1] - offs[0] == len(offs) - 1
            else {off: i for i, off in enumerate(offs)}
        )
        self._done = bytearray(len(offs))
        # Index of the first unfinished offset; only moves forward, which keeps complete +
        # committable O(1) amortised per record.
        self._cursor = 0
        self._next_position = next_position
        self._token = token
        self._revoked = False

    @property
    def token(self) -> Hashable:
        """What a completion must carry to count: the (assignment epoch, batch number) it was
        delivered under, so that a late one from an earlier assignment is ignored."""
        return self._token

    @property
    def offsets(self) -> tuple[int, ...]:
        """The offsets delivered in the batch, increasing; gaps are offsets never delivered."""
        return self._offsets

    @property
    def next_position(self) -> int:
        """The read position after the batch: what commits once every offset is finished."""
        return self._next_position

    @property
    def revoked(self) -> bool:
        """Whether the partition was revoked since: completions are then ignored."""
        return self._revoked

    @property
    def all_done(self) -> bool:
        """Whether every delivered offset is finished (True for an empty batch)."""
        return self._cursor == len(self._offsets)

    @property
    def pending(self) -> int:
        """Delivered offsets not finished yet (0 once revoked)."""
        if self._revoked:
            return 0
        return len(self._offsets) - self._cursor - sum(self._done[self._cursor :])

    def completed(self, offset: int, token: Hashable) -> bool:
        """Mark `offset` finished; False, and nothing marked, for a stale `token` or a revoked
        batch. A ValueError for an offset the batch did not deliver."""
        # A stale token or a revoked batch is checked first: late callbacks for an old assignment
        # must be ignored quietly, whatever offset they carry.
        if self._revoked or token != self._token:
            return False
        index = self._index
        done = self._done
        if index is None:
            i = offset - self._base
            if i < 0 or i >= len(done):
                raise ValueError(f"offset {offset} was not delivered in this batch")
        else:
            found = index.get(offset)
            if found is None:
                raise ValueError(f"offset {offset} was not delivered in this batch")
            i = found
        if not done[i]:
            done[i] = 1
            self._advance()
        return True

    def completed_many(self, offsets: Sequence[int], token: Hashable) -> int:
        """`completed` for several offsets at once: 0 if stale or revoked, else how many were
        accepted (all of them). Every offset is checked before any is marked."""
        if self._revoked or token != self._token or not offsets:
            return 0
        done = self._done
        index = self._index
        if index is None:
            base = self._base
            n = len(offsets)
            low, high = offsets[0] - base, offsets[-1] - base
            if high - low == n - 1 and low >= 0 and high < len(done) and _increasing(offsets):
                # A slice of the batch in offset order (what a task holds): one C-level fill.
                done[low : high + 1] = b"\x01" * n
            else:
                low, high = min(offsets) - base, max(offsets) - base
                if low < 0 or high >= len(done):
                    bad = next(o for o in offsets if not 0 <= o - base < len(done))
                    raise ValueError(f"offset {bad} was not delivered in this batch")
                for off in offsets:
                    done[off - base] = 1
        else:
            positions = [index.get(off) for off in offsets]
            if None in positions:
                bad = offsets[positions.index(None)]
                raise ValueError(f"offset {bad} was not delivered in this batch")
            for i in positions:
                done[i] = 1  # type: ignore[index]
        self._advance()
        return len(offsets)

    def _advance(self) -> None:
        # The first unfinished offset, found by a C-level byte search from the old cursor.
        i = self._done.find(0, self._cursor)
        self._cursor = len(self._done) if i < 0 else i

    def committable(self) -> int | None:
        """The earliest unfinished offset, or `next_position` once all are finished; None once
        revoked."""
        if self._revoked:
            return None
        if self._cursor == len(self._offsets):
            return self._next_position
        return self._offsets[self._cursor]

    def revoke(self) -> None:
        """The partition is gone: later completions are ignored and nothing is committable."""
        self._revoked = True

    def flags_from(self, base: int) -> bytes | bytearray:
        """One byte per offset from `base` to `next_position`: 1 finished or never delivered
        (a gap), 0 not finished. C-level for a batch without gaps."""
        if base >= self._next_position:
            return b""
        offs = self._offsets
        if not offs:
            # An empty batch: the read position moved past offsets never delivered
            # (transaction markers), from `base` (where the batch before ended) on.
            return b"\x01" * (self._next_position - base)
        if self._index is None:
            # Gapless: offsets [base0, next_position) map onto the done flags directly; the
            # position may run past the last offset (markers after it count as gaps).
            start = max(0, base - self._base)
            tail = self._next_position - (self._base + len(offs))
            head = max(0, self._base - base)
            return b"\x01" * head + self._done[start:] + b"\x01" * tail
        flags = bytearray(b"\x01") * (self._next_position - base)
        done = self._done
        for i, off in enumerate(offs):
            if off >= base and not done[i]:
                flags[off - base] = 0
        return flags

    def __repr__(self) -> str:
        first = self._offsets[0] if self._offsets else None
        return (
            f"BatchProgress(first={first}, count={len(self._offsets)}, "
            f"next_position={self._next_position}, committable={self.committable()}, "
            f"revoked={self._revoked})"
        )


class PartitionProgress:
    """The queue of batches of one partition in read order: a new poll never overwrites an old one.

    Fully finished batches are dropped from the head; the newest finished position is kept, so the
    committable offset survives an empty queue.
    """

    __slots__ = ("_batches", "_finished_position", "_revoked", "_seq", "epoch")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self._batches: deque[BatchProgress] = deque()
        self._finished_position: int | None = None
        self._seq = 0
        self._revoked = False

    def add_batch(self, offsets: Sequence[int], next_position: int) -> BatchProgress:
        """Queue a newly delivered batch behind the others and return its progress. A
        ValueError for a batch that starts behind the read position (a rewind takes a new
        assignment epoch), a RuntimeError once revoked."""
        if self._revoked:
            raise RuntimeError("partition progress was revoked")
        floor = self.read_position
        start = offsets[0] if offsets else next_position
        if floor is not None and start < floor:
            # A rewind (seek, or a re-fetch after an error) inside one assignment would make the
            # watermark go backwards; the caller must start a new assignment epoch instead.
            raise ValueError(f"batch starts at {start}, behind the read position {floor}")
        self._seq += 1
        batch = BatchProgress(offsets, next_position, (self.epoch, self._seq))
        self._batches.append(batch)
        return batch

    @property
    def read_position(self) -> int | None:
        """Where the next batch is expected to start (None before the first batch)."""
        if self._batches:
            return self._batches[-1].next_position
        return self._finished_position

    def advance_to(self, position: int) -> bool:
        """The client's read position moved past offsets it never delivered (transaction markers
        at the end of the log): record that as an empty batch so the watermark can reach it."""
        floor = self.read_position
        if self._revoked or floor is None or position <= floor:
            return False
        self.add_batch((), position)
        return True

    def committable(self) -> int | None:
        """The watermark: the earliest unfinished delivered offset of the oldest batch not
        finished, else the read position after the newest finished one; None once revoked or
        before the first batch."""
        if self._revoked:
            return None
        batches = self._batches
        while batches and batches[0].all_done:
            self._finished_position = batches.popleft().next_position
        if batches:
            return batches[0].committable()
        return self._finished_position

    @property
    def pending(self) -> int:
        """Delivered offsets not finished yet, in every batch queued."""
        return sum(b.pending for b in self._batches)

    def finished_flags(self) -> tuple[int, bytes | bytearray] | None:
        """The committable offset and the finished state of every offset from it to the read
        position (`BatchProgress.flags_from`): what an offset map encodes. None when revoked or
        before the first batch."""
        base = self.committable()
        if base is None:
            return None
        parts = []
        pos = base
        for b in self._batches:  # each from where the one before ended
            parts.append(b.flags_from(pos))
            pos = max(pos, b.next_position)
        return base, b"".join(parts)

    def mark_finished(self, batch: BatchProgress, offsets: Sequence[int]) -> int:
        """Offsets of `batch` an earlier owner finished (the committed offset map): finished
        now, without running."""
        return batch.completed_many(offsets, batch.token) if offsets else 0

    @property
    def batches(self) -> int:
        """The batches queued: delivered and not yet all finished (the oldest may be, until
        `committable` drops it)."""
        return len(self._batches)

    @property
    def revoked(self) -> bool:
        """Whether the partition was revoked: its progress is then over."""
        return self._revoked

    def revoke(self) -> None:
        """The partition is gone: every batch is revoked and dropped, nothing is committable."""
        self._revoked = True
        for b in self._batches:
            b.revoke()
        self._batches.clear()
