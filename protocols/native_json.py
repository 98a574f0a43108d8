"""The native JSON API's wire format: write bodies in, query results out.

Write items (``/api/write/single``, ``/api/write`` as an array; docs/native-api.rst)::

    {"tenant": "t-1", "metricName": "cpu_idle", "tags": {"host": "h-1"}, "ts": 1700000000, "value": 1.5}

Put items (``/api/put``, OpenTSDB style, one object or an array)::

    {"metric": "cpu_idle", "tags": {"host": "h-1"}, "timestamp": 1700000000, "value": 1.5}

Timestamps are epoch seconds or milliseconds (protocols.timespec's rule) or ISO-8601 strings;
omitted, they are the arrival time. Values are JSON numbers, numeric strings, or ``"NaN"``,
``"+Inf"``, ``"-Inf"``; a number out of float64's range (``1e999``) or a bare ``NaN``/``Infinity``
refuses its item. Each item is decoded on its own: a bad item becomes an ItemError and the
others go on.
"""

import json
import math
import re
from collections.abc import Generator
from json.scanner import make_scanner
from typing import Any, NamedTuple, TypeVar

import numpy as np

from protocols.timespec import BadTime, epoch_to_ms, parse_time

T = TypeVar("T")


class BadRequest(ValueError):
    """The whole body is unusable (not JSON, wrong top-level shape)."""


class DecodedItem(NamedTuple):
    tenant: str | None
    metric_name: str
    tags: dict
    timestamp_ms: int
    value: float


class ItemError(NamedTuple):
    index: int  # type: ignore[assignment]  # a field, shadowing tuple.index on purpose
    field: str
    problem: str


Decoded = tuple[list[tuple[int, DecodedItem]], list[ItemError]]


class _FieldError(ValueError):
    def __init__(self, field: str, problem: str):
        super().__init__(problem)
        self.field = field
        self.problem = problem


_SPECIAL_VALUES = {"nan": math.nan, "+inf": math.inf, "inf": math.inf, "-inf": -math.inf}


class _OutOfRange(NamedTuple):
    """A JSON number no float64 holds (``1e999``, 400 digits) or a non-standard ``NaN``/``Infinity``
    literal: kept as text, so the item that carries it is refused naming its field."""

    text: str


# float64 tops out at 309 digits; past that an integer would only become +Inf.
_MAX_INTEGER_DIGITS = 309


def _parse_float(text: str) -> float | _OutOfRange:
    number = float(text)
    return number if math.isfinite(number) else _OutOfRange(text)


def _parse_int(text: str) -> int | _OutOfRange:
    return int(text) if len(text.lstrip("-")) <= _MAX_INTEGER_DIGITS else _OutOfRange(text)


def _parse_json(body: bytes) -> Any:
    try:
        return json.loads(body, parse_float=_parse_float, parse_int=_parse_int, parse_constant=_OutOfRange)
    except UnicodeDecodeError as error:
        raise BadRequest(f"body is not UTF-8: {error}") from None
    except json.JSONDecodeError as error:
        raise BadRequest(f"body is not valid JSON: {error}") from None
    except RecursionError:
        raise BadRequest("body is nested too deeply") from None


# What JSONDecoder.raw_decode calls; typeshed types make_scanner's argument as the scanner class.
_SCAN = make_scanner(json.JSONDecoder(parse_float=_parse_float, parse_int=_parse_int, parse_constant=_OutOfRange))  # type: ignore[arg-type]
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_SEPARATOR = re.compile(r"[ \t\n\r]*([,\]])[ \t\n\r]*")


def _skip_whitespace(text: str, pos: int) -> int:
    match = _WHITESPACE.match(text, pos)
    assert match is not None  # matches the empty string
    return match.end()


# Items parsed, or checked, between two yields of a decoder: about a millisecond of work.
ITEMS_PER_STEP = 200

Steps = Generator[None, None, T]


