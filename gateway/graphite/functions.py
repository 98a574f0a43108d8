"""The Graphite render function library, with graphite-web 1.1 semantics, and its /functions catalog.

Every function takes a ``Request`` (render context, the call's raw argument nodes, a way to
evaluate an expression under another time range) and the validated arguments. Functions mutate
and return the series they are given, as graphite-web's do: names, tags and values of the output
follow graphite-web 1.1.8 so that Grafana dashboards show the same legends.

Functions are grouped as graphite-web groups them: Combine, Transform, Calculate, Filter Series,
Filter Data, Sorting, Alias, Graph, Special. ``docs/graphite-functions.rst`` lists them and the
known differences.
"""

import inspect
import math
import random
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial, reduce
from itertools import zip_longest
from typing import Any, Awaitable, Callable

from gateway.graphite.series import CONSOLIDATION_FUNCTIONS, TimeSeries, parse_tags
from gateway.query import QueryTooLarge
from protocols.graphite.attime import (
    DAYS, HOURS, MINUTES, MONTHS_UNIT, SECONDS, WEEKS, YEARS, parse_at_time, parse_time_offset, unit_name,
)
from protocols.graphite.target import first_path_expression
from protocols.linear_regex import BadPattern, compile_regex

INF = float("inf")
NAN = float("nan")


# A render (or a function such as linearRegression reaching back to epoch 0) must not build
# unbounded lists on the reactor.
MAX_POINTS_PER_SERIES = 1_000_000


# timeStack() evaluates its series once per shift: more copies than this is no graph, only memory.
MAX_TIME_STACK = 1000


class RenderError(ValueError):
    """A user error in a target (syntax, unknown function, bad argument): an HTTP 400."""


class EmptyResult(Exception):
    """Raised when there is nothing to normalize; the calling function then returns []."""


@dataclass
class Request:
    """What a function sees of the render request besides its arguments."""
    context: Any  # evaluator.RenderContext
    raw_args: list  # the call's positional argument nodes, to re-evaluate under another range
    evaluate: Callable[[Any, Any], Awaitable[list]]  # (node or target text, context) -> series

    async def evaluate_first_argument(self, **changes) -> list:
        """Evaluate the first argument again with the context fields changed (start=..., end=...)."""
        return await self.evaluate(self.raw_args[0], replace(self.context, **changes))

    async def compute(self, function, *args, **kwargs):
        """Run CPU-bound work through the context's ``offload`` (a thread under the server), so
        the event loop keeps serving other requests meanwhile; directly without one."""
        offload = self.context.offload
        if offload is None:
            return function(*args, **kwargs)
        # bound first: the function's own keywords (func=...) must not reach the offload's
        return await offload(partial(function, *args, **kwargs))


# Safe aggregation helpers (None-aware), as graphite-web's functions/safe.py


def safe_sum(values):
    usable = [v for v in values if v is not None]
    return sum(usable) if usable else None


def safe_diff(values):
    usable = [v for v in values if v is not None]
    if not usable:
        return None
    return usable[0] + sum(-v for v in usable[1:])


def safe_len(values):
    return len([v for v in values if v is not None])


def safe_div(a, b):
    if a is None or b in (0, None):
        return None
    return a / b


def safe_pow(a, b):
    if a is None or b is None:
        return None
    try:
        return math.pow(a, b)
    except (ValueError, OverflowError):
        return None


def safe_mul(*factors):
    if None in factors:
        return None
    return reduce(lambda x, y: x * y, [float(f) for f in factors])


def safe_subtract(a, b):
    if a is None or b is None:
        return None
    return float(a) - float(b)


def safe_avg(values):
    usable = [v for v in values if v is not None]
    return sum(usable) / len(usable) if usable else None


def safe_avg_zero(values):
    values = list(values)
    if values:
        return sum(0 if v is None else v for v in values) / len(values)
    return None


def safe_median(values):
    usable = sorted(v for v in values if v is not None)
    if not usable:
        return None
    middle = len(usable) // 2
    if len(usable) % 2 == 0:
        return float(usable[middle - 1] + usable[middle]) / 2
    return usable[middle]


def safe_stddev(values):
    values = list(values)
    average = safe_div(safe_sum(values), safe_len(values))
    if average is None:
        return None
    usable = [v for v in values if v is not None]
    return math.sqrt(sum((v - average) * (v - average) for v in usable) / len(usable))


def safe_last(values):
    for value in reversed(list(values)):
        if value is not None:
            return value
    return None


def safe_min(values, default=None):
    usable = [v for v in values if v is not None]
    return min(usable) if usable else default


def safe_max(values, default=None):
    usable = [v for v in values if v is not None]
    return max(usable) if usable else default


AGG_FUNCS = {
    "average": safe_avg,
    "avg_zero": safe_avg_zero,
    "median": safe_median,
    "sum": safe_sum,
    "min": safe_min,
    "max": safe_max,
    "diff": safe_diff,
    "stddev": safe_stddev,
    "count": safe_len,
    "range": lambda row: safe_subtract(safe_max(row), safe_min(row)),
    "multiply": lambda row: safe_mul(*row),
    "last": safe_last,
}
AGG_FUNC_ALIASES = {"rangeOf": "range", "avg": "average", "total": "sum", "current": "last"}
VALID_AGG_FUNCS = list(AGG_FUNCS) + list(AGG_FUNC_ALIASES)


def get_agg_func(name, raw_name=None):
    if name in AGG_FUNCS:
        return AGG_FUNCS[name]
    if name in AGG_FUNC_ALIASES:
        return AGG_FUNCS[AGG_FUNC_ALIASES[name]]
    raise RenderError(f"Unsupported aggregation function: {raw_name or name}")


def none_last_key(function):
    """Sort key treating None as -inf, as graphite-web does on Python 3."""
    def key(values):
        value = function(values)
        return -INF if value is None else value
    return key


# Parameter types and the registry (graphite-web's functions/params.py)


def _validate_boolean(value):
    if isinstance(value, str):
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError(value)
    if type(value) in (int, float):
        if value in (0, 1):
            return value == 1
        raise ValueError(value)
    return bool(value)


def _validate_integer(value):
    if type(value) is float:
        raise ValueError(value)
    return int(value)


