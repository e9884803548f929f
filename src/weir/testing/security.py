"""Security for the embedded broker: a throwaway CA, TLS certificates, SASL users and ACLs.

A secured broker (``EmbeddedKafka(security=BrokerSecurity())``, the cluster likewise) gets one
more listener, ``SASL_SSL``, for clients: TLS with a certificate from a CA made at start, SASL
with SCRAM-SHA-512 and PLAIN users, optionally client certificates (mTLS) and KRaft's
``StandardAuthorizer``. With ``ssl_listener=True`` it gets a second one, ``SSL``, where the
client's certificate is its login (mutual TLS as MSK and Aiven offer it). The ``PLAINTEXT``
listener stays, for the broker itself and the harness: its principal (``User:ANONYMOUS``) is a
super user. Hand clients under test the settings of ``client_settings()``, never the plaintext
address.

Needs the ``cryptography`` package (in kafka-weir's ``test`` extra).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weir.testing.errors import BrokerStartError, HarnessError

__all__ = [
    "LISTENER",
    "MECHANISMS",
    "OAUTHBEARER",
    "SSL",
    "SSL_LISTENER",
    "BrokerSecurity",
    "ClientSettings",
    "KafkaUser",
    "SecureListener",
    "TlsFiles",
    "UnsecuredTokens",
    "client_settings_of",
    "prepare_security",
    "unsecured_jws",
    "write_client_properties",
]

LISTENER = "SASL_SSL"
SCRAM = "SCRAM-SHA-512"
PLAIN = "PLAIN"
MECHANISMS = (SCRAM, PLAIN)
OAUTHBEARER = "OAUTHBEARER"
# The listener (and `client_settings` mechanism) where the client certificate is the login.
SSL = "SSL"
SSL_LISTENER = SSL
# A certificate's subject as Kafka reads it (RFC 2253, most specific first: "CN=alice,O=weir
# test") to the principal ACLs name: `User:alice`, as production maps its certificates.
SSL_PRINCIPAL_RULES = "RULE:^CN=([^,]+),.*$/$1/,DEFAULT"
# The broker's own check of unsecured JWS tokens (`alg: none`): any principal the token names
# logs in. Kafka's default for OAUTHBEARER, named so that the listener says what it accepts.
_UNSECURED_VALIDATOR = (
    "org.apache.kafka.common.security.oauthbearer.internals.unsecured."
    "OAuthBearerUnsecuredValidatorCallbackHandler"
)
# Longest OAUTHBEARER session: Kafka ends a session when its token expires only when this is set
# (KIP-368), as managed services do; clients then authenticate again with a newer token.
_OAUTHBEARER_REAUTH_MS = 3_600_000
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
# The broker's own principal on its PLAINTEXT listeners (inter-broker, controller, harness).
INTERNAL_PRINCIPAL = "User:ANONYMOUS"
# Kafka refuses fewer than 4096 iterations for SCRAM-SHA-512.
SCRAM_ITERATIONS = 4096
CERT_VALID_DAYS = 365
_MASK = "**********"
# Names and passwords go into Kafka's `--add-scram` and JAAS syntax: refuse what would need
# quoting there rather than quote it.
_NAME = re.compile(r"[A-Za-z0-9._@-]+")
_PASSWORD = re.compile(r"[!#-\[\]-~]+")  # printable ASCII without space, '"' and '\'
_SECURITY_DIR = "security"
_USERS_FILE = "users.json"


@dataclass(frozen=True)
class KafkaUser:
    """A SASL user of the secured listener (SCRAM-SHA-512 and PLAIN alike)."""

    name: str
    password: str = field(repr=False)

    def __repr__(self) -> str:
        return f"KafkaUser(name={self.name!r}, password={_MASK!r})"


def _check_user(name: str, password: str | None) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"user name {name!r}: use letters, digits and . _ @ - only (it goes into Kafka's "
            "SCRAM and JAAS syntax unquoted)"
        )
    bad = not isinstance(password, str) or not _PASSWORD.fullmatch(password)
    if password is not None and bad:
        # The password itself is never shown.
        raise ValueError(
            f"the password of user {name!r} must be printable ASCII without spaces, '\"' or '\\' "
            "(it goes into a JAAS quoted string)"
        )


@dataclass(frozen=True)
class BrokerSecurity:
    """What the secured listener asks of clients.

    ``users``: user names, or a mapping name -> password (None: generate one). Each user can log
    in with SCRAM-SHA-512 and with PLAIN. Generated passwords are kept in the work directory, so
    a kept broker started again has the same users.
    ``mtls``: clients must also present a certificate signed by the broker's CA
    (``ssl.client.auth=required``); every user gets one.
    ``authorizer``: KRaft's ``StandardAuthorizer`` with no ACLs: only ``super_users`` (and the
    harness, on the plaintext listener) may do anything until ACLs are created.
    ``hostnames``: the names and addresses the broker certificate holds. The broker listens on
    127.0.0.1 only, so the default makes ``localhost:PORT`` a hostname mismatch, as a client
    that verifies the broker's name must see it.
    ``oauthbearer``: the listener also takes SASL/OAUTHBEARER with unsecured JWS tokens (no
    signature, ``alg: none``): whoever names a principal in a token is that principal, so any
    principal can log in (a test broker's stand-in for an identity provider; the ACLs still
    apply to it). A session ends when its token expires: the client must refresh its token
    to stay connected. Tokens come from librdkafka
    (``enable.sasl.oauthbearer.unsecure.jwt``) or from a token provider (``oauth_cb``,
    `UnsecuredTokens`).
    ``ssl_listener``: a second listener, ``SSL``, where the client's certificate is its login
    (client certificates required, no SASL): the principal is the certificate subject's
    common name, ``User:<name>`` (``ssl.principal.mapping.rules``), held to the ACLs as a SASL
    user of that name. Each user has a certificate with ``CN=<user>``; ``client_settings(name,
    mechanism="SSL")`` issues one for any other principal.
    """

    users: Mapping[str, str | None] | Iterable[str] = ("weir",)
    mtls: bool = False
    oauthbearer: bool = False
    authorizer: bool = False
    super_users: Iterable[str] = ()
    hostnames: Iterable[str] = ("127.0.0.1",)
    ssl_listener: bool = False

    def __post_init__(self) -> None:
        for flag in ("mtls", "oauthbearer", "authorizer", "ssl_listener"):
            value = getattr(self, flag)
            if not isinstance(value, bool):
                raise ValueError(f"BrokerSecurity({flag}=...) must be True or False, not {value!r}")
        users = (
            dict(self.users)
            if isinstance(self.users, Mapping)
            else dict.fromkeys([self.users] if isinstance(self.users, str) else self.users)
        )
        if not users:
            raise ValueError("a secured broker needs at least one user")
        for name, password in users.items():
            _check_user(name, password)
        super_users = (
            (self.super_users,) if isinstance(self.super_users, str) else tuple(self.super_users)
        )
        unknown = [name for name in super_users if name not in users]
        if unknown:
            raise ValueError(f"super users {unknown} are not among the users {list(users)}")
        hostnames = (self.hostnames,) if isinstance(self.hostnames, str) else tuple(self.hostnames)
        if not hostnames:
            raise ValueError("the broker certificate needs at least one host name or address")
        object.__setattr__(self, "users", users)
        object.__setattr__(self, "super_users", super_users)
        object.__setattr__(self, "hostnames", hostnames)

    def __repr__(self) -> str:
        users = list(self.user_names)
        return (
            f"BrokerSecurity(users={users!r}, mtls={self.mtls!r}, "
            f"oauthbearer={self.oauthbearer!r}, authorizer={self.authorizer!r}, "
            f"super_users={list(self.super_users)!r}, hostnames={list(self.hostnames)!r}, "
            f"ssl_listener={self.ssl_listener!r})"
        )

    @property
    def user_names(self) -> tuple[str, ...]:
        assert isinstance(self.users, dict)
        return tuple(self.users)

    def resolve_users(self, stored: Mapping[str, str]) -> tuple[KafkaUser, ...]:
        """Every user with its password: as given, else as stored, else a new one."""
        assert isinstance(self.users, dict)
        return tuple(
            KafkaUser(name, given or stored.get(name) or secrets.token_urlsafe(18))
            for name, given in self.users.items()
        )


@dataclass(frozen=True)
class TlsFiles:
    """PEM files in the work directory: the CA certificate (what clients trust) and its key
    (to issue a client certificate for any principal), the broker's key and certificate chain
    in one file, and a key and certificate per user for mTLS."""

    directory: Path

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def ca_key_file(self) -> Path:
        return self.directory / "ca.key"

    @property
    def broker_file(self) -> Path:
        return self.directory / "broker.pem"

    def client_cert_file(self, user: str) -> Path:
        return self.directory / f"client-{user}.pem"

    def client_key_file(self, user: str) -> Path:
        return self.directory / f"client-{user}.key"

    def complete(self, users: Iterable[str], hostnames: Iterable[str]) -> bool:
        names = self.directory / "hostnames.json"
        try:
            same_names = json.loads(names.read_text()) == list(hostnames)
        except (OSError, ValueError):
            return False
        files = [self.ca_file, self.ca_key_file, self.broker_file]
        for user in users:
            files += [self.client_cert_file(user), self.client_key_file(user)]
        return same_names and all(path.is_file() for path in files)


@dataclass(frozen=True)
class ClientSettings:
    """How a client connects to the secured listener as one user: what a test hands to the
    application under test, as production would hand it its own. With OAUTHBEARER the user is
    the token's principal and there is no password; with ``SSL`` (no SASL) the client
    certificate is the login and ``username`` the common name it holds."""

    bootstrap_servers: str
    ca_file: str | None
    """The CA certificate that signed the broker's (None: the system's CAs, which did not)."""
    username: str
    password: str = field(repr=False)
    mechanism: str = SCRAM
    cert_file: str | None = None
    key_file: str | None = None

    def config(self) -> dict[str, str]:
        """librdkafka settings (confluent-kafka's configuration dict, weir's ``kafka=``). For
        OAUTHBEARER, librdkafka makes the unsecured tokens itself (`token_config` hands them
        from a token provider instead)."""
        conf = {"bootstrap.servers": self.bootstrap_servers}
        if self.mechanism == SSL:
            conf["security.protocol"] = SSL
        else:
            conf["security.protocol"] = LISTENER
            conf["sasl.mechanism"] = self.mechanism
        if self.mechanism == OAUTHBEARER:
            conf["enable.sasl.oauthbearer.unsecure.jwt"] = "true"
            conf["sasl.oauthbearer.config"] = f"principal={self.username}"
        elif self.mechanism != SSL:
            conf["sasl.username"] = self.username
            conf["sasl.password"] = self.password
        if self.ca_file is not None:
            conf["ssl.ca.location"] = self.ca_file
        if self.cert_file is not None and self.key_file is not None:
            conf["ssl.certificate.location"] = self.cert_file
            conf["ssl.key.location"] = self.key_file
        return conf

    def token_config(self, oauth_cb: Any) -> dict[str, Any]:
        """`config` with the OAUTHBEARER tokens from ``oauth_cb``, a token provider such as
        `UnsecuredTokens` (what production passes: a function that asks its identity
        provider)."""
        if self.mechanism != OAUTHBEARER:
            raise ValueError(
                f"a token provider needs mechanism {OAUTHBEARER!r}, not {self.mechanism!r}"
            )
        conf: dict[str, Any] = self.config()
        del conf["enable.sasl.oauthbearer.unsecure.jwt"], conf["sasl.oauthbearer.config"]
        conf["oauth_cb"] = oauth_cb
        return conf

    def __repr__(self) -> str:
        return (
            f"ClientSettings(bootstrap_servers={self.bootstrap_servers!r}, "
            f"ca_file={self.ca_file!r}, username={self.username!r}, password={_MASK!r}, "
            f"mechanism={self.mechanism!r}, cert_file={self.cert_file!r}, "
            f"key_file={self.key_file!r})"
        )


@dataclass(frozen=True)
class PreparedSecurity:
    """A broker's security made concrete in its work directory: users with passwords, files."""

    security: BrokerSecurity
    users: tuple[KafkaUser, ...]
    tls: TlsFiles
    # Certificates issued on demand (`client_settings(name, mechanism="SSL")`) from any thread.
    _issuing: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def user(self, name: str | None) -> KafkaUser:
        if name is None:
            return self.users[0]
        for user in self.users:
            if user.name == name:
                return user
        raise ValueError(f"no user {name!r}; the broker has {[u.name for u in self.users]}")

    def client_settings(
        self,
        bootstrap_servers: str,
        user: str | None = None,
        mechanism: str = SCRAM,
        ssl_bootstrap_servers: str | None = None,
    ) -> ClientSettings:
        """A user's settings; with OAUTHBEARER ``user`` is any principal (the first user's if
        None), and for mTLS the client certificate is the first user's unless it is a user.
        With ``SSL`` the certificate is the login, on the SSL listener
        (``ssl_bootstrap_servers``): ``user`` is any principal, a certificate is issued for
        one that has none."""
        if mechanism == SSL:
            return self._ssl_settings(ssl_bootstrap_servers, user)
        oauth = mechanism == OAUTHBEARER
        if oauth and not self.security.oauthbearer:
            raise ValueError(
                "mechanism 'OAUTHBEARER' needs a broker started with "
                "BrokerSecurity(oauthbearer=True)"
            )
        if not oauth and mechanism not in MECHANISMS:
            raise ValueError(
                f"mechanism {mechanism!r} is not one of {[*MECHANISMS, OAUTHBEARER, SSL]}"
            )
        if oauth and user is not None:
            _check_user(user, None)
            known = [u for u in self.users if u.name == user]
            found = known[0] if known else KafkaUser(user, "")
        else:
            found = self.user(user)
        holder = found if found in self.users else self.users[0]
        cert = key = None
        if self.security.mtls:
            cert = str(self.tls.client_cert_file(holder.name))
            key = str(self.tls.client_key_file(holder.name))
        return ClientSettings(
            bootstrap_servers=bootstrap_servers,
            ca_file=str(self.tls.ca_file),
            username=found.name,
            password="" if oauth else found.password,
            mechanism=mechanism,
            cert_file=cert,
            key_file=key,
        )

    def _ssl_settings(self, bootstrap_servers: str | None, user: str | None) -> ClientSettings:
        if not self.security.ssl_listener or bootstrap_servers is None:
            raise ValueError(
                f"mechanism {SSL!r} (the client certificate as the login) needs a broker "
                "started with BrokerSecurity(ssl_listener=True)"
            )
        name = self.users[0].name if user is None else user
        _check_user(name, None)
        cert, key = self.tls.client_cert_file(name), self.tls.client_key_file(name)
        with self._issuing:
            if not (cert.is_file() and key.is_file()):
                _issue_client_files(self.tls, name)
        return ClientSettings(
            bootstrap_servers=bootstrap_servers,
            ca_file=str(self.tls.ca_file),
            username=name,
            password="",
            mechanism=SSL,
            cert_file=str(cert),
            key_file=str(key),
        )


