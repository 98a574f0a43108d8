"""Remote read: request decoding, label matching, and both response formats.

SAMPLES answers are one snappy-compressed ReadResponse. STREAMED_XOR_CHUNKS
answers are a sequence of frames, each uvarint(len(message)) + big-endian
CRC-32C(message) + message, where message is a ChunkedReadResponse holding
one series; frames can be written as soon as each series is ready.
"""

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import groupby
from typing import NamedTuple

import numpy as np
from google.protobuf.message import DecodeError

from ..linear_regex import BadPattern, compile_regex
from . import histogram_chunks, remote_pb2, types_pb2
from .crc32c import crc32c
from .errors import ProtocolError, RemoteReadError
from .snappy import compress_block, decompress_block
from .xor import MAX_SAMPLES, decode_xor_chunk, encode_xor_chunk

SAMPLES = "SAMPLES"
STREAMED_XOR_CHUNKS = "STREAMED_XOR_CHUNKS"
SAMPLES_CONTENT_TYPE = "application/x-protobuf"  # sent with Content-Encoding: snappy
STREAMED_CONTENT_TYPE = "application/x-streamed-protobuf; proto=prometheus.ChunkedReadResponse"

_MATCHER_TYPES = ("EQ", "NEQ", "RE", "NRE")
_RESPONSE_TYPES = {value.number: value.name for value in remote_pb2.ReadRequest.ResponseType.DESCRIPTOR.values}


def _compile(pattern: str):
    # Prometheus regexes are RE2's, anchored at both ends (fullmatch), "." matching newlines.
    try:
        return compile_regex(pattern, dot_nl=True)
    except BadPattern as error:
        raise RemoteReadError(400, str(error)) from None


class Matcher(NamedTuple):
    """A label matcher: type is "EQ", "NEQ", "RE" or "NRE"."""

    type: str
    name: str
    value: str

    def matches(self, value: str) -> bool:
        """Match one label value; pass "" for a label the series does not have."""
        if self.type == "EQ":
            return value == self.value
        if self.type == "NEQ":
            return value != self.value
        if self.type == "RE":
            return _compile(self.value).fullmatch(value) is not None
        if self.type == "NRE":
            return _compile(self.value).fullmatch(value) is None
        raise ValueError(f"unknown matcher type {self.type!r}")

    def matches_labels(self, labels: Mapping[str, str]) -> bool:
        """Match a series: an absent label counts as the empty string."""
        return self.matches(labels.get(self.name, ""))


def series_matches(matchers: Iterable[Matcher], labels: Mapping[str, str]) -> bool:
    """True when every matcher accepts the series' labels."""
    return all(matcher.matches_labels(labels) for matcher in matchers)


@dataclass(frozen=True)
class ReadHints:
    """Optional hints about the PromQL query behind a remote read query."""

    step_ms: int = 0
    func: str = ""
    start_ms: int = 0
    end_ms: int = 0
    grouping: tuple[str, ...] = ()
    by: bool = False
    range_ms: int = 0


@dataclass
class ReadQuery:
    start_ms: int
    end_ms: int
    matchers: list[Matcher]
    hints: ReadHints | None = None


@dataclass
class ReadRequest:
    queries: list[ReadQuery]
    # In the client's order of preference; unknown numbers are kept as str(n).
    accepted_response_types: list[str] = field(default_factory=list)


def decode_read_request(body: bytes, max_decompressed_bytes: int) -> ReadRequest:
    """Decode a snappy-compressed ReadRequest or raise RemoteReadError (400, 413)."""
    try:
        raw = decompress_block(body, max_decompressed_bytes)
    except ProtocolError as exc:
        raise RemoteReadError(exc.status, exc.message) from exc
    request = remote_pb2.ReadRequest()
    try:
        request.ParseFromString(raw)
    except DecodeError as exc:
        raise RemoteReadError(400, f"invalid protobuf prometheus.ReadRequest: {exc}") from exc
    queries = []
    for index, query in enumerate(request.queries):
        matchers = []
        for matcher in query.matchers:
            if not 0 <= matcher.type < len(_MATCHER_TYPES):
                raise RemoteReadError(400, f"query {index}: unknown matcher type {matcher.type}")
            matchers.append(Matcher(_MATCHER_TYPES[matcher.type], matcher.name, matcher.value))
            if matcher.type in (types_pb2.LabelMatcher.RE, types_pb2.LabelMatcher.NRE):
                try:
                    _compile(matcher.value)
                except RemoteReadError as exc:
                    raise RemoteReadError(400, f"query {index}: {exc.message}") from exc
        hints = None
        if query.HasField("hints"):
            hints = ReadHints(
                step_ms=query.hints.step_ms,
                func=query.hints.func,
                start_ms=query.hints.start_ms,
                end_ms=query.hints.end_ms,
                grouping=tuple(query.hints.grouping),
                by=query.hints.by,
                range_ms=query.hints.range_ms,
            )
        queries.append(ReadQuery(query.start_timestamp_ms, query.end_timestamp_ms, matchers, hints))
    accepted = [_RESPONSE_TYPES.get(number, str(number)) for number in request.accepted_response_types]
    return ReadRequest(queries=queries, accepted_response_types=accepted)


