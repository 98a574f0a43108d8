"""Helpers shared by the function groups: step normalization, xFilesFactor, node and tag keys,
percentiles, intervals and dates, renaming, regexes."""

import math
from datetime import datetime, timedelta
from functools import reduce

from gateway.query.graphite.errors import EmptyResult, RenderError
from gateway.query.graphite.functions.registry import interval_seconds
from protocols.graphite.attime import DAYS, HOURS, MINUTES, MONTHS_UNIT, WEEKS, YEARS, parse_at_time
from protocols.graphite.target import first_path_expression
from protocols.linear_regex import BadPattern, compile_regex


def normalize(series_lists):
    """Bring series to a common step (lcm of steps) by consolidation; graphite-web's normalize."""
    series_list = [series for series_list in series_lists for series in series_list]
    if not series_list:
        raise EmptyResult()
    step = reduce(math.lcm, [series.step for series in series_list])
    for series in series_list:
        series.consolidate(step // series.step)
    start = min(series.start for series in series_list)
    end = max(series.end for series in series_list)
    end -= (end - start) % step
    return series_list, start, end, step


def xff(non_null: int, total: int, x_files_factor: float) -> bool:
    """Whether enough values are non-null (graphite-web's xFilesFactor test)."""
    if not non_null or not total:
        return False
    return non_null / total >= x_files_factor


def xff_values(values, x_files_factor: float) -> bool:
    if not values:
        return False
    return xff(len([v for v in values if v is not None]), len(values), x_files_factor)


def format_path_expressions(series_list) -> str:
    expressions = []
    for series in series_list:
        if series.pathExpression not in expressions:
            expressions.append(series.pathExpression)
    return ",".join(map(str, expressions))  # verticalLine() without a label has None


def node_or_tag(series, n, path_expression=None) -> str:
    """Node ``n`` of the name (negative counts from the end), or the value of tag ``n``."""
    if isinstance(n, int) and not isinstance(n, bool):
        nodes = (path_expression or series.name).split(";", 2)[0].split(".")
        if -len(nodes) <= n < len(nodes):
            return nodes[n]
    return series.tags.get(str(n), "")


def aggregation_key(series, nodes) -> str:
    """The group key of groupByNodes/aliasByNode: names from functions use their first path."""
    path_expression = None
    if series.name.endswith(")"):
        path_expression = first_path_expression(series.name)
    return ".".join(node_or_tag(series, n, path_expression) for n in nodes)


def group_series(series_list, key_function) -> dict:
    """Series grouped by key, in order of first appearance."""
    groups: dict = {}
    for series in series_list:
        groups.setdefault(key_function(series), []).append(series)
    return groups


def _require_finite(value: float, function: str, param: str) -> None:
    """For numbers graphite-web formats with %d (an OverflowError, its 500, on inf)."""
    if not math.isfinite(value):
        raise RenderError(f'{function}(): parameter "{param}" must be a finite number, not {value!r}')


def bucket_seconds(text) -> int:
    """A bucket width: positive, or the buckets would never end (graphite-web just renders nothing)."""
    seconds = interval_seconds(text)
    if seconds <= 0:
        raise RenderError(f"interval {text!r} must be positive")
    return seconds


def percentile(points, n, interpolate=False):
    """NIST percentile as graphite-web's _getPercentile (nearest rank unless interpolating)."""
    if not 0 <= n <= 100:
        raise RenderError(f"percentile {n!r} is not between 0 and 100")
    ordered = sorted(p for p in points if p is not None)
    if not ordered:
        return None
    fractional_rank = (n / 100.0) * (len(ordered) + 1)
    rank = int(fractional_rank)
    rank_fraction = fractional_rank - rank
    if not interpolate:
        rank += int(math.ceil(rank_fraction))
    if rank == 0:
        value = ordered[0]
    elif rank - 1 == len(ordered):
        value = ordered[-1]
    else:
        value = ordered[rank - 1]
    if interpolate and rank != len(ordered):
        value = value + rank_fraction * (ordered[rank] - value)
    return value


def format_units(value, system="si", units=None):
    """Scale a value to SI or binary prefixes, as graphite-web's glyph.format_units."""
    prefixes = {
        "binary": (("Pi", 1024.0**5), ("Ti", 1024.0**4), ("Gi", 1024.0**3), ("Mi", 1024.0**2), ("Ki", 1024.0)),
        "si": (("P", 1000.0**5), ("T", 1000.0**4), ("G", 1000.0**3), ("M", 1000.0**2), ("k", 1000.0)),
    }[system]
    if not math.isfinite(value):
        return value, units or ""
    for prefix, size in prefixes:
        if abs(value) >= size:
            scaled = value / size
            if scaled - math.floor(scaled) < 0.00000000001 and value > 1:
                scaled = float(math.floor(scaled))
            return scaled, prefix + units if units else prefix
    if value - math.floor(value) < 0.00000000001 and value > 1:
        value = float(math.floor(value))
    return value, units or ""


def _floor_to_unit(timestamp: int, tz, unit: str, iso_weekday: int = 1) -> int:
    """The start of the year/month/week/day/hour/minute containing ``timestamp`` in ``tz``."""
    local = datetime.fromtimestamp(timestamp, tz)
    if unit == YEARS:
        local = local.replace(month=1, day=1, hour=0, minute=0, second=0)
    elif unit == MONTHS_UNIT:
        local = local.replace(day=1, hour=0, minute=0, second=0)
    elif unit == WEEKS:
        days_back = (local.isoweekday() - iso_weekday) % 7
        local = local.replace(hour=0, minute=0, second=0) - timedelta(days=days_back)
    elif unit == DAYS:
        local = local.replace(hour=0, minute=0, second=0)
    elif unit == HOURS:
        local = local.replace(minute=0, second=0)
    elif unit == MINUTES:
        local = local.replace(second=0)
    return int(local.replace(microsecond=0).timestamp())


def _rename(series, name):
    series.name = name
    series.pathExpression = name


def _parse_date(value, context) -> int:
    try:
        return parse_at_time(str(value), context.now, context.tz)
    except ValueError as error:
        raise RenderError(str(error)) from None


def _spend_points(context, points: int, what: str) -> None:
    """Count points against the request's budget before building them (QueryTooLarge over it)."""
    if context.budget is not None:
        context.budget.spend(points, what)


def _generated_times(context, step: int, what: str) -> range:
    if not isinstance(step, int) or step <= 0:
        raise RenderError(f"step {step!r} must be a positive number of seconds")
    times = range(context.start, context.end, step)
    _spend_points(context, len(times), what)
    return times


def _compile(pattern, capture: bool = False):
    """Client regexes are RE2's: linear time, so no pattern can stall the server; ``capture``
    keeps the groups a substitution refers to (protocols/linear_regex.py)."""
    try:
        return compile_regex(pattern, capture=capture)
    except BadPattern as error:
        raise RenderError(str(error)) from None


def _substitute(regex, replace, name) -> str:
    """regex.sub with the user's replacement; a RenderError (400) when it is bad."""
    try:
        return regex.sub(replace, str(name))  # verticalLine() without a label has no name
    except (IndexError, KeyError, ValueError) as error:
        raise RenderError(f"invalid replacement {replace!r}: {error}") from None
