"""The engine's answers on edge values, each checked against a real Prometheus 2.42 holding the
same samples (issue 20): result order of topk/bottomk, Welford and Kahan arithmetic, means near
±MaxFloat64, NaN bounds, empty operands, duplicate label sets, error types of refused queries."""

import math
import time

import numpy as np
import pytest

from gateway.query.promql.engine import Evaluator, Query, parse, plan
from gateway.query.promql.values import PromQLError, Series, Vector
from protocols.prometheus.native_histogram import Histogram

S = 1000
BIG = 1.7e308


def constant(labels: dict, value: float, start: int = 0, end: int = 600) -> Series:
    times = np.arange(start * S, end * S + 1, 15 * S, dtype=np.int64)
    return Series(labels, times, np.full(len(times), value))


def over_time(labels: dict, values: list[float]) -> Series:
    """``values`` 15 s apart from 0 s."""
    return Series(labels, np.arange(len(values), dtype=np.int64) * 15 * S, np.array(values, dtype=np.float64))


DATA = [
    *(constant({"__name__": "t", "i": str(i)}, v) for i, v in enumerate([3, math.nan, 1, 5, 2, math.nan, 4])),
    *(constant({"__name__": "big", "i": str(i)}, v) for i, v in enumerate([BIG, BIG, -BIG])),
    *(constant({"__name__": "same", "i": str(i)}, 0.1) for i in range(3)),
    *(constant({"__name__": "av", "i": str(i)}, v) for i, v in enumerate([0.68, 0.54, 0.22])),
    *(constant({"__name__": "ks", "i": str(i)}, v) for i, v in enumerate([1e100, 1, -1e100])),
    over_time({"__name__": "ot_avg"}, [0.68, 0.54, 0.22]),
    over_time({"__name__": "ot_kahan"}, [1e100, 1, -1e100]),
    over_time({"__name__": "ot_mix"}, [BIG, BIG, -BIG, 5, 1, 1, 1, 1, 1]),
    over_time({"__name__": "ot_big"}, [BIG] * 9),
    over_time({"__name__": "ot_same"}, [0.1] * 9),
    *(
        constant({"__name__": family, "le": le, "job": "x"}, count)
        for family in ("req_a_bucket", "req_b_bucket")
        for le, count in (("0.1", 1), ("1", 3), ("+Inf", 4))
    ),
    constant({"__name__": "na", "job": "x"}, 1),
    constant({"__name__": "nb", "job": "x"}, 1),
    constant({"__name__": "early", "job": "y"}, 1, 0, 100),
    constant({"__name__": "late", "job": "y"}, 1, 400, 600),
]


def evaluate(text: str, at: float = 120, start: float | None = None, end: float | None = None, step: float = 15):
    """The query's answer as the API gets it (Evaluator.result), instant at ``at`` or a range."""
    expr = parse(text)
    if start is None:
        query, times = Query(int(at * S), int(at * S), 0, 300 * S), np.array([int(at * S)], dtype=np.int64)
    else:
        query = Query(int(start * S), int(end * S), int(step * S), 300 * S)
        times = np.arange(query.start_ms, query.end_ms + 1, query.step_ms, dtype=np.int64)
    data = {
        key: [s for s in DATA if all(m.matches(s.labels.get(m.name, "")) for m in matchers)]
        for key, (matchers, _, _) in plan(expr, query).items()
    }
    return Evaluator(query, data, time.monotonic() + 10).result(expr, times)


def rows(text: str, at: float = 120) -> list[tuple[dict, float]]:
    """An instant answer's (labels, value) in answer order."""
    value = evaluate(text, at)
    assert isinstance(value, Vector) and value.values.shape == (len(value.labels), 1)
    return [
        (labels, float(v[0])) for labels, v, present in zip(value.labels, value.values, value.present) if present[0]
    ]


def only(text: str, at: float = 120) -> float:
    (found,) = rows(text, at)
    return found[1]


def test_topk_answers_descending_and_bottomk_ascending_with_nan_last():
    def order(text):
        return [(labels["i"], "NaN" if math.isnan(v) else v) for labels, v in rows(text)]

    assert order("topk(7, t)") == [("3", 5), ("6", 4), ("0", 3), ("4", 2), ("2", 1), ("1", "NaN"), ("5", "NaN")]
    assert order("bottomk(7, t)") == [("2", 1), ("4", 2), ("0", 3), ("6", 4), ("3", 5), ("1", "NaN"), ("5", "NaN")]
    assert order("topk(2, t)") == [("3", 5), ("6", 4)]
    assert order("bottomk by (i) (1, t)")[:3] == [("0", 3), ("1", "NaN"), ("2", 1)]  # groups in input order


