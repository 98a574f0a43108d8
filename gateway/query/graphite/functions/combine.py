"""Combine: functions that merge series (sums, averages, ratios, groupBy*), as graphite-web groups them."""

import math
from functools import reduce
from itertools import zip_longest

from gateway.query.graphite.errors import EmptyResult, RenderError
from gateway.query.graphite.functions.helpers import (
    aggregation_key,
    format_path_expressions,
    group_series,
    normalize,
    percentile,
    xff_values,
)
from gateway.query.graphite.functions.registry import (
    AGG_FUNC,
    AGG_OR_SERIES_FUNC,
    ANY,
    BOOLEAN,
    FLOAT,
    NODE,
    NODE_OR_TAG,
    REGISTRY,
    SERIES_LIST,
    SERIES_LISTS,
    SERIES_LISTS_PARAMS,
    STRING,
    TAG,
    Param,
    series_function,
)
from gateway.query.graphite.functions.safe import get_agg_func, safe_div, safe_mul, safe_pow, safe_sum
from gateway.query.graphite.functions.special import constantLine
from gateway.query.graphite.series import TimeSeries, parse_tags


@series_function(
    "aggregate",
    group="Combine",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("func", AGG_FUNC, required=True),
        Param("xFilesFactor", FLOAT),
    ],
)
def aggregate(request, seriesList, func, xFilesFactor=None):
    """Aggregate series point by point with an aggregation function (sum, average, max, ...)."""
    raw_func = func
    if func.endswith("Series"):
        func = func[:-6]
    function = get_agg_func(func, raw_func)
    if not seriesList:
        return []
    series_lists = [seriesList] if isinstance(seriesList[0], TimeSeries) else seriesList
    try:
        series_list, start, end, step = normalize(series_lists)
    except EmptyResult:
        return []
    x_files_factor = xFilesFactor if xFilesFactor is not None else request.context.x_files_factor
    name = f"{func}Series({format_path_expressions(series_list)})"
    values = [function(row) if xff_values(row, x_files_factor) else None for row in zip_longest(*series_list)]
    tags = dict(series_list[0].tags)
    for series in series_list:
        tags = {k: v for k, v in tags.items() if series.tags.get(k) == v}
    tags.setdefault("name", name)
    tags["aggregatedBy"] = func
    return [TimeSeries(name, start, end, step, values, tags=tags, x_files_factor=x_files_factor)]


@series_function(
    "aggregateSeriesLists",
    group="Combine",
    params=[
        Param("seriesListFirstPos", SERIES_LIST, required=True),
        Param("seriesListSecondPos", SERIES_LIST, required=True),
        Param("func", AGG_FUNC, required=True),
        Param("xFilesFactor", FLOAT),
    ],
)
def aggregateSeriesLists(request, seriesListFirstPos, seriesListSecondPos, func, xFilesFactor=None):
    """Aggregate the i-th series of the first list with the i-th series of the second."""
    if len(seriesListFirstPos) != len(seriesListSecondPos):
        raise RenderError("seriesListFirstPos and seriesListSecondPos argument must have equal length")
    results = []
    for first, second in zip(seriesListFirstPos, seriesListSecondPos):
        aggregated = aggregate(request, [[first, second]], func, xFilesFactor)
        if not aggregated:
            continue
        result = aggregated[0]
        result.name = result.name[: result.name.find("Series(")] + f"Series({first.name},{second.name})"
        results.append(result)
    return results


def _aggregator(func: str, doc: str):
    def combine(request, *seriesLists):
        return aggregate(request, list(seriesLists), func)

    combine.__doc__ = doc
    return combine


TWO_LISTS_PARAMS = [
    Param("seriesListFirstPos", SERIES_LIST, required=True),
    Param("seriesListSecondPos", SERIES_LIST, required=True),
]
WILDCARD_PARAMS = [Param("seriesList", SERIES_LIST, required=True), Param("position", NODE, multiple=True)]

