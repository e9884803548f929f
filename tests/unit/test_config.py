"""ConsumerConfig / FlowConfig: every contradiction is a ValidationError naming the field, and
secrets never show up in reprs or error text."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from weir import ConsumerConfig, FailurePolicy, FlowConfig, GroupConsumer, RetryPolicy
from weir._engine.client import ConsumerClient

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
    assert cfg.max_batch_records <= cfg.flow.headroom_records
    assert cfg.revoke_timeout_s <= cfg.max_poll_interval_s / 2


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
    "session.timeout.ms": "session_timeout_s",
    "heartbeat.interval.ms": "heartbeat_interval_s",
    "max.poll.interval.ms": "max_poll_interval_s",
    "auto.offset.reset": "auto_offset_reset",
    # librdkafka took it for the topic-level auto.offset.reset: auto_offset_reset="earliest"
    # with kafka={"topic.auto.offset.reset": "latest"} started a new group at the log end.
    "topic.auto.offset.reset": "auto_offset_reset",
    "topic.metadata.refresh.interval.ms": "topic_refresh_s",
}


@pytest.mark.parametrize(("key", "field"), sorted(TYPED.items()))
def test_typed_keys_are_refused_in_the_kafka_mapping(key: str, field: str) -> None:
    err = invalid(kafka={key: "x"})
    assert locs(err) == [("kafka",)]
    assert key in messages(err)
    assert field in messages(err)


def test_the_topic_level_offset_reset_cannot_override_the_field() -> None:
    # Accepted before, and the member started a new group at the log end, past every record.
    err = invalid(auto_offset_reset="earliest", kafka={"topic.auto.offset.reset": "latest"})
    assert "set 'auto_offset_reset' instead of kafka['topic.auto.offset.reset']" in messages(err)


def test_other_librdkafka_keys_pass_through() -> None:
    cfg = ConsumerConfig(**BASE, kafka={"fetch.min.bytes": 10, "client.id": "me"})
    conf = cfg.librdkafka_config()
    assert conf["fetch.min.bytes"] == 10
    assert conf["client.id"] == "me"


# -- group protocols --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("session_timeout_s", 10.0),
        ("heartbeat_interval_s", 1.0),
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
    err = invalid(session_timeout_s=6.0, heartbeat_interval_s=6.0)
    assert "heartbeat_interval_s" in messages(err)
    assert "session_timeout_s" in messages(err)


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


MIB = 1024 * 1024
VALID_MARKS = {
    "capacity_records": 300,
    "pause_records": 200,
    "resume_records": 100,
    "capacity_bytes": 8 * MIB,
    "pause_bytes": 4 * MIB,
    "resume_bytes": 2 * MIB,
}


@pytest.mark.parametrize(
    ("mark", "above", "least_gap"),
    [
        ("pause_records", "capacity_records", 1),
        ("resume_records", "pause_records", 1),
        ("pause_bytes", "capacity_bytes", MIB),
        ("resume_bytes", "pause_bytes", 1),
    ],
)
def test_each_flow_mark_stays_below_the_mark_above_it(
    mark: str, above: str, least_gap: int
) -> None:
    """The four marks share one rule: the closest each may come to the mark above it is
    accepted, one more is refused, at the mark's own name and with both values."""
    high = VALID_MARKS[above]
    closest = FlowConfig(**{**VALID_MARKS, mark: high - least_gap})
    assert getattr(closest, mark) == high - least_gap
    with pytest.raises(ValidationError) as info:
        FlowConfig(**{**VALID_MARKS, mark: high - least_gap + 1})
    assert locs(info.value) == [(mark,)]
    assert f"{mark} ({high - least_gap + 1}) must " in messages(info.value)
    assert f"below {above} ({high})" in messages(info.value)


def test_the_byte_headroom_fits_librdkafkas_fetch_queue_bound() -> None:
    gib = 1024**3
    with pytest.raises(ValidationError) as info:
        FlowConfig(capacity_bytes=3 * gib, pause_bytes=gib - 1, resume_bytes=0)
    assert locs(info.value) == [("pause_bytes",)]
    assert "queued.max.messages.kbytes" in messages(info.value)
    flow = FlowConfig(capacity_bytes=3 * gib, pause_bytes=gib + 1024, resume_bytes=0)
    conf = ConsumerConfig(**BASE, flow=flow).librdkafka_config()
    assert conf["queued.max.messages.kbytes"] == 2_097_151


