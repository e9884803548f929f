"""Configuration: typed fields for what weir owns, a pass-through mapping for librdkafka.

Everything is validated before a `Consumer` is built, so a contradiction is a `ValidationError`
naming the field, never a half-started member. The `kafka` mapping is checked by librdkafka
itself: a throwaway consumer that knows no broker is built from the whole configuration and
closed at once (`weir._librdkafka_probe`). The rules on secrets, ids, topics and the `kafka`
mapping live in modules of their own; this one holds the models.
"""

from __future__ import annotations

import math
import numbers
import re
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError
from typing_extensions import TypedDict

from weir._ids import id_problem, member_id_problem, shown, text_problem
from weir._kafka_mapping import FORCED_OFF, TYPED_KEYS, KafkaSetting, KafkaValue, value_problems
from weir._librdkafka_probe import librdkafka_refusals
from weir._secrets import (
    SENSITIVE_KEYS,
    SecretCallback,
    is_secret_key,
    mask_secrets,
    masked,
    wrap_secret,
)
from weir._topics import topic_name_problem, topic_problem
from weir._unknown_settings import RENAMED, explain_unknown_fields, suggest
from weir.logs import get_logger
from weir.policy import FailurePolicy
from weir.records import Ordering

__all__ = [
    "SENSITIVE_KEYS",
    "ConsumerConfig",
    "ConsumerSettings",
    "FlowConfig",
    "KafkaSetting",
    "KafkaValue",
    "is_secret_key",
    "mask_secrets",
]


log = get_logger(__name__)


def _refuse(problem: str | None) -> None:
    """A field validator's refusal: pydantic turns the ValueError into its ValidationError."""
    if problem is not None:
        raise ValueError(problem)


# librdkafka's upper bound for queued.max.messages.kbytes, which weir sizes to the flow headroom.
_MAX_QUEUED_KBYTES = 2_097_151


