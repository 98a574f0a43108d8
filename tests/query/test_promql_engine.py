"""The PromQL engine on hand-made series: Prometheus 2.42's arithmetic checked by hand, in
milliseconds and without a store (the differential test compares with a real Prometheus)."""

import math
import struct
import time

import numpy as np
import pytest

from gateway.query.promql.engine import Evaluator, Query, format_value, parse, plan
from gateway.query.promql.values import STALE_NAN_BITS, PromQLError, Scalar, Series, Vector
from protocols.prometheus.native_histogram import Histogram

STALE = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]
S = 1000


def series(labels: dict, points: list[tuple[float, float]]) -> Series:
    return Series(
        labels,
        np.array([int(t * S) for t, _ in points], dtype=np.int64),
        np.array([v for _, v in points], dtype=np.float64),
    )


DATA = [
    series({"__name__": "requests_total", "job": "api", "code": "200"}, [(t, t) for t in range(0, 601, 10)]),
    series(
        {"__name__": "requests_total", "job": "api", "code": "500"},
        [(0, 0), (10, 10), (20, 20), (30, 5), (40, 15), (50, 25), (60, 35)],
    ),
    series({"__name__": "requests_total", "job": "web", "code": "200"}, [(t, 2 * t) for t in range(0, 601, 10)]),
    series({"__name__": "up", "job": "api"}, [(t, 1) for t in range(0, 301, 15)] + [(301, STALE)]),
    series({"__name__": "up", "job": "web"}, [(t, 1) for t in range(0, 601, 15)]),
    series({"__name__": "latency_bucket", "le": "0.1"}, [(t, 10) for t in range(0, 601, 60)]),
    series({"__name__": "latency_bucket", "le": "0.5"}, [(t, 20) for t in range(0, 601, 60)]),
    series({"__name__": "latency_bucket", "le": "+Inf"}, [(t, 30) for t in range(0, 601, 60)]),
]


def evaluate(
    text: str, at: float | None = None, start: float | None = None, end: float | None = None, step: float = 10
):
    expr = parse(text)
    if at is not None:
        query, times = Query(int(at * S), int(at * S), 0, 300 * S), np.array([int(at * S)], dtype=np.int64)
    else:
        query = Query(int(start * S), int(end * S), int(step * S), 300 * S)
        times = np.arange(query.start_ms, query.end_ms + 1, query.step_ms, dtype=np.int64)
    data = {}
    for key, (matchers, _low, _high) in plan(expr, query).items():
        data[key] = [s for s in DATA if all(m.matches(s.labels.get(m.name, "")) for m in matchers)]
    return Evaluator(query, data, time.monotonic() + 10).evaluate(expr, times)


def instant(text: str, at: float) -> dict:
    value = evaluate(text, at)
    assert isinstance(value, Vector)
    return {
        tuple(sorted(labels.items())): values[0]
        for labels, values, present in zip(value.labels, value.values, value.present)
        if present[0]
    }


def test_rate_extrapolates_and_handles_resets():
    assert instant('rate(requests_total{code="200",job="api"}[1m])', 60) == {(("code", "200"), ("job", "api")): 1.0}
    # (0 s, 60 s]: 10 20 | reset | 5 15 25 35: increase 25 + 20 over 50 s sampled, extended 10 s
    # back to the window's start: 45 * 60 / 50
    assert instant('increase(requests_total{code="500"}[1m])', 60) == {(("code", "500"), ("job", "api")): 54.0}
    assert instant('resets(requests_total{code="500"}[1m])', 60) == {(("code", "500"), ("job", "api")): 1.0}
    assert instant('changes(requests_total{code="500"}[1m])', 60) == {(("code", "500"), ("job", "api")): 5.0}
    # windows [25 s, 55 s]: samples at 30..50 of 10 s each; extrapolated by 5 s at both ends -> 30 s
    assert instant('delta(requests_total{code="200",job="api"}[30s])', 55) == {(("code", "200"), ("job", "api")): 30.0}
    assert instant('irate(requests_total{code="500"}[1m])', 40) == {(("code", "500"), ("job", "api")): 1.0}


def test_lookback_and_staleness():
    assert set(instant("up", 300)) == {(("__name__", "up"), ("job", "api")), (("__name__", "up"), ("job", "web"))}
    assert set(instant("up", 302)) == {(("__name__", "up"), ("job", "web"))}
    assert instant("up", 600 + 299) == {(("__name__", "up"), ("job", "web")): 1.0}
    assert instant("up", 600 + 300) == {}  # the lookback is left-open (Prometheus 3)
    assert instant("count_over_time(up[30s])", 345) == {
        (("job", "web"),): 2.0,
    }  # (315 s, 345 s]: left-open, right-closed; api's stale marker at 301 is no sample


