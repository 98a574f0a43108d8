"""The composition root: every component of a tsgate process is built here, and only here.

Each component has one builder that names the components it needs (``@component(name, *needs)``)
and gets them, with the settings, as arguments; ``Components.get`` builds a component once, after
what it needs (as Mimir's ``pkg/mimir/modules.go``: one init per module, a dependency map, role
targets). A command asks for its target (TARGETS) and takes the components it uses from there:
``tsgate serve`` (gateway.app.service), a query executor (gateway.app.executor_process),
``tsgate delete``, ``tsgate import whisper`` and ``tsgate downsample --once`` (gateway.app.cli);
tests ask for the one they exercise. A component a role leaves out is None (no query executors
without the query role, no Redis parts without ``--redis``).
"""

import os
import re
import socket
from collections.abc import Callable

from gateway.app.config import Config
from gateway.app.executors import QueryExecutors
from gateway.core.connections import Connections
from gateway.core.overrides import Overrides
from gateway.downsample.pending import PendingMarks, RedisPartitionLock, RedisPending, StorePending, redis_namespace
from gateway.downsample.processor import Downsampler
from gateway.http.admin_api import AdminAPI
from gateway.http.auth import Credentials
from gateway.http.graphite_api import GraphiteAPI
from gateway.http.native_api import NativeAPI
from gateway.http.ops import OpsAPI
from gateway.http.otlp_api import OTLPAPI
from gateway.http.prometheus_api import PrometheusAPI
from gateway.http.promql_api import PromQLAPI
from gateway.http.server import BodyDeadline, Router, Site, UnsentAnswers
from gateway.http.webui import WebUI
from gateway.ingest.carbon import GraphiteIngest, PickleFactory, PlaintextDatagramProtocol, PlaintextFactory
from gateway.ingest.created import CreatedTimestamps
from gateway.ingest.deletes import Deleter
from gateway.ingest.limits import TenantLimits
from gateway.ingest.metadata_cache import KnownSeries, RedisSeenSeries
from gateway.ingest.pipeline import IngestPipeline
from gateway.ingest.push import Writer
from gateway.query.graphite.finder import Finder
from gateway.query.graphite.graph import DrawHere, GraphPool
from gateway.query.graphite.storage_schemas import StorageSchemas
from gateway.query.graphite.tagdb import TagDB
from gateway.query.planner import QueryPlanner
from gateway.query.promql.engine import QueryText
from gateway.query.promql.service import PromQLService
from gateway.query.remote_read import RemoteRead
from gateway.query.selection import SeriesSelection
from gateway.store import open_store
from protocols import otlp
from protocols.prometheus import WriteLimits

# The share of --shutdown-timeout that the writes in flight may take to reach the store, and as
# much again for the carbon backlog: the bound on each follows the store's measured rate.
FLUSH_SHARE = 0.3

BUILDERS: dict[str, tuple[Callable, tuple[str, ...]]] = {}

# What each role target asks for (the components they need come with them).
TARGETS: dict[str, tuple[str, ...]] = {
    "serve": ("listeners", "downsample", "executors", "overrides"),
    "query-executor": ("executor_router", "selection", "overrides"),
    "delete": ("selection", "deleter"),
    "import": ("store",),
    "downsample-once": ("downsample",),
}


def component(name: str, *needs: str):
    """Register the builder of component ``name``: called with the settings and ``needs``, in order."""

    def register(builder: Callable) -> Callable:
        BUILDERS[name] = (builder, needs)
        return builder

    return register


