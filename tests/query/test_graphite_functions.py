"""Graphite render functions against hand-computed expectations, through evaluate_target.

The fake fetcher holds points by timestamp and answers [start, end) floored to each series'
step, so the request 100..160 gives six 10-second points at 100..150 and three 20-second points.
"""

import asyncio
import fnmatch
import math
import re

import pytest

from gateway.query.graphite.evaluator import RenderContext, RenderError, evaluate_target
from gateway.query.graphite.functions import REGISTRY, function_catalog
from gateway.query.graphite.series import TimeSeries

N = None
DATA = {
    # name: (step, {timestamp: value}); a.b.c also has points before 100 for windows and shifts
    "a.b.c": (
        10,
        {
            40: 100.0,
            50: 101.0,
            60: 102.0,
            70: 103.0,
            80: 7.0,
            90: 8.0,
            100: 1.0,
            110: 2.0,
            130: 4.0,
            140: 5.0,
            150: 6.0,
        },
    ),
    "a.x.c": (10, {100: 10.0, 110: 20.0, 120: 30.0, 140: 50.0, 150: 60.0}),
    "slow.s": (20, {100: 6.0, 140: 9.0}),
    "counter.c": (10, {100: 0.0, 110: 10.0, 120: 25.0, 130: 5.0, 140: 15.0}),
    "cpu;dc=a;host=h1": (10, {t: 1.0 for t in range(100, 160, 10)}),
    "cpu;dc=a;host=h2": (10, {t: 2.0 for t in range(100, 160, 10)}),
    "cpu;dc=b;host=h3": (10, {t: 4.0 for t in range(100, 160, 10)}),
}


def expand_braces(pattern):
    match = re.search(r"\{([^{}]*)\}", pattern)
    if not match:
        return [pattern]
    return [
        expanded
        for choice in match.group(1).split(",")
        for expanded in expand_braces(pattern[: match.start()] + choice + pattern[match.end() :])
    ]


def glob_match(name, pattern):
    """Graphite globs: * ? [..] within one node, {a,b} alternatives."""
    name_nodes = name.split(".")
    for alternative in expand_braces(pattern):
        nodes = alternative.split(".")
        if len(nodes) == len(name_nodes) and all(fnmatch.fnmatchcase(n, p) for n, p in zip(name_nodes, nodes)):
            return True
    return False


def tag_match(tags, expression):
    key, operator, value = re.match(r"([^!=]+)(!=~|=~|!=|=)(.*)", expression).groups()
    actual = tags.get(key, "")
    if operator == "=":
        return actual == value
    if operator == "!=":
        return actual != value
    matched = re.match(value, actual) is not None
    return matched if operator == "=~" else not matched


class FakeFetcher:
    def __init__(self):
        self.calls = []

    def _series(self, name, start, end):
        step, points = DATA[name]
        first, last = start - start % step, end - end % step
        return TimeSeries(name, first, last, step, [points.get(t) for t in range(first, last, step)])

    async def fetch(self, path_expression, start, end):
        self.calls.append((path_expression, start, end))
        return [self._series(name, start, end) for name in DATA if glob_match(name, path_expression)]

    async def fetch_tagged(self, expressions, start, end):
        self.calls.append((tuple(expressions), start, end))
        found = []
        for name in DATA:
            metric, *pairs = name.split(";")
            tags = dict(pair.split("=", 1) for pair in pairs)
            tags["name"] = metric
            if all(tag_match(tags, expression) for expression in expressions):
                found.append(self._series(name, start, end))
        return found


def evaluate(target, fetcher=None, **context):
    context = RenderContext(**{"start": 100, "end": 160, "now": 160, **context})
    return asyncio.run(evaluate_target(target, context, fetcher or FakeFetcher()))


def values(series):
    return list(series)


def single(target, **context):
    result = evaluate(target, **context)
    assert len(result) == 1, result
    return result[0]


def single_with(fetcher, target):
    result = evaluate(target, fetcher)
    assert len(result) == 1, result
    return result[0]


def approx(expected):
    return pytest.approx(expected, nan_ok=True)


# Fetching


def test_path_expression_fetches_sorted_series_with_their_path_expression():
    result = evaluate("a.{x,b}.c")
    assert [s.name for s in result] == ["a.b.c", "a.x.c"]
    assert [s.pathExpression for s in result] == ["a.{x,b}.c", "a.{x,b}.c"]
    assert values(result[0]) == [1.0, 2.0, N, 4.0, 5.0, 6.0]
    assert dict(result[0].tags) == {"name": "a.b.c"}


