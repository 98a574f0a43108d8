"""Float samples on Cassandra: head rows (data_head, the ingest hot path), sealed blocks, roll-ups
and the deletion of a range."""

import struct
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any

import numpy as np
from cassandra.query import BatchStatement, BatchType
from twisted.internet import defer

from gateway.core import blocking, samples
from gateway.core.caches import SlotHolds
from gateway.core.layout import HEAD_SHARDS, head_shard
from gateway.core.samples import Samples
from gateway.store.cassandra_base import (
    PLAIN_ROWS,
    RANGE_BY_TS,
    READ_SERIES_PER_REQUEST,
    CassandraBase,
    CassandraOptions,
)
from gateway.store.contract import (
    ROLLUP_COLUMN_SETS,
    ROLLUP_COLUMNS,
    RawColumns,
    RawData,
    RawPoint,
    Rollup,
    SealedBlock,
    StoreUnavailable,
    hashes_by_slot,
    time_slot,
    time_slots,
)
from gateway.store.deletion import bucket_range, cut_block

# data_head rows go in UNLOGGED batches. A batch of one partition is one mutation, which Cassandra
# neither warns about nor refuses by size; up to HEAD_PARTITION_BATCH_DATA_BYTES of rows, far under
# the commit log's limit of a mutation (half a segment), so a request stays short. Partitions of
# fewer than HEAD_SHARED_PARTITION_ROWS rows (a request of under about 400 series spreads over 16
# shards) share batches with the others of the request that have the same replicas (all of them on
# a one-node cluster): a CQL request a partition cost both sides more than its rows there
# (docs/performance-log.rst, "Head batches of several partitions": at 100 series a request, 3.2-3.5
# µs less of the gateway's CPU a sample and 7.3-7.8 of Cassandra's; at 500, where partitions have
# about 31 rows, Cassandra's cost rose by more than the gateway's fell). A batch of several
# partitions stays within Cassandra's default warning thresholds, so a default node logs nothing
# for it: HEAD_BATCH_DATA_BYTES of data (batch_size_warn_threshold, 5 KiB; it refuses above
# batch_size_fail_threshold, 50 KiB) and HEAD_BATCH_PARTITIONS partitions
# (unlogged_batch_across_partitions_warn_threshold). Cassandra 5.0 counts a batch's size as the
# sum of its partitions' data sizes: a data_head row counts its hash plus 69 bytes, a partition 29
# bytes more whatever its key (measured from its warnings, "Batch for [tsdb.data_head] is of size
# N": 2 x 35 rows 6568, 10 x 6 5870, 10 x 7 6800; 30-character hashes 6 bytes a row more).
# HEAD_ROW_DATA_BYTES and HEAD_PARTITION_DATA_BYTES count a little over both, as a margin: counted
# without the partitions, 10 partitions of 5-6 rows made batches of 5219 bytes.
HEAD_PARTITION_BATCH_DATA_BYTES = 96 * 1024
HEAD_SHARED_PARTITION_ROWS = 24
HEAD_BATCH_DATA_BYTES = 5 * 1024
HEAD_BATCH_PARTITIONS = 10
HEAD_ROW_DATA_BYTES = 72
HEAD_PARTITION_DATA_BYTES = 32

# A slot's written_at lives this much longer than the head rows written with it; WRITTEN_AT_REMEMBERED
# series-slots are remembered as having a fresh written_at. A seal records the time it read the head
# less SEAL_CLOCK_MARGIN_MS (at most half the settle delay), so the clocks of ingest and
# downsampler processes may differ by that much.
WRITTEN_AT_MARGIN_MS = 3_600_000
WRITTEN_AT_REMEMBERED = 1_000_000
SEAL_CLOCK_MARGIN_MS = 60_000

