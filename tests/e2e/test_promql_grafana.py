"""Grafana's Prometheus data source, replayed request for request against a real gateway.

Grafana 10 and 11 (``pkg/promlib`` in the backend, ``public/app/plugins/datasource/prometheus``
in the frontend, moved to ``@grafana/prometheus``) send these requests to a Prometheus data
source; with a multi-tenant backend the data source's custom header ``X-Scope-OrgID`` goes with
every one of them. Times are Unix seconds (``formatTime``: ``strconv.FormatFloat`` of seconds,
so a fraction may follow), form bodies are Go's ``url.Values.Encode`` (the default HTTP method
of the data source is POST):

* Health check, "Save & test" (``healthcheck.go``): an instant query of ``1+1`` at now, ``POST
  /api/v1/query`` with the form ``query=1%2B1&time=<now>``; Grafana wants a successful scalar.
* ``GET /api/v1/status/buildinfo`` (``getBuildInfo``): ``data.version`` must parse as a semantic
  version; a ``features`` map would make it a Mimir/Cortex, so it must be absent or empty.
* Metric browser and query builder (``language_provider.ts``): ``GET /api/v1/labels?start&end``,
  ``GET /api/v1/label/__name__/values?start&end``, ``GET /api/v1/label/job/values`` with
  ``match[]=up`` (the values of a label among a selector's series), ``GET /api/v1/series`` with
  ``match[]`` and ``start``/``end``, and ``GET /api/v1/metadata`` with no metric (every metric's
  type and help, shown as the metric's hint).
* Template variables (``metric_find_query.ts``): ``label_values(up, job)`` becomes the label
  values request with ``match[]=up`` and the dashboard's ``start``/``end``;
  ``label_values(job)`` the same without ``match[]``; ``query_result(up)`` an instant query at
  the range's end (``POST /api/v1/query``), whose series Grafana prints as text.
* A dashboard panel: ``POST /api/v1/query_range`` with ``query``, ``start``, ``end`` and ``step``
  (seconds), ``start`` and ``end`` aligned down to multiples of ``step`` as the backend aligns
  them, and ``$__rate_interval`` already replaced by Grafana (four scrape intervals: ``1m0s`` for
  15 s scrapes): ``sum by (job) (rate(http_requests_total[1m0s]))``.
* Exemplars (``exemplars`` toggle, Explore): ``POST /api/v1/query_exemplars`` with ``query``,
  ``start`` and ``end``; an empty list while tsgate stores none.

The data (``up`` and ``http_requests_total`` of two jobs, 15 s apart over 30 minutes, with their
metadata) goes in beforehand through ``/api/v1/write`` as Prometheus sends it, plus one Graphite
path through ``/api/write``, which must appear under its Prometheus name. One gateway per
backend (SQLite; Cassandra with Redis) and one tenant serve the module.
"""

import re
import time
import urllib.parse
import uuid

import pytest

from protocols.prometheus import WriteMetadata, WriteSeries, encode_write_request_v1
from tests.gatewayproc import GatewayProcess

SCRAPE = 15
POINTS = 120  # 30 minutes of scrapes
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
RATES = {"api": 2.0, "web": 1.0}  # per second, per series of the job
TARGETS = {("api", "a1:9100"): 1.0, ("api", "a2:9100"): 1.0, ("web", "w1:9100"): 1.0, ("web", "w2:9100"): 0.0}
SEMVER = re.compile(r"^\d+\.\d+\.\d+")


class Grafana:
    """The data source: a gateway, a tenant and the time the data starts."""

    def __init__(self, gateway: GatewayProcess, tenant: str, first: int):
        self.gateway = gateway
        self.tenant = tenant
        self.first = first
        self.last = first + (POINTS - 1) * SCRAPE

    def get(self, path: str, params=()):
        query = f"?{urllib.parse.urlencode(list(params))}" if params else ""
        answer = self.gateway.get(path + query, headers={"X-Scope-OrgID": self.tenant})
        return self._checked(answer)

    def post(self, path: str, params):
        body = urllib.parse.urlencode(sorted(params)).encode()
        answer = self.gateway.post(path, body, headers={"X-Scope-OrgID": self.tenant, **FORM})
        return self._checked(answer)

    @staticmethod
    def _checked(answer):
        assert answer.status == 200, answer.body[:500]
        body = answer.json()
        assert body["status"] == "success", body
        return body["data"]


def written_series(first: int) -> list[WriteSeries]:
    series = []
    for (job, instance), up in TARGETS.items():
        stamps = [(first + i * SCRAPE) * 1000 for i in range(POINTS)]
        series.append(WriteSeries({"__name__": "up", "job": job, "instance": instance}, [(ts, up) for ts in stamps]))
        counter = [(ts, RATES[job] * i * SCRAPE) for i, ts in enumerate(stamps)]
        series.append(
            WriteSeries({"__name__": "http_requests_total", "job": job, "instance": instance, "code": "200"}, counter)
        )
    return series


