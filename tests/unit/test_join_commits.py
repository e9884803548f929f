"""Commits around a rebalance, on the scripted FakeConsumer, the engine stepped on the test thread
with a `ManualClock`: one async commit waits for its answer at a time, and an overdue one stops
holding the others back. And the group protocol a member runs: `group_protocol="auto"`, and the
warning for the classic protocol's commit blackout.

Under the classic protocol a member's group requests share one connection, so its commits wait
behind its own JoinGroup while a rebalance waits for the other members, and fail when it ends
(docs/rebalances.md); tests/chaos/test_join_commits.py measures that on a real broker.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException
from tests.fake_members import SETTINGS
from tests.logged import events
from tests.stepped import Stepped
from tests.waiting import wait_until

from weir import ConsumerConfig, GroupConsumer, KafkaFatalError, Record
from weir._engine import protocols
from weir._engine.commit_requests import RESULT_OVERDUE_S
from weir._engine.protocols import (
    PROBE_LIMIT_S,
    api_keys,
    choose_protocol,
    warn_commit_blackout,
)
from weir.config import ConsumerSettings
from weir.prometheus import WeirCollector
from weir.testing.fake import FakeConsumer

pytestmark = pytest.mark.timeout(60)

TOPIC = "t"
P0 = (TOPIC, 0)


@pytest.fixture
def stepped() -> Iterator[list[Stepped]]:
    made: list[Stepped] = []
    yield made
    for s in made:
        s.stop()


def sent_offsets(fake: FakeConsumer) -> list[int]:
    return [off for off, _ in fake.commits_for(P0)]


def test_an_overdue_commit_no_longer_holds_the_next_one(
    stepped: list[Stepped], caplog: pytest.LogCaptureFixture
) -> None:
    """librdkafka answers every commit request; one whose answer never came would otherwise
    stop the member's commits for good."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3), key=b"A")
    fake.script_assign([P0])
    gate = threading.Event()

    def handle(record: Record) -> None:
        if record.offset > 0:
            gate.wait(5)

    s = Stepped(fake, handle)
    stepped.append(s)
    fake.hold_commit_results = True
    s.step_until(lambda: 1 in sent_offsets(fake), "the commit of 1")
    gate.set()
    s.step_until(lambda: s.engine.settle.processed == 3, "the other two records")
    s.steps(20)
    assert sent_offsets(fake)[-1] == 1  # its answer is awaited
    s.clock.advance(RESULT_OVERDUE_S)
    with caplog.at_level(logging.WARNING, logger="weir"):
        s.step_until(lambda: sent_offsets(fake)[-1] == 3, "3 sent past the overdue answer")
    overdue = events(caplog, "commit_result_overdue")
    assert len(overdue) == 1 and overdue[0]["waited_s"] >= RESULT_OVERDUE_S


def test_a_commit_request_of_a_lost_assignment_no_longer_holds_the_new_ones_commits(
    stepped: list[Stepped],
) -> None:
    """Seen in the fenced-ledger example under load: a member stopped (SIGSTOP) with an
    asynchronous commit in flight lost its partition when its session expired, got it back,
    processed the rest, and sent no commit for 71 s: the old request, never answered, held every
    commit turn until RESULT_OVERDUE_S. The loss ends that request's generation: its answer (if
    any) is for an assignment that is gone, and it holds nothing of the new one."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3), key=b"A")
    fake.script_assign([P0])
    s = Stepped(fake, lambda r: None)
    stepped.append(s)
    fake.hold_commit_results = True
    s.step_until(lambda: sent_offsets(fake), "a commit, never answered")
    s.step_until(lambda: s.engine.settle.processed == 3, "the first three records")
    unanswered = set(fake.pending_commit_seqs())
    fake.script_lost([P0])
    fake.script_assign([P0])
    fake.produce_many(TOPIC, 0, range(3, 6), key=b"A")

    def answer_the_new_ones() -> None:
        # Every request but the lost assignment's is answered, as the broker would.
        fresh = [seq for seq in fake.pending_commit_seqs() if seq not in unanswered]
        fake.deliver_commit_results([(seq, None) for seq in fresh])

    def new_records_done() -> bool:
        answer_the_new_ones()
        return s.engine.own.rebalances >= 2 and 5 in fake.delivered_offsets(P0)

    s.step_until(new_records_done, "the new assignment's records")
    s.clock.advance(2.0)  # two commit intervals, far short of RESULT_OVERDUE_S

    def sent_six() -> bool:
        answer_the_new_ones()
        return 6 in sent_offsets(fake)

    s.step_until(sent_six, "6 sent by the new assignment")


def test_a_commit_blackout_shows_in_stats_and_metrics(members: list[GroupConsumer]) -> None:
    """The age of the oldest unconfirmed commit, per partition and per member: it grows while
    commits get no answer (behind a classic JoinGroup), and is gone once one confirms them."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3))
    fake.script_assign([P0])
    fake.given_committed()
    fake.hold_commit_results = True
    gc = GroupConsumer(lambda r: None, consumer_factory=fake.factory, **SETTINGS)
    members.append(gc)
    gc.start()
    wait_until(fake.pending_commit_seqs, "a commit waiting for its answer")
    wait_until(
        lambda: (gc.stats().oldest_unconfirmed_commit_s or 0) > 0.3, "an unconfirmed commit ages"
    )
    [part] = gc.stats().partitions
    assert part.unconfirmed_commit_s is not None and part.unconfirmed_commit_s > 0.3
    assert scraped(gc, "weir_oldest_unconfirmed_commit_seconds") > 0.3
    assert scraped(gc, "weir_partition_unconfirmed_commit_seconds") > 0.3
    held = fake.pending_commit_seqs()
    fake.deliver_commit_results([(seq, None) for seq in held])
    wait_until(lambda: {seq for seq, _ in fake.delivered_results} >= set(held), "answered")
    fake.hold_commit_results = False  # the commit of what finished since is answered too
    wait_until(lambda: gc.stats().oldest_unconfirmed_commit_s is None, "confirmed")
    assert gc.stats().partitions[0].unconfirmed_commit_s is None
    assert scraped(gc, "weir_oldest_unconfirmed_commit_seconds") == 0


