"""Prometheus 3's anchored and smoothed range modifiers (extended range selectors) on hand-made
series, the arithmetic checked by hand; tests/query/test_promql_tier3.py runs Prometheus's own
cases (extended_vectors.test)."""

import time

import numpy as np
import pytest

from gateway.query.promql.engine import Evaluator, Query, parse, plan
from gateway.query.promql.values import PromQLError, RangeVector, Series, Vector
from protocols.prometheus.native_histogram import Histogram
from tests.query.test_promql_engine import series

S = 1000
LOOKBACK = 300 * S


DATA = [
    series({"__name__": "counter"}, [(0, 1), (60, 2), (120, 3), (180, 1), (240, 2)]),
    series({"__name__": "gauge"}, [(0, 0), (60, 60), (120, 120)]),
    series({"__name__": "late"}, [(60, 5), (120, 6)]),
    series({"__name__": "flat"}, [(0, 1), (60, 1), (120, 2)]),
]


def histograms(name: str, points: list[tuple[float, float]]) -> Series:
    """A native histogram series whose one bucket holds its whole count, the sum the count."""
    return Series(
        {"__name__": name},
        np.array([int(t * S) for t, _ in points], dtype=np.int64),
        np.array([Histogram(0, 0.0, 0.0, c, c, {0: c}, {}) for _, c in points], dtype=object),
    )


HISTOGRAMS = [
    histograms("requests", [(t, 1 + t / 15) for t in range(0, 106, 15)]),
    histograms("restarted", [(0, 5), (15, 10), (30, 2), (45, 6)]),
]


def _selected(series: list[Series], matchers) -> list[Series]:
    return [s for s in series if all(m.matches(s.labels.get(m.name, "")) for m in matchers)]


def instant(text: str, at: float) -> dict:
    """The query's value at ``at``: floats as floats, a histogram as its count."""
    expr = parse(text)
    query = Query(int(at * S), int(at * S), 0, LOOKBACK)
    needs = plan(expr, query)
    data = {key: _selected(DATA, matchers) for key, (matchers, _low, _high) in needs.items()}
    histogram_data = {key: _selected(HISTOGRAMS, matchers) for key, (matchers, _low, _high) in needs.items()}
    evaluator = Evaluator(query, data, time.monotonic() + 10, histogram_data)
    value = evaluator.result(expr, np.array([query.start_ms], dtype=np.int64))
    assert isinstance(value, Vector)
    found = {
        tuple(sorted(labels.items())): float(values[0])
        for labels, values, present in zip(value.labels, value.values, value.present)
        if present[0]
    }
    for labels, row in zip(value.labels, value.histograms if value.histograms is not None else []):
        if row[0] is not None:
            found[tuple(sorted(labels.items()))] = row[0].count
    return found


def test_anchored_increase_starts_at_the_last_sample_before_the_window():
    # (120 s, 240 s] anchored at 3 (t=120): 3 | reset | 1 2: right - left + the 3 before the reset
    assert instant("increase(counter[2m] anchored)", 240) == {(): 2.0}
    assert instant("rate(counter[2m] anchored)", 240) == {(): 2.0 / 120}
    assert instant("delta(counter[2m] anchored)", 240) == {(): -1.0}  # no reset correction
    assert instant("increase(counter[10s] anchored)", 130) == {}  # no sample after the window's start
    assert instant("increase(counter[2m] anchored)", 600) == {}  # nor inside the lookback


def test_anchored_changes_and_resets_count_from_the_anchor():
    assert instant("changes(flat[1m] anchored)", 120) == {(): 1.0}
    assert instant("changes(flat[1m])", 120) == {(): 0.0}
    assert instant("resets(counter[1m] anchored)", 180) == {(): 1.0}
    assert instant("resets(counter[1m])", 180) == {(): 0.0}


def test_smoothed_increase_interpolates_both_ends():
    # (30 s, 90 s]: 30 at the start, 90 at the end, read off the line through the samples
    assert instant("increase(gauge[1m] smoothed)", 90) == {(): 60.0}
    assert instant("delta(gauge[1m] smoothed)", 150) == {(): 30.0}  # 90 interpolated, then 120 (the last sample)
    # (150 s, 210 s]: a counter falling between two samples restarts from 0 there, so the start
    # reads 0.5 (halfway from 0 to 1 between 120 s and 180 s) and the end 1.5
    assert instant("increase(counter[1m] smoothed)", 210) == {(): 1.0}


