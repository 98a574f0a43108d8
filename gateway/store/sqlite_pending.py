"""Pending downsample work in the embedded store (pending_downsample_sets)."""

from gateway.store.contract import PendingSet
from gateway.store.sqlite_base import SQLiteBase
from gateway.store.sqlite_sql import single_statement


class SQLitePending(SQLiteBase):
    """The PendingStore role (contract.py)."""

    def mark_pending(self, rows, touched_ms):
        values = [(r.partition, r.time_slot, r.tenant, r.series_set_hash, touched_ms) for r in rows]
        return self._commit(
            single_statement, "INSERT OR REPLACE INTO pending_downsample_sets VALUES (?, ?, ?, ?, ?)", values
        )

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
        return self._commit(single_statement, query, [tuple(r) for r in rows])
