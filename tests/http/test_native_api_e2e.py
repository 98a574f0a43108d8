"""The native JSON API end to end: a real `tsgate serve` process, real sockets, real HTTP."""

import http.client
import signal
import time
import urllib.parse

import pytest

from tests.gatewayproc import GatewayProcess

pytestmark = pytest.mark.slow  # the sigterm tests start tsgate themselves; the rest use the gateway fixture


def now_s() -> int:
    return int(time.time())


def q(**params) -> str:
    return urllib.parse.urlencode(params, doseq=True)


def test_write_single_then_metadata_and_query(gateway, tenant):
    t0 = now_s() - 60
    for host, os_, value in [("h-1", "linux", 1.5), ("h-2", "linux", 2.5), ("h-3", "windows", 3.5)]:
        body = {"tenant": tenant, "metricName": "cpu_idle", "tags": {"host": host, "os": os_}, "ts": t0, "value": value}
        answer = gateway.post("/api/write/single", body)
        assert answer.status == 200, answer.body
        assert answer.json() == {"accepted": 1, "rejected": []}
    assert tenant in gateway.get("/api/metadata/tenants").json()
    assert gateway.get("/api/metadata/metricNames?" + q(tenant=tenant)).json() == ["cpu_idle"]
    assert gateway.get("/api/metadata/tagKeys?" + q(tenant=tenant, metricName="cpu_idle")).json() == ["host", "os"]
    values = gateway.get("/api/metadata/tagValues?" + q(tenant=tenant, metricName="cpu_idle", tagKey="os")).json()
    assert values == ["linux", "windows"]
    answer = gateway.get(
        "/api/query?" + q(tenant=tenant, metricName="cpu_idle", tag=["os=linux"], start=t0 - 10, end="now")
    )
    assert answer.status == 200
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0))
    assert answer.json() == [
        {"tenant": tenant, "metricName": "cpu_idle", "tags": {"host": "h-1", "os": "linux"}, "values": {iso: 1.5}},
        {"tenant": tenant, "metricName": "cpu_idle", "tags": {"host": "h-2", "os": "linux"}, "values": {iso: 2.5}},
    ]
    two_tags = gateway.get(
        "/api/query?" + q(tenant=tenant, metricName="cpu_idle", tag=["os=linux", "host=h-2"], start="5m-ago")
    )
    assert [r["tags"]["host"] for r in two_tags.json()] == ["h-2"]
    everything = gateway.get("/api/query?" + q(tenant=tenant, metricName="cpu_idle", start="5m-ago"))
    assert len(everything.json()) == 3
    assert (
        gateway.get("/api/query?" + q(tenant=tenant, metricName="cpu_idle", tag=["os=linux", "os=windows"])).json()
        == []
    )


def test_write_batch_and_put(gateway, tenant):
    t0 = now_s() - 30
    batch = [{"metricName": "m", "tags": {"i": str(i)}, "ts": t0 + i, "value": i} for i in range(50)]
    answer = gateway.post("/api/write", batch, headers={"X-Tenant": tenant})
    assert answer.json() == {"accepted": 50, "rejected": []}
    put = [
        {"metric": "sys.cpu", "tags": {"host": "a"}, "timestamp": (t0 + i) * 1000, "value": str(i)} for i in range(3)
    ]
    assert gateway.post("/api/put", put, headers={"X-Tenant": tenant}).status == 200
    assert gateway.post("/api/put", put[0], headers={"X-Tenant": tenant}).status == 200
    result = gateway.get("/api/query?" + q(metricName="sys.cpu", start=t0 - 1), headers={"X-Tenant": tenant}).json()
    assert list(result[0]["values"].values()) == [0.0, 1.0, 2.0]
    assert len(gateway.get("/api/query?" + q(tenant=tenant, metricName="m", start=t0 - 1)).json()) == 50


def test_tenants_never_see_each_other(gateway, tenant):
    other = tenant + "-b"
    body = {"metricName": "secret", "tags": {"k": "v"}, "value": 1}
    assert gateway.post("/api/write/single", body, headers={"X-Scope-OrgID": tenant}).status == 200
    assert gateway.get("/api/metadata/metricNames", headers={"X-Scope-OrgID": other}).json() == []
    assert gateway.get("/api/metadata/tagKeys?metricName=secret", headers={"X-Tenant": other}).json() == []
    assert gateway.get("/api/query?" + q(tenant=other, metricName="secret")).json() == []
    assert gateway.get("/api/query?metricName=secret").json() == []
    assert len(gateway.get("/api/query?metricName=secret", headers={"X-Scope-OrgID": tenant}).json()) == 1
    stolen = gateway.post("/api/write/single", {**body, "tenant": other}, headers={"X-Scope-OrgID": tenant})
    assert stolen.status == 400 and stolen.json()["rejected"][0]["field"] == "tenant"


def test_default_tenant(gateway):
    assert gateway.post("/api/write/single", {"metricName": "plain", "value": 1}).status == 200
    assert "plain" in gateway.get("/api/metadata/metricNames").json()
    assert "plain" in gateway.get("/api/metadata/metricNames?tenant=default").json()


