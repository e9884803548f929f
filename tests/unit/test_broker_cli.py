"""`weir broker` argument handling and state-file edge cases, without starting a broker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from weir.cli import SUBCOMMANDS, build_parser, main

pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("restore_structlog")]


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(10)
    return proc.pid


def test_broker_is_one_registered_subcommand() -> None:
    assert "broker" in SUBCOMMANDS
    args = build_parser().parse_args(["broker", "start", "--foreground", "--override", "a=b"])
    assert args.command == "broker" and args.action == "start"
    assert args.foreground is True and args.override == ["a=b"]


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2


def test_malformed_override_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        main(["broker", "start", "--state", str(tmp_path / "s.json"), "--override", "nonsense"])
    assert info.value.code == 2


def test_status_and_stop_without_state(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    state = str(tmp_path / "none.json")
    assert main(["broker", "status", "--state", state]) == 1
    assert main(["broker", "stop", "--state", state]) == 0
    assert capsys.readouterr().out.count("no broker running") == 2


def test_stale_state_is_reported_and_cleaned(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    workdir = tmp_path / "work"
    workdir.mkdir()
    state = tmp_path / "broker.json"
    state.write_text(
        json.dumps(
            {
                "pid": dead_pid(),
                "bootstrap_servers": "127.0.0.1:1",
                "workdir": str(workdir),
                "remove_workdir": True,
            }
        )
    )
    assert main(["broker", "status", "--state", str(state)]) == 1
    assert "not running; not reachable" in capsys.readouterr().out
    assert main(["broker", "stop", "--state", str(state)]) == 0
    assert not state.exists() and not workdir.exists()


def test_stop_never_signals_a_pid_that_is_not_kafka(tmp_path: Path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        state = tmp_path / "broker.json"
        state.write_text(json.dumps({"pid": sleeper.pid, "bootstrap_servers": "127.0.0.1:1"}))
        assert main(["broker", "stop", "--state", str(state)]) == 0
        assert sleeper.poll() is None  # a recycled pid must survive
    finally:
        sleeper.kill()
        sleeper.wait(10)
