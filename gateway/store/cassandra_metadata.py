"""Metric metadata, aggregators and created timestamps on Cassandra."""

from collections.abc import Iterable, Sequence

from gateway.store.cassandra_base import PLAIN_ROWS, CassandraBase
from gateway.store.contract import MetricMetadata


class CassandraMetadata(CassandraBase):
    """The MetadataStore role (contract.py)."""

    def _statement_texts(self) -> dict[str, str]:
        ks = self.keyspace
        return {
            **super()._statement_texts(),
            "add_aggregators": f"UPDATE {ks}.metric_names USING TTL ? SET aggregators = aggregators + ? WHERE tenant = ? AND metric_name = ?",
            "metric_metadata": f"INSERT INTO {ks}.metric_metadata (tenant, metric_name, type, help, unit) VALUES (?, ?, ?, ?, ?) USING TTL ?",
            "get_metric_metadata": f"SELECT type, help, unit FROM {ks}.metric_metadata WHERE tenant = ? AND metric_name = ?",
            "write_created": f"UPDATE {ks}.series_set_hashes USING TTL ? SET created_ms = ? WHERE tenant = ? AND series_set_hash = ?",
            "get_created": f"SELECT created_ms FROM {ks}.series_set_hashes WHERE tenant = ? AND series_set_hash = ?",
        }

    def add_metric_aggregators(self, tenant, metric_name, aggregators):
        return self._execute(
            self._statements["add_aggregators"], (self._all_time_ttl_s(tenant), set(aggregators), tenant, metric_name)
        )

    def write_metric_metadata(self, rows: Sequence[MetricMetadata]):
        return self._write_rows(
            [(self._statements["metric_metadata"], (*row, self._all_time_ttl_s(row.tenant))) for row in rows]
        )

    def get_metric_metadata(self, tenant, metric_name):
        def first(rows):
            return MetricMetadata(tenant, metric_name, rows[0].type, rows[0].help, rows[0].unit) if rows else None

        return self._execute(self._statements["get_metric_metadata"], (tenant, metric_name)).addCallback(first)

    def write_created_timestamps(self, rows):
        statement = self._statements["write_created"]
        return self._write_rows(
            [(statement, (self._all_time_ttl_s(r.tenant), r.created_ms, r.tenant, r.series_set_hash)) for r in rows]
        )

    def get_created_timestamps(self, tenant, hashes: Iterable[str]):
        hashes = list(hashes)
        statement = self._statements["get_created"]

        def collect(results):
            return {h: rows[0][0] for h, rows in zip(hashes, results) if rows and rows[0][0] is not None}

        return self._execute_all([(statement, (tenant, h)) for h in hashes], PLAIN_ROWS).addCallback(collect)
