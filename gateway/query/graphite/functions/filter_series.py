"""Filter Series: functions that keep or drop whole series (above/below, highest/lowest, grep)."""

from gateway.query.graphite.errors import RenderError
from gateway.query.graphite.functions.helpers import _compile, _substitute, percentile, xff_values
from gateway.query.graphite.functions.registry import (
    AGG_FUNC,
    FLOAT,
    INTEGER,
    N_FLOAT_PARAMS,
    N_INTEGER_PARAMS,
    SERIES_LIST,
    SERIES_LISTS_PARAMS,
    STRING,
    Param,
    series_function,
)
from gateway.query.graphite.functions.safe import (
    INF,
    get_agg_func,
    none_last_key,
    safe_avg,
    safe_div,
    safe_len,
    safe_max,
)

OPERATORS = {
    "=": lambda value, threshold: value is not None and value == threshold,
    "!=": lambda value, threshold: value is None or value != threshold,
    ">": lambda value, threshold: value is not None and value > threshold,
    ">=": lambda value, threshold: value is not None and value >= threshold,
    "<": lambda value, threshold: value is None or value < threshold,
    "<=": lambda value, threshold: value is None or value <= threshold,
}


@series_function(
    "filterSeries",
    group="Filter Series",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("func", AGG_FUNC, required=True),
        Param("operator", STRING, required=True, options=sorted(OPERATORS)),
        Param("threshold", FLOAT, required=True),
    ],
)
def filterSeries(request, seriesList, func, operator, threshold):
    """Keep the series whose aggregate compares to the threshold as the operator says."""
    function = get_agg_func(func)
    if operator not in OPERATORS:
        raise RenderError(f"Unsupported operator: {operator}")
    return [series for series in seriesList if OPERATORS[operator](function(series), threshold)]


def _filter(func: str, operator: str, doc: str):
    def keep(request, seriesList, n):
        return filterSeries(request, seriesList, func, operator, n)

    keep.__doc__ = doc
    return keep


maximumAbove = series_function("maximumAbove", group="Filter Series", params=N_FLOAT_PARAMS)(
    _filter("max", ">", "Series whose maximum is above n.")
)
minimumAbove = series_function("minimumAbove", group="Filter Series", params=N_FLOAT_PARAMS)(
    _filter("min", ">", "Series whose minimum is above n.")
)
maximumBelow = series_function("maximumBelow", group="Filter Series", params=N_FLOAT_PARAMS)(
    _filter("max", "<=", "Series whose maximum is at most n.")
)
minimumBelow = series_function("minimumBelow", group="Filter Series", params=N_FLOAT_PARAMS)(
    _filter("min", "<=", "Series whose minimum is at most n.")
)
currentAbove = series_function("currentAbove", group="Filter Series", params=N_FLOAT_PARAMS)(
    _filter("last", ">", "Series whose last non-null value is above n.")
)
currentBelow = series_function("currentBelow", group="Filter Series", params=N_FLOAT_PARAMS)(
    _filter("last", "<=", "Series whose last non-null value is at most n.")
)
averageAbove = series_function("averageAbove", group="Filter Series", params=N_FLOAT_PARAMS)(
    _filter("average", ">", "Series whose average is above n.")
)
averageBelow = series_function("averageBelow", group="Filter Series", params=N_FLOAT_PARAMS)(
    _filter("average", "<=", "Series whose average is at most n.")
)


@series_function(
    "highest",
    group="Filter Series",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("n", INTEGER, required=True),
        Param("func", AGG_FUNC, default="average"),
    ],
)
def highest(request, seriesList, n=1, func="average"):
    """The n series with the highest aggregate."""
    seriesList.sort(key=none_last_key(get_agg_func(func)), reverse=True)
    return seriesList[: int(n)]


@series_function(
    "lowest",
    group="Filter Series",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("n", INTEGER, required=True),
        Param("func", AGG_FUNC, default="average"),
    ],
)
def lowest(request, seriesList, n=1, func="average"):
    """The n series with the lowest aggregate."""
    seriesList.sort(key=none_last_key(get_agg_func(func)))
    return seriesList[: int(n)]


def _ranked(rank, func: str, doc: str):
    def pick(request, seriesList, n):
        return rank(request, seriesList, n, func)

    pick.__doc__ = doc
    return pick


