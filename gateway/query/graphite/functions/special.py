"""Special: constant and generated series, consolidation, xFilesFactor, substr, fallback, seriesByTag."""

import math
import random
import re

from gateway.query.graphite.errors import RenderError
from gateway.query.graphite.functions.helpers import _generated_times, _rename, format_units
from gateway.query.graphite.functions.registry import FLOAT, INTEGER, NODE, SERIES_LIST, STRING, Param, series_function
from gateway.query.graphite.functions.safe import NAN, safe_last, safe_max, safe_min
from gateway.query.graphite.series import CONSOLIDATION_FUNCTIONS, TimeSeries


@series_function("constantLine", group="Special", params=[Param("value", FLOAT, required=True)])
def constantLine(request, value):
    """A horizontal line: three points spanning the requested range."""
    context = request.context
    step = int((context.end - context.start) / 2.0)
    series = TimeSeries(
        str(value), context.start, context.end, step, [value, value, value], x_files_factor=context.x_files_factor
    )
    series.pathExpression = "constantLine(%s)" % value
    return [series]


@series_function(
    "consolidateBy",
    group="Special",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("consolidationFunc", STRING, required=True, options=list(CONSOLIDATION_FUNCTIONS)),
    ],
)
def consolidateBy(request, seriesList, consolidationFunc):
    """Choose how points are merged when consolidating (maxDataPoints, normalize)."""
    for series in seriesList:
        series.consolidationFunc = consolidationFunc
        series.tags["consolidateBy"] = consolidationFunc
        _rename(series, 'consolidateBy(%s,"%s")' % (series.name, consolidationFunc))
    return seriesList


@series_function("cumulative", group="Special", params=[Param("seriesList", SERIES_LIST, required=True)])
def cumulative(request, seriesList):
    """consolidateBy(seriesList, 'sum')."""
    return consolidateBy(request, seriesList, "sum")


@series_function(
    "setXFilesFactor",
    "xFilesFactor",
    group="Special",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("xFilesFactor", FLOAT, required=True),
    ],
)
def setXFilesFactor(request, seriesList, xFilesFactor):
    """Set the fraction of non-null values consolidation needs, for these series and the rest of the request."""
    request.context.x_files_factor = xFilesFactor
    for series in seriesList:
        series.xFilesFactor = xFilesFactor
        series.tags["xFilesFactor"] = xFilesFactor
    return seriesList


@series_function("changed", group="Special", params=[Param("seriesList", SERIES_LIST, required=True)])
def changed(request, seriesList):
    """1 where the value differs from the previous non-null one, else 0."""
    for series in seriesList:
        _rename(series, "changed(%s)" % series.name)
        previous = None
        for i, value in enumerate(series):
            if previous is None:
                previous = value
                series[i] = 0
            elif value is not None and previous != value:
                series[i] = 1
                previous = value
            else:
                series[i] = 0
    return seriesList


@series_function(
    "substr",
    group="Special",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("start", NODE, default=0),
        Param("stop", NODE, default=0),
    ],
)
def substr(request, seriesList, start=0, stop=0):
    """Rename to a slice of the dotted nodes of the innermost path in the name."""
    for series in seriesList:
        left = series.name.rfind("(") + 1
        right = series.name.find(")")
        if right < 0:
            right = len(series.name) + 1
        nodes = series.name[left:right].split(".")
        name = ".".join(nodes[int(start) :] if int(stop) == 0 else nodes[int(start) : int(stop)])
        series.name = re.sub(",.*$", "", name)
    return seriesList


@series_function(
    "fallbackSeries",
    group="Special",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("fallback", SERIES_LIST, required=True),
    ],
)
def fallbackSeries(request, seriesList, fallback):
    """The series list, or the fallback when it is empty."""
    return seriesList if seriesList else fallback


@series_function(
    "cactiStyle",
    group="Special",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("system", STRING, options=["si", "binary"]),
        Param("units", STRING),
    ],
)
def cactiStyle(request, seriesList, system=None, units=None):
    """Append aligned Current/Max/Min columns to the names."""
    if not seriesList:
        return seriesList

    def fmt(value):
        if system:
            scaled, prefix = format_units(value, system=system, units=units)
            return "%.2f %s" % (scaled, prefix) if units else "%.2f%s" % (scaled, prefix)
        return "%.2f %s" % (value, units) if units else "%.2f" % value

    def width(value):
        """graphite-web's column width, from the value's integer part (an infinity has none)."""
        value = value or 3
        return len(fmt(int(value) if math.isfinite(value) else value))

    name_width = max([0] + [len(series.name) for series in seriesList])
    last_width = max([0] + [width(safe_last(s)) for s in seriesList]) + 3
    max_width = max([0] + [width(safe_max(s)) for s in seriesList]) + 3
    min_width = max([0] + [width(safe_min(s)) for s in seriesList]) + 3
    for series in seriesList:
        last, maximum, minimum = safe_last(series), safe_max(series), safe_min(series)
        last = NAN if last is None else fmt(float(last))
        maximum = NAN if maximum is None else fmt(float(maximum))
        minimum = NAN if minimum is None else fmt(float(minimum))
        series.name = "%*s Current:%*s Max:%*s Min:%*s " % (
            -name_width,
            series.name,
            -last_width,
            last,
            -max_width,
            maximum,
            -min_width,
            minimum,
        )
    return seriesList


@series_function(
    "randomWalk",
    "randomWalkFunction",
    group="Special",
    params=[
        Param("name", STRING, required=True),
        Param("step", INTEGER, default=60),
    ],
)
def randomWalkFunction(request, name, step=60):
    """A random walk from 0, for testing."""
    context = request.context
    values = []
    current = 0
    for _ in _generated_times(context, step, f"randomWalk({name!r}, {step})"):
        values.append(current)
        current += random.random() - 0.5
    return [TimeSeries(name, context.start, context.end, step, values, x_files_factor=context.x_files_factor)]


@series_function(
    "seriesByTag",
    group="Special",
    params=[
        Param("tagExpressions", STRING, required=True, multiple=True),
    ],
)
def seriesByTag(request, *tagExpressions):
    """Series matching all tag expressions (tag=v, tag!=v, tag=~regex, tag!=~regex); the evaluator fetches them."""
    raise RenderError("seriesByTag is evaluated by the fetcher")
