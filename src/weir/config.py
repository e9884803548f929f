"""Configuration: typed fields for what weir owns, a pass-through mapping for librdkafka.

Everything is validated before a `Consumer` is built, so a contradiction is a `ValidationError`
naming the field, never a half-started member.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

__all__ = ["ConsumerConfig", "FlowConfig", "is_secret_key", "mask_secrets"]

KafkaValue = str | int | float | bool

# librdkafka settings that weir exposes as typed fields: setting them in `kafka` would bypass the
# protocol rules below, so they are refused with the name of the field to use instead.
_TYPED_KEYS = {
    "bootstrap.servers": "bootstrap_servers",
    "metadata.broker.list": "bootstrap_servers",
    "group.id": "group_id",
    "group.protocol": "group_protocol",
    "partition.assignment.strategy": "assignment_strategy",
    "group.remote.assignor": "remote_assignor",
    "group.instance.id": "group_instance_id",
    "session.timeout.ms": "session_timeout_ms",
    "heartbeat.interval.ms": "heartbeat_interval_ms",
    "max.poll.interval.ms": "max_poll_interval_ms",
    "auto.offset.reset": "auto_offset_reset",
}
# weir is the only committer; these would let librdkafka commit offsets of unfinished records.
_FORCED_OFF = ("enable.auto.commit", "enable.auto.offset.store")
_CALLBACK_KEYS = ("on_commit", "error_cb", "stats_cb", "throttle_cb", "logger")

_SECRET_PARTS = ("password", "secret", "sasl.oauthbearer.config", "ssl.key.pem", "ssl_key")


def is_secret_key(key: str) -> bool:
    k = key.lower()
    return any(part in k for part in _SECRET_PARTS)


def mask_secrets(conf: dict[str, Any]) -> dict[str, Any]:
    return {k: ("***" if is_secret_key(k) else v) for k, v in conf.items()}


class _NotScalarSecret(SecretStr):
    """A secret given as something other than a scalar: masked like any secret, then refused."""


def _wrap_secret(value: Any) -> SecretStr:
    if isinstance(value, SecretStr):
        return value
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return SecretStr(str(value))
    return _NotScalarSecret("")


class FlowConfig(BaseModel):
    """In-flight budget: records registered and not finished (queued, running, awaiting retry).

    Fetching pauses when either count reaches its `pause_*` mark and resumes once both are below
    their `resume_*` mark. The gap between `pause_*` and `capacity_*` is the headroom one fetched
    batch may use, so a batch already fetched can never push the total past the capacity.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    capacity_records: int = Field(1200, ge=2)
    pause_records: int = Field(1000, ge=1)
    resume_records: int = Field(400, ge=0)
    capacity_bytes: int = Field(96 * 1024 * 1024, ge=2 * 1024 * 1024)
    pause_bytes: int = Field(64 * 1024 * 1024, ge=1024 * 1024)
    resume_bytes: int = Field(32 * 1024 * 1024, ge=0)
    # While partitions share the record budget, records consumed past a partition's share wait
    # read ahead, up to this many in all (an even part per partition). Their bytes count in
    # the byte budget above, their number is not in the in-flight counts.
    read_ahead_records: int = Field(10_000, ge=0)

    @field_validator("pause_records")
    @classmethod
    def _pause_records(cls, v: int, info: ValidationInfo) -> int:
        cap = info.data.get("capacity_records")
        if cap is not None and v >= cap:
            raise ValueError(f"pause_records ({v}) must be below capacity_records ({cap})")
        return v

    @field_validator("resume_records")
    @classmethod
    def _resume_records(cls, v: int, info: ValidationInfo) -> int:
        high = info.data.get("pause_records")
        if high is not None and v >= high:
            raise ValueError(f"resume_records ({v}) must be below pause_records ({high})")
        return v

    @field_validator("pause_bytes")
    @classmethod
    def _pause_bytes(cls, v: int, info: ValidationInfo) -> int:
        cap = info.data.get("capacity_bytes")
        if cap is not None and cap - v < 1024 * 1024:
            raise ValueError(
                f"pause_bytes ({v}) must leave at least 1 MiB of headroom below "
                f"capacity_bytes ({cap}) for the client's fetch buffer"
            )
        return v

    @field_validator("resume_bytes")
    @classmethod
    def _resume_bytes(cls, v: int, info: ValidationInfo) -> int:
        high = info.data.get("pause_bytes")
        if high is not None and v >= high:
            raise ValueError(f"resume_bytes ({v}) must be below pause_bytes ({high})")
        return v

    @property
    def headroom_records(self) -> int:
        return self.capacity_records - self.pause_records

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.pause_bytes


