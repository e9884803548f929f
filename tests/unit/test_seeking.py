"""`GroupConsumer.seek` / `seek_to_beginning` / `seek_to_end` on the fake (`weir._engine.seeking`):
the partition's work of the old position is fenced (a late completion is never marked or
committed), its queued records dropped, the seek position committed at once (lower than before
too), and records from there read again; bad arguments raise in the caller's thread."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from confluent_kafka import KafkaError
from tests.fake_members import SETTINGS, started
from tests.waiting import wait_until

from weir import (
    BatchContext,
    BatchHandler,
    Context,
    FailurePolicy,
    GroupConsumer,
    Handler,
    Partition,
    Record,
    RetryPolicy,
    SeekError,
    State,
)
from weir.offsetmap import encode_finished
from weir.records import as_handler
from weir.testing import FakeBroker, FakeConsumer

pytestmark = pytest.mark.timeout(60)

TOPIC = "t"
P0 = (TOPIC, 0)
WAIT = 10.0


class Gate(Handler):
    """Records every offset it runs; a run of an offset in `blocks` waits for its event (once
    per event: the n-th run of an offset waits for `blocks[offset][n]`, if there is one)."""

    def __init__(self, blocks: dict[int, list[threading.Event]] | None = None) -> None:
        self.lock = threading.Lock()
        self.runs: list[int] = []
        self.blocks = blocks or {}
        self.started: dict[int, int] = {}

    def _start(self, offset: int) -> threading.Event | None:
        with self.lock:
            n = self.started.get(offset, 0)
            self.started[offset] = n + 1
        events = self.blocks.get(offset, [])
        return events[n] if n < len(events) else None

    def _done(self, offset: int) -> None:
        with self.lock:
            self.runs.append(offset)

    def handle(self, record: Record, ctx: Context) -> None:
        ev = self._start(record.offset)
        if ev is not None:
            assert ev.wait(WAIT)
        self._done(record.offset)

    def ran(self, offset: int) -> int:
        with self.lock:
            return self.runs.count(offset)


class AsyncGate(Gate):
    async def handle(self, record: Record, ctx: Context) -> None:  # type: ignore[override]
        ev = self._start(record.offset)
        if ev is not None:
            while not ev.is_set():
                await asyncio.sleep(0.005)
        self._done(record.offset)


class BatchGate(BatchHandler, Gate):
    def handle_batch(self, records: Sequence[Record], ctx: BatchContext) -> None:
        for r in records:
            ev = self._start(r.offset)
            if ev is not None:
                assert ev.wait(WAIT)
        for r in records:
            self._done(r.offset)


def run(
    members: list[GroupConsumer], fake: FakeConsumer, handler: Handler, **settings: Any
) -> GroupConsumer:
    return started(members, fake, handler, wait_s=WAIT, **settings)


def last_committed(fake: FakeConsumer) -> int:
    commits = fake.commits_for(P0)
    return commits[-1][0] if commits else -1


def test_a_seek_back_reads_again_and_commits_the_lower_offset(
    members: list[GroupConsumer],
) -> None:
    """Everything up to 10 is committed; a seek to 3 commits 3 at once, runs 3..9 again, and
    commits 10 again once they are done. Before `Committer.restart`, nothing below the offset
    already sent was ever sent again: the group stayed at 3 (the seek's own commit)."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(10))
    fake.script_assign([P0])
    handler = Gate()
    gc = run(members, fake, handler, ordering="partition")
    wait_until(lambda: last_committed(fake) == 10, "everything committed")
    assert gc.seek(P0, 3).result(WAIT) == 3
    wait_until(lambda: handler.ran(9) == 2, "3..9 run again")
    assert sorted(handler.runs) == sorted([*range(10), *range(3, 10)])
    wait_until(lambda: last_committed(fake) == 10, "10 committed again after the seek")
    after = [off for off, _ in fake.commits_for(P0)]
    assert 3 in after[after.index(10) :], "the seek position committed"


@pytest.mark.parametrize("ordering", ["key", "partition", "unordered"])
@pytest.mark.parametrize("kind", [Gate, AsyncGate, BatchGate])
def test_work_of_the_old_position_is_never_committed_after_a_seek(
    members: list[GroupConsumer], ordering: str, kind: type[Gate]
) -> None:
    """Record 5 blocks; the member seeks back to 2 and the seek's commit waits for its answer
    meanwhile; then 5's old run finishes. Nothing it did may count: no commit passes 2 until
    the new run of 2 (blocked too) has finished. Without the partition's reset, the old
    progress reached 10 once 5 finished, and 10 was committed right after the seek's 2."""
    first5, second2 = threading.Event(), threading.Event()
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(10), key=lambda off: b"k%d" % (off % 3))
    fake.script_assign([P0])
    handler = kind({5: [first5], 2: [threading.Event(), second2]})
    handler.blocks[2][0].set()  # the first run of 2 goes through
    extra: dict[str, Any] = {"ordering": ordering}
    if kind is BatchGate:
        extra["batch_max_records"] = 1
    gc = run(members, fake, handler, **extra)
    wait_until(lambda: last_committed(fake) == 5, "everything below 5 committed")
    wait_until(
        lambda: all(
            handler.ran(o) for o in range(10) if o != 5 and (ordering == "unordered" or o < 5)
        ),
        "the rest run",
    )
    fake.hold_commit_results = True
    seen = len(fake.commit_log())
    assert gc.seek(P0, 2).result(WAIT) == 2
    wait_until(lambda: any(c.offsets.get(P0) == 2 for c in fake.commit_log()[seen:]), "seek commit")
    first5.set()  # the old run of 5 finishes now (an async one was cancelled already)
    if kind is not AsyncGate:
        wait_until(lambda: handler.ran(5) >= 1, "the old run of 5 finished")
    threading.Event().wait(0.1)  # its completion reaches the owner
    held = [c.seq for c in fake.commit_log()[seen:]]
    fake.hold_commit_results = False
    fake.deliver_commit_results([(seq, None) for seq in held])
    wait_until(lambda: handler.started.get(2, 0) == 2, "the new run of 2 started")
    wait_until(lambda: handler.ran(9) >= 2 if ordering == "unordered" else True, "the rest")
    threading.Event().wait(0.3)
    sent = [c.offsets[P0] for c in fake.commit_log()[seen:] if P0 in c.offsets]
    # From the seek's commit on: a commit turn may have sent 5 again before the seek was served.
    after = sent[sent.index(2) :]
    assert after and max(after) == 2, f"committed past the seek point: {sent}"
    second2.set()
    wait_until(lambda: last_committed(fake) == 10, "everything committed after the seek")
    assert gc.state is State.RUNNING


