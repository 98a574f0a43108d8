"""PromQL's function library (Prometheus 2.42): each takes the evaluated arguments and the call,
and answers a value over all steps. Range functions live in range_functions.py."""

import math
import re
from collections import defaultdict

import numpy as np

from gateway.query.promql import range_functions as ranged
from gateway.query.promql.values import (
    NAME,
    PromQLError,
    RangeVector,
    Scalar,
    Vector,
    drop_metric_name,
    go_float,
    labels_key,
    marked_like,
    merge_same_labels,
    metric_name,
    quantile_warning,
    stacked,
)
from protocols.linear_regex import BadPattern, compile_regex

_ELEMENTWISE = {
    "abs": np.abs,
    "ceil": np.ceil,
    "floor": np.floor,
    "exp": np.exp,
    "sqrt": np.sqrt,
    "ln": np.log,
    "log2": np.log2,
    "log10": np.log10,
    "sgn": np.sign,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "tanh": np.tanh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
    "deg": np.degrees,
    "rad": np.radians,
}
_OVER_TIME = ("avg", "min", "max", "sum", "count", "stddev", "stdvar", "last", "present")
# Prometheus 3's experimental ones (--enable-feature=promql-experimental-functions there)
_OVER_TIME_3 = ("first", "mad", "ts_of_first", "ts_of_last", "ts_of_min", "ts_of_max")


def _elementwise(function):
    def apply(ctx, args, call):
        vector = args[0]
        with np.errstate(all="ignore"):
            return vector.with_values(function(vector.values))

    return apply


def _round(ctx, args, call):
    vector = args[0]
    to = args[1].values if len(args) > 1 else np.ones(ctx.steps)
    with np.errstate(all="ignore"):
        inverse = 1 / to
        return vector.with_values(np.floor(vector.values * inverse + 0.5) / inverse)


# Go's math.Max and math.Min, as Prometheus clamps: a NaN bound (or value) gives NaN.


def _clamp(ctx, args, call):
    vector, low, high = args[0], args[1].values, args[2].values
    present = vector.present & ~np.broadcast_to(low > high, vector.present.shape)
    return vector.with_values(np.maximum(low, np.minimum(high, vector.values)), present)


def _clamp_min(ctx, args, call):
    return args[0].with_values(np.maximum(args[1].values, args[0].values))


def _clamp_max(ctx, args, call):
    return args[0].with_values(np.minimum(args[1].values, args[0].values))


def _time(ctx, args, call):
    return Scalar(ctx.times_ms / 1000)


def _timestamp(ctx, args, call):
    vector = args[0]
    stamps = vector.sample_ms if vector.sample_ms is not None else np.broadcast_to(ctx.times_ms, vector.values.shape)
    return vector.with_values(stamps / 1000)._replace(present=vector.sampled)  # a histogram sample's time too


def _vector(ctx, args, call):
    return Vector([{}], args[0].values[None, :].copy(), np.ones((1, ctx.steps), dtype=bool))


def _scalar(ctx, args, call):
    vector = args[0]
    single = vector.present.sum(axis=0) == 1
    values = np.where(vector.present, vector.values, 0.0).sum(axis=0)
    return Scalar(np.where(single, values, np.nan))


def _min_of(ctx, args, call):
    return Scalar(np.minimum(args[0].values, args[1].values))


def _max_of(ctx, args, call):
    return Scalar(np.maximum(args[0].values, args[1].values))


def _pi(ctx, args, call):
    return Scalar(np.full(ctx.steps, math.pi))


def _date_function(part):
    def apply(ctx, args, call):
        vector = args[0] if args else Vector([{}], (ctx.times_ms / 1000)[None, :], np.ones((1, ctx.steps), dtype=bool))
        seconds = vector.values
        finite = np.isfinite(seconds)
        stamps = np.where(finite, seconds, 0).astype("int64").astype("datetime64[s]")
        days = stamps.astype("datetime64[D]")
        months = stamps.astype("datetime64[M]")
        years = stamps.astype("datetime64[Y]")
        if part == "year":
            result = years.astype(int) + 1970
        elif part == "month":
            result = months.astype(int) % 12 + 1
        elif part == "day_of_month":
            result = (days - months.astype("datetime64[D]")).astype(int) + 1
        elif part == "day_of_year":
            result = (days - years.astype("datetime64[D]")).astype(int) + 1
        elif part == "day_of_week":
            result = (days.astype(int) + 4) % 7
        elif part == "days_in_month":
            result = ((months + 1).astype("datetime64[D]") - months.astype("datetime64[D]")).astype(int)
        elif part == "hour":
            result = (stamps - days.astype("datetime64[s]")).astype(int) // 3600
        else:
            result = (stamps - days.astype("datetime64[s]")).astype(int) // 60 % 60
        return vector.with_values(np.where(finite, result.astype(np.float64), np.nan))

    return apply


