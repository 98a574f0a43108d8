"""A real Prometheus 2.42 remote-writes into tsgate; a second one reads back through remote read.
Both must answer the same queries the same way. Runs on both backends.

The tenant travels as ``?tenant=`` in the URLs: Debian's Prometheus 2.42 does not send the
``headers`` configured for remote write (checked: a capture shows none of them).
"""

import threading
import time
import urllib.parse

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from gateway.devservices.process import free_port
from tests.prometheusproc import PrometheusProcess

WRITER = """
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: prometheus
    static_configs: [{targets: ["127.0.0.1:SELF_PORT"]}]
  - job_name: exporter
    static_configs: [{targets: ["127.0.0.1:EXPORTER_PORT"]}]
remote_write:
  - url: http://127.0.0.1:GATEWAY_PORT/api/v1/write?tenant=TENANT
    queue_config: {batch_send_deadline: 500ms, min_backoff: 100ms, max_backoff: 1s}
    metadata_config: {send: true, send_interval: 2s}
    send_exemplars: true
"""

READER = """
global:
  scrape_interval: 1m
remote_read:
  - url: http://127.0.0.1:GATEWAY_PORT/api/v1/read?tenant=TENANT
    read_recent: true
"""

INSTANT_QUERIES = [
    "tsgate_e2e_requests_total",
    "rate(tsgate_e2e_requests_total[5s])",
    "tsgate_e2e_temperature_celsius",
    "up",
    "sum by (job) (up)",
    'prometheus_http_requests_total{handler="/metrics"}',
    'count({__name__=~"prometheus_tsdb_head_.*"})',
    'tsgate_e2e_requests_total{path=~"/a|/b"}',
    'tsgate_e2e_requests_total{path!="/a"}',
]


def configured(template: str, **values) -> str:
    for key, value in values.items():
        template = template.replace(key, str(value))
    return template


def canonical(answer: dict):
    assert answer["status"] == "success", answer
    data = answer["data"]
    return data["resultType"], sorted((sorted(item["metric"].items()), item.get("value") or item.get("values")) for item in data["result"])


def wait_for_first_scrape(prometheus, timeout: float = 30) -> None:
    """Prometheus applies scrape targets only after a 5 s discovery throttle."""
    deadline = time.monotonic() + timeout
    while not prometheus.api("/api/v1/query", query="tsgate_e2e_requests_total")["data"]["result"]:
        assert time.monotonic() < deadline, "the writer Prometheus never scraped the exporter"
        time.sleep(0.5)


@pytest.fixture
def exporter():
    """A small exporter whose counter and gauge change while Prometheus scrapes it; each increment of
    /a carries an exemplar (a new trace id), which Prometheus sees over OpenMetrics."""
    registry = CollectorRegistry()
    requests = Counter("tsgate_e2e_requests", "Requests served.", ["path"], registry=registry)
    temperature = Gauge("tsgate_e2e_temperature", "Room temperature.", ["room"], unit="celsius", registry=registry)
    port = free_port()
    server, thread = start_http_server(port, "127.0.0.1", registry)
    stop = threading.Event()

    def churn():
        tick = 0
        while not stop.wait(0.3):
            tick += 1
            requests.labels("/a").inc(exemplar={"trace_id": f"{tick:016x}"})
            requests.labels("/b").inc(tick % 3)
            temperature.labels("lab").set(20 + tick % 7 + 0.25)

    worker = threading.Thread(target=churn, daemon=True)
    worker.start()
    yield port
    stop.set()
    server.shutdown()


