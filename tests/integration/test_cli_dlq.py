"""`weir dlq show` and `weir dlq redrive` against the embedded broker, on dead letters a weir
member wrote: the failure headers shown, a dry run sends nothing, a redrive sends exactly the
selection, twice is once, and a run that crashed mid-transaction sends nothing twice."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from weir import FailurePolicy, GroupConsumer, NonRetryable, Record, RetryPolicy
from weir.cli import main
from weir.deadletters import REDRIVEN_FROM, redrive_transactional_id
from weir.testing.pytest_plugin import (
    TopicFactory,
    consume_all,
    create_topic,
    produce,
    wait_for_committed,
)

pytestmark = [pytest.mark.broker, pytest.mark.timeout(90)]


class BadOrder(NonRetryable):
    """Never worth a retry: dead-lettered after one attempt."""


def handle(record: Record) -> None:
    value = (record.value or b"").decode()
    if value.startswith("bad"):
        raise BadOrder(f"cannot charge {value}")
    if value.startswith("flaky"):
        raise TimeoutError(f"payment service timed out on {value}")


# Per source partition: the values produced (each with a `trace` header). "bad" ones fail once,
# "flaky" ones twice (two attempts), the rest succeed.
VALUES = {
    0: ["ok-0", "bad-1", "ok-2", "flaky-3", "ok-4"],
    1: ["bad-5", "ok-6", "flaky-7", "bad-8"],
}
POISON = {(p, o): v for p, vs in VALUES.items() for o, v in enumerate(vs) if not v.startswith("ok")}


@dataclass
class Letters:
    bootstrap: str
    source: str
    dlq: str
    group: str


@pytest.fixture(scope="module")
def letters(kafka_bootstrap: str, kafka_admin: AdminClient) -> Iterator[Letters]:
    """Dead letters a weir member wrote: five, in `<source>.dlq`."""
    source = create_topic(kafka_admin, partitions=2, name_prefix="dlq-orders")
    for partition, values in VALUES.items():
        records = [
            {"key": f"c-{v}", "value": v, "headers": [("trace", f"t-{v}".encode())]} for v in values
        ]
        produce(kafka_bootstrap, source, records, partition)
    group = f"dlq-payments-{uuid.uuid4().hex[:8]}"
    member = GroupConsumer(
        handle,
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        topics=[source],
        commit_interval_s=0.1,
        failure=FailurePolicy(
            retry=RetryPolicy(max_attempts=2, backoff_initial_s=0.01, jitter=0),
            final="dead_letter",
        ),
    )
    member.start()
    try:
        wait_for_committed(kafka_admin, group, source, "end", timeout=40)
    finally:
        member.stop()
        member.join(30)
    yield Letters(kafka_bootstrap, source, f"{source}.dlq", group)
    kafka_admin.delete_topics([source, f"{source}.dlq"], operation_timeout=0)


def weir(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def show_json(letters: Letters, capsys: pytest.CaptureFixture[str], *argv: str) -> list[Any]:
    code, out, err = weir(
        capsys, "dlq", "show", letters.dlq, "-b", letters.bootstrap, "--json", *argv
    )
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_show_lists_every_dead_letter_with_its_failure(
    letters: Letters, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = show_json(letters, capsys)
    assert {(r["source_partition"], r["source_offset"]): r for r in rows}.keys() == POISON.keys()
    for row in rows:
        value = POISON[(row["source_partition"], row["source_offset"])]
        assert row["source_topic"] == letters.source and row["group"] == letters.group
        assert row["key"] == f"c-{value}" and row["weir"] is True
        if value.startswith("bad"):
            assert (row["attempts"], row["exception"]) == (1, f"{__name__}.BadOrder")
            assert row["message"] == f"cannot charge {value}"
        else:
            assert (row["attempts"], row["exception"]) == (2, "builtins.TimeoutError")
        assert row["failed_at"] >= row["timestamp"] - 1000  # the write came after the failure
    assert len(show_json(letters, capsys, "--count", "2")) == 2

    code, out, err = weir(capsys, "dlq", "show", letters.dlq, "-b", letters.bootstrap)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["DLQ", "SOURCE", "ATTEMPTS", "FAILED", "AT", "KEY", "ERROR"]
    assert lines[-1] == f"5 dead letters in {letters.dlq}"
    bad_1 = next(line for line in lines if "c-bad-1" in line)
    # DLQ, SOURCE, ATTEMPTS, FAILED AT, KEY, ERROR
    cells = re.split(r"\s{2,}", bad_1.strip())
    assert cells[1:3] == [f"{letters.source}[0]@1", "1"]
    assert cells[4:] == ["c-bad-1", "BadOrder: cannot charge bad-1"]


def redrive(letters: Letters, capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = weir(
        capsys, "dlq", "redrive", letters.dlq, "-b", letters.bootstrap, "--json", *argv
    )
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def sent_to(letters: Letters, topic: str) -> list[tuple[str, dict[str, str]]]:
    """The records of `topic` (read_committed): value, and headers as text."""
    return [
        (
            (r.value or b"").decode(),
            {k: (v or b"").decode() for k, v in r.headers},
        )
        for r in consume_all(letters.bootstrap, topic, timeout=10)
    ]


def test_a_dry_run_sends_nothing(
    letters: Letters, make_topic: TopicFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    target = make_topic(1, name_prefix="dlq-target")
    result = redrive(letters, capsys, "--to", target)
    assert (result["executed"], result["to_send"], result["already_redriven"]) == (False, 5, 0)
    assert {i["status"] for i in result["items"]} == {"would send"}
    assert sent_to(letters, target) == []
    code, out, _ = weir(
        capsys, "dlq", "redrive", letters.dlq, "-b", letters.bootstrap, "--to", target
    )
    assert code == 0
    assert out.splitlines()[-1] == (
        f"dry run: would send 5 dead letters of {letters.dlq}; nothing sent (add --execute)"
    )
    one = ("--source-partition", "1", "--offset-range", "2-2", "--to", target)
    code, out, _ = weir(capsys, "dlq", "redrive", letters.dlq, "-b", letters.bootstrap, *one)
    assert out.splitlines()[-1].startswith(f"dry run: would send 1 dead letter of {letters.dlq};")


def test_a_redrive_sends_exactly_the_selection(
    letters: Letters, make_topic: TopicFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    target = make_topic(1, name_prefix="dlq-target")
    result = redrive(letters, capsys, "--to", target, "--error-contains", "badorder", "--execute")
    assert (result["sent"], result["already_redriven"]) == (3, 0)
    records = sent_to(letters, target)
    assert sorted(value for value, _ in records) == ["bad-1", "bad-5", "bad-8"]
    for value, headers in records:
        # The record's own headers, weir's dead-letter block gone, the redrive's marker added.
        assert headers.keys() == {"trace", REDRIVEN_FROM}
        assert headers["trace"] == f"t-{value}"
        assert headers[REDRIVEN_FROM].startswith(f"{letters.dlq}/")
    other = make_topic(1, name_prefix="dlq-target")
    picked = ("--source-partition", "1", "--offset-range", "1-2")
    result = redrive(letters, capsys, "--to", other, *picked, "--execute")
    assert [value for value, _ in sent_to(letters, other)] == ["flaky-7"]
    assert result["sent"] == 1


def test_a_redrive_run_twice_sends_once(
    letters: Letters, capsys: pytest.CaptureFixture[str]
) -> None:
    """Back to the source topic, in the partition each came from; the second run finds the
    markers and sends nothing."""
    first = redrive(letters, capsys, "--execute")
    assert (first["sent"], first["already_redriven"]) == (5, 0)
    second = redrive(letters, capsys, "--execute")
    assert (second["sent"], second["already_redriven"]) == (0, 5)
    assert {i["status"] for i in second["items"]} == {"already redriven"}
    back = [
        (r.partition, (r.value or b"").decode())
        for r in consume_all(letters.bootstrap, letters.source, timeout=10)
        if any(k == REDRIVEN_FROM for k, _ in r.headers)
    ]
    assert sorted(back) == sorted((p, v) for (p, _), v in POISON.items())
    assert redrive(letters, capsys)["to_send"] == 0  # a dry run now: nothing left to send


def test_a_crashed_run_is_aborted_not_repeated(
    letters: Letters, make_topic: TopicFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that died mid-transaction (its records written, not committed): the next run's
    producer aborts them, so each dead letter's record is in the target once."""
    target = make_topic(1, name_prefix="dlq-target")
    crashed = Producer(
        {
            "bootstrap.servers": letters.bootstrap,
            "transactional.id": redrive_transactional_id(letters.dlq),
        }
    )
    crashed.init_transactions(30)
    crashed.begin_transaction()
    marker: list[tuple[str, str | bytes | None]] = [(REDRIVEN_FROM, f"{letters.dlq}/0/0")]
    crashed.produce(target, value=b"half-sent", headers=marker)
    crashed.flush(30)  # in the log, never committed; the producer is abandoned
    result = redrive(letters, capsys, "--to", target, "--execute")
    assert result["sent"] == 5
    values = sorted(value for value, _ in sent_to(letters, target))
    assert values == sorted(POISON.values())  # and no "half-sent"


