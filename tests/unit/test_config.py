"""ConsumerConfig / FlowConfig: every contradiction is a ValidationError naming the field, and
secrets never show up in reprs or error text."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from weir import ConsumerConfig, FlowConfig, GroupConsumer

BASE: dict[str, Any] = {"bootstrap_servers": "broker:9092", "group_id": "g", "topics": ["t"]}
SECRET = "hunter2-S3CRET-value"


def invalid(**overrides: Any) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        ConsumerConfig(**{**BASE, **overrides})
    return info.value


def locs(err: ValidationError) -> list[tuple[Any, ...]]:
    return [tuple(e["loc"]) for e in err.errors()]


def messages(err: ValidationError) -> str:
    return " | ".join(e["msg"] for e in err.errors())


def test_defaults_are_valid() -> None:
    cfg = ConsumerConfig(**BASE)
    assert cfg.max_batch <= cfg.flow.headroom_records
    assert cfg.revoke_timeout * 1000 <= cfg.max_poll_interval_ms / 2


# -- auto commit ------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["enable.auto.commit", "enable.auto.offset.store"])
@pytest.mark.parametrize("value", [True, "true", "True", 1, "1"])
def test_auto_commit_cannot_be_turned_on(key: str, value: Any) -> None:
    err = invalid(kafka={key: value})
    assert locs(err) == [("kafka",)]
    assert key in messages(err)


@pytest.mark.parametrize("value", [False, "false", "FALSE", 0, "0"])
def test_auto_commit_may_be_stated_off(value: Any) -> None:
    cfg = ConsumerConfig(**BASE, kafka={"enable.auto.commit": value})
    assert str(cfg.librdkafka_config()["enable.auto.commit"]).lower() in ("false", "0")


def test_librdkafka_config_forces_weir_owned_settings() -> None:
    conf = ConsumerConfig(**BASE).librdkafka_config()
    assert conf["enable.auto.commit"] is False
    assert conf["enable.auto.offset.store"] is False
    assert conf["bootstrap.servers"] == "broker:9092"
    assert conf["group.id"] == "g"
    assert "on_commit" not in conf and "error_cb" not in conf
    assert conf["queued.max.messages.kbytes"] * 1024 <= FlowConfig().headroom_bytes


# -- typed keys in the kafka mapping ----------------------------------------------------------

TYPED = {
    "bootstrap.servers": "bootstrap_servers",
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


@pytest.mark.parametrize(("key", "field"), sorted(TYPED.items()))
def test_typed_keys_are_refused_in_the_kafka_mapping(key: str, field: str) -> None:
    err = invalid(kafka={key: "x"})
    assert locs(err) == [("kafka",)]
    assert key in messages(err)
    assert field in messages(err)


@pytest.mark.parametrize("key", ["on_commit", "error_cb", "stats_cb", "logger"])
def test_callback_keys_are_owned_by_weir(key: str) -> None:
    err = invalid(kafka={key: "x"})
    assert locs(err) == [("kafka",)]
    assert key in messages(err)


def test_other_librdkafka_keys_pass_through() -> None:
    cfg = ConsumerConfig(**BASE, kafka={"fetch.min.bytes": 10, "client.id": "me"})
    conf = cfg.librdkafka_config()
    assert conf["fetch.min.bytes"] == 10
    assert conf["client.id"] == "me"


# -- group protocols --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("session_timeout_ms", 10_000),
        ("heartbeat_interval_ms", 1_000),
        ("assignment_strategy", "range"),
        ("assignment_strategy", "cooperative-sticky"),
    ],
)
def test_classic_only_settings_are_refused_under_the_consumer_protocol(
    field: str, value: Any
) -> None:
    err = invalid(group_protocol="consumer", **{field: value})
    assert locs(err) == [(field,)]
    assert "consumer" in messages(err)
    # The same setting is fine under the classic protocol.
    ConsumerConfig(**BASE, group_protocol="classic", **{field: value})


def test_remote_assignor_needs_the_consumer_protocol() -> None:
    err = invalid(remote_assignor="uniform")
    assert locs(err) == [("remote_assignor",)]
    assert "group_protocol" in messages(err)
    cfg = ConsumerConfig(**BASE, group_protocol="consumer", remote_assignor="uniform")
    conf = cfg.librdkafka_config()
    assert conf["group.remote.assignor"] == "uniform"
    assert "partition.assignment.strategy" not in conf
    assert "session.timeout.ms" not in conf


def test_consumer_protocol_is_incremental_and_classic_default_is_cooperative() -> None:
    assert ConsumerConfig(**BASE, group_protocol="consumer").incremental
    classic = ConsumerConfig(**BASE)
    assert classic.incremental
    assert classic.librdkafka_config()["partition.assignment.strategy"] == "cooperative-sticky"
    assert not ConsumerConfig(**BASE, assignment_strategy="range").incremental


def test_heartbeat_must_be_below_session_timeout() -> None:
    err = invalid(session_timeout_ms=6000, heartbeat_interval_ms=6000)
    assert "heartbeat_interval_ms" in messages(err)
    assert "session_timeout_ms" in messages(err)


# -- flow marks -------------------------------------------------------------------------------


@pytest.mark.parametrize("resume", [100, 150])
def test_resume_records_must_be_below_pause_records(resume: int) -> None:
    err = invalid(flow={"capacity_records": 300, "pause_records": 100, "resume_records": resume})
    assert locs(err) == [("flow", "resume_records")]
    assert "pause_records" in messages(err)


def test_resume_bytes_must_be_below_pause_bytes() -> None:
    mib = 1024 * 1024
    err = invalid(flow={"capacity_bytes": 4 * mib, "pause_bytes": 2 * mib, "resume_bytes": 2 * mib})
    assert locs(err) == [("flow", "resume_bytes")]


def test_pause_records_must_be_below_capacity() -> None:
    with pytest.raises(ValidationError) as info:
        FlowConfig(capacity_records=10, pause_records=10, resume_records=1)
    assert locs(info.value) == [("pause_records",)]


def test_pause_bytes_must_leave_a_mebibyte_of_headroom() -> None:
    mib = 1024 * 1024
    with pytest.raises(ValidationError) as info:
        FlowConfig(capacity_bytes=3 * mib, pause_bytes=3 * mib - 1, resume_bytes=0)
    assert locs(info.value) == [("pause_bytes",)]
    assert FlowConfig(capacity_bytes=3 * mib, pause_bytes=2 * mib, resume_bytes=0)


def test_max_batch_larger_than_headroom_is_refused() -> None:
    flow = {"capacity_records": 300, "pause_records": 200, "resume_records": 50}
    err = invalid(max_batch=101, flow=flow)
    assert "max_batch" in messages(err)
    assert "headroom" in messages(err)
    assert ConsumerConfig(**BASE, max_batch=100, flow=flow).max_batch == 100


def test_revoke_timeout_must_fit_in_half_the_poll_interval() -> None:
    err = invalid(revoke_timeout=10.0, max_poll_interval_ms=19_999)
    assert "revoke_timeout" in messages(err)
    assert "max_poll_interval_ms" in messages(err)
    assert ConsumerConfig(**BASE, revoke_timeout=10.0, max_poll_interval_ms=20_000)


def test_client_fetch_queue_must_fit_in_the_byte_headroom() -> None:
    headroom_kb = FlowConfig().headroom_bytes // 1024
    err = invalid(kafka={"queued.max.messages.kbytes": headroom_kb + 1})
    assert "queued.max.messages.kbytes" in messages(err)
    assert "headroom" in messages(err)
    cfg = ConsumerConfig(**BASE, kafka={"queued.max.messages.kbytes": headroom_kb})
    assert cfg.librdkafka_config()["queued.max.messages.kbytes"] == headroom_kb


# -- plain field rules ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "loc"),
    [
        ({"topics": []}, ("topics",)),
        ({"topics": [""]}, ("topics",)),
        ({"group_id": ""}, ("group_id",)),
        ({"workers": 0}, ("workers",)),
        ({"ordering": "random"}, ("ordering",)),
        ({"poll_timeout": 5.0}, ("poll_timeout",)),
        ({"no_such_setting": 1}, ("no_such_setting",)),
    ],
)
def test_field_errors_carry_the_field_location(overrides: dict[str, Any], loc: tuple) -> None:
    assert loc in locs(invalid(**overrides))


def test_config_is_frozen() -> None:
    cfg = ConsumerConfig(**BASE)
    with pytest.raises(ValidationError):
        cfg.workers = 3  # type: ignore[misc]


def test_group_consumer_validates_before_building_a_client() -> None:
    built: list[dict[str, Any]] = []
    with pytest.raises(ValidationError):
        GroupConsumer(
            lambda r: None,
            consumer_factory=lambda conf: built.append(conf),
            **{**BASE, "kafka": {"enable.auto.commit": True}},
        )
    assert built == []


# -- secrets ----------------------------------------------------------------------------------

SECRET_KEYS = [
    "sasl.password",
    "ssl.key.password",
    "ssl.keystore.password",
    "sasl.oauthbearer.client.secret",
    "ssl.key.pem",
]


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_secrets_are_masked_in_repr_and_str(key: str) -> None:
    cfg = ConsumerConfig(**BASE, kafka={key: SECRET, "sasl.username": "alice"})
    for text in (repr(cfg), str(cfg), f"{cfg}", repr(GroupConsumer(print, cfg))):
        assert SECRET not in text
    assert "alice" in repr(cfg)  # masking is per key, not a blanket
    assert key in repr(cfg)
    # The real value still reaches the client.
    assert cfg.librdkafka_config()[key] == SECRET


INVALID_WITH_SECRET: list[dict[str, Any]] = [
    {"kafka": {"sasl.password": SECRET, "enable.auto.commit": True}},
    {"kafka": {"sasl.password": SECRET, "group.id": "other"}},
    {"kafka": {"sasl.password": SECRET, "queued.max.messages.kbytes": 10**9}},
    {"kafka": {"sasl.password": SECRET, "client.id": ["not", "scalar"]}},
    {"kafka": {"sasl.password": [SECRET]}},
    {"kafka": {"sasl.password": SECRET}, "max_batch": 10_000},
    {"kafka": {"sasl.password": SECRET}, "revoke_timeout": 1_000.0},
    {"kafka": {"sasl.password": SECRET}, "workers": 0},
]


@pytest.mark.parametrize("overrides", INVALID_WITH_SECRET)
def test_secrets_never_appear_in_validation_error_text(overrides: dict[str, Any]) -> None:
    err = invalid(**overrides)
    assert SECRET not in str(err)
    assert SECRET not in repr(err)
    assert SECRET not in messages(err)


def test_secrets_never_appear_in_validation_error_json() -> None:
    """`ValidationError.json()` is the text form web frameworks and log shippers emit; it
    carries each error's raw `input`, which for the kafka mapping or a model-level rule is the
    mapping with the password in clear."""
    leaking = [o for o in INVALID_WITH_SECRET if SECRET in invalid(**o).json()]
    assert leaking == []