def test_series_by_tag_goes_to_fetch_tagged():
    fetcher = FakeFetcher()
    result = evaluate("seriesByTag('name=cpu', 'dc=a')", fetcher)
    assert [s.name for s in result] == ["cpu;dc=a;host=h1", "cpu;dc=a;host=h2"]
    assert fetcher.calls == [(("name=cpu", "dc=a"), 100, 160)]
    assert result[0].pathExpression == "seriesByTag('name=cpu', 'dc=a')"
    assert dict(result[0].tags) == {"name": "cpu", "dc": "a", "host": "h1"}


# Combine


def test_sum_average_max_min_diff_multiply_with_nones():
    assert values(single("sumSeries(a.b.c, a.x.c)")) == [11.0, 22.0, 30.0, 4.0, 55.0, 66.0]
    assert values(single("sum(a.*.c)")) == [11.0, 22.0, 30.0, 4.0, 55.0, 66.0]
    assert values(single("averageSeries(a.*.c)")) == [5.5, 11.0, 30.0, 4.0, 27.5, 33.0]
    assert values(single("avg(a.*.c)")) == [5.5, 11.0, 30.0, 4.0, 27.5, 33.0]
    assert values(single("maxSeries(a.*.c)")) == [10.0, 20.0, 30.0, 4.0, 50.0, 60.0]
    assert values(single("minSeries(a.*.c)")) == [1.0, 2.0, 30.0, 4.0, 5.0, 6.0]
    assert values(single("diffSeries(a.x.c, a.b.c)")) == [9.0, 18.0, 30.0, 4.0, 45.0, 54.0]
    assert values(single("multiplySeries(a.b.c, a.x.c)")) == [10.0, 40.0, N, N, 250.0, 360.0]
    assert values(single("rangeOfSeries(a.*.c)")) == [9.0, 18.0, 0.0, 0.0, 45.0, 54.0]


def test_aggregate_names_and_tags():
    result = single("sumSeries(a.b.c, a.x.c)")
    assert result.name == "sumSeries(a.b.c,a.x.c)"
    assert dict(result.tags) == {"name": "sumSeries(a.b.c,a.x.c)", "aggregatedBy": "sum"}
    assert (result.start, result.end, result.step) == (100, 160, 10)
    result = single("sumSeries(seriesByTag('name=cpu', 'dc=a'))")
    assert result.name == "sumSeries(seriesByTag('name=cpu', 'dc=a'))"
    assert dict(result.tags) == {"name": "cpu", "dc": "a", "aggregatedBy": "sum"}
    assert single("aggregate(a.*.c, 'sumSeries')").name == "sumSeries(a.*.c)"


def test_aggregate_x_files_factor():
    assert values(single("aggregate(a.*.c, 'sum', 1)")) == [11.0, 22.0, N, N, 55.0, 66.0]
    assert values(single("sumSeries(a.*.c)", x_files_factor=1.0)) == [11.0, 22.0, N, N, 55.0, 66.0]


def test_different_steps_are_normalized_to_the_lcm():
    result = single("sumSeries(a.b.c, slow.s)")
    assert (result.start, result.end, result.step) == (100, 160, 20)
    # a.b.c averaged in pairs: 1.5, 4.0 (None ignored), 5.5; slow.s: 6, None, 9
    assert values(result) == [7.5, 4.0, 14.5]


def test_different_steps_with_x_files_factor_on_consolidation():
    # xFilesFactor(…, 1) makes the [None, 4] pair None and also applies to the aggregation
    assert values(single("sumSeries(xFilesFactor(a.b.c, 1), slow.s)")) == [7.5, N, 14.5]


def test_count_series():
    result = single("countSeries(a.*.c)")
    assert values(result) == [2, 2, 2, 2, 2, 2]
    assert result.name == "countSeries(a.*.c)"
    assert values(single("countSeries()")) == [0, 0, 0]


def test_divide_series():
    result = single("divideSeries(a.x.c, a.b.c)")
    assert result.name == "divideSeries(a.x.c,a.b.c)"
    assert values(result) == [10.0, 10.0, N, N, 10.0, 10.0]
    assert values(single("divideSeries(a.x.c, offset(a.b.c, -1))"))[0] is None  # divisor 0
    with pytest.raises(RenderError):
        evaluate("divideSeries(a.x.c, a.*.c)")


def test_as_percent():
    result = single("asPercent(a.b.c, 10)")
    assert result.name == "asPercent(a.b.c,10)"
    assert values(result) == [10.0, 20.0, N, 40.0, 50.0, 60.0]
    first, second = evaluate("asPercent(a.*.c)")
    assert first.name == "asPercent(a.b.c,sumSeries(a.*.c))"
    assert values(first) == approx([100 / 11, 100 / 11, N, 100.0, 100 / 11, 100 / 11])
    assert values(second) == approx([1000 / 11, 1000 / 11, 100.0, N, 1000 / 11, 1000 / 11])
    result = single("asPercent(a.b.c, a.x.c)")
    assert result.name == "asPercent(a.b.c,a.x.c)"
    assert values(result) == [10.0, 10.0, N, N, 10.0, 10.0]


