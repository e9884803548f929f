"""`ConsumerSettings`, the TypedDict behind `GroupConsumer(handler, **settings)`, stays equal to
ConsumerConfig's fields: same names, same types, the same ones required."""

from __future__ import annotations

from tests.consumer_overrides import Overrides
from typing_extensions import get_type_hints

from weir import ConsumerConfig
from weir.config import ConsumerSettings


def test_the_settings_have_the_configs_fields_and_types() -> None:
    hints = get_type_hints(ConsumerSettings)  # strips Required on 3.10 too
    fields = {name: field.annotation for name, field in ConsumerConfig.model_fields.items()}
    assert hints == fields


def test_the_required_settings_are_the_required_fields() -> None:
    required = {name for name, f in ConsumerConfig.model_fields.items() if f.is_required()}
    assert required == {"bootstrap_servers", "group_id", "topics"}
    assert ConsumerSettings.__required_keys__ == required
    assert ConsumerSettings.__optional_keys__ == set(ConsumerConfig.model_fields) - required


def test_the_test_overrides_are_the_optional_settings() -> None:
    hints = get_type_hints(ConsumerSettings)
    optional = {name: hints[name] for name in ConsumerSettings.__optional_keys__}
    assert get_type_hints(Overrides) == optional
    assert Overrides.__required_keys__ == frozenset()
