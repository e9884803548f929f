"""What happens to a record whose handler failed: retries, then a final policy.

A failure is never a silent skip. A record is retried with exponential backoff and jitter up to
`max_attempts` or `max_elapsed_s`; a record waiting for its next attempt holds no worker and
holds back only what its ordering requires (its key, its partition, or in unordered mode nothing
but the watermark). After the last attempt the final policy decides:

- `"stop"`: the member drains, commits below the record and stops with `HandlerError`;
- `"dead_letter"`: the record is written to a dead-letter topic and counts as finished once the
  broker confirmed the write; a write that fails blocks the partition instead;
- `"block"`: the partition is paused (the member stays in the group), the record is retried on a
  slow schedule and on `GroupConsumer.retry_now`; `GroupConsumer.skip` skips it deliberately.

docs/failures.md has the whole story.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidatorFunctionWrapHandler,
    field_serializer,
    field_validator,
    model_validator,
)

from weir._topics import topic_name_problem
from weir._unknown_settings import explain_unknown_fields
from weir.errors import NonRetryable

__all__ = ["FailurePolicy", "NonRetryable", "RetryPolicy"]


class RetryPolicy(BaseModel):
    """Exponential backoff with jitter: attempt n (n >= 2) waits
    `min(backoff_max_s, backoff_initial_s * backoff_multiplier ** (n - 2))`, shortened by up to
    `jitter` of itself at random so that records failing together do not retry together."""

    # The fields' docstrings are their descriptions (tests/unit/test_public_docstrings.py).
    model_config = ConfigDict(
        frozen=True, extra="forbid", arbitrary_types_allowed=True, use_attribute_docstrings=True
    )

    @model_validator(mode="wrap")
    @classmethod
    def _explain_unknown(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return explain_unknown_fields(cls, data, handler)

    max_attempts: int = Field(
        3, ge=1, le=1_000_000, strict=True, json_schema_extra={"unit": "attempts"}
    )
    """Attempts in all, the first one included: 1 means no retry."""
    max_elapsed_s: float | None = Field(None, gt=0, strict=True, allow_inf_nan=False)
    """No new attempt once this long has passed since the first failure (None: no limit)."""
    backoff_initial_s: float = Field(0.2, ge=0, strict=True, allow_inf_nan=False)
    """The wait before the second attempt."""
    backoff_max_s: float = Field(30.0, ge=0, strict=True, allow_inf_nan=False)
    """No wait is longer than this; not below `backoff_initial_s`."""
    backoff_multiplier: float = Field(
        2.0, ge=1, strict=True, allow_inf_nan=False, json_schema_extra={"unit": "factor"}
    )
    """Each wait after the first is this many times the one before (up to `backoff_max_s`)."""
    jitter: float = Field(
        0.2, ge=0, le=1, strict=True, allow_inf_nan=False, json_schema_extra={"unit": "fraction"}
    )
    """Each wait is shortened by up to this share of itself, at random, so that records that
    failed together do not retry together (0: no jitter)."""
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    """Exception types that are retried (their subclasses too)."""
    no_retry: tuple[type[BaseException], ...] = ()
    """Exception types never retried, even when `retry_on` matches. `NonRetryable` never is."""

    @field_validator("retry_on", "no_retry", mode="before")
    @classmethod
    def _exception_types(cls, v: object) -> object:
        if isinstance(v, type):
            v = (v,)
        if not isinstance(v, list | tuple):
            raise ValueError("must be a tuple of exception types")
        for t in v:
            if not (isinstance(t, type) and issubclass(t, BaseException)):
                raise ValueError(f"{t!r} is not an exception type")
        return tuple(v)

    @field_serializer("retry_on", "no_retry")
    def _type_names(self, v: tuple[type[BaseException], ...]) -> list[str]:
        return [f"{t.__module__}.{t.__qualname__}" for t in v]

    @model_validator(mode="after")
    def _backoff(self) -> RetryPolicy:
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(
                f"backoff_max_s ({self.backoff_max_s:g}) must not be below backoff_initial_s "
                f"({self.backoff_initial_s:g})"
            )
        return self

    def retries(self, error: BaseException) -> bool:
        """Whether this kind of error is worth another attempt."""
        if isinstance(error, NonRetryable) or not isinstance(error, Exception):
            return False
        return isinstance(error, self.retry_on) and not isinstance(error, self.no_retry)

    def delay(self, attempt: int, draw: float) -> float:
        """Seconds to wait before `attempt` (2 or more); `draw` is uniform in [0, 1)."""
        base = self.backoff_initial_s * self.backoff_multiplier ** max(0, attempt - 2)
        base = min(self.backoff_max_s, base)
        return base * (1.0 - self.jitter * draw)


class FailurePolicy(BaseModel):
    """Retries, then what to do with a record that still fails (per consumer, and per topic
    through `ConsumerConfig.failure_by_topic`)."""

    # The fields' docstrings are their descriptions (tests/unit/test_public_docstrings.py).
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    @model_validator(mode="wrap")
    @classmethod
    def _explain_unknown(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return explain_unknown_fields(cls, data, handler)

    retry: RetryPolicy = RetryPolicy()
    """How often and how soon a failing record is tried again."""
    final: Literal["stop", "dead_letter", "block"] = "stop"
    """What happens to a record whose retries are spent: "stop" stops the member, committing
    below the record, and `run()` raises `HandlerError`; "dead_letter" writes it to the
    dead-letter topic and goes on; "block" pauses its partition and tries the record again every
    `block_retry_s` until it succeeds or an operator lets it go ([failures](failures.md))."""
    dead_letter_topic: str | None = Field(None, min_length=1, max_length=249)
    """Where `final="dead_letter"` writes; default `<topic>.dlq`."""
    create_dead_letter_topic: bool = True
    """Create a missing dead-letter topic at start (with the source topic's partition count);
    False: a missing one is an error at start."""
    block_retry_s: float = Field(60.0, gt=0, strict=True, allow_inf_nan=False)
    """While blocked, how often the record is tried again (also on `retry_now`)."""
    deserialization_retries: bool = False
    """Retry a record whose key or value failed to deserialize (the bytes will not change)."""
    max_error_chars: int = Field(
        1000, ge=16, le=100_000, strict=True, json_schema_extra={"unit": "characters"}
    )
    """The exception message kept in a dead letter's headers is cut to this length."""
    dead_letter_timeout_s: float = Field(30.0, ge=1, le=3600, strict=True, allow_inf_nan=False)
    """How long a dead-letter write may take before it counts as failed (the partition then
    blocks); the consumer-wide policy's value applies to every topic."""

    @field_validator("dead_letter_topic")
    @classmethod
    def _dead_letter_topic(cls, v: str | None) -> str | None:
        # Here, where the policy is built: the member would fail only at start, creating or
        # writing the topic.
        problem = None if v is None else topic_name_problem(v)
        if problem is not None:
            raise ValueError(problem)
        return v

    def dead_letter_for(self, topic: str) -> str:
        """The dead-letter topic of records from `topic`."""
        return self.dead_letter_topic or f"{topic}.dlq"
