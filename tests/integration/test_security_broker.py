"""A broker secured as in production (TLS from a CA made at start, SASL/SCRAM-SHA-512 and PLAIN,
the StandardAuthorizer): a member and `weir lag` work over it, and each way of being refused is
one error that names what was refused, at once, with no secret anywhere.

One secured broker for the session (`kafka_secure_broker`); every test makes its own topic and
group.
"""

from __future__ import annotations

import json
import logging
import re
import stat
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from tests.integration.secured import cli, member
from weir import (
    AuthenticationError,
    AuthorizationError,
    FailurePolicy,
    GroupConsumer,
    Handler,
    NonRetryable,
    Record,
    RetryPolicy,
    TlsError,
)
from weir.cli import main
from weir.records import Context
from weir.testing.broker import EmbeddedKafka
from weir.testing.pytest_plugin import (
    SECURE_SUPER_USER,
    SECURE_USER,
    allow,
    consume_all,
    create_topic,
    produce,
    records_as_text,
    wait_for_committed,
)
from weir.testing.security import ClientSettings, UnsecuredTokens

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

# A refusal is named as soon as the client has no broker left to try: well within this.
NAMED_WITHIN_S = 5.0


def refused_start(
    settings: ClientSettings, expected: type[Exception]
) -> tuple[Exception, GroupConsumer]:
    """Start a member that the broker refuses: its error, which came within NAMED_WITHIN_S."""
    gc = member(settings, lambda record: None, group_id="g-refused", topics=["t"])
    began = time.monotonic()
    with pytest.raises(Exception) as raised:
        gc.run()
    took = time.monotonic() - began
    assert type(raised.value) is expected, repr(raised.value)
    assert took < NAMED_WITHIN_S, took
    return raised.value, gc


@pytest.fixture
def topic(kafka_secure_broker: EmbeddedKafka) -> str:
    return create_topic(kafka_secure_broker.internal_bootstrap_servers, partitions=2)


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


def test_a_wrong_password_is_an_authentication_error_at_once(alice: ClientSettings) -> None:
    """Regression: the member waited for startup_timeout_s and said "no Kafka broker answered"
    for a broker that had refused its password."""
    error, gc = refused_start(replace(alice, password="not-" + alice.password), AuthenticationError)
    assert str(error) == (
        f"authentication failed: the broker at {alice.bootstrap_servers!r} refused the client's "
        "SASL credentials (security.protocol SASL_SSL, sasl.mechanism SCRAM-SHA-512): SASL "
        "authentication error: Authentication failed during authentication due to invalid "
        "credentials with SASL mechanism SCRAM-SHA-512. Check sasl.username and sasl.password, "
        "and that the user exists for this mechanism"
    )
    health = gc.health()
    assert not health.live and health.reasons == (f"failed: {error!r}",)


def test_an_unknown_user_is_an_authentication_error(alice: ClientSettings) -> None:
    unknown = replace(alice, username="mallory", mechanism="PLAIN")
    error, _ = refused_start(unknown, AuthenticationError)
    assert "Invalid username or password" in str(error) and "sasl.mechanism PLAIN" in str(error)


def test_a_client_without_the_ca_gets_a_tls_verification_error(alice: ClientSettings) -> None:
    """The client verifies the broker against the system's CAs, which never signed it."""
    error, _ = refused_start(replace(alice, ca_file=None), TlsError)
    assert re.fullmatch(
        re.escape(
            f"TLS verification failed: the certificate of the broker at "
            f"{alice.bootstrap_servers!r} is not signed by a CA the client trusts ("
        )
        + r"(self[- ]signed certificate in certificate chain|unable to get local issuer "
        r"certificate)" + re.escape("): set ssl.ca.location to the CA certificate that signed it"),
        str(error),
    ), str(error)


def test_a_hostname_mismatch_is_a_tls_verification_error(alice: ClientSettings) -> None:
    """The broker certificate names 127.0.0.1 only: `localhost` is another name."""
    port = alice.bootstrap_servers.rsplit(":", 1)[1]
    error, _ = refused_start(replace(alice, bootstrap_servers=f"localhost:{port}"), TlsError)
    assert str(error) == (
        f"TLS verification failed: the certificate of the broker at 'localhost:{port}' does not "
        "name the host the client connected to (Hostname mismatch, certificate is not valid "
        "for 'localhost'.): connect with a name the certificate holds (bootstrap.servers, and "
        "the broker's advertised listeners)"
    )


def test_a_client_without_a_certificate_is_refused_by_name(alice: ClientSettings) -> None:
    """The broker requires client certificates (mTLS); librdkafka reports its refusal as a
    transport failure ("ssl/tls alert bad certificate")."""
    assert alice.cert_file is not None and alice.key_file is not None
    error, _ = refused_start(replace(alice, cert_file=None, key_file=None), TlsError)
    assert str(error) == (
        f"TLS failed: the broker at {alice.bootstrap_servers!r} refused the client's "
        "certificate (ssl/tls alert bad certificate): it requires one signed by a CA it trusts; "
        "set ssl.certificate.location and ssl.key.location"
    )


