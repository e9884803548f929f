"""The quick start (docs/quickstart.md): ten greetings into a topic, a consumer group handles
them on worker threads, and the member stops once their offsets are committed.

    weir broker start                      # prints the broker's address
    python quickstart.py 127.0.0.1:PORT    # the address printed above
    weir lag -b 127.0.0.1:PORT -g quickstart

`make dist` runs it from the installed wheel, so it must need nothing but kafka-weir itself.
"""

from __future__ import annotations

import sys
import threading

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from weir import CommitEvent, GroupConsumer, Partition, Record

TOPIC = "greetings"
GROUP = "quickstart"


def create_topic(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = admin.create_topics([NewTopic(TOPIC, num_partitions=3, replication_factor=1)])
    try:
        created[TOPIC].result()
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # a second run is fine
            raise


def produce(bootstrap: str, count: int) -> dict[Partition, int]:
    """Send `count` records; returns each partition's end offset after them."""
    ends: dict[Partition, int] = {}

    def delivered(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            raise KafkaException(err)
        partition, offset = msg.partition(), msg.offset()
        assert partition is not None and offset is not None  # a delivered record has both
        tp = Partition(TOPIC, partition)
        ends[tp] = max(ends.get(tp, 0), offset + 1)

    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        producer.produce(TOPIC, key=f"user-{i % 4}", value=f"hello {i}", on_delivery=delivered)
    if producer.flush(30) != 0:
        sys.exit("the records were not delivered within 30 s")
    return ends


def handle(record: Record) -> None:
    # Runs on a worker thread. Raising would leave the record unfinished: it is retried, and
    # the group's commit never passes it.
    print(f"{record.topic}[{record.partition}]@{record.offset}: {record.value!r}", flush=True)


def main() -> None:
    bootstrap = sys.argv[1] if len(sys.argv) > 1 else "localhost:9092"
    create_topic(bootstrap)
    ends = produce(bootstrap, 10)

    consumer = GroupConsumer(
        handle,
        bootstrap_servers=bootstrap,
        group_id=GROUP,
        topics=[TOPIC],
        ordering="key",  # one record of a key at a time, in offset order
        workers=4,
        group_protocol="auto",  # KIP-848 where the broker offers it (Kafka 4.0 and later)
    )
    committed: dict[Partition, int] = {}
    done = threading.Event()

    def on_commit(event: CommitEvent) -> None:
        if event.ok:
            committed[event.tp] = event.offset
        if all(committed.get(tp, 0) >= end for tp, end in ends.items()):
            done.set()

    consumer.add_commit_listener(on_commit)
    consumer.start()  # the member runs on a thread of its own: poll, dispatch, commit
    try:
        if not done.wait(60):
            sys.exit(f"not committed within 60 s: {committed}, expected {ends}")
    finally:
        consumer.stop()  # drain, commit, leave the group
        consumer.join(30)
    print(f"committed {sorted((tp.partition, off) for tp, off in committed.items())}")


if __name__ == "__main__":
    main()
