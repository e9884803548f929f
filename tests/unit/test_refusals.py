"""A broker that refuses the client's credentials or TLS is named as such, at once.

The client reports a refusal only to its error callback (`_AUTHENTICATION`, `_SSL`); its
requests just fail or time out. The real broker cases are in
tests/integration/test_security_broker.py; these drive the member's start with a FakeConsumer.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from tests.waiting import wait_until

from weir import AuthenticationError, BrokerUnreachableError, GroupConsumer, TlsError
from weir._engine.refusals import (
    Refusal,
    closed_unasked,
    explain,
    refusal_of,
    sasl_expected,
    startup_refusal,
)
from weir.testing.fake import FakeConsumer

AUTH = (
    "sasl_ssl://b1:9093/bootstrap: SASL authentication error: Authentication failed during "
    "authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 (after 330ms "
    "in state AUTH_REQ)"
)
TLS = (
    "sasl_ssl://b1.invalid:9093/bootstrap: SSL handshake failed: error:0A000086:SSL "
    "routines::certificate verify failed: broker certificate could not be verified, verify that "
    "ssl.ca.location is correctly configured or root CA certificates are installed (install "
    "ca-certificates package) (after 13ms in state SSL_HANDSHAKE)"
)
MTLS = (
    "sasl_ssl://b1:9093/bootstrap: Receive failed: error:0A000412:SSL routines::ssl/tls alert "
    "bad certificate: SSL alert number 42 (after 4ms in state APIVERSION_QUERY)"
)
DOWN = KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")
SECRET = "the-Password-1"


def test_refusals_are_recognised_by_code() -> None:
    assert refusal_of("_AUTHENTICATION", AUTH) == Refusal(
        "authentication",
        "b1:9093",
        "SASL authentication error: Authentication failed during authentication due to invalid "
        "credentials with SASL mechanism SCRAM-SHA-512",
    )
    tls = refusal_of("_SSL", TLS)
    assert tls is not None and tls.kind == "tls" and tls.broker == "b1.invalid:9093"
    assert refusal_of("_TRANSPORT", "b1:9093/bootstrap: Connection refused") is None
    alert = refusal_of("_TRANSPORT", MTLS)
    assert alert is not None and alert.kind == "tls"
    assert explain(alert, {}) == (
        "TLS failed: the broker at 'b1:9093' refused the client's certificate (ssl/tls alert "
        "bad certificate): it requires one signed by a CA it trusts; set "
        "ssl.certificate.location and ssl.key.location"
    )


def test_a_refusal_ends_the_start_only_when_no_broker_is_left() -> None:
    auth = ("_AUTHENTICATION", AUTH)
    assert startup_refusal({"a": auth}) is None  # another broker may still answer
    found = startup_refusal({"a": auth, "down": ("_ALL_BROKERS_DOWN", "2/2 brokers are down")})
    assert found is not None and found.kind == "authentication"
    assert startup_refusal({"x": ("_TRANSPORT", "t"), "d": ("_ALL_BROKERS_DOWN", "d")}) is None


def test_an_explanation_names_no_secret() -> None:
    refusal = refusal_of("_AUTHENTICATION", AUTH)
    assert refusal is not None
    conf = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "alice-the-user",
        "sasl.password": SECRET,
    }
    text = explain(refusal, conf)
    assert "sasl.mechanism PLAIN" in text and "security.protocol SASL_SSL" in text
    assert SECRET not in text and "alice-the-user" not in text


def member(fake: FakeConsumer, **settings: Any) -> GroupConsumer:
    return GroupConsumer(
        lambda record: None,
        bootstrap_servers="b1:9093",
        group_id="g",
        topics=["t"],
        consumer_factory=fake.factory,
        **settings,
    )


def start_refused(errors: list[KafkaError], timeout: float = 30.0) -> tuple[BaseException, float]:
    fake = FakeConsumer()
    fake.unreachable = KafkaException(
        KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: Local: Broker transport failure")
    )
    for error in errors:
        fake.raise_error_cb(error)
    gc = member(
        fake,
        startup_timeout_s=timeout,
        kafka={
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice",
            "sasl.password": SECRET,
        },
    )
    began = time.monotonic()
    with pytest.raises(BrokerUnreachableError) as raised:
        gc.run()
    return raised.value, time.monotonic() - began


def test_a_refused_password_is_an_authentication_error() -> None:
    """Regression: "no Kafka broker answered at 'b1:9093' within 30s (startup_timeout_s): SASL
    authentication error: ..." (a BrokerUnreachableError) for a broker that answered."""
    error, took = start_refused([KafkaError(KafkaError._AUTHENTICATION, AUTH), DOWN])
    assert type(error) is AuthenticationError, repr(error)
    assert str(error).startswith(
        "authentication failed: the broker at 'b1:9093' refused the client's SASL credentials "
        "(security.protocol SASL_SSL, sasl.mechanism SCRAM-SHA-512): SASL authentication error: "
    )
    assert SECRET not in str(error) and took < 5, took


def test_a_failed_tls_handshake_is_a_tls_error() -> None:
    error, took = start_refused([KafkaError(KafkaError._SSL, TLS), DOWN])
    assert type(error) is TlsError, repr(error)
    # b1.invalid does not resolve, so the certificate could not be asked about again.
    assert str(error).startswith(
        "TLS failed: the TLS handshake with the broker at 'b1.invalid:9093' failed: SSL "
        "handshake failed: error:0A000086:SSL routines::certificate verify failed"
    )
    assert took < 5, took


