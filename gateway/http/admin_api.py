"""Admin endpoints (docs/operations.rst). Those that change stored data: Prometheus's
``/api/v1/admin/tsdb/delete_series`` and ``/admin/graphite/delete`` for Graphite paths and globs,
served only with ``--enable-admin-api`` (as Prometheus's ``--web.enable-admin-api``): without it
they answer as Prometheus does, 503 "admin APIs disabled". With ``--auth-file`` every admin
endpoint needs the admin role; the tenant is the request's, as everywhere.

A delete selects its series in a query executor (``--query-executors``), under the deadline,
queue and fairness of queries, so a selector over every series of a tenant costs the serving
process nothing; the serving process then deletes them. One delete at a time per tenant in a
gateway process: a second one while the first runs gets 429 (with Retry-After).

``GET /api/v1/admin/overrides`` shows every tenant's values (--overrides); it changes nothing,
so it is served without ``--enable-admin-api``.
"""

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from gateway.core.errors import LimitExceeded
from gateway.core.model import SeriesKey
from gateway.core.overrides import Overrides
from gateway.http.promql_api import parse_time, prometheus_errors
from gateway.http.server import HTTPError, Response, Router, arg, args, json_response, request_tenant
from gateway.ingest.deletes import Deleter
from gateway.query.promql.values import PromQLError
from gateway.query.selection import SeriesSelection
from protocols.graphite.attime import parse_at_time

if TYPE_CHECKING:  # the pool is built above this layer, by the service
    from gateway.app.executors import QueryExecutors

DISABLED = "admin APIs disabled; start the gateway with --enable-admin-api"


class DeleteUnderWay(LimitExceeded):
    """A second delete of a tenant while its first one runs."""

    status = 429
    error_type = "unavailable"
    retry_after_s = 1


class AdminAPI:
    """``executors``: the pool deletes select their series in; without one (a gateway without
    the query role), the selection runs here."""

    def __init__(
        self,
        deleter: Deleter,
        selection: SeriesSelection,
        executors: "QueryExecutors | None",
        enabled: bool,
        overrides: Overrides,
    ):
        self.deleter = deleter
        self.selection = selection
        self.executors = executors
        self.enabled = enabled
        self.overrides = overrides
        self.deleting: set[str] = set()  # tenants with a delete under way

    def register(self, router: Router) -> None:
        router.add(
            "/api/v1/admin/tsdb/delete_series",
            ("POST", "PUT"),
            "admin_delete_series",
            prometheus_errors(self.delete_series),
            access="admin",
        )
        router.add("/admin/graphite/delete", ("POST",), "admin_graphite_delete", self.graphite_delete, access="admin")
        router.add("/api/v1/admin/overrides", ("GET",), "admin_overrides", self.show_overrides, access="admin")

    def _range(self, request) -> tuple[int, int]:
        start, end = arg(request, "start"), arg(request, "end")
        start_ms = parse_time(start, "start") if start else None
        end_ms = parse_time(end, "end") if end else None
        if start_ms is not None and end_ms is not None and end_ms < start_ms:
            raise PromQLError('invalid parameter "end": end timestamp must not be before start time', "bad_data")
        return self.deleter.bounds(start_ms, end_ms)

    def _graphite_range(self, request) -> tuple[int, int]:
        """``from``/``until`` as /render takes them (``-7d``, ``now``, epoch seconds, ``HH:MM_YYYYMMDD``),
        to the second, inclusive."""
        now = int(time.time())
        try:
            start = arg(request, "from")
            end = arg(request, "until")
            start_ms = parse_at_time(start, now) * 1000 if start else None
            end_ms = parse_at_time(end, now) * 1000 + 999 if end else None
        except ValueError as error:
            raise HTTPError(400, f"from/until: {error}") from None
        if start_ms is not None and end_ms is not None and end_ms < start_ms:
            raise HTTPError(400, "from must not be after until")
        return self.deleter.bounds(start_ms, end_ms)

    async def show_overrides(self, request) -> Response:
        """The flags' values, each tenant of the overrides file with its effective values, and
        which keys the file sets for it (Prometheus's envelope)."""
        return json_response(200, {"status": "success", "data": self.overrides.shown()})

    async def delete_series(self, request) -> Response:
        """Prometheus's parameters (match[], start, end: epoch seconds or RFC 3339) and answers: 204."""
        if not self.enabled:
            raise PromQLError(DISABLED, "unavailable")
        selectors = args(request, "match[]")
        if not selectors:
            raise PromQLError("no match[] parameter provided", "bad_data")
        start, end = self._range(request)
        await self._one_at_a_time(
            request, "prometheus", selectors, lambda series: self.deleter.delete(series, start, end)
        )
        return Response(204, b"")

    async def graphite_delete(self, request) -> Response:
        """``path`` (repeatable: paths or globs), ``from``/``until`` (Graphite times);
        200 with the paths deleted and how many of them left the index."""
        if not self.enabled:
            raise HTTPError(403, DISABLED)
        patterns = args(request, "path")
        if not patterns:
            raise HTTPError(400, "parameter 'path' is required (a Graphite path or glob)", field="path")
        start, end = self._graphite_range(request)
        series: list[SeriesKey] = []

        async def delete(selected: list[SeriesKey]) -> int:
            series.extend(selected)
            return await self.deleter.delete(selected, start, end)

        removed = await self._one_at_a_time(request, "graphite", patterns, delete)
        return json_response(200, {"paths": [key.metric_name for key in series], "removed": removed})

    async def _one_at_a_time(
        self, request, kind: str, patterns: list[str], delete: Callable[[list[SeriesKey]], Awaitable[int]]
    ) -> int:
        """Select the series (in an executor when there are executors), then ``delete`` them;
        429 while another delete of the same tenant is under way."""
        tenant = request_tenant(request)
        if tenant in self.deleting:
            raise DeleteUnderWay(f"a delete of tenant {tenant!r} is already under way; retry once it is done")
        self.deleting.add(tenant)
        try:
            if self.executors is not None:
                series = await self.executors.select_series(request, kind, tenant, patterns)
            else:
                series = await self.selection.select(kind, tenant, patterns)
            return await delete(series)
        finally:
            self.deleting.discard(tenant)
