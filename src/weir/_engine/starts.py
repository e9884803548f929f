"""Where each owned partition starts reading, in every mode: one path, and never librdkafka's own.

librdkafka's committed-offset fetch for an assigned partition can leave it silent (an
OffsetFetch error it does not retry while the assignment changes) or fall back to
`auto.offset.reset` (UNSTABLE_OFFSET_COMMIT while the assignment changes: committed input read
again, or skipped). So weir reads the committed offsets itself in the assign callback and
assigns every partition at an explicit offset. A partition whose start is not settled in the
callback is paused and then assigned at a placeholder it never reads from (its records are
dropped until it is sought, `holds`), not fetched meanwhile (`FetchControl` reason
`start_offset_unknown`, or `start_committing` while its reset position is committed), and
settled from the owner loop (`turn`):

- **read**: its committed offset could not be read in time: read again every 0.5 s, each read
  bounded, so the other partitions keep going;
- **resolve**: nothing is committed: where `auto_offset_reset` resolves to (the log's start or
  end, one ListOffsets request for all such partitions) ...
- **confirm**: ... is committed at once, and the partition waits until the broker confirmed it.
  A member that joins at `latest`, handles some records and dies before its first commit would
  otherwise leave its successor to resolve `latest` again, past the records it never finished;
- **seek**: the offset is known: the client is sought there and the partition resumed.

The placeholder is an absolute offset (`PLACEHOLDER`), never a logical one: librdkafka looks a
logical offset up with a ListOffsets request at once, paused or not, and a reply that comes back
after the partition's version moved on (weir's pause, its seek) is "outdated": librdkafka then
sets the partition back to querying that logical offset 500 ms later, whatever state it is in
by then. A seek to the start that landed meanwhile was undone: the partition jumped to the log
end and its records never came (a member stalled on 1,000 partitions, one in three runs here;
with live traffic, records skipped). The partition is paused right after the assign (a pause
before it is ignored); a fetch the client starts in between reads from the placeholder, and
those records are dropped until the seek. So the placeholder must be in range: a fetch below
the log's start (retention deleted offset 0) would be out of range, and librdkafka would reset
it by `auto.offset.reset`, a logical lookup again. It is the log start, asked in the callback in
one bounded ListOffsets request (`_place`); 0 only where that request does not answer.

An aborted transaction rewinds partitions through the same states (`rewind`). With
`auto_offset_reset="error"` and nothing committed the partition is left to librdkafka, which
reports it (`OffsetResetError`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, OFFSET_STORED, KafkaException
from confluent_kafka import TopicPartition as TP

from weir._engine.client import ConsumerClient, topic_partitions
from weir._engine.commit_requests import CommitPath
from weir._engine.committing import Committer
from weir._engine.fetching import FetchControl, Reason
from weir._engine.replay import ReplayMaps
from weir._engine.tasks import Assignment
from weir.logs import get_logger
from weir.records import Partition

__all__ = ["PLACEHOLDER", "Committed", "Starts"]

log = get_logger(__name__)

Committed = tuple[int, str | None]
"""A partition's committed offset (negative: none) and its metadata (the offset map)."""

# The longest the assign callback waits for the committed offsets.
_COMMITTED_TIMEOUT = 5.0
# From the owner loop: partitions whose start is not settled are read (or resolved) again this
# often, each request waiting at most this long.
_AGAIN_EVERY = 0.5
_AGAIN_TIMEOUT = 0.2
# A start commit whose result did not come (or failed) is sent again after this long.
_RESEND_AFTER = 1.0
# Where a partition whose start is not settled is assigned (never read: it is paused first and
# sought before it is resumed). Absolute, never logical: see the module docstring.
PLACEHOLDER = 0


class Wait(enum.Enum):
    """What a partition's start waits for."""

    READ = "read"
    RESOLVE = "resolve"
    CONFIRM = "confirm"
    SEEK = "seek"


class _Pending:
    __slots__ = ("offset", "sent_at", "wait")

    def __init__(self, wait: Wait, offset: int | None = None) -> None:
        self.wait = wait
        self.offset = offset
        self.sent_at = 0.0


