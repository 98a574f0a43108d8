"""Roll-ups of native histograms, pure: the histograms of one series-slot -> rows per granularity.

The rule (docs/downsampling.rst): a roll-up interval keeps the last histogram of the interval
and, for counter histograms, every histogram just before a counter reset in it, each at its own
timestamp; a kept histogram after a reset since the kept one before it carries the reset hint
YES. So a roll-up is a subset of the raw samples in which no increase is lost: rate(),
increase() and quantiles over it answer as over a sparser scrape of the same series. Gauge
histograms (reset hint GAUGE) keep the last of each interval. Coarser granularities are cut
from the finer one by the same rule, the hints standing for the resets in between.

A roll-up row holds the kept histograms of one interval as the bytes of a prometheus.TimeSeries
message with only ``histograms`` set (each with its timestamp): the row's timestamp is the
interval's start.
"""

import struct
from collections.abc import Sequence

from gateway.store.contract import HistogramRow
from gateway.store.layout import Granularity
from protocols.prometheus import types_pb2

STALE_NAN_BITS = 0x7FF0000000000002
CUSTOM_BUCKETS_SCHEMA = -53
_RESET = types_pb2.Histogram.ResetHint


def encode_interval(histograms: Sequence[HistogramRow]) -> bytes:
    """The kept histograms of one interval as one roll-up row's data."""
    series = types_pb2.TimeSeries()
    for row in histograms:
        message = series.histograms.add()
        message.MergeFromString(row.data)
        message.timestamp = row.timestamp_ms
    return series.SerializeToString()


def decode_interval(row: HistogramRow) -> list[HistogramRow]:
    """The histograms a roll-up row keeps, each a HistogramRow at its own timestamp."""
    series = types_pb2.TimeSeries.FromString(row.data)
    return [HistogramRow(row.tenant, row.series_set_hash, h.timestamp, h.SerializeToString()) for h in series.histograms]


def _is_stale(message: types_pb2.Histogram) -> bool:
    return struct.unpack("<Q", struct.pack("<d", message.sum))[0] == STALE_NAN_BITS


def _count(message: types_pb2.Histogram) -> float:
    return message.count_float if message.WhichOneof("count") == "count_float" else message.count_int


def _zero_count(message: types_pb2.Histogram) -> float:
    return message.zero_count_float if message.WhichOneof("zero_count") == "zero_count_float" else message.zero_count_int


def _buckets(spans, deltas, counts, is_float: bool) -> dict[int, float]:
    """{bucket index: count} from spans and deltas (integer) or counts (float)."""
    values = list(counts) if is_float else []
    if not is_float:
        current = 0
        for delta in deltas:
            current += delta
            values.append(current)
    found, index, position = {}, 0, 0
    for span in spans:
        index += span.offset
        for _ in range(span.length):
            if position < len(values):
                found[index] = values[position]
            index += 1
            position += 1
    return found


def _reduced(buckets: dict[int, float], from_schema: int, to_schema: int) -> dict[int, float]:
    """Exponential buckets merged into a coarser schema (Prometheus's target index)."""
    if from_schema == to_schema or from_schema == CUSTOM_BUCKETS_SCHEMA:
        return buckets
    merged: dict[int, float] = {}
    for index, count in buckets.items():
        target = ((index - 1) >> (from_schema - to_schema)) + 1
        merged[target] = merged.get(target, 0) + count
    return merged


def is_counter_reset(before: types_pb2.Histogram, after: types_pb2.Histogram) -> bool:
    """Whether a counter reset happened between two consecutive histograms, as Prometheus's
    DetectReset tells: the hint when it says YES or NO (GAUGE: never), otherwise a change of
    custom bounds, a finer schema, a smaller zero threshold, or a count, zero count or bucket
    that went down (compared at the coarser schema)."""
    if after.reset_hint in (_RESET.YES, _RESET.NO, _RESET.GAUGE):
        return after.reset_hint == _RESET.YES
    custom = after.schema == CUSTOM_BUCKETS_SCHEMA
    if custom != (before.schema == CUSTOM_BUCKETS_SCHEMA) or (custom and list(after.custom_values) != list(before.custom_values)):
        return True
    if _count(after) < _count(before) or after.schema > before.schema or after.zero_threshold < before.zero_threshold:
        return True
    if after.zero_threshold != before.zero_threshold:
        return False  # a wider zero bucket swallows buckets: the count above decides
    if _zero_count(after) < _zero_count(before):
        return True
    for side in ("positive", "negative"):
        old, new = (
            _reduced(
                _buckets(getattr(h, f"{side}_spans"), getattr(h, f"{side}_deltas"), getattr(h, f"{side}_counts"), h.WhichOneof("count") == "count_float"),
                h.schema,
                after.schema,
            )
            for h in (before, after)
        )
        if any(new.get(index, 0) < count for index, count in old.items()):
            return True
    return False


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
    return [HistogramRow(rows[0].tenant, rows[0].series_set_hash, start, encode_interval(rows)) for start, rows in sorted(intervals.items())]


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


def kept_in_range(rows: Sequence[HistogramRow], start_ms: int, end_ms: int) -> list[HistogramRow]:
    """The histograms roll-up rows keep whose own timestamps are in an inclusive range, oldest first."""
    return [h for row in rows for h in decode_interval(row) if start_ms <= h.timestamp_ms <= end_ms]

