"""`weir offsets` / `weir groups describe|delete` argument handling and weir.admin's plan
arithmetic, without a broker (tests/integration/test_cli_offsets.py runs them on one)."""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from pathlib import Path

import pytest

from weir.admin import (
    OffsetsError,
    ResetPlan,
    ResetTarget,
    _planned,
    read_saved_offsets,
    write_saved_offsets,
)
from weir.cli import SUBCOMMANDS, build_parser, main
from weir.offsetmap import FinishedMap, decode_finished, encode_finished

pytestmark = pytest.mark.timeout(30)

MAP_AT_5 = encode_finished(5, b"\x00\x01\x01\x00\x01\x01").text  # 6, 7, 9, 10 finished


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert info.value.code == 2
    return capsys.readouterr().err


def test_offsets_is_registered_and_parses() -> None:
    assert {"offsets", "groups"} <= set(SUBCOMMANDS)
    args = build_parser().parse_args(
        ["offsets", "reset", "-b", "h:1", "-g", "g", "-t", "orders:0,2", "--shift-by", "-5"]
    )
    assert (args.group, args.topic, args.shift_by, args.execute) == (
        "g",
        ("orders", [0, 2]),
        -5,
        False,
    )
    args = build_parser().parse_args(
        [
            "offsets",
            "reset",
            "-b",
            "h:1",
            "-g",
            "g",
            "-t",
            "orders",
            "--to-datetime",
            "2026-12-03T09:30:00Z",
        ]
    )
    assert args.topic == ("orders", None)
    assert args.to_datetime == dt.datetime(2026, 12, 3, 9, 30, tzinfo=dt.timezone.utc)


RESET = ("offsets", "reset", "-b", "h:1", "-g", "g")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((*RESET, "-t", "t"), "one of the arguments --to-earliest --to-latest"),
        ((*RESET, "-t", "t", "--to-earliest", "--to-latest"), "not allowed with argument"),
        ((*RESET, "-t", "t:x", "--to-earliest"), "expected TOPIC or TOPIC:P,P,... with partition"),
        ((*RESET, "-t", "t:-1", "--to-earliest"), "a partition number is 0 or more"),
        ((*RESET, "-t", "a b", "--to-earliest"), "'a b' is no topic name"),
        ((*RESET, "-t", "t", "--to-offset", "-1"), "an offset is 0 or more, got '-1'"),
        ((*RESET, "-t", "t", "--to-offset", "x"), "expected an offset, got 'x'"),
        ((*RESET, "-t", "t", "--shift-by", "1.5"), "expected a whole number"),
        ((*RESET, "-t", "t", "--to-datetime", "2026-12-03T09:30"), "has no time zone: add Z"),
        ((*RESET, "-t", "t", "--to-datetime", "yesterday"), "expected an ISO 8601 time"),
        ((*RESET, "--to-earliest"), "the topic is needed: --topic TOPIC[:P,...]"),
        ((*RESET, "-t", "t", "--to-earliest", "--save", "f"), "--save is where --execute saves"),
        (("offsets", "reset", "-b", "h:1", "-t", "t", "--to-earliest"), "--group/-g"),
        (("offsets", "delete", "-b", "h:1", "-g", "g"), "--topic/-t"),
        (("groups", "describe", "-b", "h:1"), "describe needs the group: weir groups describe"),
        (("groups", "delete", "-b", "h:1"), "delete needs the group"),
        (("groups", "list", "g", "-b", "h:1"), "list takes no group (got 'g')"),
        (("groups", "g", "-b", "h:1"), "invalid choice: 'g'"),
    ],
)
def test_bad_input_is_one_usage_line(
    argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = usage_error(capsys, *argv)
    assert err.startswith("usage: weir ")
    last = err.splitlines()[-1]
    assert last.startswith("weir ") and message in last, err
    assert "Traceback" not in err


def test_groups_alone_still_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    args = build_parser().parse_args(["groups", "-b", "h:1", "--timeout", "2"])
    assert (args.action, args.group, args.timeout) == (None, None, 2.0)
    args = build_parser().parse_args(["groups", "-b", "h:1", "describe", "g", "--json"])
    assert (args.action, args.group, args.json, args.bootstrap_servers) == (
        "describe",
        "g",
        True,
        "h:1",
    )


def test_a_saved_file_that_is_not_one_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(OffsetsError, match="is not JSON"):
        read_saved_offsets(bad)
    bad.write_text(json.dumps({"group": "g", "partitions": []}))
    with pytest.raises(OffsetsError, match="not a saved-offsets file of weir"):
        read_saved_offsets(bad)
    with pytest.raises(OffsetsError, match="cannot read"):
        read_saved_offsets(tmp_path / "missing.json")
    # Read before any client is made: no cluster is asked, none is named.
    argv = ["offsets", "reset", "-b", "127.0.0.1:1", "-g", "g", "--from-file", str(bad)]
    assert main(argv) == 1
    assert capsys.readouterr().err == (
        f'weir: {bad}: not a saved-offsets file of weir (no "format": "weir-offsets-v1")\n'
    )
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "weir-offsets-v1", "group": "h", "partitions": []}))
    assert main([*argv[:-1], str(other)]) == 1
    assert capsys.readouterr().err == f"weir: {other} holds the offsets of group 'h', not of 'g'\n"


