"""Client calls under a deadline weir enforces itself.

A librdkafka call that takes a timeout does not always keep to it: a transactional producer's
`send_offsets_to_transaction` or `commit_transaction` can wait on a condition variable with no
deadline while its coordinator comes back (seen on a broker restart, upstream librdkafka issues
5456 and 5511), and the owner thread that made the call would never return: no poll, no stats,
no stop. Such a call runs on a thread of its own here, and the caller waits for it at most until
its deadline; past it the call is abandoned: it goes on with the client it holds, which the
caller must never use again (it builds a new one).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["CallAbandoned", "call_within"]

T = TypeVar("T")

# How often a wait looks at the interrupt event (a second stop request).
_SLICE = 0.1


class CallAbandoned(Exception):
    """A client call did not return by weir's deadline (or the wait was interrupted): it was
    left running on its own thread, and its client must not be used again."""

    def __init__(self, step: str, waited_s: float, *, interrupted: bool = False) -> None:
        why = "interrupted by a second stop request" if interrupted else "past its deadline"
        super().__init__(f"{step} did not return within {waited_s:.1f} s ({why})")
        self.step = step
        self.waited_s = waited_s
        self.interrupted = interrupted


class _Call(Generic[T]):
    __slots__ = ("done", "error", "fn", "result")

    def __init__(self, fn: Callable[[], T]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # handed to the caller, whatever it is
            self.error = exc
        finally:
            self.done.set()


def call_within(
    fn: Callable[[], T],
    limit_s: float,
    step: str,
    *,
    interrupt: threading.Event | None = None,
) -> T:
    """`fn()` on a thread of its own; its result, or what it raised, if it returns within
    `limit_s`. Otherwise (or once `interrupt` is set) raises `CallAbandoned`, and `fn` goes on
    alone on its daemon thread."""
    call = _Call(fn)
    thread = threading.Thread(target=call.run, name=f"weir-call-{step}", daemon=True)
    started = time.monotonic()
    deadline = started + max(0.0, limit_s)
    thread.start()
    while True:
        remaining = deadline - time.monotonic()
        if call.done.wait(max(0.0, min(_SLICE, remaining))):
            break
        if interrupt is not None and interrupt.is_set():
            raise CallAbandoned(step, time.monotonic() - started, interrupted=True)
        if remaining <= 0:
            raise CallAbandoned(step, time.monotonic() - started)
    if call.error is not None:
        raise call.error
    return call.result  # type: ignore[return-value]
