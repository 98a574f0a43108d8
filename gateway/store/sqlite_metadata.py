"""Metric metadata, aggregators and created timestamps in the embedded store."""

import json
import sqlite3
from collections.abc import Iterable, Sequence

from gateway.store.contract import MetricMetadata
from gateway.store.sqlite_base import SQLiteBase
from gateway.store.sqlite_index import series_rows
from gateway.store.sqlite_sql import immediate, single_statement


def _get_created(connection: sqlite3.Connection, tenant: str, hashes: list[str]) -> dict[str, int]:
    return {
        series_set_hash: created
        for series_set_hash, created in series_rows(connection, "created_ms", tenant, hashes)
        if created is not None
    }


class SQLiteMetadata(SQLiteBase):
    """The MetadataStore role (contract.py)."""

    def add_metric_aggregators(self, tenant, metric_name, aggregators):
        def add(connection):
            with immediate(connection):
                row = connection.execute(
                    "SELECT aggregators FROM metric_names WHERE tenant=? AND metric_name=?", (tenant, metric_name)
                ).fetchone()
                merged = sorted(set(json.loads(row[0]) if row else ()) | set(aggregators))
                connection.execute(
                    "INSERT INTO metric_names VALUES (?, ?, ?) ON CONFLICT DO UPDATE SET aggregators = excluded.aggregators",
                    (tenant, metric_name, json.dumps(merged)),
                )

        return self._write(add)

    def write_metric_metadata(self, rows: Sequence[MetricMetadata]):
        return self._commit(
            single_statement, "INSERT OR REPLACE INTO metric_metadata VALUES (?, ?, ?, ?, ?)", list(rows)
        )

    def get_metric_metadata(self, tenant, metric_name):
        def read(connection):
            row = connection.execute(
                "SELECT * FROM metric_metadata WHERE tenant=? AND metric_name=?", (tenant, metric_name)
            ).fetchone()
            return MetricMetadata(*row) if row else None

        return self._read(read)

    def write_created_timestamps(self, rows):
        query = "UPDATE series_set_hashes SET created_ms=? WHERE tenant=? AND series_set_hash=?"
        return self._commit(single_statement, query, [(r.created_ms, r.tenant, r.series_set_hash) for r in rows])

    def get_created_timestamps(self, tenant, hashes: Iterable[str]):
        return self._read(_get_created, tenant, list(hashes))
