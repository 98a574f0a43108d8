"""PromQL over native histograms, on hand-made series with answers worked out by hand from
Prometheus's definitions (docs/promql.rst); test_prometheus_e2e.py compares with a real
Prometheus 2.42."""

import math
import time

import numpy as np
import orjson
import pytest

from gateway.http.promql_api import _encode_instant, _encode_matrix, _envelope
from gateway.query.promql.engine import Evaluator, Query, parse, plan
from gateway.query.promql.values import Series, Vector
from protocols.prometheus.native_histogram import Histogram, HistogramMean, HistogramSum

S = 1000


def h(count, sum_, positive=None, negative=None, zero=0.0, schema=0, threshold=0.001, custom=(), hint=0) -> Histogram:
    return Histogram(schema, threshold, zero, count, sum_, positive or {}, negative or {}, custom, hint)


def growing(k: int) -> Histogram:
    """Sample k of a steady counter: k zero observations, 2k in (1, 2], 3k in (2, 4]."""
    return h(6.0 * k, 10.0 * k, {1: 2.0 * k, 2: 3.0 * k}, zero=float(k))


API = {"__name__": "latency", "job": "api"}
WEB = {"__name__": "latency", "job": "web"}
HISTOGRAMS = [
    (API, [(15 * k, growing(k)) for k in range(9)]),
    # a restart at 60 s: back to sample 1
    (WEB, [(15 * k, growing(k)) for k in range(4)] + [(60, growing(1))]),
    # schema 1 then schema 0: (1, 1.41] and (1.41, 2] become (1, 2]
    ({"__name__": "sized"}, [(0, h(2.0, 3.0, {1: 1.0, 2: 1.0}, schema=1)), (60, h(5.0, 8.0, {1: 5.0}))]),
    # custom buckets (-Inf, 0.5] (0.5, 1] (1, 5] (5, +Inf)
    (
        {"__name__": "nhcb"},
        [(0, h(10.0, 20.0, {0: 2.0, 1: 2.0, 2: 4.0, 3: 2.0}, schema=-53, threshold=0.0, custom=(0.5, 1.0, 5.0)))],
    ),
    (
        {"__name__": "nhcb_rebucketed"},
        [
            (0, h(10.0, 20.0, {0: 10.0}, schema=-53, threshold=0.0, custom=(0.5, 1.0))),
            (30, h(4.0, 4.0, {1: 4.0}, schema=-53, threshold=0.0, custom=(0.5, 2.0))),
            (60, h(6.0, 6.0, {1: 6.0}, schema=-53, threshold=0.0, custom=(0.5, 2.0))),
        ],
    ),
    # a metric whose type changed: floats at 0 s and 15 s, histograms from 30 s
    ({"__name__": "retyped"}, [(30, growing(1)), (45, growing(2))]),
]
FLOATS = [
    ({"__name__": "latency", "job": "batch"}, [(t, 1.0) for t in range(0, 121, 15)]),
    ({"__name__": "retyped"}, [(0, 1.0), (15, 2.0)]),
]


def _series(labels, points, objects: bool) -> Series:
    stamps = np.array([t * S for t, _ in points], dtype=np.int64)
    return Series(labels, stamps, np.array([v for _, v in points], dtype=object if objects else np.float64))


def _chosen(pairs, matchers):
    return [(labels, points) for labels, points in pairs if all(m.matches(labels.get(m.name, "")) for m in matchers)]


def evaluate(
    text: str, at: float | None = None, start: float | None = None, end: float | None = None, step: float = 15
):
    expr = parse(text)
    if at is not None:
        start = end = at
    query = Query(int(start * S), int(end * S), int(step * S), 300 * S)
    times = np.arange(query.start_ms, query.end_ms + 1, int(step * S), dtype=np.int64)
    data, histograms = {}, {}
    for key, (matchers, _, _) in plan(expr, query).items():
        data[key] = [_series(labels, points, False) for labels, points in _chosen(FLOATS, matchers)]
        histograms[key] = [_series(labels, points, True) for labels, points in _chosen(HISTOGRAMS, matchers)]
    evaluator = Evaluator(query, data, time.monotonic() + 10, histograms)
    return evaluator.result(expr, times), evaluator.warnings


