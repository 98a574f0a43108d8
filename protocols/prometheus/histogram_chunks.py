"""Prometheus's native histogram chunk encodings (tsdb/chunkenc), for STREAMED_XOR_CHUNKS.

Both encodings start with a 2-byte big-endian sample count and a flags byte whose top two bits
are the counter-reset header (see RESET_HEADERS). The first sample then writes the chunk's
layout, which every later sample of the chunk shares: the zero threshold (one byte for 0 or a
power of two in 2^-243..2^10, else 0xff and 64 bits), the schema (varbit int), the positive
and the negative spans (varbit uint count, then length as varbit uint and offset as varbit
int), and for the custom-buckets schema -53 the custom bounds (varbit uint count, each a
multiple of 0.001 up to 33554.43 as varbit uint(bound*1000 + 1), else a 0 bit and 64 bits).

- EncHistogram (2), integer counts: the first sample writes its timestamp as varbit int, the
  count and zero count as varbit uint, the sum as 64 bits and each bucket's delta (to the
  previous bucket, as the protobuf carries them) as varbit int. Later samples write the
  delta-of-delta of the timestamp, count, zero count and of each bucket delta as varbit ints,
  and the sum XORed with the previous sum (Gorilla, as XOR chunks do).
- EncFloatHistogram (3): the first sample writes the timestamp as varbit int, then count, zero
  count, sum and each bucket's absolute count as 64 bits; later samples write the timestamp's
  delta-of-delta as varbit int and every value XORed with its previous value, each value with
  its own leading/trailing zero window.

Varbit numbers are a unary prefix choosing a width (0 | 10+3 | 110+6 | 1110+9 | 11110+12 |
111110+18 | 1111110+25 | 11111110+56 | 11111111+64 bits). A stale marker (sum with the stale
NaN's bits) keeps only its sum, as upstream. docs/prometheus.rst tells how tsgate cuts chunks.
"""

import math
from collections.abc import Sequence
from typing import NamedTuple

from . import types_pb2
from .write import CUSTOM_BUCKETS_SCHEMA
from .xor import (
    MAX_SAMPLES,
    STALE_NAN_BITS,
    BitReader,
    BitWriter,
    XorWindow,
    bits_float,
    float_bits,
    read_xor,
    signed64,
    write_xor,
)

# Counter-reset headers (top two bits of the third byte) and the protobuf hint each stands for.
UNKNOWN_COUNTER_RESET, NOT_COUNTER_RESET, COUNTER_RESET, GAUGE_TYPE = 0x00, 0x40, 0x80, 0xC0
RESET_HEADERS = {
    types_pb2.Histogram.UNKNOWN: UNKNOWN_COUNTER_RESET,
    types_pb2.Histogram.NO: NOT_COUNTER_RESET,
    types_pb2.Histogram.YES: COUNTER_RESET,
    types_pb2.Histogram.GAUGE: GAUGE_TYPE,
}

# (prefix, prefix bits, payload bits) of varbit numbers, narrowest first.
_VARBIT = (
    (0b10, 2, 3),
    (0b110, 3, 6),
    (0b1110, 4, 9),
    (0b11110, 5, 12),
    (0b111110, 6, 18),
    (0b1111110, 7, 25),
    (0b11111110, 8, 56),
)
_CUSTOM_BOUND_LIMIT = 33554430  # bound * 1000 that still fits the 4-byte varbit


class NativeHistogram(NamedTuple):
    """One native histogram sample as chunks hold it. Integer histograms keep bucket deltas (each
    to the previous bucket, as the protobuf does), float ones absolute counts; spans are
    (offset, length) pairs; ``hint`` is a types_pb2.Histogram.ResetHint value."""

    timestamp: int
    is_float: bool
    hint: "types_pb2.Histogram.ResetHint"
    schema: int
    zero_threshold: float
    total: int | float  # the count of observations
    zero_count: int | float
    sum: float
    positive_spans: tuple[tuple[int, int], ...] = ()
    negative_spans: tuple[tuple[int, int], ...] = ()
    positive: tuple = ()
    negative: tuple = ()
    custom_values: tuple[float, ...] = ()

    @property
    def is_stale(self) -> bool:
        return float_bits(self.sum) == STALE_NAN_BITS

    def layout(self) -> tuple:
        """What the chunk writes once for all its samples (floats as bits, so NaN equals NaN)."""
        custom = tuple(map(float_bits, self.custom_values)) if self.schema == CUSTOM_BUCKETS_SCHEMA else ()
        return (self.schema, float_bits(self.zero_threshold), self.positive_spans, self.negative_spans, custom)


