"""librdkafka's own verdict on a configuration, asked of a throwaway client.

A consumer that knows no broker is built from the whole configuration and closed at once: it
connects nowhere, and librdkafka refuses what it would refuse at a member's start (unknown
names, bad values and ranges, settings that do not combine). Each refusal names the `kafka` key
or typed field at fault, with secrets masked.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

import confluent_kafka

from weir._kafka_mapping import TYPED_KEYS
from weir._secrets import MASK, is_secret_key

__all__ = ["librdkafka_refusals"]


class _Quiet:
    """The throwaway client's logger: confluent-kafka hands it librdkafka's log lines (a missing
    bootstrap.servers warns), which say nothing about the configuration weir will run with."""

    def log(self, level: int, msg: str, *args: object) -> None:
        pass


_QUIET = _Quiet()
_FAILED_PREFIX = re.compile(r"^Failed to create consumer: ")
# Mechanisms whose start does nothing outside the process; OAUTHBEARER with OIDC fetches a token
# over HTTP and GSSAPI runs kinit as soon as a client is built, even one that knows no broker.
_QUIET_MECHANISMS = re.compile(r"PLAIN|SCRAM-SHA-\d+")


def _probe(conf: Mapping[str, Any]) -> str | None:
    """librdkafka's reason for refusing `conf` as a consumer's configuration, or None.

    The Python client passes each setting to rd_kafka_conf_set() (unknown names, bad values and
    ranges) and rd_kafka_new() checks how they combine; the client it builds knows no broker, so
    it connects nowhere, and closing it joins its threads.
    """
    try:
        client = confluent_kafka.Consumer({**conf, "logger": _QUIET})
    except Exception as exc:  # whatever the client raises is its refusal
        error = exc.args[0] if exc.args else exc
        text = error.str() if isinstance(error, confluent_kafka.KafkaError) else str(error)
        return _FAILED_PREFIX.sub("", text)
    client.close()
    return None


def _probes(conf: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The configuration to probe, and a second one for the SASL mechanism when the first must
    leave SASL out: starting some mechanisms reaches outside the process."""
    # Nor the token provider (oauth_cb): a client built with it calls it (it may ask an
    # identity provider) and waits a second for its token; weir._kafka_mapping checks it.
    probe = {
        k: v
        for k, v in conf.items()
        if k not in ("bootstrap.servers", "metadata.broker.list") and not callable(v)
    }
    # confluent-kafka wires an AWS token callback for this value and waits up to 10 s for a token.
    if probe.get("sasl.oauthbearer.metadata.authentication.type") == "aws_iam":
        del probe["sasl.oauthbearer.metadata.authentication.type"]
    protocol = str(probe.get("security.protocol", "plaintext"))
    mechanism = str(probe.get("sasl.mechanisms", probe.get("sasl.mechanism", "GSSAPI")))
    if not protocol.lower().startswith("sasl_") or _QUIET_MECHANISMS.fullmatch(mechanism):
        return probe, None
    probe["security.protocol"] = protocol[len("sasl_") :]
    mechanism_probe = {
        "group.id": probe["group.id"],
        "security.protocol": protocol,
        "sasl.mechanism": mechanism,
        # No kinit, and a token made in the process instead of fetched.
        "sasl.kerberos.min.time.before.relogin": 0,
        "enable.sasl.oauthbearer.unsecure.jwt": True,
    }
    return probe, mechanism_probe


def _named(reason: str, keys: Collection[str]) -> list[str]:
    return [k for k in keys if re.search(rf"(?<![\w.]){re.escape(k)}(?![\w.])", reason)]


def librdkafka_refusals(conf: Mapping[str, Any], kafka: Mapping[str, Any]) -> list[str]:
    """What librdkafka refuses in `conf`, each naming the `kafka` key or field at fault."""
    secrets = [
        str(v) for k, v in conf.items() if is_secret_key(k) and not callable(v) and len(str(v)) >= 3
    ]

    def scrub(reason: str) -> str:
        for secret in secrets:
            reason = reason.replace(secret, MASK)
        return reason

    def describe(reason: str, keys: list[str]) -> str:
        fields = sorted({TYPED_KEYS[k] for k in _named(reason, conf) if k in TYPED_KEYS})
        if keys:
            where = ", ".join(f"kafka[{k!r}]" for k in keys)
            return f"{where}: librdkafka refuses {'it' if len(keys) == 1 else 'them'}: {reason}"
        if fields:
            return f"librdkafka refuses {', '.join(fields)}: {reason}"
        return f"librdkafka refuses the configuration: {reason}"

    refusals: list[str] = []
    reasons: set[str] = set()
    probe, mechanism_probe = _probes(conf)
    # One refusal at a time: drop the keys it names and ask again, so every bad key is reported.
    for _ in range(len(kafka) + 1):
        reason = _probe(probe)
        if reason is None:
            break
        reason = scrub(reason)
        keys = [k for k in _named(reason, kafka) if k in probe]
        if not keys:  # some reasons name nothing (sasl.jaas.config's): find who fails alone
            group = {"group.id": probe["group.id"]}
            keys = [k for k in kafka if k in probe and _probe(_probes({**group, k: probe[k]})[0])]
        if reason not in reasons:  # dropping a key may leave the same complaint
            reasons.add(reason)
            refusals.append(describe(reason, keys))
        if not keys:
            break
        for k in keys:
            del probe[k]
    if mechanism_probe is not None:
        reason = _probe(mechanism_probe)
        if reason is not None:
            given = [k for k in ("sasl.mechanisms", "sasl.mechanism") if k in kafka]
            refusals.append(describe(scrub(reason), given or ["security.protocol"]))
    return refusals