# Series-slices (a series in a data_head partition, a slice of one shard) one head read covers:
# 64 series x 10 slices at 10 s is about 4000 rows, a request a busy Cassandra answers within its
# read timeout (the 60 slices of a slot at once timed out on the loaded 2-core box). A request of
# fewer series covers more slices, so a shard's series of a last-hour dashboard (500 series are
# about 31 a shard) take 4 requests, not one per 10 slices of each slot (16 requests a shard at 2
# slots: the requests, not the rows, were most of the driver's CPU; docs/performance-log.rst).
HEAD_SERIES_SLICES_PER_REQUEST = 640

_BIGINT, _INT, _DOUBLE = struct.Struct(">q").pack, struct.Struct(">i").pack, struct.Struct(">d").pack
_SHORT = struct.Struct(">H").pack

# Compare-and-set tries of a block cut while seals keep rewriting the block (delete_samples).
CUT_BLOCK_ATTEMPTS = 5


def _unsealed(written: int | None, sealed: int | None) -> bool:
    """A slot whose head (one of its tables) was written since its last seal."""
    return written is not None and (sealed is None or written > sealed)


def _head_batches(partitions: list[list[tuple]]) -> list[list[tuple]]:
    """data_head rows (statement values), a list a partition, in batches: a partition of
    HEAD_SHARED_PARTITION_ROWS rows or more (or over HEAD_BATCH_DATA_BYTES) alone, in chunks of
    HEAD_PARTITION_BATCH_DATA_BYTES; the others whole, several a batch, at most
    HEAD_BATCH_PARTITIONS and HEAD_BATCH_DATA_BYTES a batch."""
    batches: list[list[tuple]] = []
    shared: list[tuple] = []
    shared_bytes = shared_partitions = 0
    for rows in partitions:
        size = _data_bytes(rows)
        if len(rows) >= HEAD_SHARED_PARTITION_ROWS or size > HEAD_BATCH_DATA_BYTES:
            batches += _chunks(rows, HEAD_PARTITION_BATCH_DATA_BYTES)
            continue
        if shared_bytes + size > HEAD_BATCH_DATA_BYTES or shared_partitions == HEAD_BATCH_PARTITIONS:
            batches.append(shared)
            shared, shared_bytes, shared_partitions = [], 0, 0
        shared += rows
        shared_bytes += size
        shared_partitions += 1
    return batches + [shared] if shared else batches


def _data_bytes(rows: list[tuple]) -> int:
    """Cassandra's data size of these rows of one partition, with a margin (series_set_hash is the
    only column of variable length it counts)."""
    return sum(map(len, map(itemgetter(3), rows))) + HEAD_ROW_DATA_BYTES * len(rows) + HEAD_PARTITION_DATA_BYTES


