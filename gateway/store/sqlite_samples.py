"""Float samples in the embedded store: head rows (sqlite_head.py), sealed blocks, roll-ups and the
deletion of a range.
"""

import functools
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from twisted.internet.defer import succeed

from gateway.core import samples
from gateway.core.layout import Layout
from gateway.core.samples import Samples, SamplesStack
from gateway.store.contract import (
    ROLLUP_COLUMNS,
    RawColumns,
    RawData,
    RawPoint,
    RawStack,
    Rollup,
    SealedBlock,
    holds_samples,
    time_slot,
)
from gateway.store.deletion import bucket_range, cut_block
from gateway.store.sqlite_base import SQLiteBase
from gateway.store.sqlite_head import (
    drop_sealed_chunks,
    fold_head_log,
    head_slots,
    keep_in_head_slot,
    logged_samples,
    raw_statements,
    stacked_head,
)
from gateway.store.sqlite_sql import (
    column_values,
    decode_nullable,
    immediate,
    many_rows_statements,
    nullable,
    slot_rows,
)

# Series a query of series_with_data asks about (``series_set_hash IN (...)``): as many as the
# query layer reads at once (read_service.MAX_READ_BATCH).
SERIES_PER_QUERY = 2048


def series_blocks(connection, tenant: str, hashes: Sequence[str], first_slot: int, last_slot: int) -> dict[str, list]:
    """Each series' sealed blocks in the slots, in slot order, in one query for all the series
    (series without blocks there are left out)."""
    found: dict[str, list] = {}
    for hash_, block in slot_rows(
        connection, "data_blocks", "series_set_hash, block", tenant, hashes, first_slot, last_slot
    ):
        found.setdefault(hash_, []).append(block)
    return found


def _head_and_blocks(
    connection, width: int, tenant: str, hashes: list[str], start_ms: int, end_ms: int
) -> tuple[SamplesStack, list[tuple], dict[str, list]]:
    """The series' head samples in the range (stacked_head), the chunks read, and their blocks,
    from one snapshot: a fold or a seal committing meanwhile cannot move samples past the read."""
    first_slot, last_slot = time_slot(start_ms, width), time_slot(end_ms, width)
    connection.execute("BEGIN")
    try:
        head, keys = stacked_head(connection, tenant, hashes, first_slot, last_slot, start_ms, end_ms)
        return head, keys, series_blocks(connection, tenant, hashes, first_slot, last_slot)
    finally:
        connection.execute("COMMIT")


def raw_data(connection, width: int, tenant: str, hashes: list[str], start_ms: int, end_ms: int) -> list[RawData]:
    """read_raw's RawData of each series."""
    head, keys, blocks = _head_and_blocks(connection, width, tenant, hashes, start_ms, end_ms)
    return list(map(RawData, [blocks.get(hash_, []) for hash_ in hashes], head.split(), keys))


def stacked_raw_data(connection, width: int, tenant: str, hashes: list[str], start_ms: int, end_ms: int) -> RawStack:
    """read_raw_stacked's RawStack: the head read's arrays as they are."""
    head, _, blocks = _head_and_blocks(connection, width, tenant, hashes, start_ms, end_ms)
    return RawStack(head, blocks)


def _in_head_chunks(connection, width: int, tenant: str, start_ms: int, end_ms: int, hashes: list[str]) -> set[str]:
    """The hashes with a sample of the range in head_chunks, known from their timestamps alone, in
    one query for all the series: neither the values nor the merge of the writes (stacked_head's work,
    three quarters of a read of 256 series) are needed to know that a sample is there. A chunk
    that overlaps the range and whose first or last sample is inside it has one there: only the
    timestamps of a chunk around the range, or without bounds (an upgraded file's), are read
    (a last-5-minutes scan of 500 chunks: 0.58 -> 0.29 ms)."""
    slots = (time_slot(start_ms, width), time_slot(end_ms, width))
    columns = "series_set_hash, CASE WHEN first_ts >= ? OR last_ts <= ? THEN NULL ELSE timestamps END"
    rows = slot_rows(connection, "head_chunks", columns, tenant, hashes, *slots, (start_ms, end_ms), (start_ms, end_ms))
    found = {owner for owner, blob in rows if blob is None}
    rows = [(owner, blob) for owner, blob in rows if blob is not None and owner not in found]
    if not rows:
        return found
    owners, blobs = zip(*rows)
    sizes = np.fromiter(map(len, blobs), dtype=np.intp, count=len(blobs)) // 8
    timestamps = np.frombuffer(b"".join(blobs), dtype="<i8")
    owner_of_sample = np.repeat(np.arange(len(owners)), sizes)
    inside = owner_of_sample[(timestamps >= start_ms) & (timestamps <= end_ms)]
    return found | {owners[at] for at in np.unique(inside).tolist()}


