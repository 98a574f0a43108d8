"""The row format of the histograms_<granularity> tables: one row per series and roll-up
interval, holding the histograms the roll-up kept (gateway/downsample/histograms.py says which)
as the bytes of a prometheus.TimeSeries message with only ``histograms`` set, each with its own
timestamp; the row's timestamp is the interval's start."""

from collections.abc import Sequence

from gateway.store.contract import HistogramRow
from protocols.prometheus import types_pb2


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
    return [
        HistogramRow(row.tenant, row.series_set_hash, h.timestamp, h.SerializeToString()) for h in series.histograms
    ]


def kept_in_range(rows: Sequence[HistogramRow], start_ms: int, end_ms: int) -> list[HistogramRow]:
    """The histograms roll-up rows keep whose own timestamps are in an inclusive range, oldest first."""
    return [h for row in rows for h in decode_interval(row) if start_ms <= h.timestamp_ms <= end_ms]
