"""Exemplars over real HTTP on both stores: remote write 1.0 and 2.0 in, the RW 2.0 written
header, /api/v1/query_exemplars and remote read SAMPLES out, bit for bit (a real Prometheus
sending exemplars: test_prometheus_e2e.py)."""

import struct
import time
import urllib.parse

from protocols import prometheus
from protocols.prometheus import Exemplar, Matcher, ReadQuery, WriteSeries, remote_pb2

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
    params = {
        "query": query,
        **({"start": start / 1000} if start is not None else {}),
        **({"end": end / 1000} if end is not None else {}),
    }
    return gateway.get(f"/api/v1/query_exemplars?{urllib.parse.urlencode(params)}", headers={"X-Scope-OrgID": tenant})


def read_samples(gateway, tenant, queries):
    """A remote read SAMPLES answer, parsed with protobuf's own classes (exemplars included)."""
    body = prometheus.encode_read_request(queries, [prometheus.SAMPLES])
    answer = gateway.post(
        "/api/v1/read", body, headers={"Content-Type": "application/x-protobuf", "X-Scope-OrgID": tenant}
    )
    assert answer.status == 200, answer.body
    response = remote_pb2.ReadResponse()
    response.ParseFromString(prometheus.decompress_block(answer.body, 1 << 24))
    return response


def test_rw1_and_rw2_exemplars_come_back_bit_exact(gateway, tenant):
    t = now_ms() - 60_000
    v1 = [
        WriteSeries(
            {"__name__": "http_latency_seconds_bucket", "le": "0.5"},
            [(t, 3.0), (t + 1000, 4.0)],
            exemplars=[
                Exemplar({"trace_id": "aaa", "span_id": "01"}, 0.25, t + 1),
                Exemplar({"trace_id": "bbb"}, STALE_NAN, t + 999),
            ],
        ),
        WriteSeries({"__name__": "http_latency_seconds_bucket", "le": "1"}, [(t, 5.0)]),
    ]
    answer = write(gateway, tenant, v1)
    assert answer.status == 204, answer.body
    v2 = [
        WriteSeries(
            {"__name__": "jobs_total", "queue": "q"},
            [(t, 1.0)],
            metric_type="counter",
            exemplars=[Exemplar({"trace_id": "ccc"}, -0.0, t + 5)],
        )
    ]
    answer = write(gateway, tenant, v2, version=2)
    assert answer.status == 204, answer.body
    assert answer.headers["X-Prometheus-Remote-Write-Exemplars-Written"] == "1"
    assert answer.headers["X-Prometheus-Remote-Write-Samples-Written"] == "1"

    found = query_exemplars(
        gateway,
        tenant,
        'sum(rate(http_latency_seconds_bucket[5m])) + on() group(jobs_total{queue="q"})',
        t - 1,
        t + 2000,
    )
    assert found.status == 200, found.body
    assert found.json() == {
        "status": "success",
        "data": [
            {
                "seriesLabels": {"__name__": "http_latency_seconds_bucket", "le": "0.5"},
                "exemplars": [
                    {"labels": {"span_id": "01", "trace_id": "aaa"}, "value": "0.25", "timestamp": (t + 1) / 1000},
                    {"labels": {"trace_id": "bbb"}, "value": "NaN", "timestamp": (t + 999) / 1000},
                ],
            },
            {
                "seriesLabels": {"__name__": "jobs_total", "queue": "q"},
                "exemplars": [
                    {"labels": {"trace_id": "ccc"}, "value": "-0", "timestamp": (t + 5) / 1000},
                ],
            },
        ],
    }
    later = query_exemplars(gateway, tenant, "http_latency_seconds_bucket", t + 2, t + 2000).json()["data"]
    assert [[e["labels"]["trace_id"] for e in s["exemplars"]] for s in later] == [["bbb"]]
    assert query_exemplars(gateway, tenant, "http_latency_seconds_bucket").json()["data"] == found.json()["data"][:1]

    response = read_samples(
        gateway,
        tenant,
        [
            ReadQuery(t - 1, t + 2000, [Matcher("EQ", "__name__", "http_latency_seconds_bucket")]),
            ReadQuery(t - 1, t + 2000, [Matcher("EQ", "__name__", "jobs_total")]),
        ],
    )
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
    answer = write(
        gateway,
        tenant,
        [WriteSeries({"__name__": "m"}, [(t, 1.0)], exemplars=exemplars + [Exemplar({}, 1.0, 1000)])],
        version=2,
    )
    assert (
        answer.status == 400
        and b"1 of 4 exemplars rejected: timestamp: 1000 ms is older than the accepted window" in answer.body
    )
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
    assert (
        write(
            gateway,
            tenant,
            [WriteSeries({"__name__": "only_exemplars", "job": "x"}, exemplars=[Exemplar({"id": "1"}, 2.0, t)])],
        ).status
        == 204
    )
    data = query_exemplars(gateway, tenant, '{job="x"}', t, t).json()["data"]
    assert data == [
        {
            "seriesLabels": {"__name__": "only_exemplars", "job": "x"},
            "exemplars": [{"labels": {"id": "1"}, "value": "2", "timestamp": t / 1000}],
        }
    ]
    (result,) = read_samples(gateway, tenant, [ReadQuery(t, t, [Matcher("EQ", "job", "x")])]).results
    assert [(len(s.samples), len(s.exemplars)) for s in result.timeseries] == [(0, 1)]


def test_query_exemplars_errors_are_bad_data(start_gateway, tenant):
    gateway = start_gateway()
    for params, words in [
        ({}, 'invalid parameter "query"'),
        ({"query": "up{"}, 'invalid parameter "query"'),
        ({"query": "up", "start": "20", "end": "10"}, "end timestamp must not be before start time"),
        ({"query": "up", "start": "yesterday"}, 'invalid parameter "start"'),
    ]:
        query = urllib.parse.urlencode(params)
        answer = gateway.get(f"/api/v1/query_exemplars?{query}", headers={"X-Scope-OrgID": tenant})
        assert answer.status == 400 and answer.json()["errorType"] == "bad_data", (params, answer.body)
        assert words in answer.json()["error"], (params, answer.body)