def client_settings_of(
    prepared: PreparedSecurity | None,
    what: str,
    bootstrap_servers: str,
    user: str | None,
    mechanism: str,
    ssl_bootstrap_servers: str | None = None,
) -> ClientSettings:
    """``client_settings()`` of a broker or cluster (``what``)."""
    if prepared is None:
        raise RuntimeError(
            f"client_settings() needs a started {what} made with security=BrokerSecurity(...)"
        )
    return prepared.client_settings(bootstrap_servers, user, mechanism, ssl_bootstrap_servers)


@dataclass(frozen=True)
class SecureListener:
    """The secured listeners of one node: their ports and what they are configured with."""

    prepared: PreparedSecurity
    port: int
    ssl_port: int | None = None
    """The SSL listener's (client certificates as logins), None without ``ssl_listener``."""

    def properties(self) -> dict[str, str]:
        """Broker settings of the listener (the listener itself is in ``listeners``)."""
        security, tls = self.prepared.security, self.prepared.tls
        prefix = f"listener.name.{LISTENER.lower()}."
        plain_users = " ".join(f'user_{u.name}="{u.password}"' for u in self.prepared.users)
        props = {
            f"{prefix}sasl.enabled.mechanisms": ",".join(MECHANISMS),
            f"{prefix}{SCRAM.lower()}.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            f"{prefix}{PLAIN.lower()}.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
            ),
            **_tls_properties(prefix, tls, "required" if security.mtls else "none"),
        }
        if security.oauthbearer:
            oauth = f"{prefix}{OAUTHBEARER.lower()}."
            props[f"{prefix}sasl.enabled.mechanisms"] += f",{OAUTHBEARER}"
            props.update(
                {
                    # The broker's own login (never used: brokers talk over PLAINTEXT) must
                    # still name a principal.
                    f"{oauth}sasl.jaas.config": (
                        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule "
                        'required unsecuredLoginStringClaim_sub="broker";'
                    ),
                    f"{oauth}sasl.server.callback.handler.class": _UNSECURED_VALIDATOR,
                    f"{oauth}connections.max.reauth.ms": str(_OAUTHBEARER_REAUTH_MS),
                }
            )
        if self.ssl_port is not None:
            ssl = f"listener.name.{SSL_LISTENER.lower()}."
            props.update(_tls_properties(ssl, tls, "required"))
            props[f"{ssl}ssl.principal.mapping.rules"] = SSL_PRINCIPAL_RULES
        if security.authorizer:
            props["authorizer.class.name"] = AUTHORIZER
            props["super.users"] = ";".join(
                [INTERNAL_PRINCIPAL, *(f"User:{name}" for name in security.super_users)]
            )
        return props

    def format_arguments(self) -> list[str]:
        """The storage tool's ``--add-scram`` arguments: SCRAM users exist from the first
        start. Salted here, so the passwords appear neither on the command line nor in logs."""
        arguments = []
        for user in self.prepared.users:
            salt = secrets.token_bytes(16)
            salted = hashlib.pbkdf2_hmac("sha512", user.password.encode(), salt, SCRAM_ITERATIONS)
            arguments += [
                "--add-scram",
                f"{SCRAM}=[name={user.name},iterations={SCRAM_ITERATIONS},"
                f'salt="{_b64(salt)}",saltedpassword="{_b64(salted)}"]',
            ]
        return arguments


