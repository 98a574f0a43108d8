"""No value can stop the downsampler (issue 20): every float64 and every stored native histogram
is sealed and rolled up on both stores and reads back bit for bit; a series-slot that fails for
another reason is isolated, retried with backoff and watched against --head-retention.

The stores are real (SQLite in a file of the test's own; the shared Cassandra, with the pending
marks in a Redis namespace of the test's own so that no other test's downsampler sees them)."""

import logging
import math
import random
import sqlite3
import struct
import time
import uuid
from fractions import Fraction

import numpy as np
import pytest
import pytest_twisted
from prometheus_client import REGISTRY
from twisted.internet import reactor
from twisted.internet.task import deferLater

from gateway.core.layout import HOUR_MS, Layout, head_shard
from gateway.core.model import Limits, Sample, SeriesKey, now_ms, series_set_hash, series_set_text
from gateway.core.samples import empty
from gateway.downsample.aggregate import exact_sum
from gateway.downsample.failures import RollUpFailed, SlotFailures
from gateway.downsample.histograms import is_counter_reset
from gateway.downsample.partitions import partition_of
from gateway.downsample.pending import PendingMarks, RedisPending, StorePending
from gateway.downsample.processor import Downsampler
from gateway.ingest.metadata_cache import KnownSeries
from gateway.ingest.pipeline import IngestPipeline
from gateway.store.blocks import decode_block, encode_block
from gateway.store.contract import HistogramRow, StoreUnavailable
from gateway.store.histogram_rollup_rows import decode_interval
from gateway.store.read_path import ReadPath
from gateway.store.sqlite import SQLiteStore
from protocols.prometheus import types_pb2
from protocols.prometheus.xor import STALE_NAN_BITS
from tests.downsample.test_downsample import rollups
from tests.gatewayproc import downsample_once, metric_value
from tests.unit import MsClock

PARTITIONS = 64
MAX = np.finfo(np.float64).max
TINY = 5e-324  # the smallest subnormal
EXTREME_BITS = [
    0x7FF0000000000000,  # +Inf
    0xFFF0000000000000,  # -Inf
    0x7FF8000000000000,  # the canonical NaN
    0xFFF8000000000000,  # NaN with the sign bit
    STALE_NAN_BITS,  # Prometheus's stale marker (a signalling NaN)
    0x7FF0000000000001,  # the smallest signalling NaN payload
    0x7FF8DEADBEEF0001,  # a quiet NaN with a payload
    0xFFFFFFFFFFFFFFFF,  # every bit set: a NaN
    0x8000000000000000,  # -0.0
    0x0000000000000000,  # 0.0
    0x0000000000000001,  # 5e-324
    0x8000000000000001,  # -5e-324
    0x000FFFFFFFFFFFFF,  # the largest subnormal
    0x0010000000000000,  # the smallest normal
    0x7FEFFFFFFFFFFFFF,  # MaxFloat64
    0xFFEFFFFFFFFFFFFF,  # -MaxFloat64
]
NEAR_MAX = [1e308, -1e308, 1.7e308, -1.7e308, 9e307, -9e307]
KINDS = {"room_temp": "gauge", "disk_reads": "delta", "jobs_total": "counter", "lat_min": "min", "lat_max": "max"}


