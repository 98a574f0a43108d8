"""PromQL differential test: Debian's Prometheus 2.42 is the reference, tsgate must answer alike.

A real Prometheus scrapes two small exporters served by the test (one collector each, their
values a function of the scrape count, different per instance) every second and remote-writes
everything into two gateways, one on each store (the embedded SQLite store alone, and Cassandra
with Redis; ``?tenant=`` in the URL: Prometheus 2.42 sends no configured headers): one run of
scrapes serves both stores, each answer of Prometheus is compared with both.
The exporters hold counters that reset, gauges that move (some in [-1, 1], some >= 1, some
negative with .5 fractions), a classic histogram with two label sets, a constant "version"
series and a series that disappears after 30 scrapes, so Prometheus writes a stale marker.

After about 70 s Prometheus reloads (SIGHUP) a configuration without scrape jobs: the targets go
away with stale markers and the data is frozen. The test then waits until remote read of
each gateway returns exactly the sample timestamps remote read of Prometheus returns, and asks every
query of ``QUERIES`` of both: as an instant query half a second after END and, unless marked instant-only, as a
range query over [END - 59.5 s, END + 0.5 s] with a step of 1 s, 5 s or 15 s (taken in turn). Prometheus
gets GET requests; tsgate gets GET for instant queries and form POST for range queries, with the
tenant in ``X-Scope-OrgID``. The other parameter forms of ``PARAMETER_FORMS`` (RFC 3339 times,
fractions of seconds, durations as steps) must answer alike, and the bad requests of ``ERRORS``
must fail alike (HTTP status and ``errorType``).

Answers match when they have the same resultType, the same series (label sets), the same
timestamps and values equal within 1e-9 relative (NaN equals NaN, infinities their own sign).
Values within 1e-12 of each other also match: near zero a relative tolerance means nothing (an
average or a variance of moving values that cancels out is 1e-17 in one float order and 0 in
another). Series are compared sorted by labels, except the instant results of sort and
sort_desc, the only order Prometheus guarantees (rows marked ``ordered``). Every mismatch is
collected and reported at once.
"""

import json
import math
import signal
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from gateway.app.devservices.process import free_port
from protocols.prometheus import Matcher, ReadQuery, decode_read_response, encode_read_request
from tests.prometheusproc import PrometheusProcess

RUN_SECONDS = 70
WINDOW = 60
RANGE_STEPS = (1, 5, 15)
VANISH_AFTER = 30  # scrapes of d_vanishing before it disappears
FORM = {"Content-Type": "application/x-www-form-urlencoded"}

PROMETHEUS_CONFIG = """
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: diff
    static_configs: [{targets: ["127.0.0.1:EXPORTER_A", "127.0.0.1:EXPORTER_B"]}]
remote_write:
"""
REMOTE_WRITE = """  - url: http://127.0.0.1:GATEWAY_PORT/api/v1/write?tenant=TENANT
    queue_config: {batch_send_deadline: 500ms, min_backoff: 100ms, max_backoff: 1s}
"""

