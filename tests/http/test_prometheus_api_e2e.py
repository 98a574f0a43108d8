"""Remote write and remote read over real HTTP, request by request, with hand-built protobufs:
every status code of the spec, RW 2.0 headers, and the streamed read."""

import struct
import time

import cramjam
import pytest

from protocols import prometheus
from protocols.prometheus import Matcher, ReadQuery, WriteMetadata, WriteSeries, remote_pb2

STALE_NAN_BITS = 0x7FF0000000000002
V2 = "application/x-protobuf;proto=io.prometheus.write.v2.Request"


def rw_headers(tenant, content_type="application/x-protobuf", encoding="snappy"):
    headers = {"Content-Type": content_type, "X-Prometheus-Remote-Write-Version": "0.1.0", "X-Scope-OrgID": tenant}
    if encoding:
        headers["Content-Encoding"] = encoding
    return headers


def now_ms() -> int:
    return int(time.time() * 1000)


def series(name, samples, **labels):
    return WriteSeries({"__name__": name, **labels}, samples)


def read(gateway, tenant, queries, accepted=()):
    body = prometheus.encode_read_request(queries, accepted)
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy", "X-Scope-OrgID": tenant}
    return gateway.post("/api/v1/read", body, headers=headers)


def test_remote_write_v1_then_read_back(gateway, tenant):
    t = now_ms() - 60_000
    body = prometheus.encode_write_request_v1(
        [
            series("http_requests_total", [(t, 1.0), (t + 1000, 2.0)], job="api", code="200"),
            series("http_requests_total", [(t, 5.0)], job="api", code="500"),
            series("http_requests_total", [(t, 7.0)], job="web", code="200"),
        ],
        [WriteMetadata("http_requests_total", "counter", "Requests.")],
    )
    answer = gateway.post("/api/v1/write", body, headers=rw_headers(tenant))
    assert answer.status == 204, answer.body
    assert "X-Prometheus-Remote-Write-Samples-Written" not in answer.headers
    queries = [
        ReadQuery(t - 1, t + 5000, [Matcher("EQ", "__name__", "http_requests_total"), Matcher("EQ", "job", "api")]),
        ReadQuery(t - 1, t + 5000, [Matcher("RE", "__name__", "http_.*"), Matcher("NEQ", "code", "200")]),
        ReadQuery(t - 1, t + 5000, [Matcher("EQ", "__name__", "http_requests_total"), Matcher("RE", "job", "a.i|w.b")]),
        ReadQuery(
            t - 1,
            t + 5000,
            [
                Matcher("EQ", "__name__", "http_requests_total"),
                Matcher("NRE", "job", "api"),
                Matcher("EQ", "missing", ""),
            ],
        ),
        ReadQuery(t + 500, t + 5000, [Matcher("EQ", "__name__", "http_requests_total"), Matcher("EQ", "code", "200")]),
        ReadQuery(t - 1, t + 5000, [Matcher("EQ", "__name__", "nothing_here")]),
    ]
    answer = read(gateway, tenant, queries)
    assert answer.status == 200 and answer.headers["Content-Encoding"] == "snappy"
    results = prometheus.decode_read_response(answer.body, 1 << 20)
    codes = [[(labels.get("job"), labels["code"], samples) for labels, samples in result] for result in results]
    assert codes == [
        [("api", "200", [(t, 1.0), (t + 1000, 2.0)]), ("api", "500", [(t, 5.0)])],
        [("api", "500", [(t, 5.0)])],
        [("api", "200", [(t, 1.0), (t + 1000, 2.0)]), ("web", "200", [(t, 7.0)]), ("api", "500", [(t, 5.0)])],
        [("web", "200", [(t, 7.0)])],
        [("api", "200", [(t + 1000, 2.0)])],
        [],
    ]
    assert results[0][0][0] == {"__name__": "http_requests_total", "job": "api", "code": "200"}


def test_remote_write_v2_and_push_path(gateway, tenant):
    t = now_ms() - 10_000
    body = prometheus.encode_write_request_v2(
        [
            WriteSeries(
                {"__name__": "queue_depth", "queue": "a"},
                [(t, 3.0), (t + 1, 4.0)],
                metric_type="gauge",
                help="Depth.",
                unit="items",
            ),
        ]
    )
    answer = gateway.post("/api/v1/push", body, headers=rw_headers(tenant, V2))
    assert answer.status == 204, answer.body
    assert answer.headers["X-Prometheus-Remote-Write-Samples-Written"] == "2"
    assert answer.headers["X-Prometheus-Remote-Write-Histograms-Written"] == "0"
    assert answer.headers["X-Prometheus-Remote-Write-Exemplars-Written"] == "0"
    metadata = gateway.get("/api/v1/metadata?metric=queue_depth", headers={"X-Scope-OrgID": tenant}).json()
    assert metadata["data"] == {"queue_depth": [{"type": "gauge", "help": "Depth.", "unit": "items"}]}
    native = gateway.get("/api/query?metricName=queue_depth&start=1m-ago", headers={"X-Scope-OrgID": tenant}).json()
    assert native[0]["tags"] == {"queue": "a"} and len(native[0]["values"]) == 2


