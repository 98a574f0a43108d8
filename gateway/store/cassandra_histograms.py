"""Native histograms and their roll-ups on Cassandra, found through histogram_series."""

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from twisted.internet import defer

from gateway.core.layout import Layout
from gateway.store.cassandra_base import PLAIN_ROWS, RANGE_BY_TS, CassandraBase, slot_requests
from gateway.store.cassandra_schema import histogram_retention_ms
from gateway.store.contract import HistogramRow, time_slot, time_slots


class CassandraHistograms(CassandraBase):
    """The HistogramStore role (contract.py)."""

    def _statement_texts(self) -> dict[str, str]:
        ks = self.keyspace
        texts = {
            **super()._statement_texts(),
            "write_histogram": f"INSERT INTO {ks}.histograms (tenant, series_set_hash, time_slot, ts, data) VALUES (?, ?, ?, ?, ?) USING TTL ?",
            "read_histograms": f"SELECT series_set_hash, ts, data FROM {ks}.histograms WHERE tenant = ? AND series_set_hash IN ? AND time_slot IN ? AND ts >= ? AND ts <= ?",
            "delete_range_histograms": f"DELETE FROM {ks}.histograms WHERE {RANGE_BY_TS}",
            "write_histogram_series": f"INSERT INTO {ks}.histogram_series (tenant, source, time_slot, series_set_hash) VALUES (?, ?, ?, ?) USING TTL ?",
            "read_histogram_series": f"SELECT time_slot, series_set_hash FROM {ks}.histogram_series WHERE tenant = ? AND source IN ? AND time_slot IN ?",
        }
        for granularity in self.layout.granularities:
            table = granularity.histogram_table
            texts[f"write_{table}"] = (
                f"INSERT INTO {ks}.{table} (tenant, series_set_hash, time_slot, ts, data) VALUES (?, ?, ?, ?, ?) USING TTL ?"
            )
            texts[f"read_{table}"] = (
                f"SELECT series_set_hash, ts, data FROM {ks}.{table}"
                " WHERE tenant = ? AND series_set_hash IN ? AND time_slot IN ? AND ts >= ? AND ts <= ?"
            )
            texts[f"delete_range_{table}"] = f"DELETE FROM {ks}.{table} WHERE {RANGE_BY_TS}"
        return texts

    def write_histograms(self, histograms):
        """Rows with their tenant's --raw-retention."""
        return self._write_histogram_table(
            "histograms",
            self._statements["write_histogram"],
            self.slot_width_ms,
            histograms,
            lambda layout: layout.raw_retention_ms,
        )

    def read_histograms(self, tenant, hashes, start_ms, end_ms):
        return self._read_histogram_table(
            "histograms", self._statements["read_histograms"], self.slot_width_ms, tenant, hashes, start_ms, end_ms
        )

    def write_histogram_rollups(self, granularity, rows):
        """Rows with their tenant's retention of the granularity."""
        table, name = granularity.histogram_table, granularity.name
        return self._write_histogram_table(
            table,
            self._statements[f"write_{table}"],
            granularity.partition_width_ms,
            rows,
            lambda layout: layout.granularity(name).retention_ms,
        )

    def read_histogram_rollups(self, granularity, tenant, hashes, start_ms, end_ms):
        table = granularity.histogram_table
        return self._read_histogram_table(
            table, self._statements[f"read_{table}"], granularity.partition_width_ms, tenant, hashes, start_ms, end_ms
        )

    def _write_histogram_table(self, table: str, statement, width: int, histograms, retention: Callable[[Layout], int]):
        """The rows (kept their tenant's ``retention``) and, in the same requests, their
        series-slots in histogram_series (rewritten each time, so the index lives as long as the
        newest row it points at: the tenant's longest histogram retention)."""
        ttls = {tenant: self._ttl_s(tenant, retention) for tenant in {h.tenant for h in histograms}}
        requests: list[tuple[Any, tuple]] = [
            (
                statement,
                (h.tenant, h.series_set_hash, time_slot(h.timestamp_ms, width), h.timestamp_ms, h.data, ttls[h.tenant]),
            )
            for h in histograms
        ]
        indexed = {(h.tenant, time_slot(h.timestamp_ms, width), h.series_set_hash) for h in histograms}
        index = self._statements["write_histogram_series"]
        kept = {tenant: self._ttl_s(tenant, histogram_retention_ms) for tenant in ttls}
        requests += [(index, (tenant, table, slot, hash_, kept[tenant])) for tenant, slot, hash_ in sorted(indexed)]
        return self._write_rows(requests)

    def _read_histogram_table(self, table: str, statement, width: int, tenant, hashes, start_ms, end_ms):
        """histogram_series first (one partition a slot), then only the series-slots it names."""
        hashes = list(hashes)
        wanted = set(hashes)
        slots = list(self._time_slots(start_ms, end_ms, width))
        lookups = slot_requests(self._statements["read_histogram_series"], tenant, [table], slots)

        def read(pages):
            found: dict[int, list[str]] = defaultdict(list)
            for page in pages:
                for slot, hash_ in page:
                    if hash_ in wanted:
                        found[slot].append(hash_)
            requests = [
                request
                for slot, slot_hashes in sorted(found.items())
                for request in slot_requests(statement, tenant, slot_hashes, [slot], start_ms, end_ms)
            ]
            return self._execute_all(requests, PLAIN_ROWS) if requests else []

        def collect(pages):
            rows: dict[str, list[HistogramRow]] = {hash_: [] for hash_ in hashes}
            for page in pages:
                for hash_, ts, data in page:
                    rows[hash_].append(HistogramRow(tenant, hash_, ts, bytes(data)))
            return [sorted(rows[hash_], key=lambda row: row.timestamp_ms) for hash_ in hashes]

        if not hashes or not slots:
            return defer.succeed([[] for _ in hashes])
        return self._execute_all(lookups, PLAIN_ROWS).addCallback(read).addCallback(collect)

    async def _histogram_deletes(self, table: str, width: int, tenant, hashes, start_ms: int, end_ms: int) -> list:
        """Range deletes of the partitions of a histogram table that histogram_series names."""
        wanted = set(hashes)
        slots = list(time_slots(start_ms, end_ms, width))
        lookups = slot_requests(self._statements["read_histogram_series"], tenant, [table], slots)
        statement = self._statements[f"delete_range_{table}"]
        return [
            (statement, (tenant, hash_, slot, start_ms, end_ms))
            for page in await self._execute_all(lookups, PLAIN_ROWS)
            for slot, hash_ in page
            if hash_ in wanted
        ]