# area | modes | query.  Modes: IR instant and range, I instant only (range vectors, strings),
# IR-ordered / I-ordered: the instant answer's order must match too; -3: Prometheus 3 answers
# otherwise than 2.42 (tsgate answers as 3, docs/promql.rst), not compared; -3range: the range
# answer only: its first windows hold the series' start, which Prometheus 3 extrapolates
# otherwise (every rate and increase here, whether a run's timing shows it or not), or its
# subquery steps fall on the left-open edge.  MID is replaced by a timestamp in the middle of
# the range, after d_vanishing went stale.
QUERIES = """
selector      | IR | d_requests_total
selector      | IR | d_requests_total{path="/a"}
selector      | IR | d_requests_total{path!="/a"}
selector      | IR | d_requests_total{path=~"/a|/b"}
selector      | IR | d_requests_total{path!~"/a.*", code="200"}
selector      | IR | {__name__=~"d_temp.*"}
selector      | IR | {__name__="d_ratio", kind="x"}
selector      | IR | d_requests_total{missing=""}
selector      | IR | d_requests_total{instance=~".*:.*", code!~"5.."}
selector      | IR | up
selector      | IR | d_version
selector      | I  | d_requests_total[10s]
selector      | I  | d_temperature_celsius{room="lab"}[15s]
offset        | IR | d_temperature_celsius offset 10s
offset        | IR | d_temperature_celsius offset 1m
offset        | IR-3range | rate(d_requests_total[20s] offset 15s)
offset        | IR | d_requests_total offset -5s
offset        | IR | -d_temperature_celsius offset 5s
at            | IR | d_temperature_celsius @ start()
at            | IR | d_temperature_celsius @ end()
at            | IR | d_temperature_celsius @ MID
at            | IR | sum(d_requests_total @ MID)
at            | IR | max_over_time(d_temperature_celsius[30s] @ end())
at            | IR | rate(d_requests_total[20s] @ MID offset 10s)
subquery      | IR-3range | max_over_time(rate(d_requests_total[10s])[30s:5s])
subquery      | IR | avg_over_time(d_temperature_celsius[1m:])
subquery      | IR | sum_over_time(sum(d_requests_total)[30s:3s])
subquery      | IR-3range | min_over_time(d_temperature_celsius[20s:7s] offset 5s)
subquery      | IR-3range | deriv(avg(d_temperature_celsius)[30s:2s])
subquery      | I  | rate(d_requests_total[10s])[40s:10s]
subquery      | IR-3range | rate(d_requests_total[1m:5s])
subquery      | IR | predict_linear(d_load[1m:10s], 30)
lookback      | IR | d_vanishing
lookback      | IR | d_vanishing offset 30s
lookback      | IR | last_over_time(d_vanishing[1m])
lookback      | IR | count_over_time(d_vanishing[1m])
lookback      | IR | timestamp(d_vanishing)
lookback      | IR | max(d_vanishing)
lookback      | IR | d_vanishing or vector(0)
lookback      | I  | d_vanishing[1m]
lookback      | I  | d_vanishing @ MID
aggregation   | IR | sum(d_requests_total)
aggregation   | IR | sum by (path) (d_requests_total)
aggregation   | IR | sum without (instance) (d_requests_total)
aggregation   | IR-3range | sum(rate(d_requests_total[30s])) by (instance)
aggregation   | IR | avg by (code) (d_requests_total)
aggregation   | IR | avg(d_temperature_celsius) without (room)
aggregation   | IR-3range | avg(rate(d_requests_total[15s]))
aggregation   | IR | min by (room) (d_temperature_celsius)
aggregation   | IR | max without (room) (d_temperature_celsius)
aggregation   | IR-3range | max by (instance) (rate(d_requests_total[15s]))
aggregation   | IR | count by (job) ({job="diff"})
aggregation   | IR | count without (instance, path, code) (d_requests_total)
aggregation   | IR | count(count by (room) (d_temperature_celsius))
aggregation   | IR | group by (path) (d_requests_total)
aggregation   | IR | group(d_ratio)
aggregation   | IR | stddev(d_temperature_celsius)
aggregation   | IR | stddev by (instance) (d_temperature_celsius)
aggregation   | IR | stdvar without (room) (d_temperature_celsius)
aggregation   | IR | stdvar(d_ratio)
aggregation   | IR | topk(2, d_temperature_celsius)
aggregation   | IR | topk by (instance) (1, d_requests_total)
aggregation   | IR-3range | topk(1, sum by (path) (rate(d_requests_total[30s])))
aggregation   | IR | bottomk(3, d_requests_total)
aggregation   | IR | bottomk without (room) (1, d_temperature_celsius)
aggregation   | IR | quantile(0.5, d_temperature_celsius)
aggregation   | IR | quantile by (instance) (0.9, d_requests_total)
aggregation   | IR | quantile(0, d_ratio)
aggregation   | IR | quantile(1.5, d_ratio)
aggregation   | IR | count_values("value", d_load)
aggregation   | IR | count_values by (instance) ("v", d_signed)
aggregation   | IR | sum by (le) (d_duration_seconds_bucket)
aggregation   | IR-3range | sum by (job) (rate(d_requests_total[1m0s]))
aggregation   | IR | topk(scalar(count(d_version)), d_temperature_celsius)
aggregation   | IR | count(d_vanishing)
aggregation   | IR | sum by (instance) (d_requests_total) and on(instance) d_load > 5
arithmetic    | IR | d_requests_total + 1
arithmetic    | IR | 2 * d_temperature_celsius - 3
arithmetic    | IR | d_requests_total / 0
arithmetic    | IR | d_temperature_celsius % 7
arithmetic    | IR | d_temperature_celsius ^ 2
arithmetic    | IR | -d_signed
arithmetic    | IR-3 | d_ratio atan2 0.5
arithmetic    | IR | 1 + 2 * 3
arithmetic    | IR | 2 ^ 3 ^ 2
arithmetic    | IR | (1 + 2) / 4
arithmetic    | IR | scalar(sum(d_load)) * 2
arithmetic    | IR | d_duration_seconds_sum / d_duration_seconds_count
arithmetic    | IR-3range | rate(d_duration_seconds_sum[30s]) / rate(d_duration_seconds_count[30s])
matching      | IR | d_requests_total{code="200"} / ignoring(code) d_requests_total{code="500"}
matching      | IR | d_requests_total{code="200"} - on(instance, path) d_requests_total{code="500"}
matching      | IR | d_requests_total * on(instance) group_left(version) d_version
matching      | IR | d_version * on(instance) group_right(version) d_requests_total
matching      | IR | d_temperature_celsius / on(instance) group_left sum by (instance) (d_temperature_celsius)
matching      | IR | sum by (instance) (d_requests_total) / on(instance) sum by (instance) (d_temperature_celsius)
matching      | IR | d_load + ignoring(core) group_left d_version
comparison    | IR | d_temperature_celsius > 20
comparison    | IR | d_temperature_celsius > bool 20
comparison    | IR | d_temperature_celsius >= 21.5
comparison    | IR | d_temperature_celsius < bool 22
comparison    | IR | d_load == 3
comparison    | IR | d_load != bool 3
comparison    | IR | d_signed <= 0
comparison    | IR | 20 < d_temperature_celsius
comparison    | IR | 3 > bool 2
comparison    | IR | 3 < bool 2
comparison    | IR | d_requests_total{code="200"} > ignoring(code) d_requests_total{code="500"}
comparison    | IR | d_requests_total{code="200"} > bool ignoring(code) d_requests_total{code="500"}
comparison    | IR | d_temperature_celsius > on(instance) group_left avg by (instance) (d_temperature_celsius)
set           | IR | d_requests_total and d_requests_total{path="/a"}
set           | IR | d_requests_total{path="/a"} or d_requests_total{path="/b"}
set           | IR | d_requests_total unless d_requests_total{code="500"}
set           | IR | d_temperature_celsius and on(instance) d_version
set           | IR | d_requests_total unless on(path) d_requests_total{path="/c"}
set           | IR | d_temperature_celsius > 21 or d_temperature_celsius < 19
set           | IR | d_load or on(instance) d_ratio
rate          | IR-3range | rate(d_requests_total[10s])
rate          | IR-3range | rate(d_requests_total[1m])
rate          | IR | irate(d_requests_total[10s])
rate          | IR-3range | increase(d_requests_total[30s])
rate          | IR-3range | increase(d_requests_total[3s])
rate          | IR | delta(d_temperature_celsius[20s])
rate          | IR | idelta(d_temperature_celsius[10s])
rate          | IR | deriv(d_temperature_celsius[30s])
rate          | IR | predict_linear(d_temperature_celsius[30s], 60)
rate          | IR | predict_linear(d_requests_total[20s], 3600)
rate          | IR-3range | rate(d_duration_seconds_count[30s])
rate          | IR | irate(d_load[5s])
over_time     | IR | avg_over_time(d_temperature_celsius[30s])
over_time     | IR | min_over_time(d_temperature_celsius[30s])
over_time     | IR | max_over_time(d_signed[15s])
over_time     | IR | sum_over_time(d_load[20s])
over_time     | IR | count_over_time(d_requests_total[30s])
over_time     | IR | quantile_over_time(0.75, d_temperature_celsius[30s])
over_time     | IR | quantile_over_time(0.1, d_signed[1m])
over_time     | IR | stddev_over_time(d_temperature_celsius[30s])
over_time     | IR | stdvar_over_time(d_ratio[45s])
over_time     | IR | last_over_time(d_temperature_celsius[10s])
over_time     | IR | present_over_time(d_requests_total[5s])
over_time     | IR | present_over_time(d_vanishing[20s])
histogram     | IR-3range | histogram_quantile(0.9, rate(d_duration_seconds_bucket[30s]))
histogram     | IR-3range | histogram_quantile(0.5, sum by (le) (rate(d_duration_seconds_bucket[30s])))
histogram     | IR | histogram_quantile(0.99, sum by (le, handler) (d_duration_seconds_bucket))
histogram     | IR | histogram_quantile(0, d_duration_seconds_bucket)
histogram     | IR | histogram_quantile(1.5, d_duration_seconds_bucket)
histogram     | IR | histogram_quantile(0.5, d_duration_seconds_bucket{le!="+Inf"})
histogram     | IR-3range | increase(d_duration_seconds_bucket[1m])
labels        | IR | label_replace(d_temperature_celsius, "place", "$1", "room", "(.*)")
labels        | IR | label_replace(d_requests_total, "short", "x$1", "path", "/(.)")
labels        | IR | label_replace(d_requests_total, "nomatch", "$1", "path", "z(.*)")
labels        | IR | label_join(d_requests_total, "pc", "-", "path", "code")
labels        | IR | label_join(d_temperature_celsius, "x", ",", "room", "instance", "job")
math          | IR | abs(d_signed)
math          | IR | ceil(d_temperature_celsius)
math          | IR | floor(d_signed)
math          | IR | round(d_signed)
math          | IR | round(d_temperature_celsius, 0.5)
math          | IR | clamp(d_temperature_celsius, 19, 22)
math          | IR | clamp(d_temperature_celsius, 22, 19)
math          | IR | clamp_min(d_signed, 0)
math          | IR | clamp_max(d_signed, 1)
math          | IR | exp(d_ratio)
math          | IR | ln(d_load)
math          | IR | ln(d_signed)
math          | IR | log2(d_load)
math          | IR | log10(d_temperature_celsius)
math          | IR | sqrt(d_load)
math          | IR | sqrt(d_signed)
math          | IR | sgn(d_signed)
misc          | IR | time()
misc          | IR | timestamp(d_temperature_celsius)
misc          | IR | vector(1)
misc          | IR | vector(time())
misc          | IR | scalar(d_load)
misc          | IR | scalar(sum(d_load))
misc          | IR | absent(d_nonexistent{job="x", path=~"a.*"})
misc          | IR | absent(d_temperature_celsius)
misc          | IR | absent_over_time(d_nonexistent{job="y"}[1m])
misc          | IR | absent_over_time(d_vanishing[10s])
misc          | IR | changes(d_temperature_celsius[30s])
misc          | IR | changes(d_requests_total[1m])
misc          | IR | resets(d_requests_total[1m])
misc          | IR | 42
misc          | IR | time() - timestamp(d_temperature_celsius)
misc          | IR | timestamp(d_temperature_celsius offset 10s)
misc          | IR | changes(d_vanishing[1m])
misc          | IR | avg_over_time(d_vanishing[1m])
misc          | IR | stddev_over_time(d_version[30s])
misc          | IR | scalar(vector(3)) + d_load
misc          | IR | d_temperature_celsius unless on() vector(1)
misc          | IR-3range | ceil(rate(d_requests_total[20s]))
misc          | IR | -(1 + 2)
misc          | I  | "hello"
sort          | IR-ordered | sort(d_temperature_celsius)
sort          | IR-ordered | sort_desc(d_temperature_celsius)
sort          | IR-ordered | sort_desc(sum by (instance, room) (d_temperature_celsius * 2))
date          | IR | day_of_month()
date          | IR | day_of_week()
date          | IR | day_of_year()
date          | IR | days_in_month()
date          | IR | hour()
date          | IR | minute()
date          | IR | month()
date          | IR | year()
date          | IR | hour(timestamp(d_temperature_celsius))
date          | IR | minute(d_load * 100000)
date          | IR | day_of_week(vector(1e9))
date          | IR | days_in_month(vector(1709000000))
date          | IR | day_of_year(vector(1709000000))
trig          | IR | sin(d_temperature_celsius)
trig          | IR | cos(d_ratio)
trig          | IR | tan(d_ratio)
trig          | IR | asin(d_ratio)
trig          | IR | acos(d_ratio)
trig          | IR | asin(d_load)
trig          | IR | atan(d_temperature_celsius)
trig          | IR | sinh(d_ratio)
trig          | IR | cosh(d_ratio)
trig          | IR | tanh(d_ratio)
trig          | IR | asinh(d_signed)
trig          | IR | acosh(d_load)
trig          | IR | atanh(d_ratio)
trig          | IR | deg(d_ratio)
trig          | IR | rad(d_temperature_celsius)
trig          | IR | pi()
trig          | IR | pi() * d_ratio
"""

