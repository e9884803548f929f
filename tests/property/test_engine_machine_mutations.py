"""The engine state machine catches deliberate bugs: each test plants one in the engine and
runs a machine of test_engine_machine.py, unchanged, which must fail on the invariant named.

Every mutation is a monkeypatch of one small engine function: a change of behaviour a user would
notice (a record lost or run again, a commit the member must not make, two records of a key at
once, a budget that drifts until the consumer stalls or overruns its capacity). The runs are
derandomized, with no example database and no shrinking, and stop at their first failing
example. Derandomized is not reproducible, though: which example first fails changes from one
process to the next, the same mutant under the same hash seed (measured on the first-unfinished
off-by-one: after 4 examples in one run, 370 in another; CI once saw it pass 150 unharmed).
So a mutant may search up to `HUNT` examples, four times the control's bound; it costs time
only when the bug hides. The control tests run the unmutated machines, the default tier's
with `FAST`, the slow tier's with `SLOW`, and must pass; a mutant must fail on the invariant
its test names, so a failure is the planted bug's.

The exactly-once mutants (a refused output left in its transaction, no rewind after an abort,
a partition sought before a replaced producer is ready) run the transactional machine of
test_engine_machine_transactional.py.

Two tiers. The default one holds the bugs the machines find within a few dozen examples whatever
the seed. The `slow` one holds those they find only after hundreds: a revoke or lost that lands
while a handler is finishing (the `finish_soon` rule right before `revoke` or `lose`), two
tasks of one key both taken while in flight, and the first-unfinished off-by-one (a later record
of a batch finishing first, then a commit before the earlier one does); it runs them, and its
controls, with a larger bound.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

# The machines, and the fixture that runs the engine on machine time: autouse, so imported here
# it applies to this module's tests as it does to the machines' own.
from tests.property.test_engine_machine import (
    ConcurrentEngineMachine,
    EngineMachine,
    MixedOrderingsMachine,
    _machine_time,  # noqa: F401
)
from tests.property.test_engine_machine_transactional import (
    TransactionalEngineMachine,
    test_a_partition_assigned_while_the_producer_is_replaced_waits_for_it,
)

from weir._engine.budget import Budget
from weir._engine.engine import Engine
from weir._engine.exactly_once import ExactlyOnce
from weir._engine.ownership import PartitionState
from weir._engine.scheduling import Scheduler, _Lane
from weir._engine.settlement import Settlement
from weir._engine.starts import Starts
from weir._engine.tasks import Assignment
from weir._engine.tracking import BatchProgress
from weir._engine.transactions import Transactions
from weir.offsetmap import FinishedMap
from weir.records import Partition, Record

Machine = type[RuleBasedStateMachine]


def _settings(examples: int) -> settings:
    """Fixed bounds, not WEIR_MACHINE_EXAMPLES / WEIR_MACHINE_STEPS: the same runs everywhere.
    A mutant stops at its first failing example; only the controls run all of them."""
    return settings(
        max_examples=examples,
        stateful_step_count=40,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


FAST = _settings(150)
HUNT = _settings(600)
SLOW = _settings(1500)


def _caught(machine: Machine, invariant: str, run: settings = HUNT) -> None:
    """The machine fails on an assertion whose message matches `invariant`. The machine's
    teardown may raise in turn after a rule failed half-way (it finishes tasks the failed rule
    left behind): the assertion is then the context of what propagates."""
    with pytest.raises(Exception) as info:
        run_state_machine_as_test(machine, settings=run)
    error: BaseException | None = info.value
    while error is not None and not isinstance(error, AssertionError):
        error = error.__context__
    assert error is not None, f"no invariant failed: {info.value!r}"
    assert re.search(invariant, str(error)), f"another invariant failed: {error}"


# -- controls ------------------------------------------------------------------------------


# The threaded and transactional controls (about 17 s each) run in make chaos; the plain one here.
@pytest.mark.parametrize(
    "machine",
    [
        EngineMachine,
        pytest.param(ConcurrentEngineMachine, marks=pytest.mark.slow),
        pytest.param(TransactionalEngineMachine, marks=pytest.mark.slow),
    ],
)
def test_unmutated_engine_passes(machine: Machine) -> None:
    """Control: the engine as it is passes the machines under the default tier's settings."""
    run_state_machine_as_test(machine, settings=FAST)


@pytest.mark.slow
@pytest.mark.parametrize("machine", [EngineMachine, ConcurrentEngineMachine, MixedOrderingsMachine])
def test_unmutated_engine_passes_long(machine: Machine) -> None:
    """Control: the engine as it is passes the machines under the slow tier's settings."""
    run_state_machine_as_test(machine, settings=SLOW)


# -- mutants the machines find at once -----------------------------------------------------


