"""Alias: functions that rename series (the legends Grafana shows)."""

from gateway.query.graphite.errors import RenderError
from gateway.query.graphite.functions.helpers import _compile, _substitute, aggregation_key, format_units
from gateway.query.graphite.functions.registry import NODE_OR_TAG, SERIES_LIST, STRING, Param, series_function
from gateway.query.graphite.functions.safe import VALID_AGG_FUNCS, get_agg_func, safe_last
from gateway.query.graphite.functions.special import substr


@series_function(
    "alias",
    group="Alias",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("newName", STRING, required=True),
    ],
)
def alias(request, seriesList, newName):
    """Rename every series."""
    for series in seriesList:
        series.name = newName
    return seriesList


@series_function(
    "aliasSub",
    group="Alias",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("search", STRING, required=True),
        Param("replace", STRING, required=True),
    ],
)
def aliasSub(request, seriesList, search, replace):
    """Rename with a regular-expression substitution (\\1 back-references)."""
    regex = _compile(search, capture=True)
    for series in seriesList:
        series.name = _substitute(regex, replace, series.name)
    return seriesList


@series_function(
    "aliasByNode",
    group="Alias",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("nodes", NODE_OR_TAG, required=True, multiple=True),
    ],
)
def aliasByNode(request, seriesList, *nodes):
    """Rename to the given nodes of the name (negative from the end) or tag values, joined by dots."""
    for series in seriesList:
        series.name = aggregation_key(series, nodes)
    return seriesList


@series_function(
    "aliasByTags",
    group="Alias",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("tags", NODE_OR_TAG, required=True, multiple=True),
    ],
)
def aliasByTags(request, seriesList, *tags):
    """aliasByNode with tag names (nodes also accepted)."""
    return aliasByNode(request, seriesList, *tags)


@series_function("aliasByMetric", group="Alias", params=[Param("seriesList", SERIES_LIST, required=True)])
def aliasByMetric(request, seriesList):
    """Rename to the last node of the metric path."""
    return substr(request, seriesList, -1, 0)


@series_function(
    "aliasQuery",
    group="Alias",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("search", STRING, required=True),
        Param("replace", STRING, required=True),
        Param("newName", STRING, required=True),
    ],
)
async def aliasQuery(request, seriesList, search, replace, newName):
    """Rename with the last value of another series found by a regex substitution of the name."""
    regex = _compile(search, capture=True)
    for series in seriesList:
        query = _substitute(regex, replace, series.name)
        found = await request.evaluate(query, request.context)
        if not found:
            raise RenderError("No series found with query: " + query)
        current = safe_last(found[0])
        if current is None:
            raise RenderError("Cannot get last value of series: " + found[0].name)
        try:
            series.name = newName % current
        except (TypeError, ValueError) as error:
            raise RenderError(
                f"aliasQuery(): newName {newName!r} needs one %-placeholder for the value: {error}"
            ) from None
    return seriesList


@series_function(
    "legendValue",
    group="Alias",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param(
            "valuesTypes",
            STRING,
            multiple=True,
            options=VALID_AGG_FUNCS + [name + "Series" for name in VALID_AGG_FUNCS] + ["si", "binary"],
            strict_options=False,
        ),
    ],
)
def legendValue(request, seriesList, *valueTypes):
    """Append aggregate values (last, avg, max, ...) to the names, optionally in si/binary units."""
    system = None
    if valueTypes and valueTypes[-1] in ("si", "binary"):
        system = valueTypes[-1]
        valueTypes = valueTypes[:-1]
    for value_type in valueTypes:
        try:
            function = get_agg_func(value_type)
        except RenderError:
            function = lambda values: "(?)"  # noqa: E731 - graphite-web shows unknown types as (?)
        for series in seriesList:
            value = function(series)
            if system is None:
                series.name += " (%s: %s)" % (value_type, value)
            else:
                formatted = (
                    value
                    if isinstance(value, str)
                    else (None if value is None else "%.2f%s" % format_units(value, system=system))
                )
                series.name = "%-20s%-5s%-10s" % (series.name, value_type, formatted)
    return seriesList
