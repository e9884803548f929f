"""The secured embedded broker's pieces that need no JVM: users, certificates, settings."""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import re
import stat
import time
from pathlib import Path

import pytest

pytest.importorskip("cryptography")

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from weir.testing.broker import KafkaNode, remembered_secure_port
from weir.testing.cluster import EmbeddedKafkaCluster
from weir.testing.errors import BrokerStartError
from weir.testing.security import (
    AUTHORIZER,
    SCRAM_ITERATIONS,
    BrokerSecurity,
    SecureListener,
    UnsecuredTokens,
    prepare_security,
)

SECRET = "s3cret-Pa55word!"


def test_users_are_checked_and_passwords_never_shown() -> None:
    security = BrokerSecurity(users={"alice": SECRET, "bob": None}, super_users=["alice"])
    assert SECRET not in repr(security)
    assert security.user_names == ("alice", "bob")
    with pytest.raises(ValueError, match="user name 'a,b'"):
        BrokerSecurity(users=["a,b"])
    with pytest.raises(ValueError, match="the password of user 'alice'") as raised:
        BrokerSecurity(users={"alice": 'has"Xyzzy'})
    assert "Xyzzy" not in str(raised.value)
    with pytest.raises(ValueError, match=r"super users \['carol'\] are not among"):
        BrokerSecurity(users=["alice"], super_users=["carol"])
    with pytest.raises(ValueError, match="at least one user"):
        BrokerSecurity(users=[])
    assert BrokerSecurity(users="solo").user_names == ("solo",)


def test_prepared_security_is_made_once_and_kept_private(tmp_path: Path) -> None:
    security = BrokerSecurity(users={"alice": SECRET, "bob": None})
    prepared = prepare_security(security, tmp_path, formatted=False)
    bob = prepared.user("bob").password
    assert len(bob) >= 20 and SECRET not in repr(prepared.users)
    files = prepared.tls
    for private in (
        files.broker_file,
        files.client_key_file("alice"),
        tmp_path / "security" / "users.json",
    ):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, private
    ca_pem = files.ca_file.read_bytes()

    again = prepare_security(security, tmp_path, formatted=True)
    assert again.user("bob").password == bob  # a generated password is kept
    assert files.ca_file.read_bytes() == ca_pem  # and so is the CA clients trust

    changed = BrokerSecurity(users={"alice": "another-password", "bob": None})
    with pytest.raises(BrokerStartError, match=r"users \['alice'\] are new or changed"):
        prepare_security(changed, tmp_path, formatted=True)
    # A broker first formatted without security has no SCRAM users to log in with.
    with pytest.raises(BrokerStartError, match="was formatted without security"):
        prepare_security(security, tmp_path / "plain", formatted=True)
    # Storage not formatted yet: new users are fine.
    assert prepare_security(changed, tmp_path, formatted=False).user("alice").password != SECRET


def test_the_broker_certificate_names_its_hosts_and_chains_to_the_ca(tmp_path: Path) -> None:
    security = BrokerSecurity(users=["alice"], hostnames=["127.0.0.1", "kafka.test"])
    tls = prepare_security(security, tmp_path, formatted=False).tls
    ca = x509.load_pem_x509_certificate(tls.ca_file.read_bytes())
    chain = x509.load_pem_x509_certificates(tls.broker_file.read_bytes())
    broker = chain[0]
    assert chain[1] == ca
    names = broker.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert names.get_values_for_type(x509.DNSName) == ["kafka.test"]
    usage = broker.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    for cert in (
        broker,
        x509.load_pem_x509_certificate(tls.client_cert_file("alice").read_bytes()),
    ):
        cert.verify_directly_issued_by(ca)
    # Kafka's PEM key store reads an unencrypted PKCS#8 key.
    assert tls.broker_file.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert isinstance(ca.public_key(), ec.EllipticCurvePublicKey)
    # Other host names: new certificates.
    before = tls.ca_file.read_bytes()
    other = BrokerSecurity(users=["alice"], hostnames=["127.0.0.1"])
    assert prepare_security(other, tmp_path, formatted=False).tls.ca_file.read_bytes() != before


def test_scram_users_are_formatted_salted(tmp_path: Path) -> None:
    prepared = prepare_security(BrokerSecurity(users={"alice": SECRET}), tmp_path, formatted=False)
    arguments = SecureListener(prepared, 9093).format_arguments()
    assert arguments[0] == "--add-scram" and len(arguments) == 2
    assert SECRET not in " ".join(arguments)
    m = re.fullmatch(
        r'SCRAM-SHA-512=\[name=alice,iterations=(\d+),salt="([^"]+)",saltedpassword="([^"]+)"\]',
        arguments[1],
    )
    assert m is not None, arguments[1]
    iterations, salt, salted = int(m[1]), base64.b64decode(m[2]), base64.b64decode(m[3])
    assert iterations == SCRAM_ITERATIONS
    assert salted == hashlib.pbkdf2_hmac("sha512", SECRET.encode(), salt, iterations)


