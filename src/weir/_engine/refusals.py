"""A broker that answered and refused: SASL authentication and TLS failures, and what its ACLs
refused (`Denied`), named as such.

librdkafka reports them through the error callback (``_AUTHENTICATION``, ``_SSL``) while the
request that needed a broker only times out, so a client that looks at its requests alone says
"no broker answered". `refusal_of` recognises them; `explain` says what was refused for a
person. A certificate that fails verification is always "certificate verify failed" in
librdkafka's words, whether its CA is unknown or it names another host: `explain` asks the
broker once more with Python's own TLS (same CA settings, no credentials sent) to tell which.
A client whose certificate is its only login (``SSL``) at a listener that expects SASL is not
refused in any error: the broker closes the connection, which librdkafka only logs;
`sasl_expected` asks the broker once more to tell that from no answer.

Nothing here ever weakens verification: it only reads the settings the client was given.

An ACL refusal comes back as the error of the request that needed it (TOPIC_, GROUP_,
TRANSACTIONAL_ID_, CLUSTER_AUTHORIZATION_FAILED): Kafka's code names the kind of resource, and
the request the operation, which only the caller knows (a fetch reads, a produce writes).
`Denied` is the two together, with the resource's name.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import ssl
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from confluent_kafka import KafkaError, KafkaException

from weir.errors import AuthenticationError, AuthorizationError, BrokerRefusedError, TlsError
from weir.logs import client_error_cause

__all__ = [
    "AUTHORIZATION_CODES",
    "Denied",
    "Refusal",
    "RefusalSink",
    "authorization_error",
    "closed_unasked",
    "denied_of",
    "denied_topics",
    "explain",
    "first_token_refusal",
    "refusal_error",
    "refusal_of",
    "sasl_expected",
    "startup_refusal",
    "token_refusal",
    "topics_denied_error",
]

AUTHENTICATION_CODE = "_AUTHENTICATION"
TLS_CODE = "_SSL"
ALL_BROKERS_DOWN_CODE = "_ALL_BROKERS_DOWN"
_DIAGNOSE_TIMEOUT_S = 2.0
# The broker librdkafka names at the start of an error: "sasl_ssl://host:9093/bootstrap: ".
_BROKER = re.compile(r"^(?:[a-z_]+://)?(?P<address>[^\s/]+)/(?:bootstrap|\d+): ")
# The broker ended the handshake with a TLS alert about the client's certificate: librdkafka
# reports it as a transport failure ("Receive failed: ...:ssl/tls alert bad certificate: SSL
# alert number 42"), seen when a broker requires client certificates (mTLS) and gets none or one
# it does not trust.
_CERTIFICATE_ALERT = re.compile(
    r"ssl/tls alert (?:bad certificate|certificate required|unknown ca|certificate unknown|"
    r"unsupported certificate|certificate revoked|certificate expired)"
)
# OpenSSL's verify codes (X509_V_ERR_*): the certificate does not name the host connected to ...
_NAME_MISMATCH = frozenset({62, 63, 64})
# ... or it does not chain up to a CA the client trusts.
_UNKNOWN_CA = frozenset({2, 18, 19, 20, 21})

Kind = Literal["authentication", "tls"]

# What each authorization error code names: the kind of resource the ACLs refused.
AUTHORIZATION_CODES = {
    "TOPIC_AUTHORIZATION_FAILED": "topic",
    "GROUP_AUTHORIZATION_FAILED": "group",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": "transactional id",
    "CLUSTER_AUTHORIZATION_FAILED": "cluster",
}
# What a consumer group member needs, said with each refusal a member meets.
MEMBER_NEEDS = "a member needs DESCRIBE and READ on its topics and READ on its group {group!r}"


@dataclass(frozen=True)
class Denied:
    """An operation the broker's ACLs refused the client on one resource."""

    resource_type: str
    """"topic", "group", "transactional id" or "cluster"."""
    resource: str
    """Its name ("" for the cluster, or a topic the client's error did not name)."""
    operation: str
    """Kafka's name of the operation: READ, WRITE, DESCRIBE, IDEMPOTENT_WRITE, ..."""
    code: str = field(compare=False)
    """The error code, e.g. GROUP_AUTHORIZATION_FAILED (not part of what was refused: a write
    refused one way, then another, is one refusal)."""

    def __str__(self) -> str:
        if self.resource_type == "cluster":
            return f"{self.operation} on the cluster"
        if not self.resource:
            return f"{self.operation} on a {self.resource_type}"
        return f"{self.operation} on {self.resource_type} {self.resource!r}"


