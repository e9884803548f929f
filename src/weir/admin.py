"""Look at and change a consumer group from outside it: describe it, plan and apply an offset
reset (and undo one), delete the group or its offsets of one topic.

Used by ``weir groups describe|delete`` and ``weir offsets reset|delete``; Python code can call
the same functions with an admin client from ``weir.lag.admin_client``. Nothing here joins the
group. What changes a group's offsets, or deletes it, is refused while the group has members
(``GroupActiveError`` names them): a running member would overwrite the new offsets with its
next commit, and the broker refuses a commit from outside a group with members anyway.

A reset and weir's offset map (docs/offset-map.md): the map in a commit's metadata lists the
offsets above the committed one that are already finished, and it only counts for the offset it
was committed with. A reset therefore decides, per partition, what metadata goes with the new
offset:

- the same offset: the metadata is kept as it is;
- forward (records are skipped): the part of the map at and above the new offset is kept,
  re-encoded for the new offset. Those records were handled; the operator asked to skip the
  records below the new offset, not to handle these again;
- backward (records are re-read): no map. A rewind asks for the records from the new offset on
  to be handled again, and the ones finished above the old commit were handled by the same code
  as those below it: skipping them would make the replay partial;
- metadata that is no weir map for the current offset (another tool's, a stale or damaged map):
  dropped whenever the offset moves, kept when it does not.

A restore (``plan_restore``, ``weir offsets reset --from-file``) writes the saved offsets and
metadata back exactly.

Failures are ``weir.WeirError``s as in ``weir.lag``: ``GroupNotFoundError``,
``TopicNotFoundError``, ``GroupActiveError``, ``OffsetsError`` (a plan that cannot be made or a
change the broker refused), ``BrokerUnreachableError`` and its refusals.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from weir._engine.refusals import authorization_error, denied_of
from weir.errors import GroupActiveError, GroupNotFoundError, LagError, OffsetsError
from weir.lag import (
    TopicPartitionKey,
    _committed_partitions,
    _Deadline,
    _describe,
    _groups_lag,
    _log_offsets,
    _offset_spec,
    _partitions,
    _result,
)
from weir.logs import get_logger
from weir.offsetmap import FinishedMap, decode_finished, encode_finished

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

__all__ = [
    "GroupActiveError",
    "GroupDescription",
    "MemberInfo",
    "OffsetsError",
    "PartitionDetail",
    "PlannedOffset",
    "ResetPlan",
    "ResetTarget",
    "SavedOffset",
    "delete_group",
    "delete_group_offsets",
    "describe_group",
    "execute_reset",
    "plan_offsets",
    "plan_reset",
    "plan_restore",
    "read_offsets_csv",
    "read_saved_offsets",
    "require_empty",
    "write_saved_offsets",
]

SAVED_FORMAT = "weir-offsets-v1"

log = get_logger(__name__)

# What the broker's ACLs must allow for a change, as an ACL refusal of it says.
_COMMIT = ("READ", "resetting a group's offsets needs READ on the group and on the topic")
_DELETE = ("DELETE", "deleting a group needs DELETE on it")


# --- describe ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemberInfo:
    """A member as the group coordinator describes it. ``target_assignment`` is the consumer
    protocol's (KIP-848) assignment the member moves to; None under the classic protocol."""

    member_id: str
    client_id: str
    host: str
    group_instance_id: str | None
    assignment: tuple[TopicPartitionKey, ...]
    target_assignment: tuple[TopicPartitionKey, ...] | None


@dataclass(frozen=True)
class PartitionDetail:
    """A partition the group committed to or is assigned: its committed offset, lag, owner and
    the offset map committed with it (``map_bytes`` as the broker counts it, the client's NUL
    included; 0 without a map). ``map_problem`` says why metadata there is no map for the
    committed offset (another tool's, stale, damaged), else None."""

    topic: str
    partition: int
    committed: int | None
    log_end: int | None
    lag: int | None
    member_id: str | None
    map_bytes: int
    map_finished: int
    map_problem: str | None


