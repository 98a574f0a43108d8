"""The embedded default store: one SQLite file (WAL, synchronous=FULL, so a commit is durable).

The tables mirror the Cassandra ones column for column (see contract.py) but for the head, with
two differences that stand in for Cassandra's TTLs: sealing a slot deletes the head samples it
sealed, in the same transaction as the block's write, and ``sweep`` deletes blocks, head rows, roll-ups, exemplars and
histograms (and their roll-ups) past their retention, then gives the freed pages back to the file system (incremental auto-vacuum). Data
blocks are in an ordinary rowid table (not WITHOUT ROWID, which suits only small rows).

The head is not ``data_raw`` (one row a sample keyed by series, whose rows of one commit land on
one B-tree page a series) but ``head_log``, appended to in commit order, which the writer folds
into ``head_chunks``, one row of numpy bytes a series-slot, once it holds ``FOLD_ROWS`` rows; a
read takes a series' chunks and its rows still in the log, the last write of a timestamp winning
(docs/storage.rst, "The embedded store"). SQLite
calls block, so they run on threads: one writer thread (SQLite allows one writer at a time) and a
small pool of readers, each thread with its own connection.

Writes commit in groups: the writes that arrive while a transaction commits all go into the next
one (``_commit``), so under load one commit (one fsync, one pass over the B-tree pages the rows
land on) carries many requests. Each write's Deferred still fires only once its rows are
committed; if a group fails, its writes are retried one transaction each, so one bad write fails
alone.
"""

import contextlib
import json
import logging
import math
import sqlite3
import struct
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np
from twisted.internet import reactor, task, threads
from twisted.internet.defer import Deferred, succeed
from twisted.python.threadpool import ThreadPool

from gateway.core import samples
from gateway.core.layout import Layout, Retentions
from gateway.core.model import SeriesKey
from gateway.core.samples import Samples
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

log = logging.getLogger(__name__)