def test_bad_topics_are_one_line(letters: Letters, capsys: pytest.CaptureFixture[str]) -> None:
    missing = f"dlq-missing-{uuid.uuid4().hex[:8]}"
    for action in ("show", "redrive"):
        code, out, err = weir(capsys, "dlq", action, missing, "-b", letters.bootstrap)
        assert (code, out) == (1, "")
        assert err.startswith(f"weir: topic '{missing}' does not exist") and err.count("\n") == 1
    code, _, err = weir(
        capsys, "dlq", "redrive", letters.dlq, "-b", letters.bootstrap, "--to", missing
    )
    assert code == 1 and err.startswith(f"weir: topic '{missing}' does not exist")


def test_records_without_weir_headers_are_shown_and_never_redriven(
    kafka_bootstrap: str, make_topic: TopicFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    dlq = make_topic(1, name_prefix="dlq-foreign")
    produce(kafka_bootstrap, dlq, [("k", "written by something else")])
    code, out, _ = weir(capsys, "dlq", "show", dlq, "-b", kafka_bootstrap)
    assert code == 0 and "- (no weir.dlq headers)" in out
    code, out, _ = weir(capsys, "dlq", "redrive", dlq, "-b", kafka_bootstrap, "--execute")
    assert code == 0
    assert out.splitlines()[-1] == (
        f"no dead letters of {dlq} selected; 1 record without weir.dlq headers, never redriven"
    )