@dataclass(frozen=True)
class GroupDescription:
    """What `describe_group` found: the group's state, protocol, assignor ("-" when none) and
    coordinator, its members, and the partitions it committed to or is assigned."""

    group_id: str
    state: str
    protocol: str
    simple: bool
    assignor: str
    coordinator: str
    members: tuple[MemberInfo, ...]
    partitions: tuple[PartitionDetail, ...]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready view with stable keys (absent values are null)."""
        return {
            "group": self.group_id,
            "state": self.state,
            "protocol": self.protocol,
            "simple": self.simple,
            "assignor": self.assignor,
            "coordinator": self.coordinator,
            "members": [
                {
                    "member_id": m.member_id,
                    "client_id": m.client_id,
                    "host": m.host,
                    "group_instance_id": m.group_instance_id,
                    "assignment": [list(k) for k in m.assignment],
                    "target_assignment": None
                    if m.target_assignment is None
                    else [list(k) for k in m.target_assignment],
                }
                for m in self.members
            ],
            "partitions": [
                {
                    "topic": p.topic,
                    "partition": p.partition,
                    "committed": p.committed,
                    "log_end": p.log_end,
                    "lag": p.lag,
                    "member_id": p.member_id,
                    "map_bytes": p.map_bytes,
                    "map_finished": p.map_finished,
                    "map_problem": p.map_problem,
                }
                for p in self.partitions
            ],
        }


def describe_group(admin: AdminClient, group_id: str, *, timeout: float = 10.0) -> GroupDescription:
    """State, protocol, assignor, coordinator and members of ``group_id``, and per partition the
    committed offset, lag and offset map. ``GroupNotFoundError`` for a group Kafka does not know."""
    deadline = _Deadline(timeout, admin)
    description = _describe(admin, [group_id], deadline)[group_id]
    lag = _groups_lag(admin, [group_id], None, deadline)[group_id]
    members = tuple(_member(m) for m in description.members)
    if lag.state in ("dead", "unknown") and not members and not lag.partitions:
        raise GroupNotFoundError(
            f"group {group_id!r} does not exist: no members and no committed offsets"
        )
    keys = [(p.topic, p.partition) for p in lag.partitions if p.committed is not None]
    metadata = {
        k: m for k, (_, m) in _committed_with_metadata(admin, group_id, keys, deadline).items()
    }
    rows = []
    for p in lag.partitions:
        size, finished, problem = _map_stats(metadata.get((p.topic, p.partition)), p.committed)
        rows.append(
            PartitionDetail(
                topic=p.topic,
                partition=p.partition,
                committed=p.committed,
                log_end=p.log_end,
                lag=p.lag,
                member_id=p.member_id,
                map_bytes=size,
                map_finished=finished,
                map_problem=problem,
            )
        )
    node = description.coordinator
    coordinator = "-" if node is None else f"{node.host}:{node.port} (broker {node.id})"
    return GroupDescription(
        group_id=group_id,
        state=lag.state,
        protocol=lag.group_type,
        simple=lag.simple,
        assignor=description.partition_assignor or "-",
        coordinator=coordinator,
        members=members,
        partitions=tuple(rows),
    )


def _member(m: Any) -> MemberInfo:
    target = getattr(m, "target_assignment", None)
    return MemberInfo(
        member_id=m.member_id,
        client_id=m.client_id,
        host=m.host,
        group_instance_id=m.group_instance_id,
        assignment=_keys(m.assignment.topic_partitions if m.assignment else ()),
        target_assignment=None if target is None else _keys(target.topic_partitions),
    )


def _keys(tps: Iterable[Any]) -> tuple[TopicPartitionKey, ...]:
    return tuple(sorted((tp.topic, tp.partition) for tp in tps))


def _map_stats(metadata: str | None, committed: int | None) -> tuple[int, int, str | None]:
    """(bytes, finished offsets listed, why it is no map) of a committed offset's metadata."""
    text = (metadata or "").rstrip("\x00")
    if not text or committed is None:
        return 0, 0, None
    found = decode_finished(text, committed)
    if isinstance(found, FinishedMap):
        return len(text) + 1, found.count, None
    return len(text) + 1, 0, found.reason


