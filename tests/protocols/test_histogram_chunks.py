"""Native histogram chunks (protocols/prometheus/histogram_chunks.py) byte for byte.

Vectors were produced by github.com/prometheus/prometheus v0.309.1 (Prometheus 3.9.1)
tsdb/chunkenc: NewHistogramChunk / NewFloatHistogramChunk, AppendHistogram /
AppendFloatHistogram of the same histograms with appendOnly, then the counter-reset header set
to the one given. tests/e2e/test_histogram_chunks_e2e.py has the round trip through Prometheus's
own decoder.
"""

import math
import random
import struct

import pytest

from protocols import prometheus
from protocols.prometheus import types_pb2
from protocols.prometheus.histogram_chunks import (
    COUNTER_RESET,
    GAUGE_TYPE,
    NOT_COUNTER_RESET,
    UNKNOWN_COUNTER_RESET,
    NativeHistogram,
    cut_chunks,
    decode_histogram_chunk,
    encode_histogram_chunk,
    from_protobuf,
    reset_header,
)
from tests.histogram_messages import to_protobuf

H = types_pb2.Histogram
STALE = struct.unpack(">d", bytes.fromhex("7ff0000000000002"))[0]
GO_NAN = struct.unpack(">d", bytes.fromhex("7ff8000000000001"))[0]  # Go's math.NaN()
A = NativeHistogram(1000, False, H.UNKNOWN, 3, 2.0**-128, 10, 2, 12.5, ((-2, 2), (1, 1)), ((0, 1),), (3, 1, -2), (2,))
B = A._replace(timestamp=1015, total=12, sum=20.0, positive=(3, 2, -2))
C = A._replace(timestamp=1030, total=15, zero_count=3, sum=25.25, positive=(4, 2, -2), negative=(4,))
W = NativeHistogram(-5, False, H.UNKNOWN, -4, 0.3, 1 << 40, 300, -1e300, ((5, 4),), (), (1, 100, 5000, 1 << 20))
W2 = W._replace(
    timestamp=1_000_000_000,
    total=(1 << 40) + (1 << 30),
    zero_count=301,
    sum=math.inf,
    positive=(1 << 50, 100, 5000, 1 << 20),
)
W3 = W2._replace(timestamp=1_000_000_007, total=(1 << 63) - 1, sum=GO_NAN, positive=(1 << 55, -100, 3, 33))
G = A._replace(timestamp=7, hint=H.GAUGE)
G2 = G._replace(timestamp=8, total=4, zero_count=1, positive=(1, 0, 0), negative=(0,))
EMPTY = NativeHistogram(0, False, H.UNKNOWN, 8, 0.0, 0, 0, 0.0)
F = NativeHistogram(5, True, H.UNKNOWN, -53, 0.0, 7.0, 0.0, 3.5, ((0, 3),), (), (1.0, 2.5, 3.5), (), (0.5, 1.0, 1e9))
F2 = F._replace(timestamp=65, total=8.0, positive=(1.0, 3.5, 3.5))
N = NativeHistogram(100, True, H.UNKNOWN, 0, 0.001, 5.5, 0.5, -2.0, (), ((-1, 1), (2, 2)), (), (1.0, 2.0, 2.0))
N2 = N._replace(timestamp=200, total=6.5, negative=(1.0, 2.75, 2.25))
N3 = N2._replace(timestamp=300, sum=-2.5, zero_count=1.5)
BOUNDS = NativeHistogram(
    1, True, H.UNKNOWN, -53, 0.0, 1.0, 0.0, 1.0, ((0, 1),), (), (1.0,), (), (-1.0, 0.0, 0.001, 33554.43, 33554.431, 0.3)
)


def stale(h: NativeHistogram, timestamp: int) -> NativeHistogram:
    """A stale marker as chunkenc keeps it: the sum alone."""
    return NativeHistogram(timestamp, h.is_float, H.UNKNOWN, 0, 0.0, h.total * 0, h.zero_count * 0, STALE)


