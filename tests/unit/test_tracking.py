"""BatchProgress and PartitionProgress against the spec of the issue, case by case."""

from __future__ import annotations

import operator
from typing import SupportsIndex

import pytest
from tests.offset_map_handoff import skipped_by_next_owner
from typing_extensions import Buffer

from weir import BatchProgress, PartitionProgress

# -- BatchProgress: construction ------------------------------------------------------------


@pytest.mark.parametrize(
    "offsets",
    [[1, 1], [5, 3], [0, 2, 2], [10, 11, 9]],
)
def test_offsets_must_be_strictly_increasing(offsets: list[int]) -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        BatchProgress(offsets, 100, "t")


@pytest.mark.parametrize(
    ("offsets", "next_position"),
    [([100, 103, 107], 107), ([100, 103, 107], 104), ([5], 5), ([5], 0)],
)
def test_next_position_must_be_above_the_last_offset(
    offsets: list[int], next_position: int
) -> None:
    with pytest.raises(ValueError, match="next_position"):
        BatchProgress(offsets, next_position, "t")


def test_next_position_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="next_position"):
        BatchProgress([], -1, "t")


def test_valid_batches_are_accepted() -> None:
    assert BatchProgress([0], 1, "t").committable() == 0
    assert BatchProgress([7, 8, 20], 21, "t").committable() == 7
    # next_position may be further than last + 1 (a trailing transaction marker).
    assert BatchProgress([7], 9, "t").committable() == 7


# -- BatchProgress: completion and committable ------------------------------------------------


def test_issue_example_gaps_are_never_waited_for() -> None:
    b = BatchProgress([100, 103, 107], 110, "tok")
    assert b.committable() == 100
    assert b.completed(107, "tok") is True
    assert b.committable() == 100
    assert b.completed(100, "tok") is True
    assert b.committable() == 103
    assert b.completed(103, "tok") is True
    assert b.committable() == 110
    assert b.all_done


def test_empty_batch_is_committable_at_next_position() -> None:
    b = BatchProgress([], 42, "tok")
    assert b.committable() == 42
    assert b.all_done
    assert b.pending == 0


def test_in_order_completion_walks_the_offsets() -> None:
    offsets = [3, 4, 9, 10, 15]
    b = BatchProgress(offsets, 16, 1)
    for i, off in enumerate(offsets):
        assert b.committable() == off
        assert b.completed(off, 1)
        expected = offsets[i + 1] if i + 1 < len(offsets) else 16
        assert b.committable() == expected


def test_reverse_completion_holds_until_the_first_is_done() -> None:
    offsets = [0, 1, 2, 3, 4]
    b = BatchProgress(offsets, 5, 1)
    for off in reversed(offsets[1:]):
        assert b.completed(off, 1)
        assert b.committable() == 0
    assert b.pending == 1
    assert b.completed(0, 1)
    assert b.committable() == 5


def test_duplicate_completion_is_harmless() -> None:
    b = BatchProgress([10, 11, 12], 13, "t")
    assert b.completed(11, "t") is True
    assert b.completed(11, "t") is True
    assert b.committable() == 10
    assert b.pending == 2
    assert b.completed(10, "t") is True
    assert b.completed(10, "t") is True
    assert b.committable() == 12
    assert b.pending == 1


def test_offset_not_delivered_raises() -> None:
    b = BatchProgress([100, 103, 107], 110, "t")
    for missing in (101, 99, 110, 108, -1):
        with pytest.raises(ValueError, match="not delivered"):
            b.completed(missing, "t")
    assert b.committable() == 100
    assert b.pending == 3


def test_stale_token_changes_nothing() -> None:
    b = BatchProgress([1, 2, 3], 4, (7, 1))
    assert b.completed(1, (7, 2)) is False
    assert b.completed(1, (8, 1)) is False
    assert b.completed(1, None) is False
    assert b.committable() == 1
    assert b.pending == 3
    # A stale token is refused before the offset is looked at: late callbacks stay quiet.
    assert b.completed(999, "other") is False