def instant(text: str, at: float) -> dict:
    """{labels: float or Histogram} of an instant query."""
    value, _ = evaluate(text, at)
    assert isinstance(value, Vector)
    found = {}
    for row, labels in enumerate(value.labels):
        key = tuple(sorted(labels.items()))
        if value.present[row, 0]:
            found[key] = value.values[row, 0]
        elif value.histograms is not None and value.histograms[row, 0] is not None:
            found[key] = value.histograms[row, 0]
    return found


def test_a_selector_gives_histogram_samples_with_lookback():
    assert instant('latency{job="api"}', 60) == {tuple(sorted(API.items())): growing(4)}
    assert instant('latency{job="api"}', 70) == {tuple(sorted(API.items())): growing(4)}  # the last sample, 10 s old
    assert instant('latency{job="api"}', 120 + 299) == {tuple(sorted(API.items())): growing(8)}
    assert instant('latency{job="api"}', 120 + 300) == {}  # the lookback is left-open (Prometheus 3)
    both = instant("latency", 60)
    assert both[(("__name__", "latency"), ("job", "batch"))] == 1.0 and both[
        (("__name__", "latency"), ("job", "web"))
    ] == growing(1)


def test_histogram_count_sum_avg_of_any_expression():
    api = (("job", "api"),)
    assert instant('histogram_count(latency{job="api"})', 60) == {api: 24.0}
    assert instant('histogram_sum(latency{job="api"})', 60) == {api: 40.0}
    assert instant('histogram_avg(latency{job="api"})', 60) == {api: 40.0 / 24.0}
    # rate over [0, 60]: sample 4 minus sample 0, no extrapolation, per second
    assert instant('histogram_count(rate(latency{job="api"}[1m]))', 60) == {api: pytest.approx(24 / 60)}
    assert instant('histogram_sum(sum(latency{job=~"api|web"}))', 60) == {(): 40.0 + 10.0}
    assert instant("histogram_count(latency)", 60) == {api: 24.0, (("job", "web"),): 6.0}  # the float series left out


def test_histogram_stddev_and_stdvar_from_prometheus_3_formulas():
    mean = 40.0 / 24.0
    # zero bucket at 0, exponential buckets at their geometric mean
    variance = (4 * (0 - mean) ** 2 + 8 * (math.sqrt(1 * 2) - mean) ** 2 + 12 * (math.sqrt(2 * 4) - mean) ** 2) / 24
    api = (("job", "api"),)
    assert instant('histogram_stdvar(latency{job="api"})', 60) == {api: pytest.approx(variance)}
    assert instant('histogram_stddev(latency{job="api"})', 60) == {api: pytest.approx(math.sqrt(variance))}
    # custom buckets at their midpoints: the first one's, (-Inf + 0.5) / 2, is -Inf
    assert math.isinf(instant("histogram_stdvar(nhcb)", 60)[()])


def test_histogram_quantile_interpolates_linearly_in_native_buckets():
    api = (("job", "api"),)
    # sample 4: 4 in the zero bucket, 8 in (1, 2], 12 in (2, 4]; 24 in all
    assert instant('histogram_quantile(0.5, latency{job="api"})', 60) == {api: 2.0}  # rank 12 ends (1, 2]
    # rank 18: 6 of 12 into (2, 4], exponentially inside it (Prometheus 3): 2^1.5
    assert instant('histogram_quantile(0.75, latency{job="api"})', 60) == {api: pytest.approx(2**1.5)}
    # rank 2.4 in the zero bucket, which starts at 0 since there are no negative buckets
    assert instant('histogram_quantile(0.1, latency{job="api"})', 60) == {api: pytest.approx(0.001 * 2.4 / 4)}
    assert instant('histogram_quantile(0.5, rate(latency{job="api"}[1m]))', 60) == {api: pytest.approx(2.0)}
    assert instant('histogram_quantile(1.5, latency{job="api"})', 60) == {api: math.inf}
    # the classic path beside it is unchanged
    assert instant("histogram_quantile(0.5, latency_bucket)", 60) == {}


