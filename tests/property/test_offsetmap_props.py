"""Property tests of the offset map codec: exact round trips, never more than was finished, the
longest prefix that fits, the size limit, and a decoder that never raises.

The size oracle here re-derives every encoding from the documented format with plain loops, so
it checks the module's choice and its search independently of their fast paths.
"""

from __future__ import annotations

import base64
import random
import zlib

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from weir.offsetmap import (
    MIN_MAX_BYTES,
    FinishedMap,
    NoMap,
    decode_finished,
    encode_finished,
)

# Derandomized: the same examples on every run and every machine, so a red run is reproducible.
SETTINGS = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

MAX_OFFSET = (1 << 63) - 1


# --- an independent model of the format --------------------------------------------------------


def leb128(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def model_payloads(flags: bytes) -> list[bytes]:
    """Every payload the format allows for the prefix ``flags``, written offset by offset."""
    stop = 0
    for i, flag in enumerate(flags):
        if flag:
            stop = i + 1
    if stop == 0:
        return [b""]
    runs: list[int] = []
    current, length = 1, 0  # runs start with a finished one, possibly empty
    for flag in flags[:stop]:
        if flag == current:
            length += 1
        else:
            runs.append(length)
            current, length = flag, 1
    runs.append(length)
    run_payload = b"".join(leb128(r) for r in runs)
    bits = bytearray((stop + 7) // 8)
    for i in range(stop):
        if flags[i]:
            bits[i // 8] |= 0x80 >> (i % 8)
    inner = run_payload if len(run_payload) <= len(bits) else bytes(bits)
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    return [run_payload, bytes(bits), packer.compress(inner) + packer.flush()]


def model_size(base: int, flags: bytes, n: int) -> int:
    """Bytes on the wire (text and NUL) of the smallest map of offsets [base, base + n)."""
    payload = min(len(p) for p in model_payloads(flags[:n]))
    body = 1 + len(leb128(base)) + len(leb128(n)) + payload + 4
    return len("weir1:") + -(-4 * body // 3) + 1


# --- strategies ---------------------------------------------------------------------------------


@st.composite
def flag_buffers(draw: st.DrawFn) -> bytes:
    """Runs of random lengths (long runs, sparse holes), bytes at random (short runs), mostly
    finished at random or a random block repeated (deflate's cases: compressible, and often too
    long for the raw forms)."""
    shape = draw(st.sampled_from(["runs", "random", "biased", "periodic"]))
    if shape == "biased":
        rnd = random.Random(draw(st.integers(0, 2**32)))
        finished = draw(st.sampled_from([0.8, 0.9, 0.97]))
        return bytes(rnd.random() < finished for _ in range(draw(st.integers(0, 12_000))))
    if shape == "runs":
        runs = draw(st.lists(st.integers(1, 300), max_size=40))
        first = draw(st.integers(0, 1))
        return b"".join(bytes([(first + i) % 2]) * r for i, r in enumerate(runs))
    if shape == "random":
        return bytes(draw(st.lists(st.integers(0, 1), max_size=3000)))
    block = bytes(draw(st.lists(st.integers(0, 1), min_size=2, max_size=64)))
    return block * draw(st.integers(1, 12_000 // len(block)))


bases = st.one_of(st.integers(0, 1_000), st.integers(0, MAX_OFFSET - 5_000))
# Small limits force truncation on buffers a test can afford; 4096 is the broker's default.
max_sizes = st.one_of(st.integers(MIN_MAX_BYTES, 400), st.just(4096))


def last_finished(flags: bytes) -> int:
    return flags.rfind(1) + 1


# --- properties -----------------------------------------------------------------------------------


@SETTINGS
@given(bases, flag_buffers(), max_sizes)
@example(0, b"", MIN_MAX_BYTES)
@example(MAX_OFFSET - 5_000, b"\x00\x01" * 1_500, MIN_MAX_BYTES)
def test_encoding_fits_and_decodes_to_exactly_the_covered_flags(
    base: int, flags: bytes, max_bytes: int
) -> None:
    encoded = encode_finished(base, flags, max_bytes)
    assert encoded.size <= max_bytes
    assert encoded.size == len(encoded.text.encode("utf-8")) + 1
    assert encoded.text.isascii() and "\x00" not in encoded.text

    decoded = decode_finished(encoded.text, base)
    assert isinstance(decoded, FinishedMap), decoded
    assert decoded.base == base and decoded.covered == encoded.covered
    # Never more than was finished, and nothing finished inside the covered range is lost.
    assert decoded.flags == flags[: encoded.covered]
    for start, stop in decoded.ranges():
        assert flags[start - base : stop - base] == b"\x01" * (stop - start)
    assert decoded.count == flags[: encoded.covered].count(1)

    if encoded.truncated:
        assert encoded.covered < last_finished(flags)
    else:
        assert encoded.covered == last_finished(flags)  # trailing unfinished offsets implied


@SETTINGS
@given(bases, flag_buffers(), max_sizes)
def test_the_smallest_encoding_is_chosen_and_the_prefix_is_the_longest_that_fits(
    base: int, flags: bytes, max_bytes: int
) -> None:
    encoded = encode_finished(base, flags, max_bytes)
    assert encoded.size == model_size(base, flags, encoded.covered)
    if encoded.truncated:
        assert model_size(base, flags, encoded.covered + 1) > max_bytes


@SETTINGS
@given(bases, flag_buffers(), max_sizes, st.integers(-3, 3).filter(bool))
def test_a_map_for_another_offset_is_refused(
    base: int, flags: bytes, max_bytes: int, shift: int
) -> None:
    encoded = encode_finished(base, flags, max_bytes)
    decoded = decode_finished(encoded.text, base + shift)
    assert isinstance(decoded, NoMap)
    assert decoded.cause == "stale"


@SETTINGS
@given(st.text())
@example("weir1:")
@example("weir1:====")
@example("weir9999999999999999999999:AAAA")
@example("weir1:\u00e9\u00e9\u00e9\u00e9")
def test_decode_never_raises_on_any_text(text: str) -> None:
    decoded = decode_finished(text, 0)
    assert isinstance(decoded, NoMap)


def with_crc(body: bytes) -> str:
    crc = zlib.crc32(body, zlib.crc32(b"weir1:")).to_bytes(4, "big")
    return "weir1:" + base64.b64encode(body + crc).decode("ascii").rstrip("=")


@SETTINGS
@given(st.binary(max_size=200), st.integers(0, 1_000))
@example(b"\x02\x00\x10" + b"\xff" * 50, 0)  # deflate-runs of garbage
@example(b"\x00\x00\x80\x80\x80\x80\x80\x80\x80\x80\x01", 0)  # covered longer than 63 bits
@example(b"\x00\x00\x05\x06", 0)  # a run past the covered offsets
def test_decode_never_raises_on_any_body_that_passes_the_crc(body: bytes, committed: int) -> None:
    # Past the CRC, the parser meets arbitrary kinds, varints and payloads.
    decoded = decode_finished(with_crc(body), committed)
    if isinstance(decoded, FinishedMap):
        assert decoded.base == committed
        assert len(decoded.flags) == decoded.covered
        assert set(decoded.flags) <= {0, 1}


@SETTINGS
@given(bases, flag_buffers(), st.data())
def test_a_damaged_map_is_refused_not_misread(base: int, flags: bytes, data: st.DataObject) -> None:
    text = encode_finished(base, flags).text
    i = data.draw(st.integers(0, len(text) - 1))
    replacement = data.draw(st.characters(codec="ascii").filter(lambda c: c != text[i]))
    damaged = text[:i] + replacement + text[i + 1 :]
    decoded = decode_finished(damaged, base)
    # One changed character is always caught: in the prefix it is foreign or another version,
    # in the body it breaks the base64 or the CRC-32.
    assert isinstance(decoded, NoMap), damaged
