"""The reference pages (docs/reference-*.md, `make docs`) are rendered from docstrings, and with
`show_if_no_docstring` a name without one still gets a heading: a signature and nothing to say
what it is for. About 130 public methods and properties had none (issue 30); these tests fail on
the first one that is added without a docstring again.

What counts as public: every name in the `__all__` of the public modules, and every public method
and property a public class *writes in its own body*. Left out, because nobody writes them and the
reference documents them elsewhere:

- inherited members (their docstring belongs where they are written);
- what machinery generates: dataclass and `__slots__` fields (member descriptors), NamedTuple
  fields (tuple getters, which say only "Alias for field number N"), enum members, pydantic's own
  methods and `model_config`, plain class attributes; the fields are described by the class
  docstring or, for settings, by the field's description (below);
- dunder and `_private` names, which the reference filters out (`filters: ["!^_"]`).

A constant or type alias in `__all__` has no `__doc__` of its own at run time (`inspect.getdoc`
would answer with `str`'s or `dict`'s); its docstring is the string literal under its assignment,
which is what the reference shows, so the module's source is read for it.

Settings models: `ConsumerConfig`'s fields are checked by tests/unit/test_config_docs.py (its
table in docs/configuration.md is rendered from them); the other public models, `FlowConfig`,
`RetryPolicy` and `FailurePolicy`, are checked here: every field has a description, and a number
its unit.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import itertools
import sys
import typing
from collections.abc import Iterator
from types import FunctionType, ModuleType

from pydantic import BaseModel
from tests.unit.test_config_docs import unit

MODULES = (
    "weir",
    "weir.testing",
    "weir.fencing",
    "weir.admin",
    "weir.deadletters",
    "weir.serde",
    "weir.routing",
    "weir.ops",
)
# Described in docs/configuration.md's table, which tests/unit/test_config_docs.py renders.
CHECKED_BY_CONFIG_DOCS = {"ConsumerConfig"}


def public_names() -> Iterator[tuple[str, str, object]]:
    """(module, name, object) for every name a public module exports."""
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            yield module_name, name, getattr(module, name)


def public_classes() -> list[type]:
    seen: dict[int, type] = {}
    for _, _, obj in public_names():
        if isinstance(obj, type):
            seen.setdefault(id(obj), obj)
    return list(seen.values())


NOT_WRITTEN = object()


def written_docstring(cls: type, value: object) -> object:
    """The docstring of a method or property written in `cls`'s body (None if it has none), or
    NOT_WRITTEN for what is not one (fields, enum members, class attributes) or what machinery
    generated."""
    if isinstance(value, property) and not isinstance(value.fget, FunctionType):
        # `property(operator.attrgetter(...))`, for speed: its docstring is the `doc=` given,
        # not the getter's class's.
        return None if value.__doc__ == type(value.fget).__doc__ else value.__doc__
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    elif isinstance(value, property):
        value = value.fget
    elif isinstance(value, functools.cached_property):
        value = value.func
    if not isinstance(value, FunctionType):
        return NOT_WRITTEN
    # A generated method (pydantic's, a dataclass's) is not named after the class's body.
    return value.__doc__ if value.__qualname__.startswith(f"{cls.__qualname__}.") else NOT_WRITTEN


@functools.cache
def module_tree(module: ModuleType) -> ast.Module:
    return ast.parse(inspect.getsource(module))


def assignment_docstring(module: ModuleType, name: str) -> str | None:
    """The string literal right under `name = ...` at the top of `module`, if it assigns it."""
    body = module_tree(module).body
    for statement, following in itertools.pairwise(body):
        targets: list[ast.expr] = (
            list(statement.targets)
            if isinstance(statement, ast.Assign)
            else [statement.target]
            if isinstance(statement, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
                return str(following.value.value)
            return None
    return None


def value_docstring(name: str, obj: object) -> str | None:
    """A constant's or alias's docstring, read in the module that assigns it."""
    for module_name, module in sorted(sys.modules.items()):
        if module_name.split(".")[0] != "weir" or module.__dict__.get(name) is not obj:
            continue
        try:
            doc = assignment_docstring(module, name)
        except (OSError, TypeError):
            continue
        if doc:
            return doc
    return None


def own_docstring(obj: object) -> str | None:
    if isinstance(obj, type):
        doc = obj.__dict__.get("__doc__")
        # A dataclass or NamedTuple without one is given its signature: that says nothing.
        if doc and doc.startswith(f"{obj.__name__}("):
            return None
        return doc if isinstance(doc, str) else None
    if isinstance(obj, FunctionType):
        return obj.__doc__
    return None


def test_every_exported_name_has_a_docstring() -> None:
    missing = []
    for module_name, name, obj in public_names():
        doc = own_docstring(obj)
        if doc is None and not isinstance(obj, type | FunctionType):
            doc = value_docstring(name, obj)
        if not (doc or "").strip():
            missing.append(f"{module_name}.{name}")
    assert not missing, f"{len(missing)} exported names have no docstring:\n" + "\n".join(missing)


def test_every_public_method_and_property_has_a_docstring() -> None:
    missing = []
    for cls in public_classes():
        for attr, value in vars(cls).items():
            if attr.startswith("_"):
                continue
            doc = written_docstring(cls, value)
            if doc is not NOT_WRITTEN and not (str(doc or "")).strip():
                missing.append(f"{cls.__module__}.{cls.__qualname__}.{attr}")
    assert not missing, (
        f"{len(missing)} public methods and properties have no docstring:\n" + "\n".join(missing)
    )


def settings_models() -> list[type[BaseModel]]:
    return [
        cls
        for cls in public_classes()
        if issubclass(cls, BaseModel) and cls.__name__ not in CHECKED_BY_CONFIG_DOCS
    ]


def test_every_setting_of_the_other_models_says_what_it_is_and_a_number_its_unit() -> None:
    assert {m.__name__ for m in settings_models()} >= {"FlowConfig", "RetryPolicy", "FailurePolicy"}
    missing = []
    for model in settings_models():
        for name, field in model.model_fields.items():
            where = f"{model.__name__}.{name}"
            if not (field.description and field.description.endswith(".")):
                missing.append(f"{where}: no description (a sentence)")
            numbers = {int, float} & set(typing.get_args(field.annotation) or (field.annotation,))
            if numbers and not unit(name, field):
                missing.append(f"{where}: a number without a unit")
    assert not missing, f"{len(missing)} settings are not described:\n" + "\n".join(missing)


def test_the_checks_see_what_they_should() -> None:
    # The exclusions must not leave the checks with nothing to look at.
    from weir import Record
    from weir.testing import FakeConsumer

    assert written_docstring(Record, vars(Record)["size"])
    assert written_docstring(FakeConsumer, vars(FakeConsumer)["consume"]) is not NOT_WRITTEN
    assert assignment_docstring(importlib.import_module("weir.routing"), "RouteKey")
    # A NamedTuple's field is generated, not written.
    from weir import Partition

    assert written_docstring(Partition, vars(Partition)["topic"]) is NOT_WRITTEN
