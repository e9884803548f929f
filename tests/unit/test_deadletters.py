"""weir.deadletters without a broker: a dead letter's headers read back, the selection, the
headers a redrive sends (the redrive itself: tests/integration/test_cli_dlq.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from weir.deadletters import HEADERS, REDRIVEN_FROM, DeadLetter, Selection

pytestmark = pytest.mark.timeout(30)


@dataclass
class Message:
    """What DeadLetter.of reads of a confluent-kafka message."""

    headers_: list[tuple[str, bytes | None]] = field(default_factory=list)

    def topic(self) -> str:
        return "orders.dlq"

    def partition(self) -> int:
        return 1

    def offset(self) -> int:
        return 7

    def timestamp(self) -> tuple[int, int]:
        return 1, 1_700_000_000_000

    def key(self) -> bytes:
        return b"c-1"

    def value(self) -> bytes:
        return b"{}"

    def headers(self) -> list[tuple[str, bytes | None]]:
        return self.headers_


WEIR = [
    ("weir.dlq.topic", b"orders"),
    ("weir.dlq.partition", b"2"),
    ("weir.dlq.offset", b"41"),
    ("weir.dlq.timestamp", b""),
    ("weir.dlq.attempts", b"3"),
    ("weir.dlq.exception", b"payments.InvalidOrder"),
    ("weir.dlq.message", b"amount -5 is not positive"),
    ("weir.dlq.group", b"payments"),
    ("weir.dlq.failed_at", b"1700000000123"),
]


def test_a_dead_letter_reads_every_header_weir_writes() -> None:
    assert [name for name, _ in WEIR] == list(HEADERS)
    letter = DeadLetter.of(Message([("trace", b"t1"), *WEIR]))
    assert (letter.topic, letter.partition, letter.offset, letter.timestamp_ms) == (
        "orders.dlq",
        1,
        7,
        1_700_000_000_000,
    )
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == ("orders", 2, 41)
    assert (letter.attempts, letter.group, letter.failed_at_ms) == (3, "payments", 1700000000123)
    assert letter.exception == "payments.InvalidOrder"
    assert letter.error == "InvalidOrder: amount -5 is not positive"
    assert letter.is_weir and letter.marker == "orders.dlq/1/7"


def test_a_record_without_weir_headers_is_shown_but_never_selected() -> None:
    letter = DeadLetter.of(Message([("weir.dlq.partition", b"two"), ("trace", None)]))
    assert not letter.is_weir
    assert (letter.source_topic, letter.source_partition, letter.attempts) == (None, None, None)
    assert letter.error == ""
    assert not Selection().matches(letter)


def test_a_redrive_sends_the_records_own_headers_and_one_marker() -> None:
    """weir's block (appended last) goes, and so does an earlier redrive's marker: the record
    sent again carries its own headers, in order, and this redrive's marker only."""
    own = [("trace", b"t1"), ("weir.dlq.topic", b"kept: the record's own, not weir's block")]
    letter = DeadLetter.of(Message([*own, (REDRIVEN_FROM, b"orders.dlq/0/3"), *WEIR]))
    assert letter.original_headers() == own


@pytest.mark.parametrize(
    ("selection", "taken"),
    [
        (Selection(), True),
        (Selection(source_topic="orders"), True),
        (Selection(source_topic="refunds"), False),
        (Selection(source_partitions=frozenset({0, 2})), True),
        (Selection(source_partitions=frozenset({1})), False),
        (Selection(first_offset=41, last_offset=41), True),
        (Selection(first_offset=42), False),
        (Selection(last_offset=40), False),
        (Selection(error_contains="invalidorder"), True),
        (Selection(error_contains="NOT POSITIVE"), True),
        (Selection(error_contains="Timeout"), False),
        (Selection(source_topic="orders", error_contains="Timeout"), False),
    ],
)
def test_a_selection_takes_what_matches_every_field(selection: Selection, taken: bool) -> None:
    assert selection.matches(DeadLetter.of(Message(list(WEIR)))) is taken


def test_an_empty_offset_range_is_refused() -> None:
    with pytest.raises(ValueError, match="the offset range 9-3 is empty"):
        Selection(first_offset=9, last_offset=3)
