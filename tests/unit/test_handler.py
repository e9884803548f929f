"""`Handler` is an ABC whose `handle` is abstract: a subclass without it fails where it is
built, while `def handle`, `async def handle`, the optional hooks and every wrapper weir puts
around a handler keep working."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from weir import Context, GroupConsumer, Handler, Partition, Record
from weir.fencing import FencedBatchHandler, FencedHandler, SqliteFence
from weir.records import HOOKS, as_handler, is_async_handler
from weir.serde import AsyncDeserializingHandler, DeserializingHandler
from weir.testing.fake import FakeConsumer

SETTINGS: dict[str, Any] = {"bootstrap_servers": "fake:9092", "group_id": "g", "topics": ["t"]}
MISSING = r"does not define handle\(\): a Handler subclass must, as def handle\(self, record, ctx\)"


class Sync(Handler):
    def handle(self, record: Record, ctx: Context) -> None:
        pass


class Async(Handler):
    async def handle(self, record: Record, ctx: Context) -> None:
        pass


def test_the_base_class_and_a_subclass_without_handle_cannot_be_built() -> None:
    with pytest.raises(TypeError, match="Handler " + MISSING):
        Handler()  # type: ignore[abstract]  # on purpose

    class HooksOnly(Handler):
        def on_revoked(self, partitions: Sequence[Partition]) -> None:
            pass

    with pytest.raises(TypeError, match="HooksOnly " + MISSING):
        HooksOnly()  # type: ignore[abstract]  # on purpose


def test_an_abstract_base_of_ones_own_is_fine_until_it_is_built() -> None:
    """A base class of the application's that leaves `handle` to its subclasses, with an
    `__init__` of its own and another abstract method: built only through a subclass that
    defines both; one that defines only `handle` gets the ABC's own refusal."""
    from abc import abstractmethod

    class Base(Handler):
        def __init__(self, name: str, *, extra: int = 0) -> None:
            self.name = name
            self.extra = extra

        @abstractmethod
        def target(self) -> str: ...

    class Concrete(Base):
        def handle(self, record: Record, ctx: Context) -> None:
            pass

        def target(self) -> str:
            return self.name

    built = Concrete("orders", extra=2)
    assert (built.target(), built.extra) == ("orders", 2)
    assert copy.copy(built).name == "orders"

    class NoTarget(Base):
        def handle(self, record: Record, ctx: Context) -> None:
            pass

    with pytest.raises(TypeError, match=r"abstract method '?target"):
        NoTarget("x")  # type: ignore[abstract]  # on purpose


@pytest.mark.parametrize(("handler", "is_async"), [(Sync(), False), (Async(), True)])
def test_def_and_async_def_handle_both_work_and_the_hooks_are_optional(
    handler: Handler, is_async: bool
) -> None:
    assert is_async_handler(handler) is is_async
    assert as_handler(handler) is handler
    for hook in HOOKS:
        args = () if hook == "on_shutdown" else ([Partition("t", 0)],)
        assert getattr(handler, hook)(*args) is None
    gc = GroupConsumer(
        handler,
        key_deserializer=lambda b: b,
        consumer_factory=FakeConsumer().factory,
        **SETTINGS,
    )
    wrapper = AsyncDeserializingHandler if is_async else DeserializingHandler
    assert type(gc._handler) is wrapper
    assert is_async_handler(gc._handler) is is_async


def test_weirs_own_handlers_are_built_as_before(tmp_path: Path) -> None:
    """Functions become handlers, and the fenced handler (a Generic subclass) is built with
    its arguments, subscripted or not."""

    async def coroutine(record: Record) -> None:
        pass

    assert not is_async_handler(as_handler(lambda record: None))
    assert is_async_handler(as_handler(coroutine))
    fence = SqliteFence(tmp_path / "fence.db")
    try:
        plain = FencedHandler(fence, "g", lambda conn, record: None)
        subscripted = FencedHandler[Any](fence, "g", lambda conn, record: None)
        assert not is_async_handler(plain) and not is_async_handler(subscripted)
    finally:
        fence.close()


def test_a_fenced_handler_refuses_a_write_that_runs_nothing_when_called(tmp_path: Path) -> None:
    """An `async def` write (given, or a subclass's `write`) is called inside the fence's
    transaction and never awaited: each record's event id would commit with none of its
    writes, and its replay would be skipped. Refused where the handler is built."""

    async def write(conn: Any, record: Record) -> None:
        pass

    class Subclassed(FencedHandler[Any]):
        async def write(self, conn: Any, record: Record) -> None:
            pass

    class BatchSubclassed(FencedBatchHandler[Any]):
        def write(self, conn: Any, records: list[Record]) -> Iterator[None]:
            yield None

    fence = SqliteFence(tmp_path / "fence.db")
    try:
        with pytest.raises(TypeError, match=r"write .*write is async def or has a yield"):
            FencedHandler(fence, "g", write)
        with pytest.raises(TypeError, match=r"write .*Subclassed\.write is async def"):
            Subclassed(fence, "g")
        with pytest.raises(TypeError, match=r"write .*BatchSubclassed\.write is async def"):
            BatchSubclassed(fence, "g")
    finally:
        fence.close()
