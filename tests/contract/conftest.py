"""Two backends for one contract suite: weir's in-memory `FakeBroker` and a real Apache Kafka
broker (the embedded one from the weir pytest plugin).

Every test in this directory takes the `backend` fixture and runs once per backend, through the
`weir._engine.client.ConsumerClient` and `weir._engine.client.TransactionalProducer` protocols only.
On the real broker conditions arrive asynchronously, so tests wait with `pump()`, which polls
members until a condition holds or a deadline passes; on the fake the same loop ends at once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from weir._engine.client import ConsumerClient, KafkaMessage, TransactionalProducer
from weir.testing.fake import FakeBroker, FakeConsumer

TP = tuple[str, int]
WAIT_S = 20.0
"""The longest a condition may take on the real broker (a rebalance takes about a second)."""

# Classic-protocol timings for the real broker: heartbeats every 100 ms make a rebalance start
# within a tenth of a second; the session is short but well above a loaded machine's stalls.
# KIP-848 sets both on the broker (the embedded one uses a 500 ms heartbeat).
CLASSIC = {"session.timeout.ms": 3000, "heartbeat.interval.ms": 100}
PROTOCOLS = ["range", "cooperative-sticky", "consumer"]


def group_conf(protocol: str) -> dict[str, Any]:
    if protocol == "consumer":
        return {"group.protocol": "consumer"}
    return {"partition.assignment.strategy": protocol, **CLASSIC}


@dataclass(frozen=True)
class Rec:
    value: str
    key: str | None = None
    partition: int | None = None
    headers: list[tuple[str, str | bytes | None]] | None = None


class Backend:
    """What a contract test needs from a broker, the same on both."""

    name: str
    real: bool
    quiet_s: float
    """How long to keep polling to show that something does not happen."""

    def __init__(self) -> None:
        self._consumers: list[ConsumerClient] = []

    def topic(self, partitions: int = 1, config: Mapping[str, str] | None = None) -> str:
        raise NotImplementedError

    def produce(self, topic: str, records: Iterable[Rec]) -> None:
        raise NotImplementedError

    def transaction(
        self, topic: str, partition: int, values: Sequence[str], *, commit: bool
    ) -> list[int]:
        """Produce `values` in one transaction and commit or abort it; the offsets the broker
        wrote them at, in order. A committed transaction writes every value (or this fails); an
        aborted one leaves out a write whose delivery failed (it changes the log's layout, not
        what an abort means), so a test takes the layout from here."""
        raise NotImplementedError

    def make(self, conf: dict[str, Any]) -> ConsumerClient:
        """A consumer from exactly `conf` (plus the bootstrap servers); not closed for you."""
        raise NotImplementedError

    def make_producer(self, conf: dict[str, Any]) -> TransactionalProducer:
        """A producer from exactly `conf` (plus the bootstrap servers)."""
        raise NotImplementedError

    def producer(self, transactional_id: str | None = None, **conf: Any) -> TransactionalProducer:
        """A producer, transactional with `transactional_id` (a fresh one: `txn_id()`)."""
        if transactional_id is not None:
            conf["transactional.id"] = transactional_id
        return self.make_producer(conf)

    def miss_poll_interval(self, silent: Member, others: Sequence[Member]) -> None:
        """Make `silent` miss max.poll.interval.ms while `others` keep polling."""
        raise NotImplementedError

    def consumer(self, group: str | None = None, **conf: Any) -> ConsumerClient:
        base = {
            "group.id": group or f"contract-{uuid.uuid4().hex[:10]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
        client = self.make({**base, **conf})
        self._consumers.append(client)
        return client

    def close_all(self) -> None:
        for client in self._consumers:
            client.close()  # a second close() is harmless on both


class FakeBackend(Backend):
    name = "fake"
    real = False
    quiet_s = 0.05

    def __init__(self) -> None:
        super().__init__()
        self.broker = FakeBroker()

    def topic(self, partitions: int = 1, config: Mapping[str, str] | None = None) -> str:
        name = f"contract-{uuid.uuid4().hex[:10]}"
        return self.broker.create_topic(name, partitions, config=config)

    def produce(self, topic: str, records: Iterable[Rec]) -> None:
        for r in records:
            self.broker.produce(topic, r.key, r.value, partition=r.partition, headers=r.headers)

    def transaction(
        self, topic: str, partition: int, values: Sequence[str], *, commit: bool
    ) -> list[int]:
        txn = self.broker.transaction()
        written = [txn.produce(topic, value=v, partition=partition).offset() for v in values]
        assert None not in written, "the fake broker gives every record an offset at once"
        if commit:
            txn.commit()
        else:
            txn.abort()
        return cast("list[int]", written)

    def make(self, conf: dict[str, Any]) -> ConsumerClient:
        return self.broker.consumer_factory(conf)

    def make_producer(self, conf: dict[str, Any]) -> TransactionalProducer:
        return self.broker.producer_factory(conf)

    def miss_poll_interval(self, silent: Member, others: Sequence[Member]) -> None:
        assert isinstance(silent.client, FakeConsumer)
        self.broker.expire(silent.client)


class RealBackend(Backend):
    name = "real"
    real = True
    quiet_s = 0.5

    def __init__(self, bootstrap: str, make_topic: Callable[..., str]) -> None:
        super().__init__()
        self.bootstrap = bootstrap
        self._make_topic = make_topic

    def topic(self, partitions: int = 1, config: Mapping[str, str] | None = None) -> str:
        return self._make_topic(partitions, config=config, name_prefix="contract")

    def produce(self, topic: str, records: Iterable[Rec]) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "linger.ms": 0})
        for r in records:
            kw: dict[str, Any] = {"key": r.key, "value": r.value}
            if r.partition is not None:
                kw["partition"] = r.partition
            if r.headers is not None:
                kw["headers"] = r.headers
            producer.produce(topic, **kw)
        assert producer.flush(30) == 0, "records not delivered"

    def transaction(
        self, topic: str, partition: int, values: Sequence[str], *, commit: bool
    ) -> list[int]:
        producer = Producer(
            {"bootstrap.servers": self.bootstrap, "transactional.id": f"contract-{uuid.uuid4()}"}
        )
        producer.init_transactions(30)
        producer.begin_transaction()
        reports: list[tuple[KafkaError | None, int | None]] = []
        for v in values:
            producer.produce(
                topic,
                value=v,
                partition=partition,
                on_delivery=lambda err, msg: reports.append((err, msg.offset())),
            )
        # Written before the end of the transaction, so an abort leaves them in the log.
        assert producer.flush(30) == 0, "transactional records not delivered"
        failed = [err for err, _ in reports if err is not None]
        if commit:
            assert not failed, f"a record of a committed transaction failed: {failed}"
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
        return [offset for err, offset in reports if err is None and offset is not None]

    def make(self, conf: dict[str, Any]) -> ConsumerClient:
        client: ConsumerClient = Consumer({"bootstrap.servers": self.bootstrap, **conf})
        return client

    def make_producer(self, conf: dict[str, Any]) -> TransactionalProducer:
        producer: TransactionalProducer = Producer({"bootstrap.servers": self.bootstrap, **conf})
        return producer

    def miss_poll_interval(self, silent: Member, others: Sequence[Member]) -> None:
        interval = silent.conf["max.poll.interval.ms"] / 1000
        deadline = time.monotonic() + interval + 0.5
        while time.monotonic() < deadline:
            for m in others:
                m.poll()


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.broker)])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    chosen: Backend
    if request.param == "fake":
        chosen = FakeBackend()
    else:
        chosen = RealBackend(
            request.getfixturevalue("kafka_bootstrap"), request.getfixturevalue("make_topic")
        )
    try:
        yield chosen
    finally:
        chosen.close_all()


def txn_id() -> str:
    """A transactional id no other producer has."""
    return f"contract-{uuid.uuid4().hex[:10]}"


def real_only(reason: str) -> Callable[[Backend], None]:
    """Call at the start of a test that only the real broker can answer."""

    def check(backend: Backend) -> None:
        if not backend.real:
            pytest.skip(f"real broker only: {reason}")

    return check


# -- members and waiting ---------------------------------------------------------------------


@dataclass(frozen=True)
class Callback:
    seq: int
    member: str
    kind: str
    partitions: tuple[TP, ...]
    during: str | None
    """The client call that served it: "consume", "close", or None (outside any call)."""


@dataclass
class Log:
    events: list[Callback] = field(default_factory=list)

    def of(self, member: str, *, empty: bool = True) -> list[tuple[str, tuple[TP, ...]]]:
        return [
            (e.kind, e.partitions)
            for e in self.events
            if e.member == member and (empty or e.partitions)
        ]

    def seq(self, member: str, kind: str, partitions: Iterable[TP]) -> int:
        want = tuple(sorted(partitions))
        for e in self.events:
            if (e.member, e.kind, e.partitions) == (member, kind, want):
                return e.seq
        raise AssertionError(f"{member} had no {kind} of {want}: {self.events}")


class Member:
    """A consumer under test: records its rebalance callbacks, commit results and records."""

    def __init__(
        self,
        name: str,
        client: ConsumerClient,
        log: Log,
        conf: dict[str, Any] | None = None,
        *,
        commit_on_revoke: bool = False,
    ) -> None:
        self.name = name
        self.client = client
        self.log = log
        self.conf = conf or {}
        self.commit_on_revoke = commit_on_revoke
        self.during: str | None = None
        self.records: list[KafkaMessage] = []
        self.errors: list[KafkaError] = []
        self.revoke_commits: dict[TP, int] = {}

    def subscribe(self, topics: list[str]) -> None:
        self.client.subscribe(
            topics,
            on_assign=self._callback("assign"),
            on_revoke=self._callback("revoke"),
            on_lost=self._callback("lost"),
        )

    def _callback(self, kind: str) -> Callable[[Any, list[TopicPartition]], None]:
        def record(client: Any, partitions: list[TopicPartition]) -> None:
            parts = tuple(sorted((p.topic, p.partition) for p in partitions))
            self.log.events.append(
                Callback(len(self.log.events), self.name, kind, parts, self.during)
            )
            if kind == "revoke" and self.commit_on_revoke and partitions:
                # The hand-off: commit what was consumed, synchronously, inside on_revoke.
                done = [p for p in client.position(partitions) if p.offset >= 0]
                if done:
                    client.commit(offsets=done, asynchronous=False)
                    self.revoke_commits.update({(p.topic, p.partition): p.offset for p in done})

        return record

    def poll(self, num: int = 100, timeout: float = 0.02) -> list[KafkaMessage]:
        self.during = "consume"
        try:
            msgs = self.client.consume(num, timeout)
        finally:
            self.during = None
        data = []
        for m in msgs:
            err = m.error()
            if err is not None:
                self.errors.append(err)
            else:
                data.append(m)
        self.records.extend(data)
        return data

    def close(self) -> None:
        self.during = "close"
        try:
            self.client.close()
        finally:
            self.during = None

    def owned(self) -> set[TP]:
        return {(p.topic, p.partition) for p in self.client.assignment()}

    def offsets(self, tp: TP) -> list[int]:
        return [m.offset() or 0 for m in self.records if (m.topic(), m.partition()) == tp]


def pump(
    members: Sequence[Member],
    until: Callable[[], bool],
    what: str,
    *,
    timeout: float = WAIT_S,
    num: int = 100,
) -> None:
    """Poll every member in turn until `until()` holds; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        for m in members:
            m.poll(num)


def poll_for(members: Sequence[Member], seconds: float) -> None:
    """Keep polling for `seconds` (to show that something does not happen)."""
    deadline = time.monotonic() + seconds
    while True:
        for m in members:
            m.poll()
        if time.monotonic() > deadline:
            return
