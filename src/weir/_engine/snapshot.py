"""The stats snapshot: what the owner thread publishes for readers on other threads.

Built from the owner's components at a commit and at least once a second (`Engine._publish`),
immutable, and swapped in whole (`Lifecycle.publish`): `stats()`, `health()` and the Prometheus
exporter read it without touching the engine.
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import KafkaException, TopicPartition

from weir._engine.budget import Budget
from weir._engine.callbacks import Callbacks
from weir._engine.client import ConsumerClient
from weir._engine.commit_requests import CommitPath
from weir._engine.committing import Committer
from weir._engine.failures import Failures
from weir._engine.fetching import FetchControl
from weir._engine.lifecycle import Lifecycle
from weir._engine.metrics import Metrics
from weir._engine.ownership import Ownership
from weir._engine.replay import ReplayMaps
from weir._engine.settlement import Settlement
from weir._engine.stalls import Stalls
from weir._engine.watermarks import WatermarkRefresher
from weir._engine.workers import Workers
from weir.config import FlowConfig
from weir.records import Partition
from weir.stats import ConsumerStats, PartitionStats

__all__ = ["Snapshot"]


class Snapshot:
    """Owner thread only: reads the components it is given, changes none."""

    def __init__(
        self,
        *,
        client: Callable[[], ConsumerClient],
        own: Ownership,
        budget: Budget,
        metrics: Metrics,
        committer: Committer,
        commits: CommitPath,
        fetch: FetchControl,
        stalls: Stalls,
        replay: ReplayMaps,
        settle: Settlement,
        failures: Failures,
        callbacks: Callbacks,
        workers: Workers,
        life: Lifecycle,
        flow: FlowConfig,
        refresher: Callable[[], WatermarkRefresher | None],
    ) -> None:
        self._client = client
        self._own = own
        self._budget = budget
        self._metrics = metrics
        self._committer = committer
        self._commits = commits
        self._fetch = fetch
        self._stalls = stalls
        self._replay = replay
        self._settle = settle
        self._failures = failures
        self._callbacks = callbacks
        self._workers = workers
        self._life = life
        self._flow = flow
        self._refresher = refresher

    def take(self, *, running: bool, now: float) -> ConsumerStats:
        """The stats of this moment (`now`, time.monotonic())."""
        budget = self._budget
        m = self._metrics
        refresher = self._refresher()
        refreshed = refresher.high() if refresher is not None else {}
        parts = []
        for tp, st in sorted(self._own.partitions.items()):
            pb = budget.parts.get(tp)
            pm = m.parts.get(tp)
            committable = st.progress.committable()
            committed = self._committer.confirmed(tp)
            if committed is None and pm is not None:
                committed = pm.group_committed
            position = self._commits.positions.get(tp, st.progress.read_position)
            low, high = self._watermarks_of(tp)
            if tp in refreshed and (high is None or refreshed[tp] > high):
                high = refreshed[tp]
            in_flight = pb.records if pb else 0
            ahead = pb.ahead_records if pb else 0
            stalled = 0.0
            oldest_age = oldest_fetched = None
            if pm is not None:
                stalled = pm.watermark(committable, bool(in_flight or ahead), now)
                oldest_fetched, oldest_age = pm.oldest_ages(now)
            parts.append(
                PartitionStats(
                    tp=tp,
                    token=st.assignment.token,
                    in_flight=in_flight,
                    in_flight_bytes=pb.bytes if pb else 0,
                    committable=committable,
                    committed=committed,
                    paused=tp in self._fetch.paused,
                    pause_reason=self._fetch.reason(tp),
                    read_ahead=ahead,
                    offset_map_bytes=self._replay.sizes.get(tp, 0),
                    position=position,
                    high_watermark=high,
                    log_start=low,
                    throttled=budget.throttled,
                    blocked=pb.blocked if pb else False,
                    oldest_age_s=oldest_age,
                    oldest_fetched_s=oldest_fetched,
                    stalled_s=stalled,
                    silent_s=self._stalls.silent_s(tp, now),
                    last_commit_time=pm.last_commit_time if pm else None,
                    last_commit_offset=pm.last_commit_offset if pm else None,
                    last_commit_error=pm.last_commit_error if pm else None,
                    assigned_time=pm.assigned_time if pm else 0.0,
                    recovery_s=pm.recovery_s if pm else None,
                    unconfirmed_commit_s=_age(self._committer.unconfirmed_since(tp), now),
                )
            )
        ahead_bytes = budget.read_ahead_bytes
        rate, window = m.rate(self._settle.processed, now)
        flow = self._flow
        return ConsumerStats(
            at=now,
            running=running,
            processed=self._settle.processed,
            failed=self._settle.failed,
            in_flight=budget.records,
            in_flight_bytes=budget.bytes - ahead_bytes,
            peak_in_flight=budget.peak_records,
            peak_in_flight_bytes=budget.peak_bytes,
            throttled=budget.throttled,
            throttles=budget.throttles,
            paused=budget.paused,
            pauses=budget.pauses,
            rebalances=m.rebalances,
            partitions=tuple(parts),
            read_ahead=sum(p.read_ahead for p in parts),
            read_ahead_bytes=ahead_bytes,
            callback_failures=self._callbacks.failures,
            workers_replaced=self._workers.replaced,
            loop_blocked=getattr(self._workers, "loop_blocked", 0),
            retries=self._failures.retries,
            waiting_retry=self._failures.waiting,
            dead_lettered=self._failures.dead_lettered,
            skipped=self._failures.skipped,
            blocked=tuple(self._failures.blocked()),
            offset_map_truncations=self._replay.truncations,
            replay_skipped=self._replay.skipped,
            partition_stall_recoveries=self._stalls.recoveries,
            commit_failures=m.commit_failures,
            rate=rate,
            rate_window_s=window,
            handler_latency=m.handler.snapshot(),
            end_to_end_latency=m.end_to_end.snapshot(),
            rebalance_last_s=m.rebalance_last_s,
            rebalance_seconds=m.rebalance_seconds,
            rebalancing=m.rebalancing,
            joined=self._life.joined,
            capacity_records=flow.capacity_records,
            capacity_bytes=flow.capacity_bytes,
            oldest_unconfirmed_commit_s=max(
                (p.unconfirmed_commit_s for p in parts if p.unconfirmed_commit_s is not None),
                default=None,
            ),
        )

    def _watermarks_of(self, tp: Partition) -> tuple[int | None, int | None]:
        """The client's log start and high watermark of `tp` from its last fetch response: a
        local read, no request (None where unknown)."""
        try:
            low, high = self._client().get_watermark_offsets(
                TopicPartition(tp.topic, tp.partition), cached=True
            )
        except KafkaException:
            return None, None
        return (low if low >= 0 else None), (high if high >= 0 else None)


def _age(since: float | None, now: float) -> float | None:
    return None if since is None else max(0.0, now - since)
