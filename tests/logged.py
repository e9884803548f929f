"""Reading weir's events back from the records pytest's `caplog` captured."""

from __future__ import annotations

from typing import Any

import pytest


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    """The fields of every `name` event captured so far, in order."""
    return [
        dict(r.msg) for r in caplog.records if isinstance(r.msg, dict) and r.msg["event"] == name
    ]