def test_as_percent_by_nodes_with_missing_totals():
    result = evaluate("asPercent(a.*.c, a.x.c, 1)")
    assert [s.name for s in result] == ["asPercent(a.b.c,MISSING)", "asPercent(a.x.c,a.x.c)"]
    assert values(result[0]) == [N] * 6
    assert values(result[1]) == [100.0, 100.0, 100.0, N, 100.0, 100.0]


def test_percentile_of_series():
    result = single("percentileOfSeries(a.*.c, 50)")
    assert result.name == "percentileOfSeries(a.*.c,50)"
    assert values(result) == [10.0, 20.0, 30.0, 4.0, 50.0, 60.0]


def test_group_by_node_and_nodes():
    result = single("groupByNode(a.*.c, 2, 'sum')")
    assert result.name == "c"
    assert values(result) == [11.0, 22.0, 30.0, 4.0, 55.0, 66.0]
    assert single("groupByNode(a.*.c, 2)").name == "c"
    assert values(single("groupByNode(a.*.c, 2)")) == [5.5, 11.0, 30.0, 4.0, 27.5, 33.0]
    assert values(single("groupByNode(a.*.c, 2, 'sumSeries')")) == [11.0, 22.0, 30.0, 4.0, 55.0, 66.0]
    result = evaluate("groupByNodes(group(a.*.c, counter.c), 'max', 0, 2)")
    assert [s.name for s in result] == ["a.c", "counter."]  # counter.c has no node 2
    assert values(result[0]) == [10.0, 20.0, 30.0, 4.0, 50.0, 60.0]
    result = evaluate("groupByNode(seriesByTag('name=cpu'), 'dc', 'sum')")
    assert [(s.name, values(s)) for s in result] == [("a", [3.0] * 6), ("b", [4.0] * 6)]


def test_group_by_tags():
    result = evaluate("groupByTags(seriesByTag('name=cpu'), 'sum', 'dc')")
    assert [s.name for s in result] == ["cpu;dc=a", "cpu;dc=b"]
    assert values(result[0]) == [3.0] * 6
    assert dict(result[0].tags) == {"name": "cpu", "dc": "a"}
    assert result[1].pathExpression == "cpu;dc=b"
    result = evaluate("groupByTags(group(a.b.c, seriesByTag('name=cpu')), 'average', 'dc')")
    assert [s.name for s in result] == ["average;dc=", "average;dc=a", "average;dc=b"]


def test_series_with_wildcards():
    result = single("sumSeriesWithWildcards(a.*.c, 1)")
    assert result.name == "a.c"
    assert values(result) == [11.0, 22.0, 30.0, 4.0, 55.0, 66.0]
    assert values(single("averageSeriesWithWildcards(a.*.c, 1)")) == [5.5, 11.0, 30.0, 4.0, 27.5, 33.0]
    assert values(single("multiplySeriesWithWildcards(a.*.c, 1)")) == [10.0, 40.0, N, N, 250.0, 360.0]


def test_apply_by_node_evaluates_a_template_per_prefix():
    fetcher = FakeFetcher()
    result = evaluate("applyByNode(a.*.c, 1, 'sumSeries(%.c)', '%.total')", fetcher)
    assert [s.name for s in result] == ["a.b.total", "a.x.total"]
    assert values(result[0]) == [1.0, 2.0, N, 4.0, 5.0, 6.0]
    assert result[0].pathExpression == "a.b"
    assert ("a.b.c", 100, 160) in fetcher.calls and ("a.x.c", 100, 160) in fetcher.calls


# Transform


def test_scale_offset_absolute_and_their_names_and_tags():
    result = single("scale(a.b.c, 2)")
    assert (result.name, dict(result.tags)) == ("scale(a.b.c,2)", {"name": "a.b.c", "scale": "2.0"})
    assert values(result) == [2.0, 4.0, N, 8.0, 10.0, 12.0]
    result = single("offset(a.b.c, -1)")
    assert result.name == "offset(a.b.c,-1)"
    assert values(result) == [0.0, 1.0, N, 3.0, 4.0, 5.0]
    assert values(single("absolute(offset(a.b.c, -2))")) == [1.0, 0.0, N, 2.0, 3.0, 4.0]
    result = single("scaleToSeconds(a.b.c, 1)")
    assert result.name == "scaleToSeconds(a.b.c,1)"
    assert values(result) == [0.1, 0.2, N, 0.4, 0.5, 0.6]


