"""Remote write 1.0 and 2.0 request bodies: decode, validate, and encode.

Decoding is a generator (decode_write_request_steps) that yields between bounded steps, a part
of the message of about PART_BYTES or one series, so that a server can interleave a 22 MB
request with its other work; decode_write_request runs it to the end at once.

An invalid series (its labels, label refs, exemplars or metadata refs) is left out of the
batch and listed in ``WriteBatch.rejected_series``; the valid series beside it are kept, so
a caller stores them and answers 400 naming the invalid ones, as Mimir does (Prometheus drops
a batch answered 400: refusing all of it lost the good series at the sender). A request
that is not a well-formed message at all is refused whole. Native histograms are checked one
by one: an invalid one, or one over the bucket limit, is left out of its series and listed
in ``WriteBatch.rejected_histograms``; the rest is kept.

Label and metric names are any non-empty UTF-8 text, as Prometheus 3 accepts them
(``http.server.request.duration``, ``k8s.pod.name``); protobuf has checked the UTF-8.
"""

import math
import struct
import sys
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from itertools import compress, islice
from operator import attrgetter, itemgetter, not_
from typing import NamedTuple

import numpy as np
from google.protobuf.message import DecodeError

from . import remote_pb2, types_pb2, write_v2_pb2
from .errors import ProtocolError, RemoteWriteError
from .snappy import compress_block, decompress_block

PROTOBUF_MEDIA_TYPE = "application/x-protobuf"
V1_MESSAGE = "prometheus.WriteRequest"
V2_MESSAGE = "io.prometheus.write.v2.Request"
V1_CONTENT_TYPE = PROTOBUF_MEDIA_TYPE
V2_CONTENT_TYPE = f"{PROTOBUF_MEDIA_TYPE};proto={V2_MESSAGE}"

SAMPLES_WRITTEN_HEADER = "X-Prometheus-Remote-Write-Samples-Written"
HISTOGRAMS_WRITTEN_HEADER = "X-Prometheus-Remote-Write-Histograms-Written"
EXEMPLARS_WRITTEN_HEADER = "X-Prometheus-Remote-Write-Exemplars-Written"

METRIC_NAME_LABEL = "__name__"
# Prometheus's bound on an exemplar's label set: names and values together, in characters.
MAX_EXEMPLAR_LABELS_LENGTH = 128
# Native histogram schemas Prometheus accepts: exponential -4..8, and -53 (custom bucket bounds, NHCB).
MIN_EXPONENTIAL_SCHEMA, MAX_EXPONENTIAL_SCHEMA = -4, 8
CUSTOM_BUCKETS_SCHEMA = -53
# Bucket indexes are int32 in Prometheus (spans' offsets add up to them), bucket counts int64.
MIN_BUCKET_INDEX, MAX_BUCKET_INDEX = -(2**31), 2**31 - 1
MAX_BUCKET_COUNT = 2**63 - 1

_V1_TYPE_NAMES = {value.number: value.name.lower() for value in types_pb2.MetricMetadata.MetricType.DESCRIPTOR.values}
_V2_TYPE_NAMES = {
    value.number: value.name.removeprefix("METRIC_TYPE_").lower()
    for value in write_v2_pb2.Metadata.MetricType.DESCRIPTOR.values
    if value.number != 0
}
_V2_TYPE_NUMBERS = {name: number for number, name in _V2_TYPE_NAMES.items()}


class Exemplar(NamedTuple):
    """An exemplar of a series: its own labels (a trace id, say), a value and a timestamp (ms).
    A NamedTuple: a frozen dataclass took a third of decoding an exemplar."""

    labels: dict[str, str]
    value: float
    timestamp: int


@dataclass(frozen=True)
class WriteHistogram:
    """A native histogram sample: its timestamp (ms) and the bytes of its prometheus.Histogram
    message (types.proto, as protobuf serialises it), which tsgate stores and returns as is."""

    timestamp: int
    data: bytes


class RejectedHistogram(NamedTuple):
    """A native histogram left out of the batch: which series (its index in the request),
    its timestamp, a reason for counting (``invalid_histogram``, ``too_many_buckets``) and
    what is wrong with it."""

    series: int
    timestamp: int
    reason: str
    problem: str


class RejectedSeries(NamedTuple):
    """A series left out of the batch: its index in the request and what is wrong with it."""

    series: int
    problem: str

    def __str__(self) -> str:
        return f"series {self.series}: {self.problem}"


class InvalidSeries(RemoteWriteError):
    """A series that cannot be stored (400): the decoder leaves it out (RejectedSeries)."""

    def __init__(self, index: int, problem: str):
        super().__init__(400, f"series {index}: {problem}")
        self.rejected = RejectedSeries(index, problem)


class InvalidHistogram(ValueError):
    def __init__(self, problem: str, reason: str = "invalid_histogram"):
        super().__init__(problem)
        self.reason = reason


@dataclass
class WriteSeries:
    """One time series; `labels` includes `__name__`, samples are (timestamp_ms, value)."""

    labels: dict[str, str]
    samples: list[tuple[int, float]] = field(default_factory=list)
    metric_type: str | None = None  # v2 only: "counter", "gauge", ...
    help: str = ""  # v2 only
    unit: str = ""  # v2 only
    exemplars: list[Exemplar] = field(default_factory=list)
    histograms: list[WriteHistogram] = field(default_factory=list)
    created_timestamp: int = 0  # v2 only: when the series (a counter, say) started, 0 when unknown


# A series' labels in SampleArrays: a dict, or the bytes of a 1.0 label set or the names and
# values of a 2.0 one validated before (series_labels).
LabelsEntry = dict[str, str] | bytes | tuple[str, ...]


class SampleArrays(NamedTuple):
    """Samples of a request as arrays, the shape ingest works on without an object a sample: a
    table of series (``keys[i]``, the label set as the request carried it, the same bytes or
    tuple whenever the same series comes again; ``labels[i]``, its labels with ``__name__``,
    which series_labels() reads: a dict, or the bytes of a 1.0 label set or the names and values
    of a 2.0 one read before, decoded only when needed) and, a sample each, the index of its series in the table, its timestamp
    (ms) and value."""

    keys: list
    labels: list[LabelsEntry]
    series: np.ndarray  # intp
    timestamps: np.ndarray  # int64
    values: np.ndarray  # float64

    def __len__(self) -> int:
        return len(self.timestamps)


def series_key(labels: dict[str, str]) -> tuple[str, ...]:
    """The key in SampleArrays of a series the protobuf decoder read: its label names, then values."""
    return (*labels.keys(), *labels.values())


def label_bytes(labels: dict[str, str]) -> bytes:
    """A label set as remote write 1.0 carries it (the labels of a TimeSeries, in the dict's
    order): the key in SampleArrays of a series the OTLP translator made, as a 1.0 request of
    sorted labels has it. Bytes hash once, where a tuple's hash is computed at every lookup
    (0.3-0.6 us a series in the known-series cache, bench.otlp)."""
    return types_pb2.TimeSeries(
        labels=[types_pb2.Label(name=name, value=value) for name, value in labels.items()]
    ).SerializeToString()


