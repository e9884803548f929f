"""`weir tail` against the embedded broker: every start position, count, the end, isolation,
and that it joins no group; in a process of its own for Ctrl-C and a closed pipe."""

from __future__ import annotations

import json
import signal
import subprocess
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from tests.processes import WEIR, ctrl_c_as_at_a_terminal
from weir.cli import main
from weir.testing.pytest_plugin import TopicFactory, commit_offsets, produce

pytestmark = [pytest.mark.broker, pytest.mark.timeout(60)]

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, in ms
# Records stamped T0 are older than the broker's 7-day retention: a retention pass (30 s after
# the broker starts, then every 5 min) between producing them and reading them deletes them all.
KEEP = {"retention.ms": "-1"}


def tail(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[Any], str]:
    """Exit code, the records printed (as --json objects), stderr."""
    code = main(["tail", *argv, "--json"])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


@pytest.fixture
def topic(kafka_bootstrap: str, make_topic: TopicFactory) -> str:
    """Two partitions, five records each a second apart (partition 0: v0..v4, 1: w0..w4)."""
    name = make_topic(2, name_prefix="tail", config=KEEP)
    for partition, letter in ((0, "v"), (1, "w")):
        records = [
            {"key": f"k{i}", "value": f"{letter}{i}", "timestamp": T0 + 1000 * i} for i in range(5)
        ]
        produce(kafka_bootstrap, name, records, partition)
    return name


def values(records: list[Any]) -> list[str]:
    return sorted(r["value"] for r in records)


