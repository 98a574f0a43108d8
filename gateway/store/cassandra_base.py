"""The machinery every role of the Cassandra driver shares: options and connection, prepared
statements, the bounded request queue (cassandra_requests.py), batching and the errors that
become StoreUnavailable.
"""

import abc
import contextlib
import functools
import logging
import ssl
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Self
from urllib.parse import parse_qsl, unquote

from cassandra import OperationTimedOut, RequestExecutionException
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
from cassandra.connection import ConnectionException
from cassandra.policies import DCAwareRoundRobinPolicy, ExponentialReconnectionPolicy, RetryPolicy, TokenAwarePolicy
from cassandra.query import BatchStatement, BatchType, tuple_factory
from prometheus_client import Counter
from twisted.internet import defer
from twisted.python.threadpool import ThreadPool

from gateway.core import blocking
from gateway.core.layout import Layout
from gateway.store.cassandra_options import parse_consistency, parse_replication
from gateway.store.cassandra_requests import RequestQueue
from gateway.store.cassandra_schema import SchemaOptions
from gateway.store.contract import Store, StoreUnavailable, time_slots
from protocols.timespec import parse_duration

DRIVER_RETRIES = Counter("tsgate_cassandra_retries", "Requests the driver's retry policy retried", ["cause"])
DRIVER_ERRORS = Counter("tsgate_cassandra_errors", "Requests that failed, by error", ["error"])
BATCH_WARNINGS = Counter(
    "tsgate_cassandra_batch_warnings", "Cassandra's warnings about our multi-partition or large UNLOGGED batches"
)


class BatchWarningFilter(logging.Filter):
    """Cassandra answers every UNLOGGED batch over 10 partitions or 5 KiB with a warning, which the
    driver (and acsylla) logs per request: thousands of lines a second at full ingest. tsgate sends
    such batches on purpose (rows grouped by replica, see CassandraStore._batched and the head rows
    of CassandraSamples.write_raw), so they are counted, and logged once per ``interval`` seconds.
    Every other server warning is logged as it comes."""

    MARKERS = ("Unlogged batch covering", "Batch for [")

    def __init__(self, interval: float = 600.0):
        super().__init__()
        self.interval = interval
        self._last = -interval

    def drops(self, message: str) -> bool:
        """A batch warning within ``interval`` of the last one logged: counted, not to be logged."""
        if time.monotonic() - self._last >= self.interval or not any(m in message for m in self.MARKERS):
            return False
        BATCH_WARNINGS.inc()
        return True

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self.drops(message):
            return False
        if not any(marker in message for marker in self.MARKERS):
            return True
        BATCH_WARNINGS.inc()
        self._last = time.monotonic()
        record.msg, record.args = (
            "%s (expected: tsgate batches rows by replica; counted in tsgate_cassandra_batch_warnings_total, logged once per %ds)",
            (message, self.interval),
        )
        return True


logging.getLogger("cassandra.protocol").addFilter(BatchWarningFilter())

# An UNLOGGED batch holds at most this many rows and bytes of values: 50 data_raw rows are about
# Cassandra's batch_size_warn_threshold (5 KiB); the byte bound keeps batches of big metadata rows
# (long tag values) far under batch_size_fail_threshold (50 KiB). docs/performance-log.rst measured it.
ROWS_PER_BATCH = 50
PROTOCOL_VERSION = 5
BIND_ON_CALLER_ROWS = 256  # a write of more rows is bound on the binder thread (_write_rows)
BATCH_VALUE_BYTES = 16 * 1024

# Series whose data_blocks rows one request reads (an IN on the partition key): the Python driver's
# cost per request, not Cassandra, was most of a read of many series.
READ_SERIES_PER_REQUEST = 64

# Series-slots (partitions: two INs on the partition key) whose exemplars or histograms one request
# reads: a remote read of many series over a few slots costs a few requests, not one a series.
PARTITIONS_PER_REQUEST = 256