sumSeries = series_function("sumSeries", "sum", group="Combine", params=SERIES_LISTS_PARAMS, aggregator=True)(
    _aggregator("sum", "Sum of the series at each point (aggregate with 'sum').")
)
averageSeries = series_function("averageSeries", "avg", group="Combine", params=SERIES_LISTS_PARAMS, aggregator=True)(
    _aggregator("average", "Average of the series at each point (aggregate with 'average').")
)
diffSeries = series_function("diffSeries", group="Combine", params=SERIES_LISTS_PARAMS, aggregator=True)(
    _aggregator("diff", "First series minus the others at each point (aggregate with 'diff').")
)
stddevSeries = series_function("stddevSeries", group="Combine", params=SERIES_LISTS_PARAMS, aggregator=True)(
    _aggregator("stddev", "Population standard deviation of the series at each point.")
)
minSeries = series_function("minSeries", group="Combine", params=SERIES_LISTS_PARAMS, aggregator=True)(
    _aggregator("min", "Minimum of the series at each point.")
)
maxSeries = series_function("maxSeries", group="Combine", params=SERIES_LISTS_PARAMS, aggregator=True)(
    _aggregator("max", "Maximum of the series at each point.")
)
rangeOfSeries = series_function("rangeOfSeries", group="Combine", params=SERIES_LISTS_PARAMS, aggregator=True)(
    _aggregator("rangeOf", "Maximum minus minimum of the series at each point.")
)


@series_function("multiplySeries", group="Combine", params=SERIES_LISTS_PARAMS, aggregator=True)
def multiplySeries(request, *seriesLists):
    """Product of the series at each point; a single series is returned unchanged."""
    if len(seriesLists) == 1 and len(seriesLists[0]) == 1:
        return seriesLists[0]
    return aggregate(request, list(seriesLists), "multiply")


def _lists_aggregator(func: str, doc: str):
    def combine(request, seriesListFirstPos, seriesListSecondPos):
        return aggregateSeriesLists(request, seriesListFirstPos, seriesListSecondPos, func)

    combine.__doc__ = doc
    return combine


sumSeriesLists = series_function("sumSeriesLists", group="Combine", params=TWO_LISTS_PARAMS, aggregator=True)(
    _lists_aggregator("sum", "Sum the i-th series of two lists pairwise.")
)
diffSeriesLists = series_function("diffSeriesLists", group="Combine", params=TWO_LISTS_PARAMS, aggregator=True)(
    _lists_aggregator("diff", "Subtract the i-th series of the second list from the i-th of the first.")
)
multiplySeriesLists = series_function("multiplySeriesLists", group="Combine", params=TWO_LISTS_PARAMS, aggregator=True)(
    _lists_aggregator("multiply", "Multiply the i-th series of two lists pairwise.")
)


@series_function(
    "aggregateWithWildcards",
    group="Combine",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("func", AGG_FUNC, required=True),
        Param("position", NODE, multiple=True),
    ],
)
def aggregateWithWildcards(request, seriesList, func, *position):
    """Aggregate series whose names are equal once the given node positions are removed."""

    def key(series):
        return ".".join(node for i, node in enumerate(series.name.split(".")) if i not in position)

    results = []
    for group_key, members in group_series(seriesList, key).items():
        result = aggregate(request, members, func)[0]
        result.name = group_key
        results.append(result)
    return results


def _wildcards_aggregator(func: str, doc: str):
    def combine(request, seriesList, *position):
        return aggregateWithWildcards(request, seriesList, func, *position)

    combine.__doc__ = doc
    return combine


sumSeriesWithWildcards = series_function(
    "sumSeriesWithWildcards", group="Combine", params=WILDCARD_PARAMS, aggregator=True
)(_wildcards_aggregator("sum", "sumSeries over groups of names ignoring the given node positions."))
averageSeriesWithWildcards = series_function(
    "averageSeriesWithWildcards", group="Combine", params=WILDCARD_PARAMS, aggregator=True
)(_wildcards_aggregator("average", "averageSeries over groups of names ignoring the given node positions."))
multiplySeriesWithWildcards = series_function(
    "multiplySeriesWithWildcards", group="Combine", params=WILDCARD_PARAMS, aggregator=True
)(_wildcards_aggregator("multiply", "multiplySeries over groups of names ignoring the given node positions."))