def test_from_the_beginning_to_the_end(
    kafka_bootstrap: str, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, records, err = tail(
        capsys, topic, "-b", kafka_bootstrap, "--from-beginning", "--no-follow"
    )
    assert (code, err) == (0, "")
    assert values(records) == [f"{c}{i}" for c in "vw" for i in range(5)]
    first = next(r for r in records if r["value"] == "w2")
    assert first == {
        "topic": topic,
        "partition": 1,
        "offset": 2,
        "timestamp": T0 + 2000,
        "time": "2026-01-01T00:00:02.000Z",
        "key": "k2",
        "value": "w2",
        "headers": [],
    }
    by_partition = [[r["offset"] for r in records if r["partition"] == p] for p in (0, 1)]
    assert by_partition == [[0, 1, 2, 3, 4]] * 2  # each partition in order


def test_from_an_offset_of_one_partition_and_from_the_end(
    kafka_bootstrap: str, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    b = ("-b", kafka_bootstrap, "--exit-at-end")
    code, records, _ = tail(capsys, topic, *b, "--from-offset", "3", "-p", "1")
    assert (code, values(records)) == (0, ["w3", "w4"])
    code, records, _ = tail(capsys, topic, *b, "--from-offset", "-1")  # the last of each
    assert (code, values(records)) == (0, ["v4", "w4"])
    code, records, err = tail(capsys, topic, *b, "--from-offset", "9", "-p", "0")
    assert (code, records) == (0, [])
    assert "partition 0: offset 9 is outside the log (0 to 5), reading from its end, 5" in err
    code, records, err = tail(capsys, topic, *b)  # the default: from the end, nothing yet
    assert (code, records) == (0, [])
    # A tail that shows nothing says why (`tail -n 5` would have shown the last five).
    assert err == (
        f"weir: reading {topic} from its end, so only records written from now on appear: "
        "--from-beginning, or --from-offset -N for the last N of each partition\n"
    )
    code, records, err = tail(capsys, topic, *b, "--from-offset", "-1")
    assert (code, err) == (0, "")


def test_from_a_datetime(
    kafka_bootstrap: str, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    b = ("-b", kafka_bootstrap, "--no-follow")
    code, records, _ = tail(capsys, topic, *b, "--from-datetime", "2026-01-01T00:00:03Z")
    assert (code, values(records)) == (0, ["v3", "v4", "w3", "w4"])
    code, records, _ = tail(capsys, topic, *b, "--from-datetime", "2026-01-01T01:00:03+01:00")
    assert values(records) == ["v3", "v4", "w3", "w4"]
    code, records, _ = tail(capsys, topic, *b, "--from-datetime", "2030-01-01")  # after all
    assert (code, records) == (0, [])


def test_count_stops_a_follower(
    kafka_bootstrap: str, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Following (the default), it would wait for more: the count ends it.
    code, records, _ = tail(capsys, topic, "-b", kafka_bootstrap, "--from-beginning", "-n", "3")
    assert (code, len(records)) == (0, 3)


def test_text_output_with_headers_and_decoders(
    kafka_bootstrap: str, make_topic: TopicFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    name = make_topic(1, name_prefix="tail-text", config=KEEP)
    record = {"key": b"\x01\xff", "value": b'{"id": 7}', "timestamp": T0, "headers": [("h", b"x")]}
    produce(kafka_bootstrap, name, [record, {"key": None, "value": None, "timestamp": T0}])
    argv = ["tail", name, "-b", kafka_bootstrap, "--from-beginning", "--no-follow", "--headers"]
    assert main([*argv, "--key-format", "hex", "--value-format", "json-pretty"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "0@0  2026-01-01T00:00:00.000Z  01ff  {",
        '  "id": 7',
        "}",
        "    h: x",
        "0@1  2026-01-01T00:00:00.000Z  (null)  (null)",
    ]


def transactions(bootstrap: str, topic: str) -> None:
    """Transactions: committed (c0, c1), aborted (a0, a1), committed (c2)."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"tail-{uuid.uuid4().hex}"}
    )
    producer.init_transactions(30)
    for values_, commit in ((["c0", "c1"], True), (["a0", "a1"], False), (["c2"], True)):
        producer.begin_transaction()
        for value in values_:
            producer.produce(topic, value=value)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.flush(30)
            producer.abort_transaction(30)


def test_read_committed_hides_aborted_records(
    kafka_bootstrap: str, make_topic: TopicFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    name = make_topic(1, name_prefix="tail-txn")
    transactions(kafka_bootstrap, name)
    argv = (name, "-b", kafka_bootstrap, "--from-beginning", "--no-follow")
    code, records, _ = tail(capsys, *argv)
    assert (code, [r["value"] for r in records]) == (0, ["c0", "c1", "c2"])
    code, records, _ = tail(capsys, *argv, "--isolation", "read_uncommitted")
    assert (code, [r["value"] for r in records]) == (0, ["c0", "c1", "a0", "a1", "c2"])


def group_ids(admin: AdminClient) -> set[str]:
    return {g.group_id for g in admin.list_consumer_groups().result(10).valid}


def test_it_joins_no_group_and_commits_nothing(
    kafka_bootstrap: str, kafka_admin: AdminClient, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A group committed to first: the coordinator is up, so a commit of the tail would land.
    control = f"tail-control-{uuid.uuid4().hex[:8]}"
    commit_offsets(kafka_bootstrap, control, topic, {0: 1})
    before = group_ids(kafka_admin)
    assert control in before
    code, records, _ = tail(capsys, topic, "-b", kafka_bootstrap, "--from-beginning", "-n", "10")
    assert (code, len(records)) == (0, 10)
    assert group_ids(kafka_admin) == before


def test_a_missing_topic_or_partition_is_one_line(
    kafka_bootstrap: str, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = f"tail-missing-{uuid.uuid4().hex[:8]}"
    assert main(["tail", missing, "-b", kafka_bootstrap]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"weir: topic '{missing}' does not exist") and err.count("\n") == 1
    assert main(["tail", topic, "-b", kafka_bootstrap, "-p", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"weir: topic '{topic}' has no partition 2 (it has 2: 0 to 1)")


@pytest.mark.slow  # two processes of their own: about 7 s
def test_ctrl_c_ends_a_follower_and_a_closed_pipe_ends_it_quietly(
    kafka_bootstrap: str, topic: str, make_topic: TopicFactory
) -> None:
    follower = subprocess.Popen(
        [str(WEIR), "tail", topic, "-b", kafka_bootstrap, "-p", "0", "--from-offset", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_as_at_a_terminal,
    )
    try:
        assert follower.stdout is not None and follower.stderr is not None
        assert follower.stdout.readline().split()[-1] == "v4"
        produce(kafka_bootstrap, topic, [("k", "later")], 0)  # followed: it arrives
        assert follower.stdout.readline().split()[-1] == "later"
        follower.send_signal(signal.SIGINT)
        assert follower.wait(15) == 130
        assert follower.stderr.read() == ""
    finally:
        follower.kill()
        follower.wait(10)
    # More than a pipe holds (64 KiB): the writes after `head` has gone fail, whenever it goes.
    # (Following an idle topic, a closed pipe is seen at the next record's write, as `tail -f`.)
    many = make_topic(1, name_prefix="tail-many")
    produce(kafka_bootstrap, many, [(f"k{i}", "x" * 100) for i in range(2000)])
    piped = subprocess.run(
        [
            "bash",
            "-c",
            f"set -o pipefail; {WEIR} tail {many} -b {kafka_bootstrap} --from-beginning "
            "--no-follow | head -n 1",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (piped.returncode, piped.stderr, len(piped.stdout.splitlines())) == (141, "", 1)
