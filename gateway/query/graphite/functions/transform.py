"""Transform: functions that change each series' values or time range (scale, derivative, summarize, timeShift...)."""

import math
from datetime import datetime
from itertools import zip_longest

from gateway.query.graphite.errors import RenderError
from gateway.query.graphite.functions.helpers import (
    _floor_to_unit,
    _generated_times,
    _parse_date,
    _rename,
    _require_finite,
    _spend_points,
    bucket_seconds,
    xff,
)
from gateway.query.graphite.functions.registry import (
    AGG_FUNC,
    BOOLEAN,
    DATE,
    FLOAT,
    INT_OR_INF,
    INTEGER,
    INTERVAL,
    SERIES_LIST,
    STRING,
    Param,
    ParamType,
    _validate_string,
    interval_seconds,
    series_function,
)
from gateway.query.graphite.functions.safe import INF, get_agg_func, safe_max, safe_min, safe_mul, safe_pow
from gateway.query.graphite.series import TimeSeries
from gateway.query.planner import QueryTooLarge
from protocols.graphite.attime import DAYS, HOURS, MINUTES, MONTHS_UNIT, SECONDS, WEEKS, YEARS, unit_name

# timeStack() evaluates its series once per shift: more copies than this is no graph, only memory.
MAX_TIME_STACK = 1000


@series_function(
    "scale",
    group="Transform",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("factor", FLOAT, required=True),
    ],
)
def scale(request, seriesList, factor):
    """Multiply every value by a constant."""
    for series in seriesList:
        series.tags["scale"] = factor
        _rename(series, "scale(%s,%g)" % (series.name, float(factor)))
        for i, value in enumerate(series):
            series[i] = safe_mul(value, factor)
    return seriesList


@series_function(
    "scaleToSeconds",
    group="Transform",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("seconds", FLOAT, required=True),
    ],
)
def scaleToSeconds(request, seriesList, seconds):
    """Turn per-step values into per-``seconds`` values (value * seconds / step)."""
    _require_finite(seconds, "scaleToSeconds", "seconds")
    for series in seriesList:
        series.tags["scaleToSeconds"] = seconds
        _rename(series, "scaleToSeconds(%s,%d)" % (series.name, seconds))
        factor = seconds / series.step
        for i, value in enumerate(series):
            if value is not None:
                try:
                    series[i] = round(value * factor, 6)
                except OverflowError:
                    series[i] = (value // series.step) * seconds
    return seriesList


def _exp(value: float) -> float:
    try:
        return math.exp(value)
    except OverflowError:  # graphite-web fails here (its 500); e to a large power is +inf
        return INF


@series_function("exp", group="Transform", params=[Param("seriesList", SERIES_LIST, required=True)])
def exp(request, seriesList):
    """e raised to the power of each value."""
    for series in seriesList:
        series.tags["exp"] = "e"
        _rename(series, "exp(%s)" % series.name)
        for i, value in enumerate(series):
            series[i] = None if value is None else _exp(value)
    return seriesList


@series_function(
    "add",
    group="Transform",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("constant", FLOAT, required=True),
    ],
)
def add(request, seriesList, constant):
    """Add a constant to every value."""
    _require_finite(constant, "add", "constant")
    for series in seriesList:
        series.tags["add"] = constant
        _rename(series, "add(%s,%d)" % (series.name, constant))
        for i, value in enumerate(series):
            series[i] = None if value is None else value + constant
    return seriesList


@series_function("sigmoid", group="Transform", params=[Param("seriesList", SERIES_LIST, required=True)])
def sigmoid(request, seriesList):
    """1 / (1 + exp(-x)) of each value."""
    for series in seriesList:
        series.tags["sigmoid"] = "sigmoid"
        _rename(series, "sigmoid(%s)" % series.name)
        for i, value in enumerate(series):
            try:
                series[i] = 1 / (1 + math.exp(-value))
            except (TypeError, ValueError, ZeroDivisionError, OverflowError):
                series[i] = None
    return seriesList


