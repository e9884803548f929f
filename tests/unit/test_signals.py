"""SIGTERM on a member that `run()`s on the main thread, as a service's entry point does."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from weir import Context, GroupConsumer, Handler, Record
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


@pytest.mark.timeout(30)
@pytest.mark.usefixtures("slow_signal_line")
def test_sigterm_stops_a_member_waiting_for_a_handler_that_runs_until_cancelled() -> None:
    """The owner waits for completions, none come (the one running handler returns only when
    cancelled), and SIGTERM arrives on the main thread, whose handler outlasts the wait. The
    member stops within its shutdown budget. (On Python 3.10-3.12 the interrupted
    SimpleQueue.get went on waiting with a negative timeout, forever: run() never returned;
    seen on the broker as a member that ignored SIGTERM.)"""
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
        shutdown_timeout_s=0.5,
        startup_timeout_s=1.0,
    )
    main = threading.main_thread().ident
    assert main is not None
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
