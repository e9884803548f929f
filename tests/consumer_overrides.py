"""`Overrides`: the optional keyword settings of `GroupConsumer(handler, **settings)`, for test
helpers that supply the required ones (servers, group, topics) themselves and pass the rest on.

`weir.config.ConsumerSettings` requires its three required keys in every dict, so a helper's
`**overrides` cannot be typed with it; a unit test keeps this one equal to its optional part."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Literal

from typing_extensions import TypedDict

from weir import FailurePolicy, FlowConfig
from weir.config import KafkaSetting

GroupProtocol = Literal["classic", "consumer", "auto"]
Ordering = Literal["key", "partition", "unordered"]


class Overrides(TypedDict, total=False):
    ordering: Ordering
    workers: int
    max_in_flight: int
    max_records_per_s: float | None
    max_records_per_s_by_topic: Mapping[str, float]
    max_records_per_s_per_key: float | None
    group_protocol: GroupProtocol
    assignment_strategy: Literal["range", "roundrobin", "cooperative-sticky"] | None
    remote_assignor: Literal["uniform", "range"] | None
    group_instance_id: str | None
    session_timeout_s: float | None
    heartbeat_interval_s: float | None
    max_poll_interval_s: float
    auto_offset_reset: Literal["earliest", "latest", "error"]
    start_at: datetime | None
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
    tracing: bool
    kafka: Mapping[str, KafkaSetting]
