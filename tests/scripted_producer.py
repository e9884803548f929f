"""Scripted transactional producers: each call does what a test's script says (return,
raise, time out, or hang past its timeout), for the transactional paths of the engine."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from weir._engine.client import DeliveryCallback

# What a scripted call does: None returns, an exception is raised, HANG blocks until released
# (ignoring its timeout, as librdkafka's transactional calls were seen to on a broker restart),
# and a float sleeps that long (at most the call's timeout) and then times out.
HANG = "hang"


class NativeHang:
    """A wait in native code that no signal interrupts, as librdkafka's condition-variable
    waits are: `pthread_mutex_lock` on a mutex a thread of this object holds. Python runs a
    signal handler only when the main thread is back in the interpreter, so a main thread
    inside `wait()` runs none until `release()`."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None)
        self._mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER
        self._held = threading.Event()
        self._release = threading.Event()
        threading.Thread(target=self._hold, name="native-hang-holder", daemon=True).start()
        self._held.wait()

    def _hold(self) -> None:
        self._libc.pthread_mutex_lock(self._mutex)
        self._held.set()
        self._release.wait()
        self._libc.pthread_mutex_unlock(self._mutex)

    def wait(self) -> None:
        self._libc.pthread_mutex_lock(self._mutex)
        self._libc.pthread_mutex_unlock(self._mutex)

    def release(self) -> None:
        self._release.set()


Action = None | BaseException | float | str | NativeHang


def timed_out() -> KafkaException:
    """What librdkafka raises when a transactional call outlasts its timeout."""
    return KafkaException(
        KafkaError(
            KafkaError._TIMED_OUT,
            "Timed out waiting for operation to finish, retry call to resume",
            retriable=True,
        )
    )


def transport() -> KafkaException:
    """What the add-offsets step raised once on a broker restart: not retriable, not
    abortable, not fatal."""
    return KafkaException(
        KafkaError(
            KafkaError._TRANSPORT, "Failed to add offsets to transaction: Broker transport failure"
        )
    )


def fenced() -> KafkaException:
    return KafkaException(
        KafkaError(
            KafkaError._FENCED, "This instance has been fenced by a newer instance", fatal=True
        )
    )


def abortable() -> KafkaException:
    return KafkaException(
        KafkaError(
            KafkaError.ILLEGAL_GENERATION,
            "Specified group generation id is not valid",
            txn_requires_abort=True,
        )
    )


class Scripted:
    """A transactional producer whose calls follow a script per method (then succeed)."""

    def __init__(self, **script: Sequence[Action]) -> None:
        self.script = {name: list(actions) for name, actions in script.items()}
        self.calls: list[str] = []
        self.release = threading.Event()  # ends every HANG
        self.full = 0  # produce raises BufferError this many times
        self.flushes = 0

    def _act(self, name: str, timeout: float = -1) -> None:
        self.calls.append(name)
        actions = self.script.get(name)
        if not actions:
            return
        action = actions.pop(0)
        if action == HANG:
            self.release.wait()
        elif isinstance(action, NativeHang):
            action.wait()
        elif isinstance(action, float):
            time.sleep(min(action, timeout) if timeout >= 0 else action)
            if timeout >= 0 and action > timeout:
                raise timed_out()
        elif isinstance(action, BaseException):
            raise action

    def init_transactions(self, timeout: float = -1) -> None:
        self._act("init", timeout)

    def begin_transaction(self) -> None:
        self._act("begin")

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = -1
    ) -> None:
        self._act("add_offsets", timeout)

    def commit_transaction(self, timeout: float = -1) -> None:
        self._act("commit", timeout)

    def abort_transaction(self, timeout: float = -1) -> None:
        self._act("abort", timeout)

    def produce(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        callback: DeliveryCallback | None = None,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        if self.full:
            self.full -= 1
            raise BufferError("Local: Queue full")
        self.calls.append("produce")

    def poll(self, timeout: float = -1) -> int:
        return 0

    def flush(self, timeout: float = -1) -> int:
        self.flushes += 1
        self._act("flush", timeout)
        return 0

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        return None

    def __len__(self) -> int:
        return 0


class Producers:
    """A producer factory handing out scripted producers in turn (a new one per call)."""

    def __init__(self, *producers: Scripted) -> None:
        self.queue = list(producers)
        self.made: list[Scripted] = []

    def __call__(self, conf: dict[str, Any]) -> Scripted:
        p = self.queue.pop(0) if self.queue else Scripted()
        self.made.append(p)
        return p

    def release_all(self) -> None:
        for p in self.made:
            p.release.set()
