"""The offset map codec case by case: the encodings it picks, truncation at the broker's limit,
the decoded map's API, and every reason a metadata string gives no map."""

from __future__ import annotations

import base64
import random
import zlib

import pytest

from weir.offsetmap import (
    DEFAULT_MAX_BYTES,
    MAX_COVERED,
    MIN_MAX_BYTES,
    FinishedMap,
    NoMap,
    decode_finished,
    encode_finished,
)

# What a caller keeps free of the broker's 4096 bytes (room for its own use of the metadata).
RESERVE = 96


def decoded(text: str, committed: int) -> FinishedMap:
    got = decode_finished(text, committed)
    assert isinstance(got, FinishedMap), got
    return got


def refused(text: str | None, committed: int) -> NoMap:
    got = decode_finished(text, committed)
    assert isinstance(got, NoMap), got
    return got


def forged(body: bytes) -> str:
    """A map text around ``body`` with a valid CRC: what only a buggy or hostile writer sends."""
    crc = zlib.crc32(body, zlib.crc32(b"weir1:")).to_bytes(4, "big")
    return "weir1:" + base64.b64encode(body + crc).decode("ascii").rstrip("=")


# --- sizes and truncation -------------------------------------------------------------------


def test_alternating_100k_compresses_into_the_limit_without_truncation() -> None:
    # Strict alternation is the worst case for run lengths (a byte per offset) and the bitset
    # (12.5 KB) but deflate folds it to a few dozen bytes: nothing is dropped.
    flags = b"\x00\x01" * 50_000
    encoded = encode_finished(1_000, flags, DEFAULT_MAX_BYTES - RESERVE)
    assert encoded.kind == "deflate-bitset"
    assert not encoded.truncated
    assert encoded.covered == 100_000
    assert encoded.size <= 100
    got = decoded(encoded.text, 1_000)
    assert got.flags == flags
    assert got.count == 50_000
    assert got.is_finished(1_001) and not got.is_finished(1_000)
    assert got.is_finished(100_999) and not got.is_finished(101_000)


def test_incompressible_100k_is_truncated_to_what_fits_and_decodes_exactly() -> None:
    rnd = random.Random(7)
    flags = bytes(rnd.getrandbits(1) for _ in range(100_000))
    limit = DEFAULT_MAX_BYTES - RESERVE
    encoded = encode_finished(1_000, flags, limit)
    assert encoded.truncated
    assert encoded.size <= limit
    assert encoded.size > limit - 8  # the prefix fills the room: base64 steps are 4 characters
    assert 20_000 < encoded.covered < 100_000
    got = decoded(encoded.text, 1_000)
    assert got.covered == encoded.covered
    assert got.flags == flags[: encoded.covered]
    assert got.end == 1_000 + encoded.covered
    # Past the covered prefix nothing is claimed, even where the input was finished.
    beyond = flags.find(1, encoded.covered)
    assert beyond >= 0 and not got.is_finished(1_000 + beyond)


def test_alternating_100k_at_a_small_limit_is_truncated_not_refused() -> None:
    flags = b"\x00\x01" * 50_000
    rnd = random.Random(3)
    # Break the period every few offsets so deflate cannot fold it.
    noisy = bytes(f if rnd.random() > 0.1 else 1 - f for f in flags)
    encoded = encode_finished(0, noisy, MIN_MAX_BYTES)
    assert encoded.truncated and encoded.size <= MIN_MAX_BYTES
    assert decoded(encoded.text, 0).flags == noisy[: encoded.covered]


def test_the_nul_the_client_sends_is_counted() -> None:
    rnd = random.Random(11)
    flags = bytes(rnd.getrandbits(1) for _ in range(40_000))
    for limit in range(4090, 4097):
        encoded = encode_finished(5, flags, limit)
        assert len(encoded.text) + 1 == encoded.size <= limit


def test_offsets_past_max_covered_are_left_out() -> None:
    flags = bytearray(b"\x01") * (MAX_COVERED + 10)
    flags[0] = 0
    encoded = encode_finished(0, flags)
    assert encoded.truncated
    assert encoded.covered == MAX_COVERED
    assert encoded.size < 40  # two runs
    got = decoded(encoded.text, 0)
    assert got.count == MAX_COVERED - 1
    assert not got.is_finished(MAX_COVERED)