@series_function(
    "percentileOfSeries",
    group="Combine",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("n", FLOAT, required=True),
        Param("interpolate", BOOLEAN, default=False),
    ],
)
def percentileOfSeries(request, seriesList, n, interpolate=False):
    """The n-th percentile across the series at each point."""
    if n <= 0:
        raise RenderError("The requested percent is required to be greater than 0")
    if not seriesList:
        return []
    name = "percentileOfSeries(%s,%g)" % (seriesList[0].pathExpression, n)
    _, start, end, step = normalize([seriesList])
    values = [percentile(row, n, interpolate) for row in zip_longest(*seriesList)]
    return [TimeSeries(name, start, end, step, values, x_files_factor=request.context.x_files_factor)]


def _sum_group(members, x_files_factor):
    """The total of a group of series, as asPercent builds it."""
    if len(members) == 1:
        return members[0]
    name = "sumSeries(%s)" % format_path_expressions(members)
    _, start, end, step = normalize([members])
    values = [safe_sum(row) for row in zip_longest(*members)]
    return TimeSeries(name, start, end, step, values, x_files_factor=x_files_factor)


@series_function(
    "asPercent",
    "pct",
    group="Combine",
    aggregator=True,
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("total", ANY),
        Param("nodes", NODE_OR_TAG, multiple=True),
    ],
)
def asPercent(request, seriesList, total=None, *nodes):
    """Each series as a percentage of a total (a number, a series, matching series or their sum)."""
    x_files_factor = request.context.x_files_factor
    normalize([seriesList])
    if isinstance(total, list) and not all(isinstance(series, TimeSeries) for series in total):
        raise RenderError("asPercent total must be a series list, not lists of series")
    if nodes:
        groups = group_series(seriesList, lambda s: aggregation_key(s, nodes))
        keys = list(groups)
        if total is None:
            totals = {key: _sum_group(members, x_files_factor) for key, members in groups.items()}
        elif isinstance(total, list):
            total_groups = group_series(total, lambda s: aggregation_key(s, nodes))
            keys += [key for key in total_groups if key not in groups]
            totals = {key: _sum_group(members, x_files_factor) for key, members in total_groups.items()}
        else:
            raise RenderError("total must be None or a seriesList")
        results = []
        for key in keys:
            if key not in groups:
                total_series = totals[key]
                results.append(
                    TimeSeries(
                        "asPercent(MISSING,%s)" % total_series.name,
                        total_series.start,
                        total_series.end,
                        total_series.step,
                        [None for _ in total_series],
                        x_files_factor=x_files_factor,
                    )
                )
                continue
            for series in groups[key]:
                if key not in totals:
                    name = "asPercent(%s,MISSING)" % series.name
                    values = [None for _ in series]
                    start, end, step = series.start, series.end, series.step
                else:
                    total_series = totals[key]
                    name = "asPercent(%s,%s)" % (series.name, total_series.name)
                    _, start, end, step = normalize([[series, total_series]])
                    values = [safe_mul(safe_div(v1, v2), 100.0) for v1, v2 in zip_longest(series, total_series)]
                results.append(TimeSeries(name, start, end, step, values, x_files_factor=x_files_factor))
        return results

    if total is None:
        total_values = [safe_sum(row) for row in zip_longest(*seriesList)]
        total_text = "sumSeries(%s)" % format_path_expressions(seriesList)
    elif isinstance(total, list):
        if len(total) not in (1, len(seriesList)):
            raise RenderError(
                "asPercent second argument must be missing, a single digit, reference exactly 1 "
                "series or reference the same number of series as the first argument"
            )
        if len(total) == 1:
            normalize([seriesList, total])
            total_values = total[0]
            total_text = total_values.name
    else:
        if isinstance(total, bool) or not isinstance(total, (int, float)):
            raise RenderError(f"asPercent(): total {total!r} must be a number or a series list")
        total_values = [total] * len(seriesList[0])
        total_text = str(total)

    results = []
    if isinstance(total, list) and len(total) == len(seriesList):
        pairs = zip(sorted(seriesList, key=lambda s: s.name), sorted(total, key=lambda s: s.name))
        for series, total_series in pairs:
            name = "asPercent(%s,%s)" % (series.name, total_series.name)
            _, start, end, step = normalize([[series, total_series]])
            values = [safe_mul(safe_div(v1, v2), 100.0) for v1, v2 in zip_longest(series, total_series)]
            results.append(TimeSeries(name, start, end, step, values, x_files_factor=x_files_factor))
        return results
    for series in seriesList:
        values = [safe_mul(safe_div(v, t), 100.0) for v, t in zip_longest(series, total_values)]
        name = "asPercent(%s,%s)" % (series.name, total_text or series.pathExpression)
        results.append(TimeSeries(name, series.start, series.end, series.step, values, x_files_factor=x_files_factor))
    return results


