"""OTLP/HTTP metrics requests and answers (the OTLP specification, "OTLP/HTTP"):
an ExportMetricsServiceRequest as protobuf (``application/x-protobuf``) or JSON
(``application/json``, trace and span ids in hex), gzip-compressed or not; the answer, an
ExportMetricsServiceResponse in the request's encoding, with ``partial_success`` saying how
many data points were refused and why."""

import base64
import json
import zlib
from collections.abc import Iterator

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from protocols.prometheus.errors import ProtocolError
from protocols.prometheus.write import read_varint

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_DATA_KINDS = ("sum", "gauge", "histogram", "exponentialHistogram", "exponential_histogram", "summary")
# Decompressed at once at most (then the caller may pause).
GZIP_STEP_BYTES = 1 << 20
_NOT_A_REQUEST = "the body is not an OTLP ExportMetricsServiceRequest"


class OTLPError(ProtocolError):
    """A request that will never be accepted as it is: the status says why (400, 413, 415)."""


def request_encoding(content_type: str | None) -> str:
    """PROTOBUF or JSON, from the Content-Type (415 for any other)."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media not in (PROTOBUF, JSON):
        raise OTLPError(415, f"unsupported content type {content_type!r}: OTLP/HTTP takes {PROTOBUF} or {JSON}")
    return media


def decompress_steps(body: bytes, content_encoding: str | None, max_bytes: int):
    """The body, gunzipped at most ``max_bytes`` (413 beyond: a decompression bomb costs no more),
    yielding after each GZIP_STEP_BYTES."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding != "gzip":
        raise OTLPError(415, f"unsupported content encoding {content_encoding!r}: OTLP/HTTP takes gzip or none")
    inflater = zlib.decompressobj(wbits=31)
    parts, size, pending = [], 0, body
    try:
        while pending and not inflater.eof:
            part = inflater.decompress(pending, GZIP_STEP_BYTES)
            pending = inflater.unconsumed_tail
            size += len(part)
            if size > max_bytes:
                raise OTLPError(
                    413, f"the decompressed body is over the limit of {max_bytes} bytes (--max-decompressed-bytes)"
                )
            parts.append(part)
            yield
        if not inflater.eof:
            raise OTLPError(400, "the gzip body is truncated")
    except zlib.error as error:
        raise OTLPError(400, f"the body is not valid gzip: {error}") from None
    return b"".join(parts)


# A protobuf request larger than this is parsed in pieces (split_request), so that parsing one
# holds the reactor a few ms at most (protobuf parses a counter point in ~0.3 us here, a piece
# holds ~4000); translating follows in slices.
PIECE_BYTES = 512 * 1024
# The repeated field each level of an ExportMetricsServiceRequest is cut at: a ResourceMetrics'
# scope_metrics, a ScopeMetrics' metrics, a Metric's data (gauge, sum, histogram,
# exponential_histogram or summary) and the data's data_points; a data point is not cut.
_CUT_FIELDS = ({2}, {2}, {5, 7, 9, 10, 11}, {1})
_LENGTH_DELIMITED = 2
_FIXED_BYTES = {1: 8, 5: 4}  # wire types fixed64 and fixed32
# Fields walked between two yields of split_request (a few hundred us).
FIELDS_PER_STEP = 1000


def split_request(raw: bytes, piece_bytes: int = PIECE_BYTES) -> Iterator[tuple[int, bytes] | None]:
    """A protobuf ExportMetricsServiceRequest as requests of about ``piece_bytes`` at most, in
    order, each with the number of its one resource in the request: a resource's scopes,
    metrics or data points are cut into several pieces when they do not fit in one, each piece
    repeating the fields around what it holds (its resource, scope, and the metric's name, unit,
    temporality...), so one metric's points may come in several pieces. A single data point
    larger than ``piece_bytes`` is a piece alone. Lazy, and yields None between steps of
    FIELDS_PER_STEP fields (a caller pauses there). 400 if a field's length or wire type does not
    fit the message it is in (what is inside a piece is protobuf's to check)."""
    if len(raw) <= piece_bytes:
        yield 0, raw
        return
    resource = -1
    for field in _fields(raw, 0, len(raw)):
        if field is None:
            yield None
            continue
        number, wire, _, value_at, end = field
        if number != 1 or wire != _LENGTH_DELIMITED:
            continue  # not a resource_metrics: unknown, as protobuf would leave it
        resource += 1
        for piece in _cut(raw, value_at, end, 0, piece_bytes):
            yield None if piece is None else (resource, _field_bytes(b"\x0a", piece))


def _cut(raw: bytes, start: int, end: int, level: int, piece_bytes: int) -> Iterator[bytes | None]:
    """The message ``raw[start:end]`` of a level of _CUT_FIELDS as messages of about
    ``piece_bytes`` at most: its other fields (the head) in each, its fields of that level's
    numbers shared among them, one too large alone cut at the next level."""
    if end - start <= piece_bytes or level == len(_CUT_FIELDS):
        yield raw[start:end]
        return
    head_parts, items = [], []
    for field in _fields(raw, start, end):
        if field is None:
            yield None
            continue
        number, wire, tag_at, value_at, stop = field
        if number in _CUT_FIELDS[level] and wire == _LENGTH_DELIMITED:
            items.append((bytes([number << 3 | _LENGTH_DELIMITED]), value_at, stop))  # numbers under 16: a byte
        else:
            head_parts.append(raw[tag_at:stop])
    head = b"".join(head_parts)
    group: list[bytes] = []
    size = len(head)
    for tag, value_at, stop in items:
        item_bytes = stop - value_at + len(tag) + 5  # with its length (5 bytes at most)
        if size + item_bytes > piece_bytes and group:
            yield head + b"".join(group)
            group, size = [], len(head)
        if size + item_bytes > piece_bytes:
            for part in _cut(raw, value_at, stop, level + 1, piece_bytes - len(head)):
                yield None if part is None else head + _field_bytes(tag, part)
            continue
        group.append(_field_bytes(tag, raw[value_at:stop]))
        size += item_bytes
    if group or not items:
        yield head + b"".join(group)