def test_aggregations_and_matching():
    assert instant("sum by (job) (rate(requests_total[1m]))", 600) == {(("job", "api"),): 1.0, (("job", "web"),): 2.0}
    assert instant("topk(1, requests_total)", 600) == {
        (("__name__", "requests_total"), ("code", "200"), ("job", "web")): 1200.0
    }
    assert instant("bottomk by (job) (1, requests_total)", 60) == {
        (("__name__", "requests_total"), ("code", "500"), ("job", "api")): 35.0,
        (("__name__", "requests_total"), ("code", "200"), ("job", "web")): 120.0,
    }
    assert instant('count_values("value", up)', 60) == {(("value", "1"),): 2.0}
    ratio = instant("requests_total / ignoring(code) group_left up", 60)
    assert ratio[(("code", "500"), ("job", "api"))] == 35.0
    with pytest.raises(PromQLError, match="many-to-many|multiple matches"):
        evaluate("requests_total + on(job) up", 60)
    assert instant("up and on(job) requests_total", 60) == {
        (("__name__", "up"), ("job", "api")): 1.0,
        (("__name__", "up"), ("job", "web")): 1.0,
    }
    assert instant('up unless on(job) requests_total{job="web"}', 60) == {(("__name__", "up"), ("job", "api")): 1.0}


def test_by_groups_rows_by_their_values_an_absent_label_as_empty_in_order_of_first_appearance():
    value = evaluate('count by (le) ({__name__=~"up|latency_bucket"})', 60)
    assert isinstance(value, Vector)
    assert value.labels == [{}, {"le": "0.1"}, {"le": "0.5"}, {"le": "+Inf"}]
    assert value.values[:, 0].tolist() == [2.0, 1.0, 1.0, 1.0]
    value = evaluate('count without (job) ({__name__=~"up|latency_bucket"})', 60)
    assert isinstance(value, Vector)
    assert value.labels == [{}, {"le": "0.1"}, {"le": "0.5"}, {"le": "+Inf"}]


def test_histogram_quantile_on_classic_buckets():
    assert instant("histogram_quantile(0.5, latency_bucket)", 60) == {(): pytest.approx(0.3)}
    assert instant("histogram_quantile(0.99, latency_bucket)", 60) == {(): 0.5}


def test_histogram_count_and_sum_read_native_histograms_with_lookback_and_staleness():
    expr = parse('histogram_count(latency{job="api"}) + histogram_sum(latency{job="api"})')
    query = Query(60 * S, 60 * S, 0, 300 * S)
    (key,) = plan(expr, query)
    labels = {"__name__": "latency", "job": "api"}
    samples = [Histogram(0, 0.0, 4.0, 4.0, 1.5, {}, {}), Histogram(0, 0.0, 6.0, 6.0, 2.5, {}, {}), None]
    histograms = {key: [Series(labels, np.array([0, 30 * S, 90 * S], dtype=np.int64), np.array(samples, dtype=object))]}
    evaluator = Evaluator(query, {key: []}, time.monotonic() + 10, histograms)
    value = evaluator.evaluate(expr, np.array([60 * S, 100 * S], dtype=np.int64))
    assert value.labels == [{"job": "api"}] and value.values[0, 0] == 8.5 and value.present[0].tolist() == [True, False]


def test_scalars_and_errors():
    assert evaluate("1 + 2 * 3", 60).values.tolist() == [7.0]
    with pytest.raises(PromQLError, match="BOOL"):
        evaluate("1 > 2", 60)
    with pytest.raises(PromQLError) as refused:
        parse("sum(")
    assert refused.value.kind == "bad_data"
    assert isinstance(evaluate("scalar(up)", 60), Scalar)


def test_range_queries_and_subqueries():
    value = evaluate('max_over_time(rate(requests_total{code="500"}[20s])[1m:10s])', start=60, end=120, step=30)
    # the series ends at 60 s: the subquery at 120 s steps from 70 s (left-open), where no rate is
    assert value.present.tolist() == [[True, True, False]]
    series_over_steps = evaluate("up", start=290, end=320, step=10)
    api = series_over_steps.labels.index({"__name__": "up", "job": "api"})
    assert series_over_steps.present[api].tolist() == [True, True, False, False]


def test_values_are_written_as_prometheus_writes_them():
    assert [format_value(v) for v in (1.0, 0.5, 1e20, -2.5e-7, math.nan, math.inf, -math.inf)] == [
        "1",
        "0.5",
        "100000000000000000000",
        "-0.00000025",
        "NaN",
        "+Inf",
        "-Inf",
    ]


def test_a_fill_modifier_on_a_set_operator_is_refused():
    """Never answered as if the modifier were not there (promql-parser reads it there)."""
    with pytest.raises(PromQLError, match="filling in missing series not allowed for set operators"):
        parse("x and fill(0) y")


def test_a_trim_operator_takes_no_bool():
    with pytest.raises(PromQLError, match="bool modifier can only be used on comparison operators"):
        parse("h >/ bool 1")