def _series_arrays(series: list[WriteSeries]) -> Generator[None, None, SampleArrays]:
    """The samples of decoded series as arrays, yielding between runs of series."""
    keys, counts, timestamps, values = [], [], [], []
    labels: list[LabelsEntry] = []
    for index, item in enumerate(series):
        if not index % SERIES_PER_STEP:
            yield
        keys.append(series_key(item.labels))
        labels.append(item.labels)
        counts.append(len(item.samples))
        for start in range(0, len(item.samples), ITEMS_PER_STEP):
            if start:
                yield
            chunk = item.samples[start : start + ITEMS_PER_STEP]
            timestamps.append(np.fromiter(map(itemgetter(0), chunk), np.int64, len(chunk)))
            values.append(np.fromiter(map(itemgetter(1), chunk), np.float64, len(chunk)))
    return SampleArrays(
        keys,
        labels,
        np.repeat(np.arange(len(keys)), counts),
        np.concatenate([np.empty(0, np.int64), *timestamps]),
        np.concatenate([np.empty(0, np.float64), *values]),
    )


def concat_arrays(parts: list[SampleArrays]) -> SampleArrays:
    """One table and one set of arrays for the samples of several parts, in their order."""
    if len(parts) == 1:
        return parts[0]
    offsets = np.cumsum([0] + [len(part.keys) for part in parts[:-1]])
    return SampleArrays(
        [key for part in parts for key in part.keys],
        [labels for part in parts for labels in part.labels],
        np.concatenate([np.empty(0, np.intp)] + [part.series + offset for part, offset in zip(parts, offsets)]),
        np.concatenate([np.empty(0, np.int64)] + [part.timestamps for part in parts]),
        np.concatenate([np.empty(0, np.float64)] + [part.values for part in parts]),
    )


@dataclass
class WriteMetadata:
    """Metadata of a metric family, as sent in v1 requests."""

    metric_family_name: str
    type: str  # lowercase: "unknown", "counter", "gauge", ...
    help: str = ""
    unit: str = ""


@dataclass
class WriteBatch:
    """Everything tsgate keeps from one remote write request."""

    version: int
    series: list[WriteSeries] = field(default_factory=list)
    metadata: list[WriteMetadata] = field(default_factory=list)
    rejected_histograms: list[RejectedHistogram] = field(default_factory=list)
    rejected_series: list[RejectedSeries] = field(default_factory=list)
    # Decoded with ``arrays=True``: every sample of the request. The series of plain 1.0 parts
    # (known labels and samples, nothing else) are then only there, not in ``series``.
    arrays: SampleArrays | None = None

    @property
    def sample_count(self) -> int:
        if self.arrays is not None:
            return len(self.arrays)
        return sum(len(series.samples) for series in self.series)

    @property
    def histogram_count(self) -> int:
        return sum(len(series.histograms) for series in self.series)


class WriteLimits(NamedTuple):
    """Most samples, exemplars and metadata entries one request may carry; 0: no limit. They
    are counted as the decoder reaches them, each run before it is read, so a request over one is
    refused (RequestTooLarge) having cost about the limit, whatever it holds beyond."""

    samples: int = 0
    exemplars: int = 0
    metadata: int = 0


NO_LIMITS = WriteLimits()


class RequestTooLarge(RemoteWriteError):
    """A request carrying more of ``kind`` (a field of WriteLimits) than its limit: 413."""

    def __init__(self, kind: str, limit: int):
        super().__init__(413, f"the request carries over {limit} {_KIND_WORDS[kind]}, the most one request may carry")
        self.kind = kind


_KIND_WORDS = {"samples": "samples", "exemplars": "exemplars", "metadata": "metadata entries"}


class _Counted:
    """What a request carried so far, against its WriteLimits."""

    def __init__(self, limits: WriteLimits):
        self.limits = limits
        self.seen = {"samples": 0, "exemplars": 0, "metadata": 0}

    def add(self, kind: str, count: int) -> None:
        self.seen[kind] += count
        limit = getattr(self.limits, kind)
        if limit and self.seen[kind] > limit:
            raise RequestTooLarge(kind, limit)


def message_version(content_type: str | None) -> int:
    """Return 1 or 2 for the protobuf message named by a Content-Type; 415 otherwise."""
    if content_type is None or not content_type.strip():
        return 1
    media_type, *parameters = content_type.split(";")
    if media_type.strip().lower() != PROTOBUF_MEDIA_TYPE:
        raise RemoteWriteError(415, f"unsupported content type {content_type!r}")
    proto = V1_MESSAGE
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "proto":
            proto = value.strip().strip('"')
    if proto.lower() == V1_MESSAGE.lower():
        return 1
    if proto.lower() == V2_MESSAGE.lower():
        return 2
    raise RemoteWriteError(415, f"unsupported protobuf message {proto!r}")


def _check_content_encoding(content_encoding: str | None) -> None:
    # Prometheus always compresses; a missing header is read as snappy.
    if content_encoding is None or not content_encoding.strip():
        return
    if content_encoding.strip().lower() != "snappy":
        raise RemoteWriteError(415, f"unsupported content encoding {content_encoding!r}, only snappy")


# Bytes of the message parsed at once: ~3 ms of protobuf parsing on a loaded 2-core box.
PART_BYTES = 256 * 1024
# Decoded series turned into arrays at once (a few ms).
SERIES_PER_STEP = 1000
# Samples, exemplars or metadata entries of one series or part turned into Python objects at once (a few ms).
ITEMS_PER_STEP = 4096
# A series whose samples take more bytes than this is read by _sample_run, in steps.
LONG_SERIES_BYTES = 1 << 16
# Most common-shape samples _sample_run reads with numpy at once (a few ms).
SAMPLES_PER_STEP = 1 << 16

Steps = Generator[None, None, WriteBatch]


def decode_write_request(
    body: bytes,
    content_type: str | None,
    content_encoding: str | None,
    max_decompressed_bytes: int,
    max_histogram_buckets: int = 0,
    arrays: bool = False,
    limits: WriteLimits = NO_LIMITS,
) -> WriteBatch:
    """Decode a remote write body (v1 or v2 by Content-Type) or raise RemoteWriteError.

    A native histogram with more than ``max_histogram_buckets`` buckets (0: no limit) is
    refused, as an invalid one is, before its buckets are read. ``arrays`` and ``limits``: see
    decode_write_request_steps."""
    steps = decode_write_request_steps(
        body, content_type, content_encoding, max_decompressed_bytes, max_histogram_buckets, arrays, limits
    )
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def decode_write_request_steps(
    body: bytes,
    content_type: str | None,
    content_encoding: str | None,
    max_decompressed_bytes: int,
    max_histogram_buckets: int = 0,
    arrays: bool = False,
    limits: WriteLimits = NO_LIMITS,
) -> Steps:
    """decode_write_request as a generator: it yields after each bounded step and returns the
    WriteBatch (or raises RemoteWriteError) when resumed after the last one. With ``arrays``, the
    samples are also arrays (WriteBatch.arrays), and those of plain 1.0 parts are only there.
    A step is bounded whatever the request's shape: one series of millions of samples, or of
    many exemplars, and many metadata entries are read in steps too. A request over ``limits``
    raises RequestTooLarge (413) once the decoder counts past one."""
    version = message_version(content_type)
    _check_content_encoding(content_encoding)
    try:
        raw = decompress_block(body, max_decompressed_bytes)
    except ProtocolError as exc:
        raise RemoteWriteError(exc.status, exc.message) from exc
    plain: list[SampleArrays] | None = [] if arrays else None
    plain_v2 = (yield from _v2_plain(raw, _Counted(limits))) if version == 2 and arrays else None
    counted = _Counted(limits)
    if version == 1:
        batch = yield from _decode_v1(raw, max_histogram_buckets, plain, counted)
    elif plain_v2 is not None:
        batch = WriteBatch(version=2, metadata=plain_v2[1])
        plain = [plain_v2[0]]
    else:
        batch = yield from _decode_v2(raw, max_histogram_buckets, counted)
    if plain is not None:
        batch.arrays = concat_arrays([*plain, (yield from _series_arrays(batch.series))])
    return batch


