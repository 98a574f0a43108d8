"""The one read of the query APIs (gateway/query/read_service.py) on a real SQLite store, its clock
fixed: READ_BATCH series a store call over READ_BATCH_SPAN_MS (more over a shorter range), the
budget counted across batches and refusing after the batch that crossed it (the next is never
read), its check run before every batch, and no more store reads in flight than the store's bound
on calls (gateway/store/calls.py)."""

import pytest
import pytest_twisted

from gateway.core.model import Limits, Sample, SeriesKey, now_ms, series_set_hash, series_set_text
from gateway.ingest.metadata_cache import KnownSeries
from gateway.ingest.pipeline import IngestPipeline
from gateway.query.read_service import (
    MAX_READ_BATCH,
    READ_BATCH,
    READ_BATCH_SPAN_MS,
    ReadBudget,
    ReadService,
    series_per_read,
)
from tests.query.test_service_layer import CountedReads

MINUTE = 60_000
DAY = 24 * 60 * MINUTE
SERIES = 2 * READ_BATCH + 88
SPAN = READ_BATCH_SPAN_MS  # a range read READ_BATCH series a call


class Refused(Exception):
    pass


def refuse(count: int, what: str) -> Refused:
    return Refused(f"{what}: {count}")


@pytest_twisted.async_yield_fixture
async def written(sqlite_store, tenant):
    """SERIES series of two samples each, the last a minute before the returned (fixed) now."""
    now = now_ms()
    keys = [
        SeriesKey(tenant, series_set_hash(series_set_text("load", {"i": str(i)})), "load", {"i": str(i)})
        for i in range(SERIES)
    ]
    samples = [Sample(tenant, k.metric_name, k.tags, now - m * MINUTE, float(m)) for k in keys for m in (1, 2)]
    pipeline = IngestPipeline(sqlite_store, Limits(), KnownSeries(10_000), 10_000_000)
    assert not (await pipeline.ingest("prometheus", samples)).rejected
    yield now, keys


def service(store, now: int, concurrency: int = 32) -> tuple[ReadService, CountedReads]:
    counted = CountedReads(
        store, concurrency, {"read_raw", "read_raw_stacked", "read_rollups", "read_histograms", "read_exemplars"}
    )
    return ReadService(counted, clock=lambda: now), counted  # type: ignore[arg-type]


@pytest_twisted.ensureDeferred
async def test_reads_a_batch_of_series_a_store_call_and_counts_every_batch(sqlite_store, written):
    now, keys = written
    reads, counted = service(sqlite_store, now)
    budget = ReadBudget(10_000, refuse)
    found = await reads.samples(keys, now - SPAN, now, budget)
    assert [len(call[2]) for call in counted.asked] == [READ_BATCH, READ_BATCH, 88]
    assert [list(read.samples.values) for read in found] == [[2.0, 1.0]] * SERIES
    assert budget.spent == 2 * SERIES


@pytest_twisted.ensureDeferred
async def test_stacked_samples_are_read_in_the_same_batches_a_stack_each(sqlite_store, written):
    """The PromQL read: each batch's samples laid end to end, the series in their order."""
    now, keys = written
    reads, counted = service(sqlite_store, now)
    budget = ReadBudget(10_000, refuse)
    stacks = await reads.stacked_samples(keys, now - SPAN, now, budget)
    assert [call[0] for call in counted.asked] == ["read_raw_stacked"] * 3
    assert [len(stack.bounds) - 1 for stack in stacks] == [READ_BATCH, READ_BATCH, 88]
    assert [list(part.values) for stack in stacks for part in stack.split()] == [[2.0, 1.0]] * SERIES
    assert budget.spent == 2 * SERIES


@pytest_twisted.ensureDeferred
async def test_a_shorter_range_reads_more_series_a_store_call(sqlite_store, written):
    """A dashboard's last hour holds a sixth of the samples a series: six times the series a call."""
    now, keys = written
    reads, counted = service(sqlite_store, now)
    found = await reads.samples(keys, now - SPAN // 6, now, ReadBudget(10_000, refuse))
    assert [len(call[2]) for call in counted.asked] == [SERIES]
    assert [list(read.samples.values) for read in found] == [[2.0, 1.0]] * SERIES
    assert series_per_read(now - MINUTE, now) == MAX_READ_BATCH  # a minute: at most that many a call


@pytest_twisted.ensureDeferred
async def test_refuses_after_the_batch_that_crosses_the_budget_and_reads_no_further(sqlite_store, written):
    now, keys = written
    reads, counted = service(sqlite_store, now)
    budget = ReadBudget(3 * READ_BATCH, refuse)  # the first batch holds 2 x 256 samples, the second as many
    with pytest.raises(Refused, match=f"^reading load: {2 * READ_BATCH}$"):
        await reads.samples(keys, now - SPAN, now, budget, "reading load")
    assert len(counted.asked) == 2 and budget.spent == 4 * READ_BATCH


@pytest_twisted.ensureDeferred
async def test_checks_before_each_batch(sqlite_store, written):
    """PromQL's deadline: a check that fails once the (fake) clock passed it stops the reads."""
    now, keys = written
    reads, counted = service(sqlite_store, now)
    clock = [0]

    def check():
        clock[0] += 1
        if clock[0] > 2:
            raise Refused("deadline")

    with pytest.raises(Refused, match="deadline"):
        await reads.samples(keys, now - SPAN, now, ReadBudget(10**9, refuse, check))
    assert len(counted.asked) == 2


@pytest_twisted.ensureDeferred
async def test_no_more_store_reads_in_flight_than_the_bound(sqlite_store, written):
    """A range that starts past the raw retention reads a roll-up, one store call a series:
    a batch's 256 calls go at most the store's bound at once."""
    now, keys = written
    reads, counted = service(sqlite_store, now, concurrency=4)
    found = await reads.samples(keys, now - 8 * DAY, now)
    assert counted.peak == 4
    assert sum(1 for call in counted.asked if call[0] == "read_rollups") == SERIES
    assert [list(read.samples.values) for read in found] == [[2.0, 1.0]] * SERIES


@pytest_twisted.ensureDeferred
async def test_histograms_and_exemplars_are_read_a_batch_at_a_time(sqlite_store, written):
    now, keys = written
    reads, counted = service(sqlite_store, now)
    hashes = [key.series_set_hash for key in keys]
    budget = ReadBudget(10, refuse)
    assert await reads.histograms(keys[0].tenant, hashes, now - SPAN, now, budget) == [[]] * SERIES
    assert await reads.exemplars(keys[0].tenant, hashes, *reads.exemplar_range(now - SPAN, now)) == [[]] * SERIES
    assert [(call[0], len(call[2])) for call in counted.asked] == [
        (operation, size)
        for operation in ("read_histograms", "read_exemplars")
        for size in (READ_BATCH, READ_BATCH, 88)
    ]
    assert budget.spent == 0
