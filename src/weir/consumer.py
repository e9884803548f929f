"""`GroupConsumer`: the public face of a consumer-group member.

It validates the configuration and owns the lifecycle (run, start, stop, join, signals, context
manager). Everything it shares with its engine goes through one `Lifecycle` object; the
owner-thread engine itself lives in `weir._engine.engine`.
"""

from __future__ import annotations

import asyncio
import inspect
import signal
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from datetime import datetime
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, TypeAlias, overload

from confluent_kafka import Consumer
from typing_extensions import TypeVar, Unpack

from weir._engine.client import ClientFactory, ProducerFactory
from weir._engine.engine import Engine
from weir._engine.lifecycle import Lifecycle, State
from weir._engine.protocols import offers_consumer_protocol
from weir._engine.scheduling import Orderings, lane_of
from weir._engine.workers import Workers, runs_calls_of, workers_running_here
from weir.config import (
    ConsumerConfig,
    ConsumerSettings,
    RoutedSettings,
    for_async_handler,
    for_batch_handler,
    with_settings,
)
from weir.fencing.base import Fence
from weir.health import Health, check
from weir.logs import get_logger
from weir.records import (
    BatchHandler,
    CommitEvent,
    Handler,
    Partition,
    Record,
    as_handler,
    is_async_handler,
    pause_seconds,
)
from weir.routing import BatchRouter, Routes, router
from weir.serde import (
    Deserializers,
    Serializers,
    check_setting,
    deserializing,
    serializing,
)
from weir.stats import ConsumerStats

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["GroupConsumer"]

log = get_logger(__name__)

# How long run() waits on the owner thread at a time: signal handlers run between the waits as
# well as inside them, so this only bounds how late a missed wake-up could be noticed.
_JOIN_SLICE = 0.5


# A function handler's records hold what the value deserializer makes (`Record[_V]`): the type
# checker refuses a handler of `Record[Order]` given a deserializer of something else.
_V = TypeVar("_V", default=Any)
_ValueDeserializers: TypeAlias = (
    Callable[[bytes | None], _V] | Mapping[str, Callable[[bytes | None], _V]]
)

_BATCH_SETTINGS = ("batch_max_records", "batch_max_wait_s", "batch_max_bytes")


# Settings whose rule reads the flow: for a member whose budget is not the default flow, checked
# once that budget is known (`for_batch_handler`, `for_async_handler`).
_FLOW_BOUND = ("max_batch_records",)


def _check_batch_settings(handler: Handler, config: ConsumerConfig) -> None:
    """The batch settings belong to a `BatchHandler`, and `flush_timeout_s` to a flush hook."""
    if handler._flush_hook() is None and "flush_timeout_s" in config.model_fields_set:
        raise ValueError(
            f"flush_timeout_s bounds a handler's on_flush hook, and {type(handler).__qualname__} "
            "defines none: drop the setting, or define on_flush(ctx)"
        )
    if not isinstance(handler, BatchHandler):
        given = [name for name in _BATCH_SETTINGS if name in config.model_fields_set]
        if given:
            raise ValueError(
                f"{' and '.join(given)} {'configures' if len(given) == 1 else 'configure'} a "
                "batch handler (weir.BatchHandler with "
                "handle_batch), and this handler takes one record at a time: drop the setting, "
                "or subclass weir.BatchHandler"
            )
        return


