"""Functions over range vectors (``rate(x[5m])``, ``*_over_time``...), Prometheus 2.x semantics,
computed for every step at once: per series, each step's window is a slice of its samples."""

import itertools
import math

import numpy as np

from gateway.query.promql.values import (
    RECONCILED,
    LabelsKey,
    PromQLError,
    RangeVector,
    Series,
    Vector,
    drop_metric_name,
    gather,
    labels_key,
    metric_name,
    mixed_schemas_warning,
    stacked,
)
from protocols.prometheus.native_histogram import (
    NO_RESET_HINT,
    RESET_HINT,
    Histogram,
    HistogramMean,
    HistogramSum,
    IncompatibleBuckets,
)
from protocols.prometheus.types_pb2 import Histogram as HistogramMessage

GAUGE_HINT = HistogramMessage.GAUGE

STACK_CELLS = 12_000  # samples and (series, step) cells _all_series evaluates at once


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


def _all_series(matrix: RangeVector, compute, keep_name: bool = False) -> Vector:
    """As _per_series, many series at once: their samples are laid end to end and every window
    becomes a (series, step) pair of indexes into them. For the functions that only look at a
    window's ends and at pairs of neighbours inside it, which never straddle two series."""
    lengths = np.fromiter((len(s.timestamps) for s in matrix.series), np.int64, len(matrix.series))
    sampled = np.flatnonzero(lengths)
    series = matrix.series if len(sampled) == len(lengths) else [matrix.series[i] for i in sampled]
    lengths = lengths[sampled]
    labels, rows, masks = [], [], []
    for first, end in series_stacks(lengths, len(matrix.refs)):
        matrix.guard.check()
        part = series[first:end]
        timestamps = np.concatenate([s.timestamps for s in part])
        values = np.concatenate([s.values for s in part])
        lo, hi = matrix.stacked_windows(timestamps, lengths[first:end])
        result, present = compute(Series({}, timestamps, values), lo, hi)
        keep = present.any(axis=1)
        labels += [s.labels if keep_name else drop_metric_name(s.labels) for s, kept in zip(part, keep) if kept]
        rows.append(np.asarray(result)[keep])
        masks.append(present[keep])
    if not labels:
        return Vector.empty(len(matrix.refs))
    return Vector(labels, np.vstack(rows), np.vstack(masks))


def series_stacks(lengths: np.ndarray, steps: int) -> list[tuple[int, int]]:
    """Runs of series (first, end) of about STACK_CELLS samples and (series, step) cells each,
    one series at least: arrays of that size stay in the processor's cache and in the
    allocator's heap (larger ones are mapped afresh, a page fault every 4 KiB of every
    temporary: all series at once cost twice the loop they save), and the deadline is checked
    between them."""
    totals = np.cumsum(lengths + steps)
    runs, first = [], 0
    while first < len(lengths):
        before = int(totals[first - 1]) if first else 0
        end = max(int(np.searchsorted(totals, before + STACK_CELLS, side="right")), first + 1)
        runs.append((first, end))
        first = end
    return runs


def _prefix(flags: np.ndarray) -> np.ndarray:
    """Cumulative sums with a leading 0, so a window [lo, hi) sums as p[hi] - p[lo]."""
    return np.concatenate([[0.0], np.cumsum(flags, dtype=np.float64)])


