"""protocols/otlp with plain bytes: the names, labels, series and values Prometheus 3's OTLP
receiver gives (its otlptranslator rules), the wire (protobuf, JSON, gzip, limits) and the answer."""

import gzip
import json
import struct

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as m
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from protocols import otlp
from protocols.otlp import names
from protocols.otlp.translate import STALE_NAN, attribute_string, buckets_layout
from protocols.otlp.wire import PIECE_BYTES, metric_data
from protocols.prometheus import types_pb2

pytestmark = pytest.mark.fast

T_NS = 1_700_000_000_000 * 1_000_000  # 2023-11-14, in ns
T_MS = T_NS // 1_000_000
CUMULATIVE = m.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = m.AGGREGATION_TEMPORALITY_DELTA


def kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def request(*metrics, resource=None, scope=None):
    if resource is None:
        resource = (kv("service.name", "shop"), kv("service.instance.id", "i1"))
    return ExportMetricsServiceRequest(
        resource_metrics=[
            m.ResourceMetrics(
                resource=Resource(attributes=list(resource)),
                scope_metrics=[m.ScopeMetrics(scope=scope or InstrumentationScope(), metrics=list(metrics))],
            )
        ]
    )


def gauge(name, value, unit="", attributes=(), **point):
    return m.Metric(
        name=name,
        unit=unit,
        gauge=m.Gauge(
            data_points=[m.NumberDataPoint(as_double=value, time_unix_nano=T_NS, attributes=list(attributes), **point)]
        ),
    )


def counter(name, value, unit="", monotonic=True, temporality=CUMULATIVE, start=T_NS - 60_000_000_000, **point):
    return m.Metric(
        name=name,
        unit=unit,
        sum=m.Sum(
            is_monotonic=monotonic,
            aggregation_temporality=temporality,
            data_points=[m.NumberDataPoint(as_int=value, time_unix_nano=T_NS, start_time_unix_nano=start, **point)],
        ),
    )


def samples(translation) -> dict:
    """{labels as a sorted tuple: [(timestamp, value)]} of the translation's sample arrays."""
    arrays = translation.batch.arrays
    found: dict = {}
    for series, timestamp, value in zip(arrays.series.tolist(), arrays.timestamps.tolist(), arrays.values.tolist()):
        found.setdefault(tuple(sorted(arrays.labels[series].items())), []).append((timestamp, value))
    return found


def labels(**values):
    return tuple(sorted({k.replace("__name", "__name__"): v for k, v in values.items()}.items()))


@pytest.mark.parametrize(
    "name, unit, kind, expected",
    [
        ("http.server.request.duration", "s", names.HISTOGRAM, "http_server_request_duration_seconds"),
        ("system.filesystem.usage", "By", names.GAUGE, "system_filesystem_usage_bytes"),
        ("cpu.utilization", "1", names.GAUGE, "cpu_utilization_ratio"),
        ("requests", "1", names.MONOTONIC_COUNTER, "requests_total"),
        ("requests_total", "", names.MONOTONIC_COUNTER, "requests_total"),
        ("network.io", "By/s", names.MONOTONIC_COUNTER, "network_io_bytes_per_second_total"),
        ("queue.size", "{items}", names.NON_MONOTONIC_COUNTER, "queue_size"),
        ("latency_seconds", "s", names.HISTOGRAM, "latency_seconds"),
        ("2xx.responses", "", names.GAUGE, "_2xx_responses"),
        ("temperature", "Cel", names.GAUGE, "temperature_celsius"),
        ("speed", "m/h", names.GAUGE, "speed_meters_per_hour"),
        ("a..b__c", "", names.GAUGE, "a_b_c"),
    ],
)
def test_metric_names_follow_otlptranslator(name, unit, kind, expected):
    assert names.Namer.of(names.UNDERSCORE_ESCAPING_WITH_SUFFIXES).metric_name(name, unit, kind) == expected


