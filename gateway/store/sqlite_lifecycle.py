"""Lifecycle of the SQLite driver: open (schema), close, health, identity and the sweep of expired data."""

import json
import sqlite3

from twisted.internet.defer import ensureDeferred

from gateway.core import blocking
from gateway.core.layout import INDEX_BUCKET_MS, Layout, Retentions
from gateway.core.model import SeriesKey
from gateway.store.contract import time_slot
from gateway.store.deletion import remove_from_index
from gateway.store.index import BUCKET_TABLES, bucket_table
from gateway.store.sqlite_base import SQLiteBase
from gateway.store.sqlite_head import fold_head_log
from gateway.store.sqlite_schema import start_writer
from gateway.store.sqlite_sql import immediate, single_statement, transaction

# Series whose data all expired, taken out of the index a step at a time by the sweep.
EXPIRED_SERIES_A_STEP = 1000


def _sweep_statements(layout: Layout, now_ms: int, tenants: str, tenant_params: list) -> list[tuple[str, list]]:
    """Deletes of blocks, head rows and histograms older than the raw retention, roll-ups (of
    samples and of histograms) and exemplars older than theirs (by the samples' time), and the
    time index of buckets that ended the longest retention ago, of the tenants the condition
    ``tenants`` (with ``tenant_params``) selects."""
    raw_before = time_slot(now_ms - layout.raw_retention_ms, layout.slot_width_ms)
    buckets_before = now_ms - layout.raw_retention_ms - INDEX_BUCKET_MS + 1
    statements: list[tuple[str, list]] = [
        *(
            (f"DELETE FROM {bucket_table(table)} WHERE bucket < ? AND {tenants}", [(buckets_before, *tenant_params)])
            for table in BUCKET_TABLES
        ),
        (f"DELETE FROM head_chunks WHERE time_slot < ? AND {tenants}", [(raw_before, *tenant_params)]),
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
    fold_head_log(connection, retentions.layout.slot_width_ms)  # the head is then all in chunks
    statements = _sweep_statements(retentions.layout, now_ms, others, overridden)
    for tenant, layout in by_tenant.items():
        statements += _sweep_statements(layout, now_ms, "tenant = ?", [tenant])
    transaction(connection, statements)
    # incremental_vacuum frees one page per step, and Python's sqlite3 steps a statement without
    # result columns once: so one statement per free page, all in one transaction.
    with immediate(connection):
        for _ in range(connection.execute("PRAGMA freelist_count").fetchone()[0]):
            connection.execute("PRAGMA incremental_vacuum(1)")
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _expired_series(connection: sqlite3.Connection, retentions: Retentions, now_ms: int, limit: int) -> list[SeriesKey]:
    """At most ``limit`` series last indexed in a bucket that ended their tenant's longest retention
    ago: nothing of them is left in any table (series_set_hashes_last_bucket)."""
    by_tenant = retentions.by_tenant
    overridden = list(by_tenant)
    others = f"tenant NOT IN ({', '.join('?' * len(overridden))})" if overridden else "1"
    conditions = [
        (retentions.layout, others, overridden),
        *((layout, "tenant = ?", [t]) for t, layout in by_tenant.items()),
    ]
    found: list[SeriesKey] = []
    for layout, tenants, params in conditions:
        before = now_ms - layout.longest_retention_ms - INDEX_BUCKET_MS + 1
        query = (
            "SELECT tenant, series_set_hash, metric_name, tags FROM series_set_hashes"
            f" WHERE last_bucket < ? AND {tenants} LIMIT ?"
        )
        rows = connection.execute(query, (before, *params, limit - len(found))).fetchall()
        found += [SeriesKey(tenant, hash_, name, json.loads(tags)) for tenant, hash_, name, tags in rows]
        if len(found) >= limit:
            break
    return found


class SQLiteLifecycle(SQLiteBase):
    """The Lifecycle role (contract.py)."""

    def start(self):
        """Start the thread pools and open the file; if the file cannot be opened, the pools are
        stopped again before the error is raised (their threads would keep a CLI command alive)."""
        if self.path.parent.exists() and not self.path.parent.is_dir():
            raise NotADirectoryError(f"{self.path.parent} is a file, not a directory")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer.start()
        self._readers.start()
        self._fold_check.start(self.fold_check_s, now=False)
        return (
            self._write(start_writer, self.layout)
            .addCallback(lambda since: setattr(self, "bucket_index_since", since))
            .addErrback(lambda failure: self.close().addBoth(lambda _: failure))
        )

    def close(self):
        if self._fold_check.running:
            self._fold_check.stop()

        def stop_and_close():
            self._writer.stop()
            self._readers.stop()
            for connection in self._connections:
                connection.close()
            self._connections.clear()

        return blocking.in_daemon_thread(stop_and_close)

    def ping(self):
        return self._read(lambda connection: connection.execute("SELECT 1").fetchone())

    def identity(self):
        """A random id the file got when its schema was made (a copied file keeps it)."""
        return self._read(
            lambda connection: "sqlite:" + connection.execute("SELECT id FROM store_identity").fetchone()[0]
        )

    def sweep(self, now_ms):
        return ensureDeferred(self._sweep_all(now_ms))

    async def _sweep_all(self, now_ms: int) -> None:
        """The expired rows, then the index of the series they were the last of, then the tenants
        left without series: the index of a tenant whose data expired shrinks to nothing."""
        await self._write(_sweep, self.retentions, now_ms)
        while expired := await self._read(_expired_series, self.retentions, now_ms, EXPIRED_SERIES_A_STEP):
            await remove_from_index(self, expired, time_index=False)  # the sweep took their buckets
        query = (
            "DELETE FROM tenants WHERE NOT EXISTS (SELECT 1 FROM series_set_hashes s WHERE s.tenant = tenants.tenant)"
        )
        await self._commit(single_statement, query, [()])
