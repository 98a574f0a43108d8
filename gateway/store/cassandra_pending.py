"""Pending downsample work on Cassandra (pending_downsample_sets)."""

from gateway.store.cassandra_base import CassandraBase
from gateway.store.contract import PendingSet


class CassandraPending(CassandraBase):
    """The PendingStore role (contract.py)."""

    def _statement_texts(self) -> dict[str, str]:
        ks = self.keyspace
        return {
            **super()._statement_texts(),
            "pending": f"INSERT INTO {ks}.pending_downsample_sets (partition, time_slot, tenant, series_set_hash, last_touch) VALUES (?, ?, ?, ?, ?)",
            "list_pending": f"SELECT partition, time_slot, tenant, series_set_hash, last_touch FROM {ks}.pending_downsample_sets WHERE partition = ? AND time_slot < ?",
            "delete_pending": f"DELETE FROM {ks}.pending_downsample_sets WHERE partition = ? AND time_slot = ? AND tenant = ? AND series_set_hash = ? IF last_touch = ?",
        }

    def mark_pending(self, rows, touched_ms):
        statement = self._statements["pending"]
        return self._execute_all(self._batched([(statement, (*row[:4], touched_ms)) for row in rows]))

    def list_pending(self, partition, before_slot):
        def rows(found):
            return sorted(
                PendingSet(r.partition, r.time_slot, r.tenant, r.series_set_hash, r.last_touch) for r in found
            )

        return self._execute(self._statements["list_pending"], (partition, before_slot)).addCallback(rows)

    def delete_pending(self, rows):
        return self._execute_all([(self._statements["delete_pending"], tuple(row)) for row in rows])
