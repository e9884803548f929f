"""GroupConsumer on a real broker: the watermark, restarts, key order, transaction-marker gaps."""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections import defaultdict

import pytest
from confluent_kafka import Producer

from tests.consumer_overrides import GroupProtocol
from tests.integration.kafka_helpers import (
    Seen,
    committed,
    end_offsets,
    keyed_orders,
    member,
    produce,
    wait_until,
)
from weir import HandlerError, Record
from weir.testing.pytest_plugin import TopicFactory

PROTOCOLS: list[GroupProtocol] = ["classic", "consumer"]


def _group() -> str:
    return f"g-{uuid.uuid4().hex[:10]}"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_out_of_order_completion_commits_only_the_contiguous_prefix(
    kafka_bootstrap: str, make_topic: TopicFactory, protocol: GroupProtocol
) -> None:
    topic = make_topic(1)
    produce(kafka_bootstrap, topic, [(None, b"v%d" % i) for i in range(20)])
    group = _group()
    release = threading.Event()
    seen = Seen()

    def handle(r: Record) -> None:
        if r.offset == 5:
            assert release.wait(30)
        seen.add(r)

    gc = member(
        handle,
        kafka_bootstrap,
        group,
        [topic],
        ordering="unordered",
        workers=8,
        group_protocol=protocol,
    )
    with gc:
        assert seen.wait_for(19, 30), "the 19 records other than offset 5 were not processed"
        # Several commit intervals pass with offset 5 unfinished: the group must stay at 5.
        wait_until(
            lambda: gc.stats().partitions and gc.stats().partitions[0].committed == 5,
            15,
            "a commit at offset 5",
        )
        time.sleep(0.6)
        assert committed(kafka_bootstrap, group, topic, 1) == [5]
        release.set()
        wait_until(lambda: gc.stats().partitions[0].committed == 20, 15, "a commit at 20")
    assert committed(kafka_bootstrap, group, topic, 1) == [20]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_handler_failure_commits_below_it_and_a_restart_resumes_there(
    kafka_bootstrap: str, make_topic: TopicFactory, protocol: GroupProtocol
) -> None:
    topic = make_topic(1)
    produce(kafka_bootstrap, topic, [(b"same-key", b"v%d" % i) for i in range(30)])
    group = _group()
    first = Seen()

    def failing(r: Record) -> None:
        if r.offset == 12:
            raise RuntimeError("poison")
        first.add(r)

    gc = member(failing, kafka_bootstrap, group, [topic], workers=4, group_protocol=protocol)
    gc.start()
    with pytest.raises(HandlerError) as info:
        gc.join(60)
    assert info.value.record.offset == 12
    assert isinstance(info.value.__cause__, RuntimeError)
    # Key order: nothing after the failed record of the same key ran.
    assert max(o for _, o in first.offsets()) == 11
    assert committed(kafka_bootstrap, group, topic, 1) == [12]

    second = Seen()
    gc2 = member(second.add, kafka_bootstrap, group, [topic], workers=4, group_protocol=protocol)
    with gc2:
        assert second.wait_for(18, 30)
    assert min(o for _, o in second.offsets()) == 12, "the restart did not resume at the failure"
    assert first.offsets() | second.offsets() == {(0, o) for o in range(30)}
    assert committed(kafka_bootstrap, group, topic, 1) == [30]


def test_key_order_holds_per_key_under_parallelism(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    topic = make_topic(3)
    produce(kafka_bootstrap, topic, keyed_orders(3000, keys=40))
    started: dict[int, list[int]] = defaultdict(list)
    running: dict[int, int] = defaultdict(int)
    overlap: list[int] = []
    max_parallel = [0]
    active = [0]
    lock = threading.Lock()
    done = Seen()

    def handle(r: Record) -> None:
        v = json.loads(r.value or b"{}")
        with lock:
            started[v["key"]].append(v["seq"])
            running[v["key"]] += 1
            if running[v["key"]] > 1:
                overlap.append(v["key"])
            active[0] += 1
            max_parallel[0] = max(max_parallel[0], active[0])
        time.sleep(0.0005)
        with lock:
            running[v["key"]] -= 1
            active[0] -= 1
        done.add(r)

    with member(handle, kafka_bootstrap, _group(), [topic], ordering="key", workers=16):
        assert done.wait_for(3000, 60)
    assert not overlap, f"records of one key ran concurrently: keys {sorted(set(overlap))[:5]}"
    for key, seqs in started.items():
        assert seqs == sorted(seqs), f"key {key} ran out of order"
        assert seqs == list(range(len(seqs))), f"key {key} skipped or repeated a record"
    assert max_parallel[0] > 1, "different keys never ran in parallel"


def test_transaction_markers_leave_gaps_that_never_stall(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    topic = make_topic(1)
    p = Producer(
        {"bootstrap.servers": kafka_bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"}
    )
    p.init_transactions(30)
    expected = set()
    value = 0
    for tx in range(6):
        p.begin_transaction()
        for _ in range(5):
            p.produce(topic, value=str(value).encode())
            if tx % 3 != 1:
                expected.add(value)
            value += 1
        if tx % 3 == 1:
            # Flush first: abort purges records still queued in the client, and the test needs
            # aborted records on the log.
            assert p.flush(30) == 0
            p.abort_transaction(30)
        else:
            p.commit_transaction(30)
    group = _group()
    seen = Seen()
    gc = member(seen.add, kafka_bootstrap, group, [topic], ordering="unordered", workers=4)
    # 30 records + 6 markers; markers are written after commit_transaction returns, so the
    # stable end offset (read_committed) can trail for a moment.
    wait_until(lambda: end_offsets(kafka_bootstrap, topic, 1)[0] == 36, 20, "the stable end offset")
    end = 36
    with gc:
        assert seen.wait_for(len(expected), 30)
        # The last offset is a commit marker: the watermark must still reach the end.
        wait_until(
            lambda: gc.stats().partitions and gc.stats().partitions[0].committed == end,
            15,
            "a commit at the end offset past the final marker",
        )
    got = {int(v) for _, _, _, v in seen.calls if v is not None}
    assert got == expected, "read_committed must hide aborted records and show every committed one"
    assert committed(kafka_bootstrap, group, topic, 1) == [end]
    offsets = sorted(o for _, o in seen.offsets())
    assert any(b - a > 1 for a, b in itertools.pairwise(offsets)), "expected gaps at markers"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unreachable_broker_is_reported_within_the_startup_timeout(
    protocol: GroupProtocol,
) -> None:
    from weir import BrokerUnreachableError, GroupConsumer
    from weir.testing.broker import pick_free_port

    port = pick_free_port()  # nothing listens there
    gc = GroupConsumer(
        lambda r: None,
        bootstrap_servers=f"127.0.0.1:{port}",
        group_id="nobody",
        topics=["t"],
        group_protocol=protocol,
        startup_timeout_s=2.0,
    )
    t0 = time.monotonic()
    with pytest.raises(BrokerUnreachableError, match=f"127.0.0.1:{port}"):
        gc.run(handle_signals=False)
    assert time.monotonic() - t0 < 6.0