def test_the_saved_file_round_trips_and_is_never_overwritten(tmp_path: Path) -> None:
    plan = ResetPlan(
        "g",
        "offset 0",
        (
            _planned(("t", 0), 5, MAP_AT_5, 0, 0, 20, None),
            _planned(("t", 1), None, None, 0, 0, 20, None),
        ),
        (),
    )
    path = tmp_path / "saved.json"
    write_saved_offsets(path, plan)
    group, saved = read_saved_offsets(path)
    assert group == "g"
    assert [(s.topic, s.partition, s.offset, s.metadata) for s in saved] == [
        ("t", 0, 5, MAP_AT_5),
        ("t", 1, None, None),
    ]
    with pytest.raises(OffsetsError, match="exists: the saved offsets go to a new file"):
        write_saved_offsets(path, plan)


def test_a_rewind_drops_the_map_and_counts_what_it_listed() -> None:
    p = _planned(("t", 0), 5, MAP_AT_5, 2, 0, 20, None)
    assert (p.new_metadata, p.reread, p.skipped) == (None, 3 + 4, 0)
    assert p.map_change == "dropped (4 finished)"


def test_a_forward_move_rebases_the_map() -> None:
    p = _planned(("t", 0), 5, MAP_AT_5, 7, 0, 20, None)
    assert p.new_metadata is not None
    found = decode_finished(p.new_metadata, 7)
    assert isinstance(found, FinishedMap)
    assert list(found.ranges()) == [(7, 8), (9, 11)]
    assert (p.reread, p.skipped, p.map_change) == (0, 1, "rebased (3 finished)")
    past = _planned(("t", 0), 5, MAP_AT_5, 11, 0, 20, None)
    assert past.new_metadata is None and past.map_change == "dropped (none above the new offset)"
    assert past.skipped == 6 - 4


def test_the_same_offset_keeps_any_metadata_and_a_move_drops_foreign_metadata() -> None:
    same = _planned(("t", 0), 5, "other tool", 5, 0, 20, None)
    assert (same.new_metadata, same.changes) == ("other tool", False)
    moved = _planned(("t", 0), 5, "other tool", 6, 0, 20, None)
    assert moved.new_metadata is None and moved.map_change == "dropped (no map for the offset)"


def test_targets_refuse_bad_values() -> None:
    with pytest.raises(ValueError, match="0 or more"):
        ResetTarget.at_offset(-1)
    with pytest.raises(ValueError, match="must be an int"):
        ResetTarget.shift_by(True)
    naive = ResetTarget.at_time(dt.datetime(2026, 1, 1))
    assert naive.when is not None and naive.when.tzinfo is dt.timezone.utc