def denied_of(
    code: str,
    operation: str,
    *,
    topic: str | None = None,
    group: str | None = None,
    transactional_id: str | None = None,
) -> Denied | None:
    """The refusal an error `code` reports for a request doing `operation` (on its topic or
    group; on a transactional id a producer writes, on the cluster it writes idempotently), or
    None if it is no authorization error. The names are the request's."""
    kind = AUTHORIZATION_CODES.get(code)
    if kind is None:
        return None
    if kind == "topic":
        return Denied(kind, topic or "", operation, code)
    if kind == "group":
        return Denied(kind, group or "", operation, code)
    if kind == "transactional id":
        return Denied(kind, transactional_id or "", "WRITE", code)
    return Denied(kind, "", "IDEMPOTENT_WRITE", code)


def authorization_error(denied: Denied, cause: str, needs: str) -> AuthorizationError:
    """The error for `denied` (`cause`: the client's words), saying what is `needs`ed."""
    return AuthorizationError(
        f"authorization failed: the broker's ACLs do not allow this client {denied} "
        f"({denied.code}: {cause}): {needs}",
        resource_type=denied.resource_type,
        resources=(denied.resource,) if denied.resource else (),
        operation=denied.operation,
    )


class RefusalSink(Protocol):
    """Where refusals met while the member runs go: logged once, and the member not ready until
    they end (`weir._engine.client_errors.ClientErrors`)."""

    def refused(self, denied: Denied, error: str) -> None: ...

    def allowed(self, match: Callable[[Denied], bool], *, asked: bool = True) -> None: ...


@dataclass(frozen=True)
class Refusal:
    """One refusal as the client reported it: which broker and librdkafka's own words."""

    kind: Kind
    broker: str | None
    cause: str


def refusal_of(code: str, text: str) -> Refusal | None:
    """The refusal a client error reports, or None for any other error."""
    kind: Kind
    if code == AUTHENTICATION_CODE:
        kind = "authentication"
    elif code == TLS_CODE or _CERTIFICATE_ALERT.search(text):
        kind = "tls"
    else:
        return None
    m = _BROKER.match(text)
    return Refusal(kind, m.group("address") if m else None, client_error_cause(text))


def startup_refusal(errors: Mapping[str, tuple[str, str]]) -> Refusal | None:
    """The refusal among a starting client's errors (its code name and text by cause), once
    the client also said that no broker is left to try: a refusal by one broker of several
    does not stop a client that another one answers."""
    if not any(code == ALL_BROKERS_DOWN_CODE for code, _ in errors.values()):
        return None
    for code, text in errors.values():
        refusal = refusal_of(code, text)
        if refusal is not None:
            return refusal
    return None


def refusal_error(refusal: Refusal, conf: Mapping[str, Any]) -> BrokerRefusedError:
    """The member's error for ``refusal``: `AuthenticationError` or `TlsError`."""
    error = AuthenticationError if refusal.kind == "authentication" else TlsError
    return error(explain(refusal, conf))


def first_token_refusal(conf: Mapping[str, Any]) -> AuthenticationError | None:
    """Ask the OAUTHBEARER token provider of `conf` (weir's wrapper of it) for a token before
    a client is built: what it raises or returns wrong is then an AuthenticationError at once.
    Left to the client, it costs a 10 s wait, and confluent-kafka 2.16 then calls the error
    callback with an exception pending, which may kill the calling thread with a KafkaError
    for an exception. The provider is asked one more time than the clients would."""
    from weir.config import _TokenProblem

    provider = conf.get("oauth_cb")
    if provider is None:
        return None
    try:
        provider(conf.get("sasl.oauthbearer.config"))
    except _TokenProblem as exc:
        what = str(exc)
    except Exception as exc:
        what = f"raised {type(exc).__qualname__} (its words are not shown: log them there)"
    else:
        return None
    return AuthenticationError(
        f"authentication failed: the OAUTHBEARER token provider kafka['oauth_cb'], asked for "
        f"a first token before the member's client is built, {what}"
    )


