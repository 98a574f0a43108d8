"""The ingest pipeline every protocol feeds: validate, hash, apply the tenant limits, write
metadata once, write data.

A write is acknowledged (the Deferred fires) only after the store has accepted both the
metadata of new series and every data point. Invalid samples are rejected one by one; the
good samples beside them are still written.
"""

from collections.abc import Awaitable, Sequence
from sys import intern
from typing import NamedTuple, Protocol

from twisted.internet.defer import Deferred

from gateway import metrics
from gateway.limits import TenantLimits
from gateway.metadata_cache import KnownSeries, RedisSeenSeries, SeenSeries
from gateway.model import (
    ExemplarSample,
    HistogramSample,
    InvalidSample,
    Limits,
    Sample,
    SeriesKey,
    now_ms,
    series_set_hash,
    series_set_text,
    validate_point,
    validate_series,
    validate_timestamp,
)
from gateway.store import Store
from gateway.store.contract import ExemplarRow, HistogramRow, MetricMetadata, RawPoint

METRIC_METADATA_REMEMBERED = 100_000


class Rejected(NamedTuple):
    index: int
    field: str
    problem: str
    reason: str


class IngestResult(NamedTuple):
    accepted: int
    rejected: list[Rejected]


class Overloaded(Exception):
    """More samples are in flight than the configured bound: the client should retry later."""


class PendingMarker(Protocol):
    """Where the pipeline marks the series-slots it wrote so that the downsampler rolls them up
    (gateway.downsample.pending.PendingMarks); the pipeline knows nothing of partitions.
    ``delay_ms``: how long after its last touch a slot counts as settled."""

    delay_ms: int

    def mark(self, series_slots: list[tuple[str, str, int]], now_ms: int) -> Awaitable[None]:
        """Mark each (tenant, series-set hash, slot start ms) pending as of ``now_ms``."""


def _compact(key: tuple) -> tuple:
    """A label-set key as the known-series cache keeps it: tenant, metric name and tag names are
    shared by many series, so interned they are stored once (about a quarter of an entry)."""
    tenant, name, labels = key
    half = len(labels) // 2
    return intern(tenant), intern(name), (*map(intern, labels[:half]), *labels[half:])


def _per_tenant(points: list[RawPoint]) -> dict[str, tuple[int, set[str]]]:
    """What TenantLimits.admit weighs: samples and distinct series of each tenant."""
    counts: dict[str, int] = {}
    series: dict[str, set[str]] = {}
    for point in points:
        counts[point.tenant] = counts.get(point.tenant, 0) + 1
        series.setdefault(point.tenant, set()).add(point.series_set_hash)
    return {tenant: (count, series[tenant]) for tenant, count in counts.items()}