def _committed_with_metadata(
    admin: AdminClient, group_id: str, keys: Sequence[TopicPartitionKey], deadline: _Deadline
) -> dict[TopicPartitionKey, tuple[int | None, str | None]]:
    """Committed offset and metadata of each of ``keys`` (None, None: nothing committed)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    if not keys:
        return {}
    asked = [TopicPartition(t, p) for t, p in keys]
    config = getattr(admin, "weir_client_config", None)
    if config is not None:
        found = _committed_partitions(config, group_id, asked, deadline)
    else:
        future = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group_id, asked)], request_timeout=deadline.remaining()
        )[group_id]
        found = _result(future, deadline, ("group", group_id)).topic_partitions or []
    out: dict[TopicPartitionKey, tuple[int | None, str | None]] = {}
    for tp in found:
        if tp.error is not None:
            raise LagError(f"committed offset of {tp.topic}[{tp.partition}]: {tp.error}")
        if tp.offset >= 0:
            out[(tp.topic, tp.partition)] = (tp.offset, tp.metadata or None)
        else:
            out[(tp.topic, tp.partition)] = (None, None)
    return out


# --- the members check ----------------------------------------------------------------------------


def require_empty(admin: AdminClient, group_id: str, doing: str, *, timeout: float = 10.0) -> None:
    """``GroupActiveError`` naming the members when ``group_id`` has any; ``doing`` says what
    waits for them to stop ("reset its offsets")."""
    _require_empty(admin, group_id, doing, _Deadline(timeout, admin))


def _require_empty(admin: AdminClient, group_id: str, doing: str, deadline: _Deadline) -> None:
    members = _members(admin, group_id, deadline)
    if members:
        raise GroupActiveError(_active_message(group_id, doing, members), members)


def _members(
    admin: AdminClient, group_id: str, deadline: _Deadline
) -> tuple[tuple[str, str, str], ...]:
    """(member id, client id, host) of each member; none for a group Kafka does not know (a
    reset may give a new group its first offsets)."""
    try:
        description = _describe(admin, [group_id], deadline)[group_id]
    except GroupNotFoundError:
        return ()
    return tuple((m.member_id, m.client_id, m.host) for m in description.members)


def _active_message(group_id: str, doing: str, members: Sequence[tuple[str, str, str]]) -> str:
    named = "; ".join(
        f"member {member} (client id {client}, host {host.lstrip('/')})"
        for member, client, host in members
    )
    one = len(members) == 1
    return (
        f"group {group_id!r} has {len(members)} active member{'' if one else 's'}: "
        f"{named}. Stop {'it' if one else 'them'}, then {doing}"
    )


# --- reset plans ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResetTarget:
    """Where a reset moves each partition: make one with a class method."""

    kind: Literal["earliest", "latest", "datetime", "offset", "shift", "offsets"]
    offset: int = 0
    when: dt.datetime | None = None

    @classmethod
    def earliest(cls) -> ResetTarget:
        """Each partition's log start."""
        return cls("earliest")

    @classmethod
    def latest(cls) -> ResetTarget:
        """Each partition's log end: the records there now are never handled."""
        return cls("latest")

    @classmethod
    def at_offset(cls, offset: int) -> ResetTarget:
        """The same ``offset`` in every partition, clamped to the log; a ValueError for one
        that is not an int of 0 or more."""
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"an offset must be an int of 0 or more, got {offset!r}")
        return cls("offset", offset=offset)

    @classmethod
    def shift_by(cls, delta: int) -> ResetTarget:
        """Each partition's committed offset moved by ``delta`` (negative: back), clamped to the
        log; planning refuses a partition with nothing committed. A ValueError for a non-int."""
        if isinstance(delta, bool) or not isinstance(delta, int):
            raise ValueError(f"a shift must be an int, got {delta!r}")
        return cls("shift", offset=delta)

    @classmethod
    def at_time(cls, when: dt.datetime) -> ResetTarget:
        """The first record whose timestamp is at or after ``when`` (aware, or read as UTC)."""
        if not isinstance(when, dt.datetime):
            raise ValueError(f"a time must be a datetime, got {when!r}")
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.timezone.utc)
        return cls("datetime", when=when)

    def describe(self) -> str:
        """The target in words, as a plan's ``target`` and the CLI say it."""
        if self.kind == "offset":
            return f"offset {self.offset}"
        if self.kind == "shift":
            return f"shift by {self.offset:+d}"
        if self.kind == "datetime":
            assert self.when is not None
            return f"the first record at or after {self.when.isoformat()}"
        if self.kind == "offsets":
            return "the offsets given per partition"
        return f"the {self.kind} offset"


