"""The engine's clock: the system's by default, a manual one in tests (`weir.testing.ManualClock`).

Every timing decision of the owner thread (commit intervals, retry backoffs, revoke and shutdown
budgets, when a long task reports, transaction boundaries) reads the clock it was given, so a
test can drive those decisions step by step and replay them exactly. Waits on other threads (a
worker's handler, a client call under `weir._engine.bounded`) stay on real time: they are real
waits.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["SYSTEM", "Clock", "SystemClock"]


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds, for intervals and deadlines (`time.monotonic`)."""
        ...

    def perf_counter(self) -> float:
        """Seconds, finer, for how long a task has run (`time.perf_counter`: workers stamp a
        task's start with the same clock)."""
        ...


class SystemClock:
    """The system's clocks."""

    monotonic = staticmethod(time.monotonic)
    perf_counter = staticmethod(time.perf_counter)


SYSTEM: Clock = SystemClock()
