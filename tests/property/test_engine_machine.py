"""The whole engine as a state machine: random polls with gaps, completions in any order, slow
and failing handlers, revoke, lost, re-assign and crash/restart, under every ordering mode, and
(`MixedOrderingsMachine`) over two topics of different orderings, as routes make them.

The engine runs on the test thread: `Engine.step()` is one turn of the owner loop, the client is
the in-memory fake, and the workers are `ManualWorkers`, which run a task only when a rule says
so (all at once, or taken now and finished later: a slow handler). Half the runs use them as
*concurrent* workers, the model of async handlers (`weir._engine.aio`): a task's lanes run at once,
and `progress_task` finishes any records whose calls are under way, in any order, reporting them
in `Task.done` with a `Progress` notice, so lanes are freed while the task still runs. After
every step the invariants below are checked; a crash drops the engine without a shutdown and
starts a new one from what the fake broker committed, as a restarted process would.

`WEIR_MACHINE_EXAMPLES` / `WEIR_MACHINE_STEPS` size the run (`make chaos` runs a longer one).
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from typing import Any, Literal

import pytest
from confluent_kafka import TopicPartition
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from weir._engine import bounded as bounded_module
from weir._engine import settlement as settlement_module
from weir._engine import transactions as transactions_module
from weir._engine.engine import Engine
from weir._engine.lifecycle import Lifecycle
from weir._engine.scheduling import Orderings
from weir._engine.tasks import DONE, FAILED, FENCED, HELD, Assignment, Task
from weir._engine.workers import Progress
from weir.config import ConsumerConfig
from weir.errors import HandlerError
from weir.policy import FailurePolicy, RetryPolicy
from weir.records import Context, Handler, Partition, Record
from weir.testing.clock import ManualClock
from weir.testing.fake import FakeConsumer, FakeProducer

TOPIC = "t"
PARTITIONS = 3
KEYS: list[bytes | None] = [None, b"a", b"b", b"c"]
Ordering = Literal["key", "partition", "unordered"]
TP = tuple[str, int]

EXAMPLES = int(os.environ.get("WEIR_MACHINE_EXAMPLES", "40"))
STEPS = int(os.environ.get("WEIR_MACHINE_STEPS", "40"))


# The engine's time, advancing 1 ms at every reading: runs are deterministic (hypothesis
# replays them), and every wait the engine loops on still ends. The wall clock (a dead letter's
# weir.dlq.failed_at) stays the real one.
CLOCK = ManualClock(tick=0.001)


def _owner() -> bool:
    """The machine drives the engine on the main thread: only its readings are machine time. A
    thread some earlier test left running (a reaper, a member not yet gone) keeps real time, and
    cannot move the machine's clock under a run that hypothesis must be able to replay."""
    return threading.current_thread() is threading.main_thread()


def _sleep(seconds: float) -> None:
    """A wait of the owner's (a transactional call retried) passes at once in machine time; one
    of another thread (the reaper of a replaced producer) takes its real time."""
    if _owner():
        CLOCK.advance(seconds)
    else:
        time.sleep(seconds)


def _monotonic() -> float:
    return CLOCK.monotonic() if _owner() else time.monotonic()


def _perf_counter() -> float:
    return CLOCK.perf_counter() if _owner() else time.perf_counter()


# The waits for a transactional producer's calls are real ones in weir (`weir._engine.bounded`): in
# the machine the owner's read its clock too.
_TIME = type(
    "_Time",
    (),
    {
        "monotonic": staticmethod(_monotonic),
        "perf_counter": staticmethod(_perf_counter),
        "time": staticmethod(time.time),
        "sleep": staticmethod(_sleep),
    },
)


class _Hangs:
    """The machine's fake producers, whose calls may hang (`FakeProducer.hang_next`)."""

    def __init__(self) -> None:
        self.producers: list[FakeProducer] = []
        self._seen = 0

    def reset(self) -> None:
        self.producers = []
        self._seen = 0

    def began(self) -> bool:
        """A call began to hang since the last look."""
        total = sum(p.hangs for p in self.producers)
        began, self._seen = total > self._seen, total
        return began


HANGS = _Hangs()


class _CallDone(threading.Event):
    """What `weir._engine.bounded` waits on for a call running on a thread of its own, in machine
    time: the wait lasts (in real time) until the call returns or a fake producer's call begins to
    hang; a hang lets the wait's whole timeout pass on the machine's clock at once, so the call
    is abandoned at its deadline, deterministically and without waiting for it."""

    def wait(self, timeout: float | None = None) -> bool:
        while not super().wait(0.001):
            if HANGS.began() or timeout == 0:
                CLOCK.advance(timeout or 0.0)
                return self.is_set()
        return True


