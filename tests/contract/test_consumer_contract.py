"""The client contract weir relies on, checked on a real broker and on `weir.testing.FakeBroker`.

Each test runs twice (`backend` is `fake` or `real`) through `weir._engine.client.ConsumerClient`.
A test that passes on the real broker and fails on the fake is a bug in the fake.
"""

from __future__ import annotations

import time
import zlib
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_INVALID,
    TIMESTAMP_CREATE_TIME,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from tests.contract.conftest import (
    PROTOCOLS,
    TP,
    Backend,
    Log,
    Member,
    Rec,
    group_conf,
    poll_for,
    pump,
    real_only,
)

pytestmark = pytest.mark.timeout(120)


def parts(topic: str, n: int) -> tuple[TP, ...]:
    return tuple((topic, p) for p in range(n))


def tps(*items: TP | tuple[str, int, int]) -> list[TopicPartition]:
    return [TopicPartition(*item) for item in items]


# -- subscribing and reading -----------------------------------------------------------------


def test_subscribe_assigns_every_partition_inside_consume(backend: Backend) -> None:
    topic = backend.topic(3)
    log = Log()
    a = Member("A", backend.consumer(), log)
    a.subscribe([topic])
    assert log.events == []  # nothing is served inside subscribe()
    pump([a], lambda: len(a.owned()) == 3, "the assignment")
    assert log.of("A") == [("assign", parts(topic, 3))]
    assert [e.during for e in log.events] == ["consume"]


def test_records_of_a_partition_arrive_in_offset_order_with_their_fields(
    backend: Backend,
) -> None:
    topic = backend.topic(3)
    sent = [
        Rec(f"v{i}", key=f"k{i}", partition=i % 3, headers=[("n", str(i)), ("empty", None)])
        for i in range(30)
    ]
    backend.produce(topic, sent)
    a = Member("A", backend.consumer(), Log())
    a.subscribe([topic])
    pump([a], lambda: len(a.records) >= 30, "30 records")
    poll_for([a], backend.quiet_s)
    assert len(a.records) == 30
    for p in range(3):
        mine = [m for m in a.records if m.partition() == p]
        assert [m.offset() for m in mine] == list(range(10))
        assert [m.value() for m in mine] == [r.value.encode() for r in sent if r.partition == p]
    for m in a.records:
        i = int((m.value() or b"").decode()[1:])
        assert m.topic() == topic
        assert m.key() == f"k{i}".encode()
        assert list(m.headers() or []) == [("n", str(i).encode()), ("empty", None)]
        kind, stamp = m.timestamp()
        assert kind == TIMESTAMP_CREATE_TIME and abs(stamp / 1000 - time.time()) < 120
        assert m.error() is None


def test_keyed_records_land_where_the_default_partitioner_puts_them(backend: Backend) -> None:
    topic = backend.topic(5)
    keys = [f"customer-{i}" for i in range(40)]
    backend.produce(topic, [Rec("v", key=k) for k in keys])
    a = Member("A", backend.consumer(), Log())
    a.subscribe([topic])
    pump([a], lambda: len(a.records) >= 40, "40 records")
    # librdkafka's default partitioner (consistent_random) hashes keys with CRC-32.
    assert {((m.key() or b"").decode(), m.partition()) for m in a.records} == {
        (k, zlib.crc32(k.encode()) % 5) for k in keys
    }


def test_an_unknown_topic_is_reported_as_an_error_event(backend: Backend) -> None:
    missing = f"missing-{time.monotonic_ns()}"
    a = Member("A", backend.consumer(), Log())
    a.subscribe([missing])
    pump([a], lambda: bool(a.errors), "an error event")
    err = a.errors[0]
    assert err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert missing in str(err)
    assert not err.fatal()
    assert a.owned() == set()


