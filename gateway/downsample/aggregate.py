"""Roll-up arithmetic, pure: raw points of one series-slot -> rows per granularity.

Kinds (docs/downsampling.rst):

- gauge: min, max, sum, count (avg is sum/count, so coarser levels never average averages);
- delta counter (name ends with a configured counter suffix, by default reads/writes/bytes):
  sum and count;
- a name ending in an aggregate qualifier (``_min``, ``_max``; ``.min`` for Graphite paths) gets
  that aggregate only (and count);
- Prometheus cumulative counter (TYPE counter in remote-write metadata, or a name ending
  ``_total``, ``_count``, ``_sum``, ``_bucket``): reset-aware increase and last value, so that
  rate() and increase() over roll-ups stay right across counter resets.

Every granularity is computed from the slot's samples (a slot holds whole buckets of each), not
from the finer roll-up: a sum of rounded (or overflowed) finer sums would differ from the exact sum.

Every float64 has a defined roll-up (exact_sum says how sums behave at the edges), so no value
can stop the downsampler.
"""

import math
from collections.abc import Iterable, Sequence
from fractions import Fraction

import numpy as np

from gateway.core.layout import Granularity
from gateway.core.samples import Samples
from gateway.store.contract import Rollup

GAUGE = "gauge"
DELTA_COUNTER = "delta_counter"
CUMULATIVE_COUNTER = "cumulative_counter"
MIN_ONLY = "min"
MAX_ONLY = "max"

PROMETHEUS_COUNTER_SUFFIXES = ("_total", "_count", "_sum", "_bucket")

AGGREGATORS = {
    GAUGE: ("raw", "min", "max", "sum", "count", "avg"),
    DELTA_COUNTER: ("raw", "sum", "count"),
    CUMULATIVE_COUNTER: ("raw", "increase", "last"),
    MIN_ONLY: ("raw", "min", "count"),
    MAX_ONLY: ("raw", "max", "count"),
}


def series_kind(metric_name: str, metric_type: str | None, counter_suffixes: Iterable[str]) -> str:
    if metric_type == "counter" or metric_name.endswith(PROMETHEUS_COUNTER_SUFFIXES):
        return CUMULATIVE_COUNTER
    if any(metric_name.endswith(suffix) for suffix in counter_suffixes):
        return DELTA_COUNTER
    for qualifier in (MIN_ONLY, MAX_ONLY):
        if metric_name.endswith((f"_{qualifier}", f".{qualifier}")):
            return qualifier
    return GAUGE


def _bucket_rows(
    tenant: str, series_set_hash: str, kind: str, starts: np.ndarray, values: np.ndarray, increases: np.ndarray
) -> list[Rollup]:
    """One row per bucket; ``starts`` holds each value's bucket start (ascending, values NaN-free),
    ``increases`` each value's increase (cumulative counters only)."""
    if not len(values):
        return []
    firsts = np.flatnonzero(np.concatenate(([True], starts[1:] != starts[:-1])))  # starts ascend
    spans = list(zip(starts[firsts].tolist(), firsts.tolist(), [*firsts[1:].tolist(), len(values)]))
    if kind == CUMULATIVE_COUNTER:
        totals = _sums(increases, spans)
        return [
            Rollup(tenant, series_set_hash, start, last=float(values[end - 1]), increase=total)
            for (start, first, end), total in zip(spans, totals)
        ]
    wanted = AGGREGATORS[kind]
    mins = np.minimum.reduceat(values, firsts).tolist() if "min" in wanted else [None] * len(spans)
    maxes = np.maximum.reduceat(values, firsts).tolist() if "max" in wanted else [None] * len(spans)
    sums = _sums(values, spans) if "sum" in wanted else [None] * len(spans)
    return [
        Rollup(tenant, series_set_hash, start, min=low, max=high, sum=total, count=end - first)
        for (start, first, end), low, high, total in zip(spans, mins, maxes, sums)
    ]


def _sums(values: np.ndarray, spans: list[tuple[int, int, int]]) -> list[float]:
    """exact_sum of each span; a span of one value is that value (the common case of a coarse
    scrape interval or an imported whisper archive, where calling exact_sum per row dominated)."""
    listed = values.tolist()
    if not np.isfinite(values).all():
        return [listed[first] if end - first == 1 else exact_sum(values[first:end]) for _, first, end in spans]
    return [_finite_sum(listed, values, first, end) for _, first, end in spans]


def _finite_sum(listed: list[float], values: np.ndarray, first: int, end: int) -> float:
    """exact_sum of finite values, on the list (no array a span) unless math.fsum's partials overflow."""
    if end - first == 1:
        return listed[first]
    try:
        return math.fsum(listed[first:end])
    except OverflowError:
        return exact_sum(values[first:end])


def _increases(values: np.ndarray, previous: float | None) -> np.ndarray:
    """Each value's increase over the one before (``previous`` before the first): the difference,
    or the value itself after a reset (a drop). The first is 0 without a previous value."""
    before = np.concatenate(([math.nan if previous is None else previous], values[:-1]))
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, 1e308 - -1e308 is inf: both defined
        increases = np.where(values >= before, values - before, values)
    if previous is None and len(increases):
        increases[0] = 0.0
    return increases


def exact_sum(values: np.ndarray) -> float:
    """The sum as if added exactly and rounded once (math.fsum), so the order of the values does not
    matter: ±Inf where that exact sum is beyond float64's range (as IEEE rounding gives it);
    an infinity where the values hold one, NaN where they hold a NaN or both infinities (as in
    PromQL). math.fsum raises for both of the last cases and for sums of finite values whose
    partial sums overflow (1e308 + 1e308 - 1e308): those once stopped the whole downsampler."""
    finite = np.isfinite(values)
    if not finite.all():
        with np.errstate(invalid="ignore"):
            return float(np.sum(values[~finite]))
    numbers = values.tolist()
    try:
        return math.fsum(numbers)
    except OverflowError:
        total = sum(map(Fraction, numbers), Fraction(0))  # exact; only where fsum's partials overflow
        try:
            return float(total)
        except OverflowError:
            return math.inf if total > 0 else -math.inf


def roll_up(
    tenant: str,
    series_set_hash: str,
    kind: str,
    samples: Samples,
    previous: float | None,
    granularities: Sequence[Granularity],
) -> dict[str, list[Rollup]]:
    """Rows of every granularity for one series-slot. ``samples`` are in time order; ``previous`` is
    the last raw value before them (for the first increase of a counter). NaNs (stale markers)
    are left out."""
    numbers = ~np.isnan(samples.values)
    timestamps, values = samples.timestamps[numbers], samples.values[numbers]
    increases = _increases(values, previous) if kind == CUMULATIVE_COUNTER else values
    return {
        g.name: _bucket_rows(tenant, series_set_hash, kind, timestamps - timestamps % g.width_ms, values, increases)
        for g in granularities
    }
