"""Costs counted before they are paid (issue 21, item 2): what a hostile query would spend is
bounded before the work is done, on the real services over a SQLite store (and Cassandra where
the store enumerates slots)."""

import time

import pytest
import pytest_twisted

from gateway.ingest import IngestPipeline
from gateway.metadata_cache import KnownSeries
from gateway.model import ExemplarSample, HistogramSample, Limits, Sample, now_ms
from gateway.promql.service import PromQLService
from gateway.query import QueryPlanner
from gateway.remote_read import RemoteRead
from protocols.linear_regex import BadPattern, compile_regex
from protocols.prometheus import Matcher
from protocols.prometheus.read import Query
from tests.test_prometheus_protocol import histogram

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

    queries = [Query(INT64_MIN, INT64_MAX, [Matcher("RE", "__name__", "up|latency")])]
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
