"""How weir was called: the one error type a command raises for a problem it reports as one
line, and the consumer group argument the group commands share."""

from __future__ import annotations

import argparse


class UsageError(Exception):
    """A problem with how weir was called or installed, reported as one line."""


def add_group_argument(parser: argparse.ArgumentParser) -> None:
    """The consumer group a command works on, as `GROUP` (as `weir groups describe GROUP` takes
    it) or as `--group/-g GROUP`; `resolve_group` checks it once the arguments are parsed."""
    parser.add_argument(
        "group_given", nargs="?", metavar="GROUP", help="the consumer group id (or --group)"
    )
    parser.add_argument("--group", "-g", help="the consumer group id")
    parser.set_defaults(group_parser=parser)


def resolve_group(args: argparse.Namespace) -> None:
    """`args.group` from `GROUP` or `--group`, refused with the command's usage when neither or
    two different ones were given."""
    parser: argparse.ArgumentParser | None = getattr(args, "group_parser", None)
    if parser is None:
        return
    given, flag = args.group_given, args.group
    if given is not None and flag is not None and given != flag:
        parser.error(f"two groups given: {given!r} and --group {flag!r}")
    args.group = flag if flag is not None else given
    if args.group is None:
        parser.error("the group is needed: GROUP or --group/-g GROUP")