def test_a_topic_the_acls_hide_is_an_authorization_error(alice: ClientSettings, topic: str) -> None:
    """Regression: with no ACL on its topic the member started, was never assigned anything
    and only warned (consume_error TOPIC_AUTHORIZATION_FAILED / GROUP_AUTHORIZATION_FAILED)."""
    gc = member(alice, lambda record: None, group_id="g-denied", topics=[topic])
    began = time.monotonic()
    with pytest.raises(AuthorizationError) as raised:
        gc.run()
    assert time.monotonic() - began < NAMED_WITHIN_S
    assert str(raised.value) == (
        "authorization failed: the broker's ACLs do not allow this client to describe topic "
        f"{topic!r} (TOPIC_AUTHORIZATION_FAILED; also said of a topic that does not exist): a "
        "member needs DESCRIBE and READ on its topics and READ on its group 'g-denied'"
    )


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"password": "wrong-password"}, "weir: authentication failed: "),
        ({"ca_file": None}, "weir: TLS verification failed: "),
    ],
)
def test_weir_lag_and_groups_name_the_refusal(
    alice: ClientSettings,
    capsys: pytest.CaptureFixture[str],
    change: dict[str, Any],
    named: str,
) -> None:
    """Regression: both said "no Kafka broker answered ... (Local: Timed out)" after --timeout."""
    settings = replace(alice, **change)
    for argv in (("lag", "-g", "any"), ("groups",)):
        began = time.monotonic()
        code, out, err = cli(capsys, settings, *argv, "--timeout", "10")
        took = time.monotonic() - began
        assert code == 1 and out == "", (argv, out, err)
        [line] = err.splitlines()
        assert line.startswith(named), (argv, line)
        assert took < NAMED_WITHIN_S, (argv, took)
        assert "wrong-password" not in err and alice.password not in err


@pytest.fixture
def every_log_line(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG)
    yield caplog


class ForwardingAllBut(Handler):
    """Exactly-once: each record to `output`, but for the one of value `bad`, which fails."""

    def __init__(self, output: str) -> None:
        self.output = output

    def handle(self, record: Record, ctx: Context) -> None:
        if record.value == b"bad":
            raise NonRetryable("bad record")
        ctx.produce(self.output, record.value, record.key)