def _divide(request, dividend, divisor):
    name = "divideSeries(%s,%s)" % (dividend.name, divisor.name)
    both = (dividend, divisor)
    step = reduce(math.lcm, [s.step for s in both])
    for series in both:
        series.consolidate(step // series.step)
    start = min(s.start for s in both)
    end = max(s.end for s in both)
    end -= (end - start) % step
    values = [safe_div(v1, v2) for v1, v2 in zip_longest(*both)]
    return TimeSeries(name, start, end, step, values, x_files_factor=request.context.x_files_factor)


@series_function(
    "divideSeries",
    group="Combine",
    params=[
        Param("dividendSeriesList", SERIES_LIST, required=True),
        Param("divisorSeries", SERIES_LIST, required=True),
    ],
)
def divideSeries(request, dividendSeriesList, divisorSeries):
    """Divide each series by a single divisor series (None where the divisor is 0 or None)."""
    if not divisorSeries:
        for series in dividendSeriesList:
            series.name = "divideSeries(%s,MISSING)" % series.name
            series.pathExpression = series.name
            for i in range(len(series)):
                series[i] = None
        return dividendSeriesList
    if len(divisorSeries) > 1:
        raise RenderError(f"divideSeries second argument must reference exactly 1 series (got {len(divisorSeries)})")
    return [_divide(request, dividend, divisorSeries[0]) for dividend in dividendSeriesList]


@series_function(
    "divideSeriesLists",
    group="Combine",
    params=[
        Param("dividendSeriesList", SERIES_LIST, required=True),
        Param("divisorSeriesList", SERIES_LIST, required=True),
    ],
)
def divideSeriesLists(request, dividendSeriesList, divisorSeriesList):
    """Divide the i-th series of the first list by the i-th series of the second."""
    if len(dividendSeriesList) != len(divisorSeriesList):
        raise RenderError("dividendSeriesList and divisorSeriesList argument must have equal length")
    return [_divide(request, a, b) for a, b in zip(dividendSeriesList, divisorSeriesList)]


@series_function(
    "weightedAverage",
    group="Combine",
    params=[
        Param("seriesListAvg", SERIES_LIST, required=True),
        Param("seriesListWeight", SERIES_LIST, required=True),
        Param("nodes", NODE_OR_TAG, multiple=True),
    ],
)
def weightedAverage(request, seriesListAvg, seriesListWeight, *nodes):
    """Average of the first list weighted by the matching (by nodes) series of the second."""
    if len(seriesListAvg) != len(seriesListWeight):
        raise RenderError(
            "weightedAverage must receive the same number of series for seriesListAvg and "
            f"seriesListWeight but received respectively {len(seriesListAvg)} and "
            f"{len(seriesListWeight)}"
        )
    pairs = {}
    for average_series, weight_series in zip(seriesListAvg, seriesListWeight):
        pairs.setdefault(aggregation_key(average_series, nodes), {})["avg"] = average_series
        pairs.setdefault(aggregation_key(weight_series, nodes), {})["weight"] = weight_series
    x_files_factor = request.context.x_files_factor
    products = []
    for pair in pairs.values():
        if "avg" not in pair or "weight" not in pair:
            continue
        average_series, weight_series = pair["avg"], pair["weight"]
        values = [safe_mul(a, b) for a, b in zip_longest(average_series, weight_series)]
        products.append(
            TimeSeries(
                "product(%s,%s)" % (weight_series.name, average_series.name),
                average_series.start,
                average_series.end,
                average_series.step,
                values,
                x_files_factor=x_files_factor,
            )
        )
    if not products:
        return []
    sum_products = sumSeries(request, products)[0]
    sum_weights = sumSeries(request, seriesListWeight)[0]
    values = [safe_div(a, b) for a, b in zip_longest(sum_products, sum_weights)]
    name = "weightedAverage(%s, %s, %s)" % (
        ",".join(sorted({s.pathExpression for s in seriesListAvg})),
        ",".join(sorted({s.pathExpression for s in seriesListWeight})),
        ",".join(map(str, nodes)),
    )
    return [
        TimeSeries(name, sum_products.start, sum_products.end, sum_products.step, values, x_files_factor=x_files_factor)
    ]


@series_function(
    "powSeries",
    group="Combine",
    aggregator=True,
    params=[
        Param("seriesList", SERIES_LIST, required=True, multiple=True),
    ],
)
def powSeries(request, *seriesList):
    """The first series raised to the power of the next ones, point by point."""
    try:
        series_list, start, end, step = normalize(seriesList)
    except EmptyResult:
        return []
    values = []
    for row in zip_longest(*series_list):
        value = row[0]
        for element in row[1:]:
            value = safe_pow(value, element)
        values.append(value)
    name = "powSeries(%s)" % ",".join(s.name for s in series_list)
    return [TimeSeries(name, start, end, step, values, x_files_factor=request.context.x_files_factor)]


@series_function(
    "countSeries",
    group="Combine",
    aggregator=True,
    params=[
        Param("seriesLists", SERIES_LIST, multiple=True),
    ],
)
def countSeries(request, *seriesLists):
    """The number of series at each point (a constant line of 0 without arguments)."""
    if seriesLists:
        series_list, start, end, step = normalize(seriesLists)
        name = "countSeries(%s)" % format_path_expressions(series_list)
        values = [len(row) for row in zip_longest(*series_list)]
        series = TimeSeries(name, start, end, step, values, x_files_factor=request.context.x_files_factor)
    else:
        series = constantLine(request, 0)[0]
        series.pathExpression = "countSeries()"
    return [series]


@series_function("group", group="Combine", params=[Param("seriesLists", SERIES_LIST, multiple=True)])
def group(request, *seriesLists):
    """Join several series lists into one."""
    return [series for series_list in seriesLists for series in series_list]


@series_function(
    "mapSeries",
    "map",
    group="Combine",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("mapNodes", NODE_OR_TAG, required=True, multiple=True),
    ],
)
def mapSeries(request, seriesList, *mapNodes):
    """Split a series list into lists sharing the given nodes (input for reduceSeries)."""
    return list(group_series(seriesList, lambda s: aggregation_key(s, mapNodes)).values())


