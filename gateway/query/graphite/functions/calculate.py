"""Calculate: moving windows, percentiles, deviation and regression lines."""

import math

from gateway.query.graphite.errors import RenderError
from gateway.query.graphite.functions.helpers import _generated_times, _parse_date, _rename, percentile, xff
from gateway.query.graphite.functions.registry import (
    AGG_FUNC,
    BOOLEAN,
    DATE,
    FLOAT,
    INT_OR_INTERVAL,
    INTEGER,
    SERIES_LIST,
    STRING,
    Param,
    interval_seconds,
    series_function,
)
from gateway.query.graphite.functions.safe import get_agg_func, safe_avg
from gateway.query.graphite.functions.special import constantLine
from gateway.query.graphite.series import TimeSeries


async def _moving_window(request, seriesList, windowSize, func, xFilesFactor, tag_name):
    """Aggregate the ``windowSize`` points (or seconds) before each point; data before ``from`` is fetched."""
    if not seriesList:
        return []
    if isinstance(windowSize, str):
        preview_seconds = abs(interval_seconds(windowSize))
    else:
        preview_seconds = max(series.step for series in seriesList) * int(windowSize)
    fetched = await request.evaluate_first_argument(start=request.context.start - preview_seconds)
    return await request.compute(
        _moving_window_values, fetched, windowSize, preview_seconds, func, xFilesFactor, tag_name
    )


def _moving_window_values(fetched, windowSize, preview_seconds, func, xFilesFactor, tag_name):
    function = get_agg_func(func)
    results = []
    for series in fetched:
        if isinstance(windowSize, str):
            name = '%s(%s,"%s")' % (tag_name, series.name, windowSize)
            window_points = preview_seconds // series.step
        else:
            name = "%s(%s,%s)" % (tag_name, series.name, windowSize)
            window_points = int(windowSize)
        series.tags[tag_name] = windowSize
        x_files_factor = xFilesFactor if xFilesFactor is not None else series.xFilesFactor
        values = []
        for i in range(window_points, len(series)):
            usable = [v for v in series[i - window_points : i] if v is not None]
            if usable and xff(len(usable), window_points, x_files_factor):
                values.append(function(usable))
            else:
                values.append(None)
        results.append(series.copy(name=name, start=series.start + preview_seconds, values=values))
    return results


INT_OR_INTERVAL_SUGGESTIONS = [5, 7, 10, "1min", "5min", "10min", "30min", "1hour"]
MOVING_PARAMS = [
    Param("seriesList", SERIES_LIST, required=True),
    Param("windowSize", INT_OR_INTERVAL, required=True, suggestions=INT_OR_INTERVAL_SUGGESTIONS),
    Param("xFilesFactor", FLOAT),
]


@series_function(
    "movingWindow",
    group="Calculate",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("windowSize", INT_OR_INTERVAL, required=True, suggestions=INT_OR_INTERVAL_SUGGESTIONS),
        Param("func", AGG_FUNC, default="average"),
        Param("xFilesFactor", FLOAT),
    ],
)
async def movingWindow(request, seriesList, windowSize, func="average", xFilesFactor=None):
    """Aggregate, for each point, the previous windowSize points (a number, or an interval like '5min')."""
    return await _moving_window(request, seriesList, windowSize, func, xFilesFactor, "moving" + func.capitalize())


def _moving(func: str, doc: str):
    async def moving(request, seriesList, windowSize, xFilesFactor=None):
        return await _moving_window(request, seriesList, windowSize, func, xFilesFactor, "moving" + func.capitalize())

    moving.__doc__ = doc
    return moving


movingAverage = series_function("movingAverage", group="Calculate", params=MOVING_PARAMS)(
    _moving("average", "Average of the previous windowSize points (or interval).")
)
movingMedian = series_function("movingMedian", group="Calculate", params=MOVING_PARAMS)(
    _moving("median", "Median of the previous windowSize points (or interval).")
)
movingSum = series_function("movingSum", group="Calculate", params=MOVING_PARAMS)(
    _moving("sum", "Sum of the previous windowSize points (or interval).")
)
movingMin = series_function("movingMin", group="Calculate", params=MOVING_PARAMS)(
    _moving("min", "Minimum of the previous windowSize points (or interval).")
)
movingMax = series_function("movingMax", group="Calculate", params=MOVING_PARAMS)(
    _moving("max", "Maximum of the previous windowSize points (or interval).")
)


@series_function(
    "exponentialMovingAverage",
    group="Calculate",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("windowSize", INT_OR_INTERVAL, required=True, suggestions=INT_OR_INTERVAL_SUGGESTIONS),
    ],
)
async def exponentialMovingAverage(request, seriesList, windowSize):
    """EMA with constant 2/(windowSize+1), seeded by the average of the first window."""
    if not seriesList:
        return []
    if isinstance(windowSize, str):
        preview_seconds = abs(interval_seconds(windowSize))
        constant = 2.0 / (int(preview_seconds) + 1)
    elif windowSize < 0:
        raise RenderError(f"exponentialMovingAverage(): windowSize {windowSize} is negative")
    else:
        preview_seconds = max(series.step for series in seriesList) * int(windowSize)
        constant = 2.0 / (int(windowSize) + 1)
    fetched = await request.evaluate_first_argument(start=request.context.start - preview_seconds)
    return await request.compute(_exponential_moving_average, fetched, windowSize, preview_seconds, constant)


