"""`weir lag` / `weir groups` argument handling, without a broker."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from confluent_kafka import KafkaError, KafkaException
from tests.waiting import wait_until

from weir.cli import SUBCOMMANDS, build_parser, main
from weir.lag import LagError, admin_client, committed_offsets

pytestmark = pytest.mark.timeout(30)


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert info.value.code == 2
    return capsys.readouterr().err


def test_lag_and_groups_are_registered_subcommands() -> None:
    assert {"broker", "lag", "groups"} <= set(SUBCOMMANDS)
    args = build_parser().parse_args(
        ["lag", "-b", "h:1", "-g", "g", "-t", "a", "-t", "b", "-w", "2", "-X", "k=v", "--json"]
    )
    assert (args.bootstrap_servers, args.group, args.topic) == ("h:1", "g", ["a", "b"])
    assert (args.watch, args.config, args.json, args.timeout) == (2.0, [("k", "v")], True, 5.0)


def test_group_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(capsys, "lag", "-b", "h:1")
    assert err.startswith("usage: weir lag ")
    assert "the following arguments are required: --group/-g" in err


def test_bootstrap_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("WEIR_BOOTSTRAP_SERVERS", raising=False)
    assert "--bootstrap-servers/-b" in usage_error(capsys, "groups")
    monkeypatch.setenv("WEIR_BOOTSTRAP_SERVERS", "env-host:9092")
    assert build_parser().parse_args(["groups"]).bootstrap_servers == "env-host:9092"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--watch", "0"], "argument --watch/-w: must be more than 0, got '0'"),
        (["--timeout", "soon"], "argument --timeout: expected seconds, got 'soon'"),
        (["-X", "nokey"], "argument --config/-X: expected KEY=VALUE, got 'nokey'"),
    ],
)
def test_bad_values_name_the_argument(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = usage_error(capsys, "lag", "-b", "h:1", "-g", "g", *argv)
    assert err.startswith("usage: weir lag ")
    assert f"weir lag: error: {message}" in err


def test_cli_import_leaves_the_admin_and_render_code_alone() -> None:
    # (`import weir` already brings confluent_kafka, and structlog brings parts of rich.)
    lazy = "{'weir.lag', 'confluent_kafka.admin', 'rich.live', 'weir.testing.broker'}"
    code = f"import sys, weir.cli; print(sorted({lazy} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    assert result.stdout.strip() == "[]"


WEIR = Path(sys.executable).with_name("weir")


def run_weir(*argv: str) -> subprocess.CompletedProcess[str]:
    """The installed `weir` command, as a user runs it."""
    return subprocess.run(
        [str(WEIR), *argv], capture_output=True, text=True, timeout=30, check=False
    )


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


def test_a_refusal_never_shows_a_secret() -> None:
    from weir.cli import _refusal

    # librdkafka 2.16 names a setting, not its value, in every refusal seen (a string setting
    # such as sasl.password takes any value); a future one that quotes the value must not leak.
    refused = KafkaException(KafkaError(KafkaError._INVALID_ARG, 'Invalid value "hunter2" for x'))
    message = _refusal(refused, {"sasl.password": "hunter2", "client.id": "Invalid"})
    assert message == 'the client refuses the -X settings: Invalid value "***" for x'


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("bootstrap.servers=h:2", "bootstrap.servers is not a -X setting: use --bootstrap-servers"),
        ("logger=x", "logger is not a -X setting: weir routes librdkafka's log lines itself"),
        ("sasl.password:hunter2", "expected KEY=VALUE, got an item not shown (it names a secret)"),
    ],
)
def test_settings_the_command_owns_are_usage_errors(
    setting: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: `-X bootstrap.servers=...` was dropped without a word (-b won)."""
    err = usage_error(capsys, "lag", "-b", "h:1", "-g", "g", "-X", setting)
    assert f"weir lag: error: argument --config/-X: {message}" in err
    assert "hunter2" not in err


@pytest.mark.parametrize("value", ["inf", "nan", "-1"])
def test_seconds_must_be_finite_and_positive(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = usage_error(capsys, "groups", "-b", "h:1", "--timeout", value)
    assert "weir groups: error: argument --timeout: " in err


def test_a_setting_a_consumer_refuses_is_a_lag_error() -> None:
    """Regression: committed offsets of given partitions are read with a consumer, which refuses
    settings the admin client takes; its KafkaException escaped the LagError contract."""
    admin = admin_client(
        {
            "bootstrap.servers": "127.0.0.1:1",
            "group.protocol": "consumer",
            "session.timeout.ms": 10000,  # set broker-side under KIP-848: a consumer refuses it
            "logger": logging.getLogger("test.quiet"),
        }
    )
    with pytest.raises(LagError, match=r"a consumer refuses .*session\.timeout\.ms"):
        committed_offsets(admin, "g", [("t", 0)], timeout=1)


def test_ctrl_c_while_waiting_for_the_cluster_is_a_quiet_exit_130() -> None:
    """Regression: Ctrl-C during `weir groups` (one round, not --watch) printed a traceback."""
    weir = subprocess.Popen(
        [str(WEIR), "groups", "-b", "127.0.0.1:1", "--timeout", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Its admin client runs (librdkafka's threads are up): weir is waiting for the cluster.
        wait_until(
            lambda: psutil.Process(weir.pid).num_threads() >= 4, "the admin client", timeout=20
        )
        weir.send_signal(signal.SIGINT)
        out, err = weir.communicate(timeout=20)
    finally:
        weir.kill()
        weir.wait(10)
    assert (weir.returncode, out, err) == (130, "", "")
