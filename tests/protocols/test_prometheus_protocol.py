"""Byte-level tests of the Prometheus remote write / remote read wire formats.

Requests are built by hand from protobuf wire primitives (not with the
generated classes), so these tests also pin the field numbers and wire types
of our .proto files against the upstream ones.
"""

import math
import random
import struct
import time
from pathlib import Path

import cramjam
import pytest

from protocols.prometheus import (
    SAMPLES,
    STREAMED_XOR_CHUNKS,
    Exemplar,
    Matcher,
    ProtocolError,
    ReadHints,
    ReadQuery,
    RejectedHistogram,
    RemoteReadError,
    RemoteWriteError,
    WriteBatch,
    WriteHistogram,
    WriteMetadata,
    WriteSeries,
    crc32c,
    decode_chunked_read_response,
    decode_read_request,
    decode_read_response,
    decode_write_request,
    decode_write_request_steps,
    decode_xor_chunk,
    decompress_block,
    encode_chunked_series_frames,
    encode_frame,
    encode_read_request,
    encode_read_response,
    encode_write_request_v1,
    encode_write_request_v2,
    encode_xor_chunk,
    iter_frames,
    labels_for_reader,
    message_version,
    negotiate_response_type,
    prometheus_metric_name,
    sanitize_label_name,
    series_labels,
    series_matches,
    uncompressed_length,
    unescape_name,
    v2_written_headers,
    write_v2_pb2,
)
from protocols.prometheus import write as write_module

DATA = Path(__file__).resolve().parents[1] / "data" / "prometheus"
LIMIT = 1 << 20
V1 = "application/x-protobuf"
V2 = "application/x-protobuf;proto=io.prometheus.write.v2.Request"
STALE_NAN_BITS = 0x7FF0000000000002


# --- protobuf wire primitives -------------------------------------------------


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int64 values take ten bytes
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def f_varint(number: int, value: int) -> bytes:
    return varint(number << 3) + varint(value)


def f_bytes(number: int, payload: bytes | str) -> bytes:
    if isinstance(payload, str):
        payload = payload.encode()
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def f_double_bits(number: int, bits: int) -> bytes:
    return varint(number << 3 | 1) + struct.pack("<Q", bits)


def f_double(number: int, value: float) -> bytes:
    return varint(number << 3 | 1) + struct.pack("<d", value)


def bits_of(value: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", value))[0]


def float_of(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def snappy(raw: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(raw))


def unsnappy(body: bytes) -> bytes:
    return bytes(cramjam.snappy.decompress_raw(body))


# prometheus.* messages
def label(name: str, value: str) -> bytes:
    return f_bytes(1, name) + f_bytes(2, value)


def sample(value: float, timestamp: int) -> bytes:
    return f_double(1, value) + f_varint(2, timestamp)


def packed(number: int, values) -> bytes:
    return f_bytes(number, b"".join(varint(v) for v in values))


def zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def span(offset: int, length: int) -> bytes:
    return (f_varint(1, zigzag(offset)) if offset else b"") + f_varint(2, length)


def histogram(
    count=3,
    sum_=1.5,
    schema=0,
    zero_count=1,
    positive=((0, 2),),
    deltas=(1, 0),
    negative=(),
    negative_deltas=(),
    timestamp=1000,
    is_float=False,
    custom=(),
    reset_hint=0,
    zero_threshold=0.0,
) -> bytes:
    """A prometheus.Histogram as protobuf writes it (fields in number order, packed repeated):
    by default 1 zero-bucket observation and 1 in each of 2 positive buckets, count 3."""
    out = f_double(2, count) if is_float else f_varint(1, count)
    out += (f_double(3, sum_) if sum_ else b"") + (f_varint(4, zigzag(schema)) if schema else b"")
    out += f_double(5, zero_threshold) if zero_threshold else b""
    out += f_double(7, zero_count) if is_float else (f_varint(6, zero_count) if zero_count else b"")
    out += b"".join(f_bytes(8, span(o, n)) for o, n in negative)
    if negative_deltas:
        out += (
            f_bytes(10, b"".join(struct.pack("<d", c) for c in negative_deltas))
            if is_float
            else packed(9, map(zigzag, negative_deltas))
        )
    out += b"".join(f_bytes(11, span(o, n)) for o, n in positive)
    if deltas:
        out += (
            f_bytes(13, b"".join(struct.pack("<d", c) for c in deltas)) if is_float else packed(12, map(zigzag, deltas))
        )
    out += (f_varint(14, reset_hint) if reset_hint else b"") + f_varint(15, timestamp)
    if custom:
        out += f_bytes(16, b"".join(struct.pack("<d", c) for c in custom))
    return out


HISTOGRAM = histogram()


def custom_bounds(count: int, timestamp: int = 1000) -> bytes:
    """A valid custom-buckets (NHCB) histogram of ``count`` bounds, two observations in its first two buckets."""
    return histogram(
        schema=-53,
        zero_count=0,
        count=2,
        positive=((0, 2),),
        deltas=(1, 0),
        custom=tuple(float(bound) for bound in range(1, count + 1)),
        timestamp=timestamp,
    )


def v1_series(labels, samples=(), exemplars=0, histograms=0) -> bytes:
    out = b"".join(f_bytes(1, label(n, v)) for n, v in labels)
    out += b"".join(f_bytes(2, sample(v, t)) for t, v in samples)
    out += f_bytes(3, f_double(2, 1.5) + f_varint(3, 1000)) * exemplars  # Exemplar
    out += f_bytes(4, HISTOGRAM) * histograms
    return out


def v1_request(*series: bytes, metadata: bytes = b"") -> bytes:
    return b"".join(f_bytes(1, s) for s in series) + metadata


def v1_metadata(type_number: int, family: str, help_text: str, unit: str) -> bytes:
    return f_bytes(3, f_varint(1, type_number) + f_bytes(2, family) + f_bytes(4, help_text) + f_bytes(5, unit))


# io.prometheus.write.v2.* messages
def v2_series(refs, samples=(), metadata=b"", histograms=0, exemplars=0, packed_refs=True) -> bytes:
    if packed_refs:
        out = packed(1, refs) if refs else b""
    else:
        out = b"".join(f_varint(1, ref) for ref in refs)
    out += b"".join(f_bytes(2, sample(v, t)) for t, v in samples)
    out += f_bytes(3, HISTOGRAM) * histograms
    out += f_bytes(4, f_double(2, 1.0) + f_varint(3, 1000)) * exemplars
    if metadata:
        out += f_bytes(5, metadata)
    return out


def v2_request(symbols, *series: bytes) -> bytes:
    return b"".join(f_bytes(4, s) for s in symbols) + b"".join(f_bytes(5, s) for s in series)


def decode_v1(raw: bytes) -> WriteBatch:
    return decode_write_request(snappy(raw), V1, "snappy", LIMIT)


def decode_v2(raw: bytes) -> WriteBatch:
    return decode_write_request(snappy(raw), V2, "snappy", LIMIT)


def reject(raw: bytes, decode=decode_v1) -> RemoteWriteError:
    with pytest.raises(RemoteWriteError) as info:
        decode(raw)
    return info.value


def refused_series(raw: bytes, decode=decode_v1) -> list[str]:
    """What the decoder says of the series it left out of the batch (the others are kept)."""
    return list(map(str, decode(raw).rejected_series))


# --- snappy -------------------------------------------------------------------


def test_snappy_block_header_is_the_uncompressed_length():
    assert snappy(b"")[:1] == b"\x00"
    block = snappy(b"x" * 300)
    assert block[:2] == b"\xac\x02"  # uvarint 300
    assert uncompressed_length(block) == 300
    assert decompress_block(block, 300) == b"x" * 300


def test_snappy_bomb_is_refused_without_inflating(monkeypatch):
    def inflate(_):
        raise AssertionError("a snappy bomb must not be inflated")

    monkeypatch.setattr(cramjam.snappy, "decompress_raw", inflate)
    bomb = b"\xff\xff\xff\xff\x0f" + b"\x00" * 16  # announces 4 GiB - 1
    with pytest.raises(ProtocolError) as info:
        decompress_block(bomb, LIMIT)
    assert info.value.status == 413
    assert "4294967295" in info.value.message
    with pytest.raises(RemoteWriteError) as info:
        decode_write_request(bomb, V1, "snappy", LIMIT)
    assert info.value.status == 413
    with pytest.raises(RemoteReadError) as info:
        decode_read_request(bomb, LIMIT)
    assert info.value.status == 413


def test_snappy_limit_applies_to_real_compressed_payloads():
    body = snappy(b"\x00" * (LIMIT + 1))
    assert len(body) < LIMIT // 10
    with pytest.raises(RemoteWriteError) as info:
        decode_write_request(body, V1, None, LIMIT)
    assert info.value.status == 413
    assert decompress_block(snappy(b"\x00" * LIMIT), LIMIT) == b"\x00" * LIMIT


@pytest.mark.parametrize(
    "body",
    [
        b"",  # no header at all
        b"\x80",  # truncated length
        b"\x80\x80\x80\x80\x80\x01",  # length longer than 32 bits
        b"\x05abc",  # announces 5 bytes, holds garbage
        b"\x0a\x00",  # announces 10 bytes, holds none
        bytes(cramjam.snappy.compress(b"hello world")),  # framed format, not a block
    ],
)
def test_corrupt_snappy_is_a_bad_request(body):
    with pytest.raises(RemoteWriteError) as info:
        decode_write_request(body, V1, "snappy", LIMIT)
    assert info.value.status == 400
    assert "snappy" in info.value.message


# --- content negotiation ----------------------------------------------------------


@pytest.mark.parametrize(
    "content_type, version",
    [
        (None, 1),
        ("", 1),
        ("application/x-protobuf", 1),
        ("application/x-protobuf;proto=prometheus.WriteRequest", 1),
        ("Application/X-Protobuf ; PROTO = prometheus.writerequest ", 1),
        ('application/x-protobuf; proto="prometheus.WriteRequest"', 1),
        ("application/x-protobuf;proto=io.prometheus.write.v2.Request", 2),
        ("  application/x-protobuf ;  proto=io.prometheus.write.v2.Request  ", 2),
        ("application/x-protobuf; charset=utf-8; proto=io.prometheus.write.v2.Request", 2),
    ],
)
def test_content_type_selects_the_message(content_type, version):
    assert message_version(content_type) == version
    assert decode_write_request(snappy(b""), content_type, None, LIMIT).version == version


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "text/plain",
        "application/protobuf",
        "application/x-protobuf;proto=io.prometheus.write.v3.Request",
        "application/x-protobuf;proto=prometheus.ReadRequest",
        "application/x-protobuf;proto=",
    ],
)
def test_unsupported_content_type_is_415(content_type):
    bomb = b"\xff\xff\xff\xff\x0f"  # checked before the body is looked at
    with pytest.raises(RemoteWriteError) as info:
        decode_write_request(bomb, content_type, "snappy", LIMIT)
    assert info.value.status == 415


