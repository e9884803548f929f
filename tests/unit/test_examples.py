"""The side-effect example must do what docs/rebalances.md says it does."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from examples.idempotent_sink import SCHEMA, FencedSink, IdempotentSink, main

from weir import Context, Partition, Record
from weir.errors import FencedError
from weir.fencing import SqliteFence

GROUP = "orders-app"
T0 = Partition("orders", 0)


def _rec(offset: int, value: bytes) -> Record:
    return Record("orders", 0, offset, b"k", value, (), None, None, len(value) + 1)


def _ctx(rec: Record, epoch: int | None = None) -> Context:
    return Context(1, 1, rec.event_id, threading.Event(), epoch)


def test_replays_write_one_row_per_event() -> None:
    db = sqlite3.connect(":memory:", check_same_thread=False)
    db.execute(SCHEMA)
    sink = IdempotentSink(db)
    for value in (b"a", b"b", b"b"):
        sink.handle(_rec(5, value), _ctx(_rec(5, value)))
    assert db.execute("select event_id, value from orders").fetchall() == [("orders/0/5", b"b")]


def test_fenced_sink_refuses_an_older_owner_after_a_newer_one_acquired(tmp_path: Path) -> None:
    path = tmp_path / "orders.db"
    with sqlite3.connect(path) as db:
        db.execute(SCHEMA)
    old_fence, new_fence = SqliteFence(path), SqliteFence(path)
    old = old_fence.acquire(GROUP, [T0])[T0]
    new = new_fence.acquire(GROUP, [T0])[T0]
    rec = _rec(9, b"new")
    FencedSink(new_fence, GROUP).handle(rec, _ctx(rec, new))
    FencedSink(new_fence, GROUP).handle(rec, _ctx(rec, new))  # a replay: no second row
    with pytest.raises(FencedError):
        FencedSink(old_fence, GROUP).handle(_rec(9, b"zombie"), _ctx(rec, old))
    with sqlite3.connect(path) as db:
        assert db.execute("select value from orders").fetchall() == [(b"new",)]
    old_fence.close()
    new_fence.close()


def test_the_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    main()
    out = capsys.readouterr().out
    assert "new owner applies: True" in out
    assert "replay is a no-op: False" in out
    assert "zombie refused:" in out and "is fenced" in out
    assert "rows: 1" in out