def _in_head_log(connection, tenant: str, start_ms: int, end_ms: int, hashes: list[str]) -> set[str]:
    """The hashes with a sample of the range still in head_batches (not folded yet)."""
    owners = logged_samples(connection, tenant, hashes, start_ms, end_ms)[0]
    return {hashes[at] for at in np.unique(owners).tolist()}


def _in_blocks(connection, width: int, tenant: str, start_ms: int, end_ms: int, hashes: list[str]) -> set[str]:
    """The hashes with a sealed block whose first to last time overlaps the range (holds_samples)."""
    blocks = series_blocks(connection, tenant, hashes, time_slot(start_ms, width), time_slot(end_ms, width))
    return {h for h, found in blocks.items() if holds_samples(RawData(found, samples.empty()), start_ms, end_ms)}


def _rows_in_range(
    connection, table: str, width: int, tenant: str, start_ms: int, end_ms: int, hashes: list[str]
) -> list[str]:
    """The hashes with a row in the range in a table keyed (tenant, series_set_hash, time_slot, ts)."""
    query = (
        f"SELECT DISTINCT series_set_hash FROM {table} WHERE tenant=? AND series_set_hash IN"
        f" ({','.join('?' * len(hashes))}) AND time_slot BETWEEN ? AND ? AND ts BETWEEN ? AND ?"
    )
    slots = (time_slot(start_ms, width), time_slot(end_ms, width))
    return column_values(connection, query, (tenant, *hashes, *slots, start_ms, end_ms))


def _histograms_in_range(
    connection, table: str, width: int, tenant: str, start_ms: int, end_ms: int, hashes: list[str]
) -> list[str]:
    """_rows_in_range of a histogram table, asked only when histogram_series names a series of
    the tenant there in the range's slots (the read path's authority, read_histograms): a tenant
    without native histograms pays one index seek, not a probe a series."""
    slots = (time_slot(start_ms, width), time_slot(end_ms, width))
    named = connection.execute(
        "SELECT 1 FROM histogram_series WHERE tenant=? AND source=? AND time_slot BETWEEN ? AND ? LIMIT 1",
        (tenant, table, *slots),
    ).fetchone()
    return _rows_in_range(connection, table, width, tenant, start_ms, end_ms, hashes) if named else []


def _series_with_data(
    connection, layout: Layout, tenant: str, hashes: list[str], start_ms: int, end_ms: int, granularity, raw: bool
) -> set[str]:
    """series_with_data (contract.py), SERIES_PER_QUERY series a query, each asked of the next read
    only when the ones before found nothing: the timestamps of the head chunks (where a series with
    data in a recent range has it), the head log, the headers of the blocks, the native histograms,
    the roll-up tables; no series' samples are merged or decoded. One snapshot: a fold moving
    samples from the log to the chunks meanwhile cannot hide them from both reads."""
    width = layout.slot_width_ms
    reads: list[Callable[[list[str]], Iterable[str]]] = []
    if raw:
        reads += [
            functools.partial(_in_head_chunks, connection, width, tenant, start_ms, end_ms),
            functools.partial(_in_head_log, connection, tenant, start_ms, end_ms),
            functools.partial(_in_blocks, connection, width, tenant, start_ms, end_ms),
            functools.partial(_histograms_in_range, connection, "histograms", width, tenant, start_ms, end_ms),
        ]
    if granularity is not None:
        rollup_width = granularity.partition_width_ms
        reads += [
            functools.partial(_rows_in_range, connection, granularity.table, rollup_width, tenant, start_ms, end_ms),
            functools.partial(
                _histograms_in_range, connection, granularity.histogram_table, rollup_width, tenant, start_ms, end_ms
            ),
        ]
    found: set[str] = set()
    connection.execute("BEGIN")
    try:
        for at in range(0, len(hashes), SERIES_PER_QUERY):
            chunk = hashes[at : at + SERIES_PER_QUERY]
            for read in reads:
                rest = [hash_ for hash_ in chunk if hash_ not in found]
                if not rest:
                    break
                found.update(read(rest))
    finally:
        connection.execute("COMMIT")
    return found


