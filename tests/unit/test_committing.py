"""Committer: monotonic per-partition offsets, async result handling, cadence."""

from __future__ import annotations

import logging

import pytest

from weir._engine.committing import Committer
from weir.records import CommitEvent, Partition

P0 = Partition("t", 0)
P1 = Partition("t", 1)


@pytest.fixture
def events() -> list[CommitEvent]:
    return []


@pytest.fixture
def c(events: list[CommitEvent]) -> Committer:
    committer = Committer(interval_s=10.0, every=3, emit=events.append)
    committer.track(P0)
    committer.track(P1)
    return committer


def send(c: Committer, committable: dict[Partition, int | None]) -> dict[Partition, int]:
    out = c.to_send(committable)
    c.sent(out, 0.0)
    return out


def test_only_tracked_partitions_with_an_offset_are_sent(c: Committer) -> None:
    other = Partition("x", 9)
    assert c.to_send({P0: 5, P1: None, other: 7}) == {P0: 5}


def test_nothing_is_resent_at_or_below_the_sent_offset(c: Committer) -> None:
    assert send(c, {P0: 5}) == {P0: 5}
    assert c.to_send({P0: 5}) == {}
    assert c.to_send({P0: 4}) == {}
    assert c.to_send({P0: 6}) == {P0: 6}
    assert c.sent_offset(P0) == 5


def test_sent_never_lowers(c: Committer) -> None:
    c.sent({P0: 10}, 0.0)
    c.sent({P0: 3}, 0.0)
    assert c.sent_offset(P0) == 10


def test_success_is_confirmed_and_max_wins(c: Committer) -> None:
    send(c, {P0: 5})
    send(c, {P0: 9})
    c.result(P0, 9, None, sync=False)
    c.result(P0, 5, None, sync=False)  # older success arriving late
    assert c.confirmed(P0) == 9


def test_failure_of_the_newest_reopens_the_partition(c: Committer) -> None:
    send(c, {P0: 5})
    c.result(P0, 5, None, sync=False)
    send(c, {P0: 9})
    c.result(P0, 9, "timed out", sync=False)
    assert c.sent_offset(P0) == 5
    assert c.to_send({P0: 9}) == {P0: 9}


def test_failure_with_nothing_confirmed_reopens_fully(c: Committer) -> None:
    send(c, {P0: 5})
    c.result(P0, 5, "timed out", sync=True)
    assert c.sent_offset(P0) is None
    assert c.to_send({P0: 5}) == {P0: 5}


def test_older_failure_after_newer_success_changes_nothing(c: Committer) -> None:
    send(c, {P0: 5})
    send(c, {P0: 9})
    c.result(P0, 9, None, sync=False)
    c.result(P0, 5, "stale failure", sync=False)
    assert c.confirmed(P0) == 9
    assert c.sent_offset(P0) == 9
    assert c.to_send({P0: 9}) == {}


def test_older_failure_while_newer_is_pending_changes_nothing(c: Committer) -> None:
    send(c, {P0: 5})
    send(c, {P0: 9})
    c.result(P0, 5, "failed", sync=False)
    assert c.sent_offset(P0) == 9
    assert c.to_send({P0: 9}) == {}
    c.result(P0, 9, None, sync=False)
    assert c.confirmed(P0) == 9


def test_failure_of_a_resent_offset_reopens_it_again(c: Committer) -> None:
    send(c, {P0: 5})
    c.result(P0, 5, "e1", sync=False)
    assert send(c, {P0: 5}) == {P0: 5}
    c.result(P0, 5, "e2", sync=False)
    assert send(c, {P0: 5}) == {P0: 5}
    c.result(P0, 5, None, sync=False)
    assert c.confirmed(P0) == 5
    assert c.to_send({P0: 5}) == {}


def test_partitions_are_independent(c: Committer) -> None:
    send(c, {P0: 5, P1: 50})
    c.result(P1, 50, "failed", sync=False)
    assert c.to_send({P0: 5, P1: 50}) == {P1: 50}


def test_track_starts_clean_and_forget_drops_state(c: Committer) -> None:
    send(c, {P0: 5})
    c.result(P0, 5, None, sync=False)
    c.track(P0)  # re-assigned: broker state may have moved while someone else owned it
    assert c.confirmed(P0) is None
    assert c.to_send({P0: 3}) == {P0: 3}
    c.forget([P0])
    assert c.to_send({P0: 7}) == {}
    assert c.confirmed(P0) is None and c.sent_offset(P0) is None


def summary(events: list[CommitEvent]) -> list[tuple[Partition, int, bool, str, str | None]]:
    return [(e.tp, e.offset, e.sync, e.status, e.error) for e in events]


def test_results_for_forgotten_partitions_change_no_state_but_are_reported(
    c: Committer, events: list[CommitEvent]
) -> None:
    c.forget([P0])
    c.result(P0, 5, None, sync=False)
    assert c.confirmed(P0) is None
    assert summary(events) == [(P0, 5, False, "committed", None)]
    assert events[0].ok


def test_listeners_see_every_send_and_result(c: Committer, events: list[CommitEvent]) -> None:
    c.sent({P0: 5, P1: 7}, 0.0, sync=True)
    c.result(P0, 5, None, sync=True)
    c.result(P1, 7, "boom", sync=False)
    assert summary(events) == [
        (P0, 5, True, "sent", None),
        (P1, 7, True, "sent", None),
        (P0, 5, True, "committed", None),
        (P1, 7, False, "failed", "boom"),
    ]
    assert [e.ok for e in events] == [False, False, True, False]