def secured_node(workdir: Path, secure: SecureListener) -> KafkaNode:
    """A node (never started) on ports 9092 and 9091, with `secure`'s listeners."""
    return KafkaNode(
        node_id=1,
        workdir=workdir,
        port=9092,
        controller_port=9091,
        quorum={},
        properties={},
        java="java",
        jars=workdir,
        secure=secure,
    )


def test_a_secured_node_adds_a_sasl_ssl_listener(tmp_path: Path) -> None:
    security = BrokerSecurity(
        users={"admin": None, "alice": SECRET}, super_users=["admin"], authorizer=True, mtls=True
    )
    prepared = prepare_security(security, tmp_path, formatted=False)
    node = secured_node(tmp_path, SecureListener(prepared, 9093))
    props = node.properties
    assert props["listeners"] == (
        "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9091,SASL_SSL://127.0.0.1:9093"
    )
    assert props["advertised.listeners"].endswith(",SASL_SSL://127.0.0.1:9093")
    assert props["listener.security.protocol.map"].endswith(",SASL_SSL:SASL_SSL")
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    prefix = "listener.name.sasl_ssl."
    assert props[prefix + "sasl.enabled.mechanisms"] == "SCRAM-SHA-512,PLAIN"
    assert f'user_alice="{SECRET}"' in props[prefix + "plain.sasl.jaas.config"]
    assert props[prefix + "ssl.client.auth"] == "required"
    assert props["authorizer.class.name"] == AUTHORIZER
    assert props["super.users"] == "User:ANONYMOUS;User:admin"
    assert node.secure_bootstrap_servers == "127.0.0.1:9093"
    node.write_config()
    assert remembered_secure_port(tmp_path) == 9093
    settings = prepared.client_settings(node.secure_bootstrap_servers or "", "alice")
    assert SECRET not in repr(settings)
    conf = settings.config()
    assert conf["sasl.password"] == SECRET
    assert conf["ssl.certificate.location"].endswith("client-alice.pem")
    assert conf["ssl.key.location"].endswith("client-alice.key")
    with pytest.raises(ValueError, match="no user 'carol'"):
        prepared.client_settings("x:1", "carol")
    with pytest.raises(ValueError, match="mechanism 'GSSAPI'"):
        prepared.client_settings("x:1", "alice", "GSSAPI")


def _claims(token: str) -> tuple[dict[str, object], dict[str, object], str]:
    header, claims, signature = token.split(".")

    def decode(part: str) -> dict[str, object]:
        loaded = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
        assert isinstance(loaded, dict)
        return loaded

    return decode(header), decode(claims), signature


def test_oauthbearer_takes_unsecured_tokens_of_any_principal(tmp_path: Path) -> None:
    security = BrokerSecurity(users=["admin", "alice"], mtls=True, oauthbearer=True)
    prepared = prepare_security(security, tmp_path, formatted=False)
    props = SecureListener(prepared, 9093).properties()
    prefix = "listener.name.sasl_ssl."
    assert props[prefix + "sasl.enabled.mechanisms"] == "SCRAM-SHA-512,PLAIN,OAUTHBEARER"
    oauth = prefix + "oauthbearer."
    assert props[oauth + "sasl.server.callback.handler.class"].endswith(
        "OAuthBearerUnsecuredValidatorCallbackHandler"
    )
    assert "OAuthBearerLoginModule required" in props[oauth + "sasl.jaas.config"]
    # A session ends with its token: a client that does not refresh it is cut off.
    assert int(props[oauth + "connections.max.reauth.ms"]) > 0

    bob = prepared.client_settings("x:1", "bob", "OAUTHBEARER")  # any principal
    conf = bob.config()
    assert conf["sasl.mechanism"] == "OAUTHBEARER"
    assert conf["enable.sasl.oauthbearer.unsecure.jwt"] == "true"
    assert conf["sasl.oauthbearer.config"] == "principal=bob"
    assert "sasl.password" not in conf and "sasl.username" not in conf
    assert conf["ssl.certificate.location"].endswith("client-admin.pem")  # mTLS: a user's
    tokens = UnsecuredTokens("bob", lifetime_s=60)
    with_provider = bob.token_config(tokens)
    assert with_provider["oauth_cb"] is tokens
    assert "enable.sasl.oauthbearer.unsecure.jwt" not in with_provider

    token, expires, principal, extensions = tokens("ignored")
    header, claims, signature = _claims(token)
    assert header == {"alg": "none"} and signature == ""
    assert (
        claims["sub"] == "bob"
        and claims["exp"] == expires
        and (principal, extensions)
        == (
            "bob",
            {},
        )
    )
    assert 59 <= expires - time.time() <= 60
    assert tokens.calls == 1 and tokens.tokens == [token]
    assert token not in repr(tokens)

    plain = prepare_security(BrokerSecurity(users=["a"]), tmp_path / "plain", formatted=False)
    with pytest.raises(ValueError, match="BrokerSecurity\\(oauthbearer=True\\)"):
        plain.client_settings("x:1", "a", "OAUTHBEARER")
    with pytest.raises(ValueError, match="a token provider needs mechanism 'OAUTHBEARER'"):
        prepared.client_settings("x:1", "alice").token_config(tokens)