def _tls_properties(prefix: str, tls: TlsFiles, client_auth: str) -> dict[str, str]:
    """A TLS listener's key store (the broker's certificate) and trust store (the CA)."""
    return {
        f"{prefix}ssl.keystore.type": "PEM",
        f"{prefix}ssl.keystore.location": str(tls.broker_file),
        f"{prefix}ssl.truststore.type": "PEM",
        f"{prefix}ssl.truststore.location": str(tls.ca_file),
        f"{prefix}ssl.client.auth": client_auth,
    }


def unsecured_jws(principal: str, lifetime_s: float, now: float | None = None) -> tuple[str, float]:
    """An unsecured JWS token (``alg: none``) for ``principal``, valid ``lifetime_s`` seconds,
    and when it expires (seconds since the epoch): what a broker in unsecured OAUTHBEARER mode
    takes. Never a secret worth the name: anyone can make one."""
    issued = time.time() if now is None else now
    expires = issued + lifetime_s
    header = _b64url(json.dumps({"alg": "none"}).encode())
    claims = {"sub": principal, "iat": int(issued), "exp": int(expires)}
    return f"{header}.{_b64url(json.dumps(claims).encode())}.", float(int(expires))


class UnsecuredTokens:
    """An OAUTHBEARER token provider (confluent-kafka's ``oauth_cb``, weir's
    ``kafka["oauth_cb"]``) for a broker in unsecured mode: each call makes a new token for
    ``principal`` valid ``lifetime_s`` seconds. ``calls`` counts them (the clients ask again
    before a token expires) and ``tokens`` keeps what it handed out, for tests that look for
    them where they must not be."""

    def __init__(self, principal: str, lifetime_s: float = 3600.0) -> None:
        _check_user(principal, None)
        if not lifetime_s >= 2:
            raise ValueError(f"lifetime_s must be at least 2 seconds, got {lifetime_s!r}")
        self.principal = principal
        self.lifetime_s = lifetime_s
        self.tokens: list[str] = []
        self._lock = threading.Lock()

    @property
    def calls(self) -> int:
        return len(self.tokens)

    def __call__(self, oauthbearer_config: str | None) -> tuple[str, float, str, dict[str, str]]:
        token, expires = unsecured_jws(self.principal, self.lifetime_s)
        with self._lock:
            self.tokens.append(token)
        return token, expires, self.principal, {}

    def __repr__(self) -> str:
        return (
            f"UnsecuredTokens(principal={self.principal!r}, lifetime_s={self.lifetime_s!r}, "
            f"calls={self.calls})"
        )