def test_histogram_quantile_and_fraction_on_custom_buckets():
    # 2 in (-Inf, 0.5], 2 in (0.5, 1], 4 in (1, 5], 2 above 5
    assert instant("histogram_quantile(0.5, nhcb)", 30) == {(): 2.0}  # rank 5: 1 of 4 into (1, 5]
    assert instant("histogram_quantile(0.1, nhcb)", 30) == {(): 0.25}  # the first bucket starts at 0
    assert instant("histogram_quantile(0.95, nhcb)", 30) == {(): 5.0}  # the +Inf bucket: its lower bound
    assert instant("histogram_fraction(0, 3, nhcb)", 30) == {(): pytest.approx((2 + 2 + 4 * 2 / 4) / 10)}


def test_histogram_fraction_interpolates_inside_buckets():
    # all of the zero bucket (4) and (1, 2] (8), of (2, 4] the share below 3 exponentially
    # (Prometheus 3: log2(3) - 1 of its 12), out of 24
    assert instant('histogram_fraction(0, 3, latency{job="api"})', 60) == {
        (("job", "api"),): pytest.approx((4 + 8 + 12 * (math.log2(3) - 1)) / 24)
    }
    assert instant('histogram_fraction(-1, 0.0005, latency{job="api"})', 60) == {
        (("job", "api"),): pytest.approx(2 / 24)
    }
    assert instant('histogram_fraction(3, 3, latency{job="api"})', 60) == {(("job", "api"),): 0.0}


def test_rate_and_increase_extrapolate_like_floats():
    api = (("job", "api"),)
    (rate,) = instant('rate(latency{job="api"}[1m])', 60).values()
    assert rate.count == pytest.approx(24 / 60) and rate.sum == pytest.approx(40 / 60)
    assert rate.positive == pytest.approx({1: 8 / 60, 2: 12 / 60}) and rate.zero_count == pytest.approx(4 / 60)
    # window [10 s, 70 s]: samples 1..4 over 45 s, extrapolated 5 s back and 10 s on -> * 60 / 45
    (increase,) = instant('increase(latency{job="api"}[1m])', 70).values()
    assert increase.count == pytest.approx(18 * 60 / 45) and increase.positive == pytest.approx(
        {1: 6 * 60 / 45, 2: 9 * 60 / 45}
    )
    (delta,) = instant('delta(latency{job="api"}[1m])', 60).values()
    assert delta.count == 24.0
    (irate,) = instant('irate(latency{job="api"}[1m])', 60).values()
    assert irate.count == pytest.approx(6 / 15) and irate.positive == pytest.approx({1: 2 / 15, 2: 3 / 15})
    assert set(instant('rate(latency{job="api"}[1m])', 60)) == {api}


def test_counter_resets_add_the_sample_before_back():
    # 0 1 2 3 | restart | 1: last - first + the sample before the restart
    (increase,) = instant('increase(latency{job="web"}[1m])', 60).values()
    assert increase.count == 6 + 18 and increase.positive == {1: 2 + 6, 2: 3 + 9} and increase.zero_count == 1 + 3
    (irate,) = instant('irate(latency{job="web"}[1m])', 60).values()
    assert irate.count == pytest.approx(6 / 15)  # after a reset, the last sample alone
    # the custom bounds changed at 30 s, which is a counter reset: the increase starts from nothing
    # in the second sample's bounds (Prometheus 3), 6 over 60 s sampled, extended 1 s back
    value, warnings = evaluate("increase(nhcb_rebucketed[61s])", 60)
    (increase,) = value.histograms[:, 0]
    assert increase.count == pytest.approx(6.1) and increase.custom_values == (0.5, 2.0) and not warnings
    # over (0 s, 60 s] the bounds are the same: 4 -> 6, extended to the window's start: 2 * 60 / 30
    (increase,) = instant("increase(nhcb_rebucketed[1m])", 60).values()
    assert increase.count == 4.0 and increase.positive == {1: 4.0}


