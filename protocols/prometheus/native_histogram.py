"""Native histogram samples as values: Prometheus's FloatHistogram with its arithmetic (schema
and zero-threshold reconciliation, counter-reset detection) and the functions that read one
(quantile, fraction, stddev). docs/promql.rst lists what the engine does with them.

Buckets are kept as ``{index: count}`` per sign. For an exponential schema s (-4..8), bucket i
holds (2^((i-1)/2^s), 2^(i/2^s)]; for custom buckets (schema -53, NHCB) bucket i holds
(custom_values[i-1], custom_values[i]], the first one from -Inf and the one past the last bound
up to +Inf.
"""

import bisect
import dataclasses
import math
import struct
from collections.abc import Iterator
from typing import NamedTuple

from . import types_pb2
from .xor import STALE_NAN_BITS

CUSTOM_BUCKETS_SCHEMA = -53
RESET_HINT, NO_RESET_HINT = types_pb2.Histogram.YES, types_pb2.Histogram.NO
_MAX_FLOAT = 1.7976931348623157e308
_STALE_SUM = struct.pack("<Q", STALE_NAN_BITS)


class IncompatibleBuckets(ValueError):
    """Custom-bucket histograms with different bounds, or custom and exponential ones, met."""


class Bucket(NamedTuple):
    lower: float
    upper: float
    lower_inclusive: bool
    upper_inclusive: bool
    count: float  # type: ignore[assignment]  # a field, shadowing tuple.count on purpose


