"""The embedded store's schema: its tables, created or upgraded when the writer starts."""

import sqlite3
import time

from gateway.core.layout import INDEX_BUCKET_MS, Layout
from gateway.store.contract import BUCKET_INDEX_ALWAYS
from gateway.store.deletion import INDEX_KEYS
from gateway.store.index import BUCKET_TABLES, bucket_table
from gateway.store.sqlite_head import fold_head_log
from gateway.store.sqlite_sql import SLOT_INDEXED, column_values, immediate, slot_index, transaction

SCHEMA_VERSION = 12
# The writer's page cache: head rows of many series land on as many B-tree pages a commit, and
# with SQLite's default 2 MiB those pages were read back for every commit (docs/performance-log.rst).
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


def _bucket_tables() -> str:
    """The time index: each table of BUCKET_TABLES again, keyed by (tenant, bucket) first, so a lookup of
    a few buckets is as many index seeks (``bucket IN (...)``) and the sweep a range delete."""
    statements = []
    for table in BUCKET_TABLES:
        columns = ("tenant", "bucket", *INDEX_KEYS[table][1:])
        definitions = "".join(f"    {c} {'INTEGER' if c == 'bucket' else 'TEXT'} NOT NULL,\n" for c in columns)
        statements.append(
            f"CREATE TABLE IF NOT EXISTS {bucket_table(table)} (\n{definitions}    PRIMARY KEY ({', '.join(columns)})\n)"
            " WITHOUT ROWID;\n"
        )
    return "".join(statements)


# Settings of the file's own history: ``bucket_index_since``, from when the time index holds every series.
INDEX_STATE_TABLE = """
CREATE TABLE IF NOT EXISTS index_state (
    name TEXT NOT NULL PRIMARY KEY,
    value INTEGER NOT NULL
);
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
    last_bucket INTEGER,
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
CREATE TABLE IF NOT EXISTS head_batches (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL,
    first_ts INTEGER NOT NULL,
    last_ts INTEGER NOT NULL,
    samples INTEGER NOT NULL,
    hashes TEXT NOT NULL,
    timestamps BLOB NOT NULL,
    vals BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS head_chunks (
    tenant TEXT NOT NULL,
    series_set_hash TEXT NOT NULL,
    time_slot INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    first_ts INTEGER,
    last_ts INTEGER,
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


def start_writer(connection: sqlite3.Connection, layout: Layout) -> int:
    """Create or upgrade the schema and fold the head log; returns the time index's since."""
    connection.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
    _create_schema(connection, layout.granularities)
    fold_head_log(connection, layout.slot_width_ms)
    return connection.execute("SELECT value FROM index_state WHERE name = 'bucket_index_since'").fetchone()[0]


def _create_schema(connection: sqlite3.Connection, granularities) -> None:
    tables = set(column_values(connection, "SELECT name FROM sqlite_master WHERE type='table'", ()))
    # Takes effect only on a new, empty file; an older file keeps its pages until VACUUM.
    connection.execute("PRAGMA auto_vacuum=INCREMENTAL")
    connection.execute("PRAGMA journal_mode=WAL")
    connection.executescript(
        SCHEMA
        + _bucket_tables()
        + INDEX_STATE_TABLE
        + HISTOGRAM_SERIES_TABLE
        + HISTOGRAM_TABLE.format(table="histograms")
        + "".join(
            ROLLUP_TABLE.format(table=g.table) + HISTOGRAM_TABLE.format(table=g.histogram_table) for g in granularities
        )
    )
    columns = {row[1] for row in connection.execute("PRAGMA table_info(metric_names)")}
    if "aggregators" not in columns:
        connection.execute("ALTER TABLE metric_names ADD COLUMN aggregators TEXT NOT NULL DEFAULT '[]'")
    series_columns = {row[1] for row in connection.execute("PRAGMA table_info(series_set_hashes)")}
    if "created_ms" not in series_columns:
        connection.execute("ALTER TABLE series_set_hashes ADD COLUMN created_ms INTEGER")
    if "last_bucket" not in series_columns:
        # the upgrade: a series written before counts as seen now, so it leaves the index no
        # sooner than the longest retention from now (docs/storage.rst)
        with immediate(connection):
            connection.execute("ALTER TABLE series_set_hashes ADD COLUMN last_bucket INTEGER")
            now = int(time.time() * 1000)
            connection.execute("UPDATE series_set_hashes SET last_bucket = ?", (now - now % INDEX_BUCKET_MS,))
    chunk_columns = {row[1] for row in connection.execute("PRAGMA table_info(head_chunks)")}
    if "last_ts" not in chunk_columns:
        # the upgrade to chunk time bounds: older chunks have none (NULL) and are always read
        connection.execute("ALTER TABLE head_chunks ADD COLUMN first_ts INTEGER")
        connection.execute("ALTER TABLE head_chunks ADD COLUMN last_ts INTEGER")
    for table in SLOT_INDEXED:  # reads of many series scan a slot by them (slot_rows)
        connection.execute(slot_index(table))
    # the sweep finds the series whose data expired by it (sqlite_lifecycle.py)
    connection.execute("CREATE INDEX IF NOT EXISTS series_set_hashes_last_bucket ON series_set_hashes (last_bucket)")
    if "data_raw" in tables:
        # the upgrade from one row a sample keyed by series: every head row into the head log, in
        # one transaction; start_writer folds them into head_chunks next (docs/storage.rst)
        with immediate(connection):
            connection.execute(
                "INSERT INTO head_log (tenant, series_set_hash, ts, value) SELECT tenant, series_set_hash, ts, value"
                " FROM data_raw ORDER BY tenant, series_set_hash, time_slot, ts"
            )
            connection.execute("DROP TABLE data_raw")
    if "histograms" in tables and "histogram_series" not in tables:
        # the upgrade: histograms written before the index existed stay visible
        transaction(
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
    if "head_batches" not in tables:
        # the upgrade to head batches: their ids, which become chunk seqs when folded, follow
        # every id the old head log gave (its rows are folded first, by start_writer)
        connection.execute(
            "INSERT INTO sqlite_sequence (name, seq)"
            " SELECT 'head_batches', coalesce(max(seq), 0) FROM sqlite_sequence WHERE name = 'head_log'"
        )
    # the upgrade to the time index: a file that holds series answers for the time before now
    # from the all-time index; a new file has its whole history in the time index. Whatever this
    # process saw of the tables: another one opening a new file at once (a gateway and an import,
    # an import's workers) may have made index_state and not yet its row.
    with immediate(connection):
        has_series = connection.execute("SELECT 1 FROM series_set_hashes LIMIT 1").fetchone()
        since = int(time.time() * 1000) if has_series else BUCKET_INDEX_ALWAYS
        connection.execute("INSERT OR IGNORE INTO index_state VALUES ('bucket_index_since', ?)", (since,))
    connection.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