# The rows of one series-slot in an inclusive range of timestamps: the key of range deletes.
RANGE_BY_TS = "tenant = ? AND series_set_hash = ? AND time_slot = ? AND ts >= ? AND ts <= ?"

# The execution profile of data reads: rows as plain tuples. The driver's default builds a
# namedtuple class per page and a namedtuple per row, a third of a render's CPU (docs/performance-log.rst).
PLAIN_ROWS = "plain_rows"


# The clients bulk writes (data_head rows, _write_rows) can go through (URL option head_writer):
# acsylla (cassandra_acsylla.py, 4-5 times less CPU a row) or cassandra-driver like every other statement.
HEAD_WRITERS = ("acsylla", "driver")


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
    head_writer: str = "acsylla"


def parse_url(url: str, layout: Layout) -> CassandraOptions:
    """``cassandra://[user:password@]host[:port][,host[:port]...]/keyspace[?option=value&...]``

    Options: replication (simple:N or DC:N,DC:N), consistency (both), read_consistency,
    write_consistency (those three also flags: gateway/store/cassandra_options.py), local_dc, username, password, tls (true/false), tls_ca (CA file),
    request_timeout (duration), max_inflight (requests in flight), head_writer (acsylla or
    driver: the client of data_head writes). docs/configuration.rst.
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
        "head_writer",
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
    consistency = options.get("consistency", "LOCAL_QUORUM")  # both, where the read or write one is not given
    max_inflight = int(options.get("max_inflight", "256"))
    if max_inflight < 1:
        raise ValueError("max_inflight must be at least 1")
    head_writer = options.get("head_writer", "acsylla")
    if head_writer not in HEAD_WRITERS:
        raise ValueError(f"head_writer {head_writer!r} is not one of {', '.join(HEAD_WRITERS)}")
    return CassandraOptions(
        hosts=hosts,
        schema=SchemaOptions(keyspace, parse_replication(options.get("replication", "simple:1")), layout),
        read_consistency=parse_consistency(options.get("read_consistency", consistency)),
        write_consistency=parse_consistency(options.get("write_consistency", consistency)),
        local_dc=options.get("local_dc") or None,
        username=unquote(username) or options.get("username") or None,
        password=unquote(password) or options.get("password") or None,
        tls=options.get("tls", "false").lower() in ("1", "true", "yes"),
        tls_ca=options.get("tls_ca") or None,
        request_timeout_s=parse_duration(options.get("request_timeout", "10s")) / 1000,
        max_inflight=max_inflight,
        head_writer=head_writer,
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


def unavailable_error(error: Exception) -> Exception:
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


def slot_requests(statement, partition_key, keys: Sequence, slots: Sequence[int], *more) -> list[tuple[object, tuple]]:
    """Requests of up to PARTITIONS_PER_REQUEST partitions (partition_key, key, slot), two INs:
    (partition_key, keys, slots, *more)."""
    slot_chunk = max(1, min(len(slots), PARTITIONS_PER_REQUEST))
    key_chunk = max(1, PARTITIONS_PER_REQUEST // slot_chunk)
    return [
        (statement, (partition_key, keys[i : i + key_chunk], slots[j : j + slot_chunk], *more))
        for i in range(0, len(keys), key_chunk)
        for j in range(0, len(slots), slot_chunk)
    ]


# Cassandra refuses a TTL over 20 years; a row that would need more lives that long.
MAX_TTL_S = 20 * 365 * 24 * 3600


class CassandraBase(Store):
    """Connection, statements and request running; each role's mixin (cassandra_*.py) builds on it."""

    def __init__(self, options: CassandraOptions):
        super().__init__(options.schema.layout)
        self.options = options
        self.keyspace = options.schema.keyspace
        self.ttl_s = options.schema.raw_retention_ms // 1000
        self.cluster: Any = None  # a Cluster once open() ran
        self.session: Any = None  # its Session
        self._requests: RequestQueue | None = None
        self._acsylla: Any = None  # an AcsyllaWriter once start() ran, unless head_writer=driver
        self._statements: dict[str, object] = {}
        # Binds the rows of large writes (_write_rows), started by start(): one thread, see there.
        self._binder = ThreadPool(1, 1, name="cassandra-binder")
        # a daemon: a process that never closes its store (a worker killed at its stop deadline) still exits
        self._binder.threadFactory = functools.partial(threading.Thread, daemon=True)  # type: ignore[assignment]

    @classmethod
    def from_url(cls, url: str, layout: Layout) -> Self:
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
            protocol_version=PROTOCOL_VERSION,
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
            unavailable = unavailable_error(error)
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

    @abc.abstractmethod
    async def _histogram_deletes(self, table: str, width: int, tenant, hashes, start_ms: int, end_ms: int) -> list:
        """The range deletes of a histogram table (CassandraHistograms): CassandraSamples' delete_samples
        deletes histograms too."""

    def _statement_texts(self) -> dict[str, str]:
        """The CQL of every prepared statement, by name: each role's mixin adds its own."""
        return {}

    def _prepare_all(self) -> None:
        for name, text in self._statement_texts().items():
            statement = self.session.prepare(text)
            is_write = text.startswith(("INSERT", "UPDATE", "DELETE"))
            statement.consistency_level = self.options.write_consistency if is_write else self.options.read_consistency
            statement.is_idempotent = name != "add_aggregators"
            self._statements[name] = statement

    def _execute(self, statement, parameters=()) -> defer.Deferred:
        """One request; fires with all its rows (every page)."""
        return self._execute_all([(statement, parameters)]).addCallback(lambda results: results[0])

    def _execute_all(self, requests: list[tuple[object, tuple]], profile=EXEC_PROFILE_DEFAULT) -> defer.Deferred:
        """Requests through the store-wide bounded queue; fires with one row list per request."""
        if self._requests is None:
            return defer.fail(StoreUnavailable("cassandra: not connected"))
        return self._requests.run(requests, profile)

    def _ttl_s(self, tenant: str, retention: Callable[[Layout], int]) -> int:
        """The TTL of a row of ``tenant`` written now: ``retention`` of its layout (its own with
        --overrides, else the flags'). Rows written before keep the TTL they were written with."""
        return retention(self.retentions.for_tenant(tenant)) // 1000

    def _all_time_ttl_s(self, tenant: str) -> int:
        """The TTL of an all-time index row (or metric metadata) of ``tenant`` written now: it ends
        once the data of its series expired (the longest retention from now, and
        ``all_time_margin_ms``), unless a series rewrites it meanwhile (index.DailyRefresh)."""
        ttl_s = self._ttl_s(tenant, lambda layout: layout.longest_retention_ms + self.all_time_margin_ms)
        return min(ttl_s, MAX_TTL_S)

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
        return slot_requests(statement, tenant, hashes, slots, *more)

    def _write_rows(self, requests: list[tuple[Any, tuple]] | Callable[[], list[tuple[Any, tuple]]]) -> defer.Deferred:
        """Single-row writes, in UNLOGGED batches of rows that share a replica; fires once all are
        written. ``requests`` may be a function that builds them, to build them off the reactor too.

        Up to BIND_ON_CALLER_ROWS rows are bound on the caller, by cassandra-driver. More, and
        whatever a function builds, are bound on the store's one binder thread, by acsylla (one C
        call a row) unless the URL says head_writer=driver: the 20,000 new series of a large
        remote write are hundreds of thousands of index rows. Bound on the reactor they stall
        it; bound in the reactor's pool of eight threads at once, they kept it waiting for the
        GIL behind all of them (/healthz p50 0.5 s, max 2.8 s, under two such writers; the stop
        of a gateway in that state was seconds late). One thread takes the GIL in turns with the
        reactor alone."""
        if not callable(requests) and len(requests) <= BIND_ON_CALLER_ROWS:
            return self._execute_all(self._batched(requests))
        build = requests if callable(requests) else lambda: requests
        writer = self._acsylla
        if writer is None:
            return blocking.in_pool(self._binder, lambda: self._batched(build())).addCallback(self._execute_all)

        def bound() -> list:
            batches = self._chunked(build(), lambda request: _values_size(request[1]), routing_key)
            return [writer.bound([(statement.query_string, values) for statement, values in rows]) for rows in batches]

        return blocking.in_pool(self._binder, bound).addCallback(writer.run)

    def _batched(self, requests: list[tuple[Any, tuple]]) -> list[tuple[Any, tuple]]:
        """Single-row writes as UNLOGGED batches of cassandra-driver, by _chunked."""
        if len(requests) <= 1:
            return requests
        bound = [statement.bind(parameters) for statement, parameters in requests]
        chunks = self._chunked(bound, lambda statement: _values_size(statement.values), _bound_routing_key)
        return [self._batch(chunk) for chunk in chunks]

    def _chunked(self, rows: list, size: Callable[[Any], int], key: Callable[[Any], bytes]) -> list[list]:
        """Rows in batches of up to ROWS_PER_BATCH rows and BATCH_VALUE_BYTES that share a replica.

        A batch goes to one coordinator, which applies each partition's mutation; when that node
        is a replica of every partition in the batch, batching saves the per-request cost on both
        sides (the driver's request path is most of a Python client's CPU per row) without the
        extra hop that makes multi-partition batches an anti-pattern. So rows are grouped by the
        first replica of their partition (``key``: its routing key; one group on a one-node
        cluster), in the given order.
        """
        batches = []
        for group in self._by_replica(rows, key):
            chunk: list = []
            total = 0
            for row in group:
                row_size = size(row)
                if chunk and (len(chunk) == ROWS_PER_BATCH or total + row_size > BATCH_VALUE_BYTES):
                    batches.append(chunk)
                    chunk, total = [], 0
                chunk.append(row)
                total += row_size
            if chunk:
                batches.append(chunk)
        return batches

    def _batch(self, statements: list) -> tuple[object, tuple]:
        if len(statements) == 1:
            return statements[0], ()
        batch = BatchStatement(BatchType.UNLOGGED, consistency_level=self.options.write_consistency)
        for statement in statements:
            batch.add(statement)
        batch.is_idempotent = all(statement.is_idempotent for statement in statements)
        return batch, ()

    def _token_map(self):
        """The driver's token map, or None on a one-node cluster (every partition on one replica)."""
        token_map = self.cluster.metadata.token_map
        return None if token_map is None or len(self.cluster.metadata.all_hosts()) <= 1 else token_map

    def _by_replica(self, rows: list, key: Callable[[Any], bytes]) -> list[list]:
        token_map = self._token_map()
        if token_map is None:
            return [rows]
        groups: dict[object, list] = defaultdict(list)
        for row in rows:
            replicas = token_map.get_replicas(self.keyspace, token_map.token_class.from_key(key(row)))
            groups[replicas[0] if replicas else None].append(row)
        return list(groups.values())


def _values_size(values) -> int:
    """About the bytes a row's values take in a batch (a bound statement's are serialized already;
    an unbound row's texts, blobs and maps of texts, the tags of series_sets, count)."""
    size = 0
    for value in values:
        if isinstance(value, (str, bytes)):
            size += len(value)
        elif isinstance(value, dict):
            size += sum(len(key) + len(item) for key, item in value.items())
    return size


def _bound_routing_key(statement) -> bytes:
    return statement.routing_key


def routing_key(request: tuple[Any, tuple]) -> bytes:
    """The partition key of a (prepared statement, values) row, serialized as cassandra-driver's
    BoundStatement.routing_key does, without binding the row: each component as a 2-byte length,
    its bytes and a zero byte, or a lone component's bytes."""
    statement, values = request
    columns = statement.column_metadata
    parts = [columns[i].type.serialize(values[i], PROTOCOL_VERSION) for i in statement.routing_key_indexes]
    if len(parts) == 1:
        return parts[0]
    return b"".join(len(part).to_bytes(2, "big") + part + b"\x00" for part in parts)
