"""`weir offsets reset|delete` and `weir groups describe|delete` against the embedded broker.

One topic for the module (3 partitions of 20 records, record i of a partition stamped T0 + i s,
partition 2's log starting at 3); each test has its own group.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.integration.kafka_helpers import commit
from weir import GroupConsumer, Record
from weir.cli import main
from weir.offsetmap import FinishedMap, decode_finished, encode_finished
from weir.testing.pytest_plugin import create_topic, produce

pytestmark = [pytest.mark.broker, pytest.mark.timeout(90)]

RECORDS = 20
LOG_START_2 = 3
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
# Offsets 6, 7, 9 and 10 finished above a commit of 5.
MAP_AT_5 = encode_finished(5, b"\x00\x01\x01\x00\x01\x01").text


@dataclass
class Setup:
    bootstrap: str
    topic: str
    other: str  # 1 partition, 5 records

    def group(self) -> str:
        return f"weir-offsets-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def setup(kafka_bootstrap: str) -> Setup:
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    # The records carry T0's timestamps, months old: under the broker's 7-day retention a
    # retention pass (30 s after the broker starts, then every 5 min) deleted them all.
    keep = {"retention.ms": "-1"}
    topic = create_topic(admin, partitions=3, name_prefix="offsets", config=keep)
    other = create_topic(admin, partitions=1, name_prefix="offsets-other", config=keep)
    base = int(T0.timestamp() * 1000)
    records = [
        {"key": f"k{i}", "value": f"v{i}", "partition": p, "timestamp": base + i * 1000}
        for p in range(3)
        for i in range(RECORDS)
    ]
    produce(kafka_bootstrap, topic, records)
    produce(kafka_bootstrap, other, [(f"k{i}", f"v{i}") for i in range(5)])
    deleted = admin.delete_records([TopicPartition(topic, 2, LOG_START_2)])
    for future in deleted.values():
        future.result(30)
    return Setup(kafka_bootstrap, topic, other)


def committed(
    bootstrap: str, group: str, topic: str, partitions: int = 3
) -> dict[int, tuple[int | None, str | None]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], 10)
    finally:
        consumer.close()
    return {
        tp.partition: (tp.offset, tp.metadata or None) if tp.offset >= 0 else (None, None)
        for tp in found
    }


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def reset(
    capsys: pytest.CaptureFixture[str], s: Setup, group: str, *argv: str
) -> tuple[int, Any, str]:
    code, out, err = run(
        capsys, "offsets", "reset", "-b", s.bootstrap, "-g", group, *argv, "--json"
    )
    return code, json.loads(out) if out else None, err


def rows(plan: Any) -> dict[int, dict[str, Any]]:
    return {row["partition"]: row for row in plan["partitions"]}


@pytest.fixture
def member(setup: Setup) -> Iterator[tuple[str, Consumer]]:
    """A plain classic member of a new group that owns the topic's 3 partitions."""
    group = setup.group()
    consumer = Consumer(
        {
            "bootstrap.servers": setup.bootstrap,
            "group.id": group,
            "client.id": "offsets-test-member",
            "enable.auto.commit": False,
        }
    )
    commit(setup.bootstrap, group, setup.topic, {0: (4, None), 1: (4, None), 2: (4, None)})
    commit(setup.bootstrap, group, setup.other, {0: (2, None)})
    consumer.subscribe([setup.topic])
    deadline = time.monotonic() + 30
    while len(consumer.assignment()) < 3:
        assert time.monotonic() < deadline, consumer.assignment()
        consumer.poll(0.1)
    try:
        yield group, consumer
    finally:
        consumer.close()


# --- reset ---------------------------------------------------------------------------------------


