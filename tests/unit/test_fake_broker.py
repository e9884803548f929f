"""FakeBroker's own API: what a user calls to set up and check a test of their handlers.

How its consumers behave as Kafka clients is checked against a real broker by tests/contract/;
these tests cover what only the fake has (producing, transactions, waiting for commits, expiry)
and running `GroupConsumer` on it as the docs show.
"""

from __future__ import annotations

import ast
import importlib
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from tests.consumer_overrides import Overrides
from typing_extensions import Unpack

import weir.testing
from weir import (
    Context,
    FailurePolicy,
    GroupConsumer,
    Handler,
    HandlerError,
    Partition,
    Record,
    RetryPolicy,
)
from weir.config import ConsumerSettings
from weir.testing import FakeBroker, FakeConsumer, FakeGroupMetadata

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
    broker: FakeBroker,
    handler: Seen | Handler | Callable[[Record], None],
    *,
    producing: bool = False,
    **overrides: Unpack[Overrides],
) -> GroupConsumer:
    """A member on `broker`; `producing`: its producers too (exactly-once, dead letters)."""
    settings: ConsumerSettings = {
        "bootstrap_servers": "fake:9092",
        "group_id": "billing",
        "topics": ["orders"],
        "auto_offset_reset": "earliest",
        "commit_interval_s": 0.05,
        **overrides,
    }
    return GroupConsumer(
        handler,
        consumer_factory=broker.consumer_factory,
        producer_factory=broker.producer_factory if producing else None,
        **settings,
    )


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
    """weir.testing is a pytest plugin, imported in every run of every project that installs
    weir: its names resolve lazily. Imported afresh here; the modules this run had loaded are put
    back afterwards, and those the fresh import loaded dropped (one class per name)."""

    def ours() -> dict[str, ModuleType]:
        return {n: m for n, m in sys.modules.items() if n.split(".")[:2] == ["weir", "testing"]}

    before = ours()
    try:
        for name in before:
            del sys.modules[name]
        fresh = importlib.import_module("weir.testing")
        loaded = set(ours())
        assert not loaded & {"weir.testing.fake", "weir.testing.fake_broker"}, loaded
        assert fresh.FakeBroker is importlib.import_module("weir.testing.fake").FakeBroker
    finally:
        for name in ours():
            del sys.modules[name]
        sys.modules.update(before)


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


class Enrich(Handler):
    """What an exactly-once pipeline does: one output per input, in the member's transaction."""

    def handle(self, record: Record, ctx: Context) -> None:
        ctx.produce("enriched", (record.value or b"") + b"!", record.key)


