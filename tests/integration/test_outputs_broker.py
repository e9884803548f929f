"""At-least-once outputs on a real broker: `ctx.produce` without `transactional_id`. No commit
passes a record before the broker confirmed its output (checked on the owner thread at every
commit the member sends, against the producer's own delivery reports); an output the broker
refuses fails its record into the failure policy, which retries and then dead-letters it."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer

from weir import CommitEvent, Context, FailurePolicy, GroupConsumer, Handler, Record, RetryPolicy
from weir.testing.pytest_plugin import (
    TopicFactory,
    consume_all,
    produce,
    wait_for_committed,
)

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

PARTITIONS = 3
RECORDS = 300
WAIT = 30.0


class Enrich(Handler):
    """One output per record, `<partition>:<offset>`; `big` records' outputs go to `big_out`
    instead, padded past what that topic takes (a broker refuses a record batch larger than its
    topic's max.message.bytes whole, so the refused output is kept apart from the others)."""

    def __init__(
        self, out: str, big: frozenset[tuple[int, int]] = frozenset(), big_out: str = ""
    ) -> None:
        self.out = out
        self.big = big
        self.big_out = big_out

    def handle(self, record: Record, ctx: Context) -> None:
        value = f"{record.partition}:{record.offset}"
        if (record.partition, record.offset) in self.big:
            ctx.produce(self.big_out, value + "x" * 4000, record.key)
        else:
            ctx.produce(self.out, value, record.key)


class Watch:
    """What the output producer's delivery reports confirmed, and every commit sent that passed
    an input whose output was not confirmed yet (both on the owner thread)."""

    def __init__(self, topic: str, dlq: str) -> None:
        self.topic = topic
        self.dlq = dlq
        self.confirmed: set[tuple[int, int]] = set()
        self.violations: list[str] = []
        self.commits = 0
        self._lock = threading.Lock()

    def factory(self, conf: dict[str, Any]) -> Producer:
        watch = self

        class Watched(Producer):
            def produce(  # type: ignore[override]  # weir's call: on_delivery by keyword
                self, topic: str, value: Any = None, key: Any = None, **kw: Any
            ) -> None:
                report = kw.pop("on_delivery")

                def delivered(err: KafkaError | None, msg: Any) -> None:
                    if err is None:
                        with watch._lock:
                            watch.confirmed.add(watch.input_of(msg))
                    report(err, msg)

                super().produce(topic, value, key, on_delivery=delivered, **kw)

        return Watched(conf)

    def input_of(self, msg: Any) -> tuple[int, int]:
        """The input an output or a dead letter (the input's value, `v<i>`) was written for."""
        value = msg.value() or b""
        if msg.topic() == self.dlq:
            i = int(value.decode()[1:])
            return i % PARTITIONS, i // PARTITIONS
        p, o = value[:32].decode().rstrip("x").split(":")
        return int(p), int(o)

    def commit(self, e: CommitEvent) -> None:
        if e.status != "sent" or e.tp.topic != self.topic:
            return
        self.commits += 1
        with self._lock:
            late = [o for o in range(e.offset) if (e.tp.partition, o) not in self.confirmed]
        if late:
            self.violations.append(f"commit {e.tp}@{e.offset} before the outputs of {late[:10]}")


def inputs(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    rows = [
        {"key": f"k{i % 7}", "value": f"v{i}", "partition": i % PARTITIONS} for i in range(RECORDS)
    ]
    produce(bootstrap, topic, rows)
    per = RECORDS // PARTITIONS
    return [(p, o) for p in range(PARTITIONS) for o in range(per)]


def member(bootstrap: str, handler: Handler, watch: Watch, group: str) -> GroupConsumer:
    gc = GroupConsumer(
        handler,
        bootstrap_servers=bootstrap,
        group_id=group,
        topics=[watch.topic],
        auto_offset_reset="earliest",
        commit_interval_s=0.05,
        failure=FailurePolicy(
            retry=RetryPolicy(max_attempts=2, backoff_initial_s=0.05, jitter=0.0),
            final="dead_letter",
            dead_letter_topic=watch.dlq,
        ),
        producer_factory=watch.factory,
    )
    gc.add_commit_listener(watch.commit)
    return gc


def test_outputs_are_confirmed_before_the_commit_passes_their_record(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    topic, out = make_topic(PARTITIONS), make_topic(2)
    expected = inputs(kafka_bootstrap, topic)
    group = f"g-{uuid.uuid4().hex[:10]}"
    watch = Watch(topic, make_topic(1))
    gc = member(kafka_bootstrap, Enrich(out), watch, group)
    gc.start()
    try:
        wait_for_committed(kafka_bootstrap, group, topic, "end", timeout=WAIT)
    finally:
        gc.stop()
        gc.join(30)
    assert watch.commits > 0
    assert watch.violations == []
    written = Counter(
        (r.value or b"").decode() for r in consume_all(kafka_bootstrap, out, expected=RECORDS)
    )
    assert written == Counter(f"{p}:{o}" for p, o in expected)  # no fault: each once


def test_an_output_the_broker_refuses_is_retried_then_dead_lettered(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    """One input's output goes to a topic that takes records of at most 1000 bytes, and is
    larger: the broker refuses it (MSG_SIZE_TOO_LARGE) on both attempts; its record is
    dead-lettered and only then committed past, and every other output is written once."""
    topic, out = make_topic(PARTITIONS), make_topic(2)
    big_out = make_topic(1, config={"max.message.bytes": "1000"})
    expected = inputs(kafka_bootstrap, topic)
    big = frozenset({(1, 40)})
    group = f"g-{uuid.uuid4().hex[:10]}"
    watch = Watch(topic, make_topic(1))
    gc = member(kafka_bootstrap, Enrich(out, big, big_out), watch, group)
    gc.start()
    try:
        wait_for_committed(kafka_bootstrap, group, topic, "end", timeout=WAIT)
        st = gc.stats()
    finally:
        gc.stop()
        gc.join(30)
    assert st.dead_lettered == 1 and st.retries >= 1
    letters = consume_all(kafka_bootstrap, watch.dlq, expected=1)
    assert [r.value for r in letters] == [b"v121"]  # partition 1, offset 40: input 3*40+1
    # No commit passed it before its dead letter was confirmed.
    assert watch.violations == []
    written = Counter(
        (r.value or b"").decode() for r in consume_all(kafka_bootstrap, out, expected=RECORDS - 1)
    )
    assert written == Counter(f"{p}:{o}" for p, o in expected if (p, o) not in big)
