"""`weir offsets reset` and `weir offsets delete`: move or remove a group's committed offsets
(weir.admin does the work; this parses, prints and saves)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weir._cli.cluster import add_cluster_arguments, on_cluster
from weir._cli.console import number, table_console
from weir._cli.usage import UsageError, add_group_argument

if TYPE_CHECKING:
    from weir.admin import ResetPlan, ResetTarget, SavedOffset
    from weir.cli import SubParsers

_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


def register_offsets(commands: SubParsers) -> None:
    offsets = commands.add_parser(
        "offsets",
        help="reset or delete a consumer group's committed offsets",
        description="Move a group's committed offsets (a dry run unless --execute), or delete "
        "them for one topic. Both need the group to have no members.",
    )
    actions = offsets.add_subparsers(dest="action", required=True, metavar="ACTION")
    reset = actions.add_parser(
        "reset",
        help="move a group's committed offsets on a topic (dry run unless --execute)",
        description="Print where each partition's committed offset would move, and the "
        "records that would be read again or skipped; with --execute, save the current offsets "
        "(and their offset maps) to a file and commit the new ones. Undo with --from-file. "
        "Refused while the group has members.",
    )
    add_group_argument(reset)
    reset.add_argument(
        "--topic",
        "-t",
        type=topic_partitions,
        metavar="TOPIC[:P,...]",
        help="the topic, all its partitions or those listed (with --from-file: what the file "
        "may name)",
    )
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the log start")
    to.add_argument("--to-latest", action="store_true", help="the log end")
    to.add_argument(
        "--to-datetime",
        type=aware_time,
        metavar="ISO",
        help="the first record at or after this time, e.g. 2026-12-03T09:30:00Z",
    )
    to.add_argument("--to-offset", type=offset_number, metavar="N", help="offset N")
    to.add_argument(
        "--shift-by", type=shift_number, metavar="±N", help="N records on (+) or back (-)"
    )
    to.add_argument(
        "--from-file",
        type=Path,
        metavar="FILE",
        help="the offsets and maps a reset saved (undoes it exactly), or topic,partition,offset "
        "lines as Kafka's tool reads them",
    )
    reset.add_argument(
        "--execute", action="store_true", help="change the offsets (default: only print the plan)"
    )
    reset.add_argument(
        "--save",
        type=Path,
        metavar="FILE",
        help="where --execute saves the current offsets (default: "
        "weir-offsets-GROUP-<UTC time>.json here; never over an existing file)",
    )
    add_cluster_arguments(reset)
    reset.set_defaults(handler=_reset, offsets_parser=reset)

    delete = actions.add_parser(
        "delete",
        help="delete a group's committed offsets of one topic",
        description="Delete the group's committed offsets of every partition of the topic "
        "(Kafka's OffsetDelete). Refused while the group has members.",
    )
    add_group_argument(delete)
    delete.add_argument("--topic", "-t", required=True, type=topic_name, help="the topic")
    add_cluster_arguments(delete)
    delete.set_defaults(handler=_delete)


# --- argument types -----------------------------------------------------------------------------


def topic_name(text: str) -> str:
    if not _TOPIC.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is no topic name (letters, digits, '.', '_', '-')"
        )
    return text


def topic_partitions(text: str) -> tuple[str, list[int] | None]:
    topic, sep, listed = text.partition(":")
    topic_name(topic)
    if not sep:
        return topic, None
    try:
        partitions = [int(p) for p in listed.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected TOPIC or TOPIC:P,P,... with partition numbers, got {text!r}"
        ) from None
    if any(p < 0 for p in partitions):
        raise argparse.ArgumentTypeError(f"a partition number is 0 or more, got {text!r}")
    return topic, partitions


def aware_time(text: str) -> dt.datetime:
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time such as 2026-12-03T09:30:00Z, got {text!r}"
        ) from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no time zone: add Z for UTC, or an offset such as +01:00"
        )
    return when


def offset_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an offset, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"an offset is 0 or more, got {text!r}")
    return value


def shift_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number such as -100 or +5, got {text!r}"
        ) from None


def _target(args: argparse.Namespace) -> ResetTarget:
    from weir.admin import ResetTarget

    if args.to_earliest:
        return ResetTarget.earliest()
    if args.to_latest:
        return ResetTarget.latest()
    if args.to_datetime is not None:
        return ResetTarget.at_time(args.to_datetime)
    if args.to_offset is not None:
        return ResetTarget.at_offset(args.to_offset)
    return ResetTarget.shift_by(args.shift_by)


# --- weir offsets reset --------------------------------------------------------------------------


def _reset(args: argparse.Namespace) -> int:

    parser: argparse.ArgumentParser = args.offsets_parser
    if args.from_file is None and args.topic is None:
        parser.error("the topic is needed: --topic TOPIC[:P,...]")
    if args.save is not None and not args.execute:
        parser.error("--save is where --execute saves the offsets: add --execute")
    saved = None if args.from_file is None else _read_file(args)
    return on_cluster(args, lambda admin: _reset_with(admin, args, saved))


def _read_file(args: argparse.Namespace) -> list[SavedOffset] | dict[tuple[str, int], int]:
    """The file's offsets, read before any client is made (its problems are the caller's): a
    file a reset saved (JSON, restored exactly), or Kafka's topic,partition,offset lines (each
    partition reset to its offset). --topic, if given, must hold every partition it names."""
    from weir.admin import OffsetsError, read_offsets_csv, read_saved_offsets

    path = args.from_file
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        if text.lstrip().startswith("{"):
            group, saved = read_saved_offsets(path)
            if group != args.group:
                raise UsageError(
                    f"{path} holds the offsets of group {group!r}, not of {args.group!r}"
                )
            named = [(s.topic, s.partition) for s in saved]
            found: list[SavedOffset] | dict[tuple[str, int], int] = saved
        else:
            found = read_offsets_csv(text, str(path))
            named = list(found)
    except OffsetsError as exc:
        raise UsageError(str(exc)) from None
    if args.topic is not None:
        topic, partitions = args.topic
        outside = [
            f"{t}[{p}]" for t, p in named if t != topic or (partitions and p not in partitions)
        ]
        if outside:
            raise UsageError(f"{path} names {', '.join(outside)}, outside --topic {topic}")
    return found


def _reset_with(
    admin: Any,
    args: argparse.Namespace,
    saved: list[SavedOffset] | dict[tuple[str, int], int] | None,
) -> int:
    from weir.admin import (
        execute_reset,
        plan_offsets,
        plan_reset,
        plan_restore,
        require_empty,
        write_saved_offsets,
    )

    if isinstance(saved, dict):
        plan = plan_offsets(admin, args.group, saved, timeout=args.timeout)
    elif saved is not None:
        plan = plan_restore(admin, args.group, saved, timeout=args.timeout)
    else:
        topic, partitions = args.topic
        plan = plan_reset(
            admin, args.group, topic, _target(args), partitions=partitions, timeout=args.timeout
        )
    changing = any(p.changes for p in plan.partitions)
    saved_to: Path | None = None
    if args.execute and changing:
        # Checked before the file is written (execute_reset checks again, just before it commits).
        require_empty(admin, args.group, "reset its offsets", timeout=args.timeout)
        saved_to = args.save or _default_save_path(args.group)
        write_saved_offsets(saved_to, plan)
        try:
            execute_reset(admin, plan, timeout=args.timeout)
        except Exception:
            print(
                f"weir: nothing was reset; the offsets saved to {saved_to} are the current ones",
                file=sys.stderr,
            )
            raise
    if args.json:
        data = plan.as_dict()
        data["executed"] = bool(args.execute and changing)
        data["saved_to"] = None if saved_to is None else str(saved_to)
        print(json.dumps(data))
        return 0
    _print_plan(plan, executed=args.execute, changing=changing)
    if saved_to is not None:
        print(
            f"saved the previous offsets and maps to {saved_to}; undo with: weir offsets reset "
            f"-g {args.group} --from-file {saved_to} --execute",
            file=sys.stderr,
        )
    return 0


def _default_save_path(group: str) -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", group)
    return Path(f"weir-offsets-{safe}-{stamp}.json")


def _print_plan(plan: ResetPlan, *, executed: bool, changing: bool) -> None:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    if not changing:
        status = "nothing to change"
    elif executed:
        status = "done"
    else:
        status = "dry run, nothing changed: add --execute to apply"
    heading = Text.assemble(
        ("group ", "dim"),
        (plan.group_id, "bold"),
        ("  to ", "dim"),
        plan.target,
        ("  ", "dim"),
        (status, "bold"),
    )
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in (
        "TOPIC",
        "PARTITION",
        "CURRENT",
        "NEW",
        "LOG START",
        "LOG END",
        "RE-READ",
        "SKIPPED",
    ):
        table.add_column(name, justify="left" if name == "TOPIC" else "right", no_wrap=True)
    table.add_column("MAP", no_wrap=True)
    table.add_column("NOTE", overflow="fold")
    for p in plan.partitions:
        table.add_row(
            p.topic,
            str(p.partition),
            number(p.current),
            number(p.new),
            number(p.log_start),
            number(p.log_end),
            number(p.reread),
            number(p.skipped),
            p.map_change,
            p.note or "",
        )
    parts: list[Any] = [heading, table]
    if plan.members and not executed:
        names = ", ".join(f"{m} ({c}, {h.lstrip('/')})" for m, c, h in plan.members)
        parts.append(
            Text(f"the group has active members, --execute is refused until they stop: {names}")
        )
    table_console().print(Group(*parts))


# --- weir offsets delete -------------------------------------------------------------------------


def _delete(args: argparse.Namespace) -> int:
    return on_cluster(args, lambda admin: _delete_with(admin, args))


def _delete_with(admin: Any, args: argparse.Namespace) -> int:
    from weir.admin import delete_group_offsets

    deleted = delete_group_offsets(admin, args.group, args.topic, timeout=args.timeout)
    if args.json:
        print(
            json.dumps(
                {"group": args.group, "topic": args.topic, "deleted": [p for _, p in deleted]}
            )
        )
    elif deleted:
        listed = ", ".join(str(p) for _, p in deleted)
        print(
            f"deleted the committed offsets of group {args.group!r} on {args.topic} "
            f"(partitions {listed})"
        )
    else:
        print(f"group {args.group!r} had no committed offsets on {args.topic}: nothing to delete")
    return 0
