"""The PromQL HTTP API through a real gateway: envelopes and error types, limits, tenants, and a
query past the raw retention reading counter roll-ups (with a warning saying so)."""

import time
import urllib.parse

import orjson
import pytest
import pytest_twisted
from twisted.web.test.requesthelper import DummyRequest

from gateway.core.layout import HOUR_MS
from gateway.http.promql_api import prometheus_errors
from protocols.prometheus import WriteSeries
from tests.e2e.test_read_path_e2e import remote_write
from tests.gatewayproc import downsample_once

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def promql(gateway, tenant: str, path: str, method: str = "GET", **params):
    encoded = urllib.parse.urlencode(params)
    headers = {"X-Scope-OrgID": tenant}
    if method == "POST":
        return gateway.post(path, encoded.encode(), headers={**headers, **FORM})
    return gateway.get(f"{path}?{encoded}", headers=headers)


@pytest.fixture
def loaded(start_gateway, backend_args, tenant):
    gateway = start_gateway(*backend_args, "--query-max-samples", "500")
    now = int(time.time()) * 1000
    series = [
        WriteSeries(
            {"__name__": "jobs_total", "job": job}, [(now - 300_000 + i * 15_000, float(i * factor)) for i in range(20)]
        )
        for job, factor in (("api", 1), ("web", 2))
    ]
    remote_write(gateway, tenant, series)
    return gateway, now


def test_queries_answer_prometheus_envelopes(loaded, tenant):
    gateway, now = loaded
    at = (now - 15_000) / 1000
    answer = promql(gateway, tenant, "/api/v1/query", "POST", query="sum by (job) (rate(jobs_total[1m]))", time=at)
    assert answer.status == 200
    result = {
        item["metric"]["job"]: (item["value"][0], float(item["value"][1])) for item in answer.json()["data"]["result"]
    }
    assert result == {"api": (at, pytest.approx(4 / 60)), "web": (at, pytest.approx(8 / 60))}
    ranged = promql(
        gateway, tenant, "/api/v1/query_range", query="jobs_total{job='web'}", start=at - 30, end=at, step="15s"
    ).json()
    assert ranged["data"]["result"][0]["values"] == [[at - 30, "34"], [at - 15, "36"], [at, "38"]]
    assert (
        promql(gateway, tenant + "-other", "/api/v1/query", query="jobs_total", time=at).json()["data"]["result"] == []
    )
    assert promql(gateway, tenant, "/api/v1/series", **{"match[]": "jobs_total"}).json()["data"] == [
        {"__name__": "jobs_total", "job": "api"},
        {"__name__": "jobs_total", "job": "web"},
    ]
    assert promql(gateway, tenant, "/api/v1/label/job/values").json()["data"] == ["api", "web"]
    assert promql(gateway, tenant, "/api/v1/labels", **{"match[]": "jobs_total"}).json()["data"] == ["__name__", "job"]


@pytest.mark.parametrize(
    "path, params, status, kind",
    [
        ("/api/v1/query", {"query": "sum("}, 400, "bad_data"),
        ("/api/v1/query", {}, 400, "bad_data"),
        ("/api/v1/query", {"query": "up", "time": "yesterday"}, 400, "bad_data"),
        ("/api/v1/query_range", {"query": "up", "start": "10", "end": "5", "step": "1"}, 400, "bad_data"),
        ("/api/v1/query_range", {"query": "up", "start": "0", "end": "5", "step": "0"}, 400, "bad_data"),
        ("/api/v1/query_range", {"query": "up", "start": "0", "end": "100000", "step": "1"}, 400, "bad_data"),
        ("/api/v1/query_range", {"query": "up[5m]", "start": "0", "end": "10", "step": "1"}, 400, "bad_data"),
        ("/api/v1/query", {"query": "1 > 2"}, 400, "bad_data"),
        ("/api/v1/query", {"query": "start_timestamp(up)"}, 400, "bad_data"),  # a feature left out: named
        ("/api/v1/query", {"query": "limitk(NaN, up)"}, 422, "execution"),
        ("/api/v1/query", {"query": "jobs_total + on() jobs_total"}, 422, "execution"),
        ("/api/v1/query", {"query": "count_over_time(jobs_total[1h])"}, 200, None),
        ("/api/v1/query", {"query": "count_over_time(jobs_total[1h])[30m:1m]"}, 200, None),
        ("/api/v1/query", {"query": "sum_over_time(jobs_total[1h:1m])"}, 200, None),
        # 1801 and 3601 inner steps of 2 series are over --query-max-samples 500, as in Prometheus
        ("/api/v1/query", {"query": "count_over_time(jobs_total[1h])[30m:1s]"}, 422, "execution"),
        ("/api/v1/query", {"query": "sum_over_time(jobs_total[1h:1s])"}, 422, "execution"),
        ("/api/v1/series", {}, 400, "bad_data"),
        ("/api/v1/series", {"match[]": "sum(up)"}, 400, "bad_data"),
    ],
)
def test_errors_have_prometheus_status_and_type(loaded, tenant, path, params, status, kind):
    gateway, _ = loaded
    answer = promql(gateway, tenant, path, **params)
    assert answer.status == status, answer.body
    if kind:
        assert answer.json()["status"] == "error" and answer.json()["errorType"] == kind


