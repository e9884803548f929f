"""The offset map: which offsets above a committed offset are already finished, carried in the
commit's metadata string.

A committed offset is the earliest unfinished delivered offset, so everything finished above it is
replayed by the next owner. The map lets that owner skip those records instead. It travels in
``TopicPartition(..., metadata=text)``, which the broker caps at ``offset.metadata.max.bytes``
(4096 by default; the Python client sends the string with a trailing NUL, counted here). A map
that outgrows the cap must never block a commit, so the encoder keeps the longest prefix of
offsets that fits and says how far it reaches: offsets past it are simply replayed.

Text format (version 1), all ASCII::

    weir1:<base64 of body, no padding>

    body = kind (1 byte) | base (LEB128) | covered (LEB128) | payload | CRC-32 (4 bytes, big end)

``kind`` says how the payload stores the finished flags of offsets ``[base, base + covered)``:
run lengths, a bitset, or raw deflate of either. The CRC covers the ``weir1:`` prefix and the body
before it. docs/offset-map.md describes every byte.

Both directions work on flags, one byte per offset (index i = offset base + i; 1 = finished or
never delivered, 0 = not finished), the form the engine tracks per polled batch. Encoding and
decoding use C-level operations (``find``, ``translate``, ``int``, ``zlib``) with at most a Python
loop per run of equal flags, never per offset.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

__all__ = ["Encoded", "FinishedMap", "NoMap", "decode_finished", "encode_finished"]

DEFAULT_MAX_BYTES = 4096
"""The broker's default ``offset.metadata.max.bytes``."""

MIN_MAX_BYTES = 64
"""Room for the largest header (prefix, kind, a 63-bit base, covered, CRC) with an empty map."""

MAX_COVERED = 1 << 24
"""A map covers at most this many offsets, so a decoded map holds at most 16 MiB of flags
whatever a (possibly forged) metadata string claims. The encoder treats offsets past it like
offsets that do not fit: they are left out and replayed."""

_MAX_OFFSET = (1 << 63) - 1  # Kafka offsets are signed 64-bit
_VERSION = "1"
_PREFIX = "weir" + _VERSION + ":"
_PREFIX_BYTES = _PREFIX.encode("ascii")
_CRC_SIZE = 4
_EAGER_RUNS = 256

Kind = Literal["runs", "bitset", "deflate-runs", "deflate-bitset"]
_KIND_CODES: dict[str, int] = {"runs": 0, "bitset": 1, "deflate-runs": 2, "deflate-bitset": 3}
_KIND_NAMES: tuple[Kind, ...] = ("runs", "bitset", "deflate-runs", "deflate-bitset")

_TO_ASCII = bytes.maketrans(b"\x00\x01", b"01")
_FROM_ASCII = bytes.maketrans(b"01", b"\x00\x01")


# --- the results ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Encoded:
    """An encoded map, ready to send as commit metadata.

    ``covered`` offsets from ``base`` are described: a finished offset in ``[base, base +
    covered)`` is in the map, every other offset in that range was not finished. ``truncated`` is
    True when finished offsets at or past ``base + covered`` were left out to respect the size
    limit; the next owner replays them.
    """

    text: str
    base: int
    covered: int
    truncated: bool
    kind: Kind

    @property
    def size(self) -> int:
        """Bytes the broker counts against ``offset.metadata.max.bytes``: the text and the NUL
        the Python client sends after it."""
        return len(self.text) + 1


