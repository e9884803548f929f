"""Mutual TLS as the login: the secured session broker's SSL listener, where the client's
certificate is its identity (`User:<CN>`, by `ssl.principal.mapping.rules`) and the ACLs hold
it as they hold a SASL user. Each test's principal is its own (a certificate issued for it on
demand), so no ACL another test granted changes what the broker refuses it.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from tests.integration.secured import cli, member
from weir import AuthenticationError, AuthorizationError, TlsError
from weir.testing.broker import EmbeddedKafka
from weir.testing.pytest_plugin import allow, create_topic, produce, wait_for_committed
from weir.testing.security import BrokerSecurity, ClientSettings, prepare_security

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

# A refusal at start is named as soon as the broker answers: well within this.
NAMED_WITHIN_S = 5.0
WAIT_S = 30.0


@pytest.fixture
def holder(kafka_secure_broker: EmbeddedKafka, principal: str) -> ClientSettings:
    """`principal`'s certificate (CN=principal) on the SSL listener."""
    return kafka_secure_broker.client_settings(principal, mechanism="SSL")


def start_refused(settings: ClientSettings, group: str, topic: str) -> Exception:
    """Run a member the broker refuses: its error, named within NAMED_WITHIN_S."""
    gc = member(settings, lambda record: None, group_id=group, topics=[topic])
    began = time.monotonic()
    with pytest.raises(Exception) as raised:
        gc.run()
    assert time.monotonic() - began < NAMED_WITHIN_S
    assert not gc.health().live
    return raised.value


def test_a_certificate_principal_consumes_commits_and_weir_lag_reads_the_group(
    kafka_secure_broker: EmbeddedKafka,
    kafka_secure_admin: AdminClient,
    kafka_secure_client: ClientSettings,
    holder: ClientSettings,
    principal: str,
    group: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The ACLs name `User:<principal>`: only the mapping of the certificate's subject
    (`CN=<principal>,O=weir test`) to its common name lets the member in."""
    conf = holder.config()
    assert conf["security.protocol"] == "SSL" and not any(k.startswith("sasl.") for k in conf)
    assert conf["bootstrap.servers"] == kafka_secure_broker.ssl_bootstrap_servers
    topic = create_topic(kafka_secure_broker.internal_bootstrap_servers, partitions=2)
    records = [(f"k{i}", f"v{i}") for i in range(20)]
    produce(
        kafka_secure_client.bootstrap_servers, topic, records, config=kafka_secure_client.config()
    )
    allow(kafka_secure_admin, principal, topics=[topic], groups=[group])
    seen: list[str] = []
    gc = member(holder, lambda r: seen.append(r.value.decode()), group_id=group, topics=[topic])
    gc.start()
    try:
        committed = wait_for_committed(kafka_secure_admin, group, topic, timeout=WAIT_S)
    finally:
        gc.stop()
        gc.join(30)
    assert sorted(seen) == sorted(v for _, v in records)
    assert sum(o or 0 for o in committed.values()) == len(records)

    code, out, err = cli(capsys, holder, "lag", "-g", group, "--json")
    assert code == 0, err
    assert '"total_lag": 0' in out and f'"group": "{group}"' in out


def test_a_certificate_principal_refused_read_on_the_group_is_an_authorization_error(
    kafka_secure_broker: EmbeddedKafka,
    kafka_secure_admin: AdminClient,
    holder: ClientSettings,
    principal: str,
    group: str,
) -> None:
    topic = create_topic(kafka_secure_broker.internal_bootstrap_servers)
    allow(kafka_secure_admin, principal, topics=[topic])
    error = start_refused(holder, group, topic)
    assert isinstance(error, AuthorizationError), repr(error)
    text = str(error)
    assert text.startswith(
        f"authorization failed: the broker's ACLs do not allow this client READ on group "
        f"{group!r} (GROUP_AUTHORIZATION_FAILED: "
    ), text
    assert error.operation == "READ" and error.resources == (group,)


def test_no_certificate_or_one_from_another_ca_is_a_tls_error_naming_it(
    holder: ClientSettings, principal: str, group: str, tmp_path: Path
) -> None:
    """Both end in the broker's TLS alert; nothing else answers on an SSL listener."""
    assert holder.cert_file is not None and holder.key_file is not None
    # A certificate with the same name, from a CA of another (never started) broker.
    other = prepare_security(BrokerSecurity(users=[principal]), tmp_path, formatted=False)
    strangers = replace(
        holder,
        cert_file=str(other.tls.client_cert_file(principal)),
        key_file=str(other.tls.client_key_file(principal)),
    )
    for settings in (replace(holder, cert_file=None, key_file=None), strangers):
        error = start_refused(settings, group, "t")
        assert isinstance(error, TlsError), repr(error)
        text = str(error)
        assert text.startswith(
            f"TLS failed: the broker at {holder.bootstrap_servers!r} refused the client's "
            "certificate (ssl/tls alert "
        ), text
        assert text.endswith(
            "): it requires one signed by a CA it trusts; set ssl.certificate.location and "
            "ssl.key.location"
        ), text


def test_a_certificate_client_at_the_sasl_listener_is_told_it_expects_sasl(
    kafka_secure_broker: EmbeddedKafka,
    holder: ClientSettings,
    group: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Regression: an SSL client sent to the SASL_SSL port (MSK's 9096 for its 9094, say) was
    `BrokerUnreachableError: no Kafka broker answered ... Broker transport failure`, though
    the broker answered: it accepted the certificate and closed the connection at the first
    request that was not a SASL handshake. librdkafka reports that close in a log line only,
    or, when it races the client's first write, as "Send failed: ... Broken pipe" (seen once in
    a fresh-clone CI run: tests/unit/test_refusals.py holds that case)."""
    wrong_port = replace(holder, bootstrap_servers=kafka_secure_broker.bootstrap_servers)
    expected = (
        f"authentication failed: the broker at {wrong_port.bootstrap_servers!r} closed the "
        "connection at the client's first request after the TLS handshake, as a listener that "
        "expects a SASL login does (security.protocol SSL: the client certificate is the only "
        "login offered): connect to the broker's SSL listener, or log in with SASL "
        "(security.protocol SASL_SSL and sasl.*)"
    )
    error = start_refused(wrong_port, group, "t")
    assert isinstance(error, AuthenticationError), repr(error)
    assert str(error) == expected

    code, out, err = cli(capsys, wrong_port, "lag", "-g", group, "--timeout", "2")
    assert (code, out, err) == (1, "", f"weir: {expected}\n")