class IngestPipeline:
    def __init__(
        self,
        store: Store,
        limits: Limits,
        known: KnownSeries,
        max_inflight_samples: int,
        shared_seen: RedisSeenSeries | None = None,
        clock=now_ms,
        pending: PendingMarker | None = None,
        tenant_limits: TenantLimits | None = None,
        max_metadata_length: int = 1024,
    ):
        self.store = store
        self.limits = limits
        self.tenant_limits = tenant_limits or TenantLimits(0, 0)
        self.known = known
        self.shared_seen = shared_seen
        self.pending = pending
        self.max_metadata_length = max_metadata_length
        self._metadata_seen = SeenSeries(METRIC_METADATA_REMEMBERED, level="prometheus_metadata")
        self._marked: dict[tuple[str, str, int], int] = {}  # (tenant, hash, slot) -> held open until (ms)
        self._swept_slot = 0
        self.max_inflight_samples = max_inflight_samples
        self.clock = clock
        self.inflight_samples = 0
        self._drained: list[Deferred] = []

    def count_rejected(self, protocol: str, reason: str, count: int = 1) -> None:
        """Count samples a protocol decoder refused before they reached the pipeline."""
        metrics.SAMPLES_REJECTED.labels(protocol, reason).inc(count)

    def count_rejected_histograms(self, protocol: str, reason: str) -> None:
        """Count a native histogram a protocol decoder refused (invalid, too many buckets)."""
        metrics.HISTOGRAMS_REJECTED.labels(protocol, reason).inc()

    async def ingest(self, protocol: str, samples: Sequence[Sample]) -> IngestResult:
        """Validate and store samples; rejects carry their index in ``samples``.

        A sample of a series in ``self.known`` only has its timestamp and value checked: its
        name and tags passed validation and its hash was computed when it was first seen."""
        rejected: list[Rejected] = []
        now = self.clock()
        oldest, newest = now - self.limits.max_sample_age_ms, now + self.limits.max_future_ms
        known = self.known
        fresh: dict[tuple, str] = {}
        new_series: dict[tuple[str, str], SeriesKey] = {}
        points: list[RawPoint] = []
        for index, (tenant, name, tags, timestamp, value) in enumerate(samples):
            try:
                try:
                    key = (tenant, name, (*tags.keys(), *tags.values()))
                    hash_ = known.get(key) or fresh.get(key)
                except (AttributeError, TypeError):
                    key = hash_ = None
                if hash_ is None:
                    validate_series(name, tags, self.limits)
                    validate_point(timestamp, value, oldest, newest)
                    hash_ = fresh[_compact(key)] = series_set_hash(series_set_text(name, tags))
                    new_series[(tenant, hash_)] = SeriesKey(tenant, hash_, name, tags)
                else:
                    validate_point(timestamp, value, oldest, newest)
            except InvalidSample as error:
                rejected.append(Rejected(index, error.field, error.problem, error.reason))
                self.count_rejected(protocol, error.reason)
                continue
            points.append(RawPoint(tenant, hash_, timestamp, value))
        if fresh:
            metrics.METADATA_CACHE.labels("memory", "miss").inc(len(fresh))
        if points:
            if self.tenant_limits.enabled:
                self.tenant_limits.admit(_per_tenant(points))
            metrics.METADATA_CACHE.labels("memory", "hit").inc(len(points) - len(fresh))
            await self._write(new_series, points)
            known.add_all(fresh)
            metrics.SAMPLES_ACCEPTED.labels(protocol).inc(len(points))
        return IngestResult(len(points), rejected)

    async def ingest_exemplars(self, protocol: str, exemplars: Sequence[ExemplarSample]) -> IngestResult:
        """Validate and store exemplars (values are floats by construction: the decoder's doubles)."""
        return await self._ingest_attached(
            protocol,
            exemplars,
            lambda e, hash_: ExemplarRow(e.tenant, hash_, e.timestamp_ms, e.value, e.labels),
            "write_exemplars",
            self.store.write_exemplars,
            metrics.EXEMPLARS_ACCEPTED,
            metrics.EXEMPLARS_REJECTED,
        )

    async def ingest_histograms(self, protocol: str, histograms: Sequence[HistogramSample]) -> IngestResult:
        """Validate and store native histogram samples (their bytes were checked by the decoder);
        their series-slots are marked pending, as samples', for the downsampler to roll them up."""
        return await self._ingest_attached(
            protocol,
            histograms,
            lambda h, hash_: HistogramRow(h.tenant, hash_, h.timestamp_ms, h.data),
            "write_histograms",
            self.store.write_histograms,
            metrics.HISTOGRAMS_ACCEPTED,
            metrics.HISTOGRAMS_REJECTED,
            rolled_up=True,
        )

    async def _ingest_attached(
        self, protocol, items, make_row, operation, write, accepted, rejected_metric, rolled_up=False
    ) -> IngestResult:
        """Store what belongs to a series but is not a float sample (exemplars, histograms) as
        samples are: the series checked, the timestamp in the accepted window, the series'
        metadata written first, the series-slots marked pending when ``rolled_up``; rejects carry
        their index. Called after ``ingest`` of the same request, the series of its samples are
        known by then."""
        rejected: list[Rejected] = []
        now = self.clock()
        oldest, newest = now - self.limits.max_sample_age_ms, now + self.limits.max_future_ms
        fresh: dict[tuple, str] = {}
        new_series: dict[tuple[str, str], SeriesKey] = {}
        rows = []
        for index, item in enumerate(items):
            tenant, name, tags = item.tenant, item.metric_name, item.tags
            key = _compact((tenant, name, (*tags.keys(), *tags.values())))
            try:
                hash_ = self.known.get(key) or fresh.get(key)
                if hash_ is None:
                    validate_series(name, tags, self.limits)
                    hash_ = fresh[key] = series_set_hash(series_set_text(name, tags))
                    new_series[(tenant, hash_)] = SeriesKey(tenant, hash_, name, tags)
                validate_timestamp(item.timestamp_ms, oldest, newest)
            except InvalidSample as error:
                rejected.append(Rejected(index, error.field, error.problem, error.reason))
                rejected_metric.labels(protocol, error.reason).inc()
                continue
            rows.append(make_row(item, hash_))
        if rows:
            if new_series:
                await self._write_metadata(new_series)
            await metrics.observe_store(operation, write(rows))
            if rolled_up and self.pending is not None:
                await self._mark_pending(rows)
            self.known.add_all(fresh)
            accepted.labels(protocol).inc(len(rows))
        return IngestResult(len(rows), rejected)

    async def register_series(
        self, protocol: str, series: Sequence[tuple[str, str, dict[str, str]]]
    ) -> tuple[list[SeriesKey], list[Rejected]]:
        """Index (tenant, metric name, tags) series without data (Graphite's tagSeries) as their
        first sample would: validated, counted against the tenant's active series, metadata
        written once. Returns the keys of the accepted series in order, and the rejects with
        their index in ``series``."""
        rejected: list[Rejected] = []
        accepted: list[SeriesKey] = []
        fresh: dict[tuple, str] = {}
        new_series: dict[tuple[str, str], SeriesKey] = {}
        for index, (tenant, name, tags) in enumerate(series):
            try:
                validate_series(name, tags, self.limits)
            except InvalidSample as error:
                rejected.append(Rejected(index, error.field, error.problem, error.reason))
                self.count_rejected(protocol, error.reason)
                continue
            key = _compact((tenant, name, (*tags.keys(), *tags.values())))
            hash_ = self.known.get(key) or fresh.get(key)
            if hash_ is None:
                hash_ = fresh[key] = series_set_hash(series_set_text(name, tags))
                new_series[(tenant, hash_)] = SeriesKey(tenant, hash_, name, tags)
            accepted.append(SeriesKey(tenant, hash_, name, tags))
        if accepted:
            if self.tenant_limits.enabled:
                per_tenant: dict[str, set[str]] = {}
                for key in accepted:
                    per_tenant.setdefault(key.tenant, set()).add(key.series_set_hash)
                self.tenant_limits.admit({tenant: (0, hashes) for tenant, hashes in per_tenant.items()})
            if new_series:
                await self._write_metadata(new_series)
            self.known.add_all(fresh)
        return accepted, rejected

    async def ingest_metric_metadata(self, rows: Sequence[MetricMetadata]) -> None:
        """Keep the type, help and unit of metrics, each change written once. A row longer than
        ``max_metadata_length`` is skipped and counted (as Mimir does); the others are kept."""
        kept = [
            row for row in rows if max(len(row.metric_name), len(row.help), len(row.unit)) <= self.max_metadata_length
        ]
        if len(kept) < len(rows):
            metrics.PROMETHEUS_SKIPPED.labels("metadata_too_long").inc(len(rows) - len(kept))
        fresh = {row: None for row in kept if row not in self._metadata_seen}
        if fresh:
            await metrics.observe_store("write_metric_metadata", self.store.write_metric_metadata(list(fresh)))
            self._metadata_seen.add_all(fresh)

    async def _write(self, new_series: dict[tuple[str, str], SeriesKey], points: list[RawPoint]) -> None:
        if self.inflight_samples and self.inflight_samples + len(points) > self.max_inflight_samples:
            raise Overloaded(f"{self.inflight_samples} samples are already waiting for the store")
        self.inflight_samples += len(points)
        metrics.INGEST_INFLIGHT.set(self.inflight_samples)
        try:
            if new_series:
                await self._write_metadata(new_series)
            await metrics.observe_store("write_raw", self.store.write_raw(points))
            if self.pending is not None:
                await self._mark_pending(points)
        finally:
            self.inflight_samples -= len(points)
            metrics.INGEST_INFLIGHT.set(self.inflight_samples)
            if not self.inflight_samples:
                waiting, self._drained = self._drained, []
                for deferred in waiting:
                    deferred.callback(None)

    async def _write_metadata(self, candidates: dict[tuple[str, str], SeriesKey]) -> None:
        """Metadata before data, so whatever data is acknowledged is always findable."""
        unseen = list(candidates)
        if self.shared_seen is not None:
            unseen = await self.shared_seen.unseen(unseen)
        if unseen:
            await metrics.observe_store("write_series", self.store.write_series([candidates[key] for key in unseen]))
            metrics.SERIES_CREATED.inc(len(unseen))
            if self.shared_seen is not None:
                await self.shared_seen.mark(unseen)

    async def _mark_pending(self, points: Sequence[RawPoint | HistogramRow]) -> None:
        """Once per distinct series and slot of the batch, before the write is acknowledged, unless
        an earlier mark of this process still holds that slot open.

        A mark made at time m holds slot s open until max(end of s, m) + delay: neither tracker
        calls a slot settled before both its end and its last touch are ``delay`` old. A later
        write before that moment, less half the delay (a margin for clock skew between this
        process and the downsampler, and for the roll-up's own run), needs no mark: the roll-up
        reads it with the rest. So a steady stream marks once per series and slot, and a backfill
        of a past slot once per series every half delay instead of on every write."""
        width = self.store.slot_width_ms
        now = self.clock()
        marked = self._marked
        keys = {(p.tenant, p.series_set_hash, p.timestamp_ms - p.timestamp_ms % width) for p in points}
        keys = [key for key in keys if marked.get(key, 0) <= now]
        if not keys:
            return
        await self.pending.mark(keys, now)
        metrics.DOWNSAMPLE_PENDING_MARKS.inc(len(keys))
        if len(marked) + len(keys) > self.known.max_entries or now // width != self._swept_slot:
            self._marked = marked = {key: until for key, until in marked.items() if until > now}
            self._swept_slot = now // width
        if len(marked) + len(keys) <= self.known.max_entries:
            margin = self.pending.delay_ms // 2
            for key in keys:
                marked[key] = max(key[2] + width, now) + margin

    def drain(self) -> Deferred:
        """Fire once nothing is in flight (used at shutdown, after listeners stopped)."""
        deferred = Deferred()
        if self.inflight_samples:
            self._drained.append(deferred)
        else:
            deferred.callback(None)
        return deferred
