"""Deleting series and samples: the admin endpoints and ``tsgate delete`` (docs/operations.rst).

A delete selects series (Prometheus selectors, or Graphite paths and globs: gateway/query/selection.py),
then for each batch:

1. cuts the range out of every table (Store.delete_samples), twice (a seal that ran during the
   first cut could have written back a block read before it; the second cut catches that), then
   marks pending the slots in or just after the range that still hold raw samples or native
   histograms: the downsampler rolls them up again from what is left once they settle, as it
   does after any write (sealing here would break its rule that a slot is sealed only once it
   saw no write for ``--downsample-delay``);
2. finds the series with nothing left anywhere (no raw samples, histograms or roll-ups in any
   table's retention) and removes them from every index (Store.delete_series), after dropping
   them from this process's known-series cache and from Redis, so that their next sample writes
   their metadata again; then looks once more, and a series that got data meanwhile (a sender
   still writing it) is indexed again.

What is written after the delete is kept, whatever its timestamp.
"""

import logging
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from gateway.core.layout import Granularity
from gateway.core.model import SeriesKey, now_ms
from gateway.ingest.metadata_cache import KnownSeries, RedisSeenSeries
from gateway.ingest.pipeline import PendingMarker
from gateway.store import Store
from gateway.store.contract import time_slot
from gateway.store.read_path import ReadPath, clamp_range

log = logging.getLogger(__name__)

BATCH = 256  # series deleted at a time


class SeriesCount(NamedTuple):
    """What a delete removes of one series: raw samples and native histogram samples in the
    range, and whether the series has nothing left outside it (it leaves every index)."""

    series: SeriesKey
    samples: int
    histograms: int
    removed: bool


