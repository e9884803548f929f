"""Exactly-once (transactional_id) on a real broker: outputs and offsets in one transaction.

Each test runs input → transform → output (`tests.audit.exactly_once`) and reads the output
with read_committed: every input exactly once, each output the transform of its input.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from tests.audit.cluster import REPO, Members, handled_by
from tests.audit.exactly_once import Transform, check_outputs, compare
from tests.consumer_overrides import GroupProtocol, Ordering, Overrides
from tests.integration.kafka_helpers import member, produce, wait_until
from weir import (
    CommitEvent,
    Context,
    FailurePolicy,
    Partition,
    Record,
    RetryPolicy,
    TransactionError,
)
from weir.offsetmap import FinishedMap, decode_finished
from weir.testing.pytest_plugin import TopicFactory, consume_all, wait_for_committed

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

PROTOCOLS: list[GroupProtocol] = ["classic", "consumer"]


def _group() -> str:
    return f"eos-{uuid.uuid4().hex[:10]}"


def _inputs(n: int, keys: int = 13) -> list[tuple[bytes, bytes]]:
    return [(b"k%d" % (i % keys), b"value-%d" % i) for i in range(n)]


class Calls:
    """How many times the handler was called per (partition, offset)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count: Counter[tuple[int, int]] = Counter()

    def __call__(self, record: Record, ctx: Context) -> None:
        with self.lock:
            self.count[(record.partition, record.offset)] += 1


@pytest.mark.parametrize("ordering", ["key", "unordered"])
def test_transform_writes_every_input_exactly_once(
    kafka_bootstrap: str, make_topic: TopicFactory, ordering: Ordering
) -> None:
    src, out = make_topic(4), make_topic(4)
    produce(kafka_bootstrap, src, _inputs(2000))
    group = _group()
    gc = member(
        Transform(out),
        kafka_bootstrap,
        group,
        [src],
        ordering=ordering,
        workers=8,
        transactional_id=f"{group}-a",
    )
    with gc:
        wait_for_committed(kafka_bootstrap, group, src, "end", timeout=60)
    report = check_outputs(kafka_bootstrap, src, out)
    assert report.exactly_once, report.summary()
    assert report.outputs == 2000


def _committed_with_metadata(
    bootstrap: str, group: str, topic: str, partition: int = 0
) -> tuple[int, str | None]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (r,) = c.committed([TopicPartition(topic, partition)], timeout=15)
        return r.offset, r.metadata
    finally:
        c.close()


def _finished_above(bootstrap: str, group: str, topic: str, offset: int) -> list[int]:
    """The offsets the committed offset map lists as finished, if `offset` is committed."""
    committed, metadata = _committed_with_metadata(bootstrap, group, topic)
    found = decode_finished(metadata, offset) if committed == offset else None
    if not isinstance(found, FinishedMap):
        return []
    return [o for o in range(offset, found.end) if found.is_finished(o)]


def _finished_above_or_none(
    bootstrap: str, group: str, topic: str, offset: int
) -> list[int] | None:
    """`_finished_above`, or None while the group's coordinator does not answer."""
    try:
        return _finished_above(bootstrap, group, topic, offset)
    except KafkaException:
        return None


