"""weir.fencing on SQLite (a file): every test of tests/fence_suite.py (tests/integration/
test_fencing_postgres.py runs them on PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.fence_suite import *  # noqa: F403 (the suite's tests, collected here)
from tests.fence_suite import Backend, sqlite_backend


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[Backend]:
    yield from sqlite_backend(tmp_path)