@dataclasses.dataclass(slots=True)
class Histogram:
    """One native histogram sample, with float counts (Prometheus's FloatHistogram). Equality
    leaves the reset hint out (it is about the sample's history, not its value)."""

    schema: int
    zero_threshold: float
    zero_count: float
    count: float
    sum: float
    positive: dict[int, float]
    negative: dict[int, float]
    custom_values: tuple = ()
    reset_hint: int = dataclasses.field(default=0, compare=False)

    @classmethod
    def from_proto(cls, message) -> "Histogram":
        """A prometheus.Histogram message (integer or float counts) as a float histogram; a zero
        threshold that is NaN or negative (refused at write since, but maybe stored before) is 0, so
        widening to a common threshold ends."""
        floats = message.WhichOneof("count") == "count_float"
        count = message.count_float if floats else float(message.count_int)
        zero_count = (
            message.zero_count_float
            if message.WhichOneof("zero_count") == "zero_count_float"
            else float(message.zero_count_int)
        )
        positive = _buckets(
            message.positive_spans, message.positive_counts if floats else message.positive_deltas, not floats
        )
        negative = _buckets(
            message.negative_spans, message.negative_counts if floats else message.negative_deltas, not floats
        )
        return cls(
            message.schema,
            message.zero_threshold if message.zero_threshold >= 0 else 0.0,
            zero_count,
            count,
            message.sum,
            positive,
            negative,
            tuple(message.custom_values),
            message.reset_hint,
        )

    def copy(self, **changes) -> "Histogram":
        return dataclasses.replace(self, **changes)

    @property
    def custom(self) -> bool:
        return self.schema == CUSTOM_BUCKETS_SCHEMA

    # -- arithmetic ---------------------------------------------------------------------------

    def scale(self, factor: float) -> "Histogram":
        """Every count and the sum times ``factor`` (``h * s``, ``h / s``, rate's extrapolation)."""
        return self.copy(
            zero_count=self.zero_count * factor,
            count=self.count * factor,
            sum=self.sum * factor,
            positive={i: c * factor for i, c in self.positive.items()},
            negative={i: c * factor for i, c in self.negative.items()},
        )

    def add(self, other: "Histogram", sign: float = 1.0, on_reconcile=None) -> "Histogram":
        """``self + sign * other`` in the lower of both schemas and the larger zero threshold;
        custom buckets of different bounds in the bounds both have (``on_reconcile()`` is
        called then: Prometheus 3 says so in an info)."""
        a, b = reconcile(self, other)
        if on_reconcile is not None and (a.custom_values, b.custom_values) != (self.custom_values, other.custom_values):
            on_reconcile()
        return a.copy(
            zero_count=a.zero_count + sign * b.zero_count,
            count=a.count + sign * b.count,
            sum=a.sum + sign * b.sum,
            positive=_combined(a.positive, b.positive, sign),
            negative=_combined(a.negative, b.negative, sign),
            reset_hint=0,
        )

    def sub(self, other: "Histogram", on_reconcile=None) -> "Histogram":
        return self.add(other, -1.0, on_reconcile)

    def rebucketed(self, bounds: tuple) -> "Histogram":
        """A custom-bucket histogram in buckets of ``bounds`` (a subset of its own): each bucket
        joins the first of them at or above its upper bound (+Inf: the last)."""
        if bounds == self.custom_values:
            return self
        positive: dict[int, float] = {}
        for index, count in self.positive.items():
            target = bisect.bisect_left(bounds, self.bound(index))
            positive[target] = positive.get(target, 0.0) + count
        return self.copy(custom_values=bounds, positive=positive)

    def reduced(self, schema: int) -> "Histogram":
        """The same observations in buckets of a lower exponential schema (each 2^(delta) merge)."""
        if self.custom or schema >= self.schema:
            return self
        shift = self.schema - schema
        return self.copy(
            schema=schema, positive=_merge_indexes(self.positive, shift), negative=_merge_indexes(self.negative, shift)
        )

    def widened(self, threshold: float) -> "Histogram":
        """The zero bucket grown to at least ``threshold``: the buckets inside it join it (a
        threshold that falls inside a populated bucket grows to that bucket's upper bound)."""
        if self.custom or threshold <= self.zero_threshold:
            return self
        while True:
            moved, grown = self.zero_count, threshold
            kept_positive: dict[int, float] = {}
            kept_negative: dict[int, float] = {}
            for buckets, kept in ((self.positive, kept_positive), (self.negative, kept_negative)):
                for index in sorted(buckets):
                    lower, upper = self.bound(index - 1), self.bound(index)
                    if lower >= threshold:
                        kept[index] = buckets[index]
                        continue
                    moved += buckets[index]
                    if upper > threshold and buckets[index]:
                        grown = max(grown, upper)
            if grown == threshold:
                return self.copy(
                    zero_threshold=threshold, zero_count=moved, positive=kept_positive, negative=kept_negative
                )
            threshold = grown

    def detect_reset(self, previous: "Histogram") -> bool:
        """Prometheus's DetectReset: this sample restarted the counter since ``previous`` (a
        count, the zero bucket or any bucket went down, the zero threshold shrank, the schema
        grew, or the custom bounds changed)."""
        if self.reset_hint == RESET_HINT:
            return True
        if self.reset_hint == NO_RESET_HINT:
            return False
        if self.count < previous.count or self.custom != previous.custom:
            return True
        if self.custom:
            if self.custom_values != previous.custom_values:
                return True
        elif self.schema > previous.schema or self.zero_threshold < previous.zero_threshold:
            return True
        before = previous.reduced(self.schema).widened(self.zero_threshold)
        if before.zero_threshold != self.zero_threshold or self.zero_count < before.zero_count:
            return True
        return any(count > self.positive.get(i, 0.0) for i, count in before.positive.items()) or any(
            count > self.negative.get(i, 0.0) for i, count in before.negative.items()
        )

    # -- buckets ------------------------------------------------------------------------------

    def bound(self, index: int) -> float:
        """The upper bound of positive bucket ``index`` (Prometheus's getBound)."""
        if self.custom:
            if index < 0:
                return -math.inf
            return self.custom_values[index] if index < len(self.custom_values) else math.inf
        if self.schema < 0:
            exponent = index << -self.schema
            if exponent == 1024:
                return _MAX_FLOAT
            return math.ldexp(1.0, exponent) if exponent < 1024 else math.inf
        per_power = 1 << self.schema
        fraction = 2.0 ** ((index % per_power) / per_power) / 2
        exponent = index // per_power + 1
        if fraction == 0.5 and exponent == 1025:
            return _MAX_FLOAT
        return math.ldexp(fraction, exponent) if exponent <= 1024 else math.inf

    def buckets(self) -> Iterator[Bucket]:
        """Every bucket, lowest first: negative, zero, positive (AllBucketIterator: the zero
        bucket only with a count above 0, a bucket reaching into it cut at its edge, as in
        Prometheus)."""
        edge = self.zero_threshold
        for index in sorted(self.negative, reverse=True):
            upper = -self.bound(index - 1)
            yield Bucket(-self.bound(index), -edge if -edge < upper < 0 else upper, True, False, self.negative[index])
        if self.zero_count > 0:
            yield Bucket(-edge, edge, True, True, self.zero_count)
        for index in sorted(self.positive):
            lower = self.bound(index - 1)
            yield Bucket(edge if 0 < lower < edge else lower, self.bound(index), False, True, self.positive[index])

    def json(self, format_value) -> dict:
        """Prometheus 2.42's JSON: count, sum, and the non-empty buckets as
        [boundary rule, lower, upper, count] (rule 0 (lo, hi], 1 [lo, hi), 2 (lo, hi), 3 [lo, hi])."""
        out = {"count": format_value(self.count), "sum": format_value(self.sum)}
        rows = [
            [
                _RULES[b.lower_inclusive, b.upper_inclusive],
                format_value(b.lower),
                format_value(b.upper),
                format_value(b.count),
            ]
            for b in self.buckets()
            if b.count != 0
        ]
        if rows:
            out["buckets"] = rows
        return out

    # -- functions ----------------------------------------------------------------------------

    def quantile(self, q: float) -> float:
        """Prometheus 3's HistogramQuantile: the bucket the rank q * count falls in, walked from
        the low end (from the high end for q >= 0.5, unless the sum is NaN), interpolated
        linearly inside custom and zero buckets and exponentially inside exponential ones; a
        zero bucket beside buckets of one sign only starts (ends) at 0, a first custom bucket
        from -Inf at 0, and the +Inf bucket answers its lower bound."""
        if q < 0:
            return -math.inf
        if q > 1:
            return math.inf
        if self.count == 0 or math.isnan(q):
            return math.nan
        forward = math.isnan(self.sum) or q < 0.5
        rank = q * self.count if forward else (1 - q) * self.count
        seen, bucket = 0.0, Bucket(0.0, 0.0, False, False, 0.0)
        for bucket in self.buckets() if forward else reversed(list(self.buckets())):
            if bucket.count == 0:
                continue
            seen += bucket.count
            if seen >= rank:
                break
        lower, upper = bucket.lower, bucket.upper
        if not self.custom and lower < 0 < upper:
            if not self.negative and self.positive:
                lower = 0.0
            elif not self.positive and self.negative:
                upper = 0.0
        elif self.custom:
            if lower == -math.inf:
                if upper <= 0:
                    return upper
                lower = 0.0
            elif upper == math.inf:
                return lower
        seen = min(seen, self.count)
        if seen < rank:
            return math.nan if math.isnan(self.sum) else upper
        rank = rank - (seen - bucket.count) if forward else seen - rank
        fraction = rank / bucket.count
        if self.custom or (lower <= 0 <= upper):
            return lower + (upper - lower) * fraction
        low, high = math.log2(abs(lower)), math.log2(abs(upper))
        if lower > 0:
            return 2.0 ** (low + (high - low) * fraction)
        return -(2.0 ** (high + (low - high) * (1 - fraction)))

    def fraction(self, lower: float, upper: float) -> float:
        """Prometheus 3's HistogramFraction: the share of observations between ``lower`` and
        ``upper``, interpolated inside the buckets the ends fall in (linearly in custom and zero
        buckets, exponentially in exponential ones; a bucket from -Inf counts whole)."""
        if self.count == 0 or math.isnan(lower) or math.isnan(upper):
            return math.nan
        if lower >= upper:
            return 0.0
        rank, lower_rank, upper_rank = 0.0, None, None
        for b in self.buckets():
            zero_bucket = b.lower <= 0 <= b.upper
            if zero_bucket:
                if not self.negative and self.positive:
                    b = b._replace(lower=0.0)
                elif not self.positive and self.negative:
                    b = b._replace(upper=0.0)
            linear = self.custom or zero_bucket
            if lower_rank is None and b.lower >= lower:
                lower_rank = rank
            if upper_rank is None and b.lower >= upper:
                upper_rank = rank
            if lower_rank is not None and upper_rank is not None:
                break
            if lower_rank is None and b.lower < lower < b.upper:
                lower_rank = rank + b.count * _fraction_below(b, lower, linear)
            if upper_rank is None and b.lower < upper < b.upper:
                upper_rank = rank + b.count * _fraction_below(b, upper, linear)
            if lower_rank is not None and upper_rank is not None:
                break
            rank += b.count
        total = sum(b.count for b in self.buckets()) if math.isnan(self.sum) else self.count
        lower_rank = total if lower_rank is None or lower_rank > total else lower_rank
        upper_rank = total if upper_rank is None or upper_rank > total else upper_rank
        return (upper_rank - lower_rank) / self.count

    def variance(self) -> float:
        """histogram_stdvar (Prometheus 3): each bucket's observations taken at its geometric
        mean (0 in the zero bucket, the arithmetic mean of a custom bucket's bounds)."""
        if self.count == 0:
            return math.nan
        mean = self.sum / self.count
        total = 0.0
        for b in self.buckets():
            if not b.count:
                continue
            if self.custom:
                value = (b.upper + b.lower) / 2
            elif b.lower <= 0 <= b.upper:
                value = 0.0
            else:  # NaN where the bounds have no geometric mean (Go's math.Sqrt of a negative)
                product = b.upper * b.lower
                value = math.copysign(math.sqrt(product), b.upper) if product >= 0 else math.nan
            total += b.count * (value - mean) ** 2
        return total / self.count


