"""Roll-ups of native histograms, pure: the histograms of one series-slot -> rows per granularity.

The rule (docs/downsampling.rst): a roll-up interval keeps the last histogram of the interval
and, for counter histograms, every histogram just before a counter reset in it, each at its own
timestamp; a kept histogram after a reset since the kept one before it carries the reset hint
YES. So a roll-up is a subset of the raw samples in which no increase is lost: rate(),
increase() and quantiles over it answer as over a sparser scrape of the same series. Gauge
histograms (reset hint GAUGE) keep the last of each interval. Coarser granularities are cut
from the finer one by the same rule, the hints standing for the resets in between.
The rows' format is gateway/store/histogram_rollup_rows.py.
"""

import math
from collections.abc import Sequence

from gateway.core.layout import Granularity
from gateway.store.contract import HistogramRow
from gateway.store.histogram_rollup_rows import encode_interval
from protocols.prometheus import types_pb2
from protocols.prometheus.native_histogram import CUSTOM_BUCKETS_SCHEMA, Histogram
from protocols.prometheus.xor import STALE_NAN_BITS, float_bits

_RESET = types_pb2.Histogram.ResetHint
_SCHEMAS = (-4, 8)  # the exponential schemas Prometheus accepts


def _is_stale(message: types_pb2.Histogram) -> bool:
    return float_bits(message.sum) == STALE_NAN_BITS


def is_counter_reset(before: types_pb2.Histogram, after: types_pb2.Histogram) -> bool:
    """Whether a counter reset happened between two consecutive histograms, as Prometheus's
    DetectReset tells (a gauge histogram never resets). A histogram Prometheus would refuse
    cannot be compared: it counts as a reset, so the roll-up keeps it and its neighbours."""
    if after.reset_hint == _RESET.GAUGE:
        return False
    if not (_comparable(before) and _comparable(after)):
        return True
    return Histogram.from_proto(after).detect_reset(Histogram.from_proto(before))


def _comparable(message: types_pb2.Histogram) -> bool:
    """A schema of -4..8 or custom buckets, a zero threshold that is a number, and spans that
    hold exactly its bucket counts: comparing others breaks (a NaN zero threshold never stops
    widening, a schema of 2^31 makes a bound of 2^(2^31) bits, spans longer than the counts
    index past them)."""
    if not (_SCHEMAS[0] <= message.schema <= _SCHEMAS[1] or message.schema == CUSTOM_BUCKETS_SCHEMA):
        return False
    if math.isnan(message.zero_threshold):
        return False
    floats = message.WhichOneof("count") == "count_float"
    return all(
        sum(span.length for span in spans) == len(counts)
        for spans, counts in (
            (message.positive_spans, message.positive_counts if floats else message.positive_deltas),
            (message.negative_spans, message.negative_counts if floats else message.negative_deltas),
        )
    )


def _with_reset_hint(row: HistogramRow) -> HistogramRow:
    message = types_pb2.Histogram.FromString(row.data)
    if message.reset_hint == _RESET.YES:
        return row
    message.reset_hint = _RESET.YES
    return row._replace(data=message.SerializeToString())


def _keep(items: list[tuple[HistogramRow, bool]], width_ms: int) -> list[tuple[HistogramRow, bool]]:
    """The rule on (histogram, reset since the previous one) pairs in time order: the last of
    each interval and each one followed by a reset, flagged when a reset happened since the
    previous kept one."""
    kept, reset_since = [], False
    for index, (row, reset) in enumerate(items):
        reset_since = reset_since or reset
        following = items[index + 1] if index + 1 < len(items) else None
        if following is None or following[1] or following[0].timestamp_ms // width_ms != row.timestamp_ms // width_ms:
            kept.append((_with_reset_hint(row) if reset_since else row, reset_since))
            reset_since = False
    return kept


def _rows(items: list[tuple[HistogramRow, bool]], width_ms: int) -> list[HistogramRow]:
    intervals: dict[int, list[HistogramRow]] = {}
    for row, _ in items:
        intervals.setdefault(row.timestamp_ms - row.timestamp_ms % width_ms, []).append(row)
    return [
        HistogramRow(rows[0].tenant, rows[0].series_set_hash, start, encode_interval(rows))
        for start, rows in sorted(intervals.items())
    ]


def roll_up_histograms(
    histograms: Sequence[HistogramRow], previous: HistogramRow | None, granularities: Sequence[Granularity]
) -> dict[str, list[HistogramRow]]:
    """Roll-up rows of every granularity for one series-slot. ``histograms`` are in time order;
    ``previous`` is the last one before them (a reset at the slot's start is seen against it).
    Stale markers are left out, as NaN samples are from float roll-ups."""
    before = types_pb2.Histogram.FromString(previous.data) if previous is not None else None
    if before is not None and _is_stale(before):
        before = None
    items = []
    for row in histograms:
        message = types_pb2.Histogram.FromString(row.data)
        if _is_stale(message):
            continue
        items.append((row, before is not None and is_counter_reset(before, message)))
        before = message
    rows = {}
    for granularity in granularities:
        items = _keep(items, granularity.width_ms)
        rows[granularity.name] = _rows(items, granularity.width_ms)
    return rows