# Bad requests both must refuse: (endpoint, parameters); START/END/MID are replaced.
ERRORS = [
    ("/api/v1/query", {"query": "sum(", "time": "END"}),
    ("/api/v1/query", {"query": "rate(d_requests_total)", "time": "END"}),
    ("/api/v1/query", {"query": "d_requests_total[1m] + 1", "time": "END"}),
    ("/api/v1/query", {"query": 'd_requests_total{path=~"("}', "time": "END"}),
    ("/api/v1/query", {"query": "1 +", "time": "END"}),
    ("/api/v1/query", {"query": "nosuchfunction(d_load)", "time": "END"}),
    ("/api/v1/query", {"query": "d_load", "time": "yesterday"}),
    ("/api/v1/query", {"time": "END"}),
    ("/api/v1/query_range", {"query": "d_load", "start": "START", "end": "END", "step": "0"}),
    ("/api/v1/query_range", {"query": "d_load", "start": "END", "end": "START", "step": "5"}),
    ("/api/v1/query_range", {"query": "d_load", "start": "0", "end": "END", "step": "1"}),
    ("/api/v1/query_range", {"query": "d_load[1m]", "start": "START", "end": "END", "step": "5"}),
    ("/api/v1/query_range", {"query": "d_load", "start": "START", "end": "END"}),
    ("/api/v1/query", {"query": "topk(d_load, d_load)", "time": "END"}),
    ("/api/v1/query", {"query": 'label_replace(d_requests_total, "path", "", "path", ".*")', "time": "END"}),
    ("/api/v1/query", {"query": "d_requests_total + on(instance) d_temperature_celsius", "time": "END"}),
]

