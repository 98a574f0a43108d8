"""Graphite carbon ingest formats (plaintext lines, pickle frames, tagged paths) as pure code.

Every ingest decoder returns ``(samples, rejects)``: the samples as arrays
(``arrays.Samples``: a table of paths and, a point each, its path, timestamp
and value); the gateway adds the tenant. A reject carries one of ``REJECT_REASONS`` so the gateway can count refusals
by reason, and a short bounded detail it can log.
"""

from typing import Any, NamedTuple

BAD_FIELD_COUNT = "bad_field_count"
BAD_VALUE = "bad_value"
NAN_VALUE = "nan_value"
INF_VALUE = "inf_value"
BAD_TIMESTAMP = "bad_timestamp"
BAD_PATH = "bad_path"
BAD_TAG = "bad_tag"
BAD_UTF8 = "bad_utf8"
LINE_TOO_LONG = "line_too_long"
TRUNCATED_LINE = "truncated_line"
FRAME_TOO_LARGE = "frame_too_large"
TRUNCATED_FRAME = "truncated_frame"
BAD_PICKLE = "bad_pickle"
BAD_PICKLE_ITEM = "bad_pickle_item"
TOO_MANY_ITEMS = "too_many_items"
HTTP_REQUEST = "http_request"

REJECT_REASONS = frozenset(
    {
        BAD_FIELD_COUNT,
        BAD_VALUE,
        NAN_VALUE,
        INF_VALUE,
        BAD_TIMESTAMP,
        BAD_PATH,
        BAD_TAG,
        BAD_UTF8,
        LINE_TOO_LONG,
        TRUNCATED_LINE,
        FRAME_TOO_LARGE,
        TRUNCATED_FRAME,
        BAD_PICKLE,
        BAD_PICKLE_ITEM,
        TOO_MANY_ITEMS,
        HTTP_REQUEST,
    }
)

EXCERPT_LENGTH = 80

# Timestamps are stored as signed 64-bit milliseconds.
MAX_TIMESTAMP_S = (2**63 - 1) // 1000


_HTTP_METHODS = (b"GET", b"POST", b"PUT", b"HEAD", b"DELETE", b"OPTIONS", b"PATCH", b"CONNECT", b"TRACE")


def http_request_line(first_bytes: bytes) -> str | None:
    """The request line when a connection's first bytes are an HTTP request (an HTTP client
    pointed at a carbon port: ``POST /api/v1/write HTTP/1.1``), else None."""
    line = first_bytes[: EXCERPT_LENGTH * 4].split(b"\n", 1)[0].rstrip(b"\r")
    method, _, rest = line.partition(b" ")
    target, _, version = rest.rpartition(b" ")
    if method in _HTTP_METHODS and target and version.startswith(b"HTTP/"):
        return excerpt(line)
    return None


class Reject(NamedTuple):
    """One refused line, pickle item or frame."""

    reason: str
    detail: str


class InvalidInput(ValueError):
    """Raised inside the decoders for one bad line or item; never escapes them."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail

    def reject(self) -> Reject:
        return Reject(self.reason, self.detail)


def excerpt(raw: object) -> str:
    """A bounded, log-safe rendering of hostile input (never a huge or recursive repr)."""
    if isinstance(raw, (str, bytes)):
        rendered = repr(raw[:EXCERPT_LENGTH])
        if len(raw) > EXCERPT_LENGTH or len(rendered) > 2 * EXCERPT_LENGTH:
            return rendered[: 2 * EXCERPT_LENGTH] + "..."
        return rendered
    if isinstance(raw, float) or (isinstance(raw, int) and raw.bit_length() <= 64):
        return repr(raw)
    return f"<{type(raw).__name__}>"


def parse_value(raw: Any) -> float:
    """Carbon's value rule: anything float() takes (text or number); NaN and ±inf refused."""
    try:
        value = float(raw)
    except (ValueError, TypeError, OverflowError):
        raise InvalidInput(BAD_VALUE, excerpt(raw)) from None
    if value - value != 0.0:
        if value != value:
            raise InvalidInput(NAN_VALUE, excerpt(raw))
        raise InvalidInput(INF_VALUE, excerpt(raw))
    return value


def parse_timestamp_ms(raw: Any, now_ms: int) -> int:
    """Carbon's timestamp rule: int(float(ts)) seconds, where -1 means arrival time.

    Fractions are truncated (carbon stores whole seconds). Other negative,
    non-finite or beyond-int64-milliseconds timestamps are refused.
    """
    try:
        as_float = float(raw)
    except (ValueError, TypeError, OverflowError):
        raise InvalidInput(BAD_TIMESTAMP, excerpt(raw)) from None
    if as_float - as_float != 0.0:
        raise InvalidInput(BAD_TIMESTAMP, "not finite: " + excerpt(raw))
    seconds = int(as_float)
    if seconds < 0:
        if seconds == -1:
            return now_ms - now_ms % 1000
        raise InvalidInput(BAD_TIMESTAMP, "negative: " + excerpt(raw))
    if seconds > MAX_TIMESTAMP_S:
        raise InvalidInput(BAD_TIMESTAMP, "out of range: " + excerpt(raw))
    return seconds * 1000
