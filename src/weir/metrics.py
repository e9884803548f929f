"""Read-only snapshots of the engine's state, published by the owner thread.

A snapshot is built on the owner thread and swapped in whole, so other threads read a consistent
object without touching engine state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from weir.records import Partition

__all__ = ["ConsumerStats", "PartitionStats"]


@dataclass(frozen=True, slots=True)
class PartitionStats:
    tp: Partition
    token: int
    in_flight: int
    in_flight_bytes: int
    committable: int | None
    committed: int | None
    """Last offset the broker confirmed for this assignment (None before the first commit)."""
    paused: bool
    read_ahead: int = 0
    """Records read ahead of the partition's share of the budget (flow-control.md): registered,
    so the watermark waits for them, but not yet in the lanes."""


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    at: float
    """time.monotonic() when the owner thread built this snapshot."""
    running: bool
    processed: int
    failed: int
    in_flight: int
    in_flight_bytes: int
    peak_in_flight: int
    peak_in_flight_bytes: int
    paused: bool
    pauses: int
    rebalances: int
    partitions: tuple[PartitionStats, ...] = field(default=())
    read_ahead: int = 0
    """Records read ahead of their partitions' shares, not counted in `in_flight`."""
    read_ahead_bytes: int = 0
    """Their bytes: `in_flight_bytes` leaves them out, the byte budget counts them."""

    @property
    def paused_partitions(self) -> tuple[Partition, ...]:
        return tuple(p.tp for p in self.partitions if p.paused)


EMPTY = ConsumerStats(
    at=0.0,
    running=False,
    processed=0,
    failed=0,
    in_flight=0,
    in_flight_bytes=0,
    peak_in_flight=0,
    peak_in_flight_bytes=0,
    paused=False,
    pauses=0,
    rebalances=0,
)
