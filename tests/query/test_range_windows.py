"""The range functions and instant selectors evaluated for many series at once
(range_functions._all_series, Evaluator._instant_floats, RangeVector.stacked_windows) answer
exactly what each series alone gives, across stacks."""

import math

import numpy as np
import pytest

from gateway.query.promql import range_functions, values
from gateway.query.promql.engine import Context, Evaluator, Query
from gateway.query.promql.values import RangeVector, Series
from protocols.prometheus.xor import STALE_NAN_BITS

MINUTE = 60_000
START = 1_700_000_000_000


def _churned_series(count: int, rng: np.random.Generator) -> list[Series]:
    """Counters that start and stop at odd times, some with resets, NaN, duplicates of a bound,
    irregular scrapes, and a few with one sample or none."""
    series = []
    for i in range(count):
        length = int(rng.integers(0, 40))
        begin = START + int(rng.integers(-30, 60)) * MINUTE + int(rng.integers(0, 3)) * 15_000
        gaps = rng.choice([15_000, 30_000, MINUTE, 7 * MINUTE], size=length, p=[0.3, 0.3, 0.35, 0.05])
        timestamps = begin + np.cumsum(gaps).astype(np.int64)
        values = np.cumsum(rng.integers(0, 5, size=length)).astype(np.float64)
        if i % 5 == 0 and length > 3:  # resets
            values[length // 2 :] -= values[length // 2] - 1
            values[length - 1] = 0.0
        if i % 11 == 0 and length:
            values[0] = np.nan
        series.append(Series({"__name__": "c", "i": str(i)}, timestamps, values))
    return series


REFS = {
    "range query": START + np.arange(0, 121) * MINUTE,
    "instant": np.array([START + 60 * MINUTE]),
    "uneven": START + np.array([0, 1, 7, 30, 31, 90, 200]) * MINUTE + 15_000,
    "at modifier": np.full(9, START + 45 * MINUTE),
}


def _rows(vector) -> dict:
    return {v["i"]: (values, present) for v, values, present in zip(vector.labels, vector.values, vector.present)}


def _one_at_a_time(function, matrix: RangeVector) -> dict:
    answers = {}
    for series in matrix.series:
        answers.update(_rows(function(matrix._replace(series=[series]))))
    return answers


FUNCTIONS = {
    "rate": lambda m: range_functions.extrapolated_rate(m, True, True),
    "increase": lambda m: range_functions.extrapolated_rate(m, True, False),
    "delta": lambda m: range_functions.extrapolated_rate(m, False, False),
    "irate": lambda m: range_functions.instant_rate(m, True),
    "idelta": lambda m: range_functions.instant_rate(m, False),
    "changes": range_functions.changes,
    "resets": range_functions.resets,
    "count_over_time": lambda m: range_functions.over_time(m, "count"),
    "last_over_time": lambda m: range_functions.over_time(m, "last"),
    "ts_of_first_over_time": lambda m: range_functions.over_time(m, "ts_of_first"),
}


# SEARCHED_SAMPLES_A_CELL: windows always searched, always counted
STRATEGIES = {"searched": 0, "counted": 10**9}


@pytest.mark.parametrize("strategy", STRATEGIES.values(), ids=STRATEGIES.keys())
@pytest.mark.parametrize("refs", REFS.values(), ids=REFS.keys())
@pytest.mark.parametrize("name", FUNCTIONS)
def test_many_series_at_once_answer_as_each_alone(monkeypatch, name, refs, strategy):
    monkeypatch.setattr(range_functions, "STACK_CELLS", 700)  # a few series a stack: many stacks
    monkeypatch.setattr(values, "SEARCHED_SAMPLES_A_CELL", strategy)
    matrix = RangeVector(_churned_series(60, np.random.default_rng(7)), refs, 5 * MINUTE)
    together = _rows(FUNCTIONS[name](matrix))
    alone = _one_at_a_time(FUNCTIONS[name], matrix)
    assert together.keys() == alone.keys()
    assert len(together) >= 5  # series with an answer, to compare
    for key, (answer, present) in alone.items():
        np.testing.assert_array_equal(together[key][1], present)
        np.testing.assert_array_equal(together[key][0][present], answer[present])  # bit for bit, NaN too


def assert_stacked_windows_are_each_series_windows(matrix: RangeVector, series: list) -> None:
    """The windows found for all the series at once, each shifted to its own series' samples,
    are those found for that series alone."""
    lengths = np.array([len(s.timestamps) for s in series])
    lo, hi = matrix.stacked_windows(np.concatenate([s.timestamps for s in series]), lengths)
    for row, (offset, one) in enumerate(zip(np.cumsum(lengths) - lengths, series)):
        expected_lo, expected_hi = matrix.windows(one)
        np.testing.assert_array_equal(lo[row] - offset, expected_lo)
        np.testing.assert_array_equal(hi[row] - offset, expected_hi)


# a whole number of a range query's steps (windows found with the steps' ends), not one, and more
# steps than the query has
RANGES = {"5m": 5 * MINUTE, "90s": 90_000, "200m": 200 * MINUTE}


@pytest.mark.parametrize("strategy", STRATEGIES.values(), ids=STRATEGIES.keys())
@pytest.mark.parametrize("modifier", [None, "anchored"])
@pytest.mark.parametrize("range_ms", RANGES.values(), ids=RANGES.keys())
@pytest.mark.parametrize("refs", REFS.values(), ids=REFS.keys())
def test_stacked_windows_are_each_series_windows(monkeypatch, refs, range_ms, modifier, strategy):
    monkeypatch.setattr(values, "SEARCHED_SAMPLES_A_CELL", strategy)
    series = _churned_series(30, np.random.default_rng(3))
    matrix = RangeVector(series, refs, range_ms, modifier=modifier, lookback_ms=5 * MINUTE)
    assert_stacked_windows_are_each_series_windows(matrix, series)


@pytest.mark.parametrize("strategy", STRATEGIES.values(), ids=STRATEGIES.keys())
def test_stacked_windows_of_refs_out_of_order(monkeypatch, strategy):
    """Refs in no order (none the engine makes today) are windowed as sorted ones would be."""
    monkeypatch.setattr(values, "SEARCHED_SAMPLES_A_CELL", strategy)
    series = _churned_series(10, np.random.default_rng(5))
    refs = START + np.array([90, 3, 45, 45, 0, 200]) * MINUTE
    matrix = RangeVector(series, refs, 5 * MINUTE)
    assert_stacked_windows_are_each_series_windows(matrix, series)


@pytest.mark.parametrize("strategy", STRATEGIES.values(), ids=STRATEGIES.keys())
@pytest.mark.parametrize("refs", REFS.values(), ids=REFS.keys())
def test_instant_selectors_of_many_series_at_once_answer_as_each_alone(monkeypatch, refs, strategy):
    """Each step's last sample within the lookback, none where it is a stale marker."""
    monkeypatch.setattr(range_functions, "STACK_CELLS", 700)
    monkeypatch.setattr(values, "SEARCHED_SAMPLES_A_CELL", strategy)
    series = _churned_series(60, np.random.default_rng(11))
    stale = np.array([STALE_NAN_BITS]).view(np.float64)[0]
    for one in series[::4]:
        one.values[len(one.values) // 2 :: 3] = stale
    evaluator = Evaluator(Query(START, START, 0, 5 * MINUTE), {}, math.inf)
    ctx = Context(refs)
    together = evaluator._instant_floats(series, ctx, refs)
    rows = {labels["i"]: row for row, labels in enumerate(together.labels)}
    answered = 0
    for one in series:
        if not len(one.timestamps):
            assert one.labels["i"] not in rows
            continue
        # the reference: each step's search in the series alone
        index = np.searchsorted(one.timestamps, refs, side="right") - 1
        last = np.maximum(index, 0)
        present = (
            (index >= 0)
            & (one.timestamps[last] > refs - 5 * MINUTE)
            & (one.values[last].view(np.int64) != STALE_NAN_BITS)
        )
        if not present.any():
            assert one.labels["i"] not in rows
            continue
        answered += 1
        row = rows[one.labels["i"]]
        np.testing.assert_array_equal(together.present[row], present)
        np.testing.assert_array_equal(together.values[row][present], one.values[last][present])
        np.testing.assert_array_equal(together.sample_ms[row][present], one.timestamps[last][present])
    assert answered >= 5 and any(one.labels["i"] not in rows for one in series)