_RULES = {(False, True): 0, (True, False): 1, (False, False): 2, (True, True): 3}


def _fraction_below(bucket: Bucket, value: float, linear: bool) -> float:
    """The share of ``bucket`` below ``value`` (Prometheus 3's FractionBelow): linear, or linear
    in log2 of the bounds (negative buckets mirrored); a bucket from -Inf counts whole."""
    if linear:
        if bucket.lower == -math.inf:
            return 1.0
        return (value - bucket.lower) / (bucket.upper - bucket.lower)
    low, high, point = math.log2(abs(bucket.lower)), math.log2(abs(bucket.upper)), math.log2(abs(value))
    if value > 0:
        return (point - low) / (high - low)
    return 1 - (point - high) / (low - high)


def reconcile(a: Histogram, b: Histogram) -> tuple[Histogram, Histogram]:
    """Both histograms in one bucket layout: the lower schema, the larger zero threshold; custom
    buckets of different bounds in the bounds both have (Prometheus 3's reconciliation)."""
    if a.custom or b.custom:
        if a.custom != b.custom:
            raise IncompatibleBuckets("histograms with exponential and custom buckets")
        if a.custom_values != b.custom_values:
            common = tuple(sorted(set(a.custom_values) & set(b.custom_values)))
            return a.rebucketed(common), b.rebucketed(common)
        return a, b
    schema = min(a.schema, b.schema)
    a, b = a.reduced(schema), b.reduced(schema)
    while a.zero_threshold != b.zero_threshold:
        threshold = max(a.zero_threshold, b.zero_threshold)
        a, b = a.widened(threshold), b.widened(threshold)
    return a, b


def _buckets(spans, values, deltas: bool) -> dict[int, float]:
    """{index: count} from spans and (delta-encoded integer or absolute float) counts."""
    found, index, position, running = {}, 0, 0, 0
    for span in spans:
        index += span.offset
        for _ in range(span.length):
            if deltas:
                running += values[position]
                found[index] = float(running)
            else:
                found[index] = values[position]
            position += 1
            index += 1
    return found


def _merge_indexes(buckets: dict[int, float], shift: int) -> dict[int, float]:
    merged: dict[int, float] = {}
    for index, count in buckets.items():
        target = ((index - 1) >> shift) + 1
        merged[target] = merged.get(target, 0.0) + count
    return merged


def _combined(a: dict[int, float], b: dict[int, float], sign: float) -> dict[int, float]:
    out = dict(a)
    for index, count in b.items():
        out[index] = out.get(index, 0.0) + sign * count
    return out


def decode_sample(data: bytes) -> Histogram | None:
    """A stored prometheus.Histogram as a sample; None for a stale marker (its sum is the
    staleness NaN)."""
    message = types_pb2.Histogram.FromString(data)
    if struct.pack("<d", message.sum) == _STALE_SUM:
        return None
    return Histogram.from_proto(message)
