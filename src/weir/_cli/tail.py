"""`weir tail`: a console consumer for looking at a topic while debugging. It assigns the
partitions itself: it joins no group and commits nothing (weir._reading)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from weir._cli.cluster import KAFKA_LOG, add_cluster_arguments, cluster_error_message
from weir._reading import ISOLATIONS, Position, Reader, parse_datetime

if TYPE_CHECKING:
    from weir.cli import SubParsers

FORMATS = ("str", "json", "json-pretty", "hex", "bytes")
NULL = "(null)"


def register(commands: SubParsers) -> None:
    tail = commands.add_parser(
        "tail",
        help="print a topic's records as they arrive (a console consumer)",
        description="Print the records of a topic: from its end (the default), its beginning, "
        "an offset or a time, then follow it until Ctrl-C. Joins no consumer group and commits "
        "nothing.",
    )
    tail.add_argument("topic", help="the topic to read")
    add_start_arguments(tail, default="the end")
    add_partition_argument(tail)
    tail.add_argument(
        "--isolation",
        choices=ISOLATIONS,
        default="read_committed",
        help="read_committed (the default) hides records of open and aborted transactions",
    )
    for part in ("key", "value"):
        tail.add_argument(
            f"--{part}-format",
            choices=FORMATS,
            default="str",
            help=f"how the {part} is shown: UTF-8 text (the default), JSON (compact or "
            "pretty), hex, or bytes with escapes",
        )
    tail.add_argument("--headers", action="store_true", help="show each record's headers too")
    add_count_argument(tail)
    tail.add_argument(
        "--no-follow",
        "--exit-at-end",
        dest="follow",
        action="store_false",
        help="stop at the end of every partition instead of waiting for more",
    )
    add_cluster_arguments(tail)
    tail.set_defaults(handler=_tail)


def add_start_arguments(parser: argparse.ArgumentParser, *, default: str) -> None:
    start = parser.add_mutually_exclusive_group()
    start.add_argument(
        "--from-beginning", action="store_true", help="from the first record of each partition"
    )
    start.add_argument(
        "--from-offset",
        type=_offset,
        metavar="N",
        help="from offset N of each partition (below 0: that many offsets before its end); "
        "an offset outside the log is moved to its nearest end, and said so",
    )
    start.add_argument(
        "--from-datetime",
        type=_datetime,
        metavar="ISO",
        help="from the first record at or after this time (ISO 8601; without a zone, "
        f"local time) (default: {default})",
    )


def add_partition_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--partition",
        "-p",
        action="append",
        type=partition_number,
        metavar="P",
        help="only this partition, repeatable (default: all)",
    )


def add_count_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", "-n", type=_count, metavar="N", help="stop after N records")


def start_of(args: argparse.Namespace, default: Position) -> Position:
    if args.from_beginning:
        return Position("beginning")
    if args.from_offset is not None:
        return Position("offset", offset=args.from_offset)
    if args.from_datetime is not None:
        return Position.at_time(args.from_datetime)
    return default


def client_config(args: argparse.Namespace) -> dict[str, Any]:
    """The connection settings of a consumer or producer of the command: -X, the bootstrap
    servers, and librdkafka's log lines kept quiet (as the admin client's)."""
    kafka_log = logging.getLogger(KAFKA_LOG)
    kafka_log.setLevel(logging.CRITICAL)
    kafka_log.propagate = False
    if not kafka_log.handlers:
        # Without a handler of its own, Python's last resort would print the lines that pass
        # the level to stderr: a transactional producer's fatal error is logged as CRITICAL.
        kafka_log.addHandler(logging.NullHandler())
    return {**dict(args.config), "bootstrap.servers": args.bootstrap_servers, "logger": kafka_log}


def open_reader(args: argparse.Namespace, topic: str, position: Position, isolation: str) -> Reader:
    reader = Reader.open(
        client_config(args),
        topic,
        position,
        partitions=args.partition,
        isolation=isolation,
        timeout=args.timeout,
    )
    for note in reader.clamped:
        print(f"weir: {note}", file=sys.stderr)
    return reader


def _tail(args: argparse.Namespace) -> int:
    from weir.errors import WeirError

    show = _json_line if args.json else _text_lines
    key = decoder(args.key_format)
    value = decoder(args.value_format)
    end = Position("end")
    position = start_of(args, end)
    try:
        with open_reader(args, args.topic, position, args.isolation) as r:
            if position is end:
                # `tail -n 5` shows the last five lines: here nothing showed, and nothing said
                # why, until a record was written.
                print(
                    f"weir: reading {args.topic} from its end, so only records written from now "
                    "on appear: --from-beginning, or --from-offset -N for the last N of each "
                    "partition",
                    file=sys.stderr,
                )
            for msg in r.messages(follow=args.follow, count=args.count):
                # Flushed per record: a follower sees it now, and a closed pipe ends the run.
                print(show(msg, key, value, args.headers), flush=True)
    except WeirError as exc:
        print(f"weir: {cluster_error_message(exc, args)}", file=sys.stderr)
        return 1
    return 0


Decoded = tuple[str, Any]
"""A key or value as text to show, and as a JSON value."""


def decoder(kind: str) -> Callable[[bytes | None], Decoded]:
    def decode(data: bytes | None) -> Decoded:
        if data is None:
            return NULL, None
        if kind == "hex":
            return data.hex(), data.hex()
        if kind == "bytes":
            text = repr(data)[2:-1]
            return text, text
        text = data.decode("utf-8", errors="backslashreplace")
        if kind == "str":
            return text, text
        try:
            parsed = json.loads(data)
        except ValueError:
            return f"(not JSON) {text}", text
        indent = 2 if kind == "json-pretty" else None
        separators = None if indent else (",", ":")
        return json.dumps(parsed, indent=indent, separators=separators), parsed

    return decode


def timestamp(msg: Any) -> tuple[int | None, str]:
    kind, ms = msg.timestamp()
    if not kind or ms < 0:
        return None, "-"
    when = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return ms, when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def header_text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", errors="backslashreplace")


def _text_lines(
    msg: Any,
    key: Callable[[bytes | None], Decoded],
    value: Callable[[bytes | None], Decoded],
    headers: bool,
) -> str:
    _, when = timestamp(msg)
    lines = [
        f"{msg.partition()}@{msg.offset()}  {when}  {key(msg.key())[0]}  {value(msg.value())[0]}"
    ]
    if headers:
        for name, raw in msg.headers() or ():
            text = header_text(raw)
            lines.append(f"    {name}: {NULL if text is None else text}")
    return "\n".join(lines)


def _json_line(
    msg: Any,
    key: Callable[[bytes | None], Decoded],
    value: Callable[[bytes | None], Decoded],
    headers: bool,
) -> str:
    ms, when = timestamp(msg)
    row = {
        "topic": msg.topic(),
        "partition": msg.partition(),
        "offset": msg.offset(),
        "timestamp": ms,
        "time": None if ms is None else when,
        "key": key(msg.key())[1],
        "value": value(msg.value())[1],
        "headers": [[name, header_text(raw)] for name, raw in msg.headers() or ()],
    }
    return json.dumps(row)


def _offset(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an offset (a whole number), got {text!r}"
        ) from None


def partition_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a partition number (0 or more), got {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a count of 1 or more, got {text!r}")
    return value


def _datetime(text: str) -> datetime:
    try:
        return parse_datetime(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
