"""Seal and roll up settled series-slots, up to the store's ``seal_group`` of a tenant together
(each step one store call for all): merge the slot's head rows into its block, write the block,
then the roll-ups of every granularity computed from the merged samples and from the slot's
native histograms (gateway/downsample/histograms.py), then mark the work done (only after the
writes succeeded: a crash redoes work, never loses it; sealing the same samples twice writes the
same block). The raw block is written first, so it never depends on a roll-up; a series-slot
that fails either way is isolated (gateway/downsample/failures.py): its group is done again one
series-slot at a time, the rest of its slot and of the round go on, and it stays pending for a
retry."""

import contextlib
import logging
import time
from collections import defaultdict

import numpy as np
from twisted.internet import threads
from twisted.internet.defer import DeferredSemaphore, ensureDeferred, gatherResults

from gateway.core import metrics
from gateway.core.caches import LRUMap
from gateway.core.cooperative import Slices
from gateway.core.layout import Layout, head_shard
from gateway.core.model import SeriesKey, now_ms
from gateway.core.samples import Samples
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
from gateway.ingest.metadata_cache import SeenSeries
from gateway.store import Store
from gateway.store.blocks import encode_block
from gateway.store.contract import SealedBlock
from gateway.store.read_path import ReadPath, stitch_raw

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
        """Process every settled slot of the given partitions, oldest first, the store's
        ``seal_partitions_together`` partitions at a time (all if None; a partition holds 1/64 of
        the series by default, too few for full groups); returns series-slots done. ``lock(partition)`` (competing
        consumers) is an async context manager or None; the locks of the partitions processed
        together are held together."""
        done, self._round_lag, self._round_settled, self.round_failed = 0, 0.0, 0, 0
        together = self.store.seal_partitions_together or max(len(partitions), 1)
        for i in range(0, len(partitions), together):
            async with contextlib.AsyncExitStack() as held:
                mine = []
                for partition in partitions[i : i + together]:
                    if lock is None or await held.enter_async_context(lock(partition)):
                        mine.append(partition)
                done += await self._partitions(mine)
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
            await self.store.sweep(now)

    async def _partitions(self, partitions: list[int]) -> int:
        """The settled work of these partitions, slot by slot, oldest first; the work of one slot
        is sealed together (_works)."""
        now, by_slot = self.clock(), defaultdict(list)
        for partition in partitions:
            settled = await self.pending.settled(partition, now)
            self._round_settled += len(settled)
            if settled:
                settled_at = settled[0].time_slot + self.layout.slot_width_ms + self.pending.delay_ms
                self._round_lag = max(self._round_lag, (now - settled_at) / 1000)
            for work in settled:
                by_slot[work.time_slot].append(work)
        done = 0
        for slot in sorted(by_slot):
            done += await self._works(slot, by_slot[slot])
        return done

    async def _works(self, slot: int, works: list[Work]) -> int:
        """Every member of the works (of one slot) that is due (not waiting out a failure's
        backoff), up to the store's ``seal_group`` series of a tenant and head shard at a time (so
        that a group's head rows are one request on Cassandra: its shard's slices of the slot);
        the failed and the waiting stay pending. Returns the series-slots done."""
        started, now, by_shard = time.perf_counter(), self.clock(), self.store.seal_by_head_shard
        size = self.store.seal_group
        due: dict[tuple[str, int], list[str]] = defaultdict(list)
        for work in works:
            for tenant, hash_ in work.members:
                if self.failures.due(tenant, hash_, slot, now):
                    due[(tenant, head_shard(hash_) if by_shard else 0)].append(hash_)
        groups = [
            (tenant, hashes[i : i + size])
            for (tenant, _), hashes in ((key, sorted(hashes)) for key, hashes in due.items())
            for i in range(0, len(hashes), size)
        ]
        jobs = [self._semaphore.run(self._group_job, tenant, hashes, slot) for tenant, hashes in groups]
        outcome = {
            (tenant, hash_): ok
            for (tenant, hashes), done in zip(groups, await gatherResults(jobs))
            for hash_, ok in zip(hashes, done)
        }
        finished, marks = 0, []
        for work in works:
            left = {member for member in work.members if not outcome.get(member)}
            if any(outcome.get(member) is False for member in work.members):
                metrics.DOWNSAMPLE_ERRORS.inc()
            marks.append(ensureDeferred(self.pending.done(work, left)))
            finished += len(work.members) - len(left)
        await gatherResults(marks, consumeErrors=True)
        metrics.DOWNSAMPLED.inc(finished)
        log.debug(
            "rolled up %d series of slot %d (%d partitions) in %.3fs, %d left for a retry",
            finished,
            slot,
            len(works),
            time.perf_counter() - started,
            sum(len(work.members) for work in works) - finished,
        )
        return finished

    def _group_job(self, tenant: str, hashes: list[str], slot: int):
        return ensureDeferred(self._group(tenant, hashes, slot))

    async def _group(self, tenant: str, hashes: list[str], slot: int) -> list[bool]:
        """The series-slots of a group together (few store requests for all); if that fails,
        each alone (side by side: in a store outage each waits out its own timeout), so that a
        bad series-slot fails only itself. One bool (done) a series."""
        if len(hashes) > 1:
            try:
                await self.roll_up_series_slots(tenant, hashes, slot)
            except Exception as error:
                log.debug("a group of %d series-slots failed (%s); each is tried alone", len(hashes), error)
            else:
                for hash_ in hashes:
                    self.failures.succeeded(tenant, hash_, slot)
                return [True] * len(hashes)
        return await gatherResults([ensureDeferred(self._isolated(tenant, hash_, slot)) for hash_ in hashes])

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

    def roll_up_series_slot(self, tenant: str, series_set_hash: str, slot: int):
        """Seal one series-slot into its block and write its roll-ups (idempotent)."""
        return ensureDeferred(self.roll_up_series_slots(tenant, [series_set_hash], slot))

    async def roll_up_series_slots(self, tenant: str, hashes: list[str], slot: int) -> None:
        """Seal series-slots of a tenant into their blocks and write their roll-ups (idempotent),
        each step one store call for all of them."""
        keys = await self._keys(tenant, hashes)
        merged = await self._seal(tenant, keys, slot)
        try:
            await self._roll_up(tenant, keys, merged, slot)
        except Exception as error:
            raise RollUpFailed(f"{type(error).__name__}: {error}") from error

    async def _keys(self, tenant: str, hashes: list[str]) -> list[SeriesKey]:
        """The SeriesKey of each series (remembered: a series' name and tags never change); a
        series without metadata is skipped with a warning."""
        missing = [h for h in hashes if self._series.get((tenant, h)) is None]
        if missing:
            found = await self.store.get_series(tenant, missing)
            for hash_ in missing:
                if hash_ not in found:
                    log.warning("pending series %s of tenant %s has no metadata; skipped", hash_, tenant)
            self._series.add_all({(tenant, h): key for h, key in found.items()})
        return [key for key in (self._series.get((tenant, h)) for h in hashes) if key is not None]

    async def _roll_up(self, tenant: str, keys: list[SeriesKey], merged: list[Samples], slot: int) -> None:
        """The roll-ups of sealed series-slots: their samples', then their native histograms'."""
        kinds = [await self._kind(tenant, key.metric_name) for key in keys]
        counters = [key for key, kind in zip(keys, kinds) if kind == CUMULATIVE_COUNTER]
        previous = await self._previous_values(counters, slot)
        rows: dict[str, list] = {g.name: [] for g in self.layout.granularities}
        slices = Slices()
        for key, kind, series in zip(keys, kinds, merged):
            found = roll_up(
                tenant, key.series_set_hash, kind, series, previous.get(key.series_set_hash), self.layout.granularities
            )
            for name, granularity_rows in found.items():
                rows[name] += granularity_rows
            if slices.due():
                await slices.pause()
        await gatherResults(
            [self.store.write_rollups(g, rows[g.name]) for g in self.layout.granularities],
            consumeErrors=True,
        )
        await self._roll_up_histograms(tenant, [key.series_set_hash for key in keys], slot)
        for kind, metric_name in sorted({(kind, key.metric_name) for key, kind in zip(keys, kinds)}):
            if (tenant, metric_name) not in self._recorded:
                await self.store.add_metric_aggregators(tenant, metric_name, AGGREGATORS[kind])
                self._recorded.add_all([(tenant, metric_name)])

    async def _roll_up_histograms(self, tenant: str, hashes: list[str], slot: int) -> None:
        """The slot's native histograms into every granularity; the last one of the slot before
        tells whether the slot starts with a counter reset."""
        width = self.layout.slot_width_ms
        found = [
            (h, rows)
            for h, rows in zip(hashes, await self.store.read_histograms(tenant, hashes, slot, slot + width - 1))
            if rows
        ]
        if not found:
            return
        before = await self.store.read_histograms(tenant, [h for h, _ in found], slot - width, slot - 1)
        rows: dict[str, list] = {g.name: [] for g in self.layout.granularities}
        for (_, histograms), earlier in zip(found, before):
            rolled = await threads.deferToThread(
                roll_up_histograms, histograms, earlier[-1] if earlier else None, self.layout.granularities
            )
            for name, granularity_rows in rolled.items():
                rows[name] += granularity_rows
        await gatherResults(
            [self.store.write_histogram_rollups(g, rows[g.name]) for g in self.layout.granularities],
            consumeErrors=True,
        )

    async def _previous_values(self, keys: list[SeriesKey], slot: int) -> dict[str, float]:
        """The last value before the slot (in the slot before it) of each series that has one,
        which a counter's first increase starts from."""
        if not keys:
            return {}
        found = await self.reader.read_raw(keys, slot - self.layout.slot_width_ms, slot - 1)
        previous = {}
        for key, before in zip(keys, found):
            numbers = before.values[~np.isnan(before.values)]
            if len(numbers):
                previous[key.series_set_hash] = float(numbers[-1])
        return previous

    async def _seal(self, tenant: str, keys: list[SeriesKey], slot: int) -> list[Samples]:
        """Each slot's block merged with its head rows (the head wins), written back where the
        head had anything (one write_blocks); returns the merged samples. Merging and encoding
        run in a thread: pcodec's compression, a quarter of a seal's time, leaves the reactor free
        (and the GIL: the roll-ups of other groups run beside it)."""
        head_read, end = now_ms(), slot + self.layout.slot_width_ms - 1
        found = await self.store.read_raw(tenant, [key.series_set_hash for key in keys], slot, end)

        def merge_and_encode() -> tuple[list[Samples], list[bytes | None]]:
            merged = [stitch_raw(raw, slot, end) for raw in found]
            encoded = [encode_block(*series) if len(raw.head) else None for raw, series in zip(found, merged)]
            return merged, encoded

        merged, encoded = await threads.deferToThread(merge_and_encode)
        blocks = [
            SealedBlock(tenant, key.series_set_hash, slot, block, raw.head, head_read, raw.head_keys)
            for key, raw, block in zip(keys, found, encoded)
            if block is not None
        ]
        if blocks:
            await self.store.write_blocks(blocks)
            metrics.SEALED_SAMPLES.inc(sum(len(series) for raw, series in zip(found, merged) if len(raw.head)))
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