def test_max_batch_larger_than_headroom_is_refused() -> None:
    flow = {"capacity_records": 300, "pause_records": 200, "resume_records": 50}
    err = invalid(max_batch_records=101, flow=flow)
    assert "max_batch_records" in messages(err)
    assert "headroom" in messages(err)
    assert ConsumerConfig(**BASE, max_batch_records=100, flow=flow).max_batch_records == 100


def test_revoke_timeout_must_fit_in_half_the_poll_interval() -> None:
    timeouts = {"session_timeout_s": 10.0, "revoke_timeout_s": 10.0}
    err = invalid(**timeouts, max_poll_interval_s=19.999)
    assert "revoke_timeout_s" in messages(err)
    assert "max_poll_interval_s" in messages(err)
    assert ConsumerConfig(
        **BASE, session_timeout_s=10.0, revoke_timeout_s=10.0, max_poll_interval_s=20.0
    )


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
        ({"poll_timeout_s": 5.0}, ("poll_timeout_s",)),
        ({"no_such_setting": 1}, ("no_such_setting",)),
    ],
)
def test_field_errors_carry_the_field_location(
    overrides: dict[str, Any], loc: tuple[str, ...]
) -> None:
    assert loc in locs(invalid(**overrides))


def test_config_is_frozen() -> None:
    cfg = ConsumerConfig(**BASE)
    with pytest.raises(ValidationError):
        cfg.workers = 3  # type: ignore[misc]


def test_group_consumer_validates_before_building_a_client() -> None:
    built: list[dict[str, Any]] = []

    def factory(conf: dict[str, Any]) -> ConsumerClient:
        built.append(conf)
        raise AssertionError("a client was built from a configuration that failed validation")

    with pytest.raises(ValidationError):
        GroupConsumer(
            lambda r: None,
            consumer_factory=factory,
            **{**BASE, "kafka": {"enable.auto.commit": True}},
        )
    assert built == []


# -- strict numbers -----------------------------------------------------------------------------

INT_FIELDS = ["workers", "max_batch_records", "commit_every_records"]
FLOAT_FIELDS = [
    "session_timeout_s",
    "heartbeat_interval_s",
    "max_poll_interval_s",
    "topic_refresh_s",
    "poll_timeout_s",
    "commit_interval_s",
    "revoke_timeout_s",
    "shutdown_timeout_s",
    "startup_timeout_s",
]


@pytest.mark.parametrize("field", INT_FIELDS)
@pytest.mark.parametrize("value", ["4", True, 4.0, b"4"])
def test_counts_take_only_ints(field: str, value: Any) -> None:
    assert locs(invalid(**{field: value})) == [(field,)]


@pytest.mark.parametrize("field", FLOAT_FIELDS)
@pytest.mark.parametrize("value", ["1.5", True, False, float("inf"), float("nan")])
def test_durations_take_only_finite_numbers(field: str, value: Any) -> None:
    assert (field,) in locs(invalid(**{field: value}))


@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_an_int_is_a_fine_duration(field: str) -> None:
    value = 60 if field == "max_poll_interval_s" else 1
    cfg = ConsumerConfig(**{**BASE, "session_timeout_s": 50, field: value})
    assert getattr(cfg, field) == value
    assert isinstance(getattr(cfg, field), float)