def test_variance_is_welford_and_identical_values_give_exactly_zero():
    assert only("stddev(same)") == 0.0 and only("stdvar(same)") == 0.0
    assert only("stddev(ks)") == 8.164965809277261e99
    assert only("stddev_over_time(ot_same[5m])") == 0.0 and only("stdvar_over_time(ot_same[5m])") == 0.0
    assert only("stddev_over_time(ot_kahan[5m])", 40) == 8.164965809277261e99


def test_means_are_kahan_sums_over_the_count_and_do_not_overflow():
    """Prometheus 3's avg and avg_over_time: a Kahan sum divided by the count, an incremental
    mean once the sum would overflow."""
    assert only("avg(big)") == 5.666666666666665e307
    assert only('avg(big{i!="2"})') == BIG
    assert only("avg(av)") == 0.48
    assert only("avg_over_time(ot_avg[5m])", 40) == 0.48  # with Kahan summation
    assert only("avg_over_time(ot_kahan[5m])", 40) == 1 / 3
    assert only("avg_over_time(ot_mix[5m])") == 1.8888888888888883e307
    assert only("avg_over_time(ot_big[5m])") == 1.6999999999999997e308  # the incremental mean after overflow
    assert only("sum_over_time(ot_kahan[5m])", 40) == 1.0  # Kahan: the 1 is not lost
    assert only("sum(ks)") == 1.0  # Kahan too (2.42 added plainly: 0)
    assert only("sum(big)") == math.inf


def test_a_nan_clamp_bound_gives_nan():
    for text in ("clamp(t, NaN, 1)", "clamp(t, 0, NaN)", "clamp_min(t, NaN)", "clamp_max(t, NaN)"):
        found = rows(text)
        assert len(found) == 7 and all(math.isnan(v) for _, v in found), text
    assert [v for _, v in rows('clamp(t{i=~"0|3"}, 1, 4)')] == [3.0, 4.0]


@pytest.mark.parametrize(
    "text",
    [
        "nope + nope2",
        "sum(nope + nope2)",
        "nope / nope2",
        "sum(nope) / sum(nope2)",
        "u * on(x) group_left p",
        "cos(u > p)",
        "nope > bool nope2",
        "nope and nope2",
        "nope or nope2",
        "nope unless nope2",
        "topk(2, nope + nope2)",
        "quantile(0.5, nope - nope2)",
        'count_values("v", nope * nope2)',
        "stddev(nope % nope2)",
        "histogram_quantile(0.5, nope + nope2)",
        "rate((nope + nope2)[5m:1m])",
        'label_replace(nope + nope2, "a", "b", "c", ".*")',
        "sort_desc(nope ^ nope2)",
    ],
)
def test_operations_on_empty_vectors_answer_empty_vectors(text):
    for value in (evaluate(text), evaluate(text, start=0, end=120)):
        assert isinstance(value, Vector) and value.labels == [] and value.values.shape[1] >= 1


def test_absent_of_an_empty_operation_is_one():
    assert rows("absent(nope * on() nope2)") == [({}, 1.0)]
    assert rows("absent(sum(nope) / sum(nope2))") == [({}, 1.0)]


def test_histogram_quantile_groups_by_every_label_but_le():
    with pytest.raises(PromQLError, match="same labelset") as refused:
        evaluate('histogram_quantile(0.9, {__name__=~"req_.*"})')
    assert refused.value.kind == "execution"
    assert rows('histogram_quantile(0.5, {__name__="req_a_bucket"})') == [({"job": "x"}, 0.55)]


def test_results_that_lose_the_name_cannot_hold_the_same_label_set_twice():
    for text in (
        'sum(count_over_time({job="x"}[10m]))',
        'count_over_time({job="x"}[10m])',
        'sum(abs({job="x"}))',
        'sum(-{job="x"})',
        'sum({job="x"} * 1)',
        'sum(label_replace({job="x"}, "__name__", "", "", ""))',
    ):
        with pytest.raises(PromQLError, match="same labelset"):
            evaluate(text)
    # {job="y"}: two names that never hold samples at the same time. A range function's whole
    # result is checked (2.42), an instant function's step by step.
    with pytest.raises(PromQLError, match="same labelset"):
        evaluate('sum(count_over_time({job="y"}[1m]))', start=0, end=600, step=60)
    assert evaluate('sum(abs({job="y"}))', start=0, end=600, step=60).present.all()  # one of them each step
    assert only('sum(last_over_time({job="x", __name__=~"n."}[1m]))') == 2.0  # last_over_time keeps the name
    assert only('sum(abs({job="y"}))', 50) == 1.0  # only one of them holds a sample at this step