def _write_blocks(connection, width: int, blocks: Sequence[SealedBlock]) -> None:
    """Each block, and the removal from the head of the samples it sealed that still hold the
    sealed value, in one transaction for all (after folding the head log once, so that the head is
    all in chunks): a reader sees the samples in the head or in the block, never in neither. A
    timestamp rewritten meanwhile with another value stays in the head, to be sealed next time."""
    fold_head_log(connection, width)
    with immediate(connection):
        for query, rows in many_rows_statements("INSERT OR REPLACE INTO data_blocks VALUES", [b[:4] for b in blocks]):
            connection.executemany(query, rows)
        by_slot: dict[tuple[str, int], list[SealedBlock]] = {}
        for block in blocks:
            by_slot.setdefault((block.tenant, block.slot_ms), []).append(block)
        for (tenant, slot_ms), slot_blocks in by_slot.items():
            partly = drop_sealed_chunks(connection, tenant, slot_ms, width, slot_blocks)
            for series_set_hash, sealed in partly:
                for slot, (head, seqs) in head_slots(connection, tenant, series_set_hash, slot_ms, slot_ms).items():
                    keep_in_head_slot(connection, tenant, series_set_hash, slot, head, seqs, ~_sealed_in(head, sealed))


def _sealed_in(head: Samples, sealed: Samples) -> np.ndarray:
    """Which head samples ``sealed`` holds with the same value, bit for bit."""
    if not len(sealed):
        return np.zeros(len(head), dtype=bool)
    at = np.minimum(np.searchsorted(sealed.timestamps, head.timestamps), len(sealed) - 1)
    same_bits = sealed.values.view(np.int64)[at] == head.values.view(np.int64)
    return (sealed.timestamps[at] == head.timestamps) & same_bits


def _delete_samples(connection, layout: Layout, tenant: str, hashes: list[str], start_ms: int, end_ms: int) -> None:
    """One transaction: a seal's write_block (on this same writer thread) lands wholly before or
    after it, so a block is never rewritten from a copy older than the one it replaces."""
    slots = (time_slot(start_ms, layout.slot_width_ms), time_slot(end_ms, layout.slot_width_ms))
    by_ts = "tenant=? AND series_set_hash=? AND time_slot BETWEEN ? AND ? AND ts BETWEEN ? AND ?"
    fold_head_log(connection, layout.slot_width_ms)
    with immediate(connection):
        for hash_ in hashes:
            blocks = connection.execute(
                "SELECT time_slot, block FROM data_blocks WHERE tenant=? AND series_set_hash=? AND time_slot BETWEEN ? AND ?",
                (tenant, hash_, *slots),
            ).fetchall()
            for slot, block in blocks:
                cut = cut_block(block, start_ms, end_ms)
                if cut is None:
                    connection.execute(
                        "DELETE FROM data_blocks WHERE tenant=? AND series_set_hash=? AND time_slot=?",
                        (tenant, hash_, slot),
                    )
                elif cut is not block:
                    connection.execute(
                        "UPDATE data_blocks SET block=? WHERE tenant=? AND series_set_hash=? AND time_slot=?",
                        (cut, tenant, hash_, slot),
                    )
            for slot, (head, seqs) in head_slots(connection, tenant, hash_, *slots).items():
                outside = (head.timestamps < start_ms) | (head.timestamps > end_ms)
                keep_in_head_slot(connection, tenant, hash_, slot, head, seqs, outside)
            for table in ("exemplars", "histograms"):
                connection.execute(f"DELETE FROM {table} WHERE {by_ts}", (tenant, hash_, *slots, start_ms, end_ms))
            for granularity in layout.granularities:
                first, last = bucket_range(start_ms, end_ms, granularity.width_ms)
                width = granularity.partition_width_ms
                for table in (granularity.table, granularity.histogram_table):
                    connection.execute(
                        f"DELETE FROM {table} WHERE {by_ts}",
                        (tenant, hash_, time_slot(first, width), time_slot(last, width), first, last),
                    )