def test_queued_records_of_the_old_position_are_dropped(members: list[GroupConsumer]) -> None:
    """Partition order: 3 blocks with 4..9 queued behind it; a seek forward to 7 drops them:
    4, 5, 6 never run, and no commit lands between 3 and 7."""
    block = threading.Event()
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(10))
    fake.script_assign([P0])
    handler = Gate({3: [block]})
    gc = run(members, fake, handler, ordering="partition")
    wait_until(lambda: handler.started.get(3), "3 running")
    assert gc.seek(Partition(*P0), 7).result(WAIT) == 7
    block.set()
    wait_until(lambda: last_committed(fake) == 10, "committed to the end")
    assert sorted(handler.runs) == [0, 1, 2, 3, 7, 8, 9]
    assert not {4, 5, 6} & {off for off, _ in fake.commits_for(P0)}


def test_seek_to_a_time_the_beginning_and_the_end(members: list[GroupConsumer]) -> None:
    base = datetime(2026, 1, 1, tzinfo=timezone.utc)
    ms = int(base.timestamp() * 1000)
    fake = FakeConsumer()
    for i in range(10):
        fake.produce(TOPIC, 0, b"v", offset=i, timestamp=ms + i * 1000)
    fake.script_assign([P0])
    handler = Gate()
    gc = run(members, fake, handler, ordering="partition")
    wait_until(lambda: last_committed(fake) == 10, "everything committed")
    assert gc.seek(P0, base + timedelta(seconds=6, milliseconds=500)).result(WAIT) == 7
    wait_until(lambda: handler.ran(9) == 2, "7..9 again")
    assert gc.seek(P0, base + timedelta(days=1)).result(WAIT) == 10, "past the end: the end"
    assert gc.seek_to_beginning(P0).result(WAIT) == 0
    wait_until(lambda: handler.ran(9) == 3, "everything again")
    assert gc.seek(P0, 10_000).result(WAIT) == 10, "an offset past the end: the end"
    assert gc.seek_to_end(P0).result(WAIT) == 10
    fake.produce(TOPIC, 0, b"v", offset=10, timestamp=ms + 10_000)
    wait_until(lambda: handler.ran(10) == 1, "a new record after the end")
    assert handler.ran(6) == 2 and handler.ran(0) == 2


