"""Running user callbacks (commit listeners, handler hooks) so they cannot break the member.

A callback that raises is isolated: the commit path, the rebalance hand-off and the shutdown go
on as if it had returned. Its first failure is logged with the callback's name and traceback,
later ones are counted (and logged again at 10, 100, 1000, … failures); the count is in stats.
With `callback_errors="stop"` a failure also stops the member — through the normal stop path,
which still drains, commits and closes. A `BaseException` that is not an `Exception`
(KeyboardInterrupt, SystemExit) always stops the member, the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from weir.errors import CallbackError
from weir.logs import get_logger

__all__ = ["Callbacks", "callback_name"]

log = get_logger(__name__)

CallbackPolicy = Literal["log", "stop"]


def callback_name(fn: object) -> str:
    """`module.qualname` of a function or bound method, else the type's name."""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module else str(name)


class Callbacks:
    """Owner thread only."""

    def __init__(self, policy: CallbackPolicy, fail: Callable[[BaseException], object]) -> None:
        self._policy = policy
        self._fail = fail
        self._counts: dict[str, int] = {}
        self.failures = 0

    def call(self, name: str, fn: Callable[..., object], *args: Any, **fields: Any) -> bool:
        """Run `fn(*args)`; False if it raised (logged, counted). `fields` go into the log."""
        try:
            fn(*args)
        except BaseException as exc:
            self._failed(name, exc, fields)
            return False
        return True

    def _failed(self, name: str, exc: BaseException, fields: dict[str, Any]) -> None:
        self.failures += 1
        n = self._counts[name] = self._counts.get(name, 0) + 1
        fatal = self._policy == "stop" or not isinstance(exc, Exception)
        if n == 1:
            log.error(
                "callback_failed",
                callback=name,
                error=repr(exc),
                stops_member=fatal,
                exc_info=exc,
                **fields,
            )
        elif _power_of_ten(n):
            log.warning("callback_failed_again", callback=name, failures=n, error=repr(exc))
        if fatal:
            self._fail(CallbackError(name, exc))


def _power_of_ten(n: int) -> bool:
    while n >= 10 and n % 10 == 0:
        n //= 10
    return n == 1