_SKIPPED_BYTES = {1: 8, 5: 4}  # fixed64, fixed32


def _parts(raw: bytes, part_bytes: int) -> Iterator[bytes]:
    """The message as runs of whole top-level fields of about ``part_bytes`` each: each run is
    a valid message of the same type holding some of the fields (repeated fields concatenate),
    so it parses alone. From a field that is not well formed on, the rest is one run, for the
    protobuf parser to refuse with its own words. A message within ``part_bytes`` is one run."""
    if len(raw) <= part_bytes:
        if raw:
            yield raw
        return
    start = offset = 0
    try:
        while offset < len(raw):
            key, offset = read_varint(raw, offset)
            wire_type = key & 7
            if wire_type == 0:
                offset = read_varint(raw, offset)[1]
            elif wire_type == 2:
                length, offset = read_varint(raw, offset)
                offset += length
            elif wire_type in _SKIPPED_BYTES:
                offset += _SKIPPED_BYTES[wire_type]
            else:
                break
            if offset > len(raw):
                break
            if offset - start >= part_bytes:
                yield raw[start:offset]
                start = offset
    except IndexError:  # a varint cut short
        pass
    if len(raw) > start:
        yield raw[start:]


def _parse(message, raw: bytes):
    try:
        message.ParseFromString(raw)
    except DecodeError as exc:
        name = message.DESCRIPTOR.full_name
        raise RemoteWriteError(400, f"invalid protobuf {name}: {exc}") from exc
    return message


def _validated_labels(index: int, pairs: list[tuple[str, str]]) -> dict[str, str]:
    """Check a series' labels against the spec (names unique and not empty) and return them as
    a dict, or raise InvalidSeries.

    Labels with an empty value are dropped: to Prometheus an empty label
    value is the same as an absent label. Labels out of order are sorted, as
    Prometheus's own receiver does: senders should sort them, but some (the
    remote-write compliance suite among them) send them in map order.
    """
    labels: dict[str, str] = {}
    previous = ""
    for name, value in pairs:
        if not name:
            raise InvalidSeries(index, "empty label name")
        if name <= previous:
            if name == previous:
                raise InvalidSeries(index, f"duplicate label name {name!r}")
            return _validated_labels(index, sorted(pairs))
        previous = name
        if value:
            labels[name] = value
    if METRIC_NAME_LABEL not in labels:
        raise InvalidSeries(index, f"missing or empty {METRIC_NAME_LABEL} label")
    return labels


def _exemplar(index: int, pairs: Iterable[tuple[str, str]], value: float, timestamp: int) -> Exemplar:
    """Check an exemplar's labels (distinct, non-empty names; at most MAX_EXEMPLAR_LABELS_LENGTH
    characters in all, as Prometheus bounds them); empty values are dropped as for series."""
    labels: dict[str, str] = {}
    length = 0
    for name, label_value in pairs:
        if not name:
            raise InvalidSeries(index, "exemplar has an empty label name")
        if name in labels:
            raise InvalidSeries(index, f"exemplar has a duplicate label name {name!r}")
        length += len(name) + len(label_value)
        if label_value:
            labels[name] = label_value
    if length > MAX_EXEMPLAR_LABELS_LENGTH:
        raise InvalidSeries(index, f"exemplar labels are {length} characters long, over {MAX_EXEMPLAR_LABELS_LENGTH}")
    return Exemplar(labels, value, timestamp)


