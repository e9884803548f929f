"""The seam between the public `GroupConsumer` and its engine: one object both sides hold.

`GroupConsumer` (any thread: the application's, a signal handler) asks to stop, reads the state,
the failure, the latest stats and what health checks need, and adds commit listeners. The engine
(the owner thread) moves the state, records the first failure, publishes stats, notes its polls
and a broker outage, and emits commit events. Nothing else crosses between them.
"""

from __future__ import annotations

import contextlib
import enum
import queue
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from weir._engine.refusals import Denied
from weir.records import CommitEvent
from weir.stats import EMPTY, ConsumerStats

__all__ = ["CommitListener", "Lifecycle", "State"]

CommitListener = Callable[[CommitEvent], None]
Request = tuple[str, tuple[Any, ...], "Future[Any]"]

# While every broker is reported down, the owner asks for metadata this often to learn that one
# answers again (librdkafka reports the outage, never its end).
BROKER_PROBE_EVERY_S = 1.0


class State(enum.Enum):
    """Where a member is in its one run."""

    NEW = "new"  # built, not run yet
    STARTING = "starting"  # connecting and subscribing
    RUNNING = "running"  # polling and dispatching
    STOPPING = "stopping"  # draining, committing, leaving the group
    STOPPED = "stopped"  # ended after a stop request
    FAILED = "failed"  # ended with a failure (`failure`)


class Lifecycle:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = State.NEW
        self._failure: BaseException | None = None
        self._listeners: tuple[CommitListener, ...] = ()
        self.stop_requested = threading.Event()
        # A second stop request while stopping: skip the rest of the drain, commit what is
        # finished and close.
        self.hurry = threading.Event()
        self.started = threading.Event()  # subscribed, or failed before that
        self.ended = threading.Event()
        self._on_end: list[Callable[[], object]] = []
        self.stats: ConsumerStats = EMPTY
        # Written by the owner thread, read by health checks: when it last called the client
        # (time.monotonic(); None before it first did), and whether it holds an assignment from
        # the group (received, not lost since).
        self.polled_at: float | None = None
        self.joined = False
        # Whether it ever received an assignment: a refusal by the broker's ACLs before that is
        # the member's start failing, after it one the member lives with until it ends.
        self.ever_joined = False
        # ACL refusals the running member lives with, since when (time.monotonic()): replaced
        # whole by the owner thread, read by health checks.
        self.refusals: Mapping[Denied, float] = {}
        # ... and since when the client has reported every broker down with none answering since
        # (time.monotonic(); None while a broker answers).
        self.brokers_down_since: float | None = None
        self._next_broker_probe = 0.0
        self._requests: queue.SimpleQueue[Request] = queue.SimpleQueue()

    # -- any thread ----------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    @property
    def listeners(self) -> tuple[CommitListener, ...]:
        return self._listeners

    def begin(self) -> None:
        """Claim the one run of this member; a second run is a clear error, not a no-op."""
        with self._lock:
            if self._state is not State.NEW:
                raise RuntimeError(
                    f"this GroupConsumer has already run (state: {self._state.value}); a "
                    "member runs once: build a new GroupConsumer to consume again"
                )
            self._state = State.STARTING

    def request_stop(self) -> None:
        """Safe from any thread and from a signal handler. The second request hurries."""
        if self.stop_requested.is_set():
            self.hurry.set()
        self.stop_requested.set()

    def request(self, kind: str, *args: Any) -> Future[Any]:
        """An operator's request for the owner thread (`retry_now`, `skip`, `seek`): served
        within one turn of its loop (`weir._engine.requests`)."""
        future: Future[Any] = Future()
        if self._state not in (State.STARTING, State.RUNNING):
            raise RuntimeError(f"the member is not running (state: {self._state.value})")
        self._requests.put((kind, args, future))
        return future

    def on_end(self, callback: Callable[[], object]) -> None:
        """Call `callback` (from the owner thread, or now if already ended) once the run ended;
        what it raises is ignored. For waiters on an event loop (`GroupConsumer.run_async`)."""
        with self._lock:
            if not self.ended.is_set():
                self._on_end.append(callback)
                return
        _quietly(callback)

    def add_listener(self, listener: CommitListener) -> None:
        with self._lock:
            self._listeners = (*self._listeners, listener)

    # -- owner thread --------------------------------------------------------------------

    def fail(self, exc: BaseException) -> bool:
        """Record the member's failure; the first one wins. True if this one was recorded."""
        with self._lock:
            if self._failure is not None:
                return False
            self._failure = exc
            return True

    def running(self) -> None:
        with self._lock:
            if self._state is State.STARTING:
                self._state = State.RUNNING

    def stopping(self) -> None:
        with self._lock:
            if self._state in (State.STARTING, State.RUNNING):
                self._state = State.STOPPING

    def take_requests(self) -> list[Request]:
        out = []
        while True:
            try:
                out.append(self._requests.get_nowait())
            except queue.Empty:
                return out

    def end(self) -> None:
        with self._lock:
            self._state = State.FAILED if self._failure is not None else State.STOPPED
            self.started.set()
            self.ended.set()
            callbacks, self._on_end = self._on_end, []
        for _, _, future in self.take_requests():
            future.cancel()
        for callback in callbacks:
            _quietly(callback)

    def publish(self, stats: ConsumerStats) -> None:
        self.stats = stats

    def brokers_down(self, now: float) -> None:
        """The client reported every broker down (`_ALL_BROKERS_DOWN`). An outage that goes on
        keeps the time it began."""
        if self.brokers_down_since is None:
            self.brokers_down_since = now
            self._next_broker_probe = now + BROKER_PROBE_EVERY_S

    def broker_probe_due(self, now: float) -> bool:
        """Whether to ask a broker now: every `BROKER_PROBE_EVERY_S` while all are down."""
        if self.brokers_down_since is None or now < self._next_broker_probe:
            return False
        self._next_broker_probe = now + BROKER_PROBE_EVERY_S
        return True

    def broker_answered(self, now: float) -> float:
        """A broker answered: the outage is over. Returns how long it lasted (0 if none)."""
        since, self.brokers_down_since = self.brokers_down_since, None
        return 0.0 if since is None else max(0.0, now - since)

    def refuse(self, denied: Denied, now: float) -> bool:
        """The broker's ACLs refused `denied` while the member runs. True if it was not
        refused already (a refusal that goes on keeps the time it began)."""
        if denied in self.refusals:
            return False
        self.refusals = {**self.refusals, denied: now}
        return True

    def allow(self, match: Callable[[Denied], bool], now: float) -> dict[Denied, float]:
        """Refusals `match` says have ended, with how long each lasted."""
        ended = {d: now - since for d, since in self.refusals.items() if match(d)}
        if ended:
            self.refusals = {d: s for d, s in self.refusals.items() if d not in ended}
        return ended

    @property
    def should_run(self) -> bool:
        return not self.stop_requested.is_set() and self._failure is None


def _quietly(callback: Callable[[], object]) -> None:
    # A waiter's loop may be closed by now: that waiter has nothing left to wake.
    with contextlib.suppress(Exception):
        callback()