def _validate_int_or_inf(value):
    try:
        return _validate_integer(value)
    except (TypeError, ValueError):
        pass
    if float(value) == INF:
        return INF
    raise ValueError(value)


def _validate_int_or_interval(value):
    try:
        return _validate_integer(value)
    except (TypeError, ValueError):
        return _validate_interval(value)


def _validate_string(value):
    """graphite-web has no check here, and its functions then fail on a number (a 500)."""
    if not isinstance(value, str):
        raise ValueError(value)
    return value


def _validate_node_or_tag(value):
    """graphite-web looks a float node up as a tag name; inf and nan are neither node nor tag."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(value)
    return value


def _validate_interval(value):
    interval_seconds(value)
    return value


def _validate_series_list(value):
    if not isinstance(value, list) or not all(isinstance(s, TimeSeries) for s in value):
        raise ValueError(value)
    return value


def _validate_series_lists(value):
    if not isinstance(value, list):
        raise ValueError(value)
    for entry in value:
        _validate_series_list(entry)
    return value


def _validate_agg_func(value):
    if value in VALID_AGG_FUNCS or value in [name + "Series" for name in VALID_AGG_FUNCS]:
        return value
    raise ValueError(value)


@dataclass(frozen=True)
class ParamType:
    name: str
    validator: Callable | None = None


BOOLEAN = ParamType("boolean", _validate_boolean)
DATE = ParamType("date")
FLOAT = ParamType("float", float)
INTEGER = ParamType("integer", _validate_integer)
INTERVAL = ParamType("interval", _validate_interval)
INT_OR_INTERVAL = ParamType("intOrInterval", _validate_int_or_interval)
INT_OR_INF = ParamType("intOrInf", _validate_int_or_inf)
NODE = ParamType("node", _validate_integer)
NODE_OR_TAG = ParamType("nodeOrTag", _validate_node_or_tag)
SERIES_LIST = ParamType("seriesList", _validate_series_list)
SERIES_LISTS = ParamType("seriesLists", _validate_series_lists)
STRING = ParamType("string", _validate_string)
TAG = ParamType("tag", _validate_string)
ANY = ParamType("any")
AGG_FUNC = ParamType("aggFunc", _validate_agg_func)
AGG_OR_SERIES_FUNC = ParamType("aggOrSeriesFunc")


@dataclass
class Param:
    name: str
    type: ParamType
    required: bool = False
    default: Any = None
    multiple: bool = False
    options: list = field(default_factory=list)
    suggestions: list | None = None
    strict_options: bool = True  # False where graphite-web's function itself copes with other values

    def all_options(self) -> list:
        options = list(self.options)
        if self.type is AGG_FUNC:
            options += VALID_AGG_FUNCS
        if self.type is AGG_OR_SERIES_FUNC:
            options += VALID_AGG_FUNCS + [name for name, f in REGISTRY.items() if f.aggregator]
        return sorted(set(options), key=str)

    def to_json(self) -> dict:
        result = {"name": self.name, "type": self.type.name}
        if self.required:
            result["required"] = True
        if self.default is not None:
            result["default"] = self.default
        if self.multiple:
            result["multiple"] = True
        options = self.all_options()
        if options:
            result["options"] = options
        if self.suggestions:
            result["suggestions"] = self.suggestions
        return result

    def validate(self, value, function_name: str):
        if value is None and (self.default is not None or not self.required) and self.type not in (SERIES_LIST, SERIES_LISTS):
            return self.default
        options = self.all_options()
        if options and self.strict_options and self.type is not AGG_FUNC and value not in options:
            raise RenderError(f'Invalid option specified for function "{function_name}" parameter '
                              f'"{self.name}": {value!r}')
        if self.type.validator is None:
            return value
        try:
            return self.type.validator(value)
        except Exception:
            raise RenderError(f'Invalid "{self.type.name}" value specified for function "{function_name}" '
                              f'parameter "{self.name}": {value!r}') from None


@dataclass
class SeriesFunction:
    name: str
    function: Callable
    group: str
    params: list
    aggregator: bool = False

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.function)

    def validate(self, args: list, kwargs: dict) -> tuple[list, dict]:
        """Check arguments against the parameters, as graphite-web's validateParams."""
        params = self.params
        if len(args) + len(kwargs) > len(params) and not (params and params[-1].multiple):
            raise RenderError(f'Too many parameters specified for function "{self.name}"')
        if len(args) > len(params):
            positional, by_keyword = params, []
        else:
            positional, by_keyword = params[:len(args)], params[len(args):]
        valid_args = [positional[min(i, len(positional) - 1)].validate(arg, self.name)
                      for i, arg in enumerate(args)]
        valid_kwargs = {}
        for param in by_keyword:
            value = kwargs.get(param.name)
            if value is None:
                if param.required:
                    raise RenderError(f'Missing required parameter "{param.name}" for function "{self.name}"')
                continue
            valid_kwargs[param.name] = param.validate(value, self.name)
        unexpected = [key for key in kwargs if key not in valid_kwargs and kwargs[key] is not None]
        if unexpected:
            raise RenderError(f"Unexpected key word arguments: {', '.join(unexpected)}")
        return valid_args, valid_kwargs

    def info(self) -> dict:
        signature = inspect.signature(self.function)
        parameters = list(signature.parameters.values())[1:]
        return {
            "name": self.name,
            "function": self.name + str(signature.replace(parameters=parameters)),
            "description": inspect.getdoc(self.function),
            "module": __name__,
            "group": self.group,
            "params": [param.to_json() for param in self.params],
        }


REGISTRY: dict[str, SeriesFunction] = {}


def series_function(*names: str, group: str, params: list, aggregator: bool = False):
    """Register a function under its graphite-web name(s)."""
    def register(function):
        for name in names:
            REGISTRY[name] = SeriesFunction(name, function, group, params, aggregator)
        return function
    return register


def function_catalog(grouped: bool = False, group: str | None = None) -> dict:
    """The /functions document: name -> description (or group -> name -> description)."""
    result = {}
    for name in sorted(REGISTRY):
        info = REGISTRY[name].info()
        if group is not None and info["group"] != group:
            continue
        if grouped:
            result.setdefault(info["group"], {})[name] = info
        else:
            result[name] = info
    return result


# Shared helpers


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
    groups = {}
    for series in series_list:
        groups.setdefault(key_function(series), []).append(series)
    return groups


