"""The ingest pipeline every protocol feeds: validate, hash, apply the tenant limits, write
metadata once, write data.

Every kind of data (samples, native histograms, exemplars, created timestamps, series without
data) takes the same loop, IngestPipeline._admit_and_write: the same validation, tenant limits
and bound on writes in flight. A write is acknowledged (the Deferred fires) only after the store
has accepted both the metadata of new series and every row. Invalid items, and those of new
series over the tenant's active-series limit, are rejected one by one; the good ones beside
them are still written.
"""

import collections
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from itertools import compress, repeat
from operator import itemgetter
from sys import intern
from typing import Any, NamedTuple, Protocol, cast

import numpy as np
from prometheus_client import Counter
from twisted.internet.defer import Deferred, gatherResults

from gateway.core import metrics
from gateway.core.caches import SlotHolds
from gateway.core.cooperative import CHECK_EVERY, Slices
from gateway.core.errors import StoreBusy
from gateway.core.layout import INDEX_BUCKET_MS
from gateway.core.model import (
    ExemplarSample,
    HistogramSample,
    InvalidSample,
    Limits,
    Sample,
    SeriesKey,
    SeriesSamples,
    now_ms,
    series_set_hash,
    series_set_text,
    validate_point,
    validate_series,
    validate_timestamp,
)
from gateway.core.tenant_activity import TenantActivity
from gateway.ingest.limits import TenantLimits
from gateway.ingest.metadata_cache import KnownSeries, RedisSeenSeries, SeenSeries
from gateway.store import Store
from gateway.store.contract import (
    CreatedTimestamp,
    ExemplarRow,
    HistogramRow,
    MetricMetadata,
    RawColumns,
    RawPoint,
    hashes_by_slot,
)

