"""OpenTelemetry metrics in (OTLP/HTTP, docs/opentelemetry.rst), at Prometheus 3's path
``/api/v1/otlp/v1/metrics`` and Mimir's ``/otlp/v1/metrics``: decoded and translated by
protocols/otlp (gunzipped, parsed and translated in slices: protobuf a piece of at most
PIECE_BYTES at a time, JSON over INLINE_PARSE_BYTES in a thread), then
written by the one write entry point (gateway.ingest.push) as a remote write is, under the
same body, decompression, request-size and tenant limits and the same bound on writes in flight.

Answers, as the OTLP/HTTP spec gives them: 200 with an ExportMetricsServiceResponse in the
request's encoding, its ``partial_success`` counting the data points refused and naming why
(the others were written); 400 for a body that is no request, 413 over a limit, 415 for another
content type or encoding; 429 (tenant rate) and 503 (store busy) with Retry-After, which
OpenTelemetry exporters retry.
"""

from twisted.internet import threads

from gateway.core.cooperative import run_steps
from gateway.core.overrides import Overrides
from gateway.http.server import Response, Router, header, read_body, request_tenant
from gateway.ingest.push import Pushed, Writer, remote_write_batch
from protocols import otlp

PROTOCOL = "otlp"
# A decompressed JSON message larger than this is parsed in a thread: a smaller one costs the
# reactor a few ms at most.
INLINE_PARSE_BYTES = 256 * 1024


class OTLPAPI:
    def __init__(
        self,
        writer: Writer,
        overrides: Overrides,
        settings: otlp.Settings,
        delta: otlp.DeltaToCumulative | None,
        max_decompressed_bytes: int,
        max_points: int,
    ):
        self.writer = writer
        self.overrides = overrides
        self.settings = settings
        self.delta = delta
        self.max_decompressed_bytes = max_decompressed_bytes
        self.max_points = max_points

    def register(self, router: Router) -> None:
        router.add("/api/v1/otlp/v1/metrics", ("POST",), "otlp_metrics", self.write, role="ingest")
        router.add("/otlp/v1/metrics", ("POST",), "otlp_metrics", self.write, role="ingest")

    def tenant_settings(self, tenant: str) -> otlp.Settings:
        """The flags' settings with the tenant's own strategy and promoted attributes (--overrides)."""
        values = self.overrides.for_tenant(tenant)
        return self.settings._replace(
            strategy=values["otlp-translation-strategy"],
            promote_resource_attributes=frozenset(values["otlp-promote-resource-attributes"]),
        )

    async def write(self, request) -> Response:
        tenant = request_tenant(request)
        encoding = otlp.request_encoding(header(request, b"content-type"))
        body = read_body(request)
        raw = await run_steps(
            otlp.decompress_steps(body, header(request, b"content-encoding"), self.max_decompressed_bytes)
        )
        request_or_bytes = raw  # protobuf: parsed a piece at a time as it is translated
        if encoding == otlp.JSON:
            if len(raw) > INLINE_PARSE_BYTES:
                request_or_bytes = await threads.deferToThread(otlp.parse, raw, encoding)
            else:
                request_or_bytes = otlp.parse(raw, encoding)
        translation = await run_steps(
            otlp.translate_steps(request_or_bytes, self.tenant_settings(tenant), self.delta, tenant, self.max_points)
        )
        self.writer.pipeline.count_rejected(PROTOCOL, "otlp_translation", translation.refused_points)
        pushed = await self.writer.push(PROTOCOL, await remote_write_batch(tenant, translation.batch))
        translation.created_stored(tenant, (reject.index for reject in pushed.samples.rejected))
        refused = translation.refused_points + _refused_points(translation, pushed)
        problems = translation.problems + pushed.problems()
        message_text = "; ".join(problems)
        if refused:
            message_text += f"; {refused} of {translation.points} data points refused, the others were written"
        return Response(200, otlp.encode_response(encoding, refused, message_text), encoding)


def _refused_points(translation: otlp.Translation, pushed: Pushed) -> int:
    """The data points of the samples and histograms the writer refused (a classic histogram's
    point is several samples: counted once)."""
    points = set(translation.sample_points[[r.index for r in pushed.samples.rejected]].tolist())
    points.update(translation.histogram_points[r.index] for r in pushed.histograms.rejected)
    return len(points)
