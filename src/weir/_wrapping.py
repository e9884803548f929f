"""A handler around the application's handler (deserializers, tracing): the lifecycle hooks
and the flush hook are the application's, passed on unchanged."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from weir.records import FlushContext, Handler

__all__ = ["Wrapper", "await_hook", "await_plain", "call_plain"]


def call_plain(method: Callable[..., object], *args: object, hook: bool = False) -> None:
    """The wrapped handler's plain method: the workers see only the wrapper's return, so an
    awaitable it returned (its work never done) is refused here (`_refuse_awaitable`).
    `hook`: a lifecycle or flush hook, run on the owner thread."""
    result = method(*args)
    if result is not None:
        from weir._engine.workers import _refuse_awaitable

        _refuse_awaitable(method, result, hook=hook)


async def await_plain(method: Callable[..., Any], *args: object) -> None:
    """The wrapped handler's `async def` method, awaited: what its coroutine returned is
    refused if it is itself an awaitable (`return save(record)`, the await left out)."""
    result = await method(*args)
    if result is not None:
        from weir._engine.workers import _refuse_awaitable

        _refuse_awaitable(method, result, awaited=True)


async def await_hook(hook: Callable[..., object], *args: object) -> None:
    """A route's hook, from the async router's own hook on the member's loop: awaited if it
    returned an awaitable (an `async def` hook, or a plain one handing back a coroutine), and
    refused if what that gave back is itself one: a flush that never ran would let the commit
    pass the records still in its buffer."""
    result = hook(*args)
    if inspect.isawaitable(result):
        result = await result
    if result is not None:
        from weir._engine.workers import _refuse_awaitable

        _refuse_awaitable(hook, result, awaited=True)


class Wrapper(Handler):
    """Passes the application's hooks on; subclasses define `handle` (or `handle_batch`)."""

    def __init__(self, inner: Handler) -> None:
        self.inner = inner
        # The application's own bound hooks, not methods that call them: an `async def` hook
        # must still look like one, or the owner would call it and drop the coroutine unrun.
        self.on_assigned = inner.on_assigned  # type: ignore[method-assign]
        self.on_revoked = inner.on_revoked  # type: ignore[method-assign]
        self.on_lost = inner.on_lost  # type: ignore[method-assign]
        self.on_shutdown = inner.on_shutdown  # type: ignore[method-assign]

    def _flush_hook(self) -> Callable[[FlushContext], Awaitable[None] | None] | None:
        return self.inner._flush_hook()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"