@series_function("logit", group="Transform", params=[Param("seriesList", SERIES_LIST, required=True)])
def logit(request, seriesList):
    """log(x / (1 - x)) of each value."""
    for series in seriesList:
        series.tags["logit"] = "logit"
        _rename(series, "logit(%s)" % series.name)
        for i, value in enumerate(series):
            try:
                series[i] = math.log(value / (1 - value))
            except (TypeError, ValueError, ZeroDivisionError):
                series[i] = None
    return seriesList


@series_function(
    "pow",
    group="Transform",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("factor", FLOAT, required=True),
    ],
)
def power(request, seriesList, factor):
    """Raise every value to a constant power."""
    for series in seriesList:
        series.tags["pow"] = factor
        _rename(series, "pow(%s,%g)" % (series.name, float(factor)))
        for i, value in enumerate(series):
            series[i] = safe_pow(value, factor)
    return seriesList


@series_function("squareRoot", group="Transform", params=[Param("seriesList", SERIES_LIST, required=True)])
def squareRoot(request, seriesList):
    """Square root of every value (None for negative values)."""
    for series in seriesList:
        series.tags["squareRoot"] = 1
        _rename(series, "squareRoot(%s)" % series.name)
        for i, value in enumerate(series):
            series[i] = safe_pow(value, 0.5)
    return seriesList


@series_function("invert", group="Transform", params=[Param("seriesList", SERIES_LIST, required=True)])
def invert(request, seriesList):
    """1/x of every value (None for 0)."""
    for series in seriesList:
        series.tags["invert"] = 1
        _rename(series, "invert(%s)" % series.name)
        for i, value in enumerate(series):
            series[i] = safe_pow(value, -1)
    return seriesList


@series_function("absolute", group="Transform", params=[Param("seriesList", SERIES_LIST, required=True)])
def absolute(request, seriesList):
    """Absolute value of every value."""
    for series in seriesList:
        series.tags["absolute"] = 1
        _rename(series, "absolute(%s)" % series.name)
        for i, value in enumerate(series):
            series[i] = None if value is None else abs(value)
    return seriesList


@series_function(
    "offset",
    group="Transform",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("factor", FLOAT, required=True),
    ],
)
def offset(request, seriesList, factor):
    """Add a constant to every non-null value."""
    for series in seriesList:
        series.tags["offset"] = factor
        _rename(series, "offset(%s,%g)" % (series.name, float(factor)))
        for i, value in enumerate(series):
            if value is not None:
                series[i] = value + factor
    return seriesList


@series_function("offsetToZero", group="Transform", params=[Param("seriesList", SERIES_LIST, required=True)])
def offsetToZero(request, seriesList):
    """Subtract each series' minimum from its values."""
    for series in seriesList:
        minimum = safe_min(series)
        series.tags["offsetToZero"] = minimum
        _rename(series, "offsetToZero(%s)" % series.name)
        for i, value in enumerate(series):
            if value is not None:
                series[i] = value - minimum
    return seriesList


@series_function(
    "round",
    group="Transform",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("precision", INTEGER, default=0),
    ],
)
def round_function(request, seriesList, precision=None):
    """Round every value to ``precision`` decimal digits."""
    for series in seriesList:
        series.tags["round"] = precision or 0
        if precision is None:
            _rename(series, "round(%s)" % series.name)
        else:
            _rename(series, "round(%s,%g)" % (series.name, int(precision)))
        for i, value in enumerate(series):
            if value is not None:
                series[i] = round(value, precision or 0)
    return seriesList


@series_function("derivative", group="Transform", params=[Param("seriesList", SERIES_LIST, required=True)])
def derivative(request, seriesList):
    """Difference between consecutive values (None next to a None)."""
    results = []
    for series in seriesList:
        values = []
        previous = None
        for value in series:
            values.append(None if previous is None or value is None else value - previous)
            previous = value
        series.tags["derivative"] = 1
        results.append(series.copy(name="derivative(%s)" % series.name, values=values))
    return results


