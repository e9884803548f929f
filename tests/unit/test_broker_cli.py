"""`weir broker` argument handling and state-file edge cases, without starting a broker or any
other process (those are in tests/integration/test_cli_processes.py)."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

import weir
from weir.cli import SUBCOMMANDS, build_parser, main

pytestmark = pytest.mark.timeout(30)


def dead_pid() -> int:
    """A process id no process can have: the kernel's limit itself (ids run below it). The
    highest free id below it was taken by a new process mid-test once the ids had wrapped
    (the kernel hands them out upwards, so the top of the range is where the next ones go)."""
    pid = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert not psutil.pid_exists(pid)
    return pid


def test_broker_is_one_registered_subcommand() -> None:
    assert "broker" in SUBCOMMANDS
    args = build_parser().parse_args(["broker", "start", "--foreground", "--override", "a=b"])
    assert args.command == "broker" and args.action == "start"
    assert args.foreground is True and args.override == [("a", "b")]


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2


def test_malformed_override_is_a_usage_error_of_the_subcommand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: the error came with the top-level usage (`weir [-h] COMMAND ...`)."""
    with pytest.raises(SystemExit) as info:
        main(["broker", "start", "--state", str(tmp_path / "s.json"), "--override", "nonsense"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: weir broker start ")
    assert "argument --override: expected KEY=VALUE, got 'nonsense'" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"weir {weir.__version__}"


def test_status_and_stop_without_state(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = str(tmp_path / "none.json")
    assert main(["broker", "status", "--state", state]) == 1
    assert main(["broker", "stop", "--state", state]) == 0
    assert capsys.readouterr().out.count("no broker running") == 2


def test_stop_of_a_broker_that_died_says_so_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: `stop` said "stopped" and exited 0 for a broker that had already died."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    log = workdir / "kafka.log"
    log.write_text("[2026-01-01] ERROR Exiting Kafka due to fatal exception during startup.\n")
    state = tmp_path / "broker.json"
    state.write_text(
        json.dumps(
            {
                "pid": dead_pid(),
                "bootstrap_servers": "127.0.0.1:1",
                "workdir": str(workdir),
                "log_path": str(log),
                "remove_workdir": True,
            }
        )
    )
    assert main(["broker", "status", "--state", str(state)]) == 1
    assert "not running; not reachable" in capsys.readouterr().out

    assert main(["broker", "stop", "--state", str(state)]) == 1
    captured = capsys.readouterr()
    assert "stopped" not in captured.out
    assert "was not running" in captured.err and "died" in captured.err
    assert str(log) in captured.err
    assert "Exiting Kafka due to fatal exception" in captured.err  # the log's last lines
    # The state is cleared, and the dead broker's directory kept so its log can be read.
    assert not state.exists() and log.is_file()
    assert main(["broker", "stop", "--state", str(state)]) == 0  # nothing left to stop


@pytest.fixture
def no_java(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A `start` that got past its own checks fails on Java at once, starting nothing."""
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    monkeypatch.delenv("JAVA_HOME", raising=False)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('{"pid": 12', "not JSON"),
        ("", "not JSON"),
        ("[]", "not a JSON object"),
        ('{"pid": "12", "bootstrap_servers": "127.0.0.1:1"}', "pid '12' is not a process id"),
        ('{"pid": -1, "bootstrap_servers": "127.0.0.1:1"}', "pid -1 is not a process id"),
        ('{"pid": 12, "bootstrap_servers": "nowhere"}', "'nowhere' is not HOST:PORT"),
        ('{"pid": 12, "bootstrap_servers": "h:1", "remove_workdir": true}', "without a workdir"),
    ],
)
def test_a_corrupt_state_file_is_an_error_for_every_action(
    tmp_path: Path, content: str, problem: str, no_java: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: a corrupt state read as "no broker": `stop` printed "no broker running" and
    exited 0, and `start` launched a second broker over it (a half-written state file comes
    from a start that crashed while writing it: its broker may well run)."""
    state = tmp_path / "broker.json"
    state.write_text(content)
    for action in ("start", "stop", "status"):
        assert main(["broker", action, "--state", str(state)]) == 1, action
        captured = capsys.readouterr()
        assert captured.out == "", action
        [line] = captured.err.splitlines()
        assert line.startswith(f"weir: the broker state file {state} is corrupt: "), line
        assert problem in line
        assert "may still run" in line
    assert state.read_text() == content  # evidence kept: the user decides


def test_a_state_file_that_cannot_be_read_or_written_is_named(
    tmp_path: Path, no_java: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: a state path that could not be written was found only after the broker
    started (a traceback, and a broker left running that nothing knew of)."""
    a_dir = tmp_path / "state-dir"
    a_dir.mkdir()
    assert main(["broker", "stop", "--state", str(a_dir)]) == 1
    assert capsys.readouterr().err == (
        f"weir: cannot read the broker state file {a_dir}: Is a directory\n"
    )
    nowhere = "/proc/weir-nowhere/broker.json"
    assert main(["broker", "start", "--state", nowhere]) == 1
    assert capsys.readouterr().err == (
        f"weir: cannot write the broker state file {nowhere}: No such file or directory\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["start", "--port", "70000"], "argument --port: expected a port from 1 to 65535"),
        (["start", "--port", "0"], "argument --port: expected a port from 1 to 65535"),
        (["start", "--port", "x"], "argument --port: expected a port number, got 'x'"),
        (["start", "--timeout", "nan"], "argument --timeout: must be more than 0"),
        (["start", "--timeout", "0"], "argument --timeout: must be more than 0"),
        (["stop", "--timeout", "-1"], "argument --timeout: must be more than 0"),
        (["stop", "--timeout", "inf"], "argument --timeout: expected a finite number"),
    ],
)
def test_bad_broker_options_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: --port 70000 ended with an OverflowError traceback, and a --timeout of nan,
    0 or less was taken (`start --timeout nan` waited for ever)."""
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["broker", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: weir broker {argv[0]} ")
    assert f"weir broker {argv[0]}: error: {message}" in err


NEED_SECURE = "weir: --user, --super-user, --acls, --mtls and --oauthbearer need --secure\n"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--user", "alice"], NEED_SECURE),
        (["--mtls"], NEED_SECURE),
        (["--oauthbearer"], NEED_SECURE),
        (["--secure", "--user", "a b"], "weir: user name 'a b': use letters, digits and "),
    ],
)
def test_security_options_are_checked_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    state = tmp_path / "broker.json"
    assert main(["broker", "start", "--state", str(state), *argv]) == 1
    assert capsys.readouterr().err.startswith(said)
    assert not state.exists()
