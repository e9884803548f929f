"""At-least-once outputs on the in-memory FakeBroker: `ctx.produce` in a member without
`transactional_id` goes through one idempotent producer, and a record counts as finished only
once the broker confirmed its outputs. A commit never passes a record whose output is not
confirmed; a failed delivery fails the record into the failure policy, whose retry produces
the output again."""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Literal

import pytest
from confluent_kafka import KafkaError, TopicPartition
from tests.consumer_overrides import Overrides
from tests.waiting import wait_until
from typing_extensions import Unpack

from weir import (
    BatchContext,
    BatchHandler,
    Context,
    FailurePolicy,
    FlowConfig,
    GroupConsumer,
    Handler,
    Record,
    RetryPolicy,
    State,
)
from weir._engine.outputs import Outputs
from weir._engine.tasks import Assignment
from weir.config import ConsumerConfig
from weir.errors import OutputError
from weir.records import Output, Partition
from weir.testing.fake_broker import FakeBroker, FakeMessage
from weir.testing.fake_producer import FakeProducer

pytestmark = pytest.mark.timeout(60)

IN, OUT, DLQ = "orders", "out", "orders.dlq"
Ordering = Literal["key", "partition", "unordered"]

_DELAY_S = 0.03  # how long the slow broker takes to confirm an output


class Enrich(Handler):
    """One output per record: `<partition>:<offset>@<attempt>`."""

    def handle(self, record: Record, ctx: Context) -> None:
        value = f"{record.partition}:{record.offset}@{ctx.attempt}"
        ctx.produce(OUT, value, record.key)


class AsyncEnrich(Handler):
    async def handle(self, record: Record, ctx: Context) -> None:
        ctx.produce(OUT, f"{record.partition}:{record.offset}@{ctx.attempt}", record.key)


class BatchEnrich(BatchHandler):
    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        for record in records:
            value = f"{record.partition}:{record.offset}@{ctx.attempt(record)}"
            ctx.produce(record, OUT, value, record.key)


class SlowBroker(FakeBroker):
    """A broker whose output confirmations come `_DELAY_S` late: the producer serves a delivery
    report only at a poll that far after the write. At every poll it checks the invariant:
    every input below the group's committed offset has a confirmed output (`violations`)."""

    def __init__(self, delay_s: float = _DELAY_S) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.confirmed: set[tuple[int, int]] = set()
        # When each input's output was served to the member (its delivery report) after it
        # was written: (written, served), `time.monotonic()`.
        self.served: dict[tuple[int, int], tuple[float, float]] = {}
        self.violations: list[str] = []
        self._watching = threading.Lock()

    def producer_factory(self, conf: dict[str, Any]) -> FakeProducer:
        if conf.get("transactional.id") is not None or conf.get("linger.ms") == 0:
            return super().producer_factory(conf)  # a dead-letter producer
        producer = _SlowProducer(conf, broker=self, watch=self)
        with self._lock:
            self.producers.append(producer)
        return producer

    def check(self) -> None:
        with self._watching:
            for (_, p), end in self.committed_offsets("g", IN).items():
                late = [o for o in range(end) if (p, o) not in self.confirmed]
                if late:
                    self.violations.append(f"committed {IN}[{p}]@{end} before outputs of {late}")


class _SlowProducer(FakeProducer):
    def __init__(self, conf: Mapping[str, Any], *, broker: FakeBroker, watch: SlowBroker) -> None:
        super().__init__(conf, broker=broker)
        self._watch = watch
        self._late: list[tuple[float, Any, KafkaError | None, Any]] = []

    def produce(  # type: ignore[override]  # the engine's call: on_delivery, by keyword
        self, topic: str, value: Any = None, key: Any = None, **kw: Any
    ) -> None:
        report = kw.pop("on_delivery", None)

        written = time.monotonic()

        def later(err: KafkaError | None, msg: Any) -> None:
            self._late.append((written, report, err, msg))

        kw["on_delivery"] = later
        super().produce(topic, value, key, **kw)

    def _due(self, everything: bool) -> int:
        self._watch.check()
        super().poll(0)
        now = time.monotonic()
        delay = self._watch.delay_s
        due = [x for x in self._late if everything or x[0] + delay <= now]
        self._late = [x for x in self._late if not (everything or x[0] + delay <= now)]
        for written, report, err, msg in due:
            if err is None:
                p, rest = msg.value().decode().split(":")
                key = (int(p), int(rest.split("@")[0]))
                self._watch.confirmed.add(key)
                self._watch.served[key] = (written, now)
            report(err, msg)
        return len(self._late)

    def poll(self, timeout: float = -1) -> int:
        return self._due(False)

    def flush(self, timeout: float = -1) -> int:
        return self._due(True)