# The other forms of the parameters Prometheus accepts; the answers must match.
PARAMETER_FORMS = [
    ("/api/v1/query", {"query": "d_load", "time": "END_RFC3339"}),
    ("/api/v1/query", {"query": "d_load", "time": "MID.25"}),
    ("/api/v1/query_range", {"query": "d_load", "start": "START.5", "end": "END", "step": "15s"}),
    ("/api/v1/query_range", {"query": "d_ratio", "start": "START", "end": "END", "step": "1m"}),
    ("/api/v1/query_range", {"query": "d_ratio", "start": "START", "end": "END", "step": "2.5"}),
    ("/api/v1/query_range", {"query": "sum(d_load)", "start": "START_RFC3339", "end": "END_RFC3339", "step": "10"}),
]


def parsed_queries() -> list[tuple[str, str, str]]:
    rows = []
    for line in QUERIES.strip().splitlines():
        area, modes, query = (part.strip() for part in line.split("|", 2))
        rows.append((area, modes, query))
    return rows


class DiffCollector:
    """One exporter's metrics; every scrape (collect call) moves them one step."""

    def __init__(self, factor: int):
        self.factor = factor
        self.scrapes = 0
        self.lock = threading.Lock()

    def collect(self):
        with self.lock:
            n = self.scrapes
            self.scrapes += 1
        f = self.factor
        requests = CounterMetricFamily("d_requests", "Requests served.", labels=["path", "code"])
        for p, (path, period) in enumerate((("/a", 17), ("/b", 29), ("/c", None))):
            for c, code in enumerate(("200", "500")):
                step = (p + 1) * (3 if code == "200" else 1) * f
                ticks = n % period if period else n
                requests.add_metric([path, code], step * (ticks + 1) + 0.01 * (2 * p + c) + 0.001 * f)
        yield requests
        temperature = GaugeMetricFamily("d_temperature_celsius", "Room temperature.", labels=["room"])
        for r, room in enumerate(("lab", "office", "hall")):
            temperature.add_metric([room], round(20 + 3 * math.sin(n / 6 + 2.1 * r + f), 2) + 0.001 * r + 0.0001 * f)
        yield temperature
        ratio = GaugeMetricFamily("d_ratio", "A value in [-1, 1].", labels=["kind"])
        for k, kind in enumerate(("x", "y")):
            ratio.add_metric([kind], round(0.9 * math.sin(n / 4 + 1.3 * k + f), 4))
        yield ratio
        load = GaugeMetricFamily("d_load", "A value of at least 1.", labels=["core"])
        for core in range(2):
            load.add_metric([str(core)], 1 + (n * (core + 1) * f) % 7 + 0.25 * core)
        yield load
        signed = GaugeMetricFamily("d_signed", "Negative and positive halves.", labels=["side"])
        for s, side in enumerate(("left", "right")):
            signed.add_metric([side], (n * (s + 2) + 3 * f) % 11 - 5 + 0.5)
        yield signed
        duration = HistogramMetricFamily("d_duration_seconds", "Request duration.", labels=["handler"])
        for h, handler in enumerate(("/a", "/b")):
            fast = n * (h + 1)
            medium = fast + 2 * n
            slow = medium + n * f
            total = slow + n
            buckets = [("0.1", fast), ("0.5", medium), ("1.0", slow), ("+Inf", total)]
            duration.add_metric(
                [handler], buckets, sum_value=0.05 * fast + 0.3 * (medium - fast) + 0.8 * (slow - medium) + 2.5 * n
            )
        yield duration
        version = GaugeMetricFamily("d_version", "The exporter's version.", labels=["version"])
        version.add_metric([f"1.{f}"], 1)
        yield version
        if n < VANISH_AFTER:
            vanishing = GaugeMetricFamily("d_vanishing", "Gone after a while.", labels=["id"])
            vanishing.add_metric(["1"], 1.5 * n)
            yield vanishing