def test_catches_budget_kept_on_close(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug: `Budget.close` drops a revoked or lost partition without taking its records and
    bytes out of the totals: each rebalance with work in flight leaks capacity, until the
    consumer stays paused for good.
    Caught by: the budget's invariants (`budget_holds` -> `Budget.check`: the totals are the
    sums of the owned partitions' counts)."""

    def close(self: Budget, tp: Partition) -> None:
        pb = self.parts.pop(tp, None)
        if pb is None:
            return
        # the bug: no `self.records -= pb.records` and `self.bytes -= pb.bytes + pb.ahead_bytes`
        self._resume.discard(tp)
        self._blocked.pop(pb, None)
        self._starved.pop(pb, None)

    monkeypatch.setattr(Budget, "close", close)
    # Records or bytes: whichever total `Budget.check` compares first in the run's state.
    _caught(EngineMachine, r"budget (records|bytes) \d+ != partitions' \d+")


def test_catches_late_completion_credited_to_new_assignment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug: `Settlement._owner_of` finds a returning task's partition by name, not by assignment,
    so a task of a revoked or lost assignment that comes back late is settled against the
    partition's new assignment: the new assignment's budget is released for records it never
    ran (it then overruns its capacity, or goes negative).
    Caught by: the budget's invariants (`budget_holds`: tracking's unfinished records equal
    the budget's, and `Budget.check`'s counts are never negative)."""

    def owner_of(self: Settlement, a: Assignment) -> PartitionState | None:
        return self._own.partitions.get(a.tp)  # the bug: no `st.assignment is a` check

    monkeypatch.setattr(Settlement, "_owner_of", owner_of)
    _caught(EngineMachine, r"negative counts|\d+ unfinished tracked, \d+ \+ \d+ in the budget")


def test_catches_offset_map_read_off_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug: a restored offset map is read as if its flags began one past the committed offset
    (which is never finished): each flag lands on the next offset, so a new owner skips an
    unfinished record that follows a finished one, and that record is never handled.
    Caught by: a restored map skips only records handled before (the machine's
    `finished_before` check on every restart). The concurrent machine finds it soonest."""

    def is_finished(self: FinishedMap, offset: int) -> bool:
        i = offset - self.base - 1  # the bug: - 1
        return 0 <= i < self.covered and self.flags[i] == 1

    monkeypatch.setattr(FinishedMap, "is_finished", is_finished)
    _caught(ConcurrentEngineMachine, r"map skips unhandled")


def test_catches_a_refused_output_left_in_its_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug: `Transactions._delivered` ignores an output's failed delivery report. librdkafka
    still fails the commit (measured: tests/contract/test_producer_contract.py), so the
    transaction aborts, but only at its next boundary: until then the member goes on marking
    records finished into a transaction that can only abort, work that all runs again.
    Caught by: a failed write's transaction ends in the turn that reported it (`_check_turn`;
    the machine's `refuse_output` refuses the last output of a task, so that no later write of
    the turn gives the error away)."""
    monkeypatch.setattr(Transactions, "_delivered", lambda self, err, msg: None)
    _caught(TransactionalEngineMachine, r"a transaction left open after the turn")


def _no_engine_rewind(monkeypatch: pytest.MonkeyPatch) -> None:
    def rewind(self: ExactlyOnce, tps: list[Partition], *, reread: bool = False) -> None:
        pass  # the bug: the partitions go on from where they were

    monkeypatch.setattr(ExactlyOnce, "rewind", rewind)


def _no_starts_rewind(monkeypatch: pytest.MonkeyPatch) -> None:
    def rewind(self: Starts, tp: Partition, *, reread: bool) -> None:
        pass  # the bug: reset, but never sought back to the committed offset

    monkeypatch.setattr(Starts, "rewind", rewind)


@pytest.mark.parametrize("plant", [_no_engine_rewind, _no_starts_rewind])
def test_catches_no_rewind_after_an_abort(
    monkeypatch: pytest.MonkeyPatch, plant: Callable[[pytest.MonkeyPatch], None]
) -> None:
    """Bug: after an aborted transaction the owned partitions do not start over from their
    committed offsets (`ExactlyOnce.rewind` does nothing, or `Starts.rewind` seeks nowhere): the
    records marked finished in the aborted transaction, whose outputs were aborted, never run
    again, and the next commit passes them.
    Caught by: every partition still owned starts over after an abort (`_check_rewound`), and
    the output topic holds the output of every committed input (`outputs_match_committed_
    inputs`); when the abort came with a replaced producer, the partitions go on without an
    open transaction (`a record marked finished without an open transaction`)."""
    plant(monkeypatch)
    _caught(
        TransactionalEngineMachine,
        r"not rewound after the abort|committed inputs without their output"
        r"|marked finished without an open transaction",
    )


def _seek_before_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    init = Starts.__init__

    def eager(self: Starts, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._ready = lambda: True  # the bug

    monkeypatch.setattr(Starts, "__init__", eager)


def test_catches_a_seek_before_the_new_producer_is_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug: while a replaced producer's successor is not ready, partitions are sought (and
    assigned) at their committed offsets all the same (`Starts` ignores its `ready`): their
    records run and are marked finished with no transaction open, their outputs dropped, and
    the commit after the recovery passes them.
    Caught by: no record is marked finished without an open transaction (the machine's check
    on every output the member writes), or what follows from it: a committed input without its
    output, or (when the transaction the old producer left open commits after all) an output
    of an input that runs again.
    The machine's search reaches it in some processes only (the bug needs a replacement whose
    initialisation keeps failing, then an assignment, in that order): here the scenario it found,
    replayed; the search itself is in the slow tier below."""
    _seek_before_ready(monkeypatch)
    with pytest.raises(AssertionError, match="marked finished without an open transaction"):
        test_a_partition_assigned_while_the_producer_is_replaced_waits_for_it(monkeypatch)


