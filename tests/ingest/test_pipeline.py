"""IngestPipeline on its own, on a real SQLite store with a settable clock: when a write marks its
series-slots pending, how in-flight samples are counted and bounded, and when drain fires."""

import threading
import time

import numpy as np
import pytest
import pytest_twisted
from prometheus_client import REGISTRY
from twisted.internet.defer import ensureDeferred
from twisted.internet.task import LoopingCall

from gateway.core.cooperative import run_steps
from gateway.core.layout import HOUR_MS
from gateway.core.model import (
    ExemplarSample,
    HistogramSample,
    Limits,
    Sample,
    SeriesKey,
    SeriesSamples,
    series_set_hash,
    series_set_text,
    split_labels,
)
from gateway.downsample.pending import PendingMarks, StorePending
from gateway.ingest.limits import RateLimited, TenantLimits
from gateway.ingest.metadata_cache import KnownSeries
from gateway.ingest.pipeline import _SAMPLES, MIN_INFLIGHT_BOUND, IngestPipeline, Overloaded, StoreRate
from protocols import prometheus
from protocols.prometheus.write import V2_CONTENT_TYPE
from tests.unit import MsClock

MINUTE = 60_000
DELAY = 5 * MINUTE
SLOT = 1_000 * HOUR_MS  # a slot boundary; the clock starts 10 minutes into it


def marks() -> float:
    return REGISTRY.get_sample_value("tsgate_downsample_pending_marks_total") or 0.0


def pipeline_on(store, clock, max_inflight: int = 1_000_000, tenant_limits=None) -> IngestPipeline:
    return IngestPipeline(
        store,
        Limits(),
        KnownSeries(1000),
        max_inflight,
        clock=clock,
        pending=PendingMarks(StorePending(store, store.slot_width_ms, DELAY), 64),
        tenant_limits=tenant_limits,
    )


async def last_touch(store, tenant: str, name: str) -> list[tuple[int, int]]:
    """(slot, last touch) of every pending row of the series, over all partitions."""
    hash_ = series_set_hash(series_set_text(name, {}))
    rows = []
    for partition in range(64):
        rows += [
            (r.time_slot, r.last_touch_ms)
            for r in await store.list_pending(partition, 1 << 62)
            if (r.tenant, r.series_set_hash) == (tenant, hash_)
        ]
    return sorted(rows)


@pytest_twisted.ensureDeferred
async def test_a_steady_stream_marks_each_series_slot_once(sqlite_store, tenant):
    """A mark at m holds slot s open until max(end of s, m) + delay/2: writes before that need no
    mark; the first write after it marks again (late data must push the slot's settling back)."""
    clock = MsClock(SLOT + 10 * MINUTE)
    pipeline = pipeline_on(sqlite_store, clock)
    before = marks()
    await pipeline.ingest("test", [Sample(tenant, "steady", {}, SLOT + MINUTE, 1.0)])
    assert await last_touch(sqlite_store, tenant, "steady") == [(SLOT, SLOT + 10 * MINUTE)]
    for minute in range(11, 60):
        clock.now = SLOT + minute * MINUTE
        await pipeline.ingest("test", [Sample(tenant, "steady", {}, clock.now, float(minute))])
    clock.now = SLOT + HOUR_MS + DELAY // 2 - 1  # the mark's last held moment
    await pipeline.ingest("test", [Sample(tenant, "steady", {}, SLOT + 59 * MINUTE + 1, 2.0)])
    assert marks() - before == 1
    assert await last_touch(sqlite_store, tenant, "steady") == [(SLOT, SLOT + 10 * MINUTE)]
    clock.now += 1
    await pipeline.ingest("test", [Sample(tenant, "steady", {}, SLOT + 59 * MINUTE + 2, 3.0)])
    assert marks() - before == 2
    assert await last_touch(sqlite_store, tenant, "steady") == [(SLOT, clock.now)]


@pytest_twisted.ensureDeferred
async def test_a_backfill_of_a_past_slot_marks_once_every_half_delay(sqlite_store, tenant):
    clock = MsClock(SLOT + 10 * MINUTE)
    pipeline = pipeline_on(sqlite_store, clock)
    past = SLOT - 3 * HOUR_MS
    before = marks()
    for step in range(12):  # a write every 30 s: marks at 0, 2.5 and 5 minutes
        clock.now = SLOT + 10 * MINUTE + step * 30_000
        await pipeline.ingest(
            "test",
            [Sample(tenant, "backfill", {}, past + step * 1000, 1.0), Sample(tenant, "live", {}, clock.now, 1.0)],
        )
    assert marks() - before == 3 + 1
    assert await last_touch(sqlite_store, tenant, "backfill") == [(past, SLOT + 10 * MINUTE + 10 * 30_000)]
    assert await last_touch(sqlite_store, tenant, "live") == [(SLOT, SLOT + 10 * MINUTE)]