VECTORS = {
    "integer": (
        UNKNOWN_COUNTER_RESET,
        [A, B, C],
        "000300749ca568c63178fa315240290000000000009c6d2c7c9ac5ea2231d836b1ba40",
    ),
    "integer, reset header": (COUNTER_RESET, [A], "000180749ca568c63178fa315240290000000000009c6d20"),
    "integer, every varbit width": (
        NOT_COUNTER_RESET,
        [W, W2, W3],
        "000340ff3fd3333333333333de469856eff800040000000003a59fc6fc8791000eb391e327c09c47e0800007f0000001dcd6502ff0000002"
        "00000004707d038fc8791000eb3ff01ffffffffffff8feffffffc4653602ff7ffffeff7fffffffbecd20000000000007f9e0000000000007a71f7d8f7fbe000420",
    ),
    "integer, stale marker": (
        UNKNOWN_COUNTER_RESET,
        [A, stale(A, 1015)],
        "000200749ca568c63178fa315240290000000000009c6d2c798bdff640000000000080",
    ),
    "integer gauge": (GAUGE_TYPE, [G, G2], "0002c0749ca568c63161f15240290000000000009c6d28eeaeb5e560"),
    "integer, empty": (
        UNKNOWN_COUNTER_RESET,
        [EMPTY, EMPTY._replace(timestamp=60000), EMPTY._replace(timestamp=120000)],
        "00030000c4000000000000000003e3a98000",
    ),
    "float, custom buckets": (
        UNKNOWN_COUNTER_RESET,
        [F, F2],
        "00020000ee5c664fbebe3e920e6e6b280000000615007000000000000000000000000000010030000000000000ffc0000000000001001000000000000"
        "10030000000000003879a84f1b018",
    ),
    "float, negative buckets and zero bucket": (
        NOT_COUNTER_RESET,
        [N, N2, N3],
        "000340ff3f50624dd2f1a9fc251bca5c6440160000000000003fe0000000000000c0000000000000003ff00000000000004000000000000000400000"
        "0000000000e326c0b1b42f7033585ed060",
    ),
    "float, stale marker": (
        UNKNOWN_COUNTER_RESET,
        [N, stale(N, 130)],
        "000200ff3f50624dd2f1a9fc251bca5c6440160000000000003fe0000000000000c0000000000000003ff00000000000004000000000000000400000"
        "0000000000cf613a00bc44fff07f7fe0000000000004",
    ),
    "float, custom bounds of every form": (
        UNKNOWN_COUNTER_RESET,
        [BOUNDS],
        "00010000ee5c62597fe0000000000001197effffff9038189372b020c4ba5b13ff000000000000000000000000000003ff00000000000003ff00000000000000",
    ),
}


def same(a: NativeHistogram, b: NativeHistogram) -> bool:
    """Equal, floats compared by their bits (NaN sums)."""
    return to_protobuf(a).SerializeToString() == to_protobuf(b).SerializeToString()


@pytest.mark.parametrize("name", VECTORS)
def test_chunks_are_the_bytes_chunkenc_writes(name):
    header, histograms, expected = VECTORS[name]
    assert encode_histogram_chunk(header, histograms).hex() == expected


@pytest.mark.parametrize("name", VECTORS)
def test_chunkenc_bytes_decode_to_the_histograms(name):
    header, histograms, expected = VECTORS[name]
    found_header, found = decode_histogram_chunk(bytes.fromhex(expected), histograms[0].is_float)
    assert found_header == header
    hints = [H.GAUGE] * len(found) if header == GAUGE_TYPE else [H.UNKNOWN] + [H.NO] * (len(found) - 1)
    assert [h.hint for h in found] == hints
    assert all(same(a, b._replace(hint=hint)) for a, b, hint in zip(found, histograms, hints))


def test_zero_thresholds_take_one_byte_when_a_power_of_two_in_range():
    def first_byte(threshold: float) -> tuple[int, int]:
        data = encode_histogram_chunk(0, [EMPTY._replace(zero_threshold=threshold)])
        return data[3], len(data)

    assert first_byte(0.0) == (0, first_byte(0.0)[1])
    assert first_byte(-0.0)[0] == 0  # upstream writes -0 as 0
    assert first_byte(2.0**-128)[0] == 116  # Prometheus's default
    assert first_byte(2.0**10)[0] == 254 and first_byte(2.0**-243)[0] == 1
    assert first_byte(2.0**11)[0] == first_byte(2.0**-244)[0] == first_byte(0.3)[0] == 0xFF
    assert first_byte(0.3)[1] == first_byte(2.0**10)[1] + 8


