"""`weir dlq` argument handling, without a broker (the commands against the embedded broker:
tests/integration/test_cli_dlq.py)."""

from __future__ import annotations

import pytest
from tests.unit.test_cli_tail_args import usage_error

from weir.cli import SUBCOMMANDS, build_parser, main

pytestmark = pytest.mark.timeout(30)


def test_redrive_is_a_dry_run_unless_told() -> None:
    assert "dlq" in SUBCOMMANDS
    args = build_parser().parse_args(["dlq", "redrive", "orders.dlq", "-b", "h:1"])
    assert (args.execute, args.to, args.source_partition, args.offset_range) == (
        False,
        None,
        None,
        None,
    )
    picked = ["--source-partition", "1", "--offset-range", "10-", "--error-contains", "Timeout"]
    args = build_parser().parse_args(
        ["dlq", "redrive", "d", "-b", "h:1", "--execute", "--to", "retry", *picked]
    )
    assert (args.execute, args.to, args.source_partition) == (True, "retry", [1])
    assert (args.offset_range, args.error_contains) == ((10, None), "Timeout")
    args = build_parser().parse_args(["dlq", "redrive", "d", "-b", "h", "--offset-range", "3-3"])
    assert args.offset_range == (3, 3)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["show", "d", "-n", "-2"], "expected a count of 1 or more, got '-2'"),
        (["show", "d", "--from-offset", "x"], "expected an offset (a whole number), got 'x'"),
        (
            ["redrive", "d", "--offset-range", "9-3"],
            "expected offsets of 0 or more with FIRST not past LAST, got '9-3'",
        ),
        (
            ["redrive", "d", "--offset-range", "7"],
            "expected FIRST-LAST or FIRST- (source offsets), got '7'",
        ),
        (["redrive", "d", "--offset-range", "a-b"], "got 'a-b'"),
        (["redrive", "d", "--source-partition", "x"], "(0 or more), got 'x'"),
        (["purge", "d"], "argument ACTION: invalid choice: 'purge'"),
    ],
)
def test_bad_values_are_one_line_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = usage_error(capsys, "dlq", *argv, "-b", "h:1")
    assert err.startswith("usage: weir dlq")
    assert message in err.splitlines()[-1]


def test_the_topic_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    assert "required: topic" in usage_error(capsys, "dlq", "redrive", "-b", "h")
    assert "required: topic" in usage_error(capsys, "dlq", "show", "-b", "h")


@pytest.mark.parametrize("action", [["dlq", "redrive", "d", "--execute"], ["tail", "t"]])
def test_settings_the_client_refuses_are_one_line(
    action: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: `weir dlq redrive --execute -X foo=bar` ended in a KafkaException traceback
    (the transactional producer was built outside the error handling). A secret's value never
    shows, even where librdkafka quotes it back."""
    bad = ["-X", "foo=bar", "-X", "sasl.password=PLAIN"]
    assert main([*action, "-b", "127.0.0.1:1", *bad]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        'weir: the client refuses its settings: No such configuration property: "foo"'
    )
    assert err.count("\n") == 1
    secret = ["-X", "sasl.password=BOGUS", "-X", "security.protocol=BOGUS"]
    assert main([*action, "-b", "127.0.0.1:1", *secret]) == 1
    err = capsys.readouterr().err
    assert err.startswith("weir: the client refuses its settings: ") and "BOGUS" not in err
    assert err.count("\n") == 1
