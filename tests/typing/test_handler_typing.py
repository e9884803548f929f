"""The handler API is typed for sync and async handlers alike: mypy (this file is in its `files`)
accepts a `Handler` whose `handle` and hooks are `async def`, an `async def` function, `loop=`
and the asyncio lifecycle without an ignore, and refuses a wrong call (each one carries
`# type: ignore[code]`, which strict mode's `warn_unused_ignores` turns into a failure the day
it stops being an error)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from weir import CommitEvent, Context, GroupConsumer, Handler, Partition, Record


class AsyncOrders(Handler):
    async def handle(self, record: Record, ctx: Context) -> None:
        await asyncio.sleep(0)

    async def on_assigned(self, partitions: Sequence[Partition]) -> None:
        await asyncio.sleep(0)

    async def on_revoked(self, partitions: Sequence[Partition]) -> None:
        pass

    async def on_lost(self, partitions: Sequence[Partition]) -> None:
        pass

    async def on_shutdown(self) -> None:
        pass


class SyncOrders(Handler):
    def handle(self, record: Record, ctx: Context) -> None:
        pass

    def on_revoked(self, partitions: Sequence[Partition]) -> None:
        pass


async def save(record: Record) -> None:
    await asyncio.sleep(0)


def test_sync_and_async_handlers_type_check() -> None:
    loop = asyncio.new_event_loop()
    try:
        a = GroupConsumer(AsyncOrders(), bootstrap_servers="b:9092", group_id="g", topics=["t"])
        b = GroupConsumer(SyncOrders(), bootstrap_servers="b:9092", group_id="g", topics=["t"])
        c = GroupConsumer(
            save, bootstrap_servers="b:9092", group_id="g", topics=["t"], max_in_flight=64
        )
        d = GroupConsumer(save, bootstrap_servers="b:9092", group_id="g", topics=["t"], loop=loop)
        assert [x.config.max_in_flight for x in (a, b, c, d)] == [256, 256, 64, 256]
    finally:
        loop.close()


def test_the_asyncio_lifecycle_type_checks() -> None:
    async def main(consumer: GroupConsumer) -> None:
        if consumer.state.value == "never":  # not run: only its types are checked
            await consumer.run_async(handle_signals=False)
            await consumer.join_async()
            async with consumer as running:
                assert running is consumer

    consumer = GroupConsumer(save, bootstrap_servers="b:9092", group_id="g", topics=["t"])
    asyncio.run(main(consumer))


def test_wrong_calls_are_type_errors() -> None:
    with pytest.raises(TypeError):
        GroupConsumer(save, bootstrap_servers="b:9092", group_id="g", topics=["t"], loop=1)  # type: ignore[call-overload]

    async def listener(event: CommitEvent) -> None:
        pass

    consumer = GroupConsumer(save, bootstrap_servers="b:9092", group_id="g", topics=["t"])
    with pytest.raises(TypeError):
        consumer.add_commit_listener(listener)  # type: ignore[arg-type]
