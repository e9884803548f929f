"""The owner thread's commit requests: each owned partition's watermark, with its offset map,
sent to the client, and the results handed back.

`Committer` (weir._engine.committing) decides what is due and keeps offsets monotonic; `ReplayMaps`
(weir._engine.replay) writes the maps; this module makes the requests between them: asynchronous at
every commit turn, synchronous at a hand-off (revoke, shutdown), and the client's results, which may
come back in any order. In transactional mode the engine sends the same watermarks and maps into
the transaction instead (`ExactlyOnce.commit`), through `committable`, `with_maps` and
`sent` here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from weir._engine.client import ConsumerClient, offsets_to_commit, topic_partitions
from weir._engine.committing import Committer
from weir._engine.ownership import Ownership
from weir._engine.replay import ReplayMaps
from weir._engine.tasks import Assignment
from weir.logs import get_logger
from weir.records import Partition

__all__ = ["CommitPath"]

log = get_logger(__name__)

# One commit result: partition, offset, the error (None: committed), the metadata sent.
Outcome = tuple[Partition, int, object | None, str | None]


class CommitPath:
    """Commit requests for the owned partitions (owner thread only)."""

    def __init__(
        self,
        client: Callable[[], ConsumerClient],
        own: Ownership,
        committer: Committer,
        replay: ReplayMaps,
    ) -> None:
        self._client = client
        self._own = own
        self._committer = committer
        self._replay = replay
        # The client's fetch positions of the owned partitions, read at each commit turn (for
        # the stats: in-app and broker backlogs).
        self.positions: dict[Partition, int] = {}

    def committable(self) -> dict[Partition, int | None]:
        """Each owned partition's watermark (None: nothing delivered yet)."""
        return {tp: st.progress.committable() for tp, st in self._own.partitions.items()}

    def catch_up_positions(self) -> None:
        """The client's positions: offsets it skipped (transaction markers, compaction) at the
        end of what was delivered count as finished, so the watermark reaches them."""
        owned = [tp for tp, st in self._own.partitions.items() if st.assignment.dispatching]
        if not owned:
            return
        try:
            positions = self._client().position(topic_partitions(owned))
        except KafkaException as exc:
            log.debug("position_failed", error=str(exc))
            return
        known = self.positions = {}
        for r in positions:
            tp = Partition(r.topic, r.partition)
            st = self._own.partitions.get(tp)
            if st is not None and r.offset >= 0:
                st.progress.advance_to(r.offset)
                known[tp] = r.offset

    def opened(self, a: Assignment) -> None:
        pass

    def closed(self, a: Assignment) -> None:
        self.positions.pop(a.tp, None)

    def send_async(self, now: float) -> None:
        """A commit turn: what is due, asynchronously; its results come to `on_commit`."""
        self.catch_up_positions()
        committable = self.committable()
        send, metadata = self.with_maps(committable, self._committer.to_send(committable))
        if send:
            try:
                self._client().commit(offsets=offsets_to_commit(send, metadata), asynchronous=True)
            except KafkaException as exc:
                log.warning("commit_request_failed", error=str(exc))
                send = {}
        self.sent(send, metadata, now, sync=False)

    def send_offsets(self, offsets: Mapping[Partition, int], now: float) -> None:
        """Commit these offsets as they are, asynchronously (a partition's start position,
        `weir._engine.starts`); the results come to `on_commit`."""
        try:
            self._client().commit(offsets=offsets_to_commit(offsets), asynchronous=True)
        except KafkaException as exc:
            log.warning("commit_request_failed", error=str(exc))
            return
        self.sent(offsets, {}, now, sync=False)

    def send_sync(self, committable: Mapping[Partition, int | None]) -> dict[Partition, int]:
        """A hand-off commit (revoke, shutdown): the watermark of these partitions, with their
        offset maps; returns what was sent."""
        send, metadata = self.with_maps(
            committable, self._committer.to_send(committable, unconfirmed=True)
        )
        sent = dict(send)
        while send:
            self.sent(send, metadata, time.monotonic(), sync=True)
            refused = self._send_sync_once(send, metadata)
            # A map the broker refused for its size (its offset.metadata.max.bytes is below
            # offset_map_max_bytes): the limit was lowered, and as this commit is the
            # partitions' last from this member it goes again at once with smaller maps (at
            # worst none) rather than leave the next owner an older offset. The client reports
            # the error for every partition of the request, though the broker stored the others:
            # they go again too.
            if not any(metadata.get(tp) for tp in refused):
                break
            send = {tp: send[tp] for tp in refused}
            metadata = {tp: self._map_of(tp, off) for tp, off in send.items()}
        return sent

    def _send_sync_once(
        self, send: Mapping[Partition, int], metadata: Mapping[Partition, str]
    ) -> list[Partition]:
        """One synchronous commit request; returns the partitions whose map was too large."""
        try:
            results = self._client().commit(
                offsets=offsets_to_commit(send, metadata), asynchronous=False
            )
        except KafkaException as exc:
            # A failed hand-off commit means replay, never loss: the next owner starts lower.
            error = exc.args[0] if exc.args else exc
            outcome: list[Outcome] = [
                (tp, off, error, metadata.get(tp)) for tp, off in send.items()
            ]
        else:
            outcome = [
                (Partition(r.topic, r.partition), r.offset, r.error, r.metadata)
                for r in results or ()
            ]
        return self.results(outcome, sync=True)

    def _map_of(self, tp: Partition, offset: int) -> str:
        st = self._own.partitions.get(tp)
        return "" if st is None else self._replay.metadata(tp, st.progress, offset)

    def with_maps(
        self, committable: Mapping[Partition, int | None], send: dict[Partition, int]
    ) -> tuple[dict[Partition, int], dict[Partition, str]]:
        """The offset map of every partition to commit, and the partitions whose offset did
        not move while records above it finished: they are committed again, with the new map
        (a crash now replays only what finished after this commit)."""
        replay = self._replay
        if not replay.enabled:
            return send, {}
        metadata: dict[Partition, str] = {}
        parts = self._own.partitions
        for tp, off in committable.items():
            st = parts.get(tp)
            if off is None or st is None:
                continue
            text = replay.metadata(tp, st.progress, off)
            if tp in send:
                metadata[tp] = text
            elif text and off == self._committer.sent_offset(tp) and replay.changed(tp, off, text):
                send[tp] = off
                metadata[tp] = text
        return send, metadata

    def sent(
        self,
        send: Mapping[Partition, int],
        metadata: Mapping[Partition, str],
        now: float,
        *,
        sync: bool,
    ) -> None:
        self._committer.sent(send, now, sync=sync)
        for tp, off in send.items():
            self._replay.sent(tp, off, metadata.get(tp, ""))

    def results(self, outcome: Iterable[Outcome], *, sync: bool) -> list[Partition]:
        """The results of one commit request; returns the partitions failed with
        OFFSET_METADATA_TOO_LARGE. The offset map limit is lowered once for the request, from
        the largest map it carried."""
        refused = []
        largest = 0
        for tp, offset, error, metadata in outcome:
            if (
                isinstance(error, KafkaError)
                and error.code() == KafkaError.OFFSET_METADATA_TOO_LARGE
            ):
                refused.append(tp)
                if metadata:
                    largest = max(largest, len(metadata) + 1)
            code = error.name() if isinstance(error, KafkaError) else None
            text = None if error is None else str(error)
            self._committer.result(tp, offset, text, sync=sync, code=code)
        if largest:
            self._replay.too_large(refused, largest)
        return refused

    def on_commit(self, err: KafkaError | None, partitions: Sequence[TopicPartition]) -> None:
        """The client's `on_commit` callback (owner thread, inside consume)."""
        outcome: list[Outcome] = []
        for r in partitions:
            error = r.error or err
            if (
                error is not None
                and getattr(error, "code", lambda: None)() == KafkaError._NO_OFFSET
            ):
                continue
            outcome.append((Partition(r.topic, r.partition), r.offset, error, r.metadata))
        self.results(outcome, sync=False)