class GroupConsumer:
    """A consumer-group member that processes records on worker threads and commits only
    offsets whose records, and every delivered record before them, are finished.

    A member runs once (`run()`, or `start()` with `stop()` and `join()`); build a new one to
    consume again.
    """

    @overload
    def __init__(
        self,
        handler: Handler | Callable[[Record[_V]], object] | None,
        config: ConsumerConfig,
        *,
        routes: Routes | None = None,
        key_deserializer: Deserializers | None = None,
        value_deserializer: _ValueDeserializers[_V] | None = None,
        key_serializer: Serializers | None = None,
        value_serializer: Serializers | None = None,
        consumer_factory: ClientFactory | None = None,
        producer_factory: ProducerFactory | None = None,
        fence: Fence[Any] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self,
        handler: Handler | Callable[[Record[_V]], object],
        *,
        key_deserializer: Deserializers | None = None,
        value_deserializer: _ValueDeserializers[_V] | None = None,
        key_serializer: Serializers | None = None,
        value_serializer: Serializers | None = None,
        consumer_factory: ClientFactory | None = None,
        producer_factory: ProducerFactory | None = None,
        fence: Fence[Any] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        tracer_provider: TracerProvider | None = None,
        **settings: Unpack[ConsumerSettings],
    ) -> None: ...

    @overload
    def __init__(
        self,
        *,
        routes: Routes,
        key_serializer: Serializers | None = None,
        value_serializer: Serializers | None = None,
        consumer_factory: ClientFactory | None = None,
        producer_factory: ProducerFactory | None = None,
        fence: Fence[Any] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        tracer_provider: TracerProvider | None = None,
        **settings: Unpack[RoutedSettings],
    ) -> None: ...

    def __init__(
        self,
        handler: Handler | Callable[[Record], object] | None = None,
        config: ConsumerConfig | None = None,
        *,
        routes: Routes | None = None,
        key_deserializer: Deserializers | None = None,
        value_deserializer: Deserializers | None = None,
        key_serializer: Serializers | None = None,
        value_serializer: Serializers | None = None,
        consumer_factory: ClientFactory | None = None,
        producer_factory: ProducerFactory | None = None,
        fence: Fence[Any] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        tracer_provider: TracerProvider | None = None,
        **settings: Any,
    ) -> None:
        """`handler`: a `Handler`, or a function taking a `Record` (runs on worker threads).
        Settings as keywords, or one `ConsumerConfig`. `key_deserializer` /
        `value_deserializer`: functions from bytes to what the handler reads as
        `record.deserialized_key` / `deserialized_value` (or a mapping of topic to function;
        see `weir.serde`). `key_serializer` / `value_serializer`: functions from an object to
        bytes that `ctx.produce` calls, in the handler's thread, for a key or value that is not
        bytes, str or None (or a mapping of output topic to function; docs/producing.md).
        `consumer_factory` / `producer_factory` build the Kafka clients
        (`weir.testing.FakeConsumer` for tests without a broker). `fence`: a `weir.fencing`
        fence whose epochs the member acquires for each assigned partition before its first
        record (`Context.epoch`); a `FencedError` from a handler makes the partition lost.
        `routes`: instead of `handler`, a handler per topic or pattern (`weir.Route`,
        docs/routing.md); `topics` then defaults to what the routes name.
        `tracer_provider`: an OpenTelemetry tracer provider for the handler's spans (it turns
        `tracing` on; docs/tracing.md)."""
        if config is not None and not isinstance(config, ConsumerConfig):
            raise TypeError(_not_a_config(config))
        if config is not None and settings:
            raise TypeError("pass either a ConsumerConfig or keyword settings, not both")
        # Routes of different orderings: each topic's (None: every record follows the config's).
        self._orderings: Orderings | None = None
        held_back: dict[str, Any] = {}
        if config is None and "flow" not in settings:
            # Validated once the member's budget is known (below): a batch or async handler's
            # is larger than the default flow, whose headroom refused what it holds.
            held_back = {k: settings.pop(k) for k in _FLOW_BOUND if k in settings}
        if routes is not None:
            handler, config, self._orderings = _routed(handler, routes, config, settings)
            if isinstance(handler, BatchRouter):
                handler.bind(lane_of(config.ordering, self._orderings))
        elif handler is None:
            raise TypeError("GroupConsumer needs a handler, or routes= (a handler per topic)")
        self._handler = as_handler(handler)
        batch = isinstance(self._handler, BatchHandler)
        if config is None:
            config = ConsumerConfig(**settings)
        _check_batch_settings(self._handler, config)
        # A setting of the other kind of handler, given anyway, does nothing: say so.
        is_async = is_async_handler(self._handler)
        if ("workers" if is_async else "max_in_flight") in config.model_fields_set:
            log.warning(
                "workers_unused" if is_async else "max_in_flight_unused",
                workers=config.workers,
                max_in_flight=config.max_in_flight,
                reason=(
                    "an async handler runs on an event loop, not on worker threads: max_in_flight"
                    if is_async
                    else "a thread handler runs on worker threads, not on an event loop: workers"
                )
                + f" bounds the {'handle_batch calls' if batch else 'records'} running at once",
            )
        if batch:
            config = for_batch_handler(config, **held_back)  # the budget scales with the batches
        elif is_async:
            # Coroutines finish many records at once: the record budget scales with them.
            config = for_async_handler(config, **held_back)
        elif held_back:
            config = with_settings(config, **held_back)  # the default flow, checked now
        self.config = config
        if loop is not None:
            if not isinstance(loop, asyncio.AbstractEventLoop):
                raise TypeError(f"loop must be an asyncio event loop, got {loop!r}")
            if not is_async:
                raise TypeError(
                    "loop= runs async handlers; this handler is not async def (thread handlers "
                    "run on worker threads)"
                )
        # An async handler's event loop: the application's (given here, or the one that runs
        # `run_async()` / `async with`), else one on a thread of weir's own.
        self._loop = loop
        for name, given, out in (
            ("key_deserializer", key_deserializer, False),
            ("value_deserializer", value_deserializer, False),
            ("key_serializer", key_serializer, True),
            ("value_serializer", value_serializer, True),
        ):
            if given is not None:
                check_setting(name, given, serializer=out)
                if out and not isinstance(handler, Handler):
                    # A function is called with the record alone: it has no ctx.produce.
                    raise TypeError(
                        f"{name} serializes the outputs of ctx.produce, and the handler "
                        f"{getattr(handler, '__qualname__', handler)!r} is a function, called "
                        "without a Context: subclass weir.Handler and define "
                        "handle(self, record, ctx), or drop the setting"
                    )
        if key_deserializer is not None or value_deserializer is not None:
            self._handler = deserializing(
                self._handler,
                key_deserializer,
                value_deserializer,
                lane_of=lane_of(config.ordering, self._orderings),
            )
        if key_serializer is not None or value_serializer is not None:
            self._handler = serializing(self._handler, key_serializer, value_serializer)
        if tracer_provider is not None or config.tracing:
            self._handler = _traced(self._handler, config, tracer_provider)
        self._factory: ClientFactory = consumer_factory or Consumer
        # High watermarks are refreshed by a client of weir's own making: only next to the real
        # client (a fake answers its cached watermarks with live values anyway).
        self._refresh_watermarks = consumer_factory is None
        self._producer_factory = producer_factory
        self._fence = fence
        self._life = Lifecycle()
        self._thread: threading.Thread | None = None
        self._workers: Workers | None = None

    # -- public API ------------------------------------------------------------------------

    def run(self, *, handle_signals: bool = True) -> None:
        """Run the member until `stop()`, a signal, or a failure (re-raised); blocks.

        With `handle_signals` (and on the main thread) SIGINT and SIGTERM stop the member
        gracefully: drain, commit, leave the group. A second signal hurries the stop: the rest
        of the drain is skipped, the finished watermark committed, the client closed. The
        previous handlers are restored when `run()` returns. Without them, a KeyboardInterrupt
        stops the member the same way and is raised once it has stopped.

        The owner loop runs on a thread of its own (`weir-owner`) while this thread waits for
        it: Python runs signal handlers on the main thread only, between bytecodes, so a
        handler must never wait for the owner to come back from a client call.
        """
        self._refuse_on_loop("run()")
        self._life.begin()
        restore = self._install_signals() if handle_signals else None
        try:
            thread = self._spawn_owner()
            self._wait_for(thread)
        finally:
            if restore is not None:
                restore()
        if self._life.failure is not None:
            raise self._life.failure

    def _wait_for(self, thread: threading.Thread) -> None:
        """Wait for the owner thread, interruptibly: signal handlers run during the wait. An
        exception raised here (a KeyboardInterrupt with no handler of weir's) stops the member
        as a failure would, and the wait goes on until it has stopped."""
        while thread.is_alive():
            try:
                thread.join(_JOIN_SLICE)
            except BaseException as exc:
                self._life.fail(exc)  # the first failure wins
                self._life.request_stop()  # a second request hurries the stop

    def _refuse_on_loop(self, call: str) -> None:
        """A blocking call on the thread of the event loop the handlers run on would stop that
        loop, and with it the handlers: the member could never finish its work."""
        if self._loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return
        if running is self._loop:
            raise RuntimeError(
                f"{call} blocks, and this thread runs the event loop the handlers run on: use "
                "`await consumer.run_async()`, `await consumer.join_async()` or "
                "`async with consumer:` instead"
            )

    def _refuse_in_handler(self, call: str) -> None:
        """The member's end waits for its handler calls and its hooks: one of them waiting
        for that end would wait until the shutdown (or the hook's) budget ran out, and a
        handler's record would run again."""
        if self._workers is not None and workers_running_here() is self._workers:
            raise RuntimeError(
                f"{call} inside this member's own handler or hook would wait for that call "
                "itself: stop() alone is enough, the member stops once the call returns; wait "
                "for it where it was started"
            )

    def _spawn_owner(self) -> threading.Thread:
        try:
            engine = Engine(
                self.config,
                self._handler,
                self._factory,
                self._life,
                refresh_watermarks=self._refresh_watermarks,
                # Asked by a client of weir's own making, next to the real client only.
                protocol_probe=offers_consumer_protocol if self._factory is Consumer else None,
                producer_factory=self._producer_factory,
                fence=self._fence,
                loop=self._loop,
                orderings=self._orderings,
            )
        except BaseException as exc:
            self._life.fail(exc)
            self._life.end()
            raise
        self._workers = engine.workers  # what `_refuse_in_handler` knows its handler calls by

        def target() -> None:
            # Hooks and commit listeners run here (an async hook in a task made from here,
            # which copies this context): `_refuse_in_handler` knows them as the member's own.
            runs_calls_of(engine.workers)
            try:
                engine.run()  # its failures land in the lifecycle
            except BaseException as exc:
                self._life.fail(exc)

        self._thread = threading.Thread(target=target, name="weir-owner", daemon=True)
        self._thread.start()
        return self._thread

    def start(self) -> GroupConsumer:
        """Run the member on a background owner thread; pair with `stop()` and `join()`."""
        self._life.begin()
        self._spawn_owner()
        return self

    def stop(self) -> None:
        """Ask the member to shut down: safe from any thread or a signal handler. A second
        call hurries the shutdown (skips the rest of the drain)."""
        self._life.request_stop()

    def join(self, timeout: float | None = None) -> None:
        """Wait for a `start()`ed member to finish; re-raises its failure."""
        if self._thread is None:
            raise RuntimeError("join() needs start()")
        if self._thread.is_alive():
            self._refuse_on_loop("join()")
            self._refuse_in_handler("join()")
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"GroupConsumer did not stop within {timeout}s")
        if self._life.failure is not None:
            raise self._life.failure

    def wait_started(self, timeout: float | None = None) -> bool:
        """True once the member has subscribed (or has failed trying)."""
        return self._life.started.wait(timeout)

    def stats(self) -> ConsumerStats:
        """The latest snapshot published by the owner thread (at a commit, at most twice per
        `commit_interval_s`; at least once a second; and at shutdown)."""
        return self._life.stats

    def health(self) -> Health:
        """Liveness and readiness now (docs/observability.md): safe from any thread, cheap, and
        it never calls the Kafka client. `weir.prometheus.serve` exposes it as /healthz and
        /readyz."""
        c = self.config
        return check(
            self._life,
            self._life.stats,
            max_poll_interval_s=c.max_poll_interval_s,
            stuck_after_s=c.stuck_after_s,
            broker_down_unready_s=c.broker_down_unready_s,
        )

    def add_commit_listener(self, listener: Callable[[CommitEvent], None]) -> None:
        """Called on the owner thread with every per-partition commit event, from the next
        event on (before or after `start()`). A listener that raises is isolated (see
        `callback_errors`). It must be a plain function: the commit path does not wait for a
        coroutine."""
        if inspect.iscoroutinefunction(listener) or inspect.iscoroutinefunction(
            getattr(listener, "__call__", None)  # noqa: B004 - the method, not callability
        ):
            raise TypeError(
                f"commit listener {getattr(listener, '__qualname__', listener)!r} is async def: "
                "listeners run on the owner thread, which never awaits; use a plain function "
                "(and hand the event to your loop with loop.call_soon_threadsafe if needed)"
            )
        self._life.add_listener(listener)

    def retry_now(self, partition: Partition | tuple[str, int]) -> Future[bool]:
        """Try the blocked or waiting failed records of `partition` (a `Partition` or a
        `(topic, partition)` tuple) again now, instead of at their next scheduled attempt.
        The future is True if there was one to retry. A bad argument raises here."""
        return self._life.request("retry_now", _partition(partition))

    def skip(self, partition: Partition | tuple[str, int], offset: int) -> Future[bool]:
        """Give up on the failed record at `offset` of `partition` deliberately: it counts as
        finished without having been processed (logged as `record_skipped`, counted in
        stats). Only a record that is blocked or waiting for a retry can be skipped; the
        future is False otherwise. A bad argument raises here."""
        tp = _partition(partition)
        return self._life.request("skip", tp, _non_negative("offset", offset))

    def pause(
        self, target: Partition | tuple[str, int] | str, *, for_s: float | None = None
    ) -> Future[bool]:
        """Stop fetching `target` (a partition, or a topic's name for all its partitions) until
        `resume(target)`, or for `for_s` seconds. Safe from any thread. Records already fetched
        still run; nothing is skipped, and the member stays in its group. The pause belongs to
        this member, not to one assignment: partitions of a paused topic assigned later, and a
        paused partition that comes back in a rebalance, start paused. weir's own flow-control
        pauses neither lift it nor are lifted by it (`pause_reason="app"` in stats). A later
        pause of the same target replaces its end. The future is True if a partition this
        member owns now was paused. A bad argument raises here."""
        return self._life.request("pause", _target(target), pause_seconds(for_s))

    def resume(self, target: Partition | tuple[str, int] | str) -> Future[bool]:
        """Lift `pause(target)` for exactly that target (a partition of a paused topic stays
        paused until the topic is resumed). The future is True if `target` was paused."""
        return self._life.request("resume", _target(target))

    def seek(self, partition: Partition | tuple[str, int], offset: int | datetime) -> Future[int]:
        """Read `partition` on from `offset`, or from its first record at or after a
        timezone-aware `datetime` (the log end if none is that late); safe from any thread.
        An offset past the log's end goes to the end, one below its start to the start.

        The owner thread serves it within one turn: the partition's records in flight are
        cancelled (`ctx.cancelled`) and never marked or committed, its queued records and
        retries dropped, the seek position committed at once, and nothing above it committed
        before records from there have finished (docs/seeking.md). The future gives the offset
        read next, or raises `weir.SeekError` (nothing changed) if the partition is not
        assigned to this member by then. A bad argument, or a member not running, raises
        here."""
        tp = _partition(partition)
        if isinstance(offset, datetime):
            if offset.tzinfo is None or offset.utcoffset() is None:
                raise ValueError(
                    f"seek needs a timezone-aware datetime, got the naive {offset.isoformat()}: "
                    "say which zone, e.g. datetime(2026, 1, 1, tzinfo=timezone.utc)"
                )
            return self._life.request("seek", tp, offset)
        if not isinstance(offset, int) or isinstance(offset, bool):
            raise TypeError(
                f"offset must be an int or a timezone-aware datetime, got {offset!r} "
                f"({type(offset).__name__})"
            )
        return self._life.request("seek", tp, _non_negative("offset", offset))

    def seek_to_beginning(self, partition: Partition | tuple[str, int]) -> Future[int]:
        """`seek` to the first record `partition` holds now."""
        return self._life.request("seek", _partition(partition), "beginning")

    def seek_to_end(self, partition: Partition | tuple[str, int]) -> Future[int]:
        """`seek` to the end of `partition` now: only records produced from here on are read."""
        return self._life.request("seek", _partition(partition), "end")

    # -- asyncio ---------------------------------------------------------------------------

    async def run_async(self, *, handle_signals: bool = True) -> None:
        """Run the member until `stop()`, a signal, a failure (re-raised) or cancellation,
        without blocking the event loop that awaits it. An async handler runs on that loop
        unless `loop=` named another.

        Cancelling the awaiting task (as `asyncio.run` does on Ctrl-C) stops the member
        gracefully, waits for the drain, commit and leave, then lets the cancellation go on.
        With `handle_signals` (on the main thread, on loops that support it) SIGTERM stops the
        member the same way; a second SIGTERM hurries the stop. SIGINT is left to the loop.
        """
        loop = asyncio.get_running_loop()
        self._start_on(loop)
        restore = self._install_loop_signals(loop) if handle_signals else None
        try:
            await self.join_async()
        finally:
            if restore is not None:
                restore()

    async def join_async(self) -> None:
        """Wait, without blocking the loop, for a started member to finish; re-raises its
        failure. If the waiting task is cancelled, the member is stopped and waited for first."""
        if self._thread is None:
            raise RuntimeError("join_async() needs start() or run_async()")
        if self._thread.is_alive():
            self._refuse_in_handler("join_async()")
        loop = asyncio.get_running_loop()
        ended = loop.create_future()

        def wake() -> None:
            if not ended.done():
                ended.set_result(None)

        self._life.on_end(lambda: loop.call_soon_threadsafe(wake))
        try:
            await asyncio.shield(ended)
        except asyncio.CancelledError:
            self.stop()
            await ended
            raise
        if self._life.failure is not None:
            raise self._life.failure

    async def __aenter__(self) -> GroupConsumer:
        self._start_on(asyncio.get_running_loop())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        try:
            await self.join_async()
        except BaseException:
            if exc is None:
                raise

    def _start_on(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is None and is_async_handler(self._handler):
            self._loop = loop
        self.start()

    def _install_loop_signals(self, loop: asyncio.AbstractEventLoop) -> Callable[[], None] | None:
        if threading.current_thread() is not threading.main_thread():
            return None
        try:
            loop.add_signal_handler(signal.SIGTERM, self._on_loop_signal)
        except (NotImplementedError, RuntimeError, ValueError):
            return None  # not a Unix loop, or not the main thread's

        def restore() -> None:
            loop.remove_signal_handler(signal.SIGTERM)

        return restore

    def _on_loop_signal(self) -> None:
        log.info("signal_received", signal="SIGTERM", hurry=self._life.stop_requested.is_set())
        self.stop()

    @property
    def state(self) -> State:
        """Where the member is in its life: new, starting, running, stopping, stopped or failed."""
        return self._life.state

    @property
    def failure(self) -> BaseException | None:
        """The error the member failed with (the first one, which `run()` and `join()` raise);
        None while it has not failed."""
        return self._life.failure

    def __enter__(self) -> GroupConsumer:
        self._refuse_on_loop("with GroupConsumer(...)")
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
        if exc is None and self._life.failure is not None:
            raise self._life.failure

    def __repr__(self) -> str:
        c = self.config
        # Routes of different orderings: `ordering` is only the default of those with none.
        mixed = "" if self._orderings is None else f", orderings={dict(self._orderings.shown)!r}"
        return (
            f"GroupConsumer(group_id={c.group_id!r}, topics={c.topics!r}, "
            f"ordering={c.ordering!r}{mixed}, state={self._life.state.value})"
        )

    def _install_signals(self) -> Callable[[], None] | None:
        if threading.current_thread() is not threading.main_thread():
            return None

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info(
                "signal_received",
                signal=signal.Signals(signum).name,
                hurry=self._life.stop_requested.is_set(),
            )
            self.stop()

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

        def restore() -> None:
            for s, h in old.items():
                signal.signal(s, h)

        return restore


def _traced(handler: Handler, config: ConsumerConfig, provider: TracerProvider | None) -> Handler:
    """The handler with a span around each call (weir.tracing, imported only here: with tracing
    off no wrapper costs a record anything)."""
    if provider is not None and "tracing" in config.model_fields_set and not config.tracing:
        raise ValueError(
            "tracer_provider= turns tracing on, and tracing=False turns it off: drop one"
        )
    from weir.tracing import traced

    return traced(handler, config.group_id, provider)


def _non_negative(what: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int, got {value!r} ({type(value).__name__})")
    if value < 0:
        raise ValueError(f"{what} must not be negative, got {value}")
    return value


def _partition(value: object) -> Partition:
    """An operator's partition argument, checked in the caller's thread: the owner thread that
    serves the request must never be the one to find it wrong."""
    if not (isinstance(value, tuple | list) and len(value) == 2 and isinstance(value[0], str)):
        raise TypeError(
            "partition must be a weir.Partition or a (topic, partition) tuple such as "
            f"('orders', 0), got {value!r} ({type(value).__name__})"
        )
    return Partition(value[0], _non_negative("the partition number", value[1]))


def _target(value: object) -> Partition | str:
    """A pause's target: a topic's name, or a partition (checked as `_partition`)."""
    if isinstance(value, str):
        if not value:
            raise ValueError("a topic to pause must be a non-empty name")
        return value
    return _partition(value)


def _not_a_config(config: object) -> str:
    """What `GroupConsumer(handler, config)` says when `config` is not a `ConsumerConfig` (it
    failed deep inside with "'dict' object has no attribute 'model_fields_set'")."""
    said = f"config must be a ConsumerConfig, got {type(config).__name__}"
    if not isinstance(config, Mapping):
        return f"{said}: settings are keywords, GroupConsumer(handler, bootstrap_servers=...)"
    said += ": pass its settings as keywords, GroupConsumer(handler, **settings)"
    if any(isinstance(k, str) and "." in k for k in config):
        said += " (librdkafka's own settings, such as 'fetch.min.bytes', go in kafka={...})"
    return said


def _routed(
    handler: object, routes: Routes, config: ConsumerConfig | None, settings: dict[str, Any]
) -> tuple[Handler, ConsumerConfig, Orderings | None]:
    """The member's router, its config with the routes' topics and failure policies, and its
    topics' orderings if the routes' differ (when they all have one, it is the config's
    `ordering`): an unrouted subscribed topic, or a route's policy that the config sets too, is
    refused here."""
    if handler is not None:
        raise TypeError("pass a handler or routes=, not both")
    routed = router(routes)
    table = routed.table
    given = (
        dict(settings)
        if config is None
        else {name: getattr(config, name) for name in config.model_fields_set}
    )
    topics = given.setdefault("topics", table.subscription())
    if isinstance(topics, list | tuple):
        unrouted = table.unrouted(t for t in topics if isinstance(t, str))
        if unrouted:
            raise ValueError(
                f"no route for the subscribed {', '.join(map(repr, unrouted))}: every topic "
                f"(and pattern) in topics needs a route (routes: {table.names()})"
            )
    mine = dict(given.get("failure_by_topic") or {})
    both = sorted(set(mine) & table.own_policies())
    if both:
        raise ValueError(
            f"failure_by_topic and the routes both set a policy for {', '.join(both)}: "
            "set it in one place (Route(failure=...))"
        )
    # The member's own policy (a route's fallback), as given or by default.
    fallback = given.get("failure") or ConsumerConfig.model_fields["failure"].default
    policies = table.policies(fallback, mine)
    if policies:
        given["failure_by_topic"] = policies
    config = ConsumerConfig(**given)
    orderings = table.orderings(config.ordering)
    if len(orderings.modes) > 1:
        return routed, config, orderings
    (ordering,) = orderings.modes
    if ordering != config.ordering:
        config = ConsumerConfig(**{**given, "ordering": ordering})
    return routed, config, None