class GoneBroker(FakeBroker):
    """A broker that stopped answering once the member ran: its outputs are written to the
    producer's queue and never confirmed, and a flush waits its whole timeout, as the real
    client's does."""

    def __init__(self) -> None:
        super().__init__()
        self.queued = 0

    def producer_factory(self, conf: dict[str, Any]) -> FakeProducer:
        if conf.get("transactional.id") is not None or conf.get("linger.ms") == 0:
            return super().producer_factory(conf)  # a dead-letter producer
        return _GoneProducer(conf, broker=self)


class _GoneProducer(FakeProducer):
    def __init__(self, conf: Mapping[str, Any], *, broker: GoneBroker) -> None:
        super().__init__(conf, broker=broker)
        self._gone = broker

    def produce(  # type: ignore[override]  # the engine's call: on_delivery, by keyword
        self, topic: str, value: Any = None, key: Any = None, **kw: Any
    ) -> None:
        self._gone.queued += 1

    def poll(self, timeout: float = -1) -> int:
        return 0

    def flush(self, timeout: float = -1) -> int:
        time.sleep(min(max(timeout, 0.0), 60.0))
        return self._gone.queued


def broker_with(records: int, broker: FakeBroker | None = None) -> FakeBroker:
    broker = broker or FakeBroker()
    broker.create_topic(IN, partitions=2)
    broker.create_topic(OUT, partitions=3)
    broker.create_topic(DLQ, partitions=1)
    for i in range(records):
        broker.produce(IN, key=f"k{i % 5}", value=f"v{i}", partition=i % 2)
    broker.commit("g", [TopicPartition(IN, p, 0) for p in range(2)])
    return broker


def member(
    broker: FakeBroker, handler: Handler, members: list[GroupConsumer], **kw: Unpack[Overrides]
) -> GroupConsumer:
    settings: Overrides = {
        "auto_offset_reset": "earliest",
        "commit_interval_s": 0.01,
        "failure": FailurePolicy(
            retry=RetryPolicy(max_attempts=3, backoff_initial_s=0.01, jitter=0.0),
            final="dead_letter",
        ),
        **kw,
    }
    gc = GroupConsumer(
        handler,
        bootstrap_servers="fake:9092",
        group_id="g",
        topics=[IN],
        consumer_factory=broker.consumer_factory,
        producer_factory=broker.producer_factory,
        **settings,
    )
    members.append(gc)
    gc.start()
    return gc


def all_committed(broker: FakeBroker, end: int) -> bool:
    got = broker.committed_offsets("g", IN)
    return all(got.get((IN, p)) == end for p in range(2))


def committed_to(broker: FakeBroker, partition: int, end: int) -> bool:
    return broker.committed_offsets("g", IN).get((IN, partition)) == end


def text(m: FakeMessage) -> str:
    value = m.value()
    assert value is not None
    return value.decode()


def by_input(broker: FakeBroker) -> Counter[str]:
    return Counter(text(m).split("@")[0] for m in broker.messages(OUT))


def output_producers(broker: FakeBroker) -> list[FakeProducer]:
    """The member's output producer (the dead-letter producer does not wait: `linger.ms` 0)."""
    return [p for p in broker.producers if p.conf.get("linger.ms", 0) > 0]


@pytest.mark.parametrize("ordering", ["key", "unordered"])
@pytest.mark.parametrize("handler", [Enrich, AsyncEnrich, BatchEnrich])
def test_every_output_is_written_by_an_idempotent_producer_and_confirmed_before_its_commit(
    members: list[GroupConsumer], ordering: Ordering, handler: type[Handler]
) -> None:
    """The broker confirms each output 30 ms after it is written: no commit ever covers an
    input whose output is not confirmed, and every input's output is written once."""
    broker = broker_with(400, SlowBroker())
    assert isinstance(broker, SlowBroker)
    member(broker, handler(), members, ordering=ordering)
    wait_until(lambda: all_committed(broker, 200), "all committed", 20)
    broker.check()
    assert broker.violations == []
    assert by_input(broker) == Counter(f"{p}:{o}" for p in range(2) for o in range(200))
    [producer] = output_producers(broker)
    assert producer.conf["enable.idempotence"] is True
    assert producer.conf["acks"] == "all"
    assert "transactional.id" not in producer.conf


