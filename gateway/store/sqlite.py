"""The embedded default store: one SQLite file (WAL, synchronous=FULL, so a commit is durable).

The tables mirror the Cassandra ones column for column (see contract.py), with two differences
that stand in for Cassandra's TTLs: sealing a slot deletes the head rows it sealed, in the same
transaction as the block's write, and ``sweep`` deletes blocks, head rows, roll-ups, exemplars and
histograms (and their roll-ups) past their retention, then gives the freed pages back to the file system (incremental auto-vacuum). Data
blocks are in an ordinary rowid table (not WITHOUT ROWID, which suits only small rows). SQLite
calls block, so they run on threads: one writer thread (SQLite allows one writer at a time) and a
small pool of readers, each thread with its own connection.

Writes commit in groups: the writes that arrive while a transaction commits all go into the next
one (``_commit``), so under load one commit (one fsync, one pass over the B-tree pages the rows
land on) carries many requests. Each write's Deferred still fires only once its rows are
committed; if a group fails, its writes are retried one transaction each, so one bad write fails
alone.
"""

import json
import math
import sqlite3
import struct
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np
from twisted.internet import reactor, threads
from twisted.internet.defer import Deferred, succeed
from twisted.python.threadpool import ThreadPool

from gateway import samples
from gateway.model import SeriesKey
from gateway.samples import Samples
from gateway.store.contract import (
    ROLLUP_COLUMNS,
    ExemplarRow,
    HistogramRow,
    MetricMetadata,
    PathNode,
    PendingSet,
    RawData,
    RawPoint,
    Rollup,
    Store,
    StoreUnavailable,
    exemplar_labels_text,
    exemplars_in_range,
    time_slot,
)
from gateway.store.deletion import INDEX_KEYS, bucket_range, cut_block
from gateway.store.index import index_rows
from gateway.store.layout import Layout, Retentions

SCHEMA_VERSION = 7
# The writer's page cache: head rows of many series land on as many B-tree pages a commit, and
# with SQLite's default 2 MiB those pages were read back for every commit (docs/performance.rst).
WRITER_CACHE_KIB = 64 * 1024

ROLLUP_TABLE = """
CREATE TABLE IF NOT EXISTS {table} (
    tenant TEXT NOT NULL,
    series_set_hash TEXT NOT NULL,
    time_slot INTEGER NOT NULL,
    ts INTEGER NOT NULL,
    min REAL, max REAL, sum REAL, count INTEGER, last REAL, increase REAL,
    PRIMARY KEY (tenant, series_set_hash, time_slot, ts)
) WITHOUT ROWID;
"""

# Native histograms (``histograms``) and their roll-ups (``histograms_5m``...).
HISTOGRAM_TABLE = """
CREATE TABLE IF NOT EXISTS {table} (
    tenant TEXT NOT NULL,
    series_set_hash TEXT NOT NULL,
    time_slot INTEGER NOT NULL,
    ts INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (tenant, series_set_hash, time_slot, ts)
) WITHOUT ROWID;
"""

# Which series have rows in a time slot (partition slot) of a histogram table (``source``): reads
# query only those series, so float-only series cost one lookup a read, not one a series.
HISTOGRAM_SERIES_TABLE = """
CREATE TABLE IF NOT EXISTS histogram_series (
    tenant TEXT NOT NULL,
    source TEXT NOT NULL,
    time_slot INTEGER NOT NULL,
    series_set_hash TEXT NOT NULL,
    PRIMARY KEY (tenant, source, time_slot, series_set_hash)
) WITHOUT ROWID;
"""

