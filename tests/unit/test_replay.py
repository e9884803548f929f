"""What a member's commits say about records finished ahead of a slow one, on the fake client:
the committed offset, and the offset map the next owner skips by (docs/offset-map.md).

A task holds several records of a partition and runs them one after another; when one of them
is slow, those it finished before are finished, and the commit and its map must say so (the
next owner handles them again otherwise). The broker-side counterparts, with members killed and
stopped as processes, are in tests/integration/test_replay_broker.py.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import pytest
from tests.consumer_overrides import Overrides
from tests.waiting import wait_until
from typing_extensions import Unpack

from weir import Context, FlowConfig, GroupConsumer, Handler, Record
from weir._engine import scheduling as scheduling_module
from weir._engine.replay import ReplayMaps
from weir._engine.tracking import PartitionProgress
from weir.config import ConsumerSettings
from weir.offsetmap import Encoded, FinishedMap, decode_finished, encode_finished
from weir.records import Partition
from weir.testing.fake import FakeConsumer
from weir.testing.fake_broker import FakeBroker

pytestmark = pytest.mark.timeout(60)

TOPIC = "t"
P0 = (TOPIC, 0)
WAIT = 5.0


class Holding(Handler):
    """Finishes every record at once, except `held`: that one runs until `release` is set or
    its context is cancelled (then it returns unfinished)."""

    def __init__(self, held: int) -> None:
        self.held = held
        self.release = threading.Event()
        self.running = threading.Event()
        self.lock = threading.Lock()
        self.finished: list[int] = []

    def handle(self, record: Record, ctx: Context) -> None:
        if record.offset == self.held:
            self.running.set()
            while not self.release.is_set() and not ctx.cancelled:
                time.sleep(0.002)
            if ctx.cancelled:
                return
        with self.lock:
            self.finished.append(record.offset)


def commits(fake: FakeConsumer) -> list[tuple[int, set[int]]]:
    """Every commit of partition 0: the offset, and the offsets its map lists finished."""
    out = []
    for call in fake.commit_log():
        if P0 in call.offsets:
            offset = call.offsets[P0]
            found = decode_finished(call.metadata.get(P0), offset)
            listed = set()
            if isinstance(found, FinishedMap):
                listed = {o for lo, hi in found.ranges() for o in range(lo, hi)}
            out.append((offset, listed))
    return out


@pytest.fixture
def one_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """Handlers guessed fast from the start: a polled batch goes to one worker as one task (the
    whole partition's lane), as it does once a fast handler has been measured."""
    monkeypatch.setattr(scheduling_module, "_FIRST_GUESS", 1e-6)


class Member(Protocol):
    def __call__(
        self,
        handler: Handler,
        fake: FakeConsumer | Callable[[dict[str, Any]], FakeConsumer],
        **overrides: Unpack[Overrides],
    ) -> GroupConsumer: ...


@pytest.fixture
def member(members: list[GroupConsumer]) -> Member:
    """Starts a member on a scripted fake, or with a FakeBroker's consumer factory (stopped
    after the test)."""

    def start(
        handler: Handler,
        fake: FakeConsumer | Callable[[dict[str, Any]], FakeConsumer],
        **overrides: Unpack[Overrides],
    ) -> GroupConsumer:
        settings: ConsumerSettings = {
            "bootstrap_servers": "fake:9092",
            "group_id": "g",
            "topics": [TOPIC],
            "workers": 4,
            "poll_timeout_s": 0.01,
            "shutdown_timeout_s": 0.5,
            "startup_timeout_s": 1.0,
            **overrides,
        }
        factory: Callable[[dict[str, Any]], FakeConsumer] = (
            fake.factory if isinstance(fake, FakeConsumer) else fake
        )
        if isinstance(fake, FakeConsumer):
            fake.given_committed()  # a group that ran before: no start commits in the log
        gc = GroupConsumer(handler, consumer_factory=factory, **settings)
        members.append(gc)
        gc.start()
        assert gc.wait_started(WAIT)
        return gc

    return start


@pytest.mark.usefixtures("one_task")
def test_records_finished_ahead_of_a_slow_task_mate_are_committed_while_it_runs(
    member: Member,
) -> None:
    """Offsets 0-9 go out as one task; 5 is slow. 0-4 finished before it and 6-9 move to other
    workers and finish: while 5 still runs, a commit says 5 with 6-9 in its map. (The count of
    a task's finished records was read only for long tasks: the commit stayed at 0, and a new
    owner would have handled 0-4 again.)"""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(10))
    fake.script_assign([P0])
    handler = Holding(held=5)
    member(handler, fake, ordering="unordered", commit_interval_s=0.02)
    wait_until(handler.running.is_set, "offset 5 to run")
    wait_until(lambda: (5, {6, 7, 8, 9}) in commits(fake), "a commit of 5 with 6-9 in its map")
    assert sorted(handler.finished) == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    handler.release.set()
    wait_until(lambda: commits(fake)[-1] == (10, set()), "the commit of 10")


