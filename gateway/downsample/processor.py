"""Roll up settled series-slots: read the raw slot, aggregate, write each granularity, then mark
the work done (only after the writes succeeded: a crash redoes work, never loses it)."""

import logging
import time

from twisted.internet.defer import DeferredSemaphore, ensureDeferred, gatherResults

from gateway import metrics
from gateway.downsample.aggregate import AGGREGATORS, PROMETHEUS_COUNTER_SUFFIXES, roll_up, series_kind
from gateway.downsample.pending import Work
from gateway.metadata_cache import LRUMap, SeenSeries
from gateway.model import now_ms
from gateway.store import Store
from gateway.store.layout import Layout

log = logging.getLogger(__name__)


class Downsampler:
    def __init__(self, store: Store, pending, layout: Layout, counter_suffixes: tuple[str, ...], concurrency: int = 16):
        self.store = store
        self.pending = pending
        self.layout = layout
        self.counter_suffixes = counter_suffixes
        self._semaphore = DeferredSemaphore(concurrency)
        self._kinds = LRUMap(100_000)
        self._recorded = SeenSeries(100_000, level="aggregators")
        self._round_lag = 0.0
        self._round_settled = 0

    async def run_once(self, partitions: list[int], lock=None) -> int:
        """Process every settled slot of the given partitions, oldest first; returns series-slots done.
        ``lock(partition)`` (competing consumers) is an async context manager or None."""
        done, self._round_lag, self._round_settled = 0, 0.0, 0
        for partition in partitions:
            if lock is None:
                done += await self._partition(partition)
                continue
            async with lock(partition) as acquired:
                if acquired:
                    done += await self._partition(partition)
        metrics.DOWNSAMPLE_LAG.set(self._round_lag)
        metrics.DOWNSAMPLE_SETTLED.set(self._round_settled)
        return done

    async def _partition(self, partition: int) -> int:
        done, now = 0, now_ms()
        settled = await self.pending.settled(partition, now)
        self._round_settled += len(settled)
        if settled:
            settled_at = settled[0].time_slot + self.layout.slot_width_ms + self.pending.delay_ms
            self._round_lag = max(self._round_lag, (now - settled_at) / 1000)
        for work in settled:
            await self._work(work)
            done += len(work.members)
        return done

    async def _work(self, work: Work) -> None:
        started = time.perf_counter()
        jobs = [self._semaphore.run(self._series_slot_deferred, tenant, hash_, work.time_slot) for tenant, hash_ in work.members]
        try:
            await gatherResults(jobs, consumeErrors=True)
        except Exception:
            metrics.DOWNSAMPLE_ERRORS.inc()
            raise
        await self.pending.done(work)
        metrics.DOWNSAMPLED.inc(len(work.members))
        log.debug("rolled up %d series of slot %d (partition %d) in %.3fs", len(work.members), work.time_slot, work.partition, time.perf_counter() - started)

    def _series_slot_deferred(self, tenant: str, series_set_hash: str, slot: int):
        return ensureDeferred(self._series_slot(tenant, series_set_hash, slot))

    async def _series_slot(self, tenant: str, series_set_hash: str, slot: int) -> None:
        found = await self.store.get_series(tenant, [series_set_hash])
        if series_set_hash not in found:
            log.warning("pending series %s of tenant %s has no metadata; skipped", series_set_hash, tenant)
            return
        metric_name = found[series_set_hash].metric_name
        kind = await self._kind(tenant, metric_name)
        width = self.layout.slot_width_ms
        points = await self.store.read_raw(tenant, series_set_hash, slot - width, slot + width - 1)
        before = [value for timestamp, value in points if timestamp < slot and value == value]
        inside = [(timestamp, value) for timestamp, value in points if timestamp >= slot]
        rows = roll_up(tenant, series_set_hash, kind, inside, before[-1] if before else None, self.layout.granularities)
        for granularity in self.layout.granularities:
            await metrics.observe_store("write_rollups", self.store.write_rollups(granularity, rows[granularity.name]))
        if (tenant, metric_name) not in self._recorded:
            await self.store.add_metric_aggregators(tenant, metric_name, AGGREGATORS[kind])
            self._recorded.add_all([(tenant, metric_name)])

    async def _kind(self, tenant: str, metric_name: str) -> str:
        """From remote-write metadata when there is some (the family name drops _total etc.)."""
        key = (tenant, metric_name)
        kind = self._kinds.get(key)
        if kind is None:
            metric_type = None
            family = next((metric_name[: -len(s)] for s in PROMETHEUS_COUNTER_SUFFIXES if metric_name.endswith(s)), None)
            for name in filter(None, (metric_name, family)):
                metadata = await self.store.get_metric_metadata(tenant, name)
                if metadata is not None:
                    metric_type = metadata.type
                    break
            kind = series_kind(metric_name, metric_type, self.counter_suffixes)
            self._kinds.add_all({key: kind})
        return kind
