"""Fixtures for every tier: members a test started, stopped after it; and a real PostgreSQL server
for the tests that ask for ``postgres_dsn`` (weir.testing.postgres), unit and integration tests
alike.

Started once per session, on first use, and stopped at its end. Such tests are skipped only
where no PostgreSQL can be had: no server binaries and no WEIR_POSTGRES_DSN, or no psycopg.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from weir import GroupConsumer
from weir.testing.postgres import (
    ENV_DSN,
    PostgresNotFoundError,
    find_postgres_bindir,
    postgres_for_tests,
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "postgres_dsn" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    pytest.importorskip(
        "psycopg", reason="psycopg is not installed: pip install 'kafka-weir[postgres]'"
    )
    if not os.environ.get(ENV_DSN):
        try:
            find_postgres_bindir()
        except PostgresNotFoundError as exc:
            pytest.skip(str(exc))
    with postgres_for_tests() as dsn:
        yield dsn


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
