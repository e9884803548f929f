"""Batch handlers on a real broker: the consume-commit path with `handle_batch`."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable

import pytest

from tests.accumulators import Accumulator
from tests.audit.exactly_once import (
    AsyncProduceThenFailBatch,
    ProduceThenFailBatch,
    compare,
    wait_for_no_open_transaction,
)
from tests.consumer_overrides import Overrides
from tests.integration.kafka_helpers import committed, end_offsets, keyed_orders, member, produce
from tests.integration.kafka_helpers import wait_until as wait_for
from weir import BatchContext, BatchHandler, CommitEvent, FailurePolicy, Record, RetryPolicy
from weir.testing.pytest_plugin import TopicFactory, consume_all, wait_for_committed


class Collect(BatchHandler):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sizes: list[int] = []
        self.seen: dict[tuple[int, bytes | None], list[int]] = defaultdict(list)

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> Awaitable[None] | None:
        self.collect(records)
        return None

    def collect(self, records: list[Record]) -> None:
        with self.lock:
            self.sizes.append(len(records))
            for r in records:
                self.seen[(r.partition, r.key)].append(r.offset)

    def count(self) -> int:
        with self.lock:
            return sum(map(len, self.seen.values()))


class AsyncCollect(Collect):
    """`async def handle_batch`: a bulk write awaited on the event loop."""

    async def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        await asyncio.sleep(0.001)
        self.collect(records)


@pytest.mark.parametrize("handler", [Collect, AsyncCollect], ids=["threads", "async"])
def test_a_batch_handler_consumes_in_key_order_and_commits_every_partition(
    kafka_bootstrap: str, make_topic: TopicFactory, handler: type[Collect]
) -> None:
    topic = make_topic(3)
    produce(kafka_bootstrap, topic, keyed_orders(1500, 40))
    group = f"g-{uuid.uuid4().hex[:10]}"
    ends = end_offsets(kafka_bootstrap, topic, 3)
    h = handler()
    settings: Overrides = {"batch_max_records": 200}
    settings.update({"workers": 4} if handler is Collect else {"max_in_flight": 4})
    gc = member(h, kafka_bootstrap, group, [topic], **settings)
    with gc:
        wait_for(lambda: h.count() >= 1500, 60, "every record handled")
        wait_for(
            lambda: (
                [p.committed for p in sorted(gc.stats().partitions, key=lambda p: p.tp)] == ends
            ),
            30,
            "commits at the end offsets",
        )
    assert committed(kafka_bootstrap, group, topic, 3) == ends
    assert h.count() == 1500  # each once: no record handled twice without a failure
    for lane, offsets in h.seen.items():
        assert offsets == sorted(offsets), lane
    assert max(h.sizes) <= 200
    assert len(h.sizes) < 300  # batches, not record by record


def test_a_revoke_flushes_the_handlers_buffer_before_its_commit(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    """Member A keeps every record in its buffer (no periodic commit); B joining takes
    partitions from A: A's hand-off commit comes after its flush, so it covers all of A's
    records, and B runs none of them again. No commit ever passes a record only buffered."""
    topic = make_topic(2)
    produce(kafka_bootstrap, topic, keyed_orders(200, 20))
    group = f"g-{uuid.uuid4().hex[:10]}"
    ends = end_offsets(kafka_bootstrap, topic, 2)
    quiet: Overrides = {
        "commit_interval_s": 60.0,
        "commit_every_records": 1_000_000,
        "assignment_strategy": "cooperative-sticky",
    }
    a, b = Accumulator(), Accumulator()
    passed: list[str] = []

    def check(h: Accumulator) -> Callable[[CommitEvent], None]:
        """A member's commit may pass only records it flushed (from its first record of the
        partition on: below that, an earlier owner committed)."""

        def listener(event: CommitEvent) -> None:
            if event.status != "sent":
                return
            p = event.tp.partition
            with h.lock:
                mine = [o for q, o in h.handled if q == p]
                first = min(mine, default=event.offset)
                if any((p, o) not in h.durable for o in range(first, event.offset)):
                    passed.append(f"{event.tp}@{event.offset}")

        return listener

    ga = member(a, kafka_bootstrap, group, [topic], **quiet)
    ga.add_commit_listener(check(a))
    with ga:
        wait_for(lambda: len(a.handled) == 200, 60, "A buffered every record")
        assert not a.durable
        gb = member(b, kafka_bootstrap, group, [topic], **quiet)
        gb.add_commit_listener(check(b))
        with gb:
            wait_for(lambda: gb.stats().partitions, 60, "B owns a partition")
            moved = [p.tp.partition for p in gb.stats().partitions]
            assert committed(kafka_bootstrap, group, topic, 2)[moved[0]] == ends[moved[0]]
            assert {(p, o) for p, o in a.durable if p in moved} == {
                (p, o) for p, o in a.handled if p in moved
            }
            assert not b.handled  # nothing of the moved partition ran again
    assert not passed, passed


# -- exactly-once --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "handler",
    [
        # make test keeps one: the thread kind runs the same batch_calls (FakeBroker tests
        # cover both), and took 11 s here to the async one's 5 s.
        pytest.param(ProduceThenFailBatch, marks=pytest.mark.slow, id="threads"),
        pytest.param(AsyncProduceThenFailBatch, id="async"),
    ],
)
def test_batch_outputs_are_written_exactly_once_in_the_transactions(
    kafka_bootstrap: str, make_topic: TopicFactory, handler: type[ProduceThenFailBatch]
) -> None:
    """Real transactions: a read_committed reader of the output topic sees the transform of
    every input once, but of the poison record (isolated by the split, dead-lettered, its
    outputs never committed); records that failed once after producing show the output of the
    attempt that finished them only; the offsets reach the end in the same transactions."""
    src, out, dlq = make_topic(2), make_topic(2), make_topic(1)
    produce(kafka_bootstrap, src, keyed_orders(600, 13))
    group = f"eos-{uuid.uuid4().hex[:10]}"
    poison = frozenset({(0, 101)})
    h = handler(out, fail_once=lambda r: r.offset % 7 == 0, poison=poison)
    gc = member(
        h,
        kafka_bootstrap,
        group,
        [src],
        ordering="key",
        batch_max_records=200,
        transactional_id=f"{group}-a",
        failure=FailurePolicy(
            retry=RetryPolicy(max_attempts=2, backoff_initial_s=0.01),
            final="dead_letter",
            dead_letter_topic=dlq,
        ),
    )
    ends = end_offsets(kafka_bootstrap, src, 2)
    with gc:
        wait_for_committed(kafka_bootstrap, group, src, ends, timeout=60)
    dead = [
        tuple(int(h[b] or b"") for b in ("weir.dlq.partition", "weir.dlq.offset"))
        for h in (dict(r.headers) for r in consume_all(kafka_bootstrap, dlq))
    ]
    assert dead == [(0, 101)]
    assert [(0, 101)] in h.calls  # found failing alone
    wait_for_no_open_transaction(kafka_bootstrap, out, 30)
    inputs = [r for r in consume_all(kafka_bootstrap, src) if (r.partition, r.offset) not in poison]
    report = compare(inputs, consume_all(kafka_bootstrap, out))
    assert report.exactly_once, report.summary()
    assert report.outputs == 599