def _non_negative_delta(value, previous, max_value, min_value):
    """(delta, new previous) for counters that may wrap at maxValue or reset to minValue."""
    if max_value is not None and value is not None and value > max_value:
        return None, None
    if min_value is not None and value is not None and value < min_value:
        return None, None
    if previous is None or value is None:
        return None, value
    if value >= previous:
        return value - previous, value
    if max_value is not None:
        return max_value + 1 + value - previous - (min_value or 0), value
    if min_value is not None:
        return value - min_value, value
    return None, value


@series_function(
    "nonNegativeDerivative",
    group="Transform",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("maxValue", FLOAT),
        Param("minValue", FLOAT),
    ],
)
def nonNegativeDerivative(request, seriesList, maxValue=None, minValue=None):
    """derivative that ignores decreases, or computes them as counter wraps with maxValue/minValue."""
    results = []
    for series in seriesList:
        values = []
        previous = None
        for value in series:
            delta, previous = _non_negative_delta(value, previous, maxValue, minValue)
            values.append(delta)
        series.tags["nonNegativeDerivative"] = 1
        results.append(series.copy(name="nonNegativeDerivative(%s)" % series.name, values=values))
    return results


@series_function(
    "perSecond",
    group="Transform",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("maxValue", FLOAT),
        Param("minValue", FLOAT),
    ],
)
def perSecond(request, seriesList, maxValue=None, minValue=None):
    """nonNegativeDerivative divided by the step: a per-second rate of a counter."""
    results = []
    for series in seriesList:
        values = []
        previous = None
        for value in series:
            delta, previous = _non_negative_delta(value, previous, maxValue, minValue)
            if delta is None:
                values.append(None)
            else:
                try:
                    values.append(round(delta / series.step, 6))
                except OverflowError:
                    values.append(delta // series.step)
        series.tags["perSecond"] = 1
        results.append(series.copy(name="perSecond(%s)" % series.name, values=values))
    return results


@series_function(
    "delay",
    group="Transform",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("steps", INTEGER, required=True),
    ],
)
def delay(request, seriesList, steps):
    """Shift values later by ``steps`` points (earlier if negative), padding with None."""
    results = []
    for series in seriesList:
        raw = list(list.__iter__(series))
        if steps < 0:
            values = raw[-steps:] + [None] * min(-steps, len(raw))
        else:
            values = [None] * min(steps, len(raw)) + raw[:-steps]
        series.tags["delay"] = steps
        results.append(series.copy(name="delay(%s,%d)" % (series.name, steps), values=values))
    return results


@series_function("integral", group="Transform", params=[Param("seriesList", SERIES_LIST, required=True)])
def integral(request, seriesList):
    """Running total of the values (None points stay None)."""
    results = []
    for series in seriesList:
        values = []
        current = 0.0
        for value in series:
            if value is None:
                values.append(None)
            else:
                current += value
                values.append(current)
        series.tags["integral"] = 1
        results.append(series.copy(name="integral(%s)" % series.name, values=values))
    return results


@series_function(
    "integralByInterval",
    group="Transform",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("intervalUnit", STRING, required=True),
    ],
)
def integralByInterval(request, seriesList, intervalUnit):
    """Running total that restarts every interval, counted from ``from``."""
    duration = abs(interval_seconds(intervalUnit))
    if not duration:
        raise RenderError(f"interval {intervalUnit!r} must not be zero")
    start_time = request.context.start
    results = []
    for series in seriesList:
        values = []
        current_time = series.start
        current = 0.0
        for value in series:
            if (current_time - start_time) // duration != (current_time - start_time - series.step) // duration:
                current = 0.0
            if value is not None:
                current += value
            values.append(current)
            current_time += series.step
        series.tags["integralByInterval"] = intervalUnit
        results.append(series.copy(name="integralByInterval(%s,'%s')" % (series.name, intervalUnit), values=values))
    return results


@series_function(
    "keepLastValue",
    group="Transform",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("limit", INT_OR_INF, default=INF),
    ],
)
def keepLastValue(request, seriesList, limit=INF):
    """Fill runs of up to ``limit`` None values with the last value seen."""
    for series in seriesList:
        _rename(series, "keepLastValue(%s)" % series.name)
        consecutive_nones = 0
        last_value = None
        for i, value in enumerate(series):
            if value is None:
                consecutive_nones += 1
                continue
            if 0 < consecutive_nones <= limit and last_value is not None:
                for index in range(i - consecutive_nones, i):
                    series[index] = last_value
            consecutive_nones = 0
            last_value = value
        if 0 < consecutive_nones <= limit and last_value is not None:
            for index in range(len(series) - consecutive_nones, len(series)):
                series[index] = last_value
    return seriesList


