"""The production store: Cassandra through cassandra-driver, table for table as contract.py says.

Every statement is prepared and runs asynchronously through one bounded request queue
(cassandra_requests.py): each store call fires one Deferred on the reactor thread, so the
reactor never waits on Cassandra. Head rows go in single-partition UNLOGGED batches (one
mutation for up to HEAD_ROWS_PER_BATCH samples, head_batch); other writes of many rows go in
UNLOGGED batches of rows that share a replica (_batched), up to ROWS_PER_BATCH rows a request.
Timeouts and unavailable replicas become StoreUnavailable (HTTP 503, so senders retry); the
driver reconnects on its own when Cassandra comes back.
"""

import contextlib
import json
import logging
import ssl
import struct
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, unquote

import numpy as np
from cassandra import ConsistencyLevel, OperationTimedOut, RequestExecutionException
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
from cassandra.connection import ConnectionException
from cassandra.policies import DCAwareRoundRobinPolicy, ExponentialReconnectionPolicy, RetryPolicy, TokenAwarePolicy
from cassandra.query import BatchStatement, BatchType, tuple_factory
from prometheus_client import Counter
from twisted.internet import defer, threads

from gateway import samples
from gateway.metadata_cache import LRUMap
from gateway.model import SeriesKey
from gateway.samples import Samples
from gateway.store.cassandra_requests import RequestQueue
from gateway.store.cassandra_schema import (
    SchemaOptions,
    histogram_retention_ms,
    keyspace_statement,
    table_statements,
    upgrade_statements,
)
from gateway.store.contract import (
    ROLLUP_COLUMN_SETS,
    ROLLUP_COLUMNS,
    ExemplarRow,
    HistogramRow,
    MetricMetadata,
    PathNode,
    PendingSet,
    RawData,
    RawPoint,
    Rollup,
    SealedBlock,
    Store,
    StoreUnavailable,
    exemplar_labels_text,
    exemplars_in_range,
    time_slot,
    time_slots,
)
from gateway.store.deletion import INDEX_KEYS, bucket_range, cut_block
from gateway.store.index import index_rows
from gateway.store.layout import Layout, head_shard
from protocols.timespec import parse_duration

log = logging.getLogger(__name__)

DRIVER_RETRIES = Counter("tsgate_cassandra_retries", "Requests the driver's retry policy retried", ["cause"])
DRIVER_ERRORS = Counter("tsgate_cassandra_errors", "Requests that failed, by error", ["error"])
BATCH_WARNINGS = Counter(
    "tsgate_cassandra_batch_warnings", "Cassandra's warnings about our multi-partition or large UNLOGGED batches"
)


class BatchWarningFilter(logging.Filter):
    """Cassandra answers every UNLOGGED batch over 10 partitions or 5 KiB with a warning, which the
    driver logs per request: thousands of lines a second at full ingest. tsgate sends such batches
    on purpose (rows grouped by replica, see CassandraStore._batched), so they are counted, and
    logged once per ``interval`` seconds. Every other server warning is logged as it comes."""

    MARKERS = ("Unlogged batch covering", "Batch for [")

    def __init__(self, interval: float = 600.0):
        super().__init__()
        self.interval = interval
        self._last = -interval

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not any(marker in message for marker in self.MARKERS):
            return True
        BATCH_WARNINGS.inc()
        now = time.monotonic()
        if now - self._last < self.interval:
            return False
        self._last = now
        record.msg, record.args = (
            "%s (expected: tsgate batches rows by replica; counted in tsgate_cassandra_batch_warnings_total, logged once per %ds)",
            (message, self.interval),
        )
        return True


logging.getLogger("cassandra.protocol").addFilter(BatchWarningFilter())

# An UNLOGGED batch holds at most this many rows and bytes of values: 50 data_raw rows are about
# Cassandra's batch_size_warn_threshold (5 KiB); the byte bound keeps batches of big metadata rows
# (long tag values) far under batch_size_fail_threshold (50 KiB). docs/performance.rst measured it.
ROWS_PER_BATCH = 50
BATCH_VALUE_BYTES = 16 * 1024
# A single-partition batch of data_head rows is one mutation, which Cassandra neither warns about
# nor refuses by size (its batch thresholds are for batches over several partitions); the bounds
# keep one mutation far under the commit log's limit (half a segment) and a request short.
HEAD_ROWS_PER_BATCH = 1000
HEAD_BATCH_VALUE_BYTES = 128 * 1024

# A slot's written_at lives this much longer than the head rows written with it; WRITTEN_AT_REMEMBERED
# series-slots are remembered as having a fresh written_at. A seal records the time it read the head
# less SEAL_CLOCK_MARGIN_MS (at most half the settle delay), so the clocks of ingest and
# downsampler processes may differ by that much.
WRITTEN_AT_MARGIN_MS = 3_600_000
WRITTEN_AT_REMEMBERED = 1_000_000
SEAL_CLOCK_MARGIN_MS = 60_000
# Series whose data_blocks rows one request reads (an IN on the partition key): the Python driver's
# cost per request, not Cassandra, was most of a read of many series.
READ_SERIES_PER_REQUEST = 64

# data_head partitions (slices of one shard) one head read covers: with READ_SERIES_PER_REQUEST
# series at 10 s that is about 4000 rows, a request a busy Cassandra answers within its read
# timeout (the 60 slices of a slot at once timed out on the loaded 2-core box).
HEAD_SLICES_PER_REQUEST = 10

# Series-slots (partitions: two INs on the partition key) whose exemplars or histograms one request
# reads: a remote read of many series over a few slots costs a few requests, not one a series.
PARTITIONS_PER_REQUEST = 256

_BIGINT, _INT, _DOUBLE = struct.Struct(">q").pack, struct.Struct(">i").pack, struct.Struct(">d").pack

# Compare-and-set tries of a block cut while seals keep rewriting the block (delete_samples).
CUT_BLOCK_ATTEMPTS = 5

# The execution profile of data reads: rows as plain tuples. The driver's default builds a
# namedtuple class per page and a namedtuple per row, a third of a render's CPU (docs/performance.rst).
PLAIN_ROWS = "plain_rows"


class CassandraOptions(NamedTuple):
    hosts: list[tuple[str, int]]
    schema: SchemaOptions
    read_consistency: int
    write_consistency: int
    local_dc: str | None
    username: str | None
    password: str | None
    tls: bool
    tls_ca: str | None
    request_timeout_s: float
    max_inflight: int


def _consistency(name: str) -> int:
    try:
        return ConsistencyLevel.name_to_value[name.upper()]
    except KeyError:
        choices = ", ".join(sorted(ConsistencyLevel.name_to_value))
        raise ValueError(f"consistency {name!r} is not one of {choices}") from None


def _replication(text: str) -> tuple[tuple[str, int], ...]:
    """``simple:3`` or ``dc1:3,dc2:2``; also spelt with the strategy's name, as CQL has it:
    ``SimpleStrategy:3`` or ``NetworkTopologyStrategy:dc1=3,dc2=2``."""
    strategy, _, factors = text.partition(":")
    if strategy == "SimpleStrategy":
        text = f"simple:{factors}"
    elif strategy == "NetworkTopologyStrategy":
        text = factors.replace("=", ":")
    pairs = []
    for item in text.split(","):
        name, _, factor = item.partition(":")
        if not name or not factor.isdigit() or int(factor) < 1:
            raise ValueError(f"replication {text!r}: expected simple:N, DC:N,DC:N or NetworkTopologyStrategy:DC=N,DC=N")
        pairs.append((name, int(factor)))
    if any(name == "simple" for name, _ in pairs) and len(pairs) > 1:
        raise ValueError(f"replication {text!r}: simple:N stands alone")
    return tuple(pairs)