def _sort(descending: bool):
    def apply(ctx, args, call):
        vector = args[0]
        if ctx.steps != 1:
            _sort_warning(ctx)
        if ctx.steps != 1 or not vector.labels:
            return vector
        values = vector.values[:, 0]
        nan = np.isnan(values)
        order = np.lexsort((-values if descending else values, nan))
        return Vector([vector.labels[i] for i in order], vector.values[order], vector.present[order])

    return apply


def _sort_by_label(descending: bool):
    """sort_by_label(_desc): by the named labels' values in natural order (``a2`` before
    ``a10``), ties by the whole label set, as Prometheus 3 (an instant query only)."""

    def apply(ctx, args, call):
        vector = args[0]
        if ctx.steps != 1:
            _sort_warning(ctx)
        if ctx.steps != 1 or not vector.labels:
            return vector
        names = [argument.value for argument in args[1:]]

        def key(row: int):
            labels = vector.labels[row]
            return [_natural(labels.get(name, "")) for name in names], sorted(labels.items())

        order = sorted(range(len(vector.labels)), key=key, reverse=descending)
        return Vector([vector.labels[i] for i in order], vector.values[order], vector.present[order])

    return apply


def _natural(text: str) -> list[tuple[int, int | str]]:
    """The sort key of natural order: runs of digits compare as numbers, other runs as text."""
    return [(0, int(run)) if run.isdigit() else (1, run) for run in re.findall(r"\d+|\D+", text)]


def selector_labels(call_argument) -> dict:
    """The labels absent() gives: the equality matchers of its selector argument."""
    selector = getattr(call_argument, "vector_selector", call_argument)
    matchers = getattr(getattr(selector, "matchers", None), "matchers", None)
    if matchers is None:
        return {}
    labels = {}
    counts: defaultdict = defaultdict(int)
    for matcher in matchers:
        counts[matcher.name] += 1
    for matcher in matchers:
        if str(matcher.op) == "MatchOp.Equal" and matcher.name != NAME and counts[matcher.name] == 1:
            labels[matcher.name] = matcher.value
    return labels


def _absent(ctx, args, call):
    vector = args[0]
    seen = vector.sampled.any(axis=0)
    return Vector([selector_labels(call.args[0])], np.ones((1, ctx.steps)), ~seen[None, :]).without_absent()


def _absent_over_time(ctx, args, call):
    return ranged.absent_over_time(args[0], selector_labels(call.args[0]))


def valid_label_name(name: str) -> bool:
    """Prometheus 3's UTF-8 label names: any non-empty text (``k8s.pod.name`` too). A string
    the query wrote as bytes that are no UTF-8 (``"\\xff"``) is refused when parsed (engine.parse)."""
    return bool(name)


def _expand(template: str, match) -> str:
    """Go's regexp Expand: ``$1``, ``${1}``, ``$name``; a name is the longest run of word characters."""
    out, position = [], 0
    for found in re.finditer(r"\$(?:\{(\w+)\}|(\w+)|\$)", template):
        out.append(template[position : found.start()])
        position = found.end()
        name = found.group(1) or found.group(2)
        if name is None:
            out.append("$")
            continue
        try:
            group = match.group(int(name) if name.isdigit() else name)
        except IndexError:
            group = None
        out.append(group or "")
    out.append(template[position:])
    return "".join(out)


def _label_replace(ctx, args, call):
    vector, destination, replacement, source, pattern = (
        args[0],
        args[1].value,
        args[2].value,
        args[3].value,
        args[4].value,
    )
    try:
        regex = compile_regex(f"^(?:{pattern})$", dot_nl=True, capture=True)
    except BadPattern as error:
        raise PromQLError(f"invalid regular expression in label_replace(): {error}") from None
    if not valid_label_name(destination):
        raise PromQLError(f"invalid destination label name in label_replace(): {destination}")

    def relabel(series):
        match = regex.match(series.get(source, ""))
        return None if match is None else _expand(replacement, match)

    return _set_label(vector, destination, relabel)