@pytest.mark.parametrize("ordering", ["key", "partition", "unordered"])
def test_a_failed_delivery_fails_its_record_into_the_retry_that_writes_it_again(
    members: list[GroupConsumer], ordering: Ordering
) -> None:
    """The broker refuses one output: its record is not finished (no commit passes it), it is
    retried, and the retry's output (`@2`) is written; every other input's output once."""
    broker = broker_with(200)
    gc = member(broker, Enrich(), members, ordering=ordering)
    wait_until(lambda: output_producers(broker), "the output producer", 10)
    [producer] = output_producers(broker)
    wait_until(lambda: all_committed(broker, 100), "all committed", 20)
    refused = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "Broker: Message size too large")
    producer.fail_deliveries(refused, count=1)
    broker.produce(IN, key="k0", value="late", partition=0)
    wait_until(lambda: broker.committed_offsets("g", IN).get((IN, 0)) == 101, "committed", 20)
    outs = sorted(text(m) for m in broker.messages(OUT) if text(m).startswith("0:100@"))
    assert outs == ["0:100@2"], outs
    assert gc.stats().retries >= 1


def test_an_output_refused_through_every_retry_is_dead_lettered(
    members: list[GroupConsumer],
) -> None:
    """A record whose output the broker refuses on every attempt goes to the final policy like a
    record whose handler raised: dead-lettered, then committed past."""
    broker = broker_with(0)
    gc = member(broker, Enrich(), members)
    broker.produce(IN, key="k0", value="first", partition=0)
    wait_until(lambda: broker.committed_offsets("g", IN).get((IN, 0)) == 1, "committed", 20)
    [producer] = output_producers(broker)
    refused = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "Broker: Message size too large")
    producer.fail_deliveries(refused, count=3)
    broker.produce(IN, key="k0", value="poison", partition=0)
    wait_until(lambda: broker.committed_offsets("g", IN).get((IN, 0)) == 2, "dead-lettered", 20)
    assert [text(m) for m in broker.messages(DLQ)] == ["poison"]
    # stats() is the owner's last published snapshot, which may predate the commit just seen.
    wait_until(lambda: gc.stats().dead_lettered == 1, "the dead letter in the stats", 5)


@pytest.mark.parametrize("refused_count", [40, 260])
@pytest.mark.parametrize("ordering", ["key", "partition", "unordered"])
def test_many_failed_deliveries_at_once_are_each_retried_and_the_budget_balances(
    members: list[GroupConsumer], ordering: Ordering, refused_count: int
) -> None:
    """A broker that refuses a run of outputs (an oversized record fails its whole batch):
    each of their records is retried and written, or (refused on all 3 attempts) dead-lettered
    and never run again; the budget comes back to zero records in flight."""
    broker = broker_with(0)
    gc = member(broker, Enrich(), members, ordering=ordering)
    broker.produce(IN, key="k0", value="first", partition=0)
    wait_until(lambda: broker.committed_offsets("g", IN).get((IN, 0)) == 1, "committed", 20)
    [producer] = output_producers(broker)
    refused = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "Broker: Message size too large")
    producer.fail_deliveries(refused, count=refused_count)
    for i in range(100):
        broker.produce(IN, key=f"k{i % 5}", value=f"v{i}", partition=i % 2)
    ends = {(IN, 0): 51, (IN, 1): 50}
    wait_until(lambda: broker.committed_offsets("g", IN) == ends, "all committed", 20)
    lettered = {text(m) for m in broker.messages(DLQ)}
    wait_until(lambda: gc.stats().dead_lettered == len(lettered), "the stats", 5)
    assert (len(lettered) > 0) == (refused_count > 200)
    wait_until(lambda: gc.stats().in_flight == 0, "the budget balances", 5)
    assert gc.stats().in_flight == 0  # not below either
    # Every input was written or dead-lettered, and a dead-lettered one never ran again.
    written = set(by_input(broker))
    assert len(written) + len(lettered) == sum(ends.values())
    for m in broker.messages(IN):
        if text(m) in lettered:
            assert f"{m.partition()}:{m.offset()}" not in written


