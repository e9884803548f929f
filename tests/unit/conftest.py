"""Fixtures shared by the unit tests that start members on a fake client."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from weir import GroupConsumer


@pytest.fixture
def members() -> Iterator[list[GroupConsumer]]:
    """Members a test started (it appends them): stopped, then joined, after the test."""
    started: list[GroupConsumer] = []
    yield started
    for gc in started:
        gc.stop()
    for gc in started:
        with contextlib.suppress(Exception):
            gc.join(10)