def test_list_topics_and_watermarks(backend: Backend) -> None:
    topic = backend.topic(2)
    backend.produce(topic, [Rec("v", partition=0)] * 3)
    client = backend.consumer()
    meta = client.list_topics(topic, timeout=10).topics[topic]
    assert meta.error is None and sorted(meta.partitions) == [0, 1]
    unknown = f"missing-{time.monotonic_ns()}"
    assert client.list_topics(unknown, timeout=10).topics[unknown].error.code() == (
        KafkaError.UNKNOWN_TOPIC_OR_PART
    )
    assert client.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 3)
    assert client.get_watermark_offsets(TopicPartition(topic, 1), timeout=10) == (0, 0)


# -- positions, pause, seek ------------------------------------------------------------------


def test_position_is_the_last_consumed_offset_plus_one(backend: Backend) -> None:
    topic = backend.topic(2)
    backend.produce(topic, [Rec(f"v{i}", partition=0) for i in range(5)])
    a = Member("A", backend.consumer(), Log())
    a.subscribe([topic])
    pump([a], lambda: len(a.owned()) == 2, "the assignment", num=1)
    p0, p1 = tps((topic, 0), (topic, 1))
    unassigned = TopicPartition(topic, 7)
    if not a.records:  # (a poll may return the first record along with the assignment)
        assert [p.offset for p in a.client.position([p0, p1, unassigned])] == [OFFSET_INVALID] * 3
    pump([a], lambda: len(a.offsets((topic, 0))) >= 2, "two records", num=1)
    last = a.offsets((topic, 0))[-1]
    assert a.client.position([p0])[0].offset == last + 1
    assert a.client.position([p1, unassigned])[0].offset == OFFSET_INVALID  # nothing consumed


def test_pause_stops_a_partition_and_resume_continues_without_loss_or_duplicates(
    backend: Backend,
) -> None:
    topic = backend.topic(2)
    backend.produce(topic, [Rec(f"v{i}", partition=i % 2) for i in range(40)])
    a = Member("A", backend.consumer(), Log())
    a.subscribe([topic])
    pump([a], lambda: len(a.offsets((topic, 0))) >= 3, "three records of partition 0", num=1)
    p0 = TopicPartition(topic, 0)
    a.client.pause([p0])
    at_pause = a.client.position([p0])[0].offset
    seen = len(a.offsets((topic, 0)))
    assert at_pause == a.offsets((topic, 0))[-1] + 1
    pump([a], lambda: len(a.offsets((topic, 1))) == 20, "all of partition 1")
    poll_for([a], backend.quiet_s)
    assert len(a.offsets((topic, 0))) == seen  # nothing from the paused partition
    a.client.resume([p0])
    pump([a], lambda: len(a.offsets((topic, 0))) >= 20, "the rest of partition 0")
    poll_for([a], backend.quiet_s)
    assert a.offsets((topic, 0)) == list(range(20))  # no gap, no duplicate
    assert a.offsets((topic, 0))[seen] == at_pause
    assert a.offsets((topic, 1)) == list(range(20))


def test_seek_moves_the_position(backend: Backend) -> None:
    topic = backend.topic(1)
    backend.produce(topic, [Rec(f"v{i}", partition=0) for i in range(6)])
    a = Member("A", backend.consumer(), Log())
    a.subscribe([topic])
    pump([a], lambda: len(a.records) >= 6, "six records")
    p0 = TopicPartition(topic, 0)
    assert a.client.position([p0])[0].offset == 6
    a.client.seek(TopicPartition(topic, 0, 2))
    # Unknown again until the next record: the client only knows what it handed out.
    assert a.client.position([p0])[0].offset == OFFSET_INVALID
    a.records.clear()
    pump([a], lambda: len(a.records) >= 1, "a record after the seek", num=1)
    assert a.offsets((topic, 0))[0] == 2
    assert a.client.position([p0])[0].offset == 3
    with pytest.raises(KafkaException) as caught:
        a.client.seek(TopicPartition(topic, 5, 1))
    assert caught.value.args[0].code() == KafkaError._STATE
    assert "Erroneous state" in str(caught.value.args[0])