def h(timestamp, count, buckets=(1,), hint=H.UNKNOWN, **changes) -> NativeHistogram:
    """An integer histogram of one positive span over ``buckets`` (deltas)."""
    base = NativeHistogram(
        timestamp, False, hint, 0, 0.0, count, 0, float(count), ((0, len(buckets)),), (), tuple(buckets)
    )
    return base._replace(**changes)


def headers_and_sizes(histograms, max_samples=120):
    return [(header, len(part)) for header, part in cut_chunks(histograms, max_samples)]


def test_chunks_are_cut_at_120_samples_with_a_known_no_reset_header():
    series = [h(i, i) for i in range(250)]
    assert headers_and_sizes(series) == [
        (UNKNOWN_COUNTER_RESET, 120),
        (NOT_COUNTER_RESET, 120),
        (NOT_COUNTER_RESET, 10),
    ]
    assert headers_and_sizes(series, 100) == [
        (UNKNOWN_COUNTER_RESET, 100),
        (NOT_COUNTER_RESET, 100),
        (NOT_COUNTER_RESET, 50),
    ]


@pytest.mark.parametrize(
    "second, header",
    [
        (h(2, 1), COUNTER_RESET),  # count went down
        (h(2, 5, hint=H.YES), COUNTER_RESET),  # the hint says so
        (h(2, 5, zero_count=0, buckets=(0,)), COUNTER_RESET),  # a bucket went down
        (h(2, 5, positive_spans=((1, 1),)), COUNTER_RESET),  # a bucket with a count disappeared
        (h(2, 5, schema=1), UNKNOWN_COUNTER_RESET),  # schema change
        (h(2, 5, zero_threshold=0.5), UNKNOWN_COUNTER_RESET),
        (h(2, 5, buckets=(1, 0), positive_spans=((0, 2),)), NOT_COUNTER_RESET),  # a new bucket: a new layout
        (h(2, 5, hint=H.GAUGE), GAUGE_TYPE),
    ],
)
def test_a_new_chunk_starts_at_a_reset_or_a_layout_change(second, header):
    third = second._replace(timestamp=3, total=second.total + 1, hint=H.GAUGE if second.hint == H.GAUGE else H.NO)
    assert headers_and_sizes([h(1, 4), second, third]) == [(UNKNOWN_COUNTER_RESET, 1), (header, 2)]


def test_same_layout_without_reset_stays_in_one_chunk_and_gauges_go_down_freely():
    assert headers_and_sizes([h(1, 4), h(2, 4, hint=H.NO), h(3, 9, buckets=(6,))]) == [(UNKNOWN_COUNTER_RESET, 3)]
    gauges = [h(t, count, (count,), hint=H.GAUGE) for t, count in enumerate([5, 1, 7, 0])]
    assert headers_and_sizes(gauges) == [(GAUGE_TYPE, 4)]
    assert headers_and_sizes([*gauges, h(9, 1)]) == [(GAUGE_TYPE, 4), (NOT_COUNTER_RESET, 1)]


def test_a_stale_marker_ends_its_chunk():
    marker = stale(h(0, 0), 3)
    assert headers_and_sizes([h(1, 4), marker, h(4, 4)]) == [(UNKNOWN_COUNTER_RESET, 2), (UNKNOWN_COUNTER_RESET, 1)]
    assert reset_header(None, h(1, 4, hint=H.NO)) == UNKNOWN_COUNTER_RESET