class Starts:
    """Owner thread only."""

    def __init__(
        self,
        auto_offset_reset: str,
        revoke_timeout_s: float,
        client: Callable[[], ConsumerClient],
        commits: CommitPath,
        committer: Committer,
        replay: ReplayMaps,
        fetch: FetchControl,
        ready: Callable[[], bool] | None = None,
        start_at: datetime | None = None,
    ) -> None:
        self._reset = auto_offset_reset
        # `start_at`: where a partition with nothing committed starts, in ms (before the reset).
        self._start_ms = None if start_at is None else epoch_ms(start_at)
        self._callback_timeout = min(_COMMITTED_TIMEOUT, revoke_timeout_s)
        self._client = client
        self._commits = commits
        self._committer = committer
        self._replay = replay
        self._fetch = fetch
        self._assigning = False  # inside `assign`: the client has not assigned them yet
        # Whether a partition may be sought now (a transactional member: not while its
        # producer is being replaced, whose init resolves the transaction that was open).
        self._ready = ready or _always
        # What the group has committed for each owned partition as this member knows it: read
        # at the assignment, or sent in a committed transaction. Where a rewind starts, and
        # which records above it must not run again (its offset map).
        self.committed: dict[Partition, Committed] = {}
        self.pending: dict[Partition, _Pending] = {}
        self._placeholders: dict[Partition, int] = {}
        self._next_read = 0.0
        self._next_resolve = 0.0

    # -- the assign callback ---------------------------------------------------------------

    def assign(self, tps: Sequence[Partition]) -> list[TP]:
        """In the assign callback: the committed offsets of `tps`, read now (waiting for a
        transaction that holds them, within a bound), and each partition at the explicit offset
        to assign it at. Partitions not settled here start paused (`paused`). While the
        producer is being replaced none is: the transaction it left open may yet commit their
        offsets, and no record may finish before a new one is open; they are read once it is."""
        found = self.read(tps, self._callback_timeout) if self._ready() else {}
        at: dict[Partition, int | None] = {}  # None: its start waits (`pending`)
        self._assigning = True
        try:
            for tp in tps:
                committed = found.get(tp)
                if committed is None:
                    self._wait(tp, Wait.READ)
                    at[tp] = None
                    continue
                self.committed[tp] = committed
                self.pending.pop(tp, None)
                at[tp] = self._offset_of(tp, committed[0])
        finally:
            self._assigning = False
        # Not paused here: librdkafka ignores a pause of a partition it has not assigned yet
        # (seen with the plain client on every protocol: paused before `assign`, 8,000 of 8,000
        # records delivered; after it, none). The engine holds them right after the assign, and
        # a fetch the client starts before that must find the placeholder in range.
        waiting = [tp for tp, offset in at.items() if offset is None]
        if waiting:
            self._place(waiting)
        return [
            TP(tp.topic, tp.partition, self.placeholder(tp) if offset is None else offset)
            for tp, offset in at.items()
        ]

    def _place(self, tps: list[Partition]) -> None:
        """The log start of each of `tps` as its placeholder (`placeholder`), asked in one
        bounded ListOffsets request; where it does not answer, `PLACEHOLDER`. An offset below
        the log start would be out of range if fetched, and librdkafka would reset it by
        `auto.offset.reset`: a logical offset again, and the race in the module docstring."""
        try:
            found = resolve_offsets(self._client(), tps, OFFSET_BEGINNING, _AGAIN_TIMEOUT)
        except KafkaException as exc:
            log.debug("placeholder_unresolved", partitions=[str(t) for t in tps], error=str(exc))
            found = {}
        for tp in tps:
            self._placeholders[tp] = found.get(tp, PLACEHOLDER)

    def placeholder(self, tp: Partition) -> int:
        """Where `tp`, waiting for its start, is assigned: an absolute offset never read from
        (its records are dropped until it is sought), at the log start where it was known."""
        return self._placeholders.get(tp, PLACEHOLDER)

    def hold_waiting(self, added: Iterable[Partition]) -> None:
        """Partitions just assigned whose start waits: not fetched until it is settled."""
        for tp in added:
            p = self.pending.get(tp)
            if p is not None:
                self._fetch.hold([tp], _reason(p.wait))

    def _wait(self, tp: Partition, wait: Wait, offset: int | None = None) -> _Pending:
        """`tp`'s start waits for `wait`: not fetched meanwhile (its records are dropped, and
        fetching them is a waste)."""
        p = self.pending[tp] = _Pending(wait, offset)
        if not self._assigning:
            reason = _reason(wait)
            self._fetch.hold([tp], reason)
            self._fetch.release([tp], _other(reason))
        return p

    def _offset_of(self, tp: Partition, committed: int) -> int | None:
        """Where a partition with this committed offset starts (None: resolve and commit the
        reset position first)."""
        if committed >= 0:
            return committed
        if self._reset == "error" and self._start_ms is None:
            return OFFSET_STORED  # librdkafka's fetch finds nothing and reports it
        self._wait(tp, Wait.RESOLVE)
        return None

    # -- reads -----------------------------------------------------------------------------

    def read(
        self, tps: Sequence[Partition], timeout: float, *, again: bool = False
    ) -> dict[Partition, Committed]:
        """The group's committed offsets and metadata of `tps`, from the broker (it waits for
        an open transaction's offsets), bounded in time; what could not be read is left out
        (a warning, or a debug line when it is read `again` from the loop)."""
        if not tps:
            return {}
        try:
            found = self._client().committed(topic_partitions(tps), timeout=timeout)
        except KafkaException as exc:
            parts = [str(t) for t in tps]
            if again:
                log.debug("committed_reread_failed", partitions=parts, error=str(exc))
            else:
                log.warning("committed_read_failed", partitions=parts, error=str(exc))
            return {}
        return {
            Partition(r.topic, r.partition): (r.offset, r.metadata)
            for r in found
            if r.error is None
        }

    # -- the owner loop --------------------------------------------------------------------

    def holds(self, tp: Partition) -> bool:
        """Records of `tp` are dropped: it was fetched before its start was sought."""
        return tp in self.pending

    def turn(self, now: float) -> list[Partition]:
        """Move each waiting partition's start on by what can be done now; returns the
        partitions sought to their start (fetched again from the next turn)."""
        if not self.pending or not self._ready():
            return []
        waiting = {w: [tp for tp, p in self.pending.items() if p.wait is w] for w in Wait}
        if waiting[Wait.READ] and now >= self._next_read:
            # A read that waits (a killed member's open transaction holds the offsets until
            # it times out) blocks the loop: not more often than this.
            self._next_read = now + _AGAIN_EVERY
            for tp, committed in self.read(waiting[Wait.READ], _AGAIN_TIMEOUT, again=True).items():
                self.restart_at(tp, committed)
        if waiting[Wait.RESOLVE] and now >= self._next_resolve:
            self._next_resolve = now + _AGAIN_EVERY
            self._resolve(waiting[Wait.RESOLVE], now)
        for tp in waiting[Wait.CONFIRM]:
            self._confirm(tp, now)
        sought = []
        client = self._client()
        for tp, p in list(self.pending.items()):
            if p.wait is not Wait.SEEK:
                continue
            assert p.offset is not None
            try:
                client.seek(TP(tp.topic, tp.partition, p.offset))
            except KafkaException as exc:
                log.warning("seek_failed", tp=str(tp), offset=p.offset, error=str(exc))
                self._wait(tp, Wait.READ)  # read it again
                continue
            del self.pending[tp]
            self._fetch.release([tp], "start_offset_unknown")
            self._fetch.release([tp], "start_committing")
            sought.append(tp)
        return sought

    def _resolve(self, tps: list[Partition], now: float) -> None:
        """Where `start_at` or else `auto_offset_reset` puts partitions with nothing committed
        (the first record at or after that time, or the log's start or end now), committed at
        once."""
        if self._start_ms is not None:
            spec = self._start_ms
        else:
            spec = OFFSET_BEGINNING if self._reset == "earliest" else OFFSET_END
        try:
            resolved = resolve_offsets(self._client(), tps, spec, _AGAIN_TIMEOUT)
        except KafkaException as exc:
            log.debug("reset_resolve_failed", partitions=[str(t) for t in tps], error=str(exc))
            return
        for tp, offset in resolved.items():
            if tp in self.pending:
                self._wait(tp, Wait.CONFIRM, offset)
        if resolved:
            log.info(
                "start_offsets_reset",
                reset="start_at" if self._start_ms is not None else self._reset,
                offsets={str(tp): off for tp, off in resolved.items()},
            )
            self._send(resolved, now)

    def seek_to(self, tp: Partition, offset: int, now: float) -> None:
        """The operator sought `tp` to `offset` (`weir._engine.seeking`): committed at once,
        and once the broker confirmed it, the client is sought there. Its records are dropped
        meanwhile (`holds`): they were fetched from the old position."""
        self.committed.pop(tp, None)  # until the seek's commit is confirmed (`_confirm`)
        self._wait(tp, Wait.CONFIRM, offset)
        self._send({tp: offset}, now)

    def _confirm(self, tp: Partition, now: float) -> None:
        p = self.pending[tp]
        assert p.offset is not None
        confirmed = self._committer.confirmed(tp)
        if confirmed is not None and confirmed >= p.offset:
            self.committed[tp] = (p.offset, None)
            self._wait(tp, Wait.SEEK, p.offset)
        elif now - p.sent_at >= _RESEND_AFTER:
            # Failed (the committer forgot it) or no answer yet: once more.
            self._send({tp: p.offset}, now)

    def _send(self, offsets: Mapping[Partition, int], now: float) -> None:
        for tp in offsets:
            self.pending[tp].sent_at = now
        self._commits.send_offsets(offsets, now)

    # -- rewinds and hand-offs -------------------------------------------------------------

    def restart_at(self, tp: Partition, committed: Committed) -> None:
        """Start `tp` over at its committed offset (a seek from the loop), skipping what its
        committed offset map lists."""
        self.committed[tp] = committed
        offset = self._offset_of(tp, committed[0])
        if offset is not None:
            self._wait(tp, Wait.SEEK, offset)
        if self._replay.enabled:
            self._replay.forget([tp])
            self._replay.restore({tp: committed})

    def rewind(self, tp: Partition, *, reread: bool) -> None:
        """After an aborted transaction: `tp` starts over at its committed offset, read from the
        broker again when `reread` (the commit's fate was unknown) or not known."""
        if reread:
            self.committed.pop(tp, None)
        known = self.committed.get(tp)
        if known is None:
            self._wait(tp, Wait.READ)
        else:
            self.restart_at(tp, known)

    def opened(self, a: Assignment) -> None:
        pass  # read in the assign callback (`assign`), before the assignment exists

    def closed(self, a: Assignment) -> None:
        self.pending.pop(a.tp, None)
        self.committed.pop(a.tp, None)
        self._placeholders.pop(a.tp, None)


