"""Pending downsample work on Cassandra (pending_downsample_sets)."""

from collections import defaultdict

from cassandra.query import BatchStatement

from gateway.store.cassandra_base import PLAIN_ROWS, ROWS_PER_BATCH, CassandraBase
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
        return self._write_rows([(statement, (*row[:4], touched_ms)) for row in rows])

    def list_pending(self, partition, before_slot):
        def rows(found):
            return sorted(
                PendingSet(r.partition, r.time_slot, r.tenant, r.series_set_hash, r.last_touch) for r in found
            )

        return self._execute(self._statements["list_pending"], (partition, before_slot)).addCallback(rows)

    def delete_pending(self, rows):
        """Conditional deletes, ROWS_PER_BATCH of a partition a conditional batch: one Paxos
        round for them all, where one a row made sealing wait on Cassandra's Paxos work (about
        half of its CPU in a seal: docs/performance-log.rst, "Sealing against ingest"). A batch
        applies all or none, so where one of its rows was touched again the batch's rows are
        deleted one at a time."""
        statement, by_partition = self._statements["delete_pending"], defaultdict(list)
        for row in rows:
            by_partition[row.partition].append(tuple(row))
        chunks = [
            values[i : i + ROWS_PER_BATCH]
            for values in by_partition.values()
            for i in range(0, len(values), ROWS_PER_BATCH)
        ]
        requests = [
            (self._conditional_batch(chunk), ()) if len(chunk) > 1 else (statement, chunk[0]) for chunk in chunks
        ]

        def one_at_a_time(results):
            refused = [chunk for chunk, found in zip(chunks, results) if len(chunk) > 1 and not found[0][0]]
            return (
                self._execute_all([(statement, values) for chunk in refused for values in chunk]) if refused else None
            )

        return self._execute_all(requests, PLAIN_ROWS).addCallback(one_at_a_time)

    def _conditional_batch(self, rows: list[tuple]) -> BatchStatement:
        batch = BatchStatement(consistency_level=self.options.write_consistency)
        for values in rows:
            batch.add(self._statements["delete_pending"], values)
        return batch