@pytest_twisted.ensureDeferred
async def test_in_flight_samples_are_bounded_counted_and_drained(sqlite_store, tenant):
    """While the store's writer is busy, a write that would pass the bound is refused (and not
    counted), a first write may exceed it alone, and drain fires once the count is back to 0."""
    clock = MsClock(SLOT + 10 * MINUTE)
    pipeline = pipeline_on(sqlite_store, clock, max_inflight=10)
    release = threading.Event()
    sqlite_store._writer.callInThread(release.wait)  # the store's one writer thread is busy
    try:
        first = ensureDeferred(
            pipeline.ingest("test", [Sample(tenant, "bounded", {"i": str(i)}, clock.now, 1.0) for i in range(12)])
        )
        assert pipeline.inflight_samples == 12
        refused = ensureDeferred(pipeline.ingest("test", [Sample(tenant, "bounded", {}, clock.now, 1.0)]))
        with pytest.raises(Overloaded):
            await refused
        assert pipeline.inflight_samples == 12
        drained = pipeline.drain()
        assert not drained.called and not first.called
    finally:
        release.set()
    assert (await first).accepted == 12
    assert drained.called and pipeline.inflight_samples == 0
    assert REGISTRY.get_sample_value("tsgate_ingest_inflight_samples") == 0
    assert pipeline.drain().called


@pytest_twisted.ensureDeferred
async def test_a_batch_over_the_tenant_limit_is_refused_whole_and_never_in_flight(sqlite_store, tenant):
    seconds = MsClock(0)
    clock = MsClock(SLOT + 10 * MINUTE)
    pipeline = pipeline_on(sqlite_store, clock, tenant_limits=TenantLimits(10, burst_seconds=1, clock=seconds))
    ok = [Sample(tenant, "limited", {}, clock.now - i, 1.0) for i in range(10)]
    assert (await pipeline.ingest("test", ok)).accepted == 10
    with pytest.raises(RateLimited):
        await pipeline.ingest("test", [Sample("other-" + tenant, "limited", {}, clock.now, 1.0), ok[0]])
    assert pipeline.inflight_samples == 0
    seconds.now = 1
    assert (
        await pipeline.ingest("test", [Sample("other-" + tenant, "limited", {}, clock.now, 1.0), ok[0]])
    ).accepted == 2


@pytest_twisted.ensureDeferred
async def test_invalid_samples_are_rejected_one_by_one_beside_good_ones(sqlite_store, tenant):
    clock = MsClock(SLOT + 10 * MINUTE)
    pipeline = pipeline_on(sqlite_store, clock)
    batch = [
        Sample(tenant, "good", {}, clock.now, 1.0),
        Sample(tenant, "", {}, clock.now, 1.0),
        Sample(tenant, "good", {}, clock.now + 11 * MINUTE, 1.0),
        Sample(tenant, "good", {}, clock.now - 1, 2.0),
    ]
    result = await pipeline.ingest("test", batch)
    assert result.accepted == 2 and [r.index for r in result.rejected] == [1, 2]
    (found,) = await sqlite_store.read_raw(tenant, [series_set_hash(series_set_text("good", {}))], SLOT, SLOT + HOUR_MS)
    assert len(found.head) == 2


def rejected(reason: str) -> float:
    return REGISTRY.get_sample_value("tsgate_samples_rejected_total", {"protocol": "test", "reason": reason}) or 0.0


@pytest_twisted.ensureDeferred
async def test_only_new_series_over_the_active_limit_are_refused_and_every_kind_of_data_counts(sqlite_store, tenant):
    """Samples, histograms, exemplars and series without data take the same admission: a series
    over --tenant-max-active-series is refused wherever it comes from, and the items of the
    series already active are written beside it."""
    seconds = MsClock(0)
    clock = MsClock(SLOT + 10 * MINUTE)
    pipeline = pipeline_on(sqlite_store, clock, tenant_limits=TenantLimits(0, max_active_series=3, clock=seconds))
    before = rejected("max_active_series")
    assert (await pipeline.ingest("test", [Sample(tenant, "m", {"s": "1"}, clock.now, 1.0)])).accepted == 1
    histogram = HistogramSample(tenant, "h", {}, clock.now, b"\x08\x01")
    assert (await pipeline.ingest_histograms("test", [histogram])).accepted == 1
    keys, refused = await pipeline.register_series("test", [(tenant, "tagged", {"s": "2"}), (tenant, "over", {})])
    assert [key.metric_name for key in keys] == ["tagged"] and [r.index for r in refused] == [1]
    batch = [Sample(tenant, "m", {"s": str(i)}, clock.now - 1, float(i)) for i in (5, 1, 6)]
    result = await pipeline.ingest("test", batch + [Sample(tenant, "tagged", {"s": "2"}, clock.now, 2.0)])
    assert result.accepted == 2
    assert [(r.index, r.field, r.reason) for r in result.rejected] == [
        (0, "series", "max_active_series"),
        (2, "series", "max_active_series"),
    ]
    assert "3 active series (--tenant-max-active-series)" in result.rejected[0].problem
    exemplars = [
        ExemplarSample(tenant, "m", {"s": "1"}, clock.now, 1.0, {"trace_id": "a"}),
        ExemplarSample(tenant, "m", {"s": "7"}, clock.now, 1.0, {"trace_id": "b"}),
    ]
    result = await pipeline.ingest_exemplars("test", exemplars)
    assert result.accepted == 1 and [r.index for r in result.rejected] == [1]
    assert rejected("max_active_series") - before == 3  # the refused samples and series; exemplars count apart
    (found,) = await sqlite_store.read_raw(
        tenant, [series_set_hash(series_set_text("m", {"s": "1"}))], SLOT, SLOT + HOUR_MS
    )
    assert len(found.head) == 2
    assert await sqlite_store.list_metric_names(tenant) == ["h", "m", "tagged"]