def test_other_strategies():
    without = names.Namer.of(names.UNDERSCORE_ESCAPING_WITHOUT_SUFFIXES)
    assert without.metric_name("http.requests", "s", names.MONOTONIC_COUNTER) == "http_requests"
    utf8 = names.Namer.of(names.NO_UTF8_ESCAPING_WITH_SUFFIXES)
    assert utf8.metric_name("http.requests", "s", names.MONOTONIC_COUNTER) == "http.requests_seconds_total"
    assert utf8.label_name("http.method") == "http.method"
    assert names.Namer.of(names.NO_TRANSLATION).metric_name("a.b", "s", names.MONOTONIC_COUNTER) == "a.b"
    with pytest.raises(ValueError, match="unknown translation strategy"):
        names.Namer.of("Escaping")


@pytest.mark.parametrize(
    "name, expected",
    [("http.method", "http_method"), ("2k", "key_2k"), ("__a.b__", "__a_b__"), ("a__b", "a_b"), ("_x", "_x")],
)
def test_label_names_are_escaped(name, expected):
    assert names.Namer.of(names.UNDERSCORE_ESCAPING_WITH_SUFFIXES).label_name(name) == expected


def test_units_in_metadata():
    assert [names.unit_name(u) for u in ("s", "By/s", "1", "{req}", "ms")] == [
        "seconds",
        "bytes_per_second",
        "",
        "",
        "milliseconds",
    ]


def test_attribute_values_as_pdata_writes_them():
    assert attribute_string(AnyValue(int_value=-3)) == "-3"
    assert attribute_string(AnyValue(bool_value=True)) == "true"
    assert attribute_string(AnyValue(double_value=100.0)) == "100"
    assert attribute_string(AnyValue(double_value=0.25)) == "0.25"
    assert attribute_string(AnyValue(double_value=1e21)) == "1e+21"
    array = AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="a"), AnyValue(int_value=1)]))
    assert attribute_string(array) == '["a",1]'


def test_gauge_and_counters_with_job_instance_and_created_timestamp():
    translation = otlp.translate(
        request(
            gauge("temperature", 21.5, unit="Cel", attributes=[kv("room", "a"), kv("job", "ignored")]),
            counter("requests", 7, attributes=[kv("http.method", "GET")]),
            counter("queue.size", -2, monotonic=False),
        )
    )
    found = samples(translation)
    base = {"job": "shop", "instance": "i1"}
    assert found[labels(__name="temperature_celsius", room="a", **base)] == [(T_MS, 21.5)]
    assert found[labels(__name="requests_total", http_method="GET", **base)] == [(T_MS, 7.0)]
    assert found[labels(__name="queue_size", **base)] == [(T_MS, -2.0)]
    (created,) = [s for s in translation.batch.series if s.created_timestamp]
    assert created.labels["__name__"] == "requests_total" and created.created_timestamp == T_MS - 60_000
    metadata = {row.metric_family_name: (row.type, row.unit) for row in translation.batch.metadata}
    assert metadata == {
        "temperature_celsius": ("gauge", "celsius"),
        "requests_total": ("counter", ""),
        "queue_size": ("gauge", ""),
    }
    assert translation.points == 3 and translation.refused_points == 0


def test_target_info_carries_the_other_resource_attributes_and_promoted_ones_label_every_series():
    resource = (kv("service.name", "shop"), kv("service.namespace", "eu"), kv("host.name", "h1"), kv("k8s.pod", "p"))
    settings = otlp.Settings(promote_resource_attributes=frozenset({"k8s.pod"}))
    translation = otlp.translate(request(gauge("up", 1.0), resource=resource), settings)
    found = samples(translation)
    assert found[labels(__name="up", job="eu/shop", k8s_pod="p")] == [(T_MS, 1.0)]
    assert found[labels(__name="target_info", job="eu/shop", host_name="h1", k8s_pod="p")] == [(T_MS, 1.0)]


def test_scope_labels_when_promoted():
    scope = InstrumentationScope(name="lib", version="1.2", attributes=[kv("x", "y")])
    plain = samples(otlp.translate(request(gauge("g", 1.0), scope=scope)))
    assert list(plain)[0] == labels(__name="g", job="shop", instance="i1")
    promoted = samples(
        otlp.translate(request(gauge("g", 1.0), scope=scope), otlp.Settings(promote_scope_metadata=True))
    )
    assert (
        labels(__name="g", job="shop", instance="i1", otel_scope_name="lib", otel_scope_version="1.2", otel_scope_x="y")
        in promoted
    )


