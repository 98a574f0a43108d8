"""Prometheus's HTTP query API (what Grafana's Prometheus data source calls): parameters decoded
here, answered by gateway/query/promql/service.py, encoded here. Envelopes, status codes and error types are
Prometheus's: 400 bad_data, 422 execution, 503 timeout/unavailable. docs/promql.rst has the
details and the deliberate differences."""

import math
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson
import promql_parser

from gateway import __version__
from gateway.core import blocking
from gateway.http.server import HTTPError, Response, Router, arg, args, error_response, request_tenant
from gateway.query.cardinality import tenant_cardinality
from gateway.query.promql.engine import Query, format_value, parser_call
from gateway.query.promql.service import PromQLService
from gateway.query.promql.values import PromQLError, RangeVector, Scalar, String, Vector
from protocols.prometheus import unescape_name

MAX_POINTS_PER_SERIES = 11_000
# An answer of at most this many points is encoded at once, not in a thread: the hop there and back
# would cost more (32 series of an instant vector: about 50 us to encode).
SMALL_ANSWER_POINTS = 32
DAY_MS = 86_400_000
STATUS_TOP_DEFAULT = 10  # Prometheus's default ``limit`` of /api/v1/status/tsdb
STATUS_TOP_MAX = 10_000
# /labels and /label/<name>/values without match[] are answered in the serving process when their
# index listing reads at most this many rows (a value once a bucket), and need no executor (a hop
# of 0.25 ms, and a wait while the executors are busy). Beyond it, an executor answers: at 5,000
# rows two clients looping such listings took /healthz's p99 from 2.7 ms to 9.2, and a listing of
# 1,500 values was no faster here than in an executor (the SQLite read's thread hop costs as much).
IN_PROCESS_LISTING_ROWS = 1_000


async def _encoded(encode, value, *rest) -> bytes:
    """``encode(value, *rest)``: at once for a small value of floats (SMALL_ANSWER_POINTS), else
    in a thread, off the reactor (a range vector's size is unknown without a walk)."""
    if isinstance(value, String) or (
        isinstance(value, Scalar | Vector) and value.values.size <= SMALL_ANSWER_POINTS and _no_histograms(value)
    ):
        return encode(value, *rest)
    return await blocking.in_thread(encode, value, *rest)


def _no_histograms(value: "Scalar | Vector") -> bool:
    return isinstance(value, Scalar) or value.histograms is None


def _answer(data) -> Response:
    return Response(200, orjson.dumps({"status": "success", "data": data}))


def _seconds_ms(text: str, name: str, what: str) -> int | None:
    """Epoch or duration seconds (fractions allowed) as milliseconds; None when ``text`` is not
    a number; bad_data for a number that is not finite or not of a sane size (NaN, 1e300)."""
    try:
        seconds = float(text)
    except ValueError:
        return None
    if not (math.isfinite(seconds) and abs(seconds) < 1e13):
        raise PromQLError(f'invalid parameter "{name}": cannot parse "{text}" to a valid {what}', "bad_data")
    return round(seconds * 1000)


def parse_time(text: str, name: str) -> int:
    """Epoch seconds (fractions allowed) or RFC 3339, as Prometheus takes them; milliseconds."""
    found = _seconds_ms(text, name, "timestamp")
    if found is None:
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
            found = round(moment.replace(tzinfo=moment.tzinfo or UTC).timestamp() * 1000)
        except (ValueError, OverflowError):
            raise PromQLError(
                f'invalid parameter "{name}": cannot parse "{text}" to a valid timestamp', "bad_data"
            ) from None
    return found


def _time_range(request) -> tuple[int | None, int | None]:
    """The optional ``start`` and ``end`` of the metadata and exemplar endpoints (None where left out)."""
    start = parse_time(arg(request, "start"), "start") if arg(request, "start") else None  # type: ignore[arg-type]  # checked just before
    end = parse_time(arg(request, "end"), "end") if arg(request, "end") else None  # type: ignore[arg-type]  # checked just before
    if start is not None and end is not None and end < start:
        raise PromQLError('invalid parameter "end": end timestamp must not be before start time', "bad_data")
    return start, end


