"""Graphite's HTTP API as Grafana's Graphite data source uses it: render, find, expand, index,
tags, functions, version.

Parameters come from the query string or a form body (Grafana POSTs /metrics/find and /render
with ``application/x-www-form-urlencoded``). Shapes follow graphite-web 1.1.
"""

import contextlib
import datetime
import json
import time
import zoneinfo

from gateway.core import blocking
from gateway.core.overrides import PerTenant, per_tenant
from gateway.http.server import HTTPError, Response, Router, arg, args, json_response, request_tenant, require_arg
from gateway.ingest.pipeline import IngestPipeline
from gateway.query.graphite import graph, tagdb
from gateway.query.graphite.evaluator import RenderContext, RenderError, evaluate_target
from gateway.query.graphite.fetcher import StoreFetcher, consolidations
from gateway.query.graphite.finder import Finder
from gateway.query.graphite.functions import function_catalog
from gateway.query.graphite.storage_schemas import StorageSchemas
from gateway.query.planner import PointsBudget, QueryPlanner
from protocols.graphite import InvalidInput, render_formats
from protocols.graphite.attime import parse_at_time
from protocols.graphite.tags import parse_path
from protocols.linear_regex import BadPattern

DEFAULT_AUTOCOMPLETE_LIMIT = 100
TAGS_PROTOCOL = "graphite_tags"  # the protocol label of tagSeries in the ingest metrics
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
        return datetime.UTC
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a name too long for a file
        raise HTTPError(400, f"unknown time zone {name!r}", field="tz") from None


def _jsonp_callback(request) -> str | None:
    """The ``jsonp`` parameter, which must be a JavaScript identifier path (400 otherwise):
    graphite-web echoes any text, which lets a link inject script or headers."""
    callback = arg(request, "jsonp")
    if callback and not render_formats.is_jsonp_callback(callback):
        raise HTTPError(400, f"jsonp {callback[:80]!r} is not a JavaScript name such as cb or ns.cb", field="jsonp")
    return callback or None


def _jsonp(request, document) -> Response:
    """graphite-web wraps any JSON answer in ``callback(...)`` when ``jsonp`` is given."""
    callback = _jsonp_callback(request)
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


@contextlib.contextmanager
def _bad_expressions():
    """A tag expression that does not parse is the client's: a 400 naming it."""
    try:
        yield
    except tagdb.BadTagExpression as error:
        raise HTTPError(400, str(error), field="expr") from None


MAX_REPORTED_REJECTS = 10