def test_shutdown_waits_for_outputs_in_flight_and_commits_their_records(
    members: list[GroupConsumer],
) -> None:
    """The broker confirms each output 300 ms late: a member stopped with outputs in flight
    flushes them within shutdown_timeout_s and its final commit covers their records, and no
    commit before passed one."""
    broker = SlowBroker(delay_s=0.3)
    broker_with(100, broker)
    gc = member(broker, Enrich(), members)
    wait_until(lambda: len(broker.messages(OUT)) == 100, "every output written", 10)
    gc.stop()
    gc.join(10)
    broker.check()
    assert broker.violations == []
    assert broker.committed_offsets("g", IN) == {(IN, 0): 50, (IN, 1): 50}


def test_a_revoke_waits_for_outputs_in_flight_and_the_next_owner_starts_after_them(
    members: list[GroupConsumer],
) -> None:
    """A second member joins while the first has outputs in flight (confirmed 300 ms late):
    the revoke's drain waits for them, commits their records in the hand-off, and no commit
    passed an unconfirmed output; every input's output is written."""
    broker = SlowBroker(delay_s=0.3)
    broker_with(200, broker)
    member(broker, Enrich(), members)
    wait_until(lambda: len(broker.messages(OUT)) >= 50, "outputs in flight", 10)
    member(broker, Enrich(), members)
    wait_until(lambda: all_committed(broker, 100), "all committed", 20)
    broker.check()
    assert broker.violations == []
    assert set(by_input(broker)) == {f"{p}:{o}" for p in range(2) for o in range(100)}


def test_records_waiting_for_their_outputs_leave_the_budget_but_stay_uncommitted(
    members: list[GroupConsumer],
) -> None:
    """The broker confirms each output 1 s late: the records whose handlers returned leave the
    in-flight budget at once (it no longer limits the workers while the broker answers), and
    no commit passes them until their outputs are confirmed."""
    broker = SlowBroker(delay_s=1.0)
    broker_with(100, broker)
    gc = member(broker, Enrich(), members)
    wait_until(lambda: len(broker.messages(OUT)) == 100, "every output written", 10)
    wait_until(lambda: gc.stats().in_flight == 0, "the waiting records out of the budget", 0.5)
    assert broker.committed_offsets("g", IN) == {(IN, 0): 0, (IN, 1): 0}
    wait_until(lambda: all_committed(broker, 50), "all committed", 10)
    broker.check()
    assert broker.violations == []
    assert gc.stats().in_flight == 0


def test_past_the_allowance_records_wait_in_the_budget_and_a_stalled_broker_stops_fetching(
    members: list[GroupConsumer],
) -> None:
    """At most 16 x `capacity_records` records wait for their outputs outside the budget; the
    next ones wait inside it, which fills and pauses fetching: a broker that does not confirm
    holds about 17 budgets of records, not the whole topic."""
    broker = SlowBroker(delay_s=60.0)  # stalled, until the end of the test
    broker_with(1000, broker)
    flow = FlowConfig(capacity_records=20, pause_records=16, resume_records=8)
    gc = member(broker, Enrich(), members, flow=flow)
    wait_until(lambda: len(broker.messages(OUT)) >= 320, "16 budgets of outputs written", 10)
    time.sleep(0.5)  # what a member without the bound would go on writing meanwhile
    written = len(broker.messages(OUT))
    assert written <= 340 + 2  # 16 budgets outside, one inside, a fetched batch's headroom
    time.sleep(0.5)
    assert len(broker.messages(OUT)) == written  # fetching stopped
    assert gc.stats().in_flight >= 16
    broker.delay_s = 0.0
    wait_until(lambda: all_committed(broker, 500), "all committed", 30)
    broker.check()
    assert broker.violations == []
    wait_until(lambda: gc.stats().in_flight == 0, "the budget balances", 5)