@pytest.mark.parametrize("field", sorted(FlowConfig.model_fields))
@pytest.mark.parametrize("value", ["400", True, 400.0])
def test_flow_counts_take_only_ints(field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as info:
        FlowConfig(**{field: value})
    assert (field,) in locs(info.value)
    assert (("flow", field)) in locs(invalid(flow={field: value}))


def test_librdkafka_durations_stay_within_librdkafkas_ranges() -> None:
    assert locs(invalid(session_timeout_s=3600.001)) == [("session_timeout_s",)]
    assert locs(invalid(heartbeat_interval_s=3600.001)) == [("heartbeat_interval_s",)]
    assert locs(invalid(max_poll_interval_s=86400.001)) == [("max_poll_interval_s",)]
    assert locs(invalid(topic_refresh_s=3600.001)) == [("topic_refresh_s",)]


def test_max_poll_interval_is_not_below_the_session_timeout_under_classic() -> None:
    err = invalid(max_poll_interval_s=10.0)  # librdkafka's default session timeout is 45 s
    assert locs(err) == [("max_poll_interval_s",)]
    assert "session timeout" in messages(err)
    err = invalid(session_timeout_s=20.0, max_poll_interval_s=19.0)
    assert "session_timeout_s" in messages(err)
    assert ConsumerConfig(**BASE, session_timeout_s=10.0, max_poll_interval_s=10.0)
    assert ConsumerConfig(**BASE, group_protocol="consumer", max_poll_interval_s=10.0)


# -- topic metadata refresh -----------------------------------------------------------------------


def test_topic_refresh_is_30_seconds_by_default_not_librdkafkas_5_minutes() -> None:
    assert (
        ConsumerConfig(**BASE).librdkafka_config()["topic.metadata.refresh.interval.ms"] == 30_000
    )
    conf = ConsumerConfig(**BASE, topic_refresh_s=1.5).librdkafka_config()
    assert conf["topic.metadata.refresh.interval.ms"] == 1500


# -- callbacks weir owns --------------------------------------------------------------------------


class _Logger:
    def log(self, level: int, msg: str, *args: object) -> None:
        pass


@pytest.mark.parametrize("value", [_Logger(), print, "x", None])
def test_a_logger_gets_one_error_that_names_weirs_logger(value: Any) -> None:
    err = invalid(kafka={"logger": value})
    assert len(err.errors()) == 1
    assert locs(err) == [("kafka",)]
    assert "weir.librdkafka" in messages(err)
    assert "kafka['logger']" in messages(err)


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("on_commit", "add_commit_listener"),
        ("offset_commit_cb", "add_commit_listener"),
        ("error_cb", "KafkaFatalError"),
        ("stats_cb", "stats()"),
        ("throttle_cb", "throttle"),
        ("rebalance_cb", "on_revoked"),
        ("log_cb", "weir.librdkafka"),
    ],
)
def test_each_callback_weir_owns_gets_one_error_saying_what_to_use(key: str, hint: str) -> None:
    err = invalid(kafka={key: print})
    assert len(err.errors()) == 1
    assert f"kafka[{key!r}]" in messages(err)
    assert hint in messages(err)


def test_a_callable_for_another_key_is_one_clear_error() -> None:
    err = invalid(kafka={"ssl.certificate.verify_cb": print})
    assert len(err.errors()) == 1
    assert "kafka['ssl.certificate.verify_cb'] is a callable" in messages(err)
    assert "the one callable is the OAUTHBEARER token provider, kafka['oauth_cb']" in messages(err)


def test_values_that_are_not_scalars_are_one_error_per_mapping() -> None:
    err = invalid(kafka={"client.id": ["a"], "fetch.min.bytes": {"n": 1}})
    assert len(err.errors()) == 1
    assert "kafka['client.id'] must be a str, int, float or bool" in messages(err)
    assert "kafka['fetch.min.bytes']" in messages(err)


# -- unknown settings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("workres", "did you mean 'workers'?"),
        ("boostrap_servers", "did you mean 'bootstrap_servers'?"),
        ("commit_interval", "commit_interval is now commit_interval_s (seconds)"),
        ("session_timeout_ms", "session_timeout_ms is now session_timeout_s (seconds)"),
        ("commit_every", "commit_every is now commit_every_records (records)"),
        ("max_batch", "max_batch is now max_batch_records (records)"),
        ("capacity_records", "flow=FlowConfig(capacity_records=...)"),
        ("group.id", "set 'group_id'"),
        ("fetch.min.bytes", "librdkafka settings go in kafka={...}"),
        ("zzz", "unknown setting 'zzz'"),
    ],
)
def test_an_unknown_setting_says_what_was_meant(name: str, expected: str) -> None:
    err = invalid(**{name: 1})
    assert locs(err) == [(name,)]
    assert expected in messages(err)


