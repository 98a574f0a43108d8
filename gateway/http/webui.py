"""The built-in web page at ``/`` (docs/operations.rst): explore series, run a query and graph it,
see what the gateway holds and how it is doing.

The page is static HTML, CSS and vanilla JavaScript shipped in the package (``static/``): no
build step, nothing fetched from elsewhere. Its script calls the same APIs as any client (the
Prometheus API, /render, /metrics/find) with the browser's credential, plus two JSON routes
of its own: ``/ui/session`` (who the credential is, which tenants it may pick) and
``/admin/status`` (a summary of the gateway's own metrics, admin role as /metrics).

``/`` answers the page to browsers (``Accept: text/html``) and the JSON banner
``{"name", "version"}`` to every other client, as before the page existed.
"""

import time
from importlib import resources

from twisted.internet import defer, reactor

from gateway import __version__
from gateway.http.ops import metrics_registry
from gateway.http.server import Response, Router, json_response

STARTED = time.time()
PING_TIMEOUT_S = 2.0
HTML = "text/html; charset=utf-8"
STATIC_TYPES = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
# Defence in depth beside the script's own escaping: no inline script, nothing from elsewhere.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        " connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def _static(name: str) -> bytes:
    return resources.files("gateway.http").joinpath("static", name).read_bytes()


def wants_html(request) -> bool:
    """A browser navigating (its Accept names text/html); API clients send */* or JSON, or nothing."""
    return b"text/html" in (request.getHeader(b"accept") or b"").lower()


class WebUI:
    def __init__(self, config, store, pipeline):
        self.store = store
        self.pipeline = pipeline  # only read by /admin/status, which runs in the gateway process
        self.store_kind = config.store_url.partition(":")[0]
        self.redis = bool(config.redis)
        self.roles = sorted(config.role_set)
        self.page = _static("index.html")
        self.files = {name: _static(name) for name in STATIC_TYPES}

    def register(self, router: Router) -> None:
        router.add("/", ("GET",), "root", self.root, access="any")
        for name, content_type in STATIC_TYPES.items():
            router.add(f"/ui/{name}", ("GET",), "ui_static", self._file(name, content_type), access="public")
        router.add("/ui/session", ("GET",), "ui_session", self.session, access="any")
        router.add("/admin/status", ("GET",), "admin_status", self.status, access="admin")

    async def root(self, request) -> Response:
        if wants_html(request):
            return Response(200, self.page, HTML, PAGE_HEADERS)
        return json_response(200, {"name": "tsgate", "version": __version__})

    def _file(self, name: str, content_type: str):
        async def handler(request) -> Response:
            return Response(200, self.files[name], content_type, PAGE_HEADERS)

        return handler

    async def session(self, request) -> Response:
        """Who the request's credential is and the tenants it may pick: its own with
        ``--auth-file``, else every tenant that wrote (any tenant may be named without credentials)."""
        principal = getattr(request, "principal", None)
        if principal is not None:
            return json_response(
                200,
                {"auth": True, "user": principal.name, "roles": sorted(principal.roles), "tenants": [principal.tenant]},
            )
        tenants = await self.store.list_tenants()
        return json_response(200, {"auth": False, "user": None, "roles": [], "tenants": tenants or ["default"]})

    async def status(self, request) -> Response:
        """The gateway's own metrics summed up for the status view (under ``--workers N``, every
        worker's, as /metrics), with the store's health and the tenants."""
        activity = getattr(self.pipeline, "activity", None)
        if activity is not None:
            activity.prune_if_due()
        found = _samples()
        tenants = await self.store.list_tenants()
        accepted = _by_label(found, "tsgate_tenant_samples_accepted_total", "tenant")
        active = _by_label(found, "tsgate_tenant_active_series", "tenant")
        store_error = await _problem(self.store.ping)
        shared_seen = getattr(self.pipeline, "shared_seen", None)
        redis_error = await _problem(shared_seen.ping) if shared_seen is not None else None
        return json_response(
            200,
            {
                "name": "tsgate",
                "version": __version__,
                "started": STARTED,
                "uptime_seconds": time.time() - STARTED,
                "roles": self.roles,
                "store": {"kind": self.store_kind, "healthy": store_error is None, "error": store_error},
                "redis": {
                    "configured": self.redis,
                    "healthy": self.redis and redis_error is None,
                    "error": redis_error,
                    "errors": _by_label(found, "tsgate_redis_errors_total", "operation"),
                },
                "tenants": [
                    {
                        "tenant": tenant,
                        "active_series": int(active.get(tenant, 0)),
                        "samples_accepted": int(accepted.get(tenant, 0)),
                    }
                    for tenant in sorted(set(tenants) | set(accepted))
                ],
                "samples_accepted": _by_label(found, "tsgate_samples_accepted_total", "protocol"),
                "samples_rejected": [
                    {"protocol": labels["protocol"], "reason": labels["reason"], "count": value}
                    for labels, value in found.get("tsgate_samples_rejected_total", [])
                    if value
                ],
                "downsample": {
                    "lag_seconds": _total(found, "tsgate_downsample_lag_seconds"),
                    "settled_slots": _total(found, "tsgate_downsample_settled_slots"),
                    "slots_near_expiry": _total(found, "tsgate_downsample_slots_near_expiry"),
                    "errors": _total(found, "tsgate_downsample_errors_total"),
                    "series_slots_rolled_up": _total(found, "tsgate_downsampled_series_slots_total"),
                    "pending_marks": _total(found, "tsgate_downsample_pending_marks_total"),
                },
                "store_errors": _by_label(found, "tsgate_store_errors_total", "operation"),
                "ingest_inflight_samples": _total(found, "tsgate_ingest_inflight_samples"),
                "open_connections": _total(found, "tsgate_open_connections"),
            },
        )


async def _problem(ping) -> str | None:
    """None when ``ping()`` (a store's, Redis's) fires within PING_TIMEOUT_S, else why not."""
    answered = defer.maybeDeferred(ping)
    answered.addTimeout(PING_TIMEOUT_S, reactor)
    try:
        await answered
    except defer.TimeoutError:
        return f"no answer within {PING_TIMEOUT_S:g}s"
    except Exception as error:
        return str(error) or type(error).__name__
    return None


def _samples() -> dict[str, list[tuple[dict, float]]]:
    """Every sample of the gateway's metrics by sample name (``_total`` included)."""
    found: dict[str, list[tuple[dict, float]]] = {}
    for family in metrics_registry().collect():
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def _by_label(found: dict, name: str, label: str) -> dict[str, float]:
    """The values of ``name`` summed by one label (0 values left out)."""
    summed: dict[str, float] = {}
    for labels, value in found.get(name, []):
        summed[labels[label]] = summed.get(labels[label], 0) + value
    return {key: value for key, value in summed.items() if value}


def _total(found: dict, name: str) -> float:
    return sum(value for _, value in found.get(name, []))