def negotiate_response_type(accepted_response_types: Sequence[str]) -> str:
    """Pick the first response type we support; none listed means SAMPLES (400 if none fit).
    Both carry native histograms: SAMPLES as Histogram messages, STREAMED_XOR_CHUNKS as
    histogram chunks."""
    if not accepted_response_types:
        return SAMPLES
    for response_type in accepted_response_types:
        if response_type in (SAMPLES, STREAMED_XOR_CHUNKS):
            return response_type
    raise RemoteReadError(400, f"no supported response type among {list(accepted_response_types)}")


def encode_read_request(queries: Iterable[ReadQuery], accepted_response_types: Iterable[str] = ()) -> bytes:
    """Build a snappy-compressed ReadRequest, as a remote read client sends it."""
    request = remote_pb2.ReadRequest()
    for query in queries:
        message = request.queries.add(start_timestamp_ms=query.start_ms, end_timestamp_ms=query.end_ms)
        for matcher in query.matchers:
            message.matchers.add(type=_MATCHER_TYPES.index(matcher.type), name=matcher.name, value=matcher.value)
        if query.hints is not None:
            message.hints.step_ms = query.hints.step_ms
            message.hints.func = query.hints.func
            message.hints.start_ms = query.hints.start_ms
            message.hints.end_ms = query.hints.end_ms
            message.hints.grouping.extend(query.hints.grouping)
            message.hints.by = query.hints.by
            message.hints.range_ms = query.hints.range_ms
    for name in accepted_response_types:
        request.accepted_response_types.append(remote_pb2.ReadRequest.ResponseType.Value(name))
    return compress_block(request.SerializeToString())


SeriesData = tuple[dict[str, str], list[tuple[int, float]]]


def _add_labels(container, labels: Mapping[str, str]) -> None:
    for name in sorted(labels):
        container.add(name=name, value=labels[name])


def encode_read_response(results) -> bytes:
    """Build the SAMPLES answer: one QueryResult per query, in request order; each series is
    (labels, samples), (labels, samples, exemplars) or (labels, samples, exemplars, histograms),
    samples being [(timestamp_ms, value), ...] or anything with numpy ``timestamps`` and
    ``values`` arrays, exemplars objects with ``labels``, ``value`` and ``timestamp``
    (write.Exemplar), histograms objects with ``data``, a prometheus.Histogram message as
    protobuf serialises it (write.Histogram). The bytes are those protobuf's
    SerializeToString writes, with the samples encoded by numpy rather than one protobuf call a
    sample (millions of samples in a large read)."""
    return compress_block(b"".join(_field(1, _query_result(series_list)) for series_list in results))


def _query_result(series_list) -> bytes:
    parts = []
    for labels, samples, *extras in series_list:
        message = types_pb2.TimeSeries()
        _add_labels(message.labels, labels)
        timestamps, values = _sample_arrays(samples)
        exemplars, histograms = (*extras, (), ())[:2]
        encoded = message.SerializeToString() + _encoded_samples(timestamps, values) + _encoded_exemplars(exemplars)
        parts.append(_field(1, encoded + b"".join(_field(4, histogram.data) for histogram in histograms)))
    return b"".join(parts)


def _encoded_exemplars(exemplars) -> bytes:
    """``Exemplar`` fields (number 3 of TimeSeries, after the samples as protobuf orders them):
    few per series, so written by protobuf itself."""
    message = types_pb2.TimeSeries()
    for exemplar in exemplars:
        _add_labels(message.exemplars.add(value=exemplar.value, timestamp=exemplar.timestamp).labels, exemplar.labels)
    return message.SerializeToString()


def _sample_arrays(samples) -> tuple[np.ndarray, np.ndarray]:
    if hasattr(samples, "timestamps"):
        return np.asarray(samples.timestamps, dtype=np.int64), np.asarray(samples.values, dtype=np.float64)
    pairs = np.array(list(samples), dtype=[("ts", np.int64), ("value", np.float64)])
    return pairs["ts"], pairs["value"]


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _uvarint(number << 3 | 2) + _uvarint(len(payload)) + payload