def test_derivatives_and_integral():
    assert values(single("derivative(a.b.c)")) == [N, 1.0, N, N, 1.0, 1.0]
    assert values(single("integral(a.b.c)")) == [1.0, 3.0, N, 7.0, 12.0, 18.0]
    result = single("nonNegativeDerivative(counter.c)")
    assert result.name == "nonNegativeDerivative(counter.c)"
    assert dict(result.tags) == {"name": "counter.c", "nonNegativeDerivative": "1"}
    assert values(result) == [N, 10.0, 15.0, N, 10.0, N]
    # the counter wrapped at 30: 25 -> 5 is 30 + 1 + 5 - 25 = 11
    assert values(single("nonNegativeDerivative(counter.c, 30)")) == [N, 10.0, 15.0, 11.0, 10.0, N]
    # values above maxValue are dropped and restart the counter
    assert values(single("nonNegativeDerivative(counter.c, 20)")) == [N, 10.0, N, N, 10.0, N]
    assert values(single("nonNegativeDerivative(counter.c, minValue=0)")) == [N, 10.0, 15.0, 5.0, 10.0, N]
    result = single("perSecond(counter.c)")
    assert result.name == "perSecond(counter.c)"
    assert values(result) == [N, 1.0, 1.5, N, 1.0, N]


def test_delay_keep_last_value_transform_null():
    result = single("delay(a.b.c, 2)")
    assert result.name == "delay(a.b.c,2)"
    assert values(result) == [N, N, 1.0, 2.0, N, 4.0]
    assert values(single("delay(a.b.c, -2)")) == [N, 4.0, 5.0, 6.0, N, N]
    result = single("keepLastValue(a.b.c)")
    assert result.name == "keepLastValue(a.b.c)"
    assert dict(result.tags) == {"name": "a.b.c"}
    assert values(result) == [1.0, 2.0, 2.0, 4.0, 5.0, 6.0]
    assert values(single("keepLastValue(counter.c, 0)")) == [0.0, 10.0, 25.0, 5.0, 15.0, N]
    result = single("transformNull(a.b.c, -1)")
    assert result.name == "transformNull(a.b.c,-1)"
    assert values(result) == [1.0, 2.0, -1.0, 4.0, 5.0, 6.0]
    assert values(single("transformNull(a.b.c, 0, a.x.c)")) == [1.0, 2.0, 0.0, 4.0, 5.0, 6.0]
    assert values(single("transformNull(a.x.c, 0, a.b.c)")) == [10.0, 20.0, 30.0, 0.0, 50.0, 60.0]


def test_summarize_aligned_to_interval():
    result = single("summarize(a.b.c, '30s')")
    assert result.name == 'summarize(a.b.c, "30s", "sum")'
    assert (result.start, result.end, result.step) == (90, 180, 30)
    # buckets [90,120): 1+2, [120,150): None+4+5, [150,180): 6
    assert values(result) == [3.0, 9.0, 6.0]
    assert values(single("summarize(a.b.c, '30s', 'max')")) == [2.0, 5.0, 6.0]
    assert dict(result.tags) == {"name": "a.b.c", "summarize": "30s", "summarizeFunction": "sum"}


def test_summarize_aligned_to_from():
    result = single("summarize(a.b.c, '30s', 'sum', true)")
    assert result.name == 'summarize(a.b.c, "30s", "sum", true)'
    assert (result.start, result.end, result.step) == (100, 160, 30)
    assert values(result) == [3.0, 15.0]
    assert values(single("summarize(a.b.c, '30s', 'avg', alignToFrom=true)")) == [1.5, 5.0]


def test_hitcount():
    result = single("hitcount(a.b.c, '30s')")
    assert result.name == 'hitcount(a.b.c, "30s")'
    assert (result.start, result.step) == (100, 30)
    # per-second rates times seconds in each bucket: 1*10 + 2*10, 4*10 + 5*10 + 6*10
    assert values(result) == [30.0, 150.0]


def test_hitcount_aligned_to_interval_refetches_from_the_boundary():
    fetcher = FakeFetcher()
    result = evaluate("hitcount(a.b.c, '1min', true)", fetcher, start=110)
    assert ("a.b.c", 60, 160) in fetcher.calls
    assert len(result) == 1
    assert (result[0].start, result[0].step) == (60, 60)
    # buckets [60,120) and [120,180) of per-second rates times 10 seconds
    assert values(result[0]) == [(102 + 103 + 7 + 8 + 1 + 2) * 10.0, (4 + 5 + 6) * 10.0]


def test_moving_average_with_points_fetches_earlier_data():
    fetcher = FakeFetcher()
    result = single_with(fetcher, "movingAverage(a.b.c, 2)")
    assert ("a.b.c", 80, 160) in fetcher.calls
    assert result.name == "movingAverage(a.b.c,2)"
    assert dict(result.tags) == {"name": "a.b.c", "movingAverage": "2"}
    assert (result.start, result.end, result.step) == (100, 160, 10)
    # windows of the two previous points: [7,8] [8,1] [1,2] [2,None] [None,4] [4,5]
    assert values(result) == [7.5, 4.5, 1.5, 2.0, 4.0, 4.5]


