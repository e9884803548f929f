"""The output serializers mirror the deserializers: what one writes, the other reads back."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from weir.serde import (
    json_deserializer,
    json_serializer,
    pydantic_deserializer,
    pydantic_serializer,
)


class Order(BaseModel):
    id: int
    note: str


def test_json_round_trips_and_keeps_a_null() -> None:
    obj = {"id": 7, "note": "café", "items": [1, 2]}
    data = json_serializer()(obj)
    assert data == '{"id":7,"note":"café","items":[1,2]}'.encode()
    assert json_deserializer()(data) == obj
    assert json_serializer()(None) is None
    with pytest.raises(ValueError, match="None where JSON was expected"):
        json_serializer(allow_null=False)(None)
    with pytest.raises(TypeError, match="not JSON serializable"):
        json_serializer()(object())


def test_pydantic_round_trips_and_refuses_another_type() -> None:
    order = Order(id=3, note="x")
    data = pydantic_serializer(Order)(order)
    assert pydantic_deserializer(Order)(data) == order
    with pytest.raises(TypeError, match="expected a Order, got dict"):
        pydantic_serializer(Order)({"id": 3, "note": "x"})  # type: ignore[arg-type]
