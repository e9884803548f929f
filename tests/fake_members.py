"""Settings of the members the unit tests start on the scripted FakeConsumer (topic "t", group
"g"): a quick owner loop (10 ms polls, a commit after every record, short revoke and shutdown
bounds), so that what a test waits for happens within milliseconds."""

from __future__ import annotations

from weir.config import ConsumerSettings

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