def apply_callback(request, callback: str, series_list):
    """groupBy* callback: a registered aggregating function name or an aggregation name."""
    if callback in REGISTRY:
        function = REGISTRY[callback]
        if function.is_async or any(param.required for param in function.params[1:]):
            raise RenderError(f"{callback} cannot aggregate a group of series on its own")
        return function.function(request, series_list)[0]
    return aggregate(request, series_list, callback)[0]


def _require_finite(value: float, function: str, param: str) -> None:
    """For numbers graphite-web formats with %d (an OverflowError, its 500, on inf)."""
    if not math.isfinite(value):
        raise RenderError(f'{function}(): parameter "{param}" must be a finite number, not {value!r}')


def interval_seconds(text) -> int:
    """Seconds of an interval argument; a RenderError (400) naming it when it is not one."""
    try:
        return parse_time_offset(_validate_string(text))
    except ValueError:
        raise RenderError(f"invalid interval {text!r}: use e.g. '5min', '-1h', '2d'") from None


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
        "binary": (("Pi", 1024.0 ** 5), ("Ti", 1024.0 ** 4), ("Gi", 1024.0 ** 3), ("Mi", 1024.0 ** 2), ("Ki", 1024.0)),
        "si": (("P", 1000.0 ** 5), ("T", 1000.0 ** 4), ("G", 1000.0 ** 3), ("M", 1000.0 ** 2), ("k", 1000.0)),
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


# Combine


@series_function("aggregate", group="Combine", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("func", AGG_FUNC, required=True),
    Param("xFilesFactor", FLOAT),
])
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
    values = [function(row) if xff_values(row, x_files_factor) else None
              for row in zip_longest(*series_list)]
    tags = dict(series_list[0].tags)
    for series in series_list:
        tags = {k: v for k, v in tags.items() if series.tags.get(k) == v}
    tags.setdefault("name", name)
    tags["aggregatedBy"] = func
    return [TimeSeries(name, start, end, step, values, tags=tags, x_files_factor=x_files_factor)]


@series_function("aggregateSeriesLists", group="Combine", params=[
    Param("seriesListFirstPos", SERIES_LIST, required=True),
    Param("seriesListSecondPos", SERIES_LIST, required=True),
    Param("func", AGG_FUNC, required=True),
    Param("xFilesFactor", FLOAT),
])
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
        result.name = result.name[:result.name.find("Series(")] + f"Series({first.name},{second.name})"
        results.append(result)
    return results


def _aggregator(func: str, doc: str):
    def combine(request, *seriesLists):
        return aggregate(request, list(seriesLists), func)
    combine.__doc__ = doc
    return combine


SERIES_LISTS_PARAMS = [Param("seriesLists", SERIES_LIST, required=True, multiple=True)]
TWO_LISTS_PARAMS = [Param("seriesListFirstPos", SERIES_LIST, required=True),
                    Param("seriesListSecondPos", SERIES_LIST, required=True)]
WILDCARD_PARAMS = [Param("seriesList", SERIES_LIST, required=True), Param("position", NODE, multiple=True)]

sumSeries = series_function("sumSeries", "sum", group="Combine", params=SERIES_LISTS_PARAMS, aggregator=True)(
    _aggregator("sum", "Sum of the series at each point (aggregate with 'sum')."))
averageSeries = series_function("averageSeries", "avg", group="Combine", params=SERIES_LISTS_PARAMS,
                                aggregator=True)(
    _aggregator("average", "Average of the series at each point (aggregate with 'average')."))
diffSeries = series_function("diffSeries", group="Combine", params=SERIES_LISTS_PARAMS, aggregator=True)(
    _aggregator("diff", "First series minus the others at each point (aggregate with 'diff')."))
stddevSeries = series_function("stddevSeries", group="Combine", params=SERIES_LISTS_PARAMS, aggregator=True)(
    _aggregator("stddev", "Population standard deviation of the series at each point."))
minSeries = series_function("minSeries", group="Combine", params=SERIES_LISTS_PARAMS, aggregator=True)(
    _aggregator("min", "Minimum of the series at each point."))
maxSeries = series_function("maxSeries", group="Combine", params=SERIES_LISTS_PARAMS, aggregator=True)(
    _aggregator("max", "Maximum of the series at each point."))
rangeOfSeries = series_function("rangeOfSeries", group="Combine", params=SERIES_LISTS_PARAMS, aggregator=True)(
    _aggregator("rangeOf", "Maximum minus minimum of the series at each point."))


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
    _lists_aggregator("sum", "Sum the i-th series of two lists pairwise."))
diffSeriesLists = series_function("diffSeriesLists", group="Combine", params=TWO_LISTS_PARAMS, aggregator=True)(
    _lists_aggregator("diff", "Subtract the i-th series of the second list from the i-th of the first."))
multiplySeriesLists = series_function("multiplySeriesLists", group="Combine", params=TWO_LISTS_PARAMS,
                                      aggregator=True)(
    _lists_aggregator("multiply", "Multiply the i-th series of two lists pairwise."))


@series_function("aggregateWithWildcards", group="Combine", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("func", AGG_FUNC, required=True),
    Param("position", NODE, multiple=True),
])
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


sumSeriesWithWildcards = series_function("sumSeriesWithWildcards", group="Combine", params=WILDCARD_PARAMS,
                                         aggregator=True)(
    _wildcards_aggregator("sum", "sumSeries over groups of names ignoring the given node positions."))
averageSeriesWithWildcards = series_function("averageSeriesWithWildcards", group="Combine",
                                             params=WILDCARD_PARAMS, aggregator=True)(
    _wildcards_aggregator("average", "averageSeries over groups of names ignoring the given node positions."))
multiplySeriesWithWildcards = series_function("multiplySeriesWithWildcards", group="Combine",
                                              params=WILDCARD_PARAMS, aggregator=True)(
    _wildcards_aggregator("multiply", "multiplySeries over groups of names ignoring the given node positions."))


@series_function("percentileOfSeries", group="Combine", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("n", FLOAT, required=True),
    Param("interpolate", BOOLEAN, default=False),
])
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


