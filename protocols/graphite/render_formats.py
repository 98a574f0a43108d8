"""Encoders for Graphite render output formats, byte-compatible with graphite-web 1.1.

``series_list`` is a list of series as ``gateway.query.graphite.series.TimeSeries`` (a list of values
with name, start, end, step, tags, pathExpression, valuesPerPoint, consolidationFunc and
xFilesFactor attributes); iterating a series yields its consolidated values.

graphite-web applies ``maxDataPoints`` only to ``format=json``: call ``apply_max_data_points``
before ``encode_json``, not before the other encoders.
"""

import csv
import io
import json
import math
import pickle
import re
from datetime import UTC, datetime, tzinfo

import orjson

try:
    import msgpack
except ImportError:
    msgpack = None

MSGPACK_AVAILABLE = msgpack is not None
_INFINITY = float("inf")
# Points encoded at a time: one orjson call holds the GIL throughout, so encoding a large answer
# in a thread would otherwise stall the reactor thread for its whole length in one piece.
POINTS_PER_CALL = 65536

CONTENT_TYPES = {
    "json": "application/json",
    "jsonp": "text/javascript",
    "csv": "text/csv",
    "raw": "text/plain",
    "pickle": "application/pickle",
    "msgpack": "application/x-msgpack",
}
# A JSONP callback is echoed into JavaScript, so only a dotted path of identifiers is allowed
# (``cb``, ``jQuery123_456``, ``$.ns.fn``): no call, index, quote, space or line break.
JSONP_CALLBACK = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*(?:\.[A-Za-z_$][A-Za-z0-9_$]*)*")


def is_jsonp_callback(name: str) -> bool:
    return JSONP_CALLBACK.fullmatch(name) is not None


def apply_max_data_points(series_list, max_data_points: int) -> None:
    """Consolidate each series to at most ``max_data_points`` points, as graphite-web's json view.

    The time range is taken over all series; the start is nudged so buckets line up between
    refreshes (graphite-web drops one raw value fewer than the nudge spans; kept as is).
    """
    if not any(series_list):
        return
    start = min(series.start for series in series_list)
    end = max(series.end for series in series_list)
    time_range = end - start
    for series in series_list:
        if max_data_points == 1:
            series.consolidate(len(series))
            continue
        number_of_points = time_range / series.step
        if max_data_points < number_of_points:
            values_per_point = math.ceil(float(number_of_points) / float(max_data_points))
            seconds_per_point = int(values_per_point * series.step)
            nudge = seconds_per_point + (series.start % series.step) - (series.start % seconds_per_point)
            series.start = series.start + nudge
            for _ in range(1, int(nudge / series.step)):
                del series[0]
            series.consolidate(values_per_point)


def encode_json(series_list, no_null_points: bool = False, pretty: bool = False, jsonp: str | None = None) -> bytes:
    """``[{"target", "tags", "datapoints": [[value, ts], ...]}]``; NaN becomes null, ±Infinity ±1e9999.

    With ``no_null_points``, null/NaN points are dropped and series left empty are omitted.
    With ``jsonp`` (checked with ``is_jsonp_callback`` first), the document is wrapped as
    ``callback(...)`` (content type text/javascript).
    Datapoints, most of the bytes, are encoded by orjson and spaced as Python's json module spaces
    them (graphite-web's output); numbers keep their value, though orjson may spell a few
    differently (``0.00001`` for ``1e-05``).
    """
    if pretty:
        plain = [
            {"target": series.name, "tags": dict(series.tags), "datapoints": datapoints}
            for series, datapoints in _kept_datapoints(series_list, no_null_points)
        ]
        pieces = [_python_json(plain, indent=2).encode("utf-8")]
    else:
        pieces = []
        for series in series_list if any(series_list) else []:
            datapoints = _datapoints_json(series, no_null_points)
            if datapoints is not None:
                pieces.append(b", " if pieces else b"[")
                pieces.append(
                    b'{"target": %s, "tags": %s, "datapoints": ['
                    % (json.dumps(series.name).encode(), json.dumps(dict(series.tags)).encode())
                )
                pieces.extend(datapoints)
                pieces.append(b"]}")
        pieces.append(b"]" if pieces else b"[]")
    if jsonp is not None:
        pieces = [b"%s(" % jsonp.encode("utf-8"), *pieces, b")"]
    # joined once: every join of a large answer is a copy holding the GIL (the reactor waits)
    return b"".join(pieces)