# Label bytes of 1.0 series decoded and validated before: a sender sends the same bytes for a
# series every time, so a known series is one set lookup of its bytes instead of a protobuf
# object, two strings and a check a label (6 of its 8 us, see docs/performance-log.rst), and its
# labels are decoded again only if ingest does not know the series (series_labels). The bytes
# are the objects the ingest's known-series cache keeps as keys, so an entry costs a set slot.
# Emptied when full, so hostile input cannot grow it; as large as that cache by default, so
# that a worker with as many active series keeps them all.
_VALID_LABEL_BYTES: set[bytes] = set()
MAX_VALID_LABEL_BYTES = 1 << 20
_unpack_double = struct.Struct("<d").unpack_from


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The unsigned varint at ``pos`` and the position after it; IndexError past the end."""
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


# The common 1.0 series from Prometheus: labels, then one sample of a nonzero double and a
# timestamp of six varint bytes (every millisecond time from 1971 to 2109): its last 18 bytes.
_ONE_SAMPLE_BYTES = 18
_DOUBLE_BYTES = np.arange(8)
_TIMESTAMP_BYTES = np.arange(9, 15)
_TIMESTAMP_SHIFTS = np.arange(0, 42, 7, dtype=np.int64)


def _decode_v1_plain(raw: bytes, counted: _Counted, first_index: int = 0) -> Generator[None, None, SampleArrays | None]:
    """The common 1.0 request, read straight from its bytes into arrays: series of labels then
    samples and nothing else. None for anything else (metadata, exemplars, histograms, unknown or
    out-of-order fields, a malformed message), which the protobuf decoder then takes (and
    refuses with its own error); a series' labels are decoded by protobuf too, the first time
    their bytes are seen (_VALID_LABEL_BYTES). A series of known labels and the one sample Prometheus
    sends a series is one dict lookup of its label bytes here; its sample's double and timestamp
    are read for all such series at once, with numpy; a long series is read in steps
    (_sample_run). ``first_index``: the index of its first series in the request (raw may be a
    part of it), for the errors."""
    keys: list[bytes] = []
    labels_of: list[LabelsEntry] = []
    counts: list[int] = []
    one_sample_at: list[int] = []  # where the double of each common series' sample starts
    others: list[tuple[int, int, float]] = []  # (sample number, timestamp, value) of the other samples
    runs: list[SampleRun] = []
    valid = _VALID_LABEL_BYTES
    samples = pos = 0
    size = len(raw)
    try:
        while pos < size:
            if raw[pos] != 0x0A:  # field 1, timeseries
                return None
            end = raw[pos + 1]
            if end < 0x80:
                pos += 2
            else:
                end, pos = read_varint(raw, pos + 1)
            end += pos
            if end > size:
                return None
            tail = end - _ONE_SAMPLE_BYTES
            if tail >= pos and raw[tail] == 0x12 and raw[tail + 1] == 0x10 and raw[tail + 2] == 0x09:
                key = raw[pos:tail]
                if key in valid and raw[end - 7] == 0x10:
                    keys.append(key)
                    labels_of.append(key)
                    counts.append(1)
                    one_sample_at.append(tail + 3)
                    samples += 1
                    pos = end
                    continue
            start = pos
            while pos < end and raw[pos] == 0x0A:  # field 1, labels
                length, pos = read_varint(raw, pos + 1)
                pos += length
            if pos > end:
                return None
            key = raw[start:pos]
            labels: dict[str, str] | bytes = key
            if key not in valid:
                first_seen = _first_seen_labels(first_index + len(keys), key)
                if first_seen is None:
                    return None
                labels = first_seen
            count = 0
            if end - pos > LONG_SERIES_BYTES:
                run = yield from _sample_run(raw, pos, end, samples, counted)
                if run is None or run.end != end:
                    return None
                runs.append(run)
                samples += len(run.timestamps)
                count, pos = len(run.timestamps), end
            while pos < end:
                if raw[pos] != 0x12:  # field 2, samples; anything else: the general decoder
                    return None
                stop = raw[pos + 1] + pos + 2
                if raw[pos + 1] >= 0x80 or stop > end:
                    return None
                sample = _plain_sample(raw, pos + 2, stop)
                if sample is None:
                    return None
                others.append((samples, *sample))
                samples += 1
                count += 1
                pos = stop
            keys.append(key)
            labels_of.append(labels)
            counts.append(count)
    except IndexError:
        return None
    counted.add("samples", samples - sum(len(run.timestamps) for run in runs))
    sampled = _sample_arrays(raw, samples, one_sample_at, others, runs)
    if sampled is None:
        return None
    return SampleArrays(keys, labels_of, np.repeat(np.arange(len(keys)), counts), *sampled)


class SampleRun(NamedTuple):
    """The samples of a long series read by _sample_run: the number of its first sample in its
    part of the request, their timestamps and values, and the position after them."""

    first: int
    timestamps: np.ndarray
    values: np.ndarray
    end: int


# The bytes of a common-shape sample that are fixed (field 2 of 16 bytes: a double, field 1, then
# a varint, field 2), by their offset.
_COMMON_OFFSETS = np.array([0, 1, 2, 11])
_COMMON_BYTES = np.array([0x12, 0x10, 0x09, 0x10], dtype=np.uint8)
_FIRST_WINDOW = 64


def _sample_run(
    raw: bytes, pos: int, end: int, first: int, counted: _Counted
) -> Generator[None, None, SampleRun | None]:
    """The samples from ``pos`` up to ``end`` or the first field that is not a sample, yielding
    between steps of bounded work, so that a series of millions of samples holds nobody up;
    None for a sample _plain_sample does not read. Runs of the common shape (a double and a
    six-byte timestamp, _ONE_SAMPLE_BYTES) are checked and read with numpy, in a window that
    doubles while they last (up to SAMPLES_PER_STEP); other samples one by one, ITEMS_PER_STEP
    at a time. Each step's samples are counted against the request's limit before they are read."""
    data = np.frombuffer(raw, dtype=np.uint8)
    timestamps: list[np.ndarray] = []
    values: list[np.ndarray] = []
    window = _FIRST_WINDOW
    while pos < end and raw[pos] == 0x12:
        fits = min(window, (end - pos) // _ONE_SAMPLE_BYTES)
        matched = 0
        if fits:
            at = pos + _ONE_SAMPLE_BYTES * np.arange(fits)
            varints = data[(at + 3)[:, None] + _TIMESTAMP_BYTES]
            ok = (
                (data[at[:, None] + _COMMON_OFFSETS] == _COMMON_BYTES).all(axis=1)
                & (varints[:, :5] >= 0x80).all(axis=1)
                & (varints[:, 5] < 0x80)
            )
            matched = fits if ok.all() else int(np.argmin(ok))
        if matched:
            counted.add("samples", matched)
            timestamps.append(((varints[:matched] & 0x7F).astype(np.int64) << _TIMESTAMP_SHIFTS).sum(axis=1))
            values.append(data[(at[:matched] + 3)[:, None] + _DOUBLE_BYTES].view("<f8")[:, 0])
            pos += matched * _ONE_SAMPLE_BYTES
            window = min(2 * window, SAMPLES_PER_STEP) if matched == fits else _FIRST_WINDOW
        else:
            read: list[tuple[int, float]] = []
            while pos < end and raw[pos] == 0x12 and len(read) < ITEMS_PER_STEP:
                stop = raw[pos + 1] + pos + 2
                sample = _plain_sample(raw, pos + 2, stop) if raw[pos + 1] < 0x80 and stop <= end else None
                if sample is None:
                    return None
                read.append(sample)
                pos = stop
            counted.add("samples", len(read))
            timestamps.append(np.fromiter(map(itemgetter(0), read), np.int64, len(read)))
            values.append(np.fromiter(map(itemgetter(1), read), np.float64, len(read)))
        yield
    return SampleRun(
        first,
        np.concatenate([np.empty(0, np.int64), *timestamps]),
        np.concatenate([np.empty(0, np.float64), *values]),
        pos,
    )


def _v2_plain(raw: bytes, counted: _Counted) -> Generator[None, None, tuple[SampleArrays, list[WriteMetadata]] | None]:
    """The common 2.0 request, read straight from its bytes into arrays: the symbols, then series
    of labels refs, samples and metadata, and nothing else (no histograms, exemplars, created or
    start timestamps, series without samples). None for anything else, which the protobuf
    decoder then takes (and refuses with its own error where it is wrong). The refs of every
    series are decoded at once with numpy, run by run (_v2_plain_run), and a label set
    seen before is one lookup of its strings (_V2_VALID_LABEL_SETS). The metadata of the series come
    back as one MetricMetadata a metric and kind of metadata."""
    symbols: list[str] = []
    pos, size = 0, len(raw)
    try:
        while pos < size and raw[pos] == 0x22:  # field 4, symbols
            length, pos = read_varint(raw, pos + 1)
            symbols.append(raw[pos : pos + length].decode())
            pos += length
            if not len(symbols) % V2_PLAIN_SERIES:
                yield
        if pos > size or not symbols or symbols[0]:
            return None
        runs: list[SampleArrays] = []
        metadata: dict[tuple[str, bytes], None] = {}
        while pos < size:
            first_index = sum(len(done.keys) for done in runs)
            run = yield from _v2_plain_run(raw, pos, symbols, first_index, metadata, counted)
            if run is None:
                return None
            arrays, pos = run
            runs.append(arrays)
            yield
    except (IndexError, UnicodeDecodeError):
        return None
    rows = [_v2_metadata(symbols, name, data) for name, data in metadata]
    if None in rows:
        return None
    return concat_arrays(runs), [row for row in rows if row is not None and row.type]


def _v2_plain_run(
    raw: bytes,
    pos: int,
    symbols: list[str],
    first_index: int,
    metadata: dict[tuple[str, bytes], None],
    counted: _Counted,
) -> Generator[None, None, tuple[SampleArrays, int] | None]:
    """Up to V2_PLAIN_SERIES series from ``pos``, fewer when their refs pass V2_PLAIN_REF_BYTES:
    their arrays and the position after them. A long series' samples are read in steps (_sample_run)."""
    ref_starts: list[int] = []
    ref_stops: list[int] = []
    metadata_of: list[bytes] = []
    counts: list[int] = []
    one_sample_at: list[int] = []
    others: list[tuple[int, int, float]] = []
    runs: list[SampleRun] = []
    samples, size = 0, len(raw)
    ref_bytes = 0
    while pos < size and len(counts) < V2_PLAIN_SERIES and ref_bytes < V2_PLAIN_REF_BYTES:
        if raw[pos] != 0x2A:  # field 5, timeseries
            return None
        end, pos = read_varint(raw, pos + 1)
        end += pos
        if end > size or raw[pos] != 0x0A:  # field 1, labels_refs
            return None
        length, pos = read_varint(raw, pos + 1)
        ref_starts.append(pos)
        pos += length
        ref_stops.append(pos)
        ref_bytes += length
        count = 0
        if end - pos > LONG_SERIES_BYTES:
            run = yield from _sample_run(raw, pos, end, samples, counted)
            if run is None:
                return None
            runs.append(run)
            samples += len(run.timestamps)
            count, pos = len(run.timestamps), run.end
        while pos < end and raw[pos] == 0x12:  # field 2, samples
            if pos + 18 <= end and raw[pos + 1] == 0x10 and raw[pos + 2] == 0x09 and raw[pos + 11] == 0x10:
                one_sample_at.append(pos + 3)
                pos += 18
            else:
                stop = raw[pos + 1] + pos + 2
                sample = _plain_sample(raw, pos + 2, stop) if raw[pos + 1] < 0x80 and stop <= end else None
                if sample is None:
                    return None
                others.append((samples, *sample))
                pos = stop
            samples += 1
            count += 1
        data = b""
        if pos < end and raw[pos] == 0x2A:  # field 5, metadata
            stop = raw[pos + 1] + pos + 2
            if raw[pos + 1] >= 0x80 or stop > end:
                return None
            data = raw[pos + 2 : stop]
            pos = stop
        if pos != end or not count or not length:
            return None
        metadata_of.append(data)
        counts.append(count)
    counted.add("samples", samples - sum(len(run.timestamps) for run in runs))
    sampled = _sample_arrays(raw, samples, one_sample_at, others, runs)
    refs = _packed_varints(raw, ref_starts, ref_stops)
    if sampled is None or refs is None:
        return None
    values, per_series = refs
    if (per_series % 2).any() or (values >= len(symbols)).any():
        return None
    yield
    strings = itemgetter(*values.tolist())(symbols)
    bounds = np.cumsum(per_series).tolist()
    keys = [strings[start:stop] for start, stop in zip([0, *bounds], bounds)]
    labels_of: list[dict[str, str] | tuple[str, ...]] = list(keys)
    known = list(map(_V2_VALID_LABEL_SETS.__contains__, keys))
    for count, index in enumerate(compress(range(len(keys)), map(not_, known)), 1):
        try:
            labels_of[index] = _v2_new_labels(first_index + index, keys[index])
        except InvalidSeries:
            return None  # the protobuf decoder leaves it out
        if not count % V2_SERIES_PER_STEP:
            yield
    for labels, data in compress(zip(labels_of, metadata_of), metadata_of):
        metadata[(_v2_metric_name(labels), data)] = None
    timestamps, sample_values = sampled
    series = np.repeat(np.arange(len(keys)), counts)
    return SampleArrays(keys, [*labels_of], series, timestamps, sample_values), pos