@series_function("asPercent", "pct", group="Combine", aggregator=True, params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("total", ANY),
    Param("nodes", NODE_OR_TAG, multiple=True),
])
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
                results.append(TimeSeries("asPercent(MISSING,%s)" % total_series.name, total_series.start,
                                          total_series.end, total_series.step, [None for _ in total_series],
                                          x_files_factor=x_files_factor))
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
            raise RenderError("asPercent second argument must be missing, a single digit, reference exactly 1 "
                              "series or reference the same number of series as the first argument")
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


@series_function("divideSeries", group="Combine", params=[
    Param("dividendSeriesList", SERIES_LIST, required=True),
    Param("divisorSeries", SERIES_LIST, required=True),
])
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


@series_function("divideSeriesLists", group="Combine", params=[
    Param("dividendSeriesList", SERIES_LIST, required=True),
    Param("divisorSeriesList", SERIES_LIST, required=True),
])
def divideSeriesLists(request, dividendSeriesList, divisorSeriesList):
    """Divide the i-th series of the first list by the i-th series of the second."""
    if len(dividendSeriesList) != len(divisorSeriesList):
        raise RenderError("dividendSeriesList and divisorSeriesList argument must have equal length")
    return [_divide(request, a, b) for a, b in zip(dividendSeriesList, divisorSeriesList)]


@series_function("weightedAverage", group="Combine", params=[
    Param("seriesListAvg", SERIES_LIST, required=True),
    Param("seriesListWeight", SERIES_LIST, required=True),
    Param("nodes", NODE_OR_TAG, multiple=True),
])
def weightedAverage(request, seriesListAvg, seriesListWeight, *nodes):
    """Average of the first list weighted by the matching (by nodes) series of the second."""
    if len(seriesListAvg) != len(seriesListWeight):
        raise RenderError("weightedAverage must receive the same number of series for seriesListAvg and "
                          f"seriesListWeight but received respectively {len(seriesListAvg)} and "
                          f"{len(seriesListWeight)}")
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
        products.append(TimeSeries("product(%s,%s)" % (weight_series.name, average_series.name),
                                   average_series.start, average_series.end, average_series.step, values,
                                   x_files_factor=x_files_factor))
    if not products:
        return []
    sum_products = sumSeries(request, products)[0]
    sum_weights = sumSeries(request, seriesListWeight)[0]
    values = [safe_div(a, b) for a, b in zip_longest(sum_products, sum_weights)]
    name = "weightedAverage(%s, %s, %s)" % (",".join(sorted({s.pathExpression for s in seriesListAvg})),
                                            ",".join(sorted({s.pathExpression for s in seriesListWeight})),
                                            ",".join(map(str, nodes)))
    return [TimeSeries(name, sum_products.start, sum_products.end, sum_products.step, values,
                       x_files_factor=x_files_factor)]


@series_function("powSeries", group="Combine", aggregator=True, params=[
    Param("seriesList", SERIES_LIST, required=True, multiple=True),
])
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


@series_function("countSeries", group="Combine", aggregator=True, params=[
    Param("seriesLists", SERIES_LIST, multiple=True),
])
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


@series_function("mapSeries", "map", group="Combine", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("mapNodes", NODE_OR_TAG, required=True, multiple=True),
])
def mapSeries(request, seriesList, *mapNodes):
    """Split a series list into lists sharing the given nodes (input for reduceSeries)."""
    return list(group_series(seriesList, lambda s: aggregation_key(s, mapNodes)).values())


@series_function("reduceSeries", "reduce", group="Combine", params=[
    Param("seriesLists", SERIES_LISTS, required=True),
    Param("reduceFunction", STRING, required=True),
    Param("reduceNode", NODE, required=True),
    Param("reduceMatchers", STRING, required=True, multiple=True),
])
def reduceSeries(request, seriesLists, reduceFunction, reduceNode, *reduceMatchers):
    """Apply a function to the series of each mapped list picked by reduceMatchers at reduceNode."""
    if reduceFunction not in REGISTRY or REGISTRY[reduceFunction].is_async:
        raise RenderError(f"Unsupported reduce function: {reduceFunction}")
    groups = {}
    for series_list in seriesLists:
        for series in series_list:
            nodes = series.name.split(".")
            node = nodes[reduceNode]
            key = ".".join(nodes[0:reduceNode]) + ".reduce." + reduceFunction
            if node in reduceMatchers:
                groups.setdefault(key, [None] * len(reduceMatchers))[reduceMatchers.index(node)] = series
    results = []
    for key, members in groups.items():
        result = REGISTRY[reduceFunction].function(request, *[[series] for series in members])[0]
        result.name = key
        results.append(result)
    return results


@series_function("applyByNode", group="Combine", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("nodeNum", NODE, required=True),
    Param("templateFunction", STRING, required=True),
    Param("newName", STRING),
])
async def applyByNode(request, seriesList, nodeNum, templateFunction, newName=None):
    """Evaluate a template target once per name prefix (nodes 0..nodeNum), '%' standing for the prefix."""
    prefixes = sorted({".".join(series.name.split(".")[:nodeNum + 1]) for series in seriesList})
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


@series_function("groupByNode", group="Combine", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("nodeNum", NODE_OR_TAG, required=True),
    Param("callback", AGG_OR_SERIES_FUNC, default="average"),
])
def groupByNode(request, seriesList, nodeNum, callback="average"):
    """Aggregate the series sharing one node (or tag) value; the result is named by that value."""
    return groupByNodes(request, seriesList, callback, nodeNum)


@series_function("groupByNodes", group="Combine", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("callback", AGG_OR_SERIES_FUNC, required=True),
    Param("nodes", NODE_OR_TAG, multiple=True),
])
def groupByNodes(request, seriesList, callback, *nodes):
    """Aggregate the series sharing several node (or tag) values, named by the joined values."""
    results = []
    for key, members in group_series(seriesList, lambda s: aggregation_key(s, nodes)).items():
        result = apply_callback(request, callback, members)
        result.name = key
        results.append(result)
    return results