@pytest.fixture
def exporters():
    servers, ports = [], []
    for factor in (1, 2):
        registry = CollectorRegistry()
        registry.register(DiffCollector(factor))
        port = free_port()
        server, _thread = start_http_server(port, "127.0.0.1", registry)
        servers.append(server)
        ports.append(port)
    yield ports
    for server in servers:
        server.shutdown()


# -- HTTP ----------------------------------------------------------------------------------------


def http(url: str, body: bytes | None = None, headers=None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def ask_prometheus(prometheus, path: str, params: dict) -> tuple[int, dict]:
    status, body = http(f"http://127.0.0.1:{prometheus.port}{path}?{urllib.parse.urlencode(params)}")
    return status, json.loads(body)


def ask_tsgate(gateway, tenant: str, path: str, params: dict) -> tuple[int, dict]:
    """Instant queries by GET, range queries by form POST, as Grafana does either."""
    headers = {"X-Scope-OrgID": tenant}
    if path.endswith("query_range"):
        status, body = http(gateway.url + path, urllib.parse.urlencode(params).encode(), dict(headers, **FORM))
    else:
        status, body = http(f"{gateway.url}{path}?{urllib.parse.urlencode(params)}", headers=headers)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, {"status": "not JSON", "body": body[:300].decode(errors="replace")}


def raw_timestamps(url: str, headers: dict, start_ms: int, end_ms: int) -> dict:
    """Every series' sample timestamps (stale markers included) through remote read."""
    query = ReadQuery(start_ms, end_ms, [Matcher("RE", "__name__", ".+")])
    read_headers = dict(
        headers,
        **{
            "Content-Type": "application/x-protobuf",
            "Content-Encoding": "snappy",
            "X-Prometheus-Remote-Read-Version": "0.1.0",
        },
    )
    status, body = http(url, encode_read_request([query], ["SAMPLES"]), read_headers)
    assert status == 200, body[:300]
    (series,) = decode_read_response(body, 1 << 30)
    return {tuple(sorted(labels.items())): [ts for ts, _ in samples] for labels, samples in series}


# -- comparison ----------------------------------------------------------------------------------


def same_value(a: str, b: str) -> bool:
    x, y = float(a), float(b)
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return x == y or math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)