def _parse_json_steps(body: bytes) -> Steps[Any]:
    """_parse_json that reads a top-level array an item at a time and yields between runs of
    items: json.loads holds the GIL for the whole of a large body (10 MB: about a second), in a
    thread as on the reactor. Anything else is parsed at once."""
    try:
        text = body.decode(json.detect_encoding(body), "surrogatepass")  # as json.loads does
    except UnicodeDecodeError as error:
        raise BadRequest(f"body is not UTF-8: {error}") from None
    pos = _skip_whitespace(text, 0)
    if not text.startswith("[", pos):
        return _parse_json(body)
    items: list = []
    scan = _SCAN  # the C scanner raw_decode calls, without its Python frame
    pos = _skip_whitespace(text, pos + 1)
    try:
        closed = text.startswith("]", pos)
        pos += closed
        while not closed:
            try:
                item, pos = scan(text, pos)
            except StopIteration as stop:
                raise json.JSONDecodeError("Expecting value", text, stop.value) from None
            items.append(item)
            separator = _SEPARATOR.match(text, pos)
            if separator is None:
                raise json.JSONDecodeError("Expecting ',' delimiter", text, _skip_whitespace(text, pos))
            closed, pos = separator.group(1) == "]", separator.end()
            if not len(items) % ITEMS_PER_STEP:
                yield
        pos = _skip_whitespace(text, pos)
        if pos != len(text):
            raise json.JSONDecodeError("Extra data", text, pos)
    except json.JSONDecodeError as error:
        raise BadRequest(f"body is not valid JSON: {error}") from None
    except RecursionError:
        raise BadRequest("body is nested too deeply") from None
    return items


def run_to_end(steps: Steps[T]) -> T:
    """The value of a generator that yields between steps, run at once."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def _out_of_range(raw: _OutOfRange, field: str) -> _FieldError:
    return _FieldError(
        field,
        f'number {raw.text[:40]}{"..." if len(raw.text) > 40 else ""} is out of range (write NaN and infinities as the strings "NaN", "+Inf", "-Inf")',
    )


def _value(raw: Any) -> float:
    if isinstance(raw, _OutOfRange):
        raise _out_of_range(raw, "value")
    if isinstance(raw, bool) or raw is None:
        raise _FieldError("value", f"must be a number, got {json.dumps(raw)}")
    if isinstance(raw, (int, float)):
        try:
            return float(raw)
        except OverflowError:
            raise _out_of_range(_OutOfRange(str(raw)), "value") from None
    if isinstance(raw, str):
        special = _SPECIAL_VALUES.get(raw.strip().lower())
        if special is not None:
            return special
        try:
            number = float(raw)
        except ValueError:
            pass
        else:
            if math.isfinite(number):
                return number
            raise _out_of_range(_OutOfRange(raw), "value")
    raise _FieldError("value", f"must be a number, got {json.dumps(raw)[:60]}")


def _timestamp(raw: Any, field: str, now_ms: int) -> int:
    if raw is None:
        return now_ms
    if isinstance(raw, _OutOfRange):
        raise _out_of_range(raw, field)
    if isinstance(raw, bool):
        raise _FieldError(field, "must be epoch seconds, milliseconds or an ISO-8601 string")
    if isinstance(raw, (int, float)):
        if not math.isfinite(raw):
            raise _FieldError(field, "must be finite")
        return epoch_to_ms(raw)
    if isinstance(raw, str):
        try:
            return parse_time(raw, now_ms)
        except BadTime as error:
            raise _FieldError(field, str(error)) from None
    raise _FieldError(field, "must be epoch seconds, milliseconds or an ISO-8601 string")


def _item(raw: Any, name_field: str, time_fields: tuple[str, ...], now_ms: int) -> DecodedItem:
    if not isinstance(raw, dict):
        raise _FieldError("", "each item must be a JSON object")
    tenant = raw.get("tenant")
    if tenant is not None and not isinstance(tenant, str):
        raise _FieldError("tenant", "must be a string")
    if name_field not in raw:
        raise _FieldError(name_field, "is required")
    tags = raw.get("tags", {})
    if not isinstance(tags, dict):
        raise _FieldError("tags", "must be an object of tag names to string values")
    if "value" not in raw:
        raise _FieldError("value", "is required")
    time_field = next((f for f in time_fields if f in raw), time_fields[0])
    timestamp_ms = _timestamp(raw.get(time_field), time_field, now_ms)
    return DecodedItem(tenant, raw[name_field], tags, timestamp_ms, _value(raw["value"]))


def _items(raw_items: list, name_field: str, time_fields: tuple[str, ...], now_ms: int) -> Steps[Decoded]:
    decoded: list[tuple[int, DecodedItem]] = []
    errors: list[ItemError] = []
    for index, raw in enumerate(raw_items):
        if index and not index % ITEMS_PER_STEP:
            yield
        try:
            decoded.append((index, _item(raw, name_field, time_fields, now_ms)))
        except _FieldError as error:
            errors.append(ItemError(index, error.field, error.problem))
    return decoded, errors


def decode_write_single_steps(body: bytes, now_ms: int) -> Steps[Decoded]:
    """One write object -> ([(0, DecodedItem)], [ItemError])."""
    raw = _parse_json(body)
    if not isinstance(raw, dict):
        raise BadRequest("body must be one JSON object (use /api/write for an array)")
    return (yield from _items([raw], "metricName", ("ts", "timestamp"), now_ms))


def decode_write_batch_steps(body: bytes, now_ms: int) -> Steps[Decoded]:
    """A JSON array of write objects -> ([(index, DecodedItem)], [ItemError])."""
    raw = yield from _parse_json_steps(body)
    if not isinstance(raw, list):
        raise BadRequest("body must be a JSON array of objects")
    return (yield from _items(raw, "metricName", ("ts", "timestamp"), now_ms))


def decode_put_steps(body: bytes, now_ms: int) -> Steps[Decoded]:
    """An OpenTSDB-style object or array -> ([(index, DecodedItem)], [ItemError])."""
    raw = yield from _parse_json_steps(body)
    if isinstance(raw, dict):
        raw = [raw]
    if not isinstance(raw, list):
        raise BadRequest("body must be a JSON object or an array of objects")
    return (yield from _items(raw, "metric", ("timestamp",), now_ms))


def decode_write_single(body: bytes, now_ms: int) -> Decoded:
    return run_to_end(decode_write_single_steps(body, now_ms))


def decode_write_batch(body: bytes, now_ms: int) -> Decoded:
    return run_to_end(decode_write_batch_steps(body, now_ms))


def decode_put(body: bytes, now_ms: int) -> Decoded:
    return run_to_end(decode_put_steps(body, now_ms))


def json_value(value: float) -> float | str:
    """JSON has no NaN or infinities: write them as Prometheus does, as strings."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "+Inf" if value > 0 else "-Inf"