SCHEMA = """
CREATE TABLE IF NOT EXISTS tenants (
    tenant TEXT NOT NULL PRIMARY KEY
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS metric_names (
    tenant TEXT NOT NULL,
    metric_name TEXT NOT NULL,
    aggregators TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (tenant, metric_name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pending_downsample_sets (
    partition INTEGER NOT NULL,
    time_slot INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    series_set_hash TEXT NOT NULL,
    last_touch INTEGER NOT NULL,
    PRIMARY KEY (partition, time_slot, tenant, series_set_hash)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS series_set_hashes (
    tenant TEXT NOT NULL,
    series_set_hash TEXT NOT NULL,
    metric_name TEXT NOT NULL,
    tags TEXT NOT NULL,
    created_ms INTEGER,
    PRIMARY KEY (tenant, series_set_hash)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS series_sets (
    tenant TEXT NOT NULL,
    metric_name TEXT NOT NULL,
    tag_key TEXT NOT NULL,
    tag_value TEXT NOT NULL,
    series_set_hash TEXT NOT NULL,
    PRIMARY KEY (tenant, metric_name, tag_key, tag_value, series_set_hash)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tag_keys (
    tenant TEXT NOT NULL,
    metric_name TEXT NOT NULL,
    tag_key TEXT NOT NULL,
    PRIMARY KEY (tenant, metric_name, tag_key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tag_values (
    tenant TEXT NOT NULL,
    metric_name TEXT NOT NULL,
    tag_key TEXT NOT NULL,
    tag_value TEXT NOT NULL,
    PRIMARY KEY (tenant, metric_name, tag_key, tag_value)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS graphite_paths (
    tenant TEXT NOT NULL,
    parent TEXT NOT NULL,
    name TEXT NOT NULL,
    is_leaf INTEGER NOT NULL DEFAULT 0,
    is_branch INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, parent, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tenant_tag_keys (
    tenant TEXT NOT NULL,
    tag_key TEXT NOT NULL,
    PRIMARY KEY (tenant, tag_key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tenant_tag_values (
    tenant TEXT NOT NULL,
    tag_key TEXT NOT NULL,
    tag_value TEXT NOT NULL,
    PRIMARY KEY (tenant, tag_key, tag_value)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tag_metrics (
    tenant TEXT NOT NULL,
    tag_key TEXT NOT NULL,
    tag_value TEXT NOT NULL,
    metric_name TEXT NOT NULL,
    PRIMARY KEY (tenant, tag_key, tag_value, metric_name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS metric_metadata (
    tenant TEXT NOT NULL,
    metric_name TEXT NOT NULL,
    type TEXT NOT NULL,
    help TEXT NOT NULL,
    unit TEXT NOT NULL,
    PRIMARY KEY (tenant, metric_name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS data_raw (
    tenant TEXT NOT NULL,
    series_set_hash TEXT NOT NULL,
    time_slot INTEGER NOT NULL,
    ts INTEGER NOT NULL,
    value REAL,
    PRIMARY KEY (tenant, series_set_hash, time_slot, ts)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS exemplars (
    tenant TEXT NOT NULL,
    series_set_hash TEXT NOT NULL,
    time_slot INTEGER NOT NULL,
    ts INTEGER NOT NULL,
    labels TEXT NOT NULL,
    value REAL,
    PRIMARY KEY (tenant, series_set_hash, time_slot, ts, labels)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS store_identity (
    id TEXT NOT NULL
);
INSERT INTO store_identity (id) SELECT lower(hex(randomblob(16))) WHERE NOT EXISTS (SELECT 1 FROM store_identity);
CREATE TABLE IF NOT EXISTS data_blocks (
    tenant TEXT NOT NULL,
    series_set_hash TEXT NOT NULL,
    time_slot INTEGER NOT NULL,
    block BLOB NOT NULL,
    PRIMARY KEY (tenant, series_set_hash, time_slot)
);
"""

_FLOAT = struct.Struct("<d")


def _encode_value(value: float):
    """SQLite turns NaN into NULL and -0.0 into 0: keep those as their 8 bytes, so that values
    (Prometheus stale markers above all) come back bit-exact."""
    if math.isnan(value) or (value == 0 and math.copysign(1.0, value) < 0):
        return _FLOAT.pack(value)
    return value


def _decode_value(stored) -> float:
    return _FLOAT.unpack(stored)[0] if isinstance(stored, bytes) else stored


def _nullable(value):
    return None if value is None else _encode_value(value)


def _decode_nullable(stored):
    return None if stored is None else _decode_value(stored)