@dataclass(frozen=True)
class PlannedOffset:
    """One partition's move. ``current`` is None when the group committed nothing there.
    ``reread`` counts offsets already handled that will be handled again (those between the
    new and the current offset, and on a rewind those a dropped map listed as finished);
    ``skipped`` the offsets not yet handled that will never be (None when nothing was committed).
    They count offsets: records, on a topic without compaction or transaction markers.
    ``note`` says what was clamped or assumed. ``new`` is None only in a restore, where the
    group had committed nothing: the partition's offset is deleted."""

    topic: str
    partition: int
    current: int | None
    current_metadata: str | None
    new: int | None
    new_metadata: str | None
    log_start: int | None
    log_end: int | None
    reread: int | None
    skipped: int | None
    map_change: str
    note: str | None

    @property
    def changes(self) -> bool:
        """Whether the new offset or its metadata differs from the committed one."""
        return self.new != self.current or self.new_metadata != self.current_metadata


@dataclass(frozen=True)
class ResetPlan:
    """A reset or restore of ``group_id``'s offsets, planned and not done: ``target`` in words,
    each partition's move, and the group's members as (member id, client id, host), which
    ``execute_reset`` refuses to run with."""

    group_id: str
    target: str
    partitions: tuple[PlannedOffset, ...]
    members: tuple[tuple[str, str, str], ...]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready view with stable keys (what ``weir offsets reset --json`` prints)."""
        return {
            "group": self.group_id,
            "target": self.target,
            "active_members": [
                {"member_id": m, "client_id": c, "host": h} for m, c, h in self.members
            ],
            "partitions": [
                {
                    "topic": p.topic,
                    "partition": p.partition,
                    "current": p.current,
                    "new": p.new,
                    "log_start": p.log_start,
                    "log_end": p.log_end,
                    "reread": p.reread,
                    "skipped": p.skipped,
                    "map": p.map_change,
                    "note": p.note,
                }
                for p in self.partitions
            ],
        }


def plan_reset(
    admin: AdminClient,
    group_id: str,
    topic: str,
    target: ResetTarget,
    *,
    partitions: Sequence[int] | None = None,
    timeout: float = 10.0,
) -> ResetPlan:
    """Where each partition of ``topic`` (or of ``partitions`` of it) would move; changes nothing.
    An offset before the log start or past the log end is clamped, and the partition's ``note``
    says so. The plan lists the group's members, if any: ``execute_reset`` refuses then."""
    deadline = _Deadline(timeout, admin)
    members = _members(admin, group_id, deadline)
    keys = _chosen_partitions(admin, topic, partitions, deadline)
    resolved: dict[TopicPartitionKey, int | None] = {}
    if target.kind == "datetime":
        from confluent_kafka.admin import OffsetSpec

        assert target.when is not None
        millis = int(target.when.timestamp() * 1000)
        spec = OffsetSpec.for_timestamp(millis)
        resolved = _log_offsets(admin, keys, spec, deadline)
    return _plan_keys(admin, group_id, keys, target, resolved, members, deadline)


