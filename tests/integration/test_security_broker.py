"""A broker secured as in production (TLS from a CA made at start, SASL/SCRAM-SHA-512 and PLAIN,
the StandardAuthorizer): a member and `weir lag` work over it.

One secured broker for the session (`kafka_secure_broker`); every test makes its own topic and
group.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from weir import GroupConsumer, Record
from weir.cli import main
from weir.testing.broker import EmbeddedKafka
from weir.testing.pytest_plugin import (
    SECURE_USER,
    allow,
    consume_all,
    create_topic,
    produce,
    records_as_text,
    wait_for_committed,
)
from weir.testing.security import ClientSettings

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

STARTUP_TIMEOUT_S = 20.0


def member(settings: ClientSettings, handler: Any, **options: Any) -> GroupConsumer:
    conf = settings.config()
    return GroupConsumer(
        handler,
        bootstrap_servers=conf.pop("bootstrap.servers"),
        kafka=conf,
        startup_timeout_s=STARTUP_TIMEOUT_S,
        **options,
    )


@pytest.fixture
def topic(kafka_secure_broker: EmbeddedKafka) -> str:
    return create_topic(kafka_secure_broker.internal_bootstrap_servers, partitions=2)


@pytest.fixture
def alice(kafka_secure_broker: EmbeddedKafka) -> ClientSettings:
    return kafka_secure_broker.client_settings(SECURE_USER)


def cli(
    capsys: pytest.CaptureFixture[str], settings: ClientSettings, *argv: str
) -> tuple[int, str, str]:
    conf = settings.config()
    args = ["-b", conf.pop("bootstrap.servers")]
    for key, value in conf.items():
        args += ["-X", f"{key}={value}"]
    code = main([*argv, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_member_consumes_and_commits_over_sasl_ssl_and_weir_lag_reads_it(
    kafka_secure_broker: EmbeddedKafka,
    kafka_secure_client: ClientSettings,
    kafka_secure_admin: Any,
    alice: ClientSettings,
    topic: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """alice, allowed by ACLs to read the topic and the group, consumes over SASL_SSL with
    SCRAM-SHA-512; the producer is the super user, also over SASL_SSL."""
    group = f"secure-{uuid.uuid4().hex[:8]}"
    records = [(f"k{i}", f"v{i}") for i in range(20)]
    produce(
        kafka_secure_client.bootstrap_servers, topic, records, config=kafka_secure_client.config()
    )
    allow(kafka_secure_admin, SECURE_USER, topics=[topic], groups=[group])
    seen: list[tuple[str, str]] = []
    done = threading.Event()

    def handle(record: Record) -> None:
        seen.append((record.key.decode(), record.value.decode()))  # type: ignore[union-attr]
        if len(seen) == len(records):
            done.set()

    gc = member(alice, handle, group_id=group, topics=[topic], auto_offset_reset="earliest")
    gc.start()
    try:
        assert done.wait(60), f"handled {len(seen)} of {len(records)}"
        committed = wait_for_committed(kafka_secure_admin, group, topic, timeout=30)
    finally:
        gc.stop()
        gc.join(30)
    assert sorted(seen) == sorted(records)
    assert sum(o or 0 for o in committed.values()) == len(records)

    code, out, err = cli(capsys, alice, "lag", "-g", group, "--json")
    assert code == 0, err
    assert '"total_lag": 0' in out and f'"group": "{group}"' in out
    assert alice.password not in out + err


def test_plain_users_log_in_too(
    kafka_secure_broker: EmbeddedKafka, kafka_secure_client: ClientSettings, topic: str
) -> None:
    produce(
        kafka_secure_client.bootstrap_servers,
        topic,
        [("k", "v")],
        config=kafka_secure_client.config(),
    )
    plain = kafka_secure_broker.client_settings(kafka_secure_client.username, mechanism="PLAIN")
    got = consume_all(plain.bootstrap_servers, topic, expected=1, config=plain.config())
    assert records_as_text(got) == [("k", "v")]
