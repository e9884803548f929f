"""Waiting in tests: poll a condition until it holds, or fail naming what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    pred: Callable[[], T], what: str, timeout: float = 5.0, *, every: float = 0.002
) -> T:
    """Call ``pred`` every ``every`` seconds until it returns something true, and return that;
    after ``timeout`` seconds raise AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)
