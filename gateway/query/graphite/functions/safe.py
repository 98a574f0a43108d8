"""None-aware aggregation helpers and the aggregation names, as graphite-web's functions/safe.py."""

import math
from functools import reduce

from gateway.query.graphite.errors import RenderError

INF = float("inf")
NAN = float("nan")


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
