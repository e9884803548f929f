"""docs/configuration.md's settings table is rendered from `ConsumerConfig` itself: one row per
field with its type and unit, its default, its bounds and its description. The table had gone
stale (no `failure`, `failure_by_topic`, `callback_errors` nor `transaction*` rows) while it said
it listed every setting; now the test fails when the two differ.

To rewrite the table after changing a field: `.venv/bin/python -m tests.unit.test_config_docs`.
"""

from __future__ import annotations

import collections.abc
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from weir import ConsumerConfig
from weir._secrets import SecretCallback

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
COMMAND = ".venv/bin/python -m tests.unit.test_config_docs"
BEGIN = (
    "<!-- The settings table is rendered from weir.ConsumerConfig: edit the fields' descriptions "
    f"in src/weir/config.py, then run `{COMMAND}`. -->"
)
END = "<!-- End of the settings table. -->"
HEADER = "| setting | type, unit | default | rules |\n|---|---|---|---|\n"


def type_text(tp: Any) -> str:
    """A field's type as the table says it."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return ", ".join(f'`"{a}"`' for a in args)
    if origin is collections.abc.Callable:
        return "callable"
    if origin in (typing.Union, types.UnionType):
        # The token provider's wrapper is what validation makes of a callable: not given.
        given = [a for a in args if a is not type(None) and a is not SecretCallback]
        text = ", ".join(type_text(a) for a in given[:-1])
        text = f"{text} or {type_text(given[-1])}" if text else type_text(given[-1])
        return f"{text} or None" if type(None) in args else text
    if origin is list:
        return f"list of {type_text(args[0])}"
    if origin is not None and isinstance(origin, type) and issubclass(origin, Mapping):
        return f"mapping of {type_text(args[0])} to {type_text(args[1])}"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return f"`{tp.__name__}`"
    return str(tp.__name__)


def unit(name: str, field: FieldInfo) -> str | None:
    """Durations are seconds, named `..._s`; a count says its unit in json_schema_extra."""
    if name.endswith("_s"):
        return "s"
    extra = field.json_schema_extra
    return str(extra["unit"]) if isinstance(extra, dict) and "unit" in extra else None


def number(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def default_text(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel) and value == type(value)():
        return f"`{type(value).__name__}()`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, bool) or value is None or isinstance(value, Mapping):
        return f"`{value!r}`"
    return number(value)


def bounds(field: FieldInfo) -> str | None:
    """The field's numeric bounds (and a list's minimum length), as the table says them."""
    said: dict[type, str] = {}
    for m in field.metadata:
        if isinstance(m, at.MinLen) and typing.get_origin(field.annotation) is list:
            return "at least one" if m.min_length == 1 else f"at least {m.min_length}"
        for kind, sign in ((at.Ge, "≥"), (at.Gt, ">"), (at.Le, "≤"), (at.Lt, "<")):
            if isinstance(m, kind):
                said[kind] = f"{sign} {number(getattr(m, kind.__name__.lower()))}"
    if at.Ge in said and at.Le in said:
        return f"{said[at.Ge][2:]} ... {said[at.Le][2:]}"
    return " and ".join(said.values()) or None


def row(name: str, field: FieldInfo) -> str:
    assert field.description, f"ConsumerConfig.{name} has no description"
    kind = type_text(field.annotation)
    per = unit(name, field)
    rules = ". ".join(r for r in (bounds(field), field.description) if r)
    cells = (f"`{name}`", f"{kind}, {per}" if per else kind, default_text(field), rules)
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |\n"


def table() -> str:
    rows = "".join(row(name, f) for name, f in ConsumerConfig.model_fields.items())
    return f"{BEGIN}\n\n{HEADER}{rows}\n{END}"


def rendered(doc: str) -> str:
    """`doc` with its settings table rendered from the model."""
    start, end = doc.index(BEGIN), doc.index(END) + len(END)
    return doc[:start] + table() + doc[end:]


def test_the_settings_table_is_the_models() -> None:
    doc = DOC.read_text()
    assert doc.count(BEGIN) == 1 and doc.count(END) == 1, "the table's markers are missing"
    assert doc == rendered(doc), (
        f"docs/configuration.md's settings table differs from ConsumerConfig: run `{COMMAND}` "
        "to render it again (and review the diff)"
    )


def test_every_setting_says_what_it_is_and_a_number_its_unit() -> None:
    for name, field in ConsumerConfig.model_fields.items():
        assert field.description and field.description.endswith("."), name
        numbers = {int, float} & set(typing.get_args(field.annotation) or (field.annotation,))
        if numbers:
            assert unit(name, field), f"ConsumerConfig.{name}: a number without a unit"


def test_the_rendering_shows_types_defaults_and_bounds() -> None:
    # The table is only as good as these: a few rows spelled out by hand.
    fields = ConsumerConfig.model_fields
    assert row("workers", fields["workers"]).startswith(
        "| `workers` | int, threads | 8 | 1 ... 1024. Thread handlers only"
    )
    assert row("poll_timeout_s", fields["poll_timeout_s"]).startswith(
        "| `poll_timeout_s` | float, s | 0.1 | > 0 and ≤ 1. The longest"
    )
    assert row("session_timeout_s", fields["session_timeout_s"]).startswith(
        "| `session_timeout_s` | float or None, s | `None` | 0.001 ... 3600. Classic"
    )
    assert row("topics", fields["topics"]).startswith(
        "| `topics` | list of str | required | at least one. Topic names"
    )
    assert row("ordering", fields["ordering"]).startswith(
        '| `ordering` | `"key"`, `"partition"`, `"unordered"` | `"key"` | What runs'
    )
    assert row("flow", fields["flow"]).startswith("| `flow` | `FlowConfig` | `FlowConfig()` | ")
    assert row("failure_by_topic", fields["failure_by_topic"]).startswith(
        "| `failure_by_topic` | mapping of str to `FailurePolicy` | `{}` | "
    )
    assert row("kafka", fields["kafka"]).startswith(
        "| `kafka` | mapping of str to str, int, float, bool, SecretStr or callable | `{}` | "
    )
    assert row("commit_every_records", fields["commit_every_records"]).startswith(
        "| `commit_every_records` | int, records | 10000 | ≥ 1. See"
    )


if __name__ == "__main__":
    text = DOC.read_text()
    new = rendered(text)
    DOC.write_text(new)
    print(f"{DOC}: {'rendered again' if new != text else 'unchanged'}", file=sys.stderr)
