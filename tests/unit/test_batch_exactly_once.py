"""Exactly-once with batch handlers, on the in-memory FakeBroker: a batch's `ctx.produce`
outputs join the transaction record by record as its records are marked finished, and the
offsets commit in that transaction. A read_committed reader of the output topic sees each
input's output once, from the attempt that finished it; the outputs of failed, held and
dead-lettered records never."""

from __future__ import annotations

from collections import Counter
from typing import Literal

import pytest
from confluent_kafka import KafkaError, TopicPartition
from tests.accumulators import Accumulator, ProducingBatchAccumulator
from tests.audit.exactly_once import AsyncProduceThenFailBatch, ProduceThenFailBatch
from tests.consumer_overrides import Overrides
from tests.unit.test_batch_handlers import poisoned_member
from tests.waiting import wait_until
from typing_extensions import Unpack

from weir import (
    BatchContext,
    BatchHandler,
    Context,
    GroupConsumer,
    Record,
)
from weir.testing.fake_broker import FakeBroker, FakeMessage
from weir.testing.fake_producer import FakeProducer

pytestmark = pytest.mark.timeout(60)

IN, OUT, DLQ = "orders", "out", "orders.dlq"
Kind = Literal["threads", "async"]
Key = tuple[int, int]  # (partition, offset)


def attempted(r: Record, ctx: BatchContext) -> tuple[bytes | None, bytes]:
    """The output of a record: `<partition>:<offset>@<attempt>`."""
    return r.key, f"{r.partition}:{r.offset}@{ctx.attempt(r)}".encode()


@pytest.fixture(params=["threads", "async"])
def kind(request: pytest.FixtureRequest) -> Kind:
    k: Kind = request.param
    return k


def enrich(
    kind: Kind, fail_once: frozenset[Key] = frozenset(), poison: frozenset[Key] = frozenset()
) -> ProduceThenFailBatch:
    """One output per record (`attempted`); `fail_once` records are marked failed after
    producing on their first attempt; a call that holds a `poison` record raises."""
    return (ProduceThenFailBatch if kind == "threads" else AsyncProduceThenFailBatch)(
        OUT,
        value=attempted,
        fail_once=lambda r: (r.partition, r.offset) in fail_once,
        poison=poison,
    )


def broker_with(records: int, partitions: int = 2) -> FakeBroker:
    broker = FakeBroker()
    broker.create_topic(IN, partitions=partitions)
    broker.create_topic(OUT, partitions=3)
    broker.create_topic(DLQ, partitions=1)
    for i in range(records):
        # Five keys per partition: in key mode a failed record holds its key's later records.
        broker.produce(IN, key=f"k{i % 5}", value=f"v{i}", partition=i % partitions)
    # Committed start offsets: the member commits no start position of its own (what it does,
    # outside any transaction, for a partition without one: docs/rebalances.md), so every
    # commit the tests see is a transaction's.
    broker.commit("g", [TopicPartition(IN, p, 0) for p in range(partitions)])
    return broker


def member(
    broker: FakeBroker, handler: BatchHandler, members: list[GroupConsumer], **kw: Unpack[Overrides]
) -> GroupConsumer:
    """A transactional member of group `g` on `orders` (dead letters to `orders.dlq`; 2
    attempts of a batch, then the split)."""
    settings: Overrides = {
        "transactional_id": "tx-1",
        "transaction_interval_s": 0.05,
        "batch_max_records": 100,
        "batch_max_wait_s": 0.05,
        **kw,
    }
    return poisoned_member(broker, handler, members, **settings)


def transactional(broker: FakeBroker) -> list[FakeProducer]:
    return [p for p in broker.producers if p.transactional_id is not None]


def all_committed(broker: FakeBroker, ends: dict[int, int]) -> bool:
    got = broker.committed_offsets("g", IN)
    return all(got.get((IN, p)) == end for p, end in ends.items())


def text(m: FakeMessage) -> str:
    value = m.value()
    assert value is not None
    return value.decode()