def _packed_varints(raw: bytes, starts: list[int], stops: list[int]) -> tuple[np.ndarray, np.ndarray] | None:
    """The varints packed in raw[starts[i]:stops[i]] (each run non-empty, of whole varints of at
    most 5 bytes, as uint32 ones are) in one array, and how many each run holds; None if a run
    is not that."""
    lengths = np.array(stops, dtype=np.intp) - np.array(starts, dtype=np.intp)
    ends_at = np.cumsum(lengths)
    where = np.repeat(np.array(starts, dtype=np.intp) - (ends_at - lengths), lengths) + np.arange(ends_at[-1])
    data = np.frombuffer(raw, dtype=np.uint8)[where]
    last = data < 0x80
    if not last[ends_at - 1].all():
        return None
    firsts = np.flatnonzero(np.concatenate(([True], last[:-1])))
    number = np.cumsum(last) - last  # the varint each byte belongs to
    place = np.arange(len(data)) - firsts[number]
    if place.max() > 4:
        return None
    parts = (data & 0x7F).astype(np.int64) << (7 * place)
    values = np.bincount(number, weights=parts.astype(np.float64), minlength=len(firsts)).astype(np.int64)
    return values, np.add.reduceat(last.astype(np.intp), ends_at - lengths)


def _v2_metadata(symbols: list[str], name: str, data: bytes) -> WriteMetadata | None:
    """The metadata of a 2.0 series (a type, help and unit refs, each left out when zero) as a
    row; None for any other shape or a ref out of range. A type of 0 is no metadata."""
    fields = {1: 0, 3: 0, 4: 0}
    pos = 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        if key & 7 or key >> 3 not in fields:
            return None
        fields[key >> 3], pos = read_varint(data, pos)
    kind, help_ref, unit_ref = fields[1], fields[3], fields[4]
    if help_ref >= len(symbols) or unit_ref >= len(symbols):
        return None
    return WriteMetadata(
        name, _V2_TYPE_NAMES.get(kind, "unknown") if kind else "", symbols[help_ref], symbols[unit_ref]
    )


def _sample_arrays(
    raw: bytes,
    samples: int,
    one_sample_at: list[int],
    others: list[tuple[int, int, float]],
    runs: list[SampleRun],
) -> tuple[np.ndarray, np.ndarray] | None:
    """The timestamps and values of ``samples`` samples: the common ones (a double then a six-byte
    timestamp varint, the double at each of ``one_sample_at``) read at once, in order, around
    the ``others`` (sample number, timestamp, value) and the ``runs`` already read; None if a
    common one's varint is not one."""
    timestamps = np.empty(samples, dtype=np.int64)
    values = np.empty(samples, dtype=np.float64)
    common = np.ones(samples, dtype=bool)
    if others:
        numbers, other_timestamps, other_values = zip(*others)
        common[list(numbers)] = False
        timestamps[~common] = other_timestamps
        values[~common] = other_values
    for run in runs:
        stop = run.first + len(run.timestamps)
        common[run.first : stop] = False
        timestamps[run.first : stop] = run.timestamps
        values[run.first : stop] = run.values
    if one_sample_at:
        at = np.array(one_sample_at, dtype=np.intp)[:, None]
        data = np.frombuffer(raw, dtype=np.uint8)
        varints = data[at + _TIMESTAMP_BYTES]
        if not (varints[:, :5] >= 0x80).all() or not (varints[:, 5] < 0x80).all():
            return None
        timestamps[common] = ((varints & 0x7F).astype(np.int64) << _TIMESTAMP_SHIFTS).sum(axis=1)
        values[common] = data[at + _DOUBLE_BYTES].view("<f8")[:, 0]
    return timestamps, values


def _plain_series(arrays: SampleArrays) -> list[WriteSeries]:
    """The series of plain arrays, as the protobuf decoder gives them."""
    points = list(zip(arrays.timestamps.tolist(), arrays.values.tolist()))
    series, start = [], 0
    for labels, count in zip(arrays.labels, np.bincount(arrays.series, minlength=len(arrays.keys)).tolist()):
        series.append(WriteSeries(series_labels(labels), points[start : start + count]))
        start += count
    return series