def write_client_properties(settings: ClientSettings, path: Path) -> None:
    """``settings`` as a librdkafka/Java client properties file only its owner can read."""
    lines = [f"{key}={value}\n" for key, value in settings.config().items()]
    _write_private(path, "".join(lines))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def prepare_security(
    security: BrokerSecurity, workdir: Path, *, formatted: bool
) -> PreparedSecurity:
    """Users and TLS files of a broker in ``workdir``, made once and reused by a later start.

    ``formatted``: the storage exists already, so its SCRAM users cannot change; a user that is
    new or whose password changed is refused here rather than failing every login later.
    """
    directory = workdir / _SECURITY_DIR
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    users_path = directory / _USERS_FILE
    stored = _read_users(users_path)
    users = security.resolve_users(stored)
    if formatted and not stored:
        raise BrokerStartError(
            f"the broker in {workdir} was formatted without security, and SCRAM users are made "
            "when the storage is formatted: start it secured in a new directory"
        )
    if formatted:
        changed = [u.name for u in users if stored.get(u.name) != u.password]
        if changed:
            raise BrokerStartError(
                f"the broker in {workdir} was formatted with other SCRAM users or passwords "
                f"(users {changed} are new or changed): start it with the same users, or in a "
                "new directory"
            )
    _write_private(users_path, json.dumps({u.name: u.password for u in users}, indent=2))
    tls = TlsFiles(directory)
    names = [u.name for u in users]
    if not tls.complete(names, security.hostnames):
        _make_tls_files(tls, names, tuple(security.hostnames))
    return PreparedSecurity(security, users, tls)


