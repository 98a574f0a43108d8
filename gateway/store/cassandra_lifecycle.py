"""Lifecycle of the Cassandra driver: connect and close, schema apply and upgrades, health and identity."""

import time

from twisted.internet import defer, threads

from gateway.core import blocking
from gateway.store.cassandra_acsylla import AcsyllaWriter
from gateway.store.cassandra_base import CassandraBase, unavailable_error
from gateway.store.cassandra_old_index import OldIndexExpiry, Walked
from gateway.store.cassandra_requests import RequestQueue
from gateway.store.cassandra_schema import keyspace_statement, table_statements, upgrade_statements
from gateway.store.contract import BUCKET_INDEX_ALWAYS, StoreUnavailable, time_slot


class CassandraLifecycle(CassandraBase):
    """The Lifecycle role (contract.py)."""

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
                ("series_set_hashes", "last_bucket", "bigint"),
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
            statements.append(self._bucket_index_since(session, "series_set_hashes" in tables))
            return statements
        finally:
            self.cluster.shutdown()

    def expire_old_index(self, say, max_ranges: int | None = None, restart: bool = False) -> Walked:
        """Give the all-time index rows written without a TTL theirs (cassandra_old_index.py);
        blocking (used by ``tsgate schema expire-old-index``)."""
        session = self._connect(self.keyspace)
        try:
            return OldIndexExpiry(self, session, say).run(max_ranges, restart)
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

    def _bucket_index_since(self, session, existed: bool) -> str:
        """From when the time index holds every series: always for a new keyspace, from now for one
        that holds series written before it existed (their earlier time is answered from the
        all-time index). Set once (IF NOT EXISTS): applying the schema again changes nothing."""
        has_series = (
            existed and session.execute(f"SELECT series_set_hash FROM {self.keyspace}.series_set_hashes LIMIT 1").one()
        )
        since = int(time.time() * 1000) if has_series else BUCKET_INDEX_ALWAYS
        session.execute(
            f"INSERT INTO {self.keyspace}.index_state (name, value) VALUES ('bucket_index_since', %s) IF NOT EXISTS",
            [since],
        )
        row = session.execute(f"SELECT value FROM {self.keyspace}.index_state WHERE name = 'bucket_index_since'").one()
        if row.value == BUCKET_INDEX_ALWAYS:
            return "-- the time index holds every series"
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(row.value / 1000))
        return f"-- the time index holds every series from {started} on (earlier ones: the all-time index)"

    def start(self):
        def connect():
            self.session = self._connect(self.keyspace)
            row = self.session.execute("SELECT value FROM index_state WHERE name = 'bucket_index_since'").one()
            self.bucket_index_since = BUCKET_INDEX_ALWAYS if row is None else row.value
            self._prepare_all()
            self._requests = RequestQueue(self.session, self.options.max_inflight, unavailable_error)

        if self.options.head_writer == "acsylla":
            texts = self._statement_texts()
            writes = [
                text
                for name, text in texts.items()
                if text.startswith(("INSERT", "UPDATE")) and name != "add_aggregators"
            ]
            self._acsylla = AcsyllaWriter(self.options, writes, texts["head"])
        # once connected: a thread started for a store that never opens would keep a CLI command alive
        return threads.deferToThread(connect).addCallback(lambda _: self._binder.start())

    def close(self):
        """The head writer first (its loop thread and session), then the binder thread and the
        driver's cluster."""
        closed = self._acsylla.close() if self._acsylla else defer.succeed(None)
        cluster, binder = self.cluster, self._binder

        def stop_threads():
            if binder.started:
                binder.stop()
            if cluster:
                cluster.shutdown()

        return closed.addBoth(lambda result: blocking.in_daemon_thread(stop_threads).addCallback(lambda _: result))

    def ping(self):
        return self._execute("SELECT release_version FROM system.local")

    def identity(self):
        """The keyspace and the id Cassandra gave its series table when it was created."""
        query = "SELECT id FROM system_schema.tables WHERE keyspace_name = %s AND table_name = 'series_set_hashes'"
        return self._execute(query, (self.keyspace,)).addCallback(lambda rows: f"{self.keyspace}:{rows[0].id}")

    def sweep(self, now_ms):
        return defer.succeed(None)