def test_colliding_attribute_names_join_their_values_in_name_order():
    found = samples(otlp.translate(request(gauge("g", 1.0, attributes=[kv("a_b", "2"), kv("a.b", "1")]))))
    assert labels(__name="g", job="shop", instance="i1", a_b="1;2") in found


def test_classic_histogram_and_its_exemplars():
    point = m.HistogramDataPoint(
        time_unix_nano=T_NS,
        start_time_unix_nano=T_NS - 1_000_000_000,
        count=6,
        sum=12.5,
        explicit_bounds=[0.5, 1.0],
        bucket_counts=[1, 2, 3],
        exemplars=[m.Exemplar(as_double=0.75, time_unix_nano=T_NS, trace_id=bytes(range(16)), span_id=bytes(8))],
    )
    metric = m.Metric(
        name="latency", unit="s", histogram=m.Histogram(aggregation_temporality=CUMULATIVE, data_points=[point])
    )
    translation = otlp.translate(request(metric))
    found = samples(translation)
    base = {"job": "shop", "instance": "i1"}
    assert found[labels(__name="latency_seconds_sum", **base)] == [(T_MS, 12.5)]
    assert found[labels(__name="latency_seconds_count", **base)] == [(T_MS, 6.0)]
    assert found[labels(__name="latency_seconds_bucket", le="0.5", **base)] == [(T_MS, 1.0)]
    assert found[labels(__name="latency_seconds_bucket", le="1", **base)] == [(T_MS, 3.0)]
    assert found[labels(__name="latency_seconds_bucket", le="+Inf", **base)] == [(T_MS, 6.0)]
    with_exemplar = [s for s in translation.batch.series if s.exemplars]
    assert [s.labels["le"] for s in with_exemplar] == ["1"]
    assert with_exemplar[0].exemplars[0].labels == {"trace_id": bytes(range(16)).hex()}  # an all-zero span id is none
    assert {s.created_timestamp for s in translation.batch.series} == {T_MS - 1000}


def test_summary():
    point = m.SummaryDataPoint(
        time_unix_nano=T_NS,
        count=4,
        sum=2.0,
        quantile_values=[m.SummaryDataPoint.ValueAtQuantile(quantile=0.5, value=0.4)],
    )
    found = samples(otlp.translate(request(m.Metric(name="rpc", unit="s", summary=m.Summary(data_points=[point])))))
    assert found[labels(__name="rpc_seconds", quantile="0.5", job="shop", instance="i1")] == [(T_MS, 0.4)]
    assert found[labels(__name="rpc_seconds_count", job="shop", instance="i1")] == [(T_MS, 4.0)]


@pytest.mark.parametrize(
    "offset, counts, scale_down, spans, deltas",
    [
        (0, [4, 3, 2, 1], 0, [[1, 4]], [4, -1, -1, -1]),
        (0, [4, 3, 2, 1], 1, [[1, 2]], [7, -4]),
        (0, [4, 3, 2, 1], 2, [[1, 1]], [10]),
        (1, [4, 3, 2, 1], 1, [[1, 3]], [4, 1, -4]),
        (1, [4, 3, 2, 1], 2, [[1, 2]], [9, -8]),
        (4, [4, 2, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], 0, [[5, 4], [12, 1]], [4, -2, -2, 2, -1]),
        (4, [4, 2, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], 1, [[3, 2], [6, 1]], [6, -4, -1]),
    ],
)
def test_exponential_buckets_layout_as_prometheus(offset, counts, scale_down, spans, deltas):
    assert buckets_layout(counts, offset, scale_down) == (spans, deltas)


def exponential(scale=0, positive=(4, 3, 2, 1), flags=0, temporality=CUMULATIVE):
    point = m.ExponentialHistogramDataPoint(
        time_unix_nano=T_NS,
        start_time_unix_nano=T_NS - 1_000_000_000,
        scale=scale,
        count=sum(positive) + 1,
        sum=3.5,
        zero_count=1,
        positive=m.ExponentialHistogramDataPoint.Buckets(offset=0, bucket_counts=list(positive)),
        flags=flags,
    )
    return m.Metric(
        name="size",
        unit="By",
        exponential_histogram=m.ExponentialHistogram(aggregation_temporality=temporality, data_points=[point]),
    )