def _status_range(request) -> tuple[int, int]:
    """The range /api/v1/status/tsdb counts: ``start``/``end``, or the UTC day ``date``
    (YYYY-MM-DD), or the last 24 hours (up to ``end`` where given)."""
    if date := arg(request, "date"):
        if arg(request, "start") or arg(request, "end"):
            raise PromQLError('invalid parameter "date": give either date or start/end', "bad_data")
        try:
            day = datetime.strptime(date, "%Y-%m-%d").replace(tzinfo=UTC)
        except ValueError:
            raise PromQLError(f'invalid parameter "date": cannot parse "{date}" as YYYY-MM-DD', "bad_data") from None
        start = round(day.timestamp() * 1000)
        return start, start + DAY_MS - 1
    start, end = _time_range(request)  # type: ignore[assignment]  # start and end are None where left out
    end = int(time.time() * 1000) if end is None else end
    return (end - DAY_MS if start is None else start), end


def parse_step(text: str, name: str) -> int:
    """Seconds (fractions allowed) or a Prometheus duration (``15s``, ``1m30s``); milliseconds."""
    found = _seconds_ms(text, name, "duration")
    if found is None:
        try:
            found = round(parser_call(promql_parser.parse_duration, text).total_seconds() * 1000)
        except (ValueError, TypeError, OverflowError):
            raise PromQLError(
                f'invalid parameter "{name}": cannot parse "{text}" to a valid duration', "bad_data"
            ) from None
    return found


def prometheus_errors(handler):
    """Prometheus's error envelope for whatever the handler raises (gateway/http/errors.py maps
    it), a bug (500, logged) included: Grafana reads ``error`` from it whatever the status."""

    async def call(request, *rest):
        try:
            return await handler(request, *rest)
        except Exception as error:
            return error_response(error, request, prometheus=True)

    return call