def fetch(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return str(answer.read().decode())
    except urllib.error.HTTPError as error:  # /readyz of a member not ready: 503, a body
        return str(error.read().decode())


def test_no_secret_in_any_log_line_error_repr_metric_or_cli_output(
    kafka_secure_broker: EmbeddedKafka,
    kafka_secure_admin: AdminClient,
    kafka_secure_client: ClientSettings,
    alice: ClientSettings,
    topic: str,
    every_log_line: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """librdkafka's debug=all (every context: security, conf, protocol...) in every client of
    two members, one logging in with a password (its consumer, dead-letter producer,
    transactional producer and watermark refresher) and one with an OAUTHBEARER token provider,
    and while a wrong password is refused; `weir lag --json` and `weir groups --json` given the
    password with -X: the passwords and tokens appear nowhere, neither in the logs nor in the
    errors, reprs, health, stats, the Prometheus endpoint or the CLI's output."""
    from weir.prometheus import serve

    boot = kafka_secure_client.bootstrap_servers
    produce(
        boot, topic, [("k", "v"), ("k", "bad"), ("k", "w")], config=kafka_secure_client.config()
    )
    output = create_topic(kafka_secure_broker.internal_bootstrap_servers, partitions=1)
    group = f"secret-{uuid.uuid4().hex[:8]}"
    conf: dict[str, Any] = {**kafka_secure_client.config(), "debug": "all"}
    gc = member(
        kafka_secure_client, ForwardingAllBut(output), conf, group_id=group, topics=[topic],
        transactional_id=f"tx-{group}", watermark_refresh_s=0.5,
        failure=FailurePolicy(retry=RetryPolicy(max_attempts=1), final="dead_letter"),
    )  # fmt: skip
    shown: list[str] = []
    gc.start()
    try:
        with serve(gc, port=0, host="127.0.0.1") as server:
            wait_for_committed(kafka_secure_admin, group, topic, timeout=30)
            time.sleep(1.0)  # a few rounds of the watermark refresher
            shown += [fetch(f"{server.url}/{path}") for path in ("metrics", "healthz", "readyz")]
    finally:
        gc.stop()
        gc.join(30)
    assert "weir_" in shown[0] and '"live": true' in shown[1]
    shown += [repr(gc.config), str(gc.config), repr(gc.health()), repr(gc.stats())]

    admin_tokens = UnsecuredTokens(SECURE_SUPER_USER)
    oauth = kafka_secure_broker.client_settings(SECURE_SUPER_USER, mechanism="OAUTHBEARER")
    oauth_conf: dict[str, Any] = {**oauth.token_config(admin_tokens), "debug": "all"}
    oauth_group = f"secret-oauth-{uuid.uuid4().hex[:8]}"
    token_member = member(
        oauth, lambda record: None, oauth_conf, group_id=oauth_group, topics=[topic]
    )
    token_member.start()
    try:
        wait_for_committed(kafka_secure_admin, oauth_group, topic, timeout=30)
    finally:
        token_member.stop()
        token_member.join(30)
    shown += [repr(token_member.config), repr(token_member.health()), repr(token_member.stats())]
    assert admin_tokens.calls >= 1

    wrong = "wrong-" + alice.password
    bad_conf: dict[str, Any] = {**replace(alice, password=wrong).config(), "debug": "all"}
    refused = member(alice, lambda record: None, bad_conf, group_id="g-secret", topics=[topic])
    with pytest.raises(AuthenticationError) as raised:
        refused.run()
    shown += [str(raised.value), repr(raised.value), repr(refused.config), repr(refused.health())]
    shown += [repr(alice), repr(kafka_secure_client), repr(oauth)]

    for argv in (("lag", "-g", group, "--json"), ("groups", "--json")):
        code, out, err = cli(capfd, kafka_secure_client, *argv)
        assert code == 0 and out, (argv, err)
        shown += [out, err]
    code, out, err = cli(capfd, replace(alice, password=wrong), "groups", "--json")
    assert code == 1 and err.startswith("weir: authentication failed: "), err
    shown += [out, err]

    lines = [record.getMessage() for record in every_log_line.records]
    librdkafka = {
        client
        for line in lines
        for client in re.findall(r"\[(rdkafka#(?:consumer|producer)-\d+)\]", line)
    }
    assert len(lines) > 1000 and any("sasl" in line.lower() for line in lines)
    # debug=all reached more than the members' consumers: their producers and refreshers too.
    assert len(librdkafka) >= 6, librdkafka
    captured = capfd.readouterr()
    everything = "\n".join([*lines, *shown, captured.out, captured.err])
    secrets = [kafka_secure_client.password, alice.password, wrong, *admin_tokens.tokens]
    assert [s for s in secrets if s in everything] == []


def read_properties(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line)


@pytest.mark.slow  # the launcher's restart runs: make integration
@pytest.mark.usefixtures("quick_jvm")
def test_weir_broker_start_secure_keeps_its_users_and_ca_across_a_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Started again with --mtls: the same users, CA and port, client certificates asked for
    on SASL_SSL, and an SSL listener whose settings are written too, password-free."""
    state, workdir = tmp_path / "broker.json", tmp_path / "work"
    start = ["broker", "start", "--secure", "--user", "alice", "--state", str(state)]

    def started(*more: str) -> tuple[str, dict[str, str], str]:
        assert main([*start, "--dir", str(workdir), *more]) == 0
        out, err = capsys.readouterr()
        [bootstrap] = out.split()
        path = Path(json.loads(state.read_text())["client_settings"]["alice"])
        assert f"client settings of alice (password inside): {path}" in err
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        conf = read_properties(path)
        assert conf["bootstrap.servers"] == bootstrap
        assert conf["sasl.password"] not in out + err
        # Over SASL_SSL with those settings alone (a client certificate only with --mtls).
        admin = AdminClient(dict(conf))
        assert admin.list_topics(timeout=30).brokers
        return bootstrap, conf, err

    try:
        first, conf, _ = started()
        assert "ssl.certificate.location" not in conf
        assert json.loads(state.read_text())["ssl_client_settings"] == {}
        ca = Path(conf["ssl.ca.location"]).read_bytes()
        assert main(["broker", "stop", "--state", str(state)]) == 0
        assert capsys.readouterr().out == f"stopped {first}\n"
        second, again, err = started("--mtls")
        certificate = {k: v for k, v in again.items() if k not in conf}
        assert again == {**conf, **certificate} and Path(conf["ssl.ca.location"]).read_bytes() == ca
        assert sorted(certificate) == ["ssl.certificate.location", "ssl.key.location"]
        assert second == first

        recorded = json.loads(state.read_text())
        path = Path(recorded["ssl_client_settings"]["alice"])
        assert (
            f"SSL listener, a client certificate as the login: {recorded['ssl_bootstrap_servers']}"
            in err
        )
        assert f"client settings of alice over SSL (certificate, no password): {path}" in err
        ssl = read_properties(path)
        assert ssl == {
            "bootstrap.servers": recorded["ssl_bootstrap_servers"],
            "security.protocol": "SSL",
            "ssl.ca.location": conf["ssl.ca.location"],
            **certificate,
        }
        for private in (path, Path(ssl["ssl.key.location"])):
            assert stat.S_IMODE(private.stat().st_mode) == 0o600, private
        assert AdminClient(dict(ssl)).list_topics(timeout=30).brokers
    finally:
        main(["broker", "stop", "--state", str(state)])
