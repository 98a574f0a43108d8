"""Functions over range vectors (``rate(x[5m])``, ``*_over_time``...), Prometheus 2.x semantics,
computed for every step at once: per series, each step's window is a slice of its samples."""

import numpy as np

from gateway.promql.values import RangeVector, Series, Vector, drop_metric_name, gather


def _per_series(matrix: RangeVector, compute, keep_name: bool = False) -> Vector:
    """``compute(series, lo, hi) -> (values, present)`` for every series, stacked into a Vector."""
    labels, rows, masks = [], [], []
    for series in matrix.series:
        lo, hi = matrix.windows(series)
        values, present = compute(series, lo, hi)
        if present.any():
            labels.append(series.labels if keep_name else drop_metric_name(series.labels))
            rows.append(values)
            masks.append(present)
    steps = len(matrix.refs)
    if not rows:
        return Vector.empty(steps)
    return Vector(labels, np.vstack(rows), np.vstack(masks))


def _prefix(flags: np.ndarray) -> np.ndarray:
    """Cumulative sums with a leading 0, so a window [lo, hi) sums as p[hi] - p[lo]."""
    return np.concatenate([[0.0], np.cumsum(flags, dtype=np.float64)])


def _between_samples(values: np.ndarray, amount: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Sum of ``amount[i]`` (a quantity of the pair i-1, i) over the pairs inside each window."""
    prefix = _prefix(np.concatenate([[0.0], amount]))
    return np.where(hi - lo >= 2, prefix[np.maximum(hi, 1)] - prefix[np.minimum(lo + 1, len(values))], 0.0)


def extrapolated_rate(matrix: RangeVector, is_counter: bool, is_rate: bool) -> Vector:
    range_s = matrix.range_ms / 1000

    def compute(series: Series, lo, hi):
        ts, vs = series.timestamps, series.values
        present = hi - lo >= 2
        if not present.any():
            return np.zeros(len(lo)), present
        first_i, last_i = np.minimum(lo, len(vs) - 1), np.maximum(hi - 1, 0)
        first, last = vs[first_i], vs[last_i]
        result = last - first
        if is_counter:
            drops = np.where(vs[1:] < vs[:-1], vs[:-1], 0.0)
            result = result + _between_samples(vs, drops, lo, hi)
        range_start, range_end = matrix.refs - matrix.range_ms, matrix.refs
        to_start = (ts[first_i] - range_start) / 1000
        to_end = (range_end - ts[last_i]) / 1000
        sampled = (ts[last_i] - ts[first_i]) / 1000
        with np.errstate(divide="ignore", invalid="ignore"):
            average = sampled / (hi - lo - 1)
            if is_counter:
                to_zero = sampled * (first / result)
                to_start = np.where((result > 0) & (first >= 0) & (to_zero < to_start), to_zero, to_start)
            threshold = average * 1.1
            interval = sampled + np.where(to_start < threshold, to_start, average / 2) + np.where(to_end < threshold, to_end, average / 2)
            factor = interval / sampled
            if is_rate:
                factor = factor / range_s
            return result * factor, present

    return _per_series(matrix, compute)


def instant_rate(matrix: RangeVector, is_rate: bool) -> Vector:
    def compute(series: Series, lo, hi):
        ts, vs = series.timestamps, series.values
        present = hi - lo >= 2
        last_i, previous_i = np.maximum(hi - 1, 0), np.maximum(hi - 2, 0)
        last, previous = vs[last_i], vs[previous_i]
        interval = ts[last_i] - ts[previous_i]
        present = present & (interval != 0)
        result = np.where(is_rate & (last < previous), last, last - previous)
        if is_rate:
            with np.errstate(divide="ignore", invalid="ignore"):
                result = result / (interval / 1000)
        return result, present

    if not any(len(s.values) for s in matrix.series):
        return Vector.empty(len(matrix.refs))
    return _per_series(matrix, compute)


def _linear_regression(ts, vs, mask, intercept_ms):
    """Prometheus's least squares: slope and intercept per window (x in seconds from intercept_ms)."""
    n = mask.sum(axis=1).astype(np.float64)
    x = np.where(mask, (ts - intercept_ms[:, None]) / 1000, 0.0)
    y = np.where(mask, vs, 0.0)
    sum_x, sum_y = x.sum(axis=1), y.sum(axis=1)
    sum_xy, sum_x2 = (x * y).sum(axis=1), (x * x).sum(axis=1)
    first = vs[:, 0]
    constant = np.all(np.where(mask, vs == first[:, None], True), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cov_xy = sum_xy - sum_x * sum_y / n
        var_x = sum_x2 - sum_x * sum_x / n
        slope = cov_xy / var_x
        intercept = sum_y / n - slope * sum_x / n
    infinite = np.isinf(first)
    slope = np.where(constant, np.where(infinite, np.nan, 0.0), slope)
    intercept = np.where(constant, np.where(infinite, np.nan, first), intercept)
    return slope, intercept


def deriv(matrix: RangeVector) -> Vector:
    def compute(series: Series, lo, hi):
        ts, vs, mask = gather(series, lo, hi)
        slope, _ = _linear_regression(ts, vs, mask, ts[:, 0])
        return slope, hi - lo >= 2

    return _per_series(matrix, compute)


def predict_linear(matrix: RangeVector, seconds: np.ndarray, eval_ms: np.ndarray) -> Vector:
    def compute(series: Series, lo, hi):
        ts, vs, mask = gather(series, lo, hi)
        slope, intercept = _linear_regression(ts, vs, mask, eval_ms)
        return slope * seconds + intercept, hi - lo >= 2

    return _per_series(matrix, compute)


def _counting(matrix: RangeVector, counted) -> Vector:
    def compute(series: Series, lo, hi):
        vs = series.values
        flags = counted(vs[1:], vs[:-1]).astype(np.float64) if len(vs) > 1 else np.zeros(0)
        return _between_samples(vs, flags, lo, hi), hi > lo

    return _per_series(matrix, compute)


def changes(matrix: RangeVector) -> Vector:
    return _counting(matrix, lambda current, previous: (current != previous) & ~(np.isnan(current) & np.isnan(previous)))


def resets(matrix: RangeVector) -> Vector:
    return _counting(matrix, lambda current, previous: current < previous)


def over_time(matrix: RangeVector, name: str, parameter: np.ndarray | None = None) -> Vector:
    """The ``<name>_over_time`` family (``quantile_over_time`` takes ``parameter`` per step)."""

    def compute(series: Series, lo, hi):
        present = hi > lo
        count = (hi - lo).astype(np.float64)
        if name == "count":
            return count, present
        if name == "present":
            return np.ones(len(lo)), present
        if name == "last":
            return series.values[np.maximum(hi - 1, 0)] if len(series.values) else np.zeros(len(lo)), present
        _, vs, mask = gather(series, lo, hi)
        with np.errstate(invalid="ignore", divide="ignore"):
            if name == "sum":
                return np.cumsum(np.where(mask, vs, 0.0), axis=1)[:, -1], present
            if name == "avg":
                return np.cumsum(np.where(mask, vs, 0.0), axis=1)[:, -1] / count, present
            if name in ("min", "max"):
                reduce = np.fmin if name == "min" else np.fmax
                return reduce.reduce(np.where(mask, vs, np.nan), axis=1), present
            if name in ("stddev", "stdvar"):
                mean = np.where(mask, vs, 0.0).sum(axis=1) / count
                variance = np.where(mask, (vs - mean[:, None]) ** 2, 0.0).sum(axis=1) / count
                return (np.sqrt(variance) if name == "stddev" else variance), present
            if name == "quantile":
                return quantiles(np.where(mask, vs, np.inf), count, parameter), present
        raise AssertionError(name)

    return _per_series(matrix, compute)


def quantiles(rows: np.ndarray, count: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Prometheus's quantile (linear interpolation between closest ranks) of each row's first
    ``count`` values once sorted (padding sorts last as +Inf); q < 0 is -Inf, q > 1 is +Inf."""
    ordered = np.sort(rows, axis=1)
    with np.errstate(invalid="ignore"):
        rank = np.clip(q, 0, 1) * (count - 1)
    lower = np.clip(np.floor(np.nan_to_num(rank)), 0, np.maximum(count - 1, 0)).astype(np.int64)
    upper = np.minimum(lower + 1, np.maximum(count - 1, 0).astype(np.int64))
    weight = rank - lower
    pick = np.arange(len(ordered))
    result = ordered[pick, lower] * (1 - weight) + ordered[pick, upper] * weight
    result = np.where(count == 1, ordered[:, 0], result)
    result = np.where(q < 0, -np.inf, np.where(q > 1, np.inf, result))
    return np.where(np.isnan(q), np.nan, result)


def absent_over_time(matrix: RangeVector, labels: dict) -> Vector:
    steps = len(matrix.refs)
    seen = np.zeros(steps, dtype=bool)
    for series in matrix.series:
        lo, hi = matrix.windows(series)
        seen |= hi > lo
    return Vector([labels], np.ones((1, steps)), ~seen[None, :]).without_absent()