@series_function(
    "interpolate",
    group="Transform",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("limit", INT_OR_INF, default=INF),
    ],
)
def interpolate(request, seriesList, limit=INF):
    """Fill gaps of up to ``limit`` None values linearly between their neighbours."""
    for series in seriesList:
        _rename(series, "interpolate(%s)" % series.name)
        consecutive_nones = 0
        for i, value in enumerate(series):
            series[i] = value
            if i == 0:
                continue
            if value is None:
                consecutive_nones += 1
            elif consecutive_nones == 0:
                continue
            elif series[i - consecutive_nones - 1] is None:
                consecutive_nones = 0
            else:
                before = series[i - consecutive_nones - 1]
                if 0 < consecutive_nones <= limit:
                    for index in range(i - consecutive_nones, i):
                        steps = index - (i - consecutive_nones - 1)
                        series[index] = before + steps * (value - before) / (consecutive_nones + 1)
                consecutive_nones = 0
    return seriesList


@series_function(
    "transformNull",
    group="Transform",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("default", FLOAT, default=0),
        Param("referenceSeries", SERIES_LIST),
    ],
)
def transformNull(request, seriesList, default=0, referenceSeries=None):
    """Replace None with ``default`` (only where a referenceSeries has a value, if given)."""
    defaults = None
    if referenceSeries:
        defaults = [default if any(v is not None for v in row) else None for row in zip_longest(*referenceSeries)]
    for series in seriesList:
        series.tags["transformNull"] = default
        if referenceSeries:
            series.tags["referenceSeries"] = 1
            _rename(series, "transformNull(%s,%g,referenceSeries)" % (series.name, default))
        else:
            _rename(series, "transformNull(%s,%g)" % (series.name, default))
        if defaults:
            values = [d if v is None else v for v, d in zip_longest(series, defaults)]
        else:
            values = [default if v is None else v for v in series]
        series.extend(values)
        del series[: len(values)]
    return seriesList


@series_function("isNonNull", group="Transform", params=[Param("seriesList", SERIES_LIST, required=True)])
def isNonNull(request, seriesList):
    """1 where there is a value, 0 where there is none."""
    for series in seriesList:
        series.tags["isNonNull"] = 1
        _rename(series, "isNonNull(%s)" % series.name)
        values = [0 if v is None else 1 for v in series]
        series.extend(values)
        del series[: len(values)]
    return seriesList


@series_function(
    "log",
    group="Transform",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("base", INTEGER, default=10),
    ],
)
def logarithm(request, seriesList, base=10):
    """Logarithm of every value (None for values <= 0)."""
    if base <= 0 or base == 1:
        raise RenderError(f"log(): base {base} must be positive and not 1")
    results = []
    for series in seriesList:
        values = [None if v is None or v <= 0 else math.log(v, base) for v in series]
        series.tags["log"] = base
        results.append(series.copy(name="log(%s, %s)" % (series.name, base), values=values))
    return results


@series_function("minMax", group="Transform", params=[Param("seriesList", SERIES_LIST, required=True)])
def minMax(request, seriesList):
    """Scale each series to 0..1: (value - min) / (max - min)."""
    for series in seriesList:
        _rename(series, "minMax(%s)" % series.name)
        minimum = safe_min(series, default=0.0)
        maximum = safe_max(series, default=0.0)
        for i, value in enumerate(series):
            if series[i] is not None:
                try:
                    series[i] = float(value - minimum) / (maximum - minimum)
                except ZeroDivisionError:
                    series[i] = 0.0
    return seriesList