# -- commits ---------------------------------------------------------------------------------


def test_async_commit_results_arrive_through_on_commit_on_a_later_consume(
    backend: Backend,
) -> None:
    topic = backend.topic(2)
    results: list[tuple[KafkaError | None, list[tuple[TP, int, str | None, object]], str | None]]
    results = []
    a: Member

    def on_commit(err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        got = [((p.topic, p.partition), p.offset, p.metadata, p.error) for p in partitions]
        results.append((err, sorted(got, key=lambda x: x[0]), a.during))

    a = Member("A", backend.consumer(on_commit=on_commit), Log())
    a.subscribe([topic])
    pump([a], lambda: len(a.owned()) == 2, "the assignment")
    offsets = [TopicPartition(topic, 0, 3, "meta-0"), TopicPartition(topic, 1, 5)]
    assert a.client.commit(offsets=offsets, asynchronous=True) is None
    time.sleep(backend.quiet_s)
    assert results == []  # not without a consume()
    pump([a], lambda: bool(results), "the commit result")
    assert results == [
        (None, [((topic, 0), 3, "meta-0", None), ((topic, 1), 5, None, None)], "consume")
    ]


def test_sync_commit_returns_per_partition_results(backend: Backend) -> None:
    topic = backend.topic(2)
    client = backend.consumer()
    out = client.commit(
        offsets=[TopicPartition(topic, 0, 7, "m"), TopicPartition(topic, 1, 9)],
        asynchronous=False,
    )
    got = sorted(((p.topic, p.partition), p.offset, p.metadata, p.error) for p in out)
    assert got == [((topic, 0), 7, "m", None), ((topic, 1), 9, None, None)]


def test_committed_returns_offsets_and_metadata(backend: Backend) -> None:
    topic = backend.topic(4)
    group = f"contract-{time.monotonic_ns()}"
    writer = backend.consumer(group)
    reader = backend.consumer(group)
    stranger = backend.consumer()

    def committed(client: object) -> list[tuple[int, str | None]]:
        assert client is not None
        found = client.committed([TopicPartition(topic, p) for p in range(4)], timeout=10)  # type: ignore[attr-defined]
        return [(p.offset, p.metadata) for p in found]

    assert committed(reader) == [(OFFSET_INVALID, None)] * 4
    writer.commit(
        offsets=[
            TopicPartition(topic, 0, 3, '{"offsets": [5, 7]}'),
            TopicPartition(topic, 1, 4),
            TopicPartition(topic, 2, 5, ""),
            TopicPartition(topic, 3, 6, "é" * 2000),
        ],
        asynchronous=False,
    )
    assert committed(reader) == [(3, '{"offsets": [5, 7]}'), (4, None), (5, ""), (6, "é" * 2000)]
    assert committed(stranger) == [(OFFSET_INVALID, None)] * 4


def test_metadata_over_the_broker_limit_fails_the_commit_but_not_the_other_partitions(
    backend: Backend,
) -> None:
    topic = backend.topic(2)
    results: list[tuple[KafkaError | None, list[tuple[int, int | None]]]] = []

    def on_commit(err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        errors = [(p.partition, p.error.code() if p.error else None) for p in partitions]
        results.append((err, sorted(errors)))

    a = Member("A", backend.consumer(on_commit=on_commit), Log())
    # offset.metadata.max.bytes (4096) counts the NUL the Python client appends.
    a.client.commit(offsets=[TopicPartition(topic, 0, 1, "x" * 4095)], asynchronous=False)
    with pytest.raises(KafkaException) as caught:
        a.client.commit(
            offsets=[TopicPartition(topic, 0, 2, "ok"), TopicPartition(topic, 1, 2, "x" * 4096)],
            asynchronous=False,
        )
    assert caught.value.args[0].code() == KafkaError.OFFSET_METADATA_TOO_LARGE
    found = a.client.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    assert [(p.offset, p.metadata) for p in found] == [(2, "ok"), (OFFSET_INVALID, None)]
    a.client.commit(
        offsets=[TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 3, "y" * 5000)],
        asynchronous=True,
    )
    pump([a], lambda: bool(results), "the async commit result")
    err, errors = results[0]
    assert err is not None and err.code() == KafkaError.OFFSET_METADATA_TOO_LARGE
    # Every partition of the request carries the error, though the broker stored the others.
    too_large = KafkaError.OFFSET_METADATA_TOO_LARGE
    assert errors == [(0, too_large), (1, too_large)]
    found = a.client.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    assert [(p.offset, p.metadata) for p in found] == [(3, None), (OFFSET_INVALID, None)]


def test_commits_that_cannot_apply_raise(backend: Backend) -> None:
    topic = backend.topic(1)
    client = backend.consumer()
    for bad in (
        TopicPartition(f"missing-{time.monotonic_ns()}", 0, 1),
        TopicPartition(topic, 3, 1),
    ):
        with pytest.raises(KafkaException) as caught:
            client.commit(offsets=[bad], asynchronous=False)
        assert caught.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    with pytest.raises(KafkaException) as caught:
        client.commit(offsets=[], asynchronous=False)
    assert caught.value.args[0].code() == KafkaError._NO_OFFSET


def test_a_new_assignment_starts_at_the_committed_offset_or_per_auto_offset_reset(
    backend: Backend,
) -> None:
    topic = backend.topic(3)
    backend.produce(topic, [Rec(f"v{i}", partition=p) for p in range(3) for i in range(5)])
    group = f"contract-{time.monotonic_ns()}"
    backend.consumer(group).commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
    a = Member("A", backend.consumer(group, **{"auto.offset.reset": "earliest"}), Log())
    a.subscribe([topic])
    pump([a], lambda: len(a.records) >= 2 + 5 + 5, "the records after the committed offsets")
    assert a.offsets((topic, 0)) == [3, 4]
    assert a.offsets((topic, 1)) == list(range(5))
    late = Member("L", backend.consumer(**{"auto.offset.reset": "latest"}), Log())
    late.subscribe([topic])
    pump([late], lambda: len(late.owned()) == 3, "the assignment")
    poll_for([late], backend.quiet_s)

    def a_new_record() -> bool:
        if not late.records:
            backend.produce(topic, [Rec("new", partition=1)])
        return bool(late.records)

    # Produced until one arrives: the real client resolves "latest" a moment after the assign.
    pump([late], a_new_record, "a record produced after the assignment")
    assert {m.partition() for m in late.records} == {1}
    assert min(late.offsets((topic, 1))) >= 5


# -- transactions ----------------------------------------------------------------------------


def test_transaction_markers_and_aborted_records_leave_offset_gaps(backend: Backend) -> None:
    topic = backend.topic(2)
    backend.produce(topic, [Rec("a0", partition=0)])
    assert backend.transaction(topic, 0, ["c0", "c1"], commit=True) == [1, 2]  # marker 3
    # 4, 5; marker 6. One run found a1 at 6: only one of the two writes reached the log. The
    # layout after the abort is taken from the delivery reports, so a write that failed changes
    # the offsets expected here, not the contract checked.
    aborted = backend.transaction(topic, 0, ["x0", "x1"], commit=False)
    assert aborted, "the aborted transaction wrote nothing, so it left no marker to test"
    a1 = aborted[-1] + 2  # past the abort's marker
    backend.produce(topic, [Rec("a1", partition=0)])
    backend.produce(topic, [Rec("b0", partition=1)])
    assert backend.transaction(topic, 1, ["d0"], commit=True) == [1]  # marker 2, the log's end
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)

    committed = Member("C", backend.consumer(), Log())
    committed.subscribe([topic])
    pump([committed], lambda: len(committed.records) >= 6, "the committed records")
    poll_for([committed], backend.quiet_s)
    got = [(m.offset(), m.value()) for m in committed.records if m.partition() == 0]
    assert got == [(0, b"a0"), (1, b"c0"), (2, b"c1"), (a1, b"a1")]
    assert committed.offsets((topic, 1)) == [0, 1]
    assert committed.client.position([p0])[0].offset == a1 + 1
    assert committed.client.position([p1])[0].offset == 3  # past the trailing marker
    assert committed.client.get_watermark_offsets(p0, timeout=10) == (0, a1 + 1)

    everything = Member("U", backend.consumer(**{"isolation.level": "read_uncommitted"}), Log())
    everything.subscribe([topic])
    pump([everything], lambda: len(everything.records) >= 6 + len(aborted), "every record")
    assert everything.offsets((topic, 0)) == [0, 1, 2, *aborted, a1]


