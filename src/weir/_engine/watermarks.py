"""High watermarks of the owned partitions, refreshed off the owner thread.

The client knows a partition's high watermark only from its fetch responses
(`get_watermark_offsets(cached=True)`: librdkafka stores the HighwaterMarkOffset of each fetch
response and nothing else updates it). A partition that is not fetched — paused, or throttled
with the client's queue full — keeps its last value, and lag computed from it freezes: the
librdkafka consumer-lag statistic has the same flaw. So a thread of its own asks the partition
leaders for the latest offsets every `interval_s`, with one `offsets_for_times` call (one
ListOffsets request per leader, under one timeout) on a client of its own that never joins the
group: the member's client is never called from another thread (calls on one confluent-kafka
client are serialised with no timeout), and the owner never waits for the answer. The owner
takes the larger of the two values, so an active partition still shows its last fetch's value
between refreshes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from confluent_kafka import KafkaException, TopicPartition

from weir._secrets import OAUTH_CB
from weir.logs import ClientLog, Repeats, get_logger
from weir.records import Partition

__all__ = ["OffsetsClient", "WatermarkRefresher"]

log = get_logger(__name__)

# In a ListOffsets request, the "timestamp" -1 asks for the latest offset (the high watermark
# under read_uncommitted), which `offsets_for_times` passes through as given.
_LATEST = -1
# Settings of the member's client that this one must not copy: it never joins the group, and a
# static member id would confuse anyone reading the broker's logs.
_DROP = ("group.instance.id",)


class OffsetsClient(Protocol):
    def offsets_for_times(
        self, partitions: list[TopicPartition], timeout: float = ...
    ) -> list[TopicPartition]: ...
    def poll(self, timeout: float = ...) -> Any: ...
    def close(self) -> None: ...


OffsetsFactory = Callable[[dict[str, Any]], OffsetsClient]


def refresher_config(conf: Mapping[str, Any], repeats: Repeats) -> dict[str, Any]:
    """The member's librdkafka configuration for the refresher's own client: the same cluster,
    security and client id; read_uncommitted, so the latest offset is the high watermark; its
    log lines on ``weir.librdkafka``, repeated ones collapsed, as the member's are."""
    # The member's callbacks stay its own; the OAUTHBEARER token provider logs this one in too.
    out = {k: v for k, v in conf.items() if k not in _DROP and (k == OAUTH_CB or not callable(v))}
    out["isolation.level"] = "read_uncommitted"
    out["logger"] = ClientLog(repeats)
    return out


class WatermarkRefresher:
    """Owner side: `track` the owned partitions, read `high`. The thread does the rest."""

    def __init__(
        self,
        conf: Mapping[str, Any],
        interval_s: float,
        factory: OffsetsFactory | None = None,
    ) -> None:
        self._repeats = Repeats()
        self._conf = refresher_config(conf, self._repeats)
        self._interval = interval_s
        # Each round waits at most this long: it never runs into the next one.
        self._timeout = min(interval_s, 10.0)
        self._factory = factory
        self._partitions: tuple[Partition, ...] = ()
        self._high: dict[Partition, int] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: OffsetsClient | None = None
        self.rounds = 0
        self.failures = 0

    # -- owner thread ----------------------------------------------------------------------

    def track(self, partitions: Iterable[Partition]) -> None:
        """The partitions to refresh from now on. The first round comes one interval after the
        first assignment: until then the member's own fetches keep its values fresh, and a
        second client is not built in the busy first seconds of a member."""
        new = tuple(sorted(partitions))
        self._partitions = new
        if new and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="weir-watermarks", daemon=True)
            self._thread.start()

    def high(self) -> Mapping[Partition, int]:
        """The latest high watermarks read (swapped in whole by the thread)."""
        return self._high

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- its own thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                self._wake.wait(self._interval)
                self._wake.clear()
                if self._stop.is_set():
                    return
                parts = self._partitions
                if parts:
                    self._refresh(parts)
        finally:
            client, self._client = self._client, None
            if client is not None:
                try:
                    client.close()
                except Exception as exc:  # closing is best effort: nothing depends on it
                    log.debug("watermark_client_close_failed", error=repr(exc))
                self._repeats.flush()

    def _refresh(self, parts: tuple[Partition, ...]) -> None:
        client = self._client
        if client is None:
            try:
                client = self._client = self._make()
            except Exception as exc:
                self.failures += 1
                log.warning("watermark_refresh_failed", stage="client", error=repr(exc))
                return
        try:
            results = client.offsets_for_times(
                [TopicPartition(tp.topic, tp.partition, _LATEST) for tp in parts], self._timeout
            )
        except KafkaException as exc:
            self.failures += 1
            # A broker that does not answer is reported by the member's own client; this one
            # only says so once in a while.
            if self.failures in (1, 10, 100) or self.failures % 1000 == 0:
                log.warning(
                    "watermark_refresh_failed",
                    stage="query",
                    partitions=len(parts),
                    failures=self.failures,
                    error=str(exc.args[0] if exc.args else exc),
                )
            return
        finally:
            # The client's log lines and errors wait on its queue until it is served.
            client.poll(0)
            self._repeats.tick()
        high = dict(self._high)
        for r in results:
            if r.error is None and r.offset >= 0:
                high[Partition(r.topic, r.partition)] = r.offset
        owned = set(self._partitions)
        self._high = {tp: off for tp, off in high.items() if tp in owned}
        self.rounds += 1

    def _make(self) -> OffsetsClient:
        if self._factory is not None:
            return self._factory(self._conf)
        from confluent_kafka import Consumer

        client: OffsetsClient = Consumer(self._conf)
        return client