def test_revoked_batch_refuses_completions_and_has_no_committable() -> None:
    b = BatchProgress([1, 2, 3], 4, "t")
    assert b.completed(1, "t")
    b.revoke()
    assert b.revoked
    assert b.committable() is None
    assert b.completed(2, "t") is False
    assert b.completed(3, "t") is False
    assert b.committable() is None
    assert b.pending == 0


def test_revoked_empty_batch_has_no_committable() -> None:
    b = BatchProgress([], 5, "t")
    b.revoke()
    assert b.committable() is None


def test_pending_counts_unfinished_delivered_offsets() -> None:
    b = BatchProgress([0, 5, 6, 9], 10, "t")
    assert b.pending == 4
    b.completed(6, "t")
    assert b.pending == 3
    b.completed(0, "t")
    assert b.pending == 2
    b.completed(9, "t")
    b.completed(5, "t")
    assert b.pending == 0


def test_properties_and_repr() -> None:
    b = BatchProgress([4, 6], 8, "tok")
    assert b.offsets == (4, 6)
    assert b.next_position == 8
    assert b.token == "tok"
    assert "committable=4" in repr(b)


class ScanCounter(bytearray):
    """A batch's done flags that count the bytes every search for the first unfinished offset
    looks at: the work of `BatchProgress._advance`, in steps rather than seconds (a rescan from
    0 is a C-level memchr, too fast to show in wall time at any size a unit test can afford)."""

    scanned = 0

    def find(
        self,
        sub: Buffer | SupportsIndex,
        start: SupportsIndex | None = None,
        end: SupportsIndex | None = None,
        /,
    ) -> int:
        found = super().find(sub, start, end)
        first = 0 if start is None else operator.index(start)
        self.scanned += (len(self) if found < 0 else found + 1) - first
        return found


@pytest.mark.parametrize("order", ["in order", "reverse"])
def test_completion_cost_is_amortised_constant(order: str) -> None:
    """Completing n offsets looks at O(n) flags in all: in order the cursor moves one step per
    completion, in reverse it stays on the first offset until the end. A cursor that searched
    from 0 each time would look at about n*n/2 flags in order (and still pass in reverse)."""
    n = 20_000
    b = BatchProgress(range(0, 2 * n, 2), 2 * n, "t")
    flags = ScanCounter(b._done)
    b._done = flags
    if order == "in order":
        for off in range(0, 2 * n, 2):
            b.completed(off, "t")
            assert b.committable() == off + 2
    else:
        for off in range(2 * n - 2, 0, -2):
            b.completed(off, "t")
            assert b.committable() == 0
        b.completed(0, "t")
    assert b.committable() == 2 * n
    scanned = flags.scanned
    assert scanned <= 3 * n, f"{scanned} flags looked at to complete {n} offsets"


# -- PartitionProgress ------------------------------------------------------------------------


def test_new_partition_has_nothing_committable() -> None:
    p = PartitionProgress(epoch=1)
    assert p.committable() is None
    assert p.pending == 0
    assert p.batches == 0


def test_batches_are_kept_in_read_order_not_overwritten() -> None:
    p = PartitionProgress(epoch=1)
    b1 = p.add_batch([0, 1, 2], 3)
    b2 = p.add_batch([3, 4], 5)
    assert p.batches == 2
    # The newer batch completing must not hide the older unfinished one.
    for off in (3, 4):
        assert b2.completed(off, b2.token)
    assert p.committable() == 0
    assert b1.completed(0, b1.token)
    assert b1.completed(2, b1.token)
    assert p.committable() == 1
    assert b1.completed(1, b1.token)
    assert p.committable() == 5
    assert p.batches == 0
    assert p.pending == 0


def test_committable_comes_from_oldest_unfinished_batch() -> None:
    p = PartitionProgress(epoch=3)
    b1 = p.add_batch([10, 12], 13)
    b2 = p.add_batch([15, 16], 17)
    b3 = p.add_batch([20], 25)
    assert p.committable() == 10
    b1.completed(10, b1.token)
    b1.completed(12, b1.token)
    assert p.committable() == 15
    b3.completed(20, b3.token)
    assert p.committable() == 15
    b2.completed(16, b2.token)
    assert p.committable() == 15
    b2.completed(15, b2.token)
    assert p.committable() == 25


