"""`weir dlq show` and `weir dlq redrive`: a dead-letter topic's failures as a table, and the
dead letters sent back (weir.deadletters does the work)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from weir._cli.cluster import add_cluster_arguments, cluster_error_message
from weir._cli.console import number, table_console
from weir._cli.tail import (
    NULL,
    add_count_argument,
    add_partition_argument,
    add_start_arguments,
    client_config,
    open_reader,
    partition_number,
    start_of,
)
from weir._reading import Position

if TYPE_CHECKING:
    from weir.cli import SubParsers
    from weir.deadletters import DeadLetter, RedrivePlan, Selection

# The longest error shown in a table cell; --json has it whole.
ERROR_CHARS = 120


def register(commands: SubParsers) -> None:
    dlq = commands.add_parser(
        "dlq",
        help="show a dead-letter topic's failures, and send dead letters back",
        description="Dead letters weir wrote (docs/failures.md): where each came from and why "
        "it failed; and a redrive that sends selected ones back, once.",
    )
    actions = dlq.add_subparsers(dest="action", required=True, metavar="ACTION")

    show = actions.add_parser(
        "show",
        help="the dead letters as a table: source, attempts, error, time",
        description="Read a dead-letter topic (read_committed, up to its end) and show weir's "
        "failure headers of each dead letter.",
    )
    show.add_argument("topic", help="the dead-letter topic (e.g. orders.dlq)")
    add_start_arguments(show, default="the beginning")
    add_partition_argument(show)
    add_count_argument(show)
    add_cluster_arguments(show)
    show.set_defaults(handler=_show)

    redrive = actions.add_parser(
        "redrive",
        help="send dead letters back to their source topic (a dry run without --execute)",
        description="Send the selected dead letters (all by default) back to the topic they "
        "came from, in their own partition, or to --to. Each carries the header "
        "weir.redriven-from: <dead-letter topic>/<partition>/<offset>, and a dead letter whose "
        "redrive is in the target topic already is not sent again. Without --execute, only "
        "shows what would be sent.",
    )
    redrive.add_argument("topic", help="the dead-letter topic (e.g. orders.dlq)")
    picked = redrive.add_argument_group("selection (every one given must match)")
    picked.add_argument("--source-topic", metavar="TOPIC", help="dead letters of this topic")
    picked.add_argument(
        "--source-partition",
        action="append",
        type=partition_number,
        metavar="P",
        help="dead letters of this source partition, repeatable",
    )
    picked.add_argument(
        "--offset-range",
        type=_offset_range,
        metavar="FIRST-LAST",
        help="source offsets from FIRST to LAST, both included (FIRST- : no end)",
    )
    picked.add_argument(
        "--error-contains",
        metavar="TEXT",
        help="whose error (exception type or message) contains TEXT, any case",
    )
    redrive.add_argument(
        "--to", metavar="TOPIC", help="send to this topic instead (the key picks the partition)"
    )
    redrive.add_argument(
        "--execute", action="store_true", help="send them (without it: a dry run, nothing sent)"
    )
    add_cluster_arguments(redrive)
    redrive.set_defaults(handler=_redrive)


# --- weir dlq show ------------------------------------------------------------------------------


def _show(args: argparse.Namespace) -> int:
    from weir.deadletters import DeadLetter
    from weir.errors import WeirError

    try:
        with open_reader(
            args, args.topic, start_of(args, Position("beginning")), "read_committed"
        ) as reader:
            letters = [
                DeadLetter.of(msg) for msg in reader.messages(follow=False, count=args.count)
            ]
    except WeirError as exc:
        print(f"weir: {cluster_error_message(exc, args)}", file=sys.stderr)
        return 1
    if args.json:
        for letter in letters:
            print(json.dumps(letter_as_dict(letter)))
        return 0
    _print_letters(letters, args.topic)
    return 0


def letter_as_dict(letter: DeadLetter) -> dict[str, Any]:
    return {
        "partition": letter.partition,
        "offset": letter.offset,
        "timestamp": letter.timestamp_ms,
        "key": _text(letter.key),
        "source_topic": letter.source_topic,
        "source_partition": letter.source_partition,
        "source_offset": letter.source_offset,
        "attempts": letter.attempts,
        "exception": letter.exception,
        "message": letter.message,
        "group": letter.group,
        "failed_at": letter.failed_at_ms,
        "weir": letter.is_weir,
    }


def _print_letters(letters: list[DeadLetter], topic: str) -> None:
    from rich.table import Table

    console = table_console()
    if not letters:
        console.print(f"no dead letters in {topic} (from the position asked)")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("DLQ", no_wrap=True)
    table.add_column("SOURCE", no_wrap=True)
    table.add_column("ATTEMPTS", justify="right")
    table.add_column("FAILED AT", no_wrap=True)
    table.add_column("KEY", overflow="fold")
    table.add_column("ERROR", overflow="fold")
    for letter in letters:
        source = (
            f"{letter.source_topic}[{letter.source_partition}]@{letter.source_offset}"
            if letter.is_weir
            else "- (no weir.dlq headers)"
        )
        error = letter.error
        if len(error) > ERROR_CHARS:
            error = error[: ERROR_CHARS - 1] + "…"
        table.add_row(
            f"{letter.partition}@{letter.offset}",
            source,
            number(letter.attempts),
            _when(letter.failed_at_ms),
            _text(letter.key) or NULL,
            error or "-",
        )
    console.print(table)
    console.print(f"{_count(len(letters), 'dead letter')} in {topic}")


# --- weir dlq redrive ---------------------------------------------------------------------------


def _redrive(args: argparse.Namespace) -> int:
    from weir.deadletters import plan_redrive, redrive
    from weir.errors import WeirError

    selection = _selection(args)
    config = client_config(args)
    try:
        if args.execute:
            plan = redrive(config, args.topic, selection, to=args.to, timeout=args.timeout)
        else:
            plan = plan_redrive(config, args.topic, selection, to=args.to, timeout=args.timeout)
    except WeirError as exc:
        print(f"weir: {cluster_error_message(exc, args)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(_plan_as_dict(plan, args.execute)))
    else:
        _print_plan(plan, args.execute)
    return 0


def _selection(args: argparse.Namespace) -> Selection:
    from weir.deadletters import Selection

    first, last = args.offset_range or (None, None)
    return Selection(
        source_topic=args.source_topic,
        source_partitions=None
        if args.source_partition is None
        else frozenset(args.source_partition),
        first_offset=first,
        last_offset=last,
        error_contains=args.error_contains,
    )


def _status(already: bool, executed: bool) -> str:
    if already:
        return "already redriven"
    return "sent" if executed else "would send"


def _plan_as_dict(plan: RedrivePlan, executed: bool) -> dict[str, Any]:
    return {
        "dead_letter_topic": plan.dead_letter_topic,
        "executed": executed,
        "sent" if executed else "to_send": len(plan.to_send),
        "already_redriven": len(plan.already_sent),
        "not_weir": plan.not_weir,
        "items": [
            {
                "partition": item.letter.partition,
                "offset": item.letter.offset,
                "source_topic": item.letter.source_topic,
                "source_partition": item.letter.source_partition,
                "source_offset": item.letter.source_offset,
                "target_topic": item.target_topic,
                "target_partition": item.target_partition,
                "status": _status(item.already, executed),
            }
            for item in plan.items
        ],
    }


def _print_plan(plan: RedrivePlan, executed: bool) -> None:
    from rich.table import Table

    console = table_console()
    if plan.items:
        table = Table(box=None, pad_edge=False, header_style="bold")
        for name in ("DLQ", "SOURCE", "TO", "ERROR", "STATUS"):
            table.add_column(name, overflow="fold", no_wrap=name != "ERROR")
        for item in plan.items:
            letter = item.letter
            target = item.target_topic + (
                "" if item.target_partition is None else f"[{item.target_partition}]"
            )
            table.add_row(
                f"{letter.partition}@{letter.offset}",
                f"{letter.source_topic}[{letter.source_partition}]@{letter.source_offset}",
                target,
                letter.error[:ERROR_CHARS] or "-",
                _status(item.already, executed),
            )
        console.print(table)
    sending, already = len(plan.to_send), len(plan.already_sent)
    skipped = f"; {already} redriven before, left out" if already else ""
    if plan.not_weir:
        skipped += f"; {_count(plan.not_weir, 'record')} without weir.dlq headers, never redriven"
    if not plan.items:
        console.print(f"no dead letters of {plan.dead_letter_topic} selected{skipped}")
    elif executed:
        console.print(f"sent {_count(sending, 'dead letter')} of {plan.dead_letter_topic}{skipped}")
    else:
        console.print(
            f"dry run: would send {_count(sending, 'dead letter')} of {plan.dead_letter_topic}"
            f"{skipped}; "
            "nothing sent (add --execute)"
        )


def _offset_range(text: str) -> tuple[int, int | None]:
    first, sep, last = text.partition("-")
    try:
        if not sep:
            raise ValueError
        start = int(first)
        end = int(last) if last.strip() else None
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected FIRST-LAST or FIRST- (source offsets), got {text!r}"
        ) from None
    if start < 0 or (end is not None and end < start):
        raise argparse.ArgumentTypeError(
            f"expected offsets of 0 or more with FIRST not past LAST, got {text!r}"
        )
    return start, end


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="backslashreplace")


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    when = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")