class ConsumerConfig(BaseModel):
    """Settings of one `GroupConsumer` member."""

    # Inputs are hidden in errors because the `kafka` mapping may hold credentials.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    bootstrap_servers: str = Field(min_length=1)
    group_id: str = Field(min_length=1)
    topics: list[str] = Field(min_length=1)

    ordering: Literal["key", "partition", "unordered"] = "key"
    workers: int = Field(8, ge=1, le=1024)

    group_protocol: Literal["classic", "consumer"] = "classic"
    assignment_strategy: Literal["range", "roundrobin", "cooperative-sticky"] | None = None
    remote_assignor: Literal["uniform", "range"] | None = None
    group_instance_id: str | None = Field(None, min_length=1)
    session_timeout_ms: int | None = Field(None, ge=1)
    heartbeat_interval_ms: int | None = Field(None, ge=1)
    max_poll_interval_ms: int = Field(300_000, ge=1)
    auto_offset_reset: Literal["earliest", "latest", "error"] = "earliest"

    flow: FlowConfig = FlowConfig()
    max_batch: int = Field(200, ge=1, le=100_000)
    poll_timeout: float = Field(0.1, gt=0, le=1.0)
    commit_interval: float = Field(1.0, gt=0)
    # Every 10k records or every second, whichever comes first: at 200k records/s a cadence of
    # 1000 sent 200 commit requests a second, each one a write to __consumer_offsets, for
    # replay bounded by the interval anyway.
    commit_every: int = Field(10_000, ge=1)
    revoke_timeout: float = Field(10.0, gt=0)
    shutdown_timeout: float = Field(30.0, gt=0)
    startup_timeout: float = Field(30.0, gt=0)

    kafka: dict[str, KafkaValue | SecretStr] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _mask_before_validation(cls, data: Any) -> Any:
        # Errors carry their raw input (ValidationError.json() shows it even with
        # hide_input_in_errors), so secrets are wrapped before any rule can fail on them.
        if isinstance(data, dict) and isinstance(data.get("kafka"), dict):
            data = dict(data)
            data["kafka"] = {
                k: _wrap_secret(v) if is_secret_key(str(k)) else v for k, v in data["kafka"].items()
            }
        return data

    @field_validator("topics")
    @classmethod
    def _topics(cls, v: list[str]) -> list[str]:
        for t in v:
            if not t:
                raise ValueError("topics must not contain an empty name")
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
        if v is not None and info.data.get("group_protocol") != "consumer":
            raise ValueError("remote_assignor needs group_protocol='consumer'")
        return v

    @field_validator("session_timeout_ms", "heartbeat_interval_ms")
    @classmethod
    def _classic_timeouts(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and info.data.get("group_protocol") == "consumer":
            raise ValueError(
                f"{info.field_name} is a broker setting under group_protocol='consumer' "
                "(group.consumer.session.timeout.ms / group.consumer.heartbeat.interval.ms); "
                "the client refuses to start with it"
            )
        return v

    @field_validator("heartbeat_interval_ms")
    @classmethod
    def _heartbeat(cls, v: int | None, info: ValidationInfo) -> int | None:
        session = info.data.get("session_timeout_ms")
        if v is not None and session is not None and v >= session:
            raise ValueError(
                f"heartbeat_interval_ms must be below session_timeout_ms ({v} >= {session})"
            )
        return v

    @field_validator("max_batch")
    @classmethod
    def _max_batch(cls, v: int, info: ValidationInfo) -> int:
        flow = info.data.get("flow")
        if flow is not None and v > flow.headroom_records:
            raise ValueError(
                f"max_batch ({v}) is larger than the flow headroom flow.capacity_records - "
                f"flow.pause_records ({flow.headroom_records}): one fetched batch could pass "
                "the capacity"
            )
        return v

    @field_validator("revoke_timeout")
    @classmethod
    def _revoke_timeout(cls, v: float, info: ValidationInfo) -> float:
        max_poll = info.data.get("max_poll_interval_ms")
        if max_poll is not None and v * 1000 > max_poll / 2:
            raise ValueError(
                f"revoke_timeout ({v}s) must stay below half of max_poll_interval_ms "
                f"({max_poll} ms): the drain runs inside the rebalance callback, where the "
                "member does not poll"
            )
        return v

    @field_validator("kafka")
    @classmethod
    def _kafka(
        cls, v: dict[str, KafkaValue | SecretStr], info: ValidationInfo
    ) -> dict[str, KafkaValue | SecretStr]:
        for key, value in v.items():
            if isinstance(value, _NotScalarSecret):
                raise ValueError(f"kafka[{key!r}] must be a string")
            if key in _TYPED_KEYS:
                raise ValueError(f"set {_TYPED_KEYS[key]!r} instead of kafka[{key!r}]")
            if key in _FORCED_OFF and str(value).lower() not in ("false", "0"):
                raise ValueError(
                    f"kafka[{key!r}] must stay false: weir commits only finished records "
                    "itself, and librdkafka's automatic commit would skip unfinished ones"
                )
            if key in _CALLBACK_KEYS:
                raise ValueError(f"kafka[{key!r}] is owned by weir and cannot be overridden")
        flow = info.data.get("flow")
        queued_kb = v.get("queued.max.messages.kbytes")
        if (
            flow is not None
            and isinstance(queued_kb, str | int | float)
            and int(queued_kb) * 1024 > flow.headroom_bytes
        ):
            raise ValueError(
                f"kafka['queued.max.messages.kbytes'] ({queued_kb}) exceeds the flow byte "
                f"headroom flow.capacity_bytes - flow.pause_bytes ({flow.headroom_bytes})"
            )
        return v

    def effective_strategy(self) -> str | None:
        if self.group_protocol == "consumer":
            return None
        return self.assignment_strategy or "cooperative-sticky"

    @property
    def incremental(self) -> bool:
        """Whether rebalances hand over only the moved partitions (cooperative or KIP-848)."""
        return self.group_protocol == "consumer" or self.effective_strategy() == (
            "cooperative-sticky"
        )

    def librdkafka_config(self) -> dict[str, Any]:
        """The dict for `confluent_kafka.Consumer`, without callbacks."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": self.group_id,
            "group.protocol": self.group_protocol,
            "auto.offset.reset": self.auto_offset_reset,
            "max.poll.interval.ms": self.max_poll_interval_ms,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": False,
            # The client buffer is part of the stated memory bound: it may hold at most one
            # fetched batch worth of bytes beyond the pause mark.
            "queued.max.messages.kbytes": max(1024, self.flow.headroom_bytes // 1024),
            # librdkafka counts queued.min.messages over the consumer's one queue, not per
            # partition: a lower count made every resumed partition wait fetch.queue.backoff.ms
            # behind one fetch response of others. Its default keeps the count out of the way;
            # the byte bound above still holds.
            "queued.min.messages": 100_000,
            # librdkafka may pass its queue bound by one fetch response: cap that too.
            "fetch.max.bytes": max(1_048_576, min(52_428_800, self.flow.headroom_bytes)),
            # A resumed partition joins the next fetch request, which may wait behind a long
            # poll of partitions at the log end (client default 500 ms) or a queue-full backoff
            # (default 1 s), and partitions paused for their share of the budget resume many
            # times a second (flow-control.md). The price: about 100 empty fetches a second per
            # broker while caught up.
            "fetch.wait.max.ms": 10,
            "fetch.queue.backoff.ms": 50,
        }
        strategy = self.effective_strategy()
        if strategy is not None:
            conf["partition.assignment.strategy"] = strategy
        if self.remote_assignor is not None:
            conf["group.remote.assignor"] = self.remote_assignor
        if self.group_instance_id is not None:
            conf["group.instance.id"] = self.group_instance_id
        if self.session_timeout_ms is not None:
            conf["session.timeout.ms"] = self.session_timeout_ms
        if self.heartbeat_interval_ms is not None:
            conf["heartbeat.interval.ms"] = self.heartbeat_interval_ms
        conf.update(
            (k, v.get_secret_value() if isinstance(v, SecretStr) else v)
            for k, v in self.kafka.items()
        )
        return conf

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            if name == "kafka" and isinstance(value, dict):
                yield name, mask_secrets(value)
            else:
                yield name, value