def test_an_idle_owner_settles_a_confirmed_output_without_sleeping_its_poll_timeout(
    members: list[GroupConsumer],
) -> None:
    """With nothing else to do the owner waits in its poll: while an output waits for the
    broker it wakes soon enough to serve the confirmation (and settle its record), not after
    `poll_timeout_s`."""
    broker = SlowBroker(delay_s=0.02)
    broker_with(0, broker)
    member(broker, Enrich(), members, poll_timeout_s=1.0)
    broker.produce(IN, key="k0", value="first", partition=0)
    wait_until(lambda: broker.committed_offsets("g", IN).get((IN, 0)) == 1, "joined", 10)
    for i in range(1, 4):
        broker.produce(IN, key="k0", value=f"v{i}", partition=0)
        wait_until(functools.partial(committed_to, broker, 0, i + 1), "committed", 10)
        written, served = broker.served[(0, i)]  # confirmed 20 ms after it was written
        assert served - written < 0.5


@pytest.mark.parametrize("call", ["poll", "produce"])
def test_a_fatal_error_of_the_output_producer_fails_its_records_and_replaces_it(
    members: list[GroupConsumer], call: str
) -> None:
    """The output producer fails for good (raised by a poll while outputs wait, or by a
    produce): the records it held are retried, their outputs written by a new producer, and
    everything is committed."""
    broker = SlowBroker(delay_s=0.2)
    broker_with(0, broker)
    member(broker, Enrich(), members)
    broker.produce(IN, key="k0", value="first", partition=0)
    wait_until(lambda: committed_to(broker, 0, 1), "committed", 10)
    [first] = output_producers(broker)
    fatal = KafkaError(KafkaError._FATAL, "Local: Fatal error", fatal=True)
    if call == "produce":
        first.fail_next(call, fatal)
    for i in range(10):
        broker.produce(IN, key=f"k{i % 5}", value=f"v{i}", partition=i % 2)
    if call == "poll":  # while the outputs wait for their confirmations
        wait_until(lambda: len(broker.messages(OUT)) > 1, "outputs written", 10)
        first.fail_next(call, fatal)
    wait_until(lambda: committed_to(broker, 0, 6) and committed_to(broker, 1, 5), "all", 20)
    broker.check()
    assert broker.violations == []
    assert len(output_producers(broker)) == 2
    retried = [text(m) for m in broker.messages(OUT) if "@2" in text(m)]
    assert retried, "the held records ran again"