class Deleter:
    def __init__(
        self,
        store: Store,
        pending: PendingMarker,
        max_future_ms: int,
        known: KnownSeries | None = None,
        shared_seen: RedisSeenSeries | None = None,
    ):
        self.store = store
        self.layout = store.layout
        self.reader = ReadPath(store)
        self.pending = pending
        self.max_future_ms = max_future_ms
        self.known = known
        self.shared_seen = shared_seen

    def bounds(self, start_ms: int | None, end_ms: int | None) -> tuple[int, int]:
        """The range to delete, cut to the times data can have (no later than what ingest takes)."""
        now = now_ms()
        latest = now + self.max_future_ms + self.layout.slot_width_ms
        start, end = clamp_range(start_ms if start_ms is not None else 0, end_ms if end_ms is not None else latest)
        return start, min(end, latest)

    def _window(self) -> tuple[int, int]:
        """Where any table can hold data the read path reads: the longest retention back, up to the future bound."""
        now, layout = now_ms(), self.store.retentions.widest()
        retentions = [layout.raw_retention_ms, *(g.retention_ms for g in layout.granularities)]
        oldest = max(0, now - max(retentions) - self.layout.slot_width_ms)
        return oldest, now + self.max_future_ms + self.layout.slot_width_ms

    async def count(self, series: Sequence[SeriesKey], start_ms: int, end_ms: int) -> list[SeriesCount]:
        """What deleting [start_ms, end_ms] of the series would remove (a dry run deletes nothing):
        raw samples and histograms within the raw retention, where the read path reads them."""
        counts = []
        raw_retention_ms = self.store.retentions.widest().raw_retention_ms
        raw_start = max(start_ms, now_ms() - raw_retention_ms - self.layout.slot_width_ms)
        for first in range(0, len(series), BATCH):
            batch = list(series[first : first + BATCH])
            raw = await self.reader.read_raw(batch, raw_start, end_ms)
            tenant_hashes = _by_tenant(batch)
            histograms: dict[tuple[str, str], int] = {}
            for tenant, hashes in tenant_hashes.items():
                rows = await self.store.read_histograms(tenant, hashes, raw_start, end_ms)
                histograms.update({(tenant, h): len(found) for h, found in zip(hashes, rows)})
            left = await self._with_data(batch, self._outside(start_ms, end_ms))
            counts += [
                SeriesCount(key, len(samples), histograms[_pair(key)], _pair(key) not in left)
                for key, samples in zip(batch, raw)
            ]
        return counts

    async def delete(self, series: Sequence[SeriesKey], start_ms: int, end_ms: int) -> int:
        """Delete [start_ms, end_ms] of the series; returns how many left every index."""
        removed = 0
        for first in range(0, len(series), BATCH):
            batch = list(series[first : first + BATCH])
            for _ in range(2):
                for tenant, hashes in _by_tenant(batch).items():
                    await self.store.delete_samples(tenant, hashes, start_ms, end_ms)
            await self._roll_up_again(batch, start_ms, end_ms)
            left = await self._with_data(batch, self._outside(start_ms, end_ms))
            removed += await self._unindex([key for key in batch if _pair(key) not in left])
        return removed

    def _outside(self, start_ms: int, end_ms: int) -> list[tuple[int, int]]:
        """The parts of the data window outside the deleted range."""
        oldest, newest = self._window()
        parts = [(oldest, min(newest, start_ms - 1)), (max(oldest, end_ms + 1), newest)]
        return [(start, end) for start, end in parts if start <= end]

    async def _with_data(self, series: list[SeriesKey], parts: list[tuple[int, int]]) -> set[tuple[str, str]]:
        """(tenant, hash) of the series with raw samples, histograms or roll-up rows in any of the
        parts: the store's series_with_data of raw data within the raw retention, then of each
        roll-up's rows within its own retention for the series still without (a few store calls
        a batch)."""
        found: set[tuple[str, str]] = set()
        now, layout = now_ms(), self.store.retentions.widest()
        raw_oldest = now - layout.raw_retention_ms - layout.slot_width_ms
        ranges: list[tuple[int, int, Granularity | None]] = [
            (max(start, raw_oldest), end, None) for start, end in parts
        ]
        for rollup in layout.granularities:
            oldest = now - rollup.retention_ms - rollup.partition_width_ms
            ranges += [(max(start, oldest), end, rollup) for start, end in parts]
        for start, end, granularity in ranges:
            if start > end:
                continue
            for tenant, hashes in _by_tenant([key for key in series if _pair(key) not in found]).items():
                held = await self.store.series_with_data(tenant, hashes, start, end, granularity, granularity is None)
                found.update((tenant, hash_) for hash_ in held)
        return found

    async def _roll_up_again(self, series: list[SeriesKey], start_ms: int, end_ms: int) -> None:
        """Mark pending the slots of the range (and the one after it, whose counter increase
        starts from the range's last value) that still hold raw samples or histograms."""
        width = self.layout.slot_width_ms
        start = max(time_slot(start_ms, width), now_ms() - self.store.retentions.widest().raw_retention_ms)
        end = time_slot(end_ms, width) + 2 * width - 1
        if start > end:
            return
        slots = set()
        for key, samples in zip(series, await self.reader.read_raw(series, start, end)):
            for slot in np.unique(samples.timestamps - samples.timestamps % width).tolist():
                slots.add((key.tenant, key.series_set_hash, slot))
        for tenant, hashes in _by_tenant(series).items():
            for hash_, rows in zip(hashes, await self.store.read_histograms(tenant, hashes, start, end)):
                slots.update((tenant, hash_, time_slot(row.timestamp_ms, width)) for row in rows)
        if slots:
            await self.pending.mark(sorted(slots), now_ms())

    async def _unindex(self, series: list[SeriesKey]) -> int:
        """Remove series from every index; index again those that got data meanwhile."""
        if not series:
            return 0
        pairs = {_pair(key) for key in series}
        if self.known is not None:
            self.known.forget(pairs)
        if self.shared_seen is not None:
            await self.shared_seen.forget(sorted(pairs))
        await self.store.delete_series(series)
        came_back = await self._with_data(series, [self._window()])
        if came_back:
            log.info("delete: %d series got new data while they were deleted; indexed again", len(came_back))
            await self.store.write_series([key for key in series if _pair(key) in came_back])
        return len(series) - len(came_back)


def _by_tenant(series: Sequence[SeriesKey]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for key in series:
        found.setdefault(key.tenant, []).append(key.series_set_hash)
    return found


def _pair(key: SeriesKey) -> tuple[str, str]:
    return key.tenant, key.series_set_hash
