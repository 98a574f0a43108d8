"""Prometheus remote write (1.0 and 2.0) in and remote read (samples and streamed chunks) out:
requests decoded here, written by the ingest pipeline, read by gateway/query/remote_read.py.

Status codes follow the specs: 204 once the store has accepted everything; 400 for a
malformed request or rejected samples or native histograms (the good ones are written;
Prometheus does not retry 4xx); 413 for a body, or a decompressed body, over its limit; 415
for a content type or encoding we do not speak; 429 with Retry-After over a tenant limit; 503
when the store cannot take the write (Prometheus retries 5xx). docs/prometheus.rst has the details and the name
mapping for Graphite series.
"""

import logging

from twisted.internet import threads
from twisted.web import server

from gateway.core.cooperative import CHECK_EVERY, Slices, run_steps
from gateway.core.model import NAME_TAG, ExemplarSample, HistogramSample, SeriesSamples, split_labels
from gateway.http.promql_api import prometheus_errors
from gateway.http.server import HTTPError, Response, Router, arg, json_response, read_body, request_tenant
from gateway.ingest.created import CreatedTimestamps, name_and_tags
from gateway.ingest.pipeline import IngestPipeline
from gateway.query.remote_read import RemoteRead
from gateway.store.contract import MetricMetadata
from protocols import prometheus

log = logging.getLogger(__name__)

MAX_REPORTED_REJECTS = 10
# A series this small is XOR-encoded on the reactor in about a millisecond; larger ones (pure
# Python, ~2 us a sample) are encoded in a thread so that one long series stalls nobody.
INLINE_ENCODE_SAMPLES = 1000
# Rows made between two looks at the clock, where a row is a few us.
ROWS_PER_SLICE_CHECK = 1024
# Encoding a native histogram costs about one float sample per this many bytes of its message
# (its buckets: ~40 us for a 12-bucket histogram of 60 bytes).
HISTOGRAM_BYTES_PER_SAMPLE = 4


def _header(request: server.Request, name: bytes) -> str | None:
    value = request.getHeader(name)
    return value.decode("latin-1") if isinstance(value, bytes) else value


async def _metadata_rows(tenant: str, batch) -> list[MetricMetadata]:
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


def series_name_and_tags(labels) -> tuple[str, dict[str, str]]:
    """The metric name and tags of a series of remote write arrays (an entry of SampleArrays.labels)."""
    return split_labels(prometheus.series_labels(labels))