class Components:
    """The components of one process, each built on first ask. ``given`` are components built
    elsewhere: a query executor's overrides (its gateway's, not the file's), a test's store."""

    def __init__(self, config: Config, given: dict[str, object] | None = None):
        self.config = config
        self.built: dict[str, object] = dict(given or {})

    def get(self, name: str):
        if name not in self.built:
            builder, needs = BUILDERS[name]
            self.built[name] = builder(self.config, *(self.get(need) for need in needs))
        return self.built[name]

    def target(self, name: str) -> "Components":
        """Build every component of a role target (a bad setting raises here, before anything starts)."""
        for wanted in TARGETS[name]:
            self.get(wanted)
        return self

    async def start_store(self) -> None:
        """Connect the store, then prefix the Redis keys with its identity (redis_namespace). A store
        that cannot start raises StoreStartError naming the setting to look at."""
        store, config = self.get("store"), self.config
        try:
            await store.start()
        except OSError as error:  # e.g. ``Not a directory: tsgate-data/x`` without ``[Errno 20]``
            reason = f"{error.strerror}: {error.filename}" if error.strerror and error.filename else str(error)
            raise StoreStartError(f"{store_setting(config)}: {reason}") from error
        except Exception as error:
            raise StoreStartError(f"{store_setting(config)}: {error}") from error
        if config.redis:
            namespace = redis_namespace(await store.identity())
            pending, shared_seen = self.built.get("pending"), self.built.get("shared_seen")
            if pending is not None:
                pending.use_namespace(namespace)
            if shared_seen is not None:
                shared_seen.namespace = namespace


class StoreStartError(Exception):
    """The store could not start; the message says why and which setting names it."""


def store_setting(config: Config) -> str:
    """The flag that chose the store, with its value: ``--store URL`` or ``--data-dir DIR``."""
    return f"--store {redact(config.store_url)}" if config.store else f"--data-dir {config.data_dir}"


def redact(url: str) -> str:
    """A URL fit for a log line: any password replaced by ***."""
    return re.sub(r"(//[^:/@]*:)[^@/]*@", r"\1***@", re.sub(r"(password=)[^&]*", r"\1***", url))


@component("overrides")
def _overrides(config: Config) -> Overrides:
    """The flags' values and the overrides file's (OverridesError if it is refused)."""
    overrides = Overrides(config)
    overrides.load()
    return overrides


@component("store", "overrides")
def _store(config: Config, overrides: Overrides):
    """The store, writing, sweeping and deleting each tenant with its own retentions."""
    store = open_store(config.store_url, config.layout)
    store.retentions = overrides.retentions
    return store


@component("shared_seen")
def _shared_seen(config: Config) -> RedisSeenSeries | None:
    return RedisSeenSeries(config.redis, config.redis_key_ttl) if config.redis else None


@component("known_series")
def _known_series(config: Config) -> KnownSeries:
    return KnownSeries(config.metadata_cache_size)


@component("pending", "store")
def _pending(config: Config, store):
    """Which series-slots wait for the downsampler: in Redis with ``--redis``, else in the store."""
    fallback = StorePending(store, config.slot_width, config.downsample_delay)
    if not config.redis:
        return fallback
    return RedisPending(config.redis, fallback, config.slot_width, config.downsample_delay)


@component("marks", "pending")
def _marks(config: Config, pending) -> PendingMarks:
    return PendingMarks(pending, config.downsample_partitions_count)


@component("pipeline", "store", "overrides", "known_series", "shared_seen", "marks")
def _pipeline(config: Config, store, overrides: Overrides, known, shared_seen, marks) -> IngestPipeline:
    return IngestPipeline(
        store,
        config.limits,
        known,
        config.max_inflight_samples,
        shared_seen,
        pending=marks,
        tenant_limits=TenantLimits(
            overrides.limit("tenant-max-samples-per-second"), overrides.limit("tenant-max-active-series")
        ),
        max_metadata_length=config.max_metadata_length,
        flush_within_s=config.shutdown_timeout / 1000 * FLUSH_SHARE,
    )


@component("planner", "store", "overrides")
def _planner(config: Config, store, overrides: Overrides) -> QueryPlanner:
    """The one planner: each tenant's --max-series-per-query."""
    return QueryPlanner(store, overrides.limit("max-series-per-query"), max_future_ms=config.max_future)


@component("remote_read", "store", "planner", "overrides")
def _remote_read(config: Config, store, planner: QueryPlanner, overrides: Overrides) -> RemoteRead:
    return RemoteRead(store, planner, overrides.limit("max-samples-per-query"))