@pytest.mark.parametrize("encoding", [None, "", "snappy", " Snappy "])
def test_snappy_or_missing_content_encoding_is_accepted(encoding):
    assert decode_write_request(snappy(b""), V1, encoding, LIMIT) == WriteBatch(version=1)


@pytest.mark.parametrize("encoding", ["gzip", "zstd", "identity", "snappy, gzip", "framed"])
def test_other_content_encodings_are_415(encoding):
    with pytest.raises(RemoteWriteError) as info:
        decode_write_request(snappy(b""), V1, encoding, LIMIT)
    assert info.value.status == 415
    assert encoding in info.value.message


# --- remote write 1.0 -------------------------------------------------------------


def test_v1_request_decodes_series_and_samples():
    raw = v1_request(
        v1_series(
            [("__name__", "http_requests_total"), ("code", "200"), ("job", "api")],
            [(1_700_000_000_000, 1.0), (1_700_000_015_000, 2.5)],
        ),
        v1_series([("__name__", "up"), ("instance", "a:9100")], [(-1, -0.0)]),
    )
    assert decode_v1(raw) == WriteBatch(
        version=1,
        series=[
            WriteSeries(
                {"__name__": "http_requests_total", "code": "200", "job": "api"},
                [(1_700_000_000_000, 1.0), (1_700_000_015_000, 2.5)],
            ),
            WriteSeries({"__name__": "up", "instance": "a:9100"}, [(-1, -0.0)]),
        ],
    )
    assert math.copysign(1.0, decode_v1(raw).series[1].samples[0][1]) == -1.0


def test_v1_sample_values_keep_their_exact_bits():
    nan_bits = [STALE_NAN_BITS, 0x7FF8000000000000, 0x7FF8000000000001, 0xFFF8000000000000]
    series = b"".join(f_bytes(1, label(n, v)) for n, v in [("__name__", "m")])
    series += b"".join(f_bytes(2, f_double_bits(1, bits) + f_varint(2, i)) for i, bits in enumerate(nan_bits))
    series += f_bytes(2, f_double(1, math.inf) + f_varint(2, 10))
    samples = decode_v1(v1_request(series)).series[0].samples
    assert [bits_of(value) for _, value in samples[:4]] == nan_bits
    assert samples[4] == (10, math.inf)


def v1_exemplar(labels, value: float, timestamp: int) -> bytes:
    return f_bytes(
        3, b"".join(f_bytes(1, label(n, v)) for n, v in labels) + f_double(2, value) + f_varint(3, timestamp)
    )


def test_v1_exemplars_and_histograms_are_decoded():
    raw = v1_request(
        v1_series([("__name__", "latency")], [(1000, 0.5)], histograms=3)
        + v1_exemplar([("trace_id", "abc"), ("span_id", "1f")], 0.25, 990)
        + v1_exemplar([("empty", ""), ("trace_id", "def")], float_of(STALE_NAN_BITS), -5),
        v1_series([("__name__", "native")], histograms=1),
        v1_series([("__name__", "bare")], exemplars=1),
    )
    batch = decode_v1(raw)
    assert batch.histogram_count == 4
    assert batch.series[0].histograms == [WriteHistogram(1000, HISTOGRAM)] * 3
    assert sum(len(series.exemplars) for series in batch.series) == 3
    assert batch.series[0].exemplars[0] == Exemplar({"trace_id": "abc", "span_id": "1f"}, 0.25, 990)
    nan = batch.series[0].exemplars[1]
    assert (nan.labels, nan.timestamp, bits_of(nan.value)) == ({"trace_id": "def"}, -5, STALE_NAN_BITS)
    assert batch.series[1] == WriteSeries({"__name__": "native"}, histograms=[WriteHistogram(1000, HISTOGRAM)])
    assert batch.series[2].exemplars == [Exemplar({}, 1.5, 1000)]


@pytest.mark.parametrize(
    "exemplar, words",
    [
        (v1_exemplar([("", "x")], 1.0, 1), "series 1: exemplar has an empty label name"),
        (v1_exemplar([("a", "x"), ("a", "y")], 1.0, 1), "series 1: exemplar has a duplicate label name 'a'"),
        (v1_exemplar([("trace_id", "x" * 121)], 1.0, 1), "exemplar labels are 129 characters long, over 128"),
    ],
)
def test_v1_invalid_exemplars_refuse_their_series_only(exemplar, words):
    batch = decode_v1(v1_request(GOOD, v1_series([("__name__", "m")], [(1, 1.0)]) + exemplar))
    assert [series.labels for series in batch.series] == [{"__name__": "ok"}]
    [problem] = map(str, batch.rejected_series)
    assert problem.startswith("series 1: ") and words in problem


def test_exemplar_label_names_may_be_any_utf8():
    raw = v1_request(v1_series([("__name__", "m")], [(1, 1.0)]) + v1_exemplar([("trace.id", "x")], 1.0, 1))
    assert decode_v1(raw).series[0].exemplars[0].labels == {"trace.id": "x"}


def test_exemplar_labels_of_exactly_128_characters_are_accepted():
    raw = v1_request(v1_series([("__name__", "m")], [(1, 1.0)]) + v1_exemplar([("trace_id", "x" * 120)], 1.0, 1))
    assert sum(len(series.exemplars) for series in decode_v1(raw).series) == 1


@pytest.mark.parametrize(
    "number, name",
    [
        (0, "unknown"),
        (1, "counter"),
        (2, "gauge"),
        (3, "histogram"),
        (4, "gaugehistogram"),
        (5, "summary"),
        (6, "info"),
        (7, "stateset"),
        (42, "unknown"),  # a type newer than us
    ],
)
def test_v1_metadata_only_request_is_valid(number, name):
    batch = decode_v1(v1_metadata(number, "http_requests", "Requests served.", "requests"))
    assert batch == WriteBatch(
        version=1, metadata=[WriteMetadata("http_requests", name, "Requests served.", "requests")]
    )


def test_v1_label_with_empty_value_is_dropped():
    raw = v1_request(v1_series([("__name__", "m"), ("env", ""), ("job", "x")], [(1, 1.0)]))
    assert decode_v1(raw).series[0].labels == {"__name__": "m", "job": "x"}


GOOD = v1_series([("__name__", "ok")], [(1, 1.0)])


def test_v1_labels_out_of_order_are_sorted_as_prometheus_does():
    raw = v1_request(v1_series([("job", "a"), ("__name__", "m"), ("env", "b")], [(1, 1.0)]))
    assert list(decode_v1(raw).series[0].labels.items()) == [("__name__", "m"), ("env", "b"), ("job", "a")]


def test_v1_duplicate_label_out_of_order_is_still_refused():
    raw = v1_request(v1_series([("job", "a"), ("__name__", "m"), ("job", "b")], [(1, 1.0)]))
    assert refused_series(raw) == ["series 0: duplicate label name 'job'"]


@pytest.mark.parametrize(
    "labels, words",
    [
        ([("__name__", "m"), ("job", "a"), ("job", "b")], "duplicate label name 'job'"),
        ([("", "x"), ("__name__", "m")], "empty label name"),
        ([("job", "a")], "missing or empty __name__"),
        ([("__name__", ""), ("job", "a")], "missing or empty __name__"),
        ([], "missing or empty __name__"),
    ],
)
def test_v1_invalid_series_are_left_out_and_named_the_others_kept(labels, words):
    for arrays in (False, True):  # the protobuf decoder, and the plain reader (which hands it over)
        batch = decode_write_request(
            snappy(v1_request(GOOD, v1_series(labels, [(1, 1.0)]), GOOD)), V1, "snappy", LIMIT, arrays=arrays
        )
        assert batch.sample_count == 2
        [problem] = map(str, batch.rejected_series)
        assert problem.startswith("series 1: ") and words in problem


@pytest.mark.parametrize("name", ["foo-bar", "1abc", "a.b", "é", "a:b", "k8s.pod.name", "a b", "__reserved"])
def test_v1_label_names_are_any_utf8_as_in_prometheus_3(name):
    raw = v1_request(v1_series([("__name__", "http.server.request.duration"), (name, "x")], [(1, 1.0)]))
    for _ in range(2):  # first seen, then known
        batch = decode_v1(raw)
        assert batch.rejected_series == []
        assert batch.series[0].labels == {"__name__": "http.server.request.duration", name: "x"}


@pytest.mark.parametrize(
    "raw",
    [
        b"\x0a\x05\x0a\x01",  # timeseries field cut short
        b"\x0a",  # tag without its length
        b"\x0f",  # wire type 7 does not exist
        f_bytes(1, f_bytes(1, f_bytes(1, b"\xff\xfe") + f_bytes(2, "v"))),  # label name not UTF-8
    ],
)
def test_v1_bad_protobuf_is_400(raw):
    error = reject(raw)
    assert error.status == 400
    assert "prometheus.WriteRequest" in error.message


