"""FakeBroker's own API: what a user calls to set up and check a test of their handlers.

How its consumers behave as Kafka clients is checked against a real broker by tests/contract/;
these tests cover what only the fake has (producing, transactions, waiting for commits, expiry)
and running `GroupConsumer` on it as the docs show.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from tests.consumer_overrides import Overrides
from typing_extensions import Unpack

from weir import Context, GroupConsumer, Handler, HandlerError, Partition, Record
import weir.testing
from weir.config import ConsumerSettings
from weir.testing import FakeBroker

pytestmark = pytest.mark.timeout(60)


class Seen:
    def __init__(self, delay: float = 0.0) -> None:
        self.lock = threading.Lock()
        self.delay = delay
        self.count: Counter[tuple[int, int]] = Counter()

    def __call__(self, record: Record) -> None:
        time.sleep(self.delay)
        with self.lock:
            self.count[(record.partition, record.offset)] += 1


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def member(
    broker: FakeBroker, handler: Seen | Handler, **overrides: Unpack[Overrides]
) -> GroupConsumer:
    settings: ConsumerSettings = {
        "bootstrap_servers": "fake:9092",
        "group_id": "billing",
        "topics": ["orders"],
        "auto_offset_reset": "earliest",
        "commit_interval_s": 0.05,
        **overrides,
    }
    return GroupConsumer(handler, consumer_factory=broker.consumer_factory, **settings)


@pytest.mark.parametrize(
    "settings",
    [{}, {"assignment_strategy": "range"}, {"group_protocol": "consumer"}],
    ids=["cooperative-sticky", "range", "kip-848"],
)
def test_group_consumers_share_the_work_and_commit_to_the_end(settings: Overrides) -> None:
    broker = FakeBroker()
    broker.create_topic("orders", partitions=4)
    for i in range(300):
        broker.produce("orders", key=f"customer-{i % 9}", value=f"order-{i}")
    seen = Seen(delay=0.001)
    # Partition order: a revoke drains the partition's in-flight task and commits past it, so a
    # hand-over that waits for the revoke replays nothing.
    settings = {**settings, "ordering": "partition"}
    with member(broker, seen, **settings):
        # The second member joins while the first has records in flight: the hand-over must
        # wait for its revoke (drain, commit) or the newcomer replays them.
        wait_until(lambda: len(seen.count) >= 20)
        with member(broker, seen, **settings):
            for i in range(100):
                broker.produce("orders", key=f"customer-{i % 9}", value=f"order-{i}")
            broker.wait_until_committed("billing")
            assignment = broker.wait_for_assignment("billing", members=2)
            assert [len(parts) for parts in assignment.values()] == [2, 2]
        for i in range(20):
            broker.produce("orders", key=f"customer-{i % 9}", value=f"late-{i}")
        broker.wait_until_committed("billing")
    every = {(m.partition(), m.offset()) for m in broker.messages("orders")}
    assert len(every) == 420
    assert set(seen.count) == every
    assert max(seen.count.values()) == 1  # hand-overs committed in on_revoke: no replay
    assert broker.committed_offsets("billing") == {
        ("orders", p): end for p, end in broker.end_offsets("orders").items()
    }
    assert broker.members("billing") == []


def test_an_expired_member_loses_its_partitions_and_nothing_is_skipped() -> None:
    broker = FakeBroker()
    broker.create_topic("orders", partitions=2)
    seen = Seen()
    with member(broker, seen), member(broker, seen):
        broker.wait_until_committed("billing")
        wait_until(lambda: len(broker.assignments("billing")) == 2)  # both members joined
        first = broker.consumers[0]
        broker.expire(first)
        for i in range(50):
            broker.produce("orders", value=f"v{i}")
        broker.wait_until_committed("billing")
        wait_until(lambda: sorted(map(len, broker.assignments("billing").values())) == [1, 1])
        events = [
            e for batch in first.delivered_batches for m in batch if (e := m.error()) is not None
        ]
        assert [e.code() for e in events] == [KafkaError._MAX_POLL_EXCEEDED]
    assert set(seen.count) == {(m.partition(), m.offset()) for m in broker.messages("orders")}
    with pytest.raises(ValueError, match="member of a group"):
        broker.expire(first)


def test_produce_partitions_like_the_client_and_stores_bytes() -> None:
    broker = FakeBroker()
    broker.create_topic("t", partitions=3)
    keyed = broker.produce("t", key="k1", value="v", headers={"h": "x", "n": None})
    assert keyed.partition() == zlib.crc32(b"k1") % 3
    assert (keyed.key(), keyed.value(), keyed.headers()) == (
        b"k1",
        b"v",
        [("h", b"x"), ("n", None)],
    )
    assert [broker.produce("t", value=b"u").partition() for _ in range(4)] == [0, 1, 2, 0]
    explicit = broker.produce("t", value=b"e", partition=2, timestamp=1234)
    assert (explicit.partition(), explicit.timestamp()[1]) == (2, 1234)
    assert explicit.offset() == len(broker.messages("t", 2)) - 1
    with pytest.raises(KafkaException) as caught:
        broker.produce("t", value=b"x", partition=3)
    assert caught.value.args[0].code() == KafkaError._UNKNOWN_PARTITION
    with pytest.raises(KafkaException) as caught:
        broker.produce("missing", value=b"x")
    assert caught.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    with pytest.raises(TypeError, match="value must be str, bytes or None"):
        broker.produce("t", value=5)  # type: ignore[arg-type]


def test_topics_are_created_explicitly_or_on_first_produce() -> None:
    broker = FakeBroker()
    with pytest.raises(ValueError, match="partitions"):
        broker.create_topic("t", partitions=0)
    broker.create_topic("t", 2)
    with pytest.raises(KafkaException) as caught:
        broker.create_topic("t")
    assert caught.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    broker.create_partitions("t", 5)
    assert broker.topics() == {"t": 5}
    with pytest.raises(ValueError, match="must be more"):
        broker.create_partitions("t", 5)
    auto = FakeBroker(auto_create_topics=True)
    auto.produce("fresh", value=b"v")
    assert auto.topics() == {"fresh": 1}


def test_new_partitions_are_assigned_to_the_subscribed_members() -> None:
    broker = FakeBroker()
    broker.create_topic("orders", partitions=1)
    seen = Seen()
    with member(broker, seen):
        broker.wait_until_committed("billing")
        broker.create_partitions("orders", 3)
        for p in range(3):
            broker.produce("orders", value=b"v", partition=p)
        broker.wait_until_committed("billing")
    assert set(seen.count) == {(0, 0), (1, 0), (2, 0)}


def test_a_transaction_commits_on_success_and_aborts_on_an_exception() -> None:
    broker = FakeBroker()
    broker.create_topic("t", partitions=1)
    with broker.transaction() as txn:
        txn.produce("t", value="c0")
        assert broker.lag("g", "t") == {0: 0}  # open: nothing stable to read yet
    assert txn.state == "committed"
    with pytest.raises(RuntimeError), broker.transaction() as aborted:
        aborted.produce("t", value="x0")
        raise RuntimeError("handler failed")
    assert aborted.state == "aborted"
    with pytest.raises(KafkaException):
        aborted.produce("t", value="late")
    assert [m.value() for m in broker.messages("t")] == [b"c0"]
    assert [m.value() for m in broker.messages("t", committed_only=False)] == [b"c0", b"x0"]
    assert broker.end_offsets("t") == {0: 4}  # two records, two markers
    assert broker.lag("g", "t") == {0: 4}


def test_wait_until_committed_names_the_lag_when_it_gives_up() -> None:
    broker = FakeBroker()
    broker.create_topic("t", partitions=2)
    broker.produce("t", value=b"v", partition=1)
    broker.commit("g", [TopicPartition("t", 0, 0, "m")])
    assert broker.committed_offsets("g") == {("t", 0): 0}
    assert broker.committed_metadata("g") == {("t", 0): "m"}
    with pytest.raises(TimeoutError, match=r"\('t', 1\): 1"):
        broker.wait_until_committed("g", ["t"], timeout=0.05)
    with pytest.raises(TimeoutError, match="no topics"):
        broker.wait_until_committed("nobody", timeout=0.05)
    with pytest.raises(TimeoutError, match="did not settle with 2 members"):
        broker.wait_for_assignment("nobody", members=2, timeout=0.05)


def test_a_seeded_commit_is_where_a_member_starts() -> None:
    broker = FakeBroker()
    broker.create_topic("orders", partitions=1)
    for i in range(10):
        broker.produce("orders", value=f"v{i}")
    broker.commit("billing", [TopicPartition("orders", 0, 7)])
    seen = Seen()
    with member(broker, seen):
        broker.wait_until_committed("billing")
    assert sorted(seen.count) == [(0, 7), (0, 8), (0, 9)]


def test_a_broker_consumer_is_configured_like_the_client() -> None:
    broker = FakeBroker()
    with pytest.raises(ValueError, match=r"group\.id must be set"):
        broker.consumer_factory({})
    consumer = broker.consumer_factory({"group.id": "g"})
    with pytest.raises(RuntimeError, match="scripted"):
        consumer.script_assign([("t", 0)])
    assert consumer.memberid() == ""
    broker.create_topic("t")
    consumer.subscribe(["t"])
    assert consumer.memberid() == broker.members("g")[0]
    assert consumer.consumer_group_metadata().group_id == "g"


def test_importing_weir_testing_does_not_import_the_fake() -> None:
    code = (
        "import sys, weir.testing as t; "
        "assert not {'weir.testing.fake', 'weir.testing.fake_broker'} & set(sys.modules); "
        "assert t.FakeBroker is __import__('weir.testing.fake', fromlist=['x']).FakeBroker"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_module_of_weir_testing_imports_itself_through_others() -> None:
    """Every import counts, at any depth (inside a function, under TYPE_CHECKING): a cycle
    ties modules together however it is hidden (the fake's consumer and broker modules once
    imported each other)."""
    root = Path(weir.testing.__file__).parent
    names = {f"weir.testing.{path.stem}": path for path in root.glob("*.py")}
    imports: dict[str, set[str]] = {}
    for name, path in names.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        imports[name] = found & set(names)

    def cycle_from(name: str, path: list[str]) -> list[str] | None:
        if name in path:
            return [*path[path.index(name) :], name]
        for nxt in sorted(imports[name]):
            found = cycle_from(nxt, [*path, name])
            if found:
                return found
        return None

    cycles = [c for name in sorted(imports) if (c := cycle_from(name, []))]
    assert not cycles, f"import cycle: {' -> '.join(cycles[0])}"


# -- the examples of docs/testing-without-a-broker.md -----------------------------------------


class Tracking(Handler):
    def __init__(self) -> None:
        self.events: list[tuple[str, list[int]]] = []

    def handle(self, record: Record, ctx: Context) -> None:
        pass

    def on_assigned(self, partitions: Sequence[Partition]) -> None:
        self.events.append(("assigned", sorted(p.partition for p in partitions)))

    def on_revoked(self, partitions: Sequence[Partition]) -> None:
        self.events.append(("revoked", sorted(p.partition for p in partitions)))

    def on_lost(self, partitions: Sequence[Partition]) -> None:
        self.events.append(("lost", sorted(p.partition for p in partitions)))


def test_hooks_see_a_second_member_take_half_the_partitions() -> None:
    broker = FakeBroker()
    broker.create_topic("orders", partitions=4)
    first, second = Tracking(), Tracking()
    with member(broker, first):
        broker.wait_for_assignment("billing", members=1)
        with member(broker, second):
            assignment = broker.wait_for_assignment("billing", members=2)
            assert sorted(map(len, assignment.values())) == [2, 2]
    assert first.events[:2] == [("assigned", [0, 1, 2, 3]), ("revoked", [2, 3])]
    assert second.events[0] == ("assigned", [2, 3])


def test_hooks_see_an_expired_member_lose_its_partitions() -> None:
    broker = FakeBroker()
    broker.create_topic("orders", partitions=2)
    handler = Tracking()
    with member(broker, handler) as consumer:
        assert consumer.wait_started(5)
        broker.wait_for_assignment("billing")
        broker.expire(broker.consumers[0])
        wait_until(lambda: ("lost", [0, 1]) in handler.events)
        broker.wait_for_assignment("billing")
    assert handler.events[:3] == [("assigned", [0, 1]), ("lost", [0, 1]), ("assigned", [0, 1])]


def test_a_poison_record_stops_the_member_below_it() -> None:
    broker = FakeBroker()
    broker.create_topic("orders", partitions=1)
    for value in ["ok", "ok", "poison", "ok"]:
        broker.produce("orders", value=value)

    def handle(record: Record) -> None:
        if record.value == b"poison":
            raise ValueError("cannot parse")

    consumer = GroupConsumer(
        handle,
        bootstrap_servers="fake:9092",
        group_id="billing",
        topics=["orders"],
        ordering="partition",
        auto_offset_reset="earliest",
        consumer_factory=broker.consumer_factory,
    ).start()
    with pytest.raises(HandlerError):
        consumer.join(10)
    assert broker.committed_offsets("billing") == {("orders", 0): 2}


def test_aborted_transactions_are_never_handled() -> None:
    broker = FakeBroker()
    broker.create_topic("orders", partitions=1)
    with broker.transaction() as txn:
        txn.produce("orders", value="kept")
    txn = broker.transaction()
    txn.produce("orders", value="dropped")
    txn.abort()
    seen = Seen()
    with member(broker, seen):
        broker.wait_until_committed("billing")
    assert list(seen.count) == [(0, 0)]
    assert broker.committed_offsets("billing") == {("orders", 0): 4}