highestCurrent = series_function("highestCurrent", group="Filter Series", params=N_INTEGER_PARAMS)(
    _ranked(highest, "current", "The n series with the highest last value.")
)
highestMax = series_function("highestMax", group="Filter Series", params=N_INTEGER_PARAMS)(
    _ranked(highest, "max", "The n series with the highest maximum.")
)
highestAverage = series_function("highestAverage", group="Filter Series", params=N_INTEGER_PARAMS)(
    _ranked(highest, "average", "The n series with the highest average.")
)
lowestCurrent = series_function("lowestCurrent", group="Filter Series", params=N_INTEGER_PARAMS)(
    _ranked(lowest, "current", "The n series with the lowest last value.")
)
lowestAverage = series_function("lowestAverage", group="Filter Series", params=N_INTEGER_PARAMS)(
    _ranked(lowest, "average", "The n series with the lowest average.")
)


@series_function("averageOutsidePercentile", group="Filter Series", params=N_FLOAT_PARAMS)
def averageOutsidePercentile(request, seriesList, n):
    """Remove series whose average lies between the (100-n)th and n-th percentile of averages."""
    averages = [safe_avg(series) for series in seriesList]
    if n < 50:
        n = 100 - n
    low = percentile(averages, 100 - n)
    high = percentile(averages, n)
    if low is None:  # no series has a value: none is inside the band
        return seriesList
    return [series for series, average in zip(seriesList, averages) if average is None or not low < average < high]


@series_function("removeBetweenPercentile", group="Filter Series", params=N_FLOAT_PARAMS)
def removeBetweenPercentile(request, seriesList, n):
    """Remove series that never leave the band between the (100-n)th and n-th percentile of each point."""
    if n < 50:
        n = 100 - n
    columns = list(zip(*seriesList))
    lows = [percentile(column, 100 - n) for column in columns]
    highs = [percentile(column, n) for column in columns]
    # graphite-web 1.1.8 compares None with floats here and fails (a TypeError) on any gap; a
    # null point is neither inside nor outside the band
    return [
        series
        for series in seriesList
        if sum(not lows[i] < value < highs[i] for i, value in enumerate(series) if value is not None) > 0
    ]


@series_function("limit", group="Filter Series", params=N_INTEGER_PARAMS)
def limit(request, seriesList, n):
    """The first n series."""
    return seriesList[0:n]


@series_function("mostDeviant", group="Filter Series", params=N_INTEGER_PARAMS)
def mostDeviant(request, seriesList, n):
    """The n series with the highest variance."""
    deviants = []
    for series in seriesList:
        mean = safe_avg(series)
        if mean is None:
            continue
        square_sum = sum((v - mean) ** 2 for v in series if v is not None)
        sigma = safe_div(square_sum, safe_len(series))
        if sigma is None:
            continue
        deviants.append((sigma, series))
    deviants.sort(key=lambda pair: pair[0], reverse=True)
    return [series for _, series in deviants][:n]


@series_function(
    "exclude",
    group="Filter Series",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("pattern", STRING, required=True),
    ],
)
def exclude(request, seriesList, pattern):
    """Drop the series whose name matches a regular expression."""
    regex = _compile(pattern)
    return [series for series in seriesList if not regex.search(_name_text(series))]


@series_function(
    "grep",
    group="Filter Series",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("pattern", STRING, required=True),
    ],
)
def grep(request, seriesList, pattern):
    """Keep the series whose name matches a regular expression."""
    regex = _compile(pattern)
    return [series for series in seriesList if regex.search(_name_text(series))]


def _name_text(series) -> str:
    """A series' name as the patterns read it: ``verticalLine`` without a label names its series
    None, as graphite-web does (whose grep then fails with a 500); its tags say "None"."""
    return str(series.name)


@series_function(
    "removeEmptySeries",
    group="Filter Series",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("xFilesFactor", FLOAT),
    ],
)
def removeEmptySeries(request, seriesList, xFilesFactor=None):
    """Drop series without (enough) non-null values."""
    x_files_factor = xFilesFactor if xFilesFactor is not None else 0
    return [series for series in seriesList if xff_values(series, x_files_factor)]


@series_function("unique", group="Filter Series", params=SERIES_LISTS_PARAMS)
def unique(request, *seriesLists):
    """Series with distinct names, first occurrence kept."""
    seen = set()
    result = []
    for series_list in seriesLists:
        for series in series_list:
            if series.name not in seen:
                seen.add(series.name)
                result.append(series)
    return result


@series_function(
    "useSeriesAbove",
    group="Filter Series",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("value", FLOAT, required=True),
        Param("search", STRING, required=True),
        Param("replace", STRING, required=True),
    ],
)
async def useSeriesAbove(request, seriesList, value, search, replace):
    """For series whose maximum is above value, fetch the series named by a regex substitution."""
    regex = _compile(search, capture=True)
    names = [_substitute(regex, replace, series.name) for series in seriesList if safe_max(series, -INF) > value]
    if not names:
        return []
    found = await request.evaluate("group(%s)" % ",".join(names), request.context)
    return [series for series in found if series is not None and len(series) > 0]
