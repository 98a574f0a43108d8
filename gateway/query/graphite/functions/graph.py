"""Graph: styling recorded in ``series.options`` for a renderer (values pass through), and drawn lines."""

from gateway.query.graphite.errors import RenderError
from gateway.query.graphite.functions.helpers import _parse_date
from gateway.query.graphite.functions.registry import DATE, FLOAT, INTEGER, SERIES_LIST, STRING, Param, series_function
from gateway.query.graphite.functions.special import constantLine
from gateway.query.graphite.series import TimeSeries


@series_function(
    "color",
    group="Graph",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("theColor", STRING, required=True),
    ],
)
def color(request, seriesList, theColor):
    """Set the line colour."""
    for series in seriesList:
        series.color = theColor
        series.options["color"] = theColor
    return seriesList


@series_function(
    "alpha",
    group="Graph",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("alpha", FLOAT, required=True),
    ],
)
def alpha(request, seriesList, alpha):
    """Set the transparency (0..1)."""
    for series in seriesList:
        series.options["alpha"] = alpha
    return seriesList


@series_function(
    "lineWidth",
    group="Graph",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("width", FLOAT, required=True),
    ],
)
def lineWidth(request, seriesList, width):
    """Set the line width."""
    for series in seriesList:
        series.options["lineWidth"] = width
    return seriesList


@series_function(
    "dashed",
    group="Graph",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("dashLength", INTEGER, default=5),
    ],
)
def dashed(request, seriesList, dashLength=5):
    """Draw with a dashed line."""
    for series in seriesList:
        series.tags["dashed"] = dashLength
        series.name = "dashed(%s, %g)" % (series.name, dashLength)
        series.options["dashed"] = dashLength
    return seriesList


@series_function("secondYAxis", group="Graph", params=[Param("seriesList", SERIES_LIST, required=True)])
def secondYAxis(request, seriesList):
    """Draw against the second Y axis."""
    for series in seriesList:
        series.options["secondYAxis"] = True
        series.tags["secondYAxis"] = 1
        series.name = "secondYAxis(%s)" % series.name
    return seriesList


@series_function("drawAsInfinite", group="Graph", params=[Param("seriesList", SERIES_LIST, required=True)])
def drawAsInfinite(request, seriesList):
    """Draw non-zero values as vertical lines."""
    for series in seriesList:
        series.options["drawAsInfinite"] = True
        series.tags["drawAsInfinite"] = 1
        series.name = "drawAsInfinite(%s)" % series.name
    return seriesList


@series_function(
    "stacked",
    group="Graph",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("stack", STRING),
    ],
)
def stacked(request, seriesList, stack="__DEFAULT__"):
    """Stack the series on each other (running sum across series), per named stack."""
    stack = stack or "__DEFAULT__"
    totals = request.context.stacks.setdefault(stack, [])
    results = []
    for series in seriesList:
        values = []
        for i in range(len(series)):
            if len(totals) <= i:
                totals.append(0)
            if series[i] is not None:
                totals[i] += series[i]
                values.append(totals[i])
            else:
                values.append(None)
        if stack == "__DEFAULT__":
            series.tags["stacked"] = stack
            name = "stacked(%s)" % series.name
        else:
            name = series.name
        result = series.copy(name=name, values=values)
        result.options["stacked"] = True
        results.append(result)
    return results


@series_function("areaBetween", group="Graph", params=[Param("seriesList", SERIES_LIST, required=True)])
def areaBetween(request, seriesList):
    """Fill the area between exactly two series."""
    if len(seriesList) != 2:
        raise RenderError("areaBetween series argument must reference *exactly* 2 series")
    lower, upper = seriesList
    lower.options["stacked"] = True
    lower.options["invisible"] = True
    upper.options["stacked"] = True
    upper.tags["areaBetween"] = 1
    lower.tags = upper.tags
    lower.name = upper.name = "areaBetween(%s)" % upper.pathExpression
    return seriesList


@series_function(
    "threshold",
    group="Graph",
    params=[
        Param("value", FLOAT, required=True),
        Param("label", STRING),
        Param("color", STRING),
    ],
)
def threshold(request, value, label=None, color=None):
    """A constant line, optionally labelled and coloured."""
    series = constantLine(request, value)[0]
    if label:
        series.name = label
    if color:
        series.color = color
        series.options["color"] = color
    return [series]


@series_function(
    "verticalLine",
    group="Graph",
    params=[
        Param("ts", DATE, required=True),
        Param("label", STRING),
        Param("color", STRING),
    ],
)
def verticalLine(request, ts, label=None, color=None):
    """A vertical line at a time inside the requested range."""
    context = request.context
    timestamp = _parse_date(ts, context)
    if timestamp < context.start:
        raise RenderError("verticalLine(): timestamp %s exists before start of range" % timestamp)
    if timestamp > context.end:
        raise RenderError("verticalLine(): timestamp %s exists after end of range" % timestamp)
    # without a label graphite-web answers a series named None (tags {"name": "None"})
    series = TimeSeries(
        label,
        timestamp,
        timestamp,
        1,
        [1.0, 1.0],
        tags=None if label else {"name": label},
        x_files_factor=context.x_files_factor,
    )
    series.options["drawAsInfinite"] = True
    if color:
        series.color = color
        series.options["color"] = color
    return [series]
