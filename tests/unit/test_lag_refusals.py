"""weir.lag names a refusal only from what the client reported during the call at hand.

The refusals themselves are tested against the secured broker
(tests/integration/test_security_broker.py).
"""

from __future__ import annotations

import pytest

from weir.lag import BrokerUnreachableError, admin_client, topic_partitions

AUTH = (
    "sasl_ssl://127.0.0.1:1/bootstrap: SASL authentication error: Authentication failed "
    "(after 300ms in state AUTH_REQ)"
)


def test_a_refusal_of_an_earlier_call_is_forgotten() -> None:
    """An admin client used again (wait_for_committed, weir lag --watch) after a refusal that
    has ended must say what happens now."""
    admin = admin_client({"bootstrap.servers": "127.0.0.1:1"})
    admin.weir_errors.update(  # type: ignore[attr-defined]
        {
            "SASL authentication error": ("_AUTHENTICATION", AUTH),
            "1/1 brokers are down": ("_ALL_BROKERS_DOWN", "1/1 brokers are down"),
        }
    )
    with pytest.raises(BrokerUnreachableError):
        topic_partitions(admin, "t", timeout=0.5)


def test_a_request_the_acls_refuse_names_the_describe_it_lacks() -> None:
    """Regression: "GROUP_AUTHORIZATION_FAILED: Broker: Group authorization failed", a
    LagError naming no ACL."""
    from confluent_kafka import KafkaError, KafkaException

    from weir.lag import AuthorizationError, _as_lag_error, _Deadline

    refused = KafkaException(
        KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED, "Broker: Group authorization failed")
    )
    error = _as_lag_error(refused, _Deadline(1.0), ("group", "orders"))
    assert isinstance(error, AuthorizationError)
    assert str(error) == (
        "authorization failed: the broker's ACLs do not allow this client DESCRIBE on group "
        "'orders' (GROUP_AUTHORIZATION_FAILED: Broker: Group authorization failed): reading a "
        "group's lag needs DESCRIBE on the group and on its topics"
    )