def test_reset_detection():
    before = h(10.0, 10.0, {1: 5.0, 2: 5.0}, zero=0.0)
    assert not h(11.0, 11.0, {1: 6.0, 2: 5.0}).detect_reset(before)
    assert h(11.0, 11.0, {1: 4.0, 2: 7.0}).detect_reset(before)  # a bucket went down
    assert h(9.0, 11.0, {1: 5.0, 2: 4.0}).detect_reset(before)  # the count went down
    assert h(10.0, 10.0, {1: 5.0, 2: 5.0}, schema=1).detect_reset(before)  # a higher schema
    assert h(10.0, 10.0, {1: 5.0, 2: 5.0}, threshold=0.0001).detect_reset(before)  # a smaller zero threshold
    # a zero threshold of 1 takes in bucket 0 ((0.5, 1]) only, which is empty in both: no reset
    assert not h(10.0, 10.0, {1: 5.0, 2: 5.0}, threshold=1.0).detect_reset(before)
    # a zero threshold of 1.5 falls inside the populated (1, 2]: the layouts cannot be compared
    assert h(10.0, 10.0, {2: 5.0}, zero=5.0, threshold=1.5).detect_reset(before)
    assert h(12.0, 12.0, {1: 6.0, 2: 6.0}, hint=1).detect_reset(before)  # the sender said so
    assert not h(1.0, 1.0, {}, hint=2).detect_reset(before)


def test_schemas_are_reconciled_to_the_lowest():
    (increase,) = instant("increase(sized[61s])", 60).values()  # 0 s and 60 s, extended 1 s back
    assert (
        increase.schema == 0 and increase.positive == {1: pytest.approx(3.05)} and increase.count == pytest.approx(3.05)
    )
    merged = h(2.0, 3.0, {1: 1.0, 2: 1.0, -1: 2.0}, schema=1).add(h(1.0, 1.0, {1: 1.0}, threshold=0.6))
    # schema 1 bucket -1 ((0.5, 0.71]) and 0 would be schema 0 bucket 0 ((0.5, 1]): inside threshold 1 after widening
    assert (
        merged.schema == 0 and merged.positive == {1: 3.0} and merged.zero_threshold == 1.0 and merged.zero_count == 2.0
    )


def test_sum_avg_count_and_scalar_arithmetic():
    both = 'latency{job=~"api|web"}'
    assert instant(f"sum({both})", 60) == {(): growing(5)}  # samples 4 + 1
    assert instant(f"avg({both})", 60)[()] == growing(5).scale(0.5)
    assert instant(f"count({both})", 60) == {(): 2.0}
    assert instant("count(latency)", 60) == {(): 3.0}  # floats and histograms alike
    assert instant(f"sum by (job) ({both})", 60) == {(("job", "api"),): growing(4), (("job", "web"),): growing(1)}
    assert instant(f"{both} * 2", 60)[(("job", "api"),)] == growing(8)
    assert instant(f"2 * {both}", 60)[(("job", "api"),)] == growing(8)
    assert instant(f"{both} / 2", 60)[(("job", "api"),)] == growing(2)
    assert instant(f"2 / {both}", 60) == {}


