"""A handler that stops its own member and then waits for it (`join()`, `join_async()`) would
wait for itself: the member's end waits for the handler's call. Measured before the refusal, on
a real broker: 30 s (the shutdown budget) per such call, `shutdown_budget_exceeded`, and the
record ran again at the next start. A hook or a commit listener (on the owner thread) waiting
for it: threading's "cannot join current thread", or an `async def` hook's time limit."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tests.fake_members import SETTINGS, TOPIC, started
from tests.waiting import wait_until

from weir import BatchContext, BatchHandler, Context, GroupConsumer, Handler, Record
from weir.testing.fake import FakeConsumer

pytestmark = pytest.mark.timeout(30)

REFUSED = "inside this member's own handler or hook would wait for that call itself"


def fake_with_records() -> FakeConsumer:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3))
    fake.script_assign([(TOPIC, 0)])
    return fake


class Joining:
    """At its first call: stop the member, then wait for it (`how`); `said` gets the outcome."""

    def __init__(self, how: str = "join") -> None:
        self.how = how
        self.said: list[str] = []
        self.member: GroupConsumer | None = None
        self.go = threading.Event()  # the member is known
        self.lock = threading.Lock()
        self.done = False

    def first(self) -> GroupConsumer | None:
        self.go.wait(10)
        with self.lock:
            if self.done or self.member is None:
                return None
            self.done = True
        self.member.stop()
        return self.member

    @contextlib.contextmanager
    def noting(self) -> Iterator[None]:
        """What the wait inside did: 'returned', or the RuntimeError's message."""
        try:
            yield
            self.said.append("returned")
        except RuntimeError as exc:
            self.said.append(str(exc))

    def __call__(self, record: Record) -> None:
        gc = self.first()
        if gc is not None:
            with self.noting():
                gc.join(5)


class JoiningAsync(Joining):
    async def __call__(self, record: Record) -> None:  # type: ignore[override]
        gc = self.first()
        if gc is not None:
            with self.noting():
                if self.how == "join_async":
                    await gc.join_async()
                else:
                    gc.join(5)


class JoiningBatch(BatchHandler):
    def __init__(self, inner: Joining) -> None:
        self.inner = inner

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        self.inner(records[0])


class JoiningAsyncBatch(BatchHandler):
    def __init__(self, inner: JoiningAsync) -> None:
        self.inner = inner

    async def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        await self.inner(records[0])


@pytest.mark.parametrize(
    "kind", ["thread", "batch", "async join", "async join_async", "async batch join_async"]
)
def test_a_handler_waiting_for_its_own_member_is_refused_at_once(
    members: list[GroupConsumer], kind: str
) -> None:
    handlers: dict[str, Callable[[], Any]] = {
        "thread": Joining,
        "batch": lambda: JoiningBatch(Joining()),
        "async join": lambda: JoiningAsync("join"),
        "async join_async": lambda: JoiningAsync("join_async"),
        "async batch join_async": lambda: JoiningAsyncBatch(JoiningAsync("join_async")),
    }
    handler = handlers[kind]()
    joining = handler.inner if isinstance(handler, JoiningBatch | JoiningAsyncBatch) else handler
    gc = started(members, fake_with_records(), handler)
    joining.member = gc
    joining.go.set()
    wait_until(lambda: joining.said, "the handler waited for its member")
    began = time.monotonic()
    gc.join(10)
    assert time.monotonic() - began < 2.0, "the member waited for its own handler"
    call = "join_async()" if kind.endswith("join_async") else "join()"
    [said] = joining.said
    assert said.startswith(f"{call} {REFUSED}")


def test_a_handler_may_wait_for_another_member_even_one_it_serves_too(
    members: list[GroupConsumer],
) -> None:
    """Only a member's own calls are refused, known by the member's workers, not by its handler:
    one Handler instance serves two members here, and a call for one joins the other."""
    said: list[str] = []
    other: list[GroupConsumer] = []

    class Shared(Handler):
        def handle(self, record: Record, ctx: Context) -> None:
            if record.value == b"mine" and not said:
                other[0].stop()
                try:
                    other[0].join(5)
                    said.append("returned")
                except RuntimeError as exc:
                    said.append(str(exc))

    shared = Shared()
    theirs = FakeConsumer()
    theirs.produce(TOPIC, 0, b"theirs")
    theirs.script_assign([(TOPIC, 0)])
    other.append(started(members, theirs, shared, group_id="o"))
    mine = FakeConsumer()
    mine.produce(TOPIC, 0, b"mine")
    mine.script_assign([(TOPIC, 0)])
    started(members, mine, shared)
    wait_until(lambda: said, "the other member joined from a handler")
    assert said == ["returned"]


class JoiningHooks(Handler):
    """Its `hook` stops and waits for its member; `said` gets what the wait did."""

    def __init__(self, hook: str, how: str = "join") -> None:
        self.joining = JoiningAsync(how) if how == "join_async" else Joining(how)
        self.hook = hook

    def handle(self, record: Record, ctx: Context) -> None:
        pass

    def _wait(self) -> Any:
        gc = self.joining.first()
        if gc is not None:
            with self.joining.noting():
                gc.join(5)

    def on_assigned(self, partitions: Any) -> None:
        if self.hook == "on_assigned":
            self._wait()

    def on_shutdown(self) -> None:
        if self.hook == "on_shutdown":
            self._wait()


class JoiningAsyncHooks(Handler):
    """`async def` handler and hooks: `on_assigned` awaits its member's end."""

    def __init__(self) -> None:
        self.joining = JoiningAsync("join_async")

    async def handle(self, record: Record, ctx: Context) -> None:
        pass

    async def on_assigned(self, partitions: Any) -> None:
        gc = self.joining.first()
        if gc is not None:
            with self.joining.noting():
                await gc.join_async()


@pytest.mark.parametrize("kind", ["on_assigned", "on_shutdown", "a commit listener", "async"])
def test_a_hook_waiting_for_its_own_member_is_refused_at_once(
    members: list[GroupConsumer], kind: str
) -> None:
    """Hooks and commit listeners run on the member's owner thread (an `async def` hook is
    awaited by it): waiting there for the member's end waits for the waiting call itself."""
    handler: JoiningHooks | JoiningAsyncHooks
    handler = JoiningAsyncHooks() if kind == "async" else JoiningHooks(kind)
    joining = handler.joining
    if isinstance(handler, JoiningHooks) and kind == "a commit listener":
        gc = GroupConsumer(handler, consumer_factory=fake_with_records().factory, **SETTINGS)
        members.append(gc)

        def listener(event: Any) -> None:
            handler._wait()

        gc.add_commit_listener(listener)
        gc.start()
    else:
        gc = started(members, fake_with_records(), handler)
    joining.member = gc
    joining.go.set()
    if kind == "on_shutdown":
        gc.stop()
    wait_until(lambda: joining.said, "the hook waited for its member")
    began = time.monotonic()
    gc.join(10)
    assert time.monotonic() - began < 2.0, "the member waited for its own hook"
    call = "join_async()" if kind == "async" else "join()"
    [said] = joining.said
    assert said.startswith(f"{call} {REFUSED}")
