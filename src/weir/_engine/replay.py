"""No replay of finished work: the offset map in commit metadata, written and read back.

Every commit carries, per partition, which offsets above the committed one are already finished
(`weir.offsetmap`, at most `offset_map_max_bytes`; a map that does not fit is cut, never the
commit). A new owner reads the committed offsets with their metadata in the assignment path and
marks the offsets the map lists finished before dispatch: their records are not handed to a
handler again, while the watermark, the budget and the commits move exactly as if they had been
handled. A map that does not match (another committer, another base, another version, garbage)
is ignored with a warning: replay is always safe. docs/offset-map.md has the format.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from weir._engine.tasks import Assignment
from weir._engine.tracking import PartitionProgress
from weir.logs import get_logger
from weir.offsetmap import Encoded, FinishedMap, NoMap, decode_finished, encode_finished
from weir.records import Partition, Record

__all__ = ["ReplayMaps"]

log = get_logger(__name__)

_MIN_BYTES = 64


class ReplayMaps:
    """Owner thread only."""

    def __init__(self, enabled: bool, max_bytes: int) -> None:
        self.enabled = enabled
        self._max_bytes = max_bytes
        self._sent: dict[Partition, tuple[int, str]] = {}  # last (offset, metadata) sent
        self._restored: dict[Partition, FinishedMap] = {}  # read at assignment, still ahead
        # The last map encoded, when it was cut, and how many offsets it was cut from.
        self._cut: dict[Partition, tuple[Encoded, int]] = {}
        self.truncations = 0  # commits sent with a cut map
        self.skipped = 0  # records not handled again thanks to a restored map
        self.sizes: dict[Partition, int] = {}  # bytes of the map sent with the last commit

    # -- writing -------------------------------------------------------------------------

    def metadata(self, tp: Partition, progress: PartitionProgress, offset: int) -> str:
        """The map to send with `offset` (the partition's committable offset), "" for none."""
        if not self.enabled:
            return ""
        got = progress.finished_flags()
        ahead = self._restored.get(tp)
        flags: bytes | bytearray
        if got is None:
            # Nothing read in this assignment yet: the restored map still says it all.
            if ahead is None or ahead.base != offset:
                return ""
            base, flags = offset, ahead.flags
        else:
            base, flags = got
            if base != offset:
                return ""
            read_end = base + len(flags)
            if ahead is not None and ahead.base <= read_end < ahead.end:
                # Offsets the map restored at assignment lists finished, above what this
                # owner has read: a map without them would hand them to the next owner again.
                flags = bytes(flags) + ahead.flags[read_end - ahead.base :]
        if 1 not in flags:
            return ""
        enc = encode_finished(base, flags, self._max_bytes)
        if enc.truncated:
            self._cut[tp] = (enc, len(flags))
        else:
            self._cut.pop(tp, None)
        return enc.text

    def changed(self, tp: Partition, offset: int, metadata: str) -> bool:
        """Whether `metadata` says more than what was last sent with the same offset: the
        offset did not move, yet records above it finished."""
        return self._sent.get(tp) != (offset, metadata)

    def sent(self, tp: Partition, offset: int, metadata: str) -> None:
        """`metadata` went out with `offset`: counted (size, cut) here, not when encoded, as
        a map that did not change is not sent again."""
        self._sent[tp] = (offset, metadata)
        self.sizes[tp] = len(metadata) + 1 if metadata else 0
        cut = self._cut.get(tp)
        if cut is not None and metadata and cut[0].text == metadata:
            self.truncations += 1
            log.info(
                "offset_map_truncated",
                tp=str(tp),
                offset=offset,
                covered=cut[0].covered,
                flags=cut[1],
                max_bytes=self._max_bytes,
            )

    def too_large(self, tps: Sequence[Partition], largest: int) -> None:
        """The broker refused a commit request whose largest map was `largest` bytes
        (OFFSET_METADATA_TOO_LARGE: its offset.metadata.max.bytes is smaller; the client
        reports it for every partition of the request, `tps`). Maps from now on take at most
        half that, or none below 64 bytes. A refusal of a map already above the limit says
        nothing new (another request sent before the limit came down): the limit stays. One
        call per request: halving per partition would turn maps off after one request of a
        few partitions."""
        if not self.enabled or largest > self._max_bytes:
            return
        if largest // 2 >= _MIN_BYTES:
            self._max_bytes = largest // 2
        else:
            self.enabled = False
        log.warning(
            "offset_map_too_large",
            partitions=sorted(str(tp) for tp in tps),
            refused_bytes=largest,
            max_bytes=self._max_bytes,
            enabled=self.enabled,
            reason="the broker's offset.metadata.max.bytes is smaller: set offset_map_max_bytes",
        )

    def opened(self, a: Assignment) -> None:
        pass  # restored from its committed offset map once that is read (`restore`)

    def closed(self, a: Assignment) -> None:
        self.forget([a.tp])

    def forget(self, tps: Sequence[Partition]) -> None:
        for tp in tps:
            self._sent.pop(tp, None)
            self._restored.pop(tp, None)
            self._cut.pop(tp, None)
            self.sizes.pop(tp, None)

    # -- reading -------------------------------------------------------------------------

    @property
    def restoring(self) -> bool:
        """Some partition still has a restored map ahead of its read position."""
        return bool(self._restored)

    def restore(self, committed: Mapping[Partition, tuple[int, str | None]]) -> None:
        """Committed offsets and metadata of newly assigned partitions."""
        for tp, (offset, metadata) in committed.items():
            if offset < 0:
                continue  # nothing committed: nothing to skip
            found = decode_finished(metadata, offset)
            if isinstance(found, NoMap):
                if found.cause != "empty":
                    log.warning(
                        "offset_map_ignored", tp=str(tp), offset=offset, reason=found.reason
                    )
                continue
            if found.count:
                self._restored[tp] = found
                self._sent[tp] = (offset, metadata or "")
                log.info(
                    "offset_map_restored",
                    tp=str(tp),
                    offset=offset,
                    finished=found.count,
                    covered=found.covered,
                )

    def finished_before(self, tp: Partition, records: Sequence[Record]) -> list[int]:
        """Offsets among these records (of one batch, increasing) that the restored map marks
        finished: they are not handled again."""
        fm = self._restored.get(tp)
        if fm is None or not records:
            return []
        if records[0].offset >= fm.end:
            del self._restored[tp]  # read past the map: it says nothing more
            return []
        done = [r.offset for r in records if fm.is_finished(r.offset)]
        self.skipped += len(done)
        return done
