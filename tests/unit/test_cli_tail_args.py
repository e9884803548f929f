"""`weir tail` argument handling and the record decoders, without a broker (the command against
the embedded broker: tests/integration/test_cli_tail.py)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from weir._cli.tail import decoder
from weir._reading import Position, parse_datetime
from weir.cli import SUBCOMMANDS, build_parser, main

pytestmark = pytest.mark.timeout(30)


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """What a usage error printed: the subcommand's usage, then one line; never a traceback."""
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_tail_is_registered_with_its_defaults() -> None:
    assert "tail" in SUBCOMMANDS
    args = build_parser().parse_args(["tail", "orders", "-b", "h:1"])
    assert (args.topic, args.partition, args.count, args.follow) == ("orders", None, None, True)
    assert (args.isolation, args.key_format, args.value_format) == ("read_committed", "str", "str")
    assert not (args.from_beginning or args.headers or args.json)
    assert args.from_offset is None and args.from_datetime is None
    follow = ["-p", "2", "-p", "0", "-n", "5", "--exit-at-end", "--from-offset", "-3"]
    shown = ["--isolation", "read_uncommitted", "--value-format", "hex"]
    args = build_parser().parse_args(["tail", "t", "-b", "h:1", *follow, *shown])
    assert (args.partition, args.count, args.follow, args.from_offset) == ([2, 0], 5, False, -3)
    assert (args.isolation, args.value_format) == ("read_uncommitted", "hex")
    assert build_parser().parse_args(["tail", "t", "-b", "h:1", "--no-follow"]).follow is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--count", "0"], "argument --count/-n: expected a count of 1 or more, got '0'"),
        (["-n", "many"], "argument --count/-n: expected a count of 1 or more, got 'many'"),
        (["-p", "-1"], "expected a partition number (0 or more), got '-1'"),
        (["--from-offset", "1.5"], "expected an offset (a whole number), got '1.5'"),
        (
            ["--from-datetime", "yesterday"],
            "expected an ISO 8601 date-time such as 2026-12-03T10:15:00Z, got 'yesterday'",
        ),
        (
            ["--from-beginning", "--from-offset", "3"],
            "argument --from-offset: not allowed with argument --from-beginning",
        ),
        (["--isolation", "dirty"], "argument --isolation: invalid choice: 'dirty'"),
        (["--value-format", "avro"], "argument --value-format: invalid choice"),
        (["--timeout", "0"], "argument --timeout: must be more than 0, got '0'"),
    ],
)
def test_bad_values_are_one_line_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = usage_error(capsys, "tail", "t", "-b", "h:1", *argv)
    assert err.startswith("usage: weir tail")
    assert message in err.splitlines()[-1]


def test_the_topic_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    assert "the following arguments are required: topic" in usage_error(capsys, "tail", "-b", "h")


def test_a_time_without_a_zone_is_local_time() -> None:
    local = parse_datetime("2026-12-03T10:15:00")
    assert local.utcoffset() == datetime(2026, 12, 3, 10, 15).astimezone().utcoffset()
    utc = parse_datetime("2026-12-03T10:15:00Z")
    assert utc == datetime(2026, 12, 3, 10, 15, tzinfo=timezone.utc)
    assert Position.at_time(utc).time_ms == 1_796_292_900_000
    plus_one = parse_datetime("2026-12-03T11:15:00+01:00")
    assert plus_one == utc and plus_one.utcoffset() == timedelta(hours=1)
    assert parse_datetime("2026-12-03").hour == 0


@pytest.mark.parametrize(
    ("kind", "data", "shown", "as_json"),
    [
        ("str", b"caf\xc3\xa9", "café", "café"),
        ("str", b"\xff\x00a", "\\xff\x00a", "\\xff\x00a"),  # not UTF-8: escaped, no crash
        ("hex", b"\x00\xffA", "00ff41", "00ff41"),
        ("bytes", b"\x00\xffA'", "\\x00\\xffA'", "\\x00\\xffA'"),
        ("json", b'{"a": [1, 2]}', '{"a":[1,2]}', {"a": [1, 2]}),
        ("json-pretty", b'{"a": 1}', '{\n  "a": 1\n}', {"a": 1}),
        ("json", b"{oops", "(not JSON) {oops", "{oops"),
        ("json", None, "(null)", None),
        ("hex", None, "(null)", None),
    ],
)
def test_decoders(kind: str, data: bytes | None, shown: str, as_json: object) -> None:
    text, value = decoder(kind)(data)
    assert (text, value) == (shown, as_json)
    json.dumps(value)  # whatever it is, --json can write it
