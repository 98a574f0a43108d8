"""Prometheus's HTTP query API (what Grafana's Prometheus data source calls), answered by the
PromQL engine in gateway/promql over the read path. Envelopes, status codes and error types are
Prometheus's: 400 bad_data, 422 execution, 503 timeout/unavailable. docs/promql.rst has the
details and the deliberate differences."""

import math
import time
from datetime import UTC, datetime

import numpy as np
import orjson
import promql_parser
from twisted.internet import defer, threads

from gateway import __version__
from gateway.http.prometheus_api import READ_BATCH, prometheus_labels
from gateway.http.server import HTTPError, Response, Router, arg, args, request_tenant
from gateway.promql.engine import Evaluator, Query, format_value, parse, plan, selector_matchers
from gateway.promql.values import PromQLError, RangeVector, Scalar, Series, String
from gateway.query import QueryPlanner, QueryTooLarge
from gateway.read_path import clamp_range
from gateway.store import Store, StoreUnavailable
from protocols import prometheus
from protocols.linear_regex import BadPattern
from protocols.prometheus.native_histogram import decode_sample

MAX_POINTS_PER_SERIES = 11_000
_ERROR_STATUS = {"bad_data": 400, "execution": 422, "timeout": 503, "unavailable": 503}


def _answer(data) -> Response:
    return Response(200, orjson.dumps({"status": "success", "data": data}))


def _error(kind: str, message: str) -> Response:
    return Response(_ERROR_STATUS[kind], orjson.dumps({"status": "error", "errorType": kind, "error": message}))


def _seconds_ms(text: str) -> int | None:
    """Epoch or duration seconds (fractions allowed) as milliseconds; None when ``text`` is not
    a finite number of a sane size."""
    try:
        seconds = float(text)
    except ValueError:
        return None
    return round(seconds * 1000) if math.isfinite(seconds) and abs(seconds) < 1e13 else None


def parse_time(text: str, name: str) -> int:
    """Epoch seconds (fractions allowed) or RFC 3339, as Prometheus takes them; milliseconds."""
    found = _seconds_ms(text)
    if found is None:
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
            found = round(moment.replace(tzinfo=moment.tzinfo or UTC).timestamp() * 1000)
        except (ValueError, OverflowError):
            raise PromQLError(
                f'invalid parameter "{name}": cannot parse "{text}" to a valid timestamp', "bad_data"
            ) from None
    return found


def parse_step(text: str, name: str) -> int:
    """Seconds (fractions allowed) or a Prometheus duration (``15s``, ``1m30s``); milliseconds."""
    found = _seconds_ms(text)
    if found is None:
        try:
            found = round(promql_parser.parse_duration(text).total_seconds() * 1000)
        except (ValueError, TypeError, OverflowError):
            raise PromQLError(
                f'invalid parameter "{name}": cannot parse "{text}" to a valid duration', "bad_data"
            ) from None
    return found