class FinishedMap:
    """The finished offsets a decoded map describes, as one flag byte per covered offset.

    "Finished" is what the encoder was given: finished, or never delivered (a gap).

    One byte per offset (at most `MAX_COVERED`) keeps ``is_finished`` O(1) and has the same shape
    as the engine's per-batch flags; ``ranges`` walks it a run at a time.
    """

    __slots__ = ("_base", "_count", "_flags")

    def __init__(self, base: int, flags: bytes) -> None:
        self._base = base
        self._flags = flags
        self._count = flags.count(1)

    @property
    def base(self) -> int:
        """The committed offset the map applies to."""
        return self._base

    @property
    def covered(self) -> int:
        """How many offsets from `base` the map describes."""
        return len(self._flags)

    @property
    def end(self) -> int:
        """The first offset the map says nothing about (``base + covered``)."""
        return self._base + len(self._flags)

    @property
    def count(self) -> int:
        """How many offsets the map marks finished."""
        return self._count

    @property
    def flags(self) -> bytes:
        """One byte per covered offset, index i = offset ``base + i``: 1 finished, 0 not."""
        return self._flags

    def is_finished(self, offset: int) -> bool:
        """True when the map marks ``offset`` finished; False outside ``[base, end)``."""
        i = offset - self._base
        return 0 <= i < len(self._flags) and self._flags[i] == 1

    def ranges(self) -> Iterator[tuple[int, int]]:
        """The finished offsets as half-open ranges ``(start, stop)``, in increasing order."""
        flags = self._flags
        base = self._base
        i = flags.find(1)
        while i >= 0:
            j = flags.find(0, i)
            if j < 0:
                j = len(flags)
            yield base + i, base + j
            i = flags.find(1, j)

    def __repr__(self) -> str:
        return f"FinishedMap(base={self._base}, covered={self.covered}, finished={self._count})"


@dataclass(frozen=True)
class NoMap:
    """Why a metadata string gave no map; the caller logs ``reason`` and replays as usual.

    ``cause`` sorts the reasons for the log level: ``"empty"`` is the normal case of a group
    committed without a map (no metadata), the others deserve a warning.
    """

    cause: Literal["empty", "foreign", "version", "corrupt", "stale"]
    reason: str


# --- varints ----------------------------------------------------------------------------------


def _varint_len(value: int) -> int:
    return (value.bit_length() + 6) // 7 or 1


def _put_varint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _varint(value: int) -> bytes:
    out = bytearray()
    _put_varint(out, value)
    return bytes(out)


class _Corrupt(Exception):
    """A payload that no encoder of this version writes (internal: decode returns a NoMap)."""


def _get_varint(data: bytes, pos: int) -> tuple[int, int]:
    """Value and next position of the LEB128 varint at ``pos``; at most 9 bytes (63 bits)."""
    value = 0
    shift = 0
    end = len(data)
    while True:
        if pos >= end:
            raise _Corrupt("a number runs past the end")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift >= 63:
            raise _Corrupt("a number is longer than 63 bits")


# --- payloads ---------------------------------------------------------------------------------


def _bitset(flags: bytes | bytearray, stop: int) -> bytes:
    """Flags [0, stop) as bits, first offset in the top bit of the first byte. ``int(..., 2)``
    converts the whole thing at C level (power-of-two bases are linear and have no digit
    limit)."""
    if stop == 0:
        return b""
    nbytes = (stop + 7) // 8
    digits = flags[:stop].translate(_TO_ASCII) + b"0" * (nbytes * 8 - stop)
    return int(digits, 2).to_bytes(nbytes, "big")


def _deflate(data: bytes) -> bytes:
    # Raw deflate (no zlib header or Adler-32): the map has its own CRC, and 6 bytes count here.
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    return packer.compress(data) + packer.flush()


class _Runs:
    """Run lengths of a flags buffer, scanned on demand.

    Runs alternate finished / not finished, starting with a finished run that may be empty. The
    table only grows. `size` walks a few runs, then checks a C-level lower bound (the number of
    flag changes) before walking further, so a buffer of many short runs, where the bitset wins
    anyway, is not walked run by run.
    """

    __slots__ = ("_buf", "_cum", "_ends", "_flags", "_stop")

    def __init__(self, flags: bytes | bytearray, stop: int) -> None:
        self._flags = flags
        self._stop = stop
        self._ends: list[int] = []  # exclusive end of run j; even j finished, odd j not
        self._cum: list[int] = [0]  # _cum[j]: varint bytes of runs 0 .. j-1
        self._buf = bytearray()  # those varints

    def _scan_past(self, index: int, max_runs: int = -1) -> None:
        """Extend the table until the run holding ``index`` is known, or by ``max_runs`` runs."""
        flags, stop, ends = self._flags, self._stop, self._ends
        pos = ends[-1] if ends else 0
        finished = len(ends) % 2 == 0
        while pos <= index and pos < stop and max_runs:
            nxt = flags.find(0 if finished else 1, pos, stop)
            if nxt < 0:
                nxt = stop
            _put_varint(self._buf, nxt - pos)
            self._cum.append(len(self._buf))
            ends.append(nxt)
            pos = nxt
            finished = not finished
            max_runs -= 1

    def _locate(self, last: int) -> tuple[int, int]:
        """Index and start of the (finished) run holding offset index ``last``."""
        j = bisect_right(self._ends, last)
        return j, self._ends[j - 1] if j else 0

    def size(self, last: int, limit: int) -> int | None:
        """Payload bytes for flags [0, last] (flags[last] is 1), or None when over ``limit``."""
        ends = self._ends
        if not ends or ends[-1] <= last:
            # A few runs are cheaper to walk than the O(n) bound below: the usual map has few.
            self._scan_past(last, _EAGER_RUNS)
        if not ends or ends[-1] <= last:
            if len(ends) >= limit:
                return None  # these runs and the one holding `last`: a byte each at least
            prefix = self._flags[: last + 1]
            as_int = int.from_bytes(prefix, "big")
            transitions = (as_int ^ (as_int >> 8)).bit_count() - prefix[0]
            if transitions >= limit:
                return None  # transitions + 1 runs, a byte each at least
            self._scan_past(last)
        j, start = self._locate(last)
        size = self._cum[j] + _varint_len(last + 1 - start)
        return size if size <= limit else None

    def payload(self, last: int) -> bytes:
        self._scan_past(last)
        j, start = self._locate(last)
        return bytes(self._buf[: self._cum[j]]) + _varint(last + 1 - start)