def from_protobuf(timestamp: int, data: bytes) -> NativeHistogram:
    """A stored prometheus.Histogram message (its bytes) as a chunk sample at ``timestamp``."""
    h = types_pb2.Histogram.FromString(data)
    is_float = h.WhichOneof("count") == "count_float"
    zero_count = h.zero_count_float if h.WhichOneof("zero_count") == "zero_count_float" else h.zero_count_int
    return NativeHistogram(
        timestamp,
        is_float,
        h.reset_hint,
        h.schema,
        h.zero_threshold,
        h.count_float if is_float else h.count_int,
        float(zero_count) if is_float else int(zero_count),
        h.sum,
        tuple((s.offset, s.length) for s in h.positive_spans),
        tuple((s.offset, s.length) for s in h.negative_spans),
        tuple(h.positive_counts) if is_float else tuple(h.positive_deltas),
        tuple(h.negative_counts) if is_float else tuple(h.negative_deltas),
        tuple(h.custom_values),
    )


def reset_header(previous: NativeHistogram | None, h: NativeHistogram) -> int:
    """The counter-reset header of a chunk starting with ``h`` right after ``previous`` (the last
    sample of the series' previous chunk of the same encoding, or None), as chunkenc's
    appenders decide it: a reset when the hint says so, or when the count, the zero count or a
    bucket went down (a bucket that disappears counts as going to 0), or custom bounds changed;
    unknown after a stale marker or across a schema or zero threshold change."""
    if h.hint == types_pb2.Histogram.GAUGE:
        return GAUGE_TYPE
    if h.hint == types_pb2.Histogram.YES:
        return COUNTER_RESET
    if previous is None:
        return UNKNOWN_COUNTER_RESET
    if h.is_stale:
        return NOT_COUNTER_RESET
    if previous.hint == types_pb2.Histogram.GAUGE:
        return NOT_COUNTER_RESET  # after a gauge chunk, as upstream
    if previous.is_stale:
        return UNKNOWN_COUNTER_RESET
    if h.total < previous.total:
        return COUNTER_RESET
    if h.schema != previous.schema or float_bits(h.zero_threshold) != float_bits(previous.zero_threshold):
        return UNKNOWN_COUNTER_RESET
    if h.schema == CUSTOM_BUCKETS_SCHEMA and previous.custom_values != h.custom_values:
        return COUNTER_RESET
    if h.zero_count < previous.zero_count or _bucket_went_down(previous, h):
        return COUNTER_RESET
    return NOT_COUNTER_RESET


def _bucket_went_down(previous: NativeHistogram, h: NativeHistogram) -> bool:
    for side in ("positive", "negative"):
        before, after = _bucket_counts(previous, side), _bucket_counts(h, side)
        if any(count > after.get(index, 0) for index, count in before.items()):
            return True
    return False


def _bucket_counts(h: NativeHistogram, side: str) -> dict[int, float]:
    """Bucket index -> absolute count of one side."""
    counts, index, current = {}, 0, 0
    values = iter(getattr(h, side))
    for offset, length in getattr(h, f"{side}_spans"):
        index += offset
        for _ in range(length):
            value = next(values, 0)
            current = value if h.is_float else current + value
            counts[index] = current
            index += 1
    return counts