def test_floats_and_histograms_in_one_sum_drop_the_element_with_a_warning_and_custom_bounds_are_reconciled():
    value, warnings = evaluate("sum(latency)", 60)
    assert not value.labels and warnings == [
        "PromQL warning: encountered a mix of histograms and floats for aggregation"
    ]
    value, warnings = evaluate('sum by (job) (latency{job=~"api|batch"})', 60)
    assert len(value.labels) == 2 and not warnings
    # custom bounds (0.5, 1, 5) and (0.5, 2): summed in the bounds both have, (0.5), with an info
    value, warnings = evaluate('sum({__name__=~"nhcb.*"})', 30)
    (total,) = value.histograms[:, 0]
    assert total.custom_values == (0.5,) and total.positive == {0: 2.0, 1: 12.0} and total.count == 14.0
    assert warnings == ["PromQL info: mismatched custom buckets were reconciled during aggregation"]


def test_range_queries_and_subqueries_over_histograms():
    value, _ = evaluate('histogram_count(increase(latency{job="api"}[30s]))', start=30, end=120, step=30)
    assert value.values.tolist() == [[12.0, 12.0, 12.0, 12.0]]
    value, _ = evaluate('histogram_count(increase(latency{job="api"}[30s:15s]))', start=60, end=60)
    assert value.values.tolist() == [[12.0]]


def test_the_json_is_prometheus_2_42s():
    histogram = h(8.0, 3.0, {1: 2.0, 2: 0.0, 3: 3.0}, negative={2: 2.0}, zero=1.0, schema=0)
    vector = Vector(
        [{"job": "x"}], np.zeros((1, 1)), np.zeros((1, 1), dtype=bool), None, np.array([[histogram]], dtype=object)
    )
    (item,) = orjson.loads(_encode_instant(vector, 5000, []))["data"]["result"]
    assert item == {
        "metric": {"job": "x"},
        "histogram": [
            5.0,
            {
                "count": "8",
                "sum": "3",
                "buckets": [
                    [1, "-4", "-2", "2"],  # negative (2, 4] as [-4, -2)
                    [3, "-0.001", "0.001", "1"],  # the zero bucket, closed
                    [0, "1", "2", "2"],
                    [0, "4", "8", "3"],  # the empty (2, 4] is left out
                ],
            },
        ],
    }
    empty = h(0.0, 0.0)
    assert orjson.loads(_encode_instant(vector._replace(histograms=np.array([[empty]], dtype=object)), 5000, []))[
        "data"
    ]["result"][0]["histogram"] == [5.0, {"count": "0", "sum": "0"}]
    mixed = Vector(
        [{"job": "x"}],
        np.array([[1.0, 0.0]]),
        np.array([[True, False]]),
        None,
        np.array([[None, histogram]], dtype=object),
    )
    (series,) = orjson.loads(_encode_matrix(mixed, np.array([1000, 2000], dtype=np.int64), []))["data"]["result"]
    assert (
        series["values"] == [[1.0, "1"]]
        and series["histograms"][0][0] == 2.0
        and series["histograms"][0][1]["count"] == "8"
    )
    value, _ = evaluate('latency{job="web"}[30s]', 60)
    (ranged,) = orjson.loads(_encode_instant(value, 60000, []))["data"]["result"]
    assert [point[0] for point in ranged["histograms"]] == [45.0, 60.0] and "values" not in ranged  # (30 s, 60 s]


def test_set_operators_and_relabelling_keep_histograms():
    api, web, batch = (
        (("__name__", "latency"), ("job", "api")),
        (("__name__", "latency"), ("job", "web")),
        (("__name__", "latency"), ("job", "batch")),
    )
    assert instant('latency and on(job) latency{job=~"api|batch"}', 60) == {api: growing(4), batch: 1.0}
    assert instant('latency unless on(job) latency{job=~"api|batch"}', 60) == {web: growing(1)}
    assert instant('latency{job="api"} or latency', 60) == {api: growing(4), web: growing(1), batch: 1.0}
    relabelled = instant('label_replace(latency{job="api"}, "team", "$1", "job", "(.*)")', 60)
    assert relabelled == {(("__name__", "latency"), ("job", "api"), ("team", "api")): growing(4)}


