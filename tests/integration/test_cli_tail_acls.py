"""`weir tail` and `weir dlq` on the secured broker, as a principal with only the ACLs
docs/security.md says they need."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.admin import AdminClient

from tests.integration.secured import cli
from weir.deadletters import redrive_transactional_id
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


@pytest.mark.slow  # three redrives as a principal: about 4 s
def test_redrive_needs_the_transactional_id_and_write_on_the_target(
    kafka_secure_broker: EmbeddedKafka,
    kafka_secure_admin: AdminClient,
    who: ClientSettings,
    principal: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    internal = kafka_secure_broker.internal_bootstrap_servers
    source = create_topic(internal, partitions=1)
    dlq = create_topic(internal, partitions=1)
    weir_headers = [
        ("weir.dlq.topic", source),
        ("weir.dlq.partition", "0"),
        ("weir.dlq.offset", "0"),
        ("weir.dlq.attempts", "1"),
        ("weir.dlq.exception", "builtins.ValueError"),
        ("weir.dlq.message", "no"),
    ]
    produce(internal, dlq, [{"key": "k", "value": "v", "headers": weir_headers}])
    allow(kafka_secure_admin, principal, topics=[dlq, source], operations=["READ"])
    code, out, err = cli(capsys, who, "dlq", "redrive", dlq, "--execute", "--timeout", "5")
    assert (code, out) == (1, "")
    tid = redrive_transactional_id(dlq)
    assert len(err.splitlines()) == 1 and "(TRANSACTIONAL_ID_AUTHORIZATION_FAILED: " in err, err
    assert f"WRITE and DESCRIBE on the transactional id {tid!r} (cluster " in err, err
    allow(kafka_secure_admin, principal, transactional_ids=[tid], operations=["WRITE", "DESCRIBE"])
    code, out, err = cli(capsys, who, "dlq", "redrive", dlq, "--execute", "--timeout", "5")
    assert (code, out) == (1, "")
    assert len(err.splitlines()) == 1 and "(TOPIC_AUTHORIZATION_FAILED: " in err, err
    allow(kafka_secure_admin, principal, topics=[source], operations=["WRITE"])
    code, out, err = cli(capsys, who, "dlq", "redrive", dlq, "--execute", "--json")
    assert code == 0, err
    assert json.loads(out)["sent"] == 1
