"""A client's blocking request asked in short slices: Python runs a signal handler only when a C
call returns, so a wait of many seconds is cut into requests of `SLICE_S`, and a Ctrl-C or a
stop request lands between them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["SLICE_S", "in_slices"]

SLICE_S = 0.25

T = TypeVar("T")


def in_slices(
    ask: Callable[[float], T], timeout: float, stopped: Callable[[], bool] = lambda: False
) -> T:
    """`ask(wait)` again, each `wait` at most `SLICE_S`, until it answers. Its last
    `KafkaException` is raised once `timeout` has passed, `stopped()` says so, or a request
    failed in less than half its time: refused, not unanswered, and asking again changes
    nothing."""
    from confluent_kafka import KafkaException  # the `weir` command imports it only when used

    deadline = time.monotonic() + timeout
    while True:
        began = time.monotonic()
        wait = max(min(SLICE_S, deadline - began), 0.001)
        try:
            return ask(wait)
        except KafkaException:
            now = time.monotonic()
            if stopped() or now >= deadline or now - began < wait / 2:
                raise