def test_dry_run_prints_the_plan_and_changes_nothing(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    group = setup.group()
    before = {0: (5, MAP_AT_5), 1: (10, None)}
    commit(setup.bootstrap, group, setup.topic, before)
    code, plan, err = reset(capsys, setup, group, "-t", setup.topic, "--to-earliest")
    assert code == 0, err
    assert plan["executed"] is False and plan["saved_to"] is None
    got = rows(plan)
    # A rewind re-reads [0, 5) and the 4 offsets the dropped map listed as finished.
    assert (got[0]["current"], got[0]["new"], got[0]["reread"]) == (5, 0, 9)
    assert got[0]["map"] == "dropped (4 finished)"
    assert (got[1]["current"], got[1]["new"], got[1]["reread"]) == (10, 0, 10)
    assert (got[2]["current"], got[2]["new"], got[2]["reread"]) == (None, LOG_START_2, None)
    assert committed(setup.bootstrap, group, setup.topic) == {**before, 2: (None, None)}
    code, out, _ = run(
        capsys, "offsets", "reset", "-b", setup.bootstrap, "-g", group, "-t", setup.topic,
        "--to-earliest",
    )  # fmt: skip
    assert code == 0
    assert "dry run, nothing changed: add --execute to apply" in out.splitlines()[0]
    assert committed(setup.bootstrap, group, setup.topic) == {**before, 2: (None, None)}


def test_execute_moves_exactly_the_plan_and_the_file_undoes_it(
    setup: Setup, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    group = setup.group()
    before = {0: (5, MAP_AT_5), 1: (10, None), 2: (4, "someone else's metadata")}
    commit(setup.bootstrap, group, setup.topic, before)
    _, dry, _ = reset(capsys, setup, group, "-t", setup.topic, "--shift-by", "-2")
    saved = tmp_path / "saved.json"
    code, plan, err = reset(
        capsys, setup, group, "-t", setup.topic, "--shift-by", "-2", "--execute", "--save",
        str(saved),
    )  # fmt: skip
    assert code == 0, err
    assert plan["executed"] is True and plan["saved_to"] == str(saved)
    assert plan["partitions"] == dry["partitions"]  # the plan printed is the one executed
    got = rows(plan)
    assert [got[p]["new"] for p in range(3)] == [3, 8, LOG_START_2]
    assert got[2]["note"] == f"clamped: 2 is before the log start {LOG_START_2}"
    # Moved back: no map and no foreign metadata goes with the new offsets.
    assert committed(setup.bootstrap, group, setup.topic) == {
        0: (3, None),
        1: (8, None),
        2: (LOG_START_2, None),
    }
    assert json.loads(saved.read_text())["partitions"] == [
        {"topic": setup.topic, "partition": p, "offset": o, "metadata": m}
        for p, (o, m) in before.items()
    ]
    code, undo, err = reset(capsys, setup, group, "--from-file", str(saved), "--execute")
    assert code == 0, err
    assert committed(setup.bootstrap, group, setup.topic) == before  # metadata too, exactly
    assert rows(undo)[0]["map"] == "restored"
    assert undo["saved_to"] not in (None, str(saved))  # the undo saved its own file
    Path(undo["saved_to"]).unlink()


def test_undo_deletes_the_offsets_the_group_did_not_have(
    setup: Setup, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    group = setup.group()
    commit(setup.bootstrap, group, setup.topic, {0: (5, MAP_AT_5)})
    saved = str(tmp_path / "saved.json")
    code, _, err = reset(
        capsys, setup, group, "-t", setup.topic, "--to-offset", "6", "--execute", "--save", saved
    )
    assert code == 0, err
    assert [o for o, _ in committed(setup.bootstrap, group, setup.topic).values()] == [6, 6, 6]
    code, undo, err = reset(capsys, setup, group, "--from-file", saved, "--execute")
    assert code == 0, err
    assert rows(undo)[1]["note"] == "nothing was committed: the offset is deleted"
    assert committed(setup.bootstrap, group, setup.topic) == {
        0: (5, MAP_AT_5),
        1: (None, None),
        2: (None, None),
    }
    Path(undo["saved_to"]).unlink()


def test_a_forward_reset_keeps_the_map_above_the_new_offset(
    setup: Setup, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    group = setup.group()
    commit(setup.bootstrap, group, setup.topic, {0: (5, MAP_AT_5)})
    argv = ("-t", f"{setup.topic}:0", "--to-offset", "7", "--execute")
    code, plan, err = reset(capsys, setup, group, *argv, "--save", str(tmp_path / "a.json"))
    assert code == 0, err
    # 5 and 6 are passed over; 6 was finished, so only 5 is skipped unhandled.
    assert rows(plan)[0]["skipped"] == 1 and rows(plan)[0]["map"] == "rebased (3 finished)"
    offset, metadata = committed(setup.bootstrap, group, setup.topic)[0]
    assert offset == 7 and metadata is not None
    found = decode_finished(metadata, 7)
    assert isinstance(found, FinishedMap)
    assert list(found.ranges()) == [(7, 8), (9, 11)]
    # The same offset again: nothing to change, the map stays as it is.
    code, again, _ = reset(capsys, setup, group, *argv)
    assert code == 0 and again["executed"] is False and again["saved_to"] is None
    assert committed(setup.bootstrap, group, setup.topic)[0] == (7, metadata)


def test_a_kafka_offsets_file_moves_only_its_partitions(
    setup: Setup, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The runbook's "skip a poison record": topic,partition,offset lines, as Kafka's tool
    reads them; the partition's map is kept above the new offset as in any forward reset."""
    group = setup.group()
    commit(setup.bootstrap, group, setup.topic, {0: (5, MAP_AT_5), 1: (10, None)})
    skip = tmp_path / "skip.csv"
    skip.write_text(f"{setup.topic},0,6\n")
    argv = ("-t", setup.topic, "--from-file", str(skip), "--execute", "--save")
    code, plan, err = reset(capsys, setup, group, *argv, str(tmp_path / "saved.json"))
    assert code == 0, err
    assert [(r["partition"], r["new"], r["skipped"]) for r in plan["partitions"]] == [(0, 6, 1)]
    after = committed(setup.bootstrap, group, setup.topic)
    assert after[1] == (10, None) and after[0][0] == 6
    found = decode_finished(after[0][1] or "", 6)
    assert isinstance(found, FinishedMap)
    assert list(found.ranges()) == [(6, 8), (9, 11)]


@pytest.mark.parametrize(
    ("target", "new", "note"),
    [
        (["--to-earliest"], 0, None),
        (["--to-latest"], RECORDS, None),
        (["--to-offset", "12"], 12, None),
        (["--shift-by", "+3"], 13, None),
        (["--shift-by", "-30"], 0, "clamped: -20 is before the log start 0"),
        (["--to-offset", "50"], RECORDS, f"clamped: 50 is past the log end {RECORDS}"),
        (["--to-datetime", "2026-01-01T00:00:07.500Z"], 8, None),
        (["--to-datetime", "2026-01-01T01:00:07+01:00"], 7, None),
        (["--to-datetime", "2027-01-01T00:00:00Z"], RECORDS, "no record at or after that time"),
    ],
)
def test_each_mode_plans_its_offset(
    target: list[str],
    new: int,
    note: str | None,
    setup: Setup,
    capsys: pytest.CaptureFixture[str],
) -> None:
    group = setup.group()
    commit(setup.bootstrap, group, setup.topic, {1: (10, None)})
    code, plan, err = reset(capsys, setup, group, "-t", f"{setup.topic}:1", *target)
    assert code == 0, err
    [row] = plan["partitions"]
    assert (row["partition"], row["current"], row["new"]) == (1, 10, new)
    assert row["reread"] == max(0, 10 - new) and row["skipped"] == max(0, new - 10)
    if note is None:
        assert row["note"] is None
    else:
        assert row["note"].startswith(note)


def test_an_active_group_is_refused_naming_its_members(
    setup: Setup,
    member: tuple[str, Consumer],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group, consumer = member
    monkeypatch.chdir(tmp_path)
    before = committed(setup.bootstrap, group, setup.topic)
    code, plan, _ = reset(capsys, setup, group, "-t", setup.topic, "--to-earliest")
    assert code == 0  # the dry run plans, and lists the members
    assert plan["active_members"] == [
        {"member_id": consumer.memberid(), "client_id": "offsets-test-member", "host": "/127.0.0.1"}
    ]
    code, out, err = run(
        capsys, "offsets", "reset", "-b", setup.bootstrap, "-g", group, "-t", setup.topic,
        "--to-earliest", "--execute",
    )  # fmt: skip
    assert code == 1 and out == ""
    assert err.splitlines() == [
        f"weir: group {group!r} has 1 active member: member {consumer.memberid()} (client id "
        "offsets-test-member, host 127.0.0.1). Stop it, then reset its offsets "
        f"(cluster {setup.bootstrap})"
    ]
    assert committed(setup.bootstrap, group, setup.topic) == before
    assert list(tmp_path.iterdir()) == []  # nothing saved: nothing changed
    consumer.close()  # the group is empty now: the reset proceeds
    code, plan, err = reset(capsys, setup, group, "-t", setup.topic, "--to-earliest", "--execute")
    assert code == 0, err
    assert [o for o, _ in committed(setup.bootstrap, group, setup.topic).values()] == [0, 0, 3]
    assert [p.name for p in tmp_path.iterdir()] == [Path(plan["saved_to"]).name]


def test_a_member_that_joins_after_the_check_is_refused_by_the_broker(
    setup: Setup,
    member: tuple[str, Consumer],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The race the check cannot close: Kafka refuses the commit (UNKNOWN_MEMBER_ID per
    partition), and that is the same one-line refusal, not a list of partition errors."""
    import weir.admin

    group, _ = member
    monkeypatch.setattr(weir.admin, "_require_empty", lambda *args: None)
    before = committed(setup.bootstrap, group, setup.topic)
    save = str(tmp_path / "saved.json")
    code, _, err = reset(
        capsys, setup, group, "-t", setup.topic, "--to-earliest", "--execute", "--save", save
    )
    assert code == 1
    assert err.splitlines()[-1] == (
        f"weir: group {group!r} has active members (they joined after the check): the broker "
        f"refused the reset; stop them and try again (cluster {setup.bootstrap})"
    )
    assert committed(setup.bootstrap, group, setup.topic) == before


# --- delete --------------------------------------------------------------------------------------


def test_offsets_delete_refuses_an_active_group_then_deletes_one_topic(
    setup: Setup, member: tuple[str, Consumer], capsys: pytest.CaptureFixture[str]
) -> None:
    group, consumer = member
    argv = ("offsets", "delete", "-b", setup.bootstrap, "-g", group, "-t", setup.topic)
    code, _, err = run(capsys, *argv)
    assert code == 1
    assert f"has 1 active member: member {consumer.memberid()}" in err
    assert err.count("\n") == 1
    consumer.close()
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    assert json.loads(out) == {"group": group, "topic": setup.topic, "deleted": [0, 1, 2]}
    assert set(committed(setup.bootstrap, group, setup.topic).values()) == {(None, None)}
    assert committed(setup.bootstrap, group, setup.other, 1) == {0: (2, None)}  # kept
    code, out, _ = run(capsys, *argv)
    assert code == 0 and "had no committed offsets" in out


def test_groups_delete_refuses_an_active_group_then_deletes_it(
    setup: Setup, member: tuple[str, Consumer], capsys: pytest.CaptureFixture[str]
) -> None:
    group, consumer = member
    code, _, err = run(capsys, "groups", "delete", group, "-b", setup.bootstrap)
    assert code == 1
    assert f"member {consumer.memberid()} (client id offsets-test-member" in err
    assert "Stop it, then delete it" in err
    consumer.close()
    code, out, err = run(capsys, "groups", "delete", group, "-b", setup.bootstrap)
    assert (code, out) == (0, f"deleted group {group!r} and its committed offsets\n"), err
    code, _, err = run(capsys, "groups", "describe", group, "-b", setup.bootstrap)
    assert code == 1 and "does not exist" in err


# --- describe ------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_describe_a_running_weir_member(
    protocol: Literal["classic", "consumer"], setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    group = setup.group()
    held = threading.Event()

    def handle(record: Record) -> None:
        if record.partition == 0 and record.offset == 0:
            held.wait(30)  # offsets 1-19 finish above it: the commit carries a map

    consumer = GroupConsumer(
        handle,
        bootstrap_servers=setup.bootstrap,
        group_id=group,
        topics=[setup.topic],
        group_protocol=protocol,
        ordering="unordered",
        commit_interval_s=0.2,
        kafka={"client.id": "weir-describe"},
    ).start()
    try:
        deadline = time.monotonic() + 30
        while True:
            code, out, err = run(
                capsys, "groups", "describe", group, "-b", setup.bootstrap, "--json"
            )
            data = json.loads(out) if code == 0 else None
            if (
                data
                and data["partitions"]
                and data["partitions"][0]["map_finished"] == 19
                and all(p["committed"] == RECORDS for p in data["partitions"][1:])
            ):
                break
            assert time.monotonic() < deadline, (out, err)
            time.sleep(0.3)
        assert (data["state"], data["protocol"], data["simple"]) == ("stable", protocol, False)
        assert data["assignor"] and data["assignor"] != "-"
        assert data["coordinator"].startswith(setup.bootstrap)
        [m] = data["members"]
        assert m["client_id"] == "weir-describe" and m["host"].lstrip("/") == "127.0.0.1"
        assert m["assignment"] == [[setup.topic, p] for p in range(3)]
        if protocol == "consumer":
            assert m["target_assignment"] == m["assignment"]
        else:
            assert m["target_assignment"] is None
        p0, p1, p2 = data["partitions"]
        assert (p0["committed"], p0["lag"], p0["map_finished"]) == (0, RECORDS, 19)
        assert 0 < p0["map_bytes"] < 64 and p0["map_problem"] is None
        assert (p1["committed"], p1["lag"], p1["map_bytes"], p1["map_finished"]) == (
            RECORDS, 0, 0, 0,
        )  # fmt: skip
        assert p2["member_id"] == m["member_id"]
        code, out, _ = run(capsys, "groups", "describe", group, "-b", setup.bootstrap)
        assert code == 0
        lines = out.splitlines()
        assert lines[0].split()[:6] == ["group", group, "state", "stable", "protocol", protocol]
        table = [line.split() for line in lines if line.startswith(f"{setup.topic} ")]
        assert table[0][:7] == [setup.topic, "0", "0", "20", "20", str(p0["map_bytes"]), "19"]
    finally:
        held.set()
        consumer.stop()
        consumer.join(30)