def metric_data(raw: bytes) -> list[list[bytes | None]]:
    """The bytes of each metric's data message (its gauge, sum, histogram...) in a protobuf
    request, by resource then in order (what the parsed message would serialize again), found
    by walking the fields above the data points only; None for a metric whose data is not one
    field (protobuf merges repeated ones)."""
    found = []
    for resource_at, resource_end in _messages(raw, 0, len(raw), 1):
        metrics: list[bytes | None] = []
        for scope_at, scope_end in _messages(raw, resource_at, resource_end, 2):
            for metric_at, metric_end in _messages(raw, scope_at, scope_end, 2):
                data = [
                    raw[value_at:stop]
                    for number, wire, _, value_at, stop in filter(None, _fields(raw, metric_at, metric_end))
                    if number in _CUT_FIELDS[2] and wire == _LENGTH_DELIMITED
                ]
                metrics.append(data[0] if len(data) == 1 else None)
        found.append(metrics)
    return found


def _messages(raw: bytes, start: int, end: int, number: int) -> Iterator[tuple[int, int]]:
    """Where the values of the message's length-delimited fields of ``number`` start and end."""
    for field in _fields(raw, start, end):
        if field is not None and field[0] == number and field[1] == _LENGTH_DELIMITED:
            yield field[3], field[4]


def _fields(raw: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int, int] | None]:
    """The fields of the message ``raw[start:end]``: (number, wire type, where its tag starts,
    where its value starts, where it ends), and None every FIELDS_PER_STEP fields; 400 for a
    field that does not fit the message or a wire type protobuf no longer writes (groups)."""
    position, count = start, 0
    try:
        while position < end:
            key, value_at = read_varint(raw, position)
            number, wire = key >> 3, key & 7
            if wire == _LENGTH_DELIMITED:
                length, value_at = read_varint(raw, value_at)
                stop = value_at + length
            elif wire == 0:
                stop = read_varint(raw, value_at)[1]
            elif wire in _FIXED_BYTES:
                stop = value_at + _FIXED_BYTES[wire]
            else:
                raise OTLPError(400, f"{_NOT_A_REQUEST}: field {number} at byte {position} has wire type {wire}")
            if stop > end:
                raise OTLPError(
                    400, f"{_NOT_A_REQUEST}: field {number} at byte {position} runs past the end of its message"
                )
            yield number, wire, position, value_at, stop
            position = stop
            count += 1
            if not count % FIELDS_PER_STEP:
                yield None
    except IndexError:
        raise OTLPError(400, f"{_NOT_A_REQUEST}: a varint at byte {position} runs past the end") from None


def _field_bytes(tag: bytes, value: bytes) -> bytes:
    """A length-delimited field: its tag, the length of ``value`` as a varint, ``value``."""
    length, prefix = len(value), bytearray(tag)
    while length >= 0x80:
        prefix.append(length & 0x7F | 0x80)
        length >>= 7
    prefix.append(length)
    return bytes(prefix) + value


def parse(raw: bytes, encoding: str) -> ExportMetricsServiceRequest:
    """The request message (400 if it is not one)."""
    if encoding == PROTOBUF:
        try:
            return ExportMetricsServiceRequest.FromString(raw)
        except DecodeError as error:
            raise OTLPError(400, f"{_NOT_A_REQUEST}: {error}") from None
    try:
        document = json.loads(raw)
        _ids_to_base64(document)
        return json_format.ParseDict(document, ExportMetricsServiceRequest(), ignore_unknown_fields=True)
    except (ValueError, json_format.ParseError, TypeError, AttributeError, RecursionError) as error:
        raise OTLPError(400, f"the body is not an OTLP ExportMetricsServiceRequest in JSON: {error}") from None


def _ids_to_base64(document) -> None:
    """OTLP JSON writes exemplars' trace and span ids in hex, where protobuf's JSON has base64."""
    for resource in _items(document, "resourceMetrics", "resource_metrics"):
        for scope in _items(resource, "scopeMetrics", "scope_metrics"):
            for metric in _items(scope, "metrics"):
                for kind in _DATA_KINDS:
                    for point in _items(metric.get(kind) or {}, "dataPoints", "data_points"):
                        for exemplar in _items(point, "exemplars"):
                            for key in ("traceId", "trace_id", "spanId", "span_id"):
                                if isinstance(exemplar.get(key), str):
                                    exemplar[key] = base64.b64encode(bytes.fromhex(exemplar[key])).decode()


def _items(document, *keys) -> list:
    if not isinstance(document, dict):
        raise ValueError("an object was expected")
    for key in keys:
        if key in document:
            found = document[key]
            if not isinstance(found, list):
                raise ValueError(f"{key} is not a list")
            return found
    return []


def encode_response(encoding: str, rejected_points: int = 0, message: str = "") -> bytes:
    """An ExportMetricsServiceResponse; partial_success only when something was refused."""
    response = ExportMetricsServiceResponse()
    if rejected_points or message:
        response.partial_success.rejected_data_points = rejected_points
        response.partial_success.error_message = message
    if encoding == JSON:
        return json_format.MessageToJson(response, indent=None).encode()
    return response.SerializeToString()