def test_functions_that_fetch_again_take_their_series_by_keyword():
    # the first argument given as seriesList=... is evaluated again over the earlier/shifted range
    fetcher = FakeFetcher()
    result = single_with(fetcher, "movingAverage(seriesList=a.b.c, windowSize=2)")
    assert ("a.b.c", 80, 160) in fetcher.calls
    assert result.name == "movingAverage(a.b.c,2)"
    assert values(result) == [7.5, 4.5, 1.5, 2.0, 4.0, 4.5]
    shifted = single("timeShift(seriesList=a.b.c, timeShift='1min')")
    assert values(shifted) == [100.0, 101.0, 102.0, 103.0, 7.0, 8.0]


def test_moving_average_with_an_interval():
    fetcher = FakeFetcher()
    result = single_with(fetcher, "movingAverage(a.b.c, '1min')")
    assert ("a.b.c", 40, 160) in fetcher.calls
    assert result.name == 'movingAverage(a.b.c,"1min")'
    assert values(result) == approx([421 / 6, 322 / 6, 223 / 6, 121 / 5, 22 / 5, 20 / 5])
    # with xFilesFactor 1 a window holding a None gives None
    assert values(single("movingAverage(a.b.c, '1min', 1)")) == approx([421 / 6, 322 / 6, 223 / 6, N, N, N])


def test_other_moving_windows():
    assert values(single("movingSum(a.b.c, 2)")) == [15.0, 9.0, 3.0, 2.0, 4.0, 9.0]
    assert values(single("movingMax(a.b.c, 2)")) == [8.0, 8.0, 2.0, 2.0, 4.0, 5.0]
    assert values(single("movingMin(a.b.c, 2)")) == [7.0, 1.0, 1.0, 2.0, 4.0, 4.0]
    assert values(single("movingMedian(a.b.c, 3)")) == [8.0, 7.0, 2.0, 1.5, 3.0, 4.5]
    result = single("movingWindow(a.b.c, 2, 'sum')")
    assert result.name == "movingSum(a.b.c,2)"
    assert evaluate("movingAverage(no.such, 5)") == []


def test_time_shift_fetches_shifted_data():
    fetcher = FakeFetcher()
    result = single_with(fetcher, "timeShift(a.b.c, '1min')")
    assert ("a.b.c", 40, 100) in fetcher.calls
    assert result.name == 'timeShift(a.b.c, "-1min")'
    assert dict(result.tags) == {"name": "a.b.c", "timeShift": "-1min"}
    assert (result.start, result.end) == (100, 160)
    assert values(result) == [100.0, 101.0, 102.0, 103.0, 7.0, 8.0]
    fetcher = FakeFetcher()
    single_with(fetcher, "timeShift(a.b.c, '+10s')")
    assert ("a.b.c", 110, 170) in fetcher.calls


def test_remove_above_and_below_value():
    result = single("removeAboveValue(a.x.c, 30)")
    assert result.name == "removeAboveValue(a.x.c, 30)"
    assert values(result) == [10.0, 20.0, 30.0, N, N, N]
    assert values(single("removeBelowValue(a.x.c, 20)")) == [N, 20.0, 30.0, N, 50.0, 60.0]


def test_n_percentile():
    result = single("nPercentile(a.x.c, 50)")
    assert result.name == "nPercentile(a.x.c, 50)"
    assert values(result) == [30.0] * 6


def test_remove_above_and_below_percentile_tag_the_series_like_graphite_web():
    # graphite-web's nPercentile sets the tag on a copy sharing the original's Tags object
    above = single("removeAbovePercentile(a.x.c, 50)")
    assert above.name == "removeAbovePercentile(a.x.c, 50)"
    assert values(above) == [10.0, 20.0, 30.0, N, N, N]
    assert dict(above.tags) == {"name": "a.x.c", "nPercentile": "50.0"}
    below = single("removeBelowPercentile(a.x.c, 50)")
    assert values(below) == [N, N, 30.0, N, 50.0, 60.0]
    assert dict(below.tags) == {"name": "a.x.c", "nPercentile": "50.0"}
    empty = single("removeAbovePercentile(a.x.c, 50)", start=300, end=360)  # no values: no percentile, no tag
    assert dict(empty.tags) == {"name": "a.x.c"}


def test_remove_between_percentile_ignores_null_points():
    # a.b.c is null at 120 and a.x.c at 130 (graphite-web 1.1.8 fails with a TypeError there)
    assert [s.name for s in evaluate("removeBetweenPercentile(a.*.c, 50)")] == ["a.b.c", "a.x.c"]
    # x, x+1, ..., x+4 (all null at 130): the 30th..70th band is x+1..x+4 at every other point,
    # so x+2 and x+3 never leave it and are removed
    kept = evaluate(
        "removeBetweenPercentile(group(a.x.c, offset(a.x.c, 1), offset(a.x.c, 2), "
        "offset(a.x.c, 3), offset(a.x.c, 4)), 70)"
    )
    assert [s.name for s in kept] == ["a.x.c", "offset(a.x.c,1)", "offset(a.x.c,4)"]