def test_committable_survives_an_empty_queue_and_a_following_batch() -> None:
    p = PartitionProgress(epoch=1)
    b = p.add_batch([0], 1)
    b.completed(0, b.token)
    assert p.committable() == 1
    assert p.batches == 0
    b2 = p.add_batch([4, 7], 8)  # gap after a fully drained queue
    assert p.committable() == 4
    b2.completed(7, b2.token)
    b2.completed(4, b2.token)
    assert p.committable() == 8


def test_gap_between_batches_never_blocks() -> None:
    p = PartitionProgress(epoch=1)
    b1 = p.add_batch([0, 1], 5)  # 2..4 are transaction markers: never delivered
    b2 = p.add_batch([5, 9], 10)
    for b in (b1, b2):
        for off in b.offsets:
            b.completed(off, b.token)
    assert p.committable() == 10


def test_tokens_differ_per_batch_and_carry_the_epoch() -> None:
    p = PartitionProgress(epoch=9)
    b1 = p.add_batch([0], 1)
    b2 = p.add_batch([1], 2)
    assert b1.token != b2.token
    assert isinstance(b1.token, tuple) and isinstance(b2.token, tuple)
    assert b1.token[0] == 9 and b2.token[0] == 9
    # b1's token is stale for b2.
    assert b2.completed(1, b1.token) is False
    assert p.committable() == 0


def test_token_of_another_epoch_is_stale() -> None:
    old = PartitionProgress(epoch=1)
    new = PartitionProgress(epoch=2)
    ob = old.add_batch([0, 1], 2)
    nb = new.add_batch([0, 1], 2)
    assert ob.token != nb.token
    assert nb.completed(0, ob.token) is False
    assert new.committable() == 0


def test_rewind_inside_an_assignment_is_refused() -> None:
    p = PartitionProgress(epoch=1)
    p.add_batch([10, 11], 12)
    with pytest.raises(ValueError, match="behind the read position"):
        p.add_batch([11, 12], 13)
    assert p.batches == 1


def test_rewind_after_the_queue_drained_is_refused() -> None:
    p = PartitionProgress(epoch=1)
    b = p.add_batch([10, 11], 12)
    b.completed(10, b.token)
    b.completed(11, b.token)
    assert p.committable() == 12
    with pytest.raises(ValueError, match="behind the read position"):
        p.add_batch([5], 6)
    assert p.committable() == 12


def test_empty_batch_behind_the_read_position_is_refused() -> None:
    """An empty batch whose next position is behind the newest batch's is a rewind too: taking
    it would move the watermark backwards (12 -> 5) inside one assignment."""
    p = PartitionProgress(epoch=1)
    b = p.add_batch([10, 11], 12)
    b.completed(10, b.token)
    b.completed(11, b.token)
    assert p.committable() == 12
    with pytest.raises(ValueError):
        p.add_batch([], 5)
    assert p.committable() == 12


def test_empty_batches_move_the_position_forward() -> None:
    p = PartitionProgress(epoch=1)
    p.add_batch([], 3)
    assert p.committable() == 3
    b = p.add_batch([3], 4)
    p.add_batch([], 8)
    assert p.committable() == 3
    b.completed(3, b.token)
    assert p.committable() == 8


def test_revoke_clears_everything_and_refuses_new_batches() -> None:
    p = PartitionProgress(epoch=1)
    b = p.add_batch([0, 1], 2)
    b.completed(0, b.token)
    p.revoke()
    assert p.revoked
    assert p.committable() is None
    assert b.revoked
    assert b.completed(1, b.token) is False
    assert p.pending == 0
    with pytest.raises(RuntimeError):
        p.add_batch([2], 3)


def test_pending_sums_over_batches() -> None:
    p = PartitionProgress(epoch=1)
    b1 = p.add_batch([0, 1, 2], 3)
    p.add_batch([3, 4], 5)
    assert p.pending == 5
    b1.completed(1, b1.token)
    assert p.pending == 4