def token_refusal(exc: BaseException, conf: Mapping[str, Any]) -> AuthenticationError | None:
    """The error for a client that could not be built because its OAUTHBEARER token provider
    handed it no token (confluent-kafka waits 10 s for one), else None. With an error_cb set,
    confluent-kafka 2.16 calls it with that KafkaException pending, and the constructor raises
    a SystemError with the KafkaError as its context instead."""
    if "oauth_cb" not in conf:
        return None
    err = next((e for e in _kafka_errors(exc) if isinstance(e, KafkaError)), None)
    if err is None:
        return None
    if err.code() != KafkaError.SASL_AUTHENTICATION_FAILED:
        return None
    return AuthenticationError(
        f"authentication failed: the OAUTHBEARER token provider kafka['oauth_cb'] handed the "
        f"client no token ({err.str()}): it raised, or returned what a client cannot use; the "
        "oauth_token_failed error logged before this says which"
    )


def _kafka_errors(exc: BaseException) -> list[object]:
    """What `exc` carries, its cause and its context carry: where a KafkaError may be."""
    found: list[object] = []
    for what in (exc, exc.__cause__, exc.__context__):
        if what is None:
            continue
        found.append(what)
        if isinstance(what, BaseException) and what.args:
            found.append(what.args[0])
    return found


def explain(refusal: Refusal, conf: Mapping[str, Any]) -> str:
    """What was refused and what to check, for an error message. Never includes a secret:
    ``conf`` is read for the mechanism and the CA settings only."""
    where = f"the broker at {refusal.broker!r}" if refusal.broker else "the broker"
    if refusal.kind == "authentication":
        protocol = conf.get("security.protocol", "plaintext")
        mechanism = conf.get("sasl.mechanism", conf.get("sasl.mechanisms", "GSSAPI"))
        return (
            f"authentication failed: {where} refused the client's SASL credentials "
            f"(security.protocol {protocol}, sasl.mechanism {mechanism}): {refusal.cause}. "
            "Check sasl.username and sasl.password, and that the user exists for this mechanism"
        )
    alert = _CERTIFICATE_ALERT.search(refusal.cause)
    if alert is not None:
        return (
            f"TLS failed: {where} refused the client's certificate ({alert.group(0)}): it "
            "requires one signed by a CA it trusts; set ssl.certificate.location and "
            "ssl.key.location"
        )
    verified = None
    if "certificate verify failed" in refusal.cause:
        verified = _verify(refusal.broker, conf)
    if verified is None:
        return f"TLS failed: the TLS handshake with {where} failed: {refusal.cause}"
    code, message = verified
    if code in _NAME_MISMATCH:
        return (
            f"TLS verification failed: the certificate of {where} does not name the host the "
            f"client connected to ({message}): connect with a name the certificate holds "
            "(bootstrap.servers, and the broker's advertised listeners)"
        )
    if code in _UNKNOWN_CA:
        return (
            f"TLS verification failed: the certificate of {where} is not signed by a CA the "
            f"client trusts ({message}): set ssl.ca.location to the CA certificate that "
            "signed it"
        )
    return (
        f"TLS verification failed: {where} presented a certificate the client refuses ({message})"
    )


def _verify(broker: str | None, conf: Mapping[str, Any]) -> tuple[int, str] | None:
    """OpenSSL's verify code and message for the broker's certificate, checked the way
    librdkafka is configured to; None if it verifies or the broker cannot be asked."""
    address = _host_port(broker)
    if address is None:
        return None
    try:
        context = _context(conf)
    except (OSError, ssl.SSLError, ValueError):
        return None  # a CA setting Python cannot read: librdkafka's words stand
    try:
        with _tls_to(address, context):
            return None
    except ssl.SSLCertVerificationError as exc:
        return int(exc.verify_code), str(exc.verify_message)
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _tls_to(address: tuple[str, int], context: ssl.SSLContext) -> Iterator[ssl.SSLSocket]:
    """A TLS connection to a broker, its handshake done, for one question."""
    with (
        socket.create_connection(address, timeout=_DIAGNOSE_TIMEOUT_S) as sock,
        context.wrap_socket(sock, server_hostname=address[0]) as tls,
    ):
        yield tls


def _host_port(broker: str | None) -> tuple[str, int] | None:
    """``host:port`` (``[v6]:port``) as its parts; None if it is not that."""
    host, _, port = (broker or "").rpartition(":")
    host = host.strip("[]")
    return (host, int(port)) if host and port.isdigit() else None


def _metadata_request() -> bytes:
    """A Kafka Metadata request (v0, every topic): what a listener that expects a SASL login
    refuses before one (only ApiVersions and SaslHandshake may come first), by closing the
    connection."""
    client_id = b"weir-diagnosis"
    body = struct.pack(">hhih", 3, 0, 1, len(client_id)) + client_id + struct.pack(">i", 0)
    return struct.pack(">i", len(body)) + body


