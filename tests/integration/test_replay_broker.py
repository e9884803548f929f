"""No replay of finished work, on the embedded broker: a member commits the offsets finished
above its committed one (the offset map), and the next owner does not hand them to a handler
again.

Members run as processes (`tests.audit.member`) and audit every handler start and finish, so
each test names the records handled twice, by offset, and compares them with what the committed
map (read back from the broker) says. Without the map (``offset_map=False``, the behaviour
before it) each of the three hand-offs below re-handles thousands of finished records.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from tests.audit import check
from tests.audit.cluster import Members
from tests.integration.kafka_helpers import Seen, committed, member, produce, wait_until
from tests.logged import events
from weir import GroupConsumer
from weir.lag import group_lag
from weir.offsetmap import FinishedMap, decode_finished, encode_finished
from weir.testing.pytest_plugin import TopicFactory

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

Events = list[dict[str, Any]]


def _group(name: str) -> str:
    return f"replay-{name}-{uuid.uuid4().hex[:8]}"


def _committed_with_metadata(bootstrap: str, group: str, topic: str) -> tuple[int, str | None]:
    """Partition 0's committed offset and metadata, read without joining the group."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        [tp] = c.committed([TopicPartition(topic, 0)], timeout=15)
        return tp.offset, tp.metadata
    finally:
        c.close()


def _finished_in(offset: int, metadata: str | None) -> set[int]:
    """The offsets a committed map lists finished (none without a map)."""
    found = decode_finished(metadata, offset)
    if not isinstance(found, FinishedMap):
        return set()
    return {o for lo, hi in found.ranges() for o in range(lo, hi)}


def _committed_by(evs: Events, member: str) -> list[int]:
    return _offsets(evs, member, "commit_committed")


def _offsets(evs: Events, member: str, ev: str) -> list[int]:
    """Offsets of partition 0 for which `member` logged `ev`, in the order it logged them
    (records, or commits)."""
    return [e["o"] for e in evs if e["m"] == member and e["ev"] == ev and e["p"] == 0]


def _last_stats(evs: Events, member: str) -> dict[str, Any]:
    return [e for e in evs if e["m"] == member and e["ev"] == "stats"][-1]


def _finish(members: Members, name: str, bootstrap: str, group: str, topic: str, end: int) -> None:
    """Wait until the group committed `end` (everything handled), then stop `name` gracefully."""
    members.wait_for(
        lambda e: committed(bootstrap, group, topic, 1) == [end], 60, f"{name} to commit {end}"
    )
    assert members.stop(name) == 0


@pytest.mark.parametrize(
    "protocol", ["cooperative", pytest.param("consumer", marks=pytest.mark.slow)]
)
def test_after_sigkill_the_next_owner_rehandles_only_the_held_record_and_what_finished_since(
    kafka_bootstrap: str,
    make_topic: TopicFactory,
    kafka_admin: AdminClient,
    tmp_path: Path,
    protocol: str,
) -> None:
    """Offset 0 is held in a slow handler while 1 to 10 000 finish; the member commits 0 (one
    commit, due at the 10 000th finished record, with the map of 1 to 10 000), then finishes
    500 more and is SIGKILLed before its next commit. The next owner handles exactly offset 0
    and those 500; without the map it handled all 10 501."""
    topic = make_topic(1)
    group = _group("kill")
    produce(kafka_bootstrap, topic, ((None, b"v%d" % i) for i in range(10_001)), partition=0)
    members = Members(tmp_path, kafka_bootstrap, group, topic, protocol)
    # Commits at 10 000 records finished.
    quiet = ("--commit-interval", "3600", "--commit-every-records", "10000")
    try:
        members.start("m1", "--ordering", "unordered", "--slow-ms", "0", "--hold", "0:0", *quiet)
        members.wait_for(
            lambda e: len(_offsets(e, "m1", "done")) == 10_000 and _committed_by(e, "m1"),
            60,
            "m1 to finish 1..10000 and commit",
        )
        offset, metadata = _committed_with_metadata(kafka_bootstrap, group, topic)
        # Tools that know nothing of the map (the admin API, hence kafka-consumer-groups, and
        # weir lag) list the committed offset as it is, and the lag from it.
        request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])]
        listed = kafka_admin.list_consumer_group_offsets(request)[group].result(timeout=15)
        assert [tp.offset for tp in listed.topic_partitions] == [offset] == [0]
        [lag] = group_lag(kafka_admin, group).partitions
        assert (lag.committed, lag.lag) == (0, 10_001)

        # 500 more finish after that commit; none is committed before the kill.
        produce(kafka_bootstrap, topic, ((None, b"w%d" % i) for i in range(500)), partition=0)
        members.wait_for(
            lambda e: len(_offsets(e, "m1", "done")) == 10_500, 60, "m1 to finish 500 more"
        )
        members.kill("m1")
        assert _committed_with_metadata(kafka_bootstrap, group, topic) == (offset, metadata)

        members.start("m2", "--ordering", "unordered", "--slow-ms", "0")
        _finish(members, "m2", kafka_bootstrap, group, topic, 10_501)
    finally:
        members.close()

    evs = members.events()
    done_by_m1 = set(_offsets(evs, "m1", "done"))
    # The new group's start (0, committed before the first record: weir.starts), then 0 again.
    assert _committed_by(evs, "m1") == [0, 0]
    handled_by_m2 = _offsets(evs, "m2", "start")
    twice = done_by_m1 & set(handled_by_m2)
    assert twice == set(range(10_001, 10_501)), f"{len(twice)} records handled twice"
    assert sorted(handled_by_m2) == [0, *range(10_001, 10_501)]
    assert _finished_in(offset, metadata) == set(range(1, 10_001))
    assert _last_stats(evs, "m2")["skipped"] == 10_000
    report = check(evs, [10_501])
    assert not report.violations, report.violations[:10]


