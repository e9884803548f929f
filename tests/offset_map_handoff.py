"""The offset map's hand-off without an engine: what the next owner of a partition would skip."""

from __future__ import annotations

from weir._engine.replay import ReplayMaps
from weir._engine.tracking import PartitionProgress
from weir.offsetmap import DEFAULT_MAX_BYTES, NoMap, decode_finished
from weir.records import Partition

TP = Partition("t", 0)


def skipped_by_next_owner(progress: PartitionProgress) -> set[int]:
    """The offsets the next owner would not handle again: the map the engine commits with the
    committable offset (`ReplayMaps.metadata`), read back as the next owner reads it."""
    offset = progress.committable()
    assert offset is not None, "no committable offset: nothing was delivered"
    text = ReplayMaps(enabled=True, max_bytes=DEFAULT_MAX_BYTES).metadata(TP, progress, offset)
    found = decode_finished(text, offset)
    if isinstance(found, NoMap):
        assert found.cause == "empty", found
        return set()
    return {off for start, stop in found.ranges() for off in range(start, stop)}
