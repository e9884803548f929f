"""`stale_commits`, the network-fault tests' check that a member cut off from the brokers never
gets a commit accepted for a partition the group gave to another member meanwhile."""

from __future__ import annotations

from typing import Any

from tests.audit import stale_commits


def ev(t: float, m: str, kind: str, **fields: Any) -> dict[str, Any]:
    return {"t": t, "m": m, "ev": kind, **fields}


HAND_OFF = [
    ev(1.0, "b", "assigned", ps=[2, 3]),
    ev(2.0, "b", "commit_sent", p=2, o=10),
    ev(2.1, "b", "commit_committed", p=2, o=10),
    # cut at 3.0; a gets b's partitions at 9.0; b learns at 15.0 and gets 3 back at 16.0
    ev(9.0, "a", "assigned", ps=[2, 3]),
    ev(10.0, "b", "commit_sent", p=2, o=40),
    ev(10.5, "b", "commit_failed", p=2, o=40),
    ev(15.0, "b", "lost", ps=[2, 3]),
    ev(16.0, "b", "assigned", ps=[3]),
    ev(17.0, "b", "commit_sent", p=3, o=50),
    ev(17.1, "b", "commit_committed", p=3, o=50),
]


def test_refused_commits_in_the_gap_are_counted_and_none_is_stale() -> None:
    assert stale_commits(HAND_OFF, "b", since=3.0) == ([], 1)


def test_a_commit_accepted_while_another_member_owned_the_partition_is_reported() -> None:
    planted = [*HAND_OFF, ev(11.0, "b", "commit_sent", p=2, o=41)]
    planted += [ev(11.2, "b", "commit_committed", p=2, o=41)]
    planted.sort(key=lambda e: e["t"])
    bad, attempts = stale_commits(planted, "b", since=3.0)
    assert bad == ["b committed p2@41 while another member owned it"]
    assert attempts == 2


def test_a_commit_sent_before_the_hand_off_and_confirmed_after_it_is_not_stale() -> None:
    late = [*HAND_OFF, ev(8.9, "b", "commit_sent", p=3, o=30)]
    late += [ev(9.5, "b", "commit_committed", p=3, o=30)]
    late.sort(key=lambda e: e["t"])
    assert stale_commits(late, "b", since=3.0) == ([], 1)
