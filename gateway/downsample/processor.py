"""Seal and roll up settled series-slots: merge the slot's head rows into its block, write the
block, then the roll-ups of every granularity computed from the merged samples and from the
slot's native histograms (gateway/downsample/histograms.py), then mark the
work done (only after the writes succeeded: a crash redoes work, never loses it; sealing the same
samples twice writes the same block). The raw block is written first, so it never depends on a
roll-up; a series-slot that fails either way is isolated (gateway/downsample/failures.py): the
rest of its slot and of the round go on, and it stays pending for a retry."""

import logging
import time

import numpy as np
from twisted.internet import threads
from twisted.internet.defer import DeferredSemaphore, ensureDeferred, gatherResults

from gateway import metrics
from gateway.downsample.aggregate import (
    AGGREGATORS,
    CUMULATIVE_COUNTER,
    PROMETHEUS_COUNTER_SUFFIXES,
    roll_up,
    series_kind,
)
from gateway.downsample.failures import RollUpFailed, SlotFailures
from gateway.downsample.histograms import roll_up_histograms
from gateway.downsample.pending import Work
from gateway.metadata_cache import LRUMap, SeenSeries
from gateway.model import SeriesKey, now_ms
from gateway.read_path import ReadPath, stitch_raw
from gateway.samples import Samples
from gateway.store import Store
from gateway.store.blocks import encode_block
from gateway.store.layout import Layout

log = logging.getLogger(__name__)