def parse_url(url: str, layout: Layout) -> CassandraOptions:
    """``cassandra://[user:password@]host[:port][,host[:port]...]/keyspace[?option=value&...]``

    Options: replication (simple:N or DC:N,DC:N), consistency (both), read_consistency,
    write_consistency, local_dc, username, password, tls (true/false), tls_ca (CA file),
    request_timeout (duration), max_inflight (requests in flight). docs/configuration.rst.
    """
    if not url.startswith("cassandra://"):
        raise ValueError(f"{url!r} is not a cassandra:// URL")
    rest = url[len("cassandra://") :]
    location, _, query = rest.partition("?")
    netloc, _, keyspace = location.partition("/")
    credentials, _, host_list = netloc.rpartition("@")
    username, _, password = credentials.partition(":") if credentials else ("", "", "")
    options = dict(parse_qsl(query, keep_blank_values=True))
    known = {
        "replication",
        "consistency",
        "read_consistency",
        "write_consistency",
        "local_dc",
        "username",
        "password",
        "tls",
        "tls_ca",
        "request_timeout",
        "max_inflight",
    }
    unknown = set(options) - known
    if unknown:
        raise ValueError(f"unknown cassandra URL option(s): {', '.join(sorted(unknown))}")
    hosts = []
    for item in filter(None, host_list.split(",")):
        host, _, port = item.rpartition(":") if item.count(":") == 1 or item.startswith("[") else (item, "", "")
        if port and not port.isdigit():
            raise ValueError(f"{item!r} is not host[:port]")
        hosts.append((host.strip("[]"), int(port or 9042)))
    if not hosts:
        raise ValueError("the cassandra URL names no host")
    keyspace = keyspace or "tsdb"
    if not keyspace.replace("_", "a").isalnum() or not keyspace[0].isalpha():
        raise ValueError(f"keyspace {keyspace!r} must be letters, digits and _ and start with a letter")
    consistency = options.get("consistency", "LOCAL_QUORUM")
    max_inflight = int(options.get("max_inflight", "256"))
    if max_inflight < 1:
        raise ValueError("max_inflight must be at least 1")
    return CassandraOptions(
        hosts=hosts,
        schema=SchemaOptions(keyspace, _replication(options.get("replication", "simple:1")), layout),
        read_consistency=_consistency(options.get("read_consistency", consistency)),
        write_consistency=_consistency(options.get("write_consistency", consistency)),
        local_dc=options.get("local_dc") or None,
        username=unquote(username) or options.get("username") or None,
        password=unquote(password) or options.get("password") or None,
        tls=options.get("tls", "false").lower() in ("1", "true", "yes"),
        tls_ca=options.get("tls_ca") or None,
        request_timeout_s=parse_duration(options.get("request_timeout", "10s")) / 1000,
        max_inflight=max_inflight,
    )


class CountingRetryPolicy(RetryPolicy):
    """The driver's default retry decisions, counted so retries show up in /metrics."""

    def on_read_timeout(self, *args, **kwargs):
        DRIVER_RETRIES.labels("read_timeout").inc()
        return super().on_read_timeout(*args, **kwargs)

    def on_write_timeout(self, *args, **kwargs):
        DRIVER_RETRIES.labels("write_timeout").inc()
        return super().on_write_timeout(*args, **kwargs)

    def on_unavailable(self, *args, **kwargs):
        DRIVER_RETRIES.labels("unavailable").inc()
        return super().on_unavailable(*args, **kwargs)

    def on_request_error(self, *args, **kwargs):
        DRIVER_RETRIES.labels("request_error").inc()
        return super().on_request_error(*args, **kwargs)


def _unavailable(error: Exception) -> Exception:
    """Faults of the cluster (not of our statements) become StoreUnavailable."""
    DRIVER_ERRORS.labels(type(error).__name__).inc()
    if isinstance(
        error, (NoHostAvailable, OperationTimedOut, RequestExecutionException, ConnectionException, ConnectionError)
    ):
        return StoreUnavailable(f"cassandra: {type(error).__name__}: {error}")
    return error


@contextlib.contextmanager
def _driver_quiet():
    """While connecting, the driver logs each refused attempt with a traceback; the error
    raised from the connect says the same in one line. ``--log-level debug`` keeps them."""
    driver = logging.getLogger("cassandra")
    if driver.isEnabledFor(logging.DEBUG):
        yield
        return
    level = driver.level
    driver.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        driver.setLevel(level)


def _unreachable(error: NoHostAvailable) -> str:
    """One line for a cluster that refuses every connection: which hosts, why, what to try."""
    reasons = "; ".join(f"{host} {str(reason).rpartition('Last error: ')[2]}" for host, reason in error.errors.items())
    return f"cannot reach Cassandra ({reasons}): is it running? (`tsgate dev cassandra` runs one for development)"


