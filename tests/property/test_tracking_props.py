"""Property tests: the watermark never passes an unfinished delivered offset, never goes back, and
reaches the read position; commits stay monotonic under any order of results."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)
from tests.offset_map_handoff import skipped_by_next_owner

from weir._engine.committing import Committer
from weir._engine.tracking import BatchProgress, PartitionProgress
from weir.records import Partition

# Derandomized: the same examples on every run and every machine, so a red run is reproducible
# and CI never flakes.
SETTINGS = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@st.composite
def gapped_offsets(draw: st.DrawFn, max_len: int = 30) -> tuple[list[int], int]:
    """Strictly increasing offsets with random gaps (compaction, transaction markers) and a
    next position at or past last + 1 (trailing markers)."""
    start = draw(st.integers(0, 1_000))
    gaps = draw(st.lists(st.integers(1, 5), max_size=max_len))
    offsets: list[int] = []
    cur = start
    for i, gap in enumerate(gaps):
        cur = cur if i == 0 else cur + gap
        offsets.append(cur)
    trailing = draw(st.integers(1, 4))
    next_position = offsets[-1] + trailing if offsets else start + trailing - 1
    return offsets, next_position


Step = tuple[str, int | None]  # (kind, offset); a "revoke" has no offset


@st.composite
def completion_plan(draw: st.DrawFn) -> tuple[list[int], int, list[Step]]:
    offsets, next_position = draw(gapped_offsets())
    order = draw(st.permutations(offsets))
    steps: list[Step] = [("complete", off) for off in order]
    # duplicates of already-drawn offsets, stale tokens, and undelivered offsets, interleaved
    extras = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("complete"), st.sampled_from(offsets))
                if offsets
                else st.nothing(),
                st.tuples(st.just("stale"), st.sampled_from(offsets) if offsets else st.just(0)),
                st.tuples(st.just("missing"), st.integers(-5, next_position + 5)),
            ),
            max_size=15,
        )
    )
    for extra in extras:
        steps.insert(draw(st.integers(0, len(steps))), extra)
    if draw(st.booleans()) and draw(st.booleans()):
        steps.insert(draw(st.integers(0, len(steps))), ("revoke", None))
    return offsets, next_position, steps


@SETTINGS
@given(completion_plan())
def test_batch_watermark_invariants(plan: tuple[list[int], int, list[Step]]) -> None:
    offsets, next_position, steps = plan
    token = ("epoch", 1)
    b = BatchProgress(offsets, next_position, token)
    unfinished = set(offsets)
    revoked = False
    last = b.committable()
    for kind, off in steps:
        before = (b.committable(), b.pending)
        if kind == "revoke":
            b.revoke()
            revoked = True
        elif off is None:
            raise AssertionError(f"a {kind!r} step without an offset")
        elif kind == "complete":
            accepted = b.completed(off, token)
            assert accepted is (not revoked)
            if not revoked:
                unfinished.discard(off)
        elif kind == "stale":
            assert b.completed(off, ("epoch", 2)) is False
            assert (b.committable(), b.pending) == before
        else:  # "missing"
            if off in offsets:
                continue
            if revoked:
                assert b.completed(off, token) is False
            else:
                try:
                    b.completed(off, token)
                except ValueError:
                    pass
                else:
                    raise AssertionError(f"offset {off} was not delivered but was accepted")
            assert (b.committable(), b.pending) == before
        c = b.committable()
        if revoked:
            assert c is None
            assert b.pending == 0
            continue
        # never passes an unfinished delivered offset; exactly the earliest one
        expected = min(unfinished) if unfinished else next_position
        assert c == expected
        assert b.pending == len(unfinished)
        assert last is None or c >= last
        last = c
    if not revoked:
        assert b.committable() == next_position
        assert b.all_done


@SETTINGS
@given(gapped_offsets(), st.data())
def test_batch_rejects_bad_shapes(shape: tuple[list[int], int], data: st.DataObject) -> None:
    offsets, next_position = shape
    assume(len(offsets) >= 2)
    i = data.draw(st.integers(1, len(offsets) - 1))
    shuffled = list(offsets)
    shuffled[i - 1], shuffled[i] = shuffled[i], shuffled[i - 1]
    try:
        BatchProgress(shuffled, next_position, 0)
    except ValueError:
        pass
    else:
        raise AssertionError(f"unsorted offsets {shuffled} accepted")
    bad_next = data.draw(st.integers(-3, offsets[-1]))
    try:
        BatchProgress(offsets, bad_next, 0)
    except ValueError:
        pass
    else:
        raise AssertionError(f"next_position {bad_next} <= last offset {offsets[-1]} accepted")


def expected_flags(base: int, read_position: int, unfinished: set[int]) -> bytes:
    """What the offset map must say from the committable offset to the read position: 0 for a
    delivered offset not finished, 1 for one finished or never delivered."""
    return bytes(0 if off in unfinished else 1 for off in range(base, read_position))


# -- PartitionProgress against a model --------------------------------------------------------


class PartitionProgressMachine(RuleBasedStateMachine):
    """The model: the set of delivered-unfinished offsets and the newest read position."""

    batches = Bundle("batches")

    def __init__(self) -> None:
        super().__init__()
        self.epoch = 7
        self.p = PartitionProgress(self.epoch)
        self.unfinished: set[int] = set()
        self.delivered: dict[int, int] = {}  # offset -> id of its batch
        self.read_position: int | None = None
        self.revoked = False
        self.last: int | None = None

    @initialize(start=st.integers(0, 50))
    def first_position(self, start: int) -> None:
        self.start = start

    @precondition(lambda self: not self.revoked)
    @rule(
        target=batches,
        lead=st.integers(0, 4),
        gaps=st.lists(st.integers(1, 4), max_size=6),
        trailing=st.integers(1, 3),
    )
    def add_batch(
        self, lead: int, gaps: list[int], trailing: int
    ) -> tuple[BatchProgress, tuple[int, ...]]:
        floor = self.start if self.read_position is None else self.read_position
        offsets: list[int] = []
        cur = floor + lead
        for i, gap in enumerate(gaps):
            cur = cur if i == 0 else cur + gap
            offsets.append(cur)
        next_position = offsets[-1] + trailing if offsets else floor + lead + trailing - 1
        b = self.p.add_batch(offsets, next_position)
        self.unfinished.update(offsets)
        self.read_position = next_position
        return b, tuple(offsets)

    @rule(batch=batches, data=st.data())
    def complete(self, batch: tuple[BatchProgress, tuple[int, ...]], data: st.DataObject) -> None:
        b, offsets = batch
        if not offsets:
            return
        off = data.draw(st.sampled_from(offsets))
        self._complete(b, off)

    def _complete(self, b: BatchProgress, off: int) -> None:
        accepted = b.completed(off, b.token)
        if self.revoked:
            # Only a batch finished (and dropped) before the revoke may still accept a
            # duplicate; either way nothing can change any more.
            assert not accepted or b.all_done
            assert self.p.committable() is None
        else:
            assert accepted
            self.unfinished.discard(off)

    @rule(batch=batches, other=batches, data=st.data())
    def stale_token(
        self,
        batch: tuple[BatchProgress, tuple[int, ...]],
        other: tuple[BatchProgress, tuple[int, ...]],
        data: st.DataObject,
    ) -> None:
        b, offsets = batch
        token = other[0].token if other[0] is not b else (self.epoch + 1, 0)
        off = data.draw(st.sampled_from(offsets)) if offsets else 0
        before = (self.p.committable(), self.p.pending)
        assert b.completed(off, token) is False
        assert (self.p.committable(), self.p.pending) == before

    @rule(batch=consumes(batches))
    def complete_all_of_a_batch(self, batch: tuple[BatchProgress, tuple[int, ...]]) -> None:
        b, offsets = batch
        for off in reversed(offsets):
            self._complete(b, off)
            self.check()

    @precondition(lambda self: not self.revoked and self.read_position is not None)
    @rule(back=st.integers(1, 10), size=st.integers(1, 3))
    def rewind_is_refused(self, back: int, size: int) -> None:
        assert self.read_position is not None
        start = max(0, self.read_position - back)
        assume(start < self.read_position)
        before = (self.p.committable(), self.p.pending, self.p.batches)
        try:
            self.p.add_batch(list(range(start, start + size)), start + size)
        except ValueError:
            pass
        else:
            raise AssertionError("a batch behind the read position was accepted")
        assert (self.p.committable(), self.p.pending, self.p.batches) == before

    @precondition(lambda self: not self.revoked)
    @rule(ahead=st.integers(-3, 5))
    def advance_to(self, ahead: int) -> None:
        """The client's position moved past offsets it never delivered (trailing markers)."""
        if self.read_position is None:
            assert self.p.advance_to(self.start + max(ahead, 0)) is False
            return
        target = self.read_position + ahead
        moved = self.p.advance_to(target)
        assert moved is (target > self.read_position)
        if moved:
            self.read_position = target

    @precondition(lambda self: not self.revoked)
    @rule()
    def revoke(self) -> None:
        self.p.revoke()
        self.revoked = True

    @precondition(lambda self: self.revoked)
    @rule(size=st.integers(0, 3))
    def add_after_revoke_is_refused(self, size: int) -> None:
        start = self.read_position or 0
        try:
            self.p.add_batch(list(range(start, start + size)), start + size + 1)
        except RuntimeError:
            pass
        else:
            raise AssertionError("a revoked partition accepted a batch")

    @invariant()
    def check(self) -> None:
        c = self.p.committable()
        if self.revoked:
            assert c is None
            assert self.p.pending == 0
            return
        if self.read_position is None:
            assert c is None
            return
        expected = min(self.unfinished) if self.unfinished else self.read_position
        assert c == expected, (c, expected, sorted(self.unfinished))
        assert all(c <= off for off in self.unfinished)
        assert self.p.pending == len(self.unfinished)
        assert self.last is None or c >= self.last
        self.last = c
        # The offset map's flags: 0 exactly for the unfinished delivered offsets.
        assert self.p.finished_flags() == (
            c,
            expected_flags(c, self.read_position, self.unfinished),
        )


PartitionProgressMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None, derandomize=True, database=None
)
TestPartitionProgress = PartitionProgressMachine.TestCase


# -- Committer monotonicity -------------------------------------------------------------------

P = Partition("t", 0)

Op = tuple[str, int, bool]


AS, DELIVER = "advance_send", "deliver"


@settings(SETTINGS, max_examples=300)
@given(
    start=st.integers(0, 100),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("advance"), st.integers(1, 3), st.just(True)),
            st.tuples(st.just("advance_send"), st.integers(1, 3), st.just(True)),
            st.tuples(st.just("send"), st.just(0), st.just(True)),
            st.tuples(st.just("deliver"), st.integers(0, 50), st.booleans()),
            st.tuples(st.just("deliver"), st.integers(0, 50), st.booleans()),
        ),
        max_size=60,
    ),
    final_ok=st.lists(st.booleans(), min_size=30, max_size=30),
)
# The orders that matter, always run: newer success before an older one; an older failure after
# a newer success; an older failure while the newer is pending; the newest failing alone.
@example(0, [(AS, 1, True), (AS, 1, True), (DELIVER, 1, True), (DELIVER, 0, True)], [True] * 30)
@example(0, [(AS, 1, True), (AS, 1, True), (DELIVER, 1, True), (DELIVER, 0, False)], [True] * 30)
@example(0, [(AS, 1, True), (AS, 1, True), (DELIVER, 0, False), (AS, 1, True)], [True] * 30)
@example(0, [(AS, 1, True), (AS, 1, True), (DELIVER, 1, False), (DELIVER, 0, True)], [True] * 30)
@example(5, [(AS, 2, True), (DELIVER, 0, False), ("send", 0, True)], [False] * 29 + [True])
def test_committer_is_monotonic_under_any_result_order(
    start: int, ops: list[Op], final_ok: list[bool]
) -> None:
    c = Committer(interval_s=1.0, every=1)
    c.track(P)
    committable = start
    pending: list[int] = []  # sent, result not yet delivered
    succeeded: list[int] = []
    sent_log: list[tuple[int, bool]] = []  # (offset, failed?)

    def send() -> None:
        out = c.to_send({P: committable})
        if not out:
            return
        off = out[P]
        assert off == committable
        # never at or below an offset the broker confirmed
        assert not succeeded or off > max(succeeded), (off, succeeded)
        # never at or below one still in flight
        assert not pending or off > max(pending), (off, pending)
        # never below anything sent before; equal only to a resend of a failed one
        if sent_log:
            top = max(o for o, _ in sent_log)
            assert off >= top
            if off == top:
                assert all(failed for o, failed in sent_log if o == top), sent_log
        c.sent(out, 0.0)
        pending.append(off)
        sent_log.append((off, False))

    def deliver(index: int, ok: bool) -> None:
        off = pending.pop(index % len(pending))
        c.result(P, off, None if ok else "failed", sync=False)
        if ok:
            succeeded.append(off)
        else:
            for i in range(len(sent_log) - 1, -1, -1):
                if sent_log[i] == (off, False):
                    sent_log[i] = (off, True)
                    break

    for kind, n, ok in ops:
        if kind == "advance":
            committable += n
        elif kind == "advance_send":
            committable += n
            send()
        elif kind == "send":
            send()
        elif pending:
            deliver(n, ok)
        assert c.confirmed(P) == (max(succeeded) if succeeded else None)

    # Liveness: once every result is in, an unconfirmed watermark is always sent again, and a
    # confirmed one never is.
    for ok in final_ok:
        send()
        if not pending:
            break
        while pending:
            deliver(0, ok)
    while pending:
        deliver(0, True)
    confirmed = c.confirmed(P)
    out = c.to_send({P: committable})
    if confirmed == committable:
        assert out == {}
    else:
        assert out == {P: committable}


