"""Operational endpoints: the gateway's own metrics and a health check (``/``, the version banner
and the web page, is gateway/http/webui.py)."""

import os

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.http.server import Response, Router, json_response
from gateway.store import Store, StoreUnavailable


class OpsAPI:
    def __init__(self, store: Store):
        self.store = store

    def register(self, router: Router) -> None:
        router.add("/metrics", ("GET",), "metrics", self.metrics, access="admin")
        router.add("/healthz", ("GET",), "healthz", self.healthz, access="public")

    async def metrics(self, request):
        return Response(200, generate_latest(metrics_registry()), CONTENT_TYPE_LATEST)

    async def healthz(self, request):
        """200 when the store answers a trivial query, 503 otherwise."""
        try:
            await self.store.ping()
        except Exception as error:
            raise StoreUnavailable(f"store health check failed: {error}") from error
        return json_response(200, {"status": "ok"})


def metrics_registry():
    """This process's registry, or under ``--workers N`` (PROMETHEUS_MULTIPROC_DIR set by the
    supervisor) a fresh one reading every worker's files, so any worker answers for all.

    The multiprocess view has no process_* or python_* metrics: they describe one process.
    """
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        return REGISTRY
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    return registry
