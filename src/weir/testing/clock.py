"""A clock that moves only when a test says so, for the engine's timing decisions."""

from __future__ import annotations

__all__ = ["ManualClock"]


class ManualClock:
    """`weir._engine.clock.Clock` for tests: the time is `now`, which `advance` moves, and every
    reading adds `tick` (a small tick lets every wait the engine loops on end, and a run is the same
    every time it is replayed)."""

    def __init__(self, start: float = 1000.0, *, tick: float = 0.0) -> None:
        self.start = self.now = start
        self.tick = tick

    def monotonic(self) -> float:
        """`time.monotonic`: `now`, after adding `tick` to it."""
        self.now += self.tick
        return self.now

    def perf_counter(self) -> float:
        """`time.perf_counter`: the same clock as `monotonic`."""
        return self.monotonic()

    def advance(self, seconds: float) -> None:
        """Move `now` forward; a ValueError for a negative step."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back: advance({seconds})")
        self.now += seconds

    def reset(self) -> None:
        """Back to the time it started at."""
        self.now = self.start