def test_v1_series_decode_the_same_the_first_time_and_once_their_labels_are_known():
    """Known label bytes skip protobuf (write._VALID_LABEL_BYTES); what comes out must not change: long
    (two-byte length) and non-ASCII values, zero values and timestamps (left out on the wire),
    negative timestamps, NaN bits, no samples, repeated label sets, and a series with an
    exemplar (read by protobuf) after its labels were seen without one."""
    rng = random.Random(23)
    long_value = "é" * 100 + str(time.time_ns())  # unique, so the first decode sees it first
    label_sets = [
        [("__name__", "plain"), ("job", "a")],
        [("__name__", "long"), ("path", long_value)],
        [("__name__", "zero"), ("i", "ü")],
    ]
    samples = [
        [(1_700_000_000_000 + i * 15_000, rng.uniform(-1e6, 1e6)) for i in range(3)],
        [(0, 0.0), (-1, -0.0), (-(2**62), 5e-324), (2**62, float_of(STALE_NAN_BITS))],
        [],
    ]
    raw = v1_request(
        *(v1_series(labels, found) for labels, found in zip(label_sets, samples)), v1_series(label_sets[0])
    )
    expected = [dict(labels) for labels in label_sets] + [dict(label_sets[0])]
    for _ in range(2):
        batch = decode_v1(raw)
        assert [series.labels for series in batch.series] == expected
        assert [[(ts, bits_of(v)) for ts, v in series.samples] for series in batch.series] == [
            [(ts, bits_of(v)) for ts, v in found] for found in [*samples, []]
        ]
    with_exemplar = decode_v1(v1_request(v1_series(label_sets[0], samples[0], exemplars=1)))
    assert with_exemplar.series[0].exemplars == [Exemplar({}, 1.5, 1000)]
    assert with_exemplar.series[0].samples == samples[0]


@pytest.mark.parametrize("version", [V1, V2])
def test_samples_as_arrays_are_the_samples_of_the_series(version):
    """decode with arrays=True: every sample once, in the arrays, with its series' labels, whether
    the plain 1.0 reader took it (Prometheus's one sample a series of known labels, first seen or
    known, several samples, zero values and timestamps) or protobuf did (a series with an
    exemplar, 2.0); a series' key is the same in every request."""
    now = 1_700_000_000_000
    series = [
        WriteSeries({"__name__": "one", "job": "a"}, [(now, 1.5)]),
        WriteSeries({"__name__": "zero", "job": "a"}, [(now, 0.0)]),
        WriteSeries(
            {"__name__": "many", "i": "ü"}, [(now - 30_000, -2.0), (0, float_of(STALE_NAN_BITS)), (-1, 5e-324)]
        ),
        WriteSeries({"__name__": "none"}),
        WriteSeries({"__name__": "exemplar"}, [(now, 3.0)], exemplars=[Exemplar({"trace": "t"}, 1.0, now)]),
        WriteSeries({"__name__": "one", "job": "b"}, [(now + 1, 7.0)]),
    ]
    encode = encode_write_request_v1
    if version == V2:  # where a series without samples is refused
        encode, series = encode_write_request_v2, [s for s in series if s.samples]
    keys = None
    for _ in range(2):  # labels first seen, then known
        batch = decode_write_request(encode(series), version, "snappy", LIMIT, arrays=True)
        arrays = batch.arrays
        assert batch.sample_count == len(arrays) == 7
        labels = [series_labels(entry) for entry in arrays.labels]
        got = sorted(
            (labels[index]["__name__"], labels[index].get("job", ""), ts, bits_of(value))
            for index, ts, value in zip(arrays.series.tolist(), arrays.timestamps.tolist(), arrays.values.tolist())
        )
        assert got == sorted(
            (s.labels["__name__"], s.labels.get("job", ""), ts, bits_of(value))
            for s in series
            for ts, value in s.samples
        )
        assert keys in (None, arrays.keys) and len(set(arrays.keys)) == len(series)
        keys = arrays.keys


def samples_and_metadata(batch: WriteBatch) -> tuple[list, set]:
    """Every sample of a batch (by its labels, bit for bit) and every metadata row it carries,
    whether decoded as series or as arrays."""
    if batch.arrays is None:
        found = [(s.labels, ts, value) for s in batch.series for ts, value in s.samples]
    else:
        arrays = batch.arrays
        found = [
            (series_labels(arrays.labels[index]), ts, value)
            for index, ts, value in zip(arrays.series.tolist(), arrays.timestamps.tolist(), arrays.values.tolist())
        ]
    rows = {(m.metric_family_name, m.type, m.help, m.unit) for m in batch.metadata}
    rows |= {(s.labels["__name__"], s.metric_type, s.help, s.unit) for s in batch.series if s.metric_type}
    return sorted((sorted(labels.items()), ts, bits_of(value)) for labels, ts, value in found), rows


def test_v2_plain_requests_read_as_arrays_hold_what_the_protobuf_decoder_reads():
    """The plain 2.0 reader (labels refs, samples and metadata, nothing else) against the
    protobuf decoder on the same requests: more series than a run (refs of two bytes, long
    values), zero values and timestamps, several samples, NaN bits, metadata or none; and
    requests it leaves to protobuf (a created timestamp, an exemplar) give the same too."""
    now = 1_700_000_000_000
    series = [
        WriteSeries(
            {"__name__": f"m{i % 7}", "pod": f"pod-{i}", "long": "é" * 70},
            [(now, float(i % 3))],
            metric_type="counter" if i % 7 == 1 else None,
            help="Requests." if i % 7 == 1 else "",
        )
        for i in range(write_module.V2_PLAIN_SERIES + 500)
    ]
    series += [
        WriteSeries(
            {"__name__": "many"}, [(0, 0.0), (-1, float_of(STALE_NAN_BITS)), (now, 5e-324)], metric_type="gauge"
        ),
        WriteSeries({"__name__": "unit"}, [(now, 1.0)], metric_type="histogram", unit="seconds"),
    ]
    requests = {
        "plain": series,
        "created": [*series[:10], WriteSeries({"__name__": "c"}, [(now, 1.0)], created_timestamp=now - 5)],
        "exemplar": [*series[:10], WriteSeries({"__name__": "e"}, [(now, 1.0)], exemplars=[Exemplar({}, 1.0, now)])],
    }
    for name, request in requests.items():
        body = encode_write_request_v2(request)
        expected = samples_and_metadata(decode_write_request(body, V2, "snappy", LIMIT))
        for _ in range(2):  # label sets first seen, then known
            batch = decode_write_request(body, V2, "snappy", LIMIT, arrays=True)
            assert samples_and_metadata(batch) == expected
            assert (batch.series == []) == (name == "plain")


@pytest.mark.parametrize("run_bytes", [64 * 1024, 1])
def test_v2_plain_requests_refuse_invalid_series_as_the_protobuf_decoder_does(monkeypatch, run_bytes):
    """The refusal names the series by its index in the request, however the plain reader cut it
    into runs (runs of one series with run_bytes=1); the valid series are kept."""
    monkeypatch.setattr(write_module, "V2_PLAIN_REF_BYTES", run_bytes)
    good = WriteSeries({"__name__": "ok", "a.b": "x"}, [(1, 1.0)])
    bad = [good, WriteSeries({"__name__": "m", "": "x"}, [(1, 1.0)]), good]
    body = encode_write_request_v2(bad)
    for arrays in (False, True):
        batch = decode_write_request(body, V2, "snappy", LIMIT, arrays=arrays)
        assert list(map(str, batch.rejected_series)) == ["series 1: empty label name"]
        assert batch.sample_count == 2


def test_v1_invalid_labels_are_refused_every_time():
    raw = v1_request(v1_series([("__name__", "m"), ("", "x")], [(1, 1.0)]))
    for _ in range(2):
        assert refused_series(raw) == ["series 0: empty label name"]


KNOWN_LABELS = b"".join(f_bytes(1, label(n, v)) for n, v in [("__name__", "known"), ("job", "a")])


@pytest.mark.parametrize(
    "raw",
    [
        v1_request(KNOWN_LABELS + f_bytes(2, sample(1.0, 1)))[:-3],  # the request ends inside the sample
        v1_request(KNOWN_LABELS + f_bytes(2, b"\x09\x00\x00")),  # a sample too short for its double
        v1_request(KNOWN_LABELS + f_bytes(2, b"\x10\xff\xff")),  # a timestamp varint that never ends
    ],
)
def test_v1_malformed_sample_of_a_known_series_is_400(raw):
    decode_v1(v1_request(KNOWN_LABELS + f_bytes(2, sample(1.0, 1))))
    error = reject(raw)
    assert error.status == 400 and "prometheus.WriteRequest" in error.message


def test_v1_encoder_writes_the_same_bytes_as_the_spec():
    series = [
        WriteSeries(
            {"job": "api", "__name__": "up", "empty": ""},
            [(1000, 1.0), (-2000, float_of(STALE_NAN_BITS))],
        ),
    ]
    metadata = [WriteMetadata("up", "gauge", "Target is up.", "")]
    expected = v1_request(
        b"".join(f_bytes(1, label(n, v)) for n, v in [("__name__", "up"), ("job", "api")])
        + f_bytes(2, sample(1.0, 1000))
        + f_bytes(2, f_double_bits(1, STALE_NAN_BITS) + f_varint(2, -2000)),
        metadata=f_bytes(3, f_varint(1, 2) + f_bytes(2, "up") + f_bytes(4, "Target is up.")),
    )
    body = encode_write_request_v1(series, metadata)
    assert unsnappy(body) == expected
    batch = decode_write_request(body, None, None, LIMIT)
    assert batch.series[0].labels == {"__name__": "up", "job": "api"}
    assert bits_of(batch.series[0].samples[1][1]) == STALE_NAN_BITS
    assert batch.metadata == metadata


# --- remote write 2.0 -------------------------------------------------------------

SYMBOLS = ["", "__name__", "http_requests_total", "job", "api", "Requests served.", "requests"]