def test_offset_delete_through_librdkafka_times_out_cleanly() -> None:
    """The ctypes call: librdkafka found, the request sent, no answer in time is a
    BrokerUnreachableError (not a hang or a crash), and every handle is destroyed."""
    from weir._offset_delete import delete_offsets
    from weir.errors import BrokerUnreachableError

    started = time.monotonic()
    with pytest.raises(BrokerUnreachableError, match=r"no broker answered within 0\.5 s"):
        delete_offsets(
            {"bootstrap.servers": "127.0.0.1:1", "logger": object()}, "g", [("t", 0)], 0.5
        )
    assert time.monotonic() - started < 5


def test_offset_delete_refuses_a_bad_setting_by_name_only() -> None:
    from weir._offset_delete import delete_offsets
    from weir.errors import LagError

    with pytest.raises(LagError) as info:
        delete_offsets(
            {"bootstrap.servers": "h:1", "sasl.password": "hunter2x", "nope.x": "1"}, "g", [], 1
        )
    assert str(info.value) == "the client refuses the setting nope.x"


def test_a_group_kafka_does_not_know_has_no_members(monkeypatch: pytest.MonkeyPatch) -> None:
    """Some brokers answer DescribeGroups of an unknown group with GROUP_ID_NOT_FOUND (weir.lag
    raises GroupNotFoundError): a reset may still give such a group its first offsets."""
    import weir.admin
    from weir.errors import GroupNotFoundError
    from weir.lag import _Deadline

    def unknown(*args: object) -> None:
        raise GroupNotFoundError("group 'new' does not exist")

    monkeypatch.setattr(weir.admin, "_describe", unknown)
    deadline = _Deadline(1.0)
    weir.admin._require_empty(None, "new", "reset its offsets", deadline)  # type: ignore[arg-type]
    assert weir.admin._members(None, "new", deadline) == ()  # type: ignore[arg-type]


def test_offset_delete_settings_go_over_as_text() -> None:
    from weir._offset_delete import _c_settings, delete_offsets
    from weir.errors import LagError

    config = {"a": "x", "b": 5, "c": True, "d": 0.5, "logger": object(), "error_cb": print}
    assert _c_settings(config) == {"a": "x", "b": "5", "c": "true", "d": "0.5"}
    with pytest.raises(LagError, match="cannot use an oauth_cb"):
        delete_offsets({"bootstrap.servers": "h:1", "oauth_cb": print}, "g", [], 1)


def test_a_topic_partition_offset_file_is_read_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from weir.admin import read_offsets_csv

    assert read_offsets_csv("# skip the poison record\norders,3,1043\n\n orders , 1 , 7\n") == {
        ("orders", 3): 1043,
        ("orders", 1): 7,
    }
    for text, problem in [
        ("orders,3", "line 1: expected topic,partition,offset, got 'orders,3'"),
        ("orders,x,1", "line 1: expected topic,partition,offset"),
        ("orders,1,-5", "line 1: expected topic,partition,offset"),
        ("orders,1,5\norders,1,6", "line 2: orders[1] is listed twice"),
        ("# nothing\n", "lists no topic,partition,offset"),
    ]:
        with pytest.raises(OffsetsError, match=re.escape(problem)):
            read_offsets_csv(text, "f.csv")
    skip = tmp_path / "skip.csv"
    skip.write_text("orders,3,1043\nother,0,1\n")
    argv = ["offsets", "reset", "-b", "127.0.0.1:1", "-g", "g", "--from-file", str(skip)]
    assert main([*argv, "-t", "orders"]) == 1
    assert capsys.readouterr().err == f"weir: {skip} names other[0], outside --topic orders\n"
    assert main([*argv, "-t", "orders:1"]) == 1
    assert "names orders[3], other[0], outside --topic orders" in capsys.readouterr().err
