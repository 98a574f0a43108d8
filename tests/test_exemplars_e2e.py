"""Exemplars over real HTTP on both stores: remote write 1.0 and 2.0 in (hand-built, and from a
real Prometheus 2.42), the RW 2.0 written header, /api/v1/query_exemplars and remote read SAMPLES
out, bit for bit."""

import struct
import threading
import time
import urllib.parse

import pytest
from prometheus_client import CollectorRegistry, Counter, start_http_server

from gateway.devservices.process import free_port
from protocols import prometheus
from protocols.prometheus import Exemplar, Matcher, Query, Series, remote_pb2
from tests.prometheusproc import PrometheusProcess

STALE_NAN_BITS = 0x7FF0000000000002
STALE_NAN = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]
V2 = "application/x-protobuf;proto=io.prometheus.write.v2.Request"


def now_ms() -> int:
    return int(time.time() * 1000)


def bits(value: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", value))[0]


def write(gateway, tenant, series, version=1):
    if version == 1:
        body, content_type = prometheus.encode_write_request_v1(series), "application/x-protobuf"
    else:
        body, content_type = prometheus.encode_write_request_v2(series), V2
    headers = {"Content-Type": content_type, "Content-Encoding": "snappy", "X-Scope-OrgID": tenant}
    return gateway.post("/api/v1/write", body, headers=headers)


def query_exemplars(gateway, tenant, query, start=None, end=None):
    params = {"query": query, **({"start": start / 1000} if start is not None else {}), **({"end": end / 1000} if end is not None else {})}
    return gateway.get(f"/api/v1/query_exemplars?{urllib.parse.urlencode(params)}", headers={"X-Scope-OrgID": tenant})


def read_samples(gateway, tenant, queries):
    """A remote read SAMPLES answer, parsed with protobuf's own classes (exemplars included)."""
    body = prometheus.encode_read_request(queries, [prometheus.SAMPLES])
    answer = gateway.post("/api/v1/read", body, headers={"Content-Type": "application/x-protobuf", "X-Scope-OrgID": tenant})
    assert answer.status == 200, answer.body
    response = remote_pb2.ReadResponse()
    response.ParseFromString(prometheus.decompress_block(answer.body, 1 << 24))
    return response


def test_rw1_and_rw2_exemplars_come_back_bit_exact(gateway, tenant):
    t = now_ms() - 60_000
    v1 = [
        Series({"__name__": "http_latency_seconds_bucket", "le": "0.5"}, [(t, 3.0), (t + 1000, 4.0)], exemplars=[
            Exemplar({"trace_id": "aaa", "span_id": "01"}, 0.25, t + 1),
            Exemplar({"trace_id": "bbb"}, STALE_NAN, t + 999),
        ]),
        Series({"__name__": "http_latency_seconds_bucket", "le": "1"}, [(t, 5.0)]),
    ]
    answer = write(gateway, tenant, v1)
    assert answer.status == 204, answer.body
    v2 = [Series({"__name__": "jobs_total", "queue": "q"}, [(t, 1.0)], metric_type="counter", exemplars=[Exemplar({"trace_id": "ccc"}, -0.0, t + 5)])]
    answer = write(gateway, tenant, v2, version=2)
    assert answer.status == 204, answer.body
    assert answer.headers["X-Prometheus-Remote-Write-Exemplars-Written"] == "1"
    assert answer.headers["X-Prometheus-Remote-Write-Samples-Written"] == "1"

    found = query_exemplars(gateway, tenant, 'sum(rate(http_latency_seconds_bucket[5m])) + on() group(jobs_total{queue="q"})', t - 1, t + 2000)
    assert found.status == 200, found.body
    assert found.json() == {"status": "success", "data": [
        {"seriesLabels": {"__name__": "http_latency_seconds_bucket", "le": "0.5"}, "exemplars": [
            {"labels": {"span_id": "01", "trace_id": "aaa"}, "value": "0.25", "timestamp": (t + 1) / 1000},
            {"labels": {"trace_id": "bbb"}, "value": "NaN", "timestamp": (t + 999) / 1000},
        ]},
        {"seriesLabels": {"__name__": "jobs_total", "queue": "q"}, "exemplars": [
            {"labels": {"trace_id": "ccc"}, "value": "-0", "timestamp": (t + 5) / 1000},
        ]},
    ]}
    later = query_exemplars(gateway, tenant, "http_latency_seconds_bucket", t + 2, t + 2000).json()["data"]
    assert [[e["labels"]["trace_id"] for e in s["exemplars"]] for s in later] == [["bbb"]]
    assert query_exemplars(gateway, tenant, "http_latency_seconds_bucket").json()["data"] == found.json()["data"][:1]

    response = read_samples(gateway, tenant, [
        Query(t - 1, t + 2000, [Matcher("EQ", "__name__", "http_latency_seconds_bucket")]),
        Query(t - 1, t + 2000, [Matcher("EQ", "__name__", "jobs_total")]),
    ])
    buckets, jobs = response.results
    assert [len(s.exemplars) for s in buckets.timeseries] == [2, 0]
    first = buckets.timeseries[0]
    assert [(e.timestamp, bits(e.value), {label.name: label.value for label in e.labels}) for e in first.exemplars] == [
        (t + 1, bits(0.25), {"span_id": "01", "trace_id": "aaa"}),
        (t + 999, STALE_NAN_BITS, {"trace_id": "bbb"}),
    ]
    assert [(s.timestamp, s.value) for s in first.samples] == [(t, 3.0), (t + 1000, 4.0)]
    assert bits(jobs.timeseries[0].exemplars[0].value) == bits(-0.0)


def test_exemplars_past_the_per_series_cap_and_invalid_ones(start_gateway, backend_args, tenant):
    """--max-exemplars-per-series keeps the newest of a slot; an exemplar outside the accepted
    window is refused with 400 naming it, the header counting only what was stored."""
    gateway = start_gateway(*backend_args, "--max-exemplars-per-series", "2", "--max-sample-age", "1d")
    t = now_ms() - 1000
    t = max(t, t - t % 3_600_000 + 10)  # the three exemplars before t share its slot
    exemplars = [Exemplar({"trace_id": str(i)}, float(i), t - 3 + i) for i in range(3)]
    answer = write(gateway, tenant, [Series({"__name__": "m"}, [(t, 1.0)], exemplars=exemplars + [Exemplar({}, 1.0, 1000)])], version=2)
    assert answer.status == 400 and b"1 of 4 exemplars rejected: timestamp: 1000 ms is older than the accepted window" in answer.body
    assert answer.headers["X-Prometheus-Remote-Write-Exemplars-Written"] == "3"
    assert answer.headers["X-Prometheus-Remote-Write-Samples-Written"] == "1"
    data = query_exemplars(gateway, tenant, "m", t - 10, t).json()["data"]
    assert [e["labels"]["trace_id"] for e in data[0]["exemplars"]] == ["1", "2"]
    metrics = gateway.get("/metrics").body.decode()
    assert 'tsgate_exemplars_accepted_total{protocol="prometheus"} 3.0' in metrics
    assert 'tsgate_exemplars_rejected_total{protocol="prometheus",reason="too_old"} 1.0' in metrics


def test_series_with_exemplars_and_no_samples_is_indexed_and_read(start_gateway, tenant):
    """A v1 series may carry exemplars only: its series is written first, so it is found."""
    gateway = start_gateway()
    t = now_ms() - 5000
    assert write(gateway, tenant, [Series({"__name__": "only_exemplars", "job": "x"}, exemplars=[Exemplar({"id": "1"}, 2.0, t)])]).status == 204
    data = query_exemplars(gateway, tenant, '{job="x"}', t, t).json()["data"]
    assert data == [{"seriesLabels": {"__name__": "only_exemplars", "job": "x"}, "exemplars": [{"labels": {"id": "1"}, "value": "2", "timestamp": t / 1000}]}]
    (result,) = read_samples(gateway, tenant, [Query(t, t, [Matcher("EQ", "job", "x")])]).results
    assert [(len(s.samples), len(s.exemplars)) for s in result.timeseries] == [(0, 1)]


@pytest.mark.parametrize(
    "params, words",
    [
        ({}, 'invalid parameter "query"'),
        ({"query": "up{"}, 'invalid parameter "query"'),
        ({"query": "up", "start": "20", "end": "10"}, "end timestamp must not be before start time"),
        ({"query": "up", "start": "yesterday"}, 'invalid parameter "start"'),
    ],
)
def test_query_exemplars_errors_are_bad_data(start_gateway, tenant, params, words):
    gateway = start_gateway()
    answer = gateway.get(f"/api/v1/query_exemplars?{urllib.parse.urlencode(params)}", headers={"X-Scope-OrgID": tenant})
    assert answer.status == 400 and answer.json()["errorType"] == "bad_data" and words in answer.json()["error"]


WRITER = """
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: exporter
    static_configs: [{targets: ["127.0.0.1:EXPORTER_PORT"]}]
remote_write:
  - url: http://127.0.0.1:GATEWAY_PORT/api/v1/write?tenant=TENANT
    send_exemplars: true
    queue_config: {batch_send_deadline: 500ms, min_backoff: 100ms, max_backoff: 1s}
"""


@pytest.fixture
def exemplar_exporter():
    """An exporter whose counter gets an exemplar (a new trace id) on every increment; Prometheus
    scrapes it in OpenMetrics, the only exposition that carries exemplars."""
    registry = CollectorRegistry()
    requests = Counter("tsgate_ex_requests", "Requests served.", ["path"], registry=registry)
    port = free_port()
    server, _ = start_http_server(port, "127.0.0.1", registry)
    stop = threading.Event()

    def churn():
        tick = 0
        while not stop.wait(0.4):
            tick += 1
            requests.labels("/a").inc(1.5, exemplar={"trace_id": f"{tick:016x}"})

    worker = threading.Thread(target=churn, daemon=True)
    worker.start()
    yield port
    stop.set()
    server.shutdown()


def canonical_exemplars(answer: dict) -> list:
    assert answer["status"] == "success", answer
    return sorted((sorted(item["seriesLabels"].items()), item["exemplars"]) for item in answer["data"])


def test_real_prometheus_sends_exemplars_and_both_answer_alike(start_gateway, backend_args, exemplar_exporter, tmp_path, tenant):
    """Prometheus 2.42 with exemplar storage scrapes exemplars and remote-writes them; tsgate's
    /api/v1/query_exemplars then answers what Prometheus's own does, exemplar for exemplar."""
    gateway = start_gateway(*backend_args)
    config = WRITER.replace("GATEWAY_PORT", str(gateway.port)).replace("EXPORTER_PORT", str(exemplar_exporter)).replace("TENANT", tenant)
    writer = PrometheusProcess(tmp_path / "writer", config, "--enable-feature=exemplar-storage").start()
    try:
        query = 'rate(tsgate_ex_requests_total{path="/a"}[1m])'
        deadline = time.monotonic() + 60
        while True:
            end = time.time() - 3
            params = {"query": query, "start": end - 30, "end": end}
            expected = canonical_exemplars(writer.api("/api/v1/query_exemplars", **params))
            got = canonical_exemplars(query_exemplars(gateway, tenant, query, round(params["start"] * 1000), round(end * 1000)).json())
            if expected and expected[0][1] and len(expected[0][1]) >= 5 and got == expected:
                break
            assert time.monotonic() < deadline, (expected, got)
            time.sleep(1)
        labels, exemplars = got[0]
        assert dict(labels)["job"] == "exporter" and exemplars[0]["labels"]["trace_id"] and exemplars[0]["value"] == "1.5"
    finally:
        writer.stop()
    assert "Traceback" not in gateway.log()
