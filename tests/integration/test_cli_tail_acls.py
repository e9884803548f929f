"""`weir tail` and `weir dlq` on the secured broker, as a principal with only the ACLs
docs/security.md says they need."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.admin import AdminClient

from tests.integration.secured import cli
from weir.testing.broker import EmbeddedKafka
from weir.testing.pytest_plugin import allow, create_topic, produce
from weir.testing.security import ClientSettings

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]


def test_tail_and_show_need_read_on_the_topic_and_no_group(
    kafka_secure_broker: EmbeddedKafka,
    kafka_secure_admin: AdminClient,
    who: ClientSettings,
    principal: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = create_topic(kafka_secure_broker.internal_bootstrap_servers, partitions=1)
    produce(kafka_secure_broker.internal_bootstrap_servers, topic, [("k", "v"), ("k", "w")])
    code, out, err = cli(capsys, who, "tail", topic, "--from-beginning", "--no-follow")
    assert (code, out) == (1, "")
    assert len(err.splitlines()) == 1 and err.startswith("weir: "), err
    allow(kafka_secure_admin, principal, topics=[topic], operations=["READ"])
    code, out, err = cli(capsys, who, "tail", topic, "--from-beginning", "--no-follow", "--json")
    assert code == 0, err
    assert [json.loads(line)["value"] for line in out.splitlines()] == ["v", "w"]
    code, out, err = cli(capsys, who, "dlq", "show", topic, "--json")
    assert code == 0, err
    assert len(out.splitlines()) == 2