class Downsampler:
    def __init__(
        self,
        store: Store,
        pending,
        layout: Layout,
        counter_suffixes: tuple[str, ...],
        concurrency: int = 16,
        clock=now_ms,
    ):
        self.store = store
        self.clock = clock  # the time rounds, retries and near expiry are judged by
        self.pending = pending
        self.layout = layout
        self.counter_suffixes = counter_suffixes
        self.reader = ReadPath(store)
        self._semaphore = DeferredSemaphore(concurrency)
        self._kinds = LRUMap(100_000)
        self._series = LRUMap(100_000)  # (tenant, hash) -> SeriesKey: a series' name and tags never change
        self._recorded = SeenSeries(100_000, level="aggregators")
        self._round_lag = 0.0
        self._swept_at: int | None = None
        self._round_settled = 0
        self.failures = SlotFailures(layout)
        self.round_failed = 0  # series-slots whose attempt failed in the last round

    async def run_once(self, partitions: list[int], lock=None) -> int:
        """Process every settled slot of the given partitions, oldest first; returns series-slots done.
        ``lock(partition)`` (competing consumers) is an async context manager or None."""
        done, self._round_lag, self._round_settled, self.round_failed = 0, 0.0, 0, 0
        for partition in partitions:
            if lock is None:
                done += await self._partition(partition)
                continue
            async with lock(partition) as acquired:
                if acquired:
                    done += await self._partition(partition)
        metrics.DOWNSAMPLE_LAG.set(self._round_lag)
        metrics.DOWNSAMPLE_SETTLED.set(self._round_settled)
        metrics.DOWNSAMPLE_NEAR_EXPIRY.set(self.failures.near_expiry(self.clock()))
        await self._sweep()
        return done

    async def _sweep(self) -> None:
        """Drop data past its retention, at most once a slot (a no-op on Cassandra, whose TTLs do it)."""
        now = now_ms()
        if self._swept_at is None or now - self._swept_at >= self.layout.slot_width_ms:
            self._swept_at = now
            await metrics.observe_store("sweep", self.store.sweep(now))

    async def _partition(self, partition: int) -> int:
        done, now = 0, self.clock()
        settled = await self.pending.settled(partition, now)
        self._round_settled += len(settled)
        if settled:
            settled_at = settled[0].time_slot + self.layout.slot_width_ms + self.pending.delay_ms
            self._round_lag = max(self._round_lag, (now - settled_at) / 1000)
        for work in settled:
            done += await self._work(work)
        return done

    async def _work(self, work: Work) -> int:
        """Every member of the work that is due (not waiting out a failure's backoff); the
        failed and the waiting stay pending. Returns the series-slots done."""
        started, now = time.perf_counter(), self.clock()
        due = [(t, h) for t, h in work.members if self.failures.due(t, h, work.time_slot, now)]
        jobs = [self._semaphore.run(self._series_slot_job, tenant, hash_, work.time_slot) for tenant, hash_ in due]
        finished = {member for member, ok in zip(due, await gatherResults(jobs)) if ok}
        left = {member for member in work.members if member not in finished}
        if len(finished) < len(due):
            metrics.DOWNSAMPLE_ERRORS.inc()
        await self.pending.done(work, left)
        metrics.DOWNSAMPLED.inc(len(finished))
        log.debug(
            "rolled up %d series of slot %d (partition %d) in %.3fs, %d left for a retry",
            len(finished),
            work.time_slot,
            work.partition,
            time.perf_counter() - started,
            len(left),
        )
        return len(finished)

    def _series_slot_job(self, tenant: str, series_set_hash: str, slot: int):
        return ensureDeferred(self._isolated(tenant, series_set_hash, slot))

    async def _isolated(self, tenant: str, series_set_hash: str, slot: int) -> bool:
        """roll_up_series_slot, a failure of which (any exception) is counted, logged and kept for
        a retry with backoff instead of stopping the round; True when done."""
        try:
            await self.roll_up_series_slot(tenant, series_set_hash, slot)
        except Exception as error:
            self.failures.failed(tenant, series_set_hash, slot, error, self.clock())
            self.round_failed += 1
            return False
        self.failures.succeeded(tenant, series_set_hash, slot)
        return True

    async def roll_up_series_slot(self, tenant: str, series_set_hash: str, slot: int) -> None:
        """Seal one series-slot into its block and write its roll-ups (idempotent)."""
        key = self._series.get((tenant, series_set_hash))
        if key is None:
            found = await self.store.get_series(tenant, [series_set_hash])
            if series_set_hash not in found:
                log.warning("pending series %s of tenant %s has no metadata; skipped", series_set_hash, tenant)
                return
            key = found[series_set_hash]
            self._series.add_all({(tenant, series_set_hash): key})
        merged = await self._seal(tenant, series_set_hash, slot)
        try:
            await self._roll_up(key, merged, slot)
        except Exception as error:
            raise RollUpFailed(f"{type(error).__name__}: {error}") from error

    async def _roll_up(self, key: SeriesKey, merged: Samples, slot: int) -> None:
        """The roll-ups of a sealed series-slot: its samples', then its native histograms'."""
        tenant, series_set_hash = key.tenant, key.series_set_hash
        kind = await self._kind(tenant, key.metric_name)
        previous = await self._previous_value(key, slot) if kind == CUMULATIVE_COUNTER else None
        rows = roll_up(tenant, series_set_hash, kind, merged, previous, self.layout.granularities)
        await gatherResults(
            [
                metrics.observe_store("write_rollups", self.store.write_rollups(g, rows[g.name]))
                for g in self.layout.granularities
            ],
            consumeErrors=True,
        )
        await self._roll_up_histograms(tenant, series_set_hash, slot)
        if (tenant, key.metric_name) not in self._recorded:
            await self.store.add_metric_aggregators(tenant, key.metric_name, AGGREGATORS[kind])
            self._recorded.add_all([(tenant, key.metric_name)])

    async def _roll_up_histograms(self, tenant: str, series_set_hash: str, slot: int) -> None:
        """The slot's native histograms into every granularity; the last one of the slot before
        tells whether the slot starts with a counter reset."""
        width = self.layout.slot_width_ms
        (found,) = await self.store.read_histograms(tenant, [series_set_hash], slot, slot + width - 1)
        if not found:
            return
        (before,) = await self.store.read_histograms(tenant, [series_set_hash], slot - width, slot - 1)
        rows = await threads.deferToThread(
            roll_up_histograms, found, before[-1] if before else None, self.layout.granularities
        )
        await gatherResults(
            [
                metrics.observe_store("write_histogram_rollups", self.store.write_histogram_rollups(g, rows[g.name]))
                for g in self.layout.granularities
            ],
            consumeErrors=True,
        )

    async def _previous_value(self, key, slot: int) -> float | None:
        """The last value before the slot (in the slot before it), which a counter's first increase starts from."""
        (before,) = await self.reader.read_raw([key], slot - self.layout.slot_width_ms, slot - 1)
        numbers = before.values[~np.isnan(before.values)]
        return float(numbers[-1]) if len(numbers) else None

    async def _seal(self, tenant: str, series_set_hash: str, slot: int) -> Samples:
        """The slot's block merged with its head rows (the head wins), written back when the head
        had anything; returns the merged samples."""
        head_read = now_ms()
        (found,) = await self.store.read_raw(tenant, [series_set_hash], slot, slot + self.layout.slot_width_ms - 1)
        merged = stitch_raw(found, slot, slot + self.layout.slot_width_ms - 1)
        if len(found.head):
            block = encode_block(merged.timestamps, merged.values)
            await metrics.observe_store(
                "write_block", self.store.write_block(tenant, series_set_hash, slot, block, found.head, head_read)
            )
            metrics.SEALED_SAMPLES.inc(len(merged))
        return merged

    async def _kind(self, tenant: str, metric_name: str) -> str:
        """From remote-write metadata when there is some (the family name drops _total etc.)."""
        key = (tenant, metric_name)
        kind = self._kinds.get(key)
        if kind is None:
            metric_type = None
            family = next(
                (metric_name[: -len(s)] for s in PROMETHEUS_COUNTER_SUFFIXES if metric_name.endswith(s)), None
            )
            for name in filter(None, (metric_name, family)):
                metadata = await self.store.get_metric_metadata(tenant, name)
                if metadata is not None:
                    metric_type = metadata.type
                    break
            kind = series_kind(metric_name, metric_type, self.counter_suffixes)
            self._kinds.add_all({key: kind})
        return kind