_BOUNDED_THREADING = type("_Threading", (), {"Thread": threading.Thread, "Event": _CallDone})


class _Completions:
    """A completion queue that never blocks: the engine's waits become no-ops. Tasks marked to
    finish soon finish when the engine next looks (inside a revoke's drain, say)."""

    def __init__(self) -> None:
        self.items: deque[Task | Progress] = deque()
        self.soon: list[Callable[[], None]] = []

    def put(self, task: Task | Progress) -> None:
        self.items.append(task)

    def get(self, block: bool = True, timeout: float | None = None) -> Task | Progress:
        return self.get_nowait()

    def get_nowait(self) -> Task | Progress:
        soon, self.soon = self.soon, []
        for finish in soon:
            finish()
        if not self.items:
            raise queue.Empty
        return self.items.popleft()


class ManualWorkers:
    """Workers that run a task only when the test says so."""

    def __init__(self, slots: int = 4, concurrent: bool = False) -> None:
        self.concurrent = concurrent
        self.queued: list[Task] = []
        self.running: list[Task] = []
        self._done = _Completions()
        self._slots = slots
        self._replaced = 0

    @property
    def completions(self) -> _Completions:
        return self._done

    @property
    def slots(self) -> int:
        return self._slots

    @property
    def replaced(self) -> int:
        return self._replaced

    def start(self) -> None:
        pass

    def submit(self, task: Task) -> None:
        self.queued.append(task)

    def abandon(self, assignments: Collection[Assignment]) -> int:
        n = sum(1 for t in self.running if t.assignment in assignments)
        self._replaced += n
        return n

    def stop(self, timeout: float) -> bool:
        return not self.running

    def take(self, task: Task) -> None:
        """A worker takes the task and its first record (its handler starts), from the
        iterator the owner may empty, as `ThreadWorkers` does: `started` is stamped."""
        self.queued.remove(task)
        task.it = iter(task.records)
        next(task.it)
        task.started = CLOCK.perf_counter()
        self.running.append(task)

    def finish(
        self, task: Task, outcomes: bytearray | None, errors: Mapping[int, BaseException]
    ) -> None:
        self.running.remove(task)
        task.outcomes = outcomes
        task.errors = dict(errors) or None
        task.seconds = 1e-5 * len(task.records)  # fast handlers: tasks pack several records
        self._done.put(task)


class _Unused(Handler):
    def handle(self, record: Record, ctx: Context) -> None:
        raise AssertionError("ManualWorkers run no handler")


class Boom(Exception):
    pass


def _lane(ordering: Ordering, rec: Record) -> Hashable:
    if ordering == "key":
        return (rec.topic, rec.partition, rec.key)
    if ordering == "partition":
        return (rec.topic, rec.partition)
    # unordered: only the same record twice is a conflict
    return (rec.topic, rec.partition, rec.offset)


# What every machine's start draws beside its ordering(s).
_STARTS: dict[str, Any] = {  # strategies (Any: initialize also takes `target`)
    "incremental": st.booleans(),
    "keys": st.lists(st.sampled_from(KEYS), min_size=PARTITIONS, max_size=30),
    "ps": st.sets(st.integers(0, PARTITIONS - 1), min_size=1),
    "final": st.sampled_from(["stop", "block"]),
    "attempts": st.integers(1, 3),
    "fast": st.booleans(),
}