# Each mark of the flow budget and the mark it must stay below: by how much at least, and how
# to say so. The byte headroom holds the client's fetch buffer, which is at least 1 MiB.
_BELOW = "must be below {above} ({high})"
_MARK_BELOW: dict[str, tuple[str, int, str]] = {
    "pause_records": ("capacity_records", 1, _BELOW),
    "resume_records": ("pause_records", 1, _BELOW),
    "pause_bytes": (
        "capacity_bytes",
        1024 * 1024,
        "must leave at least 1 MiB of headroom below {above} ({high}) for the client's fetch "
        "buffer",
    ),
    "resume_bytes": ("pause_bytes", 1, _BELOW),
}


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class FlowConfig(BaseModel):
    """In-flight budget: records registered and not finished (queued, running, awaiting retry).

    Fetching pauses when either count reaches its `pause_*` mark and resumes once both are below
    their `resume_*` mark. The gap between `pause_*` and `capacity_*` is the headroom one fetched
    batch may use, so a batch already fetched can never push the total past the capacity.
    """

    # The fields' docstrings are their descriptions (tests/unit/test_public_docstrings.py).
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    # Numbers are strict: "4" or True is a mistake, not a count.
    capacity_records: int = Field(1200, ge=2, strict=True, json_schema_extra={"unit": "records"})
    """The hard bound on records in flight: the client's partitions are paused here. Higher: more
    memory held, and more records run again after a crash."""
    pause_records: int = Field(1000, ge=1, strict=True, json_schema_extra={"unit": "records"})
    """Records in flight at which fetching is throttled to one record per poll; below
    `capacity_records`, whose gap is the headroom one fetched batch may use."""
    resume_records: int = Field(400, ge=0, strict=True, json_schema_extra={"unit": "records"})
    """Fetching runs at full speed again once the records in flight are below this (and the bytes
    below `resume_bytes`); below `pause_records`, so that it does not flap."""
    capacity_bytes: int = Field(
        96 * 1024 * 1024, ge=2 * 1024 * 1024, strict=True, json_schema_extra={"unit": "bytes"}
    )
    """The hard bound on key + value + header bytes in flight: the client's partitions are paused
    here. It bounds the member's memory for records."""
    pause_bytes: int = Field(
        64 * 1024 * 1024, ge=1024 * 1024, strict=True, json_schema_extra={"unit": "bytes"}
    )
    """Bytes in flight at which fetching is throttled; at least 1 MiB below `capacity_bytes`, and
    at most 2 GiB below, since the client's fetch buffer is sized to the gap."""
    resume_bytes: int = Field(
        32 * 1024 * 1024, ge=0, strict=True, json_schema_extra={"unit": "bytes"}
    )
    """Fetching runs at full speed again once the bytes in flight are below this (and the records
    below `resume_records`); below `pause_bytes`."""
    read_ahead_records: int = Field(
        10_000, ge=0, strict=True, json_schema_extra={"unit": "records"}
    )
    """While partitions share the record budget: records consumed past a partition's share that
    may wait read ahead, in all (an even part per partition). Their bytes count in the byte
    budget, their number not in the record counts. Lower: prefetched records are fetched again
    more often ([flow control](flow-control.md))."""

    @model_validator(mode="wrap")
    @classmethod
    def _explain_unknown(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return explain_unknown_fields(cls, data, handler)

    @field_validator(*_MARK_BELOW)
    @classmethod
    def _below_the_mark_above(cls, v: int, info: ValidationInfo) -> int:
        name = str(info.field_name)
        above, least_gap, rule = _MARK_BELOW[name]
        high = info.data.get(above)
        if high is not None and high - v < least_gap:
            raise ValueError(f"{name} ({v}) {rule.format(above=above, high=high)}")
        return v

    @field_validator("pause_bytes")
    @classmethod
    def _fetch_buffer_bound(cls, v: int, info: ValidationInfo) -> int:
        cap = info.data.get("capacity_bytes")
        if cap is not None and cap - v > _MAX_QUEUED_KBYTES * 1024:
            raise ValueError(
                f"capacity_bytes - pause_bytes ({cap - v}) must stay within 2 GiB: the client's "
                "fetch buffer is sized to it, and librdkafka's queued.max.messages.kbytes "
                f"stops at {_MAX_QUEUED_KBYTES}"
            )
        return v

    @property
    def headroom_records(self) -> int:
        """`capacity_records - pause_records`: the bound of `max_batch_records`."""
        return self.capacity_records - self.pause_records

    @property
    def headroom_bytes(self) -> int:
        """`capacity_bytes - pause_bytes`: the bytes the client's fetch buffer may hold."""
        return self.capacity_bytes - self.pause_bytes


def async_flow(max_in_flight: int) -> FlowConfig:
    """The record marks of async handlers when `flow` is not given: 16 records of budget per
    record that may run at once (at least the thread defaults), resume at 40 % and capacity at
    120 % of the pause mark, as the defaults do; the byte marks, which bound memory, stay.
    With 1 ms coroutines 256 at a time drain the thread default of 1000 in a few
    milliseconds, and the loop then waited on fetching at every throttle (benchmarks/README.md
    has the figures)."""
    return _scaled_flow(16 * max_in_flight)


def batch_flow(batch_max_records: int) -> FlowConfig:
    """The record marks of batch handlers when `flow` is not given: 8 batches of budget (at
    least the thread defaults), shaped as `async_flow`. A batch that is gathered holds its
    records, and in key mode the records behind its keys wait in the budget too: with the
    thread default of 1000, batches of 500 paused fetching at every batch (a no-op batch
    handler ran at a quarter of the rate it has with 8 batches)."""
    return _scaled_flow(8 * batch_max_records)


def _scaled_flow(pause: int) -> FlowConfig:
    pause = max(FlowConfig.model_fields["pause_records"].default, pause)
    return FlowConfig(
        pause_records=pause, resume_records=pause * 2 // 5, capacity_records=pause * 6 // 5
    )


def for_async_handler(config: ConsumerConfig, **held_back: Any) -> ConsumerConfig:
    """`config` as an async handler's member runs it: with `async_flow` in place of the default
    `flow` (a `flow` given is kept), validated again as a whole, since every rule that reads
    the flow must hold for the budget the member will use. `held_back`: settings left out of
    `config` because the default flow would refuse them (`max_batch_records`), validated here
    against the member's own."""
    if "flow" in config.model_fields_set:
        return config
    flow = async_flow(config.max_in_flight)
    return _with_flow(
        config,
        flow,
        f"flow was not given, and an async handler's is async_flow(max_in_flight="
        f"{config.max_in_flight}) = {flow!r}: pass flow=FlowConfig(...) to choose it",
        held_back,
    )


def for_batch_handler(config: ConsumerConfig, **held_back: Any) -> ConsumerConfig:
    """`config` as a batch handler's member runs it: `batch_flow` in place of the default
    `flow`, as `for_async_handler` does (`held_back` too); a `flow` given must hold a whole
    batch."""
    if "flow" in config.model_fields_set:
        if config.batch_max_records > config.flow.pause_records:
            raise ValueError(
                f"batch_max_records ({config.batch_max_records}) is larger than "
                f"flow.pause_records ({config.flow.pause_records}): fetching pauses before a "
                "batch could fill, so every batch would wait batch_max_wait_s"
            )
        return config
    flow = batch_flow(config.batch_max_records)
    return _with_flow(
        config,
        flow,
        f"flow was not given, and a batch handler's is batch_flow(batch_max_records="
        f"{config.batch_max_records}) = {flow!r}: pass flow=FlowConfig(...) to choose it",
        held_back,
    )


def with_settings(config: ConsumerConfig, **more: Any) -> ConsumerConfig:
    """`config` with `more` settings, validated again as a whole."""
    given = {name: getattr(config, name) for name in config.model_fields_set}
    return ConsumerConfig(**given, **more)


def _with_flow(
    config: ConsumerConfig, flow: FlowConfig, note: str, held_back: dict[str, Any]
) -> ConsumerConfig:
    try:
        return with_settings(config, **held_back, flow=flow)
    except ValidationError as exc:
        raise _noted(exc, note) from None


def _noted(error: ValidationError, note: str) -> ValidationError:
    """`error` with `note` after each of its messages."""
    details: list[InitErrorDetails] = [
        {
            "type": PydanticCustomError(
                e["type"], "{message}", {"message": f"{e['msg']} ({note})"}
            ),
            "loc": e["loc"],
            "input": e["input"],
        }
        for e in error.errors()
    ]
    return ValidationError.from_exception_data(error.title, details, hide_input=True)


# librdkafka's session.timeout.ms default, which max.poll.interval.ms may not be below.
_CLIENT_SESSION_TIMEOUT_S = 45.0


class ConsumerConfig(BaseModel):
    """Settings of one `GroupConsumer` member."""

    # Inputs are hidden in errors because the `kafka` mapping may hold credentials.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    # The descriptions are docs/configuration.md's settings table (tests/unit/test_config_docs.py
    # renders it); a count's unit is its json_schema_extra "unit", a duration's the "_s".
    bootstrap_servers: str = Field(
        min_length=1, description="The brokers to start from: `host:port[,host:port...]`."
    )
    group_id: str = Field(
        min_length=1,
        description="The consumer group: 1 to 32767 bytes of UTF-8, not starting with "
        "whitespace, no NUL ([ids](#ids-and-names)).",
    )
    topics: list[str] = Field(
        min_length=1,
        description="Topic names, and regular expressions starting with `^`, in any mix "
        "([below](#topics-and-regular-expressions)).",
    )

    ordering: Ordering = Field(
        "key",
        description="What runs one record at a time, in offset order: a key's records, a "
        "partition's, or none ([workers-and-ordering.md](workers-and-ordering.md)). With "
        "`routes=`, that of the routes without an ordering of their own "
        "([routing.md](routing.md#ordering)).",
    )
    # Numbers are strict: "4" or True is a mistake, not a count; an int is a fine float.
    workers: int = Field(
        8,
        ge=1,
        le=1024,
        strict=True,
        json_schema_extra={"unit": "threads"},
        description="Thread handlers only: the worker threads (set for an async handler: the "
        "warning `workers_unused`).",
    )
    # Sized for I/O: a coroutine waiting on a socket costs a few kilobytes, not a thread.
    max_in_flight: int = Field(
        256,
        ge=1,
        le=100_000,
        strict=True,
        json_schema_extra={"unit": "records"},
        description="Async handlers only (`async def`): records running at once on the event "
        "loop, in place of worker threads; for an `async def handle_batch`, its calls "
        "([handlers.md](handlers.md)); set for a thread handler: the warning "
        "`max_in_flight_unused`.",
    )

    max_records_per_s: float | None = Field(
        None,
        gt=0,
        strict=True,
        allow_inf_nan=False,
        json_schema_extra={"unit": "records/s"},
        description="At most this many records handed to the handler per second by the member "
        "(None: no limit); the member keeps polling while records wait "
        "([flow-control.md](flow-control.md#rate-limits)).",
    )
    max_records_per_s_by_topic: Mapping[str, float] = Field(
        default_factory=dict,
        json_schema_extra={"unit": "records/s"},
        description="`max_records_per_s` per topic, on top of the member's: names as subscribed, "
        "or topics a subscribed pattern matches.",
    )
    max_records_per_s_per_key: float | None = Field(
        None,
        gt=0,
        strict=True,
        allow_inf_nan=False,
        json_schema_extra={"unit": "records/s"},
        description="At most this many records of one key (in one topic) handed to the handler "
        'per second, on top of the other limits; `ordering="key"` only (with routes: the '
        "topics in key order), and records without a key are not limited by it "
        "([flow-control.md](flow-control.md#per-key)).",
    )

    group_protocol: Literal["classic", "consumer", "auto"] = Field(
        "classic",
        description='`"consumer"` is KIP-848 (brokers 4.0 and later); `"auto"`: `"consumer"` '
        "where the broker offers it (the ConsumerGroupHeartbeat API in its API versions, asked "
        'at start), `"classic"` otherwise ([rebalances.md](rebalances.md#protocols)).',
    )
    assignment_strategy: Literal["range", "roundrobin", "cooperative-sticky"] | None = Field(
        None,
        description='Classic protocol only (with `"auto"`: if it runs classic); None: '
        '`"cooperative-sticky"`.',
    )
    remote_assignor: Literal["uniform", "range"] | None = Field(
        None,
        description='`group_protocol="consumer"` or `"auto"` (if it runs consumer); None: the '
        "broker's.",
    )
    group_instance_id: str | None = Field(
        None,
        min_length=1,
        description="Static membership ([rebalances.md](rebalances.md)): an id as `group_id`, "
        "at most 32730 bytes under the classic protocol; None: a dynamic member.",
    )
    # Durations are seconds, as everywhere in Python (floats, names ending in _s); weir converts
    # the librdkafka ones to its milliseconds, within librdkafka's ranges.
    session_timeout_s: float | None = Field(
        None,
        ge=0.001,
        le=3600,
        strict=True,
        allow_inf_nan=False,
        description='Classic protocol only (a broker setting under KIP-848; with `"auto"`: if '
        "it runs classic); None: librdkafka's, 45 s.",
    )
    heartbeat_interval_s: float | None = Field(
        None,
        ge=0.001,
        le=3600,
        strict=True,
        allow_inf_nan=False,
        description='Classic protocol only (with `"auto"`: if it runs classic); below '
        "`session_timeout_s`; None: librdkafka's, 3 s.",
    )
    max_poll_interval_s: float = Field(
        300.0,
        ge=0.001,
        le=86400,
        strict=True,
        allow_inf_nan=False,
        description="How long the member may go without polling before the group drops it; "
        "classic protocol: not below `session_timeout_s` (or librdkafka's 45 s when that is "
        "None).",
    )
    auto_offset_reset: Literal["earliest", "latest", "error"] = Field(
        "earliest",
        description="Where a partition with no committed offset starts (unless `start_at` "
        "is set), and where one whose committed offset is out of range goes.",
    )
    start_at: datetime | None = Field(
        None,
        strict=True,
        description="A timezone-aware time: a partition with no committed offset starts at "
        "its first record at or after it (the log end if none is that late); a committed "
        'offset always wins. Not with `auto_offset_reset="error"` '
        "([seeking](seeking.md)).",
    )
    # librdkafka's default is 5 minutes; 30 s costs one metadata request per member every 30 s
    # (all topics' under a regex subscription).
    topic_refresh_s: float = Field(
        30.0,
        ge=0.1,
        le=3600,
        strict=True,
        allow_inf_nan=False,
        description="How often the client refreshes topic metadata: a new topic a classic "
        "pattern matches is consumed within this time "
        "([below](#how-soon-a-new-topic-is-consumed)).",
    )

    flow: FlowConfig = Field(
        FlowConfig(),
        description="The in-flight budget of records and bytes "
        "([flow-control.md](flow-control.md)); its counts are strict ints.",
    )
    max_batch_records: int = Field(
        200,
        ge=1,
        le=100_000,
        strict=True,
        json_schema_extra={"unit": "records"},
        description="Records fetched at most per poll; at most `flow.capacity_records - "
        "flow.pause_records`.",
    )
    # Batch handlers only (`weir.BatchHandler`); a per-record handler refuses them when given.
    batch_max_records: int = Field(
        500,
        ge=1,
        le=100_000,
        strict=True,
        json_schema_extra={"unit": "records"},
        description="Batch handlers only: records per `handle_batch` call at most; at most "
        "`flow.pause_records` of a `flow` given (without one, a batch handler's budget is 8 "
        "batches) ([handlers.md](handlers.md#batch-handlers)).",
    )
    batch_max_wait_s: float = Field(
        0.05,
        ge=0,
        le=60,
        strict=True,
        allow_inf_nan=False,
        description="Batch handlers only: how long a batch that is not full waits for more "
        "records before it runs (0: it runs with what is there).",
    )
    batch_max_bytes: int | None = Field(
        None,
        ge=1,
        strict=True,
        json_schema_extra={"unit": "bytes"},
        description="Batch handlers only: bytes (`Record.size`: key, value and headers) per "
        "`handle_batch` call at most; a record larger than that is a batch alone (None: no "
        "bound) ([handlers.md](handlers.md#batch-handlers)).",
    )
    flush_timeout_s: float = Field(
        30.0,
        gt=0,
        strict=True,
        allow_inf_nan=False,
        description="Handlers with an `on_flush` hook only: how long the owner waits for one "
        "flush (at shutdown, at most what is left of `shutdown_timeout_s`); past it the flush "
        "counts as failed and is left running on its thread. At most half of "
        "`max_poll_interval_s` ([handlers.md](handlers.md#the-flush-hook)).",
    )
    poll_timeout_s: float = Field(
        0.1,
        gt=0,
        le=1.0,
        strict=True,
        allow_inf_nan=False,
        description="The longest the owner thread blocks in the client.",
    )
    commit_interval_s: float = Field(
        1.0,
        gt=0,
        strict=True,
        allow_inf_nan=False,
        description="An async commit when this much time or `commit_every_records` records have "
        "passed, whichever comes first (a restart replays at most about this much).",
    )
    # Each commit request is a write to __consumer_offsets.
    commit_every_records: int = Field(
        10_000,
        ge=1,
        strict=True,
        json_schema_extra={"unit": "records"},
        description="See `commit_interval_s`.",
    )
    revoke_timeout_s: float = Field(
        10.0,
        gt=0,
        strict=True,
        allow_inf_nan=False,
        description="The whole drain of revoked partitions; at most half of "
        "`max_poll_interval_s` ([rebalances.md](rebalances.md)).",
    )
    shutdown_timeout_s: float = Field(
        30.0,
        gt=0,
        strict=True,
        allow_inf_nan=False,
        description="The drain on stop or failure.",
    )
    startup_timeout_s: float = Field(
        30.0,
        gt=0,
        strict=True,
        allow_inf_nan=False,
        description="How long to wait at start for a broker to answer; a stop (`stop()`, "
        "SIGINT or SIGTERM in `run()`) ends the wait within a quarter of a second, and the "
        "member stops without an error.",
    )

    offset_map: bool = Field(
        True,
        description="Every commit carries the offsets finished above the committed one, and a "
        "new owner skips them ([offset-map.md](offset-map.md)).",
    )
    # The broker's offset.metadata.max.bytes is 4096 by default.
    offset_map_max_bytes: int = Field(
        4096,
        ge=64,
        le=1_048_576,
        strict=True,
        json_schema_extra={"unit": "bytes"},
        description="The offset map's size per partition, at most the broker's "
        "`offset.metadata.max.bytes` (a larger map is cut, never the commit).",
    )

    output_timeout_s: float = Field(
        30.0,
        ge=1,
        le=3600,
        strict=True,
        allow_inf_nan=False,
        description="At-least-once outputs (`ctx.produce` without `transactional_id`): how long "
        "an output may take to be confirmed by the broker before it counts as failed and its "
        "record goes to the failure policy ([producing.md](producing.md)).",
    )

    transactional_id: str | None = Field(
        None,
        min_length=1,
        description="Exactly-once: the id of the member's transactional producer, unique per "
        "running member (one started with the id of a running one fences it); an id as "
        "`group_id`; None: not transactional ([exactly-once.md](exactly-once.md)).",
    )
    transaction_interval_s: float = Field(
        0.1,
        gt=0,
        le=300,
        strict=True,
        allow_inf_nan=False,
        description="A transaction boundary at least this often.",
    )
    transaction_max_records: int = Field(
        10_000,
        ge=1,
        strict=True,
        json_schema_extra={"unit": "records"},
        description="... and after this many records were marked finished in it.",
    )
    transaction_timeout_s: float = Field(
        10.0,
        ge=1,
        le=900,
        strict=True,
        allow_inf_nan=False,
        description="How long the broker lets a transaction stay open (the producer's "
        "`transaction.timeout.ms`): a member killed mid-transaction holds its partitions back "
        "this long.",
    )

    failure: FailurePolicy = Field(
        FailurePolicy(),
        description="Retries, then what becomes of a record that still fails: stop, dead "
        "letter or block ([failures.md](failures.md)).",
    )
    # Validated when left out too: the dead-letter topic names `failure` makes are checked there.
    failure_by_topic: Mapping[str, FailurePolicy] = Field(
        default_factory=dict,
        validate_default=True,
        description="`failure` per topic: names as subscribed, topics a subscribed pattern "
        "matches, or a subscribed pattern itself (`^...`: every topic it matches).",
    )

    stuck_after_s: float = Field(
        60.0,
        gt=0,
        strict=True,
        allow_inf_nan=False,
        description="A partition whose watermark has not moved for this long while records of "
        "it are in flight makes the member not ready "
        "([observability.md](observability.md#consumerhealth)).",
    )
    # Looked at about once a second; the log end of a partition silent this long is asked for
    # in one ListOffsets request for all such partitions.
    partition_stall_s: float | None = Field(
        30.0,
        ge=1,
        le=86400,
        strict=True,
        allow_inf_nan=False,
        description="A partition weir fetches (no pause, no throttle) that delivers nothing for "
        "this long while the broker has records past its position is stalled: logged "
        "(`partition_stalled`), shown in stats and `health()` (not ready), and sought once to "
        "where it reads next. None: no watchdog "
        "([rebalances.md](rebalances.md#a-partition-that-stays-silent)).",
    )
    # The owner asks for metadata once a second meanwhile.
    broker_down_unready_s: float | None = Field(
        10.0,
        ge=1,
        le=3600,
        strict=True,
        allow_inf_nan=False,
        description="Once the client reported every broker down, the member is not ready after "
        "this long without a broker answering, and ready again at the first answer. None: an "
        "outage leaves readiness alone ([observability.md](observability.md#consumerhealth)).",
    )
    # Read by a client of its own on a thread of its own.
    watermark_refresh_s: float | None = Field(
        5.0,
        ge=0.1,
        le=3600,
        strict=True,
        allow_inf_nan=False,
        description="How often the owned partitions' high watermarks are read from their "
        "leaders, so lag stays right while a partition is not fetched (paused, or throttled); "
        "None: only the client's own values from its fetch responses "
        "([observability.md](observability.md#high-watermarks-while-a-partition-is-not-fetched)).",
    )

    callback_errors: Literal["log", "stop"] = Field(
        "log",
        description="What a user callback that raises (a commit listener, a `Handler` hook) "
        'does: `"log"` isolates it (logged once, counted in stats), `"stop"` also stops the '
        "member, which still drains, commits and closes.",
    )

    tracing: bool = Field(
        False,
        strict=True,
        description="An OpenTelemetry span per handler call, its parent the record's "
        "`traceparent`, and the context carried into outputs and dead letters; needs "
        "`pip install 'kafka-weir[otel]'`. `GroupConsumer(..., tracer_provider=...)` turns it "
        "on with a provider of the application's, else the global one "
        "([tracing.md](tracing.md)).",
    )

    # Before pydantic's own: it would read "5" or True as a rate.
    @field_validator("max_records_per_s_by_topic", mode="before")
    @classmethod
    def _rate_topics(cls, v: Any, info: ValidationInfo) -> Any:
        if not isinstance(v, Mapping):
            return v  # pydantic says what a mapping is
        topics = info.data.get("topics") or []
        patterns = [re.compile(t) for t in topics if t.startswith("^")]
        for name, rate in v.items():
            if not isinstance(name, str):
                raise ValueError(f"max_records_per_s_by_topic: a key is a topic name, got {name!r}")
            if name not in topics and not any(p.match(name) for p in patterns):
                raise ValueError(
                    f"max_records_per_s_by_topic[{name!r}]: not a subscribed topic, nor matched "
                    f"by a subscribed pattern ({', '.join(topics)})"
                )
            if (
                isinstance(rate, bool)
                or not isinstance(rate, int | float)
                or not 0 < rate < math.inf
            ):
                raise ValueError(
                    f"max_records_per_s_by_topic[{name!r}]: a rate is records per second, more "
                    f"than 0 and finite, got {rate!r}"
                )
        return v

    @field_validator("max_records_per_s_per_key")
    @classmethod
    def _rate_per_key(cls, v: float | None, info: ValidationInfo) -> float | None:
        ordering = info.data.get("ordering")
        if v is not None and ordering is not None and ordering != "key":
            raise ValueError(
                f'a rate per key needs ordering="key" (this member\'s is {ordering!r}): only '
                "there does a key have a lane of its own that can wait while the others run"
            )
        return v

    @field_validator("failure_by_topic")
    @classmethod
    def _failure_topics(
        cls, v: Mapping[str, FailurePolicy], info: ValidationInfo
    ) -> Mapping[str, FailurePolicy]:
        topics = info.data.get("topics") or []
        patterns = [re.compile(t) for t in topics if t.startswith("^")]
        for name in v:
            if name not in topics and not any(p.fullmatch(name) for p in patterns):
                raise ValueError(
                    f"failure_by_topic[{name!r}]: not a subscribed topic, nor matched by a "
                    f"subscribed pattern ({', '.join(topics)})"
                )
        problems = []  # a dead_letter_topic given is a topic name (`FailurePolicy` checks it)
        # The dead-letter topic a policy without dead_letter_topic makes of each subscribed name
        # (a pattern's topics are known only once matched).
        default = info.data.get("failure")
        for topic in topics:
            policy = v.get(topic, default)
            if topic.startswith("^") or policy is None or policy.final != "dead_letter":
                continue
            made = policy.dead_letter_for(topic)
            if policy.dead_letter_topic is None and topic_name_problem(made) is not None:
                where = f"failure_by_topic[{topic!r}]" if topic in v else "failure"
                problems.append(
                    f"{where}: the dead-letter topic of {shown(topic)} would be {shown(made)}, "
                    f"{len(made)} characters, and a topic name has at most 249: set "
                    "dead_letter_topic"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return v

    # Validated when left out too: librdkafka checks the whole configuration either way.
    kafka: Mapping[str, KafkaSetting] = Field(
        default_factory=dict,
        validate_default=True,
        description="Any other librdkafka setting, by its name "
        "([below](#librdkafka-settings-kafka)); the one callable is the OAUTHBEARER token "
        "provider `oauth_cb` ([below](#the-oauthbearer-token-provider)).",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _explain_unknown(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return explain_unknown_fields(cls, data, handler, cls._explain)

    @classmethod
    def _explain(cls, loc: tuple[int | str, ...]) -> str:
        name = str(loc[-1])  # flow's own names are explained by FlowConfig
        if name in RENAMED:
            new, unit = RENAMED[name]
            return f"{name} is now {new} ({unit})"
        if name in FlowConfig.model_fields:
            return f"{name} is a flow setting: pass flow=FlowConfig({name}=...)"
        if name in TYPED_KEYS:
            return f"{name} is librdkafka's name: set {TYPED_KEYS[name]!r}"
        if "." in name:
            return f"unknown setting {name!r}: librdkafka settings go in kafka={{...}}"
        return suggest(name, cls.model_fields)

    @model_validator(mode="before")
    @classmethod
    def _mask_before_validation(cls, data: Any) -> Any:
        # Errors carry their raw input (ValidationError.json() shows it even with
        # hide_input_in_errors), so secrets are wrapped before any rule can fail on them: in the
        # kafka mapping, and in whatever an unknown setting holds.
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if isinstance(data.get("kafka"), Mapping):
            data["kafka"] = masked(data["kafka"])
        for key in [k for k in data if k not in cls.model_fields]:
            if isinstance(key, str) and is_secret_key(key):
                data[key] = wrap_secret(data[key])
            else:
                data[key] = masked(data[key])
        return data

    @field_validator("bootstrap_servers")
    @classmethod
    def _bootstrap(cls, v: str) -> str:
        _refuse(text_problem("bootstrap_servers", v))
        return v

    @field_validator("group_id", "transactional_id")
    @classmethod
    def _ids(cls, v: str | None, info: ValidationInfo) -> str | None:
        _refuse(None if v is None else id_problem(str(info.field_name), v))
        return v

    @field_validator("group_instance_id")
    @classmethod
    def _instance_id(cls, v: str | None, info: ValidationInfo) -> str | None:
        _refuse(None if v is None else member_id_problem("group_instance_id", v, info.data))
        return v

    @field_validator("topics")
    @classmethod
    def _topics(cls, v: list[str]) -> list[str]:
        problems = [p for p in map(topic_problem, v) if p is not None]
        # librdkafka refuses a subscription that names a topic or pattern twice ("Invalid
        # argument"), which would fail the member at start.
        twice = sorted({t for t in v if v.count(t) > 1})
        if twice:
            problems.append(f"{', '.join(map(shown, twice))} listed more than once")
        if problems:
            raise ValueError("; ".join(problems))
        return v

    @field_validator("assignment_strategy")
    @classmethod
    def _strategy(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and info.data.get("group_protocol") == "consumer":
            raise ValueError(
                "assignment_strategy is a classic-protocol setting; with group_protocol="
                "'consumer' the broker assigns partitions: use remote_assignor"
            )
        return v

    @field_validator("remote_assignor")
    @classmethod
    def _remote(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and info.data.get("group_protocol") == "classic":
            raise ValueError("remote_assignor needs group_protocol='consumer' (or 'auto')")
        return v

    @field_validator("session_timeout_s", "heartbeat_interval_s")
    @classmethod
    def _classic_timeouts(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is not None and info.data.get("group_protocol") == "consumer":
            raise ValueError(
                f"{info.field_name} is a broker setting under group_protocol='consumer' "
                "(group.consumer.session.timeout.ms / group.consumer.heartbeat.interval.ms); "
                "the client refuses to start with it"
            )
        return v

    @field_validator("heartbeat_interval_s")
    @classmethod
    def _heartbeat(cls, v: float | None, info: ValidationInfo) -> float | None:
        session = info.data.get("session_timeout_s")
        if v is not None and session is not None and v >= session:
            raise ValueError(
                f"heartbeat_interval_s must be below session_timeout_s ({v} >= {session})"
            )
        return v

    @field_validator("max_poll_interval_s")
    @classmethod
    def _max_poll(cls, v: float, info: ValidationInfo) -> float:
        # "auto" may run the classic protocol: its rules hold too.
        if info.data.get("group_protocol") == "consumer" or "session_timeout_s" not in info.data:
            return v
        session = info.data["session_timeout_s"]
        if v < (session or _CLIENT_SESSION_TIMEOUT_S):
            given = "session_timeout_s" if session else "librdkafka's default session timeout"
            raise ValueError(
                f"max_poll_interval_s ({v:g} s) must not be below {given} "
                f"({session or _CLIENT_SESSION_TIMEOUT_S:g} s) under the classic protocol"
            )
        return v

    @field_validator("start_at")
    @classmethod
    def _start_at(cls, v: datetime | None, info: ValidationInfo) -> datetime | None:
        if v is None:
            return v
        if v.tzinfo is None or v.utcoffset() is None:
            raise ValueError(
                f"start_at must be timezone-aware, got the naive {v.isoformat()}: say which "
                "zone, e.g. datetime(2026, 1, 1, tzinfo=timezone.utc)"
            )
        if info.data.get("auto_offset_reset") == "error":
            raise ValueError(
                "start_at gives a partition with no committed offset a start, and "
                "auto_offset_reset='error' says to stop there instead: drop one of them "
                "(with start_at, auto_offset_reset only decides where an out-of-range "
                "committed offset goes)"
            )
        return v

    @field_validator("max_batch_records")
    @classmethod
    def _max_batch_records(cls, v: int, info: ValidationInfo) -> int:
        flow = info.data.get("flow")
        if flow is not None and v > flow.headroom_records:
            raise ValueError(
                f"max_batch_records ({v}) is larger than the flow headroom flow.capacity_records - "
                f"flow.pause_records ({flow.headroom_records}): one fetched batch could pass "
                "the capacity"
            )
        return v

    @field_validator("revoke_timeout_s", "flush_timeout_s")
    @classmethod
    def _owner_waits(cls, v: float, info: ValidationInfo) -> float:
        max_poll = info.data.get("max_poll_interval_s")
        if max_poll is not None and v > max_poll / 2:
            where = {
                "revoke_timeout_s": "the drain runs inside the rebalance callback, where the "
                "member does not poll",
                "flush_timeout_s": "the owner thread waits for the flush, and does not poll "
                "while it waits",
            }[str(info.field_name)]
            raise ValueError(
                f"{info.field_name} ({v:g} s) must stay below half of max_poll_interval_s "
                f"({max_poll:g} s): {where}"
            )
        return v

    @field_validator("kafka", mode="before")
    @classmethod
    def _kafka_values(cls, v: Any) -> Any:
        if isinstance(v, Mapping):
            _refuse("; ".join(value_problems(v)) or None)
        return v

    @field_validator("kafka")
    @classmethod
    def _kafka(
        cls, v: Mapping[str, KafkaSetting], info: ValidationInfo
    ) -> Mapping[str, KafkaSetting]:
        client_id = v.get("client.id")
        if isinstance(client_id, str):
            # The broker names a classic member after its client id unless it has an instance id.
            _refuse(
                member_id_problem("kafka['client.id']", client_id, info.data)
                if info.data.get("group_instance_id") is None
                else id_problem("kafka['client.id']", client_id)
            )
        for key, value in v.items():
            if key in TYPED_KEYS:
                raise ValueError(f"set {TYPED_KEYS[key]!r} instead of kafka[{key!r}]")
            if key in FORCED_OFF and str(value).lower() not in ("false", "0"):
                raise ValueError(
                    f"kafka[{key!r}] must stay false: weir commits only finished records "
                    "itself, and librdkafka's automatic commit would skip unfinished ones"
                )
        flow = info.data.get("flow")
        try:
            queued_kb = int(str(v.get("queued.max.messages.kbytes", 0)))
        except ValueError:
            queued_kb = 0  # not a number: librdkafka says so below
        if flow is not None and queued_kb * 1024 > flow.headroom_bytes:
            raise ValueError(
                f"kafka['queued.max.messages.kbytes'] ({queued_kb}) exceeds the flow byte "
                f"headroom flow.capacity_bytes - flow.pause_bytes ({flow.headroom_bytes})"
            )
        # librdkafka reads the whole configuration only once every field is valid; "auto"
        # must start under either protocol.
        if all(name in info.data for name in cls.model_fields if name != "kafka"):
            values = {**info.data, "kafka": v}
            protocol = info.data["group_protocol"]
            refusals: list[str] = []
            for runs in ("classic", "consumer") if protocol == "auto" else (protocol,):
                for refusal in librdkafka_refusals(_client_conf(values, runs), v):
                    if refusal not in refusals:
                        refusals.append(refusal)
            if refusals:
                raise ValueError("; ".join(refusals))
        return v

    def effective_strategy(self) -> str | None:
        """The classic protocol's assignment strategy this member asks for:
        `assignment_strategy`, or "cooperative-sticky" when it is None; None under
        `group_protocol="consumer"`, where the broker assigns."""
        return _effective_strategy(self.group_protocol, self.assignment_strategy)

    @property
    def incremental(self) -> bool:
        """Whether rebalances hand over only the moved partitions (cooperative or KIP-848)."""
        return self.group_protocol == "consumer" or self.effective_strategy() == (
            "cooperative-sticky"
        )

    def runs(self, protocol: Literal["classic", "consumer"]) -> tuple[ConsumerConfig, list[str]]:
        """The configuration of a `group_protocol="auto"` member that runs `protocol`, and the
        settings given that do not apply to it (left out); validated again as a whole."""
        drop = _CLASSIC_ONLY if protocol == "consumer" else _CONSUMER_ONLY
        given = {name: getattr(self, name) for name in self.model_fields_set}
        ignored = sorted(name for name in drop if given.pop(name, None) is not None)
        return ConsumerConfig(**{**given, "group_protocol": protocol}), ignored

    def policy_for(self, topic: str) -> FailurePolicy:
        """The failure policy of records of `topic`: its name's, else the first subscribed
        pattern's (a key starting with `^`) that matches it, else `failure`."""
        by_topic = self.failure_by_topic
        policy = by_topic.get(topic)
        if policy is None:
            policy = next(
                (p for name, p in by_topic.items() if name[:1] == "^" and re.match(name, topic)),
                self.failure,
            )
        return policy

    def librdkafka_config(self) -> dict[str, Any]:
        """The dict for `confluent_kafka.Consumer`, without callbacks."""
        return _client_conf({name: getattr(self, name) for name in type(self).model_fields})

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            if name == "kafka" and isinstance(value, Mapping):
                yield name, mask_secrets(value)
            else:
                yield name, value


# The settings only one group protocol takes (the client refuses the classic ones under KIP-848).
_CLASSIC_ONLY = ("assignment_strategy", "session_timeout_s", "heartbeat_interval_s")
_CONSUMER_ONLY = ("remote_assignor",)


def _effective_strategy(protocol: str, strategy: str | None) -> str | None:
    if protocol == "consumer":
        return None
    return strategy or "cooperative-sticky"


def _client_conf(values: Mapping[str, Any], protocol: str | None = None) -> dict[str, Any]:
    """librdkafka's configuration from validated field values (a ConsumerConfig's, or those a
    validator has seen so far), for the group protocol it runs (`protocol`; by default the
    one configured, and the classic one for "auto" until it is chosen)."""
    flow: FlowConfig = values["flow"]
    runs = protocol or values["group_protocol"]
    if runs == "auto":
        runs = "classic"
    conf: dict[str, Any] = {
        "bootstrap.servers": values["bootstrap_servers"],
        "group.id": values["group_id"],
        "group.protocol": runs,
        "auto.offset.reset": values["auto_offset_reset"],
        "max.poll.interval.ms": _ms(values["max_poll_interval_s"]),
        "topic.metadata.refresh.interval.ms": _ms(values["topic_refresh_s"]),
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": False,
        # The client buffer is part of the stated memory bound: it may hold at most one
        # fetched batch worth of bytes beyond the pause mark.
        "queued.max.messages.kbytes": max(1024, flow.headroom_bytes // 1024),
        # librdkafka counts queued.min.messages over the consumer's one queue, not per
        # partition: a lower count made every resumed partition wait fetch.queue.backoff.ms
        # behind one fetch response of others. Its default keeps the count out of the way;
        # the byte bound above still holds.
        "queued.min.messages": 100_000,
        # librdkafka may pass its queue bound by one fetch response: cap that too.
        "fetch.max.bytes": max(1_048_576, min(52_428_800, flow.headroom_bytes)),
        # A resumed partition joins the next fetch request, which may wait behind a long
        # poll of partitions at the log end (client default 500 ms) or a queue-full backoff
        # (default 1 s), and partitions paused for their share of the budget resume many
        # times a second (flow-control.md). The price: about 100 empty fetches a second per
        # broker while caught up.
        "fetch.wait.max.ms": 10,
        "fetch.queue.backoff.ms": 50,
    }
    strategy = _effective_strategy(runs, values["assignment_strategy"])
    if strategy is not None:
        conf["partition.assignment.strategy"] = strategy
    if values["remote_assignor"] is not None and runs == "consumer":
        conf["group.remote.assignor"] = values["remote_assignor"]
    if values["group_instance_id"] is not None:
        conf["group.instance.id"] = values["group_instance_id"]
    if runs == "classic":
        if values["session_timeout_s"] is not None:
            conf["session.timeout.ms"] = _ms(values["session_timeout_s"])
        if values["heartbeat_interval_s"] is not None:
            conf["heartbeat.interval.ms"] = _ms(values["heartbeat_interval_s"])
    conf.update((k, _client_value(v)) for k, v in values["kafka"].items())
    return conf


def _client_value(value: Any) -> Any:
    """A `kafka` entry as the client takes it: a secret unwrapped, the token provider in the
    wrapper that says what went wrong with it (`weir._secrets.token_provider`)."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, SecretCallback):
        return token_provider(value.fn)
    return value


# `GroupConsumer(handler, **settings)`'s keyword settings, for type checkers: the fields of
# ConsumerConfig (a unit test keeps them equal). Which keys are required follows each class's
# `total`, not `Required[...]`, which this module's postponed annotations would hide at run time.
class _OptionalSettings(TypedDict, total=False):
    tracing: bool
    start_at: datetime | None
    max_records_per_s: float | None
    max_records_per_s_by_topic: Mapping[str, float]
    max_records_per_s_per_key: float | None
    ordering: Ordering
    workers: int
    max_in_flight: int
    group_protocol: Literal["classic", "consumer", "auto"]
    assignment_strategy: Literal["range", "roundrobin", "cooperative-sticky"] | None
    remote_assignor: Literal["uniform", "range"] | None
    group_instance_id: str | None
    session_timeout_s: float | None
    heartbeat_interval_s: float | None
    max_poll_interval_s: float
    auto_offset_reset: Literal["earliest", "latest", "error"]
    topic_refresh_s: float
    flow: FlowConfig
    max_batch_records: int
    batch_max_records: int
    batch_max_wait_s: float
    batch_max_bytes: int | None
    flush_timeout_s: float
    output_timeout_s: float
    poll_timeout_s: float
    commit_interval_s: float
    commit_every_records: int
    revoke_timeout_s: float
    shutdown_timeout_s: float
    startup_timeout_s: float
    transactional_id: str | None
    transaction_interval_s: float
    transaction_max_records: int
    transaction_timeout_s: float
    offset_map: bool
    offset_map_max_bytes: int
    failure: FailurePolicy
    failure_by_topic: Mapping[str, FailurePolicy]
    stuck_after_s: float
    partition_stall_s: float | None
    broker_down_unready_s: float | None
    watermark_refresh_s: float | None
    callback_errors: Literal["log", "stop"]
    kafka: Mapping[str, KafkaSetting]


class _Member(TypedDict):
    bootstrap_servers: str
    group_id: str


class _Topics(TypedDict, total=False):
    topics: list[str]


class ConsumerSettings(_Member, _OptionalSettings):
    """`GroupConsumer(handler, **settings)`'s keyword settings."""

    topics: list[str]


class RoutedSettings(_Member, _Topics, _OptionalSettings):
    """`GroupConsumer(routes=..., **settings)`'s: `topics` defaults to what the routes name."""


class _TokenProblem(ValueError):
    """What is wrong with a token provider's result, in words that show none of it."""


def token_provider(fn: Callable[[str | None], Any]) -> Callable[[str | None], Any]:
    """The OAUTHBEARER token provider `fn` as the client gets it: librdkafka calls it on a
    thread of its own at start and before each token expires, and confluent-kafka drops without
    a word what it raises or a result it cannot use (the client then waits 10 s for a token and
    fails, or keeps its old token until it expires). Here each is an `oauth_token_failed` error
    naming the exception's type or what is wrong with the result, never their words (they may
    hold a secret) nor the token."""

    def provide(oauthbearer_config: str | None) -> Any:
        try:
            result = fn(oauthbearer_config)
        except Exception as exc:
            log.error(
                "oauth_token_failed",
                reason=f"the token provider kafka['oauth_cb'] raised {type(exc).__qualname__}",
            )
            raise
        problem = _token_problem(result)
        if problem is not None:
            log.error(
                "oauth_token_failed", reason=f"the token provider kafka['oauth_cb'] {problem}"
            )
            raise _TokenProblem(problem)
        return result

    return provide


def _token_problem(result: Any) -> str | None:
    """What is wrong with a token provider's result, in words that show none of it."""
    shape = "(token, expiry_s) or (token, expiry_s, principal, extensions)"
    if not isinstance(result, tuple) or len(result) not in (2, 4):
        size = f"a tuple of {len(result)}" if isinstance(result, tuple) else type(result).__name__
        return f"returned {size}, not {shape}"
    token, expiry = result[0], result[1]
    if not isinstance(token, str) or not token:
        return f"returned a token that is {type(token).__name__ if token else 'empty'}, not a str"
    if not isinstance(expiry, numbers.Real) or isinstance(expiry, bool) or math.isnan(expiry):
        return f"returned an expiry_s that is {type(expiry).__name__}, not seconds since the epoch"
    if expiry <= time.time():
        return (
            f"returned a token that expired {time.time() - expiry:.0f} s ago (expiry_s is "
            "seconds since the epoch)"
        )
    if len(result) == 4 and (
        not isinstance(result[2], str)
        or not isinstance(result[3], Mapping)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in result[3].items())
    ):
        return (
            "returned a principal or extensions of the wrong type: the principal is a str, "
            "the extensions a dict of str to str"
        )
    return None