def _label_join(ctx, args, call):
    vector, destination, separator = args[0], args[1].value, args[2].value
    sources = [a.value for a in args[3:]]
    for source in sources:
        if not valid_label_name(source):
            raise PromQLError(f"invalid source label name in label_join(): {source}")
    if not valid_label_name(destination):
        raise PromQLError(f"invalid destination label name in label_join(): {destination}")
    return _set_label(vector, destination, lambda series: separator.join(series.get(s, "") for s in sources))


def _set_label(vector: Vector, destination: str, value_of) -> Vector:
    """Each series with ``destination`` set to ``value_of(labels)`` (removed when that is empty,
    the series left as it is when it is None)."""
    labels = []
    for series in vector.labels:
        value = value_of(series)
        if value is None:
            labels.append(series)
            continue
        changed = {k: v for k, v in series.items() if k != destination}
        if value:
            changed[destination] = value
        labels.append(changed if destination == NAME else marked_like(series, changed))
    return merge_same_labels(Vector(labels, vector.values, vector.present, vector.sample_ms, vector.histograms))


def _of_histograms(compute):
    """A function of each histogram sample (its arguments, the step, the warn function and
    the sample's metric name) giving a float; floats are left out."""

    def apply(ctx, args, call):
        vector = args[-1]
        holds = vector.histogram_present
        values = np.full(holds.shape, np.nan)
        with np.errstate(all="ignore"):
            for row, step in zip(*np.nonzero(holds)):
                values[row, step] = compute(
                    vector.histograms[row, step], args, step, ctx.warn, metric_name(vector.labels[row])
                )
        labels = [drop_metric_name(labels) for labels in vector.labels]
        return Vector(labels, values, holds).without_absent()

    return apply


def _histogram_quantile(ctx, args, call):
    """Classic ``le`` buckets and native histograms both (as Prometheus, one call may hold both)."""
    if warning := quantile_warning(args[0].values):
        ctx.warn(warning)
    args = [*args[:-1], _apart_from_classic(ctx, args[-1])]
    native = _of_histograms(
        lambda h, a, step, warn, name: h.quantile(
            a[0].values[step],
            lambda result: warn(
                f'PromQL info: input to histogram_quantile has NaN observations, {result} for metric name "{name}"'
            ),
        )
    )(ctx, args, call)
    q, monotonic = args[0].values, _monotonic_info(ctx)
    classic = _classic(
        ctx, args[1], lambda step, uppers, counts, name: bucket_quantile(q[step], uppers, counts, monotonic(name))
    )
    return stacked(classic, native)


def _histogram_quantiles(ctx, args, call):
    """Prometheus 3's experimental ``histogram_quantiles(v, "label", q, ...)``: histogram_quantile
    of each quantile, its rows labelled ``label`` = the quantile as OpenMetrics writes it."""
    vector, label = args[0], args[1].value
    parts = []
    for quantile in args[2:]:
        result = _histogram_quantile(ctx, [quantile, vector], call)
        for value in np.unique(quantile.values):  # a quantile may differ between steps
            at = quantile.values == value if not math.isnan(value) else np.isnan(quantile.values)
            named = [
                marked_like(labels, {**labels, label: _open_metrics_float(float(value))}) for labels in result.labels
            ]
            parts.append(Vector(named, result.values, result.present & at).without_absent())
    out = Vector.empty(ctx.steps)
    for part in parts:
        out = stacked(out, part)
    return out


def _open_metrics_float(value: float) -> str:
    """A float as Prometheus's FormatOpenMetricsFloat writes it (``1.0``, ``0.25``, ``+Inf``)."""
    text = go_float(value)
    return text if not math.isfinite(value) or "e" in text or "." in text else text + ".0"


def _monotonic_info(ctx):
    def for_name(name: str):
        return lambda: ctx.warn(
            "PromQL info: input to histogram_quantile needed to be fixed for monotonicity (see "
            "https://prometheus.io/docs/prometheus/latest/querying/functions/#histogram_quantile)"
            f' for metric name "{name}"'
        )

    return for_name