@SETTINGS
@given(gapped_offsets(), st.data())
def test_completed_many_equals_one_by_one(
    shape: tuple[list[int], int], data: st.DataObject
) -> None:
    """The owner marks a whole task finished in one call: it must end exactly where completing
    the same offsets one at a time ends, and a chunk with an undelivered offset marks nothing."""
    offsets, next_position = shape
    bulk = BatchProgress(offsets, next_position, "t")
    single = BatchProgress(offsets, next_position, "t")
    order = data.draw(st.permutations(offsets))
    delivered = set(offsets)
    i = 0
    while i < len(order):
        size = data.draw(st.integers(1, 6))
        chunk = list(order[i : i + size])
        i += size
        if data.draw(st.booleans()) and data.draw(st.booleans()):
            bad = data.draw(st.integers(-3, next_position + 3).filter(lambda o: o not in delivered))
            before = bulk.committable(), bulk.pending
            with pytest.raises(ValueError, match="not delivered"):
                bulk.completed_many([*chunk, bad], "t")
            assert (bulk.committable(), bulk.pending) == before
        assert bulk.completed_many(chunk, "stale") == 0
        assert bulk.completed_many(chunk, "t") == len(chunk)
        for off in chunk:
            assert single.completed(off, "t")
        assert bulk.committable() == single.committable()
        assert bulk.pending == single.pending
    assert bulk.committable() == next_position
    bulk.revoke()
    assert bulk.completed_many(offsets, "t") == 0


