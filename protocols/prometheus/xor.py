"""Prometheus XOR chunk encoding (tsdb/chunkenc/xor.go), for STREAMED_XOR_CHUNKS.

Layout: a 2-byte big-endian sample count; the first timestamp as a zigzag
varint and the first value as 64 raw bits; the second timestamp as a uvarint
delta; every later timestamp as a delta-of-delta in a prefix-coded bucket
(0 | 10+14 bits | 110+17 bits | 1110+20 bits | 1111+64 bits); every value
after the first XORed with the previous one, Gorilla style, reusing the
previous leading/trailing zero window when the new XOR fits inside it. Bits
are written most significant first and the last byte is zero-padded. Values
are handled as raw 64-bit patterns, so NaN payloads (the stale marker
0x7ff0000000000002) survive a round trip. The bit writer and reader and the value
XOR (write_xor, read_xor) are shared with the histogram chunks (histogram_chunks.py).
"""

import struct
from collections.abc import Sequence

MAX_SAMPLES = 0xFFFF  # the count header is 16 bits

_MASK64 = (1 << 64) - 1
_DOUBLE = struct.Struct(">d")
_UINT64 = struct.Struct(">Q")

# (prefix, prefix length, payload bits) for a non-zero timestamp delta-of-delta;
# a bucket of n bits holds -(2**(n-1) - 1) .. 2**(n-1), as upstream.
_DOD_BUCKETS = ((0b10, 2, 14), (0b110, 3, 17), (0b1110, 4, 20))


STALE_NAN_BITS = 0x7FF0000000000002  # the bits of Prometheus's stale marker NaN


def float_bits(value: float) -> int:
    return _UINT64.unpack(_DOUBLE.pack(value))[0]


def bits_float(bits: int) -> float:
    return _DOUBLE.unpack(_UINT64.pack(bits))[0]