# What a starting client says when a broker closes a connection it had opened, in the words of
# librdkafka's error callback: the close races the client's first write, so it is either a
# transport error without an error callback (only logged) or a failed send on the closed socket.
_CLOSED = re.compile(r"Broken pipe|Connection reset by peer|Disconnected", re.IGNORECASE)


def closed_unasked(errors: Mapping[str, tuple[str, str]]) -> bool:
    """A starting client's errors (its code name and text by cause, as `startup_refusal` reads
    them) say nothing but that no broker is left, or only that a broker closed a connection the
    client had: worth asking the broker why (`sasl_expected`). A refused connection or an
    unknown host is no such case."""
    return all(
        _CLOSED.search(cause)
        for cause, (code, _) in errors.items()
        if code != ALL_BROKERS_DOWN_CODE
    )


def sasl_expected(conf: Mapping[str, Any]) -> AuthenticationError | None:
    """For a client of ``security.protocol`` SSL that no broker answered and that said why in
    no error: `AuthenticationError` if its first bootstrap broker accepts its TLS and then
    closes the connection at a Metadata request, as a SASL_SSL listener does before a SASL
    login; else None (no broker there, a refused certificate, an answer)."""
    if str(conf.get("security.protocol", "")).upper() != "SSL":
        return None
    first = str(conf.get("bootstrap.servers", "")).split(",")[0].strip()
    broker = first.partition("://")[2] or first
    address = _host_port(broker)
    try:
        context = _context(conf)
        certificate = conf.get("ssl.certificate.location")
        if certificate:
            context.load_cert_chain(
                str(certificate), conf.get("ssl.key.location"), conf.get("ssl.key.password")
            )
        if address is None:
            return None
        with _tls_to(address, context) as tls:
            tls.sendall(_metadata_request())
            if tls.recv(4):
                return None
    except (OSError, ValueError):  # ssl.SSLError included: not this diagnosis
        return None
    return AuthenticationError(
        f"authentication failed: the broker at {broker!r} closed the connection at the "
        "client's first request after the TLS handshake, as a listener that expects a SASL "
        "login does (security.protocol SSL: the client certificate is the only login "
        "offered): connect to the broker's SSL listener, or log in with SASL "
        "(security.protocol SASL_SSL and sasl.*)"
    )


def _context(conf: Mapping[str, Any]) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    location = conf.get("ssl.ca.location")
    pem = conf.get("ssl.ca.pem")
    if location and location != "probe":
        if os.path.isdir(str(location)):
            context.load_verify_locations(capath=str(location))
        else:
            context.load_verify_locations(cafile=str(location))
    elif pem:
        context.load_verify_locations(cadata=str(pem))
    else:
        context.load_default_certs()
    algorithm = str(conf.get("ssl.endpoint.identification.algorithm", "https")).lower()
    context.check_hostname = algorithm == "https"
    return context


def denied_topics(client: Any, topics: Sequence[str], meta: Any, timeout: float) -> list[str]:
    """The topics named in ``topics`` (not patterns) that the broker's ACLs do not let the
    client describe. A request for every topic's metadata (``meta``) leaves them out without a
    word; asking for one that is missing says TOPIC_AUTHORIZATION_FAILED. (Kafka says that
    also for a topic that does not exist, to a client that may not describe it.)"""
    known = getattr(meta, "topics", None) or {}
    denied = []
    for topic in topics:
        if topic.startswith("^"):
            continue
        found = known.get(topic)
        if found is None:
            try:
                found = client.list_topics(topic, timeout=timeout).topics.get(topic)
            except KafkaException:
                continue  # no answer: the subscription reports what it finds
        error = getattr(found, "error", None)
        if error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            denied.append(topic)
    return denied


def topics_denied_error(topics: Sequence[str], group_id: str) -> AuthorizationError:
    names = ", ".join(repr(t) for t in topics)
    return AuthorizationError(
        f"authorization failed: the broker's ACLs do not allow this client to describe topic "
        f"{names} (TOPIC_AUTHORIZATION_FAILED; also said of a topic that does not exist): "
        + MEMBER_NEEDS.format(group=group_id),
        resource_type="topic",
        resources=tuple(topics),
        operation="DESCRIBE",
    )