def test_exponential_histogram_to_native_with_scale_reduced_to_eight():
    translation = otlp.translate(request(exponential(scale=10)))
    (series,) = translation.batch.series
    assert series.labels == {"__name__": "size_bytes", "instance": "i1", "job": "shop"}
    assert series.created_timestamp == T_MS - 1000
    histogram = types_pb2.Histogram.FromString(series.histograms[0].data)
    assert (histogram.schema, histogram.count_int, histogram.sum, histogram.zero_count_int) == (8, 11, 3.5, 1)
    assert [(s.offset, s.length) for s in histogram.positive_spans] == [(1, 1)]
    assert list(histogram.positive_deltas) == [10]
    assert histogram.zero_threshold == 1e-128 and histogram.timestamp == T_MS
    assert translation.histogram_points == [0]


def test_histograms_over_the_bucket_limit_or_below_scale_minus_four_are_refused_and_named():
    settings = otlp.Settings(max_histogram_buckets=10)
    translation = otlp.translate(
        request(exponential(positive=[1] * 50), exponential(scale=-5), gauge("ok", 1.0)), settings
    )
    assert translation.refused_points == 2 and translation.points == 3
    assert "over the limit of 10" in translation.problems[0] and "scale -5" in translation.problems[1]
    assert labels(__name="ok", job="shop", instance="i1") in samples(translation)


def test_no_recorded_value_is_a_stale_marker():
    ((_, value),) = samples(otlp.translate(request(gauge("g", 1.0, flags=1))))[
        labels(__name="g", job="shop", instance="i1")
    ]
    assert struct.pack("<d", value) == struct.pack("<d", STALE_NAN)


def test_delta_is_refused_unless_converted():
    refused = otlp.translate(request(counter("hits", 3, temporality=DELTA), gauge("ok", 1.0)))
    assert refused.refused_points == 1 and "delta temporality" in refused.problems[0]
    assert labels(__name="ok", job="shop", instance="i1") in samples(refused)
    delta = otlp.DeltaToCumulative()
    first = otlp.translate(request(counter("hits", 3, temporality=DELTA, start=T_NS - 10**9)), delta=delta)
    later = request(counter("hits", 4, temporality=DELTA, start=T_NS))
    later.resource_metrics[0].scope_metrics[0].metrics[0].sum.data_points[0].time_unix_nano = T_NS + 10**9
    second = otlp.translate(later, delta=delta)
    key = labels(__name="hits_total", job="shop", instance="i1")
    assert samples(first)[key] == [(T_MS, 3.0)] and samples(second)[key] == [(T_MS + 1000, 7.0)]
    assert second.batch.series[0].created_timestamp == T_MS - 1000
    again = otlp.translate(later, delta=delta)  # resent: would count twice
    assert again.refused_points == 1 and "not after" in again.problems[0]


def test_delta_histograms_are_summed_bucket_by_bucket():
    delta = otlp.DeltaToCumulative()

    def histogram(time_ns, counts):
        point = m.HistogramDataPoint(
            time_unix_nano=time_ns, count=sum(counts), sum=1.0, explicit_bounds=[1.0], bucket_counts=counts
        )
        return m.Metric(name="h", histogram=m.Histogram(aggregation_temporality=DELTA, data_points=[point]))

    otlp.translate(request(histogram(T_NS, [1, 2])), delta=delta)
    found = samples(otlp.translate(request(histogram(T_NS + 10**9, [3, 0])), delta=delta))
    base = {"job": "shop", "instance": "i1"}
    assert found[labels(__name="h_bucket", le="1", **base)] == [(T_MS + 1000, 4.0)]
    assert found[labels(__name="h_bucket", le="+Inf", **base)] == [(T_MS + 1000, 6.0)]
    assert found[labels(__name="h_sum", **base)] == [(T_MS + 1000, 2.0)]


def test_invalid_names_refuse_their_points_only():
    translation = otlp.translate(request(gauge("...", 1.0), gauge("ok", 2.0, attributes=[kv("__", "x")])))
    assert translation.refused_points == 2 and len(translation.problems) == 2