def _histogram_fraction(ctx, args, call):
    """Native histograms, and classic ``le`` buckets (Prometheus 3's BucketFraction)."""
    args = [*args[:-1], _apart_from_classic(ctx, args[-1])]
    native = _of_histograms(
        lambda h, a, step, warn, name: h.fraction(
            a[0].values[step],
            a[1].values[step],
            lambda: warn(
                "PromQL info: input to histogram_fraction has NaN observations, which are excluded from all"
                f' fractions for metric name "{name}"'
            ),
        )
    )(ctx, args, call)
    lower, upper = args[0].values, args[1].values
    classic = _classic(
        ctx, args[2], lambda step, uppers, counts, name: bucket_fraction(lower[step], upper[step], uppers, counts)
    )
    return stacked(classic, native)


def _apart_from_classic(ctx, vector: Vector) -> Vector:
    """``vector`` without the native histogram and the classic buckets of one label set (but
    ``le``) at the steps both are there: Prometheus 3 answers neither, with a warning."""
    if vector.histograms is None:
        return vector
    holds = vector.histogram_present
    natives = {labels_key(labels): row for row, labels in enumerate(vector.labels) if holds[row].any()}
    buckets: dict[int, list[int]] = defaultdict(list)
    for index, labels in enumerate(vector.labels):
        row = natives.get(labels_key({k: v for k, v in labels.items() if k != "le"}))
        if row is not None and "le" in labels and _is_bound(labels["le"]):
            buckets[row].append(index)
    if not buckets:
        return vector
    present, histograms = vector.present.copy(), vector.histograms.copy()
    for row, indexes in buckets.items():
        clash = holds[row] & vector.present[indexes].any(axis=0)
        if clash.any():
            ctx.warn(
                "PromQL warning: vector contains a mix of classic and native histograms"
                f' for metric name "{metric_name(vector.labels[row])}"'
            )
            histograms[row, clash] = None
            present[np.ix_(indexes, clash)] = False
    return vector._replace(present=present, histograms=histograms)


