"""No value can stop the downsampler (issue 20): every float64 and every stored native histogram
is sealed and rolled up on both stores and reads back bit for bit; a series-slot that fails for
another reason is isolated, retried with backoff and watched against --head-retention.

The stores are real (SQLite in a file of the test's own; the shared Cassandra, with the pending
marks in a Redis namespace of the test's own so that no other test's downsampler sees them)."""

import math
import random
import struct
import uuid
from fractions import Fraction

import numpy as np
import pytest
import pytest_twisted
from prometheus_client import REGISTRY

from gateway.downsample.partitions import partition_of
from gateway.downsample.pending import PendingMarks, RedisPending, StorePending
from gateway.downsample.processor import Downsampler
from gateway.ingest import IngestPipeline
from gateway.metadata_cache import KnownSeries
from gateway.model import Limits, Sample, SeriesKey, now_ms, series_set_hash, series_set_text
from gateway.read_path import ReadPath
from gateway.store.blocks import decode_block
from gateway.store.contract import HistogramRow
from gateway.store.histogram_rollup_rows import decode_interval
from gateway.store.layout import HOUR_MS
from gateway.store.sqlite import SQLiteStore
from protocols.prometheus import types_pb2
from protocols.prometheus.xor import STALE_NAN_BITS

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


@pytest_twisted.async_yield_fixture(params=["sqlite", "cassandra"])
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


def failures(stage: str, reason: str) -> float:
    labels = {"stage": stage, "reason": reason}
    return REGISTRY.get_sample_value("tsgate_downsample_slot_failures_total", labels) or 0.0


def gauge(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


# -- the property test -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest_twisted.ensureDeferred
async def test_random_extreme_floats_and_histograms_are_all_sealed_and_read_back_bit_exact(
    store_and_pending, tenant, seed
):
    store, pending = store_and_pending
    rng = random.Random(seed)
    slot = past_slot()
    pipeline = pipeline_of(store, pending)
    written: dict[tuple[str, dict], dict[int, float]] = {}
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