def run(steps):
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def test_wire_protobuf_json_gzip_and_refusals():
    message = request(gauge("g", 1.0))
    raw = message.SerializeToString()
    assert otlp.parse(run(otlp.decompress_steps(gzip.compress(raw), "gzip", 1 << 20)), otlp.PROTOBUF) == message
    with pytest.raises(otlp.OTLPError) as error:
        otlp.parse(raw[:-3], otlp.PROTOBUF)
    assert error.value.status == 400
    with pytest.raises(otlp.OTLPError) as error:
        otlp.request_encoding("text/plain")
    assert error.value.status == 415
    with pytest.raises(otlp.OTLPError) as error:
        run(otlp.decompress_steps(gzip.compress(bytes(10 << 20)), "gzip", 1 << 20))
    assert error.value.status == 413
    with pytest.raises(otlp.OTLPError) as error:
        run(otlp.decompress_steps(gzip.compress(raw)[:-9], "gzip", 1 << 20))
    assert error.value.status == 400
    with pytest.raises(otlp.OTLPError) as error:
        run(otlp.decompress_steps(raw, "br", 1 << 20))
    assert error.value.status == 415


def test_json_with_hex_trace_ids():
    document = {
        "resourceMetrics": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "shop"}}]},
                "scopeMetrics": [
                    {
                        "metrics": [
                            {
                                "name": "hits",
                                "sum": {
                                    "aggregationTemporality": 2,
                                    "isMonotonic": True,
                                    "dataPoints": [
                                        {
                                            "asInt": "5",
                                            "timeUnixNano": str(T_NS),
                                            "exemplars": [
                                                {
                                                    "asDouble": 1.5,
                                                    "timeUnixNano": str(T_NS),
                                                    "traceId": "0af7651916cd43dd8448eb211c80319c",
                                                }
                                            ],
                                        }
                                    ],
                                },
                            }
                        ]
                    }
                ],
            }
        ]
    }
    message = otlp.parse(json.dumps(document).encode(), otlp.JSON)
    translation = otlp.translate(message)
    assert samples(translation)[labels(__name="hits_total", job="shop")] == [(T_MS, 5.0)]
    assert translation.batch.series[0].exemplars[0].labels == {"trace_id": "0af7651916cd43dd8448eb211c80319c"}
    with pytest.raises(otlp.OTLPError):
        otlp.parse(b'{"resourceMetrics": 3}', otlp.JSON)


def test_answer_in_the_request_encoding():
    assert otlp.encode_response(otlp.PROTOBUF) == b""
    answer = ExportMetricsServiceResponse.FromString(otlp.encode_response(otlp.PROTOBUF, 2, "two refused"))
    assert (answer.partial_success.rejected_data_points, answer.partial_success.error_message) == (2, "two refused")
    document = json.loads(otlp.encode_response(otlp.JSON, 2, "two refused"))
    assert document == {"partialSuccess": {"rejectedDataPoints": "2", "errorMessage": "two refused"}}


@pytest.mark.parametrize("as_bytes", [False, True], ids=["message", "bytes"])
def test_number_points_read_from_their_bytes_match_the_general_path(as_bytes):
    """Gauges and cumulative sums take a fast path (series found by their attributes' bytes):
    the same series, values and created timestamps come out as the general path's, known or not,
    with ints, exemplars, stale flags and resources of the same attributes kept apart, from a
    message or from a request's bytes (the data messages read where the request holds them)."""
    exemplar = m.Exemplar(as_double=1.0, time_unix_nano=T_NS, span_id=b"\x01" * 8)
    first = request(
        gauge("g", 1.5, attributes=[kv("a", "1")]),
        counter("c", 2, attributes=[kv("a", "1")], exemplars=[exemplar]),
        counter("c", 3, attributes=[kv("a", "2")]),
    )
    other = request(gauge("g", 2.5, attributes=[kv("a", "1")]), resource=(kv("service.name", "web"),))
    if as_bytes:
        first, other = first.SerializeToString(), other.SerializeToString()
    for _ in range(2):  # the second time, every series is known
        translation = otlp.translate(first)
        found = samples(translation)
        assert found[labels(__name="g", a="1", job="shop", instance="i1")] == [(T_MS, 1.5)]
        assert found[labels(__name="c_total", a="1", job="shop", instance="i1")] == [(T_MS, 2.0)]
        assert found[labels(__name="c_total", a="2", job="shop", instance="i1")] == [(T_MS, 3.0)]
        assert [s.exemplars[0].labels for s in translation.batch.series if s.exemplars] == [{"span_id": "01" * 8}]
        assert [s.created_timestamp for s in translation.batch.series] == [T_MS - 60_000] * 2
        assert samples(otlp.translate(other)) == {labels(__name="g", a="1", job="web"): [(T_MS, 2.5)]}


