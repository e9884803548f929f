"""`GroupConsumer`: the public face of a consumer-group member.

It validates the configuration, owns the lifecycle (run, start, stop, join, signals, context
manager) and publishes snapshots; the owner-thread loop itself lives in `weir.loop`.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

import structlog
from confluent_kafka import Consumer

from weir.committing import CommitEvent
from weir.config import ConsumerConfig
from weir.loop import Loop
from weir.metrics import EMPTY, ConsumerStats
from weir.records import Handler, Record, as_handler

__all__ = ["GroupConsumer"]

log = structlog.get_logger(__name__)

ConsumerFactory = Callable[[dict[str, Any]], Any]


class GroupConsumer:
    """A consumer-group member that processes records on worker threads and commits only
    offsets whose records, and every delivered record before them, are finished."""

    def __init__(
        self,
        handler: Handler | Callable[[Record], object],
        config: ConsumerConfig | None = None,
        *,
        consumer_factory: ConsumerFactory | None = None,
        **settings: Any,
    ) -> None:
        if config is None:
            config = ConsumerConfig(**settings)
        elif settings:
            raise TypeError("pass either a ConsumerConfig or keyword settings, not both")
        self.config = config
        self._handler = as_handler(handler)
        self._factory: ConsumerFactory = consumer_factory or Consumer
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._running = False
        self._commit_listeners: list[Callable[[CommitEvent], None]] = []
        self._stats: ConsumerStats = EMPTY

    # -- public API ------------------------------------------------------------------------

    def run(self, *, handle_signals: bool = True) -> None:
        """Run the member on this thread until `stop()`, a signal, or a failure (re-raised)."""
        if self._running:
            raise RuntimeError("this GroupConsumer is already running")
        self._running = True
        restore = self._install_signals() if handle_signals else None
        try:
            Loop(self).run()
        finally:
            if restore is not None:
                restore()
            self._running = False
        if self._failure is not None:
            raise self._failure

    def start(self) -> GroupConsumer:
        """Run the member on a background owner thread; pair with `stop()` and `join()`."""
        if self._thread is not None:
            raise RuntimeError("this GroupConsumer was already started")

        def target() -> None:
            try:
                self.run(handle_signals=False)
            except BaseException as exc:
                if self._failure is None:
                    self._failure = exc

        self._thread = threading.Thread(target=target, name="weir-owner", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the member to shut down: safe from any thread or a signal handler."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        """Wait for a `start()`ed member to finish; re-raises its failure."""
        if self._thread is None:
            raise RuntimeError("join() needs start()")
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"GroupConsumer did not stop within {timeout}s")
        if self._failure is not None:
            raise self._failure

    def wait_started(self, timeout: float | None = None) -> bool:
        """True once the member has subscribed (or has failed trying)."""
        return self._started.wait(timeout)

    def stats(self) -> ConsumerStats:
        """The latest snapshot published by the owner thread (about once per commit interval)."""
        return self._stats

    def add_commit_listener(self, listener: Callable[[CommitEvent], None]) -> None:
        """Called on the owner thread with every per-partition commit result."""
        self._commit_listeners.append(listener)

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def __enter__(self) -> GroupConsumer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if self._thread is not None:
            self._thread.join()
        if exc is None and self._failure is not None:
            raise self._failure

    def __repr__(self) -> str:
        c = self.config
        return (
            f"GroupConsumer(group_id={c.group_id!r}, topics={c.topics!r}, ordering={c.ordering!r})"
        )

    def _install_signals(self) -> Callable[[], None] | None:
        if threading.current_thread() is not threading.main_thread():
            return None

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("signal_received", signal=signal.Signals(signum).name)
            self.stop()

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

        def restore() -> None:
            for s, h in old.items():
                signal.signal(s, h)

        return restore
