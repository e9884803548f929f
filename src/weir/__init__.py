"""kafka-weir: consume from Kafka with worker threads and never lose or skip a record."""

from weir._engine.lifecycle import State
from weir._engine.tracking import BatchProgress, PartitionProgress
from weir.config import ConsumerConfig, ConsumerSettings, FlowConfig
from weir.consumer import GroupConsumer
from weir.errors import (
    AuthenticationError,
    AuthorizationError,
    BrokerRefusedError,
    BrokerUnreachableError,
    CallbackError,
    DeadLetterError,
    DeserializationError,
    FencedError,
    HandlerError,
    KafkaFatalError,
    NonRetryable,
    OffsetResetError,
    OutputError,
    SeekError,
    TlsError,
    TransactionError,
    WeirError,
)
from weir.health import Health
from weir.policy import FailurePolicy, RetryPolicy
from weir.records import (
    BatchContext,
    BatchHandler,
    CommitEvent,
    Context,
    FlushContext,
    Handler,
    Partition,
    Record,
)
from weir.routing import Route
from weir.stats import ConsumerStats, LatencyHistogram, PartitionStats

__all__ = [
    "AuthenticationError",
    "AuthorizationError",
    "BatchContext",
    "BatchHandler",
    "BatchProgress",
    "BrokerRefusedError",
    "BrokerUnreachableError",
    "CallbackError",
    "CommitEvent",
    "ConsumerConfig",
    "ConsumerSettings",
    "ConsumerStats",
    "Context",
    "DeadLetterError",
    "DeserializationError",
    "FailurePolicy",
    "FencedError",
    "FlowConfig",
    "FlushContext",
    "GroupConsumer",
    "Handler",
    "HandlerError",
    "Health",
    "KafkaFatalError",
    "LatencyHistogram",
    "NonRetryable",
    "OffsetResetError",
    "OutputError",
    "Partition",
    "PartitionProgress",
    "PartitionStats",
    "Record",
    "RetryPolicy",
    "Route",
    "SeekError",
    "State",
    "TlsError",
    "TransactionError",
    "WeirError",
]

__version__ = "0.2.0"