# --- the encodings chosen -------------------------------------------------------------------


def test_all_finished_is_one_run() -> None:
    encoded = encode_finished(42, b"\x01" * 100_000)
    assert encoded.kind == "runs"
    assert (encoded.covered, encoded.truncated) == (100_000, False)
    got = decoded(encoded.text, 42)
    assert list(got.ranges()) == [(42, 100_042)]


def test_sparse_holes_are_run_lengths() -> None:
    flags = bytearray(b"\x01") * 10_000
    for i in (0, 17, 5_000, 9_000):
        flags[i] = 0
    encoded = encode_finished(0, flags)
    assert encoded.kind == "runs"
    got = decoded(encoded.text, 0)
    assert list(got.ranges()) == [(1, 17), (18, 5_000), (5_001, 9_000), (9_001, 10_000)]
    assert got.count == 9_996


def test_random_flags_are_a_bitset() -> None:
    rnd = random.Random(5)
    flags = bytes(rnd.getrandbits(1) for _ in range(2_000))
    encoded = encode_finished(0, flags)
    assert encoded.kind == "bitset"
    assert decoded(encoded.text, 0).flags == flags[: encoded.covered]


def test_on_a_tie_the_runs_are_what_is_deflated() -> None:
    # 401 finished/unfinished runs of 8: 401 bytes as runs and as a bitset. Past 256 runs the
    # encoder sizes runs from a lower bound first; the bound must not drop a tie.
    flags = (b"\x01" * 8 + b"\x00" * 8) * 200 + b"\x01" * 8
    encoded = encode_finished(0, flags)
    assert encoded.kind == "deflate-runs"
    assert decoded(encoded.text, 0).flags == flags


def test_trailing_unfinished_offsets_are_not_stored() -> None:
    encoded = encode_finished(10, b"\x00\x01\x01" + b"\x00" * 1_000)
    assert (encoded.covered, encoded.truncated) == (3, False)
    got = decoded(encoded.text, 10)
    assert got.end == 13
    assert list(got.ranges()) == [(11, 13)]


@pytest.mark.parametrize("flags", [b"", b"\x00" * 500])
def test_nothing_finished_is_an_empty_map(flags: bytes) -> None:
    encoded = encode_finished(7, flags)
    assert (encoded.covered, encoded.truncated, encoded.kind) == (0, False, "runs")
    got = decoded(encoded.text, 7)
    assert (got.covered, got.count, list(got.ranges())) == (0, 0, [])
    assert not got.is_finished(7)


def test_text_is_ascii_and_says_what_it_is() -> None:
    encoded = encode_finished((1 << 63) - 2, b"\x00\x01")
    assert encoded.text.startswith("weir1:")
    assert encoded.text.isascii() and "\x00" not in encoded.text and "=" not in encoded.text
    assert decoded(encoded.text, (1 << 63) - 2).is_finished((1 << 63) - 1)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_flags_may_be_any_byte_buffer(kind: type) -> None:
    encoded = encode_finished(0, kind(b"\x00\x01\x01\x00\x01"))
    assert decoded(encoded.text, 0).flags == b"\x00\x01\x01\x00\x01"


