"""What passes between the owner thread and the workers: an assignment's fence, and tasks.

A *task* is the hand-off unit: records of one assignment that one worker runs in order (or, with
concurrent workers, one lane after another and lanes at once), then hands back once with an
outcome per record. The owner builds tasks (`weir._engine.scheduling`), workers run them
(`weir._engine.workers`, `weir._engine.aio`), the owner settles what comes back
(`weir._engine.engine`).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterator

from weir._engine.tracking import BatchProgress
from weir.records import Output, Partition, Record, size_of

__all__ = ["DONE", "FAILED", "FENCED", "HELD", "Assignment", "Lane", "LaneKey", "Task"]

# Per-record outcomes in `Task.outcomes` (a bytearray; None there means every record is DONE).
FENCED = 0  # not run: its assignment stopped dispatching before the worker reached it
DONE = 1
FAILED = 2
HELD = 3  # not run: an earlier record of its lane failed in the same task


class Lane(enum.Enum):
    """The lanes that are no record's key."""

    # A partition's records one task after another, in key and unordered mode while the handler
    # is fast (`weir._engine.scheduling`).
    WHOLE = "whole partition"
    # What a record holds in unordered mode: nothing.
    NONE = "no lane"


# A lane of one assignment (a task never mixes assignments, so the partition is implied): a
# record's key in key mode (null keys share one lane), None in partition mode (the partition's
# one lane), or a `Lane`. Record keys are bytes, so neither of the others is ever one of them.
LaneKey = bytes | None | Lane


def _no_pause(for_s: float | None) -> None:
    pass  # an assignment the application's pauses never opened (engine tests' own)


class Assignment:
    """One partition's ownership by this member, from assign to revoke/lost.

    Workers read `dispatching` before each record they run: once the owner clears it, the rest
    of the task is fenced without running. A worker whose handler raised `FencedError` clears it
    too (it is only ever cleared): the partition belongs to another member. `cancel` is what
    `Context.cancelled` reads.
    `attempts` holds the attempt number of records being retried (offset -> attempt): written
    by the owner before it hands the record out again, read by the worker that runs it.
    """

    __slots__ = ("attempts", "cancel", "dispatching", "epoch", "isolate", "pause", "token", "tp")

    def __init__(self, tp: Partition, token: int) -> None:
        self.tp = tp
        self.token = token
        self.dispatching = True
        self.cancel = threading.Event()
        self.attempts: dict[int, int] = {}
        # Batch handlers: offsets of records whose batch failed until their retries ran out. A
        # batch that holds one and fails again is split to find the record that fails alone
        # (`weir._engine.workers.BatchWorkers`). Written by the owner before the record runs.
        self.isolate: set[int] = set()
        self.epoch: int | None = None  # from the member's fence, set before the first dispatch
        # What a handler's `ctx.pause_partition(for_s)` calls (any thread; set when opened).
        self.pause: Callable[[float | None], None] = _no_pause

    def __repr__(self) -> str:
        return f"Assignment({self.tp}, token={self.token}, dispatching={self.dispatching})"


class Task:
    """Records of one assignment run in order by one worker; `batches[i]` tracks `records[i]`."""

    __slots__ = (
        "advanced",
        "assignment",
        "batch",
        "batches",
        "done",
        "errors",
        "finished",
        "it",
        "lane_left",
        "lanes",
        "moved",
        "nbytes",
        "outcomes",
        "outputs",
        "records",
        "report",
        "reported",
        "reported_bytes",
        "seconds",
        "shared",
        "started",
    )

    def __init__(
        self,
        assignment: Assignment,
        records: list[Record],
        batches: list[BatchProgress],
        lanes: list[LaneKey] | None,
    ) -> None:
        self.assignment = assignment
        self.records = records
        self.batches = batches
        self.lanes = lanes  # the lanes this task holds busy (None: unordered)
        # The one batch every record belongs to, when there is one (the common case): the owner
        # then marks the whole task finished in one call.
        self.batch: BatchProgress | None = None
        if batches and batches.count(batches[0]) == len(batches):
            self.batch = batches[0]
        self.nbytes = sum(map(size_of, records))
        # When a worker took it (`time.perf_counter()`; 0.0 before), set before the fence check:
        # a revoke waits only for tasks some worker has taken, not for ones still queued, and
        # the owner reads the progress of long tasks only once they ran a while.
        self.started = 0.0
        self.outcomes: bytearray | None = None
        self.errors: dict[int, BaseException] | None = None
        # Batch handlers: the failed records whose error is their whole batch's (a call over
        # several records raised): not known to be theirs, so never given to the final policy.
        self.shared: set[int] | None = None
        self.seconds = 0.0
        self.advanced = False
        # Progress: the worker counts its finished records in `finished` as it goes. The owner
        # reads the count of long tasks (`report`: one lane's records, or a deep unordered
        # batch) whenever it wakes (`Scheduler.reporting`), of any task once it has run long,
        # and before a hand-off commit; it has accounted for `reported` records.
        self.report = False
        self.finished = 0
        self.reported = 0
        self.reported_bytes = 0
        # The iterator the worker takes records from, set when it starts. The owner may take
        # the records it has not reached yet (`list(it)`, atomic under the GIL) while one
        # record runs long, and hand them to other workers: `moved` of them, from the end.
        self.it: Iterator[Record] | None = None
        self.moved = 0
        # What finished records produced (`Context.produce`, transactional members): by index,
        # set by the worker before the record counts as finished.
        self.outputs: dict[int, list[Output]] | None = None
        # Progress out of order (concurrent workers, `weir._engine.aio`): the worker appends the
        # index of every record that finished DONE, in the order they finished, and the owner reads
        # the entries past `reported` when the workers say so (`weir._engine.workers.Progress`).
        # None for a task whose records run one after another (its progress is the prefix
        # `finished`).
        self.done: list[int] | None = None
        # Owner side, with `done`: the records of each lane of the task not finished yet. A lane
        # whose count reaches zero is freed while the rest of the task runs
        # (`Scheduler.progressed`); None until the first progress is read.
        self.lane_left: dict[LaneKey, int] | None = None

    def __repr__(self) -> str:
        first = self.records[0].offset if self.records else None
        return f"Task({self.assignment.tp}, first={first}, records={len(self.records)})"