class PromQLAPI:
    def __init__(self, service: PromQLService):
        self.service = service

    def register(self, router: Router) -> None:
        both = ("GET", "POST")
        router.add("/api/v1/query", both, "promql_query", prometheus_errors(self.query), role="query")
        router.add("/api/v1/query_range", both, "promql_query_range", prometheus_errors(self.query_range), role="query")
        router.add("/api/v1/series", both, "promql_series", prometheus_errors(self.series), role="query")
        router.add(
            "/api/v1/labels",
            both,
            "promql_labels",
            prometheus_errors(self.labels),
            role="query",
            in_process=prometheus_errors(self.labels_in_process),
        )
        router.add_prefix(
            "/api/v1/label/",
            ("GET",),
            "promql_label_values",
            prometheus_errors(self.label_values),
            role="query",
            in_process=prometheus_errors(self.label_values_in_process),
        )
        router.add("/api/v1/status/buildinfo", ("GET",), "promql_buildinfo", self.buildinfo, role="query")
        router.add(
            "/api/v1/status/tsdb", ("GET",), "promql_tsdb_status", prometheus_errors(self.tsdb_status), role="query"
        )
        router.add("/api/v1/query_exemplars", both, "promql_exemplars", prometheus_errors(self.exemplars), role="query")

    # -- queries ------------------------------------------------------------------------------

    async def query(self, request) -> Response:
        text = _required(request, "query")
        at_ms = parse_time(arg(request, "time"), "time") if arg(request, "time") else int(time.time() * 1000)  # type: ignore[arg-type]  # checked just before
        times = np.array([at_ms], dtype=np.int64)
        value, warnings = await self._evaluate(request, text, self.service.query(at_ms, at_ms, 0), times)
        return Response(200, await _encoded(_encode_instant, value, at_ms, warnings))

    async def query_range(self, request) -> Response:
        text = _required(request, "query")
        start = parse_time(_required(request, "start"), "start")
        end = parse_time(_required(request, "end"), "end")
        step = parse_step(_required(request, "step"), "step")
        if end < start:
            raise PromQLError('invalid parameter "end": end timestamp must not be before start time', "bad_data")
        if step <= 0:
            raise PromQLError(
                'invalid parameter "step": zero or negative query resolution step widths are not accepted. Try a positive integer',
                "bad_data",
            )
        if (end - start) / step > MAX_POINTS_PER_SERIES:
            raise PromQLError(
                "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query resolution (?step=XX)",
                "bad_data",
            )
        times = np.arange(start, end + 1, step, dtype=np.int64)
        value, warnings = await self._evaluate(request, text, self.service.query(start, end, step), times)
        if isinstance(value, RangeVector):
            raise PromQLError(
                'invalid expression type "range vector" for range query, must be Scalar or instant Vector', "bad_data"
            )
        if isinstance(value, String):
            raise PromQLError(
                'invalid expression type "string" for range query, must be Scalar or instant Vector', "bad_data"
            )
        return Response(200, await _encoded(_encode_matrix, value, times, warnings))

    async def _evaluate(self, request, text: str, query: Query, times: np.ndarray):
        """The value of the query, and the warnings its answer must carry."""
        timeout_ms = parse_step(arg(request, "timeout"), "timeout") if arg(request, "timeout") else None  # type: ignore[arg-type]  # checked just before
        return await self.service.evaluate(request_tenant(request), text, query, times, timeout_ms)

    # -- metadata -----------------------------------------------------------------------------

    async def series(self, request) -> Response:
        selectors = args(request, "match[]")
        if not selectors:
            raise PromQLError("no match[] parameter provided", "bad_data")
        found = await self.service.matched(request_tenant(request), selectors, *_time_range(request))
        return _answer(found[: _limit(request)])

    async def labels(self, request, most_rows: int | None = None) -> Response | None:
        """The label names; with ``most_rows``, None for what the serving process leaves to an
        executor (PromQLService.label_names)."""
        names = await self.service.label_names(
            request_tenant(request), args(request, "match[]"), *_time_range(request), most_rows
        )
        return None if names is None else _answer(names[: _limit(request)])

    async def labels_in_process(self, request) -> Response | None:
        """/api/v1/labels in the serving process, for a GET that lists the tenant's label names
        in at most IN_PROCESS_LISTING_ROWS index rows; None for the rest (an executor answers)."""
        return await self.labels(request, IN_PROCESS_LISTING_ROWS) if request.method == b"GET" else None

    async def label_values(self, request, rest: str, most_rows: int | None = None) -> Response | None:
        """Values of a label: its name as written, or escaped as Prometheus 3 does in a path
        (``U__k8s_2e_pod_2e_name`` for ``k8s.pod.name``); ``most_rows`` as ``labels``'."""
        escaped, _, tail = rest.rpartition("/")
        if tail != "values" or not escaped:
            raise HTTPError(404, f"no such endpoint: /api/v1/label/{rest}")
        name = unescape_name(escaped)
        if not name:
            raise PromQLError('invalid label name: ""', "bad_data")
        values = await self.service.label_values(
            request_tenant(request), name, args(request, "match[]"), *_time_range(request), most_rows
        )
        return None if values is None else _answer(values[: _limit(request)])

    async def label_values_in_process(self, request, rest: str) -> Response | None:
        """/api/v1/label/<name>/values in the serving process, as ``labels_in_process``."""
        return await self.label_values(request, rest, IN_PROCESS_LISTING_ROWS)

    async def buildinfo(self, request) -> Response:
        """A Prometheus version Grafana accepts; ``revision`` says it is tsgate."""
        return _answer(
            {
                "version": "2.42.0",
                "revision": f"tsgate-{__version__}",
                "branch": "",
                "buildUser": "",
                "buildDate": "",
                "goVersion": "",
                "features": {},
            }
        )

    async def tsdb_status(self, request) -> Response:
        """The tenant's cardinality (gateway/query/cardinality.py) over ``start``..``end``, the UTC
        day ``date`` (VictoriaMetrics's parameter) or, by default, the last 24 hours; the ``limit``
        (or ``topN``) largest of each list, 10 by default."""
        start, end = _status_range(request)
        limit_text = arg(request, "limit") or arg(request, "topN") or str(STATUS_TOP_DEFAULT)
        if not limit_text.isdigit() or not 0 < int(limit_text) <= STATUS_TOP_MAX:
            raise PromQLError(
                f'invalid parameter "limit": {limit_text!r} is not a whole number from 1 to {STATUS_TOP_MAX}',
                "bad_data",
            )
        found = await tenant_cardinality(self.service.planner, request_tenant(request), start, end, int(limit_text))
        return Response(200, _envelope(found.data, found.warnings))

    async def exemplars(self, request) -> Response:
        """Prometheus's exemplar query: the exemplars of every series the query's selectors select,
        in [start, end] (the service's defaults and bounds when left out)."""
        text = _required(request, "query")
        found = await self.service.exemplars(request_tenant(request), text, *_time_range(request))
        return _answer(
            [
                {
                    "seriesLabels": labels,
                    "exemplars": [
                        {"labels": row.labels, "value": format_value(row.value), "timestamp": row.timestamp_ms / 1000}
                        for row in rows
                    ],
                }
                for labels, rows in found
            ]
        )


def _required(request, name: str) -> str:
    value = arg(request, name)
    if not value:
        raise PromQLError(f'invalid parameter "{name}": missing', "bad_data")
    return value