@SETTINGS
@given(st.integers(0, 1_000), st.integers(1, 30), st.data())
def test_completed_many_of_any_chunk_equals_one_by_one(
    start: int, count: int, data: st.DataObject
) -> None:
    """Gapless batches take a fast path for a chunk that is a slice in offset order; any other
    chunk (out of order, repeated offsets, or a first and last that only look like a slice's)
    must end exactly where completing its offsets one at a time ends."""
    offsets = list(range(start, start + count))
    bulk = BatchProgress(offsets, start + count, "t")
    single = BatchProgress(offsets, start + count, "t")
    for _ in range(data.draw(st.integers(1, 8))):
        if data.draw(st.booleans()):
            lo = data.draw(st.integers(0, count - 1))
            chunk = offsets[lo : data.draw(st.integers(lo + 1, count))]
        else:
            chunk = data.draw(st.lists(st.sampled_from(offsets), min_size=1, max_size=8))
        assert bulk.completed_many(chunk, "t") == len(chunk)
        for off in chunk:
            single.completed(off, "t")
        assert (bulk.committable(), bulk.pending) == (single.committable(), single.pending)


# -- the offset map of a partition's batches --------------------------------------------------

Layout = tuple[list[tuple[list[int], int]], set[int]]


@st.composite
def batch_layouts(draw: st.DrawFn) -> Layout:
    """Consecutive batches of one partition, as (offsets, next position), and which delivered
    offsets are finished. A batch starts where the one before ended or further on (a gap between
    batches: offsets never delivered), has gaps of its own or none (the two ways BatchProgress
    stores flags), may end before its next position (trailing markers), or is empty (the
    position moved past markers alone)."""
    pos = draw(st.integers(0, 1_000))
    batches: list[tuple[list[int], int]] = []
    for _ in range(draw(st.integers(1, 6))):
        cur = pos + draw(st.integers(0, 3))
        count = draw(st.integers(0, 6))
        gapless = draw(st.booleans())
        offsets: list[int] = []
        for i in range(count):
            cur += 0 if i == 0 else 1 if gapless else draw(st.integers(1, 3))
            offsets.append(cur)
        pos = (offsets[-1] + 1 if offsets else cur) + draw(st.integers(0, 2))
        if not offsets and batches and pos == batches[-1][1]:
            pos += 1  # an empty batch must move the position
        batches.append((offsets, pos))
    delivered = [off for offsets, _ in batches for off in offsets]
    finished = {off for off in delivered if draw(st.booleans())}
    return batches, finished


@SETTINGS
@given(batch_layouts(), st.data())
def test_the_next_owner_skips_only_what_is_finished_or_was_never_delivered(
    layout: Layout, data: st.DataObject
) -> None:
    """The offsets the committed map lets the next owner skip (encoded and decoded as the
    engine does) are a subset of the finished ones and the gaps, across gaps between batches;
    and, as nothing is cut at these sizes, every finished offset above the commit is among
    them."""
    batches, finished = layout
    p = PartitionProgress(epoch=1)
    made: dict[int, BatchProgress] = {}
    for offsets, next_position in batches:
        b = p.add_batch(offsets, next_position)
        made.update(dict.fromkeys(offsets, b))
    for off in data.draw(st.permutations(sorted(finished))):
        assert made[off].completed(off, made[off].token)
    unfinished = set(made) - finished
    read_position = batches[-1][1]
    base = min(unfinished) if unfinished else read_position
    skipped = skipped_by_next_owner(p)
    never_delivered = set(range(base, read_position)) - set(made)
    assert skipped <= finished | never_delivered, f"unfinished {sorted(skipped & unfinished)}"
    assert skipped == set(range(base, read_position)) - unfinished
    assert p.finished_flags() == (base, expected_flags(base, read_position, unfinished))
