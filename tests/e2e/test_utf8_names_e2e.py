"""Prometheus 3's UTF-8 names end to end, through a real gateway on SQLite and on Cassandra: a
series named ``http.server.request.duration{service.name="api", k8s.pod.name="p-1"}`` written by
remote write 1.0 and 2.0 reads back as written on every read API (docs/prometheus.rst, UTF-8
names); and partial acceptance: the valid series of a request beside an invalid one are stored,
the answer is a 400 naming the invalid one."""

import json
import time
import urllib.parse

from protocols import prometheus
from protocols.prometheus import Exemplar, Matcher, ReadQuery, WriteSeries
from tests.gatewayproc import metric_value

V1 = "application/x-protobuf"
V2 = "application/x-protobuf;proto=io.prometheus.write.v2.Request"
NAME = "http.server.request.duration"
LABELS = {"__name__": NAME, "service.name": "api", "k8s.pod.name": "p-1"}
V2_NAME = "db.client.operation.duration"
V2_LABELS = {"__name__": V2_NAME, "db.system": "sqlite"}
UNLABELLED = "http.server.active_requests"


def write(gateway, tenant, body: bytes, content_type: str = V1):
    headers = {"Content-Type": content_type, "Content-Encoding": "snappy", "X-Scope-OrgID": tenant}
    return gateway.post("/api/v1/write", body, headers=headers)


def api(gateway, tenant, path: str, **params):
    answer = gateway.get(f"{path}?{urllib.parse.urlencode(params, doseq=True)}", headers={"X-Scope-OrgID": tenant})
    assert answer.status == 200, (path, params, answer.body)
    return json.loads(answer.body)


def remote_read(gateway, tenant, matchers, start_ms, end_ms, user_agent=None):
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy", "X-Scope-OrgID": tenant}
    if user_agent:
        headers["User-Agent"] = user_agent
    body = prometheus.encode_read_request([ReadQuery(start_ms, end_ms, matchers)])
    answer = gateway.post("/api/v1/read", body, headers=headers)
    assert answer.status == 200, answer.body
    [result] = prometheus.decode_read_response(answer.body, 1 << 20)
    return result


