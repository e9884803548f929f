"""The side-effect example must do what docs/rebalances.md says it does."""

from __future__ import annotations

import sqlite3
import threading

import pytest
from examples.idempotent_sink import SCHEMA, FencedSink, IdempotentSink, StaleOwnerError

from weir import Context, Record


def _db() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", check_same_thread=False)
    db.executescript(SCHEMA)
    return db


def _rec(offset: int, value: bytes) -> Record:
    return Record("orders", 0, offset, b"k", value, (), None, None, len(value) + 1)


def _ctx(token: int, rec: Record) -> Context:
    return Context(token, 1, rec.event_id, threading.Event())


def test_replays_write_one_row_per_event() -> None:
    db = _db()
    sink = IdempotentSink(db)
    for value in (b"a", b"b", b"b"):
        sink.handle(_rec(5, value), _ctx(1, _rec(5, value)))
    assert db.execute("select event_id, value from orders").fetchall() == [("orders/0/5", b"b")]


def test_fenced_sink_refuses_an_older_owner_after_a_newer_one_wrote() -> None:
    db = _db()
    sink = FencedSink(db)
    rec = _rec(9, b"new")
    sink.handle(rec, _ctx(7, rec))
    with pytest.raises(StaleOwnerError):
        sink.handle(_rec(9, b"zombie"), _ctx(3, rec))
    assert db.execute("select value from orders").fetchall() == [(b"new",)]