# Issue 20: 500s before, Prometheus 2.42's answers now (one gateway for all of them).
EDGE_CASES = [
    ("/api/v1/query", {"query": "nope + nope2"}, 200, None),
    ("/api/v1/query", {"query": "sum(nope) / sum(nope2)"}, 200, None),
    ("/api/v1/query", {"query": "u * on(x) group_left p"}, 200, None),
    ("/api/v1/query", {"query": "cos(u > p)"}, 200, None),
    ("/api/v1/query_range", {"query": "sum(nope + nope2)", "start": "0", "end": "60", "step": "15"}, 200, None),
    ("/api/v1/query", {"query": "jobs_total", "timeout": "nan"}, 400, "bad_data"),
    ("/api/v1/query", {"query": "jobs_total", "timeout": "inf"}, 400, "bad_data"),
    ("/api/v1/query", {"query": "jobs_total", "timeout": "1e300"}, 400, "bad_data"),
    ("/api/v1/query", {"query": "jobs_total @ 9223372036854775807"}, 400, "bad_data"),
    ("/api/v1/query", {"query": "jobs_total @ -1e308"}, 400, "bad_data"),
    ("/api/v1/query", {"query": "jobs_total @ 1e15"}, 400, "bad_data"),
    ("/api/v1/query", {"query": "jobs_total @ -1e15"}, 400, "bad_data"),
    ("/api/v1/query", {"query": 'up{job=~"x{1001}"}'}, 400, "bad_data"),
    ("/api/v1/query", {"query": 'label_replace(jobs_total, "a", "b", "job", "(")'}, 422, "execution"),
    ("/api/v1/query", {"query": 'label_replace(jobs_total, "\\xff", "b", "job", "x")'}, 422, "execution"),
    ("/api/v1/query", {"query": "sum(count_over_time({job=~'.+'}[10m])) + sum(abs(-{job='api'}))"}, 200, None),
    ("/api/v1/metadata", {"limit": "x"}, 400, "bad_data"),
]


def test_edge_queries_answer_prometheus_status_and_type(loaded, tenant):
    gateway, _ = loaded
    for path, params, status, kind in EDGE_CASES:
        answer = promql(gateway, tenant, path, **params)
        assert answer.status == status, (path, params, answer.body)
        assert answer.json()["status"] == ("error" if kind else "success")
        assert kind is None or answer.json()["errorType"] == kind


def test_an_empty_operation_answers_an_empty_vector_and_absent_of_it_one(loaded, tenant):
    gateway, now = loaded
    for query, result in (
        ("nope / nope2", []),
        ("absent(nope * on() nope2)", [{"metric": {}, "value": [now / 1000, "1"]}]),
    ):
        answer = promql(gateway, tenant, "/api/v1/query", query=query, time=now / 1000)
        assert answer.status == 200 and answer.json()["data"] == {"resultType": "vector", "result": result}