def signed64(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >> 63 else value


class BitWriter:
    """Appends bit fields most significant bit first."""

    def __init__(self) -> None:
        self._out = bytearray()
        self._acc = 0
        self._nbits = 0

    def write(self, value: int, nbits: int) -> None:
        self._acc = (self._acc << nbits) | (value & ((1 << nbits) - 1))
        self._nbits += nbits
        if self._nbits >= 64:
            keep = self._nbits % 8
            self._out += (self._acc >> keep).to_bytes(self._nbits // 8, "big")
            self._acc &= (1 << keep) - 1
            self._nbits = keep

    def write_uvarint(self, value: int) -> None:
        while value >= 0x80:
            self.write((value & 0x7F) | 0x80, 8)
            value >>= 7
        self.write(value, 8)

    def getvalue(self) -> bytes:
        pad = -self._nbits % 8
        tail = (self._acc << pad).to_bytes((self._nbits + pad) // 8, "big")
        return bytes(self._out + tail)


class BitReader:
    """Reads bit fields most significant bit first."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0
        self._acc = 0
        self._nbits = 0

    def read(self, nbits: int) -> int:
        while self._nbits < nbits:
            if self._pos >= len(self._data):
                raise ValueError("chunk is truncated")
            self._acc = (self._acc << 8) | self._data[self._pos]
            self._pos += 1
            self._nbits += 8
        self._nbits -= nbits
        value = self._acc >> self._nbits
        self._acc &= (1 << self._nbits) - 1
        return value

    def read_uvarint(self) -> int:
        value = 0
        for shift in range(0, 70, 7):
            byte = self.read(8)
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                if value > _MASK64:
                    break
                return value
        raise ValueError("chunk has a malformed varint")


def encode_xor_chunk(samples: Sequence[tuple[int, float]]) -> bytes:
    """Encode (timestamp_ms, value) pairs as one XOR chunk, header included."""
    if len(samples) > MAX_SAMPLES:
        raise ValueError(f"an XOR chunk holds at most {MAX_SAMPLES} samples")
    out = BitWriter()
    out.write(len(samples), 16)
    prev_t = prev_delta = prev_bits = 0
    window = XorWindow()
    for i, (t, value) in enumerate(samples):
        bits = float_bits(value)
        if i == 0:
            out.write_uvarint(((t << 1) ^ (t >> 63)) & _MASK64)
            out.write(bits, 64)
            prev_t, prev_bits = t, bits
            continue
        delta = (t - prev_t) & _MASK64
        if i == 1:
            out.write_uvarint(delta)
        else:
            _write_dod(out, signed64(delta - prev_delta))
        write_xor(out, bits, prev_bits, window)
        prev_t, prev_delta, prev_bits = t, delta, bits
    return out.getvalue()


class XorWindow:
    """The leading/trailing zero window a run of XORed values shares (None: none chosen yet)."""

    def __init__(self) -> None:
        self.leading: int | None = None
        self.trailing = 0


def write_xor(out: BitWriter, bits: int, prev_bits: int, window: XorWindow) -> None:
    """One value (raw 64 bits) XORed with the previous one, reusing the window when it fits."""
    xor = bits ^ prev_bits
    if xor == 0:
        out.write(0, 1)
        return
    leading = min(64 - xor.bit_length(), 31)  # 5-bit field
    trailing = (xor & -xor).bit_length() - 1
    if window.leading is not None and leading >= window.leading and trailing >= window.trailing:
        out.write(0b10, 2)
        out.write(xor >> window.trailing, 64 - window.leading - window.trailing)
        return
    window.leading, window.trailing = leading, trailing
    significant = 64 - leading - trailing
    out.write(0b11, 2)
    out.write(leading, 5)
    out.write(significant & 0x3F, 6)  # 64 is stored as 0
    out.write(xor >> trailing, significant)


def read_xor(reader: BitReader, prev_bits: int, window: XorWindow) -> int:
    """The next value's raw 64 bits (the reader side of write_xor)."""
    if not reader.read(1):
        return prev_bits
    if reader.read(1):
        window.leading = reader.read(5)
        significant = reader.read(6) or 64
        window.trailing = 64 - window.leading - significant
        if window.trailing < 0:
            raise ValueError("chunk has an impossible value width")
    leading = window.leading or 0  # a reader with no window yet reads all 64 bits, as upstream
    return prev_bits ^ (reader.read(64 - leading - window.trailing) << window.trailing)


def _write_dod(out: BitWriter, dod: int) -> None:
    if dod == 0:
        out.write(0, 1)
        return
    for prefix, prefix_bits, nbits in _DOD_BUCKETS:
        half = 1 << (nbits - 1)
        if -(half - 1) <= dod <= half:
            out.write(prefix, prefix_bits)
            out.write(dod, nbits)
            return
    out.write(0b1111, 4)
    out.write(dod, 64)


def decode_xor_chunk(data: bytes) -> list[tuple[int, float]]:
    """Decode one XOR chunk (header included) into (timestamp_ms, value) pairs."""
    reader = BitReader(data)
    count = reader.read(16)
    samples: list[tuple[int, float]] = []
    t = delta = bits = 0
    window = XorWindow()
    for i in range(count):
        if i == 0:
            zigzag = reader.read_uvarint()
            t = signed64((zigzag >> 1) ^ -(zigzag & 1))
            bits = reader.read(64)
            samples.append((t, bits_float(bits)))
            continue
        if i == 1:
            delta = reader.read_uvarint()
        else:
            delta = (delta + _read_dod(reader)) & _MASK64
        t = signed64(t + delta)
        bits = read_xor(reader, bits, window)
        samples.append((t, bits_float(bits)))
    return samples


def _read_dod(reader: BitReader) -> int:
    # Each further 1 bit of the prefix selects the next, wider bucket.
    if not reader.read(1):
        return 0
    for _, _, nbits in _DOD_BUCKETS:
        if not reader.read(1):
            value = reader.read(nbits)
            return value - (1 << nbits) if value > 1 << (nbits - 1) else value
    return signed64(reader.read(64))
