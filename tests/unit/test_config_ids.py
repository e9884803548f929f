"""Ids and names reach librdkafka only as Kafka and the client take them: a blank group id aborted
the interpreter in the settings probe's throwaway client, a NUL or a leading blank changed an id
without a word, and a bad dead-letter topic name failed only when the member started. Each is a
`ValidationError` saying what is allowed; every id Kafka accepts still validates
(tests/integration/test_ids_broker.py runs the odd ones on a real broker, and
tests/integration/test_config_isolated.py the blank ids and signals in an interpreter of their
own)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from weir import ConsumerConfig, FailurePolicy

BASE: dict[str, Any] = {"bootstrap_servers": "broker:9092", "group_id": "g", "topics": ["t"]}
ID_RULE = "does not start with whitespace and has no NUL character"


def refused(**settings: Any) -> str:
    with pytest.raises(ValidationError) as info:
        ConsumerConfig(**{**BASE, **settings})
    return str(info.value)


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"group_id": " orders"}, "starts with whitespace, which librdkafka strips (it would be"),
        ({"group_id": "orders\x00eu"}, "contains a NUL character"),
        ({"group_id": "g" * 32768}, "group_id is 32768 bytes long"),
        ({"group_id": "é" * 16384}, "group_id is 32768 bytes long"),  # bytes, not characters
        ({"transactional_id": "\ttx"}, "transactional_id '\\ttx' starts with whitespace"),
        ({"transactional_id": "t" * 32768}, "transactional_id is 32768 bytes long"),
        ({"group_instance_id": " i"}, "group_instance_id ' i' starts with whitespace"),
        ({"group_instance_id": "i" * 32731}, "1 to 32730 bytes"),
        (
            {"group_instance_id": "i" * 32768, "group_protocol": "consumer"},
            "group_instance_id is 32768 bytes long",
        ),
        ({"kafka": {"client.id": " app"}}, "kafka['client.id'] ' app' starts with whitespace"),
        ({"kafka": {"client.id": "c" * 32731}}, "1 to 32730 bytes"),
    ],
)
def test_an_id_librdkafka_would_change_or_kafka_refuses_is_refused_saying_what_is_allowed(
    settings: dict[str, Any], said: str
) -> None:
    msg = refused(**settings)
    assert said in msg
    assert ID_RULE in msg


@pytest.mark.parametrize(
    "settings",
    [
        # Any other text is a group id to Kafka: blanks inside or at the end, control
        # characters, unicode, punctuation (run on a broker in test_ids_broker.py).
        {"group_id": "a b"},
        {"group_id": "orders "},
        {"group_id": "a\tb\x01c"},
        {"group_id": "é日本\u00a0"},
        {"group_id": "a/b:c*?"},
        {"group_id": "g" * 32767},
        {"group_id": "é" * 16383},
        {"transactional_id": "t" * 32767},  # was refused above 249
        {"transactional_id": "tx 1 "},
        {"group_instance_id": "i" * 32730},
        {"group_instance_id": "i" * 32767, "group_protocol": "consumer"},
        {"kafka": {"client.id": "c" * 32730}},
        # With an instance id the broker names the member after that, not the client id.
        {"kafka": {"client.id": "c" * 32767}, "group_instance_id": "i"},
        {"kafka": {"client.id": "c" * 32767}, "group_protocol": "consumer"},
    ],
)
def test_every_id_kafka_accepts_validates(settings: dict[str, Any]) -> None:
    cfg = ConsumerConfig(**{**BASE, **settings})
    for name, value in settings.items():
        assert getattr(cfg, name) == value


def test_a_nul_in_a_kafka_name_cannot_slip_past_the_rules_for_it() -> None:
    # librdkafka read the name up to the NUL: this set enable.auto.commit=true and the group id.
    msg = refused(kafka={"enable.auto.commit\x00": True, "group.id\x00x": "other"})
    assert "kafka['enable.auto.commit\\x00']: the name contains a NUL character" in msg
    assert "kafka['group.id\\x00x']: the name contains a NUL character" in msg


def test_a_nul_in_a_kafka_value_is_refused_without_showing_a_secret() -> None:
    msg = refused(kafka={"sasl.password": "hunter2\x00rest", "client.id": "app\x00"})
    assert "kafka['sasl.password'] contains a NUL character" in msg
    assert "kafka['client.id'] contains a NUL character" in msg
    assert "hunter2" not in msg


def test_a_nul_in_the_bootstrap_servers_is_refused() -> None:
    # The client would read "a:9092" and never hear of b.
    assert "contains a NUL character" in refused(bootstrap_servers="a:9092\x00,b:9092")


def test_the_termination_signal_may_stay_off() -> None:
    cfg = ConsumerConfig(**BASE, kafka={"internal.termination.signal": 0})
    assert cfg.librdkafka_config()["internal.termination.signal"] == 0


# -- topic patterns ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("topic", "said"),
    [
        ("^a\x00.*", "contains a NUL character"),  # librdkafka would match '^a'
        ("^a{1001}$", "repeats {1001}: the broker's RE2/J refuses a count above 1000"),
        ("^a{2,01001}$", "repeats {2,01001}"),
        # librdkafka refused these at subscribe, when the member started (found by the fuzz
        # test); '{,5}' means {0,5} to Python and POSIX, a literal to RE2/J.
        ("^{.*", "has a '{' that starts no count"),
        ("^(a|{).*", "has a '{' that starts no count"),
        ("^a{x}.*", "has a '{' that starts no count"),
        ("^a{,5}$", "has a '{' that starts no count"),
        # These escaped pydantic as OverflowError and RecursionError, not ValidationError.
        ("^a{99999999999}$", "is not a valid regular expression"),
        ("^" + "(" * 3000 + ")" * 3000 + "$", "is not a valid regular expression"),
    ],
)
def test_a_pattern_no_matcher_takes_as_written_is_refused(topic: str, said: str) -> None:
    assert said in refused(topics=[topic])


def test_counts_and_braces_both_matchers_take_are_accepted() -> None:
    topics = ["^a{1000}$", "^b{0001,1000}.*", "^c{2,}$", "^[{1001}].*", "^d\\{.*", "^e}.*"]
    assert ConsumerConfig(**{**BASE, "topics": topics}).topics == topics


# -- dead-letter topics ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["orders dlq", "..", "orders/dlq", "é", "a\x00"])
def test_a_dead_letter_topic_that_is_no_topic_name_is_refused_at_validation(name: str) -> None:
    # It passed validation and failed when the member started, creating or writing the topic;
    # then it was refused only where a ConsumerConfig was built, not with the policy itself.
    said = "is not a topic name (1-249 of A-Z a-z 0-9 . _ -, not '.' or '..')"
    policy: dict[str, Any] = {"final": "dead_letter", "dead_letter_topic": name}
    for build, where in (
        (lambda: FailurePolicy(**policy), ("dead_letter_topic",)),
        (lambda: ConsumerConfig(**BASE, failure=policy), ("failure", "dead_letter_topic")),
        (
            lambda: ConsumerConfig(**BASE, failure_by_topic={"t": policy}),
            ("failure_by_topic", "t", "dead_letter_topic"),
        ),
    ):
        with pytest.raises(ValidationError) as info:
            build()
        [error] = info.value.errors()
        assert error["loc"] == where and said in error["msg"]


def test_a_dead_letter_topic_name_made_too_long_is_refused() -> None:
    # The default dead-letter topic is '<topic>.dlq': 4 characters more than the topic's name.
    long = "x" * 246
    msg = refused(topics=[long], failure=FailurePolicy(final="dead_letter"))
    assert "failure: the dead-letter topic of" in msg and "250 characters" in msg
    msg = refused(topics=[long], failure_by_topic={long: FailurePolicy(final="dead_letter")})
    assert f"failure_by_topic[{long!r}]: the dead-letter topic" in msg


@pytest.mark.parametrize(
    "settings",
    [
        {"topics": ["x" * 245], "failure": FailurePolicy(final="dead_letter")},
        {"topics": ["x" * 249], "failure": FailurePolicy(final="stop")},
        {
            "topics": ["x" * 249],
            "failure": FailurePolicy(final="dead_letter", dead_letter_topic="dlq"),
        },
        {  # the topic's own policy does not dead-letter
            "topics": ["x" * 249],
            "failure": FailurePolicy(final="dead_letter"),
            "failure_by_topic": {"x" * 249: FailurePolicy(final="block")},
        },
        {
            "topics": ["t"],
            "failure": FailurePolicy(final="dead_letter", dead_letter_topic="a.b_c-1"),
        },
    ],
)
def test_dead_letter_topics_kafka_takes_validate(settings: dict[str, Any]) -> None:
    assert ConsumerConfig(**{**BASE, **settings})


@pytest.mark.parametrize("topics", [["t", "t"], ["^a.*", "b", "^a.*"]])
def test_a_topic_listed_twice_is_refused(topics: list[str]) -> None:
    # librdkafka refused the subscription at start: "Invalid argument or configuration".
    assert "listed more than once" in refused(topics=topics)
