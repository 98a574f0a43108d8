"""Two Downsampler replicas sharing one store's pending work, in process: every series-slot is
rolled up by exactly one of them, counted once, with the real trackers (the store's pending table
with partitions split between replicas, as ``--downsample-partitions`` does; Redis locks when
both take every partition)."""

import time
import uuid

import pytest
import pytest_twisted
from twisted.internet.defer import ensureDeferred, gatherResults

from gateway.app.devservices.redis import RedisServer
from gateway.core.layout import HOUR_MS
from gateway.core.model import Limits, Sample, now_ms
from gateway.downsample.partitions import partition_of
from gateway.downsample.pending import PendingMarks, RedisPartitionLock, RedisPending, StorePending
from gateway.downsample.processor import Downsampler
from gateway.ingest.metadata_cache import KnownSeries
from gateway.ingest.pipeline import IngestPipeline
from gateway.query.planner import QueryPlanner

PARTITIONS = 64
SERIES = 40
POINTS = 6


async def write_a_past_slot(store, pending, tenant: str, hours_ago: int = 2) -> int:
    """SERIES series of POINTS points each in the slot ``hours_ago`` hours ago; the slot's start."""
    slot = (now_ms() // HOUR_MS - hours_ago) * HOUR_MS
    pipeline = IngestPipeline(store, Limits(), KnownSeries(1000), 1_000_000, pending=PendingMarks(pending, PARTITIONS))
    batch = [
        Sample(tenant, "shared_load", {"i": str(i)}, min(slot + p * 600_000, now_ms()), float(p))
        for i in range(SERIES)
        for p in range(POINTS)
    ]
    assert (await pipeline.ingest("test", batch)).accepted == SERIES * POINTS
    return slot


async def hourly_counts(store, tenant: str, slot: int) -> list[float]:
    """The 1h roll-up count of every series of the slot."""
    planner = QueryPlanner(store, max_series=SERIES)
    series = await planner.select_series(tenant, "shared_load", {})
    hourly = store.layout.granularity("1h")
    rows = await gatherResults(
        [store.read_rollups(hourly, tenant, s.series_set_hash, slot, slot + HOUR_MS - 1) for s in series]
    )
    return [row.count for found in rows for row in found]


def replica(store, pending) -> Downsampler:
    return Downsampler(store, pending, store.layout, ())


@pytest_twisted.ensureDeferred
async def test_replicas_owning_half_the_partitions_each_roll_up_their_own_series_once(sqlite_store, tenant):
    pending = StorePending(sqlite_store, sqlite_store.slot_width_ms, 0)
    slot = await write_a_past_slot(sqlite_store, pending, tenant)
    halves = [list(range(PARTITIONS // 2)), list(range(PARTITIONS // 2, PARTITIONS))]
    mine = [
        sum(
            partition_of(tenant, key.series_set_hash, PARTITIONS) in half
            for key in await QueryPlanner(sqlite_store, SERIES).select_series(tenant, "shared_load", {})
        )
        for half in halves
    ]
    replicas = [replica(sqlite_store, StorePending(sqlite_store, sqlite_store.slot_width_ms, 0)) for _ in halves]
    rounds = [ensureDeferred(r.run_once(half)) for r, half in zip(replicas, halves)]
    assert await gatherResults(rounds) == mine and sum(mine) == SERIES
    assert await gatherResults([ensureDeferred(r.run_once(half)) for r, half in zip(replicas, halves)]) == [0, 0]
    assert await hourly_counts(sqlite_store, tenant, slot) == [POINTS] * SERIES


@pytest_twisted.ensureDeferred
async def test_replicas_competing_through_redis_locks_roll_up_every_series_exactly_once(
    sqlite_store, redis_server, tenant
):
    namespace = f"tsgate|unit-{uuid.uuid4().hex}|"

    def tracker() -> RedisPending:
        pending = RedisPending(
            redis_server.url, StorePending(sqlite_store, sqlite_store.slot_width_ms, 0), sqlite_store.slot_width_ms, 0
        )
        pending.use_namespace(namespace)
        return pending

    slot = await write_a_past_slot(sqlite_store, tracker(), tenant)
    trackers = [tracker(), tracker()]
    replicas = [replica(sqlite_store, pending) for pending in trackers]
    locks = [RedisPartitionLock(pending, f"replica-{n}", 60_000) for n, pending in enumerate(trackers)]
    everything = list(range(PARTITIONS))
    done = await gatherResults([ensureDeferred(r.run_once(everything, lock)) for r, lock in zip(replicas, locks)])
    assert sum(done) == SERIES
    assert await gatherResults([ensureDeferred(r.run_once(everything, lock)) for r, lock in zip(replicas, locks)]) == [
        0,
        0,
    ]
    assert await hourly_counts(sqlite_store, tenant, slot) == [POINTS] * SERIES
    assert not list(trackers[0].client.scan_iter(match=f"{namespace}*"))


@pytest.mark.parametrize("with_redis", [False, True], ids=["store-table", "redis"])
@pytest_twisted.ensureDeferred
async def test_a_round_counts_what_it_left_pending_and_leaves_it_marked(sqlite_store, redis_server, tenant, with_redis):
    """The current slot has not settled: ``downsample --once`` reports it as left, and its marks
    stay for a later round."""
    pending = StorePending(sqlite_store, sqlite_store.slot_width_ms, 0)
    if with_redis:
        pending = RedisPending(redis_server.url, pending, sqlite_store.slot_width_ms, 0)
        pending.use_namespace(f"tsgate|unit-{uuid.uuid4().hex}|")
    await write_a_past_slot(sqlite_store, pending, tenant)
    await write_a_past_slot(sqlite_store, pending, tenant, hours_ago=0)
    downsampler = replica(sqlite_store, pending)
    everything = list(range(PARTITIONS))
    assert await downsampler.run_once(everything) == SERIES
    assert sum([await pending.waiting(p) for p in everything]) == SERIES
    assert await downsampler.run_once(everything) == 0
    assert sum([await pending.waiting(p) for p in everything]) == SERIES


@pytest_twisted.ensureDeferred
async def test_a_redis_round_reads_its_slots_from_their_index_not_a_scan_of_the_keyspace(
    sqlite_store, tmp_path, tenant
):
    """Rounds list a partition's slots from ``slots|<partition>``: the Redis keyspace also holds
    the known-series caches (millions of keys at scale), which a SCAN a partition a round would
    walk every time. Sets left by a gateway without the index are found by one SCAN a process
    (a Redis of the test's own, so that no other client's SCAN is counted)."""
    namespace = f"tsgate|unit-{uuid.uuid4().hex}|"
    own_redis = RedisServer(tmp_path / "redis")
    own_redis.start()

    def tracker() -> RedisPending:
        pending = RedisPending(
            own_redis.url, StorePending(sqlite_store, sqlite_store.slot_width_ms, 0), sqlite_store.slot_width_ms, 0
        )
        pending.use_namespace(namespace)
        return pending

    def scans(client) -> int:
        return client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0)

    try:
        writer = tracker()
        await write_a_past_slot(sqlite_store, writer, tenant)
        for key in writer.client.scan_iter(match=f"{namespace}slots|*"):  # as a gateway without the index left it
            writer.client.delete(key)
        downsampler = replica(sqlite_store, tracker())
        everything = list(range(PARTITIONS))
        time.sleep(0.01)  # at delay 0 a past slot's ingesting mark lives 1 ms: it has gone
        before = scans(writer.client)
        assert await downsampler.run_once(everything) == SERIES  # its one SCAN found the unlisted sets
        after_first = scans(writer.client)
        assert 0 < after_first - before <= 4  # two prefixes, a call each in this small keyspace
        await write_a_past_slot(sqlite_store, writer, tenant, hours_ago=3)
        time.sleep(0.01)
        assert await downsampler.run_once(everything) == SERIES
        assert await downsampler.run_once(everything) == 0
        assert scans(writer.client) == after_first
        assert not list(writer.client.scan_iter(match=f"{namespace}*"))
    finally:
        own_redis.stop()
