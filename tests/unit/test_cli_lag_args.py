"""`weir lag` / `weir groups` argument handling, without a broker (the command in a process of
its own: tests/integration/test_cli_processes.py)."""

from __future__ import annotations

import argparse
import logging

import pytest
from confluent_kafka import KafkaError, KafkaException

from weir.cli import SUBCOMMANDS, _parse, build_parser, main
from weir.lag import LagError, admin_client, committed_offsets

pytestmark = pytest.mark.timeout(30)


def main_args(*argv: str) -> argparse.Namespace:
    """The arguments as the `weir` command takes them (its own checks included)."""
    return _parse(list(argv))


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
    assert err.splitlines()[-1] == "weir lag: error: the group is needed: GROUP or --group/-g GROUP"


@pytest.mark.parametrize("command", [("lag",), ("offsets", "reset"), ("offsets", "delete")])
def test_the_group_goes_bare_or_after_group(
    command: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """`weir lag orders` as `weir groups describe orders`: argparse said only that --group/-g
    was required, hiding the group it had been given."""
    rest = ["-b", "h:1", "-t", "t"] + (["--to-earliest"] if command[-1] == "reset" else [])
    assert main_args(*command, "orders", *rest).group == "orders"
    assert main_args(*command, "-g", "orders", *rest).group == "orders"
    assert main_args(*command, "orders", "--group", "orders", *rest).group == "orders"
    err = usage_error(capsys, *command, "orders", "--group", "refunds", *rest)
    assert err.splitlines()[-1].endswith("error: two groups given: 'orders' and --group 'refunds'")


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


def test_a_refusal_never_shows_a_secret() -> None:
    from weir._cli.cluster import refusal

    # librdkafka 2.16 names a setting, not its value, in every refusal seen (a string setting
    # such as sasl.password takes any value); a future one that quotes the value must not leak.
    refused = KafkaException(KafkaError(KafkaError._INVALID_ARG, 'Invalid value "hunter2" for x'))
    message = refusal(refused, {"sasl.password": "hunter2", "client.id": "Invalid"})
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