def test_v2_labels_out_of_order_are_sorted_as_prometheus_does():
    batch = decode_v2(v2_request(SYMBOLS, v2_series([3, 4, 1, 2], [(1, 1.0)])))
    assert list(batch.series[0].labels.items()) == [("__name__", "http_requests_total"), ("job", "api")]


def test_v2_plain_label_sets_read_again_are_sorted_and_named_as_the_first_time():
    """A plain 2.0 series whose labels come out of order with an empty value: the first request
    validates them; later ones find the label set known (one set lookup) and still give the same
    sorted labels, and its metadata row under the metric name."""
    symbols = [*SYMBOLS, "env", ""]
    counter = f_varint(1, 1) + f_varint(3, 5) + f_varint(4, 6)
    body = snappy(v2_request(symbols, v2_series([3, 4, 7, 0, 1, 2], [(1, 1.0)], metadata=counter)))
    for _ in range(3):
        batch = decode_write_request(body, V2, "snappy", LIMIT, arrays=True)
        assert batch.series == []  # read by the plain reader, not by protobuf
        assert [list(series_labels(labels).items()) for labels in batch.arrays.labels] == [
            [("__name__", "http_requests_total"), ("job", "api")]
        ]
        assert [(m.metric_family_name, m.type, m.help, m.unit) for m in batch.metadata] == [
            ("http_requests_total", "counter", "Requests served.", "requests")
        ]


@pytest.mark.parametrize("packed_refs", [True, False])
def test_v2_request_resolves_symbols_and_metadata(packed_refs):
    counter = f_varint(1, 1) + f_varint(3, 5) + f_varint(4, 6)
    raw = v2_request(
        SYMBOLS,
        v2_series([1, 2, 3, 4], [(1000, 3.0), (2000, 4.0)], counter, packed_refs=packed_refs),
        v2_series([1, 2], [(1000, float_of(STALE_NAN_BITS))], packed_refs=packed_refs),
    )
    batch = decode_v2(raw)
    assert batch == WriteBatch(
        version=2,
        series=[
            WriteSeries(
                {"__name__": "http_requests_total", "job": "api"},
                [(1000, 3.0), (2000, 4.0)],
                metric_type="counter",
                help="Requests served.",
                unit="requests",
            ),
            WriteSeries({"__name__": "http_requests_total"}, batch.series[1].samples),
        ],
    )
    assert bits_of(batch.series[1].samples[0][1]) == STALE_NAN_BITS


@pytest.mark.parametrize(
    "number, name",
    [
        (0, None),
        (1, "counter"),
        (2, "gauge"),
        (3, "histogram"),
        (4, "gaugehistogram"),
        (5, "summary"),
        (6, "info"),
        (7, "stateset"),
        (99, "unknown"),
    ],
)
def test_v2_metric_type_names(number, name):
    raw = v2_request(SYMBOLS, v2_series([1, 2], [(1, 1.0)], metadata=f_varint(1, number)))
    assert decode_v2(raw).series[0].metric_type == name


def v2_exemplar(refs, value: float, timestamp: int) -> bytes:
    return f_bytes(4, (packed(1, refs) if refs else b"") + f_double(2, value) + f_varint(3, timestamp))


def test_v2_exemplars_resolve_symbols_and_headers_say_what_was_written():
    raw = v2_request(
        SYMBOLS + ["trace_id", "abc"],
        v2_series([1, 2], [(1, 1.0), (2, 2.0)]) + v2_exemplar([7, 8], 0.5, 2) + v2_exemplar([3, 4, 7, 8], 1.5, 1),
        v2_series([1, 2, 3, 4], histograms=2, exemplars=1),
    )
    batch = decode_v2(raw)
    assert batch.histogram_count == 2
    assert batch.series[0].exemplars == [
        Exemplar({"trace_id": "abc"}, 0.5, 2),
        Exemplar({"job": "api", "trace_id": "abc"}, 1.5, 1),
    ]
    assert batch.series[1].samples == [] and batch.series[1].exemplars == [Exemplar({}, 1.0, 1000)]
    assert v2_written_headers(batch, exemplars_written=3, histograms_written=2) == {
        "X-Prometheus-Remote-Write-Samples-Written": "2",
        "X-Prometheus-Remote-Write-Histograms-Written": "2",
        "X-Prometheus-Remote-Write-Exemplars-Written": "3",
    }
    partial = v2_written_headers(batch, samples_written=1)
    assert partial["X-Prometheus-Remote-Write-Samples-Written"] == "1"
    assert partial["X-Prometheus-Remote-Write-Exemplars-Written"] == "0"
    assert partial["X-Prometheus-Remote-Write-Histograms-Written"] == "0"


@pytest.mark.parametrize(
    "exemplar, words",
    [
        (v2_exemplar([3], 1.0, 1), "series 0: odd number of exemplar labels_refs (1)"),
        (v2_exemplar([3, 99], 1.0, 1), "series 0: exemplar label value ref 99 out of range"),
        (v2_exemplar([99, 4], 1.0, 1), "series 0: exemplar label name ref 99 out of range"),
    ],
)
def test_v2_invalid_exemplars_refuse_their_series(exemplar, words):
    [problem] = refused_series(v2_request(SYMBOLS, v2_series([1, 2], [(1, 1.0)]) + exemplar), decode=decode_v2)
    assert words in problem


def test_encoders_write_exemplars_both_versions_decode():
    series = [
        WriteSeries({"__name__": "up"}, [(1000, 1.0)], exemplars=[Exemplar({"trace_id": "t1", "a": "b"}, 0.5, 999)])
    ]
    v1 = unsnappy(encode_write_request_v1(series))
    assert v1 == v1_request(
        v1_series([("__name__", "up")], [(1000, 1.0)]) + v1_exemplar([("a", "b"), ("trace_id", "t1")], 0.5, 999)
    )
    v2 = unsnappy(encode_write_request_v2(series))
    assert v2 == v2_request(
        ["", "__name__", "up", "a", "b", "trace_id", "t1"],
        v2_series([1, 2], [(1000, 1.0)]) + v2_exemplar([3, 4, 5, 6], 0.5, 999),
    )
    assert decode_v1(v1).series == series and decode_v2(v2).series == series


VALID_HISTOGRAMS = {
    "integer": histogram(),
    "float": histogram(count=3.5, zero_count=0.5, deltas=(1.0, 2.0), is_float=True),
    "float count not checked": histogram(count=1.0, zero_count=0.5, deltas=(1.0, 2.0), is_float=True),
    "empty": histogram(count=0, sum_=0.0, zero_count=0, positive=(), deltas=()),
    "negative only": histogram(
        count=2, zero_count=0, positive=(), deltas=(), negative=((-3, 1), (2, 1)), negative_deltas=(1, 0)
    ),
    "NaN sum, count above buckets": histogram(count=9, sum_=math.nan),
    "custom buckets": histogram(
        schema=-53, zero_count=0, count=3, positive=((0, 2), (1, 1)), deltas=(1, 0, 0), custom=(0.1, 0.5, 1.0)
    ),
    "schema -4": histogram(schema=-4),
    "schema 8": histogram(schema=8),
    "reset hint gauge": histogram(reset_hint=3),
}


@pytest.mark.parametrize("data", VALID_HISTOGRAMS.values(), ids=VALID_HISTOGRAMS.keys())
def test_valid_histograms_keep_their_exact_bytes_from_v1_and_v2(data):
    v1 = decode_v1(v1_request(v1_series([("__name__", "h")]) + f_bytes(4, data)))
    assert v1.series[0].histograms == [WriteHistogram(1000, data)]
    v2 = decode_v2(v2_request(SYMBOLS, v2_series([1, 2]) + f_bytes(3, data)))
    assert v2.series[0].histograms == [WriteHistogram(1000, data)]


def test_v2_created_timestamp_is_dropped_and_unknown_fields_too():
    v2 = decode_v2(v2_request(SYMBOLS, v2_series([1, 2]) + f_bytes(3, HISTOGRAM + f_varint(17, 900) + f_varint(99, 1))))
    assert v2.series[0].histograms == [WriteHistogram(1000, HISTOGRAM)]


INVALID_HISTOGRAMS = {
    "count above buckets": (histogram(count=4), "3 observations found in buckets, but the count is 4"),
    "count below buckets": (histogram(count=2), "3 observations found in buckets, but the count is 2"),
    "NaN sum, count below buckets": (
        histogram(count=2, sum_=math.nan),
        "3 observations found in buckets, but the count is 2",
    ),
    "negative bucket": (histogram(count=0, zero_count=1, deltas=(1, -2)), "positive bucket 2 has a count of -1"),
    "negative float bucket": (
        histogram(count=1.0, deltas=(1.0, -1.0), is_float=True),
        "positive bucket 2 has a count of -1.0",
    ),
    "spans need more buckets": (histogram(positive=((0, 3),)), "positive spans need 3 buckets, have 2"),
    "negative offset after the first span": (
        histogram(positive=((0, 1), (-1, 1))),
        "positive span 2 has a negative offset -1",
    ),
    "schema 9": (histogram(schema=9), "schema 9 is not an exponential schema"),
    "schema -5": (histogram(schema=-5), "schema -5 is not an exponential schema"),
    "exponential with custom bounds": (histogram(custom=(1.0,)), "must not have custom bounds"),
    "custom bounds not increasing": (
        histogram(schema=-53, zero_count=0, count=2, custom=(1.0, 1.0)),
        "custom bounds must increase, 1.0 follows 1.0",
    ),
    "custom bound +Inf": (histogram(schema=-53, zero_count=0, count=2, custom=(1.0, math.inf)), "must not be +Inf"),
    "custom bounds too few": (
        histogram(schema=-53, zero_count=0, count=2, positive=((1, 2),), custom=(1.0,)),
        "1 custom bounds cannot cover spans 3 buckets long",
    ),
    "custom buckets with a zero bucket": (
        histogram(schema=-53, custom=(1.0, 2.0)),
        "custom buckets: must have no zero bucket",
    ),
}


