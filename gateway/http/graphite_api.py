"""Graphite's HTTP API as Grafana's Graphite data source uses it: render, find, expand, index,
tags, functions, version.

Parameters come from the query string or a form body (Grafana POSTs /metrics/find and /render
with ``application/x-www-form-urlencoded``). Shapes follow graphite-web 1.1.
"""

import datetime
import json
import logging
import time
import zoneinfo

from twisted.internet import threads

from gateway.graphite import tagdb
from gateway.graphite.evaluator import RenderContext, RenderError, evaluate_target
from gateway.graphite.fetcher import StoreFetcher, consolidations
from gateway.graphite.finder import Finder, TooManyNodes
from gateway.graphite.functions import function_catalog
from gateway.graphite.storage_schemas import StorageSchemas
from gateway.http.server import HTTPError, Response, Router, arg, args, json_response, request_tenant, require_arg
from gateway.model import NAME_TAG, InvalidSample, Limits, Sample, SeriesKey, now_ms, series_set_hash, series_set_text, validate_sample
from gateway.query import PointsBudget, QueryPlanner
from gateway.store import Store
from protocols.graphite import InvalidInput, render_formats
from protocols.graphite.attime import parse_at_time
from protocols.graphite.tags import parse_path
from protocols.linear_regex import BadPattern

log = logging.getLogger(__name__)

DEFAULT_AUTOCOMPLETE_LIMIT = 100
GRAPHITE_API_VERSION = "1.1.8"


def _int_arg(request, name: str) -> int | None:
    raw = arg(request, name)
    if raw in (None, ""):
        return None
    try:
        return int(float(raw))
    except (ValueError, OverflowError):  # also inf and nan
        raise HTTPError(400, f"{name} {raw[:40]!r} is not a finite number", field=name) from None


def _max_data_points(request) -> int | None:
    """None or 0: no limit (graphite-web ignores 0 too)."""
    max_points = _int_arg(request, "maxDataPoints")
    if max_points is not None and max_points < 0:
        raise HTTPError(400, f"maxDataPoints {max_points} is negative", field="maxDataPoints")
    return max_points


def _timezone(name: str | None):
    if not name:
        return datetime.timezone.utc
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise HTTPError(400, f"unknown time zone {name!r}", field="tz") from None


def _jsonp(request, document) -> Response:
    """graphite-web wraps any JSON answer in ``callback(...)`` when ``jsonp`` is given."""
    callback = arg(request, "jsonp")
    if not callback:
        return json_response(200, document)
    body = f"{callback}({json.dumps(document)})".encode()
    return Response(200, body, "text/javascript")


def _limit(request) -> int:
    raw = arg(request, "limit")
    if raw in (None, ""):
        return DEFAULT_AUTOCOMPLETE_LIMIT
    try:
        return max(0, int(raw))
    except ValueError:
        raise HTTPError(400, f"limit {raw!r} is not an integer", field="limit") from None


def _filter(request):
    """The ``filter`` regex of /tags, anchored at the start as Graphite's tag regexes are."""
    pattern = arg(request, "filter")
    if not pattern:
        return None
    try:
        return tagdb.parse_expression(f"x=~{pattern}")
    except tagdb.BadTagExpression as error:
        raise HTTPError(400, f"filter: {error}", field="filter") from None


def _expressions(request) -> list[str]:
    return args(request, "expr") or args(request, "expr[]")