def plan_offsets(
    admin: AdminClient,
    group_id: str,
    offsets: Mapping[TopicPartitionKey, int],
    *,
    timeout: float = 10.0,
) -> ResetPlan:
    """A reset of each partition of ``offsets`` to its own offset (what Kafka's tool reads from
    a ``topic,partition,offset`` file), clamped and with the offset map handled as any reset's;
    changes nothing."""
    deadline = _Deadline(timeout, admin)
    members = _members(admin, group_id, deadline)
    keys = sorted(offsets)
    for topic in sorted({t for t, _ in keys}):
        _chosen_partitions(admin, topic, [p for t, p in keys if t == topic], deadline)
    target = ResetTarget("offsets")
    return _plan_keys(admin, group_id, keys, target, dict(offsets), members, deadline)


def _plan_keys(
    admin: AdminClient,
    group_id: str,
    keys: list[TopicPartitionKey],
    target: ResetTarget,
    resolved: Mapping[TopicPartitionKey, int | None],
    members: tuple[tuple[str, str, str], ...],
    deadline: _Deadline,
) -> ResetPlan:
    current = _committed_with_metadata(admin, group_id, keys, deadline)
    starts = _log_offsets(admin, keys, _offset_spec("earliest"), deadline)
    ends = _log_offsets(admin, keys, _offset_spec("latest"), deadline)
    rows = []
    for key in keys:
        start, end = starts.get(key), ends.get(key)
        if start is None or end is None:
            raise OffsetsError(
                f"{key[0]}[{key[1]}]: its leader did not answer for the log start and end; "
                "try again"
            )
        offset, metadata = current.get(key, (None, None))
        new, note = _new_offset(target, key, offset, start, end, resolved.get(key))
        rows.append(_planned(key, offset, metadata, new, start, end, note))
    return ResetPlan(group_id, target.describe(), tuple(rows), members)


def _chosen_partitions(
    admin: AdminClient, topic: str, partitions: Sequence[int] | None, deadline: _Deadline
) -> list[TopicPartitionKey]:
    every = _partitions(admin, [topic], deadline)[topic]
    if partitions is None:
        return every
    known = {p for _, p in every}
    missing = sorted(set(partitions) - known)
    if missing:
        raise OffsetsError(
            f"topic {topic!r} has no partition {', '.join(map(str, missing))} "
            f"(it has {len(every)}: 0 to {len(every) - 1})"
        )
    return [(topic, p) for p in sorted(set(partitions))]


def _new_offset(
    target: ResetTarget,
    key: TopicPartitionKey,
    current: int | None,
    start: int,
    end: int,
    resolved: int | None,
) -> tuple[int, str | None]:
    """The new offset, and a note; ``resolved`` is the partition's offset for the time, or the
    one given for it."""
    if target.kind == "earliest":
        return start, None
    if target.kind == "latest":
        return end, None
    if target.kind == "offsets":
        assert resolved is not None
        return _clamped(resolved, start, end)
    if target.kind == "datetime":
        if resolved is None:
            raise OffsetsError(f"{key[0]}[{key[1]}]: the broker did not resolve the time")
        if resolved < 0:
            return end, "no record at or after that time: the log end"
        return _clamped(resolved, start, end)
    if target.kind == "offset":
        return _clamped(target.offset, start, end)
    if current is None:
        raise OffsetsError(
            f"{key[0]}[{key[1]}]: the group committed no offset there to shift from; "
            "reset it with --to-earliest, --to-latest, --to-datetime or --to-offset"
        )
    return _clamped(current + target.offset, start, end)


def _clamped(wanted: int, start: int, end: int) -> tuple[int, str | None]:
    if wanted < start:
        return start, f"clamped: {wanted} is before the log start {start}"
    if wanted > end:
        return end, f"clamped: {wanted} is past the log end {end}"
    return wanted, None


