"""Sorting: functions that order the series list."""

import re

from gateway.query.graphite.functions.registry import AGG_FUNC, BOOLEAN, SERIES_LIST, Param, series_function
from gateway.query.graphite.functions.safe import get_agg_func, none_last_key, safe_max, safe_min


@series_function(
    "sortBy",
    group="Sorting",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("func", AGG_FUNC, default="average"),
        Param("reverse", BOOLEAN, default=False),
    ],
)
def sortBy(request, seriesList, func="average", reverse=False):
    """Sort by an aggregate of each series (None first)."""
    seriesList.sort(key=none_last_key(get_agg_func(func)), reverse=reverse)
    return seriesList


@series_function(
    "sortByName",
    group="Sorting",
    params=[
        Param("seriesList", SERIES_LIST, required=True),
        Param("natural", BOOLEAN, default=False),
        Param("reverse", BOOLEAN, default=False),
    ],
)
def sortByName(request, seriesList, natural=False, reverse=False):
    """Sort by name, optionally naturally (server2 before server10)."""

    def natural_key(series):
        # graphite-web's "{0:010}".format(int(digits)), on the text: no int() of thousands of digits
        return re.sub(r"\d+", lambda m: (m.group(0).lstrip("0") or "0").rjust(10, "0"), series.name)

    seriesList.sort(key=natural_key if natural else (lambda s: s.name), reverse=reverse)
    return seriesList


@series_function("sortByTotal", group="Sorting", params=[Param("seriesList", SERIES_LIST, required=True)])
def sortByTotal(request, seriesList):
    """Sort by sum of values, largest first."""
    return sortBy(request, seriesList, "sum", reverse=True)


@series_function("sortByMaxima", group="Sorting", params=[Param("seriesList", SERIES_LIST, required=True)])
def sortByMaxima(request, seriesList):
    """Sort by maximum value, largest first."""
    seriesList.sort(key=none_last_key(safe_max), reverse=True)
    return seriesList


@series_function("sortByMinima", group="Sorting", params=[Param("seriesList", SERIES_LIST, required=True)])
def sortByMinima(request, seriesList):
    """Sort by minimum value, keeping only series whose maximum is above 0."""
    kept = [series for series in seriesList if safe_max(series, default=0) > 0]
    kept.sort(key=none_last_key(safe_min))
    return kept