@pytest.mark.usefixtures("one_task")
def test_a_shutdown_commits_what_finished_ahead_of_a_record_it_gives_up(
    member: Member,
) -> None:
    """Key mode, keys a (even offsets) and b (odd); offsets 0-9 go out as one task and 4 (a)
    never finishes. The shutdown gives 4 up past its budget; its one commit is 4 with the b
    records above it, 5, 7 and 9, in the map: 0-3 finished ahead of 4 in the same task, so the
    next owner handles only 4, 6 and 8. (It committed 0: 0-3 counted only when the task came
    back, which a cancelled task never does for the commit.)"""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(10), key=lambda off: b"ab"[off % 2 : off % 2 + 1])
    fake.script_assign([P0])
    handler = Holding(held=4)
    gc = member(handler, fake, ordering="key", commit_interval_s=3600.0)
    wait_until(handler.running.is_set, "offset 4 to run")
    wait_until(lambda: len(handler.finished) == 7, "0-3, 5, 7 and 9 to finish")
    assert commits(fake) == []  # no async commit is due: only the shutdown's
    gc.stop()
    gc.join(WAIT)
    assert commits(fake) == [(4, {5, 7, 9})]
    assert gc.stats().processed == 7


def test_a_cut_map_is_counted_and_logged_once_per_commit_that_carries_it(
    member: Member, caplog: pytest.LogCaptureFixture
) -> None:
    """Key mode, keys a and b at random, the first a held: the finished b above it make a map
    that 64 bytes cannot hold. Once every b is finished the cut map stops changing and is not
    sent again, however many commit turns pass: the truncation count and the log say how many
    commits carried a cut map (they grew at every turn, sent or not)."""
    caplog.set_level(logging.INFO, logger="weir.replay")
    rnd = random.Random(3)
    keys = [b"a"] + [rnd.choice((b"a", b"b")) for _ in range(399)]
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(400), key=lambda off: keys[off])
    fake.script_assign([P0])
    handler = Holding(held=0)
    gc = member(handler, fake, ordering="key", commit_interval_s=0.01, offset_map_max_bytes=64)
    wait_until(lambda: len(handler.finished) == keys.count(b"b"), "every b to finish")
    cut = encode_finished(0, bytes(k == b"b" for k in keys), 64)
    assert cut.truncated
    listed = set(_listed(cut))
    wait_until(lambda: (0, listed) in commits(fake), "the final cut map committed")
    seen = time.monotonic()
    wait_until(lambda: gc.stats().at > seen, "stats published after that commit")
    before = gc.stats().offset_map_truncations
    time.sleep(0.3)  # 30 more commit turns
    stats = gc.stats()
    assert stats.offset_map_truncations == before >= 1
    sent = [c.metadata.get(P0) for c in fake.commit_log() if P0 in c.offsets]
    assert sent.count(cut.text) == 1  # an unchanged map is not sent again
    assert before <= sum(1 for m in sent if m)  # at most one per commit with a map
    logged = [r.msg for r in caplog.records if isinstance(r.msg, dict)]
    assert sum(1 for e in logged if e["event"] == "offset_map_truncated") == before
    assert stats.partitions[0].offset_map_bytes == len(cut.text) + 1 <= 64