def test_a_graceful_stop_in_key_mode_leaves_nothing_finished_to_rehandle(
    kafka_bootstrap: str, make_topic: TopicFactory, tmp_path: Path
) -> None:
    """Key mode, twenty keys; offset 100 (key k0) is held, so the 245 records of k0 after it
    queue behind it while the other keys finish (fewer than the flow's resume mark, 400: the
    partition keeps fetching). SIGTERM: the shutdown cancels the held record and commits 100
    with a map of everything finished above it (the only commit: none is due before). The
    restarted member handles exactly what the first one never finished; without the map it
    handled the 4 655 finished records above 100 again."""
    topic = make_topic(1)
    group = _group("term")
    n = 5_000
    produce(kafka_bootstrap, topic, ((b"k%d" % (i % 20), b"v") for i in range(n)), partition=0)
    queued = set(range(100, n, 20))  # k0 from the held record on
    members = Members(tmp_path, kafka_bootstrap, group, topic, "eager")
    try:
        members.start(
            "m1", "--ordering", "key", "--slow-ms", "0", "--hold", "0:100",
            "--shutdown-timeout", "1", "--commit-interval", "3600",
            "--commit-every-records", "100000",
        )  # fmt: skip
        members.wait_for(
            lambda e: len(_offsets(e, "m1", "done")) == n - len(queued), 60, "m1 to finish"
        )
        assert members.stop("m1") == 0
        offset, metadata = _committed_with_metadata(kafka_bootstrap, group, topic)
        members.start("m2", "--ordering", "key", "--slow-ms", "0")
        _finish(members, "m2", kafka_bootstrap, group, topic, n)
    finally:
        members.close()

    evs = members.events()
    done_by_m1 = set(_offsets(evs, "m1", "done"))
    assert done_by_m1 == set(range(n)) - queued
    handled_by_m2 = _offsets(evs, "m2", "start")
    twice = done_by_m1 & set(handled_by_m2)
    assert twice == set(), f"{len(twice)} finished records handled again"
    assert handled_by_m2 == sorted(queued)  # k0 in order, and nothing else
    assert _offsets(evs, "m1", "abandoned") == [100]
    # The new group's start (weir._engine.starts), then the shutdown's commit, the only other one.
    assert _committed_by(evs, "m1") == [0, 100]
    # The shutdown's map lists exactly what m1 finished above the committed offset.
    assert _finished_in(offset, metadata) == {o for o in done_by_m1 if o > 100}
    assert _last_stats(evs, "m2")["skipped"] == len({o for o in done_by_m1 if o > 100})
    report = check(evs, [n])
    assert report.duplicates == 1, report.summary()  # offset 100: started, abandoned, redone
    assert not report.violations, report.violations[:10]