SCHEMA_VERSION = 8
# The head log is folded into head_chunks once it holds this many rows: a bigger log gives a
# series more samples a chunk (fewer B-tree pages written a sample), and every head read a
# longer scan of the log (docs/storage.rst, "The embedded store").
FOLD_ROWS = 100_000
# The log is also folded when it took no head row for FOLD_CHECK_S (a quiet store reads chunks
# alone) and at least every FOLD_MAX_AGE_S (a small store's log stays short).
FOLD_CHECK_S = 5.0
FOLD_MAX_AGE_S = 300
# Rows a fold moves in one transaction: one fold of a log at FOLD_ROWS, and an upgraded file's
# head in steps whose Python objects stay a few tens of MiB.
FOLD_BATCH_ROWS = 2 * FOLD_ROWS
BLOCKS_QUERY = "SELECT block FROM data_blocks WHERE tenant=? AND series_set_hash=? AND time_slot BETWEEN ? AND ? ORDER BY time_slot"
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
CREATE TABLE IF NOT EXISTS head_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL,
    series_set_hash TEXT NOT NULL,
    ts INTEGER NOT NULL,
    value REAL
);
CREATE TABLE IF NOT EXISTS head_chunks (
    tenant TEXT NOT NULL,
    series_set_hash TEXT NOT NULL,
    time_slot INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    timestamps BLOB NOT NULL,
    vals BLOB NOT NULL,
    PRIMARY KEY (tenant, series_set_hash, time_slot, seq)
);
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
    def __init__(
        self,
        path: Path,
        layout: Layout,
        readers: int = 4,
        fold_rows: int | None = None,
        fold_check_s: float = FOLD_CHECK_S,
    ):
        super().__init__(layout)
        self.path = path
        self.fold_rows = fold_rows or FOLD_ROWS
        self.fold_check_s = fold_check_s
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._writer = ThreadPool(1, 1, name="sqlite-writer")
        self._readers = ThreadPool(1, readers, name="sqlite-reader")
        self._queued: list[tuple] = []  # (statements function, its arguments, Deferred) for the next commit
        self._committing = False
        self._rows_since_fold = 0  # head rows this store wrote since it last folded the head log
        self._rows_at_check = 0  # _rows_since_fold at the last _fold_when_quiet
        self._checks_since_fold = 0
        self._fold_check = task.LoopingCall(self._fold_when_quiet)

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
        """Answer every write of a group, then fold the head log if due (the writes are committed:
        they need not wait for it), then commit what queued meanwhile (writes queued by these
        answers included). The writer runs one call at a time, in order."""
        outcomes = outcome if isinstance(outcome, list) else [outcome] * len(entries)
        for (_, _, deferred), result in zip(entries, outcomes):
            if result is None:
                deferred.callback(None)
            elif isinstance(result, sqlite3.OperationalError):
                deferred.errback(StoreUnavailable(f"sqlite: {result}"))
            else:
                deferred.errback(result)
        if self._rows_since_fold >= self.fold_rows:
            self._fold()
        if self._queued:
            self._commit_queued()
        else:
            self._committing = False

    def _fold(self) -> None:
        """Fold the head log on the writer thread, after what it is doing now."""
        self._rows_since_fold = self._rows_at_check = self._checks_since_fold = 0
        self._write(_fold_head_log, self.slot_width_ms).addErrback(_fold_failed)

    def _fold_when_quiet(self) -> None:
        """Every fold_check_s: fold a log that took no head row since the last check, or that was
        last folded FOLD_MAX_AGE_S ago."""
        self._checks_since_fold += 1
        quiet = self._rows_since_fold == self._rows_at_check
        if self._rows_since_fold and (quiet or self._checks_since_fold * self.fold_check_s >= FOLD_MAX_AGE_S):
            self._fold()
        self._rows_at_check = self._rows_since_fold

    def start(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer.start()
        self._readers.start()
        self._fold_check.start(self.fold_check_s, now=False)
        return self._write(_start_writer, self.layout)

    def close(self):
        if self._fold_check.running:
            self._fold_check.stop()

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
            with _immediate(connection):
                row = connection.execute(
                    "SELECT aggregators FROM metric_names WHERE tenant=? AND metric_name=?", (tenant, metric_name)
                ).fetchone()
                merged = sorted(set(json.loads(row[0]) if row else ()) | set(aggregators))
                connection.execute(
                    "INSERT INTO metric_names VALUES (?, ?, ?) ON CONFLICT DO UPDATE SET aggregators = excluded.aggregators",
                    (tenant, metric_name, json.dumps(merged)),
                )

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
        points = list(points)
        self._rows_since_fold += len(points)
        return self._commit(_raw_statements, points)

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
            # one snapshot: a fold or a seal committing meanwhile cannot move samples past the read
            connection.execute("BEGIN")
            try:
                heads = _read_head(connection, tenant, hashes, first_slot, last_slot, start_ms, end_ms)
                return [
                    RawData(_column(connection, BLOCKS_QUERY, (tenant, hash_, first_slot, last_slot)), head)
                    for hash_, head in zip(hashes, heads)
                ]
            finally:
                connection.execute("COMMIT")

        return self._read(read)

    def write_block(self, tenant, series_set_hash, slot_ms, block, sealed, head_read_ms):
        return self._write(_write_block, self.slot_width_ms, tenant, series_set_hash, slot_ms, block, sealed)

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


def _start_writer(connection: sqlite3.Connection, layout: Layout) -> None:
    connection.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
    _create_schema(connection, layout.granularities)
    _fold_head_log(connection, layout.slot_width_ms)


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
    if "data_raw" in tables:
        # the upgrade from one row a sample keyed by series: every head row into the head log, in
        # one transaction; _start_writer folds them into head_chunks next (docs/storage.rst)
        with _immediate(connection):
            connection.execute(
                "INSERT INTO head_log (tenant, series_set_hash, ts, value) SELECT tenant, series_set_hash, ts, value"
                " FROM data_raw ORDER BY tenant, series_set_hash, time_slot, ts"
            )
            connection.execute("DROP TABLE data_raw")
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


@contextlib.contextmanager
def _immediate(connection: sqlite3.Connection):
    """One write transaction around the block: committed when it ends, rolled back if it raises."""
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def _transaction(connection: sqlite3.Connection, statements: list[tuple[str, list]]) -> None:
    with _immediate(connection):
        for query, rows in statements:
            connection.executemany(query, rows)


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


def _fold_failed(failure) -> None:
    """A fold that failed leaves its rows in the head log, where reads find them; the next fold takes them."""
    log.error("folding the SQLite head log failed: %s", failure.getErrorMessage())


def _statement(query: str, rows: list[tuple]) -> list[tuple[str, list]]:
    return [(query, rows)]


def _raw_statements(points: list[RawPoint]) -> list[tuple[str, list]]:
    """Head rows, appended to the head log; a value that is neither NaN nor zero needs no
    _encode_value (most of them)."""
    rows = [
        (tenant, hash_, ts, value if value == value and value else _encode_value(value))
        for tenant, hash_, ts, value in points
    ]
    return [("INSERT INTO head_log (tenant, series_set_hash, ts, value) VALUES (?, ?, ?, ?)", rows)]


def _fold_head_log(connection: sqlite3.Connection, width: int) -> None:
    """Move the head log's rows into head_chunks, FOLD_BATCH_ROWS a transaction, oldest first: one
    chunk a series-slot, its seq the id of the batch's last row, so that chunks sort in the order
    they were written and before every row still in the log."""
    batch_end = "SELECT max(id), count(*) FROM (SELECT id FROM head_log ORDER BY id LIMIT ?)"
    rows = "SELECT tenant, series_set_hash, ts, value FROM head_log WHERE id <= ? ORDER BY id"
    while True:
        with _immediate(connection):
            last_id, count = connection.execute(batch_end, (FOLD_BATCH_ROWS,)).fetchone()
            if not count:
                return
            groups: dict[tuple, tuple[list, list]] = {}
            for tenant, hash_, ts, value in connection.execute(rows, (last_id,)):
                timestamps, values = groups.setdefault((tenant, hash_, ts - ts % width), ([], []))
                timestamps.append(ts)
                values.append(value)
            connection.executemany(
                "INSERT INTO head_chunks VALUES (?, ?, ?, ?, ?, ?)",
                [(*key, last_id, *_chunk_blobs(_log_samples(*columns))) for key, columns in groups.items()],
            )
            connection.execute("DELETE FROM head_log WHERE id <= ?", (last_id,))
        if count < FOLD_BATCH_ROWS:
            return


def _log_samples(timestamps: list[int], values: list) -> Samples:
    """Head log rows of one series in write order -> its samples, the last write of a timestamp winning."""
    if bytes in map(type, values):  # a NaN or -0.0 (_encode_value); C-speed, unlike a generator
        values = [_decode_value(v) for v in values]
    return samples.merge([Samples(np.array(timestamps, dtype=np.int64), np.array(values, dtype=np.float64))])


def _chunk_blobs(head: Samples) -> tuple[bytes, bytes]:
    """A chunk's two columns: the timestamps as little-endian int64, the values as float64 (bit-exact)."""
    return head.timestamps.astype("<i8").tobytes(), head.values.astype("<f8").tobytes()


def _head_slots(connection, tenant: str, hash_: str, first_slot: int, last_slot: int) -> dict[int, tuple[Samples, int]]:
    """Each slot's samples in head_chunks (its chunks merged in write order, the last write of a
    timestamp winning) and the seq of its newest chunk, in slot order."""
    query = (
        "SELECT time_slot, seq, timestamps, vals FROM head_chunks WHERE tenant=? AND series_set_hash=?"
        " AND time_slot BETWEEN ? AND ? ORDER BY time_slot, seq"
    )
    chunks: dict[int, list[tuple[int, Samples]]] = {}
    for slot, seq, timestamps, values in connection.execute(query, (tenant, hash_, first_slot, last_slot)):
        chunk = Samples(np.frombuffer(timestamps, dtype="<i8"), np.frombuffer(values, dtype="<f8"))
        chunks.setdefault(slot, []).append((seq, chunk))
    return {slot: (samples.merge([chunk for _, chunk in found]), found[-1][0]) for slot, found in chunks.items()}


def _keep_in_head_slot(connection, tenant: str, hash_: str, slot: int, head: Samples, seq: int, keep) -> None:
    """Keep only the ``keep`` samples of a slot's head (as _head_slots gave it): when that drops
    any, its chunks become one chunk of those left (none if none), with the newest chunk's seq."""
    if keep.all():
        return
    connection.execute(
        "DELETE FROM head_chunks WHERE tenant=? AND series_set_hash=? AND time_slot=?", (tenant, hash_, slot)
    )
    if keep.any():
        kept = Samples(head.timestamps[keep], head.values[keep])
        connection.execute(
            "INSERT INTO head_chunks VALUES (?, ?, ?, ?, ?, ?)", (tenant, hash_, slot, seq, *_chunk_blobs(kept))
        )


def _read_head(connection, tenant, hashes, first_slot, last_slot, start_ms, end_ms) -> list[Samples]:
    """Each series' head samples in the range: its chunks (one indexed range a series), then its
    rows still in the head log (one scan of the log for all of them), the last write winning."""
    logged: dict[str, tuple[list, list]] = {}
    query = (
        "SELECT series_set_hash, ts, value FROM head_log WHERE tenant=? AND ts BETWEEN ? AND ?"
        " AND series_set_hash IN (SELECT value FROM json_each(?)) ORDER BY id"
    )
    for hash_, ts, value in connection.execute(query, (tenant, start_ms, end_ms, json.dumps(hashes))):
        timestamps, values = logged.setdefault(hash_, ([], []))
        timestamps.append(ts)
        values.append(value)
    found = []
    for hash_ in hashes:
        slots = [
            samples.empty(),
            *(h for h, _ in _head_slots(connection, tenant, hash_, first_slot, last_slot).values()),
        ]
        parts = [Samples(np.concatenate([s.timestamps for s in slots]), np.concatenate([s.values for s in slots]))]
        if hash_ in logged:
            parts.append(_log_samples(*logged[hash_]))
        found.append(samples.merge(parts).between(start_ms, end_ms))
    return found


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


def _write_block(connection, width: int, tenant, series_set_hash, slot_ms, block, sealed: Samples) -> None:
    """The block, and the removal from the head of the samples it sealed that still hold the sealed
    value, in one transaction (after folding the head log, so that the head is all in chunks): a
    reader sees the samples in the head or in the block, never in neither. A timestamp rewritten
    meanwhile with another value stays in the head, to be sealed next time."""
    _fold_head_log(connection, width)
    with _immediate(connection):
        connection.execute(
            "INSERT OR REPLACE INTO data_blocks VALUES (?, ?, ?, ?)", (tenant, series_set_hash, slot_ms, block)
        )
        for slot, (head, seq) in _head_slots(connection, tenant, series_set_hash, slot_ms, slot_ms).items():
            _keep_in_head_slot(connection, tenant, series_set_hash, slot, head, seq, ~_sealed_in(head, sealed))


def _sealed_in(head: Samples, sealed: Samples) -> np.ndarray:
    """Which head samples ``sealed`` holds with the same value, bit for bit."""
    if not len(sealed):
        return np.zeros(len(head), dtype=bool)
    at = np.minimum(np.searchsorted(sealed.timestamps, head.timestamps), len(sealed) - 1)
    same_bits = sealed.values.view(np.int64)[at] == head.values.view(np.int64)
    return (sealed.timestamps[at] == head.timestamps) & same_bits


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
    _fold_head_log(connection, layout.slot_width_ms)
    with _immediate(connection):
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
            for slot, (head, seq) in _head_slots(connection, tenant, hash_, *slots).items():
                outside = (head.timestamps < start_ms) | (head.timestamps > end_ms)
                _keep_in_head_slot(connection, tenant, hash_, slot, head, seq, outside)
            for table in ("exemplars", "histograms"):
                connection.execute(f"DELETE FROM {table} WHERE {by_ts}", (tenant, hash_, *slots, start_ms, end_ms))
            for granularity in layout.granularities:
                first, last = bucket_range(start_ms, end_ms, granularity.width_ms)
                width = granularity.partition_width_ms
                for table in (granularity.table, granularity.histogram_table):
                    connection.execute(
                        f"DELETE FROM {table} WHERE {by_ts}",
                        (tenant, hash_, time_slot(first, width), time_slot(last, width), first, last),
                    )


def _sweep_statements(layout: Layout, now_ms: int, tenants: str, tenant_params: list) -> list[tuple[str, list]]:
    """Deletes of blocks, head rows and histograms older than the raw retention, and roll-ups (of
    samples and of histograms) and exemplars older than theirs (by the samples' time), of the
    tenants the condition ``tenants`` (with ``tenant_params``) selects."""
    raw_before = time_slot(now_ms - layout.raw_retention_ms, layout.slot_width_ms)
    statements: list[tuple[str, list]] = [
        (f"DELETE FROM head_chunks WHERE time_slot < ? AND {tenants}", [(raw_before, *tenant_params)]),
        (f"DELETE FROM head_log WHERE ts < ? AND {tenants}", [(raw_before, *tenant_params)]),
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
    with _immediate(connection):
        for _ in range(connection.execute("PRAGMA freelist_count").fetchone()[0]):
            connection.execute("PRAGMA incremental_vacuum(1)")
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
