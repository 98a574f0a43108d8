"""The query services on a real SQLite store, without a server: remote read (gateway/query/remote_read.py)
and PromQL evaluation (gateway/query/promql/service.py) select, read and limit as the HTTP handlers
rely on, so the handlers only decode and encode."""

import numpy as np
import pytest
import pytest_twisted

from gateway.core.layout import DAY_MS, HOUR_MS
from gateway.core.model import HistogramSample, Limits, Sample, SeriesKey, now_ms
from gateway.ingest.metadata_cache import KnownSeries
from gateway.ingest.pipeline import IngestPipeline
from gateway.query import read_service
from gateway.query.planner import QueryPlanner, QueryTooLarge
from gateway.query.promql.service import OVERSIZED_LISTING_MS, PromQLService
from gateway.query.promql.values import PromQLError
from gateway.query.remote_read import RemoteRead
from gateway.store.contract import MetricMetadata, Rollup
from protocols.prometheus import Matcher
from protocols.prometheus.read import ReadQuery
from tests.protocols.test_prometheus_protocol import histogram

MINUTE = 60_000


@pytest_twisted.async_yield_fixture
async def written(sqlite_store, tenant):
    """Three float series of 10 samples a minute apart and one native histogram series of 10,
    all ending a minute ago; yields the time of the last sample."""
    pipeline = IngestPipeline(sqlite_store, Limits(), KnownSeries(1000), 1_000_000)
    end = (now_ms() // MINUTE - 1) * MINUTE
    times = [end - i * MINUTE for i in range(9, -1, -1)]
    samples = [
        Sample(tenant, "requests_total", {"host": host}, ts, float(i * (n + 1)))
        for n, host in enumerate(("b", "a", "c"))
        for i, ts in enumerate(times)
    ]
    assert not (await pipeline.ingest("prometheus", samples)).rejected
    histograms = [
        HistogramSample(tenant, "latency", {"host": "a"}, ts, histogram(count=3 * (i + 1), timestamp=ts))
        for i, ts in enumerate(times)
    ]
    assert not (await pipeline.ingest_histograms("prometheus", histograms)).rejected
    yield end


def remote_read(store, max_samples: int = 1_000_000) -> RemoteRead:
    return RemoteRead(store, QueryPlanner(store, max_series=100), max_samples)


@pytest_twisted.ensureDeferred
async def test_remote_read_gives_series_sorted_by_labels_with_their_samples(sqlite_store, tenant, written):
    query = ReadQuery(written - 30 * MINUTE, written, [Matcher("EQ", "__name__", "requests_total")])
    (series,) = await remote_read(sqlite_store).read(tenant, [query], streamed=False)
    assert [labels["host"] for labels, *_ in series] == ["a", "b", "c"]
    labels, samples, exemplars, histograms = series[0]
    assert labels == {"__name__": "requests_total", "host": "a"}
    assert [value for _, value in samples.points()] == [float(2 * i) for i in range(10)]
    assert exemplars == [] and histograms == []


@pytest_twisted.ensureDeferred
async def test_remote_read_gives_native_histograms_as_written(sqlite_store, tenant, written):
    query = ReadQuery(written - 30 * MINUTE, written, [Matcher("EQ", "__name__", "latency")])
    ((labels, samples, histograms),) = (await remote_read(sqlite_store).read(tenant, [query], streamed=True))[0]
    assert labels == {"__name__": "latency", "host": "a"} and len(samples) == 0
    assert [h.data for h in histograms] == [
        histogram(count=3 * (i + 1), timestamp=h.timestamp) for i, h in enumerate(histograms)
    ]
    assert histograms[-1].timestamp == written


@pytest.mark.parametrize("matcher", [("EQ", "__name__", "requests_total"), ("EQ", "__name__", "latency")])
@pytest_twisted.ensureDeferred
async def test_remote_read_refuses_a_query_over_the_sample_budget(sqlite_store, tenant, written, matcher):
    query = ReadQuery(written - 30 * MINUTE, written, [Matcher(*matcher)])
    with pytest.raises(QueryTooLarge, match="--max-samples-per-query"):
        await remote_read(sqlite_store, max_samples=9).read(tenant, [query], streamed=False)


def promql(store, max_samples: int = 1_000_000, timeout_ms: int = 60_000) -> PromQLService:
    return PromQLService(store, QueryPlanner(store, max_series=100), max_samples, 5 * MINUTE, timeout_ms)


@pytest_twisted.ensureDeferred
async def test_promql_evaluates_floats_and_native_histograms_read_from_the_store(sqlite_store, tenant, written):
    service = promql(sqlite_store)
    times = np.array([written])
    value, warnings = await service.evaluate(
        tenant, "sum(increase(requests_total[5m]))", service.query(written, written, 0), times, None
    )
    assert warnings == [] and value.values[0, 0] == pytest.approx(6 * 4 * 5 / 4)
    value, _ = await service.evaluate(
        tenant, "histogram_count(latency)", service.query(written, written, 0), times, None
    )
    assert value.labels == [{"host": "a"}] and value.values[0, 0] == 30.0


@pytest_twisted.ensureDeferred
async def test_promql_reads_series_over_several_batches_each_with_its_own_samples(
    sqlite_store, tenant, written, monkeypatch
):
    """A stack of samples a batch of series (ReadService.stacked_samples): each series keeps its labels and samples."""
    monkeypatch.setattr(read_service, "READ_BATCH", 2)
    monkeypatch.setattr(read_service, "MAX_READ_BATCH", 2)
    service = promql(sqlite_store)
    value, _ = await service.evaluate(
        tenant, "requests_total", service.query(written, written, 0), np.array([written]), None
    )
    found = {labels["host"]: row[0] for labels, row in zip(value.labels, value.values.tolist())}
    assert found == {"b": 9.0, "a": 18.0, "c": 27.0}


@pytest.mark.parametrize("text", ["requests_total", "latency"])
@pytest_twisted.ensureDeferred
async def test_promql_refuses_a_query_over_the_sample_budget(sqlite_store, tenant, written, text):
    service = promql(sqlite_store, max_samples=2)
    with pytest.raises(PromQLError, match="--query-max-samples"):
        await service.evaluate(tenant, f"{text}[10m]", service.query(written, written, 0), np.array([written]), None)


@pytest_twisted.ensureDeferred
async def test_promql_label_lookups_use_prometheus_names(sqlite_store, tenant, written):
    service = promql(sqlite_store)
    assert await service.label_values(tenant, "host", ["requests_total"]) == ["a", "b", "c"]
    assert "host" in await service.label_names(tenant, [])


@pytest_twisted.ensureDeferred
async def test_a_listing_past_the_serving_process_bound_is_not_read_there_again_for_a_while(
    sqlite_store, tenant, written
):
    """The serving process's bounded listing (``most_rows``) answers None past its bound, and
    then None without reading for OVERSIZED_LISTING_MS (an executor answers it); after that it
    reads again, and answers once the listing fits."""
    clock = [written]
    service = PromQLService(
        sqlite_store, QueryPlanner(sqlite_store, max_series=100, clock=lambda: clock[0]), 1000, 5 * MINUTE, 60_000
    )
    reads = []
    listing = sqlite_store.list_tenant_tag_values
    sqlite_store.list_tenant_tag_values = lambda *args: reads.append(args) or listing(*args)
    start = written - 30 * MINUTE
    assert await service.label_values(tenant, "host", [], start, written, most_rows=2) is None
    assert await service.label_values(tenant, "host", [], start, written, most_rows=2) is None
    assert len(reads) == 1
    assert await service.label_values(tenant, "host", [], start, written) == ["a", "b", "c"]
    clock[0] += OVERSIZED_LISTING_MS
    assert await service.label_values(tenant, "host", [], start, written, most_rows=100) == ["a", "b", "c"]
    assert len(reads) == 3


@pytest_twisted.ensureDeferred
async def test_series_over_a_range_lists_those_with_floats_or_native_histograms_in_it(sqlite_store, tenant, written):
    service = promql(sqlite_store)
    every = [{"__name__": "latency", "host": "a"}, *({"__name__": "requests_total", "host": h} for h in "abc")]
    selectors = ["latency", "requests_total"]
    assert await service.matched(tenant, selectors, written - 30 * MINUTE, written) == every
    assert await service.matched(tenant, selectors, written - 9 * MINUTE, written - 9 * MINUTE) == every
    assert await service.matched(tenant, selectors, written + 1, written + 5 * MINUTE) == []
    assert await service.matched(tenant, selectors) == every
    # label values read the index, as Prometheus reads its own without chunks
    assert await service.label_values(tenant, "host", ["requests_total"], written + 1, written + 5 * MINUTE) == [
        "a",
        "b",
        "c",
    ]


@pytest_twisted.ensureDeferred
async def test_series_over_hours_reads_only_the_series_of_the_edge_buckets(sqlite_store, tenant):
    """A series the index gives for a bucket has samples in it or in the bucket before: those of
    the buckets from the range's second whole one to its last are kept unread; only the series of
    the edge buckets alone are asked of the store."""
    hour = now_ms() // HOUR_MS * HOUR_MS - 5 * HOUR_MS
    spans = {"steady": (0, 290), "early": (0, 10), "short": (130, 140)}
    pipeline = IngestPipeline(sqlite_store, Limits(), KnownSeries(1000), 1_000_000)
    samples = [
        Sample(tenant, "jobs_total", {"job": name}, hour + minute * MINUTE, 1.0)
        for name, (first, last) in spans.items()
        for minute in range(first, last + 1, 10)
    ]
    assert not (await pipeline.ingest("prometheus", samples)).rejected
    asked: list[str] = []
    checked = sqlite_store.series_with_data

    def series_with_data(tenant, hashes, *rest):
        asked.extend(hashes)
        return checked(tenant, hashes, *rest)

    sqlite_store.series_with_data = series_with_data
    found = await promql(sqlite_store).matched(tenant, ["jobs_total"], hour + 30 * MINUTE, hour + 270 * MINUTE)
    assert [labels["job"] for labels in found] == ["short", "steady"]
    (early,) = await sqlite_store.find_series(tenant, "jobs_total", "job", "early")
    assert set(asked) == {early}


@pytest_twisted.ensureDeferred
async def test_series_of_a_range_within_one_slot_asks_the_store_once(sqlite_store, tenant):
    """SQLite reads its head a slot at a time (Store.head_read_by_slot): a range within one slot is
    asked about at once, not its newest minute first and then again for the series not found there
    (a series indexed in the hour without data in the range was asked about twice)."""
    hour = now_ms() // HOUR_MS * HOUR_MS - 2 * HOUR_MS
    minutes = {"live": 54, "earlier": 51, "gone": 10}
    pipeline = IngestPipeline(sqlite_store, Limits(), KnownSeries(1000), 1_000_000)
    samples = [Sample(tenant, "jobs_total", {"job": job}, hour + m * MINUTE, 1.0) for job, m in minutes.items()]
    assert not (await pipeline.ingest("prometheus", samples)).rejected
    calls: list[list[str]] = []
    checked = sqlite_store.series_with_data

    def series_with_data(tenant, hashes, *rest):
        calls.append(list(hashes))
        return checked(tenant, hashes, *rest)

    sqlite_store.series_with_data = series_with_data
    found = await promql(sqlite_store).matched(tenant, ["jobs_total"], hour + 50 * MINUTE, hour + 55 * MINUTE)
    assert [labels["job"] for labels in found] == ["earlier", "live"]
    assert len(calls) == 1 and len(calls[0]) == 3


@pytest_twisted.ensureDeferred
async def test_series_over_a_range_past_the_raw_retention_lists_those_with_rollups_in_it(sqlite_store, tenant):
    """Before the raw retention the read path reads roll-ups: a series whose 5m roll-up has a row
    in the range has data there; one whose roll-ups end before it has none."""
    now = now_ms()
    start, end = now - 10 * DAY_MS, now - 9 * DAY_MS
    inside, before = (SeriesKey(tenant, f"{name}-hash", "jobs_total", {"job": name}) for name in ("inside", "before"))
    await sqlite_store.write_series([inside, before])
    seen = now - 9 * DAY_MS - 12 * HOUR_MS
    await sqlite_store.write_series_buckets([(inside, seen - seen % HOUR_MS), (before, seen - seen % HOUR_MS)])
    five = sqlite_store.layout.granularity("5m")
    at = seen - seen % five.width_ms
    await sqlite_store.write_rollups(
        five,
        [
            Rollup(tenant, inside.series_set_hash, at, last=1.0, increase=0.0),
            Rollup(tenant, before.series_set_hash, start - DAY_MS, last=1.0, increase=0.0),
        ],
    )
    assert await promql(sqlite_store).matched(tenant, ["jobs_total"], start, end) == [
        {"__name__": "jobs_total", "job": "inside"}
    ]


@pytest_twisted.ensureDeferred
async def test_metadata_lists_histogram_and_summary_families_and_limits_on_families(sqlite_store, tenant):
    """Remote write carries a histogram's metadata under its family name (``lat``), which none of
    its series bears (``lat_bucket``, ``lat_sum``, ``lat_count``); ``limit`` counts families found."""
    pipeline = IngestPipeline(sqlite_store, Limits(), KnownSeries(1000), 1_000_000)
    t = now_ms() - MINUTE
    names = ["lat_bucket", "lat_sum", "lat_count", "rpc", "rpc_sum", "rpc_count", "jobs_total", "no_metadata"]
    names += [f"g{i}" for i in range(5)]
    assert not (await pipeline.ingest("prometheus", [Sample(tenant, name, {}, t, 1.0) for name in names])).rejected
    families = {"lat": "histogram", "rpc": "summary", "jobs_total": "counter", **{f"g{i}": "gauge" for i in range(5)}}
    await pipeline.ingest_metric_metadata(
        [MetricMetadata(tenant, name, kind, f"{name} help", "") for name, kind in families.items()]
    )
    service = remote_read(sqlite_store)
    rows = await service.metadata(tenant, None, None)
    assert {row.metric_name: row.type for row in rows} == families
    for limit in (1, 3, 5, 8):
        assert len(await service.metadata(tenant, None, limit)) == limit
    assert [row.type for row in await service.metadata(tenant, "lat", None)] == ["histogram"]
