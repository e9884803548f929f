"""`GroupConsumer.seek` and `start_at` on the embedded broker.

Under load, in every ordering mode: a member seeks partition 0 back while records of the old
position are running and queued. From the seek on, no commit of partition 0 passes an offset
whose record has not been handled by a call that started after the seek; every record from the
seek point is read again, and the group ends committed at the log end. `start_at` places a new
group at the first record at or after a time, and a committed offset wins over it.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka import Producer

from tests.integration.kafka_helpers import member, produce, wait_until
from weir import CommitEvent, Context, Handler, Partition, Record
from weir.records import Ordering
from weir.testing.pytest_plugin import TopicFactory, consume_all, wait_for_committed

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

N = 1000  # records per partition
SEEK_TO = 100


class Watch(Handler):
    """Records, per partition 0 offset, the calls that finished and when each started; the
    commit listener checks each commit of partition 0 sent after the seek against them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.served_at: float | None = None  # when the owner served the seek
        self.asked = False
        self.after: set[int] = set()  # offsets of partition 0 handled by a call begun after it
        self.before = 0  # calls of partition 0 that finished, begun before it
        self.done1 = 0  # records of partition 1 finished
        self.violations: list[str] = []
        self.commits_after: list[int] = []

    def handle(self, record: Record, ctx: Context) -> None:
        began = time.monotonic()
        time.sleep(0.001)
        with self.lock:
            if record.partition == 1:
                self.done1 += 1
            elif self.served_at is not None and began > self.served_at:
                self.after.add(record.offset)
            else:
                self.before += 1

    def on_commit(self, event: CommitEvent) -> None:
        if event.tp.partition != 0 or event.status != "sent":
            return
        with self.lock:
            if self.served_at is None:
                if self.asked and event.offset == SEEK_TO:
                    self.served_at = time.monotonic()  # the seek's own commit: on the owner
                return
            self.commits_after.append(event.offset)
            missing = [o for o in range(SEEK_TO, event.offset) if o not in self.after]
            if missing:
                self.violations.append(
                    f"committed {event.offset} before {len(missing)} records from the seek "
                    f"point ran again (first {missing[0]})"
                )


@pytest.mark.parametrize("ordering", ["key", "partition", "unordered"])
def test_a_seek_under_load_commits_nothing_past_what_ran_from_the_seek_point(
    kafka_bootstrap: str, make_topic: TopicFactory, ordering: Ordering
) -> None:
    topic = make_topic(2)
    group = f"seek-{ordering}-{uuid.uuid4().hex[:8]}"
    for p in (0, 1):
        produce(kafka_bootstrap, topic, ((b"k%d" % (i % 5), b"v") for i in range(N)), partition=p)
    watch = Watch()
    gc = member(
        watch,
        kafka_bootstrap,
        group,
        [topic],
        ordering=ordering,
        workers=4,
        commit_interval_s=0.05,
        auto_offset_reset="earliest",
    )
    gc.add_commit_listener(watch.on_commit)
    with gc:
        wait_until(lambda: watch.before >= 300, 30, "partition 0 well under way")
        with watch.lock:
            watch.asked = True
        assert gc.seek(Partition(topic, 0), SEEK_TO).result(10) == SEEK_TO
        wait_until(lambda: len(watch.after) == N - SEEK_TO, 30, "every record from the seek on")
        wait_until(lambda: watch.done1 >= N, 30, "partition 1 untouched by the seek")
        wait_for_committed(kafka_bootstrap, group, topic, [N, N], timeout=30)
    assert watch.served_at is not None, "the seek's commit of its position was seen"
    assert watch.violations == []
    assert watch.commits_after and watch.commits_after[-1] == N
    assert watch.after == set(range(SEEK_TO, N))


def test_start_at_places_a_new_group_and_a_committed_offset_wins(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    topic = make_topic(1)
    base = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=1)
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(10):
        stamp = base + timedelta(minutes=i)
        p.produce(topic, value=b"%d" % i, partition=0, timestamp=int(stamp.timestamp() * 1000))
    assert p.flush(30) == 0
    group = f"start-at-{uuid.uuid4().hex[:8]}"
    seen: list[int] = []

    def run(start_at: datetime, until: int) -> None:
        gc = member(
            lambda r: seen.append(r.offset),
            kafka_bootstrap,
            group,
            [topic],
            start_at=start_at,
            auto_offset_reset="latest",
        )
        with gc:
            wait_for_committed(kafka_bootstrap, group, topic, [until], timeout=30)

    run(base + timedelta(minutes=6, seconds=30), 10)
    assert seen == [7, 8, 9]
    seen.clear()
    produce(kafka_bootstrap, topic, [(None, b"10")], partition=0)
    run(base, 11)  # committed at 10: start_at does not move the group
    assert seen == [10]
    # Past every record: a new group starts at the log end.
    late = f"start-at-late-{uuid.uuid4().hex[:8]}"
    gc = member(
        lambda r: seen.append(r.offset),
        kafka_bootstrap,
        late,
        [topic],
        start_at=datetime.now(timezone.utc) + timedelta(days=1),
    )
    with gc:
        wait_for_committed(kafka_bootstrap, late, topic, [11], timeout=30)
    assert seen == [10]


class Enrich(Handler):
    def __init__(self, out: str) -> None:
        self.out = out

    def handle(self, record: Record, ctx: Context) -> None:
        ctx.produce(self.out, (record.value or b"") + b"!", record.key)


def test_an_exactly_once_seek_back_writes_the_outputs_it_reads_again_once_more(
    kafka_bootstrap: str, make_topic: TopicFactory
) -> None:
    """Exactly-once on the broker: 20 inputs, all written; a seek back to 5 commits the seek
    position beside the transactional commits, reads 5..19 again and writes their outputs once
    more (a seek back is a deliberate replay); nothing else is written twice."""
    src, out = make_topic(1), make_topic(1)
    produce(kafka_bootstrap, src, ((b"k", b"o%d" % i) for i in range(20)), partition=0)
    group = f"seek-eos-{uuid.uuid4().hex[:8]}"
    gc = member(
        Enrich(out),
        kafka_bootstrap,
        group,
        [src],
        ordering="partition",
        transactional_id=f"{group}-t",
        transaction_interval_s=0.2,
    )
    with gc:
        wait_for_committed(kafka_bootstrap, group, src, [20], timeout=30)
        assert gc.seek((src, 0), 5).result(15) == 5
        wait_until(lambda: len(consume_all(kafka_bootstrap, out)) == 35, 30, "5..19 again")
        wait_for_committed(kafka_bootstrap, group, src, [20], timeout=30)
    values = [m.value for m in consume_all(kafka_bootstrap, out)]  # read_committed
    assert values == [b"o%d!" % i for i in [*range(20), *range(5, 20)]]