def test_a_stored_created_timestamp_is_not_sent_again_for_its_tenant():
    sent = request(counter("stored.once", 1, attributes=[kv("a", "1")]), counter("stored.once", 2))
    first = otlp.translate(sent, tenant="t")
    assert len(first.batch.series) == 2
    first.created_stored("t", refused_samples=[1])  # the second series' sample was refused
    again = otlp.translate(sent, tenant="t")
    assert [s.labels.get("a") for s in again.batch.series] == [None]
    assert len(otlp.translate(sent, tenant="u").batch.series) == 2


@pytest.mark.parametrize("as_bytes", [False, True], ids=["message", "bytes"])
def test_number_points_of_every_layout_read_from_their_bytes(as_bytes):
    """Ints and doubles, a gauge with a start time and a counter without one (no created
    timestamp, the general path): the same values the first time and once their series are known."""
    sent = request(
        gauge("ints", 0, attributes=[kv("a", "1")]),
        m.Metric(name="ints", gauge=m.Gauge(data_points=[m.NumberDataPoint(as_int=-7, time_unix_nano=T_NS)])),
        gauge("started", 2.5, start_time_unix_nano=T_NS - 10**9),
        counter("unstarted", 4, start=0),
        counter("doubles", 0, as_double=1.25),
        gauge("long", 1.0, attributes=[kv("a", "x" * 200)]),  # a point's length in two bytes
        gauge("long", 2.0, attributes=[kv("a", "y" * 20_000)]),  # in three
    )
    if as_bytes:
        sent = sent.SerializeToString()
    for _ in range(2):
        translation = otlp.translate(sent, tenant="layouts")
        found = samples(translation)
        assert found[labels(__name="ints", a="1", job="shop", instance="i1")] == [(T_MS, 0.0)]
        assert found[labels(__name="ints", job="shop", instance="i1")] == [(T_MS, -7.0)]
        assert found[labels(__name="started", job="shop", instance="i1")] == [(T_MS, 2.5)]
        assert found[labels(__name="unstarted_total", job="shop", instance="i1")] == [(T_MS, 4.0)]
        assert found[labels(__name="doubles_total", job="shop", instance="i1")] == [(T_MS, 1.25)]
        assert found[labels(__name="long", a="x" * 200, job="shop", instance="i1")] == [(T_MS, 1.0)]
        assert found[labels(__name="long", a="y" * 20_000, job="shop", instance="i1")] == [(T_MS, 2.0)]
        assert [(s.labels["__name__"], s.created_timestamp) for s in translation.batch.series] == [
            ("doubles_total", T_MS - 60_000)
        ]


def many_points_request(points: int):
    """Two resources: a counter of ``points`` points (and a histogram) under one, a gauge under the other."""
    counters = m.Metric(
        name="hits",
        sum=m.Sum(
            is_monotonic=True,
            aggregation_temporality=CUMULATIVE,
            data_points=[
                m.NumberDataPoint(
                    as_double=float(n),
                    time_unix_nano=T_NS + n * 10**6,
                    start_time_unix_nano=T_NS - 10**9,
                    attributes=[kv("n", str(n % 10))],
                )
                for n in range(points)
            ],
        ),
    )
    histograms = m.Metric(
        name="latency",
        unit="s",
        histogram=m.Histogram(
            aggregation_temporality=CUMULATIVE,
            data_points=[
                m.HistogramDataPoint(
                    time_unix_nano=T_NS, count=3, sum=1.5, explicit_bounds=[0.1, 1], bucket_counts=[1, 1, 1]
                )
            ]
            * 3,
        ),
    )
    first = m.ResourceMetrics(
        resource=Resource(attributes=[kv("service.name", "shop"), kv("service.instance.id", "i1"), kv("host", "h")]),
        scope_metrics=[
            m.ScopeMetrics(scope=InstrumentationScope(name="a"), metrics=[counters]),
            m.ScopeMetrics(scope=InstrumentationScope(name="b"), metrics=[histograms]),
        ],
    )
    second = m.ResourceMetrics(
        resource=Resource(attributes=[kv("service.name", "web")]),
        scope_metrics=[m.ScopeMetrics(metrics=[gauge("g", 1.0)])],
    )
    return ExportMetricsServiceRequest(resource_metrics=[first, second])


