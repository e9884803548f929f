"""In-memory Kafka for tests without a JVM: `FakeBroker`, `FakeConsumer` and `FakeProducer`.

`FakeConsumer` satisfies `weir._engine.client.ConsumerClient` and `FakeProducer`
`weir._engine.client.TransactionalProducer` (mypy checks both in their modules, as
`weir._engine.client` checks the real clients), so `GroupConsumer` runs on them unchanged. The
consumer comes in two modes:

**Group mode** — consumers made by `FakeBroker.consumer_factory` share one in-memory broker:
topics with partitioned logs, consumer groups whose members are assigned partitions when they
subscribe, close or unsubscribe (eager `range`/`roundrobin`, `cooperative-sticky`, or KIP-848
`group.protocol=consumer`, chosen from the configuration as the client does), committed offsets
with metadata per group, and transactions. Use it to test your own handlers and hooks::

    broker = FakeBroker()
    broker.create_topic("orders", partitions=3)
    broker.produce("orders", key=b"k1", value=b"v1")
    consumer = GroupConsumer(
        handle, bootstrap_servers="fake:9092", group_id="billing", topics=["orders"],
        consumer_factory=broker.consumer_factory,
    )
    with consumer:
        broker.wait_until_committed("billing")

**Scripted mode** — `FakeConsumer()` is one member whose assignment changes only when the test
says so (`script_assign`, `script_revoke`, `script_lost`), with control over commit results
(`hold_commit_results`, `deliver_commit_results`, `fail_next_commits`), injected errors and a
log of every call. weir's engine tests use it to pin exact interleavings::

    fake = FakeConsumer()
    fake.produce_many("t", 0, range(10))
    fake.script_assign([("t", 0)])
    gc = GroupConsumer(handler, consumer_factory=fake.factory, **settings)

In both modes callbacks (on_assign / on_revoke / on_lost, `on_commit`, `error_cb`) run on the
thread that calls `consume()`, inside it, as the real client serves them from its poll; only
`close()` serves the final revoke inside itself.

`FakeBroker.producer_factory` makes producers: plain (a member's dead letters) or, with
`transactional.id`, transactional (an exactly-once member's): transactions that commit or abort
outputs and offsets together, fencing by producer epoch and by group generation, and faults on
request (`fail_next`, `hang_next`, `fail_deliveries`). A scripted consumer's producer is
`FakeProducer(conf, broker=fake._broker)`.

The modules, each importing only those below it: `fake_cluster` (`Cluster`: the state the clients
share), `fake_consumer` and `fake_producer` (the clients), `fake_broker` (`FakeBroker`: a
`Cluster` that makes its clients), and this one, which only gathers the names.

What the fake does is checked against a real Apache Kafka broker by one contract suite
(tests/contract/ in weir's repository) that runs the same tests on both. What it does not model:
time (no session or poll-interval expiry: `FakeBroker.expire` stands in for a missed
`max.poll.interval.ms`; no transaction timeout), replication and broker failures (faults stand in
for them), fetch sizes and prefetching, compaction and retention, regex subscriptions, static
membership, and the producer's queue (a record is written, or refused, at once).
"""

from __future__ import annotations

from weir.testing.fake_broker import FakeBroker
from weir.testing.fake_cluster import FakeGroupMetadata, FakeMessage, FakeTransaction
from weir.testing.fake_consumer import CommitCall, CommittedOffsets, FakeConsumer, ScriptedEvent
from weir.testing.fake_producer import FakeProducer

__all__ = [
    "CommitCall",
    "CommittedOffsets",
    "FakeBroker",
    "FakeConsumer",
    "FakeGroupMetadata",
    "FakeMessage",
    "FakeProducer",
    "FakeTransaction",
    "ScriptedEvent",
]
