"""Cassandra's grouped head layout (data_head: partition (tenant, slice, shard), clustering
(series_set_hash, ts)) on a real Cassandra 5.0: writes split at the batch bounds, slots spanning
many slices, late data into a sealed slot, and a delete racing a seal (docs/storage.rst)."""

import time

import numpy as np
import pytest_twisted

from gateway.core.layout import HEAD_SHARDS, Layout, head_shard
from gateway.downsample.processor import Downsampler
from gateway.store.blocks import decode_block, encode_block
from gateway.store.cassandra import CassandraStore
from gateway.store.cassandra_base import BATCH_WARNINGS, READ_SERIES_PER_REQUEST
from gateway.store.cassandra_samples import (
    HEAD_BATCH_DATA_BYTES,
    HEAD_BATCH_PARTITIONS,
    HEAD_PARTITION_BATCH_DATA_BYTES,
    HEAD_ROW_DATA_BYTES,
    HEAD_SERIES_SLICES_PER_REQUEST,
    HEAD_SHARED_PARTITION_ROWS,
    _head_batches,
    head_routing_key,
)
from gateway.store.contract import RawColumns, RawPoint, SealedBlock, time_slot
from gateway.store.read_path import stitch_raw
from tests.store.test_contract import series

HOUR = 3_600_000
MINUTE = 60_000


@pytest_twisted.async_yield_fixture
async def cassandra_store(cassandra_url):
    store = CassandraStore.from_url(cassandra_url, Layout())
    await store.start()
    yield store
    await store.close()


def past_slot() -> int:
    """The slot before the current one: ended, inside the head retention."""
    return time_slot(int(time.time() * 1000), HOUR) - HOUR


def downsampler(store) -> Downsampler:
    return Downsampler(store, pending=None, layout=store.layout, counter_suffixes=())


async def head_points(store, tenant: str, keys, start: int, end: int) -> list[list[tuple[int, float]]]:
    return [raw.head.points() for raw in await store.read_raw(tenant, [k.series_set_hash for k in keys], start, end)]


# Rows of a batch of several partitions, and of one, of series with hashes of 24 characters
# (murmur3 128 as base64), as all are.
ROWS_PER_PARTITION_BATCH = HEAD_PARTITION_BATCH_DATA_BYTES // (24 + HEAD_ROW_DATA_BYTES)


def rows_of(shard: int, count: int, hash_length: int = 24) -> list[tuple]:
    return [("t", 0, shard, "h" * hash_length, ts, 1.0, 60) for ts in range(count)]