def _spend_buckets(request, spans: list[int], interval: int, what: str) -> None:
    """Spend the buckets of ``interval`` seconds that series spanning ``spans`` seconds will get."""
    _spend_points(request.context, sum(-(-span // interval) for span in spans), what)


def _summarize_values(series, func, interval, new_start, new_end):
    """Bucket values into [t, t+interval) from new_start; a bucket also takes the point covering t."""
    function = get_agg_func(func)
    timestamps = list(range(int(series.start), int(series.end), int(series.step)))
    datapoints = list(series)
    interval_points = interval / series.step
    i = 0
    count = min(len(timestamps), len(datapoints))
    values = []
    bucket_start = new_start
    while bucket_start < new_end:
        first = i
        non_null = 0
        while i < count and timestamps[i] < bucket_start + interval:
            if timestamps[i] <= bucket_start:
                first = i
            if timestamps[i] >= bucket_start and datapoints[i] is not None:
                non_null += 1
            i += 1
        if xff(non_null, interval_points, series.xFilesFactor):
            values.append(function(datapoints[first:i]))
        else:
            values.append(None)
        bucket_start += interval
    return values, bucket_start


@series_function(
    "summarize",
    group="Transform",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("intervalString", INTERVAL, required=True, suggestions=["10min", "1h", "1d"]),
        Param("func", AGG_FUNC, default="sum"),
        Param("alignToFrom", BOOLEAN, default=False),
    ],
)
def summarize(request, seriesList, intervalString, func="sum", alignToFrom=False):
    """Aggregate values into fixed buckets, aligned to the interval (or to the series start)."""
    interval = bucket_seconds(intervalString)
    bounds = []
    for series in seriesList:
        if alignToFrom:
            bounds.append((series.start, series.end))
        else:
            bounds.append((series.start - (series.start % interval), series.end - (series.end % interval) + interval))
    _spend_buckets(request, [end - start for start, end in bounds], interval, f"summarize(..., {intervalString!r})")
    results = []
    for series, (new_start, new_end) in zip(seriesList, bounds):
        values, aligned_end = _summarize_values(series, func, interval, new_start, new_end)
        if alignToFrom:
            new_end = aligned_end
        series.tags["summarize"] = intervalString
        series.tags["summarizeFunction"] = func
        name = 'summarize(%s, "%s", "%s"%s)' % (series.name, intervalString, func, ", true" if alignToFrom else "")
        results.append(series.copy(name=name, start=new_start, end=new_end, step=interval, values=values))
    return results


@series_function(
    "smartSummarize",
    group="Transform",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("intervalString", INTERVAL, required=True, suggestions=["10min", "1h", "1d"]),
        Param("func", AGG_FUNC, default="sum"),
        Param(
            "alignTo",
            ParamType("string"),
            options=[None, YEARS, MONTHS_UNIT, WEEKS, DAYS, HOURS, MINUTES, SECONDS, True, False],
            strict_options=False,
        ),
    ],
)
async def smartSummarize(request, seriesList, intervalString, func="sum", alignTo=None):
    """summarize whose buckets start at ``from``, optionally first moved back to a unit boundary."""
    if alignTo is not None and not isinstance(alignTo, bool):
        try:
            unit = unit_name(_validate_string(alignTo))
        except ValueError:
            raise RenderError(f"smartSummarize(): alignTo {alignTo!r} is not a time unit") from None
        iso_weekday = int(alignTo[-1]) if unit == WEEKS and not alignTo[-1].isalpha() else 1
        start = _floor_to_unit(request.context.start, request.context.tz, unit, iso_weekday)
        seriesList = await request.evaluate_first_argument(start=start)
    interval = bucket_seconds(intervalString)
    _spend_buckets(
        request,
        [series.end - series.start for series in seriesList],
        interval,
        f"smartSummarize(..., {intervalString!r})",
    )
    return await request.compute(_smart_summarize, seriesList, intervalString, interval, func)


def _smart_summarize(seriesList, intervalString, interval, func):
    results = []
    for series in seriesList:
        values, aligned_end = _summarize_values(series, func, interval, series.start, series.end)
        series.tags["smartSummarize"] = intervalString
        series.tags["smartSummarizeFunction"] = func
        name = 'smartSummarize(%s, "%s", "%s")' % (series.name, intervalString, func)
        results.append(series.copy(name=name, end=aligned_end, step=interval, values=values))
    return results


@series_function(
    "hitcount",
    group="Transform",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("intervalString", INTERVAL, required=True, suggestions=["10min", "1h", "1d"]),
        Param("alignToInterval", BOOLEAN, default=False),
    ],
)
async def hitcount(request, seriesList, intervalString, alignToInterval=False):
    """Hits per interval from per-second rates, splitting points that straddle bucket boundaries."""
    interval = bucket_seconds(intervalString)
    if alignToInterval:
        unit = DAYS if interval >= 86400 else HOURS if interval >= 3600 else MINUTES if interval >= 60 else None
        start = request.context.start
        if unit is not None:
            start = _floor_to_unit(start, request.context.tz, unit)
        seriesList = await request.evaluate_first_argument(start=start)
        for series in seriesList:
            count = int((series.end - series.start) // interval)
            series.end = series.start + count * interval + interval
    _spend_buckets(
        request, [series.end - series.start for series in seriesList], interval, f"hitcount(..., {intervalString!r})"
    )
    return await request.compute(_hitcount, seriesList, intervalString, interval, alignToInterval)


def _hitcount(seriesList, intervalString, interval, alignToInterval):
    results = []
    for series in seriesList:
        step = int(series.step)
        bucket_count = int(math.ceil(float(series.end - series.start) / interval))
        # running sums, None for a bucket without hits (not a list a bucket: millions of lists
        # would keep the garbage collector, and so every thread, busy)
        values = [None] * bucket_count
        new_start = int(series.end - bucket_count * interval)

        def add(index, hits):
            values[index] = (0 if values[index] is None else values[index]) + hits

        for i, value in enumerate(series):
            if value is None:
                continue
            start_time = int(series.start + i * step)
            start_bucket, start_mod = divmod(start_time - new_start, interval)
            end_bucket, end_mod = divmod(start_time + step - new_start, interval)
            if end_bucket >= bucket_count:
                end_bucket = bucket_count - 1
                end_mod = interval
            if start_bucket == end_bucket:
                if start_bucket >= 0:
                    add(start_bucket, value * (end_mod - start_mod))
            else:
                if start_bucket >= 0:
                    add(start_bucket, value * (interval - start_mod))
                for j in range(start_bucket + 1, end_bucket):
                    add(j, value * interval)
                if end_mod > 0:
                    add(end_bucket, value * end_mod)
        series.tags["hitcount"] = intervalString
        name = 'hitcount(%s, "%s"%s)' % (series.name, intervalString, ", true" if alignToInterval else "")
        results.append(series.copy(name=name, start=new_start, step=interval, values=values))
    return results


def _negative_by_default(interval: str) -> str:
    return "-" + interval if interval[:1].isdigit() else interval


@series_function(
    "timeShift",
    group="Transform",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("timeShift", INTERVAL, required=True, suggestions=["1h", "6h", "12h", "1d", "2d", "7d", "14d", "30d"]),
        Param("resetEnd", BOOLEAN, default=True),
        Param("alignDst", BOOLEAN, default=False),
    ],
)
async def timeShift(request, seriesList, timeShift, resetEnd=True, alignDst=False):
    """The series as they were ``timeShift`` ago (``-1d``; no sign means back), drawn over now."""
    timeShift = _negative_by_default(timeShift)
    delta = interval_seconds(timeShift)
    start, end = request.context.start + delta, request.context.end + delta
    if alignDst:
        start, end = _align_dst(request.context, start, end)
    if not seriesList:
        return []
    reference = seriesList[0]
    results = []
    for shifted in await request.evaluate_first_argument(start=start, end=end):
        shifted.tags["timeShift"] = timeShift
        shifted.name = 'timeShift(%s, "%s")' % (shifted.name, timeShift)
        if resetEnd:
            shifted.end = reference.end
        else:
            shifted.end = shifted.end - shifted.start + reference.start
        shifted.start = reference.start
        results.append(shifted)
    return results