def test_integral_by_interval_and_changed_and_is_non_null():
    # restarts at 130 (30s after from); a None keeps the running total
    assert values(single("integralByInterval(a.b.c, '30s')")) == [1.0, 3.0, 3.0, 4.0, 9.0, 15.0]
    assert values(single("changed(counter.c)")) == [0, 1, 1, 1, 1, 0]
    assert values(single("isNonNull(a.b.c)")) == [1, 1, 0, 1, 1, 1]


def test_consolidate_by_and_constant_line_and_threshold():
    result = single("consolidateBy(a.b.c, 'max')")
    assert result.name == 'consolidateBy(a.b.c,"max")'
    assert result.consolidationFunc == "max"
    with pytest.raises(RenderError):
        evaluate("consolidateBy(a.b.c, 'median')")
    line = single("constantLine(5)")
    assert (line.name, line.start, line.end, line.step, values(line)) == ("5.0", 100, 160, 30, [5.0, 5.0, 5.0])
    assert line.datapoints() == [(5.0, 100), (5.0, 130), (5.0, 160)]
    result = single("threshold(5, 'limit', 'red')")
    assert (result.name, result.options["color"]) == ("limit", "red")


# Filter Series and Sorting


def names(target):
    return [series.name for series in evaluate(target)]


def test_highest_and_lowest():
    assert names("highestCurrent(a.*.c, 1)") == ["a.x.c"]
    assert names("highestMax(group(a.b.c, counter.c), 1)") == ["counter.c"]
    assert names("highestAverage(a.*.c, 1)") == ["a.x.c"]
    assert names("lowestCurrent(a.*.c, 1)") == ["a.b.c"]
    assert names("lowestAverage(a.*.c, 1)") == ["a.b.c"]
    assert names("highest(a.*.c, 2, 'min')") == ["a.x.c", "a.b.c"]
    with pytest.raises(RenderError):
        evaluate("highestCurrent(a.*.c, 1.5)")


def test_highest_and_lowest_default_to_one_series_by_average_as_graphite_web():
    # graphite-web 1.1.8 does not enforce "n" as required: the function's own default n=1 applies
    assert names("highest(a.*.c)") == ["a.x.c"]
    assert names("lowest(a.*.c)") == ["a.b.c"]
    assert names("highest(group(a.b.c, counter.c), func='min')") == ["a.b.c"]


def test_required_varargs_left_out_answer_as_graphite_web():
    for aggregator in ("sumSeries", "sum", "averageSeries", "diffSeries", "multiplySeries", "stddevSeries"):
        assert evaluate(f"{aggregator}()") == []
    assert evaluate("powSeries()") == [] and evaluate("unique()") == []
    assert names("aliasByNode(a.*.c)") == ["", ""]
    assert names("aliasByTags(seriesByTag('name=cpu', 'dc=b'))") == [""]
    with pytest.raises(RenderError, match="no tags specified"):  # graphite-web answers 400 too
        evaluate("groupByTags(a.b.c, 'sum')")
    with pytest.raises(RenderError, match='Missing required parameter "factor"'):  # no default: still refused
        evaluate("scale(a.b.c)")


def test_value_filters():
    assert names("currentAbove(a.*.c, 10)") == ["a.x.c"]
    assert names("currentBelow(a.*.c, 6)") == ["a.b.c"]
    assert names("averageAbove(a.*.c, 5)") == ["a.x.c"]
    assert names("maximumAbove(a.*.c, 6)") == ["a.x.c"]
    assert names("filterSeries(a.*.c, 'sum', '>=', 18)") == ["a.b.c", "a.x.c"]
    assert names("removeEmptySeries(group(a.b.c, a.x.c))") == ["a.b.c", "a.x.c"]
    assert names("removeEmptySeries(a.*.c, 1)") == []


def test_limit_exclude_grep_sorting():
    assert names("limit(a.*.c, 1)") == ["a.b.c"]
    assert names("exclude(a.*.c, 'x')") == ["a.b.c"]
    assert names("grep(a.*.c, 'x')") == ["a.x.c"]
    assert names("grep(verticalLine('now'), 'x')") == [] and names("exclude(verticalLine('now'), 'x')") == [None]
    assert names("sortByName(group(a.x.c, a.b.c))") == ["a.b.c", "a.x.c"]
    assert names("sortByName(group(a.b.c, a.x.c), reverse=true)") == ["a.x.c", "a.b.c"]
    assert names("sortByMaxima(group(a.b.c, a.x.c))") == ["a.x.c", "a.b.c"]
    assert names("sortByTotal(group(a.b.c, a.x.c))") == ["a.x.c", "a.b.c"]
    assert names("unique(a.b.c, a.*.c)") == ["a.b.c", "a.x.c"]
    assert names("fallbackSeries(no.such, a.b.c)") == ["a.b.c"]