def cut_chunks(
    histograms: Sequence[NativeHistogram], max_samples: int = 120
) -> list[tuple[int, list[NativeHistogram]]]:
    """Time-ordered histograms of one encoding as (counter-reset header, samples) chunks.

    A new chunk starts after ``max_samples``, at a counter reset (or an unknown one), at a
    change between gauge and counter histograms, and when the layout changes. chunkenc's
    appender would instead re-code the chunk for a layout that only gains buckets; tsgate cuts
    there too, so every histogram comes back with exactly the spans it was written with. The
    first chunk follows no chunk of its encoding (a series' chunks of another encoding lie
    between), so its header is the first sample's hint alone."""
    if not 1 <= max_samples <= MAX_SAMPLES:
        raise ValueError(f"max_samples must be within 1..{MAX_SAMPLES}")
    chunks: list[tuple[int, list[NativeHistogram]]] = []
    previous = None
    for h in histograms:
        if chunks:
            header, samples = chunks[-1]
            gauge = h.hint == types_pb2.Histogram.GAUGE
            if (
                len(samples) < max_samples
                and gauge == (header == GAUGE_TYPE)
                and (h.is_stale or h.layout() == samples[0].layout())
            ):
                last = samples[-1]
                if (gauge and not last.is_stale) or (not gauge and reset_header(last, h) == NOT_COUNTER_RESET):
                    samples.append(h)
                    continue
            previous = samples[-1]
        chunks.append((reset_header(previous, h), [h]))
    return chunks


def encode_histogram_chunk(header: int, histograms: Sequence[NativeHistogram]) -> bytes:
    """One EncHistogram or EncFloatHistogram chunk (by the first sample's kind), header included.
    Every sample must share the first one's layout and kind (see cut_chunks)."""
    if not 1 <= len(histograms) <= MAX_SAMPLES:
        raise ValueError(f"a histogram chunk holds 1..{MAX_SAMPLES} samples")
    is_float = histograms[0].is_float
    out = BitWriter()
    out.write(len(histograms), 16)
    out.write(header, 8)
    first = _stale_only(histograms[0])
    _write_layout(out, first)
    _write_varbit_int(out, first.timestamp)
    if is_float:
        for value in (first.total, first.zero_count, first.sum, *first.positive, *first.negative):
            out.write(float_bits(value), 64)
        _write_float_samples(out, first, histograms[1:])
    else:
        _write_varbit_uint(out, int(first.total))
        _write_varbit_uint(out, int(first.zero_count))
        out.write(float_bits(first.sum), 64)
        for delta in (*first.positive, *first.negative):
            _write_varbit_int(out, delta)
        _write_integer_samples(out, first, histograms[1:])
    return out.getvalue()


def _stale_only(h: NativeHistogram) -> NativeHistogram:
    """A stale marker keeps only its sum, as chunkenc writes it."""
    return (
        NativeHistogram(h.timestamp, h.is_float, h.hint, 0, 0.0, h.total * 0, h.zero_count * 0, h.sum)
        if h.is_stale
        else h
    )


def _write_integer_samples(out: BitWriter, first: NativeHistogram, rest: Sequence[NativeHistogram]) -> None:
    t, count, zero_count, sum_bits = first.timestamp, int(first.total), int(first.zero_count), float_bits(first.sum)
    buckets = [*first.positive, *first.negative]
    bucket_deltas = [0] * len(buckets)
    t_delta = count_delta = zero_delta = 0
    window = XorWindow()
    for h in map(_stale_only, rest):
        new_t_delta = signed64(h.timestamp - t)
        new_count_delta, new_zero_delta = signed64(int(h.total) - count), signed64(int(h.zero_count) - zero_count)
        _write_varbit_int(out, signed64(new_t_delta - t_delta))
        if h.is_stale:
            out.write(0, 2)  # count and zero count delta-of-deltas are written as 0
        else:
            _write_varbit_int(out, signed64(new_count_delta - count_delta))
            _write_varbit_int(out, signed64(new_zero_delta - zero_delta))
        write_xor(out, float_bits(h.sum), sum_bits, window)
        for i, value in enumerate((*h.positive, *h.negative)):
            delta = signed64(value - buckets[i])
            _write_varbit_int(out, signed64(delta - bucket_deltas[i]))
            buckets[i], bucket_deltas[i] = value, delta
        t, count, zero_count, sum_bits = h.timestamp, int(h.total), int(h.zero_count), float_bits(h.sum)
        t_delta, count_delta, zero_delta = new_t_delta, new_count_delta, new_zero_delta