@pytest.mark.parametrize(
    "text",
    [
        'label_replace(t, "a", "b", "c", "(")',
        'label_replace(t, "\\xff", "b", "c", "x")',  # bytes that are no UTF-8 ("1a" is a name in Prometheus 3)
        'label_join(t, "\\xc5", ",", "i")',
    ],
)
def test_label_functions_refuse_with_an_execution_error(text):
    with pytest.raises(PromQLError) as refused:
        evaluate(text)
    assert refused.value.kind == "execution"


@pytest.mark.parametrize(
    "text",
    [
        "t @ 9223372036854775807",
        "t @ -1e308",
        "t @ 1e15",
        "t @ -1e15",
        "rate(t[5m] @ -3)",
        "t[5m:1m] @ 1e13",
        "t offset -1e15",
        't{i=~"x{1001}"}',
        't{i!~"("}',
    ],
)
def test_out_of_range_modifiers_and_bad_regexes_are_bad_data(text):
    with pytest.raises(PromQLError) as refused:
        evaluate(text)
    assert refused.value.kind == "bad_data"


def test_histogram_stddev_of_a_negative_zero_threshold_is_nan_not_an_error():
    """A histogram stored with zero_threshold -1 (written before write validation existed): its
    zero bucket [1, -1] has no geometric mean; Prometheus's math.Sqrt gives NaN there."""
    expr = parse("histogram_stddev(h)")
    query = Query(60 * S, 60 * S, 0, 300 * S)
    (key,) = plan(expr, query)
    odd = Histogram(0, -1.0, 2.0, 3.0, 1.5, {1: 1.0}, {})
    histograms = {key: [Series({"__name__": "h"}, np.array([30 * S], dtype=np.int64), np.array([odd], dtype=object))]}
    value = Evaluator(query, {key: []}, time.monotonic() + 10, histograms).result(expr, np.array([60 * S]))
    assert value.labels == [{}] and math.isnan(value.values[0, 0])


def reference_rate(times_ms: list[int], values: list[float], at_ms: int, range_ms: int) -> float | None:
    """Prometheus 3's extrapolatedRate for rate(), operation by operation (the reference): a
    left-open window, the start cut at the threshold before the zero point bounds it."""
    window = [(t, v) for t, v in zip(times_ms, values) if at_ms - range_ms < t <= at_ms]
    if len(window) < 2:
        return None
    result = window[-1][1] - window[0][1]
    for (_, previous), (_, current) in zip(window, window[1:]):
        if current < previous:
            result += previous
    to_start = (window[0][0] - (at_ms - range_ms)) / 1000
    to_end = (at_ms - window[-1][0]) / 1000
    sampled = (window[-1][0] - window[0][0]) / 1000
    average = sampled / (len(window) - 1)
    if to_start >= average * 1.1:
        to_start = average / 2
    if result > 0 and window[0][1] >= 0:
        to_start = min(to_start, sampled * (window[0][1] / result))
    if to_end >= average * 1.1:
        to_end = average / 2
    return result * ((sampled + to_start + to_end) / sampled / (range_ms / 1000))


def test_rate_adds_counter_resets_in_prometheus_order_bit_for_bit():
    """The differential flake (ceil(rate(d_requests_total[20s])) 1 off at one step): resets were
    added as a difference of prefix sums, so a window's rate carried the rounding of every
    earlier reset and differed from Prometheus's in its last bits."""
    rng = np.random.default_rng(20)
    times = (np.arange(400) * 1000 + rng.integers(-40, 40, 400)).tolist()
    values, value = [], 0.011
    for i in range(400):
        value = 0.011 + 3 * (i % 17) if i % 17 == 0 else value + 3  # resets every 17 samples
        values.append(value + (1e6 if i < 100 else 0))  # large values first, then small ones
    series = Series({"__name__": "c"}, np.array(times, dtype=np.int64), np.array(values))
    expr = parse("rate(c[20s])")
    query = Query(30 * S, 399 * S, S, 300 * S)
    steps = np.arange(query.start_ms, query.end_ms + 1, query.step_ms, dtype=np.int64)
    ((key, _),) = plan(expr, query).items()
    got = Evaluator(query, {key: [series]}, time.monotonic() + 10).result(expr, steps)
    expected = [reference_rate(times, values, int(at), 20 * S) for at in steps]
    assert got.present[0].tolist() == [e is not None for e in expected]
    differing = [(int(at), e, g) for at, e, g in zip(steps, expected, got.values[0]) if e is not None and e != g]
    assert not differing, f"{len(differing)} steps differ, e.g. {differing[:3]}"
