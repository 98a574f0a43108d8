"""Series churn end to end: the same remote-write requests to tsgate and to Debian's Prometheus 2.42
(its remote-write receiver), and the last-hour queries of a dashboard asked of both.

Four generations of 30 pods, one an hour (a deploy), a sample a minute, the last ending now, in
time order; tsgate runs with ``--max-series-per-query 100``: the tenant holds 120 series, the
buckets of the last hour at most 90, so an index without time would refuse every query.
PromQL answers and /api/v1/series must equal Prometheus's; label values answer at the time
index's grain (an hour): they hold every value Prometheus gives and none of the generations
that ended before the range's buckets.
"""

import json
import math
import time
import urllib.parse
import urllib.request

import pytest

from protocols.prometheus.write import WriteSeries, encode_write_request_v1
from tests.prometheusproc import PrometheusProcess

GENERATIONS, PODS = 4, 30
WRITE_HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}


def pods(generation: int) -> set[str]:
    return {f"p{generation}-{i}" for i in range(PODS)}


def requests(now_ms: int) -> list[bytes]:
    """One request a minute, every live pod's counter in it, oldest first."""
    bodies = []
    start = now_ms - GENERATIONS * 3_600_000
    for minute in range(GENERATIONS * 60):
        at = start + (minute + 1) * 60_000
        generation = minute // 60
        series = [
            WriteSeries(
                {"__name__": "churn_total", "job": "api", "pod": f"p{generation}-{i}"}, [(at, float(minute * (i + 1)))]
            )
            for i in range(PODS)
        ]
        bodies.append(encode_write_request_v1(series))
    return bodies


@pytest.fixture
def receiver(tmp_path):
    prometheus = PrometheusProcess(
        tmp_path / "prometheus", "global: {}\n", "--web.enable-remote-write-receiver"
    ).start()
    yield prometheus
    prometheus.stop()


def ask(gateway, tenant: str, path: str, params: dict) -> tuple[int, dict]:
    answer = gateway.get(f"{path}?{urllib.parse.urlencode(params, doseq=True)}", headers={"X-Tenant": tenant})
    return answer.status, json.loads(answer.body)


def same(expected: list, got: list) -> bool:
    """Matrix or vector results equal: label sets, timestamps, values within 1e-9 relative."""

    def points(entry):
        return entry.get("values") or [entry["value"]]

    def key(entry):
        return sorted(entry["metric"].items())

    if sorted(map(key, expected)) != sorted(map(key, got)):
        return False
    for a, b in zip(sorted(expected, key=key), sorted(got, key=key)):
        pa, pb = points(a), points(b)
        if [t for t, _ in pa] != [t for t, _ in pb]:
            return False
        if not all(math.isclose(float(x), float(y), rel_tol=1e-9) for (_, x), (_, y) in zip(pa, pb)):
            return False
    return True


def test_a_dashboards_last_hour_after_hourly_deploys_answers_as_prometheus(
    start_gateway, backend_args, receiver, tenant
):
    gateway = start_gateway(*backend_args, "--max-series-per-query", "100")
    now_ms = int(time.time() // 60 * 60_000)
    for body in requests(now_ms):
        posted = gateway.post("/api/v1/write", body, headers={**WRITE_HEADERS, "X-Tenant": tenant})
        assert posted.status in (200, 204), posted.body
        post_to_prometheus(receiver.port, body)
    now = now_ms / 1000
    queries = [
        (
            "/api/v1/query_range",
            # steps half a minute off the samples': no sample on a window's edge, where Prometheus 3
            # (tsgate) leaves it out and the 2.42 receiver keeps it
            {"query": 'sum(rate(churn_total{job="api"}[5m]))', "start": now - 3570, "end": now - 30, "step": 60},
        ),
        ("/api/v1/query", {"query": 'count(churn_total{job="api"})', "time": now}),
        ("/api/v1/query", {"query": 'sum by (job) (churn_total{job="api"})', "time": now - 1800}),
    ]
    for path, params in queries:
        status, answer = ask(gateway, tenant, path, params)
        expected = receiver.api(path, **params)
        assert status == 200, answer
        assert expected["status"] == "success"
        assert same(expected["data"]["result"], answer["data"]["result"]), (path, params, expected, answer)

    status, answer = ask(
        gateway, tenant, "/api/v1/series", {"match[]": 'churn_total{job="api"}', "start": now - 300, "end": now}
    )
    expected = receiver.api("/api/v1/series", **{"match[]": 'churn_total{job="api"}', "start": now - 300, "end": now})
    got = {series["pod"] for series in answer["data"]}
    assert status == 200 and got == {series["pod"] for series in expected["data"]} == pods(GENERATIONS - 1)

    status, answer = ask(gateway, tenant, "/api/v1/label/pod/values", {"start": now - 3600, "end": now})
    assert status == 200
    assert pods(GENERATIONS - 1) <= set(answer["data"])
    assert not set(answer["data"]) & pods(0)

    # without a range, the whole history: 120 series, over the limit
    status, answer = ask(gateway, tenant, "/api/v1/series", {"match[]": 'churn_total{job="api"}'})
    assert status == 422 and "100" in answer["error"]

    # cardinality: the last five minutes' buckets hold the live generation, and the one before
    # where the range reaches into the previous hour, or where the run is in an hour's last quarter
    # (part of that generation registered ahead in the next hour, spread by series)
    status, answer = ask(gateway, tenant, "/api/v1/status/tsdb", {"start": now - 300, "end": now, "limit": 3})
    assert status == 200 and "warnings" not in answer, answer
    stats = answer["data"]
    live = stats["headStats"]["numSeries"]
    assert PODS <= live <= 2 * PODS
    assert stats["seriesCountByMetricName"] == [{"name": "churn_total", "value": live}]
    assert stats["labelValueCountByLabelName"][0] == {"name": "pod", "value": live}
    assert stats["seriesCountByLabelValuePair"][:2] == [
        {"name": "__name__=churn_total", "value": live},
        {"name": "job=api", "value": live},
    ]
    assert len(stats["seriesCountByLabelValuePair"]) == 3
    # the whole history: 120 series, label pairs counted on 100 of them (the limit) and scaled
    status, answer = ask(gateway, tenant, "/api/v1/status/tsdb", {"start": now - GENERATIONS * 3600, "end": now})
    assert status == 200 and answer["data"]["headStats"]["numSeries"] == GENERATIONS * PODS
    assert answer["data"]["seriesCountByLabelValuePair"][1] == {"name": "job=api", "value": GENERATIONS * PODS}
    assert "100 of 120 series" in answer["warnings"][0]
    status, answer = ask(gateway, tenant, "/api/v1/status/tsdb", {"limit": "0"})
    assert status == 400 and "limit" in answer["error"]


def post_to_prometheus(port: int, body: bytes) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/write", data=body, headers=WRITE_HEADERS)
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 204