def test_absent_sees_histograms():
    assert instant('absent(latency{job="api"})', 60) == {}
    assert instant('absent_over_time(latency{job="api"}[1m])', 60) == {}
    assert instant('absent(latency{job="none"})', 60) == {(("job", "none"),): 1.0}


def test_a_stored_nan_or_negative_zero_threshold_is_read_as_zero():
    """Histograms stored before write validation refused them: a NaN zero threshold made
    reconcile widen forever (NaN != NaN), so rate() of such a series never answered."""
    from protocols.prometheus import types_pb2
    from protocols.prometheus.native_histogram import reconcile

    for threshold in (math.nan, -1.0):
        message = types_pb2.Histogram(
            count_int=2, zero_count_int=0, zero_threshold=threshold, schema=0, sum=3.0, timestamp=1
        )
        message.positive_spans.add(offset=1, length=1)
        message.positive_deltas.append(2)
        stored = Histogram.from_proto(message)
        assert stored.zero_threshold == 0.0
        a, b = reconcile(stored, h(1.0, 1.0, {1: 1.0}, threshold=0.5))
        assert a.zero_threshold == b.zero_threshold == 0.5


def test_incompatible_sample_types_are_an_info_in_its_own_list():
    value, annotations = evaluate('latency{job="api"} < 1', 60)
    assert not value.labels and annotations == [
        'PromQL info: incompatible sample types encountered for binary operator "<": histogram < float'
    ]
    _, annotations = evaluate('2 * latency{job="api"} + latency{job="api"} * 2 - 1 / latency{job="api"}', 60)
    assert annotations == [
        'PromQL info: incompatible sample types encountered for binary operator "/": float / histogram'
    ]
    document = orjson.loads(_envelope({}, [*annotations, "a warning"]))
    assert document["infos"] == annotations and document["warnings"] == ["a warning"]


def test_over_time_functions_take_histograms_in():
    """Prometheus 3: sum/avg_over_time add the window's histograms, count/last_over_time see them."""
    api = (("job", "api"),)
    # (30 s, 60 s]: samples 3 and 4 of the steady counter
    (total,) = instant('sum_over_time(latency{job="api"}[30s])', 60).values()
    assert total == growing(3).add(growing(4))
    (mean,) = instant('avg_over_time(latency{job="api"}[30s])', 60).values()
    assert mean.count == (growing(3).count + growing(4).count) / 2
    assert instant('count_over_time(latency{job="api"}[30s])', 60) == {api: 2.0}
    assert instant('last_over_time(latency{job="api"}[30s])', 60) == {tuple(sorted(API.items())): growing(4)}
    assert instant('ts_of_first_over_time(latency{job="api"}[30s])', 60) == {api: 45.0}


def test_histograms_add_subtract_compare_and_negate_between_vectors():
    """Prometheus 3: + and - between two histograms, == and != compare them (the left kept)."""
    api = tuple(sorted(API.items()))
    (double,) = instant('latency{job="api"} + latency{job="api"}', 60).values()
    assert double == growing(4).scale(2.0)
    (none,) = instant('latency{job="api"} - latency{job="api"}', 60).values()
    assert none.count == 0 and none.reset_hint == 3  # a gauge
    assert instant('latency{job="api"} == latency{job="api"}', 60) == {api: growing(4)}
    assert instant('latency{job="api"} != latency{job="api"}', 60) == {}
    assert instant('latency{job="api"} == bool latency{job="api"}', 60) == {(("job", "api"),): 1.0}
    (negated,) = instant('-latency{job="api"}', 60).values()
    assert negated == growing(4).scale(-1.0)


