"""`weir broker` argument handling and state-file edge cases, without starting a broker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import weir
from weir.cli import SUBCOMMANDS, build_parser, main

pytestmark = pytest.mark.timeout(30)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(10)
    return proc.pid


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


def test_stop_never_signals_a_pid_that_is_not_kafka(tmp_path: Path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        state = tmp_path / "broker.json"
        state.write_text(json.dumps({"pid": sleeper.pid, "bootstrap_servers": "127.0.0.1:1"}))
        assert main(["broker", "stop", "--state", str(state)]) == 1  # not our broker: not running
        assert sleeper.poll() is None  # a recycled pid must survive
    finally:
        sleeper.kill()
        sleeper.wait(10)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--user", "alice"], "weir: --user, --super-user, --acls and --mtls need --secure\n"),
        (["--mtls"], "weir: --user, --super-user, --acls and --mtls need --secure\n"),
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
