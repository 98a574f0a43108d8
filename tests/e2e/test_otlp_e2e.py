"""The OTLP/HTTP receiver through a real gateway process: the OpenTelemetry Python SDK's OTLP
exporter sends every instrument kind (protobuf), read back through PromQL and remote read on
both stores; JSON posted by hand; bad input answered with the right code and the good data
beside it written (byte-level rules: test_otlp_protocol.py)."""

import json
import time
import urllib.parse

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import Observation
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as m
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as ResourceMessage
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from protocols import prometheus
from protocols.prometheus import Matcher, ReadQuery, remote_pb2

PATHS = ("/otlp/v1/metrics", "/api/v1/otlp/v1/metrics")


def query(gateway, tenant, promql):
    answer = gateway.get(
        f"/api/v1/query?{urllib.parse.urlencode({'query': promql})}", headers={"X-Scope-OrgID": tenant}
    )
    assert answer.status == 200, answer.body
    return answer.json()["data"]["result"]


def values(gateway, tenant, promql) -> dict:
    """{sorted labels but __name__, as a tuple: value} of an instant query."""
    found = {}
    for series in query(gateway, tenant, promql):
        key = tuple(sorted((k, v) for k, v in series["metric"].items() if k != "__name__"))
        found[key] = float(series["value"][1])
    return found


def send_with_sdk(gateway, tenant, path):
    exporter = OTLPMetricExporter(endpoint=gateway.url + path, headers={"X-Scope-OrgID": tenant})
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(
        resource=Resource.create({"service.name": "shop", "service.instance.id": "i1", "host.name": "h1"}),
        metric_readers=[reader],
        views=[View(instrument_name="payload.size", aggregation=ExponentialBucketHistogramAggregation())],
    )
    meter = provider.get_meter("shop.meter", "1.0")
    meter.create_counter("requests", unit="{request}", description="Requests served").add(5, {"http.method": "GET"})
    queue = meter.create_up_down_counter("queue.size")
    queue.add(3)
    queue.add(-1)
    latency = meter.create_histogram("latency", unit="s")
    for value in (0.1, 0.3, 2.0):
        latency.record(value)
    size = meter.create_histogram("payload.size", unit="By")
    for value in (1, 10, 100):
        size.record(value)
    meter.create_gauge("temperature", unit="Cel").set(21.5)
    meter.create_observable_gauge("cpu.utilization", [lambda options: [Observation(0.5)]], unit="1")
    assert provider.force_flush(10_000)
    provider.shutdown()


def test_sdk_sends_every_instrument_kind_read_back_through_promql_and_remote_read(gateway, tenant):
    send_with_sdk(gateway, tenant, PATHS[0])
    identity = (("instance", "i1"), ("job", "shop"))
    assert values(gateway, tenant, "requests_total") == {(("http_method", "GET"), *identity): 5.0}
    assert values(gateway, tenant, "queue_size") == {identity: 2.0}
    assert values(gateway, tenant, "temperature_celsius") == {identity: 21.5}
    assert values(gateway, tenant, "cpu_utilization_ratio") == {identity: 0.5}
    assert values(gateway, tenant, "latency_seconds_count") == {identity: 3.0}
    assert values(gateway, tenant, "latency_seconds_sum") == {identity: pytest.approx(2.4)}
    buckets = values(gateway, tenant, "latency_seconds_bucket")  # the SDK's default bounds: 0, 5, 10, ...
    assert buckets[(*identity, ("le", "0"))] == 0.0 and buckets[(*identity, ("le", "5"))] == 3.0
    assert values(gateway, tenant, "histogram_count(payload_size_bytes)") == {identity: 3.0}
    assert values(gateway, tenant, "histogram_sum(payload_size_bytes)") == {identity: 111.0}
    (info,) = query(gateway, tenant, "target_info")
    assert info["metric"]["host_name"] == "h1" and info["metric"]["telemetry_sdk_language"] == "python"
    metadata = gateway.get("/api/v1/metadata?metric=requests_total", headers={"X-Scope-OrgID": tenant}).json()
    assert metadata["data"]["requests_total"] == [{"type": "counter", "help": "Requests served", "unit": ""}]
    now = int(time.time() * 1000)
    body = prometheus.encode_read_request(
        [
            ReadQuery(
                now - 600_000, now + 60_000, [Matcher("EQ", "job", "shop"), Matcher("EQ", "__name__", "queue_size")]
            )
        ],
        [prometheus.SAMPLES],
    )
    answer = gateway.post(
        "/api/v1/read", body, headers={"Content-Type": "application/x-protobuf", "X-Scope-OrgID": tenant}
    )
    assert answer.status == 200, answer.body
    response = remote_pb2.ReadResponse.FromString(prometheus.decompress_block(answer.body, 1 << 24))
    (series,) = response.results[0].timeseries
    assert {label.name: label.value for label in series.labels} == {
        "__name__": "queue_size",
        "instance": "i1",
        "job": "shop",
    }
    assert {sample.value for sample in series.samples} == {2.0}  # flushed, then exported again at shutdown


def kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def export(*metrics) -> ExportMetricsServiceRequest:
    return ExportMetricsServiceRequest(
        resource_metrics=[
            m.ResourceMetrics(
                resource=ResourceMessage(attributes=[kv("service.name", "shop")]),
                scope_metrics=[m.ScopeMetrics(metrics=list(metrics))],
            )
        ]
    )


def gauge(name: str, value: float, time_ns: int | None = None, attributes=()) -> m.Metric:
    point = m.NumberDataPoint(as_double=value, time_unix_nano=time_ns or time.time_ns(), attributes=list(attributes))
    return m.Metric(name=name, gauge=m.Gauge(data_points=[point]))


def post(gateway, tenant, body: bytes, content_type="application/x-protobuf", path=PATHS[1], **headers):
    return gateway.post(path, body, headers={"Content-Type": content_type, "X-Scope-OrgID": tenant, **headers})


def partial_success(answer) -> tuple[int, str]:
    assert answer.status == 200, answer.body
    found = ExportMetricsServiceResponse.FromString(answer.body).partial_success
    return found.rejected_data_points, found.error_message


@pytest.fixture
def sqlite_gateway(start_gateway):
    return start_gateway("--max-native-histogram-buckets", "100", "--tenant-max-samples-per-second", "0")


def test_json_request_and_answer(sqlite_gateway, tenant):
    now_ns = time.time_ns()
    document = {
        "resourceMetrics": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "shop"}}]},
                "scopeMetrics": [
                    {
                        "metrics": [
                            {"name": "up", "gauge": {"dataPoints": [{"asDouble": 1, "timeUnixNano": str(now_ns)}]}},
                            {
                                "name": "hits",
                                "sum": {
                                    "aggregationTemporality": 1,
                                    "isMonotonic": True,
                                    "dataPoints": [{"asInt": "4", "timeUnixNano": str(now_ns)}],
                                },
                            },
                        ]
                    }
                ],
            }
        ]
    }
    answer = post(sqlite_gateway, tenant, json.dumps(document).encode(), "application/json")
    assert answer.status == 200 and answer.headers.get("content-type", "").startswith("application/json")
    partial = json.loads(answer.body)["partialSuccess"]
    assert partial["rejectedDataPoints"] == "1" and "delta temporality" in partial["errorMessage"]
    assert values(sqlite_gateway, tenant, "up") == {(("job", "shop"),): 1.0}


def test_bad_input_gets_its_code_and_the_good_data_beside_it_is_written(sqlite_gateway, tenant):
    gateway = sqlite_gateway
    good = export(gauge("fine", 1.0)).SerializeToString()
    assert post(gateway, tenant, good[:-2]).status == 400
    assert post(gateway, tenant, good, "text/plain").status == 415
    many = [kv(f"a{i}", "v") for i in range(10_000)]
    now_ns = time.time_ns()
    huge = m.ExponentialHistogramDataPoint(
        time_unix_nano=now_ns,
        count=100_000,
        positive=m.ExponentialHistogramDataPoint.Buckets(bucket_counts=[1] * 100_000),
    )
    request = export(
        gauge("wide", 1.0, attributes=many),
        gauge("not_a_number", float("nan")),
        gauge("infinite", float("inf")),
        gauge("ancient", 1.0, time_ns=1_000_000),
        gauge("future", 1.0, time_ns=now_ns + 10 * 365 * 86_400 * 10**9),
        m.Metric(
            name="huge",
            exponential_histogram=m.ExponentialHistogram(aggregation_temporality=2, data_points=[huge]),
        ),
        gauge("fine", 1.0),
    )
    refused, message = partial_success(post(gateway, tenant, request.SerializeToString()))
    assert refused == 4, message
    assert "64" in message and "over the limit of 100" in message
    assert values(gateway, tenant, "fine") == {(("job", "shop"),): 1.0}
    assert query(gateway, tenant, "not_a_number")[0]["value"][1] == "NaN"
    assert query(gateway, tenant, "infinite")[0]["value"][1] == "+Inf"
    assert query(gateway, tenant, "wide") == [] and query(gateway, tenant, "huge") == []