@series_function("groupByTags", group="Combine", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("callback", AGG_OR_SERIES_FUNC, required=True),
    Param("tags", TAG, required=True, multiple=True),
])
def groupByTags(request, seriesList, callback, *tags):
    """Aggregate the series sharing the given tag values; results are named as tagged series."""
    if not tags:
        raise RenderError("groupByTags(): no tags specified")
    if "name" not in tags:
        names = {series.tags["name"] for series in seriesList}
        common_name = names.pop() if len(names) == 1 else callback

    def key(series):
        if "name" in tags:
            return ";".join([series.tags["name"]] + sorted(
                f"{tag}={series.tags.get(tag, '')}" for tag in tags if tag != "name"))
        return ";".join([common_name] + sorted(f"{tag}={series.tags.get(tag, '')}" for tag in tags))

    results = []
    for group_key, members in group_series(seriesList, key).items():
        result = apply_callback(request, callback, members)
        result.name = group_key
        result.pathExpression = group_key
        result.tags = parse_tags(group_key)
        results.append(result)
    return results


# Transform


def _rename(series, name):
    series.name = name
    series.pathExpression = name


@series_function("scale", group="Transform", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("factor", FLOAT, required=True),
])
def scale(request, seriesList, factor):
    """Multiply every value by a constant."""
    for series in seriesList:
        series.tags["scale"] = factor
        _rename(series, "scale(%s,%g)" % (series.name, float(factor)))
        for i, value in enumerate(series):
            series[i] = safe_mul(value, factor)
    return seriesList


@series_function("scaleToSeconds", group="Transform", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("seconds", FLOAT, required=True),
])
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


@series_function("add", group="Transform", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("constant", FLOAT, required=True),
])
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


@series_function("pow", group="Transform", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("factor", FLOAT, required=True),
])
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


@series_function("offset", group="Transform", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("factor", FLOAT, required=True),
])
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


@series_function("round", group="Transform", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("precision", INTEGER, default=0),
])
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


@series_function("nonNegativeDerivative", group="Transform", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("maxValue", FLOAT),
    Param("minValue", FLOAT),
])
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


@series_function("perSecond", group="Transform", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("maxValue", FLOAT),
    Param("minValue", FLOAT),
])
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


@series_function("delay", group="Transform", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("steps", INTEGER, required=True),
])
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


@series_function("integralByInterval", group="Transform", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("intervalUnit", STRING, required=True),
])
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


@series_function("keepLastValue", group="Transform", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("limit", INT_OR_INF, default=INF),
])
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


@series_function("interpolate", group="Transform", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("limit", INT_OR_INF, default=INF),
])
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


@series_function("transformNull", group="Transform", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("default", FLOAT, default=0),
    Param("referenceSeries", SERIES_LIST),
])
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
        del series[:len(values)]
    return seriesList


@series_function("isNonNull", group="Transform", params=[Param("seriesList", SERIES_LIST, required=True)])
def isNonNull(request, seriesList):
    """1 where there is a value, 0 where there is none."""
    for series in seriesList:
        series.tags["isNonNull"] = 1
        _rename(series, "isNonNull(%s)" % series.name)
        values = [0 if v is None else 1 for v in series]
        series.extend(values)
        del series[:len(values)]
    return seriesList


@series_function("log", group="Transform", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("base", INTEGER, default=10),
])
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


@series_function("summarize", group="Transform", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("intervalString", INTERVAL, required=True, suggestions=["10min", "1h", "1d"]),
    Param("func", AGG_FUNC, default="sum"),
    Param("alignToFrom", BOOLEAN, default=False),
])
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


@series_function("smartSummarize", group="Transform", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("intervalString", INTERVAL, required=True, suggestions=["10min", "1h", "1d"]),
    Param("func", AGG_FUNC, default="sum"),
    Param("alignTo", ParamType("string"), options=[None, YEARS, MONTHS_UNIT, WEEKS, DAYS, HOURS, MINUTES, SECONDS, True, False],
          strict_options=False),
])
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
    _spend_buckets(request, [series.end - series.start for series in seriesList], interval, f"smartSummarize(..., {intervalString!r})")
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


@series_function("hitcount", group="Transform", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("intervalString", INTERVAL, required=True, suggestions=["10min", "1h", "1d"]),
    Param("alignToInterval", BOOLEAN, default=False),
])
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
    _spend_buckets(request, [series.end - series.start for series in seriesList], interval, f"hitcount(..., {intervalString!r})")
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


@series_function("timeShift", group="Transform", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("timeShift", INTERVAL, required=True, suggestions=["1h", "6h", "12h", "1d", "2d", "7d", "14d", "30d"]),
    Param("resetEnd", BOOLEAN, default=True),
    Param("alignDst", BOOLEAN, default=False),
])
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


@series_function("timeStack", group="Transform", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("timeShiftUnit", INTERVAL, default="1d", suggestions=["1h", "6h", "12h", "1d", "2d", "7d", "14d", "30d"]),
    Param("timeShiftStart", INTEGER, default=0),
    Param("timeShiftEnd", INTEGER, default=7),
])
async def timeStack(request, seriesList, timeShiftUnit="1d", timeShiftStart=0, timeShiftEnd=7):
    """The series shifted by timeShiftStart..timeShiftEnd-1 units, all drawn over the current range."""
    timeShiftUnit = _negative_by_default(timeShiftUnit)
    delta = interval_seconds(timeShiftUnit)
    if not seriesList:
        return []
    if timeShiftEnd - timeShiftStart > MAX_TIME_STACK:
        raise QueryTooLarge(f"timeStack() asks for {timeShiftEnd - timeShiftStart} shifted copies, over {MAX_TIME_STACK}")
    reference = seriesList[0]
    results = []
    for shift in range(int(timeShiftStart), int(timeShiftEnd)):
        context = request.context
        for shifted in await request.evaluate_first_argument(start=context.start + delta * shift,
                                                             end=context.end + delta * shift):
            shifted.tags["timeShiftUnit"] = timeShiftUnit
            shifted.tags["timeShift"] = shift
            _rename(shifted, "timeShift(%s, %s, %s)" % (shifted.name, timeShiftUnit, shift))
            shifted.start = reference.start
            shifted.end = reference.end
            results.append(shifted)
    return results


@series_function("timeSlice", group="Transform", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("startSliceAt", DATE, required=True),
    Param("endSliceAt", DATE, default="now"),
])
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


@series_function("time", "timeFunction", group="Transform", params=[
    Param("name", STRING, required=True),
    Param("step", INTEGER, default=60),
])
def timeFunction(request, name, step=60):
    """A series whose value is its own timestamp."""
    context = request.context
    values = [float(t) for t in _generated_times(context, step, f"time({name!r}, {step})")]
    return [TimeSeries(name, context.start, context.end, step, values, x_files_factor=context.x_files_factor)]