def test_a_trailing_marker_is_passed_by_the_consume_call_after_the_last_record(
    backend: Backend,
) -> None:
    topic = backend.topic(1)
    backend.transaction(topic, 0, ["c0", "c1"], commit=True)  # 0, 1; marker 2
    a = Member("A", backend.consumer(), Log())
    a.subscribe([topic])
    p0 = TopicPartition(topic, 0)
    pump([a], lambda: len(a.records) >= 2, "both records", num=1)
    # The record was handed out alone: the position is just past it, not past the marker.
    assert a.client.position([p0])[0].offset == 2
    pump([a], lambda: a.client.position([p0])[0].offset == 3, "the position past the marker")
    assert a.offsets((topic, 0)) == [0, 1]


# -- groups ----------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_members_joining_and_leaving_rebalance_and_hand_over_committed_offsets(
    backend: Backend, protocol: str
) -> None:
    topic = backend.topic(4)
    every = set(parts(topic, 4))
    backend.produce(topic, [Rec(f"v{i}", partition=p) for p in range(4) for i in range(2)])
    group = f"contract-{time.monotonic_ns()}"
    log = Log()
    conf = group_conf(protocol)
    a = Member("A", backend.consumer(group, **conf), log, commit_on_revoke=True)
    b = Member("B", backend.consumer(group, **conf), log, commit_on_revoke=True)

    a.subscribe([topic])
    pump([a], lambda: a.owned() == every and len(a.records) == 8, "A owning and reading all")
    assert log.of("A") == [("assign", parts(topic, 4))]

    # A second member joins. B polls first: it must still wait for A to give partitions up.
    b.subscribe([topic])
    pump([b, a], lambda: len(a.owned()) == 2 and len(b.owned()) == 2, "two partitions each")
    kept, moved = tuple(sorted(a.owned())), tuple(sorted(b.owned()))
    assert set(kept) | set(moved) == every
    if protocol == "range":  # eager: everything is revoked, then everything assigned
        assert log.of("A", empty=False) == [
            ("assign", parts(topic, 4)),
            ("revoke", parts(topic, 4)),
            ("assign", kept),
        ]
        assert log.of("B", empty=False) == [("assign", moved)]
        assert log.seq("B", "assign", moved) > log.seq("A", "revoke", every)
    else:  # incremental: only the moved partitions are revoked
        assert log.of("A", empty=False) == [("assign", parts(topic, 4)), ("revoke", moved)]
        assert log.of("B", empty=False) == [("assign", moved)]
        assert log.seq("B", "assign", moved) > log.seq("A", "revoke", moved)
    assert all(e.kind == "assign" for e in log.events if not e.partitions)  # empty ones
    assert all(e.during == "consume" for e in log.events)

    # The new owner starts where the old one committed inside on_revoke.
    assert {tp: a.revoke_commits[tp] for tp in moved} == dict.fromkeys(moved, 2)
    backend.produce(topic, [Rec("more", partition=p) for p in range(4)])
    pump([a, b], lambda: len(a.records) + len(b.records) == 12, "the new records")
    poll_for([a, b], backend.quiet_s)
    assert sorted(b.offsets(tp)[0] for tp in moved) == [2, 2]
    assert sorted((m.partition(), m.offset()) for m in a.records + b.records) == sorted(
        [(p, i) for p in range(4) for i in range(3)]
    )

    # B unsubscribes: its revoke comes on its next consume, then A gets everything.
    before = len(log.events)
    b.client.unsubscribe()
    assert len(log.events) == before
    pump([a, b], lambda: a.owned() == every and not b.owned(), "A owning all again")
    assert log.events[before].member == "B" and log.events[before].kind == "revoke"
    assert log.events[before].during == "consume"
    gained = [e for e in log.events[before:] if e.member == "A" and e.partitions]
    if protocol == "range":
        assert [(e.kind, e.partitions) for e in gained] == [
            ("revoke", kept),
            ("assign", parts(topic, 4)),
        ]
    else:
        assert [(e.kind, e.partitions) for e in gained] == [("assign", moved)]

    # B joins again and closes: the revoke runs inside close() and A takes over.
    b.subscribe([topic])
    pump([a, b], lambda: len(a.owned()) == 2 and len(b.owned()) == 2, "two each again")
    before = len(log.events)
    b.close()
    closing = [e for e in log.events[before:] if e.member == "B"]
    assert [(e.kind, e.during) for e in closing] == [("revoke", "close")]
    assert len(closing[0].partitions) == 2
    pump([a], lambda: a.owned() == every, "A owning all after B closed")

    before = len(log.events)
    a.close()
    assert [(e.member, e.kind, e.partitions, e.during) for e in log.events[before:]] == [
        ("A", "revoke", parts(topic, 4), "close")
    ]
    with pytest.raises(RuntimeError, match="Consumer closed"):
        a.client.consume(1, 0)
    a.client.close()  # closing twice is harmless