def _rows_within(size: int, rows: list[tuple]) -> int:
    """How many of these rows Cassandra counts within ``size`` bytes, all counted at the longest
    hash (series_set_hash is the only column of variable length it counts)."""
    return max(1, size // (max(map(len, map(itemgetter(3), rows))) + HEAD_ROW_DATA_BYTES))


def _chunks(rows: list[tuple], size: int) -> list[list[tuple]]:
    if not rows:
        return []
    count = _rows_within(size, rows)
    return [rows[i : i + count] for i in range(0, len(rows), count)]


def _by_tenant(points: Sequence[RawPoint]) -> list[RawColumns]:
    """The points as columns, one RawColumns a tenant (ingest's arrays come as one already)."""
    if isinstance(points, RawColumns):
        return [points]
    if not points:
        return []
    tenants, hashes, timestamps, values = map(list, zip(*points))
    by_tenant = [(tenants[0], range(len(tenants)))] if len(set(tenants)) == 1 else _indexes_by_tenant(tenants)
    return [
        RawColumns(
            tenant,
            list(map(hashes.__getitem__, indexes)),
            np.array(list(map(timestamps.__getitem__, indexes)), dtype=np.int64),
            np.array(list(map(values.__getitem__, indexes)), dtype=np.float64),
        )
        for tenant, indexes in by_tenant
    ]


def _indexes_by_tenant(tenants: list[str]) -> list[tuple[str, list[int]]]:
    indexes: dict[str, list[int]] = defaultdict(list)
    for index, tenant in enumerate(tenants):
        indexes[tenant].append(index)
    return list(indexes.items())


def _last_of_each(columns: RawColumns) -> RawColumns:
    """The points with the last value of a (series, ts) written twice, in C loops: a batch holding
    one row twice would keep the greater value, not the last."""
    if len(set(columns.hashes)) == len(columns.hashes):  # one sample a series, as Prometheus sends
        return columns
    timestamps = columns.timestamps.tolist()
    if len(set(zip(columns.hashes, timestamps))) == len(timestamps):
        return columns
    last = dict(zip(zip(columns.hashes, timestamps), columns.values.tolist()))
    keys = list(last)
    return RawColumns(
        columns.tenant,
        list(map(itemgetter(0), keys)),
        np.fromiter(map(itemgetter(1), keys), dtype=np.int64, count=len(keys)),
        np.fromiter(last.values(), dtype=np.float64, count=len(keys)),
    )


def _head_partitions(columns: RawColumns, slice_width: int) -> Iterator[tuple[int, int, list, list, list]]:
    """(slice, shard, hashes, timestamps, values) of each data_head partition the points fall in,
    grouped by one stable sort of a key a point (no Python a point but its shard's checksum)."""
    hashes, timestamps = columns.hashes, columns.timestamps
    shards = np.fromiter(map(head_shard, hashes), dtype=np.int64, count=len(hashes))
    keys = (timestamps - timestamps % slice_width) * HEAD_SHARDS + shards
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    bounds = (np.flatnonzero(np.diff(keys)) + 1).tolist()
    ordered_hashes = list(map(hashes.__getitem__, order.tolist()))
    ordered_timestamps, ordered_values = timestamps[order].tolist(), columns.values[order].tolist()
    for start, end in zip([0, *bounds], [*bounds, len(keys)]):
        slice_ms, shard = divmod(int(keys[start]), HEAD_SHARDS)
        yield slice_ms, shard, ordered_hashes[start:end], ordered_timestamps[start:end], ordered_values[start:end]


def head_batch(statement, rows: list[tuple], consistency: int) -> BatchStatement:
    """One UNLOGGED batch of data_head rows (statement values, of one or several partitions). The
    driver's ``bind()`` costs about 7 µs a row (a BoundStatement, its checks, its routing key),
    most of the gateway's CPU per sample; so only the first row is bound (the batch takes its
    routing key and keyspace from it) and the others are added as values serialized here as
    ``bind()`` would (text as UTF-8, bigint, int and double big-endian: under 1 µs a row),
    through the batch's own ``_add_statement_and_params`` (cassandra-driver 3.29-3.30;
    tests/store/test_cassandra_head.py reads every row back)."""
    batch = BatchStatement(BatchType.UNLOGGED, consistency_level=consistency)
    batch.add(statement.bind(rows[0]))
    query_id, add = statement.query_id, batch._add_statement_and_params
    for tenant, slice_ms, shard, hash_, ts, value, ttl in rows[1:]:
        values = [
            tenant.encode(),
            _BIGINT(slice_ms),
            _INT(shard),
            hash_.encode(),
            _BIGINT(ts),
            _DOUBLE(value),
            _INT(ttl),
        ]
        add(True, query_id, values)
    batch.is_idempotent = True
    return batch


def head_routing_key(tenant: str, slice_ms: int, shard: int) -> bytes:
    """data_head's partition key (tenant, slice, shard) serialized as Cassandra hashes it into a
    token: each component as a 2-byte length, its bytes and a zero byte."""
    return b"".join(_SHORT(len(part)) + part + b"\x00" for part in (tenant.encode(), _BIGINT(slice_ms), _INT(shard)))


def _head_samples(rows: list[tuple[str, int, float]], hashes: Sequence[str]) -> list[Samples]:
    """(series_set_hash, ts, value) head rows, in the order read -> each of ``hashes``' samples,
    the later of two rows of one timestamp winning. A page holds many slices' rows, series after
    series in each, so a series comes in many short runs: all the rows are put in order at once
    (one stable sort by series and timestamp), where a merge of each series' runs cost a numpy
    call a run (about a sample a run over a dashboard's hour)."""
    if not rows:
        return [samples.empty() for _ in hashes]
    position = {hash_: at for at, hash_ in enumerate(hashes)}
    names, timestamps, values = zip(*rows)
    owner = np.fromiter(map(position.__getitem__, names), dtype=np.intp, count=len(rows))
    ts, vs = np.array(timestamps, dtype=np.int64), np.array(values, dtype=np.float64)
    order = np.lexsort((ts, owner))
    owner, ts, vs = owner[order], ts[order], vs[order]
    last_write = np.r_[(owner[1:] != owner[:-1]) | (ts[1:] != ts[:-1]), True]
    owner, ts, vs = owner[last_write], ts[last_write], vs[last_write]
    bounds = np.searchsorted(owner, np.arange(len(hashes) + 1)).tolist()
    return [Samples(ts[a:b], vs[a:b]) for a, b in zip(bounds, bounds[1:])]


class CassandraSamples(CassandraBase):
    """The SampleStore role (contract.py)."""

    def __init__(self, options: CassandraOptions):
        super().__init__(options)
        self._written_at_fresh = SlotHolds(WRITTEN_AT_REMEMBERED, self.slot_width_ms)

    def _statement_texts(self) -> dict[str, str]:
        ks = self.keyspace
        block_key = "tenant = ? AND series_set_hash = ? AND block_partition = ? AND time_slot = ?"
        head_key = "tenant = ? AND slice IN ? AND shard = ? AND series_set_hash = ? AND ts >= ? AND ts <= ?"
        texts = {
            **super()._statement_texts(),
            "head": f"INSERT INTO {ks}.data_head (tenant, slice, shard, series_set_hash, ts, value) VALUES (?, ?, ?, ?, ?, ?) USING TTL ?",
            "head_written": f"UPDATE {ks}.data_blocks USING TTL ? SET head_written_at = ? WHERE {block_key}",
            "write_block": f"UPDATE {ks}.data_blocks USING TTL ? SET block = ?, sealed_at = ? WHERE {block_key}",
            "read_slots": f"SELECT series_set_hash, time_slot, block, written_at, head_written_at, sealed_at FROM {ks}.data_blocks WHERE tenant = ? AND series_set_hash IN ? AND block_partition = ? AND time_slot >= ? AND time_slot <= ?",
            "read_head": f"SELECT series_set_hash, ts, value FROM {ks}.data_head WHERE tenant = ? AND slice IN ? AND shard = ? AND series_set_hash IN ? AND ts >= ? AND ts <= ?",
            "read_legacy_head": f"SELECT ts, value FROM {ks}.data_raw WHERE tenant = ? AND series_set_hash = ? AND time_slot IN ? AND ts >= ? AND ts <= ?",
            "read_block": f"SELECT block FROM {ks}.data_blocks WHERE {block_key}",
            "cut_block": f"UPDATE {ks}.data_blocks USING TTL ? SET block = ? WHERE {block_key} IF block = ?",
            "delete_range_data_head": f"DELETE FROM {ks}.data_head WHERE {head_key}",
            "delete_range_data_raw": f"DELETE FROM {ks}.data_raw WHERE {RANGE_BY_TS}",
        }
        for granularity in self.layout.granularities:
            table = granularity.table
            texts[f"read_{table}"] = (
                f"SELECT ts, {', '.join(ROLLUP_COLUMNS)} FROM {ks}.{table}"
                " WHERE tenant = ? AND series_set_hash = ? AND time_slot = ? AND ts >= ? AND ts <= ?"
            )
            for columns in ROLLUP_COLUMN_SETS:
                assignments = ", ".join(f"{c} = ?" for c in columns)
                texts[f"write_{table}_{'_'.join(columns)}"] = (
                    f"UPDATE {ks}.{table} USING TTL ? SET {assignments}"
                    " WHERE tenant = ? AND series_set_hash = ? AND time_slot = ? AND ts = ?"
                )
            texts[f"delete_range_{table}"] = f"DELETE FROM {ks}.{table} WHERE {RANGE_BY_TS}"
        return texts

    def write_raw(self, points: Sequence[RawPoint]):
        """Head rows, each with the TTL of its slot, in UNLOGGED batches of a data_head partition
        (tenant, slice, shard), or of the small partitions that share their replicas (_head_batches;
        through the head writer, acsylla, unless the URL says head_writer=driver), and the slot's
        ``head_written_at`` in
        data_blocks where this process has not written it lately (read_raw finds head rows through it).
        Where a request holds one (series, ts) twice, its last value is written."""
        statement: Any = self._statements["head"]
        layout, now, consistency = self.layout, int(time.time() * 1000), self.options.write_consistency
        width, slice_width = self.slot_width_ms, layout.head_slice_ms
        groups: dict[object, list[list[tuple]]] = defaultdict(list)
        token_map = self._token_map()
        entries: list[tuple[object, tuple]] = []
        fresh: list[tuple[str, int, list[str], int]] = []
        for columns in map(_last_of_each, _by_tenant(points)):
            tenant = columns.tenant
            for slice_ms, shard, hashes, timestamps, values in _head_partitions(columns, slice_width):
                ttl = layout.head_ttl_ms(slice_ms - slice_ms % width, now) // 1000 + 1
                rows = zip(repeat(tenant), repeat(slice_ms), repeat(shard), hashes, timestamps, values, repeat(ttl))
                replicas = token_map and self._head_replicas(token_map, tenant, slice_ms, shard)
                groups[replicas].append(list(rows))
            self._written_at_updates(columns, now, entries, fresh)
        chunks = [batch for partitions in groups.values() for batch in _head_batches(partitions)]
        writer = self._acsylla
        if writer is None:  # head_writer=driver: one group of requests with the head_written_at updates
            batches = [(head_batch(statement, chunk, consistency), ()) for chunk in chunks]
            written = self._execute_all(self._batched(entries) + batches)
        else:
            heads = writer.write(chunks)
            written = defer.gatherResults([self._write_rows(entries), heads], consumeErrors=True)
            written.addErrback(lambda failure: failure.value.subFailure)
        return written.addCallback(lambda _: self._hold_written_at(fresh, now))

    def _head_replicas(self, token_map, tenant: str, slice_ms: int, shard: int) -> frozenset:
        """The replicas of a data_head partition: the coordinator of a batch of partitions that
        share their replicas applies each of them itself, with no extra hop."""
        key = head_routing_key(tenant, slice_ms, shard)
        return frozenset(token_map.get_replicas(self.keyspace, token_map.token_class.from_key(key)))

    def _written_at_updates(self, columns: RawColumns, now: int, requests: list, fresh: list) -> None:
        """``head_written_at`` = now in the data_blocks rows of the batch's series-slots, but for those
        this process wrote an entry for lately: until ``max(slot end, entry) + settle_delay / 2``, a slot
        cannot have been sealed since (sealing waits for the slot's end and its last write to be
        ``settle_delay`` old), so a reader that finds the entry newer than the last seal reads the
        head rows anyway. A write after that refreshes the entry, so one that lands after a seal
        always makes its slot's head rows read again. Adds the requests to ``requests`` and the
        holds to remember once they succeeded to ``fresh``."""
        layout, tenant, statement = self.layout, columns.tenant, self._statements["head_written"]
        for (_, slot), hashes in hashes_by_slot(columns, self.slot_width_ms).items():
            stale = self._written_at_fresh.unheld(tenant, slot, hashes, now)
            if not stale:
                continue
            ttl_ms = layout.head_ttl_ms(slot, now) + layout.settle_delay_ms + WRITTEN_AT_MARGIN_MS
            partition = time_slot(slot, layout.block_partition_width_ms)
            requests += [(statement, (ttl_ms // 1000, now, tenant, hash_, partition, slot)) for hash_ in stale]
            fresh.append((tenant, slot, stale, max(slot + self.slot_width_ms, now) + layout.settle_delay_ms // 2))

    def _hold_written_at(self, fresh: list, now: int) -> None:
        for tenant, slot, hashes, until in fresh:
            self._written_at_fresh.hold(tenant, slot, hashes, until, now)

    def read_raw(self, tenant, hashes, start_ms, end_ms):
        """The data_blocks rows of the range, READ_SERIES_PER_REQUEST series a request
        (``series_set_hash IN ?``) per block partition, then the head rows of the slots written
        since their last seal, if any (the head rows of the others are all in their blocks):
        from data_head, the series of one shard and slot together (``slice IN ? AND shard = ? AND
        series_set_hash IN ?``), and from data_raw (the head of the layout before data_head, one
        request a series) where a slot's ``written_at`` says it has rows there."""
        hashes = list(hashes)
        if end_ms < start_ms:
            return defer.succeed([RawData([], samples.empty()) for _ in hashes])
        width = self.slot_width_ms
        first, last = time_slot(start_ms, width), time_slot(end_ms, width)
        statement = self._statements["read_slots"]
        partitions = self._time_slots(first, last, self.layout.block_partition_width_ms)
        chunks = [hashes[i : i + READ_SERIES_PER_REQUEST] for i in range(0, len(hashes), READ_SERIES_PER_REQUEST)]
        requests = [
            (statement, (tenant, chunk, partition, first, last)) for chunk in chunks for partition in partitions
        ]

        def read_heads(pages):
            found: dict[str, list[tuple[int, bytes]]] = {hash_: [] for hash_ in hashes}
            legacy, unsealed = defaultdict(list), defaultdict(list)
            for page in pages:
                for hash_, slot, block, written, head_written, sealed in page:
                    if block is not None:
                        found[hash_].append((slot, block))
                    if _unsealed(written, sealed):
                        legacy[hash_].append(slot)
                    if _unsealed(head_written, sealed):
                        unsealed[(head_shard(hash_), slot)].append(hash_)
            blocks = {hash_: [block for _, block in sorted(some, key=itemgetter(0))] for hash_, some in found.items()}
            legacy = {hash_: sorted(slots) for hash_, slots in legacy.items()}
            head_requests = self._head_reads(tenant, unsealed, start_ms, end_ms)
            legacy_requests = [
                (self._statements["read_legacy_head"], (tenant, hash_, slots, start_ms, end_ms))
                for hash_, slots in legacy.items()
            ]

            def assemble(results):
                rows = [row for page in results[: len(head_requests)] for row in page]
                for hash_, page in zip(legacy, results[len(head_requests) :]):
                    rows += [(hash_, *row) for row in page]
                return [RawData(blocks[h], head) for h, head in zip(hashes, _head_samples(rows, hashes))]

            return self._execute_all(head_requests + legacy_requests, PLAIN_ROWS).addCallback(assemble)

        return self._execute_all(requests, PLAIN_ROWS).addCallback(read_heads)

    def _head_reads(self, tenant: str, unsealed: dict[tuple[int, int], list[str]], start_ms: int, end_ms: int) -> list:
        """Requests for the data_head rows in a range of the series of each (shard, slot): the slots
        of a shard with the same unsealed series read together, up to READ_SERIES_PER_REQUEST series
        and HEAD_SERIES_SLICES_PER_REQUEST series-slices a request."""
        slices_of: dict[tuple[int, tuple[str, ...]], list[int]] = defaultdict(list)
        for (shard, slot), slot_hashes in sorted(unsealed.items()):
            slices_of[(shard, tuple(sorted(slot_hashes)))] += self.layout.head_slices(slot, start_ms, end_ms)
        statement, requests = self._statements["read_head"], []
        for (shard, shard_hashes), slices in slices_of.items():
            for i in range(0, len(shard_hashes), READ_SERIES_PER_REQUEST):
                chunk = list(shard_hashes[i : i + READ_SERIES_PER_REQUEST])
                per_request = max(1, HEAD_SERIES_SLICES_PER_REQUEST // len(chunk))
                for j in range(0, len(slices), per_request):
                    requests.append((statement, (tenant, slices[j : j + per_request], shard, chunk, start_ms, end_ms)))
        return requests

    def write_block(self, tenant, series_set_hash, slot_ms, block, sealed, head_read_ms, head_keys=()):
        return self._write_blocks([SealedBlock(tenant, series_set_hash, slot_ms, block, sealed, head_read_ms)])

    def write_blocks(self, blocks):
        return self._write_blocks(blocks)

    def _write_blocks(self, blocks: Sequence[SealedBlock]) -> defer.Deferred:
        """Each block and its row marked sealed as of the head's read (less a margin for clock
        skew) in one row update (so ``sealed_at`` lives as long as the block), so readers skip the
        head rows it holds; many series-slots a request (_batched). Head rows are left to their
        TTL: deleting them would write tombstones."""
        statement, width = self._statements["write_block"], self.layout.block_partition_width_ms
        margin = min(SEAL_CLOCK_MARGIN_MS, self.layout.settle_delay_ms // 2)
        requests = [
            (
                statement,
                (
                    self._ttl_s(b.tenant, lambda layout: layout.raw_retention_ms),
                    b.block,
                    b.head_read_ms - margin,
                    b.tenant,
                    b.series_set_hash,
                    time_slot(b.slot_ms, width),
                    b.slot_ms,
                ),
            )
            for b in blocks
        ]
        return self._write_rows(requests)

    def write_rollups(self, granularity, rows):
        """An UPDATE of only the aggregates a row has, so no tombstones are written for the rest;
        each row with its tenant's retention of the granularity."""
        width, name = granularity.partition_width_ms, granularity.name
        requests = []
        for row in rows:
            columns = tuple(c for c in ROLLUP_COLUMNS if getattr(row, c) is not None)
            statement = self._statements[f"write_{granularity.table}_{'_'.join(columns)}"]
            key = (row.tenant, row.series_set_hash, time_slot(row.timestamp_ms, width), row.timestamp_ms)
            ttl = self._ttl_s(row.tenant, lambda layout: layout.granularity(name).retention_ms)
            requests.append((statement, (ttl, *(getattr(row, c) for c in columns), *key)))
        return self._write_rows(requests)

    def read_rollups(self, granularity, tenant, series_set_hash, start_ms, end_ms):
        statement = self._statements[f"read_{granularity.table}"]
        slots = self._time_slots(start_ms, end_ms, granularity.partition_width_ms)
        requests = [(statement, (tenant, series_set_hash, slot, start_ms, end_ms)) for slot in slots]

        def rows(pages):
            return [Rollup(tenant, series_set_hash, *row) for page in pages for row in page]

        return self._execute_all(requests, PLAIN_ROWS).addCallback(rows)

    def delete_samples(self, tenant, hashes, start_ms, end_ms):
        return defer.ensureDeferred(self._delete_samples(tenant, list(hashes), start_ms, end_ms))

    async def _delete_samples(self, tenant: str, hashes: list[str], start_ms: int, end_ms: int) -> None:
        """Each table from the later of ``start_ms`` and its retention's start (less a partition):
        blocks cut one compare-and-set at a time (cut_blocks), then range deletes of the
        partitions that have rows: head rows of slots written, exemplars read in the range,
        histograms and their roll-ups by histogram_series, every roll-up partition of the range."""
        layout, now = self.retentions.widest(), int(time.time() * 1000)  # as far back as any tenant's rows
        width = self.slot_width_ms
        raw_start = max(start_ms, now - layout.raw_retention_ms - layout.block_partition_width_ms)
        deletes: list[tuple[Any, tuple]] = []
        if raw_start <= end_ms:
            deletes += await self._cut_blocks(tenant, hashes, raw_start, end_ms)
            deletes += await self._histogram_deletes("histograms", width, tenant, hashes, raw_start, end_ms)
        exemplar_start = max(start_ms, now - layout.exemplar_retention_ms - width)
        if exemplar_start <= end_ms:
            requests = self._partition_requests(
                self._statements["read_exemplars"], tenant, hashes, exemplar_start, end_ms
            )
            found = {(row[0], time_slot(row[1], width)) for page in await self._execute_all(requests) for row in page}
            statement = self._statements["delete_range_exemplars"]
            deletes += [(statement, (tenant, h, slot, start_ms, end_ms)) for h, slot in sorted(found)]
        for granularity in layout.granularities:
            partition = granularity.partition_width_ms
            oldest = max(start_ms, now - granularity.retention_ms - partition)
            if oldest > end_ms:
                continue
            first, last = bucket_range(oldest, end_ms, granularity.width_ms)
            statement = self._statements[f"delete_range_{granularity.table}"]
            deletes += [
                (statement, (tenant, h, slot, first, last))
                for h in hashes
                for slot in time_slots(first, last, partition)
            ]
            deletes += await self._histogram_deletes(
                granularity.histogram_table, partition, tenant, hashes, first, last
            )
        await self._execute_all(deletes)

    async def _cut_blocks(self, tenant: str, hashes: list[str], start_ms: int, end_ms: int) -> list:
        """Cut the blocks of the range, each with ``IF block = <the bytes it was cut from>``: a seal
        that wrote the block meanwhile fails the condition, and the block is read and cut again,
        so the seal's samples outside the range stay. Returns the range deletes of the head rows
        of every slot ever written (written_at: data_raw, head_written_at: data_head)."""
        width = self.slot_width_ms
        first, last = time_slot(start_ms, width), time_slot(end_ms, width)
        statement = self._statements["read_slots"]
        chunks = [hashes[i : i + READ_SERIES_PER_REQUEST] for i in range(0, len(hashes), READ_SERIES_PER_REQUEST)]
        partitions = time_slots(first, last, self.layout.block_partition_width_ms)
        requests = [(statement, (tenant, chunk, p, first, last)) for chunk in chunks for p in partitions]
        legacy, head = self._statements["delete_range_data_raw"], self._statements["delete_range_data_head"]
        deletes: list[tuple[Any, tuple]] = []
        cuts = []
        for page in await self._execute_all(requests, PLAIN_ROWS):
            for hash_, slot, block, written, head_written, _ in page:
                if written is not None:
                    deletes.append((legacy, (tenant, hash_, slot, start_ms, end_ms)))
                slices = self.layout.head_slices(slot, start_ms, end_ms)
                if head_written is not None and slices:
                    deletes.append((head, (tenant, slices, head_shard(hash_), hash_, start_ms, end_ms)))
                if block is not None:
                    key = (tenant, hash_, time_slot(slot, self.layout.block_partition_width_ms), slot)
                    cuts.append(defer.ensureDeferred(self._cut_block(key, block, start_ms, end_ms)))
        await defer.gatherResults(cuts, consumeErrors=True)
        return deletes

    async def _cut_block(self, key: tuple, block: bytes, start_ms: int, end_ms: int) -> None:
        for _ in range(CUT_BLOCK_ATTEMPTS):
            cut = await blocking.in_thread(cut_block, block, start_ms, end_ms)
            if cut is block:
                return
            ttl = self._ttl_s(key[0], lambda layout: layout.raw_retention_ms)
            (row,) = await self._execute(self._statements["cut_block"], (ttl, cut, *key, block))
            if row[0]:
                return
            found = await self._execute(self._statements["read_block"], key)
            if not found or found[0].block is None:
                return
            block = found[0].block
        raise StoreUnavailable(f"cassandra: block {key} kept changing while it was cut; delete again")