def test_sort_by_name_naturally_with_thousands_of_digits():
    long = "9" * 5000  # graphite-web's int() of it exceeds Python's digit limit (a 500)
    target = f"sortByName(group(alias(a.b.c, 's{long}'), alias(a.x.c, 's10'), alias(slow.s, 's009x')), true)"
    assert names(target) == ["s009x", "s10", f"s{long}"]
    assert names(target.replace("true)", "true, true)")) == [f"s{long}", "s10", "s009x"]


# Map and reduce


def test_map_series_groups_by_nodes_for_reduce_series():
    (ratio,) = evaluate("reduceSeries(mapSeries(a.*.c, 0), 'divideSeries', 1, 'b', 'x')")
    assert ratio.name == "a.reduce.divideSeries"
    assert values(ratio) == approx([0.1, 0.1, N, N, 0.1, 0.1])
    (total,) = evaluate("reduceSeries(mapSeries(a.*.c), 'sumSeries', -2, 'x', 'b')")  # no nodes: one group
    assert total.name == "a.reduce.sumSeries"
    assert values(total) == [11.0, 22.0, 30.0, 4.0, 55.0, 66.0]


def test_reduce_series_leaves_out_groups_missing_a_matcher():
    # s.b.c has no 'x' sibling: graphite-web 1.1.8 passes None to diffSeries and answers 500
    target = "reduceSeries(mapSeries(group(a.*.c, alias(slow.s, 's.b.c')), 0), 'diffSeries', 1, 'b', 'x')"
    (difference,) = evaluate(target)
    assert difference.name == "a.reduce.diffSeries"
    assert values(difference) == values(single("diffSeries(a.b.c, a.x.c)"))
    assert evaluate("reduceSeries(mapSeries(a.*.c, 0), 'diffSeries', 1, 'b', 'nosuch')") == []
    assert evaluate("reduceSeries(mapSeries(a.*.c, 0), 'sumSeries', 1)") == []  # no matchers at all


def test_reduce_series_skips_series_without_the_reduce_node():
    huge = "99999999999999999999"  # IndexError "cannot fit 'int'" in graphite-web, once a 500 here
    assert evaluate(f"reduceSeries(mapSeries(time('t', 60), {huge}), 'sumSeries', 1, 'x')") == []
    assert evaluate(f"reduceSeries(mapSeries(a.*.c, 0), 'sumSeries', {huge}, 'b')") == []
    assert evaluate("reduceSeries(mapSeries(a.*.c, 0), 'sumSeries', -9, 'b')") == []


# Alias


def test_alias_functions():
    assert names("alias(a.*.c, 'x')") == ["x", "x"]
    assert names("aliasByNode(a.*.c, 1)") == ["b", "x"]
    assert names("aliasByNode(a.b.c, -1, 0)") == ["c.a"]
    assert names("aliasByNode(a.b.c, 5)") == [""]
    assert names("aliasByNode(scale(a.b.c, 2), 1)") == ["b"]
    assert names("aliasByMetric(scale(a.b.c, 2))") == ["c"]
    assert names(r"aliasSub(a.b.c, '^a\.(\w+)\..*', 'host-\1')") == ["host-b"]
    assert names("aliasByNode(seriesByTag('name=cpu', 'dc=a'), 'host', 0)") == ["h1.cpu", "h2.cpu"]
    assert names("aliasByTags(seriesByTag('name=cpu', 'dc=b'), 'host', 'dc')") == ["h3.b"]
    assert names("aliasByTags(seriesByTag('name=cpu', 'dc=b'), 'nosuch')") == [""]


def test_legend_value():
    assert names("legendValue(a.b.c, 'last', 'max')") == ["a.b.c (last: 6.0) (max: 6.0)"]


# Graph styling passes values through


def test_styling_functions_record_options():
    result = single("lineWidth(color(dashed(a.b.c), 'blue'), 2)")
    assert result.name == "dashed(a.b.c, 5)"
    assert result.options == {"dashed": 5, "color": "blue", "lineWidth": 2.0}
    assert values(result) == [1.0, 2.0, N, 4.0, 5.0, 6.0]
    result = single("alpha(secondYAxis(drawAsInfinite(a.b.c)), 0.5)")
    assert result.name == "secondYAxis(drawAsInfinite(a.b.c))"
    assert result.options == {"drawAsInfinite": True, "secondYAxis": True, "alpha": 0.5}
    first, second = evaluate("stacked(a.*.c)")
    assert first.name == "stacked(a.b.c)" and first.options["stacked"]
    assert values(second) == [11.0, 22.0, 30.0, N, 55.0, 66.0]


