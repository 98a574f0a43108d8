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

Coarser granularities are computed from the finer ones (a cascade, docs/downsampling.rst): min of mins, max of
maxes, sums of sums, counts and increases, the last of the lasts.
"""

import math
from collections.abc import Iterable, Sequence

from gateway.store.contract import Rollup
from gateway.store.layout import Granularity

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
    tenant: str, series_set_hash: str, kind: str, buckets: dict[int, list[float]], previous: float | None
) -> list[Rollup]:
    rows = []
    for start in sorted(buckets):
        values = buckets[start]
        if kind == CUMULATIVE_COUNTER:
            increase = 0.0
            for value in values:
                if previous is not None:
                    increase += value - previous if value >= previous else value
                previous = value
            rows.append(Rollup(tenant, series_set_hash, start, last=values[-1], increase=increase))
        elif kind == DELTA_COUNTER:
            rows.append(Rollup(tenant, series_set_hash, start, sum=_sum(values), count=len(values)))
        elif kind == MIN_ONLY:
            rows.append(Rollup(tenant, series_set_hash, start, min=min(values), count=len(values)))
        elif kind == MAX_ONLY:
            rows.append(Rollup(tenant, series_set_hash, start, max=max(values), count=len(values)))
        else:
            rows.append(
                Rollup(
                    tenant,
                    series_set_hash,
                    start,
                    min=min(values),
                    max=max(values),
                    sum=_sum(values),
                    count=len(values),
                )
            )
    return rows


def _sum(values: Sequence[float]) -> float:
    """An exact sum, NaN where +Inf meets -Inf (as in PromQL): math.fsum raises there, which
    stopped the roll-up of a series holding both (the compliance suite sends both)."""
    try:
        return math.fsum(values)
    except ValueError:
        return math.nan


def roll_up(
    tenant: str,
    series_set_hash: str,
    kind: str,
    points: Sequence[tuple[int, float]],
    previous: float | None,
    granularities: Sequence[Granularity],
) -> dict[str, list[Rollup]]:
    """Rows of every granularity for one series-slot. ``points`` are in time order; ``previous`` is
    the last raw value before them (for the first increase of a counter). NaNs (stale markers)
    are left out."""
    finest = granularities[0]
    buckets: dict[int, list[float]] = {}
    for timestamp, value in points:
        if not math.isnan(value):
            buckets.setdefault(timestamp - timestamp % finest.width_ms, []).append(value)
    rows = {finest.name: _bucket_rows(tenant, series_set_hash, kind, buckets, previous)}
    for finer, coarser in zip(granularities, granularities[1:]):
        grouped: dict[int, list[Rollup]] = {}
        for row in rows[finer.name]:
            grouped.setdefault(row.timestamp_ms - row.timestamp_ms % coarser.width_ms, []).append(row)
        rows[coarser.name] = [_combine(start, group) for start, group in sorted(grouped.items())]
    return rows


def _combine(start: int, rows: list[Rollup]) -> Rollup:
    def present(field: str):
        return [getattr(r, field) for r in rows if getattr(r, field) is not None]

    mins, maxes, sums, counts, increases = (
        present("min"),
        present("max"),
        present("sum"),
        present("count"),
        present("increase"),
    )
    lasts = present("last")
    return rows[0]._replace(
        timestamp_ms=start,
        min=min(mins) if mins else None,
        max=max(maxes) if maxes else None,
        sum=_sum(sums) if sums else None,
        count=sum(counts) if counts else None,
        increase=_sum(increases) if increases else None,
        last=lasts[-1] if lasts else None,
    )
