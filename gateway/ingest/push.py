"""The one write entry point: every protocol hands a decoded request to Writer.push, which
writes it in one order (metric metadata, samples, native histograms, exemplars, then created
timestamps, which need their series indexed by the samples) through the ingest pipeline, and
returns what was written and what was refused, which the protocol encodes in its answer
(remote write 2.0's written-count headers, OTLP's partial_success, the native API's JSON).
HTTP handlers only decode, push and encode.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, cast

from gateway.core.cooperative import CHECK_EVERY, Slices
from gateway.core.model import NAME_TAG, ExemplarSample, HistogramSample, Sample, SeriesSamples, split_labels
from gateway.ingest.created import CreatedTimestamps, name_and_tags
from gateway.ingest.pipeline import IngestPipeline, IngestResult
from gateway.store.contract import MetricMetadata
from protocols import prometheus
from protocols.prometheus import RejectedHistogram, RejectedSeries, WriteBatch, WriteSeries

# Rows made between two looks at the clock, where a row is a few us.
ROWS_PER_SLICE_CHECK = 1024
# Refused items named in an answer, per kind of data.
MAX_REPORTED_REJECTS = 10
_NOTHING = IngestResult(0, [])


@dataclass
class Batch:
    """What one request writes: samples (a list, or one tenant's arrays), native histograms,
    exemplars, metric metadata, the series whose created timestamps it carries (with their
    tenant: a remote write or OTLP request is one tenant's), and the series and histograms its
    decoder refused (out of the batch, named in the answer)."""

    samples: Sequence[Sample] | SeriesSamples = ()
    histograms: Sequence[HistogramSample] = ()
    exemplars: Sequence[ExemplarSample] = ()
    metadata: Sequence[MetricMetadata] = ()
    created: tuple[str, Sequence[WriteSeries]] | None = None
    refused_histograms: Sequence[RejectedHistogram] = field(default_factory=list)
    refused_series: Sequence[RejectedSeries] = field(default_factory=list)
    series: int = 0  # how many series the request held, the refused included (0: not counted)


class Pushed(NamedTuple):
    """What a push wrote and refused, by kind of data."""

    samples: IngestResult
    histograms: IngestResult
    exemplars: IngestResult
    refused_histograms: Sequence[RejectedHistogram]
    refused_series: Sequence[RejectedSeries]
    sent: tuple[int, int, int, int]  # series, samples, histograms (the decoder's refused included), exemplars

    @property
    def written(self) -> int:
        return self.samples.accepted + self.histograms.accepted + self.exemplars.accepted

    @property
    def refused(self) -> int:
        return (
            len(self.samples.rejected)
            + len(self.histograms.rejected)
            + len(self.exemplars.rejected)
            + len(self.refused_histograms)
            + len(self.refused_series)
        )

    def problems(self) -> list[str]:
        """One sentence a kind of data with refused items: how many of how many, and the first
        MAX_REPORTED_REJECTS of them named."""
        refused = [r.problem for r in self.refused_histograms]
        parts = (
            ("series", self.sent[0], list(map(str, self.refused_series))),
            ("samples", self.sent[1], _described(self.samples)),
            ("native histograms", self.sent[2], refused + _described(self.histograms)),
            ("exemplars", self.sent[3], _described(self.exemplars)),
        )
        return [
            f"{len(found)} of {sent} {kind} rejected: " + "; ".join(found[:MAX_REPORTED_REJECTS])
            for kind, sent, found in parts
            if found
        ]

    def message(self) -> str:
        """The problems, and whether the rest was written ("" when nothing was refused)."""
        problems = self.problems()
        if not problems:
            return ""
        return f"{'; '.join(problems)}; " + ("the others were written" if self.written else "none were written")


def _count(samples: Sequence[Sample] | SeriesSamples) -> int:
    return len(samples.timestamps) if isinstance(samples, SeriesSamples) else len(samples)


def _described(outcome: IngestResult) -> list[str]:
    return [f"{r.field}: {r.problem}" for r in outcome.rejected]


class Writer:
    """The write entry point (push) over the ingest pipeline and the created timestamps (None
    for a protocol that carries none: carbon)."""

    def __init__(self, pipeline: IngestPipeline, created: CreatedTimestamps | None = None):
        self.pipeline = pipeline
        self.created = created

    async def push(self, protocol: str, batch: Batch) -> Pushed:
        """Write ``batch``: metadata first (so a reader finds the type of what it reads), then the
        samples, histograms and exemplars, each item validated and admitted by the pipeline (the
        good ones written beside the refused), then the new created timestamps."""
        pipeline = self.pipeline
        if batch.refused_series:
            pipeline.count_rejected(protocol, "invalid_series", len(batch.refused_series))
        for refused in batch.refused_histograms:
            pipeline.count_rejected_histograms(protocol, refused.reason)
        if batch.metadata:
            await pipeline.ingest_metric_metadata(batch.metadata)
        created = await self.created.new(*batch.created) if batch.created and self.created else []
        sample_count = _count(batch.samples)
        samples = _NOTHING
        if isinstance(batch.samples, SeriesSamples) and sample_count:
            samples = await pipeline.ingest_arrays(protocol, batch.samples)
        elif sample_count:
            samples = await pipeline.ingest(protocol, cast(Sequence[Sample], batch.samples))
        histograms = await pipeline.ingest_histograms(protocol, batch.histograms) if batch.histograms else _NOTHING
        exemplars = await pipeline.ingest_exemplars(protocol, batch.exemplars) if batch.exemplars else _NOTHING
        if created:
            assert batch.created is not None and self.created is not None
            await self.created.write(batch.created[0], created)
        sent = (
            batch.series,
            sample_count,
            len(batch.histograms) + len(batch.refused_histograms),
            len(batch.exemplars),
        )
        return Pushed(samples, histograms, exemplars, batch.refused_histograms, batch.refused_series, sent)


def series_name_and_tags(labels) -> tuple[str, dict[str, str]]:
    """The metric name and tags of a series of remote write arrays (an entry of SampleArrays.labels)."""
    return split_labels(prometheus.series_labels(labels))


async def remote_write_batch(tenant: str, decoded: WriteBatch) -> Batch:
    """The Batch of a decoded remote write request (or of an OTLP request translated to one):
    its series' histograms and exemplars as rows, its metadata (v1 entries, v2 per-series
    fields) and created timestamps, made in slices (a request may carry many of each)."""
    assert decoded.arrays is not None  # decoded with arrays=True
    histograms: list[HistogramSample] = []
    exemplars: list[ExemplarSample] = []
    slices = Slices()
    for index, series in enumerate(decoded.series):
        if not index % CHECK_EVERY:
            await slices.maybe_pause()
        if not series.histograms and not series.exemplars:
            continue
        name, tags = name_and_tags(series)
        for start in range(0, len(series.histograms), ROWS_PER_SLICE_CHECK):
            histograms.extend(
                HistogramSample(tenant, name, tags, h.timestamp, h.data)
                for h in series.histograms[start : start + ROWS_PER_SLICE_CHECK]
            )
            await slices.maybe_pause()
        for start in range(0, len(series.exemplars), ROWS_PER_SLICE_CHECK):
            exemplars.extend(
                ExemplarSample(tenant, name, tags, e.timestamp, e.value, e.labels)
                for e in series.exemplars[start : start + ROWS_PER_SLICE_CHECK]
            )
            await slices.maybe_pause()
    arrays = decoded.arrays
    return Batch(
        SeriesSamples(
            tenant, arrays.keys, arrays.labels, series_name_and_tags, arrays.series, arrays.timestamps, arrays.values
        ),
        histograms,
        exemplars,
        await _metadata_rows(tenant, decoded),
        (tenant, decoded.series),
        decoded.rejected_histograms,
        decoded.rejected_series,
        len(arrays.keys) + len(decoded.rejected_series),
    )


async def _metadata_rows(tenant: str, batch: WriteBatch) -> list[MetricMetadata]:
    """The type/help/unit a remote write carries: v1 metadata requests, v2 per-series fields
    (made in slices: a request may carry --remote-write-max-metadata entries)."""
    rows, slices = [], Slices()
    for start in range(0, len(batch.metadata), ROWS_PER_SLICE_CHECK):
        rows += [
            MetricMetadata(tenant, m.metric_family_name, m.type, m.help, m.unit)
            for m in batch.metadata[start : start + ROWS_PER_SLICE_CHECK]
        ]
        await slices.maybe_pause()
    for index, series in enumerate(batch.series):
        if not index % CHECK_EVERY:
            await slices.maybe_pause()
        if series.metric_type:
            rows.append(MetricMetadata(tenant, series.labels[NAME_TAG], series.metric_type, series.help, series.unit))
    return rows