def _write_float_samples(out: BitWriter, first: NativeHistogram, rest: Sequence[NativeHistogram]) -> None:
    values = [float_bits(v) for v in (first.total, first.zero_count, first.sum, *first.positive, *first.negative)]
    windows = [XorWindow() for _ in values]
    t, t_delta = first.timestamp, 0
    for h in map(_stale_only, rest):
        new_t_delta = signed64(h.timestamp - t)
        _write_varbit_int(out, signed64(new_t_delta - t_delta))
        for i, value in enumerate((h.total, h.zero_count, h.sum, *h.positive, *h.negative)):
            bits = float_bits(value)
            write_xor(out, bits, values[i], windows[i])
            values[i] = bits
        t, t_delta = h.timestamp, new_t_delta


def _write_layout(out: BitWriter, h: NativeHistogram) -> None:
    mantissa, exponent = math.frexp(h.zero_threshold)
    if h.zero_threshold == 0:  # -0.0 too, as upstream
        out.write(0, 8)
    elif mantissa == 0.5 and -242 <= exponent <= 11:
        out.write(exponent + 243, 8)
    else:
        out.write(0xFF, 8)
        out.write(float_bits(h.zero_threshold), 64)
    _write_varbit_int(out, h.schema)
    for spans in (h.positive_spans, h.negative_spans):
        _write_varbit_uint(out, len(spans))
        for offset, length in spans:
            _write_varbit_uint(out, length)
            _write_varbit_int(out, offset)
    if h.schema == CUSTOM_BUCKETS_SCHEMA:
        _write_varbit_uint(out, len(h.custom_values))
        for bound in h.custom_values:
            scaled = bound * 1000
            whole = math.floor(scaled + 0.5) if 0 <= scaled <= _CUSTOM_BOUND_LIMIT else None  # Go's math.Round
            if whole is not None and whole / 1000 == bound:
                _write_varbit_uint(out, whole + 1)
            else:
                out.write(0, 1)
                out.write(float_bits(bound), 64)


def _write_varbit_int(out: BitWriter, value: int) -> None:
    _write_varbit(out, value, lambda nbits: -((1 << (nbits - 1)) - 1) <= value <= 1 << (nbits - 1))


def _write_varbit_uint(out: BitWriter, value: int) -> None:
    _write_varbit(out, value, lambda nbits: value < 1 << nbits)


def _write_varbit(out: BitWriter, value: int, fits) -> None:
    """The narrowest width ``fits`` accepts (0 is one bit, the widest 64 bits)."""
    if value == 0:
        out.write(0, 1)
        return
    for prefix, prefix_bits, nbits in _VARBIT:
        if fits(nbits):
            out.write(prefix, prefix_bits)
            out.write(value, nbits)
            return
    out.write(0xFF, 8)
    out.write(value, 64)


def _read_varbit(reader: BitReader, signed: bool) -> int:
    ones = 0
    while ones < 8 and reader.read(1):
        ones += 1
    if ones == 0:
        return 0
    if ones == 8:
        value = reader.read(64)
        return signed64(value) if signed else value
    nbits = _VARBIT[ones - 1][2]
    value = reader.read(nbits)
    if signed and value > 1 << (nbits - 1):
        value -= 1 << nbits
    return value


