"""SIGTERM on a member that `run()`s on the main thread, as a service's entry point does, and a
second signal during its drain."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator

import pytest
from tests.scripted_producer import NativeHang, Producers, Scripted

from weir import Context, GroupConsumer, Handler, Record
from weir._engine.lifecycle import State
from weir.testing.fake import FakeConsumer

TOPIC = "t"


class UntilCancelled(Handler):
    """Offset 0 runs until weir cancels it; the others finish at once."""

    def __init__(self) -> None:
        self.running = threading.Event()
        self.cancelled = threading.Event()

    def handle(self, record: Record, ctx: Context) -> None:
        if record.offset == 0:
            self.running.set()
            while not ctx.cancelled:
                time.sleep(0.002)
            self.cancelled.set()


class SlowLine(logging.Handler):
    """Takes 50 ms over weir's signal_received line: the signal handler then runs past the
    owner's 10 ms wait for completions, as a busy machine or a slow log sink makes it."""

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, dict) and record.msg.get("event") == "signal_received":
            time.sleep(0.05)


@pytest.fixture
def slow_signal_line() -> Iterator[None]:
    logger = logging.getLogger("weir.consumer")
    handler, level = SlowLine(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield
    logger.removeHandler(handler)
    logger.setLevel(level)


def member_on_the_main_thread(
    shutdown_timeout_s: float,
) -> tuple[FakeConsumer, UntilCancelled, GroupConsumer, int]:
    """A member on the fake whose offset 0 runs until cancelled, and the main thread's id, to
    send it signals (skipped where the test does not run on the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread only")
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3))
    fake.script_assign([(TOPIC, 0)])
    handler = UntilCancelled()
    gc = GroupConsumer(
        handler,
        consumer_factory=fake.factory,
        bootstrap_servers="fake:9092",
        group_id="g",
        topics=[TOPIC],
        poll_timeout_s=0.01,
        shutdown_timeout_s=shutdown_timeout_s,
        startup_timeout_s=1.0,
    )
    main = threading.main_thread().ident
    assert main is not None
    return fake, handler, gc, main


@pytest.mark.timeout(30)
@pytest.mark.usefixtures("slow_signal_line")
def test_sigterm_stops_a_member_waiting_for_a_handler_that_runs_until_cancelled() -> None:
    """The owner waits for completions, none come (the one running handler returns only when
    cancelled), and SIGTERM arrives on the main thread, whose handler outlasts the wait. The
    member stops within its shutdown budget. (On Python 3.10-3.12 the interrupted
    SimpleQueue.get went on waiting with a negative timeout, forever: run() never returned;
    seen on the broker as a member that ignored SIGTERM.)"""
    fake, handler, gc, main = member_on_the_main_thread(shutdown_timeout_s=0.5)
    sent: list[float] = []

    def terminate() -> None:
        if handler.running.wait(10):
            time.sleep(0.2)  # the owner is in its idle waits by now
            sent.append(time.monotonic())
            signal.pthread_kill(main, signal.SIGTERM)

    threading.Thread(target=terminate, daemon=True).start()
    gc.run()
    took = time.monotonic() - sent[0]
    assert took < 3.0, f"run() returned {took:.1f} s after SIGTERM"
    assert handler.cancelled.wait(2)
    assert fake.closed


class LogEvents(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, dict):
            self.events.append(str(record.msg.get("event")))


@pytest.mark.timeout(30)
def test_a_second_signal_during_the_drain_skips_the_rest_of_it() -> None:
    """SIGTERM starts a drain with a 20 s budget that a handler running until cancelled would
    use up; SIGINT on top of it (Ctrl-C after `kill`, or a second Ctrl-C) cuts the drain short:
    the running record is cancelled, the watermark below it committed and the client closed,
    at once. (Before, repeated signals waited out the whole budget.)"""
    fake, handler, gc, main = member_on_the_main_thread(shutdown_timeout_s=20.0)
    sent: list[float] = []

    def interrupt_twice() -> None:
        if handler.running.wait(10):
            time.sleep(0.2)
            signal.pthread_kill(main, signal.SIGTERM)
            time.sleep(0.5)  # the drain is under way, waiting for offset 0
            sent.append(time.monotonic())
            signal.pthread_kill(main, signal.SIGINT)

    logger = logging.getLogger("weir")
    events, level = LogEvents(), logger.level
    logger.addHandler(events)
    logger.setLevel(logging.INFO)
    try:
        threading.Thread(target=interrupt_twice, daemon=True).start()
        gc.run()
    finally:
        logger.removeHandler(events)
        logger.setLevel(level)
    took = time.monotonic() - sent[0]
    assert took < 3.0, f"run() returned {took:.1f} s after the second signal"
    assert handler.cancelled.wait(2)
    assert "shutdown_hurried" in events.events, events.events
    assert "shutdown_budget_exceeded" not in events.events
    assert fake.commits_for((TOPIC, 0))[-1][0] == 0  # the watermark: offset 0 never finished
    assert fake.closed


class Nothing(Handler):
    def handle(self, record: Record, ctx: Context) -> None:
        pass


class Timed(logging.Handler):
    """When each of weir's events was logged."""

    def __init__(self) -> None:
        super().__init__()
        self.at: dict[str, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, dict):
            self.at.setdefault(str(record.msg.get("event")), time.monotonic())


@pytest.mark.timeout(60)
def test_a_signal_is_handled_while_the_owner_is_inside_a_client_call_that_never_returns() -> None:
    """Regression (broker restart): a transactional member's commit waited in librdkafka with
    no deadline, and SIGTERM did nothing: the owner ran on the main thread, where Python runs
    signal handlers only between bytecodes. Here the commit waits in native code that no
    signal interrupts. The handler must run at once (the owner runs on a thread of its own),
    and the member must stop by itself: the commit is abandoned at weir's deadline, the
    producer replaced, and the stop drains, commits and closes. (Before the fix the handler
    ran only when the test released the wait, 6 s later.)"""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread only")
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3))
    fake.script_assign([(TOPIC, 0)])
    hang = NativeHang()
    stuck = Scripted(commit=[hang])
    gc = GroupConsumer(
        Nothing(),
        consumer_factory=fake.factory,
        producer_factory=Producers(stuck),
        bootstrap_servers="fake:9092",
        group_id="g",
        topics=[TOPIC],
        poll_timeout_s=0.01,
        startup_timeout_s=1.0,
        transactional_id="t-1",
        transaction_timeout_s=1.0,
    )
    main = threading.main_thread().ident
    assert main is not None
    sent: list[float] = []

    def terminate() -> None:
        deadline = time.monotonic() + 10
        while "commit" not in stuck.calls and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # the owner waits inside the commit by now
        sent.append(time.monotonic())
        signal.pthread_kill(main, signal.SIGTERM)
        time.sleep(6.0)
        hang.release()  # lets a member that could not take the signal go on (the old code)

    logger = logging.getLogger("weir")
    timed, level = Timed(), logger.level
    logger.addHandler(timed)
    logger.setLevel(logging.INFO)
    try:
        threading.Thread(target=terminate, daemon=True).start()
        gc.run()
        stopped = time.monotonic()
    finally:
        logger.removeHandler(timed)
        logger.setLevel(level)
        hang.release()
    handled = timed.at["signal_received"] - sent[0]
    assert handled < 0.5, f"the signal was handled {handled:.1f} s after it was sent"
    assert stopped - sent[0] < 8.0
    assert gc.state is State.STOPPED, gc.failure
    assert "transactional_producer_replaced" in timed.at