def _read_users(path: Path) -> dict[str, str]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(found, dict):
        return {}
    return {str(k): str(v) for k, v in found.items()}


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner may read (it holds passwords or a private key)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(path, 0o600)


# --- certificates -------------------------------------------------------------------------------


def _cryptography() -> Any:
    try:
        import cryptography  # noqa: F401
    except ImportError:
        raise HarnessError(
            "a secured broker makes its certificates with the cryptography package: "
            "pip install cryptography (or kafka-weir[test])"
        ) from None
    from cryptography import x509

    return x509


def _make_tls_files(tls: TlsFiles, users: list[str], hostnames: tuple[str, ...]) -> None:
    """A new CA, a broker certificate for ``hostnames`` and a client certificate per user.
    EC P-256 keys: generated in a millisecond, and both Java and OpenSSL take them."""
    x509 = _cryptography()
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    start, end = _validity()
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("weir test CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    alt: list[Any] = []
    for host in hostnames:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))
    key_pem, cert_pem = _issue(ca_key, ca_cert, hostnames[0], ExtendedKeyUsageOID.SERVER_AUTH, alt)
    _write_private(tls.broker_file, (key_pem + cert_pem + _pem(ca_cert)).decode("ascii"))
    _write_private(tls.ca_key_file, _key_pem(ca_key).decode("ascii"))
    for user in users:
        _write_client_files(tls, user, ca_key, ca_cert)
    tls.ca_file.write_text(_pem(ca_cert).decode("ascii"))
    (tls.directory / "hostnames.json").write_text(json.dumps(list(hostnames)))