def test_small_partitions_share_batches_within_cassandras_warning_thresholds():
    """Partitions of under HEAD_SHARED_PARTITION_ROWS rows go whole, several a batch, at most
    HEAD_BATCH_DATA_BYTES of Cassandra's data size (the hash and HEAD_ROW_DATA_BYTES a row) and
    HEAD_BATCH_PARTITIONS partitions a batch, so a default Cassandra warns about none."""
    partitions = [rows_of(shard, HEAD_SHARED_PARTITION_ROWS - 1) for shard in range(HEAD_SHARDS)] * 3
    batches = _head_batches(partitions)
    assert sum(batches, []) == sum(partitions, [])
    whole = HEAD_BATCH_DATA_BYTES // ((HEAD_SHARED_PARTITION_ROWS - 1) * (24 + HEAD_ROW_DATA_BYTES) + 32)
    assert [len(batch) for batch in batches] == [whole * (HEAD_SHARED_PARTITION_ROWS - 1)] * (48 // whole)
    few_rows = [rows_of(shard, 2) for shard in range(HEAD_SHARDS)]
    assert [len(batch) for batch in _head_batches(few_rows)] == [
        2 * HEAD_BATCH_PARTITIONS,
        2 * (16 - HEAD_BATCH_PARTITIONS),
    ]
    long_hashes = rows_of(1, 5) + rows_of(1, 5, hash_length=1024)  # over HEAD_BATCH_DATA_BYTES: alone
    assert _head_batches([rows_of(2, 3), long_hashes, rows_of(3, 3)]) == [long_hashes, rows_of(2, 3) + rows_of(3, 3)]


def test_a_partition_of_enough_rows_goes_alone():
    """A batch of one partition is one mutation: no batch warning, and its own bound."""
    big, enough, small = (
        rows_of(0, 2 * ROWS_PER_PARTITION_BATCH + 7),
        rows_of(1, HEAD_SHARED_PARTITION_ROWS),
        rows_of(2, HEAD_SHARED_PARTITION_ROWS - 1),
    )
    batches = _head_batches([small, big, enough, small])
    assert [len(batch) for batch in batches] == [ROWS_PER_PARTITION_BATCH] * 2 + [7, len(enough), 2 * len(small)]
    assert batches[2:] == [big[-7:], enough, small + small]


def test_series_spread_over_every_shard():
    counts = np.bincount([head_shard(f"series-{i}") for i in range(16_000)], minlength=HEAD_SHARDS)
    assert len(counts) == HEAD_SHARDS and counts.min() > 800 and counts.max() < 1200


@pytest_twisted.ensureDeferred
async def test_the_routing_key_of_a_head_partition_is_the_drivers(cassandra_store, tenant):
    """write_raw finds a partition's replicas by this key's token: it must be the key the
    driver (and Cassandra) hash for the INSERT's partition."""
    bound = cassandra_store._statements["head"].bind((tenant, 1_700_000_040_000, 13, "h" * 24, 1, 1.0, 60))
    assert head_routing_key(tenant, 1_700_000_040_000, 13) == bound.routing_key
    token_map = cassandra_store.cluster.metadata.token_map
    replicas = cassandra_store._head_replicas(token_map, tenant, 1_700_000_040_000, 13)
    assert replicas == frozenset(cassandra_store.cluster.metadata.all_hosts())  # one node here


@pytest_twisted.ensureDeferred
async def test_a_write_over_every_shard_and_several_slices_in_multi_partition_batches_reads_back_exactly(
    cassandra_store, tenant
):
    """200 series x 8 minutes: 128 partitions of about 12 rows, in batches of several partitions
    each as big as the bound lets them be, which Cassandra must accept (batch_size_fail_threshold)
    and store exactly."""
    keys = [series(tenant, "wide", {"i": str(i)}) for i in range(200)]
    slot = past_slot()
    timestamps = [slot + 20 * MINUTE + m * MINUTE for m in range(8)]
    hashes = [k.series_set_hash for k in keys for _ in timestamps]
    points = np.array([ts for _ in keys for ts in timestamps])
    values = np.array([i + ts / 1e9 for i in range(len(keys)) for ts in timestamps])
    await cassandra_store.write_raw(RawColumns(tenant, hashes, points, values))
    found = await head_points(cassandra_store, tenant, keys, slot, slot + HOUR - 1)
    assert found == [[(ts, i + ts / 1e9) for ts in timestamps] for i in range(len(keys))]


@pytest_twisted.ensureDeferred
async def test_batches_of_ten_small_partitions_draw_no_batch_size_warning(cassandra_store, tenant):
    """10 partitions of 5-6 rows (53 rows) counted without the partitions' own bytes made one
    batch Cassandra sized at 5219, over its 5120 warning threshold ("Batch for [tsdb.data_head]
    is of size ..."): counted with them, the rows go in two batches and Cassandra warns of none."""
    keys, shards = [], set()
    for i in range(1000):
        key = series(tenant, "small_partitions", {"i": str(i)})
        if head_shard(key.series_set_hash) not in shards:
            shards.add(head_shard(key.series_set_hash))
            keys.append(key)
        if len(keys) == 10:
            break
    start = past_slot() + 20 * MINUTE
    rows = [(key.series_set_hash, start + n * 1000, float(n)) for i, key in enumerate(keys) for n in range(5 + (i < 3))]
    hashes, timestamps, values = map(list, zip(*rows))
    warnings = BATCH_WARNINGS._value.get()
    await cassandra_store.write_raw(RawColumns(tenant, hashes, np.array(timestamps), np.array(values)))
    await cassandra_store.ping()  # the warnings of the write, logged by the driver's threads, have come
    time.sleep(0.5)
    assert BATCH_WARNINGS._value.get() == warnings
    found = await head_points(cassandra_store, tenant, keys, start, start + MINUTE - 1)
    assert found == [[(start + n * 1000, float(n)) for n in range(5 + (i < 3))] for i in range(10)]


@pytest_twisted.ensureDeferred
async def test_a_partition_written_over_several_batches_reads_back_whole(cassandra_store, tenant):
    """2.5 batches of rows of one series in one slice (one data_head partition), in one write."""
    key = series(tenant, "dense", {})
    slot = past_slot()
    count = 2 * ROWS_PER_PARTITION_BATCH + ROWS_PER_PARTITION_BATCH // 2
    timestamps = [slot + 10 * MINUTE + i * 20 for i in range(count)]  # 20 ms apart: all in one minute
    await cassandra_store.write_raw([RawPoint(tenant, key.series_set_hash, ts, float(ts)) for ts in timestamps])
    (found,) = await head_points(cassandra_store, tenant, [key], slot, slot + HOUR - 1)
    assert found == [(ts, float(ts)) for ts in timestamps]


@pytest_twisted.ensureDeferred
async def test_one_write_of_two_tenants_and_a_timestamp_twice_keeps_each_tenant_and_the_last_value(
    cassandra_store, tenant
):
    """Points (any order, two tenants) and ingest's columns both group by partition; a (series,
    ts) written twice in one write keeps its last value, even where the first was greater (one
    batch holding a row twice would keep the greater)."""
    other = tenant + "_other"
    key, other_key = series(tenant, "twice", {}), series(other, "twice", {})
    slot = past_slot()
    ts = slot + 5 * MINUTE
    await cassandra_store.write_raw(
        [
            RawPoint(tenant, key.series_set_hash, ts, 9.0),
            RawPoint(other, other_key.series_set_hash, ts + 2 * MINUTE, 7.0),
            RawPoint(tenant, key.series_set_hash, ts + MINUTE, 3.0),
            RawPoint(tenant, key.series_set_hash, ts, 1.0),
        ]
    )
    assert await head_points(cassandra_store, tenant, [key], slot, slot + HOUR - 1) == [[(ts, 1.0), (ts + MINUTE, 3.0)]]
    columns = RawColumns(tenant, [key.series_set_hash] * 3, np.array([ts, ts + 30, ts]), np.array([5.0, 6.0, 4.0]))
    await cassandra_store.write_raw(columns)
    assert await head_points(cassandra_store, tenant, [key], slot, slot + HOUR - 1) == [
        [(ts, 4.0), (ts + 30, 6.0), (ts + MINUTE, 3.0)]
    ]
    assert await head_points(cassandra_store, other, [other_key], slot, slot + HOUR - 1) == [[(ts + 2 * MINUTE, 7.0)]]


@pytest_twisted.ensureDeferred
async def test_a_slot_spanning_every_slice_reads_exactly_any_range_before_and_after_sealing(cassandra_store, tenant):
    keys = [series(tenant, "spread", {"i": str(i)}) for i in range(40)]  # several series in most shards
    await cassandra_store.write_series(keys)
    slot = past_slot()
    timestamps = range(slot, slot + HOUR, 10_000)
    await cassandra_store.write_raw(
        [RawPoint(tenant, k.series_set_hash, ts, i + ts / 1e6) for i, k in enumerate(keys) for ts in timestamps]
    )
    ranges = [(slot, slot + HOUR - 1), (slot + 90_500, slot + 30 * MINUTE + 1), (slot - HOUR, slot + 59_999)]

    def expected(i: int, start: int, end: int) -> list[tuple[int, float]]:
        return [(ts, i + ts / 1e6) for ts in timestamps if start <= ts <= end]

    for start, end in ranges:
        found = await head_points(cassandra_store, tenant, keys, start, end)
        assert found == [expected(i, start, end) for i in range(len(keys))]
    await downsampler(cassandra_store).roll_up_series_slots(tenant, [k.series_set_hash for k in keys], slot)
    for raw, i in zip(await cassandra_store.read_raw(tenant, [k.series_set_hash for k in keys], slot, slot), range(40)):
        (block,) = raw.blocks
        assert list(zip(*(part.tolist() for part in decode_block(block)))) == expected(i, slot, slot + HOUR - 1)
    for start, end in ranges:
        found = await cassandra_store.read_raw(tenant, [k.series_set_hash for k in keys], start, end)
        stitched = [stitch_raw(raw, start, end).points() for raw in found]
        assert stitched == [expected(i, start, end) for i in range(len(keys))]


@pytest_twisted.ensureDeferred
async def test_a_shards_slots_with_the_same_series_are_read_together_in_few_requests(cassandra_store, tenant):
    """A last-hour dashboard of 500 series: about 31 a shard over 66 slices of two slots. Each
    (series, slice) is read once, by requests of at most READ_SERIES_PER_REQUEST series and
    HEAD_SERIES_SLICES_PER_REQUEST series-slices: 4 a shard, where one a slot and 10 slices took 8."""
    slot = past_slot()
    start, end = slot + 25 * MINUTE, slot + HOUR + 30 * MINUTE
    hashes = [f"h{i}" for i in range(31)]
    other = [f"o{i}" for i in range(70)]  # a shard whose slots hold different series
    unsealed = {(3, slot): hashes, (3, slot + HOUR): hashes, (5, slot): other, (5, slot + HOUR): other[:2]}
    requests = cassandra_store._head_reads(tenant, unsealed, start, end)
    read = [(shard, h, s) for _, (_, slices, shard, chunk, _, _) in requests for h in chunk for s in slices]
    slices = {slot: range(start, slot + HOUR, MINUTE), slot + HOUR: range(slot + HOUR, end + 1, MINUTE)}
    wanted = [(shard, h, s) for (shard, at), some in unsealed.items() for h in some for s in slices[at]]
    assert sorted(read) == sorted(wanted)
    assert all(len(chunk) <= READ_SERIES_PER_REQUEST for _, (_, _, _, chunk, _, _) in requests)
    assert all(len(c) * len(s) <= HEAD_SERIES_SLICES_PER_REQUEST for _, (_, s, _, c, _, _) in requests)
    assert sum(shard == 3 for _, (_, _, shard, _, _, _) in requests) == 4


@pytest_twisted.ensureDeferred
async def test_a_range_over_two_slots_of_different_series_in_a_shard_reads_back_exactly(cassandra_store, tenant):
    keys = [series(tenant, "two-slots", {"i": str(i)}) for i in range(40)]
    await cassandra_store.write_series(keys)
    slot = past_slot()
    first = range(slot + 50 * MINUTE, slot + HOUR, MINUTE)
    second = range(slot + HOUR, slot + HOUR + 10 * MINUTE, MINUTE)
    timestamps = {i: [*first, *second] if i % 3 == 0 else first if i % 3 == 1 else second for i in range(40)}
    await cassandra_store.write_raw(
        [RawPoint(tenant, k.series_set_hash, ts, i + ts / 1e6) for i, k in enumerate(keys) for ts in timestamps[i]]
    )
    start, end = slot + 55 * MINUTE, slot + HOUR + 5 * MINUTE
    found = await head_points(cassandra_store, tenant, keys, start, end)
    assert found == [[(ts, i + ts / 1e6) for ts in timestamps[i] if start <= ts <= end] for i in range(40)]


@pytest_twisted.ensureDeferred
async def test_late_data_into_a_sealed_slot_is_read_and_sealed_again(cassandra_store, tenant):
    key = series(tenant, "late", {})
    await cassandra_store.write_series([key])
    slot = past_slot()
    h = key.series_set_hash
    await cassandra_store.write_raw([RawPoint(tenant, h, slot + m * MINUTE, float(m)) for m in range(10)])
    sealer = downsampler(cassandra_store)
    await sealer.roll_up_series_slots(tenant, [h], slot)
    # another process writes late: a new timestamp and a rewrite of a sealed one (the head wins)
    late_writer = CassandraStore(cassandra_store.options)
    await late_writer.start()
    try:
        await late_writer.write_raw([RawPoint(tenant, h, slot + 30 * MINUTE, 30.0), RawPoint(tenant, h, slot, -1.0)])
    finally:
        await late_writer.close()
    want = [(slot, -1.0)] + [(slot + m * MINUTE, float(m)) for m in range(1, 10)] + [(slot + 30 * MINUTE, 30.0)]
    (reader,) = await sealer.reader.read_raw([key], slot, slot + HOUR - 1)
    assert reader.points() == want
    await sealer.roll_up_series_slots(tenant, [h], slot)
    (raw,) = await cassandra_store.read_raw(tenant, [h], slot, slot + HOUR - 1)
    (block,) = raw.blocks
    assert list(zip(*(part.tolist() for part in decode_block(block)))) == want


@pytest_twisted.ensureDeferred
async def test_a_delete_between_a_seals_read_and_its_write_keeps_every_sample_outside_its_range(
    cassandra_store, tenant
):
    """A seal reads the head, a delete of two of three series runs, then the seal writes its
    blocks: samples of the range may come back (docs/operations.rst: delete again once the round
    is over), none outside it is lost, and the second delete leaves exactly what is outside."""
    keys = [series(tenant, "race", {"i": str(i)}) for i in range(3)]
    hashes = [k.series_set_hash for k in keys]
    slot = past_slot()
    slot_end = slot + HOUR - 1
    timestamps = list(range(slot, slot + HOUR, MINUTE))
    await cassandra_store.write_raw([RawPoint(tenant, h, ts, float(ts)) for h in hashes for ts in timestamps])
    start, end = slot + 10 * MINUTE, slot + 20 * MINUTE - 1
    everything = [(ts, float(ts)) for ts in timestamps]
    outside = [(ts, v) for ts, v in everything if not start <= ts <= end]

    head_read = int(time.time() * 1000)
    read = await cassandra_store.read_raw(tenant, hashes, slot, slot_end)
    await cassandra_store.delete_samples(tenant, hashes[:2], start, end)
    assert await head_points(cassandra_store, tenant, keys, slot, slot_end) == [outside, outside, everything]
    merged = [stitch_raw(raw, slot, slot_end) for raw in read]
    await cassandra_store.write_blocks(
        [
            SealedBlock(tenant, h, slot, encode_block(m.timestamps, m.values), raw.head, head_read)
            for h, raw, m in zip(hashes, read, merged)
        ]
    )
    for raw in await cassandra_store.read_raw(tenant, hashes, slot, slot_end):
        assert set(outside) <= set(stitch_raw(raw, slot, slot_end).points())
    await cassandra_store.delete_samples(tenant, hashes[:2], start, end)
    found = await cassandra_store.read_raw(tenant, hashes, slot, slot_end)
    assert [stitch_raw(raw, slot, slot_end).points() for raw in found] == [outside, outside, everything]
