"""Fixtures of the tests on the secured session broker (kafka_secure_broker)."""

from __future__ import annotations

import uuid

import pytest

from weir.testing.broker import EmbeddedKafka
from weir.testing.pytest_plugin import SECURE_USER
from weir.testing.security import ClientSettings


@pytest.fixture
def principal() -> str:
    """A principal of the test's own: no ACL another test granted changes what the broker
    refuses it (an idempotent producer, for one, gets its producer id from WRITE on any
    topic)."""
    return f"p-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def who(kafka_secure_broker: EmbeddedKafka, principal: str) -> ClientSettings:
    """How `principal` logs in: OAUTHBEARER with unsecured tokens, which the secured broker
    takes for any principal."""
    return kafka_secure_broker.client_settings(principal, mechanism="OAUTHBEARER")


@pytest.fixture
def alice(kafka_secure_broker: EmbeddedKafka) -> ClientSettings:
    """How `alice`, whom the secured broker holds to its ACLs, logs in: SCRAM-SHA-512 over
    SASL_SSL, with her client certificate (mTLS)."""
    return kafka_secure_broker.client_settings(SECURE_USER)


@pytest.fixture
def group() -> str:
    """A consumer group of the test's own."""
    return f"g-{uuid.uuid4().hex[:8]}"