@pytest.fixture(scope="module", params=["sqlite", "cassandra"])
def grafana(request, tmp_path_factory):
    """One gateway per backend for the module, loaded once as Prometheus remote write does."""
    workdir = tmp_path_factory.mktemp(f"promql-grafana-{request.param}")
    args = []
    if request.param == "cassandra":
        args += [
            "--store",
            request.getfixturevalue("cassandra_url"),
            "--redis",
            request.getfixturevalue("redis_server").url,
        ]
    gateway = GatewayProcess(workdir, *args).start()
    try:
        tenant = f"grafana-{uuid.uuid4().hex[:10]}"
        now = int(time.time())
        first = now - now % 60 - POINTS * SCRAPE - 120
        metadata = [
            WriteMetadata("http_requests_total", "counter", "Requests served."),
            WriteMetadata("up", "gauge", "Whether the target is up."),
        ]
        headers = {
            "Content-Type": "application/x-protobuf",
            "Content-Encoding": "snappy",
            "X-Prometheus-Remote-Write-Version": "0.1.0",
            "X-Scope-OrgID": tenant,
        }
        answer = gateway.post(
            "/api/v1/write", encode_write_request_v1(written_series(first), metadata), headers=headers
        )
        assert answer.status == 204, answer.body
        graphite = [
            {"metricName": "servers.web-1.cpu.idle", "tags": {"dc": "x"}, "ts": first + 60 * i, "value": 90.0 + i}
            for i in range(10)
        ]
        assert gateway.post("/api/write", graphite, headers={"X-Scope-OrgID": tenant}).status == 200
        yield Grafana(gateway, tenant, first)
    finally:
        assert gateway.stop() == 0, gateway.log()[-3000:]


def test_health_check_one_plus_one(grafana):
    now = time.time()
    data = grafana.post("/api/v1/query", [("query", "1+1"), ("time", f"{now:.3f}")])
    assert data["resultType"] == "scalar"
    at, value = data["result"]
    assert abs(at - now) < 0.002 and value == "2"


def test_buildinfo_version_grafana_accepts(grafana):
    data = grafana.get("/api/v1/status/buildinfo")
    assert SEMVER.match(data["version"]), data
    assert not data.get("features"), data


def test_metric_browser_labels_and_names(grafana):
    window = [("start", grafana.first), ("end", grafana.last)]
    labels = grafana.get("/api/v1/labels", window)
    assert {"__name__", "job", "instance", "code", "dc"} <= set(labels) and labels == sorted(labels)
    names = grafana.get("/api/v1/label/__name__/values", window)
    assert names == ["http_requests_total", "servers.web-1.cpu.idle", "up"]


def test_label_values_of_a_selector(grafana):
    """``label_values(up, job)`` as a variable query, and the metric browser's label filter."""
    data = grafana.get("/api/v1/label/job/values", [("match[]", "up"), ("start", grafana.first), ("end", grafana.last)])
    assert data == ["api", "web"]
    data = grafana.get(
        "/api/v1/label/instance/values", [("match[]", 'up{job="web"}'), ("start", grafana.first), ("end", grafana.last)]
    )
    assert data == ["w1:9100", "w2:9100"]
    assert grafana.get("/api/v1/label/job/values", [("start", grafana.first), ("end", grafana.last)]) == ["api", "web"]


def test_series_of_a_selector(grafana):
    params = [("match[]", '{__name__="up", job="api"}'), ("start", grafana.first), ("end", grafana.last)]
    data = grafana.get("/api/v1/series", params)
    assert sorted(data, key=lambda labels: labels["instance"]) == [
        {"__name__": "up", "job": "api", "instance": "a1:9100"},
        {"__name__": "up", "job": "api", "instance": "a2:9100"},
    ]
    both = grafana.get(
        "/api/v1/series",
        [("match[]", "up"), ("match[]", "http_requests_total"), ("start", grafana.first), ("end", grafana.last)],
    )
    assert len(both) == 8


def test_metadata_of_every_metric(grafana):
    data = grafana.get("/api/v1/metadata")
    assert data["http_requests_total"] == [{"type": "counter", "help": "Requests served.", "unit": ""}]
    assert data["up"] == [{"type": "gauge", "help": "Whether the target is up.", "unit": ""}]


def test_query_result_variable(grafana):
    """``query_result(up)``: an instant query at the end of the dashboard's range."""
    data = grafana.post("/api/v1/query", [("query", "up"), ("time", str(grafana.last))])
    assert data["resultType"] == "vector"
    got = {(item["metric"]["job"], item["metric"]["instance"]): item["value"] for item in data["result"]}
    assert got == {target: [grafana.last, f"{up:g}"] for target, up in TARGETS.items()}


def test_dashboard_range_query_with_rate_interval(grafana):
    step = 30
    start = (grafana.first + 300) // step * step
    end = grafana.last // step * step
    params = [
        ("query", "sum by (job) (rate(http_requests_total[1m0s]))"),
        ("start", start),
        ("end", end),
        ("step", step),
    ]
    data = grafana.post("/api/v1/query_range", params)
    assert data["resultType"] == "matrix"
    stamps = list(range(start, end + 1, step))
    got = {item["metric"]["job"]: item["values"] for item in data["result"]}
    assert sorted(got) == ["api", "web"] and all(
        item["metric"] == {"job": item["metric"]["job"]} for item in data["result"]
    )
    for job, rate in RATES.items():
        assert [at for at, _ in got[job]] == stamps
        assert all(abs(float(value) - 2 * rate) < 1e-9 for _, value in got[job]), got[job][:5]


def test_exemplars_are_empty(grafana):
    params = [("query", "rate(http_requests_total[1m0s])"), ("start", grafana.first), ("end", grafana.last)]
    assert grafana.post("/api/v1/query_exemplars", params) == []