def _is_bound(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _classic(ctx, vector, value_of):
    """``value_of(step, upper bounds, cumulative counts, metric name)`` of each classic histogram
    (the series of one label set but ``le``) at each step, its buckets sorted by upper bound; a
    float series without a number in ``le`` is warned of, as Prometheus 3 does."""
    groups: dict[tuple, list[tuple[float, int]]] = defaultdict(list)
    group_labels, names = {}, {}
    for index, labels in enumerate(vector.labels):
        try:
            upper = float(labels["le"])
        except (KeyError, ValueError):
            if vector.present[index].any():  # a float series that is no bucket (histograms are native)
                ctx.warn(
                    f'PromQL warning: bucket label "le" is missing or has a malformed value of "{labels.get("le", "")}"'
                    f' for metric name "{labels.get(NAME, "")}"'
                )
            continue
        # grouped by every label but le (the name too), answered without the name: two bucket
        # families with the same other labels are "the same labelset", as in Prometheus
        key = labels_key({k: v for k, v in labels.items() if k != "le"})
        groups[key].append((upper, index))
        group_labels[key] = {k: v for k, v in labels.items() if k not in ("le", NAME)}
        names[key] = labels.get(NAME, "")
    out_labels, out_values, out_present = [], [], []
    for key, buckets in groups.items():
        buckets.sort()
        uppers = np.array([b[0] for b in buckets])
        indexes = [b[1] for b in buckets]
        counts, present = vector.values[indexes], vector.present[indexes]
        values = np.full(ctx.steps, np.nan)
        any_present = present.any(axis=0)
        for step in np.flatnonzero(any_present):
            mask = present[:, step]
            values[step] = value_of(step, uppers[mask], counts[mask, step], names[key])
        out_labels.append(group_labels[key])
        out_values.append(values)
        out_present.append(any_present)
    if not out_labels:
        return Vector.empty(ctx.steps)
    return Vector(out_labels, np.vstack(out_values), np.vstack(out_present))


def bucket_fraction(lower: float, upper: float, uppers: np.ndarray, counts: np.ndarray) -> float:
    """Prometheus 3's BucketFraction over classic buckets sorted by upper bound: the share of
    observations between ``lower`` and ``upper``, interpolated linearly inside the buckets the
    ends fall in (the first bucket starts at 0 unless its bound is not above 0: from -Inf, whole)."""
    if not len(uppers) or uppers[-1] != math.inf:
        return math.nan
    merged_uppers: list[float] = []
    merged_counts: list[float] = []
    for bound, count in zip(uppers.tolist(), counts.tolist()):
        if merged_uppers and merged_uppers[-1] == bound:
            merged_counts[-1] += count
        else:
            merged_uppers.append(bound)
            merged_counts.append(count)
    total = merged_counts[-1]
    if total == 0 or math.isnan(lower) or math.isnan(upper):
        return math.nan
    if lower >= upper:
        return 0.0
    rank, lower_rank, upper_rank = 0.0, None, None
    for i, (bound, count) in enumerate(zip(merged_uppers, merged_counts)):
        start = merged_uppers[i - 1] if i else (-math.inf if merged_uppers[0] <= 0 else 0.0)

        def interpolated(value: float) -> float:
            return count if start == -math.inf else rank + (count - rank) * (value - start) / (bound - start)

        if lower_rank is None and start >= lower:
            lower_rank = rank
        if upper_rank is None and start >= upper:
            upper_rank = rank
        if lower_rank is not None and upper_rank is not None:
            break
        if lower_rank is None and start < lower < bound:
            lower_rank = interpolated(lower)
        if upper_rank is None and start < upper < bound:
            upper_rank = interpolated(upper)
        if lower_rank is not None and upper_rank is not None:
            break
        rank = count
    lower_rank = total if lower_rank is None or lower_rank > total else lower_rank
    upper_rank = total if upper_rank is None or upper_rank > total else upper_rank
    return (upper_rank - lower_rank) / total


def bucket_quantile(q: float, uppers: np.ndarray, counts: np.ndarray, on_forced=None) -> float:
    """Prometheus 2.42's bucketQuantile over classic buckets sorted by upper bound."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    if not len(uppers) or not math.isinf(uppers[-1]) or uppers[-1] < 0:
        return math.nan
    merged_uppers: list[float] = []
    merged_counts: list[float] = []
    for upper, count in zip(uppers, counts):
        if merged_uppers and merged_uppers[-1] == upper:
            merged_counts[-1] += count
        else:
            merged_uppers.append(upper)
            merged_counts.append(count)
    highest = -math.inf
    for i, count in enumerate(merged_counts):
        if count > highest:
            highest = count
        elif count < highest:
            merged_counts[i] = highest
            if on_forced is not None:
                on_forced()
    if len(merged_uppers) < 2:
        return math.nan
    observations = merged_counts[-1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = next((i for i in range(len(merged_counts) - 1) if merged_counts[i] >= rank), len(merged_counts) - 1)
    if b == len(merged_counts) - 1:
        return merged_uppers[-2]
    if b == 0 and merged_uppers[0] <= 0:
        return merged_uppers[0]
    start, end, count = 0.0, merged_uppers[b], merged_counts[b]
    if b > 0:
        start = merged_uppers[b - 1]
        count -= merged_counts[b - 1]
        rank -= merged_counts[b - 1]
    return start + (end - start) * (rank / count)


def _quantile_over_time(ctx, args, call):
    result = ranged.over_time(args[1], "quantile", args[0].values)
    if result.labels and (warning := quantile_warning(args[0].values)):
        ctx.warn(warning)
    return result


def _sort_warning(ctx) -> None:
    ctx.warn("PromQL warning: sort is ineffective for range queries since results are always ordered by labels")


def _noting_ignored_histograms(function):
    """``function`` with Prometheus 3's info on the histograms it leaves out of a window that
    holds floats too."""

    def apply(ctx, args, call):
        matrix = next(a for a in args if isinstance(a, RangeVector))
        floats = {labels_key(s.labels): s for s in matrix.series}
        for series in matrix.histogram_series:
            other = floats.get(labels_key(series.labels))
            if other is None:
                continue
            lo, hi = matrix.windows(series)
            float_lo, float_hi = matrix.windows(other)
            if ((hi > lo) & (float_hi > float_lo)).any():
                ctx.warn(
                    "PromQL info: ignored histograms in a range containing both floats and histograms"
                    f' for metric name "{series.labels.get(NAME, "")}"'
                )
        return function(ctx, args, call)

    return apply


def _rate_like(of_floats, of_histograms, last_two: bool = False):
    """A function of a range giving floats from float samples and histograms from histogram
    samples; a series holding both kinds as ranged.kinds_apart says."""

    def apply(ctx, args, call):
        matrix = args[0]
        answer = stacked(of_floats(ctx, matrix), of_histograms(ctx, matrix))
        return ranged.kinds_apart(matrix, answer, ctx.warn, last_two)

    return apply


def _ranged(compute):
    def apply(ctx, args, call):
        return compute(ctx, args)

    return apply


FUNCTIONS = {name: _elementwise(function) for name, function in _ELEMENTWISE.items()}
FUNCTIONS.update(
    {
        "round": _round,
        "clamp": _clamp,
        "clamp_min": _clamp_min,
        "clamp_max": _clamp_max,
        "time": _time,
        "timestamp": _timestamp,
        "vector": _vector,
        "scalar": _scalar,
        "pi": _pi,
        "min_of": _min_of,
        "max_of": _max_of,
        "sort": _sort(False),
        "sort_desc": _sort(True),
        "sort_by_label": _sort_by_label(False),
        "sort_by_label_desc": _sort_by_label(True),
        "absent": _absent,
        "absent_over_time": _absent_over_time,
        "label_replace": _label_replace,
        "label_join": _label_join,
        "histogram_quantile": _histogram_quantile,
        "histogram_quantiles": _histogram_quantiles,
        "rate": _rate_like(
            lambda ctx, m: ranged.extrapolated_rate(m, True, True),
            lambda ctx, m: ranged.histogram_rate(m, True, True, ctx.warn),
        ),
        "increase": _rate_like(
            lambda ctx, m: ranged.extrapolated_rate(m, True, False),
            lambda ctx, m: ranged.histogram_rate(m, True, False, ctx.warn),
        ),
        "delta": _rate_like(
            lambda ctx, m: ranged.extrapolated_rate(m, False, False),
            lambda ctx, m: ranged.histogram_rate(m, False, False, ctx.warn),
        ),
        "irate": _rate_like(
            lambda ctx, m: ranged.instant_rate(m, True),
            lambda ctx, m: ranged.histogram_instant_rate(m, True, ctx.warn),
            last_two=True,
        ),
        "idelta": _rate_like(
            lambda ctx, m: ranged.instant_rate(m, False),
            lambda ctx, m: ranged.histogram_instant_rate(m, False, ctx.warn),
            last_two=True,
        ),
        "histogram_count": _of_histograms(lambda h, *_: h.count),
        "histogram_sum": _of_histograms(lambda h, *_: h.sum),
        "histogram_avg": _of_histograms(lambda h, *_: float(np.divide(h.sum, h.count))),
        "histogram_stdvar": _of_histograms(lambda h, *_: h.variance()),
        "histogram_stddev": _of_histograms(lambda h, *_: float(np.sqrt(h.variance()))),
        "histogram_fraction": _histogram_fraction,
        "deriv": _ranged(lambda ctx, a: ranged.deriv(a[0])),
        "predict_linear": _ranged(lambda ctx, a: ranged.predict_linear(a[0], a[1].values, ctx.times_ms)),
        "double_exponential_smoothing": _ranged(
            lambda ctx, a: ranged.holt_winters(a[0], float(a[1].values[0]), float(a[2].values[0]))
        ),
        "holt_winters": _ranged(lambda ctx, a: ranged.holt_winters(a[0], float(a[1].values[0]), float(a[2].values[0]))),
        "changes": _ranged(lambda ctx, a: ranged.changes(a[0])),
        "resets": _ranged(lambda ctx, a: ranged.resets(a[0])),
        "quantile_over_time": _quantile_over_time,
    }
)
for _part in ("year", "month", "day_of_month", "day_of_year", "day_of_week", "days_in_month", "hour", "minute"):
    FUNCTIONS[_part] = _date_function(_part)
for _name in _OVER_TIME + _OVER_TIME_3:
    FUNCTIONS[f"{_name}_over_time"] = _ranged(lambda ctx, a, name=_name: ranged.over_time(a[0], name))
# float-only functions of a range: a window holding histograms beside floats is an info
for _name in (
    "deriv", "predict_linear", "double_exponential_smoothing", "holt_winters", "stddev_over_time",
    "stdvar_over_time", "quantile_over_time", "min_over_time", "max_over_time", "mad_over_time",
    "ts_of_min_over_time", "ts_of_max_over_time",
):  # fmt: skip
    FUNCTIONS[_name] = _noting_ignored_histograms(FUNCTIONS[_name])
for _name in ("sum", "avg", "count", "present", "last", "first", "ts_of_last", "ts_of_first"):
    FUNCTIONS[f"{_name}_over_time"] = _ranged(
        lambda ctx, a, name=_name: ranged.over_time_of_histograms(a[0], name, ranged.over_time(a[0], name), ctx.warn)
    )
