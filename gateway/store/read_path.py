"""The one read path: samples of many series over a range, stitched from head rows, blocks and roll-ups.

Every reader (the query APIs through gateway/query/read_service.py, the downsampler, deletes) asks
here and gets numpy arrays (gateway/core/samples.py); the edges convert to their own shapes.

- Within the raw retention (``now - raw_retention`` to the end of the range) the samples are the
  series' sealed blocks merged with its head rows (slots not sealed yet, and writes that came
  after a slot was sealed; a head row wins over a block's sample of the same timestamp).
- Before that, they are one aggregate of the finest roll-up whose retention covers the start of
  the range, one point per roll-up bucket at the bucket's start. The boundary is the raw
  retention's start rounded up to a bucket, so no bucket is counted twice.

So a range that starts past the raw retention still ends with the newest samples (Grafana's
"Last 7 days" shows the current hour). Native histograms follow the same rule: before the
boundary, the histograms the roll-up keeps (gateway/downsample/histograms.py). docs/storage.rst
has the details.
"""

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from twisted.internet.defer import ensureDeferred, gatherResults

from gateway.core import blocking, samples
from gateway.core.layout import Granularity, Layout
from gateway.core.model import Limits, SeriesKey, now_ms
from gateway.core.samples import Samples, SamplesStack
from gateway.store import Store
from gateway.store.blocks import decode_block
from gateway.store.contract import HistogramRow, RawData, Rollup, time_slot
from gateway.store.histogram_rollup_rows import kept_in_range

ROLLUP_AGGREGATES = ("min", "max", "sum", "count", "avg", "last", "increase")

# The times a read can ask for: 1970 to the end of the year 9999. Stores keep int64 milliseconds,
# so a range is cut to these rather than overflowing (``end=9223372036854775807``, ``1e20``, or
# a remote read starting at int64's minimum all mean "everything").
EARLIEST_MS = 0
LATEST_MS = 253_402_300_799_999


def clamp_range(start_ms: int, end_ms: int) -> tuple[int, int]:
    """Both ends within [EARLIEST_MS, LATEST_MS] (a range that ends before 1970 reads nothing after it)."""
    return min(max(start_ms, EARLIEST_MS), LATEST_MS), max(min(end_ms, LATEST_MS), EARLIEST_MS)


def readable_range(layout: Layout, now: int, max_future_ms: int, start_ms: int, end_ms: int) -> tuple[int, int]:
    """The part of a range the retentions can hold: from the longest retention before ``now`` to
    ``max_future_ms`` (--max-future) after it. An open range ("all time": a remote read without
    start or end) then costs what the stored data does, not one store partition per slot since 1970."""
    start_ms, end_ms = clamp_range(start_ms, end_ms)
    return max(start_ms, now - layout.longest_retention_ms), min(end_ms, now + max_future_ms)


class SeriesData(NamedTuple):
    """The samples of one series, and the roll-up aggregate that gave those before the raw
    retention (None when the whole range was raw)."""

    samples: Samples
    aggregate: str | None


def choose_granularity(layout: Layout, start_ms: int, now: int) -> Granularity | None:
    """None while the range starts inside the raw retention; otherwise the finest roll-up whose
    retention still covers the start (the coarsest when none does)."""
    if start_ms >= now - layout.raw_retention_ms:
        return None
    for granularity in layout.granularities:
        if start_ms >= now - granularity.retention_ms:
            return granularity
    return layout.granularities[-1] if layout.granularities else None


def rollup_samples(rows: Sequence[Rollup], aggregate: str, fallback: str | None = None) -> tuple[Samples, str | None]:
    """One aggregate of roll-up rows (avg is sum/count) as Samples; rows without it use
    ``fallback`` (a counter has no avg, only last and increase), then the one a max-only or
    min-only series keeps (a ``.max`` path holds max and count only). Returns the aggregate used."""
    for wanted in dict.fromkeys(filter(None, (aggregate, fallback, "max", "min"))):
        points = [(row.timestamp_ms, value) for row in rows if (value := _aggregate(row, wanted)) is not None]
        if points:
            return samples.from_points(points), wanted
    return samples.empty(), None


def _aggregate(row: Rollup, aggregate: str) -> float | None:
    if aggregate == "avg":
        return row.sum / row.count if row.sum is not None and row.count else None
    value = getattr(row, aggregate)
    return None if value is None else float(value)


