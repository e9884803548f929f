"""In-flight budget by count and bytes, with pause/resume hysteresis.

Two levels. At the high mark fetching is *throttled*: each poll takes at most one record, and the
client keeps its prefetched data. Only at the capacity are the partitions *paused* in the client,
because librdkafka's pause throws its prefetch away and a resume has to fetch it again: pausing at
every high mark made a budgeted drain several times slower. Both lift together once the counts are
below their low marks. All partitions switch together: one switch with a wide gap flaps least.
"""

from __future__ import annotations

from typing import Literal

from weir.config import FlowConfig

__all__ = ["FlowControl"]


class FlowControl:
    __slots__ = (
        "_cfg",
        "_max_batch",
        "bytes",
        "client_paused",
        "paused",
        "pauses",
        "peak_bytes",
        "peak_records",
        "records",
    )

    def __init__(self, cfg: FlowConfig, max_batch: int) -> None:
        self._cfg = cfg
        self._max_batch = max_batch
        self.records = 0
        self.bytes = 0
        self.paused = False
        self.client_paused = False
        self.pauses = 0
        self.peak_records = 0
        self.peak_bytes = 0

    def add(self, records: int, nbytes: int) -> None:
        self.records += records
        self.bytes += nbytes
        if self.records > self.peak_records:
            self.peak_records = self.records
        if self.bytes > self.peak_bytes:
            self.peak_bytes = self.bytes

    def remove(self, records: int, nbytes: int) -> None:
        self.records -= records
        self.bytes -= nbytes

    def fetch_size(self) -> int:
        """How many records one consume call may return without passing the capacity."""
        return max(1, min(self._max_batch, self._cfg.capacity_records - self.records))

    @property
    def full(self) -> bool:
        """No headroom left: the client must stop handing out records (a real pause)."""
        cfg = self._cfg
        return self.records >= cfg.capacity_records or self.bytes >= cfg.capacity_bytes

    def filling(self, shared: bool = False) -> bool:
        """At or past a resume mark: the budget is in use, not idle (while throttled, this is
        what keeps the throttle on)."""
        cfg = self._cfg
        mark = cfg.pause_records if shared else cfg.resume_records
        return self.records >= mark or self.bytes >= cfg.resume_bytes

    def update(self, shared: bool = False) -> Literal["pause", "resume"] | None:
        """`shared`: partitions hold shares of the record budget with their own pause and
        resume marks (flow-control.md: partition mode, or key mode with few keys). The count
        marks then move up to the capacity (throttle) and the pause mark (resume): a throttle
        at the usual marks would stop every partition until the total fell to the resume mark,
        while the shares already bound it."""
        cfg = self._cfg
        if not self.paused:
            mark = cfg.capacity_records if shared else cfg.pause_records
            if self.records >= mark or self.bytes >= cfg.pause_bytes:
                self.paused = True
                self.pauses += 1
                return "pause"
        elif not self.filling(shared):
            self.paused = False
            return "resume"
        return None
