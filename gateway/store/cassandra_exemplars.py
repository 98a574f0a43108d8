"""Exemplars on Cassandra."""

import json

from gateway.store.cassandra_base import PLAIN_ROWS, RANGE_BY_TS, CassandraBase
from gateway.store.contract import ExemplarRow, exemplar_labels_text, exemplars_in_range, time_slot


class CassandraExemplars(CassandraBase):
    """The ExemplarStore role (contract.py)."""

    def _statement_texts(self) -> dict[str, str]:
        ks = self.keyspace
        return {
            **super()._statement_texts(),
            "write_exemplar": f"INSERT INTO {ks}.exemplars (tenant, series_set_hash, time_slot, ts, labels, value) VALUES (?, ?, ?, ?, ?, ?) USING TTL ?",
            "read_exemplars": (
                f"SELECT series_set_hash, ts, value, labels FROM {ks}.exemplars WHERE tenant = ? AND series_set_hash IN ? AND time_slot IN ?"
                f" PER PARTITION LIMIT {self.layout.max_exemplars_per_series}"
            ),
            "delete_range_exemplars": f"DELETE FROM {ks}.exemplars WHERE {RANGE_BY_TS}",
        }

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
        return self._write_rows(requests)

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