def random_histogram(rng: random.Random, timestamp: int, is_float: bool) -> NativeHistogram:
    spans = tuple((rng.randint(-3, 3), rng.randint(0, 4)) for _ in range(rng.randint(0, 3)))
    n = sum(length for _, length in spans)
    if is_float:
        buckets = tuple(rng.choice([0.0, 0.5, rng.random() * 1e6, float(rng.randint(0, 99))]) for _ in range(n))
        count, zero = sum(buckets) + 1.0, 1.0
    else:
        buckets = tuple(rng.randint(-(1 << rng.randint(1, 62)), 1 << rng.randint(1, 62)) for _ in range(n))
        count, zero = rng.randint(0, (1 << 64) - 1), rng.randint(0, 1 << 40)
    return NativeHistogram(
        timestamp,
        is_float,
        H.UNKNOWN,
        rng.randint(-4, 8),
        rng.choice([0.0, 2.0**-128, 1e-9]),
        count,
        zero,
        rng.random() * 1e9,
        spans,
        (),
        buckets,
    )


@pytest.mark.parametrize("is_float", [False, True])
def test_random_chunks_decode_to_what_was_encoded(is_float):
    rng = random.Random(14)
    for _ in range(50):
        first = random_histogram(rng, rng.randint(-(1 << 40), 1 << 40), is_float)
        series, t = [first], first.timestamp
        for _ in range(rng.randint(0, 30)):
            t += rng.choice([0, 1, 15000, rng.randint(1, 1 << 35)])
            other = random_histogram(rng, t, is_float)
            series.append(
                other._replace(
                    schema=first.schema,
                    zero_threshold=first.zero_threshold,
                    positive_spans=first.positive_spans,
                    positive=other.positive[: len(first.positive)] + (0,) * (len(first.positive) - len(other.positive)),
                )
            )
        header, found = decode_histogram_chunk(encode_histogram_chunk(NOT_COUNTER_RESET, series), is_float)
        assert header == NOT_COUNTER_RESET
        assert all(same(a, b._replace(hint=a.hint)) for a, b in zip(found, series)) and len(found) == len(series)


def test_protobuf_conversion_keeps_every_field():
    message = to_protobuf(F._replace(hint=H.YES))
    assert from_protobuf(5, message.SerializeToString()) == F._replace(hint=H.YES)
    integer = to_protobuf(A)
    assert integer.WhichOneof("count") == "count_int" and from_protobuf(1000, integer.SerializeToString()) == A


def test_streamed_series_interleave_float_and_histogram_chunks_in_time_order():
    labels = {"__name__": "mixed"}
    floats = [(t, float(t)) for t in (1, 2, 10, 11)]
    integer = [prometheus.WriteHistogram(t, to_protobuf(h(t, t)).SerializeToString()) for t in (5, 6, 7)]
    float_h = [prometheus.WriteHistogram(t, to_protobuf(F._replace(timestamp=t)).SerializeToString()) for t in (8, 9)]
    (frame,) = prometheus.encode_chunked_series_frames(0, labels, floats, histograms=integer + float_h)
    (message,) = prometheus.iter_frames(frame)
    chunks = prometheus.remote_pb2.ChunkedReadResponse.FromString(message).chunked_series[0].chunks
    Chunk = types_pb2.Chunk
    assert [(c.type, c.min_time_ms, c.max_time_ms) for c in chunks] == [
        (Chunk.XOR, 1, 2),
        (Chunk.HISTOGRAM, 5, 7),
        (Chunk.FLOAT_HISTOGRAM, 8, 9),
        (Chunk.XOR, 10, 11),
    ]
    ((index, found_labels, samples, histograms),) = prometheus.decode_chunked_series(frame)
    assert (index, found_labels, samples) == (0, labels, floats)
    assert [x.timestamp for x in histograms] == [5, 6, 7, 8, 9]
    assert same(histograms[3], F._replace(timestamp=8))
    with pytest.raises(ValueError, match="histogram chunks"):
        list(prometheus.decode_chunked_read_response(frame))


@pytest.mark.parametrize("is_float", [False, True])
def test_damaged_chunks_are_value_errors(is_float):
    """A client decoding a damaged answer gets ValueError, whatever the damage."""
    rng = random.Random(7)
    good = bytes.fromhex(VECTORS["float, custom buckets" if is_float else "integer, every varbit width"][2])
    for _ in range(2000):
        data = bytearray(good[: rng.randint(0, len(good))])
        for _ in range(rng.randint(0, 3)):
            if data:
                data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            decode_histogram_chunk(bytes(data), is_float)
        except ValueError:
            pass