def same_points(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        round(ta * 1000) == round(tb * 1000) and same_value(va, vb) for (ta, va), (tb, vb) in zip(a, b)
    )


def difference(expected: dict, got: dict, ordered: bool) -> str | None:
    """Why two successful answers differ, or None when they match."""
    if got.get("status") != "success":
        return f"tsgate answered {json.dumps(got)[:300]}"
    kind, result = expected["data"]["resultType"], expected["data"]["result"]
    if got["data"].get("resultType") != kind:
        return f"resultType {got['data'].get('resultType')} instead of {kind}"
    theirs = got["data"]["result"]
    if kind == "string":
        return None if theirs == result else f"{theirs} instead of {result}"
    if kind == "scalar":
        return None if same_points([result], [theirs]) else f"{theirs} instead of {result}"

    def keyed(items):
        pairs = [
            (tuple(sorted(item["metric"].items())), item["values"] if kind == "matrix" else [item["value"]])
            for item in items
        ]
        return pairs if ordered else sorted(pairs, key=lambda pair: pair[0])

    mine, yours = keyed(result), keyed(theirs)
    repeated = sorted({labels for labels, _ in yours if [other for other, _ in yours].count(labels) > 1})
    if repeated:
        return f"{len(yours)} series where Prometheus has {len(mine)}: the same labels more than once, e.g. {dict(repeated[0])}"
    if [labels for labels, _ in mine] != [labels for labels, _ in yours]:
        missing = [dict(labels) for labels, _ in mine if labels not in dict(yours)]
        extra = [dict(labels) for labels, _ in yours if labels not in dict(mine)]
        return f"series differ: missing {missing[:3]}, extra {extra[:3]}, order {[dict(labels) for labels, _ in yours][:4]}"
    for (labels, points), (_, their_points) in zip(mine, yours):
        if not same_points(points, their_points):
            return f"{dict(labels)}: {points_difference(points, their_points)}"
    return None


