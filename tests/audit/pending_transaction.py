"""A plain confluent-kafka member that dies with a transaction open and its offsets sent.

Joins the group alone and takes every partition of the topic, commits one transaction with the
offsets `--committed` for every partition, then begins another, produces one output, sends the
offsets `--pending` with the consumer's group metadata and SIGKILLs itself before committing:
the group's offsets stay pending (UNSTABLE_OFFSET_COMMIT for any reader) until the broker
aborts the transaction at `--transaction-timeout-ms`, and go back to `--committed`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--partitions", type=int, required=True)
    ap.add_argument("--protocol", choices=["classic", "consumer"], required=True)
    ap.add_argument("--committed", type=int, required=True)
    ap.add_argument("--pending", type=int, required=True)
    ap.add_argument("--transaction-timeout-ms", type=int, required=True)
    args = ap.parse_args(argv)
    group_conf: dict[str, object] = (
        {"group.protocol": "consumer"}
        if args.protocol == "consumer"
        else {"partition.assignment.strategy": "range", "session.timeout.ms": 2000}
    )
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **group_conf,
        }
    )
    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "transactional.id": f"{args.group}-pending",
            "transaction.timeout.ms": args.transaction_timeout_ms,
        }
    )
    producer.init_transactions(30)
    consumer.subscribe([args.topic])
    deadline = time.monotonic() + 60
    while len(consumer.assignment()) < args.partitions:
        if time.monotonic() > deadline:
            print("not assigned every partition", file=sys.stderr)
            return 1
        consumer.poll(0.1)

    def offsets(at: int) -> list[TopicPartition]:
        return [TopicPartition(args.topic, p, at) for p in range(args.partitions)]

    producer.begin_transaction()
    producer.send_offsets_to_transaction(
        offsets(args.committed), consumer.consumer_group_metadata(), 30
    )
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(args.output, b"from the transaction that never commits")
    producer.send_offsets_to_transaction(
        offsets(args.pending), consumer.consumer_group_metadata(), 30
    )
    producer.flush(30)
    print("pending", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