def scraped(gc: GroupConsumer, name: str) -> float:
    """The value of metric `name` (its one sample) as the Prometheus collector gives it now."""
    [sample] = [
        s
        for family in WeirCollector(gc, member="m").collect()
        for s in family.samples
        if s.name == name
    ]
    return float(sample.value)


# -- group_protocol="auto" ------------------------------------------------------------------------

# librdkafka's `feature` debug lines for a broker's ApiVersions response, as its logger gets
# them (Kafka 4.1, librdkafka 2.16).
LINES = [
    "FEATURE [rdkafka#producer-1] [thrd:127.0.0.1:50535/bootstrap]: 127.0.0.1:50535/bootstrap: "
    "Updated enabled protocol features +ApiVersion to ApiVersion",
    "APIVERSION [rdkafka#producer-1] [thrd:127.0.0.1:50535/bootstrap]: 127.0.0.1:50535/bootstrap:"
    "   ApiKey ApiVersion (18) Versions 0..4",
    "APIVERSION [rdkafka#producer-1] [thrd:127.0.0.1:50535/bootstrap]: 127.0.0.1:50535/bootstrap:"
    "   ApiKey ConsumerGroupHeartbeat (68) Versions 0..1",
]


def test_the_api_keys_are_read_from_librdkafkas_lines() -> None:
    assert api_keys(LINES) == {18, 68}
    assert api_keys(LINES[:2]) == {18}
    assert api_keys(LINES[:1]) is None  # no ApiVersions response: no broker answered


AUTO: ConsumerSettings = {**SETTINGS, "group_protocol": "auto"}


@pytest.mark.parametrize(
    ("offered", "protocol", "reason"),
    [
        (True, "consumer", "the broker offers ConsumerGroupHeartbeat"),
        (False, "classic", "the broker does not offer ConsumerGroupHeartbeat"),
        (None, "classic", "no broker listed its APIs"),
    ],
)
def test_auto_runs_the_protocol_the_broker_offers_and_says_why(
    caplog: pytest.LogCaptureFixture, offered: bool | None, protocol: str, reason: str
) -> None:
    asked: list[tuple[str, float]] = []

    def probe(conf: object, timeout: float, stopped: Callable[[], bool]) -> bool | None:
        assert isinstance(conf, dict) and stopped() is False
        asked.append((conf["bootstrap.servers"], timeout))
        return offered

    given: ConsumerSettings = {**AUTO, "session_timeout_s": 10.0, "remote_assignor": "range"}
    cfg = ConsumerConfig(**given)
    with caplog.at_level(logging.INFO, logger="weir"):
        chosen = choose_protocol(cfg, probe, lambda: False)
    assert asked == [("fake:9092", min(cfg.startup_timeout_s, PROBE_LIMIT_S))]
    assert chosen.group_protocol == protocol
    [event] = events(caplog, "group_protocol_chosen")
    assert event["protocol"] == protocol and reason in event["reason"]
    assert event["ignored"] == (
        ["session_timeout_s"] if protocol == "consumer" else ["remote_assignor"]
    )


