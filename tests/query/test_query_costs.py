"""Costs counted before they are paid (issue 21, item 2): what a hostile query would spend is
bounded before the work is done, on the real services over a SQLite store (and Cassandra where
the store enumerates slots)."""

import os
import socket
import time
import urllib.parse

import numpy as np
import pytest
import pytest_twisted
from prometheus_client import REGISTRY

from gateway.core.model import ExemplarSample, HistogramSample, Limits, Sample, now_ms
from gateway.ingest.metadata_cache import KnownSeries
from gateway.ingest.pipeline import IngestPipeline
from gateway.query.graphite.tagdb import TagDB
from gateway.query.planner import QueryPlanner, QueryTooLarge
from gateway.query.promql.engine import QueryText
from gateway.query.promql.service import PromQLService
from gateway.query.promql.values import PromQLError
from gateway.query.remote_read import RemoteRead
from protocols.linear_regex import BadPattern, compile_regex
from protocols.prometheus import Matcher, WriteSeries, prometheus_labels
from protocols.prometheus.read import ReadQuery
from tests.e2e.test_read_path_e2e import remote_write
from tests.protocols.test_prometheus_protocol import histogram

LONG_VALUE = "x" * 2048
MINUTE = 60_000
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@pytest.mark.parametrize("pattern", ["(.*){1000}", "((.*)|(.*)){1000}", "((.*)|(.*)|(.*)){1000}"])
def test_a_capturing_regex_matches_long_values_on_the_dfa(pattern):
    """Groups made RE2 fall back to its NFA: 107-412 ms a 2 KB value, so 100 values took 10-41 s."""
    matcher = Matcher("RE", "v", pattern)
    began = time.monotonic()
    assert all(matcher.matches(f"{LONG_VALUE}{i}") for i in range(100))
    assert time.monotonic() - began < 2


def test_a_regex_too_large_for_the_dfa_is_refused():
    with pytest.raises(BadPattern, match="too complex"):
        compile_regex("((.*)|(.*)|(.*)|(.*)|(.*)|(.*)|(.*)|(.*)){1000}")


def test_substitutions_keep_their_groups():
    assert compile_regex("a(b)c", capture=True).sub(r"\1!", "abc") == "b!"
    assert compile_regex("a(b)c").fullmatch("abc") is not None