def test_an_exactly_once_member_writes_every_output_once_through_a_refused_write() -> None:
    broker = FakeBroker()
    broker.create_topic("orders", partitions=3)
    broker.create_topic("enriched", partitions=3)
    for i in range(200):
        broker.produce("orders", key=f"customer-{i % 7}", value=f"order-{i}")
    consumer = member(
        broker,
        Enrich(),
        producing=True,
        transactional_id="enricher-1",
        transaction_interval_s=0.05,
    )
    with consumer:
        broker.wait_until_committed("billing", timeout=10)
        (producer,) = broker.producers
        # The broker refuses the next output: its transaction aborts, its records run again.
        producer.fail_deliveries(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"))
        for i in range(200, 400):
            broker.produce("orders", key=f"customer-{i % 7}", value=f"order-{i}")
        broker.wait_until_committed("billing", timeout=10)
    outputs = Counter(m.value() for m in broker.messages("enriched"))  # read_committed
    assert outputs == Counter(f"order-{i}!".encode() for i in range(400))
    assert [t.state for t in producer.transactions].count("aborted") >= 1
    assert producer.conf["transactional.id"] == "enricher-1"


def test_a_dead_letter_goes_through_the_fakes_plain_producer() -> None:
    broker = FakeBroker()
    broker.create_topic("orders", partitions=1)
    broker.create_topic("orders.dlq", partitions=1)
    for value in ["ok", "poison", "ok"]:
        broker.produce("orders", key="k", value=value)

    def handle(record: Record) -> None:
        assert record.value != b"poison", "cannot parse"

    policy = FailurePolicy(retry=RetryPolicy(max_attempts=1), final="dead_letter")
    with member(broker, handle, producing=True, failure=policy):
        broker.wait_until_committed("billing")
    (letter,) = broker.messages("orders.dlq")
    assert (letter.key(), letter.value()) == (b"k", b"poison")
    assert dict(letter.headers() or [])["weir.dlq.offset"] == b"1"
    (producer,) = broker.producers
    assert producer.transactional_id is None and producer.reports[0][0] is None


def test_init_transactions_fences_the_older_producer_and_aborts_what_it_left_open() -> None:
    broker = FakeBroker()
    broker.create_topic("t", partitions=1)
    old = broker.producer_factory({"transactional.id": "app-1"})
    old.init_transactions()
    old.begin_transaction()
    old.produce("t", b"zombie", partition=0)
    new = broker.producer_factory({"transactional.id": "app-1"})
    new.init_transactions()
    assert (old.epoch, new.epoch) == (0, 1)
    assert [t.state for t in old.transactions] == ["aborted"]  # by the coordinator
    assert broker.messages("t") == [] and broker.end_offsets("t") == {0: 2}
    with pytest.raises(KafkaException) as caught:
        old.commit_transaction()
    assert caught.value.args[0].code() == KafkaError._FENCED and old.state == "fatal"


def test_a_faulty_call_fails_before_or_after_it_takes_effect() -> None:
    broker = FakeBroker()
    broker.create_topic("t", partitions=1)
    p = broker.producer_factory({"transactional.id": "app-1"})

    def state() -> str:
        return p.state

    timed_out = KafkaError(KafkaError._TIMED_OUT, "retry call to resume", retriable=True)
    p.fail_next("init_transactions", timed_out)
    with pytest.raises(KafkaException):
        p.init_transactions()
    assert state() == "init"  # not applied: call it again
    p.init_transactions()
    p.begin_transaction()
    p.produce("t", b"v", partition=0)
    # The commit reached the coordinator; its answer did not come back.
    p.fail_next("commit_transaction", timed_out, applied=True)
    with pytest.raises(KafkaException):
        p.commit_transaction()
    assert [m.value() for m in broker.messages("t")] == [b"v"]
    p.commit_transaction()  # resumed: it is done
    assert p.calls[-2:] == ["commit_transaction", "commit_transaction"]
    assert [t.state for t in p.transactions] == ["committed"]

    abortable = KafkaError(KafkaError.ILLEGAL_GENERATION, "generation", txn_requires_abort=True)
    p.begin_transaction()
    p.fail_next("send_offsets_to_transaction", abortable)
    with pytest.raises(KafkaException):
        p.send_offsets_to_transaction([TopicPartition("t", 0, 1)], FakeGroupMetadata("g", ""))
    assert state() == "abortable"
    with pytest.raises(KafkaException):
        p.commit_transaction()
    p.abort_transaction()
    p.begin_transaction()
    p.fail_next("produce", BufferError("Local: Queue full"))
    with pytest.raises(BufferError):
        p.produce("t", b"w", partition=0)
    p.fail_next("begin_transaction", KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    p.abort_transaction()
    with pytest.raises(KafkaException):
        p.begin_transaction()
    assert state() == "fatal"
    with pytest.raises(KafkaException) as caught:
        p.poll(0)  # the fatal error comes out of the next poll once, as the client's does
    assert caught.value.args[0].code() == KafkaError._FENCED
    assert p.poll(0) == 0
    with pytest.raises(ValueError, match="unknown call"):
        p.fail_next("commit", timed_out)
    with pytest.raises(ValueError, match="does not reach the coordinator"):
        p.hang_next("produce", applied=True)


def test_a_hung_call_blocks_until_released_then_goes_on() -> None:
    broker = FakeBroker()
    broker.create_topic("t", partitions=1)
    p = broker.producer_factory({"transactional.id": "app-1"})
    p.init_transactions()
    p.begin_transaction()
    p.produce("t", b"v", partition=0)
    p.hang_next("commit_transaction")
    done = threading.Event()

    def commit() -> None:
        p.commit_transaction(0.1)
        done.set()

    threading.Thread(target=commit, daemon=True).start()
    wait_until(lambda: p.hanging == 1)
    assert not done.wait(0.2)  # whatever its timeout
    assert broker.messages("t") == []  # not applied: nothing committed yet
    p.release()
    assert done.wait(5) and p.hanging == 0 and p.hangs == 1
    assert [m.value() for m in broker.messages("t")] == [b"v"]
    # Applied: the coordinator committed before the call hung; the caller never hears of it.
    p.begin_transaction()
    p.produce("t", b"w", partition=0)
    p.hang_next("commit_transaction", applied=True)
    threading.Thread(target=p.commit_transaction, daemon=True).start()
    wait_until(lambda: p.hanging == 1)
    assert [m.value() for m in broker.messages("t")] == [b"v", b"w"]
    p.release()
    wait_until(lambda: p.state == "ready")


def test_an_expired_member_can_no_longer_send_offsets_to_a_transaction() -> None:
    broker = FakeBroker()
    broker.create_topic("t", partitions=1)
    zombie = broker.consumer_factory({"group.id": "g", "auto.offset.reset": "earliest"})
    zombie.subscribe(["t"])
    zombie.consume(10, 0)
    meta = zombie.consumer_group_metadata()
    assert meta.generation >= 1
    p = broker.producer_factory({"transactional.id": "app-1"})
    p.init_transactions()
    p.begin_transaction()
    broker.expire(zombie)
    with pytest.raises(KafkaException) as caught:
        p.send_offsets_to_transaction([TopicPartition("t", 0, 1)], meta)
    err = caught.value.args[0]
    assert (err.code(), err.txn_requires_abort()) == (KafkaError.UNKNOWN_MEMBER_ID, True)


def test_a_topics_max_message_bytes_refuses_larger_records() -> None:
    broker = FakeBroker()
    broker.create_topic("small", config={"max.message.bytes": "10"})
    broker.produce("small", key="k", value="123456789")
    with pytest.raises(KafkaException) as caught:
        broker.produce("small", key="k", value="1234567890")
    assert caught.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    with pytest.raises(ValueError, match=r"only max\.message\.bytes"):
        broker.create_topic("other", config={"retention.ms": "1000"})
    with pytest.raises(ValueError, match="positive integer"):
        broker.create_topic("other", config={"max.message.bytes": "-1"})


def test_a_restarted_scripted_consumer_finds_what_the_last_one_left() -> None:
    fake = FakeConsumer()
    fake.produce_many("t", 0, range(3))
    fake.given_committed({("t", 0): 2})
    again = fake.restarted()
    assert again is not fake and dict(again.committed) == {("t", 0): 2}
    again.produce("t", 0)
    assert fake._broker.end_offsets("t") == {0: 4}
    with pytest.raises(RuntimeError, match="scripted"):
        FakeBroker().consumer_factory({"group.id": "g"}).restarted()


def test_a_plain_producer_reports_each_record_and_refuses_the_planned_ones() -> None:
    broker = FakeBroker()
    broker.create_topic("t")
    p = broker.producer_factory({"enable.idempotence": True})
    too_large = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
    p.fail_deliveries(too_large, after=2)  # the third record from now
    for value in (b"a", b"b", b"c", b"d"):
        p.produce("t", value, partition=0)
    assert len(p) == 4  # reports wait for a poll or flush
    assert p.flush(1) == 0 and len(p) == 0
    assert [(err and err.code(), msg.value()) for err, msg in p.reports] == [
        (None, b"a"),
        (None, b"b"),
        (KafkaError.MSG_SIZE_TOO_LARGE, b"c"),
        (None, b"d"),
    ]
    assert [m.value() for m in broker.messages("t")] == [b"a", b"b", b"d"]
    with pytest.raises(KafkaException) as caught:
        p.begin_transaction()
    assert caught.value.args[0].code() == KafkaError._NOT_CONFIGURED