class PrometheusAPI:
    """``pipeline`` and ``created`` are None in a query executor, which serves no ingest route."""

    def __init__(
        self,
        pipeline: IngestPipeline | None,
        remote_read: RemoteRead,
        created: CreatedTimestamps | None,
        max_decompressed_bytes: int,
        max_histogram_buckets: int = 0,
        limits: prometheus.WriteLimits = prometheus.write.NO_LIMITS,
    ):
        self.pipeline = pipeline
        self.max_histogram_buckets = max_histogram_buckets
        self.limits = limits
        self.remote_read = remote_read
        self.max_decompressed_bytes = max_decompressed_bytes
        self.created = created

    def register(self, router: Router) -> None:
        router.add("/api/v1/write", ("POST",), "remote_write", self.write, role="ingest")
        router.add("/api/v1/push", ("POST",), "remote_write", self.write, role="ingest")
        router.add("/api/v1/read", ("POST",), "remote_read", self.read, role="query")
        router.add("/api/v1/metadata", ("GET",), "metadata", prometheus_errors(self.metadata), role="query")

    async def metadata(self, request) -> Response:
        """Prometheus's metadata API: one ``metric``, or every metric family of the tenant (up to
        ``limit`` of them), in Prometheus's envelope."""
        tenant = request_tenant(request)
        metric = arg(request, "metric")
        limit = arg(request, "limit")
        if limit is not None and not limit.lstrip("-").isdigit():
            raise HTTPError(400, f"parameter 'limit' is not an integer: {limit!r}")
        wanted = int(limit) if limit is not None and int(limit) > 0 else None
        rows = await self.remote_read.metadata(tenant, metric, wanted)
        data = {row.metric_name: [{"type": row.type, "help": row.help, "unit": row.unit}] for row in rows if row}
        return json_response(200, {"status": "success", "data": data})

    async def write(self, request) -> Response:
        tenant = request_tenant(request)
        body = read_body(request)
        try:
            batch = await run_steps(
                prometheus.decode_write_request_steps(
                    body,
                    _header(request, b"content-type"),
                    _header(request, b"content-encoding"),
                    self.max_decompressed_bytes,
                    self.max_histogram_buckets,
                    arrays=True,
                    limits=self.limits,
                )
            )
        except prometheus.RemoteWriteError as error:
            self.pipeline.count_rejected("prometheus", f"http_{error.status}", 1)
            if isinstance(error, prometheus.RequestTooLarge):
                raise HTTPError(413, f"{error.message} (--remote-write-max-{error.kind})") from None
            raise
        for refused in batch.rejected_histograms:
            self.pipeline.count_rejected_histograms("prometheus", refused.reason)
        histograms, exemplars = [], []
        slices = Slices()
        for index, series in enumerate(batch.series):
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
        await self.pipeline.ingest_metric_metadata(await _metadata_rows(tenant, batch))
        created = await self.created.new(tenant, batch.series)
        arrays = batch.arrays
        assert arrays is not None  # decoded with arrays=True
        samples = SeriesSamples(
            tenant, arrays.keys, arrays.labels, series_name_and_tags, arrays.series, arrays.timestamps, arrays.values
        )
        result = await self.pipeline.ingest_arrays("prometheus", samples)
        native = await self.pipeline.ingest_histograms("prometheus", histograms)
        stored = await self.pipeline.ingest_exemplars("prometheus", exemplars)
        await self.created.write(tenant, created)
        headers = (
            prometheus.v2_written_headers(batch, result.accepted, stored.accepted, native.accepted)
            if batch.version == 2
            else {}
        )
        refused = [r.problem for r in batch.rejected_histograms]
        parts = (
            ("samples", len(arrays), _described(result)),
            ("native histograms", len(histograms) + len(refused), refused + _described(native)),
            ("exemplars", len(exemplars), _described(stored)),
        )
        problems = [
            f"{len(found)} of {sent} {kind} rejected: " + "; ".join(found[:MAX_REPORTED_REJECTS])
            for kind, sent, found in parts
            if found
        ]
        if problems:
            written = result.accepted + native.accepted + stored.accepted
            message = f"{'; '.join(problems)}; " + ("the others were written" if written else "none were written")
            return Response(400, message.encode(), "text/plain; charset=utf-8", headers)
        return Response(204, b"", "text/plain; charset=utf-8", headers)

    async def read(self, request):
        tenant = request_tenant(request)
        body = read_body(request)
        read_request = prometheus.decode_read_request(body, self.max_decompressed_bytes)
        # A 400 before reading.
        streamed = prometheus.negotiate_response_type(read_request.accepted_response_types) == (
            prometheus.STREAMED_XOR_CHUNKS
        )
        answers = await self.remote_read.read(tenant, read_request.queries, streamed)
        if streamed:
            return Response(200, self._stream(answers), prometheus.STREAMED_CONTENT_TYPE)
        return Response(
            200,
            await threads.deferToThread(prometheus.encode_read_response, answers),
            prometheus.SAMPLES_CONTENT_TYPE,
            {"Content-Encoding": "snappy"},
        )

    @staticmethod
    async def _stream(answers):
        """STREAMED_XOR_CHUNKS frames, encoded series by series as they are sent (long series in a thread)."""
        for index, answer in enumerate(answers):
            for labels, found, native in answer:
                if (
                    len(found) + sum(len(row.data) for row in native) // HISTOGRAM_BYTES_PER_SAMPLE
                    <= INLINE_ENCODE_SAMPLES
                ):
                    frames = _series_frames(index, labels, found, native)
                else:
                    frames = await threads.deferToThread(_series_frames, index, labels, found, native)
                for frame in frames:
                    yield frame


def _described(outcome) -> list[str]:
    return [f"{r.field}: {r.problem}" for r in outcome.rejected]


def _series_frames(index: int, labels: dict[str, str], found, native) -> list[bytes]:
    points = found.points() if len(found) else []
    return list(prometheus.encode_chunked_series_frames(index, labels, points, histograms=native))