# --- bad input to the encoder ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((0, b"\x00\x02\x01"), ValueError, r"flags\[1\] is 2"),
        ((0, [0, 1]), TypeError, "flags must be bytes"),
        ((0, memoryview(b"\x00" * 16).cast("q")), TypeError, "1-byte items"),
        ((-1, b"\x01"), ValueError, "base must be an offset"),
        ((1 << 63, b"\x01"), ValueError, "base must be an offset"),
        ((True, b"\x01"), TypeError, "base must be an int"),
        (((1 << 63) - 1, b"\x01\x01"), ValueError, "past the largest offset"),
        ((0, b"\x01", MIN_MAX_BYTES - 1), ValueError, "max_bytes must be at least"),
        ((0, b"\x01", 4096.0), TypeError, "max_bytes must be an int"),
    ],
)
def test_bad_input_is_refused_with_its_name(
    args: tuple[object, ...], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        encode_finished(*args)  # type: ignore[arg-type]


# --- why a string gives no map --------------------------------------------------------------


@pytest.mark.parametrize("text", [None, "", "\x00"])
def test_no_metadata_is_no_map_quietly(text: str | None) -> None:
    assert refused(text, 5).cause == "empty"


@pytest.mark.parametrize("text", ["hello", "weird", "weir:abc", "weirx:abc", '{"a": 1}'])
def test_foreign_metadata_is_ignored_without_echoing_it(text: str) -> None:
    no = refused(text, 5)
    assert no.cause == "foreign"
    assert text not in no.reason


def test_an_unknown_version_is_named() -> None:
    no = refused("weir2:AAAA", 5)
    assert (no.cause, no.reason) == ("version", "offset map version 2 is not known here (knows 1)")
    assert refused("weir" + "9" * 5000 + ":AAAA", 5).cause == "version"


def test_a_map_for_another_offset_is_stale() -> None:
    text = encode_finished(100, b"\x00\x01").text
    no = refused(text, 101)
    assert no.cause == "stale"
    assert "100" in no.reason and "101" in no.reason


def test_a_trailing_nul_is_accepted() -> None:
    text = encode_finished(3, b"\x00\x01").text
    assert decoded(text + "\x00", 3).flags == b"\x00\x01"


def test_a_changed_character_fails_the_crc() -> None:
    text = encode_finished(3, b"\x00\x01" * 40).text
    i = len(text) // 2
    damaged = text[:i] + ("A" if text[i] != "A" else "B") + text[i + 1 :]
    assert refused(damaged, 3).cause == "corrupt"


def test_padding_bits_are_refused() -> None:
    text = encode_finished(3, b"\x00\x01").text
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    assert len(text.removeprefix("weir1:")) % 4 in (2, 3)  # the last character has spare bits
    flipped = alphabet[alphabet.index(text[-1]) ^ 1]
    no = refused(text[:-1] + flipped, 3)
    assert (no.cause, no.reason) == ("corrupt", "offset map is not canonical base64")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("weir1:", "too short"),
        ("weir1:A", "not valid base64"),
        ("weir1:AAAA*AAA", "not valid base64"),
        ("weir1:\u00e9t\u00e9", "not valid base64"),
        (forged(b"\x07\x00\x00"), "kind 7"),
        (forged(b"\x00\x00\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"), "63 bits"),
        (forged(b"\x00\x00\x80"), "past the end"),
        (forged(b"\x00\x00\x81\x80\x80\x08"), "covers 16777217 offsets"),  # MAX_COVERED + 1
        (forged(b"\x00\x00\x04\x01\x04"), "past the 4 covered"),
        (forged(b"\x01\x00\x04\x01"), "bits set past"),
        (forged(b"\x01\x00\x04\x00\x00"), "bitset of 2 bytes"),
        (forged(b"\x03\x00\x04\xff\xff"), "deflate"),
    ],
)
def test_malformed_maps_are_corrupt(text: str, reason: str) -> None:
    no = refused(text, 0)
    assert no.cause == "corrupt"
    assert reason in no.reason


def test_a_deflate_bomb_stops_at_the_covered_size() -> None:
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = packer.compress(b"\xff" * 10_000_000) + packer.flush()
    no = refused(forged(b"\x03\x00\x10" + bomb), 0)  # 16 offsets: 2 bytes of bitset at most
    assert no.cause == "corrupt"
    assert "longer than the covered offsets need" in no.reason


# --- the decoded map ------------------------------------------------------------------------


def test_finished_map_answers_per_offset_and_per_range() -> None:
    got = FinishedMap(100, b"\x00\x01\x01\x00\x01")
    assert (got.base, got.covered, got.end, got.count) == (100, 5, 105, 3)
    assert [o for o in range(95, 110) if got.is_finished(o)] == [101, 102, 104]
    assert list(got.ranges()) == [(101, 103), (104, 105)]
    assert repr(got) == "FinishedMap(base=100, covered=5, finished=3)"


def test_decode_refuses_non_string_metadata_as_a_bug() -> None:
    with pytest.raises(TypeError, match="text must be a str"):
        decode_finished(b"weir1:", 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="committed_offset must be an int"):
        decode_finished("", "0")  # type: ignore[arg-type]