def epoch_ms(when: datetime) -> int:
    """A timezone-aware time as the milliseconds since the epoch a ListOffsets request takes."""
    return int(when.timestamp() * 1000)


def resolve_offsets(
    client: ConsumerClient, tps: Sequence[Partition], spec: int, timeout: float
) -> dict[Partition, int]:
    """Where `spec` puts each of `tps` now: `OFFSET_BEGINNING`, `OFFSET_END`, or a time in ms
    (the first record at or after it; the log end when there is none that late). One
    ListOffsets request, two for a time past some log's end; raises `KafkaException`.
    Partitions the broker did not answer for are left out."""
    found = client.offsets_for_times(
        [TP(tp.topic, tp.partition, spec) for tp in tps], timeout=timeout
    )
    resolved = {
        Partition(r.topic, r.partition): r.offset
        for r in found
        if r.error is None and r.offset >= 0
    }
    late = [Partition(r.topic, r.partition) for r in found if r.error is None and r.offset < 0]
    if late and spec >= 0:
        resolved.update(resolve_offsets(client, late, OFFSET_END, timeout))
    return resolved


def _always() -> bool:
    return True


def _reason(wait: Wait) -> Reason:
    return "start_committing" if wait is Wait.CONFIRM else "start_offset_unknown"


def _other(reason: Reason) -> Reason:
    return "start_offset_unknown" if reason == "start_committing" else "start_committing"