def test_label_functions_write_utf8_label_names(loaded, tenant):
    """label_replace, label_join and count_values write a dotted (UTF-8) label, as Prometheus 3
    does; a name the query writes as bytes that are no UTF-8 is refused in Prometheus's words."""
    gateway, now = loaded

    def result(query: str) -> list:
        answer = promql(gateway, tenant, "/api/v1/query", query=query, time=now / 1000)
        assert answer.status == 200, answer.body
        return [(item["metric"], item["value"][1]) for item in answer.json()["data"]["result"]]

    assert result('label_replace(jobs_total{job="api"}, "service.name", "svc-$1", "job", "(.*)")') == [
        ({"__name__": "jobs_total", "job": "api", "service.name": "svc-api"}, "19")
    ]
    assert result('label_join(jobs_total{job="web"}, "k8s.job", "/", "job", "job")') == [
        ({"__name__": "jobs_total", "job": "web", "k8s.job": "web/web"}, "38")
    ]
    assert result('count_values("app.version", jobs_total{job="api"})') == [({"app.version": "19"}, "1")]
    answer = promql(gateway, tenant, "/api/v1/query", query='count_values("a\\xc5z", jobs_total)', time=now / 1000)
    assert answer.status == 422 and answer.json()["error"] == 'invalid label name "a\\xc5z"'


def test_a_name_dropped_by_a_range_function_leaves_the_same_label_set_twice(start_gateway, tenant):
    """Two series that differ only by their name, summed over a range function: Prometheus 2.42
    refuses it (422), as sum(count_over_time({job="prometheus"}[10m])) over its own metrics."""
    gateway = start_gateway()
    now = int(time.time()) * 1000
    remote_write(
        gateway,
        tenant,
        [
            WriteSeries({"__name__": name, "job": "x"}, [(now - 60_000, 1.0), (now, 2.0)])
            for name in ("first", "second")
        ],
    )
    answer = promql(gateway, tenant, "/api/v1/query", query='sum(count_over_time({job="x"}[10m]))', time=now / 1000)
    assert answer.status == 422 and answer.json() == {
        "status": "error",
        "errorType": "execution",
        "error": "vector cannot contain metrics with the same labelset",
    }


@pytest_twisted.ensureDeferred
async def test_an_unexpected_error_answers_500_in_prometheus_envelope():
    """A bug still answers Prometheus's envelope, so Grafana shows the message (not raw JSON)."""

    async def broken(request):
        raise RuntimeError("a bug")

    answer = await prometheus_errors(broken)(DummyRequest([b"api", b"v1", b"query"]))
    assert answer.status == 500 and orjson.loads(answer.body) == {
        "status": "error",
        "errorType": "internal",
        "error": "internal error; see the gateway log",
    }


def test_the_samples_limit_is_an_execution_error(start_gateway, tenant):
    gateway = start_gateway("--query-max-samples", "10")
    now = int(time.time()) * 1000
    remote_write(
        gateway, tenant, [WriteSeries({"__name__": "many"}, [(now - 60_000 + i * 1000, 1.0) for i in range(30)])]
    )
    answer = promql(gateway, tenant, "/api/v1/query", query="sum_over_time(many[5m])", time=now / 1000)
    assert answer.status == 422 and "--query-max-samples" in answer.json()["error"]


def test_past_raw_retention_counters_read_their_rollups(start_gateway, backend_args, tmp_path, tenant):
    """A counter that resets, 3 hours old with one hour of raw retention: rate() over the 5 m
    roll-ups (their last values) stays right across the reset, and the answer warns."""
    args = (
        *(backend_args or ("--data-dir", str(tmp_path / "data"))),
        "--raw-retention",
        "1h",
        "--downsample-delay",
        "0s",
    )
    gateway = start_gateway(*args, "--roles", "ingest,query")
    slot = (int(time.time() * 1000) // HOUR_MS - 3) * HOUR_MS
    points = [(slot + i * 10_000, float(i if i < 180 else i - 180)) for i in range(360)]  # 1/10 s, reset at 30 min
    remote_write(gateway, tenant, [WriteSeries({"__name__": "old_total"}, points)])
    downsample_once(*args)
    at = (slot + 50 * 60_000) / 1000
    answer = promql(gateway, tenant, "/api/v1/query", query="increase(old_total[20m])", time=at).json()
    assert "roll-ups" in answer["warnings"][0]
    (result,) = answer["data"]["result"]
    assert float(result["value"][1]) == pytest.approx(120.0, rel=0.01)  # 0.1/s over 20 minutes, reset included
    across = promql(
        gateway, tenant, "/api/v1/query", query="increase(old_total[20m])", time=(slot + 40 * 60_000) / 1000
    ).json()
    # the window is left-open (Prometheus 3): the roll-up point at its start is out, so 15 of the
    # 20 minutes are sampled and the rest extrapolated
    assert float(across["data"]["result"][0]["value"][1]) == pytest.approx(120.0, rel=0.02)