def _encoded_samples(timestamps: np.ndarray, values: np.ndarray) -> bytes:
    """``Sample`` fields (number 2 of TimeSeries) of every sample, vectorised. A Sample is
    ``0x12 <length> [0x09 <8 bytes of the double>] [0x10 <varint timestamp>]``; as proto3 does,
    a value whose bits are all zero (+0.0) and a timestamp of 0 are left out. A negative
    timestamp is a 10-byte varint of its two's complement."""
    count = len(timestamps)
    if not count:
        return b""
    value_bits = values.view(np.uint64)
    stamps = timestamps.view(np.uint64)
    groups = (stamps[:, None] >> (7 * np.arange(10, dtype=np.uint64))) & np.uint64(0x7F)
    varint_length = np.maximum(1, 10 - np.argmax(groups[:, ::-1] != 0, axis=1))
    varint_length[stamps == 0] = 0
    has_value = value_bits != 0
    body = 9 * has_value + (varint_length + 1) * (stamps != 0)
    starts = np.concatenate(([0], np.cumsum(body + 2)[:-1]))
    out = np.zeros(int(np.sum(body + 2)), dtype=np.uint8)
    out[starts] = 0x12
    out[starts + 1] = body
    at = starts + 2
    with_value = at[has_value]
    out[with_value] = 0x09
    out[with_value[:, None] + np.arange(1, 9)] = values[has_value].astype("<f8").view(np.uint8).reshape(-1, 8)
    at = at + 9 * has_value
    with_time = stamps != 0
    out[at[with_time]] = 0x10
    lengths, digits = varint_length[with_time], groups[with_time].astype(np.uint8)
    more = np.arange(10) < (lengths[:, None] - 1)
    digits[more] |= 0x80
    used = np.arange(10) < lengths[:, None]
    positions = at[with_time][:, None] + 1 + np.arange(10)
    out[positions[used]] = digits[used]
    return out.tobytes()


def decode_read_response(body: bytes, max_decompressed_bytes: int) -> list[list[SeriesData]]:
    """Decode a SAMPLES answer (the client side of encode_read_response)."""
    response = remote_pb2.ReadResponse()
    try:
        response.ParseFromString(decompress_block(body, max_decompressed_bytes))
    except DecodeError as exc:
        raise ProtocolError(400, f"invalid protobuf prometheus.ReadResponse: {exc}") from exc
    return [
        [
            (
                {label.name: label.value for label in ts.labels},
                [(sample.timestamp, sample.value) for sample in ts.samples],
            )
            for ts in result.timeseries
        ]
        for result in response.results
    ]


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_frame(message: bytes) -> bytes:
    """Wrap one serialized ChunkedReadResponse as a stream frame."""
    return _uvarint(len(message)) + crc32c(message).to_bytes(4, "big") + message


