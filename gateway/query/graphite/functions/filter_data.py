"""Filter Data: functions that null out values of a series (above/below a value or a percentile)."""

from gateway.query.graphite.functions.calculate import nPercentile
from gateway.query.graphite.functions.helpers import _rename
from gateway.query.graphite.functions.registry import N_FLOAT_PARAMS, series_function


def _remove_values(seriesList, label, n, drop):
    for series in seriesList:
        _rename(series, "%s(%s, %g)" % (label, series.name, n))
        for i, value in enumerate(series):
            if drop(value):
                series[i] = None
    return seriesList


@series_function("removeAboveValue", group="Filter Data", params=N_FLOAT_PARAMS)
def removeAboveValue(request, seriesList, n):
    """Set values above n to None."""
    return _remove_values(seriesList, "removeAboveValue", n, lambda v: v is not None and v > n)


@series_function("removeBelowValue", group="Filter Data", params=N_FLOAT_PARAMS)
def removeBelowValue(request, seriesList, n):
    """Set values below n to None."""
    return _remove_values(seriesList, "removeBelowValue", n, lambda v: v is None or v < n)


@series_function("removeAbovePercentile", group="Filter Data", params=N_FLOAT_PARAMS)
def removeAbovePercentile(request, seriesList, n):
    """Set values above the series' n-th percentile to None."""
    for series in seriesList:
        _rename(series, "removeAbovePercentile(%s, %g)" % (series.name, n))
        line = nPercentile(request, [series], n)
        if not line or not len(line[0]):
            continue
        # graphite-web's nPercentile tags a copy whose Tags object is shared with the original
        series.tags["nPercentile"] = n
        threshold = line[0][0]
        for i, value in enumerate(series):
            if value is not None and value > threshold:
                series[i] = None
    return seriesList


@series_function("removeBelowPercentile", group="Filter Data", params=N_FLOAT_PARAMS)
def removeBelowPercentile(request, seriesList, n):
    """Set values below the series' n-th percentile to None."""
    for series in seriesList:
        _rename(series, "removeBelowPercentile(%s, %g)" % (series.name, n))
        line = nPercentile(request, [series], n)
        if not line or not len(line[0]):
            continue
        # graphite-web's nPercentile tags a copy whose Tags object is shared with the original
        series.tags["nPercentile"] = n
        threshold = line[0][0]
        for i, value in enumerate(series):
            if value is None or value < threshold:
                series[i] = None
    return seriesList