def test_due_by_count_of_finished_records() -> None:
    c = Committer(interval_s=1000.0, every=3)
    c.sent({}, now=0.0)
    assert not c.due(1.0)
    c.finished()
    assert not c.due(1.0)
    c.finished(2)
    assert c.due(1.0)  # count reached before the interval


def test_due_by_interval_even_without_finished_records() -> None:
    """A failed commit, or a position moved past trailing markers, must be retried/committed
    while idle: the interval alone makes a commit due."""
    c = Committer(interval_s=0.5, every=1000)
    c.sent({}, now=100.0)
    assert not c.due(100.4)
    assert c.due(100.5)


def test_due_by_interval_with_finished_records() -> None:
    c = Committer(interval_s=0.5, every=1000)
    c.sent({}, now=100.0)
    c.finished()
    assert not c.due(100.4)
    assert c.due(100.5)


def test_sent_resets_the_cadence() -> None:
    c = Committer(interval_s=0.5, every=2)
    c.finished(5)
    assert c.due(0.0)
    c.sent({}, now=10.0)
    assert not c.due(10.1)


def test_the_oldest_unconfirmed_commit_is_the_first_no_confirmation_covers(c: Committer) -> None:
    assert c.unconfirmed_since(P0) is None
    c.sent({P0: 5}, 1.0)
    c.sent({P0: 9}, 2.0)
    assert c.unconfirmed_since(P0) == 1.0
    c.result(P0, 5, None, sync=False)
    assert c.unconfirmed_since(P0) == 2.0
    # A failure leaves its commit unconfirmed, whatever is sent after it...
    c.result(P0, 9, "ILLEGAL_GENERATION", sync=False)
    c.sent({P0: 9}, 3.0)
    assert c.unconfirmed_since(P0) == 2.0
    # ...until an offset at least as high is confirmed.
    c.result(P0, 9, None, sync=False)
    assert c.unconfirmed_since(P0) is None
    assert c.unconfirmed_since(P1) is None


def test_many_unconfirmed_commits_keep_the_oldest_time(c: Committer) -> None:
    for i in range(100):
        c.sent({P0: i + 1}, float(i))
    assert c.unconfirmed_since(P0) == 0.0
    c.result(P0, 50, None, sync=False)
    since = c.unconfirmed_since(P0)
    assert since is not None and since <= 50.0  # never younger than the truth
    c.result(P0, 100, None, sync=False)
    assert c.unconfirmed_since(P0) is None


def test_a_result_from_before_a_restart_is_ignored_and_an_older_one_after_a_failure_counts() -> (
    None
):
    """After `restart` (a seek) a result above everything sent since answers a commit from
    before: it confirms nothing. A failure of the newest offset lowers what counts as sent,
    and the older offset's success that comes after it still counts: the guard goes by the
    highest offset sent, not by `sent` (which a failure lowers)."""
    tp = Partition("t", 0)
    c = Committer(60.0, 1_000_000)
    c.track(tp)
    c.sent({tp: 5}, 0.0)
    c.sent({tp: 6}, 0.0)
    c.result(tp, 6, "failed", sync=False)
    c.result(tp, 5, None, sync=False)
    assert c.confirmed(tp) == 5
    c.restart(tp)
    c.sent({tp: 3}, 1.0)
    c.result(tp, 6, None, sync=False)  # the answer to a commit from before the seek
    assert c.confirmed(tp) is None
    c.result(tp, 3, None, sync=False)
    assert c.confirmed(tp) == 3
    assert c.to_send({tp: 4}) == {tp: 4}


@pytest.mark.parametrize(
    ("code", "level"),
    [
        ("STALE_MEMBER_EPOCH", logging.INFO),
        ("REBALANCE_IN_PROGRESS", logging.INFO),
        ("NOT_COORDINATOR", logging.INFO),
        ("COORDINATOR_LOAD_IN_PROGRESS", logging.INFO),
        ("ILLEGAL_GENERATION", logging.WARNING),
        ("GROUP_AUTHORIZATION_FAILED", logging.WARNING),
        (None, logging.WARNING),
    ],
)
def test_a_failure_the_next_commit_repairs_is_logged_at_info_and_others_warn(
    c: Committer, caplog: pytest.LogCaptureFixture, code: str | None, level: int
) -> None:
    """Regression: a KIP-848 member whose assignment grew (a pattern matching a new topic) had
    its in-flight commits answered STALE_MEMBER_EPOCH, a `commit_failed` warning per partition
    on stderr of an application that configures no logging, though the next commit with the new
    epoch passes. Either way the offset is sent again."""
    caplog.set_level(logging.DEBUG, logger="weir")
    send(c, {P0: 5})
    c.result(P0, 5, "Broker: it failed", sync=False, code=code)
    [logged] = [r for r in caplog.records if r.getMessage().startswith("commit_")]
    assert logged.levelno == level
    assert logged.getMessage().startswith(
        "commit_retriable" if level < logging.WARNING else "commit_failed"
    )
    assert c.to_send({P0: 5}) == {P0: 5}
