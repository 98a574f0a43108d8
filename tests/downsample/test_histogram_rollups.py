"""Native histogram roll-ups by hand (gateway/downsample/histograms.py): what each granularity
keeps of a counter and of a gauge histogram, and counter reset detection as Prometheus's. The end
to end test through `tsgate downsample --once` is in test_read_path_e2e.py."""

import itertools
import struct

from gateway.core.layout import Layout
from gateway.downsample.histograms import is_counter_reset, roll_up_histograms
from gateway.store.contract import HistogramRow
from gateway.store.histogram_rollup_rows import decode_interval, encode_interval, kept_in_range
from protocols.prometheus import types_pb2
from tests.protocols.test_prometheus_protocol import histogram

MINUTE = 60_000
STALE_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]


def _histogram_row(minute: int, count: int, reset_hint: int = 0, schema: int = 0, stale: bool = False) -> HistogramRow:
    """An integer histogram at ``minute``: 1 zero-bucket observation, the rest in bucket 1."""
    sum_ = STALE_NAN if stale else 1.5 * count
    data = histogram(
        count=count,
        sum_=sum_,
        zero_count=1,
        positive=((1, 1),),
        deltas=(count - 1,),
        timestamp=minute * MINUTE,
        reset_hint=reset_hint,
        schema=schema,
    )
    return HistogramRow("t", "h", minute * MINUTE, data)