def _listed(encoded: Encoded) -> Iterator[int]:
    found = decode_finished(encoded.text, encoded.base)
    assert isinstance(found, FinishedMap)
    for lo, hi in found.ranges():
        yield from range(lo, hi)


def test_a_request_refused_for_its_maps_lowers_the_limit_once(
    member: Member, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker whose offset.metadata.max.bytes is 300, eight partitions each with a map of
    about 350 bytes (a held first record, random keys above it). The first commit request is
    refused, and the client reports it for all eight partitions: the limit comes down once, to
    half the largest refused map, and every partition's map is committed from then on. (It was
    halved once per partition: eight halvings from 4096 turned maps off for good.)"""
    caplog.set_level(logging.INFO, logger="weir.replay")
    broker = FakeBroker(offset_metadata_max_bytes=300)
    broker.create_topic(TOPIC, 8)
    rnd = random.Random(5)
    for p in range(8):
        for i in range(2000):
            key = b"a" if i == 0 else rnd.choice((b"a", b"b"))
            broker.produce(TOPIC, key, b"v", partition=p)
    handler = Holding(held=0)
    gc = member(
        handler,
        broker.consumer_factory,
        ordering="key",
        workers=12,
        commit_interval_s=1.0,  # the first request carries every partition's map
        flow=FlowConfig(capacity_records=20_000, pause_records=18_000, resume_records=16_000),
    )

    def every_map_committed() -> bool:
        metadata = broker.committed_metadata("g", TOPIC)
        return len(metadata) == 8 and all(
            isinstance(decode_finished(m, 0), FinishedMap) for m in metadata.values()
        )

    wait_until(every_map_committed, "a map committed for every partition")
    seen = time.monotonic()
    # The snapshot is published on the loop's own schedule: one taken before the map that
    # went out after the refusal still shows the refused sizes.
    wait_until(lambda: gc.stats().at > seen, "stats published after the maps were committed")
    refused = [
        r.msg for r in caplog.records if isinstance(r.msg, dict)
        if r.msg["event"] == "offset_map_too_large"
    ]  # fmt: skip
    assert len(refused) == 1, refused
    assert refused[0]["enabled"] and refused[0]["max_bytes"] == refused[0]["refused_bytes"] // 2
    assert len(refused[0]["partitions"]) == 8
    limit = refused[0]["max_bytes"]
    assert all(0 < p.offset_map_bytes <= limit for p in gc.stats().partitions)


def _finished_in(metadata: str, offset: int) -> set[int]:
    found = decode_finished(metadata, offset)
    assert isinstance(found, FinishedMap), found
    return {o for lo, hi in found.ranges() for o in range(lo, hi)}


@pytest.mark.parametrize("read", [[], [0], [0, 1]])
def test_a_restored_map_is_sent_on_until_its_offsets_are_read(read: list[int]) -> None:
    """Regression (found by the transactional engine machine): a new owner restored a map with
    1 and 2 finished above committed 0, read only offset 0 (it failed and was retried), and
    committed 0 with an empty map: the restored one was overwritten, and the owner after it ran
    1 and 2 again (with transactions: their outputs written twice). The map sent with an offset
    lists the offsets read and finished in this assignment and, above the read position, those
    the restored map lists."""
    tp = Partition(TOPIC, 0)
    replay = ReplayMaps(enabled=True, max_bytes=4096)
    restored = encode_finished(0, b"\x00\x01\x01\x00\x01", 4096).text  # 1, 2 and 4 finished
    replay.restore({tp: (0, restored)})
    progress = PartitionProgress(epoch=1)
    if read:
        batch = progress.add_batch(read, read[-1] + 1)
        progress.mark_finished(
            batch, replay.finished_before(tp, [Record(TOPIC, 0, o, None, None) for o in read])
        )
    sent = replay.metadata(tp, progress, 0)
    assert _finished_in(sent, 0) == {1, 2, 4}
