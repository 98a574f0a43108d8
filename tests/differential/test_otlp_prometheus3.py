"""OTLP answered as Prometheus 3.14's OTLP receiver answers it: the OpenTelemetry SDK exports the
same instruments (every kind, attributes with dots, a resource with service and host
attributes) to Prometheus 3 and to tsgate, then the same questions of both: the series and
their labels, every value, native histogram counts and sums (Prometheus keeps no metadata of
OTLP writes to compare). Prometheus 3 is
built by tests/prometheus3.py where the machine has not built it yet."""

import time
import urllib.parse

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from tests.prometheus3 import answer_getters, build
from tests.prometheusproc import PrometheusProcess

pytestmark = [
    pytest.mark.slow,
]

RECEIVER = """
global:
  scrape_interval: 1h
"""
RESOURCE = {"service.name": "shop", "service.namespace": "eu", "service.instance.id": "i1", "host.name": "h1"}
QUESTIONS = [
    ("/api/v1/series", {"match[]": '{job="eu/shop"}'}),
    *(
        ("/api/v1/query", {"query": query})
        for query in (
            '{job="eu/shop", __name__!="target_info"}',
            "target_info",
            "histogram_count(payload_size_bytes)",
            "histogram_sum(payload_size_bytes)",
            "sum by (le) (latency_seconds_bucket)",
        )
    ),
]


def export_everything(url: str, headers: dict) -> None:
    """One export of every instrument kind through the SDK's OTLP/HTTP exporter."""
    exporter = OTLPMetricExporter(endpoint=url, headers=headers)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(
        resource=Resource.create(RESOURCE),
        metric_readers=[reader],
        views=[View(instrument_name="payload.size", aggregation=ExponentialBucketHistogramAggregation())],
    )
    meter = provider.get_meter("shop.meter", "1.0")
    requests = meter.create_counter("http.requests", unit="{request}", description="Requests served")
    requests.add(5, {"http.method": "GET", "http.route": "/a"})
    requests.add(2, {"http.method": "POST", "http.route": "/a"})
    queue = meter.create_up_down_counter("queue.size", description="Jobs waiting")
    queue.add(3)
    queue.add(-1)
    latency = meter.create_histogram("latency", unit="s")
    for value in (0.1, 0.3, 2.0, 7.5):
        latency.record(value)
    size = meter.create_histogram("payload.size", unit="By")
    for value in (1, 10, 100, 1000):
        size.record(value)
    meter.create_gauge("temperature", unit="Cel").set(21.5, {"room": "b.2"})
    meter.create_observable_gauge("cpu.utilization", [lambda options: [Observation(0.5)]], unit="1")
    assert provider.force_flush(10_000)
    provider.shutdown()


def ask(get, path: str, params: dict, at: float):
    if path == "/api/v1/query":
        params = {**params, "time": at}
    elif path == "/api/v1/series":
        params = {**params, "start": at - 600, "end": at}
    answer = get(f"{path}?{urllib.parse.urlencode(params)}")
    assert answer["status"] == "success", (path, params, answer)
    data = answer["data"]
    if isinstance(data, dict) and "result" in data:  # a vector: its series in order of labels
        return sorted(data["result"], key=lambda r: sorted(r["metric"].items()))
    if isinstance(data, list):
        return sorted(data, key=lambda labels: sorted(labels.items()))
    return data


def _bounds_rounded(answer):
    """The answer with native histogram bucket bounds to 15 digits: Prometheus's table of
    exponential bounds (model/histogram/generic.go) is one ulp off the correctly rounded
    2 ** (i / 2 ** schema) in 341 of its 511 entries, and tsgate computes them (docs/promql.rst)."""
    if isinstance(answer, list):
        return [_bounds_rounded(item) for item in answer]
    if isinstance(answer, dict) and "histogram" in answer:
        at, histogram = answer["histogram"]
        buckets = [
            [kind, f"{float(low):.15g}", f"{float(high):.15g}", count]
            for kind, low, high, count in histogram["buckets"]
        ]
        return {**answer, "histogram": [at, {**histogram, "buckets": buckets}]}
    return answer


def test_every_instrument_kind_reads_back_as_prometheus_3_translates_it(start_gateway, tmp_path, tenant):
    gateway = start_gateway("--max-native-histogram-buckets", "160")
    reference = PrometheusProcess(tmp_path / "p3", RECEIVER, "--web.enable-otlp-receiver", binary=str(build())).start()
    try:
        export_everything(f"http://127.0.0.1:{reference.port}/api/v1/otlp/v1/metrics", {})
        export_everything(f"{gateway.url}/api/v1/otlp/v1/metrics", {"X-Scope-OrgID": tenant})
        at = time.time() + 1
        from_gateway, from_reference = answer_getters(gateway, tenant, reference)
        answers = [
            (path, params, ask(from_reference, path, params, at), ask(from_gateway, path, params, at))
            for path, params in QUESTIONS
        ]
        for _, _, expected, _ in answers:
            assert expected, "Prometheus 3 answered nothing: the comparison would prove nothing"
        for path, params, expected, got in answers:
            assert _bounds_rounded(got) == _bounds_rounded(expected), (path, params)
    finally:
        reference.stop()