class CassandraStore(Store):
    def __init__(self, options: CassandraOptions):
        super().__init__(options.schema.layout)
        self.options = options
        self.keyspace = options.schema.keyspace
        self.ttl_s = options.schema.raw_retention_ms // 1000
        self.cluster: Any = None  # a Cluster once open() ran
        self.session: Any = None  # its Session
        self._requests: RequestQueue | None = None
        self._statements: dict[str, object] = {}
        self._written_at_fresh = LRUMap(WRITTEN_AT_REMEMBERED)

    @classmethod
    def from_url(cls, url: str, layout: Layout) -> "CassandraStore":
        return cls(parse_url(url, layout))

    def _cluster(self) -> Cluster:
        options = self.options

        def profile(**overrides) -> ExecutionProfile:
            return ExecutionProfile(
                load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=options.local_dc)),
                retry_policy=CountingRetryPolicy(),
                consistency_level=options.read_consistency,
                request_timeout=options.request_timeout_s,
                **overrides,
            )

        ssl_context = None
        if options.tls:
            ssl_context = ssl.create_default_context(cafile=options.tls_ca)
        auth = PlainTextAuthProvider(options.username, options.password) if options.username else None
        return Cluster(
            contact_points=[host for host, _ in options.hosts],
            port=options.hosts[0][1],
            execution_profiles={EXEC_PROFILE_DEFAULT: profile(), PLAIN_ROWS: profile(row_factory=tuple_factory)},
            reconnection_policy=ExponentialReconnectionPolicy(0.5, 10.0),
            auth_provider=auth,
            ssl_context=ssl_context,
            connect_timeout=options.request_timeout_s,
            protocol_version=5,
        )

    def _connect(self, keyspace: str | None):
        self.cluster = self._cluster()
        try:
            with _driver_quiet():
                return self.cluster.connect(keyspace)
        except Exception as error:
            self.cluster.shutdown()
            with _driver_quiet():
                missing = keyspace is not None and self._keyspace_missing(keyspace)
            if missing:
                raise RuntimeError(
                    f"keyspace {keyspace!r} does not exist; create it with: tsgate schema apply --store cassandra://HOST/{keyspace}"
                ) from error
            unavailable = _unavailable(error)
            if isinstance(error, NoHostAvailable) and error.errors:
                unavailable = StoreUnavailable(_unreachable(error))
            raise unavailable from error

    def _keyspace_missing(self, keyspace: str) -> bool:
        """Tell "no such keyspace" (a setup step was missed) from an unreachable cluster."""
        cluster = self._cluster()
        try:
            rows = cluster.connect().execute(
                "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s", [keyspace]
            )
            return not list(rows)
        except Exception:
            return False
        finally:
            cluster.shutdown()

    def apply_schema(self) -> list[str]:
        """Create or upgrade keyspace and tables; blocking (used by ``tsgate schema apply``)."""
        session = self._connect(None)
        try:
            schema = self.options.schema
            statements = [keyspace_statement(schema), *table_statements(schema)]
            # Columns added since the first release (ALTER TABLE ... ADD fails where the column exists).
            for table, column, cql_type in (
                ("metric_names", "aggregators", "set<text>"),
                ("series_set_hashes", "created_ms", "bigint"),
                ("data_blocks", "head_written_at", "bigint"),
            ):
                existing = {
                    row.column_name
                    for row in session.execute(
                        "SELECT column_name FROM system_schema.columns WHERE keyspace_name = %s AND table_name = %s",
                        [schema.keyspace, table],
                    )
                }
                if existing and column not in existing:
                    statements.append(f"ALTER TABLE {schema.keyspace}.{table} ADD {column} {cql_type}")
            statements += upgrade_statements(schema)
            tables = {
                row.table_name
                for row in session.execute(
                    "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", [schema.keyspace]
                )
            }
            for statement in statements:
                session.execute(statement, timeout=120)
            if not session.cluster.control_connection.wait_for_schema_agreement(wait_time=120):
                raise StoreUnavailable("the nodes do not agree on the schema after 120 s: is a node down?")
            if "data_raw" in tables and "data_blocks" not in tables:
                statements.append(self._index_head_rows(session))
            if "histograms" in tables and "histogram_series" not in tables:
                statements.append(self._index_histograms(session))
            return statements
        finally:
            self.cluster.shutdown()

    def _index_head_rows(self, session) -> str:
        """The upgrade from one row a sample: each data_raw partition written before data_blocks
        existed gets a ``written_at`` in its slot's data_blocks row, so read_raw reads its rows
        until they expire with the raw retention they were written with. Slots still pending are
        sealed into blocks by the downsampler like any other; slots rolled up before the upgrade
        stay head rows until then."""
        ks, ttl = self.keyspace, self.ttl_s
        update = session.prepare(
            f"UPDATE {ks}.data_blocks USING TTL {ttl} SET written_at = ?"
            " WHERE tenant = ? AND series_set_hash = ? AND block_partition = ? AND time_slot = ?"
        )
        rows = session.execute(f"SELECT DISTINCT tenant, series_set_hash, time_slot FROM {ks}.data_raw", timeout=120)
        count, now, width = 0, int(time.time() * 1000), self.layout.block_partition_width_ms
        for row in rows:
            session.execute(
                update, (now, row.tenant, row.series_set_hash, time_slot(row.time_slot, width), row.time_slot)
            )
            count += 1
        return f"-- indexed {count} data_raw partitions written before the upgrade in data_blocks"

    def _index_histograms(self, session) -> str:
        """The upgrade to histogram_series: every partition of the histogram tables written before
        it existed gets its index row, else reads would no longer see it."""
        ks = self.keyspace
        insert = session.prepare(
            f"INSERT INTO {ks}.histogram_series (tenant, source, time_slot, series_set_hash) VALUES (?, ?, ?, ?)"
        )
        count = 0
        for table in ("histograms", *(g.histogram_table for g in self.layout.granularities)):
            rows = session.execute(f"SELECT DISTINCT tenant, series_set_hash, time_slot FROM {ks}.{table}", timeout=120)
            for row in rows:
                session.execute(insert, (row.tenant, table, row.time_slot, row.series_set_hash))
                count += 1
        return f"-- indexed {count} histogram partitions written before the upgrade in histogram_series"

    def _prepare_all(self) -> None:
        ks = self.keyspace
        texts = {
            "tenant": f"INSERT INTO {ks}.tenants (tenant) VALUES (?)",
            "metric_name": f"INSERT INTO {ks}.metric_names (tenant, metric_name) VALUES (?, ?)",
            "series_set_hash": f"INSERT INTO {ks}.series_set_hashes (tenant, series_set_hash, metric_name, tags) VALUES (?, ?, ?, ?)",
            "series_set": f"INSERT INTO {ks}.series_sets (tenant, metric_name, tag_key, tag_value, series_set_hash) VALUES (?, ?, ?, ?, ?)",
            "tag_key": f"INSERT INTO {ks}.tag_keys (tenant, metric_name, tag_key) VALUES (?, ?, ?)",
            "tag_value": f"INSERT INTO {ks}.tag_values (tenant, metric_name, tag_key, tag_value) VALUES (?, ?, ?, ?)",
            "path_leaf": f"UPDATE {ks}.graphite_paths SET is_leaf = true WHERE tenant = ? AND parent = ? AND name = ?",
            "path_branch": f"UPDATE {ks}.graphite_paths SET is_branch = true WHERE tenant = ? AND parent = ? AND name = ?",
            "tenant_tag_key": f"INSERT INTO {ks}.tenant_tag_keys (tenant, tag_key) VALUES (?, ?)",
            "tenant_tag_value": f"INSERT INTO {ks}.tenant_tag_values (tenant, tag_key, tag_value) VALUES (?, ?, ?)",
            "tag_metric": f"INSERT INTO {ks}.tag_metrics (tenant, tag_key, tag_value, metric_name) VALUES (?, ?, ?, ?)",
            "list_path_children": f"SELECT name, is_leaf, is_branch FROM {ks}.graphite_paths WHERE tenant = ? AND parent = ?",
            "list_tenant_tag_keys": f"SELECT tag_key FROM {ks}.tenant_tag_keys WHERE tenant = ?",
            "list_tenant_tag_values": f"SELECT tag_value FROM {ks}.tenant_tag_values WHERE tenant = ? AND tag_key = ?",
            "find_metrics_by_tag": f"SELECT metric_name FROM {ks}.tag_metrics WHERE tenant = ? AND tag_key = ? AND tag_value = ?",
            "pending": f"INSERT INTO {ks}.pending_downsample_sets (partition, time_slot, tenant, series_set_hash, last_touch) VALUES (?, ?, ?, ?, ?)",
            "list_pending": f"SELECT partition, time_slot, tenant, series_set_hash, last_touch FROM {ks}.pending_downsample_sets WHERE partition = ? AND time_slot < ?",
            "delete_pending": f"DELETE FROM {ks}.pending_downsample_sets WHERE partition = ? AND time_slot = ? AND tenant = ? AND series_set_hash = ? IF last_touch = ?",
            "add_aggregators": f"UPDATE {ks}.metric_names SET aggregators = aggregators + ? WHERE tenant = ? AND metric_name = ?",
            "get_aggregators": f"SELECT aggregators FROM {ks}.metric_names WHERE tenant = ? AND metric_name = ?",
            "metric_metadata": f"INSERT INTO {ks}.metric_metadata (tenant, metric_name, type, help, unit) VALUES (?, ?, ?, ?, ?)",
            "get_metric_metadata": f"SELECT type, help, unit FROM {ks}.metric_metadata WHERE tenant = ? AND metric_name = ?",
            "head": f"INSERT INTO {ks}.data_head (tenant, slice, shard, series_set_hash, ts, value) VALUES (?, ?, ?, ?, ?, ?) USING TTL ?",
            "head_written": f"UPDATE {ks}.data_blocks USING TTL ? SET head_written_at = ? WHERE tenant = ? AND series_set_hash = ? AND block_partition = ? AND time_slot = ?",
            "write_block": f"UPDATE {ks}.data_blocks USING TTL ? SET block = ?, sealed_at = ? WHERE tenant = ? AND series_set_hash = ? AND block_partition = ? AND time_slot = ?",
            "read_slots": f"SELECT series_set_hash, time_slot, block, written_at, head_written_at, sealed_at FROM {ks}.data_blocks WHERE tenant = ? AND series_set_hash IN ? AND block_partition = ? AND time_slot >= ? AND time_slot <= ?",
            "read_head": f"SELECT series_set_hash, ts, value FROM {ks}.data_head WHERE tenant = ? AND slice IN ? AND shard = ? AND series_set_hash IN ? AND ts >= ? AND ts <= ?",
            "read_legacy_head": f"SELECT ts, value FROM {ks}.data_raw WHERE tenant = ? AND series_set_hash = ? AND time_slot IN ? AND ts >= ? AND ts <= ?",
            "write_exemplar": f"INSERT INTO {ks}.exemplars (tenant, series_set_hash, time_slot, ts, labels, value) VALUES (?, ?, ?, ?, ?, ?) USING TTL ?",
            "read_exemplars": (
                f"SELECT series_set_hash, ts, value, labels FROM {ks}.exemplars WHERE tenant = ? AND series_set_hash IN ? AND time_slot IN ?"
                f" PER PARTITION LIMIT {self.layout.max_exemplars_per_series}"
            ),
            "write_histogram": f"INSERT INTO {ks}.histograms (tenant, series_set_hash, time_slot, ts, data) VALUES (?, ?, ?, ?, ?) USING TTL ?",
            "read_histograms": f"SELECT series_set_hash, ts, data FROM {ks}.histograms WHERE tenant = ? AND series_set_hash IN ? AND time_slot IN ? AND ts >= ? AND ts <= ?",
            "write_histogram_series": f"INSERT INTO {ks}.histogram_series (tenant, source, time_slot, series_set_hash) VALUES (?, ?, ?, ?) USING TTL ?",
            "read_histogram_series": f"SELECT time_slot, series_set_hash FROM {ks}.histogram_series WHERE tenant = ? AND source IN ? AND time_slot IN ?",
            "list_tenants": f"SELECT tenant FROM {ks}.tenants",
            "list_metric_names": f"SELECT metric_name FROM {ks}.metric_names WHERE tenant = ?",
            "list_tag_keys": f"SELECT tag_key FROM {ks}.tag_keys WHERE tenant = ? AND metric_name = ?",
            "list_tag_values": f"SELECT tag_value FROM {ks}.tag_values WHERE tenant = ? AND metric_name = ? AND tag_key = ?",
            "find_series": f"SELECT series_set_hash FROM {ks}.series_sets WHERE tenant = ? AND metric_name = ? AND tag_key = ? AND tag_value = ?",
            "get_series": f"SELECT series_set_hash, metric_name, tags FROM {ks}.series_set_hashes WHERE tenant = ? AND series_set_hash IN ?",
            "write_created": f"UPDATE {ks}.series_set_hashes SET created_ms = ? WHERE tenant = ? AND series_set_hash = ?",
            "get_created": f"SELECT created_ms FROM {ks}.series_set_hashes WHERE tenant = ? AND series_set_hash = ?",
        }
        texts.update(self._delete_statements())
        for granularity in self.layout.granularities:
            table, histogram_table = granularity.table, granularity.histogram_table
            texts[f"write_{histogram_table}"] = (
                f"INSERT INTO {ks}.{histogram_table} (tenant, series_set_hash, time_slot, ts, data) VALUES (?, ?, ?, ?, ?) USING TTL ?"
            )
            texts[f"read_{histogram_table}"] = (
                f"SELECT series_set_hash, ts, data FROM {ks}.{histogram_table}"
                " WHERE tenant = ? AND series_set_hash IN ? AND time_slot IN ? AND ts >= ? AND ts <= ?"
            )
            texts[f"read_{table}"] = (
                f"SELECT ts, {', '.join(ROLLUP_COLUMNS)} FROM {ks}.{table}"
                " WHERE tenant = ? AND series_set_hash = ? AND time_slot = ? AND ts >= ? AND ts <= ?"
            )
            for columns in ROLLUP_COLUMN_SETS:
                assignments = ", ".join(f"{c} = ?" for c in columns)
                texts[f"write_{table}_{'_'.join(columns)}"] = (
                    f"UPDATE {ks}.{table} USING TTL ? SET {assignments}"
                    " WHERE tenant = ? AND series_set_hash = ? AND time_slot = ? AND ts = ?"
                )
        for name, text in texts.items():
            statement = self.session.prepare(text)
            is_write = text.startswith(("INSERT", "UPDATE", "DELETE"))
            statement.consistency_level = self.options.write_consistency if is_write else self.options.read_consistency
            statement.is_idempotent = name != "add_aggregators"
            self._statements[name] = statement

    def start(self):
        def connect():
            self.session = self._connect(self.keyspace)
            self._prepare_all()
            self._requests = RequestQueue(self.session, self.options.max_inflight, _unavailable)

        return threads.deferToThread(connect)

    def close(self):
        cluster = self.cluster
        return threads.deferToThread(cluster.shutdown) if cluster else defer.succeed(None)

    def _execute(self, statement, parameters=()) -> defer.Deferred:
        """One request; fires with all its rows (every page)."""
        return self._execute_all([(statement, parameters)]).addCallback(lambda results: results[0])

    def _execute_all(self, requests: list[tuple[object, tuple]], profile=EXEC_PROFILE_DEFAULT) -> defer.Deferred:
        """Requests through the store-wide bounded queue; fires with one row list per request."""
        if self._requests is None:
            return defer.fail(StoreUnavailable("cassandra: not connected"))
        return self._requests.run(requests, profile)

    def ping(self):
        return self._execute("SELECT release_version FROM system.local")

    def identity(self):
        """The keyspace and the id Cassandra gave its series table when it was created."""
        query = "SELECT id FROM system_schema.tables WHERE keyspace_name = %s AND table_name = 'series_set_hashes'"
        return self._execute(query, (self.keyspace,)).addCallback(lambda rows: f"{self.keyspace}:{rows[0].id}")

    def write_series(self, series: Sequence[SeriesKey]):
        s, rows = self._statements, index_rows(series)
        requests = [
            *((s["tenant"], row) for row in rows.tenants),
            *((s["metric_name"], row) for row in rows.metric_names),
            *((s["series_set_hash"], row) for row in rows.series_set_hashes),
            *((s["series_set"], row) for row in rows.series_sets),
            *((s["tag_key"], row) for row in rows.tag_keys),
            *((s["tag_value"], row) for row in rows.tag_values),
            *(
                (s["path_leaf" if leaf else "path_branch"], (tenant, parent, name))
                for tenant, parent, name, leaf in rows.graphite_paths
            ),
            *((s["tenant_tag_key"], row) for row in rows.tenant_tag_keys),
            *((s["tenant_tag_value"], row) for row in rows.tenant_tag_values),
            *((s["tag_metric"], row) for row in rows.tag_metrics),
        ]
        return self._execute_all(self._batched(requests))

    def list_path_children(self, tenant, parent):
        def nodes(rows):
            return sorted(PathNode(r.name, bool(r.is_leaf), bool(r.is_branch)) for r in rows)

        return self._execute(self._statements["list_path_children"], (tenant, parent)).addCallback(nodes)

    def list_tenant_tag_keys(self, tenant):
        return self._execute(self._statements["list_tenant_tag_keys"], (tenant,)).addCallback(
            lambda rows: [r.tag_key for r in rows]
        )

    def list_tenant_tag_values(self, tenant, tag_key):
        return self._execute(self._statements["list_tenant_tag_values"], (tenant, tag_key)).addCallback(
            lambda rows: [r.tag_value for r in rows]
        )

    def find_metrics_by_tag(self, tenant, tag_key, tag_value):
        return self._execute(self._statements["find_metrics_by_tag"], (tenant, tag_key, tag_value)).addCallback(
            lambda rows: [r.metric_name for r in rows]
        )

    def _ttl_s(self, tenant: str, retention: Callable[[Layout], int]) -> int:
        """The TTL of a row of ``tenant`` written now: ``retention`` of its layout (its own with
        --overrides, else the flags'). Rows written before keep the TTL they were written with."""
        return retention(self.retentions.for_tenant(tenant)) // 1000

    def write_rollups(self, granularity, rows):
        """An UPDATE of only the aggregates a row has, so no tombstones are written for the rest;
        each row with its tenant's retention of the granularity."""
        width, name = granularity.partition_width_ms, granularity.name
        requests = []
        for row in rows:
            columns = tuple(c for c in ROLLUP_COLUMNS if getattr(row, c) is not None)
            statement = self._statements[f"write_{granularity.table}_{'_'.join(columns)}"]
            key = (row.tenant, row.series_set_hash, time_slot(row.timestamp_ms, width), row.timestamp_ms)
            ttl = self._ttl_s(row.tenant, lambda layout: layout.granularity(name).retention_ms)
            requests.append((statement, (ttl, *(getattr(row, c) for c in columns), *key)))
        return self._execute_all(self._batched(requests))

    def read_rollups(self, granularity, tenant, series_set_hash, start_ms, end_ms):
        statement = self._statements[f"read_{granularity.table}"]
        slots = self._time_slots(start_ms, end_ms, granularity.partition_width_ms)
        requests = [(statement, (tenant, series_set_hash, slot, start_ms, end_ms)) for slot in slots]

        def rows(pages):
            return [Rollup(tenant, series_set_hash, *row) for page in pages for row in page]

        return self._execute_all(requests, PLAIN_ROWS).addCallback(rows)

    def mark_pending(self, rows, touched_ms):
        statement = self._statements["pending"]
        return self._execute_all(self._batched([(statement, (*row[:4], touched_ms)) for row in rows]))

    def list_pending(self, partition, before_slot):
        def rows(found):
            return sorted(
                PendingSet(r.partition, r.time_slot, r.tenant, r.series_set_hash, r.last_touch) for r in found
            )

        return self._execute(self._statements["list_pending"], (partition, before_slot)).addCallback(rows)

    def delete_pending(self, rows):
        return self._execute_all([(self._statements["delete_pending"], tuple(row)) for row in rows])

    def add_metric_aggregators(self, tenant, metric_name, aggregators):
        return self._execute(self._statements["add_aggregators"], (set(aggregators), tenant, metric_name))

    def get_metric_aggregators(self, tenant, metric_name):
        def aggregators(rows):
            return sorted(rows[0].aggregators or ()) if rows else []

        return self._execute(self._statements["get_aggregators"], (tenant, metric_name)).addCallback(aggregators)

    def write_metric_metadata(self, rows: Sequence[MetricMetadata]):
        return self._execute_all(self._batched([(self._statements["metric_metadata"], tuple(row)) for row in rows]))

    def get_metric_metadata(self, tenant, metric_name):
        def first(rows):
            return MetricMetadata(tenant, metric_name, rows[0].type, rows[0].help, rows[0].unit) if rows else None

        return self._execute(self._statements["get_metric_metadata"], (tenant, metric_name)).addCallback(first)

    def write_raw(self, points: Sequence[RawPoint]):
        """Head rows, each with the TTL of its slot, grouped by data_head partition (tenant, slice,
        shard) into single-partition UNLOGGED batches, and the slot's ``head_written_at`` in
        data_blocks where this process has not written it lately (read_raw finds head rows through it).
        Where a request holds one (series, ts) twice, its last value is written."""
        statement: Any = self._statements["head"]
        layout, now, consistency = self.layout, int(time.time() * 1000), self.options.write_consistency
        width, slice_width = self.slot_width_ms, layout.head_slice_ms
        partitions: dict[tuple[str, int, int], dict[tuple[str, int], float]] = defaultdict(dict)
        shards: dict[str, int] = {}
        for tenant, hash_, timestamp, value in points:
            shard = shards.get(hash_)
            if shard is None:
                shard = shards[hash_] = head_shard(hash_)
            partitions[(tenant, timestamp - timestamp % slice_width, shard)][(hash_, timestamp)] = value
        batches = []
        for (tenant, slice_ms, shard), rows in partitions.items():
            slot = slice_ms - slice_ms % width
            ttl = layout.head_ttl_ms(slot, now) // 1000 + 1
            values = [(tenant, slice_ms, shard, hash_, ts, value, ttl) for (hash_, ts), value in rows.items()]
            batches += [(head_batch(statement, chunk, consistency), ()) for chunk in _head_batches(values)]
        entries, fresh = self._written_at_updates(points, now)
        written = self._execute_all(self._batched(entries) + batches)
        return written.addCallback(lambda _: self._written_at_fresh.add_all(fresh))

    def _written_at_updates(self, points: Sequence[RawPoint], now: int) -> tuple[list[tuple[object, tuple]], dict]:
        """``head_written_at`` = now in the data_blocks rows of the batch's series-slots, but for those
        this process wrote an entry for lately: until ``max(slot end, entry) + settle_delay / 2``, a slot
        cannot have been sealed since (sealing waits for the slot's end and its last write to be
        ``settle_delay`` old), so a reader that finds the entry newer than the last seal reads the
        head rows anyway. A write after that refreshes the entry, so one that lands after a seal
        always makes its slot's head rows read again. Returns the requests and what to remember
        once they succeeded."""
        width, written, layout = self.slot_width_ms, self._written_at_fresh, self.layout
        keys = {(tenant, hash_, timestamp - timestamp % width) for tenant, hash_, timestamp, _ in points}
        requests, fresh = [], {}
        for key in keys:
            if (written.get(key) or 0) > now:
                continue
            tenant, hash_, slot = key
            ttl_ms = layout.head_ttl_ms(slot, now) + layout.settle_delay_ms + WRITTEN_AT_MARGIN_MS
            partition = time_slot(slot, layout.block_partition_width_ms)
            requests.append((self._statements["head_written"], (ttl_ms // 1000, now, tenant, hash_, partition, slot)))
            fresh[key] = max(key[2] + width, now) + layout.settle_delay_ms // 2
        return requests, fresh

    def read_raw(self, tenant, hashes, start_ms, end_ms):
        """The data_blocks rows of the range, READ_SERIES_PER_REQUEST series a request
        (``series_set_hash IN ?``) per block partition, then the head rows of the slots written
        since their last seal, if any (the head rows of the others are all in their blocks):
        from data_head, the series of one shard and slot together (``slice IN ? AND shard = ? AND
        series_set_hash IN ?``), and from data_raw (the head of the layout before data_head, one
        request a series) where a slot's ``written_at`` says it has rows there."""
        hashes = list(hashes)
        if end_ms < start_ms:
            return defer.succeed([RawData([], samples.empty()) for _ in hashes])
        width = self.slot_width_ms
        first, last = time_slot(start_ms, width), time_slot(end_ms, width)
        statement = self._statements["read_slots"]
        partitions = self._time_slots(first, last, self.layout.block_partition_width_ms)
        chunks = [hashes[i : i + READ_SERIES_PER_REQUEST] for i in range(0, len(hashes), READ_SERIES_PER_REQUEST)]
        requests = [
            (statement, (tenant, chunk, partition, first, last)) for chunk in chunks for partition in partitions
        ]

        def read_heads(pages):
            rows: dict[str, list] = {hash_: [] for hash_ in hashes}
            for page in pages:
                for hash_, slot, block, written, head_written, sealed in page:
                    rows[hash_].append((slot, block, written, head_written, sealed))
            blocks, legacy, unsealed = {}, [], defaultdict(list)
            for hash_, found in rows.items():
                found.sort(key=lambda row: row[0])
                blocks[hash_] = [block for _, block, _, _, _ in found if block is not None]
                legacy_slots = [slot for slot, _, written, _, sealed in found if _unsealed(written, sealed)]
                if legacy_slots:
                    legacy.append((hash_, legacy_slots))
                for slot, _, _, head_written, sealed in found:
                    if _unsealed(head_written, sealed):
                        unsealed[(head_shard(hash_), slot)].append(hash_)
            head_requests = self._head_reads(tenant, unsealed, start_ms, end_ms)
            legacy_requests = [
                (self._statements["read_legacy_head"], (tenant, hash_, slots, start_ms, end_ms))
                for hash_, slots in legacy
            ]

            def assemble(results):
                heads: dict[str, list] = defaultdict(list)
                for page in results[: len(head_requests)]:
                    for hash_, ts, value in page:
                        heads[hash_].append((ts, value))
                for (hash_, _), page in zip(legacy, results[len(head_requests) :]):
                    heads[hash_] += page
                return [RawData(blocks[h], _samples_of(heads[h]) if h in heads else samples.empty()) for h in hashes]

            return self._execute_all(head_requests + legacy_requests, PLAIN_ROWS).addCallback(assemble)

        return self._execute_all(requests, PLAIN_ROWS).addCallback(read_heads)

    def _head_reads(self, tenant: str, unsealed: dict[tuple[int, int], list[str]], start_ms: int, end_ms: int) -> list:
        """Requests for the data_head rows in a range of the series of each (shard, slot):
        READ_SERIES_PER_REQUEST series and HEAD_SLICES_PER_REQUEST of the slot's slices that
        overlap the range a request."""
        statement, requests = self._statements["read_head"], []
        for (shard, slot), slot_hashes in sorted(unsealed.items()):
            slices = self.layout.head_slices(slot, start_ms, end_ms)
            for i in range(0, len(slot_hashes), READ_SERIES_PER_REQUEST):
                chunk = slot_hashes[i : i + READ_SERIES_PER_REQUEST]
                for j in range(0, len(slices), HEAD_SLICES_PER_REQUEST):
                    some = slices[j : j + HEAD_SLICES_PER_REQUEST]
                    requests.append((statement, (tenant, some, shard, chunk, start_ms, end_ms)))
        return requests

    def write_block(self, tenant, series_set_hash, slot_ms, block, sealed, head_read_ms):
        return self._write_blocks([SealedBlock(tenant, series_set_hash, slot_ms, block, sealed, head_read_ms)])

    def write_blocks(self, blocks):
        return self._write_blocks(blocks)

    def _write_blocks(self, blocks: Sequence[SealedBlock]) -> defer.Deferred:
        """Each block and its row marked sealed as of the head's read (less a margin for clock
        skew) in one row update (so ``sealed_at`` lives as long as the block), so readers skip the
        head rows it holds; many series-slots a request (_batched). Head rows are left to their
        TTL: deleting them would write tombstones."""
        statement, width = self._statements["write_block"], self.layout.block_partition_width_ms
        margin = min(SEAL_CLOCK_MARGIN_MS, self.layout.settle_delay_ms // 2)
        requests = [
            (
                statement,
                (
                    self._ttl_s(b.tenant, lambda layout: layout.raw_retention_ms),
                    b.block,
                    b.head_read_ms - margin,
                    b.tenant,
                    b.series_set_hash,
                    time_slot(b.slot_ms, width),
                    b.slot_ms,
                ),
            )
            for b in blocks
        ]
        return self._execute_all(self._batched(requests))

    def write_exemplars(self, exemplars):
        """Rows with their tenant's --exemplar-retention; the per-series cap applies on reading."""
        statement, width = self._statements["write_exemplar"], self.slot_width_ms
        requests = [
            (
                statement,
                (
                    e.tenant,
                    e.series_set_hash,
                    time_slot(e.timestamp_ms, width),
                    e.timestamp_ms,
                    exemplar_labels_text(e.labels),
                    e.value,
                    self._ttl_s(e.tenant, lambda layout: layout.exemplar_retention_ms),
                ),
            )
            for e in exemplars
        ]
        return self._execute_all(self._batched(requests))

    def read_exemplars(self, tenant, hashes, start_ms, end_ms):
        """The newest ``max_exemplars_per_series`` of each slot (PER PARTITION LIMIT over the
        clustering order ts DESC, labels ASC), then those in the range: what SQLite keeps. Up to
        PARTITIONS_PER_REQUEST series-slots a request."""
        hashes = list(hashes)
        requests = self._partition_requests(self._statements["read_exemplars"], tenant, hashes, start_ms, end_ms)

        def collect(pages):
            rows: dict[str, list[ExemplarRow]] = {hash_: [] for hash_ in hashes}
            for page in pages:
                for hash_, ts, value, labels in page:
                    rows[hash_].append(ExemplarRow(tenant, hash_, ts, value, json.loads(labels)))
            return [exemplars_in_range(rows[hash_], start_ms, end_ms) for hash_ in hashes]

        return self._execute_all(requests, PLAIN_ROWS).addCallback(collect)

    def _time_slots(self, start_ms: int, end_ms: int, width_ms: int) -> range:
        """The slots (or partitions) ``width_ms`` wide of an inclusive range, at most the layout's
        longest retention before its end: a last guard, as the read path already cuts ranges to
        what the retentions hold (an open range listed 70 million 1 h slots and took a worker)."""
        return time_slots(max(start_ms, end_ms - self.layout.longest_retention_ms), end_ms, width_ms)

    def _partition_requests(self, statement, tenant, hashes, start_ms, end_ms, *more, width_ms: int | None = None):
        """Requests of up to PARTITIONS_PER_REQUEST series-slots of an inclusive range:
        (tenant, hashes, slots, *more) for a statement whose partitions are series-slots
        (slots ``width_ms`` wide, the slot width unless given)."""
        slots = list(self._time_slots(start_ms, end_ms, width_ms or self.slot_width_ms))
        return _slot_requests(statement, tenant, hashes, slots, *more)

    def write_histograms(self, histograms):
        """Rows with their tenant's --raw-retention."""
        return self._write_histogram_table(
            "histograms",
            self._statements["write_histogram"],
            self.slot_width_ms,
            histograms,
            lambda layout: layout.raw_retention_ms,
        )

    def read_histograms(self, tenant, hashes, start_ms, end_ms):
        return self._read_histogram_table(
            "histograms", self._statements["read_histograms"], self.slot_width_ms, tenant, hashes, start_ms, end_ms
        )

    def write_histogram_rollups(self, granularity, rows):
        """Rows with their tenant's retention of the granularity."""
        table, name = granularity.histogram_table, granularity.name
        return self._write_histogram_table(
            table,
            self._statements[f"write_{table}"],
            granularity.partition_width_ms,
            rows,
            lambda layout: layout.granularity(name).retention_ms,
        )

    def read_histogram_rollups(self, granularity, tenant, hashes, start_ms, end_ms):
        table = granularity.histogram_table
        return self._read_histogram_table(
            table, self._statements[f"read_{table}"], granularity.partition_width_ms, tenant, hashes, start_ms, end_ms
        )

    def _write_histogram_table(self, table: str, statement, width: int, histograms, retention: Callable[[Layout], int]):
        """The rows (kept their tenant's ``retention``) and, in the same requests, their
        series-slots in histogram_series (rewritten each time, so the index lives as long as the
        newest row it points at: the tenant's longest histogram retention)."""
        ttls = {tenant: self._ttl_s(tenant, retention) for tenant in {h.tenant for h in histograms}}
        requests: list[tuple[Any, tuple]] = [
            (
                statement,
                (h.tenant, h.series_set_hash, time_slot(h.timestamp_ms, width), h.timestamp_ms, h.data, ttls[h.tenant]),
            )
            for h in histograms
        ]
        indexed = {(h.tenant, time_slot(h.timestamp_ms, width), h.series_set_hash) for h in histograms}
        index = self._statements["write_histogram_series"]
        kept = {tenant: self._ttl_s(tenant, histogram_retention_ms) for tenant in ttls}
        requests += [(index, (tenant, table, slot, hash_, kept[tenant])) for tenant, slot, hash_ in sorted(indexed)]
        return self._execute_all(self._batched(requests))

    def _read_histogram_table(self, table: str, statement, width: int, tenant, hashes, start_ms, end_ms):
        """histogram_series first (one partition a slot), then only the series-slots it names."""
        hashes = list(hashes)
        wanted = set(hashes)
        slots = list(self._time_slots(start_ms, end_ms, width))
        lookups = _slot_requests(self._statements["read_histogram_series"], tenant, [table], slots)

        def read(pages):
            found: dict[int, list[str]] = defaultdict(list)
            for page in pages:
                for slot, hash_ in page:
                    if hash_ in wanted:
                        found[slot].append(hash_)
            requests = [
                request
                for slot, slot_hashes in sorted(found.items())
                for request in _slot_requests(statement, tenant, slot_hashes, [slot], start_ms, end_ms)
            ]
            return self._execute_all(requests, PLAIN_ROWS) if requests else []

        def collect(pages):
            rows: dict[str, list[HistogramRow]] = {hash_: [] for hash_ in hashes}
            for page in pages:
                for hash_, ts, data in page:
                    rows[hash_].append(HistogramRow(tenant, hash_, ts, bytes(data)))
            return [sorted(rows[hash_], key=lambda row: row.timestamp_ms) for hash_ in hashes]

        if not hashes or not slots:
            return defer.succeed([[] for _ in hashes])
        return self._execute_all(lookups, PLAIN_ROWS).addCallback(read).addCallback(collect)

    def sweep(self, now_ms):
        return defer.succeed(None)

    def _delete_statements(self) -> dict[str, str]:
        """The statements of deletes (delete_samples, delete_index_rows, write_path_flags)."""
        ks = self.keyspace
        block_key = "tenant = ? AND series_set_hash = ? AND block_partition = ? AND time_slot = ?"
        by_ts = "tenant = ? AND series_set_hash = ? AND time_slot = ? AND ts >= ? AND ts <= ?"
        tables = ["data_raw", "exemplars", "histograms"]
        head_key = "tenant = ? AND slice IN ? AND shard = ? AND series_set_hash = ? AND ts >= ? AND ts <= ?"
        for granularity in self.layout.granularities:
            tables += [granularity.table, granularity.histogram_table]
        return {
            "read_block": f"SELECT block FROM {ks}.data_blocks WHERE {block_key}",
            "cut_block": f"UPDATE {ks}.data_blocks USING TTL ? SET block = ? WHERE {block_key} IF block = ?",
            "delete_range_data_head": f"DELETE FROM {ks}.data_head WHERE {head_key}",
            "path_flags": f"UPDATE {ks}.graphite_paths SET is_leaf = ?, is_branch = ? WHERE tenant = ? AND parent = ? AND name = ?",
            **{f"delete_range_{table}": f"DELETE FROM {ks}.{table} WHERE {by_ts}" for table in tables},
            **{
                f"delete_index_{table}": f"DELETE FROM {ks}.{table} WHERE {' AND '.join(f'{c} = ?' for c in columns)}"
                for table, columns in INDEX_KEYS.items()
            },
        }

    def delete_samples(self, tenant, hashes, start_ms, end_ms):
        return defer.ensureDeferred(self._delete_samples(tenant, list(hashes), start_ms, end_ms))

    async def _delete_samples(self, tenant: str, hashes: list[str], start_ms: int, end_ms: int) -> None:
        """Each table from the later of ``start_ms`` and its retention's start (less a partition):
        blocks cut one compare-and-set at a time (cut_blocks), then range deletes of the
        partitions that have rows: head rows of slots written, exemplars read in the range,
        histograms and their roll-ups by histogram_series, every roll-up partition of the range."""
        layout, now = self.retentions.widest(), int(time.time() * 1000)  # as far back as any tenant's rows
        width = self.slot_width_ms
        raw_start = max(start_ms, now - layout.raw_retention_ms - layout.block_partition_width_ms)
        deletes: list[tuple[Any, tuple]] = []
        if raw_start <= end_ms:
            deletes += await self._cut_blocks(tenant, hashes, raw_start, end_ms)
            deletes += await self._histogram_deletes("histograms", width, tenant, hashes, raw_start, end_ms)
        exemplar_start = max(start_ms, now - layout.exemplar_retention_ms - width)
        if exemplar_start <= end_ms:
            requests = self._partition_requests(
                self._statements["read_exemplars"], tenant, hashes, exemplar_start, end_ms
            )
            found = {(row[0], time_slot(row[1], width)) for page in await self._execute_all(requests) for row in page}
            statement = self._statements["delete_range_exemplars"]
            deletes += [(statement, (tenant, h, slot, start_ms, end_ms)) for h, slot in sorted(found)]
        for granularity in layout.granularities:
            partition = granularity.partition_width_ms
            oldest = max(start_ms, now - granularity.retention_ms - partition)
            if oldest > end_ms:
                continue
            first, last = bucket_range(oldest, end_ms, granularity.width_ms)
            statement = self._statements[f"delete_range_{granularity.table}"]
            deletes += [
                (statement, (tenant, h, slot, first, last))
                for h in hashes
                for slot in time_slots(first, last, partition)
            ]
            deletes += await self._histogram_deletes(
                granularity.histogram_table, partition, tenant, hashes, first, last
            )
        await self._execute_all(deletes)

    async def _histogram_deletes(self, table: str, width: int, tenant, hashes, start_ms: int, end_ms: int) -> list:
        """Range deletes of the partitions of a histogram table that histogram_series names."""
        wanted = set(hashes)
        slots = list(time_slots(start_ms, end_ms, width))
        lookups = _slot_requests(self._statements["read_histogram_series"], tenant, [table], slots)
        statement = self._statements[f"delete_range_{table}"]
        return [
            (statement, (tenant, hash_, slot, start_ms, end_ms))
            for page in await self._execute_all(lookups, PLAIN_ROWS)
            for slot, hash_ in page
            if hash_ in wanted
        ]

    async def _cut_blocks(self, tenant: str, hashes: list[str], start_ms: int, end_ms: int) -> list:
        """Cut the blocks of the range, each with ``IF block = <the bytes it was cut from>``: a seal
        that wrote the block meanwhile fails the condition, and the block is read and cut again,
        so the seal's samples outside the range stay. Returns the range deletes of the head rows
        of every slot ever written (written_at: data_raw, head_written_at: data_head)."""
        width = self.slot_width_ms
        first, last = time_slot(start_ms, width), time_slot(end_ms, width)
        statement = self._statements["read_slots"]
        chunks = [hashes[i : i + READ_SERIES_PER_REQUEST] for i in range(0, len(hashes), READ_SERIES_PER_REQUEST)]
        partitions = time_slots(first, last, self.layout.block_partition_width_ms)
        requests = [(statement, (tenant, chunk, p, first, last)) for chunk in chunks for p in partitions]
        legacy, head = self._statements["delete_range_data_raw"], self._statements["delete_range_data_head"]
        deletes: list[tuple[Any, tuple]] = []
        cuts = []
        for page in await self._execute_all(requests, PLAIN_ROWS):
            for hash_, slot, block, written, head_written, _ in page:
                if written is not None:
                    deletes.append((legacy, (tenant, hash_, slot, start_ms, end_ms)))
                slices = self.layout.head_slices(slot, start_ms, end_ms)
                if head_written is not None and slices:
                    deletes.append((head, (tenant, slices, head_shard(hash_), hash_, start_ms, end_ms)))
                if block is not None:
                    key = (tenant, hash_, time_slot(slot, self.layout.block_partition_width_ms), slot)
                    cuts.append(defer.ensureDeferred(self._cut_block(key, block, start_ms, end_ms)))
        await defer.gatherResults(cuts, consumeErrors=True)
        return deletes

    async def _cut_block(self, key: tuple, block: bytes, start_ms: int, end_ms: int) -> None:
        for _ in range(CUT_BLOCK_ATTEMPTS):
            cut = await threads.deferToThread(cut_block, block, start_ms, end_ms)
            if cut is block:
                return
            ttl = self._ttl_s(key[0], lambda layout: layout.raw_retention_ms)
            (row,) = await self._execute(self._statements["cut_block"], (ttl, cut, *key, block))
            if row[0]:
                return
            found = await self._execute(self._statements["read_block"], key)
            if not found or found[0].block is None:
                return
            block = found[0].block
        raise StoreUnavailable(f"cassandra: block {key} kept changing while it was cut; delete again")

    def delete_index_rows(self, rows):
        requests = [(self._statements[f"delete_index_{table}"], key) for table, keys in rows.items() for key in keys]
        return self._execute_all(self._batched(requests))

    def write_path_flags(self, tenant, parent, name, is_leaf, is_branch):
        if is_leaf or is_branch:
            return self._execute(self._statements["path_flags"], (is_leaf, is_branch, tenant, parent, name))
        return self._execute(self._statements["delete_index_graphite_paths"], (tenant, parent, name))

    def _batched(self, requests: list[tuple[Any, tuple]]) -> list[tuple[Any, tuple]]:
        """Single-row writes as UNLOGGED batches of up to ROWS_PER_BATCH rows sharing a replica.

        A batch goes to one coordinator, which applies each partition's mutation; when that node
        is a replica of every partition in the batch, batching saves the per-request cost on both
        sides (the driver's request path is most of a Python client's CPU per row) without the
        extra hop that makes multi-partition batches an anti-pattern. So rows are grouped by the
        first replica of their partition (one group on a one-node cluster), in the given order.
        """
        if len(requests) <= 1:
            return requests
        bound = [statement.bind(parameters) for statement, parameters in requests]
        batched = []
        for group in self._by_replica(bound):
            chunk: list = []
            size = 0
            for statement in group:
                statement_size = sum(len(value) for value in statement.values if value)
                if chunk and (len(chunk) == ROWS_PER_BATCH or size + statement_size > BATCH_VALUE_BYTES):
                    batched.append(self._batch(chunk))
                    chunk, size = [], 0
                chunk.append(statement)
                size += statement_size
            batched.append(self._batch(chunk))
        return batched

    def _batch(self, statements: list) -> tuple[object, tuple]:
        if len(statements) == 1:
            return statements[0], ()
        batch = BatchStatement(BatchType.UNLOGGED, consistency_level=self.options.write_consistency)
        for statement in statements:
            batch.add(statement)
        batch.is_idempotent = all(statement.is_idempotent for statement in statements)
        return batch, ()

    def _by_replica(self, bound: list) -> list[list]:
        token_map = self.cluster.metadata.token_map
        if token_map is None or len(self.cluster.metadata.all_hosts()) <= 1:
            return [bound]
        groups: dict[object, list] = defaultdict(list)
        for statement in bound:
            replicas = token_map.get_replicas(self.keyspace, token_map.token_class.from_key(statement.routing_key))
            groups[replicas[0] if replicas else None].append(statement)
        return list(groups.values())

    def list_tenants(self):
        return self._execute(self._statements["list_tenants"]).addCallback(lambda rows: sorted(r.tenant for r in rows))

    def list_metric_names(self, tenant):
        return self._execute(self._statements["list_metric_names"], (tenant,)).addCallback(
            lambda rows: [r.metric_name for r in rows]
        )

    def list_tag_keys(self, tenant, metric_name):
        return self._execute(self._statements["list_tag_keys"], (tenant, metric_name)).addCallback(
            lambda rows: [r.tag_key for r in rows]
        )

    def list_tag_values(self, tenant, metric_name, tag_key):
        return self._execute(self._statements["list_tag_values"], (tenant, metric_name, tag_key)).addCallback(
            lambda rows: [r.tag_value for r in rows]
        )

    def find_series(self, tenant, metric_name, tag_key, tag_value):
        return self._execute(self._statements["find_series"], (tenant, metric_name, tag_key, tag_value)).addCallback(
            lambda rows: {r.series_set_hash for r in rows}
        )

    def write_created_timestamps(self, rows):
        statement = self._statements["write_created"]
        return self._execute_all(
            self._batched([(statement, (r.created_ms, r.tenant, r.series_set_hash)) for r in rows])
        )

    def get_created_timestamps(self, tenant, hashes: Iterable[str]):
        hashes = list(hashes)
        statement = self._statements["get_created"]

        def collect(results):
            return {h: rows[0][0] for h, rows in zip(hashes, results) if rows and rows[0][0] is not None}

        return self._execute_all([(statement, (tenant, h)) for h in hashes], PLAIN_ROWS).addCallback(collect)

    def get_series(self, tenant, hashes: Iterable[str]):
        """READ_SERIES_PER_REQUEST series a request (``series_set_hash IN ?``): the downsampler
        asks for a whole sealing group at once."""
        hashes = sorted(set(hashes))
        statement = self._statements["get_series"]
        chunks = [hashes[i : i + READ_SERIES_PER_REQUEST] for i in range(0, len(hashes), READ_SERIES_PER_REQUEST)]

        def collect(pages):
            return {
                row.series_set_hash: SeriesKey(tenant, row.series_set_hash, row.metric_name, dict(row.tags or {}))
                for page in pages
                for row in page
            }

        return self._execute_all([(statement, (tenant, chunk)) for chunk in chunks]).addCallback(collect)


def _slot_requests(statement, partition_key, keys: Sequence, slots: Sequence[int], *more) -> list[tuple[object, tuple]]:
    """Requests of up to PARTITIONS_PER_REQUEST partitions (partition_key, key, slot), two INs:
    (partition_key, keys, slots, *more)."""
    slot_chunk = max(1, min(len(slots), PARTITIONS_PER_REQUEST))
    key_chunk = max(1, PARTITIONS_PER_REQUEST // slot_chunk)
    return [
        (statement, (partition_key, keys[i : i + key_chunk], slots[j : j + slot_chunk], *more))
        for i in range(0, len(keys), key_chunk)
        for j in range(0, len(slots), slot_chunk)
    ]


def _unsealed(written: int | None, sealed: int | None) -> bool:
    """A slot whose head (one of its tables) was written since its last seal."""
    return written is not None and (sealed is None or written > sealed)


def _head_batches(rows: list[tuple]) -> list[list[tuple]]:
    """data_head rows of one partition (statement values) in chunks of at most HEAD_ROWS_PER_BATCH
    rows and about HEAD_BATCH_VALUE_BYTES of values."""
    chunks: list[list[tuple]] = []
    chunk: list[tuple] = []
    size = 0
    for row in rows:
        row_size = len(row[0]) + len(row[3]) + 36  # tenant, hash and five numbers
        if chunk and (len(chunk) == HEAD_ROWS_PER_BATCH or size + row_size > HEAD_BATCH_VALUE_BYTES):
            chunks.append(chunk)
            chunk, size = [], 0
        chunk.append(row)
        size += row_size
    if chunk:
        chunks.append(chunk)
    return chunks


def head_batch(statement, rows: list[tuple], consistency: int) -> BatchStatement:
    """One single-partition UNLOGGED batch of data_head rows (statement values). The driver's
    ``bind()`` costs about 7 µs a row (a BoundStatement, its checks, its routing key), most of
    the gateway's CPU per sample; the rows of one partition share their key, so only the first
    is bound (the batch takes its routing key and keyspace from it) and the others are added as
    values serialized here as ``bind()`` would (text as UTF-8, bigint, int and double
    big-endian: 0.6 µs a row), through the batch's own ``_add_statement_and_params``
    (cassandra-driver 3.29-3.30; tests/test_cassandra_head.py reads every row back)."""
    batch = BatchStatement(BatchType.UNLOGGED, consistency_level=consistency)
    batch.add(statement.bind(rows[0]))
    tenant, slice_ms, shard, _, _, _, ttl = rows[0]
    key = [tenant.encode(), _BIGINT(slice_ms), _INT(shard)]
    ttl_bytes, query_id, add = _INT(ttl), statement.query_id, batch._add_statement_and_params
    for _, _, _, hash_, ts, value, _ in rows[1:]:
        add(True, query_id, [*key, hash_.encode(), _BIGINT(ts), _DOUBLE(value), ttl_bytes])
    batch.is_idempotent = True
    return batch


def _samples_of(rows: list[tuple[int, float]]) -> Samples:
    """(ts, value) rows of several head partitions, in any slot order -> Samples."""
    if not rows:
        return samples.empty()
    array = np.array(rows, dtype=[("ts", np.int64), ("value", np.float64)])
    return samples.merge([Samples(array["ts"], array["value"])])