# -- mutants the machines find after hundreds of examples ---------------------------------


@pytest.mark.slow
def test_catches_a_routes_ordering_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug: the scheduler runs every topic under the member's ordering, not its route's: with
    the member unordered, a key- or partition-ordered route's records run side by side.
    Caught by: lane order holds per topic (`_check_no_conflict`, `_check_order`) in the machine
    over two topics of different orderings."""
    monkeypatch.setattr(Scheduler, "rule_of", lambda self, assignment: self._rule)
    _caught(MixedOrderingsMachine, r"would run .* while .* runs them|lane .* ran \d+ after \d+")


@pytest.mark.slow
def test_catches_first_unfinished_off_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug: `BatchProgress._advance` looks for the first unfinished record from one past the
    cursor, so when a later record of the batch finishes first the cursor jumps over the
    unfinished record it was on, and the watermark passes it: committed, then lost in a crash.
    Caught by: no commit passes an unfinished delivered offset (`_check_commits`); the
    tracking/budget agreement of `budget_holds` catches it too in some runs."""

    def advance(self: BatchProgress) -> None:
        i = self._done.find(0, self._cursor + 1)  # the bug: + 1
        self._cursor = len(self._done) if i < 0 else i

    monkeypatch.setattr(BatchProgress, "_advance", advance)
    # Concurrent workers finish a batch's records in any order, the bug's trigger; the
    # sequential machine finishes a later record first only across tasks, which its bound does
    # not always reach. (tests/unit/test_tracking.py catches the same bug without a search.)
    _caught(
        ConcurrentEngineMachine,
        r"commit \d+ on .* passes unhandled offset \d+|unfinished tracked",
        SLOW,
    )


@pytest.mark.slow
def test_the_machine_finds_a_seek_before_the_new_producer_is_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same bug, found by the transactional machine's own search."""
    _seek_before_ready(monkeypatch)
    _caught(
        TransactionalEngineMachine,
        r"marked finished without an open transaction|committed inputs without their output"
        r"|outputs of inputs not committed",
        SLOW,
    )


@pytest.mark.slow
def test_catches_busy_key_dispatched(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug: key mode's intake (`Scheduler._submit_keys`) does not see which keys are busy, so
    a new record of a key that a task holds goes out at once in a task of its own: two records
    of one key run at the same time, and may finish out of order.
    Caught by: key order holds (`_check_no_conflict` when the second task is taken while the
    first runs; `_check_order` when they run out of order)."""
    submit_keys = Scheduler._submit_keys

    def blind(
        self: Scheduler,
        assignment: Assignment,
        lanes: dict[Hashable, _Lane | list[Hashable]],
        batch: BatchProgress,
        records: list[Record],
    ) -> None:
        submit_keys(self, assignment, {}, batch, records)  # the bug: {} for the busy lanes

    monkeypatch.setattr(Scheduler, "_submit_keys", blind)
    _caught(
        ConcurrentEngineMachine,
        r"would run .* while .* runs them|lane .* ran \d+ after \d+",
        SLOW,
    )


@pytest.mark.slow
def test_catches_lost_served_as_revoke(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug: partitions lost are handed off like revoked ones (what the client does when no
    `on_lost` is registered): the engine waits for their handlers and commits their
    watermark, over the commits of the member that owns them now.
    Caught by: lost never commits (`_check_commits`: no commit on a partition lost and not
    assigned again; `lose`: none inside on_lost). Only a record that finishes during the lost
    callback leaves something new to commit, hence the many examples."""
    monkeypatch.setattr(Engine, "_on_lost", Engine._on_revoke)
    _caught(
        ConcurrentEngineMachine,
        r"commit on .* after it was lost|committed inside on_lost",
        SLOW,
    )


@pytest.mark.slow
def test_catches_revoke_without_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug: a revoke commits at once instead of waiting (up to `revoke_timeout_s`) for the
    handlers still running on its partitions: records that finish a moment later are left
    out of the hand-off commit, and the next owner runs them again.
    Caught by: a revoke's commit equals the watermark (`_check_revoke`: it includes what
    finished within the revoke's budget)."""

    def drain_until(self: Engine, deadline: float, assignments: list[Assignment]) -> None:
        self.settle.settle_started(assignments)  # the bug: no waiting before it

    monkeypatch.setattr(Engine, "_drain_until", drain_until)
    _caught(EngineMachine, r"revoke of .* did not wait for", SLOW)
