"""The native JSON API (docs/native-api.rst): writes, metadata and queries under /api/."""

from gateway.core import blocking
from gateway.core.cooperative import CHECK_EVERY, Slices, run_steps
from gateway.core.model import InvalidSample, Sample, validate_tenant
from gateway.core.overrides import PerTenant, per_tenant
from gateway.http.server import (
    HTTPError,
    Response,
    Router,
    arg,
    args,
    explicit_tenant,
    json_response,
    read_body,
    request_tenant,
    require_arg,
)
from gateway.ingest.push import Batch, Writer
from gateway.query.planner import PointsBudget, QueryPlanner
from gateway.store.read_path import ROLLUP_AGGREGATES
from protocols import native_json
from protocols.timespec import BadTime, parse_time

MAX_REPORTED_REJECTS = 100


class NativeAPI:
    """``writer`` is None in a query executor, which serves no ingest route."""

    def __init__(self, writer: Writer | None, planner: QueryPlanner, max_points: int | PerTenant):
        self.max_points = per_tenant("max-points-per-query", max_points)
        self.writer = writer
        self.planner = planner

    def register(self, router: Router) -> None:
        router.add("/api/write/single", ("POST",), "write_single", self.write_single, role="ingest")
        router.add("/api/write", ("POST",), "write", self.write_batch, role="ingest")
        router.add("/api/put", ("POST",), "put", self.put, role="ingest")
        router.add("/api/metadata/tenants", ("GET",), "tenants", self.tenants, role="query", access="admin")
        router.add("/api/metadata/metricNames", ("GET",), "metric_names", self.metric_names, role="query")
        router.add("/api/metadata/tagKeys", ("GET",), "tag_keys", self.tag_keys, role="query")
        router.add("/api/metadata/tagValues", ("GET",), "tag_values", self.tag_values, role="query")
        router.add("/api/query", ("GET",), "query", self.query, role="query")

    async def write_single(self, request):
        return await self._write(request, native_json.decode_write_single_steps)

    async def write_batch(self, request):
        return await self._write(request, native_json.decode_write_batch_steps)

    async def put(self, request):
        return await self._write(request, native_json.decode_put_steps)

    async def _write(self, request, decode) -> Response:
        """Write the good items; 200 when all were stored, 400 listing the rejects otherwise.

        A large body (10 MB: seconds of parsing and per-item Python, which a thread would do
        holding the GIL as long) is decoded on the reactor in slices (gateway.core.cooperative)."""
        assert self.writer is not None  # an ingest route: see the class docstring
        request_tenant_ = explicit_tenant(request)
        body = read_body(request)
        decoded, errors = await run_steps(decode(body, self.writer.pipeline.clock()))
        rejects = [{"index": e.index, "field": e.field, "error": e.problem} for e in errors]
        samples, positions = [], []
        slices = Slices()
        for count, (index, item) in enumerate(decoded):
            if not count % CHECK_EVERY:
                await slices.maybe_pause()
            try:
                tenant = self._item_tenant(item.tenant, request_tenant_)
            except InvalidSample as error:
                rejects.append({"index": index, "field": error.field, "error": error.problem})
                continue
            samples.append(Sample(tenant, item.metric_name, item.tags, item.timestamp_ms, item.value))
            positions.append(index)
        self.writer.pipeline.count_rejected("json", "bad_item", len(rejects))
        result = (await self.writer.push("json", Batch(samples))).samples
        for reject in result.rejected:
            rejects.append({"index": positions[reject.index], "field": reject.field, "error": reject.problem})
        if not rejects:
            return json_response(200, {"accepted": result.accepted, "rejected": []})
        rejects.sort(key=lambda r: r["index"])
        return json_response(
            400,
            {
                "error": f"{len(rejects)} of {len(rejects) + result.accepted} samples rejected; "
                + ("the others were written" if result.accepted else "none were written"),
                "accepted": result.accepted,
                "rejectedCount": len(rejects),
                "rejected": rejects[:MAX_REPORTED_REJECTS],
            },
        )

    @staticmethod
    def _item_tenant(item_tenant: str | None, request_tenant_: str | None) -> str:
        if item_tenant is None:
            return request_tenant_ or "default"
        validate_tenant(item_tenant)
        if request_tenant_ is not None and item_tenant != request_tenant_:
            raise InvalidSample(
                "tenant", f"{item_tenant!r} differs from the request's tenant {request_tenant_!r}", "bad_tenant"
            )
        return item_tenant

    async def tenants(self, request):
        return json_response(200, await self.planner.tenants())

    async def metric_names(self, request):
        return json_response(200, await self.planner.metric_names(request_tenant(request)))

    async def tag_keys(self, request):
        tenant = request_tenant(request)
        metric_name = require_arg(request, "metricName")
        return json_response(200, await self.planner.tag_keys(tenant, metric_name))

    async def tag_values(self, request):
        tenant = request_tenant(request)
        metric_name = require_arg(request, "metricName")
        tag_key = require_arg(request, "tagKey")
        return json_response(200, await self.planner.tag_values(tenant, metric_name, tag_key))

    async def query(self, request):
        tenant = request_tenant(request)
        metric_name = require_arg(request, "metricName")
        filters: dict[str, str] = {}
        for pair in args(request, "tag"):
            key, separator, value = pair.partition("=")
            if not separator or not key:
                raise HTTPError(400, f"tag {pair!r} must be written key=value", field="tag")
            if filters.get(key, value) != value:
                return json_response(200, [])
            filters[key] = value
        now = self.planner.now()
        start_ms = self._time(request, "start", "1h-ago", now)
        end_ms = self._time(request, "end", "now", now)
        if start_ms > end_ms:
            raise HTTPError(400, "start is after end", field="start")
        aggregator = arg(request, "aggregator") or None
        if aggregator not in (None, "raw", *ROLLUP_AGGREGATES):
            choices = ", ".join(("raw", *ROLLUP_AGGREGATES))
            raise HTTPError(400, f"aggregator {aggregator!r} is not one of {choices}", field="aggregator")
        granularity = self._granularity(request)
        if granularity is None and aggregator not in (None, "raw") and arg(request, "granularity") != "raw":
            granularity = self.planner.layout.granularities[0]
        if granularity is not None and aggregator == "raw":
            raise HTTPError(400, "aggregator raw reads raw samples, so it takes no granularity", field="aggregator")
        if granularity is None and aggregator not in (None, "raw"):
            raise HTTPError(400, "an aggregator other than raw needs a granularity", field="aggregator")
        raw = aggregator == "raw" or arg(request, "granularity") == "raw"
        results = await self.planner.read_series(
            tenant,
            metric_name,
            filters,
            start_ms,
            end_ms,
            PointsBudget(self.max_points(tenant), self.max_points.setting(tenant)),
            granularity,
            aggregator,
            raw,
        )
        # A JSON document of a million samples takes seconds to build: in a thread, off the reactor.
        return Response(200, await blocking.in_thread(native_json.encode_query_results, results))

    def _granularity(self, request):
        """An explicit ``granularity=5m`` (or ISO ``PT5M``); None for ``raw`` or none given."""
        layout = self.planner.layout
        name = arg(request, "granularity")
        if not name or name == "raw":
            return None
        name = name.lower().removeprefix("pt").removeprefix("p")
        try:
            return layout.granularity(name)
        except KeyError:
            choices = ", ".join(["raw", *(g.name for g in layout.granularities)])
            raise HTTPError(400, f"granularity {name!r} is not one of {choices}", field="granularity") from None

    @staticmethod
    def _time(request, name: str, default: str, now: int) -> int:
        try:
            return parse_time(arg(request, name) or default, now)
        except BadTime as error:
            raise HTTPError(400, str(error), field=name) from None