# --- encoding ---------------------------------------------------------------------------------


class _Encoder:
    """The sizes and payloads of one call's candidate maps for each prefix [0, n)."""

    __slots__ = ("_base_varint", "_flags", "_runs")

    def __init__(self, base: int, flags: bytes | bytearray, stop: int) -> None:
        self._flags = flags
        self._base_varint = _varint(base)
        self._runs = _Runs(flags, stop)

    def header_size(self, covered: int) -> int:
        return 1 + len(self._base_varint) + _varint_len(covered) + _CRC_SIZE

    def _raw(self, n: int, limit: int) -> tuple[Kind, int, int] | None:
        """The smaller raw form of prefix n as (kind, size, last + 1), None when both pass
        ``limit``."""
        stop = self._flags.rfind(1, 0, n) + 1
        if stop == 0:
            return "runs", 0, 0
        bits = (stop + 7) // 8
        runs = self._runs.size(stop - 1, min(limit, bits))
        if runs is not None:
            return "runs", runs, stop
        return ("bitset", bits, stop) if bits <= limit else None

    def raw_fits(self, n: int, budget: int) -> bool:
        return self._raw(n, budget - self.header_size(n)) is not None

    def best(self, n: int) -> tuple[Kind, bytes]:
        """The smallest payload of prefix n (on a tie: run lengths, the bitset, deflate)."""
        kind, _, stop = self._raw(n, 1 << 62) or ("runs", 0, 0)
        if stop == 0:
            return "runs", b""
        inner = self._runs.payload(stop - 1) if kind == "runs" else _bitset(self._flags, stop)
        packed = _deflate(inner)
        if len(packed) < len(inner):
            return ("deflate-runs" if kind == "runs" else "deflate-bitset"), packed
        return kind, inner

    def best_size(self, n: int) -> int:
        return self.header_size(n) + len(self.best(n)[1])

    def text(self, n: int, kind: Kind, payload: bytes) -> str:
        body = bytearray((_KIND_CODES[kind],))
        body += self._base_varint
        _put_varint(body, n)
        body += payload
        body += zlib.crc32(body, zlib.crc32(_PREFIX_BYTES)).to_bytes(_CRC_SIZE, "big")
        return _PREFIX + base64.b64encode(body).decode("ascii").rstrip("=")


def _body_budget(max_bytes: int) -> int:
    """The largest body whose text, plus the NUL, fits in max_bytes: unpadded base64 of b
    bytes is ceil(4b/3) characters."""
    chars = max_bytes - 1 - len(_PREFIX)
    return chars * 3 // 4


def _flags_bytes(flags: bytes | bytearray | memoryview) -> bytes | bytearray:
    if isinstance(flags, (bytes, bytearray)):
        return flags
    if isinstance(flags, memoryview):
        if flags.itemsize != 1:
            raise TypeError(
                f"flags must be bytes-like with 1-byte items, got format {flags.format}"
            )
        return flags.tobytes()
    raise TypeError(f"flags must be bytes, bytearray or memoryview, got {type(flags).__name__}")


