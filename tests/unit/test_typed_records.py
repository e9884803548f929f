"""Typed records: `Record[Order]` types `deserialized_value` for the type checker, a bare `Record`
still means `Record[Any]` under `mypy --strict`, and a handler whose record type does not match
its deserializer is refused by mypy. The typed handlers here are checked by the project's mypy
run over tests (what type-checks); `test_mypy_reports_*` runs mypy on a snippet (what must not)."""

from __future__ import annotations

import copy
import pickle
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from tests.fake_members import FAKE_LOOP
from tests.waiting import wait_until

from weir import (
    BatchContext,
    BatchHandler,
    Context,
    GroupConsumer,
    Handler,
    Partition,
    Record,
    Route,
)
from weir.serde import pydantic_deserializer
from weir.testing.fake import FakeConsumer

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
WAIT = 10.0
SETTINGS: dict[str, Any] = {k: v for k, v in FAKE_LOOP.items() if k != "topics"}
ORDERS = Partition("orders", 0)
TOPICS = ["orders"]


class Order(BaseModel):
    id: int
    total: float


def order_bytes(offset: int) -> bytes:
    return Order(id=offset, total=offset * 1.5).model_dump_json().encode()


class Totals(Handler):
    """A class handler typed by its records' value: `total` is a float to mypy."""

    def __init__(self) -> None:
        self.totals: list[float] = []
        self.lock = threading.Lock()

    def handle(self, record: Record[Order], ctx: Context) -> None:
        total: float = record.deserialized_value.total
        with self.lock:
            self.totals.append(total)


class BatchTotals(BatchHandler):
    def __init__(self) -> None:
        self.totals: list[float] = []

    def handle_batch(self, records: list[Record[Order]], ctx: BatchContext) -> None:
        self.totals.extend(r.deserialized_value.total for r in records)


def untyped(record: Record) -> None:
    """A bare `Record`, as every handler before typed records: `Record[Any]`, no error under
    `disallow_any_generics`."""
    record.deserialized_value.anything_goes  # noqa: B018


def committed(fake: FakeConsumer, tp: Partition) -> int:
    return max((off for off, _ in fake.commits_for(tp)), default=-1)


def fake_orders(count: int) -> FakeConsumer:
    fake = FakeConsumer()
    fake.produce_many("orders", 0, range(count), value=order_bytes)
    fake.script_assign([ORDERS])
    return fake


def run(members: list[GroupConsumer], fake: FakeConsumer, end: int, **kw: Any) -> None:
    """A member on `fake` with `kw` (the handler, its deserializer, or routes) until `end` is
    committed."""
    gc = GroupConsumer(consumer_factory=fake.factory, **kw, **SETTINGS)
    members.append(gc)
    gc.start()
    wait_until(lambda: committed(fake, ORDERS) == end, "every order committed", WAIT)


def test_a_typed_function_handler_reads_the_model_of_its_deserializer(
    members: list[GroupConsumer],
) -> None:
    totals: list[float] = []

    def handle(record: Record[Order]) -> None:
        totals.append(record.deserialized_value.total)

    deserializer = pydantic_deserializer(Order)
    run(members, fake_orders(3), 3, handler=handle, value_deserializer=deserializer, topics=TOPICS)
    assert totals == [0.0, 1.5, 3.0]


def test_typed_class_batch_and_routed_handlers_read_their_models(
    members: list[GroupConsumer],
) -> None:
    deserializer = pydantic_deserializer(Order)
    one, batch = Totals(), BatchTotals()
    run(
        members,
        fake_orders(2),
        2,
        handler=one,
        value_deserializer={"orders": deserializer},
        topics=TOPICS,
    )
    assert one.totals == [0.0, 1.5]
    run(members, fake_orders(2), 2, handler=batch, value_deserializer=deserializer, topics=TOPICS)
    assert batch.totals == [0.0, 1.5]

    routed: list[float] = []

    def route(record: Record[Order]) -> None:
        routed.append(record.deserialized_value.total)

    run(
        members, fake_orders(2), 2, routes={"orders": Route(route, value_deserializer=deserializer)}
    )
    assert routed == [0.0, 1.5]


def test_a_parameterized_record_is_the_same_record_at_run_time() -> None:
    """The parameter is for the type checker: `Record[Order]` builds a plain `Record`, which
    keeps its slots (no per-record `__dict__`), and compares, pickles and copies as before."""
    typed = Record[Order]("orders", 0, 7, b"k", b"v")
    plain = Record("orders", 0, 7, b"k", b"v")
    assert type(typed) is Record and typed == plain
    assert not hasattr(plain, "__dict__")
    assert pickle.loads(pickle.dumps(typed)) == plain
    assert copy.deepcopy(typed) == plain and copy.copy(typed) is typed
    assert repr(typed) == repr(plain)
    assert Record[Order] == Record[Order] and Record[Order].__origin__ is Record  # type: ignore[attr-defined]


# What mypy must refuse, each line marked with the error code it must report there (and no other
# line may have one): a wrong attribute of the model, a model's field used as another type, a
# record of one model passed as another, and a handler given a deserializer of another model,
# on a route and on a member.
SNIPPET = """\
from pydantic import BaseModel

from weir import Context, GroupConsumer, Handler, Record, Route
from weir.serde import json_deserializer, pydantic_deserializer


class Order(BaseModel):
    id: int
    total: float


class Invoice(BaseModel):
    id: int


class Reprice(Handler):
    def handle(self, record: Record[Order], ctx: Context) -> None:
        print(record.deserialized_value.total)
        print(record.deserialized_value.totl)  # E: attr-defined
        label: str = record.deserialized_value.total  # E: assignment
        bill(record)  # E: arg-type


def bill(record: Record[Invoice]) -> None:
    print(record.deserialized_value.id)


def by_order(record: Record[Order]) -> None:
    print(record.deserialized_value.total)


def untyped(record: Record) -> None:
    print(record.deserialized_value.whatever)


def as_model(record: Record[Order]) -> Record[BaseModel]:
    return record


Route(by_order, value_deserializer=pydantic_deserializer(Order))
Route(by_order, value_deserializer=json_deserializer())
Route(untyped, value_deserializer=pydantic_deserializer(Invoice))
Route(by_order, value_deserializer=pydantic_deserializer(Invoice))  # E: misc
GroupConsumer(
    by_order,
    value_deserializer=pydantic_deserializer(Order),
    bootstrap_servers="localhost:9092",
    group_id="g",
    topics=["orders"],
)
GroupConsumer(  # E: misc
    by_order,
    value_deserializer={"orders": pydantic_deserializer(Invoice)},
    bootstrap_servers="localhost:9092",
    group_id="g",
    topics=["orders"],
)
"""


def test_mypy_reports_a_wrong_attribute_and_a_mismatched_deserializer(tmp_path: Path) -> None:
    from mypy import api

    source = tmp_path / "typed_snippet.py"
    source.write_text(SNIPPET)
    expected = {
        (n, m.group(1))
        for n, line in enumerate(SNIPPET.splitlines(), 1)
        if (m := re.search(r"# E: ([a-z-]+)$", line))
    }
    # The project's settings and cache: after `make typecheck` only the snippet is checked.
    stdout, stderr, _ = api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            "--show-error-codes",
            "--no-pretty",
            str(source),
        ]
    )
    found = {
        (int(m.group(1)), m.group(2))
        for m in re.finditer(r"typed_snippet\.py:(\d+): error: .*\[([a-z-]+)\]$", stdout, re.M)
    }
    assert found == expected, f"mypy said:\n{stdout}{stderr}"
    assert '"Order" has no attribute "totl"' in stdout