def test_offset_map_travels_in_the_transaction_and_the_next_owner_skips_it(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    """send_offsets_to_transaction carries the offset map: the broker stores it with the
    transaction's offsets, and the next owner does not handle those records again."""
    src, out = make_topic(1), make_topic(1)
    produce(kafka_bootstrap, src, _inputs(50), partition=0)
    group = _group()
    release = threading.Event()
    first = Calls()

    def block_ten(record: Record, ctx: Context) -> None:
        first(record, ctx)
        if record.offset == 10:
            release.wait(30)
            raise RuntimeError("cancelled by the test")  # never finishes in this member

    gc = member(
        Transform(out, before=block_ten),
        kafka_bootstrap,
        group,
        [src],
        ordering="unordered",
        workers=4,
        transactional_id=f"{group}-a",
        shutdown_timeout_s=1.0,
    )
    try:
        with gc:
            # The map of every record above 10: a transaction may carry only those finished by
            # its boundary (a loaded run stopped at a first one listing 12..48), and a group's
            # coordinator may not answer yet (NOT_COORDINATOR on a fresh broker): not yet.
            wait_until(
                lambda: (
                    _finished_above_or_none(kafka_bootstrap, group, src, 10) == list(range(11, 50))
                ),
                30,
                "a transaction to commit offset 10 with a map of 11..49",
            )
    finally:
        release.set()
    assert _finished_above(kafka_bootstrap, group, src, 10) == list(range(11, 50))
    assert first.count[(0, 10)] == 1 and len(first.count) == 50

    second = Calls()
    gc = member(
        Transform(out, before=second),
        kafka_bootstrap,
        group,
        [src],
        ordering="unordered",
        workers=4,
        transactional_id=f"{group}-b",
    )
    with gc:
        wait_for_committed(kafka_bootstrap, group, src, [50], timeout=30)
    assert dict(second.count) == {(0, 10): 1}, "only the record the map left out runs again"
    report = check_outputs(kafka_bootstrap, src, out)
    assert report.exactly_once, report.summary()


# An output topic whose broker refuses records over 64 KiB: one output of `_TOO_LARGE` bytes
# makes its transaction fail abortably (MSG_SIZE_TOO_LARGE), while the client (1 MB batches)
# accepts it.
_SMALL_RECORDS = {"max.message.bytes": "65536"}
_TOO_LARGE = b"x" * 200_000


@pytest.mark.parametrize("ordering", ["key", "unordered"])
def test_an_aborted_transaction_replays_its_partitions_from_the_committed_offsets(
    kafka_bootstrap: str, make_topic: TopicFactory, ordering: Ordering
) -> None:
    src, out = make_topic(4), make_topic(4, config=_SMALL_RECORDS)
    produce(kafka_bootstrap, src, _inputs(800))
    group = _group()
    calls = Calls()
    poisoned = threading.Event()

    def poison_once(record: Record, ctx: Context) -> None:
        calls(record, ctx)
        if record.partition == 2 and record.offset >= 100 and not poisoned.is_set():
            poisoned.set()
            ctx.produce(out, _TOO_LARGE, record.key)  # the transaction cannot commit

    gc = member(
        Transform(out, sleep_s=0.001, before=poison_once),
        kafka_bootstrap,
        group,
        [src],
        ordering=ordering,
        workers=8,
        transactional_id=f"{group}-a",
    )
    with gc:
        wait_for_committed(kafka_bootstrap, group, src, "end", timeout=60)
    assert poisoned.is_set()
    report = check_outputs(kafka_bootstrap, src, out)
    assert report.exactly_once, report.summary()
    # The abort really happened: records finished in the aborted transaction ran again, and
    # its outputs were written and then aborted (a read_uncommitted reader sees them).
    again = [k for k, n in calls.count.items() if n > 1]
    assert again, "no record was handled again after the abort"
    uncommitted = consume_all(kafka_bootstrap, out, isolation_level="read_uncommitted")
    assert len(uncommitted) > report.outputs


def test_a_rewind_after_an_abort_skips_what_the_committed_offset_map_lists(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    """The committed offset map survives an abort: the partition replays from the committed
    offset, and the records the committed map lists (their outputs are committed) are not
    handled again."""
    src, out = make_topic(1), make_topic(1, config=_SMALL_RECORDS)
    produce(kafka_bootstrap, src, _inputs(100), partition=0)
    group = _group()
    calls = Calls()

    def poison_ten(record: Record, ctx: Context) -> None:
        calls(record, ctx)
        if record.offset == 10 and calls.count[(0, 10)] == 1:
            # Wait until the others are committed above offset 10 (in the map), then fail
            # this transaction.
            wait_until(
                lambda: _finished_above(kafka_bootstrap, group, src, 10) == list(range(11, 100)),
                30,
                "offsets 11-99 committed in the map above 10",
            )
            ctx.produce(out, _TOO_LARGE, record.key)

    gc = member(
        Transform(out, before=poison_ten),
        kafka_bootstrap,
        group,
        [src],
        ordering="unordered",
        workers=4,
        transactional_id=f"{group}-a",
    )
    with gc:
        wait_for_committed(kafka_bootstrap, group, src, [100], timeout=60)
    report = check_outputs(kafka_bootstrap, src, out)
    assert report.exactly_once, report.summary()
    # Offset 10 ran again after the abort (and once more if librdkafka aborted the next
    # transaction too, to bump its epoch after the failed produce); 11-99 ran once.
    assert calls.count[(0, 10)] >= 2
    assert [k for k, n in calls.count.items() if n > 1] == [(0, 10)]


class ProduceThenFail(Transform):
    """Produces its output, then fails the first `failures` attempts of every record whose
    offset is a multiple of 7; `always` fails every attempt of those offsets."""

    def __init__(self, output: str, failures: int, calls: Calls) -> None:
        super().__init__(output)
        self.failures = failures
        self.calls = calls

    def handle(self, record: Record, ctx: Context) -> None:
        self.calls(record, ctx)
        super().handle(record, ctx)
        if record.offset % 7 == 0 and ctx.attempt <= self.failures:
            raise RuntimeError(f"attempt {ctx.attempt} fails after producing")


@pytest.mark.parametrize("ordering", ["key", "unordered"])
def test_a_retried_record_writes_its_outputs_once_at_its_final_success(
    kafka_bootstrap: str, make_topic: TopicFactory, ordering: Ordering
) -> None:
    src, out = make_topic(2), make_topic(2)
    produce(kafka_bootstrap, src, _inputs(300))
    group = _group()
    calls = Calls()
    gc = member(
        ProduceThenFail(out, failures=2, calls=calls),
        kafka_bootstrap,
        group,
        [src],
        ordering=ordering,
        workers=4,
        transactional_id=f"{group}-a",
        failure=FailurePolicy(retry=RetryPolicy(max_attempts=3, backoff_initial_s=0.01)),
    )
    with gc:
        wait_for_committed(kafka_bootstrap, group, src, "end", timeout=60)
    assert {n for (_, o), n in calls.count.items() if o % 7 == 0} == {3}
    report = check_outputs(kafka_bootstrap, src, out)
    assert report.exactly_once, report.summary()


def test_a_dead_lettered_record_writes_no_output(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    src, out, dlq = make_topic(1), make_topic(1), make_topic(1)
    produce(kafka_bootstrap, src, _inputs(50), partition=0)
    group = _group()
    calls = Calls()
    gc = member(
        ProduceThenFail(out, failures=1_000_000, calls=calls),
        kafka_bootstrap,
        group,
        [src],
        ordering="key",
        workers=4,
        transactional_id=f"{group}-a",
        failure=FailurePolicy(
            retry=RetryPolicy(max_attempts=2, backoff_initial_s=0.01),
            final="dead_letter",
            dead_letter_topic=dlq,
        ),
    )
    with gc:
        wait_for_committed(kafka_bootstrap, group, src, [50], timeout=60)
    dead = {
        int(v)
        for r in consume_all(kafka_bootstrap, dlq)
        for k, v in r.headers
        if k == "weir.dlq.offset" and v is not None
    }
    assert dead == set(range(0, 50, 7))
    inputs = [r for r in consume_all(kafka_bootstrap, src) if r.offset not in dead]
    report = compare(inputs, consume_all(kafka_bootstrap, out))
    assert report.exactly_once, report.summary()


@pytest.mark.parametrize(
    ("protocol", "interval"),
    # With a long interval the old member learns of the fence from its producer (a failed
    # produce, served by poll) before any boundary.
    [("classic", 0.1), ("consumer", 0.1), ("classic", 30.0)],
)
def test_a_member_started_with_the_same_transactional_id_fences_the_old_one(
    kafka_bootstrap: str, make_topic: TopicFactory, protocol: GroupProtocol, interval: float
) -> None:
    src, out = make_topic(4), make_topic(4)
    produce(kafka_bootstrap, src, _inputs(1000))
    group = _group()
    first = Calls()
    shut_down = threading.Event()

    class Fenced(Transform):
        def on_shutdown(self) -> None:
            shut_down.set()

    old = member(
        Fenced(out, sleep_s=0.002, before=first),
        kafka_bootstrap,
        group,
        [src],
        workers=4,
        transactional_id=f"{group}-same",
        transaction_interval_s=interval,
        group_protocol=protocol,
    ).start()
    try:
        wait_until(lambda: sum(first.count.values()) >= 100, 30, "the old member to work")
        new = member(
            Transform(out),
            kafka_bootstrap,
            group,
            [src],
            workers=4,
            transactional_id=f"{group}-same",
            group_protocol=protocol,
        )
        with new:
            with pytest.raises(TransactionError, match="fenced"):
                old.join(30)
            # Its shutdown ran to the end: the fenced producer's flush raised the fence again,
            # which skipped the rest of the shutdown (the hook, the workers' and the watermark
            # refresher's stop: their threads and client were left running for good).
            assert shut_down.is_set(), "the fenced member's shutdown stopped half-way"
            wait_for_committed(kafka_bootstrap, group, src, "end", timeout=60)
    finally:
        old.stop()
    wait_until(
        lambda: not [t for t in threading.enumerate() if t.name.startswith("weir-")],
        10,
        "the stopped members' threads to end",
    )
    report = check_outputs(kafka_bootstrap, src, out)
    assert report.exactly_once, report.summary()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_idle_member_learns_of_its_fence_at_the_rebalance_the_new_one_causes(
    kafka_bootstrap: str,
    make_topic: TopicFactory,
    protocol: GroupProtocol,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The old member has handled every record and committed: it writes nothing more, so no
    write can tell it that the new member's producer fenced it. The new member fences before it
    joins, and the hand-off its join starts goes to the transaction coordinator even with
    nothing new in it: the old member stops with the fence there. (It stayed in the group,
    idle, holding partitions, until records came for them.) The fence is logged once, as
    transaction_fatal: the revoke callback it stopped adds a warning, not a second traceback."""
    src, out = make_topic(4), make_topic(4)
    produce(kafka_bootstrap, src, _inputs(200))
    group = _group()
    first = Calls()
    old = member(
        Transform(out, before=first),
        kafka_bootstrap,
        group,
        [src],
        transactional_id=f"{group}-same",
        group_protocol=protocol,
    ).start()
    try:
        wait_until(lambda: sum(first.count.values()) >= 200, 30, "the old member to finish")
        wait_for_committed(kafka_bootstrap, group, src, "end", timeout=30)
        new = member(
            Transform(out),
            kafka_bootstrap,
            group,
            [src],
            transactional_id=f"{group}-same",
            group_protocol=protocol,
        )
        with new, pytest.raises(TransactionError, match="fenced"):
            old.join(30)
    finally:
        old.stop()
    report = check_outputs(kafka_bootstrap, src, out)
    assert report.exactly_once, report.summary()
    events = [(r.msg["event"], r) for r in caplog.records if isinstance(r.msg, dict)]
    assert [r.levelname for e, r in events if e == "transaction_fatal"] == ["ERROR"]
    assert "rebalance_callback_failed" not in {e for e, _ in events}
    assert [r.levelname for e, r in events if e == "rebalance_callback_fenced"] == ["WARNING"]


def _visible(bootstrap: str, topic: str, seconds: float = 1.0) -> int:
    """How many records of `topic` a read_committed reader gets within `seconds`."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"probe-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + seconds
        n = 0
        while time.monotonic() < deadline:
            m = c.poll(0.1)
            if m is not None and m.error() is None:
                n += 1
        return n
    finally:
        c.close()


class Assigned(Transform):
    """`Transform` that counts its calls and signals its first assignment."""

    def __init__(self, output: str) -> None:
        self.calls = Calls()
        super().__init__(output, before=self.calls)
        self.assigned = threading.Event()

    def on_assigned(self, partitions: Sequence[Partition]) -> None:
        if partitions:
            self.assigned.set()


@pytest.mark.parametrize(
    ("protocol", "strategy"),
    [("classic", "range"), ("classic", "cooperative-sticky"), ("consumer", None)],
)
def test_a_revoke_commits_the_open_transaction_before_the_partitions_go(
    kafka_bootstrap: str,
    make_topic: TopicFactory,
    protocol: GroupProtocol,
    strategy: Literal["range", "cooperative-sticky"] | None,
) -> None:
    """No boundary falls due (60 s interval): the outputs become visible with the revoke, before
    the new owner gets the partitions, and the new owner runs nothing again."""
    src, out = make_topic(4), make_topic(4)
    produce(kafka_bootstrap, src, _inputs(400))
    group = _group()
    first = Calls()
    a = member(
        Transform(out, before=first),
        kafka_bootstrap,
        group,
        [src],
        transactional_id=f"{group}-a",
        transaction_interval_s=60.0,
        group_protocol=protocol,
        assignment_strategy=strategy,
    )
    with a:
        wait_until(lambda: len(first.count) == 400, 30, "the first member to handle everything")
        assert _visible(kafka_bootstrap, out) == 0, "outputs visible before any commit"
        joiner = Assigned(out)
        b = member(
            joiner,
            kafka_bootstrap,
            group,
            [src],
            transactional_id=f"{group}-b",
            group_protocol=protocol,
            assignment_strategy=strategy,
        )
        with b:
            assert joiner.assigned.wait(30), "the second member got no partition"
            report = check_outputs(kafka_bootstrap, src, out, timeout=10)
            assert report.exactly_once, report.summary()
            assert not joiner.calls.count, "the new owner ran records again"


@pytest.mark.parametrize("protocol", ["cooperative", "consumer"])
def test_lost_partitions_abort_the_open_transaction(
    kafka_bootstrap: str, make_topic: TopicFactory, tmp_path: Path, protocol: str
) -> None:
    """A member frozen past its session loses its partitions with a transaction open: the new
    owner replays them, and the frozen member, once it runs again, aborts (none of its outputs
    ever become visible)."""
    src, out = make_topic(2), make_topic(2)
    produce(kafka_bootstrap, src, _inputs(200))
    group = _group()
    members = Members(tmp_path, kafka_bootstrap, group, src, protocol)
    txn = ["--output", out, "--slow-ms", "1", "--transaction-timeout", "60"]
    try:
        members.start("a", *txn, "--transaction-interval", "60")
        members.wait_for(lambda e: handled_by(e, "a") >= 200, 30, "a to handle everything")
        assert _visible(kafka_bootstrap, out) == 0, "outputs visible before any commit"
        members.procs["a"].send_signal(signal.SIGSTOP)
        try:
            members.start("b", *txn)
            members.wait_for(lambda e: handled_by(e, "b") >= 200, 60, "b to replay everything")
        finally:
            members.procs["a"].send_signal(signal.SIGCONT)
        members.wait_for(lambda e: any(ev["ev"] == "lost" for ev in e), 30, "a to see the loss")
        wait_for_committed(kafka_bootstrap, group, src, "end", timeout=60)
        for name in list(members.procs):
            assert members.stop(name) == 0
    finally:
        members.close()
    report = check_outputs(kafka_bootstrap, src, out)
    assert report.exactly_once, report.summary()
    log = (tmp_path / "a.log").read_text()
    lost, aborted = log.find("partitions_lost"), log.find("transaction_aborted")
    assert 0 <= lost < aborted, "a did not abort its transaction when it lost its partitions"


# --- UNSTABLE_OFFSET_COMMIT: a killed member's transaction holds the group's offsets ---------

_COMMITTED, _PENDING = 300, 500
# How long the killed member's transaction stays open: long enough for the second member to
# join and be assigned the partitions (after the killed member's session: 2 s classic, the
# broker's 6 s with KIP-848) and for the third to join while the offsets are still pending.
_TXN_TIMEOUT_MS: dict[GroupProtocol, int] = {"classic": 8_000, "consumer": 12_000}


class PlainMember(threading.Thread):
    """A plain confluent-kafka group member: the first offset it reads of each partition."""

    def __init__(self, bootstrap: str, group: str, topic: str, protocol: GroupProtocol) -> None:
        super().__init__(daemon=True)
        conf: dict[str, object] = (
            {"group.protocol": "consumer"}
            if protocol == "consumer"
            else {"partition.assignment.strategy": "range", "session.timeout.ms": 6000}
        )
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                **conf,
            }
        )
        self.topic = topic
        self.assigned = threading.Event()
        self.first: dict[int, int] = {}
        self.halt = threading.Event()

    def _on_assign(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        if tps:
            self.assigned.set()

    def run(self) -> None:
        self.consumer.subscribe([self.topic], on_assign=self._on_assign)
        try:
            while not self.halt.is_set():
                m = self.consumer.poll(0.1)
                if m is None or m.error() is not None:
                    continue
                p, o = m.partition(), m.offset()
                if p is not None and o is not None:
                    self.first.setdefault(p, o)
        finally:
            self.consumer.close()


def _kill_in_transaction(
    bootstrap: str, group: str, src: str, out: str, protocol: GroupProtocol
) -> None:
    """A member commits offset 300 on both partitions, sends 500 in a second transaction and
    is SIGKILLed before committing it (tests.audit.pending_transaction)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.audit.pending_transaction",
            "--bootstrap",
            bootstrap,
            "--group",
            group,
            "--topic",
            src,
            "--output",
            out,
            "--partitions",
            "2",
            "--protocol",
            protocol,
            "--committed",
            str(_COMMITTED),
            "--pending",
            str(_PENDING),
            "--transaction-timeout-ms",
            str(_TXN_TIMEOUT_MS[protocol]),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        timeout=90,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert proc.stdout.strip() == b"pending"


# librdkafka's own hazard, with plain consumers (what weir's start path avoids is tested
# above): in make integration, not in make test's eight minutes.
@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_librdkafka_starts_at_auto_offset_reset_when_the_assignment_changes_during_unstable(
    kafka_bootstrap: str, make_topic: TopicFactory, protocol: GroupProtocol
) -> None:
    """The hazard, with plain confluent-kafka consumers: B is assigned the partitions while the
    killed member's transaction holds their offsets; C joins while B's committed-offset fetch
    waits, so B's assignment changes; librdkafka then starts a partition at auto.offset.reset
    (offset 0) instead of the committed offset (300, once the transaction is aborted)."""
    src, out = make_topic(2), make_topic(1)
    produce(kafka_bootstrap, src, _inputs(_PENDING + 100, keys=1), partition=0)
    produce(kafka_bootstrap, src, _inputs(_PENDING + 100, keys=1), partition=1)
    group = _group()
    _kill_in_transaction(kafka_bootstrap, group, src, out, protocol)
    b = PlainMember(kafka_bootstrap, group, src, protocol)
    c = PlainMember(kafka_bootstrap, group, src, protocol)
    b.start()
    try:
        assert b.assigned.wait(30)
        time.sleep(0.5)
        c.start()
        wait_until(lambda: len(b.first) + len(c.first) >= 2, 60, "both partitions read")
    finally:
        b.halt.set()
        c.halt.set()
        b.join(15)
        c.join(15)
    firsts = sorted([*b.first.values(), *c.first.values()])
    assert firsts[0] == 0, f"the hazard did not show: first offsets {b.first} {c.first}"


class FirstOffsets(Transform):
    """`Transform` that remembers every offset it ran, per partition."""

    def __init__(self, output: str, ran: dict[int, list[int]], lock: threading.Lock) -> None:
        super().__init__(output)
        self.ran = ran
        self.lock = lock

    def handle(self, record: Record, ctx: Context) -> None:
        with self.lock:
            self.ran.setdefault(record.partition, []).append(record.offset)
        super().handle(record, ctx)


@pytest.mark.parametrize(
    "protocol",
    ["classic", pytest.param("consumer", marks=pytest.mark.slow)],  # 20 s each
)
def test_a_transactional_member_starts_exactly_at_the_committed_offset_after_unstable(
    kafka_bootstrap: str, make_topic: TopicFactory, protocol: GroupProtocol
) -> None:
    """The same scenario with weir's transactional members: each partition starts at 300, the
    offset committed before the killed member's open transaction (aborted at its timeout), and
    every input from there is written exactly once."""
    src, out = make_topic(2), make_topic(2)
    produce(kafka_bootstrap, src, _inputs(_PENDING + 100, keys=1), partition=0)
    produce(kafka_bootstrap, src, _inputs(_PENDING + 100, keys=1), partition=1)
    group = _group()
    _kill_in_transaction(kafka_bootstrap, group, src, out, protocol)
    ran: dict[int, list[int]] = {}
    lock = threading.Lock()
    b_assigned = threading.Event()

    class B(FirstOffsets):
        def on_assigned(self, partitions: Sequence[Partition]) -> None:
            if partitions:
                b_assigned.set()

    def settings(name: str) -> Overrides:
        conf: Overrides = {
            "group_protocol": protocol,
            "workers": 4,
            "transactional_id": f"{group}-{name}",
        }
        if protocol == "classic":
            conf["assignment_strategy"] = "range"
        return conf

    b = member(B(out, ran, lock), kafka_bootstrap, group, [src], **settings("b"))
    c = member(FirstOffsets(out, ran, lock), kafka_bootstrap, group, [src], **settings("c"))
    with b:
        assert b_assigned.wait(30)
        time.sleep(0.5)
        with c:
            wait_for_committed(kafka_bootstrap, group, src, "end", timeout=60)
    assert {p: min(offsets) for p, offsets in ran.items()} == {0: _COMMITTED, 1: _COMMITTED}
    inputs = [r for r in consume_all(kafka_bootstrap, src) if r.offset >= _COMMITTED]
    report = compare(inputs, consume_all(kafka_bootstrap, out))
    assert report.exactly_once, report.summary()


def test_an_idle_member_commits_no_transaction(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    src, out = make_topic(2), make_topic(2)
    produce(kafka_bootstrap, src, _inputs(20))
    group = _group()
    events: list[CommitEvent] = []
    gc = member(
        Transform(out),
        kafka_bootstrap,
        group,
        [src],
        transactional_id=f"{group}-a",
        transaction_interval_s=0.05,
    )
    gc.add_commit_listener(events.append)
    with gc:
        wait_for_committed(kafka_bootstrap, group, src, "end", timeout=30)
        time.sleep(0.5)  # the last commit's events reach the listener
        before = len(events)
        time.sleep(1.0)  # 20 intervals with nothing to commit
        assert len(events) == before, f"{len(events) - before} commit events while idle"
    report = check_outputs(kafka_bootstrap, src, out)
    assert report.exactly_once, report.summary()


def test_a_transaction_ends_after_its_record_count_well_before_its_interval(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    """`transaction_max_records` is a boundary of its own: with a 60 s interval, transactions
    of 10 records or more commit one after another (the member would otherwise sit on 35
    finished records for a minute): 30 is committed within 15 s, by two transactions or more,
    each holding at least its 10."""
    src, out = make_topic(1), make_topic(1)
    produce(kafka_bootstrap, src, _inputs(35))
    group = _group()
    events: list[CommitEvent] = []
    calls = Calls()
    gc = member(
        Transform(out, sleep_s=0.01, before=calls),
        kafka_bootstrap,
        group,
        [src],
        ordering="partition",
        workers=1,
        transactional_id=f"{group}-a",
        transaction_interval_s=60.0,
        transaction_max_records=10,
    )
    gc.add_commit_listener(events.append)
    with gc:
        wait_for_committed(kafka_bootstrap, group, src, [30], timeout=15)

        # The transactions' commits (sync events), not the new group's start commit. At least
        # two before 30: the worker may run ahead while the owner waits on a commit, and the
        # next transaction then holds more than 10 (one run: 10, then 34).
        def commits() -> list[int]:
            return [e.offset for e in events if e.ok and e.sync]

        wait_until(lambda: commits() and commits()[-1] >= 30, 5, "the commit events up to 30")
        offsets = commits()
        # The last five stay in the open transaction until the stop commits it: handled first,
        # so that the stop has nothing left to drop.
        wait_until(lambda: sum(calls.count.values()) >= 35, 10, "every record handled")
    assert len(offsets) >= 2, offsets
    steps = [b - a for a, b in zip([0, *offsets], offsets, strict=False)]
    assert all(step >= 10 for step in steps), steps
    assert wait_for_committed(kafka_bootstrap, group, src, "end", timeout=10) == {0: 35}
    report = check_outputs(kafka_bootstrap, src, out)
    assert report.exactly_once, report.summary()
