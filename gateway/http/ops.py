"""Operational endpoints: the gateway's own metrics, a health check and a version banner."""

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from gateway import __version__
from gateway.http.server import Response, Router, json_response
from gateway.store import Store, StoreUnavailable


class OpsAPI:
    def __init__(self, store: Store):
        self.store = store

    def register(self, router: Router) -> None:
        router.add("/", ("GET",), "root", self.root)
        router.add("/metrics", ("GET",), "metrics", self.metrics)
        router.add("/healthz", ("GET",), "healthz", self.healthz)

    async def root(self, request):
        return json_response(200, {"name": "tsgate", "version": __version__})

    async def metrics(self, request):
        return Response(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)

    async def healthz(self, request):
        """200 when the store answers a trivial query, 503 otherwise."""
        try:
            await self.store.ping()
        except Exception as error:
            raise StoreUnavailable(f"store health check failed: {error}") from error
        return json_response(200, {"status": "ok"})