# Errors and catalog


@pytest.mark.parametrize(
    "target,message",
    [
        ("noSuchFunction(a.b.c)", "unknown function"),
        ("scale(a.b.c)", "Missing required parameter"),
        ("scale(a.b.c, 'x')", 'Invalid "float" value'),
        ("sumSeries(a.b.c", "expected"),
        ("limit(a.b.c, 1.5)", 'Invalid "integer" value'),
        ("scale(a.b.c, 2, 3)", "Too many parameters"),
        ("movingAverage(a.b.c, 2, foo=1)", "Unexpected key word"),
        ("summarize(a.b.c, 'x1')", 'Invalid "interval" value'),
        ("aggregate(a.b.c, 'nope')", 'Invalid "aggFunc" value'),
        ("groupByNode(a.b.c, 1, 'nope')", "Invalid option"),
        ("exclude(a.b.c, '(')", "invalid regular expression"),
        ("scale(1, 2)", 'Invalid "seriesList" value'),
        ("aliasByNode(a.b.c, nodes=1)", '"nodes" of function "aliasByNode" is given by position only'),
        ("mapSeries(a.*.c, mapNodes=0)", "given by position only"),
        # reduce functions that cannot take one series per matcher: graphite-web calls them anyway
        # and fails with a TypeError (a 500); messages name the series, never all their values
        ("reduceSeries(mapSeries(a.*.c, 0), 'scale', 1, 'b', 'x')", 'Invalid "float" value'),
        ("reduceSeries(mapSeries(a.*.c, 0), 'alias', 1, 'b')", 'Missing required parameter "newName"'),
        ("reduceSeries(mapSeries(a.*.c, 0), 'absolute', 1, 'b', 'x')", "Too many parameters"),
        ("reduceSeries(mapSeries(a.*.c, 0), 'mapSeries', 1, 'b')", "does not reduce series to a series"),
        ("reduceSeries(mapSeries(a.*.c, 0), 'reduceSeries', 1, 'b', 'x')", 'Invalid "seriesLists" value'),
        ("reduceSeries(mapSeries(a.*.c, 0), 'movingAverage', 1, 'b')", "Unsupported reduce function"),
        ("reduceSeries(a.*.c, 'sumSeries', 1, 'b')", "[the series 'a.b.c', the series 'a.x.c']"),
        ("mapSeries(mapSeries(a.*.c, 0), 1)", "[[the series 'a.b.c', the series 'a.x.c']]"),
        ("sumSeries(mapSeries(a.*.c, 0))", 'Invalid "seriesList" value'),
    ],
)
def test_user_errors_are_render_errors(target, message):
    with pytest.raises(RenderError, match=re.escape(message)):
        evaluate(target)


def test_empty_inputs_give_empty_results():
    assert evaluate("sumSeries(no.such)") == []
    assert evaluate("asPercent(no.such)") == []
    assert evaluate("") == []


def test_function_catalog_shape():
    catalog = function_catalog()
    assert {"sumSeries", "sum", "avg", "movingAverage", "seriesByTag", "groupByTags", "aliasByTags"} <= set(catalog)
    entry = catalog["movingWindow"]
    assert entry["name"] == "movingWindow"
    assert entry["group"] == "Calculate"
    assert entry["function"] == "movingWindow(seriesList, windowSize, func='average', xFilesFactor=None)"
    assert entry["params"][0] == {"name": "seriesList", "type": "seriesList", "required": True}
    assert entry["params"][2]["default"] == "average"
    assert "median" in entry["params"][2]["options"]
    assert catalog["sumSeries"]["params"] == [
        {"name": "seriesLists", "type": "seriesList", "required": True, "multiple": True}
    ]
    assert "sumSeries" in catalog["groupByNode"]["params"][2]["options"]
    assert math.isinf(catalog["keepLastValue"]["params"][1]["default"])
    grouped = function_catalog(grouped=True)
    assert "scale" in grouped["Transform"]
    assert set(function_catalog(group="Alias")) >= {"alias", "aliasByNode"}
    assert all(entry["description"] for entry in catalog.values())


def test_every_registered_function_has_valid_params():
    for name, function in REGISTRY.items():
        assert function.group in {
            "Combine",
            "Transform",
            "Calculate",
            "Filter Series",
            "Filter Data",
            "Sorting",
            "Alias",
            "Graph",
            "Special",
        }, name
        multiple = [param for param in function.params if param.multiple]
        assert not multiple or function.params[-1].multiple, name
        assert len(function.python_parameters) == len(function.params), name  # validate() pairs them
