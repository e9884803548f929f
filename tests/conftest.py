"""A real PostgreSQL server for the tests that ask for ``postgres_dsn`` (weir.testing.postgres),
unit and integration tests alike.

Started once per session, on first use, and stopped at its end. Such tests are skipped only
where no PostgreSQL can be had: no server binaries and no WEIR_POSTGRES_DSN, or no psycopg.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

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