def iter_frames(stream: bytes) -> Iterator[bytes]:
    """Split a streamed answer into messages, checking each CRC-32C (ValueError if bad)."""
    pos = 0
    while pos < len(stream):
        length = shift = 0
        while True:
            if pos >= len(stream) or shift > 63:
                raise ValueError("truncated or malformed frame length")
            byte = stream[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        if pos + 4 + length > len(stream):
            raise ValueError("truncated frame")
        expected = int.from_bytes(stream[pos : pos + 4], "big")
        message = stream[pos + 4 : pos + 4 + length]
        if crc32c(message) != expected:
            raise ValueError("frame checksum mismatch")
        pos += 4 + length
        yield message


def encode_chunked_series_frames(
    query_index: int,
    labels: Mapping[str, str],
    samples: Sequence[tuple[int, float]],
    max_samples_per_chunk: int = 120,
    max_frame_bytes: int = 1 << 20,
    histograms: Sequence = (),
) -> Iterator[bytes]:
    """Yield the STREAMED_XOR_CHUNKS frames of one series (none if it has no samples).

    Samples are cut into XOR chunks of at most `max_samples_per_chunk`
    (Prometheus cuts at 120); a series whose chunk data passes
    `max_frame_bytes` continues in another frame with the same labels, as
    Prometheus does, so no frame grows without bound. `histograms` (objects
    with ``timestamp`` and ``data``, the prometheus.Histogram bytes, as
    write.Histogram) become histogram chunks (histogram_chunks.py) between the
    float chunks, in time order, as a Prometheus series holds them.
    """
    if not 1 <= max_samples_per_chunk <= MAX_SAMPLES:
        raise ValueError(f"max_samples_per_chunk must be within 1..{MAX_SAMPLES}")
    chunks: list[types_pb2.Chunk] = []
    chunk_bytes = 0
    for chunk in _series_chunks(samples, histograms, max_samples_per_chunk):
        chunks.append(chunk)
        chunk_bytes += len(chunk.data)
        if chunk_bytes >= max_frame_bytes:
            yield _series_frame(query_index, labels, chunks)
            chunks, chunk_bytes = [], 0
    if chunks:
        yield _series_frame(query_index, labels, chunks)


_FLOAT, _HISTOGRAM, _FLOAT_HISTOGRAM = types_pb2.Chunk.XOR, types_pb2.Chunk.HISTOGRAM, types_pb2.Chunk.FLOAT_HISTOGRAM


def _series_chunks(
    samples: Sequence[tuple[int, float]], histograms: Sequence, max_samples: int
) -> Iterator[types_pb2.Chunk]:
    """The chunks of one series: float samples as they come when there are no histograms;
    otherwise every sample in time order, a new chunk whenever the kind (float, integer
    histogram, float histogram) changes, as Prometheus's head cuts them."""
    if not histograms:
        yield from _xor_chunks(samples, max_samples)
        return
    decoded = [histogram_chunks.from_protobuf(h.timestamp, h.data) for h in histograms]
    timeline = sorted(
        [(t, _FLOAT, i) for i, (t, _) in enumerate(samples)]
        + [(h.timestamp, _FLOAT_HISTOGRAM if h.is_float else _HISTOGRAM, i) for i, h in enumerate(decoded)]
    )
    for kind, run in groupby(timeline, key=lambda event: event[1]):
        if kind == _FLOAT:
            yield from _xor_chunks([samples[i] for _, _, i in run], max_samples)
            continue
        for header, part in histogram_chunks.cut_chunks([decoded[i] for _, _, i in run], max_samples):
            yield _chunk(kind, part, partial(histogram_chunks.encode_histogram_chunk, header))


def _xor_chunks(samples: Sequence[tuple[int, float]], max_samples: int) -> Iterator[types_pb2.Chunk]:
    for start in range(0, len(samples), max_samples):
        yield _chunk(_FLOAT, samples[start : start + max_samples], encode_xor_chunk)


def _chunk(encoding: "types_pb2.Chunk.Encoding", part: Sequence, encode) -> types_pb2.Chunk:
    """One chunk of ``part`` (pairs or histograms, timestamp first) with its time range."""
    timestamps = [item[0] for item in part]
    return types_pb2.Chunk(min_time_ms=min(timestamps), max_time_ms=max(timestamps), type=encoding, data=encode(part))


def _series_frame(query_index: int, labels: Mapping[str, str], chunks: list[types_pb2.Chunk]) -> bytes:
    response = remote_pb2.ChunkedReadResponse(query_index=query_index)
    series = response.chunked_series.add()
    _add_labels(series.labels, labels)
    series.chunks.extend(chunks)
    return encode_frame(response.SerializeToString())


def decode_chunked_series(
    stream: bytes,
) -> Iterator[tuple[int, dict[str, str], list[tuple[int, float]], list[histogram_chunks.NativeHistogram]]]:
    """Yield (query_index, labels, samples, histograms) per series per frame of a streamed answer."""
    for message in iter_frames(stream):
        response = remote_pb2.ChunkedReadResponse()
        response.ParseFromString(message)
        for series in response.chunked_series:
            samples, histograms = [], []
            for chunk in series.chunks:
                if chunk.type == types_pb2.Chunk.XOR:
                    samples.extend(decode_xor_chunk(chunk.data))
                elif chunk.type in (types_pb2.Chunk.HISTOGRAM, types_pb2.Chunk.FLOAT_HISTOGRAM):
                    histograms.extend(
                        histogram_chunks.decode_histogram_chunk(
                            chunk.data, chunk.type == types_pb2.Chunk.FLOAT_HISTOGRAM
                        )[1]
                    )
                else:
                    raise ValueError(f"unsupported chunk encoding {chunk.type}")
            labels = {label.name: label.value for label in series.labels}
            yield response.query_index, labels, samples, histograms


def decode_chunked_read_response(
    stream: bytes,
) -> Iterator[tuple[int, dict[str, str], list[tuple[int, float]]]]:
    """Yield (query_index, labels, samples) per series per frame of a streamed answer of float
    samples only (ValueError at a histogram chunk: decode_chunked_series reads those)."""
    for query_index, labels, samples, histograms in decode_chunked_series(stream):
        if histograms:
            raise ValueError("the answer holds histogram chunks")
        yield query_index, labels, samples