def _limit(request) -> int | None:
    text = arg(request, "limit")
    if not text:
        return None
    try:
        limit = int(text)
    except ValueError:
        raise PromQLError(f'invalid parameter "limit": cannot parse "{text}" to a valid limit', "bad_data") from None
    return limit if limit > 0 else None


def _points(times: np.ndarray, values: np.ndarray) -> list:
    return [[t / 1000, format_value(v)] for t, v in zip(times.tolist(), values.tolist())]


def _histogram_points(times: np.ndarray, histograms: np.ndarray) -> list:
    return [[t / 1000, h.json(format_value)] for t, h in zip(times.tolist(), histograms.tolist())]


INFO_PREFIX = "PromQL info:"


def _envelope(data, annotations: list[str]) -> bytes:
    """The success document; the annotations go to ``infos`` (Prometheus 3's "PromQL info: ..."
    ones) and ``warnings`` (the others), as Prometheus 3's API sorts them."""
    document = {"status": "success", "data": data}
    warnings = [text for text in annotations if not text.startswith(INFO_PREFIX)]
    infos = [text for text in annotations if text.startswith(INFO_PREFIX)]
    if warnings:
        document["warnings"] = warnings
    if infos:
        document["infos"] = infos
    return orjson.dumps(document)


def _series(
    labels: dict, times: np.ndarray, values: np.ndarray, present: np.ndarray, histograms: np.ndarray | None
) -> dict | None:
    """A matrix series as Prometheus 2.42 writes one: ``values`` (floats) and ``histograms``,
    each only when there are some; None for a series with neither."""
    series: dict[str, Any] = {"metric": labels}
    if present.any():
        series["values"] = _points(times[present], values[present])
    if histograms is not None:
        holds = np.not_equal(histograms, None)  # type: ignore[call-overload]  # numpy's stubs: None in an object array
        if holds.any():
            series["histograms"] = _histogram_points(times[holds], histograms[holds])
    return series if len(series) > 1 else None


def _encode_matrix(value, times: np.ndarray, warnings: list[str]) -> bytes:
    if isinstance(value, Scalar):
        result = [{"metric": {}, "values": _points(times, value.values)}]
    else:
        rows = sorted(range(len(value.labels)), key=lambda i: sorted(value.labels[i].items()))
        found = (
            _series(
                value.labels[i],
                times,
                value.values[i],
                value.present[i],
                None if value.histograms is None else value.histograms[i],
            )
            for i in rows
        )
        result = [series for series in found if series is not None]
    return _envelope({"resultType": "matrix", "result": result}, warnings)


def _encode_instant(value, at_ms: int, warnings: list[str]) -> bytes:
    at = at_ms / 1000
    if isinstance(value, Scalar):
        data = {"resultType": "scalar", "result": [at, format_value(value.values[0])]}
    elif isinstance(value, String):
        data = {"resultType": "string", "result": [at, value.value]}
    elif isinstance(value, RangeVector):
        result = []
        histograms = {tuple(sorted(s.labels.items())): s for s in value.histogram_series}
        floats = {tuple(sorted(s.labels.items())): s for s in value.series}
        for key in sorted(floats.keys() | histograms.keys()):
            series = {"metric": (floats.get(key) or histograms.get(key)).labels}  # type: ignore[union-attr]  # the key is in one of them
            if key in floats:
                lo, hi = value.windows(floats[key])
                if hi[0] > lo[0]:
                    series["values"] = _points(floats[key].timestamps[lo[0] : hi[0]], floats[key].values[lo[0] : hi[0]])
            if key in histograms:
                lo, hi = value.windows(histograms[key])
                if hi[0] > lo[0]:
                    series["histograms"] = _histogram_points(
                        histograms[key].timestamps[lo[0] : hi[0]], histograms[key].values[lo[0] : hi[0]]
                    )
            if len(series) > 1:
                result.append(series)
        data = {"resultType": "matrix", "result": result}
    else:
        holds = value.histogram_present[:, 0]
        result = []
        for row, (labels, values, present) in enumerate(zip(value.labels, value.values, value.present)):
            if present[0]:
                result.append({"metric": labels, "value": [at, format_value(values[0])]})
            elif holds[row]:
                result.append({"metric": labels, "histogram": [at, value.histograms[row, 0].json(format_value)]})
        data = {"resultType": "vector", "result": result}
    return _envelope(data, warnings)