def _align_dst(context, start: int, end: int) -> tuple[int, int]:
    """Move a shifted range by an hour when it and the request are on different sides of DST."""

    def in_dst(timestamp):
        try:
            return bool(datetime.fromtimestamp(timestamp, context.tz).dst())
        except (ValueError, OverflowError, OSError):
            raise RenderError("timeShift() moves the time range out of the years 1 to 9999") from None

    request_dst = (in_dst(context.start), in_dst(context.end))
    shifted_dst = (in_dst(start), in_dst(end))
    if all(request_dst) and not any(shifted_dst):
        return start + 3600, end + 3600
    if not any(request_dst) and all(shifted_dst):
        return start - 3600, end - 3600
    return start, end


@series_function(
    "timeStack",
    group="Transform",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("timeShiftUnit", INTERVAL, default="1d", suggestions=["1h", "6h", "12h", "1d", "2d", "7d", "14d", "30d"]),
        Param("timeShiftStart", INTEGER, default=0),
        Param("timeShiftEnd", INTEGER, default=7),
    ],
)
async def timeStack(request, seriesList, timeShiftUnit="1d", timeShiftStart=0, timeShiftEnd=7):
    """The series shifted by timeShiftStart..timeShiftEnd-1 units, all drawn over the current range."""
    timeShiftUnit = _negative_by_default(timeShiftUnit)
    delta = interval_seconds(timeShiftUnit)
    if not seriesList:
        return []
    if timeShiftEnd - timeShiftStart > MAX_TIME_STACK:
        raise QueryTooLarge(
            f"timeStack() asks for {timeShiftEnd - timeShiftStart} shifted copies, over {MAX_TIME_STACK}"
        )
    reference = seriesList[0]
    results = []
    for shift in range(int(timeShiftStart), int(timeShiftEnd)):
        context = request.context
        for shifted in await request.evaluate_first_argument(
            start=context.start + delta * shift, end=context.end + delta * shift
        ):
            shifted.tags["timeShiftUnit"] = timeShiftUnit
            shifted.tags["timeShift"] = shift
            _rename(shifted, "timeShift(%s, %s, %s)" % (shifted.name, timeShiftUnit, shift))
            shifted.start = reference.start
            shifted.end = reference.end
            results.append(shifted)
    return results