def _exponential_moving_average(fetched, windowSize, preview_seconds, constant):
    results = []
    for series in fetched:
        if isinstance(windowSize, str):
            name = 'exponentialMovingAverage(%s,"%s")' % (series.name, windowSize)
            window_points = preview_seconds // series.step
        else:
            name = "exponentialMovingAverage(%s,%s)" % (series.name, windowSize)
            window_points = int(windowSize)
        series.tags["exponentialMovingAverage"] = windowSize
        ema = safe_avg(series[:window_points]) or 0
        values = [round(ema, 6)]
        for i in range(window_points, len(series)):
            if series[i] is None:
                values.append(None)
            else:
                ema = constant * series[i] + (1 - constant) * ema
                values.append(round(ema, 6))
        results.append(series.copy(name=name, start=series.start + preview_seconds, values=values))
    return results


@series_function(
    "nPercentile",
    group="Calculate",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("n", FLOAT, required=True),
    ],
)
def nPercentile(request, seriesList, n):
    """A constant line at the n-th percentile of each series."""
    if not n:
        raise RenderError("The requested percent is required to be greater than 0")
    results = []
    for series in seriesList:
        ordered = series.copy(values=sorted(v for v in series if v is not None))
        if not ordered:
            continue
        value = percentile(ordered, n)
        if value is not None:
            ordered.tags["nPercentile"] = n
            points = int((series.end - series.start) / series.step)
            results.append(ordered.copy(name="nPercentile(%s, %g)" % (ordered.name, n), values=[value] * points))
    return results


@series_function(
    "stdev",
    group="Calculate",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("points", INTEGER, required=True),
        Param("windowTolerance", FLOAT, default=0.1),
    ],
)
def stdev(request, seriesList, points, windowTolerance=0.1):
    """Moving standard deviation over ``points`` points, None if too many are missing."""
    if points <= 0:
        raise RenderError(f"stdev(): points {points} must be positive")
    for index, series in enumerate(seriesList):
        series.tags["stdev"] = points
        result = series.copy(name="stdev(%s,%d)" % (series.name, int(points)), values=[])
        valid = 0
        total = 0
        total_squares = 0
        for i, value in enumerate(series):
            dropped = series[i - points] if i >= points else None
            if dropped is not None:
                valid -= 1
                total -= dropped
                total_squares -= dropped**2
            if value is not None:
                valid += 1
                total += value
                total_squares += value**2
            if valid > 0 and float(valid) / points >= windowTolerance:
                try:
                    result.append(math.sqrt(valid * total_squares - total**2) / valid)
                except ValueError:
                    result.append(None)
            else:
                result.append(None)
        seriesList[index] = result
    return seriesList


@series_function(
    "linearRegression",
    group="Calculate",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("startSourceAt", DATE),
        Param("endSourceAt", DATE),
    ],
)
async def linearRegression(request, seriesList, startSourceAt=None, endSourceAt=None):
    """Least-squares line fitted on the source range (default: the request range)."""
    context = request.context
    start = context.start if startSourceAt is None else _parse_date(startSourceAt, context)
    end = context.end if endSourceAt is None else _parse_date(endSourceAt, context)
    sources = await request.evaluate_first_argument(start=start, end=end)
    results = []
    for source, series in zip(sources, seriesList):
        series.tags["linearRegressions"] = "%s, %s" % (start, end)
        name = "linearRegression(%s, %s, %s)" % (series.name, start, end)
        fit = _linear_fit(source)
        if fit is None:
            continue
        factor, intercept = fit
        values = [intercept + (series.start + i * series.step) * factor for i in range(len(series))]
        result = TimeSeries(
            name, series.start, series.end, series.step, values, tags=series.tags, x_files_factor=series.xFilesFactor
        )
        results.append(result)
    return results


def _linear_fit(series):
    points = [(i, v) for i, v in enumerate(series) if v is not None]
    n = len(points)
    sum_i = sum(i for i, _ in points)
    sum_v = sum(v for _, v in points)
    sum_ii = sum(i * i for i, _ in points)
    sum_iv = sum(i * v for i, v in points)
    denominator = float(n * sum_ii - sum_i * sum_i)
    if denominator == 0:
        return None
    factor = (n * sum_iv - sum_i * sum_v) / denominator / series.step
    intercept = (sum_ii * sum_v - sum_iv * sum_i) / denominator - factor * series.start
    return factor, intercept


@series_function(
    "aggregateLine",
    group="Calculate",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("func", AGG_FUNC, default="average"),
        Param("keepStep", BOOLEAN, default=False),
    ],
)
def aggregateLine(request, seriesList, func="average", keepStep=False):
    """A constant line at the aggregate (average by default) of each series."""
    function = get_agg_func(func)
    results = []
    for series in seriesList:
        value = function(series)
        name = (
            "aggregateLine(%s, %g)" % (series.name, value)
            if value is not None
            else "aggregateLine(%s, None)" % series.name
        )
        if keepStep:
            line = series.copy(name=name, values=[value] * len(series))
        else:
            line = constantLine(request, value)[0]
            _rename(line, name)
        results.append(line)
    return results


@series_function("identity", group="Calculate", params=[Param("name", STRING, required=True)])
def identity(request, name):
    """A series whose value is its timestamp, every 60 seconds."""
    context = request.context
    # a comprehension, not list(): one C call making millions of ints would hold the GIL throughout
    times = [t for t in _generated_times(context, 60, f"identity({name!r})")]
    series = TimeSeries(name, context.start, context.end, 60, times, x_files_factor=context.x_files_factor)
    series.pathExpression = 'identity("%s")' % name
    return [series]