METRIC_METADATA_REMEMBERED = 100_000
# Rows of one store call: a store prepares them on the reactor thread, so a large batch is cut.
ROWS_PER_STORE_CALL = 5000
# Series looked up, or rows built, at once from arrays (ingest_arrays): a few ms.
ROWS_PER_STEP = 4096
# The bound on rows in flight never goes below this, however slow the store has been.
MIN_INFLIGHT_BOUND = 20_000
# The reason counted (tsgate_samples_rejected) for items of new series over --tenant-max-active-series.
ACTIVE_SERIES_LIMITED = "max_active_series"
# A series with samples in the last PRE_INDEX_MS of a time-index bucket is indexed in the next
# bucket from a moment of that stretch its hash picks, so that a boundary is no burst of index
# writes (docs/storage.rst): a quarter of the bucket, so that few series that stop in a bucket are
# indexed in the next one.
PRE_INDEX_MS = INDEX_BUCKET_MS // 4
_BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
# How early, by the first character of its hash, a series is indexed in the next bucket.
_PRE_INDEX_LEAD = {char: PRE_INDEX_MS * (index + 1) // len(_BASE64) for index, char in enumerate(_BASE64)}


class Rejected(NamedTuple):
    index: int  # type: ignore[assignment]  # the item's index in its batch, shadowing tuple.index
    field: str
    problem: str
    reason: str


class IngestResult(NamedTuple):
    accepted: int
    rejected: list[Rejected]


class CreatedSample(NamedTuple):
    """A created timestamp of the series (tenant, metric_name, tags), as the pipeline takes it."""

    tenant: str
    metric_name: str
    tags: dict[str, str]
    created_ms: int


class Overloaded(StoreBusy):
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


class _Kind(NamedTuple):
    """What the one admission loop (IngestPipeline._admit_and_write) needs to know of a kind of
    data: how an item's own fields are checked beside its series', the row it becomes, the
    store call writing rows, its metrics, whether its series-slots are rolled up (marked
    pending), and whether it counts as a sample against the tenant's rate."""

    check: Callable[[Any, int, int], None] | None
    row: Callable[[Any, str], object]
    operation: str
    accepted: Counter | None
    rejected: Counter
    rolled_up: bool
    counted: bool
    # Which bucket its series are indexed in (the time index): its rows' timestamps ("rows"), current
    # ("now"), or none (created timestamps: their series are indexed by their samples).
    indexed_by: str = "rows"


def _check_sample(sample, oldest: int, newest: int) -> None:
    validate_point(sample[3], sample[4], oldest, newest)


def _check_timestamp(item, oldest: int, newest: int) -> None:
    validate_timestamp(item[3], oldest, newest)


_SAMPLES = _Kind(
    _check_sample,
    lambda s, hash_: RawPoint(s[0], hash_, s[3], s[4]),
    "write_raw",
    metrics.SAMPLES_ACCEPTED,
    metrics.SAMPLES_REJECTED,
    rolled_up=True,
    counted=True,
)
_HISTOGRAMS = _Kind(
    _check_timestamp,
    lambda h, hash_: HistogramRow(h.tenant, hash_, h.timestamp_ms, h.data),
    "write_histograms",
    metrics.HISTOGRAMS_ACCEPTED,
    metrics.HISTOGRAMS_REJECTED,
    rolled_up=True,
    counted=True,
)
_EXEMPLARS = _Kind(
    _check_timestamp,
    lambda e, hash_: ExemplarRow(e.tenant, hash_, e.timestamp_ms, e.value, e.labels),
    "write_exemplars",
    metrics.EXEMPLARS_ACCEPTED,
    metrics.EXEMPLARS_REJECTED,
    rolled_up=False,
    counted=True,
)
# Series without data (Graphite's tagSeries): indexed, counted as active series, no rows.
_SERIES = _Kind(
    None,
    lambda s, hash_: SeriesKey(s[0], hash_, s[1], s[2]),
    "",
    None,
    metrics.SAMPLES_REJECTED,
    rolled_up=False,
    counted=False,
    indexed_by="now",
)
# The created timestamps of remote write 2.0 series (gateway/ingest/created.py), checked there.
_CREATED = _Kind(
    None,
    lambda c, hash_: CreatedTimestamp(c[0], hash_, c[3]),
    "write_created_timestamps",
    None,
    metrics.SAMPLES_REJECTED,
    rolled_up=False,
    counted=False,
    indexed_by="",
)


def _window_error(timestamp: int, oldest: int, newest: int) -> InvalidSample:
    """The reject of a timestamp outside the accepted window, in validate_timestamp's words."""
    try:
        validate_timestamp(timestamp, oldest, newest)
    except InvalidSample as error:
        return error
    raise ValueError(f"{timestamp} is inside the window")


class _Owners(Sequence[tuple[str, str, int]]):
    """(tenant, hash, index in the batch) of each row of samples of one tenant given as arrays,
    held as their columns (no tuple a row unless asked for)."""

    def __init__(self, tenant: str, hashes: list[str], positions: Sequence[int]):
        self.tenant = tenant
        self.hashes = hashes
        self.positions = positions

    def __len__(self) -> int:
        return len(self.hashes)

    def __iter__(self) -> Iterator[tuple[str, str, int]]:
        return zip(repeat(self.tenant), self.hashes, self.positions)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return list(zip(repeat(self.tenant), self.hashes[index], self.positions[index]))
        return self.tenant, self.hashes[index], self.positions[index]


class _Admitted(NamedTuple):
    """A batch once resolved and admitted: its rows (with their series' tenant and hash), the
    series to index first, the cache entries to keep once written, and the rejects."""

    rows: Sequence
    series: Sequence[tuple[str, str, int]]  # (tenant, hash, index in the batch) of each row
    new_series: dict[tuple[str, str], SeriesKey]
    fresh: dict[tuple, str]
    rejected: list[Rejected]


class StoreRate:
    """Rows the store took per second while it was busy: measured over windows of ``window_s``
    during which writes were under way all the time (an idle moment voids the window). The
    highest recent figure is kept, forgotten by ``decay`` a window: a bound derived from it then
    limits what it measures only slowly (a bound that followed the last figure would shrink
    itself to its floor). None until a first busy window ends."""

    def __init__(self, window_s: float = 1.0, decay: float = 0.9, clock=time.monotonic):
        self.window_s = window_s
        self.decay = decay
        self.clock = clock
        self.rate: float | None = None
        self._window_start: float | None = None
        self._stored = 0

    def busy(self) -> None:
        """A write starts."""
        if self._window_start is None:
            self._window_start, self._stored = self.clock(), 0

    def stored(self, rows: int, still_busy: bool) -> None:
        """A write of ``rows`` ended; ``still_busy``: others are still under way."""
        if self._window_start is None:
            return
        self._stored += rows
        now = self.clock()
        if now - self._window_start >= self.window_s:
            measured = self._stored / (now - self._window_start)
            self.rate = measured if self.rate is None else max(measured, self.rate * self.decay)
            self._window_start, self._stored = now, 0
        if not still_busy:
            self._window_start = None


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
        flush_within_s: float | None = None,
    ):
        self.store = store
        self.limits = limits
        self.tenant_limits = tenant_limits or TenantLimits(0, 0)
        self.known = known
        self.shared_seen = shared_seen
        self.pending = pending
        self.max_metadata_length = max_metadata_length
        self._metadata_seen = SeenSeries(METRIC_METADATA_REMEMBERED, level="prometheus_metadata")
        self._marked = SlotHolds(known.max_entries, store.slot_width_ms)  # until when a mark holds a slot open
        self._bucket_indexed = SlotHolds(
            2 * known.max_entries, INDEX_BUCKET_MS
        )  # series this process indexed in a bucket
        self.max_inflight_samples = max_inflight_samples
        self.clock = clock
        self.inflight_samples = 0
        # What is in flight must be storable within this (a share of --shutdown-timeout): the
        # bound on rows in flight follows the store's measured rate (flushable_samples).
        self.flush_within_s = flush_within_s
        self.store_rate = StoreRate()
        self.activity = TenantActivity()
        self.draining = False
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
        admitted = await self._admit_and_write(protocol, _SAMPLES, samples)
        return IngestResult(len(admitted.rows), admitted.rejected)

    async def ingest_arrays(self, protocol: str, samples: SeriesSamples) -> IngestResult:
        """ingest() of samples given as arrays (a decoder's table of series and a sample each its
        series, timestamp and value): the same checks and outcome, rejects carrying the sample's
        index in the arrays, but series looked up once each and samples checked on arrays."""
        admitted = await self._admit_and_write(protocol, _SAMPLES, samples)
        return IngestResult(len(admitted.rows), admitted.rejected)

    async def ingest_exemplars(self, protocol: str, exemplars: Sequence[ExemplarSample]) -> IngestResult:
        """Validate and store exemplars (values are floats by construction: the decoder's doubles)."""
        admitted = await self._admit_and_write(protocol, _EXEMPLARS, exemplars)
        return IngestResult(len(admitted.rows), admitted.rejected)

    async def ingest_histograms(self, protocol: str, histograms: Sequence[HistogramSample]) -> IngestResult:
        """Validate and store native histogram samples (their bytes were checked by the decoder);
        their series-slots are marked pending, as samples', for the downsampler to roll them up."""
        admitted = await self._admit_and_write(protocol, _HISTOGRAMS, histograms)
        return IngestResult(len(admitted.rows), admitted.rejected)

    async def ingest_created(self, protocol: str, created: Sequence[CreatedSample]) -> IngestResult:
        """Store created timestamps of series (gateway/ingest/created.py chose which)."""
        admitted = await self._admit_and_write(protocol, _CREATED, created)
        return IngestResult(len(admitted.rows), admitted.rejected)

    async def register_series(
        self, protocol: str, series: Sequence[tuple[str, str, dict[str, str]]]
    ) -> tuple[list[SeriesKey], list[Rejected]]:
        """Index (tenant, metric name, tags) series without data (Graphite's tagSeries) as their
        first sample would: validated, counted against the tenant's active series, metadata
        written once. Returns the keys of the accepted series in order, and the rejects with
        their index in ``series``."""
        admitted = await self._admit_and_write(protocol, _SERIES, series)
        return cast(list[SeriesKey], admitted.rows), admitted.rejected

    async def _admit_and_write(self, protocol: str, kind: _Kind, items: Sequence) -> _Admitted:
        """The one loop every kind of data takes: resolve each item's series (validated and
        hashed once, then found in ``self.known``), admit the batch under the tenant limits
        (RateLimited over the rate; the new series over the active-series limit rejected), write
        within the in-flight bound, metadata of new series first, and remember the new series."""
        admitted = await self._resolve(protocol, kind, items)
        if admitted.rows and self.tenant_limits.enabled:
            admitted = self._admit(protocol, kind, admitted)
        if admitted.rows:
            await self._write(kind, admitted)
            self.known.add_all(admitted.fresh)
            if kind.accepted is not None:
                kind.accepted.labels(protocol).inc(len(admitted.rows))
            if kind.counted and isinstance(admitted.series, _Owners):
                self.activity.record_tenant(admitted.series.tenant, admitted.series.hashes)
            elif kind.counted:
                self.activity.record(admitted.series)
        return admitted

    async def _resolve(self, protocol: str, kind: _Kind, items: Sequence | SeriesSamples) -> _Admitted:
        """Each item's series hash, its own fields checked; a long batch pauses for the reactor
        now and then (gateway.core.cooperative). Items are (tenant, metric name, tags, timestamp, ...),
        or samples as arrays."""
        if isinstance(items, SeriesSamples):
            return await self._resolve_arrays(protocol, kind, items)
        rejected: list[Rejected] = []
        now = self.clock()
        oldest, newest = now - self.limits.max_sample_age_ms, now + self.limits.max_future_ms
        known, check, make_row = self.known, kind.check, kind.row
        fresh: dict[tuple, str] = {}
        new_series: dict[tuple[str, str], SeriesKey] = {}
        rows, series = [], []
        slices = Slices()
        for index, item in enumerate(items):
            if not index % CHECK_EVERY and slices.due():
                await slices.pause()
            tenant, name, tags = item[0], item[1], item[2]
            try:
                try:
                    key = (tenant, name, (*tags.keys(), *tags.values()))
                    hash_ = known.get(key) or fresh.get(key)
                except (AttributeError, TypeError):
                    key = hash_ = None  # type: ignore[assignment]  # validate_series refuses the item below
                if hash_ is None:
                    validate_series(name, tags, self.limits)
                    if check is not None:
                        check(item, oldest, newest)
                    hash_ = fresh[_compact(key)] = series_set_hash(series_set_text(name, tags))
                    new_series[(tenant, hash_)] = SeriesKey(tenant, hash_, name, tags)
                elif check is not None:
                    check(item, oldest, newest)
            except InvalidSample as error:
                rejected.append(Rejected(index, error.field, error.problem, error.reason))
                kind.rejected.labels(protocol, error.reason).inc()
                continue
            rows.append(make_row(item, hash_))
            series.append((tenant, hash_, index))
        if fresh:
            metrics.METADATA_CACHE.labels("memory", "miss").inc(len(fresh))
        metrics.METADATA_CACHE.labels("memory", "hit").inc(len(rows) - len(fresh))
        return _Admitted(rows, series, new_series, fresh, rejected)

    async def _resolve_arrays(self, protocol: str, kind: _Kind, batch: SeriesSamples) -> _Admitted:
        """_resolve for samples as arrays: the series of the table looked up in ``self.known``
        at once, those not found validated and hashed one by one (pausing for the reactor as
        _resolve does; a series without samples is left alone), the timestamps checked on the
        array, and the rows built by C loops."""
        tenant = batch.tenant
        now = self.clock()
        oldest, newest = now - self.limits.max_sample_age_ms, now + self.limits.max_future_ms
        keys = list(zip(repeat(intern(tenant)), batch.keys))
        slices = Slices()
        hashes: list[str | None] = []
        for start in range(0, len(keys), ROWS_PER_STEP):
            hashes += self.known.get_many(keys[start : start + ROWS_PER_STEP])
            await slices.maybe_pause()
        fresh: dict[tuple, str] = {}
        new_series: dict[tuple[str, str], SeriesKey] = {}
        invalid: dict[int, InvalidSample] = {}
        if None in hashes:
            with_samples = np.zeros(len(hashes), dtype=bool)
            with_samples[batch.series] = True
            for index in compress(range(len(hashes)), with_samples.tolist()):
                if hashes[index] is not None:
                    continue
                if slices.due():
                    await slices.pause()
                hash_ = fresh.get(keys[index])
                if hash_ is None:
                    name, tags = batch.name_and_tags(batch.labels[index])
                    try:
                        validate_series(name, tags, self.limits)
                    except InvalidSample as problem:
                        invalid[index] = problem
                        continue
                    hash_ = fresh[keys[index]] = series_set_hash(series_set_text(name, tags))
                    new_series[(tenant, hash_)] = SeriesKey(tenant, hash_, name, tags)
                hashes[index] = hash_
        series, timestamps, values = batch.series, batch.timestamps, batch.values
        bad = (timestamps < oldest) | (timestamps > newest)
        if invalid:
            bad |= np.isin(series, list(invalid))
        rejected: list[Rejected] = []
        positions: Sequence[int] = range(len(timestamps))
        if bad.any():
            for position in np.flatnonzero(bad).tolist():
                error = invalid.get(int(series[position])) or _window_error(int(timestamps[position]), oldest, newest)
                rejected.append(Rejected(position, error.field, error.problem, error.reason))
                kind.rejected.labels(protocol, error.reason).inc()
            kept = np.flatnonzero(~bad)
            series, timestamps, values, positions = series[kept], timestamps[kept], values[kept], kept.tolist()
            written = {hashes[index] for index in np.unique(series).tolist()}
            new_series = {key: new for key, new in new_series.items() if key[1] in written}
            fresh = {key: hash_ for key, hash_ in fresh.items() if hash_ in written}
        sample_hashes = np.array(hashes, dtype=object)[series].tolist()
        rows = RawColumns(tenant, sample_hashes, timestamps, values)
        owners = _Owners(tenant, sample_hashes, positions)
        if fresh:
            metrics.METADATA_CACHE.labels("memory", "miss").inc(len(fresh))
        metrics.METADATA_CACHE.labels("memory", "hit").inc(len(rows) - len(fresh))
        return _Admitted(rows, owners, new_series, fresh, rejected)

    def _admit(self, protocol: str, kind: _Kind, admitted: _Admitted) -> _Admitted:
        """The batch under the tenant limits: RateLimited refuses all of it; the items of new
        series over the active-series limit become rejects, the others stay."""
        weight = 1 if kind.counted else 0
        per_tenant: dict[str, dict[str, int]] = {}
        if isinstance(admitted.series, _Owners):  # one tenant's arrays: counted by C loops
            hashes = admitted.series.hashes
            per_tenant[admitted.series.tenant] = collections.Counter(hashes) if weight else dict.fromkeys(hashes, 0)
        else:
            for tenant, hash_, _ in admitted.series:
                counts = per_tenant.setdefault(tenant, {})
                counts[hash_] = counts.get(hash_, 0) + weight
        refused = self.tenant_limits.admit(per_tenant)
        if not refused:
            return admitted
        limit = self.tenant_limits.max_active_series
        problems = {
            tenant: f"a new series over the tenant's limit of {limit(tenant)} active series ({limit.setting(tenant)})"
            for tenant in refused
        }
        rows, series, rejected = [], [], list(admitted.rejected)
        for row, owner in zip(admitted.rows, admitted.series):
            tenant, hash_, index = owner
            if hash_ in refused.get(tenant, ()):
                rejected.append(Rejected(index, "series", problems[tenant], ACTIVE_SERIES_LIMITED))
            else:
                rows.append(row)
                series.append(owner)
        kind.rejected.labels(protocol, ACTIVE_SERIES_LIMITED).inc(len(admitted.rows) - len(rows))
        rejected.sort(key=lambda reject: reject.index)
        return _Admitted(
            rows,
            series,
            {key: new for key, new in admitted.new_series.items() if key[1] not in refused.get(key[0], ())},
            {key: hash_ for key, hash_ in admitted.fresh.items() if hash_ not in refused.get(key[0], ())},
            rejected,
        )

    async def ingest_metric_metadata(self, rows: Sequence[MetricMetadata]) -> None:
        """Keep the type, help and unit of metrics, each change written once. A row longer than
        ``max_metadata_length`` is skipped and counted (as Mimir does); the others are kept. Many
        rows are looked at, and written, in slices."""
        fresh: dict[MetricMetadata, None] = {}
        skipped = 0
        slices = Slices()
        for index, row in enumerate(rows):
            if not index % CHECK_EVERY:
                await slices.maybe_pause()
            if max(len(row.metric_name), len(row.help), len(row.unit)) > self.max_metadata_length:
                skipped += 1
            elif row not in self._metadata_seen:
                fresh[row] = None
        if skipped:
            metrics.PROMETHEUS_SKIPPED.labels("metadata_too_long").inc(skipped)
        if fresh:
            await self._store_calls(self.store.write_metric_metadata, list(fresh))
            self._metadata_seen.add_all(fresh)

    async def _write(self, kind: _Kind, admitted: _Admitted) -> None:
        """Metadata of the new series, then the rows, then the pending marks, within the bound on
        rows in flight (Overloaded beyond it; a first batch may exceed it alone)."""
        rows = admitted.rows if kind.operation else []
        if rows and self.inflight_samples and self.inflight_samples + len(rows) > self.flushable_samples():
            raise Overloaded(f"{self.inflight_samples} samples are already waiting for the store")
        self.inflight_samples += len(rows)
        metrics.INGEST_INFLIGHT.set(self.inflight_samples)
        if rows:
            self.store_rate.busy()
        try:
            if admitted.new_series:
                await self._write_metadata(admitted.new_series)
            if kind.indexed_by:
                await self._index_buckets(kind, admitted)
            if rows:
                await self._store_calls(getattr(self.store, kind.operation), rows)
            if kind.rolled_up and self.pending is not None:
                for start in range(0, len(rows), ROWS_PER_STORE_CALL):
                    await self._mark_pending(rows[start : start + ROWS_PER_STORE_CALL])
        finally:
            self.inflight_samples -= len(rows)
            metrics.INGEST_INFLIGHT.set(self.inflight_samples)
            if rows:
                self.store_rate.stored(len(rows), bool(self.inflight_samples))
            if not self.inflight_samples:
                waiting, self._drained = self._drained, []
                for deferred in waiting:
                    deferred.callback(None)

    def flushable_samples(self) -> int:
        """The bound on rows in flight: --max-inflight-samples, and once the store's rate is
        known, no more than it stores in ``flush_within_s`` (at least MIN_INFLIGHT_BOUND), so
        that what was accepted when SIGTERM comes is stored within --shutdown-timeout."""
        rate = self.store_rate.rate
        if self.flush_within_s is None or rate is None or self.draining:
            return self.max_inflight_samples
        return min(self.max_inflight_samples, max(MIN_INFLIGHT_BOUND, int(rate * self.flush_within_s)))

    async def _write_metadata(self, candidates: dict[tuple[str, str], SeriesKey]) -> None:
        """Metadata before data, so whatever data is acknowledged is always findable."""
        unseen = list(candidates)
        if self.shared_seen is not None:
            unseen = await self.shared_seen.unseen(unseen)
        if unseen:
            await self._store_calls(self.store.write_series, [candidates[key] for key in unseen])
            metrics.SERIES_CREATED.inc(len(unseen))
            if self.shared_seen is not None:
                await self.shared_seen.mark(unseen)

    async def _index_buckets(self, kind: _Kind, admitted: _Admitted) -> None:
        """Index the batch's series in the buckets of their rows (the time index), each series and bucket
        once while this process remembers it (and Redis, shared by replicas, where given), and
        in the next bucket ahead of time in a bucket's last PRE_INDEX_MS; before the rows are written,
        so that acknowledged data is always findable by its bucket."""
        now = self.clock()
        wanted = self._unindexed_buckets(kind, admitted, now)
        if not wanted:
            return
        pairs = [(tenant, f"{hash_}|{bucket}") for (tenant, bucket), hashes in wanted.items() for hash_ in hashes]
        if self.shared_seen is not None:
            unseen = set(await self.shared_seen.unseen(pairs))
        else:
            unseen = set(pairs)
        keys: list[tuple[SeriesKey, int]] = []
        for (tenant, bucket), hashes in wanted.items():
            series = {hash_: admitted.new_series.get((tenant, hash_)) for hash_ in hashes}
            lacking = [hash_ for hash_, key in series.items() if key is None]
            if lacking:
                series.update(await self.store.get_series(tenant, lacking))
            keys += [
                (key, bucket)
                for hash_, key in series.items()
                if key is not None and (tenant, f"{hash_}|{bucket}") in unseen
            ]
        if keys:
            await self._store_calls(self.store.write_series_buckets, keys)
            metrics.INDEX_BUCKET_SERIES.inc(len(keys))
        if self.shared_seen is not None:
            await self.shared_seen.mark([(key.tenant, f"{key.series_set_hash}|{bucket}") for key, bucket in keys])
        for (tenant, bucket), hashes in wanted.items():
            self._bucket_indexed.hold(
                tenant, bucket, hashes, max(bucket + 2 * INDEX_BUCKET_MS, now + INDEX_BUCKET_MS), now
            )

    def _unindexed_buckets(self, kind: _Kind, admitted: _Admitted, now: int) -> dict[tuple[str, int], list[str]]:
        """(tenant, bucket) -> the batch's series not yet indexed in that bucket by this process: the
        buckets of the rows, and the next bucket for series whose moment to be indexed in it came."""
        if kind.indexed_by == "now":
            current = now - now % INDEX_BUCKET_MS
            groups: dict[tuple[str, int], list[str]] = {}
            for tenant, hash_, _ in admitted.series:
                groups.setdefault((tenant, current), []).append(hash_)
            latest = now
        else:
            groups = hashes_by_slot(admitted.rows, INDEX_BUCKET_MS)
            timestamps = admitted.rows.timestamps if isinstance(admitted.rows, RawColumns) else None
            latest = int(timestamps.max()) if timestamps is not None else max(map(itemgetter(2), admitted.rows))
        wanted = {}
        for (tenant, bucket), hashes in groups.items():
            if missing := self._bucket_indexed.unheld(tenant, bucket, hashes, now):
                wanted[(tenant, bucket)] = missing
            next_bucket = bucket + INDEX_BUCKET_MS
            if latest >= next_bucket - PRE_INDEX_MS and latest < next_bucket:
                ahead = self._bucket_indexed.unheld(tenant, next_bucket, hashes, now)
                if due := [hash_ for hash_ in ahead if latest >= next_bucket - _PRE_INDEX_LEAD[hash_[0]]]:
                    wanted[(tenant, next_bucket)] = due
        return wanted

    @staticmethod
    async def _store_calls(write: Callable[[Sequence], Deferred], rows: Sequence) -> None:
        """``write(rows)`` in calls of at most ROWS_PER_STORE_CALL rows, all under way at once: a
        store prepares a call's rows on the reactor thread (~1-3 us a row), so one call of
        150,000 rows would hold it for a good part of a second."""
        if len(rows) <= ROWS_PER_STORE_CALL:
            await write(rows)
            return
        calls, slices = [], Slices()
        for start in range(0, len(rows), ROWS_PER_STORE_CALL):
            calls.append(write(rows[start : start + ROWS_PER_STORE_CALL]))
            await slices.maybe_pause()
        await gatherResults(calls, consumeErrors=True)

    async def _mark_pending(self, points: Sequence[RawPoint | HistogramRow]) -> None:
        """Once per distinct series and slot of the batch, before the write is acknowledged, unless
        an earlier mark of this process still holds that slot open.

        A mark made at time m holds slot s open until max(end of s, m) + delay: neither tracker
        calls a slot settled before both its end and its last touch are ``delay`` old. A later
        write before that moment, less half the delay (a margin for clock skew between this
        process and the downsampler, and for the roll-up's own run), needs no mark: the roll-up
        reads it with the rest. So a steady stream marks once per series and slot, and a backfill
        of a past slot once per series every half delay instead of on every write."""
        assert self.pending is not None  # _write marks only with a pending marker
        width = self.store.slot_width_ms
        now = self.clock()
        unmarked = {
            (tenant, slot): hashes
            for (tenant, slot), batch_hashes in hashes_by_slot(points, width).items()
            if (hashes := self._marked.unheld(tenant, slot, batch_hashes, now))
        }
        if not unmarked:
            return
        keys: list[tuple[str, str, int]] = []
        for (tenant, slot), hashes in unmarked.items():
            keys += zip(repeat(tenant), hashes, repeat(slot))
        await self.pending.mark(keys, now)
        metrics.DOWNSAMPLE_PENDING_MARKS.inc(len(keys))
        margin = self.pending.delay_ms // 2
        for (tenant, slot), hashes in unmarked.items():
            self._marked.hold(tenant, slot, hashes, max(slot + width, now) + margin, now)

    def drain(self) -> Deferred:
        """Fire once nothing is in flight (used at shutdown, after listeners stopped). What was
        accepted is written from now on as fast as the store takes it: the bound on rows in
        flight is back to --max-inflight-samples."""
        self.draining = True
        deferred: Deferred[None] = Deferred()
        if self.inflight_samples:
            self._drained.append(deferred)
        else:
            deferred.callback(None)
        return deferred