def _first_seen_labels(index: int, key: bytes) -> dict[str, str] | None:
    """Labels of bytes not seen before, decoded by protobuf, validated and remembered; None if the
    bytes are not labels protobuf reads or not valid ones (the general decoder then reports it)."""
    try:
        series = types_pb2.TimeSeries.FromString(key)
        labels = _validated_labels(index, [(sys.intern(label.name), label.value) for label in series.labels])
    except (DecodeError, InvalidSeries):
        return None
    if len(_VALID_LABEL_BYTES) >= MAX_VALID_LABEL_BYTES:
        _VALID_LABEL_BYTES.clear()
    _VALID_LABEL_BYTES.add(key)
    return labels


def series_labels(entry: LabelsEntry) -> dict[str, str]:
    """The labels of a series of SampleArrays (an entry of its ``labels``): the bytes of a 1.0
    label set read before are decoded again, the names and values of a 2.0 one paired again
    (they were valid then, and are the same)."""
    if isinstance(entry, dict):
        return entry
    if isinstance(entry, tuple):
        return _validated_labels(0, list(zip(entry[::2], entry[1::2])))
    labels = types_pb2.TimeSeries.FromString(entry).labels
    return _validated_labels(0, [(sys.intern(label.name), label.value) for label in labels])


def _plain_sample(raw: bytes, pos: int, stop: int) -> tuple[int, float] | None:
    """(timestamp, value) of the Sample message in raw[pos:stop]: a double (field 1) then an
    int64 varint (field 2), either left out when zero as encoders do; None for any other shape."""
    value, timestamp = 0.0, 0
    if pos + 9 <= stop and raw[pos] == 0x09:
        value = _unpack_double(raw, pos + 1)[0]
        pos += 9
    if pos < stop and raw[pos] == 0x10:
        timestamp, pos = read_varint(raw, pos + 1)
        if pos != stop or timestamp >= 1 << 64:
            return None
        if timestamp >= 1 << 63:  # int64 in two's complement
            timestamp -= 1 << 64
    return (timestamp, value) if pos == stop else None


def _decode_v1(raw: bytes, max_histogram_buckets: int, plain: list[SampleArrays] | None, counted: _Counted) -> Steps:
    """With ``plain``, the plain parts are left there as arrays instead of becoming series."""
    batch = WriteBatch(version=1)
    for part in _parts(raw, PART_BYTES):
        yield
        first_index = len(batch.series) + len(batch.rejected_series) + sum(len(done.keys) for done in plain or ())
        before = counted.seen["samples"]
        arrays = yield from _decode_v1_plain(part, counted, first_index)
        if arrays is not None:
            if plain is None:
                batch.series.extend(_plain_series(arrays))
            else:
                plain.append(arrays)
            continue
        counted.seen["samples"] = before  # counted again by the general decoder
        request = _parse(remote_pb2.WriteRequest(), part)
        yield from _decode_v1_series(batch, first_index, request.timeseries, max_histogram_buckets, counted)
        batch.metadata += yield from _stepped(request.metadata, _v1_metadata, counted, "metadata")
    return batch


_sample_pair = attrgetter("timestamp", "value")


def _stepped(items, convert, counted: _Counted, kind: str) -> Generator[None, None, list]:
    """``[convert(item) for item in items]``, counted against the request's limit of ``kind``
    before any is converted, ITEMS_PER_STEP items at a time, yielding after each run (slices of
    a protobuf repeated field cost their start: it is iterated instead)."""
    counted.add(kind, len(items))
    done: list = []
    remaining = iter(items)
    while run := list(islice(remaining, ITEMS_PER_STEP)):
        done += map(convert, run)
        yield
    return done


def _decode_v1_series(
    batch: WriteBatch, first_index: int, timeseries, max_histogram_buckets: int, counted: _Counted
) -> Generator[None, None, None]:
    """The series of a part into ``batch``, an invalid one into its ``rejected_series``."""
    for index, ts in enumerate(timeseries, first_index):
        try:
            labels = _validated_labels(index, [(label.name, label.value) for label in ts.labels])
            samples = yield from _stepped(ts.samples, _sample_pair, counted, "samples")
            # Tested first: iterating an empty repeated field costs more than testing it (~0.5 µs a series).
            exemplars = (
                (yield from _stepped(ts.exemplars, partial(_v1_exemplar, index), counted, "exemplars"))
                if ts.exemplars
                else []
            )
        except InvalidSeries as invalid:
            batch.rejected_series.append(invalid.rejected)
            continue
        histograms = (
            (yield from _histograms(batch, index, ts.histograms, max_histogram_buckets)) if ts.histograms else []
        )
        batch.series.append(WriteSeries(labels=labels, samples=samples, exemplars=exemplars, histograms=histograms))
        yield


def _v1_exemplar(index: int, e) -> Exemplar:
    return _exemplar(index, ((label.name, label.value) for label in e.labels), e.value, e.timestamp)


def _v1_metadata(metadata) -> WriteMetadata:
    return WriteMetadata(
        metric_family_name=metadata.metric_family_name,
        type=_V1_TYPE_NAMES.get(metadata.type, "unknown"),
        help=metadata.help,
        unit=metadata.unit,
    )


def _symbol(symbols: list[str], ref: int, index: int, what: str) -> str:
    if ref >= len(symbols):
        raise InvalidSeries(index, f"{what} {ref} out of range (symbols table has {len(symbols)} entries)")
    return symbols[ref]


def _decode_v2(raw: bytes, max_histogram_buckets: int, counted: _Counted) -> Steps:
    """Every part is parsed first: a series may refer to any symbol, wherever it comes."""
    symbols: list[str] = []
    timeseries = []
    for part in _parts(raw, PART_BYTES):
        yield
        request = _parse(write_v2_pb2.Request(), part)
        symbols.extend(request.symbols)
        if request.timeseries:
            timeseries.append(request.timeseries)
    if symbols and symbols[0] != "":
        raise RemoteWriteError(400, "symbols[0] must be the empty string")
    batch = WriteBatch(version=2)
    for part_series in timeseries:
        yield from _decode_v2_series(batch, symbols, part_series, max_histogram_buckets, counted)
    return batch


def _decode_v2_series(
    batch: WriteBatch, symbols: list[str], timeseries, max_histogram_buckets: int, counted: _Counted
) -> Generator[None, None, None]:
    """The series of a part into ``batch``, an invalid one into its ``rejected_series``."""
    for index, ts in enumerate(timeseries, len(batch.series) + len(batch.rejected_series)):
        if not index % V2_SERIES_PER_STEP:
            yield
        samples, histograms, metadata = ts.samples, ts.histograms, ts.metadata
        try:
            labels = _v2_labels(symbols, index, ts.labels_refs)
            if not samples and not histograms:
                raise InvalidSeries(index, "no samples and no histograms")
            help_text = _symbol(symbols, metadata.help_ref, index, "help_ref")
            unit = _symbol(symbols, metadata.unit_ref, index, "unit_ref")
            exemplars = (
                (yield from _stepped(ts.exemplars, partial(_v2_exemplar, symbols, index), counted, "exemplars"))
                if ts.exemplars
                else []
            )
        except InvalidSeries as invalid:
            batch.rejected_series.append(invalid.rejected)
            continue
        created = ts.created_timestamp or max(
            (*map(_start_timestamp, samples), *map(_start_timestamp, histograms)), default=0
        )
        batch.series.append(
            WriteSeries(
                labels=labels,
                samples=(yield from _stepped(samples, _sample_pair, counted, "samples")),
                exemplars=exemplars,
                histograms=(yield from _histograms(batch, index, histograms, max_histogram_buckets))
                if histograms
                else [],
                metric_type=_V2_TYPE_NAMES.get(metadata.type, "unknown") if metadata.type else None,
                help=help_text,
                unit=unit,
                created_timestamp=created,
            )
        )