def test_real_prometheus_round_trip(start_gateway, backend_args, exporter, tmp_path, tenant):
    gateway = start_gateway(*backend_args)
    values = dict(GATEWAY_PORT=gateway.port, EXPORTER_PORT=exporter, TENANT=tenant)
    writer = PrometheusProcess(tmp_path / "writer", configured(WRITER, **values)).start()
    reader = PrometheusProcess(tmp_path / "reader", configured(READER, **values)).start()
    try:
        wait_for_first_scrape(writer)
        time.sleep(6)
        at = int(time.time()) - 2
        deadline = time.monotonic() + 45
        while True:
            mismatches = []
            for query in INSTANT_QUERIES:
                expected = canonical(writer.api("/api/v1/query", query=query, time=at))
                got = canonical(reader.api("/api/v1/query", query=query, time=at))
                assert expected[1], f"{query} has no result in the writer"
                if got != expected:
                    mismatches.append((query, expected, got))
            expected = canonical(writer.api("/api/v1/query_range", query="tsgate_e2e_temperature_celsius", start=at - 6, end=at, step=1))
            got = canonical(reader.api("/api/v1/query_range", query="tsgate_e2e_temperature_celsius", start=at - 6, end=at, step=1))
            if got != expected:
                mismatches.append(("range", expected, got))
            if not mismatches or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert mismatches == []
        metadata = gateway.get("/api/v1/metadata?metric=tsgate_e2e_requests", headers={"X-Scope-OrgID": tenant}).json()
        assert metadata["data"]["tsgate_e2e_requests"] == [{"type": "counter", "help": "Requests served.", "unit": ""}]
        native = gateway.get("/api/query?metricName=tsgate_e2e_temperature_celsius&start=1m-ago", headers={"X-Scope-OrgID": tenant}).json()
        assert native and native[0]["tags"]["room"] == "lab"
        target = "seriesByTag('name=tsgate_e2e_temperature_celsius','room=lab')"
        rendered = gateway.get(f"/render?target={target}&from=-2min&format=json&tenant={tenant}").json()
        assert rendered[0]["tags"] == {"name": "tsgate_e2e_temperature_celsius", "room": "lab", "job": "exporter", "instance": f"127.0.0.1:{exporter}"}
        assert any(value is not None for value, _ in rendered[0]["datapoints"])
    finally:
        writer.stop()
        reader.stop()
    assert "Traceback" not in gateway.log()


def test_graphite_style_names_read_back_through_real_prometheus(start_gateway, backend_args, tmp_path, tenant):
    gateway = start_gateway(*backend_args)
    now = int(time.time())
    batch = [{"metricName": "servers.web-1.cpu.idle", "tags": {"dc": "x"}, "ts": now - 10 + i, "value": float(i)} for i in range(5)]
    assert gateway.post("/api/write", batch, headers={"X-Scope-OrgID": tenant}).status == 200
    reader = PrometheusProcess(tmp_path / "reader", configured(READER, GATEWAY_PORT=gateway.port, TENANT=tenant)).start()
    try:
        answer = reader.api("/api/v1/query", query="servers_web_1_cpu_idle", time=now - 6)
        assert answer["status"] == "success", answer
        assert [(r["metric"], r["value"][1]) for r in answer["data"]["result"]] == [({"__name__": "servers_web_1_cpu_idle", "dc": "x"}, "4")]
        regex = reader.api("/api/v1/query", query='{__name__=~"servers_.*", dc="x"}', time=now - 6)
        assert len(regex["data"]["result"]) == 1
    finally:
        reader.stop()


def canonical_exemplars(answer: dict) -> list:
    assert answer["status"] == "success", answer
    return sorted((sorted(item["seriesLabels"].items()), item["exemplars"]) for item in answer["data"])


def test_real_prometheus_sends_exemplars_and_both_answer_alike(start_gateway, backend_args, exporter, tmp_path, tenant):
    """Prometheus 2.42 with exemplar storage scrapes exemplars and remote-writes them
    (send_exemplars); tsgate's /api/v1/query_exemplars then answers what Prometheus's own does."""
    gateway = start_gateway(*backend_args)
    values = dict(GATEWAY_PORT=gateway.port, EXPORTER_PORT=exporter, TENANT=tenant)
    writer = PrometheusProcess(tmp_path / "writer", configured(WRITER, **values), "--enable-feature=exemplar-storage").start()
    try:
        query = 'rate(tsgate_e2e_requests_total{path="/a"}[1m])'
        deadline = time.monotonic() + 60
        while True:
            end = time.time() - 3
            params = {"query": query, "start": end - 30, "end": end}
            expected = canonical_exemplars(writer.api("/api/v1/query_exemplars", **params))
            got = canonical_exemplars(gateway.get("/api/v1/query_exemplars?" + urllib.parse.urlencode(params), headers={"X-Scope-OrgID": tenant}).json())
            if expected and len(expected[0][1]) >= 5 and got == expected:
                break
            assert time.monotonic() < deadline, (expected, got)
            time.sleep(1)
        labels, exemplars = got[0]
        assert dict(labels)["job"] == "exporter" and exemplars[0]["labels"]["trace_id"] and exemplars[0]["value"] == "1"
    finally:
        writer.stop()
    assert "Traceback" not in gateway.log()
