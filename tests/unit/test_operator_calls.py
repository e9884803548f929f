"""The operator's calls on a running member (`retry_now`, `skip`): a bad argument raises in the
caller's thread, and nothing a caller passes reaches the owner thread as an error. Before, the
owner unpacked the argument itself: `retry_now("orders")` raised TypeError there, the member
died and the returned future never resolved."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from tests import waiting

from weir import (
    Context,
    FailurePolicy,
    GroupConsumer,
    Handler,
    Partition,
    Record,
    RetryPolicy,
    State,
)
from weir.testing.fake import FakeConsumer

pytestmark = pytest.mark.timeout(60)

TOPIC = "t"
P0, P1 = (TOPIC, 0), (TOPIC, 1)
WAIT = 10.0


class FailsOne(Handler):
    """Fails record 1 of partition 0, every time, counting its attempts."""

    def __init__(self) -> None:
        self.attempts = 0

    def handle(self, record: Record, ctx: Context) -> None:
        if (record.partition, record.offset) == (0, 1):
            self.attempts += 1
            raise RuntimeError("poison")


def committed(fake: FakeConsumer, tp: tuple[str, int]) -> int:
    return max((off for off, _ in fake.commits_for(tp)), default=-1)


@pytest.fixture
def blocked(members: list[GroupConsumer]) -> tuple[GroupConsumer, FakeConsumer]:
    """A running member whose partition 0 is blocked on record 1; partition 1 flows."""
    fake = FakeConsumer()
    fake.produce_many(TOPIC, 0, range(3))
    fake.produce_many(TOPIC, 1, range(3))
    fake.script_assign([P0, P1])
    gc = GroupConsumer(
        FailsOne(),
        consumer_factory=fake.factory,
        bootstrap_servers="fake:9092",
        group_id="g",
        topics=[TOPIC],
        ordering="partition",
        poll_timeout_s=0.01,
        commit_interval_s=0.01,
        commit_every_records=1,
        failure=FailurePolicy(retry=RetryPolicy(max_attempts=1), final="block"),
    )
    members.append(gc)
    gc.start()
    assert gc.wait_started(WAIT)
    waiting.wait_until(lambda: gc.stats().blocked == (Partition(*P0),), "partition 0 blocked")
    return gc, fake


def assert_running_and_committing(gc: GroupConsumer, fake: FakeConsumer) -> None:
    assert gc.state is State.RUNNING and gc.failure is None
    fake.produce_many(TOPIC, 1, range(3, 6))
    waiting.wait_until(lambda: committed(fake, P1) == 6, "partition 1 still committed")
    # The same calls with good arguments are served.
    handler = gc._handler
    assert isinstance(handler, FailsOne)
    before = handler.attempts
    assert gc.retry_now(P0).result(WAIT) is True
    # A skip while the record runs again finds nothing to skip: wait for its failure.
    waiting.wait_until(lambda: handler.attempts > before, "record 1 tried again")
    waiting.wait_until(
        lambda: gc.skip(Partition(*P0), 1).result(WAIT), "record 1 skipped once blocked again"
    )
    waiting.wait_until(lambda: committed(fake, P0) == 3, "committed past the skipped record")


BAD_RETRY: list[tuple[Any, type[Exception], str]] = [
    ("orders", TypeError, "partition must be a weir.Partition or a (topic, partition) tuple"),
    (("orders",), TypeError, "got ('orders',) (tuple)"),
    (("t", 0, 1), TypeError, "(topic, partition) tuple"),
    ((0, "t"), TypeError, "(topic, partition) tuple"),
    (("t", "0"), TypeError, "the partition number must be an int, got '0' (str)"),
    (("t", True), TypeError, "the partition number must be an int, got True (bool)"),
    (("t", 0.0), TypeError, "must be an int"),
    (("t", -1), ValueError, "the partition number must not be negative"),
    (None, TypeError, "got None (NoneType)"),
    (b"t", TypeError, "(topic, partition) tuple"),
]


@pytest.mark.parametrize(("partition", "error", "said"), BAD_RETRY)
def test_a_bad_retry_now_argument_raises_in_the_caller_and_the_member_runs_on(
    blocked: tuple[GroupConsumer, FakeConsumer],
    partition: Any,
    error: type[Exception],
    said: str,
) -> None:
    gc, fake = blocked
    with pytest.raises(error) as info:
        gc.retry_now(partition)
    assert said in str(info.value)
    assert_running_and_committing(gc, fake)


@pytest.mark.parametrize(
    ("partition", "offset", "error", "said"),
    [
        ("orders", 5, TypeError, "partition must be a weir.Partition"),
        (("orders",), 5, TypeError, "(topic, partition) tuple"),
        (P0, "1", TypeError, "offset must be an int, got '1' (str)"),
        (P0, True, TypeError, "offset must be an int, got True (bool)"),
        (P0, 1.0, TypeError, "offset must be an int"),
        (P0, None, TypeError, "offset must be an int"),
        (P0, -1, ValueError, "offset must not be negative, got -1"),
    ],
)
def test_a_bad_skip_argument_raises_in_the_caller_and_the_member_runs_on(
    blocked: tuple[GroupConsumer, FakeConsumer],
    partition: Any,
    offset: Any,
    error: type[Exception],
    said: str,
) -> None:
    gc, fake = blocked
    with pytest.raises(error) as info:
        gc.skip(partition, offset)
    assert said in str(info.value)
    assert_running_and_committing(gc, fake)


def test_a_list_is_a_partition_too(blocked: tuple[GroupConsumer, FakeConsumer]) -> None:
    # tuple(partition) took one before: it still does.
    gc, fake = blocked
    assert gc.retry_now(["t", 0]).result(WAIT) is True  # type: ignore[arg-type]
    assert gc.retry_now(("other", 0)).result(WAIT) is False
    assert_running_and_committing(gc, fake)


def test_an_error_serving_a_request_goes_to_its_future_not_the_owner(
    blocked: tuple[GroupConsumer, FakeConsumer],
) -> None:
    gc, fake = blocked
    # Past the caller's checks (as a future bug in them would be): the owner raises serving it.
    bad: Future[bool] = gc._life.request("retry_now", "orders")
    unknown: Future[bool] = gc._life.request("rewind", P0)
    assert isinstance(bad.exception(WAIT), TypeError)
    assert "unknown request 'rewind'" in str(unknown.exception(WAIT))
    assert_running_and_committing(gc, fake)