def points_difference(expected: list, got: list) -> str:
    """Which points differ: timestamps only one side has, and values that differ (at most 5 of each)."""
    theirs = {round(t * 1000): v for t, v in got}
    mine = {round(t * 1000): v for t, v in expected}
    missing = sorted(mine.keys() - theirs.keys())
    extra = sorted(theirs.keys() - mine.keys())
    values = [
        (t / 1000, mine[t], theirs[t])
        for t in sorted(mine.keys() & theirs.keys())
        if not same_value(mine[t], theirs[t])
    ]
    parts = [f"{len(got)} points where Prometheus has {len(expected)}"]
    if missing:
        parts.append(f"missing at {[t / 1000 for t in missing[:5]]}")
    if extra:
        parts.append(f"extra at {[t / 1000 for t in extra[:5]]}")
    if values:
        parts.append(f"{len(values)} values differ, (time, expected, got): {values[:5]}")
    return "; ".join(parts)


def scraping_off_whole_seconds(gateways, exporters, tmp_path, tenant) -> tuple[PrometheusProcess, str, str]:
    """A Prometheus scraping the exporters into every gateway, whose scrapes fall off the whole
    seconds, with its configuration and the tenant it writes. Prometheus times a target's scrapes
    at a fixed offset in the second (from a hash of its labels); at offset 0 every sample sits on
    the whole-second edges of ``@`` and subquery windows, which 2.42 includes and Prometheus 3 (as
    tsgate) leaves out. Such a start is replaced by one whose targets carry another label (so
    another hash) and write another tenant: about one run in 500."""
    for attempt in range(5):
        written = tenant if attempt == 0 else f"{tenant}-{attempt}"
        config = PROMETHEUS_CONFIG.replace("EXPORTER_A", str(exporters[0])).replace("EXPORTER_B", str(exporters[1]))
        for gateway in gateways:
            config += REMOTE_WRITE.replace("GATEWAY_PORT", str(gateway.port)).replace("TENANT", written)
        if attempt:
            config = config.replace("]}]", f'], labels: {{attempt: "{attempt}"}}}}]')
        prometheus = PrometheusProcess(tmp_path / f"prometheus-{attempt}", config).start()
        deadline = time.monotonic() + 30
        while not (scraped := prometheus.api("/api/v1/query", query="timestamp(up)")["data"]["result"]):
            assert time.monotonic() < deadline, "Prometheus never scraped the exporters"
            time.sleep(0.5)
        if all(round(float(found["value"][1]) * 1000) % 1000 for found in scraped):
            return prometheus, config, written
        prometheus.stop()
    raise AssertionError("Prometheus scraped on whole seconds five times over")