@series_function(
    "reduceSeries",
    "reduce",
    group="Combine",
    params=[
        Param("seriesLists", SERIES_LISTS, required=True),
        Param("reduceFunction", STRING, required=True),
        Param("reduceNode", NODE, required=True),
        Param("reduceMatchers", STRING, required=True, multiple=True),
    ],
)
def reduceSeries(request, seriesLists, reduceFunction, reduceNode, *reduceMatchers):
    """Apply a function to the series of each mapped list picked by reduceMatchers at reduceNode.

    A group that lacks a series for one of the matchers, or whose reduction is empty, is left out
    (graphite-web 1.1.8 fails with a 500 there, as it does for series without node reduceNode).
    """
    function = REGISTRY.get(reduceFunction)
    if function is None or function.is_async:
        raise RenderError(f"Unsupported reduce function: {reduceFunction}")
    groups = {}
    for series_list in seriesLists:
        for series in series_list:
            nodes = series.name.split(".")
            if not -len(nodes) <= reduceNode < len(nodes) or nodes[reduceNode] not in reduceMatchers:
                continue
            key = ".".join(nodes[0:reduceNode]) + ".reduce." + reduceFunction
            groups.setdefault(key, [None] * len(reduceMatchers))[reduceMatchers.index(nodes[reduceNode])] = series
    results = []
    for key, members in groups.items():
        if any(series is None for series in members):
            continue
        args, kwargs = function.validate([[series] for series in members], {})
        reduced = function.function(request, *args, **kwargs)
        if not reduced:
            continue
        if not isinstance(reduced[0], TimeSeries):
            raise RenderError(f"reduceSeries(): {reduceFunction} does not reduce series to a series")
        reduced[0].name = key
        results.append(reduced[0])
    return results