INVALID_HISTOGRAMS |= {
    "zero threshold -1": (histogram(zero_threshold=-1.0), "the zero threshold must be a number >= 0, not -1.0"),
    "zero threshold NaN": (histogram(zero_threshold=math.nan), "the zero threshold must be a number >= 0, not nan"),
    "first span past int32": (histogram(positive=((2**31 - 1, 2),)), "reaches bucket indexes 2147483647..2147483648"),
    "later span past int32": (
        histogram(positive=((2**31 - 1, 1), (0, 1))),
        "positive span 2 reaches bucket indexes 2147483648..2147483648, beyond int32",
    ),
    "negative side past int32": (
        histogram(
            count=2, zero_count=0, positive=(), deltas=(), negative=((2**31 - 2, 3),), negative_deltas=(1, 0, -1)
        ),
        "negative span 1 reaches bucket indexes 2147483646..2147483648",
    ),
    "integer count past int64": (
        histogram(count=2**64 - 1, zero_count=0, deltas=(2**62, 2**62)),
        "positive bucket 2 has a count of 9223372036854775808, over 2^63-1",
    ),
    "negative float count": (histogram(count=-1.0, deltas=(1.0, 2.0), is_float=True), "the observation count is -1.0"),
    "negative float zero bucket": (
        histogram(count=3.0, zero_count=-0.5, deltas=(1.0, 2.0), is_float=True),
        "the zero bucket count is -0.5",
    ),
    "-Inf float bucket": (
        histogram(count=3.0, deltas=(1.0, -math.inf), is_float=True),
        "positive bucket 2 has a count of -inf",
    ),
}


@pytest.mark.parametrize("data, words", INVALID_HISTOGRAMS.values(), ids=INVALID_HISTOGRAMS.keys())
def test_invalid_histograms_are_left_out_and_listed_in_v1_and_v2(data, words):
    """The sample and the valid histogram beside the invalid one stay; the request is not refused."""
    good = histogram(timestamp=2000)
    for batch in (
        decode_v1(v1_request(v1_series([("__name__", "h")], [(1, 1.0)]) + f_bytes(4, data) + f_bytes(4, good))),
        decode_v2(v2_request(SYMBOLS, v2_series([1, 2], [(1, 1.0)]) + f_bytes(3, data) + f_bytes(3, good))),
    ):
        assert batch.series == [
            WriteSeries(
                {"__name__": "http_requests_total"} if batch.version == 2 else {"__name__": "h"},
                [(1, 1.0)],
                histograms=[WriteHistogram(2000, good)],
            )
        ]
        (refused,) = batch.rejected_histograms
        assert refused[:3] == (0, 1000, "invalid_histogram")
        assert refused.problem.startswith("series 0: invalid native histogram at 1000: ")
        assert words in refused.problem


def test_float_histograms_keep_nan_and_inf_counts_as_prometheus_does():
    """FloatHistogram.Validate refuses only negative counts: NaN and +Inf pass (a recording rule dividing by 0)."""
    data = histogram(count=math.nan, zero_count=math.inf, deltas=(math.nan, math.inf), is_float=True)
    batch = decode_v1(v1_request(v1_series([("__name__", "h")]) + f_bytes(4, data)))
    assert batch.series[0].histograms == [WriteHistogram(1000, data)] and batch.rejected_histograms == []


def test_histograms_over_the_bucket_limit_are_refused_before_their_buckets_are_read():
    def decode(data, limit):
        return decode_write_request(
            snappy(v1_request(v1_series([("__name__", "h")]) + f_bytes(4, data))), V1, None, LIMIT, limit
        )

    two_buckets = histogram()
    assert decode(two_buckets, 2).series[0].histograms == [WriteHistogram(1000, two_buckets)]
    assert decode(two_buckets, 0).series[0].histograms == [WriteHistogram(1000, two_buckets)]  # 0: no limit
    ((index, timestamp, reason, problem),) = decode(two_buckets, 1).rejected_histograms
    assert (index, timestamp, reason) == (0, 1000, "too_many_buckets")
    assert problem == "series 0: invalid native histogram at 1000: 2 buckets, over the limit of 1"
    many_spans = histogram(count=1, zero_count=0, positive=((0, 0), (0, 0), (0, 1)), deltas=(1,))
    assert "3 spans, over the limit of 2" in decode(many_spans, 2).rejected_histograms[0].problem
    marker = histogram(count=0, zero_count=0, positive=((0, 0),), deltas=())  # client_golang's empty histogram
    assert decode(marker, 1).rejected_histograms == []
    custom = histogram(schema=-53, zero_count=0, count=2, positive=((0, 2),), deltas=(1, 0), custom=(1.0, 2.0, 3.0))
    assert decode(custom, 3).series[0].histograms == [WriteHistogram(1000, custom)]
    assert "4 custom bounds, over the limit of 3" in decode(custom_bounds(4), 3).rejected_histograms[0].problem

    # the histogram: one span of a million buckets, stored before and 24 s to read back
    million = histogram(count=10**6, zero_count=0, positive=((0, 10**6),), deltas=(1,) + (0,) * (10**6 - 1))
    body = snappy(v1_request(v1_series([("__name__", "h")], [(1, 1.0)]) + f_bytes(4, million)))
    started = time.monotonic()
    batch = decode_write_request(body, V1, None, 64 << 20, 160)
    assert time.monotonic() - started < 0.5  # checked by its length, not bucket by bucket
    assert batch.series == [WriteSeries({"__name__": "h"}, [(1, 1.0)])]
    assert batch.rejected_histograms == [
        RejectedHistogram(
            0,
            1000,
            "too_many_buckets",
            "series 0: invalid native histogram at 1000: 1000000 buckets, over the limit of 160",
        )
    ]


def test_encoders_write_histograms_both_versions_decode():
    series = [
        WriteSeries(
            {"__name__": "h"},
            histograms=[WriteHistogram(1000, HISTOGRAM), WriteHistogram(2000, histogram(timestamp=2000))],
        )
    ]
    v1 = unsnappy(encode_write_request_v1(series))
    assert v1 == v1_request(
        v1_series([("__name__", "h")]) + f_bytes(4, HISTOGRAM) + f_bytes(4, histogram(timestamp=2000))
    )
    v2 = unsnappy(encode_write_request_v2(series))
    assert v2 == v2_request(
        ["", "__name__", "h"], v2_series([1, 2]) + f_bytes(3, HISTOGRAM) + f_bytes(3, histogram(timestamp=2000))
    )
    assert decode_v1(v1).series == series and decode_v2(v2).series == series


def test_v1_body_sent_as_v2_decodes_to_nothing():
    # v2 reserves fields 1-3, so a v1 body parses as an empty v2 request; the
    # zero Written headers are how the sender notices.
    batch = decode_v2(v1_request(GOOD))
    assert batch == WriteBatch(version=2)
    assert v2_written_headers(batch)["X-Prometheus-Remote-Write-Samples-Written"] == "0"


@pytest.mark.parametrize(
    "symbols, series, words",
    [
        (SYMBOLS, v2_series([1, 2, 3], [(1, 1.0)]), "series 0: odd number of labels_refs (3)"),
        (SYMBOLS, v2_series([1, 7], [(1, 1.0)]), "series 0: label value ref 7 out of range"),
        (SYMBOLS, v2_series([99, 2], [(1, 1.0)]), "series 0: label name ref 99 out of range"),
        (SYMBOLS, v2_series([1, 2], [(1, 1.0)], metadata=f_varint(3, 7)), "series 0: help_ref 7"),
        (SYMBOLS, v2_series([1, 2], [(1, 1.0)], metadata=f_varint(4, 8)), "series 0: unit_ref 8"),
        (SYMBOLS, v2_series([1, 2, 1, 2], [(1, 1.0)]), "series 0: duplicate label name"),
        (SYMBOLS + [""], v2_series([1, 2, 7, 4], [(1, 1.0)]), "series 0: empty label name"),
        (SYMBOLS, v2_series([3, 4], [(1, 1.0)]), "series 0: missing or empty __name__"),
        (SYMBOLS, v2_series([1, 0], [(1, 1.0)]), "series 0: missing or empty __name__"),
        (SYMBOLS, v2_series([1, 2]), "series 0: no samples and no histograms"),
        ([], v2_series([1, 2], [(1, 1.0)]), "out of range (symbols table has 0 entries)"),
    ],
)
def test_v2_invalid_series_are_left_out_and_named(symbols, series, words):
    [problem] = refused_series(v2_request(symbols, series), decode=decode_v2)
    assert words in problem


def test_v2_symbols_not_starting_empty_refuse_the_request():
    error = reject(v2_request(["x", "__name__", "m"], v2_series([1, 2], [(1, 1.0)])), decode=decode_v2)
    assert error.status == 400 and "symbols[0] must be" in error.message


def test_v2_bad_protobuf_is_400():
    error = reject(b"\x22\x05ab", decode=decode_v2)  # symbol cut short
    assert error.status == 400
    assert "io.prometheus.write.v2.Request" in error.message


def test_v2_encoder_interns_strings_like_the_spec():
    series = [
        WriteSeries({"job": "api", "__name__": "up"}, [(1000, 1.0)]),
        WriteSeries({"__name__": "reqs", "job": "api"}, [(1000, 5.0)], "counter", "Requests.", "s"),
    ]
    expected = v2_request(
        ["", "__name__", "up", "job", "api", "reqs", "Requests.", "s"],
        v2_series([1, 2, 3, 4], [(1000, 1.0)]),
        v2_series([1, 5, 3, 4], [(1000, 5.0)], f_varint(1, 1) + f_varint(3, 6) + f_varint(4, 7)),
    )
    body = encode_write_request_v2(series)
    assert unsnappy(body) == expected
    assert decode_write_request(body, V2, "snappy", LIMIT).series == series


# --- remote read: request and matchers ----------------------------------------


def matcher_bytes(type_number: int, name: str, value: str) -> bytes:
    # proto3 leaves out fields holding their default (EQ, ""), as encoders do.
    out = f_varint(1, type_number) if type_number else b""
    return out + f_bytes(2, name) + (f_bytes(3, value) if value else b"")