def test_promql_answers_match_prometheus(gateways, exporters, tmp_path, tenant):
    prometheus, config, tenant = scraping_off_whole_seconds(gateways.values(), exporters, tmp_path, tenant)
    try:
        deadline = time.monotonic() + 30
        while not prometheus.api("/api/v1/query", query="d_version")["data"]["result"]:
            assert time.monotonic() < deadline, "Prometheus never scraped the exporters"
            time.sleep(0.5)
        time.sleep(RUN_SECONDS)
        prometheus.config_path.write_text(
            config[: config.index("scrape_configs:")] + config[config.index("remote_write:") :]
        )
        prometheus.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while prometheus.api("/api/v1/targets")["data"]["activeTargets"]:
            assert time.monotonic() < deadline, "Prometheus kept its targets after the reload"
            time.sleep(0.5)
        stopped = int(time.time())
        end, start = stopped - 8, stopped - 8 - WINDOW
        mid = start + WINDOW // 2
        span = ((start - 600) * 1000, stopped * 1000 + 5000)
        reference = raw_timestamps(f"http://127.0.0.1:{prometheus.port}/api/v1/read", {}, *span)
        for store, gateway in gateways.items():
            deadline = time.monotonic() + 60
            while raw_timestamps(gateway.url + "/api/v1/read", {"X-Scope-OrgID": tenant}, *span) != reference:
                assert time.monotonic() < deadline, f"tsgate on {store} never held the samples Prometheus holds"
                time.sleep(1)

        def placed(text: str) -> str:
            for name, at in (("START", start), ("END", end), ("MID", mid)):
                text = text.replace(f"{name}_RFC3339", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))).replace(
                    name, str(at)
                )
            return text

        mismatches, asked, empty = [], 0, []
        for number, (area, modes, query) in enumerate(parsed_queries()):
            query = placed(query)
            ordered = modes.endswith("-ordered")
            # instant and range queries half a second off the whole seconds, so no subquery step
            # (whole seconds) falls on a window's left edge, which 2.42 includes and Prometheus 3
            # leaves out
            instant = {"query": query, "time": end + 0.5}
            requests = [] if modes.endswith("-3") else [("/api/v1/query", instant, ordered)]
            if modes.startswith("IR") and not modes.endswith(("-3", "-3range")):
                step = RANGE_STEPS[number % len(RANGE_STEPS)]
                requests.append(
                    (
                        "/api/v1/query_range",
                        {"query": query, "start": start + 0.5, "end": end + 0.5, "step": step},
                        False,
                    )
                )
            for path, params, in_order in requests:
                asked += 1
                status, expected = ask_prometheus(prometheus, path, params)
                assert status == 200 and expected["status"] == "success", (
                    f"the test's query is wrong: {query}: {expected}"
                )
                if expected["data"]["result"] in ([], None):
                    empty.append(query)
                for store, gateway in gateways.items():
                    problem = difference(expected, ask_tsgate(gateway, tenant, path, params)[1], in_order)
                    if problem:
                        mismatches.append(f"{store} [{area}] {path} {params}: {problem}")
        for path, params in PARAMETER_FORMS:
            params = {key: placed(value) for key, value in params.items()}
            asked += 1
            status, expected = ask_prometheus(prometheus, path, params)
            assert status == 200 and expected["data"]["result"], (
                f"the test's parameters are wrong: {params}: {expected}"
            )
            for store, gateway in gateways.items():
                problem = difference(expected, ask_tsgate(gateway, tenant, path, params)[1], False)
                if problem:
                    mismatches.append(f"{store} [parameters] {path} {params}: {problem}")
        for path, params in ERRORS:
            params = {key: placed(value) for key, value in params.items()}
            asked += 1
            status, expected = ask_prometheus(prometheus, path, params)
            assert expected["status"] == "error", f"Prometheus accepted the bad request {params}"
            for store, gateway in gateways.items():
                their_status, got = ask_tsgate(gateway, tenant, path, params)
                if (their_status, got.get("status"), got.get("errorType")) != (status, "error", expected["errorType"]):
                    mismatches.append(
                        f"{store} [error] {path} {params}: expected {status} {expected['errorType']} ({expected['error']}), got {their_status} {json.dumps(got)[:300]}"
                    )
    finally:
        prometheus.stop()
    assert asked >= 300 and len(empty) < 20, f"too many empty reference answers: {empty}"
    assert not mismatches, (
        f"{len(mismatches)} answers of {asked} requests to each store differ from Prometheus:\n" + "\n".join(mismatches)
    )
    assert not [store for store, gateway in gateways.items() if "Traceback" in gateway.log()]