def outputs(broker: FakeBroker) -> Counter[str]:
    """The output topic as a read_committed reader sees it."""
    return Counter(map(text, broker.messages(OUT)))


def expected(broker: FakeBroker) -> Counter[str]:
    """One output per input, of its first attempt."""
    return Counter(f"{m.partition()}:{m.offset()}@1" for m in broker.messages(IN))


@pytest.mark.parametrize("ordering", ["key", "unordered"])
def test_batch_outputs_commit_once_each_with_their_offsets_in_the_transaction(
    members: list[GroupConsumer], kind: Kind, ordering: Literal["key", "unordered"]
) -> None:
    """Every record's output is committed once, and the member's offsets go only through
    the transactions (the consumer never commits on its own): each committed transaction holds
    outputs and the offsets of their inputs together."""
    broker = broker_with(600)
    member(broker, enrich(kind), members, ordering=ordering)
    wait_until(lambda: all_committed(broker, {0: 300, 1: 300}), "all committed", 20)
    assert outputs(broker) == expected(broker)
    consumer_calls = [name for c in broker.consumers for name, _ in c.calls]
    assert "commit" not in consumer_calls, consumer_calls
    txns = [t for p in transactional(broker) for t in p.transactions if t.state == "committed"]
    with_offsets = [t for t in txns if t.offsets.get("g")]
    assert with_offsets, "no transaction carried the group's offsets"
    last = {tp: off for t in with_offsets for tp, (off, _) in t.offsets["g"].items()}
    assert last == {(IN, 0): 300, (IN, 1): 300}


@pytest.mark.parametrize("ordering", ["key", "partition", "unordered"])
def test_outputs_of_failed_and_held_records_are_never_committed(
    members: list[GroupConsumer], kind: Kind, ordering: Literal["key", "partition", "unordered"]
) -> None:
    """Records marked failed after they produced write nothing: the retry that finishes them
    writes its own outputs (`@2`), once. In key and partition mode the records held behind
    them in the same call (finished by the call, not counted) write nothing either, and run
    again. A poison record is isolated by the split and dead-lettered: its outputs, produced in
    every call that held it, are never committed, and the records that were in those calls
    with it write theirs once."""
    broker = broker_with(400)
    fail_once = frozenset({(1, 17), (0, 42), (1, 101)})
    poison = frozenset({(0, 150)})
    h = enrich(kind, fail_once=fail_once, poison=poison)
    gc = member(broker, h, members, ordering=ordering)
    wait_until(lambda: all_committed(broker, {0: 200, 1: 200}), "all committed", 30)
    assert sorted(map(text, broker.messages(DLQ))) == ["v300"]  # P0's offset 150
    written = outputs(broker)
    by_input = Counter(out.split("@")[0] for out in written.elements())
    inputs = {(m.partition(), m.offset()) for m in broker.messages(IN)}
    assert by_input == Counter(f"{p}:{o}" for p, o in inputs - poison)  # each once, but poison's
    # What the failed attempt produced (`@1`) is not among them: the retry's is.
    assert not {f"{p}:{o}@1" for p, o in fail_once} & set(written)
    assert [(0, 150)] in h.calls  # the split found it alone
    wait_until(lambda: gc.stats().dead_lettered == 1, "the stats publish the dead letter", 5)


def test_an_aborted_transaction_runs_its_batches_again_and_writes_their_outputs_once(
    members: list[GroupConsumer], kind: Kind
) -> None:
    """The group coordinator refuses the offsets of one boundary (an abortable error): that
    transaction's outputs are aborted, its records run again from the committed offsets, and
    the output topic ends with each output once. Offsets committed outside the transaction
    would survive the abort and lose those outputs."""
    broker = broker_with(400)
    h = enrich(kind)
    gc = member(broker, h, members, ordering="key")
    wait_until(lambda: transactional(broker), "the transactional producer", 10)
    producer = transactional(broker)[0]
    abortable = KafkaError(KafkaError.ILLEGAL_GENERATION, "generation", txn_requires_abort=True)
    producer.fail_next("send_offsets_to_transaction", abortable)
    for i in range(400, 800):
        broker.produce(IN, key=f"k{i % 5}", value=f"v{i}", partition=i % 2)
    wait_until(lambda: all_committed(broker, {0: 400, 1: 400}), "all committed", 30)
    assert any(t.state == "aborted" for t in producer.transactions)
    assert outputs(broker) == expected(broker)
    assert gc.stats().processed >= 800