@pytest_twisted.ensureDeferred
async def test_histograms_and_exemplars_take_the_rate_limit_and_the_in_flight_bound(sqlite_store, tenant):
    seconds = MsClock(0)
    clock = MsClock(SLOT + 10 * MINUTE)
    pipeline = pipeline_on(
        sqlite_store, clock, max_inflight=8, tenant_limits=TenantLimits(10, burst_seconds=1, clock=seconds)
    )
    histograms = [HistogramSample(tenant, "h", {}, clock.now - i, b"\x08\x01") for i in range(10)]
    assert (await pipeline.ingest_histograms("test", histograms)).accepted == 10
    with pytest.raises(RateLimited):
        await pipeline.ingest_exemplars("test", [ExemplarSample(tenant, "h", {}, clock.now, 1.0, {})])
    seconds.now = 5  # the bucket full again: 10 tokens
    release = threading.Event()
    sqlite_store._writer.callInThread(release.wait)  # the store's one writer thread is busy
    try:
        first = ensureDeferred(pipeline.ingest_histograms("test", histograms[:6]))
        assert pipeline.inflight_samples == 6
        with pytest.raises(Overloaded):
            await pipeline.ingest_exemplars(
                "test", [ExemplarSample(tenant, "h", {}, clock.now - i, 1.0, {}) for i in range(4)]
            )
    finally:
        release.set()
    assert (await first).accepted == 6 and pipeline.inflight_samples == 0


def test_the_in_flight_bound_follows_the_store_rate_so_that_a_stop_can_flush_it_in_time(sqlite_store):
    """A busy second storing 30,000 rows makes the bound what the store takes in flush_within_s;
    the figure kept decays slowly (a bound that limits the rate must not shrink itself), has a
    floor, and the drain at shutdown lifts it."""
    seconds = MsClock(0)
    pipeline = IngestPipeline(sqlite_store, Limits(), KnownSeries(10), 1_000_000, flush_within_s=2.0)
    pipeline.store_rate = StoreRate(window_s=1.0, decay=0.5, clock=seconds)
    assert pipeline.flushable_samples() == 1_000_000  # nothing measured yet
    pipeline.store_rate.busy()
    seconds.now = 0.5
    pipeline.store_rate.stored(10_000, still_busy=True)
    seconds.now = 1.0
    pipeline.store_rate.stored(20_000, still_busy=True)
    assert pipeline.flushable_samples() == 60_000
    seconds.now = 2.0
    pipeline.store_rate.stored(5_000, still_busy=False)  # a slower second: the figure halves
    assert pipeline.flushable_samples() == 30_000
    pipeline.store_rate.busy()
    seconds.now = 2.5
    pipeline.store_rate.stored(100_000, still_busy=False)  # idle before the window ended: not a figure
    assert pipeline.flushable_samples() == 30_000
    pipeline.store_rate.rate = 10.0
    assert pipeline.flushable_samples() == MIN_INFLIGHT_BOUND
    pipeline.drain()
    assert pipeline.flushable_samples() == 1_000_000


class ReactorTicks:
    """Counts the turns a timer asked for every 5 ms got while some work ran on the reactor."""

    def __init__(self):
        self.count = 0
        self.loop = LoopingCall(self.tick)

    def tick(self):
        self.count += 1

    async def during(self, work) -> float:
        """Await ``work`` with the timer running; the seconds it took. The turns are in ``count``."""
        self.count = 0
        self.loop.start(0.005, now=False)
        started = time.perf_counter()
        try:
            await work
        finally:
            self.loop.stop()
        return time.perf_counter() - started