@pytest.mark.slow  # 13-16 s: make integration
def test_a_map_that_cannot_fit_is_cut_and_commits_keep_flowing(
    kafka_bootstrap: str, make_topic: TopicFactory, tmp_path: Path
) -> None:
    """40 000 records of keys a and b at random; the first a is held, so every a queues behind
    it and every b finishes: the finished offsets above the commit are a random half of 40 000,
    a 5 KB bitset that no encoding brings under 4096 bytes. The member's commits carry the
    longest prefix that fits and are accepted; after a SIGKILL the next owner skips exactly the
    finished records below the cut, handles every a, and replays the finished b above the cut.
    """
    topic = make_topic(1)
    group = _group("cut")
    n = 40_000
    rnd = random.Random(17)
    keys = [rnd.choice((b"a", b"b")) for _ in range(n)]
    produce(kafka_bootstrap, topic, ((k, b"v") for k in keys), partition=0)
    a0 = keys.index(b"a")
    finished = bytes(1 if k == b"b" else 0 for k in keys[a0:])
    expected = encode_finished(a0, finished)
    assert expected.truncated and expected.covered < len(finished)
    members = Members(tmp_path, kafka_bootstrap, group, topic, "consumer")
    big = ("--capacity-records", "50000")  # every a stays in flight behind the held one
    try:
        members.start("m1", "--ordering", "key", "--slow-ms", "0", "--hold", f"0:{a0}", *big)
        members.wait_for(
            lambda e: len(_offsets(e, "m1", "done")) == keys.count(b"b"), 60, "every b finished"
        )
        # The b are finished in offset order (one key): the cut prefix was complete before the
        # last of them, and a commit is due every 0.25 s.
        time.sleep(1.0)
        members.kill("m1")
        offset, metadata = _committed_with_metadata(kafka_bootstrap, group, topic)
        members.start("m2", "--ordering", "key", "--slow-ms", "0", *big)
        _finish(members, "m2", kafka_bootstrap, group, topic, n)
    finally:
        members.close()

    evs = members.events()
    cut = a0 + expected.covered
    handled_by_m2 = set(_offsets(evs, "m2", "start"))
    a_records = {o for o, k in enumerate(keys) if k == b"a"}
    b_records = set(range(n)) - a_records
    twice_below_cut = {o for o in b_records if o < cut} & handled_by_m2
    assert twice_below_cut == set(), f"{len(twice_below_cut)} handled again below the cut"
    assert a_records <= handled_by_m2  # nothing unfinished skipped
    assert handled_by_m2 == a_records | {o for o in b_records if o >= cut}  # the rest replayed
    assert (offset, metadata) == (a0, expected.text)
    m1_commits = [e for e in evs if e["m"] == "m1" and e["ev"].startswith("commit_")]
    assert m1_commits and all(e["ev"] != "commit_failed" for e in m1_commits)
    stats = _last_stats(evs, "m1")
    assert stats["truncations"] >= 1
    assert 4000 < stats["map_bytes"]["0"] <= 4096
    assert _last_stats(evs, "m2")["skipped"] == sum(finished[: expected.covered])
    report = check(evs, [n])
    assert not report.violations, report.violations[:10]


@pytest.mark.slow  # 20 s or more: make integration
def test_a_hand_off_commit_whose_map_the_broker_refuses_goes_again_with_a_smaller_map(
    kafka_bootstrap: str, make_topic: TopicFactory, tmp_path: Path
) -> None:
    """offset_map_max_bytes above the broker's offset.metadata.max.bytes (65 536 against its
    4096), and a map of 30 000 offsets at random (about 5 KB) when SIGTERM comes, with no commit
    before. The shutdown's commit is refused for its map's size (OFFSET_METADATA_TOO_LARGE);
    it goes again at once with a map of at most half that, which the broker takes, so the
    hand-off keeps its offset and map and the restart handles only what was not finished below
    the cut. (The refused commit was the last: nothing was committed, and the restart handled
    all 30 000 records again.)"""
    topic = make_topic(1)
    group = _group("refused")
    n = 30_000
    rnd = random.Random(23)
    keys = [rnd.choice((b"a", b"b")) for _ in range(n)]
    produce(kafka_bootstrap, topic, ((k, b"v") for k in keys), partition=0)
    a0 = keys.index(b"a")
    members = Members(tmp_path, kafka_bootstrap, group, topic, "cooperative")
    big = ("--capacity-records", "40000")
    try:
        members.start(
            "m1", "--ordering", "key", "--slow-ms", "0", "--hold", f"0:{a0}", *big,
            "--offset-map-max-bytes", "65536", "--shutdown-timeout", "1",
            "--commit-interval", "3600", "--commit-every-records", "1000000",
        )  # fmt: skip
        members.wait_for(
            lambda e: len(_offsets(e, "m1", "done")) == keys.count(b"b"), 60, "every b finished"
        )
        assert members.stop("m1") == 0
        offset, metadata = _committed_with_metadata(kafka_bootstrap, group, topic)
        members.start("m2", "--ordering", "key", "--slow-ms", "0", *big)
        _finish(members, "m2", kafka_bootstrap, group, topic, n)
    finally:
        members.close()

    evs = members.events()
    a_records = {o for o, k in enumerate(keys) if k == b"a"}
    handled_by_m2 = set(_offsets(evs, "m2", "start"))
    listed = _finished_in(offset, metadata)
    assert offset == a0, f"committed {offset}: m2 handled {len(handled_by_m2)} records again"
    assert listed and max(listed) < n - 1  # a cut map
    assert handled_by_m2 == set(range(a0, n)) - listed
    assert a_records <= handled_by_m2
    m1 = [e for e in evs if e["m"] == "m1" and e["ev"].startswith("commit_")]
    failed = [e for e in m1 if e["ev"] == "commit_failed"]
    assert failed and all("OFFSET_METADATA_TOO_LARGE" in e["err"] for e in failed)
    assert m1[-1]["ev"] == "commit_committed" and m1[-1]["o"] == a0
    assert metadata is not None and len(metadata) + 1 <= 4096
    report = check(evs, [n])
    assert not report.violations, report.violations[:10]


