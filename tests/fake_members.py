"""Settings of the members the unit tests start on the scripted FakeConsumer (topic "t", group
"g"): a quick owner loop (10 ms polls, a commit after every record, short revoke and shutdown
bounds), so that what a test waits for happens within milliseconds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from weir import GroupConsumer
from weir.config import ConsumerSettings
from weir.testing.fake import FakeConsumer

TOPIC = "t"

FAKE_LOOP: ConsumerSettings = {
    "bootstrap_servers": "fake:9092",
    "group_id": "g",
    "topics": [TOPIC],
    "poll_timeout_s": 0.01,
    "commit_interval_s": 0.01,
    "commit_every_records": 1,
    "revoke_timeout_s": 2.0,
    "shutdown_timeout_s": 5.0,
}
"""The quick loop alone, for tests that choose the workers themselves."""

SETTINGS: ConsumerSettings = {**FAKE_LOOP, "startup_timeout_s": 1.0, "workers": 4}
"""The quick loop with four workers and a start that gives up after a second."""


def started(
    members: list[GroupConsumer],
    fake: FakeConsumer,
    handler: Any,
    settings: Mapping[str, Any] = SETTINGS,
    wait_s: float = 10.0,
    **overrides: Any,
) -> GroupConsumer:
    """A member on `fake` with `settings` and `overrides`, started and up within `wait_s`;
    appended to `members` (the fixture that stops them after the test)."""
    gc = GroupConsumer(handler, consumer_factory=fake.factory, **{**settings, **overrides})
    members.append(gc)
    gc.start()
    assert gc.wait_started(wait_s)
    return gc