class EngineMachine(RuleBasedStateMachine):
    # The partitions a rule's `p` draws from (a subclass spreads them over two topics).
    slots: tuple[TP, ...] = tuple((TOPIC, p) for p in range(PARTITIONS))

    def __init__(self) -> None:
        super().__init__()
        CLOCK.reset()
        self.logs: dict[TP, list[tuple[int, bytes | None, bool]]] = defaultdict(list)
        self.handled: dict[TP, set[int]] = defaultdict(set)  # a handler finished it once
        self.ordering: Ordering = "key"
        # Each topic's ordering (routes of different orderings: `MixedOrderingsMachine`).
        self.orderings: dict[str, Ordering] = {}
        self.concurrent = False
        # Concurrent tasks: the records whose calls are under way (or were, and finished).
        self.began: dict[int, set[int]] = {}
        self.engine: Engine | None = None
        self.fake: FakeConsumer | None = None
        self.workers = ManualWorkers()
        self.life = Lifecycle()
        self.assigned: set[TP] = set()
        self.lost_since: set[TP] = set()  # lost and not assigned again: no commit allowed
        self.commits_seen = 0
        # (tp, token) -> the last offset sent and its metadata
        self.last_commit: dict[tuple[TP, int], tuple[int, str | None]] = {}
        self.lane_order: dict[tuple[int, Hashable], int] = {}  # (token, lane) -> last offset
        self.incarnations = 0
        self.revoking_in = 0
        self.failure = FailurePolicy()
        self.fast = False
        self.fail_at: dict[int, int | None] = {}  # slow tasks that will fail a record
        self.live: dict[int, bool] = {}  # taken tasks: whether their first call began
        self.soon: set[int] = set()  # running tasks that finish at the engine's next look
        self.in_budget: dict[int, set[int]] = defaultdict(set)  # a revoke must wait for these
        # Per assignment token: offsets delivered to it, and offsets whose handler finished
        # in one of its tasks before its revoke (what its watermark is made of).
        self.delivered: dict[int, set[int]] = defaultdict(set)
        self.finished: dict[int, set[int]] = defaultdict(set)
        # Partitions that started over (an aborted transaction) in the turn under way.
        self.started_over: set[Partition] = set()

    # -- set-up and incarnations ---------------------------------------------------------

    @initialize(
        ordering=st.sampled_from(["key", "partition", "unordered"]),
        **_STARTS,
        concurrent=st.booleans(),
    )
    def start(
        self,
        ordering: Ordering,
        incremental: bool,
        keys: list[bytes | None],
        ps: set[int],
        final: Literal["stop", "block"],
        attempts: int,
        fast: bool,
        concurrent: bool,
    ) -> None:
        # Fast handlers from the start (as after a while of running): tasks pack several
        # records and lanes, and whole-partition lanes come into play.
        self.fast = fast
        self.ordering = ordering
        self.orderings = {t: self.orderings.get(t, ordering) for t, _ in self.slots}
        self.incremental = incremental
        # Backoffs in machine time (1 ms a clock reading): due within a few turns.
        self.failure = FailurePolicy(
            retry=RetryPolicy(
                max_attempts=attempts, backoff_initial_s=0.01, backoff_max_s=0.01, jitter=0.0
            ),
            final=final,
            block_retry_s=0.05,
        )
        self.concurrent = concurrent
        for i, key in enumerate(keys):
            self.logs[self.slots[i % PARTITIONS]].append((i // PARTITIONS, key, False))
        # The group committed the start of every partition but the first before (a group that
        # ran before); the first has nothing committed, so its start goes through the reset
        # path (`weir._engine.starts`: resolved, committed, then sought) under every rule.
        self._incarnate({self.slots[p]: 0 for p in range(1, PARTITIONS)})
        self.assign(ps)

    def _config(self, **extra: Any) -> ConsumerConfig:
        return ConsumerConfig(
            bootstrap_servers="fake:9092",
            group_id="g",
            topics=sorted({t for t, _ in self.slots}),
            ordering=self.ordering,
            workers=4,
            assignment_strategy="cooperative-sticky" if self.incremental else "range",
            poll_timeout_s=0.001,
            commit_interval_s=0.001,
            commit_every_records=1,
            revoke_timeout_s=0.01,
            shutdown_timeout_s=0.02,
            startup_timeout_s=1.0,
            max_batch_records=4,
            flow={"capacity_records": 12, "pause_records": 8, "resume_records": 2},
            failure=self.failure,
            **extra,
        )

    def _client(self, committed: dict[TP, int]) -> FakeConsumer:
        """A new process's client: a fresh fake over the same log and committed offsets."""
        fake = FakeConsumer()
        for topic in sorted({t for t, _ in self.slots}):
            fake._broker.create_topic(topic, sum(t == topic for t, _ in self.slots))
        for (topic, p), entries in self.logs.items():
            for off, key, marker in entries:
                if marker:
                    fake.produce_marker(topic, p, off)
                else:
                    fake.produce(topic, p, b"v", key, offset=off)
        # A scripted fake keeps its committed offsets in its private broker, under group "".
        fake._broker.commit("", [TopicPartition(t, p, off) for (t, p), off in committed.items()])
        return fake

    def _engine(self, fake: FakeConsumer) -> Engine:
        return Engine(self._config(), _Unused(), fake.factory, self.life, self.workers, clock=CLOCK)

    def _incarnate(self, committed: dict[TP, int]) -> None:
        """A new process: a fresh engine and client over the same log and committed offsets."""
        fake = self.fake = self._client(committed)
        self.workers = ManualWorkers(concurrent=self.concurrent)
        self.life = Lifecycle()
        self.soon.clear()
        engine = self.engine = self._engine(fake)
        if self.fast:
            engine.scheduler._per_record = 1e-6
        replay = engine.replay
        restored = replay.finished_before

        def finished_before(tp: Partition, records: Sequence[Record]) -> list[int]:
            """Records a restored offset map lets the engine skip: each must have been handled
            by some earlier owner, and counts as finished in this assignment."""
            done = restored(tp, records)
            handled = self.handled[(tp.topic, tp.partition)]
            assert set(done) <= handled, f"map skips unhandled {sorted(set(done) - handled)}"
            if done:
                event("records skipped thanks to an offset map")
                self.finished[engine.own.partitions[tp].assignment.token].update(done)
            return done

        replay.finished_before = finished_before  # type: ignore[method-assign]
        self.engine.start()
        self.assigned = set()
        self.commits_seen = 0
        self.incarnations += 1

    @property
    def eng(self) -> Engine:
        assert self.engine is not None
        return self.engine

    @property
    def fk(self) -> FakeConsumer:
        assert self.fake is not None
        return self.fake

    def _step(self, turns: int = 1) -> None:
        """`turns` turns of the owner loop, and as many more as the fake needs to serve every
        scripted rebalance (one per consume call)."""
        done = 0
        while done < turns or self.fk._events:
            seen = len(self.fk.delivered)
            # A partition whose start is not sought yet drops what it is handed (the seek
            # comes after the turn's intake): nothing of it is delivered to its assignment.
            # Nor to one that started over in the turn (its next records come after a seek).
            starting = set(self.eng.starts.pending)
            self.started_over.clear()
            self._turn()
            for tp, off in self.fk.delivered[seen:]:
                part = Partition(*tp)
                st_ = self.eng.own.partitions.get(part)
                if st_ is not None and part not in starting and part not in self.started_over:
                    self.delivered[st_.assignment.token].add(off)
            done += 1
            self._check_commits()
            if self.life.failure is not None:
                self._stop_after_failure()
                return

    def _turn(self) -> None:
        """One turn of the owner loop, as `Engine.run` makes it."""
        self.eng.step()

    def _stop_after_failure(self) -> None:
        failure = self.life.failure
        assert isinstance(failure, HandlerError), failure
        event("a handler failure stopped the member")
        self.budget_holds()  # what the failed task settled, before the shutdown moves on
        self.eng.shutdown()
        self._check_commits()
        # The final commit never passes the failed record.
        tp = (failure.record.topic, failure.record.partition)
        assert self.fk.committed.get(tp, 0) <= failure.record.offset
        self._incarnate(dict(self.fk.committed))

    # -- rules ---------------------------------------------------------------------------

    @rule(
        p=st.integers(0, PARTITIONS - 1),
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=8),
        gap=st.integers(0, 2),
        marker=st.booleans(),
    )
    def produce(self, p: int, keys: list[bytes | None], gap: int, marker: bool) -> None:
        tp = self.slots[p]
        log = self.logs[tp]
        nxt = log[-1][0] + 1 if log else 0
        nxt += gap  # compaction: offsets that never exist
        entries = []
        for key in keys:
            entries.append((nxt, key, False))
            nxt += 1
        if marker:
            entries.append((nxt, None, True))  # a transaction marker occupies an offset
        log.extend(entries)
        for off, key, is_marker in entries:
            if is_marker:
                self.fk.produce_marker(*tp, off)
            else:
                self.fk.produce(*tp, b"v", key, offset=off)

    @precondition(lambda self: bool(self.workers.running))
    @rule(data=st.data(), n=st.integers(1, 3))
    def produce_behind(self, data: st.DataObject, n: int, task: Task | None = None) -> None:
        """More records of a lane that a running task holds (its key, its partition): they
        must wait for that lane, however much of the task has finished."""
        if task is None:
            task = data.draw(st.sampled_from(self.workers.running))
        rec = data.draw(st.sampled_from(task.records))
        self.produce(self.slots.index((rec.topic, rec.partition)), [rec.key] * n, 0, False)
        self._step()

    @rule(ps=st.sets(st.integers(0, PARTITIONS - 1), min_size=1))
    def assign(self, ps: set[int]) -> None:
        new = [self.slots[p] for p in sorted(ps) if self.slots[p] not in self.assigned]
        if not new:
            return
        if self.incremental:
            self.fk.script_assign(new)
            self.assigned |= set(new)
        else:
            # Eager: everything is revoked, then the whole new assignment given.
            whole = sorted(self.assigned | set(new))
            if self.assigned:
                self._revoke_all_eager()
            self.fk.script_assign(whole)
            self.assigned = set(whole)
        self.lost_since -= set(new)
        self._step()

    def _revoke_all_eager(self) -> None:
        old = sorted(self.assigned)
        self._step(0)  # earlier rebalances are served first
        expected = self._expected_watermarks(old)
        self.fk.script_revoke(old)
        self.assigned = set()
        self._step(0)
        self._check_revoke(expected)

    @precondition(lambda self: bool(self.assigned))
    @rule(data=st.data())
    def revoke(self, data: st.DataObject) -> None:
        if self.incremental:
            tps = data.draw(st.sets(st.sampled_from(sorted(self.assigned)), min_size=1))
        else:
            tps = set(self.assigned)
        self._step(0)  # earlier rebalances are served first
        expected = self._expected_watermarks(sorted(tps))
        self.fk.script_revoke(sorted(tps))
        self.assigned -= tps
        self._step(0)
        self._check_revoke(expected)

    @precondition(lambda self: bool(self.assigned))
    @rule(data=st.data())
    def lose(self, data: st.DataObject) -> None:
        if self.incremental:
            tps = data.draw(st.sets(st.sampled_from(sorted(self.assigned)), min_size=1))
        else:
            tps = set(self.assigned)  # eager: the whole assignment is lost at once
        self._step(0)  # earlier rebalances are served first
        before = len(self.fk.commit_log())
        self.fk.script_lost(sorted(tps))
        self.assigned -= tps
        self.lost_since |= tps
        self._step(0)
        lost_commits = [
            c for c in self.fk.commit_log()[before:] if c.in_callback == "lost" and set(c.offsets)
        ]
        assert not lost_commits, f"committed inside on_lost: {lost_commits}"
        self._check_commits()

    @rule(turns=st.integers(1, 3))
    def step(self, turns: int) -> None:
        self._step(turns)

    @precondition(lambda self: bool(self.workers.queued))
    @rule(data=st.data(), fail=st.booleans(), slow=st.booleans())
    def run_task(self, data: st.DataObject, fail: bool, slow: bool) -> None:
        """A worker takes a queued task: it runs to the end now, or (slow) stays running until
        `finish_task`. Optionally one record fails."""
        task = data.draw(st.sampled_from(self.workers.queued))
        self._take(task)
        fail_at = data.draw(st.integers(0, len(task.records) - 1)) if fail else None
        if slow:
            self.fail_at[id(task)] = fail_at
            if task.done is not None and self._heads(task) and data.draw(st.booleans()):
                self._progress_some(task, data)  # some of its lanes are quick
            return
        self._run(task, fail_at, self.live.pop(id(task)))
        self._step()

    def _slow(self) -> list[Task]:
        """Running tasks not already set to finish soon."""
        return [t for t in self.workers.running if id(t) not in self.soon]

    @precondition(lambda self: bool(self._slow()))
    @rule(data=st.data())
    def finish_soon(self, data: st.DataObject) -> None:
        """A running task finishes while the engine is busy with something else: it is seen
        at the engine's next look at its completions (a revoke's drain, for one)."""
        task = data.draw(st.sampled_from(self._slow()))
        self.soon.add(id(task))

        def finish() -> None:
            self.soon.discard(id(task))
            self._run(task, self.fail_at.pop(id(task), None), self.live.pop(id(task)))

        self.workers.completions.soon.append(finish)

    @precondition(lambda self: bool(self._slow()))
    @rule(data=st.data())
    def finish_task(self, data: st.DataObject) -> None:
        task = data.draw(st.sampled_from(self._slow()))
        self._run(task, self.fail_at.pop(id(task), None), self.live.pop(id(task)))
        self._step()

    @precondition(lambda self: bool(self.workers.queued))
    @rule(fail=st.booleans())
    def run_all(self, fail: bool) -> None:
        """Every queued task runs to the end, the first record of the first task failing if
        `fail`."""
        for i, task in enumerate(list(self.workers.queued)):
            self._take(task)
            self._run(task, 0 if fail and i == 0 else None, self.live.pop(id(task)))
        self._step()

    def _take(self, task: Task) -> None:
        """A worker takes the task. A concurrent one starts the first record of every lane."""
        live = task.assignment.dispatching  # a fenced task runs nothing: the worker sees it
        if live:
            self._check_no_conflict(task)
            if any(
                t.done is not None and t.done and t.assignment is task.assignment
                for t in self.workers.running
            ):
                event("a task starts beside a partly finished task of its partition")
        self.workers.take(task)
        self.live[id(task)] = live
        if task.done is not None:
            heads = [idxs[0] for idxs in self._lanes_of(task).values()]
            self.began[id(task)] = set(heads) if live else set()

    def _lanes_of(self, task: Task) -> dict[Hashable, list[int]]:
        lanes: dict[Hashable, list[int]] = {}
        for i, rec in enumerate(task.records):
            lanes.setdefault(self._lane(rec), []).append(i)
        return lanes

    def _heads(self, task: Task) -> list[int]:
        """Records of a running concurrent task whose calls are under way, bar the one set to
        fail: each is the first unfinished record of its lane in the task."""
        assert task.done is not None
        done = set(task.done)
        began = self.began.get(id(task), set())
        fail_at = self.fail_at.get(id(task))
        heads = []
        for idxs in self._lanes_of(task).values():
            i = next((i for i in idxs if i not in done), None)
            if i is not None and i in began and i != fail_at:
                heads.append(i)
        return heads

    def _progressable(self) -> list[Task]:
        return [t for t in self._slow() if t.done is not None and self._heads(t)]

    @precondition(lambda self: bool(self._progressable()))
    @rule(data=st.data())
    def progress_task(self, data: st.DataObject) -> None:
        """Concurrent workers: records whose calls are under way in a running task finish, in
        any order, and are reported while the task goes on."""
        self._progress_some(data.draw(st.sampled_from(self._progressable())), data)

    def _progress_some(self, task: Task, data: st.DataObject) -> None:
        heads = self._heads(task)
        for i in data.draw(st.lists(st.sampled_from(heads), min_size=1, unique=True)):
            self._finish_record(task, i)
        self.workers.completions.put(Progress([task]))
        event("progress of a running concurrent task")
        self._step()
        if data.draw(st.booleans()):
            # More records of the task's lanes arrive, and the tasks the owner then hands out
            # for its partition start at once: lanes freed too early would run twice.
            self.produce_behind(data, data.draw(st.integers(1, 3)), task)
            for t in [t for t in self.workers.queued if t.assignment is task.assignment]:
                self._take(t)
                self.fail_at[id(t)] = None

    def _finish_record(self, task: Task, i: int) -> None:
        """A concurrent task's record `i` finished; the next record of its lane starts if its
        assignment still dispatches."""
        assert task.done is not None
        a = task.assignment
        rec = task.records[i]
        lane = self._lane(rec)
        self._check_order(a.token, rec)
        self._handled(task, i)
        task.done.append(i)
        if a.dispatching:
            idxs = self._lanes_of(task)[lane]
            after = idxs.index(i) + 1
            if after < len(idxs):
                self.began.setdefault(id(task), set()).add(idxs[after])

    def _handled(self, task: Task, i: int) -> None:
        """The handler of `task.records[i]` returned (before the record counts as finished)."""
        rec = task.records[i]
        self.handled[(rec.topic, rec.partition)].add(rec.offset)
        if not task.assignment.cancel.is_set():
            self.finished[task.assignment.token].add(rec.offset)

    @precondition(lambda self: any(self.handled.values()))
    @rule()
    def crash(self) -> None:
        """kill -9: no shutdown, no final commit. The next process starts from what was
        committed."""
        event("crash")
        self._incarnate(dict(self.fk.committed))

    # -- the simulated handler -----------------------------------------------------------

    def _run(self, task: Task, fail_at: int | None, first_started: bool) -> None:
        """What a worker does: the first record's call began when the task was taken (if its
        assignment still dispatched then); every later record checks the fence first."""
        if task.done is not None:
            self._run_concurrent(task, fail_at)
            return
        a = task.assignment
        n = len(task.records)
        outcomes = bytearray(n)
        errors: dict[int, BaseException] = {}
        held: set[Hashable] = set()
        assert task.it is not None
        # The first record was taken with the task; the rest come from the iterator, which
        # the owner may have emptied (records moved to other tasks: left FENCED here, and the
        # engine leaves them to the tasks that took them).
        for i, rec in enumerate(itertools.chain(task.records[:1], task.it)):
            if not (a.dispatching or (i == 0 and first_started)):
                break  # FENCED from here on
            lane = self._lane(rec)
            if self.orderings[rec.topic] != "unordered" and lane in held:
                outcomes[i] = HELD
                continue
            if i == fail_at:
                outcomes[i] = FAILED
                errors[i] = Boom(rec.event_id)
                held.add(lane)
                continue
            self._check_order(a.token, rec)
            outcomes[i] = DONE
            self._handled(task, i)
        if task.moved:
            event("records moved off a long task")
        clean = all(o == DONE for o in outcomes)
        self.workers.finish(task, None if clean else outcomes, errors)

    def _run_concurrent(self, task: Task, fail_at: int | None) -> None:
        """The rest of a concurrent task, lane by lane: a record runs if its call is under way
        or its assignment still dispatches; a failure holds the rest of its lane."""
        assert task.done is not None
        a = task.assignment
        began = self.began.pop(id(task), set())
        self.began[id(task)] = began  # _finish_record adds the next of each lane here
        out = bytearray(len(task.records))  # FENCED unless said otherwise
        errors: dict[int, Exception] = {}
        for idxs in self._lanes_of(task).values():
            for pos, i in enumerate(idxs):
                if i in task.done:
                    out[i] = DONE
                    continue
                if not (a.dispatching or i in began):
                    break  # the rest of the lane stays FENCED
                if i == fail_at:
                    out[i] = FAILED
                    errors[i] = Boom(task.records[i].event_id)
                    for j in idxs[pos + 1 :]:
                        out[j] = HELD
                    break
                self._finish_record(task, i)
                out[i] = DONE
        self.began.pop(id(task), None)
        clean = all(o == DONE for o in out)
        self.workers.finish(task, None if clean else out, errors)

    # -- invariants ----------------------------------------------------------------------

    def _check_no_conflict(self, task: Task) -> None:
        """No record of a lane runs while another task of the same lane runs: the same key (key
        mode), the same partition (partition mode), the same record (any mode), whatever
        assignment each task belongs to. A running task of a fenced assignment holds only the
        record whose call is under way; it runs nothing after it."""
        mine = {self._lane(r) for r in task.records}
        for other in self.workers.running:
            if not self.live[id(other)]:
                continue
            if other.done is not None:
                # A concurrent task holds the lanes of its unfinished records: of all of them
                # while it dispatches, else of those whose calls are under way.
                done = set(other.done)
                began = self.began.get(id(other), set())
                recs = [
                    r
                    for i, r in enumerate(other.records)
                    if i not in done and (other.assignment.dispatching or i in began)
                ]
            elif other.assignment.dispatching:  # it runs all it still holds
                recs = other.records[: len(other.records) - other.moved]
            else:
                recs = other.records[:1]
            theirs = {self._lane(r) for r in recs}
            clash = mine & theirs
            assert not clash, f"{task} would run {clash} while {other} runs them"

    def _lane(self, rec: Record) -> Hashable:
        return _lane(self.orderings[rec.topic], rec)

    def _check_order(self, token: int, rec: Record) -> None:
        if self.orderings[rec.topic] == "unordered":
            return
        lane, offset = self._lane(rec), rec.offset
        last = self.lane_order.get((token, lane))
        assert last is None or offset > last, f"lane {lane} ran {offset} after {last}"
        self.lane_order[(token, lane)] = offset

    def _check_commits(self) -> None:
        log = self.fk.commit_log()
        for call in log[self.commits_seen :]:
            for tp, off in call.offsets.items():
                # No commit passes a record that was never handled.
                for o, _, marker in self.logs[tp]:
                    if o >= off:
                        break
                    assert marker or o in self.handled[tp], (
                        f"commit {off} on {tp} passes unhandled offset {o}"
                    )
                assert tp not in self.lost_since, f"commit on {tp} after it was lost"
                # Monotonic per partition and assignment; the same offset again only with a
                # new offset map (more records finished above it).
                st_ = self.eng.own.partitions.get(Partition(*tp))
                if st_ is not None:
                    key = (tp, st_.assignment.token)
                    md = call.metadata.get(tp)
                    prev = self.last_commit.get(key)
                    assert prev is None or off > prev[0] or (off == prev[0] and md != prev[1]), (
                        f"{tp}: commit {off} {md!r} after {prev}"
                    )
                    self.last_commit[key] = (off, md)
        if len(log) > self.commits_seen:
            event("commits")
        self.commits_seen = len(log)

    def _expected_watermarks(self, tps: list[TP]) -> dict[TP, int]:
        """The tokens of the partitions about to be revoked. A task set to finish soon finishes
        within the revoke's budget: the revoke must wait for it, so the record its call was
        running counts as finished (its later records are fenced by then)."""
        self.revoking_in = self.incarnations
        tokens: dict[TP, int] = {
            tp: self.eng.own.partitions[tp].assignment.token
            for tp in tps
            if tp in self.eng.own.partitions
        }
        for task in self.workers.running:
            if (
                id(task) not in self.soon
                or task.assignment.token not in tokens.values()
                or not self.live.get(id(task))
            ):
                continue
            if task.done is not None:
                done = set(task.done)
                for i in self.began.get(id(task), set()) - done:
                    if self.fail_at.get(id(task)) != i:
                        self.in_budget[task.assignment.token].add(task.records[i].offset)
            elif self.fail_at.get(id(task)) != 0:
                self.in_budget[task.assignment.token].add(task.records[0].offset)
        return tokens

    def _check_revoke(self, tokens: dict[TP, int]) -> None:
        """A revoke commits its partitions' watermark: the first offset delivered to the
        assignment whose handler did not finish in one of its tasks, or, with every delivered
        record finished, a position past the last one."""
        if self.incarnations != self.revoking_in:
            return  # a failure restarted the member meanwhile
        for tp, token in tokens.items():
            assert tp not in self.eng.own.partitions
            delivered = self.delivered.pop(token, set())
            finished = self.finished.pop(token, set())
            waited_for = self.in_budget.pop(token, set())
            assert waited_for <= finished, (
                f"revoke of {tp} did not wait for {sorted(waited_for - finished)}, which "
                "finished within its budget"
            )
            unfinished = delivered - finished
            committed = self.fk.committed.get(tp)
            if unfinished:
                assert committed == min(unfinished), (
                    f"revoke of {tp} left {committed} committed, its watermark is {min(unfinished)}"
                )
            elif delivered:
                assert committed is not None and committed > max(delivered), (
                    f"revoke of {tp}: everything up to {max(delivered)} finished, "
                    f"committed {committed}"
                )

    @invariant()
    def budget_holds(self) -> None:
        if self.engine is None:
            return
        b = self.eng.budget
        b.check()
        # Tracking and the budget agree: every delivered unfinished record of an owned
        # partition is in the budget, in the lanes or read ahead.
        for tp, st_ in self.eng.own.partitions.items():
            pb = b.parts[tp]
            assert st_.progress.pending == pb.records + pb.ahead_records, (
                f"{tp}: {st_.progress.pending} unfinished tracked, "
                f"{pb.records} + {pb.ahead_records} in the budget"
            )

    def teardown(self) -> None:
        if self.engine is None:
            return
        if self.workers.replaced:
            event("a worker replaced after a cut-off hand-off")
        if self.eng.failures.retries:
            event("a failed record retried")
        if self.eng.failures.blocked():
            event("a partition blocked")
        if self.eng.budget.throttles:
            event("throttled")
        if self.eng.budget.pauses:
            event("paused at the capacity")
        if any(st_.progress.pending for st_ in self.eng.own.partitions.values()):
            event("unfinished records at the end")
        for task in self._slow():
            self._run(task, None, self.live.pop(id(task)))
        self.life.request_stop()
        self.eng.shutdown()
        self._check_commits()
        if self.life.failure is None:
            b = self.eng.budget
            b.check()


class ConcurrentEngineMachine(EngineMachine):
    """The same machine with concurrent workers only: partly finished tasks, lanes freed while
    their task runs, and new tasks of those lanes beside it, get every example."""

    @initialize(
        ordering=st.sampled_from(["key", "partition", "unordered"]),
        **_STARTS,
    )
    def start_concurrent(self, ordering: Ordering, **drawn: Any) -> None:
        EngineMachine.start(self, ordering, concurrent=True, **drawn)


class MixedOrderingsMachine(EngineMachine):
    """The same machine over two topics of different orderings, as routes with orderings of
    their own make them (`weir.routing`): each topic's records keep its own lanes, in one
    scheduler, one budget and one commit path, through revokes, losses and crashes."""

    slots = (("t", 0), ("t", 1), ("u", 0))

    @initialize(
        orderings=st.permutations(["key", "partition", "unordered"]),
        **_STARTS,
        concurrent=st.booleans(),
    )
    def start_mixed(self, orderings: list[Ordering], **drawn: Any) -> None:
        # `t` takes the member's ordering, `u` a route's of another.
        self.orderings = {"t": orderings[0], "u": orderings[1]}
        EngineMachine.start(self, orderings[0], **drawn)

    def _engine(self, fake: FakeConsumer) -> Engine:
        topics = dict(self.orderings)
        mixed = Orderings(topics.__getitem__, frozenset(topics.values()), topics)
        return Engine(
            self._config(),
            _Unused(),
            fake.factory,
            self.life,
            self.workers,
            clock=CLOCK,
            orderings=mixed,
        )


# Hypothesis runs every initialize rule: the subclass keeps only its own. Without `run_all`
# tasks are taken one by one, often slow: partly finished tasks are the point here.
ConcurrentEngineMachine.start = None  # type: ignore[method-assign]
MixedOrderingsMachine.start = None  # type: ignore[method-assign]
ConcurrentEngineMachine.run_all = None  # type: ignore[assignment]

for machine in (EngineMachine, ConcurrentEngineMachine, MixedOrderingsMachine):
    machine.TestCase.settings = settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


@pytest.fixture(autouse=True)
def _machine_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # A slow task gives its unreached records away after a few turns of machine time.
    monkeypatch.setattr(settlement_module, "_MOVE_AFTER", 0.01)
    for module in (transactions_module, bounded_module):
        monkeypatch.setattr(module, "time", _TIME)
    # Exactly-once: a transactional call's wait is one wait for its whole deadline, in machine
    # time (`_CallDone`), and a replaced producer's initialisation is tried again every turn.
    monkeypatch.setattr(bounded_module, "threading", _BOUNDED_THREADING)
    monkeypatch.setattr(bounded_module, "_SLICE", float("inf"))
    monkeypatch.setattr(transactions_module, "_RECOVER_EVERY", 0.02)


TestEngineMachine = EngineMachine.TestCase
TestConcurrentEngineMachine = ConcurrentEngineMachine.TestCase
TestMixedOrderingsMachine = MixedOrderingsMachine.TestCase
_ = (itertools, FENCED, Any)