def test_a_partition_not_assigned_is_a_seek_error_and_the_member_runs_on(
    members: list[GroupConsumer],
) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3))
    fake.script_assign([P0])
    handler = Gate()
    gc = run(members, fake, handler)
    wait_until(lambda: last_committed(fake) == 3, "committed")
    with pytest.raises(SeekError, match=r"t\[1\] is not assigned to this member") as info:
        gc.seek((TOPIC, 1), 0).result(WAIT)
    assert info.value.not_assigned
    fake.produce_many(TOPIC, 0, range(3, 5))
    wait_until(lambda: last_committed(fake) == 5, "still committing")
    assert gc.state is State.RUNNING


BAD: list[tuple[Any, Any, type[Exception], str]] = [
    ("t", 0, TypeError, "partition must be a weir.Partition"),
    (P0, -1, ValueError, "offset must not be negative, got -1"),
    (P0, "3", TypeError, "offset must be an int or a timezone-aware datetime, got '3' (str)"),
    (P0, True, TypeError, "got True (bool)"),
    (P0, 3.0, TypeError, "got 3.0 (float)"),
    (P0, datetime(2026, 1, 1), ValueError, "timezone-aware datetime, got the naive"),
]


@pytest.mark.parametrize(("partition", "offset", "error", "said"), BAD)
def test_a_bad_seek_raises_in_the_caller_and_the_member_runs_on(
    members: list[GroupConsumer], partition: Any, offset: Any, error: type[Exception], said: str
) -> None:
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3))
    fake.script_assign([P0])
    gc = run(members, fake, Gate())
    wait_until(lambda: last_committed(fake) == 3, "committed")
    with pytest.raises(error) as info:
        gc.seek(partition, offset)
    assert said in str(info.value)
    with pytest.raises(TypeError, match="partition must be"):
        gc.seek_to_end("t")  # type: ignore[arg-type]
    assert gc.seek(P0, 1).result(WAIT) == 1
    assert gc.state is State.RUNNING


def test_a_seek_on_a_member_not_running_raises_at_once() -> None:
    fake = FakeConsumer()
    gc = GroupConsumer(Gate(), consumer_factory=fake.factory, **SETTINGS)
    with pytest.raises(RuntimeError, match="not running"):
        gc.seek(P0, 0)
    fake.script_assign([P0])
    gc.start()
    gc.stop()
    gc.join(WAIT)
    with pytest.raises(RuntimeError, match="not running"):
        gc.seek_to_beginning(P0)