@series_function(
    "applyByNode",
    group="Combine",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("nodeNum", NODE, required=True),
        Param("templateFunction", STRING, required=True),
        Param("newName", STRING),
    ],
)
async def applyByNode(request, seriesList, nodeNum, templateFunction, newName=None):
    """Evaluate a template target once per name prefix (nodes 0..nodeNum), '%' standing for the prefix."""
    prefixes = sorted({".".join(series.name.split(".")[: nodeNum + 1]) for series in seriesList})
    results = []
    for prefix in prefixes:
        for result in await request.evaluate(templateFunction.replace("%", prefix), request.context):
            if newName:
                result.name = newName.replace("%", prefix)
            result.pathExpression = prefix
            result.start = seriesList[-1].start
            result.end = seriesList[-1].end
            results.append(result)
    return results


def apply_callback(request, callback: str, series_list):
    """groupBy* callback: a registered aggregating function name or an aggregation name."""
    if callback in REGISTRY:
        function = REGISTRY[callback]
        if function.is_async or any(param.required for param in function.params[1:]):
            raise RenderError(f"{callback} cannot aggregate a group of series on its own")
        return function.function(request, series_list)[0]
    return aggregate(request, series_list, callback)[0]


@series_function(
    "groupByNode",
    group="Combine",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("nodeNum", NODE_OR_TAG, required=True),
        Param("callback", AGG_OR_SERIES_FUNC, default="average"),
    ],
)
def groupByNode(request, seriesList, nodeNum, callback="average"):
    """Aggregate the series sharing one node (or tag) value; the result is named by that value."""
    return groupByNodes(request, seriesList, callback, nodeNum)


@series_function(
    "groupByNodes",
    group="Combine",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("callback", AGG_OR_SERIES_FUNC, required=True),
        Param("nodes", NODE_OR_TAG, multiple=True),
    ],
)
def groupByNodes(request, seriesList, callback, *nodes):
    """Aggregate the series sharing several node (or tag) values, named by the joined values."""
    results = []
    for key, members in group_series(seriesList, lambda s: aggregation_key(s, nodes)).items():
        result = apply_callback(request, callback, members)
        result.name = key
        results.append(result)
    return results


@series_function(
    "groupByTags",
    group="Combine",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("callback", AGG_OR_SERIES_FUNC, required=True),
        Param("tags", TAG, required=True, multiple=True),
    ],
)
def groupByTags(request, seriesList, callback, *tags):
    """Aggregate the series sharing the given tag values; results are named as tagged series."""
    if not tags:
        raise RenderError("groupByTags(): no tags specified")
    if "name" not in tags:
        names = {series.tags["name"] for series in seriesList}
        common_name = names.pop() if len(names) == 1 else callback

    def key(series):
        if "name" in tags:
            return ";".join(
                [series.tags["name"]] + sorted(f"{tag}={series.tags.get(tag, '')}" for tag in tags if tag != "name")
            )
        return ";".join([common_name] + sorted(f"{tag}={series.tags.get(tag, '')}" for tag in tags))

    results = []
    for group_key, members in group_series(seriesList, key).items():
        result = apply_callback(request, callback, members)
        result.name = group_key
        result.pathExpression = group_key
        result.tags = parse_tags(group_key)
        results.append(result)
    return results