class PromQLAPI:
    def __init__(
        self,
        store: Store,
        planner: QueryPlanner,
        max_samples: int,
        lookback_ms: int,
        timeout_ms: int,
        max_future_ms: int,
    ):
        self.store = store
        self.max_future_ms = max_future_ms
        self.planner = planner
        self.max_samples = max_samples
        self.lookback_ms = lookback_ms
        self.timeout_ms = timeout_ms

    def register(self, router: Router) -> None:
        both = ("GET", "POST")
        router.add("/api/v1/query", both, "promql_query", self._guarded(self.query), role="query")
        router.add("/api/v1/query_range", both, "promql_query_range", self._guarded(self.query_range), role="query")
        router.add("/api/v1/series", both, "promql_series", self._guarded(self.series), role="query")
        router.add("/api/v1/labels", both, "promql_labels", self._guarded(self.labels), role="query")
        router.add_prefix(
            "/api/v1/label/", ("GET",), "promql_label_values", self._guarded(self.label_values), role="query"
        )
        router.add("/api/v1/status/buildinfo", ("GET",), "promql_buildinfo", self.buildinfo, role="query")
        router.add("/api/v1/query_exemplars", both, "promql_exemplars", self._guarded(self.exemplars), role="query")

    @staticmethod
    def _guarded(handler):
        """Prometheus's error envelope for what the engine, the planner and the store raise."""

        async def call(request, *rest):
            try:
                return await handler(request, *rest)
            except PromQLError as error:
                return _error(error.kind, str(error))
            except QueryTooLarge as error:
                return _error("execution", str(error))
            except BadPattern as error:
                return _error("bad_data", str(error))
            except HTTPError as error:
                if error.status in (401, 403):
                    raise
                return _error("bad_data", error.message)
            except StoreUnavailable as error:
                return _error("unavailable", f"the store cannot answer now: {error}")

        return call

    # -- queries ------------------------------------------------------------------------------

    async def query(self, request) -> Response:
        text = _required(request, "query")
        at_ms = parse_time(arg(request, "time"), "time") if arg(request, "time") else int(time.time() * 1000)
        times = np.array([at_ms], dtype=np.int64)
        value, warnings = await self._evaluate(request, text, Query(at_ms, at_ms, 0, self.lookback_ms), times)
        return Response(200, await threads.deferToThread(_encode_instant, value, at_ms, warnings))

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
        value, warnings = await self._evaluate(request, text, Query(start, end, step, self.lookback_ms), times)
        if isinstance(value, RangeVector):
            raise PromQLError(
                'invalid expression type "range vector" for range query, must be Scalar or instant Vector', "bad_data"
            )
        if isinstance(value, String):
            raise PromQLError(
                'invalid expression type "string" for range query, must be Scalar or instant Vector', "bad_data"
            )
        return Response(200, await threads.deferToThread(_encode_matrix, value, times, warnings))

    async def _evaluate(self, request, text: str, query: Query, times: np.ndarray):
        """The value of the query, and the warnings its answer must carry."""
        tenant = request_tenant(request)
        timeout_ms = parse_step(arg(request, "timeout"), "timeout") if arg(request, "timeout") else self.timeout_ms
        deadline = time.monotonic() + min(timeout_ms, self.timeout_ms) / 1000
        expr = await threads.deferToThread(parse, text)
        needs = plan(expr, query)
        selected = {
            key: await self.planner.select_by_matchers(tenant, matchers, prometheus_labels)
            for key, (matchers, _, _) in needs.items()
        }
        data, histograms = await defer.gatherResults(
            [
                defer.ensureDeferred(self._fetch(selected, needs, deadline)),
                defer.ensureDeferred(self._fetch_histograms(tenant, selected, needs, deadline)),
            ],
            consumeErrors=True,
        ).addErrback(lambda failure: failure.value.subFailure.raiseException())
        evaluator = Evaluator(query, data, deadline, histograms)
        value = await threads.deferToThread(evaluator.result, expr, times)
        return value, self._rollup_warnings(needs) + evaluator.warnings

    def _rollup_warnings(self, needs: dict) -> list[str]:
        """Say so when samples before the raw retention came from roll-ups (docs/promql.rst)."""
        earliest = min((low for _, low, _ in needs.values()), default=None)
        granularity = self.planner.reader.rollup_for(earliest) if earliest is not None else None
        if granularity is None:
            return []
        boundary = datetime.fromtimestamp(
            self.planner.reader.clock() / 1000 - self.store.layout.raw_retention_ms / 1000, UTC
        )
        return [
            f"samples before {boundary:%Y-%m-%dT%H:%M:%SZ} (past --raw-retention) are {granularity.name} roll-ups:"
            " one point per bucket, the average for gauges, the last value for counters"
        ]

    async def _fetch(self, selected: dict, needs: dict, deadline: float) -> dict[tuple, list[Series]]:
        """The samples of every selector's ``selected`` series, through the read path."""
        data, samples = {}, 0
        for key, (_, low, high) in needs.items():
            keys = selected[key]
            found = []
            for start in range(0, len(keys), READ_BATCH):
                if time.monotonic() > deadline:
                    raise PromQLError("query timed out in query execution", "timeout")
                part = keys[start : start + READ_BATCH]
                for series, read in zip(part, await self.planner.reader.read(part, low, high)):
                    samples += len(read.samples)
                    if samples > self.max_samples:
                        raise PromQLError(
                            "query processing would load too many samples into memory in query execution"
                            f" (--query-max-samples {self.max_samples})"
                        )
                    if len(read.samples):
                        labels = prometheus_labels(series.metric_name, series.tags)
                        found.append(Series(labels, read.samples.timestamps, read.samples.values))
            data[key] = found
        return data

    async def _fetch_histograms(
        self, tenant: str, selected: dict, needs: dict, deadline: float
    ) -> dict[tuple, list[Series]]:
        """The native histograms of every selector's ``selected`` series (raw samples only: the
        read path's roll-ups hold floats), as series of Histogram objects (None: stale); each
        histogram counts as one sample against --query-max-samples."""
        found: dict[tuple, list[Series]] = {}
        samples = 0
        for key, (_, low, high) in needs.items():
            keys = selected[key]
            start_ms, end_ms = clamp_range(low, high)
            for begin in range(0, len(keys), READ_BATCH):
                if time.monotonic() > deadline:
                    raise PromQLError("query timed out in query execution", "timeout")
                part = keys[begin : begin + READ_BATCH]
                rows = await self.planner.reader.read_histograms(
                    tenant, [k.series_set_hash for k in part], start_ms, end_ms
                )
                samples += sum(len(r) for r in rows)
                if samples > self.max_samples:
                    raise PromQLError(
                        "query processing would load too many samples into memory in query execution"
                        f" (--query-max-samples {self.max_samples})"
                    )
                if not any(rows):
                    continue
                for series, decoded in zip(part, await threads.deferToThread(_decoded_histograms, rows)):
                    if decoded is not None:
                        found.setdefault(key, []).append(
                            Series(prometheus_labels(series.metric_name, series.tags), *decoded)
                        )
        return found

    # -- metadata -----------------------------------------------------------------------------

    async def _matched(self, request) -> list[dict] | None:
        """Label sets of the series the ``match[]`` selectors select (None without match[])."""
        selectors = args(request, "match[]")
        if not selectors:
            return None
        tenant = request_tenant(request)
        found: dict[tuple, dict] = {}
        for text in selectors:
            expr = await threads.deferToThread(parse, text)
            if type(expr).__name__ != "VectorSelector":
                raise PromQLError(f'invalid parameter "match[]": {text!r} is not a series selector', "bad_data")
            for key in await self.planner.select_by_matchers(tenant, selector_matchers(expr), prometheus_labels):
                labels = prometheus_labels(key.metric_name, key.tags)
                found[tuple(sorted(labels.items()))] = labels
        return [found[key] for key in sorted(found)]

    async def series(self, request) -> Response:
        matched = await self._matched(request)
        if matched is None:
            raise PromQLError("no match[] parameter provided", "bad_data")
        return _answer(matched[: _limit(request)])

    async def labels(self, request) -> Response:
        matched = await self._matched(request)
        if matched is None:
            keys = await self.store.list_tenant_tag_keys(request_tenant(request))
            names = {"__name__", *(prometheus.sanitize_label_name(k) for k in keys)}
        else:
            names = {name for labels in matched for name in labels}
        return _answer(sorted(names)[: _limit(request)])

    async def label_values(self, request, rest: str) -> Response:
        name, _, tail = rest.partition("/")
        if tail != "values":
            raise HTTPError(404, f"no such endpoint: /api/v1/label/{rest}")
        matched = await self._matched(request)
        if matched is not None:
            values = {labels[name] for labels in matched if name in labels}
        elif name == "__name__":
            values = {
                prometheus.prometheus_metric_name(n)
                for n in await self.store.list_metric_names(request_tenant(request))
            }
        else:
            values = set(await self.store.list_tenant_tag_values(request_tenant(request), name))
        return _answer(sorted(values)[: _limit(request)])

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

    async def exemplars(self, request) -> Response:
        """Prometheus's exemplar query: the exemplars of every series the query's selectors select,
        in [start, end] (default: the exemplar retention up to now; a range is cut to what can be
        stored, from the retention's start to ``--max-future`` ahead)."""
        text = _required(request, "query")
        tenant = request_tenant(request)
        now = int(time.time() * 1000)
        oldest, newest = now - self.store.layout.exemplar_retention_ms, now + self.max_future_ms
        start = parse_time(arg(request, "start"), "start") if arg(request, "start") else oldest
        end = parse_time(arg(request, "end"), "end") if arg(request, "end") else now
        if end < start:
            raise PromQLError('invalid parameter "end": end timestamp must not be before start time', "bad_data")
        start, end = max(start, oldest), min(end, newest)
        expr = await threads.deferToThread(parse, text)
        selected = {}
        for matchers, _, _ in plan(expr, Query(start, end, 0, self.lookback_ms)).values():
            for key in await self.planner.select_by_matchers(tenant, matchers, prometheus_labels):
                selected[key.series_set_hash] = key
        keys = list(selected.values())
        result = []
        for begin in range(0, len(keys), READ_BATCH):
            part = keys[begin : begin + READ_BATCH]
            found = await self.store.read_exemplars(tenant, [key.series_set_hash for key in part], start, end)
            result += [
                {
                    "seriesLabels": prometheus_labels(key.metric_name, key.tags),
                    "exemplars": [
                        {"labels": row.labels, "value": format_value(row.value), "timestamp": row.timestamp_ms / 1000}
                        for row in rows
                    ],
                }
                for key, rows in zip(part, found)
                if rows
            ]
        return _answer(sorted(result, key=lambda item: sorted(item["seriesLabels"].items())))


def _decoded_histograms(rows_by_series) -> list:
    """(timestamps, object array of Histogram or None for a stale marker) of each series' stored
    histograms; None for a series without."""
    decoded = []
    for rows in rows_by_series:
        if not rows:
            decoded.append(None)
            continue
        samples = np.full(len(rows), None, dtype=object)
        samples[:] = [decode_sample(row.data) for row in rows]
        decoded.append((np.array([row.timestamp_ms for row in rows], dtype=np.int64), samples))
    return decoded


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


def _envelope(data, warnings: list[str]) -> bytes:
    document = {"status": "success", "data": data}
    if warnings:
        document["warnings"] = warnings
    return orjson.dumps(document)


def _series(
    labels: dict, times: np.ndarray, values: np.ndarray, present: np.ndarray, histograms: np.ndarray | None
) -> dict | None:
    """A matrix series as Prometheus 2.42 writes one: ``values`` (floats) and ``histograms``,
    each only when there are some; None for a series with neither."""
    series = {"metric": labels}
    if present.any():
        series["values"] = _points(times[present], values[present])
    if histograms is not None:
        holds = np.not_equal(histograms, None)
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
            series = {"metric": (floats.get(key) or histograms.get(key)).labels}
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
