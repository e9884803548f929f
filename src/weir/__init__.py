"""kafka-weir: consume from Kafka with worker threads and never lose or skip a record."""

from weir.committing import CommitEvent
from weir.config import ConsumerConfig, FlowConfig
from weir.consumer import GroupConsumer
from weir.errors import BrokerUnreachableError, HandlerError, KafkaFatalError, WeirError
from weir.metrics import ConsumerStats, PartitionStats
from weir.records import Context, Handler, Partition, Record
from weir.tracking import BatchProgress, PartitionProgress

__all__ = [
    "BatchProgress",
    "BrokerUnreachableError",
    "CommitEvent",
    "ConsumerConfig",
    "ConsumerStats",
    "Context",
    "FlowConfig",
    "GroupConsumer",
    "Handler",
    "HandlerError",
    "KafkaFatalError",
    "Partition",
    "PartitionProgress",
    "PartitionStats",
    "Record",
    "WeirError",
]

__version__ = "0.1.0"
