"""Ctrl-C in the `weir` command is a quiet exit 130, wherever it lands (the command in a process
of its own, at a terminal: tests/integration/test_cli_processes.py)."""

from __future__ import annotations

import argparse

import pytest

from weir._cli import groups
from weir.cli import INTERRUPTED, main

pytestmark = pytest.mark.timeout(30)


def interrupted_inside_a_client_call(args: argparse.Namespace) -> int:
    """What a SIGINT during `AdminClient.list_consumer_groups` raised once in a CI run (1 in 40
    tries on a loaded machine): the C call returned with the KeyboardInterrupt set."""
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as exc:
        raise SystemError(
            "<built-in method list_consumer_groups of _ConfiguredAdmin object> returned a result "
            "with an exception set"
        ) from exc


def a_bug(args: argparse.Namespace) -> int:
    raise SystemError("a bug of the client's, not an interrupt")


def test_ctrl_c_inside_a_client_call_is_a_quiet_exit_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(groups, "_list", interrupted_inside_a_client_call)
    assert main(["groups", "-b", "h:1"]) == INTERRUPTED == 130
    assert capsys.readouterr() == ("", "")


def test_a_system_error_of_another_cause_is_not_taken_for_an_interrupt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(groups, "_list", a_bug)
    with pytest.raises(SystemError, match="a bug of the client's"):
        main(["groups", "-b", "h:1"])
