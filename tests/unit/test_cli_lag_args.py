"""`weir lag` / `weir groups` argument handling, without a broker."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

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