def test_push_back_is_429_with_retry_after(start_gateway, tenant):
    gateway = start_gateway("--tenant-max-samples-per-second", "10")
    request = export(*[gauge(f"g{i}", 1.0) for i in range(200)])
    answers = [post(gateway, tenant, request.SerializeToString()) for _ in range(3)]
    limited = [a for a in answers if a.status == 429]
    assert limited and all(a.headers.get("retry-after") for a in limited)


def test_translation_settings_per_tenant(start_gateway, tmp_path, tenant):
    overrides = tmp_path / "overrides.toml"
    overrides.write_text(
        f'[tenants."{tenant}"]\n'
        'otlp-translation-strategy = "UnderscoreEscapingWithoutSuffixes"\n'
        'otlp-promote-resource-attributes = ["service.version"]\n'
        f'[tenants."{tenant}-utf8"]\n'
        'otlp-translation-strategy = "NoUTF8EscapingWithSuffixes"\n'
        'otlp-promote-resource-attributes = ["service.version"]\n'
    )
    gateway = start_gateway("--overrides", str(overrides))
    metric = m.Metric(
        name="jobs.done",
        unit="s",
        sum=m.Sum(
            aggregation_temporality=2,
            is_monotonic=True,
            data_points=[m.NumberDataPoint(as_int=3, time_unix_nano=time.time_ns())],
        ),
    )
    request = ExportMetricsServiceRequest(
        resource_metrics=[
            m.ResourceMetrics(
                resource=ResourceMessage(attributes=[kv("service.name", "shop"), kv("service.version", "2")]),
                scope_metrics=[m.ScopeMetrics(metrics=[metric])],
            )
        ]
    )
    for who in (tenant, "other", f"{tenant}-utf8"):
        assert partial_success(post(gateway, who, request.SerializeToString())) == (0, "")
    assert values(gateway, tenant, "jobs_done") == {(("job", "shop"), ("service_version", "2")): 3.0}
    assert values(gateway, "other", "jobs_done_seconds_total") == {(("job", "shop"),): 3.0}
    assert values(gateway, f"{tenant}-utf8", '{"jobs.done_seconds_total"}') == {
        (("job", "shop"), ("service.version", "2")): 3.0
    }


def many_points(name: str, points: int, series: int, now_ns: int) -> bytes:
    """A protobuf request of one counter of ``points`` points across ``series`` series (two
    attributes each: ~60 bytes a point), each series' a second apart up to ``now_ns``."""
    data = [
        m.NumberDataPoint(
            as_double=float(n),
            time_unix_nano=now_ns - (points // series - n // series) * 10**9,
            start_time_unix_nano=now_ns - 3600 * 10**9,
            attributes=[kv("series", str(n % series)), kv("zone", "zone-a")],
        )
        for n in range(points)
    ]
    metric = m.Metric(name=name, sum=m.Sum(aggregation_temporality=2, is_monotonic=True, data_points=data))
    return export(metric).SerializeToString()


def test_a_request_over_a_piece_is_written_whole_and_one_over_the_points_limit_is_a_413(start_gateway, tenant):
    """A protobuf request over 512 KiB is parsed and translated a piece at a time (wire.split_request):
    every point is written; one over --remote-write-max-samples is refused before it is translated."""
    gateway = start_gateway("--remote-write-max-samples", "11000", "--tenant-max-samples-per-second", "0")
    now_ns = time.time_ns()
    body = many_points("pieces", 10_000, 100, now_ns)
    assert len(body) > 512 * 1024
    assert partial_success(post(gateway, tenant, body)) == (0, "")
    assert values(gateway, tenant, "sum(count_over_time(pieces_total[30m]))") == {(): 10_000.0}
    over = post(gateway, tenant, many_points("over", 12_000, 100, now_ns))
    assert over.status == 413 and b"more than 11000 data points" in over.body
    assert query(gateway, tenant, "over_total") == []