def _planned(
    key: TopicPartitionKey,
    current: int | None,
    metadata: str | None,
    new: int,
    start: int | None,
    end: int | None,
    note: str | None,
) -> PlannedOffset:
    found = None if current is None or not metadata else decode_finished(metadata, current)
    old_map = found if isinstance(found, FinishedMap) else None
    reread: int | None = None
    skipped: int | None = None
    if current is None:
        new_metadata, change = None, "none"
    elif new == current:
        new_metadata, change = metadata, "kept" if metadata else "none"
        reread, skipped = 0, 0
    elif new < current:
        new_metadata = None
        change = f"dropped ({old_map.count} finished)" if old_map is not None else "none"
        reread = current - new + (old_map.count if old_map is not None else 0)
        skipped = 0
    else:
        new_metadata, kept = _rebased(old_map, new)
        if old_map is None:
            change = "none"
        else:
            change = f"rebased ({kept} finished)" if kept else "dropped (none above the new offset)"
        handled_between = 0 if old_map is None else old_map.flags[: new - current].count(1)
        reread, skipped = 0, new - current - handled_between
    if found is not None and old_map is None and new != current:
        change = "dropped (no map for the offset)"
    return PlannedOffset(
        topic=key[0],
        partition=key[1],
        current=current,
        current_metadata=metadata,
        new=new,
        new_metadata=new_metadata,
        log_start=start,
        log_end=end,
        reread=reread,
        skipped=skipped,
        map_change=change,
        note=note,
    )


def _rebased(old: FinishedMap | None, new: int) -> tuple[str | None, int]:
    """The part of ``old`` at and above ``new``, as a map for ``new`` (None when it lists
    nothing there), and how many finished offsets it lists."""
    if old is None:
        return None, 0
    rest = old.flags[new - old.base :]
    if 1 not in rest:
        return None, 0
    encoded = encode_finished(new, rest)
    return encoded.text, rest[: encoded.covered].count(1)


# --- saved offsets and restore --------------------------------------------------------------------


@dataclass(frozen=True)
class SavedOffset:
    """A partition's committed offset and metadata as a reset found them (offset None: nothing
    was committed)."""

    topic: str
    partition: int
    offset: int | None
    metadata: str | None