@series_function(
    "timeSlice",
    group="Transform",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("startSliceAt", DATE, required=True),
        Param("endSliceAt", DATE, default="now"),
    ],
)
def timeSlice(request, seriesList, startSliceAt, endSliceAt="now"):
    """Keep only the values between two times (inclusive); others become None."""
    context = request.context
    start = _parse_date(startSliceAt, context)
    end = _parse_date(endSliceAt, context)
    for series in seriesList:
        series.tags["timeSliceStart"] = start
        series.tags["timeSliceEnd"] = end
        series.name = "timeSlice(%s, %s, %s)" % (series.name, start, end)
        current = context.start
        for i, value in enumerate(series):
            if value is None or current < start or current > end:
                series[i] = None
            current += series.step
    return seriesList


@series_function(
    "time",
    "timeFunction",
    group="Transform",
    params=[
        Param("name", STRING, required=True),
        Param("step", INTEGER, default=60),
    ],
)
def timeFunction(request, name, step=60):
    """A series whose value is its own timestamp."""
    context = request.context
    values = [float(t) for t in _generated_times(context, step, f"time({name!r}, {step})")]
    return [TimeSeries(name, context.start, context.end, step, values, x_files_factor=context.x_files_factor)]


@series_function(
    "sin",
    "sinFunction",
    group="Transform",
    params=[
        Param("name", STRING, required=True),
        Param("amplitude", INTEGER, default=1),
        Param("step", INTEGER, default=60),
    ],
)
def sinFunction(request, name, amplitude=1, step=60):
    """A sine wave of the timestamp, times amplitude."""
    context = request.context
    values = [
        math.sin(t) * amplitude for t in _generated_times(context, step, f"sinFunction({name!r}, {amplitude}, {step})")
    ]
    return [TimeSeries(name, context.start, context.end, step, values, x_files_factor=context.x_files_factor)]
