"""Remote write 1.0 and 2.0 request bodies: decode, validate, and encode.

The whole request is rejected on the first invalid series (the specs allow a
receiver to refuse a request that holds any invalid sample), so a caller
either stores everything in the returned batch or nothing.
"""

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

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
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

_V1_TYPE_NAMES = {
    value.number: value.name.lower()
    for value in types_pb2.MetricMetadata.MetricType.DESCRIPTOR.values
}
_V2_TYPE_NAMES = {
    value.number: value.name.removeprefix("METRIC_TYPE_").lower()
    for value in write_v2_pb2.Metadata.MetricType.DESCRIPTOR.values
    if value.number != 0
}
_V2_TYPE_NUMBERS = {name: number for number, name in _V2_TYPE_NAMES.items()}


@dataclass(frozen=True)
class Exemplar:
    """An exemplar of a series: its own labels (a trace id, say), a value and a timestamp (ms)."""

    labels: dict[str, str]
    value: float
    timestamp: int


@dataclass
class Series:
    """One time series; `labels` includes `__name__`, samples are (timestamp_ms, value)."""

    labels: dict[str, str]
    samples: list[tuple[int, float]] = field(default_factory=list)
    metric_type: str | None = None  # v2 only: "counter", "gauge", ...
    help: str = ""  # v2 only
    unit: str = ""  # v2 only
    exemplars: list[Exemplar] = field(default_factory=list)


@dataclass
class MetricMetadata:
    """Metadata of a metric family, as sent in v1 requests."""

    metric_family_name: str
    type: str  # lowercase: "unknown", "counter", "gauge", ...
    help: str = ""
    unit: str = ""


@dataclass
class WriteBatch:
    """Everything tsgate keeps from one remote write request."""

    version: int
    series: list[Series] = field(default_factory=list)
    metadata: list[MetricMetadata] = field(default_factory=list)
    histograms_skipped: int = 0

    @property
    def sample_count(self) -> int:
        return sum(len(series.samples) for series in self.series)

    @property
    def exemplar_count(self) -> int:
        return sum(len(series.exemplars) for series in self.series)


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
        raise RemoteWriteError(
            415, f"unsupported content encoding {content_encoding!r}, only snappy"
        )


def decode_write_request(
    body: bytes,
    content_type: str | None,
    content_encoding: str | None,
    max_decompressed_bytes: int,
) -> WriteBatch:
    """Decode a remote write body (v1 or v2 by Content-Type) or raise RemoteWriteError."""
    version = message_version(content_type)
    _check_content_encoding(content_encoding)
    try:
        raw = decompress_block(body, max_decompressed_bytes)
    except ProtocolError as exc:
        raise RemoteWriteError(exc.status, exc.message) from exc
    if version == 1:
        return _decode_v1(raw)
    return _decode_v2(raw)


def _parse(message, raw: bytes):
    try:
        message.ParseFromString(raw)
    except DecodeError as exc:
        name = message.DESCRIPTOR.full_name
        raise RemoteWriteError(400, f"invalid protobuf {name}: {exc}") from exc
    return message


# Label names already checked against _LABEL_NAME: a process sees few distinct names, and the
# regex per label was a tenth of decoding. Bounded so hostile input cannot grow it.
_VALID_LABEL_NAMES: set[str] = set()
_MAX_VALID_LABEL_NAMES = 10_000


def _check_label_name(index: int, name: str) -> None:
    if not name:
        raise RemoteWriteError(400, f"series {index}: empty label name")
    if not _LABEL_NAME.fullmatch(name):
        raise RemoteWriteError(400, f"series {index}: invalid label name {name!r}")
    if len(_VALID_LABEL_NAMES) < _MAX_VALID_LABEL_NAMES:
        _VALID_LABEL_NAMES.add(name)


def _validated_labels(index: int, pairs: list[tuple[str, str]]) -> dict[str, str]:
    """Check a series' labels against the spec and return them as a dict.

    Labels with an empty value are dropped: to Prometheus an empty label
    value is the same as an absent label. Labels out of order are sorted, as
    Prometheus's own receiver does: senders should sort them, but some (the
    remote-write compliance suite among them) send them in map order.
    """
    labels: dict[str, str] = {}
    previous = ""
    for name, value in pairs:
        if name not in _VALID_LABEL_NAMES:
            _check_label_name(index, name)
        if name <= previous:
            if name == previous:
                raise RemoteWriteError(400, f"series {index}: duplicate label name {name!r}")
            return _validated_labels(index, sorted(pairs))
        previous = name
        if value:
            labels[name] = value
    if METRIC_NAME_LABEL not in labels:
        raise RemoteWriteError(400, f"series {index}: missing or empty {METRIC_NAME_LABEL} label")
    return labels