def test_labels_out_of_order_are_written_as_one_series(gateway, tenant):
    """Prometheus's receiver sorts labels; senders in map order (the compliance suite) rely on it."""
    t = now_ms() - 10_000
    request = remote_pb2.WriteRequest()
    for offset, names in enumerate([("zeta", "__name__", "alpha"), ("__name__", "alpha", "zeta")]):
        ts = request.timeseries.add()
        for name in names:
            ts.labels.add(name=name, value="m" if name == "__name__" else name[0])
        ts.samples.add(timestamp=t + offset, value=float(offset))
    answer = gateway.post(
        "/api/v1/write", bytes(cramjam.snappy.compress_raw(request.SerializeToString())), headers=rw_headers(tenant)
    )
    assert answer.status == 204, answer.body
    (result,) = prometheus.decode_read_response(
        read(gateway, tenant, [ReadQuery(t - 1, t + 5, [Matcher("EQ", "__name__", "m")])]).body, 1 << 20
    )
    assert result == [({"__name__": "m", "alpha": "a", "zeta": "z"}, [(t, 0.0), (t + 1, 1.0)])]


def test_metadata_over_the_length_limit_is_skipped_and_its_samples_written(start_gateway, tenant):
    """8 MB of help text used to be stored and served."""
    gateway = start_gateway("--max-metadata-length", "100")
    t = now_ms() - 10_000
    body = prometheus.encode_write_request_v2(
        [
            WriteSeries(
                {"__name__": "chatty", "queue": "a"}, [(t, 3.0)], metric_type="gauge", help="x" * 101, unit="items"
            ),
            WriteSeries(
                {"__name__": "quiet", "queue": "a"}, [(t, 4.0)], metric_type="gauge", help="Short.", unit="items"
            ),
        ]
    )
    assert gateway.post("/api/v1/push", body, headers=rw_headers(tenant, V2)).status == 204
    headers = {"X-Scope-OrgID": tenant}
    assert gateway.get("/api/v1/metadata?metric=chatty", headers=headers).json()["data"] == {}
    assert gateway.get("/api/v1/metadata?metric=quiet", headers=headers).json()["data"]["quiet"][0]["help"] == "Short."
    assert len(gateway.get("/api/query?metricName=chatty&start=1m-ago", headers=headers).json()[0]["values"]) == 1
    assert 'tsgate_prometheus_skipped_total{kind="metadata_too_long"} 1.0' in gateway.get("/metrics").body.decode()


def test_streamed_xor_chunks(gateway, tenant):
    t = now_ms() - 600_000
    samples = [(t + i * 1000, float(i % 17) / 3) for i in range(300)]
    stale = (t + 300_000, struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0])
    body = prometheus.encode_write_request_v1(
        [series("up", samples + [stale], job="a"), series("up", samples[:5], job="b")]
    )
    assert gateway.post("/api/v1/write", body, headers=rw_headers(tenant)).status == 204
    queries = [
        ReadQuery(t, t + 400_000, [Matcher("EQ", "__name__", "up")]),
        ReadQuery(t, t + 400_000, [Matcher("EQ", "job", "b"), Matcher("EQ", "__name__", "up")]),
    ]
    answer = read(gateway, tenant, queries, accepted=[prometheus.STREAMED_XOR_CHUNKS, prometheus.SAMPLES])
    assert answer.status == 200
    assert answer.headers["Content-Type"] == prometheus.STREAMED_CONTENT_TYPE
    frames = list(prometheus.decode_chunked_read_response(answer.body))
    assert [(index, labels["job"], len(points)) for index, labels, points in frames] == [
        (0, "a", 301),
        (0, "b", 5),
        (1, "b", 5),
    ]
    assert frames[0][2][:300] == samples
    assert struct.pack("<d", frames[0][2][300][1]) == struct.pack("<Q", STALE_NAN_BITS)


@pytest.fixture
def strict_gateway(start_gateway):
    return start_gateway(
        "--max-decompressed-bytes",
        "4096",
        "--max-body-bytes",
        "100000",
        "--max-series-per-query",
        "2",
        "--tenant-max-samples-per-second",
        "20",
    )