def as_float(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def bits_of(values: np.ndarray) -> list[int]:
    return np.ascontiguousarray(values, dtype=np.float64).view(np.uint64).tolist()


def extreme_value(rng: random.Random) -> float:
    """Mostly the edges of float64, some ordinary numbers and some arbitrary bit patterns."""
    pick = rng.random()
    if pick < 0.35:
        return as_float(rng.choice(EXTREME_BITS))
    if pick < 0.7:
        return rng.choice(NEAR_MAX)
    if pick < 0.85:
        return rng.uniform(-1e6, 1e6)
    return as_float(rng.getrandbits(64))


def reference_sum(values: list[float]) -> float:
    """What a roll-up sum must be, computed another way: exactly in fractions, rounded once."""
    if any(math.isnan(v) for v in values) or (math.inf in values and -math.inf in values):
        return math.nan
    if math.inf in values or -math.inf in values:
        return math.inf if math.inf in values else -math.inf
    total = sum(map(Fraction, values), Fraction(0))
    try:
        return float(total)
    except OverflowError:
        return math.inf if total > 0 else -math.inf


def same(a: float | None, b: float | None) -> bool:
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


# -- native histograms -------------------------------------------------------------------------


def random_histogram(rng: random.Random, timestamp_ms: int) -> bytes:
    """One histogram as Prometheus sends it, with extreme counts, sums, thresholds and indexes."""
    message = types_pb2.Histogram(timestamp=timestamp_ms, sum=extreme_value(rng))
    message.reset_hint = rng.choice([0, 1, 2, 3])
    layout = rng.choice(["integer", "float", "custom"])
    buckets = rng.randint(0, 6)
    offset = rng.choice([0, 3, -5, 2**31 - 1 - buckets, -(2**31)])
    if layout == "custom":
        message.schema = -53
        message.custom_values.extend(sorted(rng.uniform(-1e300, 1e300) for _ in range(buckets)))
        offset = 0
    else:
        message.schema = rng.randint(-4, 8)
        message.zero_threshold = rng.choice([0.0, TINY, 1e-128, 1e308, math.inf])
    if buckets:
        message.positive_spans.add(offset=offset, length=buckets)
    if layout == "integer":
        message.count_int = rng.choice([0, 1, 2**63, 2**64 - 1])
        message.zero_count_int = rng.choice([0, 2**64 - 1])
        message.positive_deltas.extend(rng.choice([-(2**63), 2**63 - 1, 1, -1, 0]) for _ in range(buckets))
    else:
        message.count_float = extreme_value(rng)
        message.zero_count_float = extreme_value(rng)
        message.positive_counts.extend(extreme_value(rng) for _ in range(buckets))
    return message.SerializeToString()


def malformed_histogram(rng: random.Random, timestamp_ms: int) -> bytes:
    """A histogram Prometheus refuses, as gateways stored them before they validated them: a NaN
    or negative zero threshold, a schema far out of range, spans that hold more buckets than
    there are counts, a bucket index past int32."""
    message = types_pb2.Histogram(timestamp=timestamp_ms, sum=1.0, count_int=3, schema=0)
    flaw = rng.choice(["nan_threshold", "negative_threshold", "huge_schema", "tiny_schema", "short_counts", "index"])
    if flaw == "nan_threshold":
        message.zero_threshold = math.nan
    elif flaw == "negative_threshold":
        message.zero_threshold = -1.0
    elif flaw == "huge_schema":
        message.schema = 2**31 - 1
    elif flaw == "tiny_schema":
        message.schema = -(2**31)
    message.positive_spans.add(offset=2**31 - 1 if flaw == "index" else 0, length=5 if flaw == "short_counts" else 2)
    message.positive_spans.add(offset=2**31 - 1 if flaw == "index" else 1, length=1)
    message.positive_deltas.extend([1, 1, -1])
    return message.SerializeToString()


# -- fixtures ----------------------------------------------------------------------------------


@pytest_twisted.async_yield_fixture(params=["sqlite", pytest.param("cassandra", marks=pytest.mark.slow)])
async def store_and_pending(request, tmp_path):
    """(store, pending tracker) of the test's own: SQLite with its pending table, or the shared
    Cassandra with the marks in a Redis namespace of the test's own. That tracker's fallback
    table (read by every round) is a private SQLite file's, so a round never takes the marks
    other tests leave in the shared keyspace's table, nor they the marks of this one."""
    private = SQLiteStore(tmp_path / "extremes.db", request.getfixturevalue("store_layout"))
    await private.start()
    if request.param == "sqlite":
        yield private, StorePending(private, private.slot_width_ms, 0)
    else:
        from gateway.store.cassandra import CassandraStore

        store = CassandraStore.from_url(request.getfixturevalue("cassandra_url"), private.layout)
        await store.start()
        fallback = StorePending(private, private.slot_width_ms, 0)
        pending = RedisPending(request.getfixturevalue("redis_server").url, fallback, store.slot_width_ms, 0)
        pending.use_namespace(f"tsgate|extremes-{uuid.uuid4().hex}|")
        yield store, pending
        pending.client.close()
        await store.close()
    await private.close()


def pipeline_of(store, pending) -> IngestPipeline:
    return IngestPipeline(store, Limits(), KnownSeries(10_000), 1_000_000, pending=PendingMarks(pending, PARTITIONS))


def partitions_of(tenant_hashes) -> list[int]:
    """Only the partitions of these series: a round on the shared Cassandra leaves other tests' work alone."""
    return sorted({partition_of(tenant, hash_, PARTITIONS) for tenant, hash_ in tenant_hashes})


def key_of(tenant: str, name: str, tags: dict[str, str]) -> SeriesKey:
    return SeriesKey(tenant, series_set_hash(series_set_text(name, tags)), name, tags)


def past_slot(hours_ago: int = 2) -> int:
    return (now_ms() // HOUR_MS - hours_ago) * HOUR_MS


async def assert_sealed(store, tenant: str, written: dict[str, dict[int, float]], slot: int) -> None:
    """Each series' slot is one block holding exactly the samples written, bit for bit (the head
    rows may still be read beside it on Cassandra, where they are left to their TTL)."""
    found = await store.read_raw(tenant, list(written), slot, slot + store.slot_width_ms - 1)
    for (hash_, expected), raw in zip(written.items(), found):
        assert len(raw.blocks) == 1, hash_
        timestamps, values = decode_block(raw.blocks[0])
        assert timestamps.tolist() == list(expected)
        assert bits_of(values) == bits_of(np.array(list(expected.values()), dtype=np.float64)), hash_


async def settled() -> None:
    """Even with no delay, Redis holds a slot as ingesting for 1 ms after its last mark (its
    minimum expiry): a round started sooner leaves the slot for the next one."""
    await deferLater(reactor, 0.01, lambda: None)


def failures(stage: str, reason: str) -> float:
    labels = {"stage": stage, "reason": reason}
    return REGISTRY.get_sample_value("tsgate_downsample_slot_failures_total", labels) or 0.0


def gauge(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


# -- the property test -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(1, 7))
@pytest_twisted.ensureDeferred
async def test_random_extreme_floats_and_histograms_are_all_sealed_and_read_back_bit_exact(
    store_and_pending, tenant, seed
):
    store, pending = store_and_pending
    rng = random.Random(seed)
    slot = past_slot()
    pipeline = pipeline_of(store, pending)
    written: dict[tuple[str, int], dict[int, float]] = {}
    batch = []
    for name in KINDS:
        for copy in range(2):
            offsets = sorted(rng.sample(range(store.slot_width_ms), rng.randint(1, 150)))
            values = {slot + offset: extreme_value(rng) for offset in offsets}
            written[name, copy] = values
            batch += [Sample(tenant, name, {"copy": str(copy)}, ts, value) for ts, value in values.items()]
    assert (await pipeline.ingest("test", batch)).accepted == len(batch)

    keys, _ = await pipeline.register_series("test", [(tenant, "latency", {"flavour": f}) for f in ("ok", "bad")])
    histograms = {
        key.series_set_hash: [
            HistogramRow(tenant, key.series_set_hash, ts, make(rng, ts))
            for ts in sorted(rng.sample(range(slot, slot + store.slot_width_ms), 40))
        ]
        for key, make in zip(keys, (random_histogram, malformed_histogram))
    }
    # stored as they come, as before write validation: the downsampler must cope with whatever is there
    await store.write_histograms([row for rows in histograms.values() for row in rows])
    await PendingMarks(pending, PARTITIONS).mark([(tenant, hash_, slot) for hash_ in histograms], now_ms())

    by_name = {(name, copy): key_of(tenant, name, {"copy": str(copy)}) for name, copy in written}
    members = [(tenant, key.series_set_hash) for key in by_name.values()] + [(tenant, h) for h in histograms]

    downsampler = Downsampler(store, pending, store.layout, ("reads",))
    await settled()
    failed_before = gauge("tsgate_downsample_errors_total")
    assert await downsampler.run_once(partitions_of(members)) == len(members)
    assert downsampler.round_failed == 0 and gauge("tsgate_downsample_errors_total") == failed_before
    assert sum([await pending.waiting(p) for p in partitions_of(members)]) == 0

    reader = ReadPath(store)
    end = slot + store.slot_width_ms - 1
    await assert_sealed(store, tenant, {key.series_set_hash: written[n] for n, key in by_name.items()}, slot)
    read = await reader.read_raw(list(by_name.values()), slot, end)
    for (name, copy), samples in zip(by_name, read):
        expected = written[name, copy]
        assert samples.timestamps.tolist() == list(expected)
        assert bits_of(samples.values) == bits_of(np.array(list(expected.values()))), (name, copy)

    finest = store.layout.granularities[0]
    for (name, copy), key in by_name.items():
        rows = await store.read_rollups(finest, tenant, key.series_set_hash, slot, end)
        numbers = [(ts, v) for ts, v in written[name, copy].items() if not math.isnan(v)]
        buckets: dict[int, list[float]] = {}
        for ts, value in numbers:
            buckets.setdefault(ts - ts % finest.width_ms, []).append(value)
        assert [row.timestamp_ms for row in rows] == sorted(buckets), name
        for row in rows:
            values = buckets[row.timestamp_ms]
            if KINDS[name] in ("gauge", "delta"):
                assert same(row.sum, reference_sum(values)) and row.count == len(values), (name, values, row)
            if KINDS[name] in ("gauge", "min"):
                assert row.min == min(values)
            if KINDS[name] in ("gauge", "max"):
                assert row.max == max(values)
            if KINDS[name] == "counter":
                assert bits_of(np.array([row.last])) == bits_of(np.array([values[-1]]))
        (hourly,) = await store.read_rollups(store.layout.granularity("1h"), tenant, key.series_set_hash, slot, end)
        values = [v for _, v in numbers]
        if KINDS[name] in ("gauge", "delta"):
            assert same(hourly.sum, reference_sum(values)) and hourly.count == len(values), name
        if KINDS[name] == "counter":
            increases = [0.0] + [b - a if b >= a else b for a, b in zip(values, values[1:])]
            assert same(hourly.increase, reference_sum(increases)), (name, values)

    raw = await reader.read_histograms(tenant, list(histograms), slot, end)
    for hash_, rows in zip(histograms, raw):
        assert [(r.timestamp_ms, r.data) for r in rows] == [(r.timestamp_ms, r.data) for r in histograms[hash_]]
        live = [r for r in histograms[hash_] if struct.pack("<d", types_pb2.Histogram.FromString(r.data).sum) != STALE]
        for granularity in store.layout.granularities:
            (kept_rows,) = await store.read_histogram_rollups(granularity, tenant, [hash_], slot, end)
            kept = [h for row in kept_rows for h in decode_interval(row)]
            if live:
                assert without_hint(kept[-1].data) == without_hint(live[-1].data), granularity.name


STALE = struct.pack("<Q", STALE_NAN_BITS)


def without_hint(data: bytes) -> bytes:
    message = types_pb2.Histogram.FromString(data)
    message.reset_hint = 0
    message.timestamp = 0
    return message.SerializeToString()


# -- regression and isolation ------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_series_near_max_float_no_longer_stops_every_tenants_round(store_and_pending, tenant):
    """Issue 20: math.fsum raised OverflowError on 1e308 + 1e308, the round failed every time and
    every tenant's unsealed slots waited for their head rows to expire."""
    store, pending = store_and_pending
    other = f"{tenant}-good"
    slot = past_slot()
    bad = {slot + i * 60_000: value for i, value in enumerate([1e308, 1e308, -1e308, MAX, MAX, 1.0])}
    good = {slot + i * 60_000: float(i) for i in range(10)}
    batch = [Sample(tenant, "broken_exporter", {}, ts, v) for ts, v in bad.items()]
    batch += [Sample(other, "room_temp", {"room": str(r)}, ts, v) for r in range(3) for ts, v in good.items()]
    assert (await pipeline_of(store, pending).ingest("test", batch)).accepted == len(batch)
    keys = [key_of(tenant, "broken_exporter", {})] + [key_of(other, "room_temp", {"room": str(r)}) for r in range(3)]
    partitions = partitions_of([(key.tenant, key.series_set_hash) for key in keys])

    downsampler = Downsampler(store, pending, store.layout, ())
    await settled()
    assert await downsampler.run_once(partitions) == 4 and downsampler.round_failed == 0
    assert sum([await pending.waiting(p) for p in partitions]) == 0
    await assert_sealed(store, tenant, {keys[0].series_set_hash: bad}, slot)
    await assert_sealed(store, other, {key.series_set_hash: good for key in keys[1:]}, slot)
    (hourly,) = await store.read_rollups(store.layout.granularity("1h"), tenant, keys[0].series_set_hash, slot, slot)
    assert (hourly.min, hourly.max, hourly.sum, hourly.count) == (-1e308, MAX, math.inf, 6)


def test_sums_past_float64_are_infinite_and_exact_where_they_fit():
    assert exact_sum(np.array([1e308, 1e308, -1e308])) == 1e308  # fsum's partials overflow here
    assert exact_sum(np.array([MAX, MAX])) == math.inf
    assert exact_sum(np.array([-MAX, -1e300])) == -math.inf
    assert exact_sum(np.array([MAX, 1e291])) == MAX  # rounds back down to MaxFloat64
    assert exact_sum(np.array([1e308, 1e308, -1e308, -1e308, 1.5])) == 1.5
    assert exact_sum(np.array([TINY, TINY, -TINY])) == TINY
    assert exact_sum(np.array([math.inf, 1e308, 1e308])) == math.inf
    assert math.isnan(exact_sum(np.array([math.inf, -math.inf, 1.0])))
    assert math.isnan(exact_sum(np.array([as_float(0x7FF8DEADBEEF0001), 1.0])))


def test_histograms_prometheus_refuses_count_as_resets_instead_of_hanging_the_downsampler():
    """Comparing a histogram with a NaN zero threshold looped for ever (in a thread of the
    downsampler); a huge schema builds a 2^(2^31)-bit bound; spans past the counts raise."""
    fine = types_pb2.Histogram(count_int=3, sum=1.0, schema=0)
    flawed = [
        types_pb2.Histogram(count_int=3, sum=1.0, schema=0, zero_threshold=math.nan),
        types_pb2.Histogram(count_int=3, sum=1.0, schema=2**31 - 1),
        types_pb2.Histogram(count_int=3, sum=1.0, schema=0, positive_spans=[types_pb2.BucketSpan(offset=0, length=4)]),
    ]
    for histogram in flawed:
        assert is_counter_reset(fine, histogram) and is_counter_reset(histogram, fine)
    assert not is_counter_reset(fine, fine)


async def corrupt_block(store, key: SeriesKey, slot: int) -> None:
    """Bytes in the slot's block that are no block (as a block of a future format would be):
    sealing the slot fails until it is replaced."""
    await store.write_block(key.tenant, key.series_set_hash, slot, b"not a block", empty(), now_ms())


@pytest.mark.parametrize(
    "with_redis", [pytest.param(False, id="store-table"), pytest.param(True, id="redis", marks=pytest.mark.slow)]
)
@pytest_twisted.ensureDeferred
async def test_a_failing_series_slot_is_isolated_retried_with_backoff_and_watched_for_expiry(
    sqlite_store, request, tenant, with_redis, caplog
):
    """One series-slot whose seal fails (a corrupt block) and one whose roll-up fails (a corrupt
    histogram beside its samples, whose block is written all the same) beside good series of
    another tenant in the same slot: the good ones are done in
    the first round, the bad ones counted, logged, left pending and retried only after their
    backoff; the unsealed one raises the near-expiry gauge and an error line once less than
    half of --head-retention is left, and is sealed once it can be."""
    pending = StorePending(sqlite_store, sqlite_store.slot_width_ms, 0)
    if with_redis:
        pending = RedisPending(request.getfixturevalue("redis_server").url, pending, sqlite_store.slot_width_ms, 0)
        pending.use_namespace(f"tsgate|unit-{uuid.uuid4().hex}|")
    other = f"{tenant}-good"
    slot = past_slot()
    pipeline = pipeline_of(sqlite_store, pending)
    batch = [Sample(tenant, "unsealable", {}, slot + 60_000, 1.0), Sample(tenant, "latency", {}, slot + 60_000, 2.0)]
    batch += [Sample(other, "room_temp", {"room": str(r)}, slot + 60_000, float(r)) for r in range(4)]
    assert (await pipeline.ingest("test", batch)).accepted == len(batch)
    unsealable, good = (
        key_of(tenant, "unsealable", {}),
        [key_of(other, "room_temp", {"room": str(r)}) for r in range(4)],
    )
    await corrupt_block(sqlite_store, unsealable, slot)
    histogram_key = key_of(tenant, "latency", {})  # its samples' roll-up works, its histograms' fails
    await sqlite_store.write_histograms([HistogramRow(tenant, histogram_key.series_set_hash, slot + 1, b"\xff\xff")])
    partitions = list(range(PARTITIONS))

    clock = MsClock(now_ms())
    await settled()
    downsampler = Downsampler(sqlite_store, pending, sqlite_store.layout, (), clock=clock)
    seal_failures, rollup_failures = failures("seal", "BadBlock"), failures("rollup", "DecodeError")
    caplog.set_level(logging.WARNING, logger="gateway.downsample")
    assert await downsampler.run_once(partitions) == 4 and downsampler.round_failed == 2
    assert (failures("seal", "BadBlock"), failures("rollup", "DecodeError")) == (seal_failures + 1, rollup_failures + 1)
    logged = caplog.text
    assert f"seal of tenant {tenant} series {unsealable.series_set_hash} slot" in logged and "BadBlock" in logged
    assert f"roll-up (raw block written) of tenant {tenant} series {histogram_key.series_set_hash}" in logged
    await assert_sealed(
        sqlite_store, other, {key.series_set_hash: {slot + 60_000: float(r)} for r, key in enumerate(good)}, slot
    )
    await assert_sealed(sqlite_store, tenant, {histogram_key.series_set_hash: {slot + 60_000: 2.0}}, slot)
    assert sum([await pending.waiting(p) for p in partitions]) == 2
    assert gauge("tsgate_downsample_slots_near_expiry") == 0

    assert await downsampler.run_once(partitions) == 0 and downsampler.round_failed == 0  # backoff: not tried
    assert failures("seal", "BadBlock") == seal_failures + 1
    assert sum([await pending.waiting(p) for p in partitions]) == 2
    clock.now += 31_000
    assert await downsampler.run_once(partitions) == 0 and downsampler.round_failed == 2  # retried
    assert (failures("seal", "BadBlock"), failures("rollup", "DecodeError")) == (seal_failures + 2, rollup_failures + 2)

    # the slot ended an hour ago and head rows live 6 h past its end: at 2.5 h from now only 2.5 h remain
    caplog.clear()
    clock.now += int(2.5 * HOUR_MS)
    assert await downsampler.run_once(partitions) == 0
    assert gauge("tsgate_downsample_slots_near_expiry") == 1  # only the unsealed one: the other's block is written
    assert f"tenant {tenant} series {unsealable.series_set_hash} slot" in caplog.text
    assert "still unsealed" in caplog.text and "--head-retention" in caplog.text

    await sqlite_store.write_block(tenant, unsealable.series_set_hash, slot, encode_block(*empty()), empty(), now_ms())
    clock.now += 15 * 60_000
    assert await downsampler.run_once(partitions) == 1
    await assert_sealed(sqlite_store, tenant, {unsealable.series_set_hash: {slot + 60_000: 1.0}}, slot)
    assert gauge("tsgate_downsample_slots_near_expiry") == 0
    assert sum([await pending.waiting(p) for p in partitions]) == 1  # the corrupt histogram's, still retried


# -- end to end --------------------------------------------------------------------------------

EDGE_VALUES = [1e308, 1e308, -1e308, "+Inf", MAX, 5e-324, -0.0]


def write_bad_and_good(gateway, tenant: str) -> int:
    """A series of edge values in one tenant and ordinary ones in another, in the slot 3 h ago; its start (s)."""
    t0 = (int(time.time() * 1000) // HOUR_MS - 3) * HOUR_MS // 1000
    bad = [{"metricName": "broken_exporter", "ts": t0 + i * 60, "value": v} for i, v in enumerate(EDGE_VALUES)]
    good = [{"metricName": "room_temp", "ts": t0 + i * 60, "value": float(i)} for i in range(10)]
    assert gateway.post("/api/write", bad, headers={"X-Tenant": tenant}).status == 200
    assert gateway.post("/api/write", good, headers={"X-Tenant": f"{tenant}-good"}).status == 200
    return t0


def assert_edge_values_read_back(gateway, tenant: str, t0: int) -> None:
    window = (t0, t0 + 3599)
    raw = rollups(gateway, tenant, "broken_exporter", "raw", "raw", *window)
    assert raw == [EDGE_VALUES]
    assert rollups(gateway, tenant, "broken_exporter", "1h", "sum", *window) == [["+Inf"]]
    assert rollups(gateway, tenant, "broken_exporter", "1h", "min", *window) == [[-1e308]]
    assert rollups(gateway, tenant, "broken_exporter", "5m", "max", *window) == [["+Inf", 5e-324]]
    assert rollups(gateway, f"{tenant}-good", "room_temp", "1h", "count", *window) == [[10.0]]


def test_edge_values_through_downsample_once(start_gateway, backend_args, tmp_path, tenant):
    store_args = backend_args or ("--data-dir", str(tmp_path / "data"))
    gateway = start_gateway(*store_args, "--roles", "ingest,query", "--downsample-delay", "0s")
    t0 = write_bad_and_good(gateway, tenant)
    # every partition pinned: no lock, which a downsampler of another test on the shared servers may hold
    output = downsample_once(*store_args, "--downsample-partitions", "0-63")  # exits 0: nothing failed
    assert "rolled up" in output and "failed" not in output
    assert_edge_values_read_back(gateway, tenant, t0)


def test_edge_values_through_the_downsample_role_and_its_metrics(start_gateway, tenant):
    gateway = start_gateway("--downsample-delay", "0s", "--downsample-interval", "1s")
    t0 = write_bad_and_good(gateway, tenant)
    deadline = time.monotonic() + 60
    while metric_value(gateway, "tsgate_downsampled_series_slots_total") < 2:
        assert time.monotonic() < deadline, gateway.get("/metrics").body.decode()
        time.sleep(0.5)
    exposition = gateway.get("/metrics").body.decode()
    assert metric_value(gateway, "tsgate_downsample_errors_total") == 0
    assert "tsgate_downsample_slot_failures_total{" not in exposition
    assert metric_value(gateway, "tsgate_downsample_slots_near_expiry") == 0
    assert_edge_values_read_back(gateway, tenant, t0)


def test_near_expiry_counts_unsealed_failures_from_half_the_head_retention_until_expiry():
    layout = Layout()
    slot, end = 0, layout.slot_width_ms
    failures = SlotFailures(layout)
    failures.failed("t", "unsealed", slot, ValueError("seal failed"), end)
    try:
        raise KeyError("roll-up failed")
    except KeyError as error:
        failures.failed("t", "sealed", slot, RollUpFailed(str(error)), end)
    half = layout.head_retention_ms // 2
    assert [failures.near_expiry(end + at) for at in (half - 1, half, 2 * half - 1, 2 * half)] == [0, 1, 1, 0]
    assert not failures.due("t", "unsealed", slot, end + 29_999) and failures.due("t", "unsealed", slot, end + 30_000)
    failures.failed("t", "unsealed", slot, ValueError("again"), end + 30_000)
    assert not failures.due("t", "unsealed", slot, end + 89_999) and failures.due("t", "unsealed", slot, end + 90_000)
    failures.succeeded("t", "unsealed", slot)
    assert failures.near_expiry(end + half) == 0 and failures.due("t", "unsealed", slot, end)


def test_an_unavailable_store_is_one_log_line_and_an_unexpected_error_has_its_traceback(caplog):
    failures = SlotFailures(Layout())
    with caplog.at_level(logging.WARNING, logger="gateway.downsample.failures"):
        failures.failed("t", "down", 0, StoreUnavailable("2 of 3 replicas down"), 0)
        try:
            raise ValueError("a bug")
        except ValueError as error:
            failures.failed("t", "bug", 0, error, 0)
    down, bug = caplog.records
    assert "StoreUnavailable: 2 of 3 replicas down" in down.getMessage() and down.exc_info is None
    assert "ValueError: a bug" in bug.getMessage() and bug.exc_info is not None


@pytest_twisted.ensureDeferred
async def test_a_failed_roll_up_write_is_counted_by_the_stores_error_and_the_block_is_written(
    sqlite_store, tmp_path, tenant
):
    """A database that refuses the 5-minute roll-up rows (a trigger stands for a damaged table):
    the failure is labelled with the store's own error, not the FirstError of the writes
    gathered, and the slot's block is written before it."""
    pending = StorePending(sqlite_store, sqlite_store.slot_width_ms, 0)
    slot = past_slot()
    assert (await pipeline_of(sqlite_store, pending).ingest("test", [Sample(tenant, "cpu", {}, slot, 0.5)])).accepted
    table = sqlite_store.layout.granularities[0].table
    with sqlite3.connect(tmp_path / "unit.db") as database:
        database.execute(f"CREATE TRIGGER refused BEFORE INSERT ON {table} BEGIN SELECT RAISE(ABORT, 'refused'); END")
    before = failures("rollup", "IntegrityError")
    downsampler = Downsampler(sqlite_store, pending, sqlite_store.layout, ())
    assert await downsampler.run_once(list(range(PARTITIONS))) == 0 and downsampler.round_failed == 1
    assert failures("rollup", "IntegrityError") == before + 1
    await assert_sealed(sqlite_store, tenant, {key_of(tenant, "cpu", {}).series_set_hash: {slot: 0.5}}, slot)


@pytest_twisted.ensureDeferred
async def test_a_bad_series_slot_in_a_sealing_group_fails_alone(sqlite_store, tenant):
    """Series of one tenant and head shard are sealed as one group; one corrupt block among them
    fails the group, which is redone series by series: the others are sealed, the bad one is
    counted once and stays pending."""
    pending = StorePending(sqlite_store, sqlite_store.slot_width_ms, 0)
    slot = past_slot()
    names = [f"grouped_{i}" for i in range(200)]
    shard = head_shard(key_of(tenant, names[0], {}).series_set_hash)
    same_shard = [n for n in names if head_shard(key_of(tenant, n, {}).series_set_hash) == shard][:5]
    assert len(same_shard) == 5
    batch = [Sample(tenant, name, {}, slot + 60_000, float(i)) for i, name in enumerate(same_shard)]
    assert (await pipeline_of(sqlite_store, pending).ingest("test", batch)).accepted == 5
    keys = [key_of(tenant, name, {}) for name in same_shard]
    await corrupt_block(sqlite_store, keys[2], slot)
    await settled()
    before = failures("seal", "BadBlock")
    downsampler = Downsampler(sqlite_store, pending, sqlite_store.layout, ())
    assert await downsampler.run_once(list(range(PARTITIONS))) == 4 and downsampler.round_failed == 1
    assert failures("seal", "BadBlock") == before + 1
    good = {k.series_set_hash: {slot + 60_000: float(i)} for i, k in enumerate(keys) if i != 2}
    await assert_sealed(sqlite_store, tenant, good, slot)
    assert sum([await pending.waiting(p) for p in range(PARTITIONS)]) == 1
