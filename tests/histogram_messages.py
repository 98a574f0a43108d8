"""A decoded chunk sample as the prometheus.Histogram message it came from, so tests compare
what remote read returns with what was written, field for field."""

from protocols.prometheus import types_pb2
from protocols.prometheus.histogram_chunks import NativeHistogram


def to_protobuf(h: NativeHistogram) -> types_pb2.Histogram:
    """The prometheus.Histogram message of a decoded sample."""
    message = types_pb2.Histogram(
        sum=h.sum,
        schema=h.schema,
        zero_threshold=h.zero_threshold,
        reset_hint=h.hint,
        timestamp=h.timestamp,
        custom_values=h.custom_values,
    )
    if h.is_float:
        message.count_float, message.zero_count_float = h.total, h.zero_count
        message.positive_counts.extend(h.positive)
        message.negative_counts.extend(h.negative)
    else:
        message.count_int, message.zero_count_int = int(h.total), int(h.zero_count)
        message.positive_deltas.extend(h.positive)
        message.negative_deltas.extend(h.negative)
    for spans, field in ((h.positive_spans, message.positive_spans), (h.negative_spans, message.negative_spans)):
        for offset, length in spans:
            field.add(offset=offset, length=length)
    return message
