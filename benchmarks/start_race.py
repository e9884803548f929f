"""librdkafka alone: a partition assigned at a logical offset, paused, then sought, may jump to
the log end (the cause of key-mode runs on 1,000 partitions that crawled; `weir._engine.starts`).

Each trial is a fresh consumer that assigns every partition, pauses them, seeks each to 0 after
`--delay` seconds and resumes them, then consumes for `--consume-s` seconds. It counts the
partitions that delivered nothing: their seek was undone by an outdated ListOffsets reply
(librdkafka re-arms the lookup of the logical offset 500 ms later, whatever state the partition
is in then). `--placeholder end` is what weir did (OFFSET_END, paused after the assign);
`--placeholder zero` is what it does (assigned at offset 0, paused after the assign).

    .venv/bin/python benchmarks/start_race.py --placeholder end
    .venv/bin/python benchmarks/start_race.py --placeholder zero
"""

from __future__ import annotations

import argparse
import time

from _common import add_broker_args, broker_from, create_topic, produce, unique
from confluent_kafka import OFFSET_END, Consumer, TopicPartition


def trial(
    bootstrap: str, topic: str, partitions: int, placeholder: str, delay: float, consume_s: float
) -> tuple[int, int]:
    """(records delivered, partitions that delivered nothing)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("start-race"),
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
            "log_level": 3,
        }
    )
    try:
        c.list_topics(topic, timeout=10)
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        at = OFFSET_END if placeholder == "end" else 0
        c.assign([TopicPartition(topic, p, at) for p in range(partitions)])
        c.pause(tps)
        time.sleep(delay)
        for tp in tps:
            c.seek(TopicPartition(topic, tp.partition, 0))
        c.resume(tps)
        seen: set[int] = set()
        n = 0
        end = time.monotonic() + consume_s
        while time.monotonic() < end:
            for m in c.consume(1000, 0.2):
                part = m.partition()
                if m.error() is None and part is not None:
                    seen.add(part)
                    n += 1
        return n, partitions - len(seen)
    finally:
        c.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_broker_args(p)
    p.add_argument("--placeholder", choices=["end", "zero"], default="end")
    p.add_argument("--partitions", type=int, default=1000)
    p.add_argument("--records-per-partition", type=int, default=30)
    p.add_argument("--delays", default="0,0.05,0.2", help="seconds between pause and seek")
    p.add_argument("--trials", type=int, default=2, help="per delay")
    p.add_argument("--consume-s", type=float, default=5.0)
    args = p.parse_args()
    with broker_from(args) as bk:
        topic = unique("start-race")
        create_topic(bk.bootstrap, topic, args.partitions)
        total = args.partitions * args.records_per_partition
        produce(
            bk.bootstrap,
            topic,
            total,
            value_size=100,
            partitions=args.partitions,
            keys=args.partitions,
        )
        for delay in (float(d) for d in args.delays.split(",")):
            for i in range(args.trials):
                n, silent = trial(
                    bk.bootstrap, topic, args.partitions, args.placeholder, delay, args.consume_s
                )
                print(
                    f"placeholder={args.placeholder} delay={delay:g}s trial {i}: "
                    f"{n:,} of {total:,} records, {silent} of {args.partitions} partitions "
                    "delivered nothing",
                    flush=True,
                )


if __name__ == "__main__":
    main()