# Classic protocols only: under KIP-848 the broker moves the partitions only after its own
# session timeout (group.consumer.session.timeout.ms, 6 s on the embedded broker), too slow
# for this suite; the fake, which has no clock, hands them over at once for every protocol.
@pytest.mark.parametrize("protocol", ["range", "cooperative-sticky"])
def test_a_member_that_misses_max_poll_interval_loses_its_partitions(
    backend: Backend, protocol: str
) -> None:
    topic = backend.topic(2)
    group = f"contract-{time.monotonic_ns()}"
    log = Log()
    # session.timeout.ms may not exceed max.poll.interval.ms
    conf: dict[str, Any] = {**group_conf(protocol), "max.poll.interval.ms": 1500}
    conf["session.timeout.ms"] = 1000
    a = Member("A", backend.consumer(group, **conf), log, conf)
    b = Member("B", backend.consumer(group, **conf), log, conf)
    a.subscribe([topic])
    b.subscribe([topic])
    pump([a, b], lambda: len(a.owned()) == 1 and len(b.owned()) == 1, "one partition each")
    lost = tuple(sorted(a.owned()))
    before = len(log.events)

    backend.miss_poll_interval(a, [b])
    pump([b], lambda: b.owned() == set(parts(topic, 2)), "B owning both")
    assert [e for e in log.events[before:] if e.member == "A"] == []  # A was not polling

    pump([a], lambda: any(e.member == "A" and e.kind == "lost" for e in log.events), "on_lost")
    # The first event that moves partitions: a cooperative rebalance's second round, an empty
    # incremental assign, can still be pending for A when "one partition each" first holds (seen
    # on a loaded machine), and it comes first.
    first = next(e for e in log.events[before:] if e.member == "A" and e.partitions)
    assert (first.kind, first.partitions, first.during) == ("lost", lost, "consume")
    pump([a], lambda: bool(a.errors), "the error event")
    assert a.errors[0].code() == KafkaError._MAX_POLL_EXCEEDED