def test_a_seek_forgets_the_offset_map_of_the_old_position(members: list[GroupConsumer]) -> None:
    """The group committed 2 with a map saying 4 and 5 were finished: they are skipped at the
    start. A seek back to 0 reads everything again, 4 and 5 too: before the map was forgotten,
    it still marked them finished and they never ran."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(10))
    text = encode_finished(2, b"\x00\x00\x01\x01", 4096).text
    fake._broker._offsets.setdefault("", {})[P0] = (2, text)
    fake.script_assign([P0])
    handler = Gate()
    gc = run(members, fake, handler, ordering="partition")
    wait_until(lambda: last_committed(fake) == 10, "committed to the end")
    assert sorted(handler.runs) == [2, 3, 6, 7, 8, 9], "the map's records skipped at the start"
    assert gc.seek(P0, 0).result(WAIT) == 0
    wait_until(lambda: handler.ran(9) == 2, "read again from 0")
    assert sorted(handler.runs) == sorted([2, 3, 6, 7, 8, 9, *range(10)])


class Enrich(Handler):
    """Writes each record's value + b"!" to "enriched"; the first run of 12 waits for `gate`."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started12 = threading.Event()
        self.runs12 = 0
        self.handled = 0

    def handle(self, record: Record, ctx: Context) -> None:
        self.handled += 1
        if record.offset == 12:
            self.runs12 += 1
            if self.runs12 == 1:
                self.started12.set()
                assert self.gate.wait(WAIT)
        ctx.produce("enriched", (record.value or b"") + b"!", record.key)


def test_an_exactly_once_seek_commits_the_open_transaction_first_and_drops_old_outputs() -> None:
    """Exactly-once: 0..11 done, 12 blocks, 13..19 queued; a seek to 15 commits the open
    transaction (the outputs of 0..11 with offset 12), then reads 15..19. The old run of 12
    finishes after the seek: its output is never written, and 13, 14 never run. The seek back
    to 0 then writes every output once more: a seek back is a deliberate replay."""
    broker = FakeBroker()
    broker.create_topic("orders", partitions=1)
    broker.create_topic("enriched", partitions=1)
    for i in range(20):
        broker.produce("orders", key="k", value=f"o{i}")
    handler = Enrich()
    gc = GroupConsumer(
        handler,
        consumer_factory=broker.consumer_factory,
        producer_factory=broker.producer_factory,
        bootstrap_servers="fake:9092",
        group_id="billing",
        topics=["orders"],
        ordering="partition",
        transactional_id="enricher-1",
        transaction_interval_s=0.2,
    )
    with gc:
        assert handler.started12.wait(WAIT)
        assert gc.seek(("orders", 0), 15).result(WAIT) == 15
        committed = broker.committed_offsets("billing")
        assert committed[("orders", 0)] == 15, "the seek position, after the open transaction"
        outputs = [m.value() for m in broker.messages("enriched")]
        assert outputs == [f"o{i}!".encode() for i in range(12)], "committed before the seek"
        handler.gate.set()
        wait_until(lambda: len(broker.messages("enriched")) == 17, "15..19 written", timeout=WAIT)
        assert gc.seek_to_beginning(("orders", 0)).result(WAIT) == 0
        wait_until(
            lambda: len(broker.messages("enriched")) == 37, "all 20 written again", timeout=WAIT
        )
        wait_until(lambda: broker.committed_offsets("billing")[("orders", 0)] == 20, "committed")
    outputs = [m.value() for m in broker.messages("enriched")]
    once = [f"o{i}!".encode() for i in [*range(12), *range(15, 20)]]
    assert outputs == once + [f"o{i}!".encode() for i in range(20)]