# Series decoded between two yields of the 2.0 decoder: about a millisecond.
V2_SERIES_PER_STEP = 64
# Series of a run of the plain 2.0 reader, whose refs numpy decodes at once, and the bytes of
# refs that end a run sooner (series of many labels): a few ms of work either way.
V2_PLAIN_SERIES = 2048
V2_PLAIN_REF_BYTES = 64 * 1024
_start_timestamp = attrgetter("start_timestamp")
# Label sets of 2.0 series validated before, by their names and values in a flat tuple (the
# refs differ between requests, the strings do not): a known label set is one set lookup
# instead of a check a label. The tuples are the objects the ingest's known-series cache keeps
# as keys, so an entry costs a set slot, and it holds as many as _VALID_LABEL_BYTES (a dict of
# labels an entry, 65536 at most, was emptied in turn by a worker with more active series, whose
# every series then paid the checks again). Emptied when full, as _VALID_LABEL_BYTES.
_V2_VALID_LABEL_SETS: set[tuple[str, ...]] = set()


def _v2_labels(symbols: list[str], index: int, refs) -> dict[str, str]:
    """The labels of a 2.0 series from its refs into the symbols table, checked as _validated_labels does."""
    if len(refs) % 2:
        raise InvalidSeries(index, f"odd number of labels_refs ({len(refs)})")
    try:
        key = itemgetter(*refs)(symbols) if refs else ()
    except IndexError:
        key = None  # a ref out of range: _symbol says which
    if key is None:
        key = tuple(
            _symbol(symbols, ref, index, "label value ref" if i % 2 else "label name ref") for i, ref in enumerate(refs)
        )
    return _v2_new_labels(index, key)


def _v2_new_labels(index: int, key: tuple[str, ...]) -> dict[str, str]:
    """The labels of a 2.0 series not seen before, by its names and values in turn, validated
    and remembered."""
    labels = _validated_labels(index, list(zip(key[::2], key[1::2])))
    if len(_V2_VALID_LABEL_SETS) >= MAX_VALID_LABEL_BYTES:
        _V2_VALID_LABEL_SETS.clear()
    _V2_VALID_LABEL_SETS.add(key)
    return labels


def _v2_metric_name(labels: dict[str, str] | tuple[str, ...]) -> str:
    """The metric name of a 2.0 series of SampleArrays: a label set validated before holds one
    ``__name__`` label, with a value."""
    if isinstance(labels, dict):
        return labels[METRIC_NAME_LABEL]
    return labels[2 * labels[::2].index(METRIC_NAME_LABEL) + 1]


def _v2_exemplar(symbols: list[str], index: int, exemplar) -> Exemplar:
    refs = exemplar.labels_refs
    if len(refs) % 2:
        raise InvalidSeries(index, f"odd number of exemplar labels_refs ({len(refs)})")
    pairs = [
        (
            _symbol(symbols, refs[i], index, "exemplar label name ref"),
            _symbol(symbols, refs[i + 1], index, "exemplar label value ref"),
        )
        for i in range(0, len(refs), 2)
    ]
    return _exemplar(index, pairs, exemplar.value, exemplar.timestamp)


def _v1_histogram(histogram) -> types_pb2.Histogram:
    """The types.proto form of a v2 Histogram (a 1.0 one as it is): fields 1 to 16 have the same
    numbers and types; the created timestamp (17) has no place there (the series keeps it,
    Series.created_timestamp)."""
    if isinstance(histogram, types_pb2.Histogram):
        return histogram
    message = types_pb2.Histogram.FromString(histogram.SerializeToString())
    message.DiscardUnknownFields()
    return message


def _histograms(
    batch: WriteBatch, index: int, messages, max_buckets: int
) -> Generator[None, None, list[WriteHistogram]]:
    """The valid histograms of series ``index`` (1.0 or 2.0 messages) as their bytes; the
    others go to ``batch.rejected_histograms``. Yields every ITEMS_PER_STEP histograms."""
    kept = []
    for number, message in enumerate(messages, 1):
        if not number % ITEMS_PER_STEP:
            yield
        try:
            _check_bucket_limit(message, max_buckets)  # before anything reads the buckets
            message = _v1_histogram(message)
            _check_histogram(message)
        except InvalidHistogram as exc:
            problem = f"series {index}: invalid native histogram at {message.timestamp}: {exc}"
            batch.rejected_histograms.append(RejectedHistogram(index, message.timestamp, exc.reason, problem))
            continue
        message.DiscardUnknownFields()
        kept.append(WriteHistogram(message.timestamp, message.SerializeToString()))
    return kept


def _check_bucket_limit(h, max_buckets: int) -> None:
    """Prometheus's native_histogram_bucket_limit counts positive and negative buckets; a scrape
    over it gets a lower resolution, a remote write (whose sender chose the layout) is refused.
    Spans and custom bounds are bounded by it too: each span holds buckets, but for the one
    empty marker span, and each custom bound (8 bytes stored with every sample) starts one."""
    if not max_buckets:
        return
    # every bucket field, the one the histogram's kind ignores too: its bytes are stored
    buckets = len(h.positive_deltas) + len(h.positive_counts) + len(h.negative_deltas) + len(h.negative_counts)
    if buckets > max_buckets:
        raise InvalidHistogram(f"{buckets} buckets, over the limit of {max_buckets}", "too_many_buckets")
    spans = len(h.positive_spans) + len(h.negative_spans)
    if spans > max(max_buckets, 1):
        raise InvalidHistogram(f"{spans} spans, over the limit of {max_buckets}", "too_many_buckets")
    if len(h.custom_values) > max_buckets:
        raise InvalidHistogram(
            f"{len(h.custom_values)} custom bounds, over the limit of {max_buckets}", "too_many_buckets"
        )


