"""Every setting of ``tsgate serve`` in one table: command-line flag, config-file key, default.

A config file (``--config FILE``) is TOML whose keys are the flag names without the leading
dashes (``max-body-bytes = 1048576``). Flags given on the command line win over the file, the
file wins over the defaults. docs/configuration.rst lists the same settings.
"""

import argparse
import dataclasses
import os
import resource
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.core.layout import Layout, parse_granularities
from gateway.core.model import InvalidSample, Limits, validate_tenant
from gateway.core.overrides import TENANT_RETENTION, TENANT_ROLLUPS, TenantValue, did_you_mean, tenant_limit
from gateway.downsample.partitions import parse_partitions
from gateway.store.cassandra_options import FLAG_OPTIONS, consistency_flag, replication_flag, with_flag_options
from protocols.otlp.names import STRATEGIES, UNDERSCORE_ESCAPING_WITH_SUFFIXES, Namer
from protocols.timespec import parse_duration

RESERVED_DESCRIPTORS = 128  # open files kept free of client connections (--max-connections auto)


def parse_hostport(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` or ``[v6]:PORT``."""
    host, separator, port = str(text).rpartition(":")
    if not separator or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def _optional_hostport(text) -> tuple[str, int] | None:
    """``HOST:PORT``, or None for a listener that is off (``off`` or empty)."""
    return parse_hostport(text) if str(text).strip() not in ("", "off") else None


def _integer(text) -> int:
    """A whole number, with a message that says so (not Python's ``invalid literal for int()``)."""
    try:
        return int(text)
    except (TypeError, ValueError):
        raise ValueError(f"{text!r} is not a whole number") from None


def _positive(text) -> int:
    value = _integer(text)
    if value <= 0:
        raise ValueError(f"{text!r} must be a positive integer")
    return value


def _auto_or_positive(text) -> int | None:
    """``auto`` (None: decided by a Config property) or a positive number."""
    if str(text).strip() == "auto":
        return None
    try:
        return _positive(text)
    except ValueError:
        raise ValueError(f"{text!r} must be a positive whole number or auto") from None


def _auto_or_non_negative(text) -> int | None:
    """``auto`` (None: decided by a Config property) or a number, 0 included."""
    return None if str(text).strip() == "auto" else _non_negative(text)


def _non_negative(text) -> int:
    value = _integer(text)
    if value < 0:
        raise ValueError(f"{text!r} must be 0 or more")
    return value


def _boolean(text) -> bool:
    """``true``/``false`` (also yes/no, on/off, 1/0); the flag alone means true."""
    value = str(text).strip().lower()
    if value not in ("true", "false", "yes", "no", "on", "off", "1", "0"):
        raise ValueError(f"{text!r} must be true or false")
    return value in ("true", "yes", "on", "1")


def _translation_strategy(text) -> str:
    """One of the OTLP translation strategies (protocols/otlp/names.py); empty: Prometheus 3's default."""
    strategy = str(text).strip() or UNDERSCORE_ESCAPING_WITH_SUFFIXES
    Namer.of(strategy)
    return strategy


def _attribute_names(text) -> tuple[str, ...]:
    """Comma-separated OTLP attribute names (a TOML list too)."""
    names = text if isinstance(text, list) else str(text).split(",")
    return tuple(name.strip() for name in names if str(name).strip())


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    parse: Callable[[Any], Any]
    default: str
    help: str
    per_tenant: TenantValue | None = None  # how an --overrides file gives it per tenant (gateway/core/overrides.py)


SETTINGS = [
    Setting(
        "http",
        _optional_hostport,
        "0.0.0.0:8080",
        "address of the HTTP APIs, /healthz and /metrics; off: none (a process that only takes carbon lines or only downsamples)",
    ),
    Setting("graphite", _optional_hostport, "0.0.0.0:2003", "carbon plaintext TCP listener; off or empty: none"),
    Setting(
        "graphite-udp", _optional_hostport, "", "carbon plaintext UDP listener, e.g. 0.0.0.0:2003; off or empty: none"
    ),
    Setting("pickle", _optional_hostport, "0.0.0.0:2004", "carbon pickle TCP listener; off or empty: none"),
    Setting("graphite-tenant", str, "default", "tenant of everything the Graphite listeners receive"),
    Setting("graphite-max-line-length", _positive, "16384", "longest plaintext line (longer ones are rejected)"),
    Setting(
        "pickle-max-frame-bytes", _positive, str(1 << 20), "largest pickle frame (larger ones are rejected and skipped)"
    ),
    Setting(
        "graphite-storage-schemas",
        lambda text: Path(text) if str(text).strip() else None,
        "",
        "carbon storage-schemas.conf giving each path's render step; none: 60 s",
    ),
    Setting(
        "graphite-max-pending", _positive, "200000", "Graphite samples waiting for the store before TCP reading pauses"
    ),
    Setting("data-dir", Path, "./tsgate-data", "directory of the embedded store"),
    Setting("store", str, "", "store URL; default sqlite:///<data-dir>/tsgate.db"),
    Setting(
        "replication",
        replication_flag,
        "",
        "Cassandra keyspace replication made by 'tsgate schema apply': simple:N, DC:N[,DC:N] or NetworkTopologyStrategy:DC=N[,DC=N]; empty: the store URL's replication option, else simple:1",
    ),
    Setting(
        "write-consistency",
        consistency_flag,
        "",
        "Cassandra consistency level a write must reach before a sample is acknowledged (docs/configuration.rst); empty: the store URL's, else LOCAL_QUORUM",
    ),
    Setting(
        "read-consistency",
        consistency_flag,
        "",
        "Cassandra consistency level of reads; empty: the store URL's, else LOCAL_QUORUM",
    ),
    Setting("slot-width", parse_duration, "1h", "time slot of raw data partitions"),
    Setting(
        "raw-retention",
        parse_duration,
        "7d",
        "how long raw samples are kept (in sealed blocks)",
        per_tenant=TENANT_RETENTION,
    ),
    Setting(
        "head-retention",
        parse_duration,
        "6h",
        "how long head rows (raw samples not yet sealed into a block) are kept past the end of their slot; the downsampler must seal a slot within it",
    ),
    Setting(
        "granularities",
        str,
        "5m:14d,1h:365d",
        "roll-up granularities with their retention, finest first",
        per_tenant=TENANT_ROLLUPS,
    ),
    Setting(
        "exemplar-retention",
        parse_duration,
        "7d",
        "how long Prometheus exemplars are kept (by their timestamp)",
        per_tenant=TENANT_RETENTION,
    ),
    Setting(
        "max-exemplars-per-series", _positive, "100", "exemplars kept per series and slot (--slot-width): the newest"
    ),
    Setting(
        "roles",
        str,
        "ingest,query,downsample",
        "what this process does: any of ingest, query, downsample; the carbon listeners (--graphite, --graphite-udp, --pickle) open only with ingest",
    ),
    Setting("downsample-partitions-count", _positive, "64", "partitions the series are hashed into for downsampling"),
    Setting(
        "downsample-partitions",
        str,
        "",
        "partitions this replica rolls up, e.g. 0-15,40; empty: all (shared through Redis locks when --redis is given)",
    ),
    Setting(
        "downsample-delay", parse_duration, "5m", "a slot is rolled up once it ended and saw no sample for this long"
    ),
    Setting("downsample-interval", parse_duration, "10s", "how often the downsample role looks for settled slots"),
    Setting(
        "counter-suffixes", str, "reads,writes,bytes", "metric name suffixes of delta counters (rolled up as sums)"
    ),
    Setting(
        "redis",
        str,
        "",
        "redis://host:port/db shared by replicas: metadata cache, pending roll-ups, partition locks; none: in-memory cache, pending table in the store",
    ),
    Setting("redis-key-ttl", parse_duration, "1d", "expiry of the Redis metadata cache keys"),
    Setting(
        "auth-file",
        lambda text: Path(text) if str(text).strip() else None,
        "",
        "TOML file of bearer tokens and basic-auth users, each with its tenant and roles (docs/security.rst); none: no credentials asked, the tenant comes from the X-Scope-OrgID header",
    ),
    Setting(
        "auth-max-failures",
        _non_negative,
        "20",
        "with --auth-file: failed credentials a minute per client address, and per user name for addresses that failed in the last 10 minutes, before further attempts get 429 (no password is checked then); 0: no limit",
    ),
    Setting(
        "enable-admin-api",
        _boolean,
        "false",
        "serve the endpoints that change stored data (deletes, docs/operations.rst); with --auth-file they need the admin role",
    ),
    Setting("max-body-bytes", _positive, str(10 << 20), "largest HTTP request body accepted (413 above)"),
    Setting(
        "max-decompressed-bytes",
        _positive,
        str(64 << 20),
        "largest snappy-decompressed remote write/read body (413 above)",
    ),
    Setting(
        "remote-write-max-samples",
        _positive,
        "2000000",
        "samples one remote write request may carry (413 above, refused once the decoder counts past it)",
    ),
    Setting(
        "remote-write-max-exemplars",
        _positive,
        "100000",
        "exemplars one remote write request may carry (413 above, refused once the decoder counts past it)",
    ),
    Setting(
        "remote-write-max-metadata",
        _positive,
        "100000",
        "metadata entries one remote write 1.0 request may carry (413 above, refused once the decoder counts past it)",
    ),
    Setting(
        "max-connections",
        _auto_or_positive,
        "auto",
        "TCP connections one process keeps open over all its HTTP and carbon listeners; at it a new one replaces the oldest idle one (no request under way), or is closed at once (logged, counted); auto: the open-files limit (ulimit -n) minus 128",
    ),
    Setting(
        "http-idle-timeout",
        parse_duration,
        "6m",
        "an HTTP connection idle this long, or taking this long to send a request's headers, is closed; 0s: never; longer than clients keep idle connections (Prometheus 5m, Go and Grafana 90s), so that they close first",
    ),
    Setting(
        "http-body-timeout",
        parse_duration,
        "60s",
        "a request body not received in full this long after its headers gets 408 and its connection is closed; 0s: never",
    ),
    Setting(
        "http-body-min-rate",
        _non_negative,
        "1024",
        "bytes per second a request body must arrive at, on average from its headers on, once it took over 5 s (408 and closed below); 0: no minimum",
    ),
    Setting(
        "http-write-timeout",
        parse_duration,
        "60s",
        "an HTTP connection whose client takes none of its answer for this long (the gateway's send buffer stays full) is closed; 0s: never",
    ),
    Setting(
        "http-max-unsent-bytes",
        _positive,
        str(256 << 20),
        "bytes of HTTP answers one process holds for clients that have not taken them yet; past it, connections stalled in a write for over a second are closed first, then a new answer gets 503 with Retry-After",
    ),
    Setting(
        "carbon-idle-timeout",
        parse_duration,
        "5m",
        "a carbon plaintext or pickle TCP connection that sends nothing for this long is closed; 0s: never",
    ),
    Setting(
        "shutdown-timeout",
        parse_duration,
        "10s",
        "on SIGTERM or SIGINT, how long open requests, carbon batches and a running downsample round get to finish; then what is left is logged and closed",
    ),
    Setting(
        "max-inflight-samples",
        _positive,
        "1000000",
        "samples waiting for the store before writes get 503 (fewer while the store is slow: what it stores in 0.3 x --shutdown-timeout)",
    ),
    Setting("metadata-cache-size", _positive, "1000000", "series remembered as already indexed (in-memory LRU)"),
    Setting(
        "max-series-per-query", _positive, "10000", "series one query may read (422 above)", per_tenant=tenant_limit(1)
    ),
    Setting(
        "max-samples-per-query",
        _positive,
        "5000000",
        "samples one remote-read query may return (422 above)",
        per_tenant=tenant_limit(1),
    ),
    Setting(
        "query-lookback-delta", parse_duration, "5m", "PromQL: how far back an instant selector looks for a sample"
    ),
    Setting(
        "promql-delayed-name-removal",
        _boolean,
        "false",
        "PromQL: keep __name__ through the query and drop it only from the answer where a function or operator dropped it, as Prometheus's --enable-feature=promql-delayed-name-removal (label_replace/label_join can still read or keep it)",
    ),
    Setting(
        "query-timeout",
        parse_duration,
        "2m",
        "longest a query may run, queue wait included (PromQL, remote read, Graphite render/find/tags, native query): its query executor is killed then and the client gets 503",
    ),
    Setting(
        "query-max-samples",
        _positive,
        "50000000",
        "PromQL: samples one query may read, as Prometheus's --query.max-samples (422 above)",
        per_tenant=tenant_limit(1),
    ),
    Setting(
        "query-executors",
        _auto_or_non_negative,
        "auto",
        "processes that run the query routes (PromQL, remote read, Graphite render/find/tags, native query), one query at a time each, so no query stops the gateway; 0: in the gateway process (the embedded store's :memory:); auto: the usable cores shared among the --workers, at least 2 per worker; one tenant holds at most half of them",
    ),
    Setting(
        "query-queue",
        _positive,
        "100",
        "queries waiting for a query executor; more get 429 with Retry-After",
    ),
    Setting(
        "query-max-memory-bytes",
        _positive,
        str(2 << 30),
        "resident memory a query executor may use; a query going past it gets 422 and its executor is replaced",
    ),
    Setting(
        "query-max-length",
        _positive,
        "65536",
        "characters of one PromQL query or selector, or of one Graphite render target (400 above)",
    ),
    Setting(
        "query-max-terms",
        _positive,
        "300",
        "operators, matchers, brackets and arguments of a PromQL query, calls and arguments of a Graphite target, counted before it is parsed (400 above); a target evaluates at most twice as many calls and paths, re-evaluations included",
    ),
    Setting(
        "query-max-depth",
        _positive,
        "64",
        "how deep a PromQL query's parentheses, calls, aggregations, subqueries and unary operators, or a Graphite target's function calls, may nest, checked before it is parsed (400 above)",
    ),
    Setting("render-max-targets", _positive, "500", "Graphite: targets one /render request may have (400 above)"),
    Setting(
        "max-points-per-query",
        _positive,
        "10000000",
        "points one /render or /api/query request may read, generate or bucket (time(), summarize(), hitcount(), ...), counted before the work is done (422 above)",
        per_tenant=tenant_limit(1),
    ),
    Setting(
        "tenant-max-samples-per-second",
        _non_negative,
        "0",
        "per-tenant ingest rate of one process, 429 above; 0: no limit",
        per_tenant=tenant_limit(0),
    ),
    Setting(
        "tenant-max-active-series",
        _non_negative,
        "0",
        "per-tenant series written in the last 20 min to one process; the new series beyond it are rejected, the others written; 0: no limit",
        per_tenant=tenant_limit(0),
    ),
    Setting(
        "overrides",
        lambda text: Path(text) if str(text).strip() else None,
        "",
        'TOML file of per-tenant values of the tenant, query and retention settings, reloaded when it changes and on SIGHUP (docs/configuration.rst, "Per-tenant overrides"); none: the flags for every tenant',
    ),
    Setting("max-name-length", _positive, "1024", "longest metric name"),
    Setting("max-tag-key-length", _positive, "1024", "longest tag key"),
    Setting("max-tag-value-length", _positive, "2048", "longest tag value"),
    Setting("max-tags", _positive, "64", "most tags per series"),
    Setting(
        "created-timestamp-zero-ingestion",
        _boolean,
        "false",
        "write a zero sample (or an empty histogram) at a remote-write 2.0 created timestamp not written before, as Prometheus 3's feature of that name, so rate() of a new counter counts its first samples",
    ),
    Setting(
        "otlp-translation-strategy",
        _translation_strategy,
        "",
        "how OTLP metric and attribute names become Prometheus names, as Prometheus 3's otlp.translation_strategy: UnderscoreEscapingWithSuffixes (empty: this, the default), UnderscoreEscapingWithoutSuffixes, NoUTF8EscapingWithSuffixes or NoTranslation (per tenant in --overrides)",
        per_tenant=TenantValue("choice", choices=STRATEGIES),
    ),
    Setting(
        "otlp-promote-resource-attributes",
        _attribute_names,
        "",
        "OTLP resource attributes made labels of every series of their resource, comma-separated, as Prometheus 3's otlp.promote_resource_attributes (per tenant in --overrides)",
        per_tenant=TenantValue("names"),
    ),
    Setting(
        "otlp-promote-scope-metadata",
        _boolean,
        "false",
        "label OTLP series with their instrumentation scope (otel_scope_name, otel_scope_version, otel_scope_schema_url, otel_scope_<attribute>), as Prometheus 3's otlp.promote_scope_metadata",
    ),
    Setting(
        "otlp-keep-identifying-attributes",
        _boolean,
        "false",
        "keep service.name, service.namespace and service.instance.id as target_info labels beside job and instance, as Prometheus 3's otlp.keep_identifying_resource_attributes",
    ),
    Setting(
        "otlp-convert-delta",
        _boolean,
        "false",
        "sum OTLP delta sums and histograms into cumulative ones in the gateway's memory (the deltas of a series must reach one replica); off, they are refused and named in the answer's partial_success",
    ),
    Setting(
        "max-metadata-length",
        _positive,
        "1024",
        "longest Prometheus metadata text (metric family name, help, unit); longer metadata is skipped and counted, its samples are written",
    ),
    Setting(
        "max-native-histogram-buckets",
        _non_negative,
        "160",
        "most buckets (positive and negative), and most custom bounds, of one remote-written native histogram; one with more is refused and counted, the rest of the request is written (Prometheus's native_histogram_bucket_limit, which lowers a scrape's resolution instead); 0: no limit",
    ),
    Setting("max-sample-age", parse_duration, "3650d", "oldest accepted timestamp, relative to now"),
    Setting("max-future", parse_duration, "10m", "newest accepted timestamp, ahead of now"),
    Setting(
        "workers",
        _auto_or_positive,
        "auto",
        "worker processes sharing the listening sockets; auto: one per usable core, but 1 on the embedded SQLite store and with --roles downsample; tenant limits are per process, so N workers allow a tenant up to N times them",
    ),
    Setting("log-level", lambda text: str(text).upper(), "info", "debug, info, warning or error"),
]
# The settings an --overrides file may give per tenant, by their key in the file.
TENANT_VALUES = {
    setting.per_tenant.key or setting.name: setting.per_tenant for setting in SETTINGS if setting.per_tenant
}

_BY_NAME = {setting.name: setting for setting in SETTINGS}


@dataclasses.dataclass(frozen=True)
class Config:
    http: tuple[str, int] | None
    graphite: tuple[str, int] | None
    graphite_udp: tuple[str, int] | None
    pickle: tuple[str, int] | None
    graphite_tenant: str
    graphite_max_line_length: int
    pickle_max_frame_bytes: int
    graphite_storage_schemas: Path | None
    graphite_max_pending: int
    data_dir: Path
    store: str
    replication: str
    write_consistency: str
    read_consistency: str
    slot_width: int
    raw_retention: int
    head_retention: int
    granularities: str
    exemplar_retention: int
    max_exemplars_per_series: int
    roles: str
    downsample_partitions_count: int
    downsample_partitions: str
    downsample_delay: int
    downsample_interval: int
    counter_suffixes: str
    redis: str
    redis_key_ttl: int
    auth_file: Path | None
    auth_max_failures: int
    enable_admin_api: bool
    max_body_bytes: int
    max_decompressed_bytes: int
    remote_write_max_samples: int
    remote_write_max_exemplars: int
    remote_write_max_metadata: int
    max_connections: int | None
    http_idle_timeout: int
    http_body_timeout: int
    http_body_min_rate: int
    http_write_timeout: int
    http_max_unsent_bytes: int
    carbon_idle_timeout: int
    shutdown_timeout: int
    max_inflight_samples: int
    metadata_cache_size: int
    max_series_per_query: int
    max_samples_per_query: int
    query_lookback_delta: int
    promql_delayed_name_removal: bool
    query_timeout: int
    query_max_samples: int
    query_executors: int | None
    query_queue: int
    query_max_memory_bytes: int
    query_max_length: int
    query_max_terms: int
    query_max_depth: int
    render_max_targets: int
    max_points_per_query: int
    tenant_max_samples_per_second: int
    tenant_max_active_series: int
    overrides: Path | None
    max_name_length: int
    max_tag_key_length: int
    max_tag_value_length: int
    max_tags: int
    created_timestamp_zero_ingestion: bool
    otlp_translation_strategy: str
    otlp_promote_resource_attributes: tuple[str, ...]
    otlp_promote_scope_metadata: bool
    otlp_keep_identifying_attributes: bool
    otlp_convert_delta: bool
    max_metadata_length: int
    max_native_histogram_buckets: int
    max_sample_age: int
    max_future: int
    workers: int | None
    log_level: str

    @property
    def tenant_values(self) -> dict[str, TenantValue]:
        """The per-tenant settings (TENANT_VALUES): what gateway.core.overrides checks a file against."""
        return TENANT_VALUES

    @property
    def store_url(self) -> str:
        """``--store`` (or the embedded store's file) with ``--replication`` and the consistency
        flags put in as its options, replacing the URL's own."""
        url = self.store or f"sqlite:///{self.data_dir / 'tsgate.db'}"
        return with_flag_options(url, {option: getattr(self, option) for option in FLAG_OPTIONS})

    @property
    def layout(self) -> Layout:
        return Layout(
            self.slot_width,
            self.raw_retention,
            parse_granularities(self.granularities, self.slot_width),
            self.head_retention,
            self.downsample_delay,
            self.exemplar_retention,
            self.max_exemplars_per_series,
        )

    @property
    def role_set(self) -> set[str]:
        return {r.strip() for r in self.roles.split(",") if r.strip()}

    @property
    def worker_count(self) -> int:
        """``--workers``, else one per usable core; 1 on SQLite, which has one writer at a time
        (more processes would queue on its write lock), and for a downsample-only process (only one
        worker runs the downsample loop, see gateway.app.workers)."""
        if self.workers is not None:
            return self.workers
        if self.store_url.startswith("sqlite:") or self.role_set == {"downsample"}:
            return 1
        return len(os.sched_getaffinity(0))

    @property
    def query_executor_count(self) -> int:
        """``--query-executors`` of each gateway process, else the usable cores shared among the
        ``--workers`` (at least 2 each); 0 for an in-memory SQLite store, which no other process
        can open."""
        if ":memory:" in self.store_url:
            return 0
        if self.query_executors is not None:
            return self.query_executors
        return max(2, -(-len(os.sched_getaffinity(0)) // self.worker_count))

    @property
    def connection_limit(self) -> int:
        """``--max-connections``, else the open-files limit less what the store, Redis, logs and
        threads need, so the cap is reached before accept() fails for lack of descriptors."""
        if self.max_connections is not None:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return 1 << 16  # no limit on open files: still a bound
        return max(1, soft - RESERVED_DESCRIPTORS)

    @property
    def listeners(self) -> dict[str, tuple[str, int]]:
        """The sockets this configuration listens on, by setting name (``graphite-udp`` is UDP).

        The carbon listeners (plaintext TCP and UDP, pickle) only write, so they open only
        with the ingest role; HTTP opens unless ``--http off`` (its routes check the roles one by one).
        """
        ingest = "ingest" in self.role_set
        wanted = {
            "http": self.http,
            "graphite": self.graphite if ingest else None,
            "graphite-udp": self.graphite_udp if ingest else None,
            "pickle": self.pickle if ingest else None,
        }
        return {name: address for name, address in wanted.items() if address is not None}

    @property
    def owned_partitions(self) -> list[int]:
        return parse_partitions(self.downsample_partitions, self.downsample_partitions_count) or list(
            range(self.downsample_partitions_count)
        )

    @property
    def limits(self) -> Limits:
        return Limits(
            max_name_length=self.max_name_length,
            max_tag_key_length=self.max_tag_key_length,
            max_tag_value_length=self.max_tag_value_length,
            max_tags=self.max_tags,
            max_sample_age_ms=self.max_sample_age,
            max_future_ms=self.max_future,
        )


class ConfigError(ValueError):
    pass


# The settings each command takes besides ``serve`` (which takes them all), so that its
# ``--help`` lists only what it uses. A config file may still hold any setting.
SCHEMA_SETTINGS = (
    "store",
    "replication",
    "slot-width",
    "raw-retention",
    "head-retention",
    "granularities",
    "exemplar-retention",
    "max-exemplars-per-series",
    "downsample-delay",
    "log-level",
)
# What ``tsgate overrides check`` needs: the flags the file's keys default to, and the layout.
OVERRIDES_SETTINGS = (
    "slot-width",
    "raw-retention",
    "granularities",
    "exemplar-retention",
    "tenant-max-samples-per-second",
    "tenant-max-active-series",
    "max-series-per-query",
    "max-samples-per-query",
    "query-max-samples",
    "max-points-per-query",
)
DOWNSAMPLE_SETTINGS = (
    "data-dir",
    *SCHEMA_SETTINGS,
    "redis",
    "redis-key-ttl",
    "downsample-partitions-count",
    "downsample-partitions",
    "downsample-interval",
    "counter-suffixes",
    "overrides",
    "write-consistency",
    "read-consistency",
)
DELETE_SETTINGS = (*DOWNSAMPLE_SETTINGS, "max-future", "max-series-per-query")
IMPORT_SETTINGS = (
    "data-dir",
    *SCHEMA_SETTINGS,
    "counter-suffixes",
    "overrides",
    "write-consistency",
    "read-consistency",
)


def add_arguments(parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None) -> None:
    """``--config`` and a flag per setting (those named in ``only``, else all of them)."""
    parser.add_argument("--config", type=Path, help="TOML file with any of the settings below")
    for setting in SETTINGS:
        if only is not None and setting.name not in only:
            continue
        flag = {"nargs": "?", "const": "true"} if setting.parse is _boolean else {}
        default = f" (default {setting.default})" if setting.default else ""
        parser.add_argument(f"--{setting.name}", default=None, help=f"{setting.help}{default}", **flag)


def _read_file(path: Path) -> dict[str, object]:
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"--config {path}: {error}") from None
    values = {}
    for key, value in document.items():
        name = key.replace("_", "-")
        if name not in _BY_NAME:
            raise ConfigError(f"--config {path}: unknown setting {key!r}{did_you_mean(name, _BY_NAME)}")
        values[name] = value
    return values


def _flag_value(namespace: argparse.Namespace, setting: Setting):
    """The flag's value, or None when it was not given (or the command has no such flag)."""
    return getattr(namespace, setting.name.replace("-", "_"), None)


def setting_flags(namespace: argparse.Namespace) -> list[str]:
    """Flags that give another process the same settings: ``--config`` and every flag given.

    Worker processes get these, so they read the same config file and flags as the supervisor.
    """
    flags = ["--config", str(namespace.config)] if namespace.config is not None else []
    for setting in SETTINGS:
        value = _flag_value(namespace, setting)
        if value is not None:
            flags.append(f"--{setting.name}={value}")
    return flags


def build_config(namespace: argparse.Namespace) -> Config:
    """Defaults, then the config file, then flags; every value parsed and checked."""
    raw: dict[str, object] = {setting.name: setting.default for setting in SETTINGS}
    if namespace.config is not None:
        raw.update(_read_file(namespace.config))
    for setting in SETTINGS:
        value = _flag_value(namespace, setting)
        if value is not None:
            raw[setting.name] = value
    values = {}
    for name, value in raw.items():
        try:
            values[name.replace("-", "_")] = _BY_NAME[name].parse(value)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"--{name}: {error}") from None
    try:
        validate_tenant(values["graphite_tenant"])
    except InvalidSample as error:
        raise ConfigError(f"--graphite-tenant: {error.problem}") from None
    try:
        parse_granularities(values["granularities"], values["slot_width"])
    except ValueError as error:
        raise ConfigError(f"--granularities: {error}") from None
    if values["head_retention"] <= values["downsample_delay"]:
        raise ConfigError(
            f"--head-retention ({raw['head-retention']}) must be longer than --downsample-delay ({raw['downsample-delay']}):"
            " head rows must outlive the wait before their slot is sealed"
        )
    roles = set(filter(None, (r.strip() for r in values["roles"].split(","))))
    if not roles or roles - {"ingest", "query", "downsample"}:
        raise ConfigError(f"--roles: {values['roles']!r} must name some of ingest, query, downsample")
    try:
        parse_partitions(values["downsample_partitions"], values["downsample_partitions_count"])
    except ValueError as error:
        raise ConfigError(f"--downsample-partitions: {error}") from None
    if values["workers"] not in (None, 1) and roles == {"downsample"}:
        raise ConfigError(
            "--workers: a downsample-only process runs one worker (only one worker runs the downsample loop)"
        )
    if values["auth_file"] is not None:
        from gateway.http.auth import AuthFileError, Credentials

        try:
            Credentials.from_file(values["auth_file"])
        except AuthFileError as error:
            raise ConfigError(str(error)) from None
    if values["log_level"] not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"--log-level: {raw['log-level']!r} is not debug, info, warning or error")
    cassandra_only = [f"--{flag}" for flag in FLAG_OPTIONS.values() if raw[flag]]
    if cassandra_only and not str(values["store"]).startswith("cassandra://"):
        raise ConfigError(f"{', '.join(cassandra_only)}: only a cassandra:// --store has replication and consistency")
    config = Config(**values)
    if config.overrides is not None:
        from gateway.core.overrides import Overrides, OverridesError

        try:
            Overrides(config).load()
        except OverridesError as error:
            raise ConfigError(f"--overrides {config.overrides}: {error}") from None
    from gateway.store import open_store

    try:
        open_store(config.store_url, config.layout)  # only built, to check the URL: nothing opened
    except ValueError as error:
        raise ConfigError(f"--store: {error}") from None
    return config