def test_a_paused_partition_stays_paused_when_it_is_assigned_again(backend: Backend) -> None:
    topic = backend.topic(2)
    backend.produce(topic, [Rec(f"v{i}", partition=p) for p in range(2) for i in range(3)])
    group = f"contract-{time.monotonic_ns()}"
    log = Log()
    conf = group_conf("cooperative-sticky")
    a = Member("A", backend.consumer(group, **conf), log, commit_on_revoke=True)
    a.subscribe([topic])
    pump([a], lambda: len(a.records) == 6, "every record")
    every = [TopicPartition(topic, p) for p in range(2)]
    a.client.pause(every)
    b = Member("B", backend.consumer(group, **conf), log, commit_on_revoke=True)
    b.subscribe([topic])
    pump([a, b], lambda: len(a.owned()) == 1 and len(b.owned()) == 1, "one partition each")
    b.close()
    pump([a], lambda: len(a.owned()) == 2, "A owning both again")
    backend.produce(topic, [Rec("after", partition=p) for p in range(2)])
    poll_for([a], backend.quiet_s)
    # The client keeps the pause flag of a partition that leaves and comes back.
    assert len(a.records) == 6
    a.client.resume(every)
    pump([a], lambda: len(a.records) == 8, "the records after resume")
    poll_for([a], backend.quiet_s)
    assert sorted((m.partition(), m.offset()) for m in a.records[6:]) == [(0, 3), (1, 3)]