def flattened(message) -> list:
    """(resource, scope, metric without its points, point) of every data point of a request."""
    found = []
    for resource_metrics in message.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                data = getattr(metric, metric.WhichOneof("data"))
                head = m.Metric()
                head.CopyFrom(metric)
                getattr(head, metric.WhichOneof("data")).ClearField("data_points")
                for point in data.data_points:
                    found.append((resource_metrics.resource, scope_metrics.scope, head, point))
    return found


def test_a_split_request_pieces_hold_the_whole_in_order():
    sent = many_points_request(40)
    raw = sent.SerializeToString()
    pieces = [piece for piece in otlp.split_request(raw, 300) if piece is not None]
    assert len(pieces) > 10
    assert all(len(piece) <= 300 + 64 for _, piece in pieces)  # the repeated heads at most on top
    assert sorted({number for number, _ in pieces}) == [0, 1]
    messages = [ExportMetricsServiceRequest.FromString(piece) for _, piece in pieces]
    assert all(len(message.resource_metrics) == 1 for message in messages)
    assert [item for message in messages for item in flattened(message)] == flattened(sent)
    assert list(otlp.split_request(raw, len(raw))) == [(0, raw)]  # small enough: whole
    for _, piece in pieces:  # each metric's data message, as the parsed piece holds it
        found = [data for resource in metric_data(piece) for data in resource]
        parsed = ExportMetricsServiceRequest.FromString(piece).resource_metrics[0]
        expected = [
            getattr(metric, metric.WhichOneof("data")) for scope in parsed.scope_metrics for metric in scope.metrics
        ]
        assert [type(data).FromString(raw) for raw, data in zip(found, expected)] == expected


@pytest.mark.parametrize(
    "body, problem",
    [
        (b"\x0a\xff\x7f" + bytes(400), "field 1 at byte 0 runs past the end of its message"),
        (  # a scope_metrics of a resource_metrics longer than its resource_metrics, whose bytes follow
            b"\x0a\x95\x03" + b"\x0a\x8d\x03" + bytes(397) + b"\x12\x05abc" + b"\x0a\x00",
            "field 2 at byte 403 runs past the end of its message",
        ),
        (b"\x0b" + bytes(400), "field 1 at byte 0 has wire type 3"),
        (bytes(400) + b"\x0a\xff", "a varint at byte 400 runs past the end"),
    ],
)
def test_a_malformed_length_in_a_split_request_is_a_400_naming_it(body, problem):
    with pytest.raises(otlp.OTLPError) as error:
        list(otlp.split_request(body, 300))
    assert error.value.status == 400
    assert problem in str(error.value)


def test_a_request_over_a_piece_is_translated_as_its_message_is():
    sent = many_points_request(15_000)
    raw = sent.SerializeToString()
    assert len(raw) > PIECE_BYTES
    whole, pieces = otlp.translate(sent, tenant="whole"), otlp.translate(raw, tenant="pieces")
    assert samples(pieces) == samples(whole)
    assert pieces.points == whole.points == 15_004
    assert pieces.batch.metadata == whole.batch.metadata
    assert [s.created_timestamp for s in pieces.batch.series] == [s.created_timestamp for s in whole.batch.series]
    assert labels(__name="target_info", host="h", instance="i1", job="shop") in samples(pieces)


def test_a_request_over_the_points_limit_is_a_413_before_translating():
    steps = otlp.translate_steps(many_points_request(5).SerializeToString(), max_points=4)
    with pytest.raises(otlp.OTLPError) as error:
        run(steps)
    assert error.value.status == 413
    assert "more than 4 data points" in str(error.value)
