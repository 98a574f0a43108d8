"""Prometheus remote write (1.0, 2.0) and remote read wire formats, sans I/O.

Bytes in, plain Python data out, and back: no sockets, no HTTP server. Errors
carry the HTTP status to answer with (see docs/prometheus.rst, Wire formats).

The *_pb2.py modules and their *_pb2.pyi type stubs are generated from the
.proto files beside them and committed. Regenerate them from the repository root with grpcio-tools 1.85.1
(protoc 35.1, gencode 7.35.1, which needs protobuf runtime >= 7.35.1, < 8),
installed in a throwaway venv so it cannot change the project's protobuf:

    python -m venv /tmp/protoc-venv
    /tmp/protoc-venv/bin/pip install grpcio-tools==1.85.1
    /tmp/protoc-venv/bin/python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. \\
        protocols/prometheus/types.proto protocols/prometheus/remote.proto \\
        protocols/prometheus/write_v2.proto
"""

from .crc32c import crc32c
from .errors import ProtocolError, RemoteReadError, RemoteWriteError
from .histogram_chunks import NativeHistogram, decode_histogram_chunk, encode_histogram_chunk
from .names import (
    labels_for_reader,
    prometheus_labels,
    prometheus_metric_name,
    sanitize_label_name,
    unescape_name,
    utf8_labels,
)
from .read import (
    SAMPLES,
    SAMPLES_CONTENT_TYPE,
    STREAMED_CONTENT_TYPE,
    STREAMED_XOR_CHUNKS,
    Matcher,
    ReadHints,
    ReadQuery,
    ReadRequest,
    decode_chunked_read_response,
    decode_chunked_series,
    decode_read_request,
    decode_read_response,
    encode_chunked_series_frames,
    encode_frame,
    encode_read_request,
    encode_read_response,
    iter_frames,
    negotiate_response_type,
    series_matches,
)
from .snappy import compress_block, decompress_block, uncompressed_length
from .write import (
    V1_CONTENT_TYPE,
    V2_CONTENT_TYPE,
    Exemplar,
    RejectedHistogram,
    RejectedSeries,
    RequestTooLarge,
    WriteBatch,
    WriteHistogram,
    WriteLimits,
    WriteMetadata,
    WriteSeries,
    decode_write_request,
    decode_write_request_steps,
    encode_write_request_v1,
    encode_write_request_v2,
    message_version,
    series_labels,
    v2_written_headers,
)
from .xor import decode_xor_chunk, encode_xor_chunk

__all__ = [
    "SAMPLES",
    "SAMPLES_CONTENT_TYPE",
    "STREAMED_CONTENT_TYPE",
    "STREAMED_XOR_CHUNKS",
    "V1_CONTENT_TYPE",
    "V2_CONTENT_TYPE",
    "Exemplar",
    "WriteHistogram",
    "WriteLimits",
    "Matcher",
    "NativeHistogram",
    "WriteMetadata",
    "ProtocolError",
    "ReadQuery",
    "ReadHints",
    "ReadRequest",
    "RejectedHistogram",
    "RejectedSeries",
    "RequestTooLarge",
    "RemoteReadError",
    "RemoteWriteError",
    "WriteSeries",
    "WriteBatch",
    "compress_block",
    "crc32c",
    "decode_chunked_read_response",
    "decode_chunked_series",
    "decode_histogram_chunk",
    "decode_read_request",
    "decode_read_response",
    "decode_write_request",
    "decode_write_request_steps",
    "decode_xor_chunk",
    "decompress_block",
    "encode_chunked_series_frames",
    "encode_frame",
    "encode_histogram_chunk",
    "encode_read_request",
    "encode_read_response",
    "encode_write_request_v1",
    "encode_write_request_v2",
    "series_labels",
    "encode_xor_chunk",
    "iter_frames",
    "message_version",
    "negotiate_response_type",
    "labels_for_reader",
    "prometheus_labels",
    "prometheus_metric_name",
    "sanitize_label_name",
    "unescape_name",
    "utf8_labels",
    "series_matches",
    "uncompressed_length",
    "v2_written_headers",
]