def test_a_chunk_whose_ends_look_like_a_slice_marks_only_its_own_offsets() -> None:
    b = BatchProgress(range(5, 10), 10, "t")
    assert b.completed_many([5, 9, 6, 8], "t") == 4  # 7 is not among them
    assert (b.committable(), b.pending) == (7, 1)
    assert b.completed_many([5, 6, 7], "t") == 3
    assert b.committable() == 10


# -- finished flags: what the offset map carries to the next owner ----------------------------


def finish(p: PartitionProgress, batches: list[BatchProgress], *offsets: int) -> None:
    for off in offsets:
        (b,) = (b for b in batches if off in b.offsets)
        assert b.completed(off, b.token)


def test_a_gap_between_batches_keeps_its_place_in_the_flags() -> None:
    """2..4 were never delivered (the client's position jumped from 2 to 5): the flags of the
    batch after the gap start at 5, not where the gap starts. Dropping the gap's flags would
    shift 8 and 9's flags onto 5 and 6, and the next owner would skip the unfinished 6."""
    p = PartitionProgress(epoch=1)
    batches = [p.add_batch([0, 1], 2), p.add_batch([5, 6, 7], 8), p.add_batch([8, 9], 10)]
    finish(p, batches, 1, 5, 7, 9)
    assert skipped_by_next_owner(p) == {1, 2, 3, 4, 5, 7, 9}
    assert p.finished_flags() == (0, bytes([0, 1, 1, 1, 1, 1, 0, 1, 0, 1]))


def test_a_gap_before_a_batch_with_gaps_of_its_own() -> None:
    p = PartitionProgress(epoch=1)
    batches = [p.add_batch([0, 1], 2), p.add_batch([4, 6, 7], 9), p.add_batch([11, 12], 13)]
    finish(p, batches, 1, 6, 12)
    # 2, 3 (between batches), 5 (inside one), 8 (a trailing marker), 9, 10 (between batches)
    # were never delivered: finished for the map; 0, 4, 7, 11 are not finished.
    assert p.finished_flags() == (0, bytes([0, 1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1]))
    assert skipped_by_next_owner(p) == {1, 2, 3, 5, 6, 8, 9, 10, 12}


def test_trailing_markers_and_a_gap_count_as_finished_up_to_the_read_position() -> None:
    p = PartitionProgress(epoch=1)
    # 5, 6 and 11 are markers after the last record of a batch; 7, 8 a gap between batches.
    batches = [p.add_batch([3, 4], 7), p.add_batch([9, 10], 12)]
    finish(p, batches, 4, 9)
    assert p.finished_flags() == (3, bytes([0, 1, 1, 1, 1, 1, 1, 0, 1]))
    assert skipped_by_next_owner(p) == {4, 5, 6, 7, 8, 9, 11}


def test_flags_start_at_the_committable_offset_inside_a_batch() -> None:
    """The first batch is partly finished: its flags start at the committable offset, and the
    gap after it keeps its place."""
    p = PartitionProgress(epoch=1)
    batches = [p.add_batch([10, 11, 12, 13], 14), p.add_batch([16, 17], 18)]
    finish(p, batches, 10, 11, 13, 17)
    assert p.finished_flags() == (12, bytes([0, 1, 1, 1, 0, 1]))
    assert skipped_by_next_owner(p) == {13, 14, 15, 17}


def test_an_empty_batch_fills_the_gap_it_skipped() -> None:
    p = PartitionProgress(epoch=1)
    first = p.add_batch([0, 1], 2)
    assert p.advance_to(5)  # 2..4: transaction markers
    batches = [first, p.add_batch([5, 6], 7)]
    finish(p, batches, 1, 6)
    assert p.finished_flags() == (0, bytes([0, 1, 1, 1, 1, 0, 1]))
    assert skipped_by_next_owner(p) == {1, 2, 3, 4, 6}


def test_with_nothing_finished_only_the_gap_is_marked() -> None:
    p = PartitionProgress(epoch=1)
    p.add_batch([0, 1], 2)
    p.add_batch([5, 6], 7)
    assert p.finished_flags() == (0, bytes([0, 0, 1, 1, 1, 0, 0]))
    assert skipped_by_next_owner(p) == {2, 3, 4}
    p.revoke()
    assert p.finished_flags() is None