def _check_histogram(h: types_pb2.Histogram) -> None:
    """Prometheus's Histogram.Validate / FloatHistogram.Validate, on the wire form: a known
    schema; spans that match the buckets; no negative count; for integer histograms, the
    buckets and the zero bucket add up to the count (at most the count when the sum is NaN).
    Float histograms skip that last check, as Prometheus does (rounding). Beyond Prometheus's
    checks, which let these through to fail later: a zero threshold that is a number >= 0, bucket
    indexes that fit int32 (Prometheus's type for them), integer counts that fit int64."""
    is_float = h.WhichOneof("count") == "count_float"
    positive = list(h.positive_counts) if is_float else _absolute_counts(h.positive_deltas)
    negative = list(h.negative_counts) if is_float else _absolute_counts(h.negative_deltas)
    if h.schema == CUSTOM_BUCKETS_SCHEMA:
        _check_custom_bounds(list(h.custom_values), h.positive_spans, len(positive))
        if _zero_count(h) or h.zero_threshold or h.negative_spans or negative:
            raise InvalidHistogram("custom buckets: must have no zero bucket and no negative buckets")
    elif MIN_EXPONENTIAL_SCHEMA <= h.schema <= MAX_EXPONENTIAL_SCHEMA:
        _check_spans("positive", h.positive_spans, len(positive))
        _check_spans("negative", h.negative_spans, len(negative))
        if h.custom_values:
            raise InvalidHistogram("a histogram with an exponential schema must not have custom bounds")
        if not h.zero_threshold >= 0:
            raise InvalidHistogram(f"the zero threshold must be a number >= 0, not {h.zero_threshold}")
    else:
        raise InvalidHistogram(
            f"schema {h.schema} is not an exponential schema ({MIN_EXPONENTIAL_SCHEMA}..{MAX_EXPONENTIAL_SCHEMA}) or {CUSTOM_BUCKETS_SCHEMA}"
        )
    for side, counts in (("positive", positive), ("negative", negative)):
        for number, count in enumerate(counts, 1):
            if count < 0:
                raise InvalidHistogram(f"{side} bucket {number} has a count of {count}")
            if not is_float and count > MAX_BUCKET_COUNT:
                raise InvalidHistogram(f"{side} bucket {number} has a count of {count}, over 2^63-1")
    if is_float:
        for what, value in (("observation count", h.count_float), ("zero bucket count", _zero_count(h))):
            if value < 0:
                raise InvalidHistogram(f"the {what} is {value}")
        return
    in_buckets = sum(positive) + sum(negative) + h.zero_count_int
    if in_buckets > h.count_int or (in_buckets != h.count_int and not math.isnan(h.sum)):
        raise InvalidHistogram(f"{in_buckets} observations found in buckets, but the count is {h.count_int}")


def _zero_count(h: types_pb2.Histogram) -> float:
    return h.zero_count_float if h.WhichOneof("zero_count") == "zero_count_float" else h.zero_count_int


def _absolute_counts(deltas) -> list[int]:
    """Bucket counts from the deltas integer histograms carry (each to the previous bucket)."""
    counts, current = [], 0
    for delta in deltas:
        current += delta
        counts.append(current)
    return counts


def _check_spans(side: str, spans, buckets: int) -> None:
    index = 0
    for number, span in enumerate(spans, 1):
        if number > 1 and span.offset < 0:
            raise InvalidHistogram(f"{side} span {number} has a negative offset {span.offset}")
        index += span.offset
        if span.length and not MIN_BUCKET_INDEX <= index <= index + span.length - 1 <= MAX_BUCKET_INDEX:
            raise InvalidHistogram(
                f"{side} span {number} reaches bucket indexes {index}..{index + span.length - 1}, beyond int32"
            )
        index += span.length
    needed = sum(span.length for span in spans)
    if needed != buckets:
        raise InvalidHistogram(f"{side} spans need {needed} buckets, have {buckets}")


def _check_custom_bounds(bounds: list[float], spans, buckets: int) -> None:
    """Custom (NHCB) bounds rise strictly and leave +Inf implicit; the spans, none with a
    negative offset, cover at most one bucket more than there are bounds."""
    for previous, current in zip([-math.inf, *bounds], bounds):
        if not current > previous:
            raise InvalidHistogram(f"custom bounds must increase, {current} follows {previous}")
    if bounds and bounds[-1] == math.inf:
        raise InvalidHistogram("the last custom bound must not be +Inf, it is implicit")
    for number, span in enumerate(spans, 1):
        if span.offset < 0:
            raise InvalidHistogram(f"span {number} has a negative offset {span.offset}")
    _check_spans("positive", spans, buckets)
    covered = sum(span.offset + span.length for span in spans)
    if covered > len(bounds) + 1:
        raise InvalidHistogram(f"{len(bounds)} custom bounds cannot cover spans {covered} buckets long")


def v2_written_headers(
    batch: WriteBatch, samples_written: int | None = None, exemplars_written: int = 0, histograms_written: int = 0
) -> dict[str, str]:
    """Response headers a v2 receiver must send: how many elements were stored.

    Samples default to every sample of the batch (pass `samples_written` after a
    partial failure); exemplars and histograms are those the caller stored.
    """
    if samples_written is None:
        samples_written = batch.sample_count
    return {
        SAMPLES_WRITTEN_HEADER: str(samples_written),
        HISTOGRAMS_WRITTEN_HEADER: str(histograms_written),
        EXEMPLARS_WRITTEN_HEADER: str(exemplars_written),
    }


def encode_write_request_v1(series: Iterable[WriteSeries], metadata: Iterable[WriteMetadata] | None = None) -> bytes:
    """Build a snappy-compressed v1 WriteRequest (labels sorted, empty values left out)."""
    request = remote_pb2.WriteRequest()
    for item in series:
        ts = request.timeseries.add()
        for name in sorted(item.labels):
            if item.labels[name]:
                ts.labels.add(name=name, value=item.labels[name])
        for timestamp, value in item.samples:
            ts.samples.add(timestamp=timestamp, value=value)
        for exemplar in item.exemplars:
            message = ts.exemplars.add(value=exemplar.value, timestamp=exemplar.timestamp)
            for name in sorted(exemplar.labels):
                message.labels.add(name=name, value=exemplar.labels[name])
        for histogram in item.histograms:
            ts.histograms.add().MergeFromString(histogram.data)
    for entry in metadata or ():
        request.metadata.add(
            type=types_pb2.MetricMetadata.MetricType.Value(entry.type.upper()),
            metric_family_name=entry.metric_family_name,
            help=entry.help,
            unit=entry.unit,
        )
    return compress_block(request.SerializeToString())


def encode_write_request_v2(series: Iterable[WriteSeries]) -> bytes:
    """Build a snappy-compressed v2 Request with an interned symbols table."""
    request = write_v2_pb2.Request()
    refs: dict[str, int] = {"": 0}

    def intern(text: str) -> int:
        if text not in refs:
            refs[text] = len(refs)
        return refs[text]

    for item in series:
        ts = request.timeseries.add()
        for name in sorted(item.labels):
            if item.labels[name]:
                ts.labels_refs.extend((intern(name), intern(item.labels[name])))
        for timestamp, value in item.samples:
            ts.samples.add(timestamp=timestamp, value=value)
        for exemplar in item.exemplars:
            message = ts.exemplars.add(value=exemplar.value, timestamp=exemplar.timestamp)
            for name in sorted(exemplar.labels):
                message.labels_refs.extend((intern(name), intern(exemplar.labels[name])))
        for histogram in item.histograms:
            # Fields 1 to 16 of the v2 Histogram are those of types.proto's.
            ts.histograms.add().MergeFromString(histogram.data)
        ts.created_timestamp = item.created_timestamp
        if item.metric_type not in (None, "unknown"):
            if item.metric_type not in _V2_TYPE_NUMBERS:
                raise ValueError(f"unknown metric type {item.metric_type!r}")
            ts.metadata.type = _V2_TYPE_NUMBERS[item.metric_type]
        # Assigning marks the metadata present, so leave it unset when empty.
        if item.help:
            ts.metadata.help_ref = intern(item.help)
        if item.unit:
            ts.metadata.unit_ref = intern(item.unit)
    request.symbols.extend(refs)
    return compress_block(request.SerializeToString())
