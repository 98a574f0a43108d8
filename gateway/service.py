"""The running gateway: builds the store, pipeline, planner and HTTP site, and stops them cleanly.

Shutdown order (SIGTERM or SIGINT): stop accepting connections, wait for accepted writes to
reach the store, close the store, exit 0.
"""

import logging
import re

from twisted.internet import defer, reactor

from gateway import __version__
from gateway.config import Config
from gateway.http.native_api import NativeAPI
from gateway.http.ops import OpsAPI
from gateway.http.prometheus_api import PrometheusAPI
from gateway.limits import TenantLimits
from gateway.http.server import Router, Site
from gateway.ingest import IngestPipeline
from gateway.metadata_cache import RedisSeenSeries, SeenSeries
from gateway.query import QueryPlanner
from gateway.store import open_store

log = logging.getLogger(__name__)


class Gateway:
    def __init__(self, config: Config):
        self.config = config
        self.store = open_store(config.store_url, config.slot_width, config.raw_retention)
        self.shared_seen = RedisSeenSeries(config.redis, config.redis_key_ttl) if config.redis else None
        self.pipeline = IngestPipeline(
            self.store, config.limits, SeenSeries(config.metadata_cache_size), config.max_inflight_samples, self.shared_seen
        )
        self.planner = QueryPlanner(self.store, config.max_series_per_query)
        router = Router()
        NativeAPI(self.store, self.pipeline, self.planner).register(router)
        PrometheusAPI(
            self.store,
            self.pipeline,
            self.planner,
            TenantLimits(config.tenant_max_samples_per_second),
            config.max_decompressed_bytes,
            config.max_samples_per_query,
        ).register(router)
        OpsAPI(self.store).register(router)
        self.site = Site(router, config.max_body_bytes)
        self.ports = []

    async def start(self) -> None:
        await self.store.start()
        if self.shared_seen is not None:
            self.shared_seen.start()
        host, port = self.config.http
        self.ports.append(reactor.listenTCP(port, self.site, interface=host))
        log.info(
            "tsgate %s: HTTP on %s:%d, store %s, redis %s",
            __version__, host, port, redact(self.config.store_url), redact(self.config.redis) or "none (in-memory cache only)",
        )

    async def stop(self) -> None:
        log.info("stopping: no new connections, flushing accepted writes")
        await defer.gatherResults([defer.maybeDeferred(port.stopListening) for port in self.ports])
        await self.pipeline.drain()
        await self.store.close()
        if self.shared_seen is not None:
            await self.shared_seen.stop()
        log.info("stopped")


def redact(url: str) -> str:
    """A URL fit for a log line: any password replaced by ***."""
    return re.sub(r"(//[^:/@]*:)[^@/]*@", r"\1***@", re.sub(r"(password=)[^&]*", r"\1***", url))


def run(config: Config) -> int:
    """Run until a signal stops the reactor; 0 after a clean stop, 1 if start-up failed."""
    try:
        gateway = Gateway(config)
    except ValueError as error:
        log.error("bad setting: %s", error)
        return 2
    outcome = {"code": 0}

    def started_or_failed():
        deferred = defer.ensureDeferred(gateway.start())

        def failed(failure):
            log.error("could not start: %s", failure.getErrorMessage())
            outcome["code"] = 1
            reactor.stop()

        def stop_on_shutdown(_):
            reactor.addSystemEventTrigger("before", "shutdown", lambda: defer.ensureDeferred(gateway.stop()))

        deferred.addCallbacks(stop_on_shutdown, failed)

    reactor.callWhenRunning(started_or_failed)
    reactor.run()
    return outcome["code"]
