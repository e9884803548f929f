"""`weir lag` and `weir groups` against the embedded broker: every number, JSON, and failures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from tests.processes import ctrl_c_as_at_a_terminal
from weir.cli import main
from weir.testing.pytest_plugin import TopicFactory, commit_offsets, produce

pytestmark = [
    pytest.mark.broker,
    pytest.mark.timeout(90),
]

# Records per partition of the first topic, and the group's committed offsets (none on 2).
PRODUCED = {0: 5, 1: 3, 2: 4}
COMMITTED = {0: 2, 1: 3}
# Lag: end - committed; partition 2 has no commit, so its lag counts from the log start (0).
LAG = {0: 3, 1: 0, 2: 4}


@dataclass
class Group:
    bootstrap: str
    group: str
    orders: str  # 3 partitions, lag 3 / 0 / 4
    audit: str  # 1 partition, 2 records, committed 1: lag 1


@pytest.fixture
def group(kafka_bootstrap: str, make_topic: TopicFactory) -> Group:
    orders = make_topic(3, name_prefix="lag-orders")
    audit = make_topic(1, name_prefix="lag-audit")
    for partition, count in PRODUCED.items():
        produce(kafka_bootstrap, orders, [(f"k{i}", f"v{i}") for i in range(count)], partition)
    produce(kafka_bootstrap, audit, [("a", "1"), ("b", "2")])
    name = f"weir-lag-{uuid.uuid4().hex[:8]}"
    commit_offsets(kafka_bootstrap, name, orders, COMMITTED)
    commit_offsets(kafka_bootstrap, name, audit, {0: 1})
    return Group(kafka_bootstrap, name, orders, audit)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def table_rows(out: str) -> dict[str, list[str]]:
    """Data rows of the plain (piped) table, keyed by 'topic partition' or 'topic total'."""
    rows = {}
    for line in out.splitlines():
        cells = line.split()
        if len(cells) >= 2 and cells[0].startswith("lag-"):
            rows[f"{cells[0]} {cells[1]}"] = cells[2:]
    return rows


def test_table_shows_every_number(group: Group, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "lag", "-b", group.bootstrap, "-g", group.group)
    assert code == 0, err
    assert "\x1b[" not in out  # piped: no colour codes
    heading = out.splitlines()[0].split()
    assert heading[:2] == ["group", group.group]
    assert heading[heading.index("state") + 1] == "empty"
    assert heading[heading.index("members") + 1] == "0"
    assert heading[-3:] == ["total", "lag", "8"]  # 3 + 0 + 4 on orders, 1 on audit
    rows = table_rows(out)
    o, a = group.orders, group.audit
    # committed, log end, lag, [hottest mark], member, client id, host
    assert rows[f"{o} 0"] == ["2", "5", "3", "-", "-", "-"]
    assert rows[f"{o} 1"] == ["3", "3", "0", "-", "-", "-"]
    assert rows[f"{o} 2"] == ["-", "4", "4", "◀", "hottest", "-", "-", "-"]
    assert rows[f"{o} total"] == ["7"]
    assert rows[f"{a} 0"] == ["1", "2", "1", "-", "-", "-"]
    assert rows[f"{a} total"] == ["1"]
    assert len(rows) == 6


def test_json_is_stable_and_complete(group: Group, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "lag", "-b", group.bootstrap, "-g", group.group, "--json")
    assert code == 0
    assert out.count("\n") == 1  # one object, one line
    data = json.loads(out)
    assert list(data) == [
        "group",
        "state",
        "type",
        "simple",
        "members",
        "total_lag",
        "topics",
        "hottest",
        "partitions",
    ]
    assert (data["group"], data["state"], data["type"], data["simple"]) == (
        group.group,
        "empty",
        "classic",
        True,
    )
    assert data["members"] == 0 and data["total_lag"] == 8
    assert data["topics"] == {group.orders: 7, group.audit: 1}
    assert data["hottest"] == {"topic": group.orders, "partition": 2, "lag": 4}
    expected = [
        {
            "topic": group.audit,
            "partition": 0,
            "committed": 1,
            "log_start": 0,
            "log_end": 2,
            "lag": 1,
            "member_id": None,
            "client_id": None,
            "host": None,
        }
    ] + [
        {
            "topic": group.orders,
            "partition": p,
            "committed": COMMITTED.get(p),
            "log_start": 0,
            "log_end": PRODUCED[p],
            "lag": LAG[p],
            "member_id": None,
            "client_id": None,
            "host": None,
        }
        for p in range(3)
    ]
    assert data["partitions"] == sorted(expected, key=lambda r: (r["topic"], r["partition"]))


def test_topic_filter(group: Group, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ("lag", "-b", group.bootstrap, "-g", group.group, "-t", group.audit, "--json")
    code, out, _ = run(capsys, *argv)
    assert code == 0
    data = json.loads(out)
    assert data["topics"] == {group.audit: 1} and data["total_lag"] == 1
    assert [(p["topic"], p["partition"]) for p in data["partitions"]] == [(group.audit, 0)]


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_each_partition_shows_its_owner(
    protocol: str, group: Group, capsys: pytest.CaptureFixture[str]
) -> None:
    member = Consumer(
        {
            "bootstrap.servers": group.bootstrap,
            "group.id": group.group,
            "group.protocol": protocol,
            "client.id": "weir-lag-test",
            "enable.auto.commit": False,
            "auto.offset.reset": "latest",
        }
    )
    try:
        member.subscribe([group.orders])
        deadline = time.monotonic() + 30
        while len(member.assignment()) < 3:
            assert time.monotonic() < deadline, member.assignment()
            member.poll(0.1)
        argv = ("lag", "-b", group.bootstrap, "-g", group.group, "-t", group.orders, "--json")
        data = json.loads(run(capsys, *argv)[1])
        assert data["state"] == "stable" and data["members"] == 1
        assert data["type"] == protocol and data["simple"] is False
        for row in data["partitions"]:
            assert row["member_id"] == member.memberid()
            assert row["client_id"] == "weir-lag-test"
            assert row["host"].lstrip("/") == "127.0.0.1"
        # The member reads but never commits: the lag is still the committed one.
        assert [row["lag"] for row in data["partitions"]] == [LAG[p] for p in range(3)]
    finally:
        member.close()


def test_groups_lists_state_members_and_lag(
    group: Group, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "groups", "-b", group.bootstrap, "--json")
    assert code == 0
    ours = [row for row in json.loads(out) if row["group"] == group.group]
    assert ours == [
        {
            "group": group.group,
            "state": "empty",
            "type": "classic",
            "simple": True,
            "members": 0,
            "total_lag": 8,
        }
    ]
    code, out, _ = run(capsys, "groups", "-b", group.bootstrap)
    assert code == 0
    line = next(line for line in out.splitlines() if line.startswith(group.group + " "))
    assert line.split() == [group.group, "empty", "classic", "(simple)", "0", "8"]


def test_missing_group(kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]) -> None:
    missing = f"weir-no-such-group-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    code, out, err = run(capsys, "lag", "-b", kafka_bootstrap, "-g", missing)
    assert code == 1 and out == ""
    assert err.splitlines() == [
        f"weir: group {missing!r} does not exist: no members and no committed offsets "
        f"(cluster {kafka_bootstrap})"
    ]
    assert time.monotonic() - started < 10


def test_missing_topic(group: Group, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "lag", "-b", group.bootstrap, "-g", group.group, "-t", "nope-t")
    assert code == 1
    assert "topic 'nope-t' does not exist" in err


@pytest.mark.parametrize("command", [["lag", "-g", "any"], ["groups"]])
def test_unreachable_broker_is_one_line_and_quick(command: list[str]) -> None:
    # What the interpreter and the CLI's imports take before the command starts its 2 s, on a
    # machine as loaded as it is now: timed the same way, with a command that ends there.
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-c", "import weir.cli, weir.admin, weir.lag"], timeout=30, check=True
    )
    start_up = time.monotonic() - started
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "weir.cli", *command, "-b", "127.0.0.1:1", "--timeout", "2"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 1
    assert result.stdout == ""
    # One line: no traceback, no librdkafka "Connect to ... failed" lines.
    assert result.stderr.splitlines() == [
        "weir: no Kafka broker answered at 127.0.0.1:1 within 2 s (Local: Timed out); "
        "check --bootstrap-servers, or raise --timeout"
    ]
    assert elapsed >= 2 and elapsed - start_up < 5, (elapsed, start_up)


@pytest.fixture
def watcher(group: Group) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "weir.cli", "lag", "-b", group.bootstrap),
            *("-g", group.group, "--watch", "0.3", "--json"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=ctrl_c_as_at_a_terminal,
    )
    yield proc
    proc.kill()
    proc.wait(10)


def test_watch_repeats_until_ctrl_c(group: Group, watcher: subprocess.Popen[str]) -> None:
    assert watcher.stdout is not None
    first = json.loads(watcher.stdout.readline())
    commit_offsets(group.bootstrap, group.group, group.orders, {2: 4})  # partition 2 caught up
    deadline = time.monotonic() + 20
    while True:
        latest = json.loads(watcher.stdout.readline())
        if latest["total_lag"] != first["total_lag"] or time.monotonic() > deadline:
            break
    assert (first["total_lag"], latest["total_lag"]) == (8, 4)
    watcher.send_signal(signal.SIGINT)
    assert watcher.wait(10) == 0
    assert watcher.stderr is not None and "Traceback" not in watcher.stderr.read()


@pytest.mark.parametrize("output", ["--json", "--table"])
def test_watch_piped_into_head_ends_quietly(group: Group, output: str) -> None:
    """Regression: `weir lag --watch --json | head` ended with a BrokenPipeError traceback (and
    exit 1): the reader leaving ends a watch like Ctrl-C does, with exit code 0."""
    weir = Path(sys.executable).with_name("weir")
    options = "--json" if output == "--json" else ""
    script = (
        f"set -o pipefail; {weir} lag -b {group.bootstrap} -g {group.group} --watch 0.2 "
        f"{options} | head -n 2"
    )
    result = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    if output == "--json":
        assert [json.loads(line)["total_lag"] for line in lines] == [8, 8]
    else:
        assert lines[0].split()[:2] == ["group", group.group]