@pytest_twisted.ensureDeferred
async def test_an_open_range_read_costs_what_the_data_does(store, tenant):
    """A remote read without start and end (Prometheus's /api/v1/series through remote_read) made
    Cassandra list every 1 h slot from 1970 to 9999 for exemplars and histograms (70 million):
    a worker grew to 2.9 GB and hung for 13 minutes. Ranges are cut to what the retentions hold."""
    pipeline = IngestPipeline(store, Limits(), KnownSeries(1000), 1_000_000)
    stamp = (now_ms() // MINUTE - 1) * MINUTE
    assert not (await pipeline.ingest("prometheus", [Sample(tenant, "up", {"job": "a"}, stamp, 1.0)])).rejected
    exemplar = ExemplarSample(tenant, "up", {"job": "a"}, stamp, 1.0, {"trace_id": "t1"})
    assert not (await pipeline.ingest_exemplars("prometheus", [exemplar])).rejected
    native = HistogramSample(tenant, "latency", {"job": "a"}, stamp, histogram(count=3, timestamp=stamp))
    assert not (await pipeline.ingest_histograms("prometheus", [native])).rejected
    planner = QueryPlanner(store, max_series=100)
    began = time.monotonic()

    queries = [ReadQuery(INT64_MIN, INT64_MAX, [Matcher("RE", "__name__", "up|latency")])]
    (found,) = await RemoteRead(store, planner, 1000).read(tenant, queries, streamed=False)
    by_name = {labels["__name__"]: (samples, exemplars, histograms) for labels, samples, exemplars, histograms in found}
    samples, exemplars, _ = by_name["up"]
    assert [value for _, value in samples.points()] == [1.0]
    assert [(e.labels, e.timestamp) for e in exemplars] == [({"trace_id": "t1"}, stamp)]
    assert [h.timestamp for h in by_name["latency"][2]] == [stamp]

    promql = PromQLService(store, planner, 1000, 5 * MINUTE, 60_000)
    ((labels, rows),) = await promql.exemplars(tenant, "up", 0, 253_402_300_799_999)
    assert labels == {"__name__": "up", "job": "a"} and [row.timestamp_ms for row in rows] == [stamp]
    assert time.monotonic() - began < 10


async def _write_minutes(store, tenant: str, series: int, hours: int = 6) -> int:
    """``m{i=...}`` every 15 s for ``hours`` up to a minute ago; returns the last timestamp."""
    pipeline = IngestPipeline(store, Limits(), KnownSeries(10_000), 10_000_000)
    end = (now_ms() // MINUTE - 1) * MINUTE
    samples = [
        Sample(tenant, "m", {"i": str(i)}, end - k * 15_000, float(k))
        for i in range(series)
        for k in range(hours * 240)
    ]
    assert not (await pipeline.ingest("prometheus", samples)).rejected
    return end


async def _instant(store, tenant: str, text: str, at: int, max_samples: int = 50_000_000, timeout_ms: int = 60_000):
    service = PromQLService(store, QueryPlanner(store, max_series=10_000), max_samples, 5 * MINUTE, timeout_ms)
    return await service.evaluate(tenant, text, service.query(at, at, 0), np.array([at]), None)


@pytest.mark.parametrize(
    "text, max_samples",
    [
        ("max_over_time(vector(1)[1d:1s])", 1000),  # 86401 inner steps passed a limit of 1000
        ('rate(({__name__=~"up|http.*"})[292y:])', 50_000_000),  # 153 million steps froze the server
        ("max_over_time(max_over_time(m[6h:1s])[6h:1s])", 50_000_000),  # windows of 466 million samples
    ],
)
@pytest_twisted.ensureDeferred
async def test_subquery_steps_and_windows_count_against_the_sample_limit(sqlite_store, tenant, text, max_samples):
    end = await _write_minutes(sqlite_store, tenant, series=3)
    began = time.monotonic()
    with pytest.raises(PromQLError, match="would load too many samples into memory in query execution") as error:
        await _instant(sqlite_store, tenant, text, end, max_samples)
    assert error.value.kind == "execution"
    assert time.monotonic() - began < 3


@pytest_twisted.ensureDeferred
async def test_the_deadline_stops_a_subquery_of_millions_of_steps(sqlite_store, tenant):
    """Checked between nodes only, ``max_over_time(rate(m[1m])[20d:1s])`` ran 93 s past a 5 s
    --query-timeout: the 1.7 million inner steps are one node. 25 series (43 million values,
    under --query-max-samples) take about 5 s here."""
    end = await _write_minutes(sqlite_store, tenant, series=25)
    began = time.monotonic()
    with pytest.raises(PromQLError, match="timed out") as error:
        await _instant(sqlite_store, tenant, "max_over_time(rate(m[1m])[20d:1s])", end, timeout_ms=1000)
    assert error.value.kind == "timeout"
    assert time.monotonic() - began < 3


def _store_calls(operation: str) -> float:
    return REGISTRY.get_sample_value("tsgate_store_operation_duration_seconds_count", {"operation": operation}) or 0


@pytest.fixture
def many_values(sqlite_store, tenant):
    """``vol{i=0..1999}`` and ``other{i=7}``, indexed as ingest indexes them."""

    async def write():
        pipeline = IngestPipeline(sqlite_store, Limits(), KnownSeries(10_000), 10_000_000)
        stamp = now_ms() - MINUTE
        samples = [Sample(tenant, "vol", {"i": str(i)}, stamp, 1.0) for i in range(2000)]
        samples.append(Sample(tenant, "other", {"i": "7"}, stamp, 1.0))
        assert not (await pipeline.ingest("prometheus", samples)).rejected

    return write


@pytest_twisted.ensureDeferred
async def test_index_matching_refuses_before_a_lookup_per_value(sqlite_store, tenant, many_values):
    """With 100k series ``{i=~".+"}`` answered 422 after 103 s: one series_sets lookup per
    matching value, then the count. Values are counted first."""
    await many_values()
    planner = QueryPlanner(sqlite_store, max_series=100)
    lookups = _store_calls("find_series") + _store_calls("find_metrics_by_tag")
    with pytest.raises(QueryTooLarge, match="--max-series-per-query"):
        await planner.select_by_matchers(tenant, [Matcher("RE", "i", ".+")], prometheus_labels)
    assert _store_calls("find_series") + _store_calls("find_metrics_by_tag") - lookups < 10
    narrowed = [Matcher("RE", "i", ".+"), Matcher("EQ", "i", "7")]
    found = await planner.select_by_matchers(tenant, narrowed, prometheus_labels)
    assert sorted(key.metric_name for key in found) == ["other", "vol"]


@pytest_twisted.ensureDeferred
async def test_tag_value_counts_are_refused_past_the_series_limit_or_limited(sqlite_store, tenant, many_values):
    """``GET /tags/i`` over 100k values took 60 s: a count of each value's series."""
    await many_values()
    tags = TagDB(sqlite_store, QueryPlanner(sqlite_store, max_series=100))
    lookups = _store_calls("find_series")
    with pytest.raises(QueryTooLarge, match="--max-series-per-query"):
        await tags.value_counts(tenant, "i")
    assert _store_calls("find_series") == lookups
    assert await tags.value_counts(tenant, "i", limit=3) == [("0", 1), ("1", 1), ("10", 1)]


@pytest.mark.parametrize(
    "text, setting",
    [
        ("+".join(["1"] * 2000), "--query-max-terms"),  # parsing alone held the GIL 3.7 s
        ("vector(1)" + " " * 70_000, "--query-max-length"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_query_text_over_its_bounds_is_refused_before_parsing(sqlite_store, tenant, text, setting):
    began = time.monotonic()
    with pytest.raises(PromQLError, match=setting) as error:
        await _instant(sqlite_store, tenant, text, now_ms())
    assert error.value.kind == "bad_data"
    assert time.monotonic() - began < 0.5


@pytest_twisted.ensureDeferred
async def test_a_deep_expression_is_bad_data_not_a_recursion_error(sqlite_store, tenant):
    """With the depth and terms bounds raised, 1500 nested parentheses parse, then planning recursed too deep (a 500)."""
    service = PromQLService(
        sqlite_store, QueryPlanner(sqlite_store, 100), 1000, 5 * MINUTE, 60_000, QueryText(10**6, 10**6, 10**6)
    )
    text = "(" * 1500 + "1" + ")" * 1500
    with pytest.raises(PromQLError, match="nested too deeply") as error:
        await service.evaluate(tenant, text, service.query(0, 0, 0), np.array([0]), None)
    assert error.value.kind == "bad_data"


def test_render_targets_and_their_length_are_bounded(start_gateway):
    """POST /render with 5000 targets stalled the gateway 8.4 s."""
    gateway = start_gateway("--render-max-targets", "5", "--query-max-length", "1000")
    form = {"format": "json", "from": "-10min", "target": [f"a.b{i}" for i in range(6)]}
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    answer = gateway.post("/render", urllib.parse.urlencode(form, doseq=True).encode(), headers=headers)
    assert answer.status == 400 and "--render-max-targets 5" in answer.json()["error"]
    form["target"] = form["target"][:5]
    assert gateway.post("/render", urllib.parse.urlencode(form, doseq=True).encode(), headers=headers).status == 200
    answer = gateway.get("/render?" + urllib.parse.urlencode({"format": "json", "target": "a." * 600}))
    assert answer.status == 400 and "--query-max-length 1000" in answer.json()["error"]
    answer = gateway.get("/api/v1/query?" + urllib.parse.urlencode({"query": "+".join(["1"] * 400)}))
    assert answer.status == 400 and answer.json()["errorType"] == "bad_data"
    assert "--query-max-terms 300" in answer.json()["error"]


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_client_that_goes_away_cancels_its_query(start_gateway, tenant):
    """The gateway noted a closed connection and kept working: a PromQL query of many seconds ran
    to its end for nobody. Now its work is cancelled, so the process stops spending CPU on it."""
    gateway = start_gateway("--query-max-samples", "200000000", "--query-timeout", "5m")
    end = (now_ms() // MINUTE - 1) * MINUTE
    series = [
        WriteSeries({"__name__": "m", "i": str(i)}, [(end - k * 15_000, float(k)) for k in range(1440)])
        for i in range(45)
    ]
    remote_write(gateway, tenant, series)
    query = urllib.parse.urlencode({"query": "max_over_time(rate(m[1m])[20d:1s])", "time": end / 1000})
    with socket.create_connection(("127.0.0.1", gateway.port)) as client:
        client.sendall(f"GET /api/v1/query?{query} HTTP/1.1\r\nHost: x\r\nX-Scope-OrgID: {tenant}\r\n\r\n".encode())
        time.sleep(1.5)  # selected and read; evaluating (about 10 s of CPU)
    time.sleep(1.5)  # it stops at its next series
    spent = _cpu_seconds(gateway.process.pid)
    time.sleep(3)
    assert _cpu_seconds(gateway.process.pid) - spent < 0.5
    assert gateway.get("/healthz").status == 200