def test_rejections(strict_gateway, tenant):
    gateway = strict_gateway
    good = prometheus.encode_write_request_v1([series("m", [(now_ms(), 1.0)])])

    def write(body, **kwargs):
        return gateway.post("/api/v1/write", body, headers=rw_headers(tenant, **kwargs))

    bad_snappy = write(b"\x10\xff\xfe not snappy")
    assert bad_snappy.status == 400
    assert write(bytes(cramjam.snappy.compress_raw(b"\x0a\x05garbage-protobuf"))).status == 400
    assert write(good, content_type="text/plain").status == 415
    assert write(good, encoding="gzip").status == 415
    bomb = bytes(cramjam.snappy.compress_raw(b"\0" * 100_000))
    assert len(bomb) < 100_000
    too_big = write(bomb)
    assert too_big.status == 413 and b"4096" in too_big.body
    assert write(b"x" * 200_000).status == 413
    request = remote_pb2.WriteRequest()
    ts = request.timeseries.add()
    ts.labels.add(name="zeta", value="1")
    ts.labels.add(name="__name__", value="m")
    ts.labels.add(name="zeta", value="2")
    ts.samples.add(timestamp=now_ms(), value=1.0)
    answer = write(bytes(cramjam.snappy.compress_raw(request.SerializeToString())))
    assert answer.status == 400 and b"duplicate label name 'zeta'" in answer.body
    no_name = remote_pb2.WriteRequest()
    no_name.timeseries.add().labels.add(name="job", value="x")
    answer = write(bytes(cramjam.snappy.compress_raw(no_name.SerializeToString())))
    assert answer.status == 400 and b"__name__" in answer.body
    partial = prometheus.encode_write_request_v1([series("m", [(now_ms() - 1000, 1.0), (1000, 2.0)])])
    answer = write(partial)
    assert answer.status == 400 and b"1 of 2 samples rejected" in answer.body
    assert "Traceback" not in gateway.log()


def test_tenant_rate_limit_answers_429(strict_gateway, tenant):
    t = now_ms() - 1000
    body = prometheus.encode_write_request_v1([series("m", [(t - i, float(i)) for i in range(60)])])
    statuses = [strict_gateway.post("/api/v1/write", body, headers=rw_headers(tenant)) for _ in range(3)]
    assert statuses[0].status == 204
    assert statuses[-1].status == 429 and int(statuses[-1].headers["Retry-After"]) >= 1
    other = strict_gateway.post("/api/v1/write", body, headers=rw_headers(tenant + "-other"))
    assert other.status == 204


def test_remote_read_refuses_too_many_series(strict_gateway, tenant):
    t = now_ms() - 1000
    body = prometheus.encode_write_request_v1([series("wide", [(t, 1.0)], i=str(i)) for i in range(3)])
    assert strict_gateway.post("/api/v1/write", body, headers=rw_headers(tenant)).status == 204
    answer = read(strict_gateway, tenant, [ReadQuery(t - 1, t + 1, [Matcher("EQ", "__name__", "wide")])])
    assert answer.status == 422 and b"--max-series-per-query" in answer.body
    bad_regex = read(strict_gateway, tenant, [ReadQuery(t - 1, t + 1, [Matcher("RE", "__name__", "(")])])
    assert bad_regex.status == 400
    assert strict_gateway.post("/api/v1/read", b"\x00junk", headers={"X-Scope-OrgID": tenant}).status == 400


def test_tenant_active_series_limit_refuses_only_the_new_series(start_gateway, tenant):
    gateway = start_gateway("--tenant-max-active-series", "3")
    t = now_ms() - 1000
    first = prometheus.encode_write_request_v1([series("m", [(t, 1.0)], i=str(i)) for i in range(3)])
    assert gateway.post("/api/v1/write", first, headers=rw_headers(tenant)).status == 204
    assert gateway.post("/api/v1/write", first, headers=rw_headers(tenant)).status == 204
    more = prometheus.encode_write_request_v1(
        [series("m", [(t + 1, 2.0)], i="new"), series("m", [(t + 1, 2.0)], i="0")]
    )
    refused = gateway.post("/api/v1/write", more, headers=rw_headers(tenant))
    assert refused.status == 400 and b"active series" in refused.body, refused.body
    stored = gateway.get(f"/api/query?tenant={tenant}&metricName=m&start={t // 1000 - 60}&end=now").json()
    assert {s["tags"]["i"]: len(s["values"]) for s in stored} == {
        "0": 2,
        "1": 1,
        "2": 1,
    }  # the known series' sample written
    assert gateway.post("/api/v1/write", more, headers=rw_headers(tenant + "-other")).status == 204