def encode_json(document: Any) -> bytes:
    return json.dumps(document, ensure_ascii=False, allow_nan=False).encode("utf-8")


# Samples encoded by one json.dumps: a call holds the GIL throughout (a million samples, about
# a second), so even from a thread a whole answer in one call would stall the event loop.
SAMPLES_PER_CALL = 65536


def encode_query_results(results) -> bytes:
    """The query answer (docs/native-api.rst): [{tenant, metricName, tags, values: {ISO time: value}}], with
    createdTimestamp (ms) for a series whose created timestamp is known. Each result has tenant,
    metric_name, tags, samples (numpy timestamps in ms and float values) and maybe created_ms.
    Encoded SAMPLES_PER_CALL samples at a time, the pieces joined as one json.dumps writes them."""
    documents = []
    for result in results:
        fields = {"tenant": result.tenant, "metricName": result.metric_name, "tags": result.tags}
        if getattr(result, "created_ms", None) is not None:
            fields["createdTimestamp"] = result.created_ms
        head = encode_json(fields)
        timestamps, values = result.samples
        pieces = [
            encode_json(
                dict(
                    zip(
                        iso_times(timestamps[first : first + SAMPLES_PER_CALL]),
                        map(json_value, values[first : first + SAMPLES_PER_CALL].tolist()),
                    )
                )
            )[1:-1]
            for first in range(0, len(timestamps), SAMPLES_PER_CALL)
        ]
        documents.append(b'%s, "values": {%s}}' % (head[:-1], b", ".join(pieces)))
    return b"[%s]" % b", ".join(documents)


def iso_times(timestamps_ms: np.ndarray) -> list[str]:
    """format_iso of many timestamps at once."""
    moments = np.asarray(timestamps_ms, dtype=np.int64).astype("datetime64[ms]")
    texts = np.char.add(np.datetime_as_string(moments, unit="ms"), "Z")
    whole = np.asarray(timestamps_ms) % 1000 == 0
    if whole.any():
        texts[whole] = np.char.add(np.datetime_as_string(moments[whole], unit="s"), "Z")
    return texts.tolist()