def write_saved_offsets(path: Path, plan: ResetPlan) -> None:
    """The offsets and metadata ``plan`` replaces, to ``path`` (never over an existing file),
    for ``plan_restore``."""
    data = {
        "format": SAVED_FORMAT,
        "group": plan.group_id,
        "saved_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "reset_to": plan.target,
        "partitions": [
            {
                "topic": p.topic,
                "partition": p.partition,
                "offset": p.current,
                "metadata": p.current_metadata,
            }
            for p in plan.partitions
        ],
    }
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise OffsetsError(f"{path} exists: the saved offsets go to a new file") from None
    except OSError as exc:
        raise OffsetsError(f"cannot write {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_offsets_csv(text: str, name: str = "the file") -> dict[TopicPartitionKey, int]:
    """``topic,partition,offset`` lines (Kafka's reset file; blank lines and ``#`` comments
    skipped) as a mapping for ``plan_offsets``."""
    offsets: dict[TopicPartitionKey, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        cells = [c.strip() for c in line.split(",")]
        try:
            topic, partition, offset = cells[0], int(cells[1]), int(cells[2])
        except (ValueError, IndexError):
            topic, partition, offset = "", -1, -1
        if len(cells) != 3 or not topic or partition < 0 or offset < 0:
            raise OffsetsError(
                f"{name} line {number}: expected topic,partition,offset, got {line!r}"
            )
        if (topic, partition) in offsets:
            raise OffsetsError(f"{name} line {number}: {topic}[{partition}] is listed twice")
        offsets[(topic, partition)] = offset
    if not offsets:
        raise OffsetsError(f"{name} lists no topic,partition,offset")
    return offsets


def read_saved_offsets(path: Path) -> tuple[str, list[SavedOffset]]:
    """The group and offsets ``write_saved_offsets`` wrote to ``path``."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise OffsetsError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise OffsetsError(f"{path} is not JSON: {exc}") from None
    problem = "not a saved-offsets file of weir"
    if not isinstance(data, dict) or data.get("format") != SAVED_FORMAT:
        raise OffsetsError(f'{path}: {problem} (no "format": "{SAVED_FORMAT}")')
    group, rows = data.get("group"), data.get("partitions")
    if not isinstance(group, str) or not isinstance(rows, list):
        raise OffsetsError(f"{path}: {problem} (group or partitions missing)")
    saved = []
    for index, row in enumerate(rows):
        ok = (
            isinstance(row, dict)
            and isinstance(row.get("topic"), str)
            and type(row.get("partition")) is int
            and row["partition"] >= 0
            and (row.get("offset") is None or (type(row["offset"]) is int and row["offset"] >= 0))
            and (row.get("metadata") is None or isinstance(row["metadata"], str))
        )
        if not ok:
            raise OffsetsError(f"{path}: partition entry {index} is not topic, partition, offset")
        saved.append(SavedOffset(row["topic"], row["partition"], row["offset"], row["metadata"]))
    return group, saved


def plan_restore(
    admin: AdminClient,
    group_id: str,
    saved: Sequence[SavedOffset],
    *,
    timeout: float = 10.0,
) -> ResetPlan:
    """A plan that writes ``saved`` back exactly: offsets and metadata. A partition saved
    without an offset (the group had committed nothing there) gets none again: its committed
    offset is deleted (Kafka's OffsetDelete)."""
    deadline = _Deadline(timeout, admin)
    members = _members(admin, group_id, deadline)
    keys = [(s.topic, s.partition) for s in saved]
    for topic in sorted({t for t, _ in keys}):
        _chosen_partitions(admin, topic, [p for t, p in keys if t == topic], deadline)
    current = _committed_with_metadata(admin, group_id, keys, deadline)
    starts = _log_offsets(admin, keys, _offset_spec("earliest"), deadline)
    ends = _log_offsets(admin, keys, _offset_spec("latest"), deadline)
    rows = []
    for s in saved:
        key = (s.topic, s.partition)
        offset, metadata = current.get(key, (None, None))
        start, end = starts.get(key), ends.get(key)
        note = None
        if s.offset is None:
            note = "nothing was committed: the offset is deleted" if offset is not None else None
        elif start is not None and s.offset < start:
            note = f"the saved offset is before the log start {start} now"
        elif end is not None and s.offset > end:
            note = f"the saved offset is past the log end {end}"
        reread, skipped = _restore_counts(offset, metadata, s.offset, s.metadata)
        change = "restored" if s.metadata else "none"
        rows.append(
            PlannedOffset(
                topic=s.topic,
                partition=s.partition,
                current=offset,
                current_metadata=metadata,
                new=s.offset,
                new_metadata=s.metadata,
                log_start=start,
                log_end=end,
                reread=reread,
                skipped=skipped,
                map_change=change,
                note=note,
            )
        )
    return ResetPlan(group_id, "the saved offsets", tuple(rows), members)


def _restore_counts(
    current: int | None, metadata: str | None, saved: int | None, saved_metadata: str | None
) -> tuple[int | None, int | None]:
    """(re-read, skipped) of a move from ``current`` back to ``saved``: the maps on either side
    say which offsets between the two were handled already."""
    if current is None or saved is None:
        return None, None
    if saved <= current:
        restored = decode_finished(saved_metadata, saved) if saved_metadata else None
        handled = (
            restored.flags[: current - saved].count(1) if isinstance(restored, FinishedMap) else 0
        )
        return current - saved - handled, 0
    found = decode_finished(metadata, current) if metadata else None
    handled = found.flags[: saved - current].count(1) if isinstance(found, FinishedMap) else 0
    return 0, saved - current - handled


def execute_reset(admin: AdminClient, plan: ResetPlan, *, timeout: float = 10.0) -> None:
    """Commit ``plan``'s new offsets and metadata for its group, after checking again that the
    group has no members (``GroupActiveError``). Save the old ones first with
    ``write_saved_offsets`` to be able to undo it."""
    from confluent_kafka import TopicPartition

    deadline = _Deadline(timeout, admin)
    _require_empty(admin, plan.group_id, "reset its offsets", deadline)
    # The client takes no None for metadata; without it the commit carries none.
    offsets = [
        TopicPartition(p.topic, p.partition, p.new)
        if p.new_metadata is None
        else TopicPartition(p.topic, p.partition, p.new, metadata=p.new_metadata)
        for p in plan.partitions
        if p.new is not None
    ]
    deleted = [
        (p.topic, p.partition) for p in plan.partitions if p.new is None and p.current is not None
    ]
    if deleted:
        _delete_committed(admin, plan.group_id, deleted, deadline)
    if offsets:
        _alter(admin, plan.group_id, offsets, deadline)
    log.info(
        "group_offsets_reset",
        group=plan.group_id,
        to=plan.target,
        offsets={f"{p.topic}[{p.partition}]": [p.current, p.new] for p in plan.partitions},
    )


def _alter(admin: AdminClient, group_id: str, offsets: list[Any], deadline: _Deadline) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions

    future = admin.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group_id, offsets)],
        request_timeout=deadline.remaining(),
    )[group_id]
    try:
        done = _result(future, deadline, ("group", group_id), asking=_COMMIT)
    except LagError as exc:
        raise _refused(group_id, "reset", exc) from exc
    refused = [tp for tp in done.topic_partitions or () if tp.error is not None]
    for tp in refused:
        # The broker answers an ACL refusal of the commit per partition.
        code = tp.error.name()
        denied = denied_of(code, _COMMIT[0], group=group_id, topic=tp.topic)
        if denied is not None:
            raise authorization_error(denied, tp.error.str(), _COMMIT[1])
    if refused:
        failed = "; ".join(
            f"{tp.topic}[{tp.partition}]: {tp.error.name()}: {tp.error.str()}" for tp in refused
        )
        raise _refused(group_id, "reset", OffsetsError(failed))


