"""`weir groups [list]`, `weir groups describe GROUP`, `weir groups delete GROUP`."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from weir._cli.cluster import add_cluster_arguments, on_cluster
from weir._cli.console import number, table_console

if TYPE_CHECKING:
    from weir.cli import SubParsers

ACTIONS = ("list", "describe", "delete")


def register_groups(commands: SubParsers) -> None:
    # One parser with an optional action, not sub-parsers: `weir groups -b HOST` (no action)
    # must keep working, and a sub-parser would not see options given before its name.
    groups = commands.add_parser(
        "groups",
        help="list, describe or delete consumer groups",
        description="weir groups [list]: every consumer group of the cluster with its state, "
        "type, member count and total lag. weir groups describe GROUP: its state, protocol, "
        "assignor, coordinator, members and, per partition, committed offset, lag and offset "
        "map. weir groups delete GROUP: delete an empty group and its committed offsets.",
        usage="weir groups [list | describe GROUP | delete GROUP] [options]",
    )
    groups.add_argument(
        "action",
        nargs="?",
        choices=ACTIONS,
        metavar="ACTION",
        help="list (default), describe, delete",
    )
    groups.add_argument(
        "group", nargs="?", metavar="GROUP", help="the group, for describe and delete"
    )
    add_cluster_arguments(groups)
    groups.set_defaults(handler=_groups, groups_parser=groups)


def _groups(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args.groups_parser
    action = args.action or "list"
    if action == "list":
        if args.group is not None:
            parser.error(f"list takes no group (got {args.group!r}); did you mean describe?")
        return _list(args)
    if not args.group:
        parser.error(f"{action} needs the group: weir groups {action} GROUP")
    run = _describe if action == "describe" else _delete
    return on_cluster(args, lambda admin: run(admin, args))


def _list(args: argparse.Namespace) -> int:
    from weir.lag import all_groups_lag

    return on_cluster(
        args, lambda admin: _print_groups(all_groups_lag(admin, timeout=args.timeout), args)
    )


_LISTED = ("group", "state", "type", "simple", "members", "total_lag")


def _print_groups(lags: list[Any], args: argparse.Namespace) -> int:
    from weir.lag import lag_as_dict

    if args.json:
        print(json.dumps([{key: lag_as_dict(lag)[key] for key in _LISTED} for lag in lags]))
        return 0
    from rich.table import Table

    console = table_console()
    if not lags:
        console.print(f"no consumer groups on {args.bootstrap_servers}")
        return 0
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("GROUP", overflow="fold")
    table.add_column("STATE")
    table.add_column("TYPE")
    table.add_column("MEMBERS", justify="right")
    table.add_column("LAG", justify="right")
    for lag in lags:
        table.add_row(
            lag.group_id,
            lag.state,
            lag.group_type + (" (simple)" if lag.simple else ""),
            str(lag.members),
            str(lag.total_lag),
        )
    console.print(table)
    return 0


def _describe(admin: Any, args: argparse.Namespace) -> int:
    from weir.admin import describe_group

    found = describe_group(admin, args.group, timeout=args.timeout)
    if args.json:
        print(json.dumps(found.as_dict()))
        return 0
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    heading = Text.assemble(
        ("group ", "dim"),
        (found.group_id, "bold"),
        ("  state ", "dim"),
        found.state,
        ("  protocol ", "dim"),
        found.protocol + (" (simple)" if found.simple else ""),
        ("  assignor ", "dim"),
        found.assignor,
        ("  coordinator ", "dim"),
        found.coordinator,
    )
    parts: list[Any] = [heading]
    consumer_protocol = any(m.target_assignment is not None for m in found.members)
    if found.members:
        members = Table(box=None, pad_edge=False, header_style="bold", title_justify="left")
        for name in ("MEMBER", "CLIENT ID", "HOST", "ASSIGNMENT"):
            members.add_column(name, overflow="fold")
        if consumer_protocol:
            members.add_column("TARGET ASSIGNMENT", overflow="fold")
        for m in found.members:
            row = [m.member_id, m.client_id, m.host.lstrip("/"), _assignment(m.assignment)]
            if consumer_protocol:
                row.append(_assignment(m.target_assignment or ()))
            members.add_row(*row)
        parts += [Text(""), members]
    else:
        parts.append(Text("no members"))
    if found.partitions:
        table = Table(box=None, pad_edge=False, header_style="bold")
        for name in ("TOPIC", "PARTITION", "COMMITTED", "LOG END", "LAG", "MAP BYTES", "FINISHED"):
            table.add_column(name, justify="left" if name == "TOPIC" else "right", no_wrap=True)
        table.add_column("MEMBER / NOTE", overflow="fold")
        for p in found.partitions:
            table.add_row(
                p.topic,
                str(p.partition),
                number(p.committed),
                number(p.log_end),
                number(p.lag),
                str(p.map_bytes),
                str(p.map_finished),
                p.member_id or (f"metadata ignored: {p.map_problem}" if p.map_problem else "-"),
            )
        parts += [Text(""), table]
    else:
        parts.append(Text("no committed offsets"))
    table_console().print(Group(*parts))
    return 0


def _assignment(keys: Any) -> str:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in keys:
        by_topic.setdefault(topic, []).append(partition)
    return " ".join(f"{t}:{','.join(map(str, ps))}" for t, ps in by_topic.items()) or "-"


def _delete(admin: Any, args: argparse.Namespace) -> int:
    from weir.admin import delete_group

    delete_group(admin, args.group, timeout=args.timeout)
    if args.json:
        print(json.dumps({"group": args.group, "deleted": True}))
    else:
        print(f"deleted group {args.group!r} and its committed offsets")
    return 0