def read_request_bytes() -> bytes:
    hints = f_varint(1, 15000) + f_bytes(2, "rate") + f_varint(3, 1000) + f_varint(4, 61000)
    hints += f_bytes(5, "job") + f_bytes(5, "code") + f_varint(6, 1) + f_varint(7, 300000)
    query0 = f_varint(1, 1000) + f_varint(2, 61000)
    query0 += f_bytes(3, matcher_bytes(0, "__name__", "http_requests_total"))
    query0 += f_bytes(3, matcher_bytes(1, "env", ""))
    query0 += f_bytes(3, matcher_bytes(2, "job", "api|web"))
    query0 += f_bytes(3, matcher_bytes(3, "code", "5.."))
    query0 += f_bytes(4, hints)
    query1 = f_varint(1, -5000) + f_varint(2, -1) + f_bytes(3, matcher_bytes(0, "__name__", "up"))
    return f_bytes(1, query0) + f_bytes(1, query1) + packed(2, [1, 0])


def test_read_request_decodes_queries_matchers_and_hints():
    request = decode_read_request(snappy(read_request_bytes()), LIMIT)
    assert request.accepted_response_types == [STREAMED_XOR_CHUNKS, SAMPLES]
    first, second = request.queries
    assert (first.start_ms, first.end_ms) == (1000, 61000)
    assert first.matchers == [
        ("EQ", "__name__", "http_requests_total"),
        ("NEQ", "env", ""),
        ("RE", "job", "api|web"),
        ("NRE", "code", "5.."),
    ]
    assert first.hints == ReadHints(15000, "rate", 1000, 61000, ("job", "code"), True, 300000)
    assert second == ReadQuery(-5000, -1, [Matcher("EQ", "__name__", "up")], None)


def test_read_request_encoder_writes_the_same_bytes():
    request = decode_read_request(snappy(read_request_bytes()), LIMIT)
    body = encode_read_request(request.queries, request.accepted_response_types)
    assert unsnappy(body) == read_request_bytes()


def test_explicit_default_fields_decode_like_absent_ones():
    raw = f_bytes(1, f_bytes(3, f_varint(1, 0) + f_bytes(2, "env") + f_bytes(3, "")))
    assert decode_read_request(snappy(raw), LIMIT).queries[0].matchers == [("EQ", "env", "")]


def test_present_but_empty_hints_are_kept():
    raw = f_bytes(1, f_varint(1, 1) + f_bytes(4, b""))
    assert decode_read_request(snappy(raw), LIMIT).queries[0].hints == ReadHints()


@pytest.mark.parametrize(
    "raw, words",
    [
        (f_bytes(1, f_bytes(3, matcher_bytes(2, "job", "(x"))), "query 0: invalid regular expression"),
        (f_bytes(1, f_bytes(3, matcher_bytes(3, "job", "[z-a]"))), "invalid regular expression"),
        (f_bytes(1, f_bytes(3, matcher_bytes(4, "job", "x"))), "query 0: unknown matcher type 4"),
        (b"\x0a\x09\x0a", "prometheus.ReadRequest"),
    ],
)
def test_bad_read_requests_are_400(raw, words):
    with pytest.raises(RemoteReadError) as info:
        decode_read_request(snappy(raw), LIMIT)
    assert info.value.status == 400
    assert words in info.value.message


def test_corrupt_snappy_read_request_is_400():
    with pytest.raises(RemoteReadError) as info:
        decode_read_request(b"\x05abc", LIMIT)
    assert info.value.status == 400


@pytest.mark.parametrize(
    "accepted, chosen",
    [
        ([], SAMPLES),
        ([SAMPLES], SAMPLES),
        ([STREAMED_XOR_CHUNKS, SAMPLES], STREAMED_XOR_CHUNKS),
        (["7", SAMPLES], SAMPLES),
    ],
)
def test_response_type_negotiation(accepted, chosen):
    assert negotiate_response_type(accepted) == chosen


def test_unknown_response_types_are_kept_and_refused():
    request = decode_read_request(snappy(packed(2, [7])), LIMIT)
    assert request.accepted_response_types == ["7"]
    with pytest.raises(RemoteReadError) as info:
        negotiate_response_type(request.accepted_response_types)
    assert info.value.status == 400


@pytest.mark.parametrize(
    "matcher, labels, expected",
    [
        (("EQ", "job", "api"), {"job": "api"}, True),
        (("EQ", "job", "api"), {"job": "apis"}, False),
        (("EQ", "foo", ""), {"job": "api"}, True),  # unset label equals ""
        (("EQ", "foo", ""), {"foo": "x"}, False),
        (("NEQ", "foo", ""), {"job": "api"}, False),  # foo!="" requires foo
        (("NEQ", "foo", ""), {"foo": "x"}, True),
        (("NEQ", "job", "api"), {}, True),
        (("RE", "job", "ap"), {"job": "api"}, False),  # anchored at the end
        (("RE", "job", "pi"), {"job": "api"}, False),  # and at the start
        (("RE", "job", "a.*"), {"job": "api"}, True),
        (("RE", "job", "api|web"), {"job": "web"}, True),
        (("RE", "job", "api|web"), {"job": "apiweb"}, False),  # anchors wrap the alternation
        (("RE", "job", "a.c"), {"job": "a\nc"}, True),  # "." matches a newline, as in Prometheus
        (("RE", "foo", ".*"), {}, True),
        (("RE", "foo", ".+"), {}, False),
        (("RE", "foo", "bar|"), {}, True),
        (("NRE", "code", "5.."), {"code": "500"}, False),
        (("NRE", "code", "5.."), {"code": "200"}, True),
        (("NRE", "code", "5.."), {}, True),
        (("NRE", "foo", ""), {}, False),
    ],
)
def test_matcher_semantics_follow_prometheus(matcher, labels, expected):
    assert Matcher(*matcher).matches_labels(labels) is expected
    assert Matcher(*matcher).matches(labels.get(matcher[1], "")) is expected


def test_series_matches_needs_every_matcher():
    matchers = [Matcher("EQ", "__name__", "up"), Matcher("RE", "job", "api|web")]
    assert series_matches(matchers, {"__name__": "up", "job": "web"})
    assert not series_matches(matchers, {"__name__": "up", "job": "db"})
    assert series_matches([], {"__name__": "anything"})


def test_invalid_regex_in_a_constructed_matcher_is_400():
    with pytest.raises(RemoteReadError) as info:
        Matcher("RE", "job", "a(").matches("a")
    assert info.value.status == 400


# --- remote read: SAMPLES response ------------------------------------------------


def test_samples_response_bytes():
    results = [
        [({"job": "api", "__name__": "up"}, [(1000, 1.0), (2000, float_of(STALE_NAN_BITS))])],
        [],
        [({"__name__": "a"}, []), ({"__name__": "b"}, [(-1, -2.5)])],
    ]
    series_up = (
        f_bytes(1, label("__name__", "up"))
        + f_bytes(1, label("job", "api"))
        + f_bytes(2, sample(1.0, 1000))
        + f_bytes(2, f_double_bits(1, STALE_NAN_BITS) + f_varint(2, 2000))
    )
    expected = (
        f_bytes(1, f_bytes(1, series_up))
        + f_bytes(1, b"")
        + f_bytes(
            1,
            f_bytes(1, f_bytes(1, label("__name__", "a")))
            + f_bytes(1, f_bytes(1, label("__name__", "b")) + f_bytes(2, sample(-2.5, -1))),
        )
    )
    body = encode_read_response(results)
    assert unsnappy(body) == expected
    decoded = decode_read_response(body, LIMIT)
    assert len(decoded) == 3 and decoded[1] == [] and decoded[2] == results[2]
    assert bits_of(decoded[0][0][1][1][1]) == STALE_NAN_BITS


def test_samples_answer_is_what_protobuf_serializes():
    """The vectorised sample encoding writes protobuf's own bytes, whatever the values and
    timestamps (zeros left out, negative timestamps as 10-byte varints, NaN payloads kept)."""
    import numpy as np

    rng = np.random.default_rng(3)
    specials = np.array([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 5e-324], dtype=np.float64)
    values = np.concatenate(
        [rng.normal(0, 1e6, 500), specials, np.frombuffer(struct.pack("<Q", STALE_NAN_BITS), dtype=np.float64)]
    )
    stamps = np.concatenate(
        [rng.integers(-(2**62), 2**62, 300), rng.integers(0, 2**14, 200), [0, -1, 1, 127, 128, -(2**63), 2**63 - 1]]
    )
    stamps = stamps[: len(values)].astype(np.int64)

    from types import SimpleNamespace

    from protocols.prometheus import remote_pb2

    arrays = SimpleNamespace(timestamps=stamps, values=values)
    expected = remote_pb2.ReadResponse()
    series = expected.results.add().timeseries.add()
    series.labels.add(name="__name__", value="x")
    for timestamp, value in zip(stamps.tolist(), values.tolist()):
        series.samples.add(timestamp=timestamp, value=value)
    assert unsnappy(encode_read_response([[({"__name__": "x"}, arrays)]])) == expected.SerializeToString()