def test_partial_batch_writes_the_good_samples(gateway, tenant):
    batch = [
        {"metricName": "good", "value": 1},
        {"metricName": "", "value": 1},
        {"metricName": "good", "tags": {"k": ""}, "value": 1},
        {"metricName": "good", "ts": 1, "value": 1},
        {"metricName": "good", "value": "abc"},
        {"metricName": "good", "tags": {"x": "y"}, "value": 2},
    ]
    answer = gateway.post("/api/write", batch, headers={"X-Tenant": tenant})
    assert answer.status == 400
    document = answer.json()
    assert document["accepted"] == 2 and document["rejectedCount"] == 4
    assert [(r["index"], r["field"]) for r in document["rejected"]] == [
        (1, "metricName"),
        (2, "tags.k"),
        (3, "timestamp"),
        (4, "value"),
    ]
    assert len(gateway.get("/api/query?" + q(tenant=tenant, metricName="good")).json()) == 2


def test_client_mistakes_get_4xx_with_a_message(start_gateway):
    gateway = start_gateway("--max-body-bytes", "2000", "--max-series-per-query", "2")
    cases = [
        (gateway.post("/api/write/single", b"{oops"), 400, "JSON"),
        (gateway.post("/api/write/single", b"[1]"), 400, "one JSON object"),
        (gateway.post("/api/write", b'{"a": 1}'), 400, "array"),
        (gateway.post("/api/write/single", b"\xff\xfe\x00"), 400, "UTF-8"),
        (
            gateway.post("/api/write/single", {"metricName": "m", "value": 1}, headers={"X-Tenant": "bad tenant"}),
            400,
            "tenant",
        ),
        (gateway.post("/api/write", b"[" + b'{"metricName": "m", "value": 1},' * 100 + b"{}]"), 413, "limit"),
        (gateway.get("/api/nope"), 404, "no such endpoint"),
        (gateway.get("/api/write"), 405, "POST"),
        (gateway.post("/api/query", b""), 405, "GET"),
        (gateway.get("/api/query"), 400, "metricName"),
        (gateway.get("/api/metadata/tagValues?metricName=m"), 400, "tagKey"),
        (gateway.get("/api/query?metricName=m&tag=novalue"), 400, "key=value"),
        (gateway.get("/api/query?metricName=m&start=tomorrow"), 400, "not a time"),
        (gateway.get("/api/query?metricName=m&start=now&end=1h-ago"), 400, "after"),
        (gateway.get("/api/query?metricName=%ff"), 400, "UTF-8"),
    ]
    for answer, status, words in cases:
        assert answer.status == status, (status, answer.body)
        assert words in answer.json()["error"], answer.body
    assert gateway.get("/api/write").headers["Allow"] == "POST"
    for i in range(3):
        gateway.post("/api/write/single", {"metricName": "wide", "tags": {"i": str(i)}, "value": 1})
    too_wide = gateway.get("/api/query?metricName=wide")
    assert too_wide.status == 422 and "limit of 2" in too_wide.json()["error"]
    assert "Traceback" not in gateway.log()


def test_chunked_body_over_the_limit(start_gateway):
    gateway = start_gateway("--max-body-bytes", "1000")
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    chunks = (b'{"metricName": "m", "value": 1}' + b" " * 100 for _ in range(20))
    connection.request("POST", "/api/write/single", body=chunks, encode_chunked=True)
    answer = connection.getresponse()
    assert answer.status == 413


def test_metrics_and_health(gateway, tenant):
    gateway.post(
        "/api/write", [{"metricName": "m", "value": 1}, {"metricName": "", "value": 1}], headers={"X-Tenant": tenant}
    )
    assert gateway.get("/healthz").json() == {"status": "ok"}
    exposition = gateway.get("/metrics").body.decode()
    assert 'tsgate_samples_accepted_total{protocol="json"} 1.0' in exposition
    assert 'tsgate_samples_rejected_total{protocol="json",reason="bad_metric_name"} 1.0' in exposition
    assert 'tsgate_http_request_duration_seconds_count{code="400",handler="write",method="POST"} 1.0' in exposition
    assert 'tsgate_store_operation_duration_seconds_count{operation="write_raw"}' in exposition


def test_invented_http_methods_do_not_grow_the_metrics(start_gateway):
    """2,000 requests with made-up methods used to add 2,000 label values (48 KB -> 71.6 MB)."""
    gateway = start_gateway()
    before = len(gateway.get("/metrics").body)
    for number in range(200):
        connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
        connection.request(f"M{number:04d}", "/api/query")
        assert connection.getresponse().status == 405
        connection.close()
    exposition = gateway.get("/metrics").body.decode()
    assert 'handler="unknown",method="other"' in exposition
    assert "M0001" not in exposition and len(exposition) < before + 20_000


def test_sigterm_flushes_and_data_survives_a_restart(tmp_path, tenant):
    data_dir = str(tmp_path / "durable")
    first = GatewayProcess(tmp_path, "--data-dir", data_dir).start()
    batch = [{"metricName": "kept", "tags": {"i": str(i)}, "value": i} for i in range(200)]
    assert first.post("/api/write", batch, headers={"X-Tenant": tenant}).status == 200
    assert first.stop() == 0
    assert "stopped" in first.log()
    second = GatewayProcess(tmp_path, "--data-dir", data_dir).start()
    try:
        assert len(second.get("/api/query?" + q(tenant=tenant, metricName="kept")).json()) == 200
    finally:
        assert second.stop() == 0


def test_sigint_also_stops_cleanly(tmp_path):
    process = GatewayProcess(tmp_path).start()
    try:
        process.process.send_signal(signal.SIGINT)
        assert process.process.wait(30) == 0
    finally:
        if process.process.poll() is None:  # the signal was not handled: do not leave it running
            process.process.kill()
            process.process.wait()