def test_a_count_renamed_for_its_unit_is_refused_with_its_new_name() -> None:
    """commit_every and max_batch did not say whether they count records or bytes (a Kafka
    producer's batch.size is bytes); their old names are refused, naming the new ones, from
    GroupConsumer's keywords as from ConsumerConfig."""
    with pytest.raises(ValidationError) as info:
        GroupConsumer(print, **BASE, commit_every=10, max_batch=10)  # type: ignore[call-overload]
    assert set(locs(info.value)) == {("commit_every",), ("max_batch",)}
    assert "commit_every is now commit_every_records (records)" in messages(info.value)
    assert "max_batch is now max_batch_records (records)" in messages(info.value)
    cfg = ConsumerConfig(**BASE, commit_every_records=10, max_batch_records=10)
    assert (cfg.commit_every_records, cfg.max_batch_records) == (10, 10)


def test_unknown_settings_are_reported_with_the_other_errors() -> None:
    err = invalid(workres=4, workers=0, flow={"pause_record": 10})
    assert set(locs(err)) == {("workres",), ("workers",), ("flow", "pause_record")}
    assert "did you mean 'pause_records'?" in messages(err)
    with pytest.raises(ValidationError) as info:
        FlowConfig(resume_record=1)  # type: ignore[call-arg]  # misspelled on purpose
    assert "did you mean 'resume_records'?" in messages(info.value)


def test_a_misspelled_failure_setting_gets_its_policy_s_closest_name() -> None:
    """RetryPolicy and FailurePolicy name their own close matches, built alone or nested in a
    ConsumerConfig (whose own explanations know only its names: 'finall' got no hint)."""
    err = invalid(failure={"finall": "stop", "retry": {"max_attempt": 2}})
    assert set(locs(err)) == {("failure", "finall"), ("failure", "retry", "max_attempt")}
    assert "did you mean 'final'?" in messages(err)
    assert "did you mean 'max_attempts'?" in messages(err)
    with pytest.raises(ValidationError) as info:
        FailurePolicy(dead_leter_topic="x")  # type: ignore[call-arg]  # misspelled on purpose
    assert "did you mean 'dead_letter_topic'?" in messages(info.value)
    with pytest.raises(ValidationError) as info:
        RetryPolicy(backof_max_s=1.0)  # type: ignore[call-arg]  # misspelled on purpose
    assert "did you mean 'backoff_max_s'?" in messages(info.value)


def test_group_consumer_says_did_you_mean_for_a_misspelled_setting() -> None:
    with pytest.raises(ValidationError) as info:
        GroupConsumer(print, **BASE, max_bach=10)  # type: ignore[call-overload]  # on purpose
    assert "did you mean 'max_batch_records'?" in str(info.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("session_timeout_s", 10.0),
        ("heartbeat_interval_s", 1.0),
        ("assignment_strategy", "range"),
        ("remote_assignor", "uniform"),
    ],
)
def test_auto_takes_the_settings_of_either_protocol_and_runs_each_with_its_own(
    field: str, value: Any
) -> None:
    """group_protocol="auto" chooses at start: a setting of one protocol applies if it runs
    that one, and is left out (and named) if it runs the other."""
    cfg = ConsumerConfig(**BASE, group_protocol="auto", **{field: value})
    classic, classic_ignored = cfg.runs("classic")
    consumer, consumer_ignored = cfg.runs("consumer")
    own, other = (consumer, classic) if field == "remote_assignor" else (classic, consumer)
    assert getattr(own, field) == value and getattr(other, field) is None
    assert (consumer_ignored, classic_ignored) == (
        ([], [field]) if field == "remote_assignor" else ([field], [])
    )
    assert (classic.group_protocol, consumer.group_protocol) == ("classic", "consumer")
    # Before it is chosen the client's configuration is the classic one, without KIP-848's.
    conf = cfg.librdkafka_config()
    assert conf["group.protocol"] == "classic"
    assert "group.remote.assignor" not in conf
    assert "session.timeout.ms" not in consumer.librdkafka_config()


def test_auto_holds_the_classic_protocols_rules() -> None:
    err = invalid(group_protocol="auto", session_timeout_s=60.0, max_poll_interval_s=30.0)
    assert locs(err) == [("max_poll_interval_s",)]