def _exemplar(index: int, pairs: Iterable[tuple[str, str]], value: float, timestamp: int) -> Exemplar:
    """Check an exemplar's labels (valid, distinct names; at most MAX_EXEMPLAR_LABELS_LENGTH
    characters in all, as Prometheus bounds them); empty values are dropped as for series."""
    labels: dict[str, str] = {}
    length = 0
    for name, label_value in pairs:
        if name not in _VALID_LABEL_NAMES:
            _check_label_name(index, name)
        if name in labels:
            raise RemoteWriteError(400, f"series {index}: exemplar has a duplicate label name {name!r}")
        length += len(name) + len(label_value)
        if label_value:
            labels[name] = label_value
    if length > MAX_EXEMPLAR_LABELS_LENGTH:
        raise RemoteWriteError(
            400, f"series {index}: exemplar labels are {length} characters long, over {MAX_EXEMPLAR_LABELS_LENGTH}"
        )
    return Exemplar(labels, value, timestamp)


def _decode_v1(raw: bytes) -> WriteBatch:
    request = _parse(remote_pb2.WriteRequest(), raw)
    batch = WriteBatch(version=1)
    for index, ts in enumerate(request.timeseries):
        labels = _validated_labels(index, [(label.name, label.value) for label in ts.labels])
        samples = [(sample.timestamp, sample.value) for sample in ts.samples]
        exemplars = [
            _exemplar(index, ((label.name, label.value) for label in e.labels), e.value, e.timestamp)
            for e in ts.exemplars
        ]
        batch.series.append(Series(labels=labels, samples=samples, exemplars=exemplars))
        batch.histograms_skipped += len(ts.histograms)
    for metadata in request.metadata:
        batch.metadata.append(
            MetricMetadata(
                metric_family_name=metadata.metric_family_name,
                type=_V1_TYPE_NAMES.get(metadata.type, "unknown"),
                help=metadata.help,
                unit=metadata.unit,
            )
        )
    return batch


def _symbol(symbols: list[str], ref: int, index: int, what: str) -> str:
    if ref >= len(symbols):
        raise RemoteWriteError(
            400,
            f"series {index}: {what} {ref} out of range "
            f"(symbols table has {len(symbols)} entries)",
        )
    return symbols[ref]


def _decode_v2(raw: bytes) -> WriteBatch:
    request = _parse(write_v2_pb2.Request(), raw)
    symbols = list(request.symbols)
    if symbols and symbols[0] != "":
        raise RemoteWriteError(400, "symbols[0] must be the empty string")
    batch = WriteBatch(version=2)
    for index, ts in enumerate(request.timeseries):
        refs = ts.labels_refs
        if len(refs) % 2:
            raise RemoteWriteError(
                400, f"series {index}: odd number of labels_refs ({len(refs)})"
            )
        pairs = [
            (
                _symbol(symbols, refs[i], index, "label name ref"),
                _symbol(symbols, refs[i + 1], index, "label value ref"),
            )
            for i in range(0, len(refs), 2)
        ]
        labels = _validated_labels(index, pairs)
        if not ts.samples and not ts.histograms:
            raise RemoteWriteError(400, f"series {index}: no samples and no histograms")
        metadata = ts.metadata
        batch.series.append(
            Series(
                labels=labels,
                samples=[(sample.timestamp, sample.value) for sample in ts.samples],
                exemplars=[_v2_exemplar(symbols, index, e) for e in ts.exemplars],
                metric_type=_V2_TYPE_NAMES.get(metadata.type, "unknown") if metadata.type else None,
                help=_symbol(symbols, metadata.help_ref, index, "help_ref"),
                unit=_symbol(symbols, metadata.unit_ref, index, "unit_ref"),
            )
        )
        batch.histograms_skipped += len(ts.histograms)
    return batch


def _v2_exemplar(symbols: list[str], index: int, exemplar) -> Exemplar:
    refs = exemplar.labels_refs
    if len(refs) % 2:
        raise RemoteWriteError(400, f"series {index}: odd number of exemplar labels_refs ({len(refs)})")
    pairs = [
        (
            _symbol(symbols, refs[i], index, "exemplar label name ref"),
            _symbol(symbols, refs[i + 1], index, "exemplar label value ref"),
        )
        for i in range(0, len(refs), 2)
    ]
    return _exemplar(index, pairs, exemplar.value, exemplar.timestamp)


def v2_written_headers(
    batch: WriteBatch, samples_written: int | None = None, exemplars_written: int = 0
) -> dict[str, str]:
    """Response headers a v2 receiver must send: how many elements were stored.

    Samples default to every sample of the batch (pass `samples_written` after a
    partial failure); exemplars are those the caller stored. Histograms are always 0
    because tsgate skips them, which tells the sender they were not stored.
    """
    if samples_written is None:
        samples_written = batch.sample_count
    return {
        SAMPLES_WRITTEN_HEADER: str(samples_written),
        HISTOGRAMS_WRITTEN_HEADER: "0",
        EXEMPLARS_WRITTEN_HEADER: str(exemplars_written),
    }


def encode_write_request_v1(
    series: Iterable[Series], metadata: Iterable[MetricMetadata] | None = None
) -> bytes:
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
    for entry in metadata or ():
        request.metadata.add(
            type=types_pb2.MetricMetadata.MetricType.Value(entry.type.upper()),
            metric_family_name=entry.metric_family_name,
            help=entry.help,
            unit=entry.unit,
        )
    return compress_block(request.SerializeToString())


def encode_write_request_v2(series: Iterable[Series]) -> bytes:
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
