"""Native histograms and their roll-ups in the embedded store."""

from gateway.store.contract import HistogramRow, time_slot
from gateway.store.sqlite_base import SQLiteBase
from gateway.store.sqlite_sql import column_values


def _histogram_statements(table: str, width: int, histograms) -> list[tuple[str, list]]:
    """The rows of a histogram table and their series-slots in histogram_series, in one transaction."""
    rows = [(h.tenant, h.series_set_hash, time_slot(h.timestamp_ms, width), h.timestamp_ms, h.data) for h in histograms]
    indexed = sorted({(tenant, table, slot, hash_) for tenant, hash_, slot, _, _ in rows})
    return [
        (f"INSERT OR REPLACE INTO {table} VALUES (?, ?, ?, ?, ?)", rows),
        ("INSERT OR IGNORE INTO histogram_series VALUES (?, ?, ?, ?)", indexed),
    ]


class SQLiteHistograms(SQLiteBase):
    """The HistogramStore role (contract.py)."""

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
            present = set(column_values(connection, indexed, (tenant, table, *slots)))
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