def encode_finished(
    base: int, flags: bytes | bytearray | memoryview, max_bytes: int = DEFAULT_MAX_BYTES
) -> Encoded:
    """Encode which offsets from ``base`` are finished, in at most ``max_bytes``.

    ``flags[i]`` is 1 when offset ``base + i`` is finished or was never delivered (a gap), 0 when
    it is not finished. ``max_bytes`` counts the text and the trailing NUL the client sends:
    pass the broker's ``offset.metadata.max.bytes`` less whatever the caller reserves.

    The map reaches the last finished offset; trailing unfinished offsets are implied. When it
    does not fit, the longest prefix that fits is kept (``truncated``) rather than failing the
    commit: a binary search over the prefix length, O(log n) size probes, each C-level over the
    prefix (the deflate probes compress it). Never raises for a map that is too large.
    """
    if isinstance(base, bool) or not isinstance(base, int):
        raise TypeError(f"base must be an int offset, got {type(base).__name__}")
    if not 0 <= base <= _MAX_OFFSET:
        raise ValueError(f"base must be an offset in [0, 2**63 - 1], got {base}")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
        raise TypeError(f"max_bytes must be an int, got {type(max_bytes).__name__}")
    if max_bytes < MIN_MAX_BYTES:
        raise ValueError(f"max_bytes must be at least {MIN_MAX_BYTES}, got {max_bytes}")
    data = _flags_bytes(flags)
    if data.translate(None, b"\x00\x01"):
        bad = next(i for i, v in enumerate(data) if v > 1)
        raise ValueError(f"flags must hold only 0 and 1; flags[{bad}] is {data[bad]}")
    if base + len(data) - 1 > _MAX_OFFSET:
        raise ValueError(f"flags run past the largest offset: base {base} + {len(data)} flags")

    last_finished = data.rfind(1) + 1  # the map's natural end: past it all is unfinished
    limit = min(last_finished, MAX_COVERED)
    enc = _Encoder(base, data, limit)
    budget = _body_budget(max_bytes)

    if last_finished <= MAX_COVERED:
        kind, payload = enc.best(last_finished)
        if enc.header_size(last_finished) + len(payload) <= budget:
            return Encoded(enc.text(last_finished, kind, payload), base, last_finished, False, kind)
        too_long = last_finished  # the smallest length known not to fit
    else:
        too_long = MAX_COVERED + 1

    # Truncate. The raw forms grow with the prefix, so their longest fit is found by plain
    # binary search with cheap size probes; deflate only needs probing past it.
    lo, hi = 0, too_long
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if enc.raw_fits(mid, budget):
            lo = mid
        else:
            hi = mid
    # Deflate sizes are not monotone in the prefix, so search for a boundary n that fits with
    # n + 1 not fitting: gallop up from the raw fit (probes stay near the answer, each one
    # compresses a prefix) and bisect the last step. Every probe above lo either fits, moving
    # lo, or becomes the new hi, so the invariant fits(lo) and not fits(hi) holds throughout.
    hi = too_long
    step = max(64, lo)
    while hi - lo > 1:
        probe = min(lo + step, hi - 1) if step else (lo + hi) // 2
        if enc.best_size(probe) > budget:
            hi = probe
            step = 0  # found a ceiling: bisect from here on
        else:
            lo = probe
            if step:
                step *= 2
    kind, payload = enc.best(lo)
    return Encoded(enc.text(lo, kind, payload), base, lo, True, kind)


# --- decoding ---------------------------------------------------------------------------------


def _runs_to_flags(payload: bytes, covered: int) -> bytes:
    out = bytearray(covered)
    pos = 0
    i = 0
    finished = True
    end = len(payload)
    while i < end:
        length, i = _get_varint(payload, i)
        stop = pos + length
        if stop > covered:
            raise _Corrupt(f"runs reach past the {covered} covered offsets")
        if finished and length:
            out[pos:stop] = b"\x01" * length
        pos = stop
        finished = not finished
    return bytes(out)


def _bitset_to_flags(payload: bytes, covered: int) -> bytes:
    if len(payload) > (covered + 7) // 8:
        raise _Corrupt(f"bitset of {len(payload)} bytes for {covered} covered offsets")
    nbits = len(payload) * 8
    if not nbits:
        return bytes(covered)
    digits = format(int.from_bytes(payload, "big"), f"0{nbits}b").encode("ascii")
    flags = digits.translate(_FROM_ASCII)
    if nbits > covered:
        if flags.find(1, covered) >= 0:
            raise _Corrupt("bits set past the covered offsets")
        return flags[:covered]
    return flags + bytes(covered - nbits)