def test_past_the_byte_allowance_large_records_wait_in_the_budget(
    members: list[GroupConsumer],
) -> None:
    """The allowance counts bytes as the budget does: of 100 records of 100 KB waiting for a
    broker that does not confirm, those past `capacity_bytes` (2 MiB: 20 records) wait inside
    the budget, which then holds the rest (and keeps fetching paused)."""
    broker = SlowBroker(delay_s=60.0)  # stalled, until the end of the test
    broker_with(0, broker)
    big = "x" * 100_000
    for i in range(100):
        broker.produce(IN, key=f"k{i % 5}", value=big, partition=i % 2)
    mib = 1024 * 1024
    flow = FlowConfig(capacity_bytes=2 * mib, pause_bytes=mib, resume_bytes=mib // 2)
    gc = member(broker, Enrich(), members, flow=flow)
    wait_until(lambda: len(broker.messages(OUT)) == 100, "every output written", 10)
    wait_until(lambda: gc.stats().in_flight < 100, "some out of the budget", 2)
    assert gc.stats().in_flight >= 100 - 20  # at most 20 records' bytes outside it
    broker.delay_s = 0.0
    wait_until(lambda: all_committed(broker, 50), "all committed", 30)
    broker.check()
    assert broker.violations == []
    wait_until(lambda: gc.stats().in_flight == 0, "the budget balances", 5)


def test_reports_for_outputs_forgotten_at_a_revoke_are_ignored() -> None:
    """A revoked partition's outputs in flight are forgotten: the broker's later answers for
    them neither settle their records nor disturb the accounting of the others."""
    broker = broker_with(0)
    cfg = ConsumerConfig(bootstrap_servers="fake:9092", group_id="g", topics=[IN])
    outputs = Outputs(cfg, broker.producer_factory)
    kept, revoked = Assignment(Partition(IN, 0), 1), Assignment(Partition(IN, 1), 1)
    done: list[tuple[str, list[OutputError | None], bool]] = []

    def confirmed(name: str) -> Callable[[list[OutputError | None], bool], None]:
        return lambda errors, free: done.append((name, list(errors), free))

    for a, name in ((revoked, "revoked"), (kept, "kept")):
        outputs.send(
            a,
            [[Output(OUT, b"v", b"k", None, None)], [Output(OUT, b"w", b"k", None, None)]],
            20,
            confirmed(name),
        )
    assert outputs.pending == 2 and outputs.waiting_outside == 4
    outputs.forget([revoked])
    outputs.poll()  # the broker answers for both groups
    assert done == [("kept", [None, None], True)]
    assert outputs.pending == 0 and outputs.waiting_outside == 0
    outputs.close()


class Keeps(Handler):
    """Keeps every context it is given (as a handler that hands it to a thread or a callback
    that runs on after the call would)."""

    def __init__(self) -> None:
        self.kept: list[Context] = []

    def handle(self, record: Record, ctx: Context) -> None:
        ctx.produce(OUT, f"{record.partition}:{record.offset}@{ctx.attempt}", record.key)
        self.kept.append(ctx)


class AsyncKeeps(Keeps):
    async def handle(self, record: Record, ctx: Context) -> None:  # type: ignore[override]
        Keeps.handle(self, record, ctx)


class BatchKeeps(BatchHandler):
    def __init__(self) -> None:
        self.kept: list[tuple[BatchContext, Record]] = []

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        for record in records:
            value = f"{record.partition}:{record.offset}@{ctx.attempt(record)}"
            ctx.produce(record, OUT, value, record.key)
        self.kept.append((ctx, records[0]))


@pytest.mark.parametrize("handler", [Keeps, AsyncKeeps])
def test_a_context_used_after_its_call_returned_refuses_to_produce(
    members: list[GroupConsumer], handler: type[Keeps]
) -> None:
    """An output produced through a context after its call returned was accepted and never
    written: its record was settled when the call returned. It raises in the caller's thread."""
    broker = broker_with(20)
    h = handler()
    gc = member(broker, h, members)
    wait_until(lambda: all_committed(broker, 10), "all committed", 10)
    assert len(h.kept) == 20
    for ctx in h.kept:
        with pytest.raises(RuntimeError, match=r"ctx.produce after the handler's call returned"):
            ctx.produce(OUT, "late")
    assert by_input(broker) == Counter(f"{p}:{o}" for p in range(2) for o in range(10))
    assert gc.state == State.RUNNING


def test_a_batch_context_used_after_its_call_returned_refuses_marks_and_outputs(
    members: list[GroupConsumer],
) -> None:
    """The same for a batch call's context: `produce`, `done` and `fail` after the call
    returned were dropped unseen."""
    broker = broker_with(20)
    h = BatchKeeps()
    gc = member(broker, h, members, batch_max_records=4)
    wait_until(lambda: all_committed(broker, 10), "all committed", 10)
    assert h.kept
    for ctx, record in h.kept:
        with pytest.raises(RuntimeError, match=r"ctx.produce after the handler's call returned"):
            ctx.produce(record, OUT, "late")
        with pytest.raises(RuntimeError, match=r"ctx.done after the handler's call returned"):
            ctx.done(record)
        with pytest.raises(RuntimeError, match=r"ctx.fail after the handler's call returned"):
            ctx.fail(record, ValueError("late"))
    assert by_input(broker) == Counter(f"{p}:{o}" for p in range(2) for o in range(10))
    assert gc.state == State.RUNNING


def test_a_second_stop_cuts_the_wait_for_outputs_in_flight_short(
    members: list[GroupConsumer],
) -> None:
    """At shutdown the member waits for its outputs in flight, within shutdown_timeout_s, so
    that the final commit may pass their records. With the broker gone that wait was one
    flush of the whole budget, where the second stop (a second Ctrl-C, which hurries the
    shutdown) could not reach it: it waited the budget out. Nothing past the unconfirmed
    records is committed either way."""
    broker = GoneBroker()
    broker_with(10, broker)
    gc = member(broker, Enrich(), members, shutdown_timeout_s=30.0)
    wait_until(lambda: broker.queued >= 10, "every output written, none confirmed")
    gc.stop()
    time.sleep(0.5)  # the shutdown waits for the outputs now
    hurried = time.monotonic()
    gc.stop()
    gc.join(10)
    assert time.monotonic() - hurried < 1.5
    assert broker.committed_offsets("g", IN) == {(IN, 0): 0, (IN, 1): 0}
