"""Exemplars in the embedded store."""

import json

from twisted.internet.defer import succeed

from gateway.store.contract import ExemplarRow, exemplar_labels_text, exemplars_in_range, time_slot
from gateway.store.sqlite_base import SQLiteBase
from gateway.store.sqlite_sql import decode_value, encode_value


def _exemplar_statements(rows: list[tuple], keep: int) -> list[tuple[str, list]]:
    """The exemplars, then, in the same transaction, the deletion of those past the newest
    ``keep`` of each series-slot they landed in (--max-exemplars-per-series)."""
    trim = (
        "DELETE FROM exemplars WHERE tenant=?1 AND series_set_hash=?2 AND time_slot=?3 AND (ts, labels) NOT IN"
        " (SELECT ts, labels FROM exemplars WHERE tenant=?1 AND series_set_hash=?2 AND time_slot=?3"
        " ORDER BY ts DESC, labels LIMIT ?4)"
    )
    slots = sorted({(*row[:3], keep) for row in rows})
    return [("INSERT OR REPLACE INTO exemplars VALUES (?, ?, ?, ?, ?, ?)", rows), (trim, slots)]


class SQLiteExemplars(SQLiteBase):
    """The ExemplarStore role (contract.py)."""

    def write_exemplars(self, exemplars):
        width = self.slot_width_ms
        rows = [
            (
                e.tenant,
                e.series_set_hash,
                time_slot(e.timestamp_ms, width),
                e.timestamp_ms,
                exemplar_labels_text(e.labels),
                encode_value(e.value),
            )
            for e in exemplars
        ]
        return self._commit(_exemplar_statements, rows, self.layout.max_exemplars_per_series)

    def read_exemplars(self, tenant, hashes, start_ms, end_ms):
        hashes = list(hashes)
        if end_ms < start_ms:
            return succeed([[] for _ in hashes])
        query = (
            "SELECT ts, value, labels FROM exemplars WHERE tenant=? AND series_set_hash=?"
            " AND time_slot BETWEEN ? AND ? AND ts BETWEEN ? AND ?"
        )
        slots = (time_slot(start_ms, self.slot_width_ms), time_slot(end_ms, self.slot_width_ms))

        def read(connection):
            return [
                exemplars_in_range(
                    (
                        ExemplarRow(tenant, hash_, ts, decode_value(value), json.loads(labels))
                        for ts, value, labels in connection.execute(query, (tenant, hash_, *slots, start_ms, end_ms))
                    ),
                    start_ms,
                    end_ms,
                )
                for hash_ in hashes
            ]

        return self._read(read)
