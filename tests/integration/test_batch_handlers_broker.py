"""Batch handlers on a real broker: the consume-commit path with `handle_batch`."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable

import pytest

from tests.accumulators import Accumulator, AsyncBatchAccumulator, ProducingBatchAccumulator
from tests.audit.exactly_once import (
    AsyncProduceThenFailBatch,
    ProduceThenFailBatch,
    compare,
    wait_for_no_open_transaction,
)
from tests.consumer_overrides import Overrides
from tests.integration.kafka_helpers import committed, end_offsets, keyed_orders, member, produce
from tests.integration.kafka_helpers import wait_until as wait_for
from tests.unit.test_batch_handlers import bulk_write
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


@pytest.mark.parametrize(
    "kind", [Accumulator, AsyncBatchAccumulator], ids=["handle", "async handle_batch"]
)
def test_a_revoke_flushes_the_handlers_buffer_before_its_commit(
    kafka_bootstrap: str, make_topic: TopicFactory, kind: type[Accumulator]
) -> None:
    """Member A keeps every record in its buffer (no periodic commit); B joining takes
    partitions from A: A's hand-off commit comes after its flush, so it covers all of A's
    records, and B runs none of them again. No commit ever passes a record only buffered.
    The same with an `async def handle_batch` member, whose buffer its calls fill on the
    event loop."""
    topic = make_topic(2)
    produce(kafka_bootstrap, topic, keyed_orders(200, 20))
    group = f"g-{uuid.uuid4().hex[:10]}"
    ends = end_offsets(kafka_bootstrap, topic, 2)
    quiet: Overrides = {
        "commit_interval_s": 60.0,
        "commit_every_records": 1_000_000,
        "assignment_strategy": "cooperative-sticky",
    }
    a, b = kind(), kind()
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


# -- async def handle_batch: a lost partition, a poison record ----------------------------------


@pytest.mark.slow
def test_a_lost_partitions_buffer_is_dropped_never_flushed_or_committed(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    """An `async def handle_batch` member keeps its records in a buffer of its own. The owner
    thread is held (a commit listener that blocks) past `max_poll_interval_s` while a slow call
    still runs on the loop: the call returns during the stall, its record buffered under the
    partition's old token, and the partition is lost. That record is never flushed (the flush
    hook is told the old token is no longer owned, and drops it) and no commit passes it
    before it is handled again in the partition's new assignment and flushed there."""
    topic = make_topic(1)
    produce(kafka_bootstrap, topic, keyed_orders(10, 5), partition=0)
    group = f"g-{uuid.uuid4().hex[:10]}"
    h = AsyncBatchAccumulator(slow=frozenset({11}), delay=1.5)
    block = threading.Event()
    passed: list[str] = []

    def listener(event: CommitEvent) -> None:
        if event.status != "sent":
            return
        with h.lock:
            if any((0, o) not in h.durable for o in range(event.offset)):
                passed.append(f"{event.tp}@{event.offset}")
        if block.is_set():
            block.clear()
            time.sleep(3.0)  # past max.poll.interval.ms: the owner does not poll meanwhile

    gc = member(
        h,
        kafka_bootstrap,
        group,
        [topic],
        ordering="unordered",
        batch_max_records=1,  # offset 10 and the slow 11 in calls of their own
        batch_max_wait_s=0.0,
        max_in_flight=4,
        session_timeout_s=1.0,
        heartbeat_interval_s=0.3,
        max_poll_interval_s=1.0,
        revoke_timeout_s=0.4,
        commit_interval_s=0.1,
    )
    gc.add_commit_listener(listener)
    with gc:
        wait_for(lambda: len(h.durable) == 10, 30, "the first ten flushed")
        block.set()
        # 10 returns at once: its flush and commit come while 11 still sleeps on the loop, and
        # that commit stalls the owner; 11 returns during the stall, into the buffer.
        produce(kafka_bootstrap, topic, keyed_orders(2, 2), partition=0)
        wait_for(lambda: (0, 11) in h.dropped, 30, "offset 11 dropped by a flush")
        wait_for(lambda: (0, 11) in h.durable, 30, "offset 11 handled again and flushed")
        wait_for(lambda: committed(kafka_bootstrap, group, topic, 1) == [12], 30, "committed")
    assert h.handled.count((0, 11)) == 2  # its first run was buffered, dropped, and run again
    assert not passed, passed


def test_a_poison_record_in_an_async_batch_of_500_is_dead_lettered_alone(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    """An `async def handle_batch` bulk write that fails while its batch holds offset 317 of
    500: the batch is retried, then split until 317 fails alone; it alone is dead-lettered,
    every other record is written once, and the partition is committed to its end."""
    topic, dlq = make_topic(1), make_topic(1)
    produce(kafka_bootstrap, topic, keyed_orders(500, 20), partition=0)
    group = f"g-{uuid.uuid4().hex[:10]}"
    h = bulk_write("async", poison={317})
    gc = member(
        h,
        kafka_bootstrap,
        group,
        [topic],
        ordering="key",
        batch_max_records=500,
        batch_max_wait_s=0.5,
        failure=FailurePolicy(
            retry=RetryPolicy(max_attempts=2, backoff_initial_s=0.01, jitter=0.0),
            final="dead_letter",
            dead_letter_topic=dlq,
        ),
    )
    with gc:
        wait_for_committed(kafka_bootstrap, group, topic, [500], timeout=60)
        wait_for(lambda: gc.stats().dead_lettered == 1, 5, "the stats publish the dead letter")
    dead = [dict(r.headers)["weir.dlq.offset"] for r in consume_all(kafka_bootstrap, dlq)]
    assert dead == [b"317"]
    assert sorted(h.written) == [o for o in range(500) if o != 317]  # each once
    assert [317] in h.calls  # found failing alone
    assert len(h.calls) < 40, [len(c) for c in h.calls]  # about two calls per halving


def test_a_flush_hook_in_a_transactional_member_writes_each_output_once(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    """Real transactions with an `async def handle_batch` that keeps its records in a buffer
    and produces each one's transform: the flush runs before each transaction commits, so the
    group's offsets reach the end while the member runs, and a read_committed reader sees every
    output once; the first flush fails, and the records it was to cover run again without their
    first outputs ever being committed."""
    src, out = make_topic(2), make_topic(2)
    produce(kafka_bootstrap, src, keyed_orders(400, 13))
    group = f"eos-{uuid.uuid4().hex[:10]}"
    h = ProducingBatchAccumulator(out, fail_flushes=1)
    gc = member(
        h,
        kafka_bootstrap,
        group,
        [src],
        ordering="key",
        batch_max_records=100,
        transactional_id=f"{group}-a",
        callback_errors="log",
    )
    ends = end_offsets(kafka_bootstrap, src, 2)
    with gc:
        wait_for_committed(kafka_bootstrap, group, src, ends, timeout=60)
    assert h.flushes > 1 and len(h.handled) > 400  # the failed flush's records ran again
    assert h.durable == {(r.partition, r.offset) for r in consume_all(kafka_bootstrap, src)}
    wait_for_no_open_transaction(kafka_bootstrap, out, 30)
    report = compare(consume_all(kafka_bootstrap, src), consume_all(kafka_bootstrap, out))
    assert report.exactly_once, report.summary()
    assert report.outputs == 400