def test_samples_answer_with_exemplars_is_what_protobuf_serializes():
    """Exemplars follow the samples (field 3 of TimeSeries); a series may have exemplars only."""
    from protocols.prometheus import remote_pb2

    nan = float_of(STALE_NAN_BITS)
    exemplars = [Exemplar({"trace_id": "t1", "a": "b"}, nan, 999), Exemplar({}, 0.0, -5), Exemplar({"x": "y"}, -0.0, 0)]
    results = [
        [({"__name__": "x"}, [(1000, 1.0)], exemplars), ({"__name__": "y"}, [], exemplars[:1])],
        [({"__name__": "z"}, [(1, 2.0)])],
    ]
    expected = remote_pb2.ReadResponse()
    for series_list in results:
        result = expected.results.add()
        for labels, samples, *rest in series_list:
            series = result.timeseries.add()
            for name in sorted(labels):
                series.labels.add(name=name, value=labels[name])
            for timestamp, value in samples:
                series.samples.add(timestamp=timestamp, value=value)
            for exemplar in rest[0] if rest else ():
                message = series.exemplars.add(value=exemplar.value, timestamp=exemplar.timestamp)
                for name in sorted(exemplar.labels):
                    message.labels.add(name=name, value=exemplar.labels[name])
    encoded = unsnappy(encode_read_response(results))
    assert encoded == expected.SerializeToString()
    exemplar_bytes = f_bytes(
        3,
        f_bytes(1, label("a", "b"))
        + f_bytes(1, label("trace_id", "t1"))
        + f_double_bits(2, STALE_NAN_BITS)
        + f_varint(3, 999),
    )
    assert f_bytes(2, sample(1.0, 1000)) + exemplar_bytes in encoded


def test_samples_answer_with_histograms_is_what_protobuf_serializes():
    """Histograms (field 4 of TimeSeries) follow the exemplars, each the stored bytes as they are;
    a series may have histograms only."""
    from protocols.prometheus import remote_pb2

    stored = [WriteHistogram(1000, data) for data in VALID_HISTOGRAMS.values()]
    results = [
        [
            ({"__name__": "h"}, [(1000, 1.0)], [Exemplar({"trace_id": "t"}, 0.5, 999)], stored),
            ({"__name__": "only_histograms"}, [], [], stored[:1]),
        ]
    ]
    expected = remote_pb2.ReadResponse()
    result = expected.results.add()
    for labels, samples, exemplars, histograms in results[0]:
        series = result.timeseries.add()
        series.labels.add(name="__name__", value=labels["__name__"])
        for timestamp, value in samples:
            series.samples.add(timestamp=timestamp, value=value)
        for exemplar in exemplars:
            series.exemplars.add(value=exemplar.value, timestamp=exemplar.timestamp).labels.add(
                name="trace_id", value="t"
            )
        for histogram in histograms:
            series.histograms.add().ParseFromString(histogram.data)
    encoded = unsnappy(encode_read_response(results))
    assert encoded == expected.SerializeToString()
    assert [h.SerializeToString() for h in expected.results[0].timeseries[0].histograms] == [h.data for h in stored]


# --- remote read: STREAMED_XOR_CHUNKS ---------------------------------------------


@pytest.mark.parametrize(
    "data, crc",
    [
        (b"123456789", 0xE3069283),  # the standard check value
        (b"", 0),
        (bytes(32), 0x8A9136AA),  # RFC 3720 B.4 vectors
        (b"\xff" * 32, 0x62A8AB43),
        (bytes(range(32)), 0x46DD794E),
        (bytes(range(31, -1, -1)), 0x113FDB5C),
    ],
)
def test_crc32c_vectors(data, crc):
    assert crc32c(data) == crc


def test_crc32c_can_continue():
    assert crc32c(b"6789", crc32c(b"12345")) == 0xE3069283


def test_frame_layout():
    assert encode_frame(b"123456789") == b"\x09" + bytes.fromhex("e3069283") + b"123456789"
    frame = encode_frame(b"x" * 300)
    assert frame[:2] == b"\xac\x02"
    assert frame[2:6] == crc32c(b"x" * 300).to_bytes(4, "big")
    assert list(iter_frames(encode_frame(b"abc") + frame)) == [b"abc", b"x" * 300]


@pytest.mark.parametrize(
    "stream, words",
    [
        (b"\x03" + b"\x00\x00\x00\x00" + b"abc", "checksum"),
        (encode_frame(b"abc")[:-1], "truncated"),
        (b"\x80", "truncated"),
    ],
)
def test_bad_frames_are_refused(stream, words):
    with pytest.raises(ValueError, match=words):
        list(iter_frames(stream))


def chunk_bytes(min_t: int, max_t: int, data: bytes) -> bytes:
    return f_varint(1, min_t) + f_varint(2, max_t) + f_varint(3, 1) + f_bytes(4, data)


def test_chunked_series_frame_bytes():
    samples = [(1000 + 15000 * i, float(i)) for i in range(250)]
    labels = {"job": "api", "__name__": "up"}
    (frame,) = encode_chunked_series_frames(3, labels, samples)
    parts = [samples[:120], samples[120:240], samples[240:]]
    series = f_bytes(1, label("__name__", "up")) + f_bytes(1, label("job", "api"))
    for part in parts:
        series += f_bytes(2, chunk_bytes(part[0][0], part[-1][0], encode_xor_chunk(part)))
    message = f_bytes(1, series) + f_varint(2, 3)
    assert frame == varint(len(message)) + crc32c(message).to_bytes(4, "big") + message
    assert list(decode_chunked_read_response(frame)) == [(3, labels, samples)]


def test_chunked_series_split_over_frames_and_streams():
    samples = [(i * 1000, random.Random(i).random()) for i in range(1000)]
    frames = list(encode_chunked_series_frames(0, {"__name__": "x"}, samples, 100, 2000))
    assert len(frames) > 1
    decoded = list(decode_chunked_read_response(b"".join(frames)))
    assert all(index == 0 and labels == {"__name__": "x"} for index, labels, _ in decoded)
    assert [s for _, _, part in decoded for s in part] == samples
    assert list(encode_chunked_series_frames(0, {"__name__": "x"}, [])) == []


def test_chunk_time_range_covers_unsorted_samples():
    (frame,) = encode_chunked_series_frames(0, {"__name__": "x"}, [(50, 1.0), (10, 2.0), (30, 3.0)])
    (message,) = iter_frames(frame)
    expected_chunk = chunk_bytes(10, 50, encode_xor_chunk([(50, 1.0), (10, 2.0), (30, 3.0)]))
    assert f_bytes(2, expected_chunk) in message


@pytest.mark.parametrize("size", [0, 65536])
def test_chunk_size_limits(size):
    with pytest.raises(ValueError):
        next(encode_chunked_series_frames(0, {"__name__": "x"}, [(1, 1.0)], size))


# --- XOR chunks -------------------------------------------------------------------
# Vectors marked "Prometheus" were produced by github.com/prometheus/prometheus
# v0.316.0 tsdb/chunkenc.NewXORChunk().Appender().Append(...) for the same input.

PROMETHEUS_VECTORS = {
    "one sample": ([(1000, 1.0)], "0001d00f3ff0000000000000"),
    "basic": (
        [(1000, 1.0), (2000, 1.0), (3000, 2.0), (4000, 2.5), (5001, 2.5), (6000, 0.0)],
        "0006d00f3ff0000000000000e8073097ffdb41c000afffb09b0010",
    ),
    "specials and negative deltas": (
        [
            (-5000, float_of(STALE_NAN_BITS)),
            (-4000, math.inf),
            (-4100, -math.inf),
            (100000, float_of(0x7FF8000000000001)),  # Go's math.NaN()
            (100001, 1e-300),
            (1 << 40, 42.0),
        ],
        "00068f4e7ff0000000000002e807ff000000000ddda6007c32e118008008000000000001ee695d9f975b"
        "87f0be3cd63c000003fffff9e57a41e06e1fc2f8f359",
    ),
    "value widths": (
        [
            (i * 10, float_of(bits))
            for i, bits in enumerate(
                [
                    bits_of(1.0),
                    bits_of(-1.0),  # XOR is the sign bit alone: 63 trailing zeros
                    0x0000000000000001,
                    0x8000000000000001,  # 64 significant bits, stored as 0
                    0x7FFFFFFFFFFFFFFF,
                    bits_of(3.0),
                    bits_of(3.0),
                    bits_of(3.5),
                    bits_of(1e308),
                    0x0000000100000000,  # more than 31 leading zeros
                ]
            )
        ],
        "000a003ff00000000000000ac00d800bff000000000000150000000000000000bfffffffffffffff91ff"
        "bffffffffffff8800100000000000011ff6e679c2f5e45027fe1ccf285ebc8a0",
    ),
}

# Delta-of-deltas on both sides of every bucket boundary (14, 17, 20, 64 bits).
DOD_BOUNDS = [
    0,
    1,
    -1,
    8192,
    -8191,
    8193,
    -8192,
    65536,
    -65535,
    65537,
    -65536,
    524288,
    -524287,
    524289,
    -524288,
    1 << 40,
    -(1 << 40),
]


def dod_bound_samples() -> list[tuple[int, float]]:
    samples, delta = [(0, 0.0), (1000, 0.0)], 1000
    for dod in DOD_BOUNDS:
        delta += dod
        samples.append((samples[-1][0] + delta, 0.0))
    return samples


PROMETHEUS_VECTORS["dod buckets"] = (
    dod_bound_samples(),
    "0013000000000000000000e80710002bfff50002800584002de00068000340005c20002ef00007400003a"
    "00005e0000000000100002ffffffffffff80000780000080000000003ffffffc00000000000",
)
PROMETHEUS_VECTORS["120 samples"] = (
    [(1_700_000_000_000 + i * 15000 + (i % 7) * 3, (i * i) / 3) for i in range(120)],
    (DATA / "xor_chunk_120_samples.hex").read_text().strip(),
)


def same_bits(a, b) -> bool:
    return [(t, bits_of(v)) for t, v in a] == [(t, bits_of(v)) for t, v in b]


@pytest.mark.parametrize("name", PROMETHEUS_VECTORS)
def test_xor_chunk_matches_prometheus_bytes(name):
    samples, hex_bytes = PROMETHEUS_VECTORS[name]
    assert encode_xor_chunk(samples).hex() == hex_bytes
    assert same_bits(decode_xor_chunk(bytes.fromhex(hex_bytes)), samples)


