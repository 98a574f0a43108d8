"""UTF-8 names answered as Prometheus 3.14 answers them: the same remote write 1.0 request (the
issue's ``http.server.request.duration{service.name="api", k8s.pod.name="p-1"}``, a dotted name
without labels, and a classic one) into Prometheus 3 and into tsgate, then the same questions of
both; and a Prometheus 3 reading tsgate through remote read gets the names as written. Prometheus 3 is
built by tests/prometheus3.py where the machine has not built it yet."""

import time
import urllib.parse
import urllib.request

import pytest

from protocols import prometheus
from protocols.prometheus import Matcher, ReadQuery, WriteSeries
from tests.prometheus3 import answer_getters, build
from tests.prometheusproc import PrometheusProcess

pytestmark = [
    pytest.mark.slow,
]

NAME = "http.server.request.duration"
LABELS = {"__name__": NAME, "service.name": "api", "k8s.pod.name": "p-1"}
RECEIVER = """
global:
  scrape_interval: 1h
"""
READER = """
global:
  scrape_interval: 1h
remote_read:
  - url: http://127.0.0.1:GATEWAY_PORT/api/v1/read?tenant=TENANT
    read_recent: true
"""
QUESTIONS = [
    ("/api/v1/query", {"query": '{"http.server.request.duration", "k8s.pod.name"="p-1"}'}),
    ("/api/v1/query", {"query": 'sum by ("service.name") ({"http.server.request.duration"})'}),
    ("/api/v1/query", {"query": '{"http.server.active_requests"}'}),
    ("/api/v1/query", {"query": 'up{"job"="x"}'}),
    ("/api/v1/series", {"match[]": '{"http.server.request.duration"}'}),
    ("/api/v1/labels", {}),
    ("/api/v1/label/__name__/values", {}),
    ("/api/v1/label/U__k8s_2e_pod_2e_name/values", {}),
    ("/api/v1/label/service.name/values", {}),
]


def written(now_ms: int) -> bytes:
    return prometheus.encode_write_request_v1(
        [
            WriteSeries(LABELS, [(now_ms - 2000, 0.25), (now_ms - 1000, 0.5)]),
            WriteSeries({"__name__": "http.server.active_requests"}, [(now_ms - 1000, 7.0)]),
            WriteSeries({"__name__": "up", "job": "x"}, [(now_ms - 1000, 1.0)]),
        ]
    )


def ask(get, path: str, params: dict, at: float) -> dict:
    if path.startswith("/api/v1/query"):
        params = {**params, "time": at}
    else:
        params = {**params, "start": at - 600, "end": at}
    answer = get(f"{path}?{urllib.parse.urlencode(params)}")
    assert answer["status"] == "success", (path, params, answer)
    data = answer["data"]
    if isinstance(data, dict):  # a vector: its series in order of labels
        data = sorted(data["result"], key=lambda r: sorted(r["metric"].items()))
    return data


def test_utf8_names_read_back_as_prometheus_3_answers(start_gateway, tmp_path, tenant):
    gateway = start_gateway()
    reference = PrometheusProcess(
        tmp_path / "p3", RECEIVER, "--web.enable-remote-write-receiver", binary=str(build())
    ).start()
    try:
        now_ms = int(time.time() * 1000)
        body = written(now_ms)
        headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy", "X-Scope-OrgID": tenant}
        assert gateway.post("/api/v1/write", body, headers=headers).status == 204
        request = urllib.request.Request(f"http://127.0.0.1:{reference.port}/api/v1/write", body, headers)
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 204
        at = now_ms / 1000
        from_gateway, from_reference = answer_getters(gateway, tenant, reference)
        answers = [
            (path, params, ask(from_reference, path, params, at), ask(from_gateway, path, params, at))
            for path, params in QUESTIONS
        ]
        assert [answer for answer in answers if answer[2] != answer[3]] == []

        # Prometheus 3's remote read answers the names as written; so does tsgate's.
        matchers = [Matcher("EQ", "__name__", NAME)]
        read = prometheus.encode_read_request([ReadQuery(now_ms - 60_000, now_ms, matchers)])
        read_headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy", "X-Scope-OrgID": tenant}
        request = urllib.request.Request(f"http://127.0.0.1:{reference.port}/api/v1/read", read, read_headers)
        with urllib.request.urlopen(request, timeout=30) as answer:
            expected = prometheus.decode_read_response(answer.read(), 1 << 20)
        got = prometheus.decode_read_response(gateway.post("/api/v1/read", read, headers=read_headers).body, 1 << 20)
        assert got == expected
    finally:
        reference.stop()


def test_prometheus_3_reads_utf8_names_from_tsgate(start_gateway, tmp_path, tenant):
    """A Prometheus 3 with tsgate as its remote read (its User-Agent says 3.x): the series comes
    as written, and Prometheus 3 takes it, where a 2.x reader gets the mapped names."""
    gateway = start_gateway()
    now_ms = int(time.time() * 1000)
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy", "X-Scope-OrgID": tenant}
    assert gateway.post("/api/v1/write", written(now_ms), headers=headers).status == 204
    config = READER.replace("GATEWAY_PORT", str(gateway.port)).replace("TENANT", tenant)
    reader = PrometheusProcess(tmp_path / "reader", config, binary=str(build())).start()
    try:
        answer = reader.api(
            "/api/v1/query", query='{"http.server.request.duration", "k8s.pod.name"="p-1"}', time=now_ms / 1000
        )
        assert answer["status"] == "success", answer
        assert [(r["metric"], r["value"][1]) for r in answer["data"]["result"]] == [(LABELS, "0.5")]
    finally:
        reader.stop()