def _delete_committed(
    admin: AdminClient, group_id: str, keys: list[TopicPartitionKey], deadline: _Deadline
) -> None:
    from weir._offset_delete import delete_offsets

    config = getattr(admin, "weir_client_config", None)
    if config is None:
        raise OffsetsError("deleting offsets needs an admin client from weir.lag.admin_client")
    try:
        delete_offsets(config, group_id, keys, deadline.remaining())
    except LagError as exc:
        raise _refused(group_id, "offsets deletion", exc) from exc


def _refused(group_id: str, what: str, exc: LagError) -> LagError:
    text = str(exc)
    if any(
        code in text
        for code in ("UNKNOWN_MEMBER_ID", "GROUP_NOT_EMPTY", "GROUP_SUBSCRIBED_TO_TOPIC")
    ):
        return GroupActiveError(
            f"group {group_id!r} has active members (they joined after the check): "
            f"the broker refused the {what}; stop them and try again"
        )
    return OffsetsError(f"the broker refused the {what} of group {group_id!r}: {text}")


# --- deleting ------------------------------------------------------------------------------------


def delete_group(admin: AdminClient, group_id: str, *, timeout: float = 10.0) -> None:
    """Delete ``group_id`` and its committed offsets; refused while it has members."""
    deadline = _Deadline(timeout, admin)
    _require_empty(admin, group_id, "delete it", deadline)
    future = admin.delete_consumer_groups([group_id], request_timeout=deadline.remaining())[
        group_id
    ]
    try:
        _result(future, deadline, ("group", group_id), asking=_DELETE)
    except LagError as exc:
        if "GROUP_ID_NOT_FOUND" in str(exc):
            raise GroupNotFoundError(f"group {group_id!r} does not exist") from exc
        raise _refused(group_id, "deletion", exc) from exc
    log.info("group_deleted", group=group_id)


def delete_group_offsets(
    admin: AdminClient, group_id: str, topic: str, *, timeout: float = 10.0
) -> list[TopicPartitionKey]:
    """Delete ``group_id``'s committed offsets of every partition of ``topic``; refused while
    the group has members. Returns the partitions that had an offset."""
    deadline = _Deadline(timeout, admin)
    _require_empty(admin, group_id, "delete its offsets", deadline)
    keys = _partitions(admin, [topic], deadline)[topic]
    had = [
        k
        for k, (o, _) in _committed_with_metadata(admin, group_id, keys, deadline).items()
        if o is not None
    ]
    if not had:
        return []
    _delete_committed(admin, group_id, had, deadline)
    log.info("group_offsets_deleted", group=group_id, topic=topic, partitions=[p for _, p in had])
    return had
