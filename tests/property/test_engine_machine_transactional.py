"""The engine state machine of test_engine_machine.py with exactly-once on: the member runs with
`transactional_id`, its producers are `FakeProducer`s on the fake's broker, and every record a
handler finishes produces one output ("<partition>:<offset>" to topic `out`).

Besides the rules of the base machine (crash and restart included: the next process's producer
fences the last one's and aborts what it left open), rules make the producer fail as a broker
does: a call fails abortably (the transaction aborts), retriably (weir tries it again), or with
a transport error (weir replaces the producer), each before or after it took effect at the
coordinator; a call hangs past its deadline (abandoned in machine time, the producer replaced);
the broker refuses an output; after a replacement, the broker stays away for the next few
initialisations; a second member starts with the same transactional id (a fence: this one
stops).

Invariants, checked after every step (and turn): the output topic, read_committed, holds the
output of each input whose offset is committed (below the committed offset or in its offset
map) exactly once, and no other; committed offsets never go back, and none is committed for a
partition lost since; no record is marked finished without an open transaction; a transaction
with a refused output (or another failed call) is not left open past the turn that reported
it; after an abort every partition still owned starts over (sought back to its committed
offset, or waiting to be), so that the records marked finished in the aborted transaction run
again.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from typing import Any, Literal

import pytest
from confluent_kafka import KafkaError
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

# The machine, and the fixture that runs the engine on machine time: autouse, so imported here
# it applies to this module's tests as it does to the machines' own.
from tests.property.test_engine_machine import (
    CLOCK,
    HANGS,
    TOPIC,
    TP,
    EngineMachine,
    _machine_time,  # noqa: F401
    _Unused,
)

from weir._engine.engine import Engine
from weir._engine.tasks import Assignment, Task
from weir.config import ConsumerConfig
from weir.errors import TransactionError
from weir.offsetmap import FinishedMap, decode_finished
from weir.records import Output, Partition
from weir.testing.fake import FakeConsumer, FakeProducer, FakeTransaction

OUT = "out"
TXN_ID = "machine-1"

EXAMPLES = int(os.environ.get("WEIR_MACHINE_EXAMPLES", "40"))
STEPS = int(os.environ.get("WEIR_MACHINE_STEPS", "40"))

_STEPS = ["send_offsets_to_transaction", "commit_transaction", "abort_transaction"]
Kind = Literal["abortable", "retriable", "transport"]
# While the broker is away, a replacement's initialisation times out (tried again on the same
# producer), fails (a new producer next time) or never returns (abandoned): for `n` attempts.
Away = tuple[Literal["retriable", "transport", "hang"], int]
_AWAY = st.tuples(st.sampled_from(["retriable", "transport", "hang"]), st.integers(1, 4))


def _error(kind: Kind) -> KafkaError:
    """What librdkafka raises: an abortable error (a generation over), a timeout it asks to be
    retried, a broker gone (neither: weir replaces the producer)."""
    if kind == "abortable":
        return KafkaError(
            KafkaError.ILLEGAL_GENERATION,
            "Specified group generation id is not valid",
            txn_requires_abort=True,
        )
    if kind == "retriable":
        return KafkaError(KafkaError._TIMED_OUT, "Timed out, retry call to resume", retriable=True)
    return KafkaError(KafkaError._TRANSPORT, "Broker transport failure")


def _input(output: bytes | None) -> tuple[int, int]:
    partition, offset = (output or b"").decode().split(":")
    return int(partition), int(offset)


class TransactionalEngineMachine(EngineMachine):
    def __init__(self) -> None:
        super().__init__()
        HANGS.reset()
        self.producers = HANGS.producers  # every producer the member made, in order
        self.outage: Away | None = None
        self.starting = False
        self.fenced = False  # a second member's producer fenced this one's
        self.committed_seen: dict[TP, int] = {}
        self.txns_checked: set[int] = set()  # ended transactions already looked at
        self.before_revoke: tuple[bool, int, int] = (True, 0, 0)
        self.given_up: set[int] = set()  # running tasks of assignments an abort reset

    # -- the member and its producers ----------------------------------------------------

    def _config(self, **extra: Any) -> ConsumerConfig:
        return super()._config(
            transactional_id=TXN_ID,
            transaction_interval_s=0.05,
            transaction_max_records=16,
            transaction_timeout_s=1.0,
            **extra,
        )

    def _client(self, committed: dict[TP, int]) -> FakeConsumer:
        """The first process builds the broker; a restarted one finds it as it was left (its
        outputs, transactions and producer epochs too)."""
        if self.fake is None:
            fake = super()._client(committed)
            fake._broker.create_topic(OUT, 1)
            return fake
        return self.fk.restarted()

    def _engine(self, fake: FakeConsumer) -> Engine:
        engine = Engine(
            self._config(),
            _Unused(),
            fake.factory,
            self.life,
            self.workers,
            producer_factory=self._producer,
            clock=CLOCK,
        )
        reset = engine.own.reset

        def started_over(tps: Iterable[Partition], *, quiet: bool = False) -> list[Assignment]:
            """Partitions starting over after an abort: what was delivered to them in this turn
            was not delivered to their new assignment, and the calls their tasks still run
            are given up on."""
            old = reset(tps, quiet=quiet)
            self.started_over.update(a.tp for a in old)
            self.given_up.update(id(t) for t in self.workers.running if t.assignment in old)
            return old

        engine.own.reset = started_over  # type: ignore[method-assign]
        txn = engine.txn
        assert txn is not None
        produce = txn.produce

        def marked_finished(outputs: list[Output]) -> None:
            """The outputs of a record marked finished now, into the open transaction."""
            assert txn.ready, "a record marked finished without an open transaction"
            produce(outputs)

        txn.produce = marked_finished  # type: ignore[method-assign]
        return engine

    def _producer(self, conf: dict[str, Any]) -> FakeProducer:
        """The member's producer factory: a replacement made during an outage fails (or hangs
        in) its initialisation."""
        producer = FakeProducer(conf, broker=self.fk._broker)
        if self.outage is not None and not self.starting:
            kind, left = self.outage
            if kind == "hang":
                producer.hang_next("init_transactions")
            elif kind == "retriable":
                producer.fail_next("init_transactions", _error(kind), count=left)
                left = 1  # the same producer is tried again
            else:
                producer.fail_next("init_transactions", _error(kind))
            self.outage = (kind, left - 1) if left > 1 else None
        self.producers.append(producer)
        return producer

    def _incarnate(self, committed: dict[TP, int]) -> None:
        self.starting = True
        try:
            super()._incarnate(committed)
        finally:
            self.starting = False
        # The new producer fenced the last process's (or the second member's) and aborted what
        # it left open: those partitions are assigned afresh, from what is committed.
        self.fenced = False
        self._ended()

    def _turn(self) -> None:
        seeks, assigns = len(self.fk.seeks), len(self.fk.assigned_at)
        try:
            super()._turn()
        except TransactionError as exc:  # as Engine.run does
            self.life.fail(exc)
        self._check_turn(seeks, assigns)

    def _handled(self, task: Task, i: int) -> None:
        super()._handled(task, i)
        rec = task.records[i]
        if task.outputs is None:
            task.outputs = {}
        task.outputs[i] = [Output(OUT, f"{rec.partition}:{rec.offset}", rec.key, None, None)]

    def _check_no_conflict(self, task: Task) -> None:
        """As in the base machine, but a task whose partition started over after an abort holds
        no lane: the member gave its call up (`Workers.abandon`, its cancel set) and runs its
        records again, as it does for a revoke past its budget; a call that goes on meanwhile
        is the handler's to stop (`ctx.cancelled`), and its outputs are never written."""
        running = self.workers.running
        self.workers.running = [t for t in running if id(t) not in self.given_up]
        try:
            super()._check_no_conflict(task)
        finally:
            self.workers.running = running

    def _stop_after_failure(self) -> None:
        failure = self.life.failure
        if not isinstance(failure, TransactionError):
            super()._stop_after_failure()
            return
        # Only a second member with this transactional id stops a member here. The fence may
        # surface in a hand-off commit, half-way through a revoke: the member's state is only
        # used by its shutdown then, which commits nothing.
        assert failure.fenced and self.fenced, failure
        event("a fenced member stopped")
        self.eng.shutdown()
        self._check_commits()
        self._incarnate(dict(self.fk.committed))

    def _expected_watermarks(self, tps: list[TP]) -> dict[TP, int]:
        txn = self.eng.txn
        assert txn is not None
        self.before_revoke = (txn.ready, txn.aborted, txn.replaced)
        return super()._expected_watermarks(tps)

    def _check_revoke(self, tokens: dict[TP, int]) -> None:
        """The hand-off commits the watermark, when its transaction commits: a failed one
        (aborted, or its producer replaced, or being replaced already) leaves the partitions at
        what was committed before, for the next owner to run again."""
        txn = self.eng.txn
        assert txn is not None
        if self.before_revoke == (True, txn.aborted, txn.replaced):
            super()._check_revoke(tokens)
        else:
            event("a revoke whose hand-off transaction failed")

    # -- rules: the producer fails ---------------------------------------------------------

    @rule(
        call=st.sampled_from(_STEPS),
        kind=st.sampled_from(["abortable", "retriable", "transport"]),
        applied=st.booleans(),
        away=_AWAY,
    )
    def fail_call(self, call: str, kind: Kind, applied: bool, away: Away) -> None:
        """The next `call` fails; `applied`: the coordinator did it, the answer was lost (a
        commit that committed). An abortable error is never one of those. A transport error
        gets the producer replaced: the broker may stay `away` a while."""
        applied = applied and kind != "abortable"
        self.producers[-1].fail_next(call, _error(kind), applied=applied)
        self.outage = away if kind == "transport" else None
        self._step()

    @rule(call=st.sampled_from(_STEPS), applied=st.booleans(), away=_AWAY)
    def hang(self, call: str, applied: bool, away: Away) -> None:
        """The next `call` never returns (a broker restart): abandoned at its deadline, the
        producer replaced while the broker may stay `away` a while."""
        self.producers[-1].hang_next(call, applied=applied)
        self.outage = away
        self._step()

    @precondition(lambda self: bool(self.workers.queued))
    @rule(
        data=st.data(),
        code=st.sampled_from([KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.UNKNOWN_TOPIC_OR_PART]),
    )
    def refuse_output(self, data: st.DataObject, code: int) -> None:
        """A task runs, and the broker refuses the output of its last record (often the last
        write of the turn, when nothing but the member's own handling of the error ends the
        transaction at once): that transaction can only abort."""
        task = data.draw(st.sampled_from(self.workers.queued))
        self.producers[-1].fail_deliveries(KafkaError(code), after=len(task.records) - 1)
        self._take(task)
        self._run(task, None, self.live.pop(id(task)))
        self._step()

    @precondition(lambda self: not self.fenced)
    @rule()
    def fence(self) -> None:
        """A second member starts with the same transactional id: its producer fences this
        one's and aborts its open transaction; this member stops at its next call."""
        FakeProducer({"transactional.id": TXN_ID}, broker=self.fk._broker).init_transactions()
        self.fenced = True
        self._ended()  # aborted by the coordinator, not by the member: no rewind expected
        self._step()

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def outputs_match_committed_inputs(self) -> None:
        """Read_committed, the output topic holds each committed input's output once, and no
        other output."""
        if self.fake is None:
            return
        broker = self.fk._broker
        offsets = broker.committed_offsets("")
        maps = broker.committed_metadata("")
        committed = set()
        for tp, entries in self.logs.items():
            at = offsets.get(tp)
            if at is None:
                continue
            done = decode_finished(maps.get(tp), at)
            for off, _, marker in entries:
                if not marker and (
                    off < at or (isinstance(done, FinishedMap) and done.is_finished(off))
                ):
                    committed.add((tp[1], off))
        written = Counter(_input(m.value()) for m in broker.messages(OUT))
        twice = sorted(i for i, n in written.items() if n > 1)
        assert not twice, f"outputs written twice: {twice}"
        assert set(written) == committed, (
            f"committed inputs without their output: {sorted(committed - set(written))}; "
            f"outputs of inputs not committed: {sorted(set(written) - committed)}"
        )

    def _check_turn(self, seeks: int, assigns: int) -> None:
        """After each turn: what the turn did to the transactions."""
        if self.eng.txn is not None and not self.eng.txn.ready:
            event("a turn while the producer is being replaced")
        if self.producers and self.producers[-1].state == "abortable":
            raise AssertionError(
                "a transaction left open after the turn that reported its failed write or call"
            )
        committed = self.fk._broker.committed_offsets("")
        for tp, off in committed.items():
            before = self.committed_seen.get(tp, off)
            assert off >= before, f"committed offset of {tp} went back from {before} to {off}"
        self.committed_seen = committed
        for txn in self._ended():
            if txn.state == "committed":
                lost = set(txn.offsets.get("", {})) & self.lost_since
                assert not lost, f"a transaction committed offsets of {lost}, lost since"
            else:
                self._check_rewound(txn, seeks, assigns)

    def _check_rewound(self, txn: FakeTransaction, seeks: int, assigns: int) -> None:
        """The member aborted `txn`: every partition it wrote outputs of, if still owned, starts
        over at or below those records (its start is pending, or it was sought or assigned
        there in this turn)."""
        first: dict[int, int] = {}
        for msg in txn.records:
            p, off = _input(msg.value())
            first[p] = min(off, first.get(p, off))
        for p, off in sorted(first.items()):
            tp = Partition(TOPIC, p)
            if tp not in self.eng.own.partitions:
                continue
            again = [o for t, o in self.fk.seeks[seeks:] if t == (TOPIC, p)]
            again += [a[(TOPIC, p)] for a in self.fk.assigned_at[assigns:] if (TOPIC, p) in a]
            assert tp in self.eng.starts.pending or any(0 <= o <= off for o in again), (
                f"{tp} not rewound after the abort of a transaction with its record {off}"
            )
        event("a transaction aborted")

    def _ended(self) -> list[FakeTransaction]:
        """The member's transactions that ended since the last look."""
        out = [
            t
            for p in self.producers
            for t in p.transactions
            if t.state != "open" and id(t) not in self.txns_checked
        ]
        self.txns_checked.update(id(t) for t in out)
        return out

    def teardown(self) -> None:
        try:
            # The member stops once its producer is back, if it is being replaced: the last
            # commit then covers what it did meanwhile.
            for _ in range(100):
                if self.engine is None or self.eng.txn is None or self.eng.txn.ready:
                    break
                self._step()
            super().teardown()
            if self.engine is not None:
                self.outputs_match_committed_inputs()
        finally:
            for producer in self.producers:
                producer.release()


TransactionalEngineMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

TestTransactionalEngineMachine = TransactionalEngineMachine.TestCase


class _Drawn:
    """`data` for a rule driven by hand: each draw returns the next value given."""

    def __init__(self, *values: Any) -> None:
        self.values = list(values)

    def draw(self, strategy: object) -> Any:
        return self.values.pop(0)


def test_a_partition_assigned_while_the_producer_is_replaced_waits_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression: a partition assigned while the member's transactional producer was being
    replaced started at once, at the committed offset the assign callback read, so its records
    were marked finished with no transaction open: their outputs were dropped, and the next
    commit passed them (found by the machine above). It now waits for the new producer, as a
    partition whose committed offset could not be read does."""
    for module in ("tests.property.test_engine_machine", __name__):
        monkeypatch.setattr(f"{module}.event", lambda *args: None)  # no hypothesis run here
    machine = TransactionalEngineMachine()
    machine.start("partition", True, [b"a"] * 3, {0}, "stop", 1, False, False)
    # Losing t[0] aborts the open transaction; the abort meets a broker gone away: the
    # producer is replaced, and its replacement's initialisation times out three times.
    machine.fail_call("abort_transaction", "transport", False, ("retriable", 3))
    machine.lose(_Drawn({(TOPIC, 0)}))
    txn = machine.eng.txn
    assert txn is not None and not txn.ready
    machine.assign({1})
    if machine.workers.queued:
        machine.run_all(fail=False)  # before the fix: its record finished without a transaction
    for _ in range(100):
        if txn.ready and not machine.eng.starts.pending:
            break
        machine.step(1)
    assert txn.ready and txn.replaced == 1
    machine.step(2)  # t[1] read from its committed offset again, and its record fetched
    machine.run_all(fail=False)
    machine.teardown()
    assert [m.value() for m in machine.fk._broker.messages(OUT)] == [b"1:0"]


def test_a_restored_offset_map_survives_a_commit_before_its_offsets_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression (found by the machine above): t[1]'s first record fails and is given up
    (blocked), 1 and 2 finish and their outputs commit with offset 0 and a map listing 1 and 2.
    Assigned again, the member reads offset 0, fails it again, and its revoke commits offset 0:
    with an empty map, which overwrote the restored one, and the next owner ran 1 and 2 again
    (their outputs written twice). The map read at assignment is sent on until its offsets are
    read (`ReplayMaps.metadata`)."""
    for module in ("tests.property.test_engine_machine", __name__):
        monkeypatch.setattr(f"{module}.event", lambda *args: None)  # no hypothesis run here
    machine = TransactionalEngineMachine()
    keys: list[bytes | None] = [b"a", None, b"c", None, None, b"c", b"c", b"c"]
    machine.start("unordered", False, keys, {0, 1, 2}, "stop", 1, False, False)
    machine.run_all(fail=True)
    machine.assign({0, 1, 2})
    machine.revoke(_Drawn(set()))
    machine.teardown()  # the outputs match the committed inputs, each once
