"""OpenTelemetry OTLP/HTTP metrics in, sans I/O: the request decoded (wire.py) and translated to
Prometheus series as Prometheus 3 does it (translate.py, names.py, delta.py), the answer
encoded. The messages are the ``opentelemetry-proto`` package's."""

from .delta import DeltaToCumulative
from .names import STRATEGIES, Namer
from .translate import Settings, Translation, translate, translate_steps
from .wire import JSON, PROTOBUF, OTLPError, decompress_steps, encode_response, parse, request_encoding, split_request

__all__ = [
    "JSON",
    "PROTOBUF",
    "STRATEGIES",
    "DeltaToCumulative",
    "Namer",
    "OTLPError",
    "Settings",
    "Translation",
    "decompress_steps",
    "encode_response",
    "parse",
    "request_encoding",
    "split_request",
    "translate",
    "translate_steps",
]