@component("created", "store", "pipeline", "planner")
def _created(config: Config, store, pipeline: IngestPipeline, planner: QueryPlanner) -> CreatedTimestamps:
    return CreatedTimestamps(store, pipeline, planner.path, config.created_timestamp_zero_ingestion)


@component("writer", "pipeline", "created")
def _writer(config: Config, pipeline: IngestPipeline, created: CreatedTimestamps) -> Writer:
    """The one write entry point (push) of the HTTP write APIs."""
    return Writer(pipeline, created)


@component("selection", "store", "planner")
def _selection(config: Config, store, planner: QueryPlanner) -> SeriesSelection:
    return SeriesSelection(store, planner)


@component("deleter", "store", "marks", "known_series", "shared_seen")
def _deleter(config: Config, store, marks, known, shared_seen) -> Deleter:
    return Deleter(store, marks, config.max_future, known, shared_seen)


@component("downsample", "store", "pending")
def _downsample(config: Config, store, pending) -> "DownsampleRole":
    return DownsampleRole(config, store, pending)


@component("executors", "overrides")
def _executors(config: Config, overrides: Overrides) -> QueryExecutors | None:
    """The query executor processes, with the query role and ``--query-executors`` above 0."""
    count = config.query_executor_count if "query" in config.role_set else 0
    return QueryExecutors(config, count, overrides) if count else None


@component("credentials")
def _credentials(config: Config) -> Credentials | None:
    return Credentials.from_file(config.auth_file, config.auth_max_failures) if config.auth_file else None


@component("graphs")
def _graphs(config: Config) -> GraphPool:
    return GraphPool()


@component("connections")
def _connections(config: Config) -> Connections:
    return Connections(config.connection_limit)


@component(
    "router",
    "store",
    "planner",
    "pipeline",
    "writer",
    "remote_read",
    "graphs",
    "overrides",
    "executors",
    "credentials",
    "deleter",
    "selection",
)
def _router(
    config: Config,
    store,
    planner,
    pipeline,
    writer,
    remote_read,
    graphs,
    overrides,
    executors,
    credentials,
    deleter,
    selection,
) -> Router:
    """The gateway's routes: its query routes go to ``executors`` where it has them."""
    router = Router(config.role_set, credentials, executors, UnsentAnswers(config.http_max_unsent_bytes))
    add_routes(config, router, store, planner, pipeline, writer, remote_read, graphs, overrides)
    AdminAPI(deleter, selection, executors, config.enable_admin_api, overrides).register(router)
    return router


@component("executor_router", "store", "planner", "remote_read", "overrides")
def _executor_router(config: Config, store, planner, remote_read, overrides) -> Router:
    """A query executor's routes: the query routes alone, drawing graphs in the executor itself."""
    router = Router({"query"})
    add_routes(config, router, store, planner, None, None, remote_read, DrawHere(), overrides)
    return router