def _kept(datapoints: list, no_null_points: bool) -> list:
    if not no_null_points:
        return datapoints
    return [point for point in datapoints if point[0] is not None and not math.isnan(point[0])]


def _kept_datapoints(series_list, no_null_points: bool):
    """(series, datapoints) of the series to encode: with ``no_null_points``, those left with points."""
    for series in series_list if any(series_list) else []:
        datapoints = _kept(series.datapoints(), no_null_points)
        if datapoints or not no_null_points:
            yield series, datapoints


def _python_json(document, indent: int | None = None) -> str:
    """graphite-web's own encoding: Python's json, NaN written null and Infinity 1e9999."""
    return json.dumps(document, indent=indent).replace("NaN,", "null,").replace("Infinity,", "1e9999,")


def _datapoints_json(series, no_null_points: bool) -> list[bytes] | None:
    """The pieces of ``[value, ts], ...`` (without the outer brackets), or None when
    ``no_null_points`` leaves none: orjson, with Python's ``", "`` separators (the text holds only
    numbers and nulls, so every comma is a separator), POINTS_PER_CALL points at a time. orjson
    writes NaN as null, as wanted, but infinities as null too: a series holding one (consolidation
    makes one only from one) takes Python's encoder."""
    if list.__contains__(series, _INFINITY) or list.__contains__(series, -_INFINITY):
        datapoints = _kept(series.datapoints(), no_null_points)
        return [_python_json(datapoints)[1:-1].encode("utf-8")] if datapoints or not no_null_points else None
    pieces: list[bytes] = []
    for datapoints in series.datapoint_chunks(POINTS_PER_CALL):
        datapoints = _kept(datapoints, no_null_points)
        if datapoints:
            if pieces:
                pieces.append(b", ")
            pieces.append(orjson.dumps(datapoints)[1:-1].replace(b",", b", "))
    if no_null_points and not pieces:
        return None
    return pieces


def encode_csv(series_list, tz: tzinfo = UTC) -> bytes:
    """``name,YYYY-MM-DD HH:MM:SS,value`` rows (empty value for null), CRLF line ends."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, dialect="excel")
    for series in series_list:
        for i, value in enumerate(series):
            timestamp = datetime.fromtimestamp(series.start + i * series.step, tz)
            writer.writerow((series.name, timestamp.strftime("%Y-%m-%d %H:%M:%S"), value))
    return buffer.getvalue().encode("utf-8")


def encode_raw(series_list) -> bytes:
    """``name,start,end,step|v1,v2,...`` lines, values as Python reprs (``None`` for null)."""
    lines = []
    for series in series_list:
        header = "%s,%d,%d,%d|" % (series.name, series.start, series.end, series.step)
        lines.append(header + ",".join(map(repr, series)) + "\n")
    return "".join(lines).encode("utf-8")


def _series_info(series) -> dict:
    return {
        "name": str(series.name),
        "start": series.start,
        "end": series.end,
        "step": series.step,
        "values": list(series),
        "pathExpression": str(series.pathExpression),
        "valuesPerPoint": series.valuesPerPoint,
        "consolidationFunc": str(series.consolidationFunc),
        "xFilesFactor": series.xFilesFactor,
    }


def encode_pickle(series_list) -> bytes:
    """A pickled list of dicts (name, start, end, step, values, pathExpression, ...), highest protocol."""
    return pickle.dumps([_series_info(series) for series in series_list], protocol=-1)


def encode_msgpack(series_list) -> bytes:
    """The pickle format's dicts as msgpack; only when the ``msgpack`` package is installed."""
    if msgpack is None:
        raise RuntimeError("format=msgpack needs the msgpack package")
    return msgpack.packb([_series_info(series) for series in series_list], use_bin_type=True)


def encode_functions_json(catalog: dict, pretty: bool = False) -> bytes:
    """The /functions document; infinite defaults are written 1e9999 as graphite-web does."""
    output = json.dumps(catalog, indent=2 if pretty else None)
    return output.replace("Infinity,", "1e9999,").encode("utf-8")