@series_function("sin", "sinFunction", group="Transform", params=[
    Param("name", STRING, required=True),
    Param("amplitude", INTEGER, default=1),
    Param("step", INTEGER, default=60),
])
def sinFunction(request, name, amplitude=1, step=60):
    """A sine wave of the timestamp, times amplitude."""
    context = request.context
    values = [math.sin(t) * amplitude for t in _generated_times(context, step, f"sinFunction({name!r}, {amplitude}, {step})")]
    return [TimeSeries(name, context.start, context.end, step, values, x_files_factor=context.x_files_factor)]


# Calculate


async def _moving_window(request, seriesList, windowSize, func, xFilesFactor, tag_name):
    """Aggregate the ``windowSize`` points (or seconds) before each point; data before ``from`` is fetched."""
    if not seriesList:
        return []
    if isinstance(windowSize, str):
        preview_seconds = abs(interval_seconds(windowSize))
    else:
        preview_seconds = max(series.step for series in seriesList) * int(windowSize)
    fetched = await request.evaluate_first_argument(start=request.context.start - preview_seconds)
    return await request.compute(_moving_window_values, fetched, windowSize, preview_seconds, func, xFilesFactor, tag_name)


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
            usable = [v for v in series[i - window_points:i] if v is not None]
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


@series_function("movingWindow", group="Calculate", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("windowSize", INT_OR_INTERVAL, required=True, suggestions=INT_OR_INTERVAL_SUGGESTIONS),
    Param("func", AGG_FUNC, default="average"),
    Param("xFilesFactor", FLOAT),
])
async def movingWindow(request, seriesList, windowSize, func="average", xFilesFactor=None):
    """Aggregate, for each point, the previous windowSize points (a number, or an interval like '5min')."""
    return await _moving_window(request, seriesList, windowSize, func, xFilesFactor, "moving" + func.capitalize())


def _moving(func: str, doc: str):
    async def moving(request, seriesList, windowSize, xFilesFactor=None):
        return await _moving_window(request, seriesList, windowSize, func, xFilesFactor, "moving" + func.capitalize())
    moving.__doc__ = doc
    return moving


movingAverage = series_function("movingAverage", group="Calculate", params=MOVING_PARAMS)(
    _moving("average", "Average of the previous windowSize points (or interval)."))
movingMedian = series_function("movingMedian", group="Calculate", params=MOVING_PARAMS)(
    _moving("median", "Median of the previous windowSize points (or interval)."))
movingSum = series_function("movingSum", group="Calculate", params=MOVING_PARAMS)(
    _moving("sum", "Sum of the previous windowSize points (or interval)."))
movingMin = series_function("movingMin", group="Calculate", params=MOVING_PARAMS)(
    _moving("min", "Minimum of the previous windowSize points (or interval)."))
movingMax = series_function("movingMax", group="Calculate", params=MOVING_PARAMS)(
    _moving("max", "Maximum of the previous windowSize points (or interval)."))


@series_function("exponentialMovingAverage", group="Calculate", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("windowSize", INT_OR_INTERVAL, required=True, suggestions=INT_OR_INTERVAL_SUGGESTIONS),
])
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


@series_function("nPercentile", group="Calculate", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("n", FLOAT, required=True),
])
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


@series_function("stdev", group="Calculate", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("points", INTEGER, required=True),
    Param("windowTolerance", FLOAT, default=0.1),
])
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
                total_squares -= dropped ** 2
            if value is not None:
                valid += 1
                total += value
                total_squares += value ** 2
            if valid > 0 and float(valid) / points >= windowTolerance:
                try:
                    result.append(math.sqrt(valid * total_squares - total ** 2) / valid)
                except ValueError:
                    result.append(None)
            else:
                result.append(None)
        seriesList[index] = result
    return seriesList


@series_function("linearRegression", group="Calculate", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("startSourceAt", DATE),
    Param("endSourceAt", DATE),
])
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
        result = TimeSeries(name, series.start, series.end, series.step, values, tags=series.tags,
                            x_files_factor=series.xFilesFactor)
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


@series_function("aggregateLine", group="Calculate", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("func", AGG_FUNC, default="average"),
    Param("keepStep", BOOLEAN, default=False),
])
def aggregateLine(request, seriesList, func="average", keepStep=False):
    """A constant line at the aggregate (average by default) of each series."""
    function = get_agg_func(func)
    results = []
    for series in seriesList:
        value = function(series)
        name = "aggregateLine(%s, %g)" % (series.name, value) if value is not None else \
            "aggregateLine(%s, None)" % series.name
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
    series = TimeSeries(name, context.start, context.end, 60, times,
                        x_files_factor=context.x_files_factor)
    series.pathExpression = 'identity("%s")' % name
    return [series]


# Filter Series


OPERATORS = {
    "=": lambda value, threshold: value is not None and value == threshold,
    "!=": lambda value, threshold: value is None or value != threshold,
    ">": lambda value, threshold: value is not None and value > threshold,
    ">=": lambda value, threshold: value is not None and value >= threshold,
    "<": lambda value, threshold: value is None or value < threshold,
    "<=": lambda value, threshold: value is None or value <= threshold,
}


@series_function("filterSeries", group="Filter Series", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("func", AGG_FUNC, required=True),
    Param("operator", STRING, required=True, options=sorted(OPERATORS)),
    Param("threshold", FLOAT, required=True),
])
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


N_FLOAT_PARAMS = [Param("seriesList", SERIES_LIST, required=True), Param("n", FLOAT, required=True)]
N_INTEGER_PARAMS = [Param("seriesList", SERIES_LIST, required=True), Param("n", INTEGER, required=True)]

maximumAbove = series_function("maximumAbove", group="Filter Series", params=N_FLOAT_PARAMS)(
    _filter("max", ">", "Series whose maximum is above n."))
minimumAbove = series_function("minimumAbove", group="Filter Series", params=N_FLOAT_PARAMS)(
    _filter("min", ">", "Series whose minimum is above n."))
maximumBelow = series_function("maximumBelow", group="Filter Series", params=N_FLOAT_PARAMS)(
    _filter("max", "<=", "Series whose maximum is at most n."))
minimumBelow = series_function("minimumBelow", group="Filter Series", params=N_FLOAT_PARAMS)(
    _filter("min", "<=", "Series whose minimum is at most n."))