def _kept(rows: list[HistogramRow]) -> list[tuple[int, int, int]]:
    """(minute, count, reset hint) of the histograms roll-up rows keep."""
    found = [types_pb2.Histogram.FromString(h.data) for row in rows for h in decode_interval(row)]
    return [(h.timestamp // MINUTE, h.count_int, h.reset_hint) for h in found]


def _increase(rows: list[HistogramRow], previous: HistogramRow | None = None) -> int:
    """increase() of the count as PromQL takes it: a reset starts again from zero."""
    messages = [types_pb2.Histogram.FromString(row.data) for row in ([previous] if previous else []) + rows]
    return sum(
        b.count_int if is_counter_reset(a, b) else b.count_int - a.count_int for a, b in itertools.pairwise(messages)
    )


def test_histogram_roll_up_keeps_the_last_and_the_one_before_each_reset():
    """A counter histogram scraped each minute, reset after minute 6 (and its count back above
    the old one by minute 9) and again after minute 31: every interval keeps its last histogram,
    and the one before a reset; the kept one after a reset says so. increase() over each roll-up
    equals increase() over the raw histograms, at both granularities."""
    layout = Layout()
    counts = [10 + i for i in range(7)] + [2, 8, 30] + [31 + i for i in range(22)] + [3 + i for i in range(28)]
    raw = [_histogram_row(minute, count) for minute, count in enumerate(counts)]
    previous = _histogram_row(-1, 9)
    rows = roll_up_histograms(raw, previous, layout.granularities)
    assert [row.timestamp_ms for row in rows["5m"]] == [i * 5 * MINUTE for i in range(12)]
    kept_5m = _kept(rows["5m"])
    assert kept_5m[:4] == [(4, 14, 0), (6, 16, 0), (9, 30, 1), (14, 35, 0)]
    assert (31, 52, 0) in kept_5m and (34, 5, 1) in kept_5m and kept_5m[-1] == (59, 30, 0)
    assert _kept(rows["1h"]) == [(6, 16, 0), (31, 52, 1), (59, 30, 1)]
    expected = _increase(raw, previous)
    for name in ("5m", "1h"):
        kept = [h for row in rows[name] for h in decode_interval(row)]
        assert _increase(kept, previous) == expected == 9 - 9 + 7 + 2 + 6 + 22 + 22 + 3 + 27


def test_histogram_roll_up_of_a_reset_at_the_slot_start_and_of_gauge_histograms():
    layout = Layout()
    raw = [_histogram_row(minute, 5 + minute) for minute in range(3)]
    rows = roll_up_histograms(raw, _histogram_row(-1, 100), layout.granularities)
    assert _kept(rows["5m"]) == [(2, 7, 1)] and _kept(rows["1h"]) == [(2, 7, 1)]
    gauge = [_histogram_row(minute, count, reset_hint=3) for minute, count in enumerate([9, 2, 7, 1, 8, 3, 5])]
    rows = roll_up_histograms(gauge, _histogram_row(-1, 50, reset_hint=3), layout.granularities)
    assert _kept(rows["5m"]) == [(4, 8, 3), (6, 5, 3)] and _kept(rows["1h"]) == [(6, 5, 3)]
    assert rows["5m"][0].data == encode_interval([gauge[4]])  # kept as written


def test_histogram_roll_up_leaves_stale_markers_out_and_keeps_bytes():
    layout = Layout()
    raw = [_histogram_row(0, 4), _histogram_row(1, 5), _histogram_row(2, 5, stale=True)]
    rows = roll_up_histograms(raw, None, layout.granularities)
    (only,) = rows["5m"]
    assert [h.data for h in decode_interval(only)] == [raw[1].data]
    assert kept_in_range(rows["1h"], MINUTE, MINUTE) == [raw[1]] and kept_in_range(rows["1h"], 0, MINUTE - 1) == []
    assert roll_up_histograms([], None, layout.granularities) == {"5m": [], "1h": []}


def test_counter_reset_detection_follows_prometheus():
    def message(**fields):
        return types_pb2.Histogram.FromString(histogram(**fields))

    base = message(count=3, zero_count=1, positive=((0, 2),), deltas=(1, 0))
    assert not is_counter_reset(base, base)
    assert is_counter_reset(base, message(count=3, zero_count=1, positive=((0, 2),), deltas=(1, 0), reset_hint=1))
    assert not is_counter_reset(base, message(count=1, zero_count=1, positive=(), deltas=(), reset_hint=2))
    # the same count, but an observation moved from a bucket to another: a reset
    assert is_counter_reset(base, message(count=3, zero_count=1, positive=((0, 2),), deltas=(0, 2)))
    assert is_counter_reset(base, message(count=3, zero_count=0, positive=((0, 2),), deltas=(1, 1)))
    # schema 1 buckets 1 and 2 fall into schema 0 bucket 1: compared there, nothing went down
    finer = message(count=4, schema=1, zero_count=1, positive=((1, 2),), deltas=(1, 1))
    coarser = message(count=5, schema=0, zero_count=1, positive=((1, 1),), deltas=(4,))
    assert not is_counter_reset(finer, coarser) and is_counter_reset(coarser, finer)
    floats = message(count=3.5, zero_count=0.5, deltas=(1.0, 2.0), is_float=True)
    assert not is_counter_reset(floats, message(count=4.5, zero_count=0.5, deltas=(2.0, 2.0), is_float=True))
    assert is_counter_reset(floats, message(count=4.5, zero_count=0.5, deltas=(3.0, 1.0), is_float=True))
    custom = message(count=2, zero_count=0, schema=-53, positive=((0, 2),), deltas=(1, 0), custom=(1.0,))
    # other custom bounds: compared in the bounds both have (Prometheus 3.14), here +Inf alone (2 -> 5)
    assert not is_counter_reset(
        custom, message(count=5, zero_count=0, schema=-53, positive=((0, 2),), deltas=(2, 1), custom=(2.0,))
    )
    # in the bounds (1, +Inf) both have, (-Inf, 1] went from 1 to 0
    assert is_counter_reset(
        custom, message(count=5, zero_count=0, schema=-53, positive=((0, 3),), deltas=(0, 2, 1), custom=(1.0, 2.0))
    )
    assert not is_counter_reset(
        custom, message(count=5, zero_count=0, schema=-53, positive=((0, 2),), deltas=(2, 1), custom=(1.0,))
    )
