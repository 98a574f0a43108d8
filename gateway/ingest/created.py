"""Created timestamps of remote write 2.0 series (docs/prometheus.rst): the latest of each series
is stored (a column of series_set_hashes), and with ``--created-timestamp-zero-ingestion`` a zero
sample (float 0, or an empty histogram hinted as a counter reset) is written at a created
timestamp not stored before, when it comes before the series' samples in the request and inside
the accepted window, as Prometheus 3's feature of that name does, so rate() and increase() of a
counter that just started count its first samples.

A steady sender repeats the same created timestamp in every request: the last one stored of each
series is remembered (an LRU), so only a new one costs a store read and write.
"""

from collections.abc import Sequence

from gateway.core.caches import LRUMap
from gateway.core.cooperative import CHECK_EVERY, Slices
from gateway.core.model import HistogramSample, Sample, SeriesKey, series_set_hash, series_set_text, split_labels
from gateway.core.samples import Samples
from gateway.ingest.pipeline import CreatedSample, IngestPipeline
from gateway.store import Store
from gateway.store.contract import CreatedTimestamp, HistogramRow
from gateway.store.read_path import ReadPath
from protocols.prometheus import WriteSeries, types_pb2
from protocols.prometheus.write import label_bytes, series_key


def name_and_tags(series: WriteSeries) -> tuple[str, dict[str, str]]:
    """A remote-write series' metric name and tags (its labels but ``__name__``), as ingest has them."""
    return split_labels(series.labels)


def zero_histogram(data: bytes, created_ms: int) -> bytes:
    """An empty histogram at the created timestamp, with the schema, zero threshold and custom
    bounds of the histogram after it (as Prometheus writes its created-timestamp zero)."""
    after = types_pb2.Histogram.FromString(data)
    zero = types_pb2.Histogram(
        schema=after.schema,
        zero_threshold=after.zero_threshold,
        custom_values=after.custom_values,
        reset_hint=types_pb2.Histogram.ResetHint.YES,
        timestamp=created_ms,
    )
    if after.WhichOneof("count") == "count_float":
        zero.count_float, zero.zero_count_float = 0.0, 0.0
    else:
        zero.count_int, zero.zero_count_int = 0, 0
    return zero.SerializeToString()


def series_cache_keys(tenant: str, series: WriteSeries) -> tuple[tuple, tuple, tuple]:
    """The keys a remote-write series has in the pipeline's known-series cache once written: by
    its samples (IngestPipeline.ingest_arrays; a translated OTLP series' by its label bytes), by
    its histograms (ingest_histograms)."""
    name, tags = name_and_tags(series)
    return (
        (tenant, series_key(series.labels)),
        (tenant, label_bytes(series.labels)),
        (tenant, name, (*tags.keys(), *tags.values())),
    )


class CreatedTimestamps:
    def __init__(
        self,
        store: Store,
        pipeline: IngestPipeline,
        reads: ReadPath,
        zero_ingestion: bool,
        remembered: int = 100_000,
    ):
        self.store = store
        self.pipeline = pipeline
        self.reads = reads
        self.zero_ingestion = zero_ingestion
        self._stored = LRUMap(remembered)  # (tenant, labels) -> the created timestamp stored

    async def new(self, tenant: str, series: Sequence[WriteSeries]) -> list[tuple[WriteSeries, CreatedTimestamp]]:
        """The series of a request whose created timestamp is not the one stored for them."""
        candidates = []
        slices = Slices()
        for index, item in enumerate(series):
            if not index % CHECK_EVERY:
                await slices.maybe_pause()
            if item.created_timestamp and self._stored.get(self._key(tenant, item)) != item.created_timestamp:
                candidates.append((item, series_set_hash(series_set_text(*name_and_tags(item)))))
        if not candidates:
            return []
        stored = await self.store.get_created_timestamps(tenant, [hash_ for _, hash_ in candidates])
        await self._remember(tenant, [(item, stored[hash_]) for item, hash_ in candidates if hash_ in stored])
        return [
            (item, CreatedTimestamp(tenant, hash_, item.created_timestamp))
            for item, hash_ in candidates
            if stored.get(hash_) != item.created_timestamp
        ]

    async def zeros(
        self, tenant: str, new: Sequence[tuple[WriteSeries, CreatedTimestamp]], oldest_ms: int
    ) -> tuple[list[Sample], list[HistogramSample]]:
        """The zero samples and histograms to write for new created timestamps (none unless
        ``zero_ingestion``): each before every sample of its series in the request, and only
        where nothing is stored from it up to them (Prometheus drops a zero that would land at or
        before a sample it has, so a zero never replaces a sample or lands between two)."""
        samples: list[Sample] = []
        histograms: list[HistogramSample] = []
        found: Samples | list[HistogramRow]
        if not self.zero_ingestion:
            return samples, histograms
        for item, row in new:
            created = row.created_ms
            times = [ts for ts, _ in item.samples] + [h.timestamp for h in item.histograms]
            if created < oldest_ms or not times or created >= min(times):
                continue
            name, tags = name_and_tags(item)
            if item.samples:
                (found,) = await self.reads.read_raw(
                    [SeriesKey(tenant, row.series_set_hash, name, tags)], created, min(times) - 1
                )
                if not len(found):
                    samples.append(Sample(tenant, name, tags, created, 0.0))
            else:
                (found,) = await self.reads.read_histograms(tenant, [row.series_set_hash], created, min(times) - 1)
                if not found:
                    first = min(item.histograms, key=lambda h: h.timestamp)
                    histograms.append(HistogramSample(tenant, name, tags, created, zero_histogram(first.data, created)))
        return samples, histograms

    async def write(self, tenant: str, created: Sequence[tuple[WriteSeries, CreatedTimestamp]]) -> None:
        """New created timestamps, after the samples (so after their series' metadata), with the
        zero samples of --created-timestamp-zero-ingestion; those add nothing to the counts the
        answer gives. Only of series the pipeline indexed: one whose every sample was refused has
        no metadata row to hold its created timestamp."""
        known = self.pipeline.known
        indexed = []
        slices = Slices()
        for index, (item, row) in enumerate(created):
            if not index % CHECK_EVERY:
                await slices.maybe_pause()
            if any(map(known.get, series_cache_keys(tenant, item))):
                indexed.append((item, row))
        created = indexed
        if not created:
            return
        now = self.pipeline.clock()
        zero_samples, zero_histograms = await self.zeros(tenant, created, now - self.pipeline.limits.max_sample_age_ms)
        if zero_samples:
            await self.pipeline.ingest("prometheus", zero_samples)
        if zero_histograms:
            await self.pipeline.ingest_histograms("prometheus", zero_histograms)
        await self.pipeline.ingest_created(
            "prometheus", [CreatedSample(tenant, *name_and_tags(item), row.created_ms) for item, row in created]
        )
        await self._remember(tenant, [(item, row.created_ms) for item, row in created])

    async def _remember(self, tenant: str, stored: list[tuple[WriteSeries, int]]) -> None:
        """Remember the created timestamp stored of each series, in slices (an OTLP request's
        first sight of its counters may bring 40,000)."""
        slices = Slices()
        for start in range(0, len(stored), CHECK_EVERY):
            self._stored.add_all(
                {self._key(tenant, item): created for item, created in stored[start : start + CHECK_EVERY]}
            )
            await slices.maybe_pause()

    @staticmethod
    def _key(tenant: str, item: WriteSeries) -> tuple:
        return tenant, tuple(item.labels.items())