def test_histograms_add_with_kahan_compensation_and_average_incrementally_past_overflow():
    """Prometheus 3's KahanAdd: 1e100 + 1 - 1e100 keeps the 1, in the sum and in the buckets."""
    running = HistogramSum.of(h(1.0, 1e100, {1: 1e100}))
    for histogram in (h(1.0, 1.0, {1: 1.0}), h(1.0, -1e100, {1: -1e100})):
        running.add(histogram)
    total = running.result()
    assert (total.count, total.sum, total.positive) == (3.0, 1.0, {1: 1.0})
    # counts past MaxFloat64 together: the mean goes on incrementally and stays finite
    mean = HistogramMean(h(1.7e308, 2.0))
    mean.add(h(1.5e308, 4.0))
    assert mean.result().count == pytest.approx(1.6e308) and mean.result().sum == 3.0
    # as Prometheus's Div: by 0 the buckets go, the counts and the sum become infinite or NaN
    divided = h(4.0, 0.0, {1: 4.0}, zero=2.0).divided(0.0)
    assert divided.positive == {} and divided.count == math.inf and divided.zero_count == math.inf
    assert math.isnan(divided.sum)


def test_custom_bucket_resets_are_judged_in_the_bounds_both_samples_have():
    before = h(3.0, 3.0, {1: 3.0}, schema=-53, threshold=0.0, custom=(1.0,))  # 3 in (1, +Inf)
    assert not h(3.0, 3.0, {1: 3.0}, schema=-53, threshold=0.0, custom=(5.0, 10.0)).detect_reset(before)
    assert h(3.0, 3.0, {0: 3.0}, schema=-53, threshold=0.0, custom=(1.0, 10.0)).detect_reset(before)  # (1, +Inf) lost 3


def test_nan_observations_are_told_and_histograms_have_prometheus_text():
    nan = h(15.0, math.nan, {1: 12.0})  # 3 NaN observations, in no bucket
    told = []
    assert nan.quantile(0.4, told.append) == pytest.approx(math.sqrt(2))
    assert nan.quantile(0.9, told.append) != nan.quantile(0.9, told.append) and told == [
        "result is skewed higher",
        "result is NaN",
        "result is NaN",
    ]
    assert nan.fraction(-math.inf, math.inf, lambda: told.append("fraction")) == 0.8 and told[-1] == "fraction"
    text = h(20.0, 10.0, {1: 2.0, 0: 1.0}, {1: 2.0, 0: 1.0}, zero=2.0).text(lambda v: f"{v:g}")
    assert text == "{count:20, sum:10, [-2,-1):2, [-1,-0.5):1, [-0.001,0.001]:2, (0.5,1]:1, (1,2]:2}"


def test_a_series_holding_floats_and_histograms():
    """Prometheus 3: changes/resets walk both kinds in time order; irate by the last two samples;
    rate nothing for a window holding both kinds, with a warning."""
    assert instant("changes(retyped[1m])", 45) == {(): 3.0}  # 1 -> 2, 2 -> histogram, growing(1) -> growing(2)
    assert instant("resets(retyped[1m])", 45) == {(): 1.0}  # the change of kind
    assert instant("irate(retyped[1m])", 45)[()] == growing(1).scale(1 / 15)
    mixed = 'PromQL warning: encountered a mix of histograms and floats for metric name "retyped"'
    for query, at in (("irate(retyped[1m])", 30), ("rate(retyped[1m])", 45)):
        value, warnings = evaluate(query, at)
        assert not value.labels and warnings == [mixed]
    assert instant("timestamp(retyped)", 45) == {(): 45.0}


def test_a_sum_read_for_histogram_count_tells_counter_resets_as_prometheus_3():
    """The selector under histogram_count is read as Prometheus's HistogramStatsIterator reads it:
    web's sample at 60 s reset the counter, api's did not, so the sum warns of the conflict."""
    conflict = "PromQL warning: conflicting counter resets during histogram aggregation"
    assert evaluate('histogram_count(sum(latency{job=~"api|web"}))', 60)[1] == [conflict]
    assert evaluate('sum(latency{job=~"api|web"})', 60)[1] == []
    assert evaluate('histogram_count(last_over_time(sum(latency{job=~"api|web"})[1m:15s]))', 60)[1] == []  # a subquery