def _between_samples(values: np.ndarray, amount: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Sum of ``amount[i]`` (a quantity of the pair i-1, i) over the pairs inside each window."""
    prefix = _prefix(np.concatenate([[0.0], amount]))
    return np.where(hi - lo >= 2, prefix[np.maximum(hi, 1)] - prefix[np.minimum(lo + 1, len(values))], 0.0)


def _with_resets(values: np.ndarray, result: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``result`` plus the value before each counter reset inside each window, added one after
    the other in time order as Prometheus adds them. (A difference of prefix sums would carry the
    rounding of every earlier reset of the series into the window: the rate would differ from
    Prometheus's in its last bits, and ceil() of a rate that is a whole number by 1.)"""
    is_reset = np.zeros(len(values), dtype=bool)
    is_reset[1:] = values[1:] < values[:-1]
    after_reset = np.flatnonzero(is_reset)
    resets_before = np.concatenate([[0], np.cumsum(is_reset)])  # [i]: the resets before sample i
    first, end = resets_before[np.minimum(lo + 1, len(values))], resets_before[hi]
    for k in range(int((end - first).max(initial=0))):
        index = first + k
        inside = index < end
        before = values[after_reset[np.minimum(index, len(after_reset) - 1)] - 1]
        result = np.where(inside, result + before, result)
    return result


def extrapolated_rate(matrix: RangeVector, is_counter: bool, is_rate: bool) -> Vector:
    if matrix.modifier is not None:
        return extended_rate(matrix, is_counter, is_rate)
    range_s = matrix.range_ms / 1000

    def compute(series: Series, lo, hi):
        """Over the windows of two samples or more alone (a series lives in a few of a range's
        windows where series churn)."""
        ts, vs = series.timestamps, series.values
        present = hi - lo >= 2
        answer = np.zeros(lo.shape)
        cells = np.flatnonzero(present)
        if not len(cells):
            return answer, present
        lo, hi = lo.ravel()[cells], hi.ravel()[cells]
        range_end = np.broadcast_to(matrix.refs, present.shape).ravel()[cells]
        first_i, last_i = lo, hi - 1
        first, last = vs[first_i], vs[last_i]
        result = last - first
        if is_counter:
            result = _with_resets(vs, result, lo, hi)
        to_start = (ts[first_i] - (range_end - matrix.range_ms)) / 1000
        to_end = (range_end - ts[last_i]) / 1000
        sampled = (ts[last_i] - ts[first_i]) / 1000
        with np.errstate(divide="ignore", invalid="ignore"):
            average = sampled / (hi - lo - 1)
            threshold = average * 1.1
            to_start = np.where(to_start < threshold, to_start, average / 2)
            if is_counter:  # Prometheus 3: the zero point bounds the start after the threshold's cut
                to_zero = sampled * (first / result)
                to_start = np.where((result > 0) & (first >= 0) & (to_zero < to_start), to_zero, to_start)
            to_end = np.where(to_end < threshold, to_end, average / 2)
            factor = (sampled + to_start + to_end) / sampled
            if is_rate:
                factor = factor / range_s
            answer.ravel()[cells] = result * factor
            return answer, present

    return _all_series(matrix, compute)


def _interpolated(ts: np.ndarray, vs: np.ndarray, before: np.ndarray, at: np.ndarray, is_counter: bool) -> np.ndarray:
    """The value at ``at`` on the line from sample ``before`` to the next; a counter that falls
    between them restarts from 0 (Prometheus's interpolate)."""
    after = np.minimum(before + 1, len(vs) - 1)
    y1, y2 = vs[before], vs[after]
    if is_counter:
        y1 = np.where(y2 < y1, 0.0, y1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return y1 + (y2 - y1) * (at - ts[before]) / (ts[after] - ts[before])


def _extended_ends(matrix: RangeVector, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per step of an anchored or smoothed window over the samples at ``ts``: the first sample
    read (a lookback before the window), the left and right boundary samples, and whether
    there is a value (a sample after the window's start; smoothed, one at or before its end)."""
    smoothed = matrix.modifier == "smoothed"
    range_start, range_end = matrix.refs - matrix.range_ms, matrix.refs
    last_index = len(ts) - 1
    lo = np.searchsorted(ts, range_start - matrix.lookback_ms, side="right")
    hi = np.searchsorted(ts, range_end + (matrix.lookback_ms if smoothed else 0), side="right")
    count = hi - lo
    first = lo + np.maximum(np.minimum(np.searchsorted(ts, range_start, side="right") - lo, count - 1) - 1, 0)
    last = lo + np.minimum(np.searchsorted(ts, range_end, side="left") - lo, count - 1) if smoothed else hi - 1
    first, last = np.clip(first, 0, last_index), np.clip(last, 0, last_index)
    present = (count > 0) & (ts[last] > range_start)
    if smoothed:
        present &= ts[first] <= range_end
    return lo, first, last, present


def extended_samples(matrix: RangeVector) -> RangeVector:
    """An anchored or smoothed range selector answered as it is, at one time (Prometheus's
    extendFloats): each series' samples inside the window between a sample at its start (the
    anchor's value, or smoothed the value interpolated there) and one at its end (the last
    value, or smoothed interpolated there). The window is widened by a millisecond so that it
    holds the sample at its start."""
    if matrix.histogram_series:
        raise PromQLError(f"{matrix.modifier} modifier is not supported with histograms")
    smoothed = matrix.modifier == "smoothed"
    start, end = int(matrix.refs[0]) - matrix.range_ms, int(matrix.refs[0])
    extended = []
    for series in matrix.series:
        ts, vs = series.timestamps, series.values
        if not len(ts):
            continue
        lo, firsts, lasts, present = _extended_ends(matrix, ts)
        if not present[0]:
            continue
        first, last = int(firsts[0]), int(lasts[0])
        left, right = vs[first], vs[last]
        if smoothed and ts[first] < start:
            left = _interpolated(ts, vs, np.array(first), np.array(start), False)
        if smoothed and last > lo[0] and ts[last] > end:
            right = _interpolated(ts, vs, np.array(last - 1), np.array(end), False)
        inner = slice(first + int(ts[first] <= start), last + 1 - int(ts[last] >= end))
        extended.append(
            Series(
                series.labels,
                np.concatenate([[start], ts[inner], [end]]).astype(np.int64),
                np.concatenate([[left], vs[inner], [right]]).astype(np.float64),
            )
        )
    return RangeVector(extended, matrix.refs, matrix.range_ms + 1, (), matrix.guard)


def extended_rate(matrix: RangeVector, is_counter: bool, is_rate: bool) -> Vector:
    """rate/increase/delta over an anchored or smoothed window (Prometheus 3's extendedRate):
    no extrapolation; the window's left value is its anchor (the last sample at or before its
    start, within the lookback) and its right value its last sample; smoothed, both are the
    series' values interpolated at the window's start and end, from samples up to a lookback
    beyond them. Counter resets between the two are added back."""
    smoothed = matrix.modifier == "smoothed"
    range_start, range_end = matrix.refs - matrix.range_ms, matrix.refs

    def compute(series: Series, _lo, _hi):
        ts, vs = series.timestamps, series.values
        last_index = len(vs) - 1
        lo, first, last, present = _extended_ends(matrix, ts)
        left, right = vs[first], vs[last]
        if smoothed:
            left = np.where(ts[first] < range_start, _interpolated(ts, vs, first, range_start, is_counter), left)
            across_end = (last > lo) & (ts[last] > range_end)
            right = np.where(across_end, _interpolated(ts, vs, np.maximum(last - 1, 0), range_end, is_counter), right)
        result = right - left
        if is_counter:
            inner_first = first + (ts[first] <= range_start)
            inner_last = last - (ts[last] >= range_end)
            inner = inner_last >= inner_first
            at_first, at_last = vs[np.clip(inner_first, 0, last_index)], vs[np.clip(inner_last, 0, last_index)]
            correction = np.where(inner & (at_first < left), left, 0.0)
            correction = _with_resets(
                vs, correction, np.where(inner, inner_first, 0), np.where(inner, inner_last + 1, 0)
            )
            before_right = np.where(inner, at_last, left)
            result = result + (correction + np.where(right < before_right, before_right, 0.0))
        if is_rate:
            result = result / (matrix.range_ms / 1000)
        return result, present

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

    return _all_series(matrix, compute)


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
        ts, vs, mask = gather(series, lo, hi, matrix.guard)
        slope, _ = _linear_regression(ts, vs, mask, ts[:, 0])
        return slope, hi - lo >= 2

    return _per_series(matrix, compute)


def predict_linear(matrix: RangeVector, seconds: np.ndarray, eval_ms: np.ndarray) -> Vector:
    def compute(series: Series, lo, hi):
        ts, vs, mask = gather(series, lo, hi, matrix.guard)
        slope, intercept = _linear_regression(ts, vs, mask, eval_ms)
        return slope * seconds + intercept, hi - lo >= 2

    return _per_series(matrix, compute)


def holt_winters(matrix: RangeVector, smoothing: float, trend: float) -> Vector:
    """Double exponential smoothing of each window, Prometheus 2.42's loop run for all steps at
    once: position by position, only the windows that are that long move on."""
    if not 0 < smoothing < 1:
        raise PromQLError(f"invalid smoothing factor. Expected: 0 < sf < 1, got: {smoothing:f}")
    if not 0 < trend < 1:
        raise PromQLError(f"invalid trend factor. Expected: 0 < tf < 1, got: {trend:f}")

    def compute(series: Series, lo, hi):
        _, vs, mask = gather(series, lo, hi, matrix.guard)
        level_before = np.zeros(len(lo))
        level = vs[:, 0].copy()
        slope = vs[:, min(1, vs.shape[1] - 1)] - vs[:, 0]
        for i in range(1, vs.shape[1]):
            moving = mask[:, i]
            if i > 1:
                slope = np.where(moving, trend * (level - level_before) + (1 - trend) * slope, slope)
            smoothed = smoothing * vs[:, i] + (1 - smoothing) * (level + slope)
            level_before = np.where(moving, level, level_before)
            level = np.where(moving, smoothed, level)
        return level, hi - lo >= 2

    return _per_series(matrix, compute)


def _counting(matrix: RangeVector, counted) -> Vector:
    def compute(series: Series, lo, hi):
        vs = series.values
        flags = counted(vs[1:], vs[:-1]).astype(np.float64) if len(vs) > 1 else np.zeros(0)
        return _between_samples(vs, flags, lo, hi), hi > lo

    return _all_series(matrix, compute)


def changes(matrix: RangeVector) -> Vector:
    floats = _counting(
        _floats_apart(matrix),
        lambda current, previous: (current != previous) & ~(np.isnan(current) & np.isnan(previous)),
    )
    return stacked(
        floats,
        _counting_with_histograms(
            matrix,
            lambda current, previous: current != previous and not (math.isnan(current) and math.isnan(previous)),
            lambda current, previous: current != previous,
        ),
    )


def resets(matrix: RangeVector) -> Vector:
    floats = _counting(_floats_apart(matrix), lambda current, previous: current < previous)
    return stacked(
        floats,
        _counting_with_histograms(
            matrix,
            lambda current, previous: current < previous,
            lambda current, previous: current.detect_reset(previous),
        ),
    )


def _floats_apart(matrix: RangeVector) -> RangeVector:
    """The matrix without the float series of the series holding histograms too."""
    with_histograms = {labels_key(s.labels) for s in matrix.histogram_series}
    return matrix._replace(series=[s for s in matrix.series if labels_key(s.labels) not in with_histograms])


def _counting_with_histograms(matrix: RangeVector, float_counted, histogram_counted) -> Vector:
    """changes/resets over the series that hold native histograms (and maybe floats): each pair
    of neighbours in the window, floats and histograms in time order, counted by
    ``float_counted``/``histogram_counted(current, previous)`` when both are of one kind, always
    when the kind changes (as Prometheus 3 does)."""
    steps = len(matrix.refs)
    floats = {labels_key(s.labels): s for s in matrix.series}
    labels, rows, masks = [], [], []
    for series in matrix.histogram_series:
        other = floats.get(labels_key(series.labels), Series(series.labels, np.zeros(0, np.int64), np.zeros(0)))
        timestamps = np.concatenate([other.timestamps, series.timestamps])
        order = np.argsort(timestamps, kind="stable")
        merged = Series(
            series.labels, timestamps[order], np.concatenate([other.values.astype(object), series.values])[order]
        )
        lo, hi = matrix.windows(merged)
        values = np.zeros(steps)
        for step in np.flatnonzero(hi > lo):
            window = merged.values[lo[step] : hi[step]]
            values[step] = sum(
                bool(_counted(a, b, float_counted, histogram_counted)) for a, b in itertools.pairwise(window)
            )
        if (hi > lo).any():
            labels.append(drop_metric_name(series.labels))
            rows.append(values)
            masks.append(hi > lo)
    if not labels:
        return Vector.empty(steps)
    return Vector(labels, np.vstack(rows), np.vstack(masks))


def _counted(previous, current, float_counted, histogram_counted) -> bool:
    if isinstance(previous, Histogram) != isinstance(current, Histogram):
        return True
    return (histogram_counted if isinstance(current, Histogram) else float_counted)(current, previous)


def over_time(matrix: RangeVector, name: str, parameter: np.ndarray | None = None) -> Vector:
    """The ``<name>_over_time`` family (``quantile_over_time`` takes ``parameter`` per step)."""

    def compute(series: Series, lo, hi):
        present = hi > lo
        count = (hi - lo).astype(np.float64)
        if name == "count":
            return count, present
        if name == "present":
            return np.ones(lo.shape), present
        if name == "last":
            return series.values[np.maximum(hi - 1, 0)], present
        if name == "first":
            return series.values[np.minimum(lo, len(series.values) - 1)], present
        if name == "ts_of_last":
            return series.timestamps[np.maximum(hi - 1, 0)] / 1000, present
        if name == "ts_of_first":
            return series.timestamps[np.minimum(lo, len(series.values) - 1)] / 1000, present
        ts, vs, mask = gather(series, lo, hi, matrix.guard)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            if name == "sum":
                return compensated_sum(np.where(mask, vs, 0.0)), present
            if name in ("min", "max"):
                reduce = np.fmin if name == "min" else np.fmax
                return reduce.reduce(np.where(mask, vs, np.nan), axis=1), present
            if name == "quantile":
                return quantiles(np.where(mask, vs, np.inf), count, parameter), present  # type: ignore[arg-type]  # quantile_over_time passes its parameter
            if name == "mad":
                return _median_absolute_deviation(vs, mask, count), present
            if name in ("ts_of_min", "ts_of_max"):
                return _time_of_extreme(ts, vs, mask, name == "ts_of_max"), present
        raise AssertionError(name)

    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if name == "avg":
            return _windowed(matrix, compensated_mean)
        if name == "stdvar":
            return _windowed(matrix, compensated_variance)
        if name == "stddev":
            return _windowed(matrix, lambda vs, mask: np.sqrt(compensated_variance(vs, mask)))
    stacked = name in ("count", "present", "last", "first", "ts_of_last", "ts_of_first")
    return (_all_series if stacked else _per_series)(matrix, compute, keep_name=name in ("last", "first"))


def over_time_of_histograms(matrix: RangeVector, name: str, floats: Vector, warn) -> Vector:
    """``floats`` (over_time's answer over the float samples) with the native histograms of the
    range taken in, as Prometheus 3 does: ``sum``/``avg`` add them (a window of one series
    holding floats and histograms gives nothing, with a warning); ``count``/``present`` count
    both kinds; ``last``/``first`` and their ``ts_of_`` take the later (earlier) of both."""
    if not matrix.histogram_series:
        return floats
    steps = len(matrix.refs)
    keep_name = name in ("last", "first")
    rows = {labels_key(labels): i for i, labels in enumerate(floats.labels)}
    labels = list(floats.labels)
    values, present = [*floats.values], [*floats.present]
    histograms = [np.full(steps, None, dtype=object) for _ in labels]
    float_series = {labels_key(s.labels): s for s in matrix.series}
    for series in matrix.histogram_series:
        lo, hi = matrix.windows(series)
        holds = hi > lo
        if not holds.any():
            continue
        out_labels = series.labels if keep_name else drop_metric_name(series.labels)
        key = labels_key(out_labels)
        if key not in rows:
            rows[key] = len(labels)
            labels.append(out_labels)
            values.append(np.zeros(steps))
            present.append(np.zeros(steps, dtype=bool))
            histograms.append(np.full(steps, None, dtype=object))
        row = rows[key]
        other = float_series.get(labels_key(series.labels))
        float_lo, float_hi = matrix.windows(other) if other is not None else (lo, lo)
        with_floats = float_hi > float_lo
        if name in ("count", "present"):
            counted = (hi - lo) + np.where(present[row], values[row], 0.0) if name == "count" else np.ones(steps)
            values[row] = np.where(holds, counted, values[row])
            present[row] = present[row] | holds
            continue
        for step in np.flatnonzero(holds):
            window_times = series.timestamps[lo[step] : hi[step]]
            window = series.values[lo[step] : hi[step]]
            if name in ("sum", "avg"):
                if with_floats[step]:
                    warn(
                        f'PromQL warning: encountered a mix of histograms and floats for metric name "{metric_name(series.labels)}"'
                    )
                    present[row][step] = False
                    continue
                total = HistogramMean(window[0]) if name == "avg" else HistogramSum.of(window[0])
                try:
                    for h in window[1:]:
                        total.add(h, on_reconcile=lambda: warn(f"{RECONCILED} aggregation"))
                except IncompatibleBuckets:
                    warn(mixed_schemas_warning(series.labels))
                    continue
                hints = {h.reset_hint for h in window}
                if RESET_HINT in hints and NO_RESET_HINT in hints:
                    warn("PromQL warning: conflicting counter resets during histogram aggregation")
                histograms[row][step] = total.result()
                continue
            latest = name in ("last", "ts_of_last")
            at = window_times[-1] if latest else window_times[0]
            float_at = other.timestamps[float_hi[step] - 1 if latest else float_lo[step]] if with_floats[step] else None  # type: ignore[union-attr]  # other is set where with_floats
            if float_at is not None and (float_at > at if latest else float_at < at):
                continue  # the float sample is the answer already
            if name.startswith("ts_of_"):
                values[row][step], present[row][step] = at / 1000, True
            else:
                present[row][step] = False
                histograms[row][step] = window[-1] if latest else window[0]
    if not labels:
        return Vector.empty(steps)
    return Vector(labels, np.vstack(values), np.vstack(present), None, np.vstack(histograms)).without_absent()


def _median_absolute_deviation(vs: np.ndarray, mask: np.ndarray, count: np.ndarray) -> np.ndarray:
    """mad_over_time: the median of the distances to the median; a window holding NaN gives NaN."""
    half = np.full(len(vs), 0.5)
    median = quantiles(np.where(mask, vs, np.inf), count, half)
    distances = quantiles(np.where(mask, np.abs(vs - median[:, None]), np.inf), count, half)
    return np.where((mask & np.isnan(vs)).any(axis=1), np.nan, distances)


def _time_of_extreme(ts: np.ndarray, vs: np.ndarray, mask: np.ndarray, largest: bool) -> np.ndarray:
    """ts_of_max_over_time/ts_of_min_over_time: when the window's largest (smallest) value was
    last seen, NaN left out unless the window holds nothing else (then its last sample)."""
    extreme = (np.fmax if largest else np.fmin).reduce(np.where(mask, vs, np.nan), axis=1)
    chosen = mask & ((vs == extreme[:, None]) | np.isnan(extreme)[:, None])
    last = chosen.shape[1] - 1 - np.argmax(chosen[:, ::-1], axis=1)
    return ts[np.arange(len(ts)), last] / 1000


WINDOW_ELEMENTS = 1 << 21  # window samples _windowed reduces at once (a few tens of MB)


def _windowed(matrix: RangeVector, reduce) -> Vector:
    """``reduce(values, mask) -> row values`` over every series' windows, a row per series and
    step, the windows of as many series as fit in WINDOW_ELEMENTS at once: for the reductions
    that walk the windows position by position (a numpy call per position, whatever the rows)."""
    steps = len(matrix.refs)
    labels, rows, masks = [], [], []
    batch: list[tuple[dict, np.ndarray, np.ndarray, np.ndarray]] = []

    def flush():
        width = max(vs.shape[1] for _, vs, _, _ in batch)
        values, mask = np.zeros((len(batch) * steps, width)), np.zeros((len(batch) * steps, width), dtype=bool)
        for n, (_, vs, window_mask, _) in enumerate(batch):
            values[n * steps : (n + 1) * steps, : vs.shape[1]] = vs
            mask[n * steps : (n + 1) * steps, : vs.shape[1]] = window_mask
        reduced = np.asarray(reduce(values, mask)).reshape(len(batch), steps)
        for (series_labels, _, _, present), row in zip(batch, reduced):
            labels.append(drop_metric_name(series_labels))
            rows.append(row)
            masks.append(present)
        batch.clear()

    for series in matrix.series:
        lo, hi = matrix.windows(series)
        if not (hi > lo).any():
            continue
        _, vs, mask = gather(series, lo, hi, matrix.guard)
        if batch and (len(batch) + 1) * steps * max(vs.shape[1], *(b[1].shape[1] for b in batch)) > WINDOW_ELEMENTS:
            flush()
        batch.append((series.labels, vs, mask, hi > lo))
    if batch:
        flush()
    if not rows:
        return Vector.empty(steps)
    return Vector(labels, np.vstack(rows), np.vstack(masks))


def _kahan_add(increment: np.ndarray, total: np.ndarray, compensation: np.ndarray):
    """Prometheus 3's kahansum.Inc element-wise: Neumaier's compensated addition, whose
    correction is dropped once the total is infinite."""
    new_total = total + increment
    with np.errstate(invalid="ignore"):
        lost = np.where(
            np.abs(total) >= np.abs(increment), (total - new_total) + increment, (increment - new_total) + total
        )
    return new_total, np.where(np.isinf(new_total), 0.0, compensation + lost)


def _where(condition: np.ndarray, chosen: np.ndarray, other: np.ndarray) -> np.ndarray:
    """np.where, without the copy when every row is chosen (most window positions)."""
    return chosen if condition.all() else np.where(condition, chosen, other)


def compensated_sum(rows: np.ndarray, axis: int = 1) -> np.ndarray:
    """sum_over_time as Prometheus 2.42 adds each row (zeros padding its end) along ``axis``:
    Neumaier's running sum, whose running totals are a cumulative sum and whose corrections add
    up likewise, so no loop is needed; an infinite total is answered as it is. (Summing along
    the axis the array is laid out in: a transposed view costs strided passes.)"""
    totals = np.cumsum(rows, axis=axis)
    before = np.zeros_like(totals)
    if axis == 0:
        before[1:] = totals[:-1]
    else:
        before[:, 1:] = totals[:, :-1]
    lost = np.where(np.abs(before) >= np.abs(rows), (before - totals) + rows, (rows - totals) + before)
    total, compensation = np.take(totals, -1, axis=axis), np.take(np.cumsum(lost, axis=axis), -1, axis=axis)
    return np.where(np.isinf(total), total, total + compensation)


class KahanMean:
    """Prometheus 3's mean (avg, avg_over_time) of many cells at once: a Kahan sum divided by
    the count while the sum stays finite; a cell whose sum would overflow goes on as an
    incremental mean (with Kahan summation too) from there. ``add`` takes the next value of
    the cells at ``where`` (an index into the cells) where ``moves``."""

    def __init__(self, shape: tuple[int, ...]):
        self.total, self.lost, self.count = np.zeros(shape), np.zeros(shape), np.zeros(shape)
        self.mean, self.mean_lost = np.zeros(shape), np.zeros(shape)
        self.incremental = np.zeros(shape, dtype=bool)

    def add(self, where, value: np.ndarray, moves: np.ndarray) -> None:
        total, lost, mean, mean_lost = self.total[where], self.lost[where], self.mean[where], self.mean_lost[where]
        count, incremental = self.count[where] + moves, self.incremental[where]
        first = moves & (count == 1)
        summing = moves & ~first & ~incremental
        added, added_lost = _kahan_add(value, total, lost)
        overflows = summing & np.isinf(added)
        if overflows.any():
            incremental = incremental | overflows
            mean = np.where(overflows, total / (count - 1), mean)
            mean_lost = np.where(overflows, lost / (count - 1), mean_lost)
        summing &= ~overflows
        self.total[where] = np.where(first, value, np.where(summing, added, total))
        self.lost[where] = np.where(first, 0.0, np.where(summing, added_lost, lost))
        stepping = moves & incremental
        if stepping.any():
            counted = np.maximum(count, 1)
            share = (counted - 1) / counted
            moved, moved_lost = _kahan_add(value / counted, share * mean, share * mean_lost)
            mean, mean_lost = np.where(stepping, moved, mean), np.where(stepping, moved_lost, mean_lost)
        self.mean[where], self.mean_lost[where] = mean, mean_lost
        self.count[where], self.incremental[where] = count, incremental

    def result(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(
                self.incremental, self.mean + self.mean_lost, self.total / self.count + self.lost / self.count
            )


def compensated_mean(rows: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """avg_over_time as Prometheus 3 computes it (KahanMean), window position by position, all
    steps at once."""
    mean = KahanMean((len(rows),))
    for column in range(rows.shape[1]):
        mean.add(slice(None), rows[:, column], mask[:, column])
    return mean.result()


def compensated_variance(rows: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """stdvar_over_time as Prometheus 2.42 computes it: Welford's running update with Kahan
    summation of the mean and of the squares (identical values give exactly 0)."""
    zeros = np.zeros(len(rows))
    mean, mean_lost, squares, squares_lost, count = zeros, zeros, zeros, zeros, zeros
    for column in range(rows.shape[1]):
        value, taken = rows[:, column], mask[:, column]
        count = count + taken
        delta = value - (mean + mean_lost)
        new_mean, new_mean_lost = _kahan_add(delta / count, mean, mean_lost)
        new_squares, new_squares_lost = _kahan_add(delta * (value - (new_mean + new_mean_lost)), squares, squares_lost)
        mean, mean_lost = _where(taken, new_mean, mean), _where(taken, new_mean_lost, mean_lost)
        squares, squares_lost = _where(taken, new_squares, squares), _where(taken, new_squares_lost, squares_lost)
    return (squares + squares_lost) / count


def quantiles(rows: np.ndarray, count: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Prometheus's quantile (linear interpolation between closest ranks) of each row's first
    ``count`` values once sorted, NaN first as Prometheus sorts them (padding sorts last as
    +Inf); q < 0 is -Inf, q > 1 is +Inf. Both ranks always count, so an infinite value at the
    rank gives NaN (Inf * 0), as in Prometheus."""
    ordered = np.take_along_axis(rows, np.lexsort((rows, ~np.isnan(rows)), axis=1), axis=1)
    with np.errstate(invalid="ignore"):
        rank = np.clip(q, 0, 1) * (count - 1)
    lower = np.clip(np.floor(np.nan_to_num(rank)), 0, np.maximum(count - 1, 0)).astype(np.int64)
    upper = np.minimum(lower + 1, np.maximum(count - 1, 0).astype(np.int64))
    weight = rank - lower
    pick = np.arange(len(ordered))
    result = ordered[pick, lower] * (1 - weight) + ordered[pick, upper] * weight
    result = np.where(q < 0, -np.inf, np.where(q > 1, np.inf, result))
    return np.where(np.isnan(q), np.nan, result)


def absent_over_time(matrix: RangeVector, labels: dict) -> Vector:
    steps = len(matrix.refs)
    seen = np.zeros(steps, dtype=bool)
    for series in (*matrix.series, *matrix.histogram_series):
        lo, hi = matrix.windows(series)
        seen |= hi > lo
    return Vector([labels], np.ones((1, steps)), ~seen[None, :]).without_absent()


def histogram_rate(matrix: RangeVector, is_counter: bool, is_rate: bool, warn) -> Vector:
    """rate/increase (counters) and delta (gauges) of native histograms: last minus first in the
    lowest schema of the window, counter resets added back (histogramRate; a reset at the second
    sample starts from nothing), then extrapolated as extrapolated_rate does floats, the zero
    point taken from the counts. Custom bounds that differ are reconciled, with an info; a window
    mixing exponential and custom buckets is left out with a warning, as Prometheus 3 does."""
    if matrix.modifier is not None:
        return extended_histogram_rate(matrix, is_counter, is_rate, warn)
    range_s = matrix.range_ms / 1000
    range_start, range_end = matrix.refs - matrix.range_ms, matrix.refs

    def compute(series: Series, lo, hi):
        out = np.full(len(lo), None, dtype=object)
        ts, hs = series.timestamps, series.values
        for step in np.flatnonzero(hi - lo >= 2):
            window = hs[lo[step] : hi[step]]
            first, last = window[0], window[-1]
            _warn_kind(window if is_counter else (first, last), is_counter, series.labels, warn)
            if is_counter and window[1].detect_reset(first):  # from nothing, in the second's layout
                second = window[1]
                first = Histogram(second.schema, 0.0, 0.0, 0.0, 0.0, {}, {}, second.custom_values)
            if len({h.custom for h in ([first, *window[1:]] if is_counter else (first, last))}) > 1:
                warn(mixed_schemas_warning(series.labels))
                continue
            try:
                result = last.reduced(
                    min(h.schema for h in [first, *window[1:]]) if is_counter else min(first.schema, last.schema)
                ).sub(first, lambda: warn(f"{RECONCILED} subtraction"))
                if is_counter:
                    for previous, current in itertools.pairwise([first, *window[1:]]):
                        if current.detect_reset(previous):
                            result = result.add(previous, on_reconcile=lambda: warn(f"{RECONCILED} addition"))
            except IncompatibleBuckets:
                warn(mixed_schemas_warning(series.labels))
                continue
            first_ms, last_ms = ts[lo[step]], ts[hi[step] - 1]
            sampled = (last_ms - first_ms) / 1000
            average = sampled / (len(window) - 1)
            to_start, to_end = (first_ms - range_start[step]) / 1000, (range_end[step] - last_ms) / 1000
            threshold = average * 1.1
            to_start = to_start if to_start < threshold else average / 2
            if is_counter and result.count > 0 and window[0].count >= 0:  # not below zero (Prometheus 3)
                to_start = min(to_start, sampled * (window[0].count / result.count))
            interval = sampled + to_start + (to_end if to_end < threshold else average / 2)
            factor = interval / sampled / (range_s if is_rate else 1)
            out[step] = result.scale(factor).copy(reset_hint=GAUGE_HINT)
        return out

    return _histogram_rows(matrix, compute)


def interpolated_histogram(
    h1: Histogram, t1: int, h2: Histogram, t2: int, at: int, is_counter: bool, warn
) -> Histogram:
    """The histogram at ``at`` on the line from ``h1`` to ``h2``; a counter reset between them
    restarts from nothing (Prometheus's interpolateHistograms). IncompatibleBuckets where one
    has exponential and the other custom buckets."""
    if at == t1:
        return h1
    if at == t2:
        return h2
    fraction = (at - t1) / (t2 - t1)
    if is_counter and h2.detect_reset(h1):
        return h2.scale(fraction)
    difference = h2.sub(h1, lambda: warn(f"{RECONCILED} subtraction"))
    line = difference.scale(fraction).add(h1, on_reconcile=lambda: warn(f"{RECONCILED} addition"))
    return line.copy(reset_hint=_hint_of_sum(h2.reset_hint, h1.reset_hint))


def _hint_of_sum(receiver: int, other: int) -> int:
    """The reset hint of ``receiver`` plus or minus ``other`` (Prometheus's adjustCounterReset):
    kept where both agree, a gauge where either is one, else unknown."""
    if receiver == other:
        return receiver
    return GAUGE_HINT if GAUGE_HINT in (receiver, other) else 0


def extended_histogram_rate(matrix: RangeVector, is_counter: bool, is_rate: bool, warn) -> Vector:
    """extended_rate of native histograms (Prometheus 3's extendedHistogramRate): right minus
    left, counter resets between them added back, no extrapolation."""
    smoothed = matrix.modifier == "smoothed"
    range_start, range_end = matrix.refs - matrix.range_ms, matrix.refs

    def compute(series: Series, _lo, _hi):
        out = np.full(len(matrix.refs), None, dtype=object)
        ts, hs = series.timestamps, series.values
        lo, firsts, lasts, present = _extended_ends(matrix, ts)
        for step in np.flatnonzero(present):
            first, last, start, end = int(firsts[step]), int(lasts[step]), int(range_start[step]), int(range_end[step])
            window = hs[first : last + 1]
            if len({h.custom for h in window}) > 1:
                warn(mixed_schemas_warning(series.labels))
                continue
            if is_counter:
                _warn_kind(window, True, series.labels, warn)
            try:
                left = hs[first]
                if smoothed and ts[first] < start:
                    left = interpolated_histogram(
                        hs[first], ts[first], hs[first + 1], ts[first + 1], start, is_counter, warn
                    )
                right = hs[last]
                if smoothed and last > lo[step] and ts[last] > end:
                    right = interpolated_histogram(
                        hs[last - 1], ts[last - 1], hs[last], ts[last], end, is_counter, warn
                    )
                if not is_counter:
                    _warn_kind((left, right), False, series.labels, warn)
                result = right.sub(left, lambda: warn(f"{RECONCILED} subtraction"))
                if is_counter:
                    result = _histogram_correction(
                        hs, first, last, left, right, smoothed and ts[first] < start, result, warn
                    )
            except IncompatibleBuckets:
                warn(mixed_schemas_warning(series.labels))
                continue
            if is_rate:
                result = result.scale(1000 / matrix.range_ms)
            out[step] = result.copy(reset_hint=GAUGE_HINT)
        return out

    return _histogram_rows(matrix, compute)


def _histogram_correction(hs, first: int, last: int, left, right, left_interpolated: bool, result, warn):
    """``result`` plus the value before each counter reset from ``left`` through the samples
    between the boundary samples to ``right`` (correctForCounterResetsHistogram): a reset the
    left interpolation spanned is already in ``left``; the last sample is ``right`` itself."""
    inner_first, previous = first + 1, left
    if left_interpolated and hs[first + 1].detect_reset(hs[first]):
        previous = hs[first + 1]
        inner_first += 1
    if inner_first > last:
        return result
    correction = None
    for current in [*hs[inner_first:last], right]:
        if current.detect_reset(previous):
            correction = (
                previous
                if correction is None
                else correction.add(previous, on_reconcile=lambda: warn(f"{RECONCILED} addition"))
            )
        previous = current
    if correction is None:
        return result
    return result.add(correction, on_reconcile=lambda: warn(f"{RECONCILED} addition"))


def _warn_kind(histograms, counter: bool, labels: dict, warn) -> None:
    """Prometheus 3's warnings on a counter function over a gauge histogram (any sample of the
    window hinted so), and on a gauge function over a counter (its ends not hinted gauge)."""
    if counter and any(h.reset_hint == GAUGE_HINT for h in histograms):
        warn(f'PromQL warning: this native histogram metric is not a counter: "{metric_name(labels)}"')
    elif not counter and any(h.reset_hint != GAUGE_HINT for h in histograms):
        warn(f'PromQL warning: this native histogram metric is not a gauge: "{metric_name(labels)}"')


def histogram_instant_rate(matrix: RangeVector, is_rate: bool, warn) -> Vector:
    """irate/idelta of native histograms: the last two samples (irate: the last alone after a
    counter reset), per second for irate."""

    def compute(series: Series, lo, hi):
        out = np.full(len(lo), None, dtype=object)
        ts, hs = series.timestamps, series.values
        for step in np.flatnonzero(hi - lo >= 2):
            previous, last = hs[hi[step] - 2], hs[hi[step] - 1]
            interval = (ts[hi[step] - 1] - ts[hi[step] - 2]) / 1000
            if interval == 0:
                continue
            _warn_kind((previous, last), is_rate, series.labels, warn)
            try:
                result = (
                    last
                    if is_rate and last.detect_reset(previous)
                    else last.sub(previous, lambda: warn(f"{RECONCILED} subtraction"))
                )
            except IncompatibleBuckets:
                warn(mixed_schemas_warning(series.labels))
                continue
            out[step] = (result.scale(1 / interval) if is_rate else result).copy(reset_hint=GAUGE_HINT)
        return out

    return _histogram_rows(matrix, compute)


def _histogram_rows(matrix: RangeVector, compute) -> Vector:
    """``compute(series, lo, hi) -> object row`` for every histogram series, as a Vector of
    histogram samples (kinds_apart then leaves out what a series holding floats too gives)."""
    steps = len(matrix.refs)
    if not matrix.histogram_series:
        return Vector.empty(steps)
    labels, rows = [], []
    for series in matrix.histogram_series:
        lo, hi = matrix.windows(series)
        row = compute(series, lo, hi)
        if np.not_equal(row, None).any():  # type: ignore[call-overload]  # numpy's stubs: None in an object array
            labels.append(drop_metric_name(series.labels))
            rows.append(row)
    if not rows:
        return Vector.empty(steps)
    return Vector(labels, np.zeros((len(rows), steps)), np.zeros((len(rows), steps), dtype=bool), None, np.vstack(rows))


def kinds_apart(matrix: RangeVector, answer: Vector, warn, last_two: bool = False) -> Vector:
    """A rate-like function's ``answer`` (its float rows and its histogram rows, names dropped)
    as Prometheus 3 gives it for a series holding floats and histograms both: nothing where the
    window holds both kinds (``last_two``: where its last two samples are of both kinds, irate
    and idelta), with a warning; elsewhere only the answer of the kind the window holds."""
    if not matrix.histogram_series:  # the usual case: no series to look up (a key a series costs)
        return answer.without_absent()
    floats = {labels_key(s.labels): s for s in matrix.series}
    present, histograms = answer.present, answer.histograms
    rows: dict[LabelsKey, list[int]] = {}
    for index, row_labels in enumerate(answer.labels):
        rows.setdefault(labels_key(row_labels), []).append(index)
    for series in matrix.histogram_series:
        other = floats.get(labels_key(series.labels))
        if other is None:
            continue
        float_keep, histogram_keep = (_last_two_kinds if last_two else _window_kinds)(matrix, other, series)
        if (~float_keep & ~histogram_keep & _holds_two(matrix, other, series, last_two)).any():
            warn(
                "PromQL warning: encountered a mix of histograms and floats for metric name"
                f' "{metric_name(series.labels)}"'
            )
        present, histograms = present.copy(), histograms.copy() if histograms is not None else None
        for row in rows.get(labels_key(drop_metric_name(series.labels)), []):
            present[row] &= float_keep
            if histograms is not None:
                histograms[row, ~histogram_keep] = None
    return answer._replace(present=present, histograms=histograms).without_absent()


def _window_kinds(matrix: RangeVector, floats: Series, histograms: Series) -> tuple[np.ndarray, np.ndarray]:
    """Per step, whether the window holds floats only, histograms only."""
    float_lo, float_hi = matrix.windows(floats)
    lo, hi = matrix.windows(histograms)
    return hi == lo, float_hi == float_lo


def _last_two_kinds(matrix: RangeVector, floats: Series, histograms: Series) -> tuple[np.ndarray, np.ndarray]:
    """Per step, whether the window's last two samples are floats, histograms."""
    float_lo, float_hi = matrix.windows(floats)
    lo, hi = matrix.windows(histograms)

    def time(series: Series, lo, hi, back: int) -> np.ndarray:
        """The time of the back-th last sample of each window (-inf where there is none)."""
        if not len(series.timestamps):
            return np.full(len(lo), -np.inf)
        at = hi - back
        return np.where(at >= lo, series.timestamps[np.clip(at, 0, len(series.timestamps) - 1)], -np.inf)

    float_last, float_second = time(floats, float_lo, float_hi, 1), time(floats, float_lo, float_hi, 2)
    last, second = time(histograms, lo, hi, 1), time(histograms, lo, hi, 2)
    return float_second > last, second > float_last


def _holds_two(matrix: RangeVector, floats: Series, histograms: Series, last_two: bool) -> np.ndarray:
    """Per step, whether the window holds two samples (``last_two``) or one of each kind."""
    float_lo, float_hi = matrix.windows(floats)
    lo, hi = matrix.windows(histograms)
    if last_two:
        return (hi - lo) + (float_hi - float_lo) >= 2
    return (hi > lo) & (float_hi > float_lo)