def _issue_client_files(tls: TlsFiles, common: str) -> None:
    """A client certificate for ``common`` from the CA in ``tls`` (an SSL principal of a
    test's own)."""
    x509 = _cryptography()
    from cryptography.hazmat.primitives import serialization

    ca_key = serialization.load_pem_private_key(tls.ca_key_file.read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(tls.ca_file.read_bytes())
    _write_client_files(tls, common, ca_key, ca_cert)


def _write_client_files(tls: TlsFiles, common: str, ca_key: Any, ca_cert: Any) -> None:
    """``CN=<common>``'s key (only its owner may read it) and certificate chain."""
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key_pem, cert_pem = _issue(ca_key, ca_cert, common, ExtendedKeyUsageOID.CLIENT_AUTH, None)
    _write_private(tls.client_key_file(common), key_pem.decode("ascii"))
    tls.client_cert_file(common).write_text((cert_pem + _pem(ca_cert)).decode("ascii"))


def _validity() -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now - datetime.timedelta(hours=1), now + datetime.timedelta(days=CERT_VALID_DAYS)


def _name(common: str) -> Any:
    x509 = _cryptography()
    from cryptography.x509.oid import NameOID

    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "weir test"),
            x509.NameAttribute(NameOID.COMMON_NAME, common),
        ]
    )


def _issue(
    ca_key: Any, ca_cert: Any, common: str, usage: Any, alt_names: list[Any] | None
) -> tuple[bytes, bytes]:
    """A new key and a certificate for ``CN=<common>`` the CA signed, as PEM."""
    x509 = _cryptography()
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    start, end = _validity()
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    )
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return _key_pem(key), _pem(cert)


def _key_pem(key: Any) -> bytes:
    """PKCS#8, unencrypted: the form Kafka's PEM key store reads without a key password."""
    from cryptography.hazmat.primitives import serialization

    pem: bytes = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return pem


def _pem(cert: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    pem: bytes = cert.public_bytes(serialization.Encoding.PEM)
    return pem
