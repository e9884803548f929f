"""Failure policies on a real broker: poison records under each ordering mode and final policy,
the dead-letter topic read back header by header, a dead-letter topic that cannot be written,
retries that hold no worker, deserialization failures, and a blocked partition's neighbours
keeping their throughput."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)

from tests import waiting
from tests.logged import events
from weir import (
    Context,
    DeadLetterError,
    FailurePolicy,
    GroupConsumer,
    Handler,
    HandlerError,
    Partition,
    Record,
    RetryPolicy,
)
from weir._engine.deadletter import HEADERS
from weir.serde import json_deserializer, pydantic_deserializer
from weir.testing.pytest_plugin import (
    ConsumedRecord,
    TopicFactory,
    client_config,
    consume_all,
    create_topic,
    produce,
    wait_for_committed,
)

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

Ordering = Literal["key", "partition", "unordered"]
Final = Literal["stop", "dead_letter", "block"]
ORDERINGS: tuple[Ordering, ...] = ("key", "partition", "unordered")
WAIT = 30.0

PARTITIONS = 3
PER_PARTITION = 20
KEYS = 4  # keys per partition; each partition has keys of its own
# (partition, offset) of the poison records: two in partition 0 (different keys), one in 1.
POISON = {(0, 5), (0, 10), (1, 7)}
ORIGINAL_HEADERS: list[tuple[str, bytes | None]] = [("trace-id", b"t-1"), ("empty", None)]
TIMESTAMP_MS = 1_700_000_000_123

T = TypeVar("T")


class Poisoned(RuntimeError):
    """What the handler raises for a poison record."""


def _group() -> str:
    return f"g-{uuid.uuid4().hex[:10]}"


def fast_retry(attempts: int = 2, backoff: float = 0.05) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=attempts, backoff_initial_s=backoff, backoff_max_s=backoff, jitter=0.0
    )


@dataclass(frozen=True)
class Call:
    partition: int
    offset: int
    key: bytes | None
    attempt: int
    ok: bool


class Recorder(Handler):
    """Fails the records in `poison` (a fresh `Poisoned` each time) until they are taken out;
    records every call in the order handlers started, under a lock."""

    def __init__(self, poison: set[tuple[int, int]] | None = None, delay: float = 0.0) -> None:
        self.lock = threading.Lock()
        self.poison = set(poison or ())
        self.delay = delay
        self.calls: list[Call] = []

    def handle(self, record: Record, ctx: Context) -> None:
        at = (record.partition, record.offset)
        with self.lock:
            bad = at in self.poison
            self.calls.append(Call(*at, record.key, ctx.attempt, not bad))
        if self.delay:
            time.sleep(self.delay)
        if bad:
            raise Poisoned(f"poison at {record.partition}/{record.offset}")

    def cure(self, *at: tuple[int, int]) -> None:
        with self.lock:
            self.poison.difference_update(at)

    def snapshot(self) -> list[Call]:
        with self.lock:
            return list(self.calls)

    def succeeded(self) -> set[tuple[int, int]]:
        return {(c.partition, c.offset) for c in self.snapshot() if c.ok}

    def attempts(self, at: tuple[int, int]) -> list[int]:
        return [c.attempt for c in self.snapshot() if (c.partition, c.offset) == at]


def member(
    handler: Handler | Callable[[Record], object],
    bootstrap: str,
    group: str,
    topics: Sequence[str],
    **kw: Any,
) -> GroupConsumer:
    settings: dict[str, Any] = {
        "commit_interval_s": 0.1,
        "shutdown_timeout_s": 10.0,
        "revoke_timeout_s": 5.0,
        "startup_timeout_s": 15.0,
        "workers": 4,
    }
    settings.update(kw)
    return GroupConsumer(
        handler, bootstrap_servers=bootstrap, group_id=group, topics=list(topics), **settings
    )


@contextlib.contextmanager
def running(gc: GroupConsumer) -> Iterator[GroupConsumer]:
    """Start `gc`, stop and join it afterwards (its failure, if any, is the test's to check)."""
    gc.start()
    try:
        assert gc.wait_started(WAIT)
        yield gc
    finally:
        gc.stop()
        with contextlib.suppress(HandlerError):
            gc.join(WAIT)


def committed_now(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets as the broker has them (-1001: none)."""
    c = Consumer(client_config(bootstrap, {"group.id": group}))
    try:
        res = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=15)
        return {r.partition: r.offset for r in res}
    finally:
        c.close()


def topic_exists(bootstrap: str, topic: str) -> int:
    """The topic's partition count, 0 if it does not exist. The lookup must not create it:
    an admin client, like a producer, asks the broker to create a topic it looks up unless
    told not to (and the test broker creates topics on demand)."""
    admin = AdminClient(client_config(bootstrap, {"allow.auto.create.topics": False}))
    found = admin.list_topics(topic, timeout=10).topics.get(topic)
    return 0 if found is None or found.error is not None else len(found.partitions)


def wait_until(pred: Callable[[], T], what: str, timeout: float = WAIT) -> T:
    return waiting.wait_until(pred, what, timeout, every=0.02)


def key_of(partition: int, offset: int) -> bytes:
    return b"p%d-k%d" % (partition, offset % KEYS)


def produce_poisoned(bootstrap: str, topic: str) -> None:
    """PER_PARTITION records in each partition, written partition by partition so offsets are
    known; poison records carry headers and a timestamp of their own."""
    records: list[dict[str, Any]] = []
    for p in range(PARTITIONS):
        for o in range(PER_PARTITION):
            rec: dict[str, Any] = {
                "partition": p,
                "key": key_of(p, o),
                "value": json.dumps({"p": p, "o": o}).encode(),
            }
            if (p, o) in POISON:
                rec["value"] = b"poison %d/%d" % (p, o)
                rec["headers"] = ORIGINAL_HEADERS
                rec["timestamp"] = TIMESTAMP_MS
            records.append(rec)
    assert produce(bootstrap, topic, records) == PARTITIONS * PER_PARTITION


def check_order(calls: Sequence[Call], ordering: Ordering) -> None:
    """Key mode: per key, handler calls never go back in offset (a retry repeats its offset;
    nothing later of the key ran before the record's last attempt). Partition mode: the same
    per partition. Unordered promises nothing."""
    if ordering == "unordered":
        return
    last: dict[object, int] = {}
    for c in calls:
        lane: object = (c.partition, c.key) if ordering == "key" else c.partition
        assert c.offset >= last.get(lane, -1), f"{ordering} order broken at {c} after {last}"
        last[lane] = c.offset


def check_dead_letters(
    letters: Sequence[ConsumedRecord],
    topic: str,
    group: str,
    expected: set[tuple[int, int]],
    *,
    attempts: int,
    failed_between: tuple[float, float],
) -> None:
    """Each dead letter: the original key, value and headers, then every weir.dlq.* header."""
    seen = set()
    lo_ms, hi_ms = (int(t * 1000) for t in failed_between)
    for letter in letters:
        names = [name for name, _ in letter.headers]
        assert names == [name for name, _ in ORIGINAL_HEADERS] + list(HEADERS), names
        assert list(letter.headers[: len(ORIGINAL_HEADERS)]) == ORIGINAL_HEADERS
        h = {name: v for name, v in letter.headers[len(ORIGINAL_HEADERS) :]}
        assert all(v is not None for v in h.values()), h
        text = {name: (v or b"").decode() for name, v in h.items()}
        p, o = int(text["weir.dlq.partition"]), int(text["weir.dlq.offset"])
        seen.add((p, o))
        assert letter.key == key_of(p, o)
        assert letter.value == b"poison %d/%d" % (p, o)
        assert text["weir.dlq.topic"] == topic
        assert text["weir.dlq.timestamp"] == str(TIMESTAMP_MS)
        assert text["weir.dlq.attempts"] == str(attempts)
        assert text["weir.dlq.exception"] == f"{Poisoned.__module__}.Poisoned"
        assert text["weir.dlq.message"] == f"poison at {p}/{o}"
        assert text["weir.dlq.group"] == group
        assert lo_ms <= int(text["weir.dlq.failed_at"]) <= hi_ms, (text, lo_ms, hi_ms)
    assert seen == expected
    assert len(letters) == len(expected), "a record was dead-lettered twice"


def all_offsets() -> set[tuple[int, int]]:
    return {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}


@pytest.fixture
def cleanup_topics(kafka_admin: AdminClient) -> Iterator[list[str]]:
    """Topics the test made weir create (dead-letter topics): deleted afterwards."""
    names: list[str] = []
    yield names
    if names:
        kafka_admin.delete_topics(names, operation_timeout=0)


# -- poison records under each ordering mode and final policy -------------------------------------


@pytest.mark.parametrize("ordering", ORDERINGS)
def test_poison_records_are_dead_lettered_and_nothing_else_waits(
    kafka_bootstrap: str, make_topic: TopicFactory, cleanup_topics: list[str], ordering: Ordering
) -> None:
    topic = make_topic(PARTITIONS)
    cleanup_topics.append(f"{topic}.dlq")
    produce_poisoned(kafka_bootstrap, topic)
    group = _group()
    h = Recorder(POISON)
    policy = FailurePolicy(retry=fast_retry(attempts=2), final="dead_letter")
    t0 = time.time()
    with running(member(h, kafka_bootstrap, group, [topic], ordering=ordering, failure=policy)):
        wait_for_committed(kafka_bootstrap, group, topic, "end", timeout=WAIT)
        t1 = time.time()
    letters = consume_all(kafka_bootstrap, f"{topic}.dlq", expected=len(POISON))
    check_dead_letters(letters, topic, group, POISON, attempts=2, failed_between=(t0, t1))
    # Every good record handled, every poison record tried twice and dead-lettered: none
    # skipped silently.
    assert h.succeeded() == all_offsets() - POISON
    for at in POISON:
        assert h.attempts(at) == [1, 2], at
    check_order(h.snapshot(), ordering)


@pytest.mark.parametrize("ordering", ORDERINGS)
def test_stop_resumes_at_the_poison_record_and_goes_on_once_the_policy_changes(
    kafka_bootstrap: str, make_topic: TopicFactory, cleanup_topics: list[str], ordering: Ordering
) -> None:
    topic = make_topic(PARTITIONS)
    cleanup_topics.append(f"{topic}.dlq")
    produce_poisoned(kafka_bootstrap, topic)
    group = _group()
    first_poison = {p: min(o for q, o in POISON if q == p) for p, _ in POISON}
    stop = FailurePolicy(retry=fast_retry(attempts=2), final="stop")

    def run_until_it_stops(h: Recorder) -> HandlerError:
        gc = member(h, kafka_bootstrap, group, [topic], ordering=ordering, failure=stop)
        gc.start()
        with pytest.raises(HandlerError) as info:
            gc.join(WAIT)
        assert isinstance(info.value.__cause__, Poisoned)
        rec = info.value.record
        assert (rec.partition, rec.offset) in POISON
        assert h.attempts((rec.partition, rec.offset)) == [1, 2]
        check_order(h.snapshot(), ordering)
        return info.value

    before = Recorder(POISON)
    first = run_until_it_stops(before)
    after_first = committed_now(kafka_bootstrap, group, topic, PARTITIONS)
    for p, o in first_poison.items():
        assert after_first[p] <= o, f"partition {p} committed {after_first[p]}, past poison {o}"
    assert after_first[first.record.partition] >= 0, "nothing committed below the poison"

    # The same handler again: it resumes at the committed watermark and stops again at a poison
    # record (the one that stopped it before, unless another partition's is reached first).
    again = Recorder(POISON)
    second = run_until_it_stops(again)
    calls = again.snapshot()
    for p in range(PARTITIONS):
        mine = [c.offset for c in calls if c.partition == p]
        if mine:
            assert min(mine) == max(after_first[p], 0), (p, mine, after_first)
    after_second = committed_now(kafka_bootstrap, group, topic, PARTITIONS)
    for p, o in first_poison.items():
        assert after_second[p] <= o
    del second

    # The policy changed to dead letters: the member goes on to the end.
    fixed = Recorder(POISON)
    dead_letter = FailurePolicy(retry=fast_retry(attempts=1), final="dead_letter")
    t0 = time.time()
    gc = member(fixed, kafka_bootstrap, group, [topic], ordering=ordering, failure=dead_letter)
    with running(gc):
        wait_for_committed(kafka_bootstrap, group, topic, "end", timeout=WAIT)
        t1 = time.time()
    assert gc.failure is None
    # Everything at or above the committed watermark was handled or dead-lettered: now, or
    # before the stops (records finished above a poison record are in the committed offset
    # map, and are not handled again).
    owed = {(p, o) for p, o in all_offsets() if o >= max(after_second[p], 0)}
    assert fixed.succeeded() | POISON | before.succeeded() | again.succeeded() >= owed
    letters = consume_all(kafka_bootstrap, f"{topic}.dlq", expected=len(POISON))
    check_dead_letters(letters, topic, group, POISON, attempts=1, failed_between=(t0, t1))
    check_order(fixed.snapshot(), ordering)


@pytest.mark.parametrize("ordering", ORDERINGS)
def test_block_holds_its_partition_at_the_record_while_the_others_finish(
    kafka_bootstrap: str, make_topic: TopicFactory, ordering: Ordering
) -> None:
    """Partitions 0 and 1 block on their poison records; partition 2 finishes. `skip` unblocks
    partition 0 past its first poison (its second one blocks it again until skipped too), and
    `retry_now` with the record cured unblocks partition 1. Fetching resumes: records produced
    afterwards are handled too."""
    topic = make_topic(PARTITIONS)
    produce_poisoned(kafka_bootstrap, topic)
    group = _group()
    h = Recorder(POISON)
    policy = FailurePolicy(retry=fast_retry(attempts=2), final="block", block_retry_s=60.0)
    gc = member(h, kafka_bootstrap, group, [topic], ordering=ordering, failure=policy)
    p0, p1 = Partition(topic, 0), Partition(topic, 1)
    with running(gc):
        wait_for_committed(kafka_bootstrap, group, topic, {2: PER_PARTITION}, timeout=WAIT)
        wait_until(lambda: set(gc.stats().blocked) == {p0, p1}, "partitions 0 and 1 blocked")
        wait_for_committed(kafka_bootstrap, group, topic, {0: 5, 1: 7}, timeout=WAIT)
        time.sleep(1.0)  # ten commit intervals: nothing passes the poison records
        assert committed_now(kafka_bootstrap, group, topic, PARTITIONS) == {
            0: 5,
            1: 7,
            2: PER_PARTITION,
        }
        parts = {s.tp: s for s in gc.stats().partitions}
        assert parts[p0].paused and parts[p0].pause_reason == "blocked"
        assert parts[p1].paused and parts[p1].pause_reason == "blocked"
        assert not parts[Partition(topic, 2)].paused
        if ordering == "partition":
            # Nothing after a poison record ran in its partition.
            assert {o for p, o in h.succeeded() if p == 0} == set(range(5))
            assert {o for p, o in h.succeeded() if p == 1} == set(range(7))

        # Partition 0: skip its first poison record; the second one (another key) blocks it.
        assert gc.skip(p0, 4).result(WAIT) is False, "not a failed record"
        assert gc.skip(p0, 5).result(WAIT) is True
        wait_for_committed(kafka_bootstrap, group, topic, {0: 10}, timeout=WAIT)
        wait_until(lambda: h.attempts((0, 10)) == [1, 2], "partition 0's second poison tried")
        assert gc.skip(p0, 10).result(WAIT) is True
        # Partition 1: cured, and tried again now rather than in 60 s.
        h.cure((1, 7))
        assert gc.retry_now(p1).result(WAIT) is True
        wait_for_committed(kafka_bootstrap, group, topic, "end", timeout=WAIT)
        wait_until(lambda: gc.stats().blocked == (), "nothing blocked")
        assert h.attempts((1, 7)) == [1, 2, 3]
        # Fetching resumed on the unblocked partitions.
        more = [{"partition": p, "key": key_of(p, 99), "value": b"late"} for p in range(3)]
        produce(kafka_bootstrap, topic, more)
        wait_for_committed(kafka_bootstrap, group, topic, "end", timeout=WAIT)
        wait_until(lambda: gc.stats().skipped == 2, "skips counted")
    assert h.succeeded() == (all_offsets() | {(p, PER_PARTITION) for p in range(3)}) - {
        (0, 5),
        (0, 10),
    }
    check_order(h.snapshot(), ordering)


# -- a dead-letter topic that cannot be written ----------------------------------------------------


@pytest.mark.parametrize("ordering", ["key", "unordered"])
def test_a_dead_letter_too_large_for_its_topic_blocks_the_partition(
    kafka_bootstrap: str,
    make_topic: TopicFactory,
    kafka_admin: AdminClient,
    caplog: pytest.LogCaptureFixture,
    ordering: Ordering,
) -> None:
    """The dead-letter topic takes no record of this size: the write fails, the partition
    blocks (saying so, with the sizes), and the committed offset never passes the record. Once
    the topic takes it, `retry_now` writes it and the partition goes on."""
    caplog.set_level(logging.ERROR, logger="weir.failures")
    topic = make_topic(2)
    dlq = make_topic(1, config={"max.message.bytes": "200"})
    big = b"x" * 2000
    produce(
        kafka_bootstrap,
        topic,
        [
            {"partition": p, "key": b"k%d" % o, "value": big if (p, o) == (0, 3) else b"ok"}
            for p in range(2)
            for o in range(10)
        ],
    )
    group = _group()
    h = Recorder({(0, 3)})
    policy = FailurePolicy(
        retry=fast_retry(attempts=1),
        final="dead_letter",
        dead_letter_topic=dlq,
        dead_letter_timeout_s=5.0,
        block_retry_s=60.0,
    )
    gc = member(h, kafka_bootstrap, group, [topic], ordering=ordering, failure=policy)
    with running(gc):
        wait_until(lambda: gc.stats().blocked == (Partition(topic, 0),), "partition 0 blocked")
        # The block says why, with the dead letter's size and the topic's limit.
        (blocked,) = [e for e in events(caplog, "partition_blocked") if e["tp"] == f"{topic}[0]"]
        assert blocked["reason"].startswith("dead letter too large: "), blocked
        assert blocked["dead_letter_bytes"] > len(big) and blocked["max_message_bytes"] == 200
        wait_for_committed(kafka_bootstrap, group, topic, {0: 3, 1: 10}, timeout=WAIT)
        for _ in range(6):  # a few seconds of commits: none passes the record
            time.sleep(0.5)
            assert committed_now(kafka_bootstrap, group, topic, 2)[0] == 3
        assert gc.stats().dead_lettered == 0
        # The operator makes room and retries now.
        room = ConfigEntry(
            "max.message.bytes", "1048588", incremental_operation=AlterConfigOpType.SET
        )
        resource = ConfigResource("topic", dlq, incremental_configs=[room])
        for f in kafka_admin.incremental_alter_configs([resource]).values():
            f.result(WAIT)
        time.sleep(0.5)  # the broker applies the change to the log
        retried_at = time.time()
        assert gc.retry_now((topic, 0)).result(WAIT) is True
        wait_for_committed(kafka_bootstrap, group, topic, "end", timeout=WAIT)
        wait_until(lambda: gc.stats().dead_lettered == 1, "dead letter counted")
    (letter,) = consume_all(kafka_bootstrap, dlq, expected=1)
    assert letter.value == big and letter.key == b"k3"
    # When the record's last attempt failed, not when its dead letter was finally written.
    failed_at = int(dict(letter.headers)["weir.dlq.failed_at"] or b"0") / 1000
    assert failed_at < retried_at - 3, (failed_at, retried_at)


def test_a_record_as_large_as_its_topic_takes_is_dead_lettered(
    kafka_bootstrap: str,
    make_topic: TopicFactory,
    kafka_admin: AdminClient,
    cleanup_topics: list[str],
) -> None:
    """Regression: weir created the dead-letter topic with the broker's default
    max.message.bytes (1 MB) and its producer refused records over 1 MB, so a failing record
    of a topic that takes larger ones blocked its partition for good."""
    topic = make_topic(1, config={"max.message.bytes": str(2 * 1024 * 1024)})
    dlq = f"{topic}.dlq"
    cleanup_topics.append(dlq)
    big = bytes(range(256)) * 6000  # 1.5 MB
    produce(
        kafka_bootstrap,
        topic,
        [(b"big", big), (b"small", b"ok")],
        partition=0,
        config={"message.max.bytes": 4 * 1024 * 1024},
    )
    group = _group()
    h = Recorder({(0, 0)})
    policy = FailurePolicy(
        retry=fast_retry(attempts=1), final="dead_letter", dead_letter_timeout_s=15.0
    )
    gc = member(h, kafka_bootstrap, group, [topic], failure=policy)
    with running(gc):
        wait_for_committed(kafka_bootstrap, group, topic, {0: 2}, timeout=WAIT)
        wait_until(lambda: gc.stats().dead_lettered == 1, "dead letter counted")
        assert gc.stats().blocked == ()
    (letter,) = consume_all(kafka_bootstrap, dlq, expected=1)
    assert letter.key == b"big" and letter.value == big
    resource = ConfigResource("topic", dlq)
    described = kafka_admin.describe_configs([resource])[resource].result(WAIT)
    assert int(described["max.message.bytes"].value) > 2 * 1024 * 1024


def test_a_deleted_dead_letter_topic_blocks_the_partition(
    kafka_bootstrap: str, make_topic: TopicFactory, kafka_admin: AdminClient
) -> None:
    """The dead-letter topic is deleted while the member runs (the broker would create topics
    on demand; the dead-letter producer must not): the write fails, the partition blocks and
    nothing passes the record."""
    topic = make_topic(1)
    dlq = make_topic(1)
    group = _group()
    h = Recorder({(0, 3)})
    policy = FailurePolicy(
        retry=fast_retry(attempts=1),
        final="dead_letter",
        dead_letter_topic=dlq,
        dead_letter_timeout_s=2.0,
        block_retry_s=60.0,
    )
    gc = member(h, kafka_bootstrap, group, [topic], ordering="partition", failure=policy)
    with running(gc):
        wait_until(lambda: gc.stats().partitions, "assigned")
        kafka_admin.delete_topics([dlq], operation_timeout=10)[dlq].result(WAIT)
        produce(kafka_bootstrap, topic, [(b"k", b"v%d" % i) for i in range(6)])
        wait_until(lambda: gc.stats().blocked == (Partition(topic, 0),), "blocked")
        for _ in range(6):
            time.sleep(0.5)
            assert committed_now(kafka_bootstrap, group, topic, 1)[0] in (-1001, 3)
        wait_for_committed(kafka_bootstrap, group, topic, {0: 3}, timeout=WAIT)
        assert gc.stats().dead_lettered == 0
        assert not topic_exists(kafka_bootstrap, dlq), "the dead-letter producer created it"
        assert {o for _, o in h.succeeded()} == {0, 1, 2}
        # The operator creates the topic again and retries now: the dead letter is written.
        create_topic(kafka_admin, dlq, partitions=1)
        assert gc.retry_now((topic, 0)).result(WAIT) is True
        wait_for_committed(kafka_bootstrap, group, topic, {0: 6}, timeout=WAIT)
        wait_until(lambda: gc.stats().dead_lettered == 1, "dead letter counted")
    (letter,) = consume_all(kafka_bootstrap, dlq, expected=1)
    assert letter.value == b"v3"
    assert {o for _, o in h.succeeded()} == {0, 1, 2, 4, 5}


# -- retries hold no worker --------------------------------------------------------------------


class FailFirst(Handler):
    """Fails the first `failures` attempts of every record; keeps when each call started and
    when each record succeeded."""

    def __init__(self, failures: int = 1) -> None:
        self.failures = failures
        self.lock = threading.Lock()
        self.started: list[float] = []
        self.done: dict[tuple[int, int], float] = {}
        self.attempts: dict[tuple[int, int], list[int]] = defaultdict(list)

    def handle(self, record: Record, ctx: Context) -> None:
        at = (record.partition, record.offset)
        with self.lock:
            self.started.append(time.monotonic())
            self.attempts[at].append(ctx.attempt)
        if ctx.attempt <= self.failures:
            raise ConnectionError(f"transient failure {ctx.attempt} of {at}")
        with self.lock:
            self.done[at] = time.monotonic()


@pytest.mark.parametrize("ordering", ["key", "unordered"])
def test_records_waiting_for_a_retry_hold_no_worker(
    kafka_bootstrap: str, make_topic: TopicFactory, ordering: Ordering
) -> None:
    """8 workers, 100 records each failing once with a 1 s backoff: about 1-2 s in all. A
    worker held through each backoff would make it 100 s / 8 workers = 12.5 s."""
    topic = make_topic(4)
    produce(kafka_bootstrap, topic, [(b"k%d" % i, b"v%d" % i) for i in range(100)])
    group = _group()
    h = FailFirst(1)
    retry = RetryPolicy(max_attempts=2, backoff_initial_s=1.0, backoff_max_s=1.0, jitter=0.0)
    policy = FailurePolicy(retry=retry, final="stop")
    gc = member(h, kafka_bootstrap, group, [topic], ordering=ordering, workers=8, failure=policy)
    with running(gc):
        wait_until(lambda: len(h.done) == 100, "every record retried and done")
        wait_for_committed(kafka_bootstrap, group, topic, "end", timeout=WAIT)
        assert gc.stats().retries == 100
    took = max(h.done.values()) - min(h.started)
    assert all(a == [1, 2] for a in h.attempts.values()), h.attempts
    assert 1.0 <= took < 4.0, f"{took:.2f}s from the first call to the last success"


def test_a_record_failing_twice_then_succeeding_keeps_partition_order(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    topic = make_topic(1)
    produce(kafka_bootstrap, topic, [(b"k", b"v%d" % i) for i in range(10)])
    group = _group()
    order: list[int] = []

    def handle(record: Record) -> None:
        order.append(record.offset)
        if record.offset == 4 and order.count(4) <= 2:
            raise TimeoutError("the service is busy")

    policy = FailurePolicy(retry=fast_retry(attempts=3, backoff=0.1), final="stop")
    gc = member(handle, kafka_bootstrap, group, [topic], ordering="partition", failure=policy)
    with running(gc):
        wait_for_committed(kafka_bootstrap, group, topic, "end", timeout=WAIT)
        wait_until(lambda: gc.stats().retries == 2, "two retries counted")
    assert order == [0, 1, 2, 3, 4, 4, 4, 5, 6, 7, 8, 9]
    assert gc.failure is None


@pytest.mark.parametrize("ordering", ORDERINGS)
def test_a_retry_is_due_after_its_backoff_not_after_the_poll_timeout(
    kafka_bootstrap: str, make_topic: TopicFactory, ordering: Ordering
) -> None:
    """With nothing else in flight the owner waits in poll for up to poll_timeout_s. The
    landed code slept through the retry's due time there, and handed the record out only on
    the turn after: a 50 ms backoff took two poll timeouts (2 s here)."""
    topic = make_topic(1)
    produce(kafka_bootstrap, topic, [(b"k", b"v%d" % i) for i in range(5)])
    group = _group()
    at: dict[int, float] = {}

    class Once(Handler):
        def handle(self, record: Record, ctx: Context) -> None:
            if record.offset == 2:
                at[ctx.attempt] = time.monotonic()
                if ctx.attempt == 1:
                    raise ConnectionError("fails once")

    policy = FailurePolicy(retry=fast_retry(attempts=2, backoff=0.05))
    gc = member(
        Once(), kafka_bootstrap, group, [topic], ordering=ordering, poll_timeout_s=1.0,
        failure=policy,
    )  # fmt: skip
    with running(gc):
        wait_for_committed(kafka_bootstrap, group, topic, "end", timeout=WAIT)
    assert sorted(at) == [1, 2]
    assert 0.05 <= at[2] - at[1] < 0.5, f"retried {at[2] - at[1]:.3f}s after the failure"


# -- deserializers ---------------------------------------------------------------------------------


def test_records_that_fail_to_deserialize_are_dead_lettered_with_their_raw_bytes(
    kafka_bootstrap: str, make_topic: TopicFactory, cleanup_topics: list[str]
) -> None:
    from pydantic import BaseModel

    class Order(BaseModel):
        id: int

    topic = make_topic(1)
    cleanup_topics.append(f"{topic}.dlq")
    bad_value = b"\xff\xfe not json"
    bad_key = b"\x00\x01"
    records: list[tuple[bytes, bytes]] = [
        (b'"a"', b'{"id": 1}'),
        (b'"b"', bad_value),  # not JSON
        (b'"c"', b'{"id": "three"}'),  # JSON, not an Order
        (bad_key, b'{"id": 4}'),  # the key fails
        (b'"e"', b'{"id": 5}'),
    ]
    produce(kafka_bootstrap, topic, records)
    group = _group()
    seen: list[tuple[object, object]] = []
    calls: list[int] = []

    def handle(record: Record) -> None:
        calls.append(record.offset)
        seen.append((record.deserialized_key, record.deserialized_value))

    # Retries are configured, but the bytes will not change: a deserialization failure is not
    # retried unless `deserialization_retries` says so.
    policy = FailurePolicy(retry=fast_retry(attempts=3), final="dead_letter")
    gc = GroupConsumer(
        handle,
        key_deserializer=json_deserializer(),
        value_deserializer=pydantic_deserializer(Order),
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        topics=[topic],
        commit_interval_s=0.1,
        ordering="key",
        failure=policy,
    )
    with running(gc):
        wait_for_committed(kafka_bootstrap, group, topic, "end", timeout=WAIT)
        assert gc.stats().retries == 0
    assert seen == [("a", Order(id=1)), ("e", Order(id=5))]
    assert calls == [0, 4], "the handler never saw a record that failed to deserialize"
    letters = consume_all(kafka_bootstrap, f"{topic}.dlq", expected=3)
    by_offset = {int(dict(r.headers)["weir.dlq.offset"] or b"-1"): r for r in letters}
    assert sorted(by_offset) == [1, 2, 3]
    for offset, letter in by_offset.items():
        key, value = records[offset]
        assert (letter.key, letter.value) == (key, value), "raw bytes kept"
        h = {name: (v or b"").decode() for name, v in letter.headers}
        assert h["weir.dlq.exception"] == "weir.errors.DeserializationError"
        assert h["weir.dlq.attempts"] == "1"
        field = "key" if offset == 3 else "value"
        assert h["weir.dlq.message"].startswith(
            f"could not deserialize the {field} of {topic}/0/{offset}: "
        ), h["weir.dlq.message"]


# -- a blocked partition's neighbours keep their throughput ------------------------------------


def _healthy_rate(
    bootstrap: str, topic: str, partitions: int, per_partition: int, *, block: bool
) -> float:
    """Records/s of partitions 1.. (1 ms handlers, partition mode, a worker per partition),
    from the first record entering a handler to the last healthy one leaving it; with `block`
    partition 0's first record is poison and blocks it."""
    lock = threading.Lock()
    first: list[float] = []
    healthy_done: list[float] = []
    target = (partitions - 1) * per_partition

    def handle(record: Record) -> None:
        now = time.perf_counter()
        with lock:
            if not first:
                first.append(now)
        if block and record.partition == 0:
            raise Poisoned("blocks partition 0")
        time.sleep(0.001)
        if record.partition:
            with lock:
                healthy_done.append(time.perf_counter())

    policy = FailurePolicy(retry=fast_retry(attempts=1), final="block")
    gc = member(
        handle,
        bootstrap,
        _group(),
        [topic],
        ordering="partition",
        workers=partitions,
        failure=policy,
    )
    with running(gc):
        wait_until(lambda: len(healthy_done) >= target, "the healthy partitions finished", 60)
        if block:
            assert gc.stats().blocked == (Partition(topic, 0),)
    return target / (max(healthy_done) - first[0])


def test_healthy_partitions_keep_their_throughput_while_one_is_blocked(
    kafka_bootstrap: str, make_topic: TopicFactory, record_property: Callable[[str, object], None]
) -> None:
    """8 partitions, 1 ms handlers, partition mode, 8 workers: the 7 healthy partitions' rate
    with partition 0 blocked vs with nothing blocked (best of two alternating runs each)."""
    partitions, per_partition = 8, 400
    topic = make_topic(partitions)
    produce(
        kafka_bootstrap,
        topic,
        [
            {"partition": p, "key": b"k", "value": b"v"}
            for p in range(partitions)
            for _ in range(per_partition)
        ],
    )
    rates: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(2):
        for block in (False, True):
            rates[block].append(
                _healthy_rate(kafka_bootstrap, topic, partitions, per_partition, block=block)
            )
    free, blocked = max(rates[False]), max(rates[True])
    ratio = blocked / free
    record_property("healthy_rate_free", rates[False])
    record_property("healthy_rate_blocked", rates[True])
    print(  # the figure is the point of this test: pytest -s shows it
        f"healthy partitions: {free:.0f}/s with none blocked, {blocked:.0f}/s with one "
        f"blocked = {ratio:.2f}x (runs: {rates})"
    )
    # 7 lanes of 1 ms records: 7,000/s at best either way. A stall would be far below.
    assert ratio >= 0.7, rates


def test_a_partition_blocked_with_a_full_lane_does_not_throttle_the_others(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    """Partition mode, a handler so fast that partitions do not share the budget: partition 0
    blocks deep in a backlog with hundreds of its records registered behind the poison one.
    The landed code counted them against the whole member's budget for as long as the block
    lasted: at or above the resume mark, the throttle and the capacity pause never lifted and
    the healthy partitions crawled at one record per poll (30,007 of 60,000 in 30 s)."""
    partitions, per_partition, poison = 4, 20_000, 12_000
    topic = make_topic(partitions)
    produce(
        kafka_bootstrap,
        topic,
        [
            {"partition": p, "key": b"k%d" % (i % 50), "value": b"v"}
            for p in range(partitions)
            for i in range(per_partition)
        ],
    )
    group = _group()

    def handle(record: Record) -> None:
        if (record.partition, record.offset) == (0, poison):
            raise Poisoned("blocks partition 0")

    policy = FailurePolicy(retry=fast_retry(attempts=1), final="block", block_retry_s=60.0)
    gc = member(
        handle, kafka_bootstrap, group, [topic], ordering="partition", workers=8, failure=policy
    )
    with running(gc):
        healthy = {p: per_partition for p in range(1, partitions)}
        wait_for_committed(kafka_bootstrap, group, topic, healthy, timeout=20)
        wait_for_committed(kafka_bootstrap, group, topic, {0: poison}, timeout=WAIT)
        assert gc.stats().blocked == (Partition(topic, 0),)
        time.sleep(0.3)
        assert committed_now(kafka_bootstrap, group, topic, partitions)[0] == poison


@pytest.mark.parametrize("ordering", ["partition", "key"])
def test_a_record_waiting_for_its_retry_does_not_hold_the_other_partitions(
    kafka_bootstrap: str, make_topic: TopicFactory, ordering: Ordering
) -> None:
    """A handler so fast that partitions do not share the budget; in key mode one key per
    partition (a hot key). While one record waits 4 s for its retry, the records waiting for
    it filled the budget until the capacity paused every partition: the landed code held the
    healthy partitions for the whole backoff (partition mode), and so did the first fix for
    it in key mode. Now they finish while the record still waits."""
    partitions, per_partition, failing = 4, 20_000, (0, 5_000)
    topic = make_topic(partitions)
    produce(
        kafka_bootstrap,
        topic,
        [
            {
                "partition": p,
                "key": b"hot%d" % p if ordering == "key" else b"k%d" % (i % 50),
                "value": b"v",
            }
            for p in range(partitions)
            for i in range(per_partition)
        ],
    )
    group = _group()
    attempts: list[int] = []

    class Once(Handler):
        def handle(self, record: Record, ctx: Context) -> None:
            if (record.partition, record.offset) == failing:
                attempts.append(ctx.attempt)
                if ctx.attempt == 1:
                    raise ConnectionError("fails once")

    retry = RetryPolicy(max_attempts=2, backoff_initial_s=4.0, backoff_max_s=4.0, jitter=0.0)
    gc = member(
        Once(),
        kafka_bootstrap,
        group,
        [topic],
        ordering=ordering,
        workers=8,
        failure=FailurePolicy(retry=retry),
    )
    with running(gc):
        wait_until(lambda: attempts == [1], "the first attempt failed")
        # The healthy partitions may all be finished before the failing record is reached (a
        # fetch can bring a whole partition at once), so the failing partition's commit up to
        # its record can come a commit interval after theirs: wait for both, within the backoff.
        expected = {p: per_partition for p in range(1, partitions)} | {0: failing[1]}
        wait_for_committed(kafka_bootstrap, group, topic, expected, timeout=WAIT)
        assert attempts == [1], "the healthy partitions waited for the retry"
        assert committed_now(kafka_bootstrap, group, topic, partitions)[0] == failing[1]
        wait_for_committed(kafka_bootstrap, group, topic, "end", timeout=WAIT)
    assert attempts == [1, 2]


# -- revoked partitions take no failure state along --------------------------------------------


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_revoked_blocked_partition_starts_over_from_the_committed_watermark(
    kafka_bootstrap: str, make_topic: TopicFactory, protocol: str
) -> None:
    """Member A blocks both partitions of a topic on their poison records; B joins with a
    handler that copes. The partition that moves to B starts at its committed watermark (the
    poison record) and goes on; A's block state for it is gone, A keeps blocking the other."""
    topic = make_topic(2)
    produce(
        kafka_bootstrap,
        topic,
        [{"partition": p, "key": b"k", "value": b"v%d" % o} for p in range(2) for o in range(8)],
    )
    group = _group()
    a = Recorder({(0, 3), (1, 3)})
    b = Recorder()
    policy = FailurePolicy(retry=fast_retry(attempts=1), final="block", block_retry_s=60.0)
    both = {Partition(topic, 0), Partition(topic, 1)}
    kw: dict[str, Any] = {"ordering": "partition", "failure": policy, "group_protocol": protocol}
    ga = member(a, kafka_bootstrap, group, [topic], **kw)
    with running(ga):
        wait_until(lambda: set(ga.stats().blocked) == both, "A blocks both partitions")
        wait_for_committed(kafka_bootstrap, group, topic, [3, 3], timeout=WAIT)
        gb = member(b, kafka_bootstrap, group, [topic], **kw)
        with running(gb):
            wait_until(lambda: len(gb.stats().partitions) == 1, "B owns a partition")
            moved = gb.stats().partitions[0].tp
            kept = (both - {moved}).pop()
            wait_until(lambda: ga.stats().blocked == (kept,), "A forgot the moved block")
            wait_for_committed(kafka_bootstrap, group, topic, {moved.partition: 8}, timeout=WAIT)
            assert [c.offset for c in b.snapshot()] == [3, 4, 5, 6, 7]
            assert ga.stats().waiting_retry == 1
            assert ga.skip(kept, 3).result(WAIT) is True
            wait_for_committed(kafka_bootstrap, group, topic, "end", timeout=WAIT)


def test_the_dead_letter_producer_goes_when_the_member_stops(
    kafka_bootstrap: str, make_topic: TopicFactory, cleanup_topics: list[str]
) -> None:
    """The landed code dropped its dead-letter producer with the engine, whose reference
    cycles only the garbage collector breaks: after join() the producer lived on, connected
    to the broker, until some later collection."""
    import gc

    from confluent_kafka import Producer

    def producers() -> int:
        return sum(1 for o in gc.get_objects() if isinstance(o, Producer))

    topic = make_topic(1)
    cleanup_topics.append(f"{topic}.dlq")
    produce(kafka_bootstrap, topic, [(b"k", b"v%d" % i) for i in range(3)])
    group = _group()
    policy = FailurePolicy(retry=fast_retry(attempts=1), final="dead_letter")
    gc.collect()
    before = producers()
    gc.disable()  # no collection may break the cycles behind the test's back
    try:
        consumer = member(Recorder({(0, 1)}), kafka_bootstrap, group, [topic], failure=policy)
        with running(consumer):
            wait_for_committed(kafka_bootstrap, group, topic, "end", timeout=WAIT)
            assert producers() == before + 1
        assert consumer.stats().dead_lettered == 1
        assert producers() == before, "the dead-letter producer outlived its member"
    finally:
        gc.enable()


# -- dead-letter topics of a regex subscription ------------------------------------------------


def test_a_regex_subscriptions_dead_letter_topic_is_created_on_its_first_dead_letter(
    kafka_bootstrap: str, make_topic: TopicFactory, cleanup_topics: list[str]
) -> None:
    """A topic matched by a pattern is not known at start, so its dead-letter topic is checked
    (and created, with the topic's partition count) when its first dead letter is written. The
    landed code never created it: the write timed out and the partition blocked for good."""
    prefix = f"rx-{uuid.uuid4().hex[:8]}"
    topic = make_topic(2, name_prefix=prefix)
    dlq = f"{topic}.dlq"
    cleanup_topics.append(dlq)
    produce(
        kafka_bootstrap,
        topic,
        [{"partition": 0, "key": b"k", "value": b"v%d" % i} for i in range(5)],
    )
    group = _group()
    h = Recorder({(0, 2)})
    policy = FailurePolicy(
        retry=fast_retry(attempts=1), final="dead_letter", dead_letter_timeout_s=5.0
    )
    # The dead-letter topic is named so that the pattern does not match it.
    gc = member(
        h, kafka_bootstrap, group, [f"^{prefix}-[0-9a-f]+$"], ordering="key", failure=policy
    )
    with running(gc):
        wait_for_committed(kafka_bootstrap, group, topic, [5, 0], timeout=WAIT)
        assert gc.stats().blocked == ()
        assert gc.stats().dead_lettered == 1
    (letter,) = consume_all(kafka_bootstrap, dlq, expected=1)
    assert letter.value == b"v2"
    assert dict(letter.headers)["weir.dlq.offset"] == b"2"
    assert topic_exists(kafka_bootstrap, dlq) == 2, "created with the topic's partition count"


def test_a_regex_topics_missing_dead_letter_topic_blocks_when_creation_is_off(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    prefix = f"rx-{uuid.uuid4().hex[:8]}"
    topic = make_topic(1, name_prefix=prefix)
    produce(kafka_bootstrap, topic, [(b"k", b"v%d" % i) for i in range(5)])
    group = _group()
    h = Recorder({(0, 2)})
    policy = FailurePolicy(
        retry=fast_retry(attempts=1),
        final="dead_letter",
        create_dead_letter_topic=False,
        dead_letter_timeout_s=5.0,
    )
    gc = member(
        h, kafka_bootstrap, group, [f"^{prefix}-[0-9a-f]+$"], ordering="key", failure=policy
    )
    with running(gc):
        wait_until(lambda: gc.stats().blocked == (Partition(topic, 0),), "blocked")
        wait_for_committed(kafka_bootstrap, group, topic, [2], timeout=WAIT)
        time.sleep(0.5)
        assert committed_now(kafka_bootstrap, group, topic, 1)[0] == 2
    assert not topic_exists(kafka_bootstrap, f"{topic}.dlq"), "created although creation is off"


def test_a_missing_dead_letter_topic_that_may_not_be_created_fails_the_start(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    """A subscribed topic's dead-letter topic is checked when the member starts: missing, with
    creation off, is a `DeadLetterError` naming both topics before any record is handed to a
    handler, so nothing is committed and nothing is created."""
    topic = make_topic(1)
    produce(kafka_bootstrap, topic, [(b"k", b"v%d" % i) for i in range(5)])
    group = _group()
    h = Recorder({(0, 2)})
    policy = FailurePolicy(
        retry=fast_retry(attempts=1), final="dead_letter", create_dead_letter_topic=False
    )
    gc = member(h, kafka_bootstrap, group, [topic], failure=policy)
    gc.start()
    with pytest.raises(DeadLetterError) as info:
        gc.join(WAIT)
    assert f"dead-letter topic '{topic}.dlq' of '{topic}' does not exist" in str(info.value)
    assert "create_dead_letter_topic=False" in str(info.value)
    assert h.snapshot() == []
    assert committed_now(kafka_bootstrap, group, topic, 1) == {0: -1001}
    assert not topic_exists(kafka_bootstrap, f"{topic}.dlq")


class LongError(Handler):
    """Fails offset 2 of every topic with a 5,000-character message, on every attempt."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done: set[tuple[str, int]] = set()

    def handle(self, record: Record, ctx: Context) -> None:
        if record.offset == 2:
            raise Poisoned("poison " + "x" * 4_993)
        with self.lock:
            self.done.add((record.topic, record.offset))


def test_a_topics_own_policy_applies_to_its_records_and_cuts_the_dead_letters_message(
    kafka_bootstrap: str, make_topic: TopicFactory, cleanup_topics: list[str]
) -> None:
    """The consumer's policy blocks; `failure_by_topic` dead-letters one topic's failures
    instead, with the exception message cut to that policy's `max_error_chars`. The same
    failing offset in both topics: the plain one blocks at it, the other writes it to its
    dead-letter topic and commits to its end."""
    plain, special = make_topic(1), make_topic(1)
    cleanup_topics.append(f"{special}.dlq")
    for topic in (plain, special):
        produce(kafka_bootstrap, topic, [(b"k", b"v%d" % i) for i in range(5)])
    group = _group()
    h = LongError()
    block = FailurePolicy(retry=fast_retry(attempts=1), final="block", block_retry_s=60.0)
    letter = FailurePolicy(retry=fast_retry(attempts=2), final="dead_letter", max_error_chars=40)
    gc = member(
        h,
        kafka_bootstrap,
        group,
        [plain, special],
        ordering="partition",
        failure=block,
        failure_by_topic={special: letter},
    )
    with running(gc):
        wait_for_committed(kafka_bootstrap, group, special, "end", timeout=WAIT)
        wait_until(lambda: gc.stats().blocked == (Partition(plain, 0),), "the plain one blocked")
        assert committed_now(kafka_bootstrap, group, plain, 1) == {0: 2}
        assert gc.stats().dead_lettered == 1
    [dead] = consume_all(kafka_bootstrap, f"{special}.dlq", expected=1)
    headers = {name: (v or b"").decode() for name, v in dead.headers}
    assert (headers["weir.dlq.topic"], headers["weir.dlq.offset"]) == (special, "2")
    assert headers["weir.dlq.attempts"] == "2"
    message = headers["weir.dlq.message"]
    assert len(message) == 40 and message == "poison " + "x" * 32 + "…", message
    assert h.done >= {(t, o) for t in (plain, special) for o in (0, 1)}
    assert (special, 3) in h.done and (plain, 3) not in h.done
    assert not topic_exists(kafka_bootstrap, f"{plain}.dlq"), "the blocking topic has none"
