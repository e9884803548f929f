"""Unknown settings explained: a setting renamed since, one given at the wrong level, or a close
match of a known name, in place of pydantic's bare "extra inputs are not permitted"."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection

from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

__all__ = ["RENAMED", "suggest", "with_suggestions"]


# Names of 0.1, before every duration said its unit.
RENAMED = {
    old: f"{old}_s"
    for old in (
        "poll_timeout",
        "commit_interval",
        "revoke_timeout",
        "shutdown_timeout",
        "startup_timeout",
    )
} | {
    f"{name}_ms": f"{name}_s"
    for name in ("session_timeout", "heartbeat_interval", "max_poll_interval")
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
