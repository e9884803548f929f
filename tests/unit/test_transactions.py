"""`weir._engine.transactions` on scripted producers: what a boundary does when the coordinator is
slow, gone, or fenced the producer, and that no call keeps the owner past weir's deadline."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from tests.scripted_producer import (
    HANG,
    Producers,
    Scripted,
    abortable,
    fenced,
    transport,
)

import weir._engine.transactions as transactions_module
from weir import ConsumerConfig, TransactionError
from weir._engine.transactions import Outcome, Transactions
from weir.records import Output, Partition

OFFSETS = {Partition("t", 0): 5}


@pytest.fixture
def producers() -> Iterator[Callable[..., Producers]]:
    made: list[Producers] = []

    def make(*ps: Scripted) -> Producers:
        made.append(Producers(*ps))
        return made[-1]

    yield make
    for f in made:
        f.release_all()  # no hung call outlives its test


def transactions(factory: Callable[[dict[str, Any]], Scripted], **settings: Any) -> Transactions:
    cfg = ConsumerConfig(
        bootstrap_servers="broker:9092",
        group_id="g",
        topics=["t"],
        transactional_id="t-1",
        transaction_timeout_s=1.0,
        **settings,
    )
    txn = Transactions(cfg, factory)
    txn.start()
    return txn


class Events(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, dict):
            self.events.append(record.msg)

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event]


@pytest.fixture
def events() -> Iterator[Events]:
    logger = logging.getLogger("weir.transactions")
    handler, level = Events(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("end", ["abort", "commit"])
def test_an_end_of_transaction_that_times_out_is_retried_past_the_transaction_timeout(
    end: str, producers: Callable[..., Producers]
) -> None:
    """Regression (one CI run): an abort whose epoch bump waited on the coordinator timed out
    after transaction_timeout_s, once, and stopped the member with TransactionError, although
    librdkafka asks for the call to be retried. Now it is retried for up to three times the
    transaction timeout: here it completes after 1.5 s of a 1 s transaction timeout."""
    producer = Scripted(**{end: [1.5]})
    txn = transactions(producers(producer))
    started = time.monotonic()
    if end == "abort":
        txn.abort()
        assert txn.aborted == 1
    else:
        assert txn.commit(OFFSETS, {}, object()) is Outcome.COMMITTED
        assert txn.committed == 1
    assert 1.5 <= time.monotonic() - started < 3.0
    ends = [c for c in producer.calls if c != "add_offsets"]
    assert ends == ["init", "begin", end, "begin"], "a new transaction is open afterwards"
    assert txn.fatal is None and txn.ready


@pytest.mark.timeout(30)
def test_an_abort_that_never_completes_gets_the_producer_replaced_within_its_bound(
    producers: Callable[..., Producers], events: Events
) -> None:
    """The bound: three times the transaction timeout. Past it the producer is replaced (a new
    one with the same transactional id fences it and aborts its transaction), not the member
    stopped (before: TransactionError "transaction abort failed: Timed out")."""
    stuck = Scripted(abort=[3600.0])
    factory = producers(stuck)
    txn = transactions(factory)
    started = time.monotonic()
    txn.abort()
    assert 3.0 <= time.monotonic() - started < 5.0
    assert txn.fatal is None
    assert len(factory.made) == 2 and txn.ready, "a new producer, initialised, transaction open"
    assert factory.made[1].calls == ["init", "begin"]
    replaced = events.named("transactional_producer_replaced")
    assert [e["step"] for e in replaced] == ["aborting the transaction"]


@pytest.mark.timeout(30)
def test_the_bound_is_half_of_max_poll_interval_when_that_is_shorter(
    producers: Callable[..., Producers],
) -> None:
    """The owner does not poll while it waits: with max_poll_interval_s=2 the abort gives up
    after 1 s (never less than the transaction timeout)."""
    factory = producers(Scripted(abort=[3600.0]))
    txn = transactions(factory, max_poll_interval_s=2.0, session_timeout_s=1.0)
    started = time.monotonic()
    txn.abort()
    assert 1.0 <= time.monotonic() - started < 1.9
    assert len(factory.made) == 2


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("step", "outcome"), [("add_offsets", Outcome.ABORTED), ("commit", Outcome.UNKNOWN)]
)
def test_a_call_that_ignores_its_timeout_is_abandoned_at_weirs_deadline(
    step: str, outcome: Outcome, producers: Callable[..., Producers], events: Events
) -> None:
    """Regression (broker restart, 3 runs in 5): send_offsets_to_transaction never returned,
    whatever timeout it was given, and the member hung for good. Now the owner waits for it
    at most its timeout plus a second, leaves it running on its own thread, and replaces the
    producer. A hung add-offsets step ends the transaction uncommitted (ABORTED: the engine
    rewinds to the offsets it knows); a hung commit may have committed (UNKNOWN: the engine
    reads them again once the new producer has resolved it)."""
    hung = Scripted(**{step: [HANG]})
    factory = producers(hung)
    txn = transactions(factory)
    started = time.monotonic()
    assert txn.commit(OFFSETS, {}, object()) is outcome
    took = time.monotonic() - started
    within = 1.0 if step == "add_offsets" else 3.0  # the end of a transaction gets 3 T
    assert within <= took < within + 2.0, took
    assert txn.abandoned == 1 and txn.replaced == 1
    assert txn.ready and factory.made[1].calls == ["init", "begin"]
    names = {
        "add_offsets": "adding the offsets to the transaction",
        "commit": "committing the transaction",
    }
    (replaced,) = events.named("transactional_producer_replaced")
    assert replaced["step"] == names[step] and replaced["abandoned"] is True
    assert "fenced" not in replaced["error"]
    assert not hung.release.is_set(), "the hung call was never waited for again"


@pytest.mark.timeout(30)
def test_a_transport_error_replaces_the_producer_instead_of_stopping_the_member(
    producers: Callable[..., Producers], events: Events
) -> None:
    """Regression (broker restart, 2 runs in 5): add-offsets failed with _TRANSPORT, neither
    retriable nor abortable, and the member stopped with TransactionError ("transaction
    commit failed: ..."). Now the producer is replaced and the member goes on."""
    factory = producers(Scripted(add_offsets=[transport()]))
    txn = transactions(factory)
    assert txn.commit(OFFSETS, {}, object()) is Outcome.ABORTED
    assert txn.fatal is None and txn.ready and len(factory.made) == 2
    (replaced,) = events.named("transactional_producer_replaced")
    assert replaced["step"] == "adding the offsets to the transaction"
    assert replaced["abandoned"] is False and "transport" in replaced["error"].lower()
    assert not events.named("transaction_fatal")


@pytest.mark.timeout(30)
def test_an_abortable_error_aborts_and_keeps_the_producer(
    producers: Callable[..., Producers],
) -> None:
    factory = producers(Scripted(add_offsets=[abortable()]))
    txn = transactions(factory)
    assert txn.commit(OFFSETS, {}, object()) is Outcome.ABORTED
    assert txn.aborted == 1 and txn.replaced == 0 and txn.ready
    assert factory.made[0].calls == ["init", "begin", "add_offsets", "abort", "begin"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("step", "name"),
    [
        ("add_offsets", "adding the offsets to the transaction"),
        ("commit", "committing the transaction"),
    ],
)
def test_a_fence_stops_the_member_naming_the_step(
    step: str, name: str, producers: Callable[..., Producers], events: Events
) -> None:
    factory = producers(Scripted(**{step: [fenced()]}))
    txn = transactions(factory)
    with pytest.raises(TransactionError) as info:
        txn.commit(OFFSETS, {}, object())
    assert info.value.fenced and info.value.step == name
    assert str(info.value).startswith(f"{name} failed: the producer was fenced by a newer producer")
    (fatal,) = events.named("transaction_fatal")
    assert fatal["fenced"] is True and fatal["step"] == name
    with pytest.raises(TransactionError) as again:
        txn.commit(OFFSETS, {}, object())
    assert again.value is info.value
    assert len(factory.made) == 1, "a fenced producer is never replaced"


@pytest.mark.timeout(30)
def test_while_no_broker_answers_recovery_tries_in_short_bounded_attempts(
    producers: Callable[..., Producers], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a replacement the new producer's init is tried from the owner loop, one bounded
    attempt (`_RECOVER_TIMEOUT`, here 0.3 s) at a time with a 0.5 s pause after each, so the
    owner keeps polling in between; it is ready as soon as an attempt succeeds, with the same
    producer (librdkafka resumes an init that timed out), and nothing is fatal meanwhile."""
    monkeypatch.setattr(transactions_module, "_RECOVER_TIMEOUT", 0.3)
    down = Scripted(init=[0.5, 0.5])  # two attempts time out (retriably)
    factory = producers(Scripted(add_offsets=[transport()]), down)
    txn = transactions(factory)
    started = time.monotonic()
    assert txn.commit(OFFSETS, {}, object()) is Outcome.ABORTED
    assert not txn.ready and 0.3 <= time.monotonic() - started < 1.0, "bounded too"
    assert not txn.recover(time.monotonic()) and down.calls == ["init"], "a pause first"
    attempts: list[float] = []
    while not txn.ready:
        before = len(down.calls)
        txn.recover(time.monotonic())
        if len(down.calls) > before:
            attempts.append(time.monotonic())
        time.sleep(0.02)
        assert time.monotonic() - started < 10
    assert down.calls == ["init", "init", "init", "begin"]
    assert txn.fatal is None
    assert attempts[1] - attempts[0] >= 0.5, "a pause after each attempt"


@pytest.mark.timeout(30)
def test_a_second_stop_request_abandons_a_hung_call_at_once(
    producers: Callable[..., Producers],
) -> None:
    hurry = threading.Event()
    factory = producers(Scripted(commit=[HANG]))
    txn = Transactions(
        ConsumerConfig(
            bootstrap_servers="broker:9092",
            group_id="g",
            topics=["t"],
            transactional_id="t-1",
            transaction_timeout_s=10.0,
        ),
        factory,
        interrupt=hurry,
    )
    txn.start()
    threading.Timer(0.5, hurry.set).start()
    started = time.monotonic()
    assert txn.commit(OFFSETS, {}, object()) is Outcome.UNKNOWN
    assert time.monotonic() - started < 2.0


@pytest.mark.timeout(30)
def test_a_queue_that_stays_full_fails_the_transaction_instead_of_holding_the_owner(
    producers: Callable[..., Producers],
) -> None:
    """Before, produce() retried a full local queue forever: with no broker taking outputs
    the owner never came back to its loop. Now the transaction fails after a second and its
    boundary aborts it."""
    producer = Scripted()
    txn = transactions(producers(producer))
    producer.full = 10**9
    started = time.monotonic()
    txn.produce([Output("out", b"v", None, None, None)])
    assert 1.0 <= time.monotonic() - started < 2.0
    assert txn.failed is not None and "queue stayed full" in txn.failed
    assert txn.due(time.monotonic())
    assert txn.commit(OFFSETS, {}, object()) is Outcome.ABORTED


def test_closing_a_fenced_producer_does_not_raise_and_lets_it_go(
    producers: Callable[..., Producers],
) -> None:
    """Regression: close() raised the fence from the producer's flush, which ended the
    member's shutdown before its hook, its workers' stop and the watermark refresher's stop
    (threads and a client left running). Now it logs the error and forgets the producer."""
    producer = Scripted(flush=[fenced()])
    txn = transactions(producers(producer))
    txn.close(1.0)
    assert producer.flushes == 1
    txn.close(1.0)
    assert producer.flushes == 1, "a second close does not use the producer again"


# -- the broker's ACLs -------------------------------------------------------------------------

REFUSED_WRITE = KafkaError(
    KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Topic authorization failed"
)
NEEDS = (
    "an exactly-once member needs WRITE and DESCRIBE on its transactional_id 't-1', WRITE on its "
    "output topics and READ on its group"
)


class RefusingOutputs(Scripted):
    """Its outputs are refused by the broker's ACLs, as the delivery reports say."""

    def __init__(self) -> None:
        super().__init__()
        self.reports: list[Callable[[], None]] = []

    def produce(self, topic: str, *args: Any, on_delivery: Any = None, **kwargs: Any) -> None:
        super().produce(topic, *args, **kwargs)
        message = SimpleNamespace(topic=lambda: topic)
        self.reports.append(lambda: on_delivery(REFUSED_WRITE, message))

    def poll(self, timeout: float = -1) -> int:
        reports, self.reports = self.reports, []
        for report in reports:
            report()
        return len(reports)


def test_an_output_the_acls_refuse_stops_the_member_at_the_next_boundary(
    producers: Callable[..., Producers], events: Events
) -> None:
    """Regression: the boundary aborted the transaction and the engine replayed its records,
    whose outputs the broker refused again: five aborts a second, for ever, the member
    ready."""
    txn = transactions(producers(RefusingOutputs()))
    txn.produce([Output("out", b"v", None, None, None)])
    with pytest.raises(TransactionError) as raised:
        txn.commit(OFFSETS, {}, object())
    assert str(raised.value) == (
        "writing an output failed: the broker's ACLs do not allow this client WRITE on topic "
        f"'out' (TOPIC_AUTHORIZATION_FAILED: Broker: Topic authorization failed): {NEEDS}"
    )
    assert raised.value.step == "writing an output" and not raised.value.fenced
    assert [e["step"] for e in events.named("transaction_fatal")] == ["writing an output"]


@pytest.mark.parametrize(
    ("code", "step", "script", "named"),
    [
        (
            KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            "initialising transactions",
            "init",
            "WRITE on transactional id 't-1'",
        ),
        (
            KafkaError.GROUP_AUTHORIZATION_FAILED,
            "adding the offsets to the transaction",
            "add_offsets",
            "READ on group 'g'",
        ),
    ],
)
def test_a_transactional_call_the_acls_refuse_names_them(
    producers: Callable[..., Producers], code: int, step: str, script: str, named: str
) -> None:
    refused = KafkaException(KafkaError(code, "Broker: authorization failed"))
    with pytest.raises(TransactionError) as raised:
        txn = transactions(producers(Scripted(**{script: [refused]})))
        txn.commit(OFFSETS, {}, object())
    name = KafkaError(code).name()
    assert str(raised.value) == (
        f"{step} failed: the broker's ACLs do not allow this client {named} ({name}: Broker: "
        f"authorization failed): {NEEDS}"
    )