def test_utf8_names_are_stored_and_read_back_as_written_on_every_read_api(gateway, tenant):
    now_ms = int(time.time() * 1000)
    t = now_ms - 60_000
    series = [WriteSeries(LABELS, [(t, 0.25), (t + 1000, 0.5)]), WriteSeries({"__name__": UNLABELLED}, [(t, 7.0)])]
    answer = write(gateway, tenant, prometheus.encode_write_request_v1(series))
    assert answer.status == 204, answer.body
    v2 = WriteSeries(
        V2_LABELS,
        [(t, 3.0)],
        metric_type="histogram",
        help="Duration of database client operations.",
        unit="s",
        exemplars=[Exemplar({"trace.id": "abc"}, 3.0, t)],
    )
    answer = write(gateway, tenant, prometheus.encode_write_request_v2([v2]), V2)
    assert answer.status == 204, answer.body
    assert answer.headers["X-Prometheus-Remote-Write-Samples-Written"] == "1"
    at = (t + 1000) / 1000

    # PromQL: a quoted selector, quoted label names in a matcher and in by().
    query = api(
        gateway, tenant, "/api/v1/query", query='{"http.server.request.duration", "k8s.pod.name"="p-1"}', time=at
    )
    assert [(r["metric"], r["value"][1]) for r in query["data"]["result"]] == [(LABELS, "0.5")]
    query = api(gateway, tenant, "/api/v1/query", query=f'sum by ("service.name") ({{"{NAME}"}})', time=at)
    assert [r["metric"] for r in query["data"]["result"]] == [{"service.name": "api"}]
    query = api(gateway, tenant, "/api/v1/query", query=f'{{__name__="{NAME}", "service.name"=~"a.i"}}', time=at)
    assert [r["metric"] for r in query["data"]["result"]] == [LABELS]
    matrix = api(gateway, tenant, "/api/v1/query_range", query=f'{{"{NAME}"}}', start=at - 1, end=at, step=1)
    assert [r["metric"] for r in matrix["data"]["result"]] == [LABELS]

    # The metadata APIs, the name in the path as written or U__-escaped as Prometheus 3 does.
    window = {"start": t / 1000 - 60, "end": now_ms / 1000}
    assert api(gateway, tenant, "/api/v1/series", **{"match[]": f'{{"{NAME}"}}'}, **window)["data"] == [LABELS]
    assert {"k8s.pod.name", "service.name", "db.system"} <= set(
        api(gateway, tenant, "/api/v1/labels", **window)["data"]
    )
    names = api(gateway, tenant, "/api/v1/label/__name__/values", **window)["data"]
    assert names == sorted([NAME, V2_NAME, UNLABELLED])
    for path_name in ("k8s.pod.name", "U__k8s_2e_pod_2e_name", "k8s%2Epod%2Ename"):
        assert api(gateway, tenant, f"/api/v1/label/{path_name}/values", **window)["data"] == ["p-1"]
    empty = gateway.get("/api/v1/label/U__/values", headers={"X-Scope-OrgID": tenant})
    assert (empty.status, empty.json()["error"]) == (400, 'invalid label name: ""')
    metadata = api(gateway, tenant, "/api/v1/metadata", metric=V2_NAME)["data"]
    assert metadata == {
        V2_NAME: [{"type": "histogram", "help": "Duration of database client operations.", "unit": "s"}]
    }
    exemplars = api(gateway, tenant, "/api/v1/query_exemplars", query=f'{{"{V2_NAME}"}}', start=t / 1000 - 1, end=at)[
        "data"
    ]
    assert [(e["seriesLabels"], [x["labels"] for x in e["exemplars"]]) for e in exemplars] == [
        (V2_LABELS, [{"trace.id": "abc"}])
    ]

    # Remote read: as written, but for a Prometheus 2.x reader, which refuses such names.
    matchers = [Matcher("EQ", "__name__", NAME), Matcher("EQ", "k8s.pod.name", "p-1")]
    assert remote_read(gateway, tenant, matchers, t - 1, now_ms) == [(LABELS, [(t, 0.25), (t + 1000, 0.5)])]
    legacy = [Matcher("EQ", "__name__", "http_server_request_duration")]
    mapped = {"__name__": "http_server_request_duration", "service_name": "api", "k8s_pod_name": "p-1"}
    assert remote_read(gateway, tenant, legacy, t - 1, now_ms, "Prometheus/2.42.0") == [
        (mapped, [(t, 0.25), (t + 1000, 0.5)])
    ]
    assert remote_read(gateway, tenant, matchers, t - 1, now_ms, "Prometheus/3.14.0")[0][0] == LABELS

    # The native API.
    native = api(gateway, tenant, "/api/query", metricName=NAME, tag="k8s.pod.name=p-1", start=t - 1, end=now_ms)
    assert [(s["metricName"], s["tags"], len(s["values"])) for s in native] == [
        (NAME, {"service.name": "api", "k8s.pod.name": "p-1"}, 2)
    ]
    assert api(gateway, tenant, "/api/metadata/tagKeys", metricName=NAME) == ["k8s.pod.name", "service.name"]

    # Graphite: the name is a dotted path, the labels are tags as written (docs/prometheus.rst).
    target = f"seriesByTag('name={NAME}','service.name=api')"
    rendered = api(
        gateway, tenant, "/render", target=target, format="json", **{"from": t // 1000 - 60, "until": int(at) + 60}
    )
    assert [(r["target"], r["tags"]) for r in rendered] == [
        (f"{NAME};k8s.pod.name=p-1;service.name=api", {"name": NAME, "service.name": "api", "k8s.pod.name": "p-1"})
    ]
    tags = api(gateway, tenant, "/tags/autoComplete/tags", tagPrefix="k8s")
    assert tags == ["k8s.pod.name"]
    # A series without labels is also in the path tree; a tagged one only in seriesByTag, as in Graphite.
    found = api(gateway, tenant, "/metrics/find", query="http.server.*")
    assert [(node["id"], node["leaf"]) for node in found] == [(UNLABELLED, 1)]
    rendered = api(gateway, tenant, "/render", target=UNLABELLED, format="json", **{"from": "-5min"})
    assert [value for value, _ in rendered[0]["datapoints"] if value is not None] == [7.0]


def test_a_request_with_an_invalid_series_stores_the_others_and_names_it(gateway, tenant):
    """1,000 valid series and one without a metric name, by remote write 1.0 then 2.0: 1,000 are
    stored (counted back by PromQL), the answer is a 400 naming the invalid one; 2.0's headers
    count what was stored."""
    t = int(time.time() * 1000) - 60_000
    for version, content_type, encode in (
        (1, V1, prometheus.encode_write_request_v1),
        (2, V2, prometheus.encode_write_request_v2),
    ):
        metric = f"mixed.v{version}"
        good = [WriteSeries({"__name__": metric, "i": str(i)}, [(t, float(i))]) for i in range(1000)]
        bad = WriteSeries({"job": "no-name"}, [(t, 1.0)])
        answer = write(gateway, tenant, encode([*good[:500], bad, *good[500:]]), content_type)
        assert answer.status == 400, answer.body
        assert answer.body.decode() == (
            "1 of 1001 series rejected: series 500: missing or empty __name__ label; the others were written"
        )
        if version == 2:
            assert answer.headers["X-Prometheus-Remote-Write-Samples-Written"] == "1000"
        query = api(gateway, tenant, "/api/v1/query", query=f'count({{"{metric}"}})', time=t / 1000)
        assert query["data"]["result"][0]["value"][1] == "1000"
    assert metric_value(gateway, 'tsgate_samples_rejected_total{protocol="prometheus",reason="invalid_series"}') == 2