def _inflate(payload: bytes, limit: int) -> bytes:
    unpacker = zlib.decompressobj(-15)
    try:
        data = unpacker.decompress(payload, limit + 1)
    except zlib.error as exc:
        raise _Corrupt(f"deflate stream: {exc}") from None
    if len(data) > limit or not unpacker.eof or unpacker.unused_data:
        raise _Corrupt("deflate stream is longer than the covered offsets need, or cut short")
    return data


def _parse(text: str, committed_offset: int) -> FinishedMap | NoMap:
    if not text.startswith("weir"):
        return NoMap("foreign", f"metadata of {len(text)} characters is not a weir offset map")
    head, sep, encoded = text.partition(":")
    version = head[4:]
    if not sep or not version or not (version.isascii() and version.isdigit()):
        return NoMap("foreign", f"metadata of {len(text)} characters is not a weir offset map")
    if version != _VERSION:
        shown = version if len(version) <= 8 else version[:8] + "..."
        return NoMap("version", f"offset map version {shown} is not known here (knows 1)")
    try:
        body = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):  # non-base64 or non-ASCII characters, bad length
        return NoMap("corrupt", "offset map is not valid base64")
    if base64.b64encode(body).rstrip(b"=") != encoded.encode("ascii"):
        # Set padding bits: the encoder never writes them, and refusing them means any one
        # changed character is caught.
        return NoMap("corrupt", "offset map is not canonical base64")
    if len(body) < 3 + _CRC_SIZE:
        return NoMap("corrupt", f"offset map of {len(body)} bytes is too short")
    core = body[:-_CRC_SIZE]
    if zlib.crc32(core, zlib.crc32(_PREFIX_BYTES)) != int.from_bytes(body[-_CRC_SIZE:], "big"):
        return NoMap("corrupt", "offset map fails its CRC-32 check")
    kind_code = core[0]
    if kind_code >= len(_KIND_NAMES):
        return NoMap("corrupt", f"offset map kind {kind_code} is not known")
    kind = _KIND_NAMES[kind_code]
    try:
        base, pos = _get_varint(core, 1)
        covered, pos = _get_varint(core, pos)
        if covered > MAX_COVERED or base + covered - 1 > _MAX_OFFSET:
            raise _Corrupt(f"offset map covers {covered} offsets from {base}")
        if base != committed_offset:
            return NoMap(
                "stale",
                f"offset map is for offset {base}, the committed offset is {committed_offset}",
            )
        payload = core[pos:]
        bits_limit = (covered + 7) // 8
        if kind == "runs":
            flags = _runs_to_flags(payload, covered)
        elif kind == "bitset":
            flags = _bitset_to_flags(payload, covered)
        elif kind == "deflate-runs":
            # The encoder deflates runs only when they are no larger than the bitset.
            flags = _runs_to_flags(_inflate(payload, bits_limit), covered)
        else:
            flags = _bitset_to_flags(_inflate(payload, bits_limit), covered)
    except _Corrupt as exc:
        return NoMap("corrupt", f"offset map ({kind}): {exc}")
    return FinishedMap(base, flags)


def decode_finished(text: str | None, committed_offset: int) -> FinishedMap | NoMap:
    """Read back the map committed with ``committed_offset``, or say why there is none.

    ``text`` is the committed ``TopicPartition.metadata`` (None or "" when the group was committed
    without metadata). A map whose base is not ``committed_offset`` (someone committed or reset the
    offset since) is refused: its flags describe other offsets. Never raises on any string: foreign
    or damaged metadata costs only the replay the map would have saved.
    """
    if text is not None and not isinstance(text, str):
        raise TypeError(f"text must be a str or None, got {type(text).__name__}")
    if isinstance(committed_offset, bool) or not isinstance(committed_offset, int):
        raise TypeError(f"committed_offset must be an int, got {type(committed_offset).__name__}")
    # A client that reads the metadata as bytes sees the NUL the Python client sent with it.
    text = (text or "").rstrip("\x00")
    if not text:
        return NoMap("empty", "no metadata: the offset was committed without a map")
    return _parse(text, committed_offset)
