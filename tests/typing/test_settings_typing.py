"""`GroupConsumer(handler, **settings)` is typed: mypy (this file is in its `files`) reports a
misspelled, missing or mistyped setting, and so does the constructor at run time.

Each call mypy must refuse carries `# type: ignore[code]`: under `warn_unused_ignores` (strict),
an ignore that no longer silences an error fails the type check, so the file fails `make
typecheck` the day a wrong call stops being a type error."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from weir import ConsumerConfig, GroupConsumer, Record
from weir.config import ConsumerSettings


def handle(record: Record) -> None:
    pass


def test_settings_type_check() -> None:
    consumer = GroupConsumer(
        handle,
        bootstrap_servers="broker:9092",
        group_id="g",
        topics=["orders", "^audit-.*"],
        workers=4,
        session_timeout_s=10,  # an int is a float here too
        kafka={"client.id": "me", "fetch.min.bytes": 1},
    )
    assert consumer.config.workers == 4
    settings: ConsumerSettings = {"bootstrap_servers": "b:9092", "group_id": "g", "topics": ["t"]}
    assert GroupConsumer(handle, **settings).config.group_id == "g"
    assert GroupConsumer(handle, ConsumerConfig(**settings)).config.group_id == "g"


REQUIRED: ConsumerSettings = {"bootstrap_servers": "broker:9092", "group_id": "g", "topics": ["t"]}


def test_a_misspelled_setting_is_refused() -> None:
    with pytest.raises(ValidationError, match="did you mean 'workers'"):
        GroupConsumer(handle, **REQUIRED, workres=4)  # type: ignore[call-overload]


def test_a_missing_required_setting_is_refused() -> None:
    with pytest.raises(ValidationError, match="topics"):
        GroupConsumer(handle, bootstrap_servers="broker:9092", group_id="g")  # type: ignore[call-overload]


def test_a_mistyped_setting_is_refused() -> None:
    with pytest.raises(ValidationError, match="valid integer"):
        GroupConsumer(handle, **REQUIRED, workers="4")  # type: ignore[call-overload]
    with pytest.raises(ValidationError, match="ordering"):
        GroupConsumer(handle, **REQUIRED, ordering="random")  # type: ignore[call-overload]


def test_a_config_and_settings_together_are_refused() -> None:
    config = ConsumerConfig(**REQUIRED)
    with pytest.raises(TypeError, match="not both"):
        GroupConsumer(handle, config, workers=4)  # type: ignore[call-overload]
