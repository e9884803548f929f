"""Unknown settings explained: a setting renamed since, one given at the wrong level, or a close
match of a known name, in place of pydantic's bare "extra inputs are not permitted"."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection
from typing import Any

from pydantic import BaseModel, ValidationError, ValidatorFunctionWrapHandler
from pydantic_core import InitErrorDetails, PydanticCustomError

__all__ = ["RENAMED", "explain_unknown_fields", "suggest", "with_suggestions"]


# Names of earlier versions, before every setting said its unit: the name now, and the unit.
RENAMED: dict[str, tuple[str, str]] = {
    **{
        old: (f"{old}_s", "seconds")
        for old in (
            "poll_timeout",
            "commit_interval",
            "revoke_timeout",
            "shutdown_timeout",
            "startup_timeout",
        )
    },
    **{
        f"{name}_ms": (f"{name}_s", "seconds")
        for name in ("session_timeout", "heartbeat_interval", "max_poll_interval")
    },
    # A count of records, not of bytes (a Kafka producer's batch.size is bytes).
    "commit_every": ("commit_every_records", "records"),
    "max_batch": ("max_batch_records", "records"),
}


def _unknown(message: str) -> PydanticCustomError:
    return PydanticCustomError("unknown_setting", "{message}", {"message": message})


def with_suggestions(
    error: ValidationError, explain: Callable[[tuple[int | str, ...]], str]
) -> ValidationError:
    """`error` with each unknown setting explained: renamed, misplaced, or a close match."""
    details: list[InitErrorDetails] = []
    for e in error.errors():
        detail: InitErrorDetails = {"type": e["type"], "loc": e["loc"], "input": e["input"]}
        if "ctx" in e:
            detail["ctx"] = e["ctx"]
        if e["type"] == "extra_forbidden":
            detail = {"type": _unknown(explain(e["loc"])), "loc": e["loc"], "input": e["input"]}
        elif e["type"] == "unknown_setting":  # a nested model's, already explained
            detail = {"type": _unknown(e["msg"]), "loc": e["loc"], "input": e["input"]}
        details.append(detail)
    return ValidationError.from_exception_data(error.title, details, hide_input=True)


def suggest(name: str, choices: Collection[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f"unknown setting {name!r}" + (f": did you mean {close[0]!r}?" if close else "")


def explain_unknown_fields(
    cls: type[BaseModel],
    data: Any,
    handler: ValidatorFunctionWrapHandler,
    explain: Callable[[tuple[int | str, ...]], str] | None = None,
) -> Any:
    """The body of a settings model's `model_validator(mode="wrap")`: an unknown field is
    explained by `explain`, by default with the closest of the model's own names (also where
    the model is nested in `ConsumerConfig`, whose explanations know only its own names)."""
    try:
        return handler(data)
    except ValidationError as exc:
        closest = explain or (lambda loc: suggest(str(loc[-1]), cls.model_fields))
        raise with_suggestions(exc, closest) from None