class GraphiteAPI:
    def __init__(self, store: Store, planner: QueryPlanner, finder: Finder, limits: Limits, schemas: StorageSchemas, max_points: int):
        self.store = store
        self.max_points = max_points
        self.schemas = schemas
        self.limits = limits
        self.planner = planner
        self.finder = finder

    def register(self, router: Router) -> None:
        both = ("GET", "POST")
        router.add("/metrics/find", both, "graphite_find", self.find, role="query")
        router.add("/metrics/expand", both, "graphite_expand", self.expand, role="query")
        router.add("/metrics/index.json", both, "graphite_index", self.index, role="query")
        router.add("/tags", both, "graphite_tags", self.tag_list, role="query")
        router.add("/tags/findSeries", both, "graphite_tags_find", self.find_series, role="query")
        router.add("/tags/autoComplete/tags", both, "graphite_autocomplete", self.autocomplete_tags, role="query")
        router.add("/tags/autoComplete/values", both, "graphite_autocomplete", self.autocomplete_values, role="query")
        router.add("/tags/tagSeries", ("POST",), "graphite_tag_series", self.tag_series, role="ingest")
        router.add("/tags/tagMultiSeries", ("POST",), "graphite_tag_series", self.tag_multi_series, role="ingest")
        router.add_prefix("/tags/", both, "graphite_tag_details", self.tag_details, role="query")
        router.add("/render", both, "graphite_render", self.render, role="query")
        router.add("/functions", both, "graphite_functions", self.functions, role="query")
        router.add_prefix("/functions/", both, "graphite_functions", self.function, role="query")
        router.add("/version", both, "graphite_version", self.version, role="query")

    async def render(self, request):
        """graphite-web's /render: every target evaluated in one context, then encoded."""
        tenant = request_tenant(request)
        now = int(time.time())
        tz = _timezone(arg(request, "tz"))
        try:
            start = parse_at_time(arg(request, "from") or "-24h", now, tz)
            end = parse_at_time(arg(request, "until") or "now", now, tz)
        except ValueError as error:
            raise HTTPError(400, f"from/until: {error}") from None
        if start >= end:
            raise HTTPError(400, "from must be before until")
        form = arg(request, "format", "json")
        if form not in ("json", "csv", "raw", "pickle", "msgpack") or (form == "msgpack" and not render_formats.MSGPACK_AVAILABLE):
            raise HTTPError(400, f"format {form!r} is not supported: use json, csv, raw or pickle (no images)", field="format")
        max_points = _max_data_points(request)
        try:
            x_files_factor = float(arg(request, "xFilesFactor") or 0)
        except ValueError:
            raise HTTPError(400, "xFilesFactor must be a number", field="xFilesFactor") from None
        budget = PointsBudget(self.max_points)
        context = RenderContext(
            start, end, now, tz=tz, x_files_factor=x_files_factor, max_data_points=max_points, budget=budget,
            offload=threads.deferToThread,
        )
        targets = args(request, "target")
        consolidation = {path: func for target in targets for path, func in consolidations(target).items()}
        fetcher = StoreFetcher(tenant, self.finder, self.planner, self.schemas, self.planner.max_series, consolidation, budget)
        series_list = []
        for target in targets:
            try:
                series_list.extend(await evaluate_target(target, context, fetcher))
            except (RenderError, BadPattern) as error:
                raise HTTPError(400, f"target {target!r}: {error}", field="target") from None
        # Encoding a large answer takes a while (a day of 100 series at 10 s is 17 MB of JSON): in a thread.
        if form == "json":
            no_nulls = arg(request, "noNullPoints", "false").lower() in ("1", "true")
            callback = arg(request, "jsonp")
            body = await threads.deferToThread(_consolidated_json, series_list, max_points, no_nulls, callback)
            return Response(200, body, render_formats.CONTENT_TYPES["jsonp" if callback else "json"])
        encode = {"csv": render_formats.encode_csv, "raw": render_formats.encode_raw, "pickle": render_formats.encode_pickle, "msgpack": render_formats.encode_msgpack}[form]
        body = await (threads.deferToThread(encode, series_list, tz) if form == "csv" else threads.deferToThread(encode, series_list))
        return Response(200, body, render_formats.CONTENT_TYPES[form])

    async def functions(self, request):
        grouped = arg(request, "grouped", "false").lower() in ("1", "true")
        catalog = function_catalog(grouped=grouped, group=arg(request, "group"))
        return Response(200, render_formats.encode_functions_json(catalog, pretty=bool(arg(request, "pretty"))))

    async def function(self, request, name: str):
        catalog = function_catalog()
        if name not in catalog:
            raise HTTPError(404, f"function {name!r} not found")
        return Response(200, render_formats.encode_functions_json(catalog[name]))

    async def version(self, request):
        """The graphite-web version whose API this follows; Grafana enables 1.1 features on it."""
        return Response(200, GRAPHITE_API_VERSION.encode(), "text/plain")

    async def _find(self, tenant: str, query: str):
        try:
            return await self.finder.find(tenant, query)
        except TooManyNodes as error:
            raise HTTPError(422, str(error)) from None

    async def find(self, request):
        tenant = request_tenant(request)
        query = require_arg(request, "query")
        form = arg(request, "format", "treejson")
        leaves_only = arg(request, "leavesOnly", "0") == "1"
        if form == "completer":
            query = query.replace("..", "*.")
            if not query.endswith("*"):
                query += "*"
        nodes = [n for n in await self._find(tenant, query) if n.is_leaf or not leaves_only]
        base = query.rsplit(".", 1)[0] + "." if "." in query else ""
        if form == "treejson":
            return _jsonp(request, _tree_json(nodes, base, arg(request, "wildcards", "0") == "1"))
        if form == "completer":
            metrics = [
                {"path": n.path + ("" if n.is_leaf else "."), "name": n.path.rsplit(".", 1)[-1], "is_leaf": str(int(n.is_leaf))}
                for n in nodes
            ]
            return _jsonp(request, {"metrics": metrics})
        if form == "json":
            return _jsonp(request, [{"path": n.path, "is_leaf": n.is_leaf} for n in nodes])
        if form == "nodelist":
            position = _int_arg(request, "position")
            position = -1 if position is None else position
            try:
                return _jsonp(request, {"nodes": sorted({n.path.split(".")[position] for n in nodes})})
            except IndexError:
                raise HTTPError(400, f"position {position} is beyond the matched paths", field="position") from None
        raise HTTPError(400, f"format {form!r} is not one of treejson, completer, json, nodelist", field="format")

    async def expand(self, request):
        tenant = request_tenant(request)
        leaves_only = arg(request, "leavesOnly", "0") == "1"
        results = {}
        for query in args(request, "query"):
            results[query] = sorted({n.path for n in await self._find(tenant, query) if n.is_leaf or not leaves_only})
        if arg(request, "groupByExpr", "0") == "1":
            return _jsonp(request, {"results": results})
        return _jsonp(request, {"results": sorted(set().union(*results.values()))})

    async def index(self, request):
        """Every leaf path of the tenant (walks the whole tree: an operator's tool, as in Graphite)."""
        tenant = request_tenant(request)
        leaves, frontier = [], [""]
        while frontier:
            next_frontier = []
            for parent in frontier:
                for child in await self.store.list_path_children(tenant, parent):
                    path = f"{parent}.{child.name}" if parent else child.name
                    if child.is_leaf:
                        leaves.append(path)
                    if child.is_branch:
                        next_frontier.append(path)
            frontier = next_frontier
        return _jsonp(request, sorted(leaves))

    async def _tag_series_paths(self, tenant: str, expressions: list[str]) -> list[SeriesKey]:
        try:
            return await tagdb.find_series(self.planner, tenant, expressions)
        except tagdb.BadTagExpression as error:
            raise HTTPError(400, str(error), field="expr") from None

    async def find_series(self, request):
        tenant = request_tenant(request)
        expressions = _expressions(request)
        if not expressions:
            raise HTTPError(400, "no tag expressions specified", field="expr")
        return _jsonp(request, [tagdb.graphite_path(s) for s in await self._tag_series_paths(tenant, expressions)])

    async def tag_list(self, request):
        tenant = request_tenant(request)
        keys = await self._tag_keys(tenant)
        pattern = _filter(request)
        if pattern:
            keys = [k for k in keys if pattern.matches(k)]
        return _jsonp(request, [{"tag": key} for key in keys[: _limit(request) if arg(request, "limit") else None]])

    async def _tag_keys(self, tenant: str) -> list[str]:
        return sorted({"name", *await self.store.list_tenant_tag_keys(tenant)})

    async def _tag_values(self, tenant: str, tag: str) -> list[str]:
        if tag == "name":
            return await self.store.list_metric_names(tenant)
        return await self.store.list_tenant_tag_values(tenant, tag)

    async def tag_details(self, request, tag: str):
        tenant = request_tenant(request)
        values = await self._tag_values(tenant, tag)
        pattern = _filter(request)
        if pattern:
            values = [v for v in values if pattern.matches(v)]
        counted = []
        for value in values:
            if tag == "name":
                count = len(await self.store.find_series(tenant, value, NAME_TAG, value))
            else:
                count = len(await self._tag_series_paths(tenant, [f"{tag}={value}"]))
            counted.append({"value": value, "count": count})
        return _jsonp(request, {"tag": tag, "values": counted})

    async def autocomplete_tags(self, request):
        tenant = request_tenant(request)
        prefix = arg(request, "tagPrefix") or ""
        limit = _limit(request)
        expressions = _expressions(request)
        if not expressions:
            keys = await self._tag_keys(tenant)
        else:
            try:
                searched = {tagdb.parse_expression(e).name for e in expressions}
            except tagdb.BadTagExpression as error:
                raise HTTPError(400, str(error), field="expr") from None
            keys = set()
            for series in await self._tag_series_paths(tenant, expressions):
                keys.update(tagdb.graphite_labels(series.metric_name, series.tags))
            keys = sorted("name" if k == NAME_TAG else k for k in keys if k not in searched)
        return _jsonp(request, [k for k in keys if k.startswith(prefix)][:limit])

    async def autocomplete_values(self, request):
        tenant = request_tenant(request)
        tag = require_arg(request, "tag")
        prefix = arg(request, "valuePrefix") or ""
        limit = _limit(request)
        expressions = _expressions(request)
        if not expressions:
            values = await self._tag_values(tenant, tag)
        else:
            key = NAME_TAG if tag == "name" else tag
            series = await self._tag_series_paths(tenant, [*expressions, f"{tag}!="])
            values = sorted({tagdb.graphite_labels(s.metric_name, s.tags)[key] for s in series})
        return _jsonp(request, [v for v in values if v.startswith(prefix)][:limit])

    async def _register(self, tenant: str, paths: list[str]) -> list[str]:
        """Index series without data (Graphite's tagSeries), answering their canonical paths."""
        keys, canonical = [], []
        now = now_ms()
        for path in paths:
            try:
                name, tags = parse_path(path)
                validate_sample(Sample(tenant, name, tags, now, 0.0), self.limits, now)
            except InvalidInput as error:
                raise HTTPError(400, f"{path!r}: {error.detail}", field="path") from None
            except InvalidSample as error:
                raise HTTPError(400, f"{path!r}: {error}", field="path") from None
            keys.append(SeriesKey(tenant, series_set_hash(series_set_text(name, tags)), name, tags))
            canonical.append(tagdb.graphite_path(keys[-1]))
        await self.store.write_series(keys)
        return canonical

    async def tag_series(self, request):
        return _jsonp(request, (await self._register(request_tenant(request), [require_arg(request, "path")]))[0])

    async def tag_multi_series(self, request):
        paths = args(request, "path") or args(request, "path[]")
        if not paths:
            raise HTTPError(400, "no path specified", field="path")
        return _jsonp(request, await self._register(request_tenant(request), paths))


def _consolidated_json(series_list, max_points: int | None, no_nulls: bool, callback: str | None) -> bytes:
    """maxDataPoints consolidation and the JSON encoding of a render: CPU-bound, run in a thread."""
    if max_points:
        render_formats.apply_max_data_points(series_list, max_points)
    return render_formats.encode_json(series_list, no_null_points=no_nulls, jsonp=callback)


def _tree_json(nodes, base: str, wildcards: bool) -> list[dict]:
    """graphite-web's treejson: branches first, then leaves, one entry per name."""
    branch = {"allowChildren": 1, "expandable": 1, "leaf": 0}
    leaf = {"allowChildren": 0, "expandable": 0, "leaf": 1}
    results = []
    if wildcards and len(nodes) > 1:
        results.append({"text": "*", "id": base + "*", **(branch if any(not n.is_leaf for n in nodes) else leaf)})
    seen, branches, leaves = set(), [], []
    for node in nodes:
        name = node.path.rsplit(".", 1)[-1]
        if name in seen:
            continue
        seen.add(name)
        entry = {"text": name, "id": base + name, "context": {}}
        if node.is_leaf:
            leaves.append({**entry, **leaf})
        else:
            branches.append({**entry, **branch})
    return results + branches + leaves
