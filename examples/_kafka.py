"""What the runnable examples share that is not about weir: the broker they run on (an embedded
one unless `--bootstrap` names one), their client settings, and creating their topics."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

# librdkafka's own log lines (a coordinator still loading on a fresh broker) go through this
# logger, which lets only errors through.
KAFKA_LOG = logging.getLogger("examples.kafka")
KAFKA_LOG.setLevel(logging.ERROR)


def client(bootstrap: str, **conf: Any) -> dict[str, Any]:
    """Settings of a plain confluent-kafka client of the example (producer, reader, admin)."""
    return {"bootstrap.servers": bootstrap, "logger": KAFKA_LOG, **conf}


def create_topics(bootstrap: str, partitions: dict[str, int]) -> None:
    """Create each topic with its partitions; return once every partition has a leader."""
    admin = AdminClient(client(bootstrap))
    created = admin.create_topics([NewTopic(t, num_partitions=n) for t, n in partitions.items()])
    for future in created.values():
        future.result(30)
    deadline = time.monotonic() + 30
    for topic, n in partitions.items():
        while True:
            meta = admin.list_topics(topic, timeout=10).topics.get(topic)
            if (
                meta is not None
                and meta.error is None
                and len(meta.partitions) == n
                and all(p.leader >= 0 for p in meta.partitions.values())
            ):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {topic} has no leader for every partition")
            time.sleep(0.1)


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    """Nothing left behind on a broker that outlives the example."""
    AdminClient(client(bootstrap)).delete_topics(topics, operation_timeout=0)


def broker(stack: contextlib.ExitStack, bootstrap: str | None) -> str | None:
    """`bootstrap`, or an embedded broker's address (stopped when `stack` closes); None, with
    the reason on stderr, if the embedded broker cannot start."""
    if bootstrap:
        return bootstrap
    from weir.testing import EmbeddedKafka, HarnessError

    print("starting embedded Kafka...", flush=True)
    try:
        kafka = stack.enter_context(EmbeddedKafka())
    except HarnessError as exc:  # no Java, no Maven, a broker that would not start
        print(f"cannot start the embedded Kafka broker: {exc}", file=sys.stderr)
        print("(or use a Kafka of yours: --bootstrap HOST:PORT)", file=sys.stderr)
        return None
    return kafka.bootstrap_servers