def decode_histogram_chunk(data: bytes, is_float: bool) -> tuple[int, list[NativeHistogram]]:
    """(counter-reset header, samples) of one histogram chunk. Hints are those chunkenc's
    iterator gives: gauge in a gauge chunk, else unknown for the first sample and no reset for
    the others (a chunk cut at a reset starts a new chunk, which says so in its header)."""
    reader = BitReader(data)
    count, header = reader.read(16), reader.read(8) & GAUGE_TYPE
    if count == 0:
        return header, []
    first_byte = reader.read(8)
    zero_threshold = {0: 0.0, 0xFF: None}.get(first_byte, math.ldexp(0.5, first_byte - 243))
    if zero_threshold is None:
        zero_threshold = bits_float(reader.read(64))
    schema = _read_varbit(reader, True)
    positive_spans, negative_spans = (
        tuple((_read_varbit_pair(reader)) for _ in range(_read_varbit(reader, False))) for _ in range(2)
    )
    custom_values: tuple[float, ...] = ()
    if schema == CUSTOM_BUCKETS_SCHEMA:
        custom_values = tuple(_read_custom_bound(reader) for _ in range(_read_varbit(reader, False)))
    n_positive = sum(length for _, length in positive_spans)
    n_buckets = n_positive + sum(length for _, length in negative_spans)
    read = _read_float_samples if is_float else _read_integer_samples
    samples = []
    for i, (t, count_, zero_count, sum_, buckets) in enumerate(read(reader, count, n_buckets)):
        hint = (
            types_pb2.Histogram.GAUGE
            if header == GAUGE_TYPE
            else (types_pb2.Histogram.NO if i else types_pb2.Histogram.UNKNOWN)
        )
        if float_bits(sum_) == STALE_NAN_BITS:
            samples.append(NativeHistogram(t, is_float, hint, 0, 0.0, count_ * 0, zero_count * 0, sum_))
            continue
        samples.append(
            NativeHistogram(
                t,
                is_float,
                hint,
                schema,
                zero_threshold,
                count_,
                zero_count,
                sum_,
                positive_spans,
                negative_spans,
                tuple(buckets[:n_positive]),
                tuple(buckets[n_positive:]),
                custom_values,
            )
        )
    return header, samples


def _read_varbit_pair(reader: BitReader) -> tuple[int, int]:
    length = _read_varbit(reader, False)
    return _read_varbit(reader, True), length


def _read_custom_bound(reader: BitReader) -> float:
    value = _read_varbit(reader, False)
    return bits_float(reader.read(64)) if value == 0 else (value - 1) / 1000


def _read_integer_samples(reader: BitReader, count: int, n_buckets: int):
    t = _read_varbit(reader, True)
    total, zero_count, sum_bits = _read_varbit(reader, False), _read_varbit(reader, False), reader.read(64)
    buckets = [_read_varbit(reader, True) for _ in range(n_buckets)]
    yield t, total, zero_count, bits_float(sum_bits), buckets
    deltas, t_delta, count_delta, zero_delta = [0] * n_buckets, 0, 0, 0
    window = XorWindow()
    for _ in range(count - 1):
        t_delta += _read_varbit(reader, True)
        count_delta += _read_varbit(reader, True)
        zero_delta += _read_varbit(reader, True)
        t, total, zero_count = (
            signed64(t + t_delta),
            (total + count_delta) & (1 << 64) - 1,
            (zero_count + zero_delta) & (1 << 64) - 1,
        )
        sum_bits = read_xor(reader, sum_bits, window)
        if sum_bits == STALE_NAN_BITS:
            yield t, total, zero_count, bits_float(sum_bits), []
            continue
        for i in range(n_buckets):
            deltas[i] += _read_varbit(reader, True)
            buckets[i] = signed64(buckets[i] + deltas[i])
        yield t, total, zero_count, bits_float(sum_bits), list(buckets)


def _read_float_samples(reader: BitReader, count: int, n_buckets: int):
    t = _read_varbit(reader, True)
    values = [reader.read(64) for _ in range(3 + n_buckets)]
    windows = [XorWindow() for _ in values]
    t_delta = 0
    for i in range(count):
        if i:
            t_delta += _read_varbit(reader, True)
            t = signed64(t + t_delta)
            for j in range(len(values)):
                if j == 3 and values[2] == STALE_NAN_BITS:
                    break  # a stale marker has no buckets
                values[j] = read_xor(reader, values[j], windows[j])
        floats = [bits_float(v) for v in values]
        yield t, floats[0], floats[1], floats[2], floats[3:]