def test_the_protocol_probe_asks_once_when_it_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe asks in short requests so that a stop is seen between them; a request that
    fails at once (refused, not unanswered) must end the asking, not repeat it for 5 s."""
    calls: list[float] = []

    class Refusing:
        def __init__(self, conf: object) -> None:
            pass

        def list_topics(self, timeout: float) -> None:
            calls.append(timeout)
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG, "refused"))

        def poll(self, timeout: float) -> int:
            return 0

    monkeypatch.setattr(protocols, "Producer", Refusing)
    assert protocols.offers_consumer_protocol({"bootstrap.servers": "fake:9092"}, 5.0) is None
    assert calls == [0.25]


def test_auto_without_a_probe_runs_the_classic_protocol() -> None:
    assert choose_protocol(ConsumerConfig(**AUTO), None, bool).group_protocol == "classic"
    classic = ConsumerConfig(**SETTINGS)
    assert choose_protocol(classic, lambda conf, timeout, stopped: True, bool) is classic


def test_an_auto_member_builds_its_client_for_the_protocol_chosen(stepped: list[Stepped]) -> None:
    fake = FakeConsumer()
    fake.script_assign([P0])
    s = Stepped(fake, lambda r: None, ConsumerConfig(**AUTO), lambda conf, timeout, stopped: True)
    stepped.append(s)
    assert fake.conf is not None and fake.conf["group.protocol"] == "consumer"
    assert fake.incremental
    assert s.engine.cfg.group_protocol == "consumer"


def test_a_refused_consumer_protocol_stops_the_member_saying_what_to_do() -> None:
    """A Kafka 4 broker with the consumer protocol turned off still lists its heartbeat API:
    "auto" runs it, and the broker's refusal is fatal."""
    fake = FakeConsumer()
    fake.script_assign([P0])
    gc = GroupConsumer(lambda r: None, consumer_factory=fake.factory, **SETTINGS)
    gc.start()
    fake.raise_error_cb(
        KafkaError(
            KafkaError.UNSUPPORTED_VERSION,
            "ConsumerGroupHeartbeat fatal error: Broker: API version not supported",
            fatal=True,
        )
    )
    with pytest.raises(KafkaFatalError) as info:
        gc.join(5)
    assert "group_protocol='classic'" in str(info.value)


# -- the warning at start --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "warned"),
    [
        ({}, True),  # librdkafka's 45 s session, a 1 s commit interval
        ({"session_timeout_s": 6.0, "commit_interval_s": 1.0}, True),
        ({"session_timeout_s": 6.0, "commit_interval_s": 2.0}, False),
        ({"group_instance_id": "i-1"}, False),  # static: a restart in time starts no rebalance
        ({"assignment_strategy": "range"}, False),  # eager revokes everything before its join
        ({"group_protocol": "consumer"}, False),  # KIP-848: no join barrier
        ({"transactional_id": "tx"}, False),  # its offsets go through the producer
    ],
)
def test_a_classic_dynamic_member_with_a_long_session_is_warned_at_start(
    caplog: pytest.LogCaptureFixture, settings: ConsumerSettings, warned: bool
) -> None:
    given: ConsumerSettings = {
        "bootstrap_servers": "b:9092",
        "group_id": "g",
        "topics": ["t"],
        **settings,
    }
    cfg = ConsumerConfig(**given)
    with caplog.at_level(logging.WARNING, logger="weir"):
        warn_commit_blackout(cfg)
    found = events(caplog, "classic_protocol_without_static_membership")
    assert bool(found) is warned
    if warned:
        assert "group_instance_id" in found[0]["remedy"]


def test_a_member_on_a_fake_client_is_not_warned_of_a_classic_join(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Regression: every member a test ran on the fake broker warned of commits held behind a
    classic JoinGroup, which the fake does not have: noise in every test of an application's
    handler. The warning is for a member weir builds the real client of."""
    fake = FakeConsumer()
    fake.script_assign([("t", 0)])
    gc = GroupConsumer(lambda record: None, consumer_factory=fake.factory, **SETTINGS)
    with caplog.at_level(logging.WARNING, logger="weir"):
        gc.start()
        try:
            assert gc.wait_started(5.0)
        finally:
            gc.stop()
            gc.join(5.0)
    assert ConsumerConfig(**SETTINGS).group_protocol == "classic"  # the warning's case
    assert not events(caplog, "classic_protocol_without_static_membership")
