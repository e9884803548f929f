"""Test harness: an embedded broker/cluster, broker providers, pytest fixtures, and an in-memory
fake of Kafka (``FakeBroker``, ``FakeConsumer`` and ``FakeProducer`` in ``weir.testing.fake``) for
tests without a JVM.

Importing this package starts nothing and imports almost nothing: the pytest plugin lives here and
is loaded in every pytest run of every project that installs weir, so names resolve lazily.
The produce/consume helpers for tests live in ``weir.testing.pytest_plugin`` next to the fixtures.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from weir.testing.broker import TEST_BROKER_DEFAULTS, EmbeddedKafka, KafkaNode
    from weir.testing.clock import ManualClock
    from weir.testing.cluster import EmbeddedKafkaCluster
    from weir.testing.errors import (
        BrokerStartError,
        BrokerUnavailableError,
        HarnessError,
        JavaNotFoundError,
        JavaVersionError,
        MavenError,
        MavenNotFoundError,
        PortInUseError,
        WorkdirError,
        WorkdirInUseError,
    )
    from weir.testing.events import capture_events
    from weir.testing.fake_broker import FakeBroker
    from weir.testing.fake_cluster import FakeGroupMetadata, FakeMessage, FakeTransaction
    from weir.testing.fake_consumer import CommitCall, CommittedOffsets, FakeConsumer, ScriptedEvent
    from weir.testing.fake_producer import FakeProducer
    from weir.testing.jars import KAFKA_VERSION, ensure_kafka_jars
    from weir.testing.providers import (
        BrokerProvider,
        EmbeddedBroker,
        ExternalBroker,
        TestcontainersBroker,
        select_provider,
    )

_WHERE = {
    "TEST_BROKER_DEFAULTS": "broker",
    "EmbeddedKafka": "broker",
    "KafkaNode": "broker",
    "EmbeddedKafkaCluster": "cluster",
    "BrokerStartError": "errors",
    "BrokerUnavailableError": "errors",
    "HarnessError": "errors",
    "JavaNotFoundError": "errors",
    "JavaVersionError": "errors",
    "MavenError": "errors",
    "MavenNotFoundError": "errors",
    "PortInUseError": "errors",
    "WorkdirError": "errors",
    "WorkdirInUseError": "errors",
    "CommitCall": "fake_consumer",
    "CommittedOffsets": "fake_consumer",
    "FakeBroker": "fake_broker",
    "FakeConsumer": "fake_consumer",
    "FakeTransaction": "fake_cluster",
    "FakeGroupMetadata": "fake_cluster",
    "FakeMessage": "fake_cluster",
    "FakeProducer": "fake_producer",
    "ScriptedEvent": "fake_consumer",
    "KAFKA_VERSION": "jars",
    "ensure_kafka_jars": "jars",
    "capture_events": "events",
    "ManualClock": "clock",
    "BrokerProvider": "providers",
    "EmbeddedBroker": "providers",
    "ExternalBroker": "providers",
    "TestcontainersBroker": "providers",
    "select_provider": "providers",
}

__all__ = [
    "KAFKA_VERSION",
    "TEST_BROKER_DEFAULTS",
    "BrokerProvider",
    "BrokerStartError",
    "BrokerUnavailableError",
    "CommitCall",
    "CommittedOffsets",
    "EmbeddedBroker",
    "EmbeddedKafka",
    "EmbeddedKafkaCluster",
    "ExternalBroker",
    "FakeBroker",
    "FakeConsumer",
    "FakeGroupMetadata",
    "FakeMessage",
    "FakeProducer",
    "FakeTransaction",
    "HarnessError",
    "JavaNotFoundError",
    "JavaVersionError",
    "KafkaNode",
    "ManualClock",
    "MavenError",
    "MavenNotFoundError",
    "PortInUseError",
    "ScriptedEvent",
    "TestcontainersBroker",
    "WorkdirError",
    "WorkdirInUseError",
    "capture_events",
    "ensure_kafka_jars",
    "select_provider",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