# -- interoperability -----------------------------------------------------------------------


def _plain_commit(bootstrap: str, group: str, offsets: list[TopicPartition]) -> None:
    """Commit as any other client would: a plain consumer, no subscription, sync."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        deadline = time.monotonic() + 30
        while True:  # a fresh group's coordinator may still be loading
            try:
                results = c.commit(offsets=offsets, asynchronous=False) or []
            except KafkaException as exc:
                if not exc.args[0].retriable() or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
                continue
            assert all(r.error is None for r in results), results
            return
    finally:
        c.close()


def _consume_all(
    bootstrap: str, group: str, topic: str, partitions: int, end: int
) -> tuple[Seen, GroupConsumer]:
    """A weir member until the group committed `end` on every partition; stopped after."""
    seen = Seen()
    gc = member(seen.add, bootstrap, group, [topic], ordering="unordered")
    gc.start()
    try:
        assert gc.wait_started(30)
        wait_until(
            lambda: committed(bootstrap, group, topic, partitions) == [end] * partitions,
            60,
            f"the group to commit {end}",
        )
    finally:
        gc.stop()
        gc.join(30)
    return seen, gc


def test_a_group_committed_by_a_plain_consumer_is_taken_over_at_its_offset(
    kafka_bootstrap: str, make_topic: TopicFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A group a plain confluent_kafka consumer committed (no metadata): weir starts at the
    committed offset, warns of nothing, skips nothing, and leaves no metadata behind once
    everything is finished (nothing above the commit to list)."""
    caplog.set_level(logging.INFO, logger="weir")
    topic = make_topic(1)
    group = _group("plain")
    produce(kafka_bootstrap, topic, ((None, b"v") for _ in range(1000)), partition=0)
    _plain_commit(kafka_bootstrap, group, [TopicPartition(topic, 0, 300)])
    seen, gc = _consume_all(kafka_bootstrap, group, topic, 1, 1000)
    assert sorted(o for _, o, _, _ in seen.calls) == list(range(300, 1000))
    assert gc.stats().replay_skipped == 0
    assert not events(caplog, "offset_map_ignored") and not events(caplog, "offset_map_restored")
    assert _committed_with_metadata(kafka_bootstrap, group, topic) == (1000, None)


def test_metadata_that_is_no_map_for_the_committed_offset_is_ignored_with_a_warning(
    kafka_bootstrap: str, make_topic: TopicFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Four partitions committed at 100 by another client, each with metadata that must not be
    read as a map: another library's, a weir map for offset 90 (someone committed since), a
    later version, and a map with one character changed. Each map would list 100-149 finished.
    weir warns once per partition and handles every record from 100, skipping none."""
    caplog.set_level(logging.INFO, logger="weir")
    topic = make_topic(4)
    group = _group("foreign")
    for p in range(4):
        produce(kafka_bootstrap, topic, ((None, b"v") for _ in range(200)), partition=p)
    good = encode_finished(100, b"\x00" + b"\x01" * 49).text  # 101-149 finished
    corrupt = good[:-3] + ("A" if good[-3] != "A" else "B") + good[-2:]
    metadata = [
        '{"client": "another", "state": [100, 149]}',
        encode_finished(90, b"\x00" * 10 + b"\x01" * 50).text,  # 100-149, from 90
        "weir9:" + good.partition(":")[2],
        corrupt,
    ]
    assert isinstance(decode_finished(good, 100), FinishedMap)  # unaltered, it is read
    _plain_commit(
        kafka_bootstrap,
        group,
        [TopicPartition(topic, p, 100, metadata=m) for p, m in enumerate(metadata)],
    )
    seen, gc = _consume_all(kafka_bootstrap, group, topic, 4, 200)
    for p in range(4):
        assert sorted(o for q, o, _, _ in seen.calls if q == p) == list(range(100, 200))
    assert gc.stats().replay_skipped == 0
    ignored = events(caplog, "offset_map_ignored")
    assert sorted(e["tp"] for e in ignored) == [f"{topic}[{p}]" for p in range(4)]
    reasons = {e["tp"]: e["reason"] for e in ignored}
    assert "not a weir offset map" in reasons[f"{topic}[0]"]
    assert "is for offset 90" in reasons[f"{topic}[1]"]
    assert "version 9" in reasons[f"{topic}[2]"]
    assert "CRC" in reasons[f"{topic}[3]"] or "base64" in reasons[f"{topic}[3]"]
    assert all(e["offset"] == 100 for e in ignored)
    assert not events(caplog, "offset_map_restored")
