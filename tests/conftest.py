"""Fixtures shared by the unit and integration tests (the broker fixtures come from the weir
pytest plugin)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture
def restore_structlog() -> Iterator[None]:
    # main() configures structlog for a terminal; keep that out of the rest of the session.
    was_configured = structlog.is_configured()
    config = structlog.get_config()
    yield
    if was_configured:
        structlog.configure(**config)
    else:
        structlog.reset_defaults()
