"""`topics`: names, and regular expressions starting with '^' that mean the same under both group
protocols (librdkafka's POSIX matching for classic, the broker's RE2/J for KIP-848)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from weir import ConsumerConfig

BASE: dict[str, Any] = {"bootstrap_servers": "broker:9092", "group_id": "g"}


def refused(*topics: str) -> str:
    with pytest.raises(ValidationError) as info:
        ConsumerConfig(**BASE, topics=list(topics))
    assert [e["loc"] for e in info.value.errors()] == [("topics",)]
    return str(info.value.errors()[0]["msg"])


@pytest.mark.parametrize(
    "topics",
    [
        ["orders"],
        ["orders.eu_1-a", "x" * 249],
        ["^orders-.*"],
        ["^orders-[0-9]+$", "^(eu|us)\\.orders.*", "payments"],
        ["^a\\\\.*"],  # an escaped backslash, then .*
        ["^orders-(eu|us)?$"],
    ],
)
def test_names_and_portable_patterns_are_accepted(topics: list[str]) -> None:
    assert ConsumerConfig(**BASE, topics=topics).topics == topics


@pytest.mark.parametrize("topic", ["^orders-(", "^orders-[a-", "^*", "^a{2,1}$"])
def test_a_bad_regular_expression_names_it_and_why(topic: str) -> None:
    msg = refused(topic)
    assert repr(topic) in msg
    assert "not a valid regular expression" in msg


@pytest.mark.parametrize(
    "topic",
    [
        "^orders-\\d+$",  # \d is a plain 'd' in POSIX
        "^orders-\\w+.*",
        "^(?i:orders).*",
        "^orders(?=-eu).*",
        "^(?P<region>eu|us).*",
        "^(?:eu|us).*",
        "^(a)\\1.*",
    ],
)
def test_constructs_the_matchers_read_differently_are_refused(topic: str) -> None:
    msg = refused(topic)
    assert repr(topic) in msg
    assert "[0-9]" in msg


@pytest.mark.parametrize("topic", ["^orders", "^orders-", "^orders|payments", "^a\\.*", "^a\\$"])
def test_a_pattern_must_match_whole_names(topic: str) -> None:
    """Classic (librdkafka) takes '^orders' for every topic starting with 'orders', KIP-848 (the
    broker) for the topic 'orders' alone: a pattern ending in '.*' or '$' means one thing."""
    msg = refused(topic)
    assert repr(topic) in msg
    assert "'.*' or '$'" in msg


@pytest.mark.parametrize("topic", ["", ".", "..", "a b", "orders*", "x" * 250, "ordérs"])
def test_a_topic_name_must_be_one_kafka_accepts(topic: str) -> None:
    msg = refused(topic)
    assert "not a topic name" in msg
    assert "starts with '^'" in msg


def test_every_bad_topic_is_reported() -> None:
    msg = refused("ok", "a b", "^(", "^x")
    for topic in ("a b", "^(", "^x"):
        assert repr(topic) in msg
    assert "'ok'" not in msg