def add_routes(
    config: Config,
    router: Router,
    store,
    planner: QueryPlanner,
    pipeline: IngestPipeline | None,
    writer: Writer | None,
    remote_read: RemoteRead,
    graphs: GraphPool | DrawHere,
    overrides: Overrides,
) -> None:
    """Every API on ``router`` (which keeps the routes of its roles). The query limits are each
    tenant's (``overrides``). ``pipeline`` and ``writer`` are None in a query executor: it has
    no ingest routes."""
    max_points = overrides.limit("max-points-per-query")
    NativeAPI(writer, planner, max_points).register(router)
    PrometheusAPI(
        writer,
        remote_read,
        config.max_decompressed_bytes,
        config.max_native_histogram_buckets,
        WriteLimits(
            config.remote_write_max_samples, config.remote_write_max_exemplars, config.remote_write_max_metadata
        ),
    ).register(router)
    if writer is not None:  # OTLP has ingest routes only
        OTLPAPI(
            writer,
            overrides,
            otlp.Settings(
                config.otlp_translation_strategy,
                frozenset(config.otlp_promote_resource_attributes),
                config.otlp_promote_scope_metadata,
                config.otlp_keep_identifying_attributes,
                config.max_native_histogram_buckets,
                config.query_lookback_delta,
            ),
            otlp.DeltaToCumulative() if config.otlp_convert_delta else None,
            config.max_decompressed_bytes,
            config.remote_write_max_samples,
        ).register(router)
    PromQLAPI(
        PromQLService(
            store,
            planner,
            overrides.limit("query-max-samples"),
            config.query_lookback_delta,
            config.query_timeout,
            QueryText(config.query_max_length, config.query_max_terms, config.query_max_depth),
            config.promql_delayed_name_removal,
        )
    ).register(router)
    GraphiteAPI(
        pipeline,
        planner,
        Finder(store),
        TagDB(store, planner),
        StorageSchemas.from_file(config.graphite_storage_schemas),
        max_points,
        graphs,
        max_targets=config.render_max_targets,
        max_query_length=config.query_max_length,
        max_depth=config.query_max_depth,
        max_terms=config.query_max_terms,
    ).register(router)
    OpsAPI(store, executors=router.executors).register(router)
    WebUI(config, store, pipeline).register(router)


@component("site", "router", "connections")
def _site(config: Config, router: Router, connections: Connections) -> Site:
    return Site(
        router,
        config.max_body_bytes,
        connections,
        seconds(config.http_idle_timeout),
        BodyDeadline(seconds(config.http_body_timeout), config.http_body_min_rate),
        seconds(config.http_write_timeout),
    )


@component("graphite_ingest", "pipeline")
def _graphite_ingest(config: Config, pipeline: IngestPipeline) -> GraphiteIngest:
    return GraphiteIngest(pipeline, max_pending=config.graphite_max_pending)


@component("listeners", "site", "graphite_ingest", "connections")
def _listeners(config: Config, site: Site, graphite: GraphiteIngest, connections: Connections) -> dict:
    """What each listener of ``Config.listeners`` serves, by listener name."""
    carbon_idle_s = seconds(config.carbon_idle_timeout)
    tenant, max_line = config.graphite_tenant, config.graphite_max_line_length
    return {
        "http": site,
        "graphite": PlaintextFactory(graphite, tenant, max_line, connections, carbon_idle_s),
        "graphite-udp": PlaintextDatagramProtocol(graphite, tenant, max_line),
        "pickle": PickleFactory(graphite, tenant, config.pickle_max_frame_bytes, connections, carbon_idle_s),
    }


class DownsampleRole:
    """What the downsample role needs beside the store: the pending tracker, the downsampler and
    the partition lock (``serve --roles downsample`` and ``tsgate downsample --once``)."""

    def __init__(self, config: Config, store, pending):
        self.partitions = config.owned_partitions
        self.pending = pending
        self.downsampler = Downsampler(
            store, self.pending, config.layout, tuple(filter(None, config.counter_suffixes.split(",")))
        )
        self.partition_lock = partition_lock(config, self.pending)

    async def run_once(self) -> int:
        """One round over this replica's partitions; the number of series-slots rolled up."""
        return await self.downsampler.run_once(self.partitions, self.partition_lock)

    async def waiting(self) -> int:
        """Series-slots of this replica's partitions still pending: not settled yet, or failed."""
        return sum([await self.pending.waiting(partition) for partition in self.partitions])


def partition_lock(config: Config, pending):
    """Competing consumers through Redis unless partitions are pinned; without Redis, none."""
    if not isinstance(pending, RedisPending) or config.downsample_partitions:
        return None
    lease = max(60_000, 6 * config.downsample_interval)
    return RedisPartitionLock(pending, f"{socket.gethostname()}:{os.getpid()}", lease)


def seconds(milliseconds: int) -> float | None:
    """A timeout setting for Twisted: seconds, or None (never) for 0."""
    return milliseconds / 1000 or None