def test_smoothed_instant_selector_interpolates_and_keeps_the_name():
    assert instant("gauge smoothed", 30) == {(("__name__", "gauge"),): 30.0}
    assert instant("gauge smoothed", 200) == {(("__name__", "gauge"),): 120.0}  # past the last sample: its value
    assert instant("late smoothed", 30) == {}  # before the first: nothing
    assert instant("late smoothed + 0", 90) == {(): 5.5}


def test_native_histograms_are_extended_as_floats_are():
    # (−10 s, 50 s]: no anchor before the window, so its first sample (count 1) to the last (4)
    assert instant("increase(requests[1m] anchored)", 50) == {(): 3.0}
    # smoothed, the end is read between 45 s (4) and 60 s (5)
    assert instant("increase(requests[1m] smoothed)", 50) == pytest.approx({(): 3 + 1 / 3})
    assert instant("rate(requests[1m] smoothed)", 50) == pytest.approx({(): (3 + 1 / 3) / 60})
    # 5 10 | reset | 2 6 anchored at 5: 6 - 5 + the 10 before the reset
    assert instant("increase(restarted[45s] anchored)", 45) == {(): 11.0}
    assert instant("requests smoothed", 7) == pytest.approx({(("__name__", "requests"),): 1 + 7 / 15})
    # across the reset the counter restarts from nothing: a third of the way from 0 to 2
    assert instant("restarted smoothed", 20) == pytest.approx({(("__name__", "restarted"),): 2 / 3})


def test_functions_prometheus_does_not_extend_are_refused_as_it_words_it():
    with pytest.raises(PromQLError) as refused:
        instant("deriv(gauge[1m] smoothed)", 90)
    assert str(refused.value) == "smoothed modifier can only be used with: delta, increase, rate - not with deriv"
    with pytest.raises(PromQLError) as refused:
        instant("max_over_time(gauge[1m] anchored)", 90)
    assert str(refused.value) == (
        "anchored modifier can only be used with: changes, delta, increase, rate, resets - not with max_over_time"
    )


def samples(text: str, at: float) -> dict:
    expr = parse(text)
    query = Query(int(at * S), int(at * S), 0, LOOKBACK)
    needs = plan(expr, query)
    data = {key: _selected(DATA, matchers) for key, (matchers, _low, _high) in needs.items()}
    value = Evaluator(query, data, time.monotonic() + 10).result(expr, np.array([query.start_ms], dtype=np.int64))
    assert isinstance(value, RangeVector)
    found = {}
    for one in value.series:
        lo, hi = value.windows(one)
        found[one.labels["__name__"]] = list(zip(one.timestamps[lo[0] : hi[0]] / S, one.values[lo[0] : hi[0]]))
    return found


def test_an_extended_range_selector_alone_answers_its_samples_with_the_boundaries():
    # (90 s, 150 s]: the anchor's value at the start, the last value at the end
    assert samples("gauge[1m] anchored", 150) == {"gauge": [(90, 60.0), (120, 120.0), (150, 120.0)]}
    # smoothed: both read off the line through the samples
    assert samples("gauge[1m] smoothed", 90) == {"gauge": [(30, 30.0), (60, 60.0), (90, 90.0)]}
    assert samples("late[1m] anchored", 30) == {}


@pytest.mark.parametrize(
    "text, error",
    [
        ("rate(x[5m:1m] anchored)", "1:15: parse error: anchored modifier is not supported for subqueries"),
        ("rate(x[5m])[10m] smoothed", "1:18: parse error: smoothed modifier not implemented"),
        ("x anchored smoothed", "1:12: parse error: anchored and smoothed modifiers cannot be used together"),
        ('x{__tsgate_range_modifier__="smoothed"}', "the label name __tsgate_range_modifier__ is reserved"),
        ('{a=~".*"}[5m] anchored', "vector selector must contain at least one non-empty matcher"),
    ],
)
def test_modifiers_prometheus_refuses_are_refused(text, error):
    with pytest.raises(PromQLError) as refused:
        parse(text)
    assert (str(refused.value), refused.value.error_type) == (f'invalid parameter "query": {error}', "bad_data")


def test_the_plan_reads_a_lookback_beyond_extended_windows():
    query = Query(600 * S, 600 * S, 0, LOOKBACK)
    ((_, low, high),) = plan(parse("rate(x[1m] anchored)"), query).values()
    assert (low, high) == (240 * S, 600 * S)
    ((matchers, low, high),) = plan(parse("rate(x[1m] smoothed)"), query).values()
    assert (low, high) == (240 * S, 900 * S) and [m.name for m in matchers] == ["__name__"]
    ((_, low, high),) = plan(parse("x smoothed"), query).values()
    assert (low, high) == (300 * S, 900 * S)