# -- configuration ---------------------------------------------------------------------------


def test_the_client_configuration_is_validated_at_construction(backend: Backend) -> None:
    with pytest.raises(KafkaException) as caught:
        conf: dict[str, Any] = {"group.protocol": "consumer", "session.timeout.ms": 6000}
        backend.consumer(**conf)
    assert caught.value.args[0].code() == KafkaError._INVALID_ARG
    assert "session.timeout.ms" in str(caught.value.args[0])
    with pytest.raises(KafkaException) as caught:
        backend.consumer(**{"auto.offset.reset": "soonest"})
    assert caught.value.args[0].code() == KafkaError._INVALID_ARG
    with pytest.raises(KafkaException) as caught:
        backend.consumer(**{"partition.assignment.strategy": "range,cooperative-sticky"})
    assert caught.value.args[0].code() == KafkaError._INVALID_ARG
    with pytest.raises(KafkaException) as caught:
        backend.consumer(on_commit="not callable")
    assert caught.value.args[0].code() == KafkaError._INVALID_ARG
    with pytest.raises(ValueError, match=r"group\.id must be set"):
        backend.make({"auto.offset.reset": "earliest"})


def test_consume_takes_zero_to_a_million_messages(backend: Backend) -> None:
    client = backend.consumer()
    assert list(client.consume(0, 0)) == []
    with pytest.raises(ValueError):
        client.consume(1_000_001, 0)


# -- what the fake does not model ------------------------------------------------------------


def test_a_static_member_keeps_its_partitions_across_a_restart(backend: Backend) -> None:
    real_only(
        "static membership (group.instance.id) is not modelled: a fake member's close() "
        "always leaves the group"
    )(backend)
    topic = backend.topic(2)
    group = f"contract-{time.monotonic_ns()}"
    log = Log()
    conf = group_conf("cooperative-sticky")
    a = Member("A", backend.consumer(group, **conf, **{"group.instance.id": "a"}), log)
    b = Member("B", backend.consumer(group, **conf), log)
    a.subscribe([topic])
    b.subscribe([topic])
    pump([a, b], lambda: len(a.owned()) == 1 and len(b.owned()) == 1, "one partition each")
    held = tuple(sorted(a.owned()))
    a.close()  # a static member sends no LeaveGroup: its partitions wait for it
    before = len(log.events)
    poll_for([b], 1.0)
    assert [e for e in log.events[before:] if e.member == "B" and e.partitions] == []
    again = Member("A2", backend.consumer(group, **conf, **{"group.instance.id": "a"}), log)
    again.subscribe([topic])
    pump([again, b], lambda: set(again.owned()) == set(held), "the restarted member's partitions")
    assert [e for e in log.events[before:] if e.member == "B" and e.partitions] == []
