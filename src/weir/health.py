"""Is the member healthy: liveness and readiness, for `GroupConsumer.health()` and Kubernetes.

- **live**: the member has not failed, and its owner thread called the client within
  `max_poll_interval_s` (past it, librdkafka has already given the member's partitions up). A
  member that is not live should be restarted.
- **ready**: live, running, joined (it received an assignment from the group, possibly empty,
  and did not lose it since), no partition stuck (a partition whose watermark has not moved
  for `stuck_after_s` while records of it are in flight: a hung handler, a blocked failure
  policy), no partition stalled (the watchdog found one fetched, with records on the broker past
  its position, delivering nothing for `partition_stall_s`; ready again once it delivers), no
  broker outage: not `broker_down_unready_s` or longer since the client reported every broker
  down with none answering since, and nothing refused by the broker's ACLs (a commit, a fetch,
  a dead letter) since the last time it was allowed. A member that is not ready needs a look,
  not necessarily a restart.

Computed on demand from what the owner thread last published plus the current time: asking is
cheap and never touches the engine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from weir._engine.lifecycle import Lifecycle, State
from weir.records import Partition
from weir.stats import ConsumerStats

__all__ = ["Health", "check"]


@dataclass(frozen=True, slots=True)
class Health:
    """What `GroupConsumer.health()` found: `live` (restart the member if not) and `ready`
    (it needs a look if not), with the reasons and what they rest on (the module's docstring
    says what each requires)."""

    live: bool
    """Not failed, and the owner thread called the client within `max_poll_interval_s`."""
    ready: bool
    """Live, running, joined, nothing stuck or stalled, no broker outage, nothing refused."""
    state: str
    """The member's `State` value."""
    reasons: tuple[str, ...]
    """Why it is not live or not ready (empty when both hold)."""
    poll_age_s: float | None
    """Seconds since the owner thread last called the client (None before it first did)."""
    stuck: tuple[Partition, ...] = ()
    """Partitions whose watermark has stood still for `stuck_after_s` with work in flight."""
    brokers_down_s: float | None = None
    """Seconds since the client reported every broker down, none answering since (None: a
    broker answers)."""
    stalled: tuple[Partition, ...] = ()
    """Partitions the stall watchdog found silent with records to read (`partition_stall_s`)."""
    refused: tuple[str, ...] = ()
    """What the broker's ACLs refuse the running member, e.g. "READ on group 'orders'"."""

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready view: partitions as "topic[n]", seconds rounded to the millisecond."""
        return {
            "live": self.live,
            "ready": self.ready,
            "state": self.state,
            "reasons": list(self.reasons),
            "poll_age_s": None if self.poll_age_s is None else round(self.poll_age_s, 3),
            "stuck": [str(tp) for tp in self.stuck],
            "brokers_down_s": None
            if self.brokers_down_s is None
            else round(self.brokers_down_s, 3),
            "stalled": [str(tp) for tp in self.stalled],
            "refused": list(self.refused),
        }


def check(
    life: Lifecycle,
    stats: ConsumerStats,
    *,
    max_poll_interval_s: float,
    stuck_after_s: float,
    broker_down_unready_s: float | None = None,
    now: float | None = None,
) -> Health:
    if now is None:
        now = time.monotonic()
    state = life.state
    reasons: list[str] = []
    live = True
    polled = life.polled_at
    poll_age = None if polled is None else max(0.0, now - polled)
    if state is State.FAILED:
        live = False
        reasons.append(f"failed: {life.failure!r}")
    elif state is State.STOPPED:
        live = False
        reasons.append("stopped")
    elif poll_age is not None and poll_age > max_poll_interval_s:
        live = False
        reasons.append(
            f"the owner thread has not polled for {poll_age:.1f} s "
            f"(max_poll_interval_s {max_poll_interval_s:g})"
        )
    ready = live
    if live and state is not State.RUNNING:
        ready = False
        reasons.append(f"not running ({state.value})")
    if live and not life.joined:
        ready = False
        reasons.append("no assignment from the group yet")
    stuck = _stuck(stats, stuck_after_s, now) if stats.running else ()
    if stuck:
        ready = False
        reasons.append(
            f"watermark stuck for {stuck_after_s:g} s or more with records in flight: "
            + ", ".join(map(str, stuck))
        )
    stalled = stats.stalled_partitions if stats.running else ()
    if stalled:
        ready = False
        reasons.append(
            "partitions delivering nothing while the broker has records for them "
            "(partition_stall_s): " + ", ".join(map(str, stalled))
        )
    down_since = life.brokers_down_since
    down = None if down_since is None else max(0.0, now - down_since)
    limit = broker_down_unready_s
    if live and down is not None and limit is not None and down >= limit:
        ready = False
        reasons.append(
            f"no broker has answered for {down:.1f} s since all were reported down "
            f"(broker_down_unready_s {limit:g})"
        )
    refusals = life.refusals
    if live and refusals:
        ready = False
        for denied, since in sorted(refusals.items(), key=lambda item: item[1]):
            reasons.append(
                f"the broker's ACLs refuse {denied} ({denied.code}) "
                f"for {max(0.0, now - since):.1f} s"
            )
    refused = tuple(str(d) for d in refusals)
    return Health(live, ready, state.value, tuple(reasons), poll_age, stuck, down, stalled, refused)


def _stuck(stats: ConsumerStats, after: float, now: float) -> tuple[Partition, ...]:
    """Partitions stalled at the snapshot and still, by now, for `after` seconds."""
    since = max(0.0, now - stats.at)
    return tuple(
        p.tp
        for p in stats.partitions
        if (p.in_flight or p.read_ahead) and p.stalled_s > 0 and p.stalled_s + since >= after
    )