def test_xor_chunk_derived_by_hand():
    # 0003: three samples. 00: zigzag varint of t=0. Eight 00 bytes: value 0.0.
    # 0a: uvarint delta 10. Then bits: 0 (value unchanged), 10 + 00000000001010
    # (delta-of-delta 20-10=10 in the 14-bit bucket), 0 (value unchanged),
    # padded: 01000000 00000101 00000000 = 40 05 00.
    samples = [(0, 0.0), (10, 0.0), (30, 0.0)]
    expected = bytes.fromhex("0003" + "00" + "00" * 8 + "0a" + "400500")
    assert encode_xor_chunk(samples) == expected
    assert decode_xor_chunk(expected) == samples
    assert encode_xor_chunk([]) == b"\x00\x00"
    assert decode_xor_chunk(b"\x00\x00") == []


def random_samples(rng: random.Random, count: int) -> list[tuple[int, float]]:
    t = rng.randint(-(1 << 45), 1 << 45)
    value = rng.uniform(-1e6, 1e6)
    samples = []
    for _ in range(count):
        t += rng.choice([15000, 15000, 15001, 14999, 0, -1, rng.randint(-(1 << 30), 1 << 30)])
        kind = rng.random()
        if kind < 0.3:
            pass  # repeat the value
        elif kind < 0.6:
            value += rng.choice([1.0, 0.5, -0.25])
        elif kind < 0.8:
            value = float(rng.randint(-1000, 1000))
        else:
            value = float_of(rng.getrandbits(64))  # any bit pattern, NaNs included
        samples.append((t, value))
    return samples


@pytest.mark.parametrize("seed", range(20))
def test_xor_chunk_round_trips_random_data(seed):
    rng = random.Random(seed)
    samples = random_samples(rng, rng.choice([1, 2, 3, 119, 120, 500]))
    assert same_bits(decode_xor_chunk(encode_xor_chunk(samples)), samples)


@pytest.mark.parametrize(
    "samples",
    [
        [(0, 0.0)],
        [(-(1 << 63), -0.0), ((1 << 63) - 1, 0.0)],  # extreme timestamps
        [((1 << 63) - 1, 1.0), (-(1 << 63), 1.0), ((1 << 63) - 1, 1.0)],  # wrapping deltas
        [(i, 7.0) for i in range(120)],  # equal values
        [(1000 * i, float_of(STALE_NAN_BITS)) for i in range(5)],
        [(1000 * i, v) for i, v in enumerate([math.inf, -math.inf, math.nan, 5e-324, -1.7e308])],
        [(100 - 10 * i, float(i)) for i in range(10)],  # time going backwards
    ],
)
def test_xor_chunk_round_trips_edge_data(samples):
    assert same_bits(decode_xor_chunk(encode_xor_chunk(samples)), samples)


def test_xor_chunk_sample_limit():
    big = [(i, 1.0) for i in range(65535)]
    assert decode_xor_chunk(encode_xor_chunk(big)) == big
    with pytest.raises(ValueError):
        encode_xor_chunk(big + [(65535, 1.0)])


def test_truncated_xor_chunk_is_refused():
    data = bytes.fromhex(PROMETHEUS_VECTORS["basic"][1])
    with pytest.raises(ValueError, match="truncated"):
        decode_xor_chunk(data[:-3])


# --- name mapping -----------------------------------------------------------------


@pytest.mark.parametrize(
    "name, expected",
    [
        ("servers.web-1.cpu.user", "servers_web_1_cpu_user"),
        ("http_requests_total", "http_requests_total"),
        ("job:rate5m", "job:rate5m"),
        ("1min.load", "_1min_load"),
        ("carbon.agents.a.b.c/d e", "carbon_agents_a_b_c_d_e"),
        ("température", "temp_rature"),
        ("_", "_"),
    ],
)
def test_prometheus_metric_name(name, expected):
    assert prometheus_metric_name(name) == expected


@pytest.mark.parametrize(
    "name, expected",
    [
        ("dc", "dc"),
        ("data-center", "data_center"),
        ("a:b", "a_b"),
        ("9lives", "_9lives"),
        ("rack.id", "rack_id"),
    ],
)
def test_sanitize_label_name(name, expected):
    assert sanitize_label_name(name) == expected


def test_empty_names_cannot_be_mapped():
    with pytest.raises(ValueError):
        prometheus_metric_name("")
    with pytest.raises(ValueError):
        sanitize_label_name("")


def test_v2_created_timestamps_of_a_series_or_its_samples():
    """Prometheus 3.x sends TimeSeries.created_timestamp (6); later drafts carry it per sample
    and histogram (start_timestamp): the series keeps the first, else the newest of the others."""
    from protocols.prometheus import write_v2_pb2

    request = write_v2_pb2.Request(symbols=["", "__name__", "a", "b"])
    request.timeseries.add(labels_refs=[1, 2], created_timestamp=500).samples.add(
        value=1.0, timestamp=1000, start_timestamp=400
    )
    per_sample = request.timeseries.add(labels_refs=[1, 3])
    per_sample.samples.add(value=1.0, timestamp=1000, start_timestamp=300)
    per_sample.samples.add(value=1.0, timestamp=2000, start_timestamp=1500)
    request.timeseries.add(labels_refs=[1, 1]).histograms.add().MergeFromString(
        histogram(timestamp=900) + b"\x88\x01\xf4\x03"
    )
    request.timeseries.add(labels_refs=[1, 2]).samples.add(value=1.0, timestamp=1000)
    batch = decode_v2(request.SerializeToString())
    assert [s.created_timestamp for s in batch.series] == [500, 1500, 500, 0]
    assert batch.series[2].histograms[0].data == histogram(
        timestamp=900
    )  # start_timestamp (17) is not kept in the bytes
    again = decode_write_request(encode_write_request_v2(batch.series), V2, "snappy", LIMIT)
    assert [s.created_timestamp for s in again.series] == [500, 1500, 500, 0]


# --- decoding in bounded steps ---------------------------------------------------


def decoded_in_steps(body: bytes, content_type: str) -> tuple[WriteBatch, int]:
    """The batch decode_write_request_steps returns, and how many times it yielded."""
    steps = decode_write_request_steps(body, content_type, "snappy", LIMIT)
    yields = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value, yields
        yields += 1


def test_a_request_decodes_in_bounded_parts_to_what_it_decodes_to_at_once(monkeypatch):
    """Parts of a few fields each parse alone; the batch, series indexes in errors included, is
    the same as from one part, and the decoder yields at least once a part (of about 2 series
    here), or, in 2.0, every V2_SERIES_PER_STEP series."""
    series = [
        WriteSeries({"__name__": "parts", "i": str(i)}, [(1_700_000_000_000 + i, float(i))], metric_type="gauge")
        for i in range(40)
    ]
    whole = {V1: decode_write_request(encode_write_request_v1(series), V1, "snappy", LIMIT)}
    whole[V2] = decode_write_request(encode_write_request_v2(series), V2, "snappy", LIMIT)
    monkeypatch.setattr(write_module, "PART_BYTES", 64)
    monkeypatch.setattr(write_module, "V2_SERIES_PER_STEP", 2)
    for content_type, encode in ((V1, encode_write_request_v1), (V2, encode_write_request_v2)):
        batch, yields = decoded_in_steps(encode(series), content_type)
        assert batch == whole[content_type] and len(batch.series) == 40
        assert yields >= 20
    bad = [*series[:30], WriteSeries({"__name__": "parts", "": "x"}, [(1_700_000_000_000, 1.0)]), *series[30:]]
    for content_type, encode in ((V1, encode_write_request_v1), (V2, encode_write_request_v2)):
        for arrays in (False, True):
            batch = decode_write_request(encode(bad), content_type, "snappy", LIMIT, arrays=arrays)
            assert list(map(str, batch.rejected_series)) == ["series 30: empty label name"]
            assert batch.sample_count == 40


def test_v2_symbols_sent_after_the_series_that_use_them_are_found(monkeypatch):
    monkeypatch.setattr(write_module, "PART_BYTES", 16)
    raw = cramjam.snappy.decompress_raw(
        encode_write_request_v2([WriteSeries({"__name__": "late", "a": "b"}, [(1_700_000_000_000, 1.0)])])
    )
    request = write_v2_pb2.Request.FromString(bytes(raw))
    symbols_only = write_v2_pb2.Request(symbols=request.symbols).SerializeToString()
    series_only = write_v2_pb2.Request(timeseries=request.timeseries).SerializeToString()
    (found,) = decode_v2(series_only + symbols_only).series
    assert found.labels == {"__name__": "late", "a": "b"}


@pytest.mark.parametrize(
    "path_name, name",
    [
        ("k8s.pod.name", "k8s.pod.name"),  # no prefix: as it is
        ("U__k8s_2e_pod_2e_name", "k8s.pod.name"),
        ("U__http__server_2E_requests", "http_server.requests"),  # "__" is "_", hex either case
        ("U___31_min", "1min"),  # "U__" then "_31_"
        ("U__caf_e9_", "café"),
        ("U__emoji_1f4c8_", "emoji\U0001f4c8"),
        ("U__", ""),
        ("U__a_", "U__a_"),  # a lone "_" at the end: left as it is, as Prometheus does
        ("U__a_zz_", "U__a_zz_"),  # not hex
        ("U__a_d800_", "U__a_d800_"),  # a surrogate is no code point
        ("U__a_10ffff_", "U__a_10ffff_"),  # six hex digits: Prometheus's UnescapeName gives up
    ],
)
def test_names_in_a_url_path_are_unescaped_as_prometheus_3_does(path_name, name):
    assert unescape_name(path_name) == name


def test_remote_read_maps_names_only_for_prometheus_2_readers():
    labels = {"k8s.pod.name": "p-1"}
    for agent in ("Prometheus/2.42.0", "Prometheus/1.8.2"):
        assert labels_for_reader(agent)("http.server.duration", labels) == {
            "__name__": "http_server_duration",
            "k8s_pod_name": "p-1",
        }
    for agent in ("Prometheus/3.14.0", "Thanos/0.35", "", None):
        assert labels_for_reader(agent)("http.server.duration", labels) == {
            "__name__": "http.server.duration",
            "k8s.pod.name": "p-1",
        }