currentAbove = series_function("currentAbove", group="Filter Series", params=N_FLOAT_PARAMS)(
    _filter("last", ">", "Series whose last non-null value is above n."))
currentBelow = series_function("currentBelow", group="Filter Series", params=N_FLOAT_PARAMS)(
    _filter("last", "<=", "Series whose last non-null value is at most n."))
averageAbove = series_function("averageAbove", group="Filter Series", params=N_FLOAT_PARAMS)(
    _filter("average", ">", "Series whose average is above n."))
averageBelow = series_function("averageBelow", group="Filter Series", params=N_FLOAT_PARAMS)(
    _filter("average", "<=", "Series whose average is at most n."))


@series_function("highest", group="Filter Series", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("n", INTEGER, required=True),
    Param("func", AGG_FUNC, default="average"),
])
def highest(request, seriesList, n=1, func="average"):
    """The n series with the highest aggregate."""
    seriesList.sort(key=none_last_key(get_agg_func(func)), reverse=True)
    return seriesList[:int(n)]


@series_function("lowest", group="Filter Series", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("n", INTEGER, required=True),
    Param("func", AGG_FUNC, default="average"),
])
def lowest(request, seriesList, n=1, func="average"):
    """The n series with the lowest aggregate."""
    seriesList.sort(key=none_last_key(get_agg_func(func)))
    return seriesList[:int(n)]


def _ranked(rank, func: str, doc: str):
    def pick(request, seriesList, n):
        return rank(request, seriesList, n, func)
    pick.__doc__ = doc
    return pick


highestCurrent = series_function("highestCurrent", group="Filter Series", params=N_INTEGER_PARAMS)(
    _ranked(highest, "current", "The n series with the highest last value."))
highestMax = series_function("highestMax", group="Filter Series", params=N_INTEGER_PARAMS)(
    _ranked(highest, "max", "The n series with the highest maximum."))
highestAverage = series_function("highestAverage", group="Filter Series", params=N_INTEGER_PARAMS)(
    _ranked(highest, "average", "The n series with the highest average."))
lowestCurrent = series_function("lowestCurrent", group="Filter Series", params=N_INTEGER_PARAMS)(
    _ranked(lowest, "current", "The n series with the lowest last value."))
lowestAverage = series_function("lowestAverage", group="Filter Series", params=N_INTEGER_PARAMS)(
    _ranked(lowest, "average", "The n series with the lowest average."))


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
    return [series for series in seriesList
            if sum(not lows[i] < value < highs[i] for i, value in enumerate(series) if value is not None) > 0]


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


@series_function("exclude", group="Filter Series", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("pattern", STRING, required=True),
])
def exclude(request, seriesList, pattern):
    """Drop the series whose name matches a regular expression."""
    regex = _compile(pattern)
    return [series for series in seriesList if not regex.search(series.name)]


@series_function("grep", group="Filter Series", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("pattern", STRING, required=True),
])
def grep(request, seriesList, pattern):
    """Keep the series whose name matches a regular expression."""
    regex = _compile(pattern)
    return [series for series in seriesList if regex.search(series.name)]


def _compile(pattern):
    """Client regexes are RE2's: linear time, so no pattern can stall the server."""
    try:
        return compile_regex(pattern)
    except BadPattern as error:
        raise RenderError(str(error)) from None


def _substitute(regex, replace, name) -> str:
    """regex.sub with the user's replacement; a RenderError (400) when it is bad."""
    try:
        return regex.sub(replace, str(name))  # verticalLine() without a label has no name
    except (IndexError, KeyError, ValueError) as error:
        raise RenderError(f"invalid replacement {replace!r}: {error}") from None


@series_function("removeEmptySeries", group="Filter Series", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("xFilesFactor", FLOAT),
])
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


@series_function("useSeriesAbove", group="Filter Series", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("value", FLOAT, required=True),
    Param("search", STRING, required=True),
    Param("replace", STRING, required=True),
])
async def useSeriesAbove(request, seriesList, value, search, replace):
    """For series whose maximum is above value, fetch the series named by a regex substitution."""
    regex = _compile(search)
    names = [_substitute(regex, replace, series.name) for series in seriesList if safe_max(series, -INF) > value]
    if not names:
        return []
    found = await request.evaluate("group(%s)" % ",".join(names), request.context)
    return [series for series in found if series is not None and len(series) > 0]


# Filter Data


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


# Sorting


@series_function("sortBy", group="Sorting", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("func", AGG_FUNC, default="average"),
    Param("reverse", BOOLEAN, default=False),
])
def sortBy(request, seriesList, func="average", reverse=False):
    """Sort by an aggregate of each series (None first)."""
    seriesList.sort(key=none_last_key(get_agg_func(func)), reverse=reverse)
    return seriesList


@series_function("sortByName", group="Sorting", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("natural", BOOLEAN, default=False),
    Param("reverse", BOOLEAN, default=False),
])
def sortByName(request, seriesList, natural=False, reverse=False):
    """Sort by name, optionally naturally (server2 before server10)."""
    def natural_key(series):
        return re.sub(r"(\d+)", lambda m: "{0:010}".format(int(m.group(0))), series.name)
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


# Alias


@series_function("alias", group="Alias", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("newName", STRING, required=True),
])
def alias(request, seriesList, newName):
    """Rename every series."""
    for series in seriesList:
        series.name = newName
    return seriesList


@series_function("aliasSub", group="Alias", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("search", STRING, required=True),
    Param("replace", STRING, required=True),
])
def aliasSub(request, seriesList, search, replace):
    """Rename with a regular-expression substitution (\\1 back-references)."""
    regex = _compile(search)
    for series in seriesList:
        series.name = _substitute(regex, replace, series.name)
    return seriesList


@series_function("aliasByNode", group="Alias", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("nodes", NODE_OR_TAG, required=True, multiple=True),
])
def aliasByNode(request, seriesList, *nodes):
    """Rename to the given nodes of the name (negative from the end) or tag values, joined by dots."""
    for series in seriesList:
        series.name = aggregation_key(series, nodes)
    return seriesList


@series_function("aliasByTags", group="Alias", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("tags", NODE_OR_TAG, required=True, multiple=True),
])
def aliasByTags(request, seriesList, *tags):
    """aliasByNode with tag names (nodes also accepted)."""
    return aliasByNode(request, seriesList, *tags)