class SQLiteSamples(SQLiteBase):
    """The SampleStore role (contract.py)."""

    # A fold lays its chunks out in hash order (sqlite_head._chunks): a seal group of series
    # neighbours in hash order, among all the settled series of a round, rewrites a few pages of
    # each fold, where one of a head shard rewrote a page a series and fold.
    seal_by_head_shard = False
    seal_partitions_together = None
    seal_group = 256  # SEALED_READ (sqlite_head.py) reads a group's chunk keys in one query
    head_read_by_slot = True  # _in_head_chunks reads a chunk a series-slot
    series_with_data_batch = SERIES_PER_QUERY

    def write_raw(self, points: Sequence[RawPoint]):
        if not isinstance(points, RawColumns):
            points = list(points)
        self._rows_since_fold += len(points)
        return self._commit(raw_statements, points)

    def read_raw(self, tenant, hashes, start_ms, end_ms):
        hashes = list(hashes)
        if end_ms < start_ms:
            return succeed([RawData([], samples.empty()) for _ in hashes])
        return self._read(raw_data, self.slot_width_ms, tenant, hashes, start_ms, end_ms)

    def read_raw_stacked(self, tenant, hashes, start_ms, end_ms):
        hashes = list(hashes)
        if end_ms < start_ms:
            return succeed(RawStack(samples.stacked([samples.empty()] * len(hashes)), {}))
        return self._read(stacked_raw_data, self.slot_width_ms, tenant, hashes, start_ms, end_ms)

    def series_with_data(self, tenant, hashes, start_ms, end_ms, granularity=None, raw=True):
        """One reader call (_series_with_data; contract.py)."""
        if end_ms < start_ms:
            return succeed(set())
        return self._read(_series_with_data, self.layout, tenant, list(hashes), start_ms, end_ms, granularity, raw)

    def write_block(self, tenant, series_set_hash, slot_ms, block, sealed, head_read_ms, head_keys=()):
        one = SealedBlock(tenant, series_set_hash, slot_ms, block, sealed, head_read_ms, head_keys)
        return self._write(_write_blocks, self.slot_width_ms, [one])

    def write_blocks(self, blocks):
        """One writer call and one transaction for all (a seal writes a group's blocks together)."""
        return self._write(_write_blocks, self.slot_width_ms, list(blocks))

    def write_rollups(self, granularity, rows):
        width = granularity.partition_width_ms
        values = [
            (
                r.tenant,
                r.series_set_hash,
                time_slot(r.timestamp_ms, width),
                r.timestamp_ms,
                *map(nullable, r[3:]),  # ROLLUP_COLUMNS
            )
            for r in rows
        ]
        return self._commit(many_rows_statements, f"INSERT OR REPLACE INTO {granularity.table} VALUES", values)

    def read_rollups(self, granularity, tenant, series_set_hash, start_ms, end_ms):
        if end_ms < start_ms:
            return succeed([])
        width = granularity.partition_width_ms
        query = (
            f"SELECT ts, {', '.join(ROLLUP_COLUMNS)} FROM {granularity.table} WHERE tenant=? AND series_set_hash=?"
            " AND time_slot BETWEEN ? AND ? AND ts BETWEEN ? AND ? ORDER BY time_slot, ts"
        )
        parameters = (tenant, series_set_hash, time_slot(start_ms, width), time_slot(end_ms, width), start_ms, end_ms)

        def read(connection):
            return [
                Rollup(tenant, series_set_hash, ts, *(decode_nullable(v) for v in values))
                for ts, *values in connection.execute(query, parameters)
            ]

        return self._read(read)

    def delete_samples(self, tenant, hashes, start_ms, end_ms):
        return self._write(_delete_samples, self.layout, tenant, list(hashes), start_ms, end_ms)
