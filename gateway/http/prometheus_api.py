"""Prometheus remote write (1.0 and 2.0) in and remote read (samples and streamed chunks) out:
requests decoded here, written by the ingest pipeline, read by gateway/query/remote_read.py.

Status codes follow the specs: 204 once the store has accepted everything; 400 for a
malformed request or rejected series, samples or native histograms (the good ones are written;
Prometheus does not retry 4xx); 413 for a body, or a decompressed body, over its limit; 415
for a content type or encoding we do not speak; 429 with Retry-After over a tenant limit; 503
when the store cannot take the write (Prometheus retries 5xx). docs/prometheus.rst has the details and the name
mapping for Graphite series.
"""

import logging

from gateway.core import blocking
from gateway.core.cooperative import run_steps
from gateway.http.promql_api import prometheus_errors
from gateway.http.server import HTTPError, Response, Router, arg, header, json_response, read_body, request_tenant
from gateway.ingest.push import Writer, remote_write_batch
from gateway.query.remote_read import RemoteRead
from protocols import prometheus

log = logging.getLogger(__name__)

# A series this small is XOR-encoded on the reactor in about a millisecond; larger ones (pure
# Python, ~2 us a sample) are encoded in a thread so that one long series stalls nobody.
INLINE_ENCODE_SAMPLES = 1000
# Rows made between two looks at the clock, where a row is a few us.
ROWS_PER_SLICE_CHECK = 1024
# Encoding a native histogram costs about one float sample per this many bytes of its message
# (its buckets: ~40 us for a 12-bucket histogram of 60 bytes).
HISTOGRAM_BYTES_PER_SAMPLE = 4


class PrometheusAPI:
    """``writer`` is None in a query executor, which serves no ingest route."""

    def __init__(
        self,
        writer: Writer | None,
        remote_read: RemoteRead,
        max_decompressed_bytes: int,
        max_histogram_buckets: int = 0,
        limits: prometheus.WriteLimits = prometheus.write.NO_LIMITS,
    ):
        self.writer = writer
        self.max_histogram_buckets = max_histogram_buckets
        self.limits = limits
        self.remote_read = remote_read
        self.max_decompressed_bytes = max_decompressed_bytes

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
        assert self.writer is not None  # an ingest route: see the class docstring
        tenant = request_tenant(request)
        body = read_body(request)
        try:
            batch = await run_steps(
                prometheus.decode_write_request_steps(
                    body,
                    header(request, b"content-type"),
                    header(request, b"content-encoding"),
                    self.max_decompressed_bytes,
                    self.max_histogram_buckets,
                    arrays=True,
                    limits=self.limits,
                )
            )
        except prometheus.RemoteWriteError as error:
            self.writer.pipeline.count_rejected("prometheus", f"http_{error.status}", 1)
            if isinstance(error, prometheus.RequestTooLarge):
                raise HTTPError(413, f"{error.message} (--remote-write-max-{error.kind})") from None
            raise
        pushed = await self.writer.push("prometheus", await remote_write_batch(tenant, batch))
        headers = (
            prometheus.v2_written_headers(
                batch, pushed.samples.accepted, pushed.exemplars.accepted, pushed.histograms.accepted
            )
            if batch.version == 2
            else {}
        )
        if message := pushed.message():
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
        label_view = prometheus.labels_for_reader(header(request, b"user-agent"))
        answers = await self.remote_read.read(tenant, read_request.queries, streamed, label_view)
        if streamed:
            return Response(200, self._stream(answers), prometheus.STREAMED_CONTENT_TYPE)
        return Response(
            200,
            await blocking.in_thread(prometheus.encode_read_response, answers),
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
                    frames = await blocking.in_thread(_series_frames, index, labels, found, native)
                for frame in frames:
                    yield frame


def _series_frames(index: int, labels: dict[str, str], found, native) -> list[bytes]:
    points = found.points() if len(found) else []
    return list(prometheus.encode_chunked_series_frames(index, labels, points, histograms=native))