def test_without_a_refusal_the_error_is_still_unreachable() -> None:
    refused = KafkaError(KafkaError._TRANSPORT, "b1:9093/bootstrap: Connect to b1 failed: refused")
    error, _ = start_refused([refused, DOWN], timeout=1.0)
    assert type(error) is BrokerUnreachableError
    assert str(error).endswith("(startup_timeout_s): Connect to b1 failed: refused")


def test_a_refusal_while_running_is_logged_as_an_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="weir")
    fake = FakeConsumer()
    fake.script_assign([("t", 0)])
    gc = member(fake)
    gc.start()
    try:
        assert gc.wait_started(10)
        for _ in range(3):
            fake.raise_error_cb(KafkaError(KafkaError._AUTHENTICATION, AUTH))
        fake.raise_error_cb(KafkaError(KafkaError._SSL, TLS))
        # The owner serves them in its next consume call: wait for the one after that.
        calls = fake.consume_calls
        wait_until(lambda: fake.consume_calls >= calls + 2, "two more consume calls", 10)
    finally:
        gc.stop()
        gc.join(10)
    events = [
        (r.levelname, dict(r.msg)["event"]) for r in caplog.records if isinstance(r.msg, dict)
    ]
    assert events.count(("ERROR", "kafka_authentication_failed")) == 1, events
    assert events.count(("ERROR", "kafka_tls_failed")) == 1, events
    assert ("WARNING", "error_repeated") in events
    assert not [e for e in events if e[1] == "kafka_error"], events


def test_a_certificate_login_at_a_sasl_listener_is_told_so(tmp_path: Path) -> None:
    """What a SASL_SSL listener does to a client of security.protocol SSL: accept its TLS, then
    close the connection at its first request, which librdkafka only logs. A listener that
    answers, or a client of another protocol, is not this refusal."""
    pytest.importorskip("cryptography")
    from weir.testing.security import BrokerSecurity, prepare_security

    tls = prepare_security(BrokerSecurity(users=["alice"]), tmp_path, formatted=False).tls
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(tls.broker_file)

    def conf_of(answer: bytes) -> dict[str, str]:
        server = socket.create_server(("127.0.0.1", 0))
        server.settimeout(5)  # a client that never comes

        def serve() -> None:
            with server, server.accept()[0] as sock, server_context.wrap_socket(sock, True) as s:
                s.recv(1024)  # the request
                s.sendall(answer)  # nothing: closed unanswered

        def serving() -> None:
            with contextlib.suppress(OSError):
                serve()

        threading.Thread(target=serving, daemon=True).start()
        return {
            "bootstrap.servers": f"127.0.0.1:{server.getsockname()[1]}",
            "security.protocol": "ssl",
            "ssl.ca.location": str(tls.ca_file),
            "ssl.certificate.location": str(tls.client_cert_file("alice")),
            "ssl.key.location": str(tls.client_key_file("alice")),
        }

    conf = conf_of(b"")
    error = sasl_expected(conf)
    assert isinstance(error, AuthenticationError), error
    assert str(error).startswith(
        f"authentication failed: the broker at {conf['bootstrap.servers']!r} closed the "
        "connection at the client's first request after the TLS handshake"
    )
    assert sasl_expected(conf_of(b"\x00\x00\x00\x10")) is None  # an answer
    assert sasl_expected({**conf_of(b""), "security.protocol": "SASL_SSL"}) is None
    assert sasl_expected({**conf, "bootstrap.servers": "nonsense"}) is None


def test_a_send_that_failed_on_a_closed_connection_is_worth_asking_the_broker_why() -> None:
    """Regression (a fresh-clone CI run): an SSL client at a SASL_SSL listener was told "no
    Kafka broker answered ... Send failed: ... Broken pipe" when the listener's close came before
    the client's first write had gone out: the client then says so in its error callback, and
    only a client that said nothing was asked about. A closed connection, in whichever words,
    is worth asking the broker about; a refused connection or an unknown host is not."""
    broken_pipe = (
        "Send failed: error:80000020:system library::Broken pipe: tls_retry_write_records failure"
    )

    def said(*causes: str) -> dict[str, tuple[str, str]]:
        """The start's errors by cause (`ClientErrors.on_error`), the client's last word that
        no broker is left among them."""
        errors = {cause: ("_TRANSPORT", cause) for cause in causes}
        errors["1/1 brokers are down"] = ("_ALL_BROKERS_DOWN", "1/1 brokers are down")
        return errors

    assert closed_unasked(said())
    assert closed_unasked(said(broken_pipe))
    assert closed_unasked(said("Disconnected (after 3ms in state UP)"))
    assert closed_unasked(said("Receive failed: Connection reset by peer"))
    refused = "Connect to ipv4#127.0.0.1:1 failed: Connection refused"
    assert not closed_unasked(said(broken_pipe, refused))
    assert not closed_unasked(said("Failed to resolve 'nowhere:9092': Name or service not known"))


def test_a_start_that_met_only_a_closed_connection_asks_the_broker_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The start's end, wired: a client whose only error was a send on a closed connection asks
    the broker (`sasl_expected`, stubbed here; the real one has its own test above)."""
    import weir._engine.client_errors as client_errors

    asked: list[str] = []

    def told(conf: dict[str, Any]) -> AuthenticationError:
        asked.append(conf["bootstrap.servers"])
        return AuthenticationError("the broker expects a SASL login")

    monkeypatch.setattr(client_errors, "sasl_expected", told)
    closed = KafkaError(
        KafkaError._TRANSPORT,
        "ssl://b1:9093/bootstrap: Send failed: error:80000020:system library::Broken pipe: "
        "tls_retry_write_records failure (after 1ms in state UP)",
    )
    error, _ = start_refused([closed, DOWN], timeout=1.0)
    assert type(error) is AuthenticationError and asked == ["b1:9093"], (error, asked)