def test_batch_produce_refuses_a_record_of_another_batch_and_a_member_without_a_transaction() -> (
    None
):
    ctx = BatchContext(
        [Record(IN, 0, 5, None, b"x")],
        {},
        outputs=True,
    )
    with pytest.raises(ValueError, match="not a record of this batch: produce for only"):
        ctx.produce(Record(IN, 0, 5, None, b"x"), OUT, b"y")  # equal, not the one given
    with pytest.raises(TypeError, match=r"takes the record .* first.*ctx.produce\(record, topic"):
        ctx.produce(OUT, b"y")  # type: ignore[arg-type]  # a Handler's ctx.produce(topic, value)
    with pytest.raises(TypeError, match="topic must be a non-empty str"):
        ctx.produce(ctx._records[0], "", b"y")
    plain = BatchContext([Record(IN, 0, 5, None, b"x")], {})
    with pytest.raises(RuntimeError, match="needs a context built by a GroupConsumer"):
        plain.produce(plain._records[0], OUT, b"y")


# -- a flush hook in a transactional member ------------------------------------------------------


class Producing(Accumulator):
    """An `Accumulator` (a buffer of its own, written by `on_flush`; the first `fail_flushes`
    flushes raise) whose records each produce an output `<partition>:<offset>`."""

    def handle(self, record: Record, ctx: Context) -> None:
        ctx.produce(OUT, f"{record.partition}:{record.offset}", record.key)
        super().handle(record, ctx)


@pytest.mark.parametrize("batch", [False, True], ids=["handle", "async handle_batch"])
def test_a_flush_hook_runs_before_each_transaction_commits_and_a_failed_one_writes_nothing(
    members: list[GroupConsumer], batch: bool
) -> None:
    """With transactional_id and on_flush, a record's outputs are written into the transaction
    when the flush that covers it has returned, before that transaction commits: the output
    topic and the committed offsets reach the end while the member runs (not only at its
    shutdown), and no output of a record is committed before its flush wrote it. The first two
    flushes fail: their records count for nothing, run again, and their outputs are committed
    once, from the run whose flush succeeded."""
    broker = broker_with(400)
    h = ProducingBatchAccumulator(OUT, fail_flushes=2) if batch else Producing(fail_flushes=2)
    settings: Overrides = {
        "transactional_id": "tx-1",
        "transaction_interval_s": 0.05,
        "ordering": "key",
        "callback_errors": "log",
    }
    if batch:
        settings.update({"batch_max_records": 100, "batch_max_wait_s": 0.05})
    gc = GroupConsumer(
        h,
        bootstrap_servers="fake:9092",
        group_id="g",
        topics=[IN],
        consumer_factory=broker.consumer_factory,
        producer_factory=broker.producer_factory,
        **settings,
    )
    members.append(gc)
    gc.start()
    wait_until(lambda: all_committed(broker, {0: 200, 1: 200}), "all committed", 20)
    # Each output's input, `<partition>:<offset>` (the batch handler's outputs are the
    # transform, `<partition>:<offset>:<value reversed>`).
    written = Counter(":".join(out.split(":")[:2]) for out in outputs(broker).elements())
    assert gc.state.name == "RUNNING"
    with h.lock:
        durable = set(h.durable)
        assert h.flushes > 2
    assert written == Counter(f"{p}:{o}" for p, o in durable)  # each once, and only if flushed
    assert durable == {(m.partition(), m.offset()) for m in broker.messages(IN)}
    assert len(h.handled) > 400  # the failed flushes' records ran again