class ReadPath:
    def __init__(self, store: Store, clock=now_ms, max_future_ms: int = Limits.max_future_ms):
        self.store = store
        self.layout = store.layout
        self.clock = clock
        self.max_future_ms = max_future_ms

    def readable(self, start_ms: int, end_ms: int) -> tuple[int, int]:
        """What the query readers (``read``, ``read_rollup``, ``read_histograms``, and exemplars)
        read of a range: the part the retentions can hold (``readable_range``)."""
        return readable_range(self.layout, self.clock(), self.max_future_ms, start_ms, end_ms)

    def exemplar_range(self, start_ms: int, end_ms: int) -> tuple[int, int]:
        """What an exemplar read reads of a range: the readable part within --exemplar-retention."""
        start_ms, end_ms = self.readable(start_ms, end_ms)
        return max(start_ms, self.clock() - self.layout.exemplar_retention_ms), end_ms

    def rollup_for(self, start_ms: int, tenant: str) -> Granularity | None:
        """The roll-up a range of ``tenant`` starting here reads before its raw retention (None:
        all raw); a tenant's retentions are its own with --overrides."""
        return choose_granularity(self.store.retentions.for_tenant(tenant), start_ms, self.clock())

    async def read(
        self,
        series: Sequence[SeriesKey],
        start_ms: int,
        end_ms: int,
        aggregate: str = "avg",
        fallback: str | None = "last",
        before_raw: Granularity | None = None,
    ) -> list[SeriesData]:
        """Each series' samples in the inclusive range, stitched as the module says, in order;
        ``before_raw``, the roll-up read before the raw retention where the caller chose it (a
        render's step is that roll-up's width: each of its buckets comes from one source, whole)."""
        start_ms, end_ms = self.readable(start_ms, end_ms)
        tenant = series[0].tenant if series else ""  # a query reads one tenant
        granularity = before_raw or self.rollup_for(start_ms, tenant)
        if granularity is None:
            return [SeriesData(s, None) for s in await self.read_raw(series, start_ms, end_ms)]
        boundary = self._boundary(granularity, tenant)
        old = await self.read_rollup(series, granularity, aggregate, start_ms, min(end_ms, boundary - 1), fallback)
        new = await self.read_raw(series, boundary, end_ms) if end_ms >= boundary else [samples.empty()] * len(series)
        return [SeriesData(samples.merge([before, after]), used) for (before, used), after in zip(old, new)]

    async def read_stacked(self, series: Sequence[SeriesKey], start_ms: int, end_ms: int) -> SamplesStack:
        """``read``'s samples laid end to end (the PromQL evaluator's read): the store's stacked head
        as it is where the range holds no block and needs no roll-up, as it mostly does (a
        dashboard's recent minutes), else ``read``'s samples stacked."""
        start_ms, end_ms = clamp_range(*self.readable(start_ms, end_ms))
        tenants = {key.tenant for key in series}
        if end_ms < start_ms or len(tenants) != 1 or self.rollup_for(start_ms, next(iter(tenants))) is not None:
            return samples.stacked([data.samples for data in await self.read(series, start_ms, end_ms)])
        raw = await self.store.read_raw_stacked(
            tenants.pop(), [key.series_set_hash for key in series], start_ms, end_ms
        )
        if not raw.blocks:
            return raw.head
        found = [RawData(raw.blocks.get(key.series_set_hash, []), head) for key, head in zip(series, raw.head.split())]
        return samples.stacked(await blocking.in_thread(_stitch_all, found, start_ms, end_ms))

    def _boundary(self, granularity: Granularity, tenant: str) -> int:
        """Where raw data takes over from a roll-up: the tenant's raw retention's start rounded up to a bucket."""
        width, raw_retention_ms = granularity.width_ms, self.store.retentions.for_tenant(tenant).raw_retention_ms
        return math.ceil((self.clock() - raw_retention_ms) / width) * width

    async def read_histograms(
        self, tenant: str, hashes: Sequence[str], start_ms: int, end_ms: int
    ) -> list[list[HistogramRow]]:
        """Each series' native histograms in the inclusive range, oldest first: stored ones within
        the raw retention and, before it, those the roll-up covering the start keeps (the same
        roll-up and boundary as ``read``; docs/downsampling.rst)."""
        start_ms, end_ms = self.readable(start_ms, end_ms)
        if end_ms < start_ms:
            return [[] for _ in hashes]
        granularity = self.rollup_for(start_ms, tenant)
        if granularity is None:
            return await self.store.read_histograms(tenant, hashes, start_ms, end_ms)
        boundary = self._boundary(granularity, tenant)
        old_end = min(end_ms, boundary - 1)
        old: list[list[HistogramRow]] = [[] for _ in hashes]
        if old_end >= start_ms:
            intervals = await self.store.read_histogram_rollups(
                granularity,
                tenant,
                hashes,
                time_slot(start_ms, granularity.width_ms),
                old_end,
            )
            old = await blocking.in_thread(lambda: [kept_in_range(rows, start_ms, old_end) for rows in intervals])
        if end_ms < boundary:
            return old
        new = await self.store.read_histograms(tenant, hashes, boundary, end_ms)
        return [before + after for before, after in zip(old, new)]

    async def read_exemplars(self, tenant: str, hashes: Sequence[str], start_ms: int, end_ms: int) -> list[list]:
        """Each series' exemplars in the inclusive range."""
        return await self.store.read_exemplars(tenant, hashes, start_ms, end_ms)

    async def read_created(self, tenant: str, hashes: Sequence[str]) -> dict[str, int]:
        """The created timestamps (remote write 2.0) stored for these series, by hash."""
        return await self.store.get_created_timestamps(tenant, hashes)

    async def read_raw(self, series: Sequence[SeriesKey], start_ms: int, end_ms: int) -> list[Samples]:
        """Blocks merged with head rows, the series of a tenant in one store call."""
        start_ms, end_ms = clamp_range(start_ms, end_ms)
        if end_ms < start_ms:
            return [samples.empty() for _ in series]
        tenants = [key.tenant for key in series]
        if len(set(tenants)) == 1:  # a query's series: no regrouping
            return await self._read_tenant(tenants[0], [key.series_set_hash for key in series], start_ms, end_ms)
        by_tenant: dict[str, list[int]] = {}
        for index, tenant in enumerate(tenants):
            by_tenant.setdefault(tenant, []).append(index)
        reads = [
            ensureDeferred(self._read_tenant(tenant, [series[i].series_set_hash for i in indexes], start_ms, end_ms))
            for tenant, indexes in by_tenant.items()
        ]
        found: list = [None] * len(series)
        for indexes, stitched in zip(by_tenant.values(), await gatherResults(reads, consumeErrors=True)):
            for index, data in zip(indexes, stitched):
                found[index] = data
        return found

    async def _read_tenant(self, tenant: str, hashes: list[str], start_ms: int, end_ms: int) -> list[Samples]:
        raw = await self.store.read_raw(tenant, hashes, start_ms, end_ms)
        # decoding the blocks of many series takes a while: in a thread, off the reactor (head
        # samples alone are as they are: no thread to wait for)
        if any(data.blocks for data in raw):
            return await blocking.in_thread(_stitch_all, raw, start_ms, end_ms)
        return [data.head for data in raw]

    async def read_rollup(
        self,
        series: Sequence[SeriesKey],
        granularity: Granularity,
        aggregate: str,
        start_ms: int,
        end_ms: int,
        fallback: str | None = None,
    ) -> list[SeriesData]:
        """One aggregate of a roll-up table for every series (with ``fallback`` for series lacking it)."""
        start_ms, end_ms = self.readable(start_ms, end_ms)
        if end_ms < start_ms:
            return [SeriesData(samples.empty(), None) for _ in series]
        reads = [self.store.read_rollups(granularity, s.tenant, s.series_set_hash, start_ms, end_ms) for s in series]
        found = await gatherResults(reads, consumeErrors=True)
        return [SeriesData(*rollup_samples(rows, aggregate, fallback)) for rows in found]


def _stitch_all(raw: list[RawData], start_ms: int, end_ms: int) -> list[Samples]:
    return [stitch_raw(data, start_ms, end_ms) for data in raw]


def stitch_raw(found: RawData, start_ms: int, end_ms: int) -> Samples:
    """Blocks (cut to the range) first, the head last so that its samples win."""
    blocks, head = found.blocks, found.head
    if not blocks:
        return head
    decoded = [Samples(*decode_block(block)) for block in blocks]
    sealed = Samples(np.concatenate([d.timestamps for d in decoded]), np.concatenate([d.values for d in decoded]))
    return samples.merge([sealed.between(start_ms, end_ms), head])