@pytest_twisted.ensureDeferred
async def test_a_large_remote_write_decodes_and_resolves_without_holding_the_reactor(sqlite_store, tenant):
    """30,000 new series of 20 labels: seconds of per-series Python on this box, cut into slices
    with the reactor running between them. Counted in reactor turns, not in the longest gap: on a
    shared box the process itself is descheduled for hundreds of ms at times."""
    clock = MsClock(SLOT + 10 * MINUTE)
    pipeline = pipeline_on(sqlite_store, clock)
    common = {f"label_{i:02d}": f"value_{i}" for i in range(18)}
    body = prometheus.encode_write_request_v2(
        [
            prometheus.WriteSeries({"__name__": "large", "n": str(n), **common}, [(clock.now, 1.0)])
            for n in range(30_000)
        ]
    )
    ticks = ReactorTicks()
    decoding = ensureDeferred(
        run_steps(prometheus.decode_write_request_steps(body, V2_CONTENT_TYPE, "snappy", 1 << 26))
    )
    took = await ticks.during(decoding)
    assert took > 0.3, "too quick to tell: the test needs a larger request"
    assert ticks.count >= took / 0.1, f"{ticks.count} reactor turns in {took:.1f}s of decoding"
    samples = [
        Sample(tenant, s.labels["__name__"], {k: v for k, v in s.labels.items() if k != "__name__"}, *s.samples[0])
        for s in decoding.result.series
    ]
    resolving = ensureDeferred(pipeline._resolve("test", _SAMPLES, samples))
    took = await ticks.during(resolving)
    assert took > 0.3, "too quick to tell: the test needs a larger request"
    assert ticks.count >= took / 0.1, f"{ticks.count} reactor turns in {took:.1f}s of resolving"
    assert len(resolving.result.rows) == 30_000 and not resolving.result.rejected


def as_arrays(tenant: str, table: list[dict[str, str]], samples: list[tuple[int, int, float]]) -> SeriesSamples:
    """(series index in ``table``, timestamp, value) samples as ingest_arrays takes them."""
    series, timestamps, values = zip(*samples)
    return SeriesSamples(
        tenant,
        [(*labels.keys(), *labels.values()) for labels in table],
        table,
        split_labels,
        np.array(series, dtype=np.intp),
        np.array(timestamps, dtype=np.int64),
        np.array(values, dtype=np.float64),
    )


@pytest_twisted.ensureDeferred
async def test_samples_as_arrays_are_written_and_rejected_as_sample_objects_are(sqlite_store, tenant):
    """ingest_arrays and ingest on the same samples, each into its own tenant, new series then
    known ones: the same counts, the same rejects (with the sample's index), the same rows and
    series metadata. A series whose only sample is refused, or without samples, is not indexed."""
    clock = MsClock(SLOT + 10 * MINUTE)
    now = clock.now
    table = [
        {"__name__": "good", "job": "a"},
        {"__name__": "bad", "job": "x\x01"},
        {"__name__": "no_samples"},
        {"__name__": "too_old", "job": "b"},
        {"__name__": "fresh"},
    ]
    samples = [
        (0, now, 1.0),
        (1, now, 2.0),
        (0, now + 11 * MINUTE, 3.0),
        (4, now - 5, 4.0),
        (3, now - 3651 * 86_400_000, 5.0),
    ]
    samples += [(0, now - 1, float("nan")), (4, now, -0.0)]
    pipeline = pipeline_on(sqlite_store, clock)
    objects, arrays = tenant, tenant + "-arrays"
    for shift in (0, 7):  # new series, then known ones
        moved = [(index, ts + shift, value) for index, ts, value in samples]
        expected = await pipeline.ingest(
            "test", [Sample(objects, *split_labels(table[index]), ts, value) for index, ts, value in moved]
        )
        got = await pipeline.ingest_arrays("test", as_arrays(arrays, table, moved))
        assert got == expected
        assert expected.accepted == 4 and [r.index for r in expected.rejected] == [1, 2, 4]
    hashes = [series_set_hash(series_set_text(*split_labels(labels))) for labels in table]
    for kind in (objects, arrays):
        assert sorted((await sqlite_store.get_series(kind, hashes)).values()) == sorted(
            SeriesKey(kind, hashes[index], *split_labels(table[index])) for index in (0, 4)
        )
    (by_objects, by_arrays) = [
        await sqlite_store.read_raw(kind, hashes, SLOT, SLOT + HOUR_MS) for kind in (objects, arrays)
    ]
    assert [len(found.head) for found in by_objects] == [4, 0, 0, 0, 4]
    for one, other in zip(by_objects, by_arrays):
        assert one.head.timestamps.tolist() == other.head.timestamps.tolist()
        assert one.head.values.view(np.int64).tolist() == other.head.values.view(np.int64).tolist()
