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

import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from weir._engine.client import ConsumerClient, offsets_to_commit, topic_partitions
from weir._engine.clock import SYSTEM, Clock
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

# The longest an asynchronous commit request holds back the next commit turn. librdkafka answers
# every request (at worst when its socket.timeout.ms, 60 s by default, runs out); past this, a
# request whose answer never came no longer holds the member's commits.
RESULT_OVERDUE_S = 120.0
# The shutdown's last commit is sent again after a failed answer at most this often.
_FINAL_RETRY_S = 0.1
# How long the shutdown serves the client at a time while it waits for that commit's answer.
_FINAL_WAIT = 0.05


class CommitPath:
    """Commit requests for the owned partitions (owner thread only)."""

    def __init__(
        self,
        client: Callable[[], ConsumerClient],
        own: Ownership,
        committer: Committer,
        replay: ReplayMaps,
        *,
        clock: Clock = SYSTEM,
    ) -> None:
        self._clock = clock
        self._client = client
        self._own = own
        self._committer = committer
        self._replay = replay
        # The client's fetch positions of the owned partitions, read at each commit turn (for
        # the stats: in-app and broker backlogs).
        self.positions: dict[Partition, int] = {}
        # When each asynchronous commit request without an answer yet was sent, oldest first
        # (the client calls `on_commit` once per request).
        self._requests: deque[float] = deque()

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

    def generation_ended(self) -> None:
        """Partitions were lost: the member's generation is over, and so is whatever its
        asynchronous requests were waiting for. One may never be answered (a member stopped
        past its session timeout); its answer, if it comes, is for assignments that are gone.
        It holds back no commit of the next generation (`ready`), which would otherwise wait
        RESULT_OVERDUE_S with every record of the new assignment finished."""
        self._requests.clear()

    def ready(self, now: float) -> bool:
        """Whether a commit turn may send: no earlier asynchronous request is still waiting for
        its answer. Under the classic protocol every group request of a member goes over one
        connection, behind its JoinGroup while a rebalance waits for the other members (up to
        a dead member's session timeout): requests sent meanwhile all fail when it ends
        (ILLEGAL_GENERATION, docs/rebalances.md). One waits; the turn after its answer sends
        what is due then, and the assign callback that ends a rebalance sends at once
        (`send_pending`)."""
        requests = self._requests
        while requests and now - requests[0] >= RESULT_OVERDUE_S:
            log.warning("commit_result_overdue", waited_s=round(now - requests.popleft(), 1))
        return not requests

    def send_async(self, now: float) -> None:
        """A commit turn: what is due, asynchronously; its results come to `on_commit`."""
        self.catch_up_positions()
        committable = self.committable()
        send, metadata = self.with_maps(committable, self._committer.to_send(committable))
        self.sent(self._request(send, metadata, now), metadata, now, sync=False)

    def send_pending(self, now: float) -> None:
        """The end of a rebalance (the assign callback): every owned partition's watermark
        the broker has not confirmed, asynchronously and at once, whatever request is still
        waiting for its answer. A classic rebalance fails the commits a member sent while its
        JoinGroup waited (ILLEGAL_GENERATION, often answered after this callback): what the
        kept partitions finished meanwhile goes now with the new generation, not a commit
        interval later."""
        committable = self.committable()
        send, metadata = self.with_maps(
            committable, self._committer.to_send(committable, unconfirmed=True)
        )
        self.sent(self._request(send, metadata, now), metadata, now, sync=False)

    def send_offsets(self, offsets: Mapping[Partition, int], now: float) -> None:
        """Commit these offsets as they are, asynchronously (a partition's start position,
        `weir._engine.starts`); the results come to `on_commit`."""
        if self._request(offsets, {}, now):
            self.sent(offsets, {}, now, sync=False)

    def _request(
        self, send: Mapping[Partition, int], metadata: Mapping[Partition, str], now: float
    ) -> Mapping[Partition, int]:
        """One asynchronous commit request; returns what it sent (nothing if the client
        refused it). Its results come to `on_commit`."""
        if not send:
            return send
        try:
            self._client().commit(offsets=offsets_to_commit(send, metadata), asynchronous=True)
        except KafkaException as exc:
            log.warning("commit_request_failed", error=str(exc))
            return {}
        self._requests.append(now)
        return send

    def send_final(
        self,
        committable: Mapping[Partition, int | None],
        deadline: float,
        serve: Callable[[float], None],
        hurry: threading.Event,
    ) -> dict[Partition, int]:
        """The shutdown's last commit: the watermark of these partitions, with their offset
        maps, asynchronously; its answer is awaited by serving the client (`serve(wait)`: the
        answers and rebalance callbacks come from consume) until `deadline` or a hurried stop,
        and a failed answer sends it again. Returns what was sent.

        Not a synchronous commit: one has no timeout, and under the classic protocol it waits
        behind the member's own JoinGroup for as long as a rebalance waits for the other
        members (up to a dead member's session timeout) only to fail when the join ends. Served
        meanwhile, the rebalance's assign callback sends the offsets again with the new
        generation (`send_pending`), which succeeds."""
        sent: dict[Partition, int] = {}
        started = next_try = self._clock.monotonic()
        # The assignments whose work these offsets are: a rebalance served meanwhile may hand a
        # partition over and back, and the new assignment's offset is no longer this one.
        owners = {tp: st.assignment for tp, st in self._own.partitions.items()}
        parts = self._own.partitions
        while True:
            now = self._clock.monotonic()
            committable = {
                tp: off
                for tp, off in committable.items()
                if tp in parts and parts[tp].assignment is owners.get(tp)
            }
            # The first request goes whatever is still unanswered: the last chance to send
            # these offsets (the client's close waits for it).
            if sent and self._requests:
                if now >= deadline or hurry.is_set():
                    break
                serve(max(0.0, min(_FINAL_WAIT, deadline - now)))
                continue
            send, metadata = self.with_maps(
                committable, self._committer.to_send(committable, unconfirmed=True)
            )
            if not send:
                return sent
            if sent and (now >= deadline or hurry.is_set()):
                break
            if now < next_try:
                serve(max(0.0, min(next_try, deadline) - now))
                continue
            requested = self._request(send, metadata, now)
            self.sent(requested, metadata, now, sync=False)
            if not requested:
                return sent  # the client refused the request (logged)
            sent.update(requested)
            next_try = now + _FINAL_RETRY_S
        unanswered = self._committer.to_send(committable, unconfirmed=True)
        log.warning(
            "shutdown_commit_unanswered",
            offsets={str(tp): off for tp, off in sorted(unanswered.items())},
            waited_s=round(self._clock.monotonic() - started, 3),
        )
        return sent

    def send_sync(self, committable: Mapping[Partition, int | None]) -> dict[Partition, int]:
        """A hand-off commit of a revoke (inside the rebalance callback, where the client can
        be neither served nor waited on otherwise): the watermark of these partitions, with
        their offset maps; returns what was sent."""
        send, metadata = self.with_maps(
            committable, self._committer.to_send(committable, unconfirmed=True)
        )
        sent = dict(send)
        while send:
            self.sent(send, metadata, self._clock.monotonic(), sync=True)
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
        """The client's `on_commit` callback (owner thread, inside consume): the answer to one
        asynchronous request."""
        if self._requests:
            self._requests.popleft()
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
