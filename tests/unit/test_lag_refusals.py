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