def test_a_batch_being_gathered_is_dropped_by_a_seek(members: list[GroupConsumer]) -> None:
    """A batch handler gathers 0..4 and waits for more (batch_max_wait_s); a seek to 3 drops
    the gathered records: only 3 and 4 ever run."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(5))
    fake.script_assign([P0])
    handler = BatchGate()
    gc = run(
        members, fake, handler, ordering="partition", batch_max_records=100, batch_max_wait_s=1.0
    )
    wait_until(lambda: gc.stats().partitions and gc.stats().partitions[0].in_flight, "gathered")
    assert handler.runs == []
    assert gc.seek(P0, 3).result(WAIT) == 3
    wait_until(lambda: last_committed(fake) == 5, "committed to the end", timeout=WAIT)
    assert sorted(handler.runs) == [3, 4]


def test_a_late_commit_result_from_before_the_seek_does_not_confirm_it(
    members: list[GroupConsumer],
) -> None:
    """10 is committed and its answer held; the seek to 3 commits 3. The answer for 10 comes
    first: it says nothing about 3, so the partition still waits, and runs 3 again only once
    3 is confirmed. Before, a result above what was sent since the seek counted: 10 >= 3
    confirmed the seek's commit, and the partition was sought before the broker had it."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(10))
    fake.given_committed({P0: 0})
    fake.script_assign([P0])
    fake.hold_commit_results = True
    handler = Gate()
    gc = run(members, fake, handler, ordering="partition")
    wait_until(lambda: any(c.offsets.get(P0) == 10 for c in fake.commit_log()), "10 sent")
    (old,) = [c.seq for c in fake.commit_log() if c.offsets.get(P0) == 10]
    assert gc.seek(P0, 3).result(WAIT) == 3
    (sought,) = [c.seq for c in fake.commit_log() if c.offsets.get(P0) == 3]
    fake.deliver_commit_results([(old, None)])
    threading.Event().wait(0.3)
    assert handler.ran(3) == 1, "sought before the seek's commit was confirmed"
    fake.hold_commit_results = False
    fake.deliver_commit_results([(sought, None)])
    wait_until(lambda: handler.ran(9) == 2, "3..9 again")


def test_a_seek_past_a_blocked_record_unblocks_the_partition(
    members: list[GroupConsumer],
) -> None:
    """Record 1 fails for good and blocks the partition (final="block"); a seek to 2 drops it
    with the rest of the old position: the partition is fetched and committed again."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3))
    fake.script_assign([P0])

    def handle(record: Record) -> None:
        if record.offset == 1:
            raise RuntimeError("poison")

    gc = run(
        members,
        fake,
        as_handler(handle),
        ordering="partition",
        failure=FailurePolicy(retry=RetryPolicy(max_attempts=1), final="block"),
    )
    wait_until(lambda: gc.stats().blocked == (Partition(*P0),), "partition 0 blocked")
    assert gc.seek(P0, 2).result(WAIT) == 2
    fake.produce_many(TOPIC, 0, range(3, 6))
    wait_until(lambda: last_committed(fake) == 6, "committed past the blocked record")
    wait_until(lambda: gc.stats().blocked == (), "no longer blocked")


def test_an_exactly_once_seek_whose_transaction_aborts_is_not_done() -> None:
    """The commit a seek makes first aborts (the coordinator refuses the offsets: a new
    generation). The seek raises SeekError and does not happen: the partition starts over from
    its committed offset as after any abort, and every output is written once."""
    broker = FakeBroker()
    broker.create_topic("orders", partitions=1)
    broker.create_topic("enriched", partitions=1)
    for i in range(10):
        broker.produce("orders", key="k", value=f"o{i}")
    handler = Enrich()
    handler.gate.set()
    gc = GroupConsumer(
        handler,
        consumer_factory=broker.consumer_factory,
        producer_factory=broker.producer_factory,
        bootstrap_servers="fake:9092",
        group_id="billing",
        topics=["orders"],
        ordering="partition",
        transactional_id="enricher-1",
        transaction_interval_s=60.0,
        transaction_max_records=10,
    )
    with gc:
        wait_until(lambda: broker.committed_offsets("billing").get(("orders", 0)) == 10, "10")
        (producer,) = broker.producers
        broker.produce("orders", key="k", value="o10")
        wait_until(lambda: handler.handled >= 11, "o10 handled")
        time.sleep(0.1)  # settled: its output is in the open transaction
        abortable = KafkaError(KafkaError.ILLEGAL_GENERATION, "generation", txn_requires_abort=True)
        producer.fail_next("send_offsets_to_transaction", abortable)
        with pytest.raises(SeekError, match="aborted"):
            gc.seek(("orders", 0), 3).result(WAIT)
        wait_until(lambda: handler.handled >= 12, "o10 handled again")
        assert gc.seek(("orders", 0), 11).result(WAIT) == 11
    assert broker.committed_offsets("billing")[("orders", 0)] == 11
    outputs = [m.value() for m in broker.messages("enriched")]
    assert outputs == [f"o{i}!".encode() for i in range(11)]
