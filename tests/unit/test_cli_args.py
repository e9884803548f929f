"""Arguments no command knows: refused by the (sub)command they were given to, with its usage and
the closest option it has. argparse refused them with the top-level usage (`weir [-h]
[--version] COMMAND ...`) and no hint."""

from __future__ import annotations

import pytest

from weir.cli import _parse, main

pytestmark = pytest.mark.timeout(30)


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[str, str]:
    """(the usage's first line, the error line) of a usage error; never a traceback."""
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    return lines[0], lines[-1]


@pytest.mark.parametrize(
    ("argv", "usage", "error"),
    [
        (
            ["tail", "orders", "-b", "h:1", "--from-begining"],
            "usage: weir tail",
            "weir tail: error: unrecognized arguments: --from-begining "
            "(did you mean --from-beginning?)",
        ),
        (
            ["broker", "start", "--prot", "9092"],
            "usage: weir broker start",
            "weir broker start: error: unrecognized arguments: --prot 9092 (did you mean --port?)",
        ),
        (
            ["tail", "t", "-b", "h:1", "--from-begining", "--value-fromat=hex"],
            "usage: weir tail",
            "weir tail: error: unrecognized arguments: --from-begining --value-fromat=hex "
            "(--from-begining: did you mean --from-beginning?; "
            "--value-fromat: did you mean --value-format?)",
        ),
        (
            ["lag", "-g", "g", "-b", "h:1", "--zzz"],
            "usage: weir lag",
            "weir lag: error: unrecognized arguments: --zzz",
        ),
        (
            ["lag", "g", "-b", "h:1", "extra"],
            "usage: weir lag",
            "weir lag: error: unrecognized arguments: extra",
        ),
    ],
    ids=["one-option", "nested-command", "two-options", "no-close-option", "stray-positional"],
)
def test_an_unknown_argument_is_refused_by_its_command_with_the_closest_option(
    capsys: pytest.CaptureFixture[str], argv: list[str], usage: str, error: str
) -> None:
    first, last = refused(capsys, *argv)
    assert first.startswith(usage)
    assert last == error


@pytest.mark.parametrize(
    ("argv", "action", "group"),
    [
        (["groups", "describe", "-b", "h:1", "orders"], "describe", "orders"),
        (
            ["groups", "delete", "--json", "-b", "h:1", "--timeout", "5", "orders"],
            "delete",
            "orders",
        ),
        (["groups", "-b", "h:1", "describe", "orders"], "describe", "orders"),
        (["groups", "describe", "orders", "-b", "h:1"], "describe", "orders"),
        (["groups", "-b", "h:1"], None, None),
    ],
    ids=["options-between", "several-options-between", "options-first", "options-last", "none"],
)
def test_a_group_after_the_options_is_placed(
    argv: list[str], action: str | None, group: str | None
) -> None:
    """`weir groups describe -b HOST GROUP` was refused with "unrecognized arguments: GROUP":
    argparse filled both positionals from "describe" alone, before the options."""
    args = _parse(argv)
    assert (args.action, args.group, args.bootstrap_servers) == (action, group, "h:1")


def test_a_third_word_after_the_options_is_still_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    usage, error = refused(capsys, "groups", "describe", "-b", "h:1", "g1", "g2")
    assert usage.startswith("usage: weir groups")
    assert error == "weir groups: error: unrecognized arguments: g2"