class GraphiteAPI:
    """The handlers decode parameters, call the Graphite services (Finder for the path tree,
    TagDB for tags, the evaluator for render, the ingest pipeline for tagSeries) and encode.
    ``pipeline`` is None in a query executor, which serves no ingest route."""

    def __init__(
        self,
        pipeline: IngestPipeline | None,
        planner: QueryPlanner,
        finder: Finder,
        tags: tagdb.TagDB,
        schemas: StorageSchemas,
        max_points: int | PerTenant,
        graphs: graph.GraphPool | graph.DrawHere,
        *,
        max_targets: int,
        max_query_length: int,
        max_depth: int,
        max_terms: int,
    ):
        self.graphs = graphs
        self.pipeline = pipeline
        self.max_points = per_tenant("max-points-per-query", max_points)
        self.max_targets = max_targets
        self.max_query_length = max_query_length
        self.max_depth = max_depth
        self.max_terms = max_terms
        self.schemas = schemas
        self.planner = planner
        self.finder = finder
        self.tags = tags

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

    def _targets(self, request) -> list[str]:
        """The render targets, at most --render-max-targets of at most --query-max-length each
        (5000 targets in one request stalled the gateway 8.4 s)."""
        targets = args(request, "target")
        if len(targets) > self.max_targets:
            raise HTTPError(
                400, f"{len(targets)} targets, over --render-max-targets {self.max_targets}", field="target"
            )
        for target in targets:
            if len(target) > self.max_query_length:
                raise HTTPError(
                    400,
                    f"target {target[:100]!r}... has {len(target)} characters, over --query-max-length {self.max_query_length}",
                    field="target",
                )
        return targets

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
        form = arg(request, "format") or "png"  # graphite-web's default: a graph
        if form not in ("json", "csv", "raw", "pickle", "msgpack", *graph.CONTENT_TYPES) or (
            form == "msgpack" and not render_formats.MSGPACK_AVAILABLE
        ):
            raise HTTPError(
                400, f"format {form!r} is not supported: use png, svg, json, csv, raw or pickle", field="format"
            )
        graph_options = None
        if form in graph.CONTENT_TYPES:
            graph_options = graph.parse_graph_options(form, lambda name: arg(request, name), tz)
        max_points = _max_data_points(request)
        try:
            x_files_factor = float(arg(request, "xFilesFactor") or 0)
        except ValueError:
            raise HTTPError(400, "xFilesFactor must be a number", field="xFilesFactor") from None
        budget = PointsBudget(self.max_points(tenant), self.max_points.setting(tenant))
        context = RenderContext(
            start,
            end,
            now,
            tz=tz,
            x_files_factor=x_files_factor,
            max_data_points=max_points,
            budget=budget,
            offload=blocking.in_thread,
            max_depth=self.max_depth,
            max_terms=self.max_terms,
        )
        targets = self._targets(request)
        consolidation = {
            path: func
            for target in targets
            for path, func in consolidations(target, self.max_depth, self.max_terms).items()
        }
        fetcher = StoreFetcher(
            tenant, self.finder, self.planner, self.schemas, self.planner.max_series(tenant), consolidation, budget
        )
        series_list = []
        for target in targets:
            try:
                series_list.extend(await evaluate_target(target, context, fetcher))
            except (RenderError, BadPattern) as error:
                raise HTTPError(400, f"target {target!r}: {error}", field="target") from None
        if graph_options is not None:
            return Response(200, await self._draw(graph_options, series_list), graph.CONTENT_TYPES[form])
        # Encoding a large answer takes a while (a day of 100 series at 10 s is 17 MB of JSON): in a thread.
        if form == "json":
            no_nulls = arg(request, "noNullPoints", "false").lower() in ("1", "true")
            callback = _jsonp_callback(request)
            body = await blocking.in_thread(_consolidated_json, series_list, max_points, no_nulls, callback)
            return Response(200, body, render_formats.CONTENT_TYPES["jsonp" if callback else "json"])
        encode = {
            "csv": render_formats.encode_csv,
            "raw": render_formats.encode_raw,
            "pickle": render_formats.encode_pickle,
            "msgpack": render_formats.encode_msgpack,
        }[form]
        body = await (
            blocking.in_thread(encode, series_list, tz) if form == "csv" else blocking.in_thread(encode, series_list)
        )
        return Response(200, body, render_formats.CONTENT_TYPES[form])

    async def _draw(self, options: graph.GraphOptions, series_list) -> bytes:
        graph.check_series_colors(series_list)
        return await self.graphs.draw(options, series_list)

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

    async def find(self, request):
        tenant = request_tenant(request)
        query = require_arg(request, "query")
        form = arg(request, "format", "treejson")
        leaves_only = arg(request, "leavesOnly", "0") == "1"
        if form == "completer":
            query = query.replace("..", "*.")
            if not query.endswith("*"):
                query += "*"
        nodes = [n for n in await self.finder.find(tenant, query) if n.is_leaf or not leaves_only]
        base = query.rsplit(".", 1)[0] + "." if "." in query else ""
        if form == "treejson":
            return _jsonp(request, _tree_json(nodes, base, arg(request, "wildcards", "0") == "1"))
        if form == "completer":
            metrics = [
                {
                    "path": n.path + ("" if n.is_leaf else "."),
                    "name": n.path.rsplit(".", 1)[-1],
                    "is_leaf": str(int(n.is_leaf)),
                }
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
            results[query] = sorted(
                {n.path for n in await self.finder.find(tenant, query) if n.is_leaf or not leaves_only}
            )
        if arg(request, "groupByExpr", "0") == "1":
            return _jsonp(request, {"results": results})
        return _jsonp(request, {"results": sorted(set().union(*results.values()))})

    async def index(self, request):
        """Every leaf path of the tenant (walks the whole tree: an operator's tool, as in Graphite)."""
        return _jsonp(request, await self.finder.all_leaves(request_tenant(request)))

    async def find_series(self, request):
        tenant = request_tenant(request)
        expressions = _expressions(request)
        if not expressions:
            raise HTTPError(400, "no tag expressions specified", field="expr")
        with _bad_expressions():
            found = await self.tags.find_series(tenant, expressions)
        return _jsonp(request, [tagdb.graphite_path(s) for s in found])

    async def tag_list(self, request):
        keys = await self.tags.tag_keys(request_tenant(request), _filter(request))
        return _jsonp(request, [{"tag": key} for key in keys[: _limit(request) if arg(request, "limit") else None]])

    async def tag_details(self, request, tag: str):
        limit = _limit(request) if arg(request, "limit") else None
        counted = await self.tags.value_counts(request_tenant(request), tag, _filter(request), limit)
        return _jsonp(request, {"tag": tag, "values": [{"value": value, "count": count} for value, count in counted]})

    async def autocomplete_tags(self, request):
        tenant = request_tenant(request)
        with _bad_expressions():
            keys = await self.tags.autocomplete_tags(
                tenant, _expressions(request), arg(request, "tagPrefix") or "", _limit(request)
            )
        return _jsonp(request, keys)

    async def autocomplete_values(self, request):
        tenant = request_tenant(request)
        tag = require_arg(request, "tag")
        with _bad_expressions():
            values = await self.tags.autocomplete_values(
                tenant, tag, _expressions(request), arg(request, "valuePrefix") or "", _limit(request)
            )
        return _jsonp(request, values)

    async def _register(self, tenant: str, paths: list[str]) -> list[str]:
        """Index series without data (Graphite's tagSeries) through the ingest pipeline, as a
        first sample would be; their canonical paths. A 400 names the rejected paths (the good
        ones beside them are registered)."""
        assert self.pipeline is not None  # an ingest route: see the class docstring
        series, positions, rejects = [], [], []
        for index, path in enumerate(paths):
            try:
                name, tags = parse_path(path)
            except InvalidInput as error:
                rejects.append((index, f"{path!r}: {error.detail}"))
                continue
            series.append((tenant, name, tags))
            positions.append(index)
        self.pipeline.count_rejected(TAGS_PROTOCOL, "bad_path", len(rejects))
        accepted, rejected = await self.pipeline.register_series(TAGS_PROTOCOL, series)
        rejects += [(positions[r.index], f"{paths[positions[r.index]]!r}: {r.field}: {r.problem}") for r in rejected]
        if rejects:
            listed = "; ".join(problem for _, problem in sorted(rejects)[:MAX_REPORTED_REJECTS])
            raise HTTPError(
                400,
                f"{len(rejects)} of {len(paths)} paths rejected: {listed}; the others were registered",
                field="path",
            )
        return [tagdb.graphite_path(key) for key in accepted]

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