@series_function("aliasByMetric", group="Alias", params=[Param("seriesList", SERIES_LIST, required=True)])
def aliasByMetric(request, seriesList):
    """Rename to the last node of the metric path."""
    return substr(request, seriesList, -1, 0)


@series_function("aliasQuery", group="Alias", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("search", STRING, required=True),
    Param("replace", STRING, required=True),
    Param("newName", STRING, required=True),
])
async def aliasQuery(request, seriesList, search, replace, newName):
    """Rename with the last value of another series found by a regex substitution of the name."""
    regex = _compile(search)
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
            raise RenderError(f"aliasQuery(): newName {newName!r} needs one %-placeholder for the value: {error}") from None
    return seriesList


@series_function("legendValue", group="Alias", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("valuesTypes", STRING, multiple=True,
          options=VALID_AGG_FUNCS + [name + "Series" for name in VALID_AGG_FUNCS] + ["si", "binary"],
          strict_options=False),
])
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
                formatted = value if isinstance(value, str) else (
                    None if value is None else "%.2f%s" % format_units(value, system=system))
                series.name = "%-20s%-5s%-10s" % (series.name, value_type, formatted)
    return seriesList


# Graph (styling is recorded in series.options for a renderer; values pass through)


@series_function("color", group="Graph", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("theColor", STRING, required=True),
])
def color(request, seriesList, theColor):
    """Set the line colour."""
    for series in seriesList:
        series.color = theColor
        series.options["color"] = theColor
    return seriesList


@series_function("alpha", group="Graph", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("alpha", FLOAT, required=True),
])
def alpha(request, seriesList, alpha):
    """Set the transparency (0..1)."""
    for series in seriesList:
        series.options["alpha"] = alpha
    return seriesList


@series_function("lineWidth", group="Graph", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("width", FLOAT, required=True),
])
def lineWidth(request, seriesList, width):
    """Set the line width."""
    for series in seriesList:
        series.options["lineWidth"] = width
    return seriesList


@series_function("dashed", group="Graph", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("dashLength", INTEGER, default=5),
])
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


@series_function("stacked", group="Graph", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("stack", STRING),
])
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


@series_function("threshold", group="Graph", params=[
    Param("value", FLOAT, required=True),
    Param("label", STRING),
    Param("color", STRING),
])
def threshold(request, value, label=None, color=None):
    """A constant line, optionally labelled and coloured."""
    series = constantLine(request, value)[0]
    if label:
        series.name = label
    if color:
        series.color = color
        series.options["color"] = color
    return [series]


@series_function("verticalLine", group="Graph", params=[
    Param("ts", DATE, required=True),
    Param("label", STRING),
    Param("color", STRING),
])
def verticalLine(request, ts, label=None, color=None):
    """A vertical line at a time inside the requested range."""
    context = request.context
    timestamp = _parse_date(ts, context)
    if timestamp < context.start:
        raise RenderError("verticalLine(): timestamp %s exists before start of range" % timestamp)
    if timestamp > context.end:
        raise RenderError("verticalLine(): timestamp %s exists after end of range" % timestamp)
    # without a label graphite-web answers a series named None (tags {"name": "None"})
    series = TimeSeries(label, timestamp, timestamp, 1, [1.0, 1.0], tags=None if label else {"name": label},
                        x_files_factor=context.x_files_factor)
    series.options["drawAsInfinite"] = True
    if color:
        series.color = color
        series.options["color"] = color
    return [series]


# Special


@series_function("constantLine", group="Special", params=[Param("value", FLOAT, required=True)])
def constantLine(request, value):
    """A horizontal line: three points spanning the requested range."""
    context = request.context
    step = int((context.end - context.start) / 2.0)
    series = TimeSeries(str(value), context.start, context.end, step, [value, value, value],
                        x_files_factor=context.x_files_factor)
    series.pathExpression = "constantLine(%s)" % value
    return [series]


@series_function("consolidateBy", group="Special", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("consolidationFunc", STRING, required=True, options=list(CONSOLIDATION_FUNCTIONS)),
])
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


@series_function("setXFilesFactor", "xFilesFactor", group="Special", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("xFilesFactor", FLOAT, required=True),
])
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


@series_function("substr", group="Special", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("start", NODE, default=0),
    Param("stop", NODE, default=0),
])
def substr(request, seriesList, start=0, stop=0):
    """Rename to a slice of the dotted nodes of the innermost path in the name."""
    for series in seriesList:
        left = series.name.rfind("(") + 1
        right = series.name.find(")")
        if right < 0:
            right = len(series.name) + 1
        nodes = series.name[left:right].split(".")
        name = ".".join(nodes[int(start):] if int(stop) == 0 else nodes[int(start):int(stop)])
        series.name = re.sub(",.*$", "", name)
    return seriesList


@series_function("fallbackSeries", group="Special", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("fallback", SERIES_LIST, required=True),
])
def fallbackSeries(request, seriesList, fallback):
    """The series list, or the fallback when it is empty."""
    return seriesList if seriesList else fallback


@series_function("cactiStyle", group="Special", params=[
    Param("seriesList", SERIES_LIST, required=True),
    Param("system", STRING, options=["si", "binary"]),
    Param("units", STRING),
])
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
            -name_width, series.name, -last_width, last, -max_width, maximum, -min_width, minimum)
    return seriesList


@series_function("randomWalk", "randomWalkFunction", group="Special", params=[
    Param("name", STRING, required=True),
    Param("step", INTEGER, default=60),
])
def randomWalkFunction(request, name, step=60):
    """A random walk from 0, for testing."""
    context = request.context
    values = []
    current = 0
    for _ in _generated_times(context, step, f"randomWalk({name!r}, {step})"):
        values.append(current)
        current += random.random() - 0.5
    return [TimeSeries(name, context.start, context.end, step, values, x_files_factor=context.x_files_factor)]


@series_function("seriesByTag", group="Special", params=[
    Param("tagExpressions", STRING, required=True, multiple=True),
])
def seriesByTag(request, *tagExpressions):
    """Series matching all tag expressions (tag=v, tag!=v, tag=~regex, tag!=~regex); the evaluator fetches them."""
    raise RenderError("seriesByTag is evaluated by the fetcher")