class SQLiteStore(Store):
    def __init__(self, path: Path, layout: Layout, readers: int = 4):
        super().__init__(layout)
        self.path = path
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._writer = ThreadPool(1, 1, name="sqlite-writer")
        self._readers = ThreadPool(1, readers, name="sqlite-reader")
        self._queued: list[tuple] = []  # (statements function, its arguments, Deferred) for the next commit
        self._committing = False

    @classmethod
    def from_url(cls, url: str, layout: Layout) -> "SQLiteStore":
        """``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``."""
        parts = urlsplit(url)
        path = unquote(parts.path)[1:] if parts.path.startswith("/") else unquote(parts.path)
        if parts.netloc or not path:
            raise ValueError(f"{url!r}: expected sqlite:///path/to/file.db")
        return cls(Path(path), layout)

    def _connection(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            # Each connection stays on the thread that made it; close() closes them all after
            # the threads have stopped, hence check_same_thread=False.
            connection = sqlite3.connect(self.path, isolation_level=None, timeout=30, check_same_thread=False)
            connection.execute("PRAGMA synchronous=FULL")
            self._local.connection = connection
            self._connections.append(connection)
        return connection

    def _run(self, pool: ThreadPool, function, *args):
        def guarded():
            try:
                return function(self._connection(), *args)
            except sqlite3.OperationalError as error:
                raise StoreUnavailable(f"sqlite: {error}") from error

        return threads.deferToThreadPool(reactor, pool, guarded)

    def _write(self, function, *args):
        return self._run(self._writer, function, *args)

    def _read(self, function, *args):
        return self._run(self._readers, function, *args)

    def _commit(self, statements, *args) -> Deferred:
        """Write ``statements(*args)`` (a list of (query, rows)) in the next group commit; the
        Deferred fires once they are committed."""
        deferred: Deferred[None] = Deferred()
        self._queued.append((statements, args, deferred))
        if not self._committing:
            self._commit_queued()
        return deferred

    def _commit_queued(self) -> None:
        entries, self._queued = self._queued, []
        self._committing = True
        self._write(_commit_group, [(statements, args) for statements, args, _ in entries]).addBoth(
            self._committed, entries
        )

    def _committed(self, outcome, entries: list[tuple]) -> None:
        """Answer every write of a group, then commit what queued meanwhile (writes queued by
        these answers included)."""
        outcomes = outcome if isinstance(outcome, list) else [outcome] * len(entries)
        for (_, _, deferred), result in zip(entries, outcomes):
            if result is None:
                deferred.callback(None)
            elif isinstance(result, sqlite3.OperationalError):
                deferred.errback(StoreUnavailable(f"sqlite: {result}"))
            else:
                deferred.errback(result)
        if self._queued:
            self._commit_queued()
        else:
            self._committing = False

    def start(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer.start()
        self._readers.start()
        return self._write(_start_writer, self.layout.granularities)

    def close(self):
        def stop_and_close():
            self._writer.stop()
            self._readers.stop()
            for connection in self._connections:
                connection.close()
            self._connections.clear()

        return threads.deferToThread(stop_and_close)

    def ping(self):
        return self._read(lambda connection: connection.execute("SELECT 1").fetchone())

    def identity(self):
        """A random id the file got when its schema was made (a copied file keeps it)."""
        return self._read(
            lambda connection: "sqlite:" + connection.execute("SELECT id FROM store_identity").fetchone()[0]
        )

    def write_series(self, series: Sequence[SeriesKey]):
        return self._commit(_series_statements, list(series))

    def list_path_children(self, tenant, parent):
        query = "SELECT name, is_leaf, is_branch FROM graphite_paths WHERE tenant=? AND parent=? ORDER BY name"
        return self._read(
            lambda connection: [
                PathNode(n, bool(leaf), bool(branch)) for n, leaf, branch in connection.execute(query, (tenant, parent))
            ]
        )

    def list_tenant_tag_keys(self, tenant):
        return self._read(_column, "SELECT tag_key FROM tenant_tag_keys WHERE tenant=? ORDER BY tag_key", (tenant,))

    def list_tenant_tag_values(self, tenant, tag_key):
        query = "SELECT tag_value FROM tenant_tag_values WHERE tenant=? AND tag_key=? ORDER BY tag_value"
        return self._read(_column, query, (tenant, tag_key))

    def find_metrics_by_tag(self, tenant, tag_key, tag_value):
        query = "SELECT metric_name FROM tag_metrics WHERE tenant=? AND tag_key=? AND tag_value=? ORDER BY metric_name"
        return self._read(_column, query, (tenant, tag_key, tag_value))

    def write_rollups(self, granularity, rows):
        width = granularity.partition_width_ms
        values = [
            (
                r.tenant,
                r.series_set_hash,
                time_slot(r.timestamp_ms, width),
                r.timestamp_ms,
                *(_nullable(getattr(r, c)) for c in ROLLUP_COLUMNS),
            )
            for r in rows
        ]
        query = f"INSERT OR REPLACE INTO {granularity.table} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        return self._commit(_statement, query, values)

    def read_rollups(self, granularity, tenant, series_set_hash, start_ms, end_ms):
        if end_ms < start_ms:
            return succeed([])
        width = granularity.partition_width_ms
        query = (
            f"SELECT ts, {', '.join(ROLLUP_COLUMNS)} FROM {granularity.table} WHERE tenant=? AND series_set_hash=?"
            " AND time_slot BETWEEN ? AND ? AND ts BETWEEN ? AND ? ORDER BY time_slot, ts"
        )
        parameters = (tenant, series_set_hash, time_slot(start_ms, width), time_slot(end_ms, width), start_ms, end_ms)

        def read(connection):
            return [
                Rollup(tenant, series_set_hash, ts, *(_decode_nullable(v) for v in values))
                for ts, *values in connection.execute(query, parameters)
            ]

        return self._read(read)

    def mark_pending(self, rows, touched_ms):
        values = [(r.partition, r.time_slot, r.tenant, r.series_set_hash, touched_ms) for r in rows]
        return self._commit(_statement, "INSERT OR REPLACE INTO pending_downsample_sets VALUES (?, ?, ?, ?, ?)", values)

    def list_pending(self, partition, before_slot):
        query = (
            "SELECT * FROM pending_downsample_sets WHERE partition=? AND time_slot < ?"
            " ORDER BY time_slot, tenant, series_set_hash"
        )
        return self._read(
            lambda connection: [PendingSet(*row) for row in connection.execute(query, (partition, before_slot))]
        )

    def delete_pending(self, rows):
        query = (
            "DELETE FROM pending_downsample_sets WHERE partition=? AND time_slot=? AND tenant=?"
            " AND series_set_hash=? AND last_touch=?"
        )
        return self._commit(_statement, query, [tuple(r) for r in rows])

    def add_metric_aggregators(self, tenant, metric_name, aggregators):
        def add(connection):
            connection.execute("BEGIN IMMEDIATE")
            try:
                row = connection.execute(
                    "SELECT aggregators FROM metric_names WHERE tenant=? AND metric_name=?", (tenant, metric_name)
                ).fetchone()
                merged = sorted(set(json.loads(row[0]) if row else ()) | set(aggregators))
                connection.execute(
                    "INSERT INTO metric_names VALUES (?, ?, ?) ON CONFLICT DO UPDATE SET aggregators = excluded.aggregators",
                    (tenant, metric_name, json.dumps(merged)),
                )
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")

        return self._write(add)

    def get_metric_aggregators(self, tenant, metric_name):
        def get(connection):
            row = connection.execute(
                "SELECT aggregators FROM metric_names WHERE tenant=? AND metric_name=?", (tenant, metric_name)
            ).fetchone()
            return json.loads(row[0]) if row else []

        return self._read(get)

    def write_metric_metadata(self, rows: Sequence[MetricMetadata]):
        return self._commit(_statement, "INSERT OR REPLACE INTO metric_metadata VALUES (?, ?, ?, ?, ?)", list(rows))

    def get_metric_metadata(self, tenant, metric_name):
        def read(connection):
            row = connection.execute(
                "SELECT * FROM metric_metadata WHERE tenant=? AND metric_name=?", (tenant, metric_name)
            ).fetchone()
            return MetricMetadata(*row) if row else None

        return self._read(read)

    def write_raw(self, points: Sequence[RawPoint]):
        return self._commit(_raw_statements, list(points), self.slot_width_ms)

    def list_tenants(self):
        return self._read(_column, "SELECT tenant FROM tenants ORDER BY tenant", ())

    def list_metric_names(self, tenant):
        return self._read(
            _column, "SELECT metric_name FROM metric_names WHERE tenant=? ORDER BY metric_name", (tenant,)
        )

    def list_tag_keys(self, tenant, metric_name):
        return self._read(
            _column,
            "SELECT tag_key FROM tag_keys WHERE tenant=? AND metric_name=? ORDER BY tag_key",
            (tenant, metric_name),
        )

    def list_tag_values(self, tenant, metric_name, tag_key):
        return self._read(
            _column,
            "SELECT tag_value FROM tag_values WHERE tenant=? AND metric_name=? AND tag_key=? ORDER BY tag_value",
            (tenant, metric_name, tag_key),
        )

    def find_series(self, tenant, metric_name, tag_key, tag_value):
        query = "SELECT series_set_hash FROM series_sets WHERE tenant=? AND metric_name=? AND tag_key=? AND tag_value=?"
        return self._read(_column, query, (tenant, metric_name, tag_key, tag_value)).addCallback(set)

    def get_series(self, tenant, hashes: Iterable[str]):
        return self._read(_get_series, tenant, list(hashes))

    def write_created_timestamps(self, rows):
        query = "UPDATE series_set_hashes SET created_ms=? WHERE tenant=? AND series_set_hash=?"
        return self._commit(_statement, query, [(r.created_ms, r.tenant, r.series_set_hash) for r in rows])

    def get_created_timestamps(self, tenant, hashes: Iterable[str]):
        return self._read(_get_created, tenant, list(hashes))

    def read_raw(self, tenant, hashes, start_ms, end_ms):
        hashes = list(hashes)
        if end_ms < start_ms:
            return succeed([RawData([], samples.empty()) for _ in hashes])
        first_slot = time_slot(start_ms, self.slot_width_ms)
        last_slot = time_slot(end_ms, self.slot_width_ms)

        def read(connection):
            return [_read_raw(connection, tenant, hash_, first_slot, last_slot, start_ms, end_ms) for hash_ in hashes]

        return self._read(read)

    def write_block(self, tenant, series_set_hash, slot_ms, block, sealed, head_read_ms):
        return self._write(_write_block, tenant, series_set_hash, slot_ms, block, sealed)

    def write_exemplars(self, exemplars):
        width = self.slot_width_ms
        rows = [
            (
                e.tenant,
                e.series_set_hash,
                time_slot(e.timestamp_ms, width),
                e.timestamp_ms,
                exemplar_labels_text(e.labels),
                _encode_value(e.value),
            )
            for e in exemplars
        ]
        return self._commit(_exemplar_statements, rows, self.layout.max_exemplars_per_series)

    def read_exemplars(self, tenant, hashes, start_ms, end_ms):
        hashes = list(hashes)
        if end_ms < start_ms:
            return succeed([[] for _ in hashes])
        query = (
            "SELECT ts, value, labels FROM exemplars WHERE tenant=? AND series_set_hash=?"
            " AND time_slot BETWEEN ? AND ? AND ts BETWEEN ? AND ?"
        )
        slots = (time_slot(start_ms, self.slot_width_ms), time_slot(end_ms, self.slot_width_ms))

        def read(connection):
            return [
                exemplars_in_range(
                    (
                        ExemplarRow(tenant, hash_, ts, _decode_value(value), json.loads(labels))
                        for ts, value, labels in connection.execute(query, (tenant, hash_, *slots, start_ms, end_ms))
                    ),
                    start_ms,
                    end_ms,
                )
                for hash_ in hashes
            ]

        return self._read(read)

    def write_histograms(self, histograms):
        return self._commit(_histogram_statements, "histograms", self.slot_width_ms, list(histograms))

    def read_histograms(self, tenant, hashes, start_ms, end_ms):
        return self._read_histogram_table("histograms", self.slot_width_ms, tenant, hashes, start_ms, end_ms)

    def write_histogram_rollups(self, granularity, rows):
        return self._commit(
            _histogram_statements, granularity.histogram_table, granularity.partition_width_ms, list(rows)
        )

    def read_histogram_rollups(self, granularity, tenant, hashes, start_ms, end_ms):
        return self._read_histogram_table(
            granularity.histogram_table, granularity.partition_width_ms, tenant, hashes, start_ms, end_ms
        )

    def _read_histogram_table(self, table: str, width: int, tenant, hashes, start_ms, end_ms):
        """Only the series histogram_series names in the range's slots are looked up."""
        hashes = list(hashes)
        query = (
            f"SELECT ts, data FROM {table} WHERE tenant=? AND series_set_hash=?"
            " AND time_slot BETWEEN ? AND ? AND ts BETWEEN ? AND ? ORDER BY time_slot, ts"
        )
        indexed = "SELECT DISTINCT series_set_hash FROM histogram_series WHERE tenant=? AND source=? AND time_slot BETWEEN ? AND ?"
        slots = (time_slot(start_ms, width), time_slot(end_ms, width))

        def read(connection):
            present = set(_column(connection, indexed, (tenant, table, *slots)))
            return [
                [
                    HistogramRow(tenant, hash_, ts, bytes(data))
                    for ts, data in connection.execute(query, (tenant, hash_, *slots, start_ms, end_ms))
                ]
                if hash_ in present
                else []
                for hash_ in hashes
            ]

        return self._read(read)

    def sweep(self, now_ms):
        return self._write(_sweep, self.retentions, now_ms)

    def delete_samples(self, tenant, hashes, start_ms, end_ms):
        return self._write(_delete_samples, self.layout, tenant, list(hashes), start_ms, end_ms)

    def delete_index_rows(self, rows):
        statements = [
            (f"DELETE FROM {table} WHERE {' AND '.join(f'{c}=?' for c in INDEX_KEYS[table])}", keys)
            for table, keys in rows.items()
            if keys
        ]
        return self._write(_transaction, statements)

    def write_path_flags(self, tenant, parent, name, is_leaf, is_branch):
        if is_leaf or is_branch:
            query = "UPDATE graphite_paths SET is_leaf=?, is_branch=? WHERE tenant=? AND parent=? AND name=?"
            rows = [(int(is_leaf), int(is_branch), tenant, parent, name)]
        else:
            query, rows = "DELETE FROM graphite_paths WHERE tenant=? AND parent=? AND name=?", [(tenant, parent, name)]
        return self._commit(_statement, query, rows)


def _start_writer(connection: sqlite3.Connection, granularities) -> None:
    connection.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
    _create_schema(connection, granularities)


def _create_schema(connection: sqlite3.Connection, granularities) -> None:
    tables = set(_column(connection, "SELECT name FROM sqlite_master WHERE type='table'", ()))
    # Takes effect only on a new, empty file; an older file keeps its pages until VACUUM.
    connection.execute("PRAGMA auto_vacuum=INCREMENTAL")
    connection.execute("PRAGMA journal_mode=WAL")
    connection.executescript(
        SCHEMA
        + HISTOGRAM_SERIES_TABLE
        + HISTOGRAM_TABLE.format(table="histograms")
        + "".join(
            ROLLUP_TABLE.format(table=g.table) + HISTOGRAM_TABLE.format(table=g.histogram_table) for g in granularities
        )
    )
    columns = {row[1] for row in connection.execute("PRAGMA table_info(metric_names)")}
    if "aggregators" not in columns:
        connection.execute("ALTER TABLE metric_names ADD COLUMN aggregators TEXT NOT NULL DEFAULT '[]'")
    if "created_ms" not in {row[1] for row in connection.execute("PRAGMA table_info(series_set_hashes)")}:
        connection.execute("ALTER TABLE series_set_hashes ADD COLUMN created_ms INTEGER")
    if "histograms" in tables and "histogram_series" not in tables:
        # the upgrade: histograms written before the index existed stay visible
        _transaction(
            connection,
            [
                (
                    f"INSERT OR IGNORE INTO histogram_series"
                    f" SELECT DISTINCT tenant, '{table}', time_slot, series_set_hash FROM {table}",
                    [()],
                )
                for table in ("histograms", *(g.histogram_table for g in granularities))
            ],
        )
    connection.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


def _column(connection: sqlite3.Connection, query: str, parameters: tuple) -> list:
    return [row[0] for row in connection.execute(query, parameters)]


def _transaction(connection: sqlite3.Connection, statements: list[tuple[str, list]]) -> None:
    connection.execute("BEGIN IMMEDIATE")
    try:
        for query, rows in statements:
            connection.executemany(query, rows)
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def _commit_group(connection: sqlite3.Connection, writes: list[tuple]) -> list[Exception | None]:
    """Every (statements function, arguments) of ``writes`` in one transaction; if one write's data
    fails it, each in its own, so that only the failing ones fail. Returns each write's error or
    None. An OperationalError (locked past the busy timeout, disk full) would fail each alike:
    it fails them all at once."""
    try:
        _transaction(connection, [statement for statements, args in writes for statement in statements(*args)])
        return [None] * len(writes)
    except sqlite3.OperationalError as error:
        return [error] * len(writes)
    except Exception as error:
        if len(writes) == 1:
            return [error]
    outcomes: list[Exception | None] = []
    for statements, args in writes:
        try:
            _transaction(connection, statements(*args))
            outcomes.append(None)
        except Exception as error:
            outcomes.append(error)
    return outcomes


def _statement(query: str, rows: list[tuple]) -> list[tuple[str, list]]:
    return [(query, rows)]


def _raw_statements(points: list[RawPoint], width: int) -> list[tuple[str, list]]:
    """Head rows; a value that is neither NaN nor zero needs no _encode_value (most of them)."""
    rows = [
        (tenant, hash_, ts - ts % width, ts, value if value == value and value else _encode_value(value))
        for tenant, hash_, ts, value in points
    ]
    return [("INSERT OR REPLACE INTO data_raw VALUES (?, ?, ?, ?, ?)", rows)]


def _series_statements(series: list[SeriesKey]) -> list[tuple[str, list]]:
    rows = index_rows(series)
    return [
        ("INSERT OR IGNORE INTO tenants VALUES (?)", rows.tenants),
        ("INSERT OR IGNORE INTO metric_names (tenant, metric_name) VALUES (?, ?)", rows.metric_names),
        (
            "INSERT INTO series_set_hashes (tenant, series_set_hash, metric_name, tags) VALUES (?, ?, ?, ?)"
            " ON CONFLICT DO UPDATE SET metric_name = excluded.metric_name, tags = excluded.tags",
            [
                (tenant, hash_, name, json.dumps(tags, sort_keys=True))
                for tenant, hash_, name, tags in rows.series_set_hashes
            ],
        ),
        ("INSERT OR IGNORE INTO series_sets VALUES (?, ?, ?, ?, ?)", rows.series_sets),
        ("INSERT OR IGNORE INTO tag_keys VALUES (?, ?, ?)", rows.tag_keys),
        ("INSERT OR IGNORE INTO tag_values VALUES (?, ?, ?, ?)", rows.tag_values),
        (
            "INSERT INTO graphite_paths VALUES (?, ?, ?, ?, ?) ON CONFLICT DO UPDATE"
            " SET is_leaf = max(is_leaf, excluded.is_leaf), is_branch = max(is_branch, excluded.is_branch)",
            [(tenant, parent, name, int(leaf), int(not leaf)) for tenant, parent, name, leaf in rows.graphite_paths],
        ),
        ("INSERT OR IGNORE INTO tenant_tag_keys VALUES (?, ?)", rows.tenant_tag_keys),
        ("INSERT OR IGNORE INTO tenant_tag_values VALUES (?, ?, ?)", rows.tenant_tag_values),
        ("INSERT OR IGNORE INTO tag_metrics VALUES (?, ?, ?, ?)", rows.tag_metrics),
    ]


def _series_rows(connection: sqlite3.Connection, columns: str, tenant: str, hashes: list[str]):
    """(series_set_hash, *columns) of the series_set_hashes rows of the hashes, 500 a query."""
    for start in range(0, len(hashes), 500):
        chunk = hashes[start : start + 500]
        marks = ",".join("?" * len(chunk))
        query = (
            f"SELECT series_set_hash, {columns} FROM series_set_hashes WHERE tenant=? AND series_set_hash IN ({marks})"
        )
        yield from connection.execute(query, (tenant, *chunk))


def _get_series(connection: sqlite3.Connection, tenant: str, hashes: list[str]) -> dict[str, SeriesKey]:
    return {
        series_set_hash: SeriesKey(tenant, series_set_hash, metric_name, json.loads(tags))
        for series_set_hash, metric_name, tags in _series_rows(connection, "metric_name, tags", tenant, hashes)
    }


def _get_created(connection: sqlite3.Connection, tenant: str, hashes: list[str]) -> dict[str, int]:
    return {
        series_set_hash: created
        for series_set_hash, created in _series_rows(connection, "created_ms", tenant, hashes)
        if created is not None
    }


def _read_raw(connection, tenant, series_set_hash, first_slot, last_slot, start_ms, end_ms) -> RawData:
    blocks_query = "SELECT block FROM data_blocks WHERE tenant=? AND series_set_hash=? AND time_slot BETWEEN ? AND ? ORDER BY time_slot"
    blocks = _column(connection, blocks_query, (tenant, series_set_hash, first_slot, last_slot))
    head_query = (
        "SELECT ts, value FROM data_raw WHERE tenant=? AND series_set_hash=?"
        " AND time_slot BETWEEN ? AND ? AND ts BETWEEN ? AND ? ORDER BY time_slot, ts"
    )
    rows = connection.execute(head_query, (tenant, series_set_hash, first_slot, last_slot, start_ms, end_ms)).fetchall()
    if not rows:
        return RawData(blocks, samples.empty())
    timestamps, values = zip(*rows)
    head = Samples(
        np.array(timestamps, dtype=np.int64),
        np.array(
            [_decode_value(v) for v in values] if any(isinstance(v, bytes) for v in values) else values,
            dtype=np.float64,
        ),
    )
    return RawData(blocks, head)


def _write_block(connection, tenant, series_set_hash, slot_ms, block, sealed: Samples) -> None:
    """The block, and the deletion of the head rows it sealed that still hold the sealed value, in
    one transaction: a reader sees the samples in the head or in the block, never in neither."""
    head_rows = [
        (tenant, series_set_hash, slot_ms, ts, _encode_value(value))
        for ts, value in zip(sealed.timestamps.tolist(), sealed.values.tolist())
    ]
    _transaction(
        connection,
        [
            ("INSERT OR REPLACE INTO data_blocks VALUES (?, ?, ?, ?)", [(tenant, series_set_hash, slot_ms, block)]),
            (
                "DELETE FROM data_raw WHERE tenant=? AND series_set_hash=? AND time_slot=? AND ts=? AND value IS ?",
                head_rows,
            ),
        ],
    )


def _exemplar_statements(rows: list[tuple], keep: int) -> list[tuple[str, list]]:
    """The exemplars, then, in the same transaction, the deletion of those past the newest
    ``keep`` of each series-slot they landed in (--max-exemplars-per-series)."""
    trim = (
        "DELETE FROM exemplars WHERE tenant=?1 AND series_set_hash=?2 AND time_slot=?3 AND (ts, labels) NOT IN"
        " (SELECT ts, labels FROM exemplars WHERE tenant=?1 AND series_set_hash=?2 AND time_slot=?3"
        " ORDER BY ts DESC, labels LIMIT ?4)"
    )
    slots = sorted({(*row[:3], keep) for row in rows})
    return [("INSERT OR REPLACE INTO exemplars VALUES (?, ?, ?, ?, ?, ?)", rows), (trim, slots)]


def _histogram_statements(table: str, width: int, histograms) -> list[tuple[str, list]]:
    """The rows of a histogram table and their series-slots in histogram_series, in one transaction."""
    rows = [(h.tenant, h.series_set_hash, time_slot(h.timestamp_ms, width), h.timestamp_ms, h.data) for h in histograms]
    indexed = sorted({(tenant, table, slot, hash_) for tenant, hash_, slot, _, _ in rows})
    return [
        (f"INSERT OR REPLACE INTO {table} VALUES (?, ?, ?, ?, ?)", rows),
        ("INSERT OR IGNORE INTO histogram_series VALUES (?, ?, ?, ?)", indexed),
    ]


def _delete_samples(connection, layout: Layout, tenant: str, hashes: list[str], start_ms: int, end_ms: int) -> None:
    """One transaction: a seal's write_block (on this same writer thread) lands wholly before or
    after it, so a block is never rewritten from a copy older than the one it replaces."""
    slots = (time_slot(start_ms, layout.slot_width_ms), time_slot(end_ms, layout.slot_width_ms))
    by_ts = "tenant=? AND series_set_hash=? AND time_slot BETWEEN ? AND ? AND ts BETWEEN ? AND ?"
    connection.execute("BEGIN IMMEDIATE")
    try:
        for hash_ in hashes:
            blocks = connection.execute(
                "SELECT time_slot, block FROM data_blocks WHERE tenant=? AND series_set_hash=? AND time_slot BETWEEN ? AND ?",
                (tenant, hash_, *slots),
            ).fetchall()
            for slot, block in blocks:
                cut = cut_block(block, start_ms, end_ms)
                if cut is None:
                    connection.execute(
                        "DELETE FROM data_blocks WHERE tenant=? AND series_set_hash=? AND time_slot=?",
                        (tenant, hash_, slot),
                    )
                elif cut is not block:
                    connection.execute(
                        "UPDATE data_blocks SET block=? WHERE tenant=? AND series_set_hash=? AND time_slot=?",
                        (cut, tenant, hash_, slot),
                    )
            for table in ("data_raw", "exemplars", "histograms"):
                connection.execute(f"DELETE FROM {table} WHERE {by_ts}", (tenant, hash_, *slots, start_ms, end_ms))
            for granularity in layout.granularities:
                first, last = bucket_range(start_ms, end_ms, granularity.width_ms)
                width = granularity.partition_width_ms
                for table in (granularity.table, granularity.histogram_table):
                    connection.execute(
                        f"DELETE FROM {table} WHERE {by_ts}",
                        (tenant, hash_, time_slot(first, width), time_slot(last, width), first, last),
                    )
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def _sweep_statements(layout: Layout, now_ms: int, tenants: str, tenant_params: list) -> list[tuple[str, list]]:
    """Deletes of blocks, head rows and histograms older than the raw retention, and roll-ups (of
    samples and of histograms) and exemplars older than theirs (by the samples' time), of the
    tenants the condition ``tenants`` (with ``tenant_params``) selects."""
    raw_before = time_slot(now_ms - layout.raw_retention_ms, layout.slot_width_ms)
    statements: list[tuple[str, list]] = [
        (f"DELETE FROM data_raw WHERE time_slot < ? AND {tenants}", [(raw_before, *tenant_params)]),
        (f"DELETE FROM data_blocks WHERE time_slot < ? AND {tenants}", [(raw_before, *tenant_params)]),
        (f"DELETE FROM histograms WHERE time_slot < ? AND {tenants}", [(raw_before, *tenant_params)]),
        (
            f"DELETE FROM histogram_series WHERE source = 'histograms' AND time_slot < ? AND {tenants}",
            [(raw_before, *tenant_params)],
        ),
        (
            f"DELETE FROM exemplars WHERE ts < ? AND {tenants}",
            [(now_ms - layout.exemplar_retention_ms, *tenant_params)],
        ),
    ]
    for granularity in layout.granularities:
        for table in (granularity.table, granularity.histogram_table):
            statements.append(
                (
                    f"DELETE FROM {table} WHERE ts < ? AND {tenants}",
                    [(now_ms - granularity.retention_ms, *tenant_params)],
                )
            )
        # a partition slot whose whole width is past the retention has no rows left
        oldest_partition = now_ms - granularity.retention_ms - granularity.partition_width_ms + 1
        statements.append(
            (
                f"DELETE FROM histogram_series WHERE source = ? AND time_slot < ? AND {tenants}",
                [(granularity.histogram_table, oldest_partition, *tenant_params)],
            )
        )
    return statements


def _sweep(connection, retentions: Retentions, now_ms: int) -> None:
    """Delete what is past its retention: each tenant with retentions of its own (--overrides) by
    them, every other tenant by the store's; then return the freed pages to the file system."""
    by_tenant = retentions.by_tenant  # one reload's, even if another comes meanwhile
    overridden = list(by_tenant)
    others = f"tenant NOT IN ({', '.join('?' * len(overridden))})" if overridden else "1"
    statements = _sweep_statements(retentions.layout, now_ms, others, overridden)
    for tenant, layout in by_tenant.items():
        statements += _sweep_statements(layout, now_ms, "tenant = ?", [tenant])
    _transaction(connection, statements)
    # incremental_vacuum frees one page per step, and Python's sqlite3 steps a statement without
    # result columns once: so one statement per free page, all in one transaction.
    connection.execute("BEGIN IMMEDIATE")
    try:
        for _ in range(connection.execute("PRAGMA freelist_count").fetchone()[0]):
            connection.execute("PRAGMA incremental_vacuum(1)")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
