"""The `weir` command with processes: in a process of its own as a user runs it (output into a
closed pipe, refused -X settings, Ctrl-C while it waits), and `weir broker` against processes
that are not the broker of its state file, or with a `java -version` run before it refuses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.processes import WEIR, ctrl_c_as_at_a_terminal, run_weir
from tests.waiting import wait_until
from weir.cli import main

pytestmark = pytest.mark.timeout(30)


# -- weir broker ---------------------------------------------------------------------------------


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
    ("argv", "code"),
    [
        (["broker", "status"], 128 + signal.SIGPIPE),  # the status is not all written
        (["broker", "stop"], 128 + signal.SIGPIPE),
        (["--version"], 0),  # argparse lets a failed write of its own messages go
        (["broker", "--help"], 0),
    ],
)
def test_output_into_a_closed_pipe_ends_quietly(tmp_path: Path, argv: list[str], code: int) -> None:
    """Regression: `weir broker status | head -0` ended with a BrokenPipeError traceback."""
    if argv[0] == "broker" and argv[1] != "--help":
        argv = [*argv, "--state", str(tmp_path / "none.json")]
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before weir writes: every write fails with EPIPE
    try:
        result = subprocess.run(
            [str(WEIR), *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=30,
            check=False,
        )
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode == code


@pytest.fixture
def a_running_broker(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A state file of a running "broker": a process with kafka.Kafka on its command line."""
    stand_in = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "kafka.Kafka"]
    )
    workdir = tmp_path / "running"
    workdir.mkdir()
    state = tmp_path / "broker.json"
    state.write_text(
        json.dumps(
            {"pid": stand_in.pid, "bootstrap_servers": "127.0.0.1:1", "workdir": str(workdir)}
        )
    )
    yield state, workdir
    stand_in.kill()
    stand_in.wait(10)


def test_start_with_the_state_of_a_broker_on_another_dir_is_refused(
    a_running_broker: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: `start --dir B` printed "already running" and exited 0 when the state file
    named a broker running on another directory A: the caller got A's broker for B."""
    state, workdir = a_running_broker
    other = tmp_path / "other"
    assert main(["broker", "start", "--state", str(state), "--dir", str(other)]) == 1
    err = capsys.readouterr().err
    assert f"the broker of {state} runs on {workdir}, not {other}: stop it first" in err
    assert not other.exists()
    for same in (["--dir", str(workdir)], []):
        assert main(["broker", "start", "--state", str(state), *same]) == 0
        assert "already running: 127.0.0.1:1" in capsys.readouterr().out


def test_a_dir_that_is_a_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # (`start` runs `java -version` before it looks at the directory.)
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    state = str(tmp_path / "broker.json")
    assert main(["broker", "start", "--dir", str(a_file), "--state", state]) == 1
    assert capsys.readouterr().err == (
        f"weir: cannot use {a_file} as a work directory: it is not a directory\n"
    )


# -- weir lag and weir groups -------------------------------------------------------------------


@pytest.mark.parametrize("command", [["lag", "-g", "g"], ["groups"]])
@pytest.mark.parametrize(
    ("setting", "reason"),
    [
        ("no.such.setting=1", 'No such configuration property: "no.such.setting"'),
        ("session.timeout.ms=soon", 'Invalid value for configuration property "session.timeout'),
        ("security.protocol=carrier-pigeon", 'Invalid value "carrier-pigeon" for configuration'),
        ("partition.assignment.strategy=nope", "Unsupported partition.assignment.strategy: nope"),
        ("error_cb=print", "expected error_cb property as a callable function"),
    ],
)
def test_a_setting_the_client_refuses_is_one_line_and_exit_1(
    command: list[str], setting: str, reason: str
) -> None:
    """Regression: the client's refusal escaped as a KafkaException (or TypeError) traceback."""
    result = run_weir(*command, "-b", "127.0.0.1:1", "--timeout", "1", "-X", setting)
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("weir: the client refuses the -X settings: "), line
    assert reason in line


@pytest.mark.parametrize(
    "command", [["groups"], ["tail", "orders"], ["dlq", "show", "orders.dlq"], ["lag", "billing"]]
)
def test_ctrl_c_while_waiting_for_the_cluster_is_a_quiet_exit_130(command: list[str]) -> None:
    """Regression: Ctrl-C during `weir groups` (one round, not --watch) printed a traceback.
    `weir tail` and `weir dlq show` waited in one metadata request of the whole --timeout,
    where Python cannot run its signal handler: Ctrl-C did nothing until it ended."""
    weir = subprocess.Popen(
        [str(WEIR), *command, "-b", "127.0.0.1:1", "--timeout", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_as_at_a_terminal,
    )
    try:
        # Its admin client runs (librdkafka's threads are up): weir is waiting for the cluster.
        wait_until(
            lambda: psutil.Process(weir.pid).num_threads() >= 4, "the admin client", timeout=20
        )
        weir.send_signal(signal.SIGINT)
        sent = time.monotonic()
        out, err = weir.communicate(timeout=20)
        took = time.monotonic() - sent
    finally:
        weir.kill()
        weir.wait(10)
    assert (weir.returncode, out, err) == (130, "", "")
    assert took < 2.0
