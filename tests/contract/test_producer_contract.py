"""The producer contract weir's exactly-once mode relies on, checked on a real broker and on
`weir.testing.FakeBroker`'s `FakeProducer`.

Each test runs twice (`backend` is `fake` or `real`) through
`weir._engine.client.TransactionalProducer` and `weir._engine.client.ConsumerClient`. A test that
passes on the real broker and fails on the fake is a bug in the fake.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, TopicPartition

from tests.contract.conftest import (
    PROTOCOLS,
    Backend,
    Log,
    Member,
    group_conf,
    poll_for,
    pump,
    txn_id,
)
from weir._engine.client import ConsumerClient, TransactionalProducer

pytestmark = pytest.mark.timeout(120)

WAIT = 30.0  # the transactional calls' timeout: the real broker answers within a second


def raised(call: Callable[[], object]) -> KafkaError:
    """The KafkaError `call` raised (it must raise one)."""
    with pytest.raises(KafkaException) as caught:
        call()
    err = caught.value.args[0]
    assert isinstance(err, KafkaError)
    return err


def committed(client: ConsumerClient, topic: str, *parts: int) -> list[tuple[int, str | None]]:
    found = client.committed([TopicPartition(topic, p) for p in parts], timeout=10)
    return [(p.offset, p.metadata) for p in found]


def ready(backend: Backend, transactional_id: str | None = None) -> TransactionalProducer:
    """A transactional producer, initialised."""
    producer = backend.producer(transactional_id or txn_id())
    producer.init_transactions(WAIT)
    return producer


Reports = list[tuple[int | None, int | None, bool]]


def reporter(reports: Reports) -> Callable[[KafkaError | None, Any], None]:
    """A delivery callback keeping (error code, offset, served on the calling thread)."""
    caller = threading.get_ident()

    def report(err: KafkaError | None, msg: Any) -> None:
        reports.append((err.code() if err else None, msg.offset(), threading.get_ident() == caller))

    return report


# -- visibility --------------------------------------------------------------------------------


def test_a_transactions_records_are_read_committed_only_once_it_commits(backend: Backend) -> None:
    topic = backend.topic(1)
    p = ready(backend)
    reports: Reports = []
    p.begin_transaction()
    p.produce(topic, "c0", partition=0, on_delivery=reporter(reports))
    p.produce(topic, "c1", partition=0, on_delivery=reporter(reports))
    assert p.flush(WAIT) == 0  # written: only the end of the transaction is left
    assert reports == [(None, 0, True), (None, 1, True)]  # served by flush, on this thread
    reader = Member("C", backend.consumer(), Log())
    loose = Member("U", backend.consumer(**{"isolation.level": "read_uncommitted"}), Log())
    reader.subscribe([topic])
    loose.subscribe([topic])
    pump([loose], lambda: len(loose.records) == 2, "the open transaction's records, uncommitted")
    poll_for([reader], backend.quiet_s)
    assert reader.records == []
    p.commit_transaction(WAIT)
    pump([reader], lambda: len(reader.records) == 2, "the committed records")

    p.begin_transaction()  # 3 (2 is the commit marker)
    p.produce(topic, "x0", partition=0, on_delivery=reporter(reports))
    # Written before the abort (the client purges what is still in its queue at an abort).
    assert p.flush(WAIT) == 0
    p.abort_transaction(WAIT)
    assert reports[2:] == [(None, 3, True)]
    p.begin_transaction()
    p.produce(topic, "c2", partition=0)  # 5 (4 is the abort marker)
    p.commit_transaction(WAIT)
    pump([reader], lambda: len(reader.records) == 3, "the next committed record")
    poll_for([reader], backend.quiet_s)
    assert [(m.offset(), m.value()) for m in reader.records] == [(0, b"c0"), (1, b"c1"), (5, b"c2")]
    pump([loose], lambda: len(loose.records) == 4, "every record, uncommitted")
    assert [m.offset() for m in loose.records] == [0, 1, 3, 5]


def test_offsets_sent_to_a_transaction_are_committed_with_it(backend: Backend) -> None:
    topic = backend.topic(2)
    group = f"contract-{time.monotonic_ns()}"
    reader = backend.consumer(group)  # read_committed, the client's default
    loose = backend.consumer(group, **{"isolation.level": "read_uncommitted"})
    reader.commit(
        offsets=[TopicPartition(topic, 0, 2), TopicPartition(topic, 1, 3)], asynchronous=False
    )
    p = ready(backend)
    p.begin_transaction()
    p.send_offsets_to_transaction(
        [TopicPartition(topic, 0, 9, "map-9")], reader.consumer_group_metadata(), WAIT
    )
    # While the transaction holds them (UNSTABLE_OFFSET_COMMIT), a read_committed reader waits
    # for it and gives up at its timeout; other partitions, and read_uncommitted, read what is
    # committed.
    began = time.monotonic()
    err = raised(lambda: reader.committed([TopicPartition(topic, 0)], timeout=1.0))
    assert err.code() == KafkaError._TIMED_OUT and time.monotonic() - began >= 0.9
    assert committed(reader, topic, 1) == [(3, None)]
    assert committed(loose, topic, 0, 1) == [(2, None), (3, None)]
    # ... and has its answer as soon as the transaction ends.
    threading.Timer(0.5, lambda: p.commit_transaction(WAIT)).start()
    assert committed(reader, topic, 0) == [(9, "map-9")]

    p.begin_transaction()
    p.send_offsets_to_transaction(
        [TopicPartition(topic, 0, 11)], reader.consumer_group_metadata(), WAIT
    )
    p.abort_transaction(WAIT)
    assert committed(reader, topic, 0) == [(9, "map-9")]

    # A commit made after the transaction's offsets were sent wins over them.
    p.begin_transaction()
    p.send_offsets_to_transaction(
        [TopicPartition(topic, 1, 11)], reader.consumer_group_metadata(), WAIT
    )
    reader.commit(offsets=[TopicPartition(topic, 1, 4)], asynchronous=False)
    p.commit_transaction(WAIT)
    assert committed(reader, topic, 1) == [(4, None)]

    # No offset (OFFSET_INVALID) is left out; an unknown partition is retried until the call's
    # timeout, then fails the transaction.
    p.begin_transaction()
    p.send_offsets_to_transaction(
        [TopicPartition(topic, 0, OFFSET_INVALID)], reader.consumer_group_metadata(), WAIT
    )
    began = time.monotonic()
    err = raised(
        lambda: p.send_offsets_to_transaction(
            [TopicPartition(topic, 7, 1)], reader.consumer_group_metadata(), 1.0
        )
    )
    assert err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART and err.txn_requires_abort()
    assert time.monotonic() - began >= 0.9
    p.abort_transaction(WAIT)
    assert committed(reader, topic, 0, 1) == [(9, "map-9"), (4, None)]


# -- fencing -----------------------------------------------------------------------------------


def test_a_newer_producer_with_the_same_id_fences_the_older_and_aborts_its_transaction(
    backend: Backend,
) -> None:
    topic = backend.topic(1)
    group = f"contract-{time.monotonic_ns()}"
    reader = backend.consumer(group)
    meta = reader.consumer_group_metadata()
    tid = txn_id()
    old = ready(backend, tid)
    old.begin_transaction()
    old.produce(topic, "zombie", partition=0)  # 0
    assert old.flush(WAIT) == 0
    old.send_offsets_to_transaction([TopicPartition(topic, 0, 1)], meta, WAIT)

    new = ready(backend, tid)  # aborts the old one's transaction: its marker is 1
    assert committed(reader, topic, 0) == [(OFFSET_INVALID, None)]  # not waiting: it ended
    err = raised(lambda: old.commit_transaction(WAIT))
    assert (err.code(), err.fatal(), err.txn_requires_abort()) == (KafkaError._FENCED, True, False)
    assert "fenced by a newer instance" in err.str()
    # Fatal: every transactional call raises it from now on; produce refuses.
    for call in (
        old.begin_transaction,
        lambda: old.send_offsets_to_transaction([TopicPartition(topic, 0, 1)], meta, WAIT),
        lambda: old.abort_transaction(WAIT),
    ):
        assert raised(call).code() == KafkaError._FENCED
    late = raised(lambda: old.produce(topic, "late", partition=0))
    assert (late.code(), late.fatal()) == (KafkaError._FATAL, False)

    new.begin_transaction()
    new.produce(topic, "fresh", partition=0)  # 2
    new.send_offsets_to_transaction([TopicPartition(topic, 0, 3)], meta, WAIT)
    new.commit_transaction(WAIT)
    assert committed(reader, topic, 0) == [(3, None)]
    member = Member("C", backend.consumer(), Log())
    member.subscribe([topic])
    pump([member], lambda: bool(member.records), "the new producer's record")
    poll_for([member], backend.quiet_s)
    assert [(m.offset(), m.value()) for m in member.records] == [(2, b"fresh")]


def test_a_fenced_producer_learns_it_only_from_the_broker(backend: Backend) -> None:
    """A transaction that holds nothing ends without the coordinator: a fenced producer commits
    it. Its next write fails, and the fatal error comes out of the poll (or flush) that serves
    it, once, then out of every transactional call."""
    topic = backend.topic(1)
    tid = txn_id()
    old = ready(backend, tid)
    old.begin_transaction()
    ready(backend, tid)
    old.commit_transaction(WAIT)
    old.begin_transaction()
    old.produce(topic, "zombie", partition=0)
    deadline = time.monotonic() + WAIT
    with pytest.raises(KafkaException) as caught:
        while time.monotonic() < deadline:
            old.flush(1)
            old.poll(0.1)
    err = caught.value.args[0]
    assert (err.code(), err.fatal()) == (KafkaError._FENCED, True)
    assert old.poll(0) == 0  # raised once
    assert raised(lambda: old.commit_transaction(WAIT)).code() == KafkaError._FENCED


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_offsets_sent_with_an_old_generation_are_refused_abortably(
    backend: Backend, protocol: str
) -> None:
    topic = backend.topic(2)
    group = f"contract-{time.monotonic_ns()}"
    log = Log()
    conf = group_conf(protocol)
    a = Member("A", backend.consumer(group, **conf), log)
    a.subscribe([topic])
    pump([a], lambda: len(a.owned()) == 2, "A owning both partitions")
    stale = a.client.consumer_group_metadata()
    p = ready(backend)
    p.begin_transaction()
    p.send_offsets_to_transaction([TopicPartition(topic, 0, 1)], stale, WAIT)
    p.commit_transaction(WAIT)

    b = Member("B", backend.consumer(group, **conf), log)
    b.subscribe([topic])
    pump([a, b], lambda: len(a.owned()) == 1 and len(b.owned()) == 1, "a partition each")
    p.begin_transaction()
    err = raised(lambda: p.send_offsets_to_transaction([TopicPartition(topic, 0, 2)], stale, WAIT))
    assert (err.code(), err.txn_requires_abort(), err.fatal()) == (
        KafkaError.ILLEGAL_GENERATION,
        True,
        False,
    )
    assert raised(lambda: p.commit_transaction(WAIT)).code() == KafkaError.ILLEGAL_GENERATION
    p.abort_transaction(WAIT)
    p.begin_transaction()
    p.send_offsets_to_transaction(
        [TopicPartition(topic, 0, 3)], a.client.consumer_group_metadata(), WAIT
    )
    p.commit_transaction(WAIT)
    assert committed(a.client, topic, 0) == [(3, None)]

    left = b.client.consumer_group_metadata()
    b.close()
    pump([a], lambda: len(a.owned()) == 2, "A owning both partitions again")
    p.begin_transaction()
    err = raised(lambda: p.send_offsets_to_transaction([TopicPartition(topic, 0, 4)], left, WAIT))
    assert (err.code(), err.txn_requires_abort()) == (KafkaError.UNKNOWN_MEMBER_ID, True)
    p.abort_transaction(WAIT)

    # A client outside the group (no member id, no generation): the classic coordinator takes
    # its offsets, KIP-848's refuses them.
    outsider = backend.consumer(group, **conf).consumer_group_metadata()
    p.begin_transaction()
    if protocol == "consumer":
        err = raised(
            lambda: p.send_offsets_to_transaction([TopicPartition(topic, 0, 5)], outsider, WAIT)
        )
        assert (err.code(), err.txn_requires_abort()) == (KafkaError.UNKNOWN_MEMBER_ID, True)
        p.abort_transaction(WAIT)
    else:
        p.send_offsets_to_transaction([TopicPartition(topic, 0, 5)], outsider, WAIT)
        p.commit_transaction(WAIT)
        assert committed(a.client, topic, 0) == [(5, None)]


# -- failed writes -----------------------------------------------------------------------------


def test_a_record_the_broker_refuses_fails_its_transaction_and_the_next_write_there(
    backend: Backend,
) -> None:
    # The broker refuses records over 64 KiB in this topic; the client (1 MB) sends them.
    topic = backend.topic(2, config={"max.message.bytes": "65536"})
    group = f"contract-{time.monotonic_ns()}"
    reader = backend.consumer(group)
    meta = reader.consumer_group_metadata()
    p = ready(backend)
    reports: Reports = []
    p.begin_transaction()
    p.send_offsets_to_transaction([TopicPartition(topic, 1, 7)], meta, WAIT)
    p.produce(topic, "x" * 200_000, partition=0, on_delivery=reporter(reports))
    err = raised(lambda: p.commit_transaction(WAIT))
    assert (err.code(), err.txn_requires_abort(), err.fatal()) == (
        KafkaError.MSG_SIZE_TOO_LARGE,
        True,
        False,
    )
    assert reports == [(KafkaError.MSG_SIZE_TOO_LARGE, None, True)]  # served inside commit
    # Until it aborts, every transactional call raises the error, and produce refuses.
    for call in (
        p.begin_transaction,
        lambda: p.send_offsets_to_transaction([TopicPartition(topic, 1, 8)], meta, WAIT),
        lambda: p.commit_transaction(WAIT),
    ):
        assert raised(call).code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert raised(lambda: p.produce(topic, "y", partition=1)).code() == KafkaError._STATE
    p.abort_transaction(WAIT)
    assert committed(reader, topic, 1) == [(OFFSET_INVALID, None)]

    # The refused record left a gap in the producer's sequence of partition 0: a transaction
    # that writes elsewhere commits, the next one that writes there fails too.
    p.begin_transaction()
    p.produce(topic, "elsewhere", partition=1)
    p.commit_transaction(WAIT)
    p.begin_transaction()
    p.produce(topic, "again", partition=0)
    err = raised(lambda: p.commit_transaction(WAIT))
    assert (err.code(), err.txn_requires_abort()) == (KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, True)
    p.abort_transaction(WAIT)
    p.begin_transaction()
    p.produce(topic, "third", partition=0)
    p.commit_transaction(WAIT)
    member = Member("C", backend.consumer(), Log())
    member.subscribe([topic])
    pump([member], lambda: len(member.records) == 2, "the committed records")
    poll_for([member], backend.quiet_s)
    assert sorted((m.partition(), m.value()) for m in member.records) == [
        (0, b"third"),
        (1, b"elsewhere"),
    ]


# -- the state machine -------------------------------------------------------------------------


def test_transactional_calls_out_of_turn_are_refused(backend: Backend) -> None:
    plain = backend.producer()
    for call in (
        lambda: plain.init_transactions(WAIT),
        plain.begin_transaction,
        lambda: plain.commit_transaction(WAIT),
        lambda: plain.abort_transaction(WAIT),
    ):
        assert raised(call).code() == KafkaError._NOT_CONFIGURED
    topic = backend.topic(1)
    p = backend.producer(txn_id())
    states: list[tuple[str, int, str]] = []

    def refused(what: str, call: Callable[[], object]) -> None:
        err = raised(call)
        states.append((what, err.code(), err.str()))

    refused("produce before init", lambda: p.produce(topic, "v", partition=0))
    refused("begin before init", p.begin_transaction)
    p.init_transactions(WAIT)
    refused("init again", lambda: p.init_transactions(WAIT))
    refused("produce before begin", lambda: p.produce(topic, "v", partition=0))
    refused("commit before begin", lambda: p.commit_transaction(WAIT))
    refused("abort before begin", lambda: p.abort_transaction(WAIT))
    p.begin_transaction()
    refused("begin again", p.begin_transaction)
    erroneous = "Unable to produce message: Local: Erroneous state"
    assert states == [
        ("produce before init", KafkaError._STATE, erroneous),
        ("begin before init", KafkaError._STATE, "Operation not valid in state Init"),
        ("init again", KafkaError._STATE, "Operation not valid in state Ready"),
        ("produce before begin", KafkaError._STATE, erroneous),
        ("commit before begin", KafkaError._STATE, "Operation not valid in state Ready"),
        ("abort before begin", KafkaError._STATE, "Operation not valid in state Ready"),
        ("begin again", KafkaError._STATE, "Operation not valid in state InTransaction"),
    ]