def test_an_ssl_listener_takes_client_certificates_as_logins(tmp_path: Path) -> None:
    security = BrokerSecurity(users=["admin", "alice"], authorizer=True, ssl_listener=True)
    prepared = prepare_security(security, tmp_path, formatted=False)
    node = secured_node(tmp_path, SecureListener(prepared, 9093, 9094))
    props = node.properties
    assert props["listeners"].endswith(",SASL_SSL://127.0.0.1:9093,SSL://127.0.0.1:9094")
    assert props["advertised.listeners"].endswith(",SSL://127.0.0.1:9094")
    assert props["listener.security.protocol.map"].endswith(",SASL_SSL:SASL_SSL,SSL:SSL")
    prefix = "listener.name.ssl."
    assert props[prefix + "ssl.client.auth"] == "required"
    assert props[prefix + "ssl.truststore.location"] == str(prepared.tls.ca_file)
    assert props["listener.name.sasl_ssl.ssl.client.auth"] == "none"  # no mtls asked
    # Kafka reads a subject as RFC 2253 (cryptography's RFC 4514 string, the same here) and
    # maps it by the first rule that matches: the common name, as ACLs name the principal.
    rule, default = props[prefix + "ssl.principal.mapping.rules"].split("/,")
    pattern, replacement = rule.removeprefix("RULE:").split("/")
    assert (default, replacement) == ("DEFAULT", "$1")
    node.write_config()
    assert remembered_secure_port(tmp_path, "SSL") == 9094
    assert node.ssl_bootstrap_servers == "127.0.0.1:9094"

    ca = x509.load_pem_x509_certificate(prepared.tls.ca_file.read_bytes())
    for name in ("alice", "p-1234"):  # a user, and any other principal: issued on demand
        settings = prepared.client_settings("x:1", name, "SSL", node.ssl_bootstrap_servers)
        conf = settings.config()
        assert conf == {
            "bootstrap.servers": "127.0.0.1:9094",
            "security.protocol": "SSL",
            "ssl.ca.location": str(prepared.tls.ca_file),
            "ssl.certificate.location": str(prepared.tls.client_cert_file(name)),
            "ssl.key.location": str(prepared.tls.client_key_file(name)),
        }
        cert = x509.load_pem_x509_certificate(prepared.tls.client_cert_file(name).read_bytes())
        cert.verify_directly_issued_by(ca)
        subject = cert.subject.rfc4514_string()
        mapped = re.fullmatch(pattern, subject)
        assert mapped is not None and mapped.group(1) == name, subject
        key = prepared.tls.client_key_file(name)
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(prepared.tls.ca_key_file.stat().st_mode) == 0o600
    with pytest.raises(ValueError, match="user name 'a,b'"):
        prepared.client_settings("x:1", "a,b", "SSL", "127.0.0.1:9094")


def test_an_ssl_login_needs_the_ssl_listener(tmp_path: Path) -> None:
    prepared = prepare_security(BrokerSecurity(users=["alice"]), tmp_path, formatted=False)
    with pytest.raises(ValueError, match=r"needs a broker started with .*ssl_listener=True"):
        prepared.client_settings("x:1", "alice", "SSL", None)
    with pytest.raises(ValueError, match=r"ssl_listener=\.\.\.\) must be True or False"):
        BrokerSecurity(ssl_listener="yes")  # type: ignore[arg-type]


def test_each_node_of_a_secured_cluster_gets_its_ssl_listener(tmp_path: Path) -> None:
    """Nodes made as `start()` makes them (never started): 4 ports each, the SSL listeners
    last, and `client_settings(mechanism="SSL")` bootstraps from every one."""
    security = BrokerSecurity(users=["alice"], ssl_listener=True)
    cluster = EmbeddedKafkaCluster(3, security=security)
    cluster._workdir = tmp_path
    cluster._prepared = prepare_security(security, tmp_path, formatted=False)
    cluster.nodes = cluster._make_nodes("java", tmp_path, list(range(9000, 9012)))
    assert [node.ssl_bootstrap_servers for node in cluster.nodes] == [
        "127.0.0.1:9009",
        "127.0.0.1:9010",
        "127.0.0.1:9011",
    ]
    assert cluster.nodes[2].secure_bootstrap_servers == "127.0.0.1:9008"
    settings = cluster.client_settings("alice", mechanism="SSL")
    assert settings.bootstrap_servers == "127.0.0.1:9009,127.0.0.1:9010,127.0.0.1:9011"
    assert cluster.client_settings("alice").bootstrap_servers.endswith(",127.0.0.1:9008")
