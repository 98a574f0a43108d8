"""OTLP/HTTP metrics requests and answers (the OTLP specification, "OTLP/HTTP"):
an ExportMetricsServiceRequest as protobuf (``application/x-protobuf``) or JSON
(``application/json``, trace and span ids in hex), gzip-compressed or not; the answer, an
ExportMetricsServiceResponse in the request's encoding, with ``partial_success`` saying how
many data points were refused and why."""

import base64
import json
import zlib

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from protocols.prometheus.errors import ProtocolError

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_DATA_KINDS = ("sum", "gauge", "histogram", "exponentialHistogram", "exponential_histogram", "summary")
# Decompressed at once at most (then the caller may pause).
GZIP_STEP_BYTES = 1 << 20


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


def parse(raw: bytes, encoding: str) -> ExportMetricsServiceRequest:
    """The request message (400 if it is not one)."""
    if encoding == PROTOBUF:
        try:
            return ExportMetricsServiceRequest.FromString(raw)
        except DecodeError as error:
            raise OTLPError(400, f"the body is not an OTLP ExportMetricsServiceRequest: {error}") from None
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
