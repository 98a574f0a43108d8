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
RESET_HINT, NO_RESET_HINT, UNKNOWN_HINT = types_pb2.Histogram.YES, types_pb2.Histogram.NO, types_pb2.Histogram.UNKNOWN
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

    def divided(self, divisor: float) -> "Histogram":
        """Every count and the sum divided by ``divisor`` (Prometheus's Div: ``h / s`` and the
        means); dividing by 0 drops the buckets, leaving the zero bucket, count and sum infinite
        (NaN where they were 0)."""
        if divisor == 0:
            return self.copy(
                zero_count=_by_zero(self.zero_count, divisor),
                count=_by_zero(self.count, divisor),
                sum=_by_zero(self.sum, divisor),
                positive={},
                negative={},
            )
        return self.copy(
            zero_count=self.zero_count / divisor,
            count=self.count / divisor,
            sum=self.sum / divisor,
            positive={i: c / divisor for i, c in self.positive.items()},
            negative={i: c / divisor for i, c in self.negative.items()},
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
        grew, or a bucket went down in the custom bounds both have)."""
        if self.reset_hint == RESET_HINT:
            return True
        if self.reset_hint == NO_RESET_HINT:
            return False
        if self.count < previous.count or self.custom != previous.custom:
            return True
        if self.custom:
            if self.custom_values != previous.custom_values:  # a bucket went down in the bounds both have
                common = tuple(sorted(set(self.custom_values) & set(previous.custom_values)))
                now, before = self.rebucketed(common), previous.rebucketed(common)
                return any(count > now.positive.get(i, 0.0) for i, count in before.positive.items())
        elif self.schema > previous.schema or self.zero_threshold < previous.zero_threshold:
            return True
        before = previous.reduced(self.schema).widened(self.zero_threshold)
        if before.zero_threshold != self.zero_threshold or self.zero_count < before.zero_count:
            return True
        return any(count > self.positive.get(i, 0.0) for i, count in before.positive.items()) or any(
            count > self.negative.get(i, 0.0) for i, count in before.negative.items()
        )

    def trimmed(self, value: float, upper: bool) -> "Histogram":
        """Prometheus 3's trim operators: ``h </ value`` (``upper``) keeps the observations below
        ``value``, ``h >/ value`` those above it. A bucket the value cuts keeps its interpolated
        share (linear for custom buckets, log-linear for exponential ones); when a bucket changes,
        count and sum become the kept counts and their buckets' midpoints times the counts."""
        total = weighted = 0.0
        changed = False
        kept_sides = []
        for side, buckets in ((1, self.positive), (-1, self.negative)):
            kept = {}
            for index, count in buckets.items():
                if count == 0:
                    continue
                if side == 1:
                    bucket = Bucket(self.bound(index - 1), self.bound(index), False, True, count)
                else:
                    bucket = Bucket(-self.bound(index), -self.bound(index - 1), True, False, count)
                keep, midpoint = _trim_bucket(bucket, value, upper, side == 1, self.custom)
                total += keep
                weighted += midpoint * keep
                changed = changed or keep != count
                if keep != 0:
                    kept[index] = keep
            kept_sides.append(kept)
        zero_count = self.zero_count
        if zero_count > 0:
            has_positive, has_negative = any(self.positive.values()), any(self.negative.values())
            low = 0.0 if has_positive and not has_negative else -self.zero_threshold
            high = 0.0 if has_negative and not has_positive else self.zero_threshold
            zero_count, midpoint = _trim_zero_bucket(zero_count, low, high, value, upper)
            changed = changed or zero_count != self.zero_count
            weighted += midpoint * zero_count
            total += zero_count
        if not changed:
            return self
        return self.copy(
            zero_count=zero_count, count=total, sum=weighted, positive=kept_sides[0], negative=kept_sides[1]
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

    def text(self, format_number) -> str:
        """Prometheus's FloatHistogram.String (count_values labels a histogram with it): count,
        sum and the non-empty buckets, negative, zero, positive, each as its bounds and count
        (numbers as ``format_number`` writes them, Go's %g)."""
        parts = [f"count:{format_number(self.count)}", f"sum:{format_number(self.sum)}"]

        def bucket(lower: float, upper: float, lower_inclusive: bool, upper_inclusive: bool, count: float) -> str:
            return (
                f"{'[' if lower_inclusive else '('}{format_number(lower)},{format_number(upper)}"
                f"{']' if upper_inclusive else ')'}:{format_number(count)}"
            )

        for index in sorted(self.negative, reverse=True):
            if self.negative[index]:
                parts.append(bucket(-self.bound(index), -self.bound(index - 1), True, False, self.negative[index]))
        if self.zero_count:
            parts.append(bucket(-self.zero_threshold, self.zero_threshold, True, True, self.zero_count))
        for index in sorted(self.positive):
            if self.positive[index]:
                parts.append(bucket(self.bound(index - 1), self.bound(index), False, True, self.positive[index]))
        return "{" + ", ".join(parts) + "}"

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

    def quantile(self, q: float, note=lambda what: None) -> float:
        """Prometheus 3's HistogramQuantile: the bucket the rank q * count falls in, walked from
        the low end (from the high end for q >= 0.5, unless the sum is NaN), interpolated
        linearly inside custom and zero buckets and exponentially inside exponential ones; a
        zero bucket beside buckets of one sign only starts (ends) at 0, a first custom bucket
        from -Inf at 0, and the +Inf bucket answers its lower bound. NaN observations (a NaN sum,
        a count above the buckets') are told to ``note`` ("result is NaN" where the rank is past
        every bucket, else "result is skewed higher")."""
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
            if math.isnan(self.sum):
                note("result is NaN")
                return math.nan
            return upper
        rank = rank - (seen - bucket.count) if forward else seen - rank
        if self._has_nan_observations():
            note("result is skewed higher")
        fraction = rank / bucket.count
        if self.custom or (lower <= 0 <= upper):
            return lower + (upper - lower) * fraction
        low, high = math.log2(abs(lower)), math.log2(abs(upper))
        if lower > 0:
            return 2.0 ** (low + (high - low) * fraction)
        return -(2.0 ** (high + (low - high) * (1 - fraction)))

    def _has_nan_observations(self) -> bool:
        """The sum is NaN and the buckets hold fewer observations than the count."""
        return math.isnan(self.sum) and sum(b.count for b in self.buckets()) < self.count

    def fraction(self, lower: float, upper: float, note=lambda: None) -> float:
        """Prometheus 3's HistogramFraction: the share of observations between ``lower`` and
        ``upper``, interpolated inside the buckets the ends fall in (linearly in custom and zero
        buckets, exponentially in exponential ones; a bucket from -Inf counts whole). NaN
        observations count in no bucket: ``note()`` is told of them."""
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
        if total < self.count:
            note()
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


def kahan_inc(increment: float, total: float, compensation: float) -> tuple[float, float]:
    """Prometheus 3's kahansum.Inc: Neumaier's compensated addition, the correction dropped once
    the total is infinite."""
    new_total = total + increment
    if math.isinf(new_total):
        return new_total, 0.0
    if abs(total) >= abs(increment):
        return new_total, compensation + ((total - new_total) + increment)
    return new_total, compensation + ((increment - new_total) + total)


@dataclasses.dataclass(slots=True)
class HistogramSum:
    """A running sum of histograms with its Kahan compensation, a histogram in the same bucket
    layout (Prometheus 3's KahanAdd): sums of huge and tiny counts or sums lose less."""

    total: Histogram
    compensation: Histogram

    @classmethod
    def of(cls, first: Histogram) -> "HistogramSum":
        return cls(first, _zeroed(first))

    def add(self, other: Histogram, on_reconcile=None) -> None:
        added = self.plus(other, on_reconcile)
        self.total, self.compensation = added.total, added.compensation

    def plus(self, other: Histogram, on_reconcile=None) -> "HistogramSum":
        """``self + other``, in the layout both share (as Histogram.add; IncompatibleBuckets for
        custom and exponential buckets met)."""
        total, compensation = self.total, self.compensation
        other_compensation = other.copy(zero_count=0.0, count=0.0, sum=0.0, positive={}, negative={})
        if total.custom or other.custom:
            if total.custom != other.custom:
                raise IncompatibleBuckets("histograms with exponential and custom buckets")
            if total.custom_values != other.custom_values:
                if on_reconcile is not None:
                    on_reconcile()
                common = tuple(sorted(set(total.custom_values) & set(other.custom_values)))
                total, compensation = _kahan_rebucketed(total, compensation, common)
                other, other_compensation = _kahan_rebucketed(other, other_compensation, common)
        else:
            while total.zero_threshold != other.zero_threshold:
                if total.zero_threshold > other.zero_threshold:
                    other, other_compensation = _kahan_widened(other, other_compensation, total.zero_threshold)
                if other.zero_threshold > total.zero_threshold:
                    total, compensation = _kahan_widened(total, compensation, other.zero_threshold)
            schema = min(total.schema, other.schema)
            total, compensation = _kahan_reduced(total, compensation, schema)
            other, other_compensation = _kahan_reduced(other, other_compensation, schema)
        zero, zero_lost = kahan_inc(other.zero_count, total.zero_count, compensation.zero_count)
        zero, zero_lost = kahan_inc(other_compensation.zero_count, zero, zero_lost)
        count, count_lost = kahan_inc(other.count, total.count, compensation.count)
        total_sum, sum_lost = kahan_inc(other.sum, total.sum, compensation.sum)
        positive, lost_positive = _kahan_added(
            total.positive, compensation.positive, other.positive, other_compensation.positive
        )
        negative, lost_negative = _kahan_added(
            total.negative, compensation.negative, other.negative, other_compensation.negative
        )
        return HistogramSum(
            total.copy(zero_count=zero, count=count, sum=total_sum, positive=positive, negative=negative, reset_hint=0),
            compensation.copy(
                zero_count=zero_lost, count=count_lost, sum=sum_lost, positive=lost_positive, negative=lost_negative
            ),
        )

    def scale(self, factor: float) -> "HistogramSum":
        return HistogramSum(self.total.scale(factor), self.compensation.scale(factor))

    def divided(self, divisor: float) -> "HistogramSum":
        return HistogramSum(self.total.divided(divisor), self.compensation.divided(divisor))

    @property
    def overflows(self) -> bool:
        """Prometheus's HasOverflow: a count, the sum or a bucket of the total is infinite."""
        h = self.total
        return any(
            math.isinf(v)
            for v in (h.zero_count, h.count, h.sum, *h.positive.values(), *h.negative.values(), *h.custom_values)
        )

    def result(self) -> Histogram:
        return self.total.add(self.compensation).copy(reset_hint=self.total.reset_hint)


class HistogramMean:
    """Prometheus 3's mean of histograms (avg, avg_over_time): their Kahan sum divided by their
    number while no count of the sum overflows; from the sample that would overflow it on, an
    incremental mean (with Kahan compensation too)."""

    def __init__(self, first: Histogram):
        self.running, self.number, self.incremental = HistogramSum.of(first), 1, False

    def add(self, other: Histogram, on_reconcile=None) -> None:
        self.number += 1
        if not self.incremental:
            added = self.running.plus(other, on_reconcile)
            if not added.overflows:
                self.running = added
                return
            self.incremental = True
            self.running = self.running.divided(self.number - 1)
        share = (self.number - 1) / self.number
        self.running = self.running.scale(share).plus(other.divided(self.number), on_reconcile)

    def result(self) -> Histogram:
        return (self.running if self.incremental else self.running.divided(self.number)).result()


def _zeroed(h: Histogram) -> Histogram:
    """A compensation histogram for ``h``: its layout, every count 0."""
    return h.copy(
        zero_count=0.0,
        count=0.0,
        sum=0.0,
        positive=dict.fromkeys(h.positive, 0.0),
        negative=dict.fromkeys(h.negative, 0.0),
        reset_hint=0,
    )


def _kahan_added(
    values: dict[int, float], losts: dict[int, float], theirs: dict[int, float], their_losts: dict[int, float]
) -> tuple[dict[int, float], dict[int, float]]:
    """Buckets plus other buckets (and their compensations), bucket by bucket (kahanAddBuckets)."""
    values, losts = dict(values), dict(losts)
    for index, increment in theirs.items():
        value, lost = kahan_inc(increment, values.get(index, 0.0), losts.get(index, 0.0))
        if their_losts:
            value, lost = kahan_inc(their_losts.get(index, 0.0), value, lost)
        values[index], losts[index] = value, lost
    return values, losts


def _kahan_merged(
    buckets: dict[int, float], losts: dict[int, float], target
) -> tuple[dict[int, float], dict[int, float]]:
    """Buckets (and their compensations) joined into the buckets ``target(index)`` names,
    added with compensation in index order (kahanReduceResolution)."""
    merged: dict[int, float] = {}
    merged_losts: dict[int, float] = {}
    for index in sorted(buckets):
        to = target(index)
        if to not in merged:
            merged[to], merged_losts[to] = buckets[index], losts.get(index, 0.0)
            continue
        value, lost = kahan_inc(buckets[index], merged[to], merged_losts[to])
        merged[to], merged_losts[to] = kahan_inc(losts.get(index, 0.0), value, lost)
    return merged, merged_losts


def _kahan_reduced(h: Histogram, lost: Histogram, schema: int) -> tuple[Histogram, Histogram]:
    if schema >= h.schema:
        return h, lost
    shift = h.schema - schema

    def target(index: int) -> int:
        return ((index - 1) >> shift) + 1

    positive, lost_positive = _kahan_merged(h.positive, lost.positive, target)
    negative, lost_negative = _kahan_merged(h.negative, lost.negative, target)
    return (
        h.copy(schema=schema, positive=positive, negative=negative),
        lost.copy(schema=schema, positive=lost_positive, negative=lost_negative),
    )


def _kahan_rebucketed(h: Histogram, lost: Histogram, bounds: tuple) -> tuple[Histogram, Histogram]:
    """Custom buckets joined into ``bounds`` (a subset of their own), as Histogram.rebucketed."""
    if bounds == h.custom_values:
        return h, lost
    positive, lost_positive = _kahan_merged(
        h.positive, lost.positive, lambda index: bisect.bisect_left(bounds, h.bound(index))
    )
    return (
        h.copy(custom_values=bounds, positive=positive),
        lost.copy(custom_values=bounds, positive=lost_positive),
    )


def _kahan_widened(h: Histogram, lost: Histogram, threshold: float) -> tuple[Histogram, Histogram]:
    """The zero bucket grown to at least ``threshold`` as Histogram.widened, the buckets it
    takes in added with compensation (zeroCountForLargerThreshold)."""
    grown = h.widened(threshold).zero_threshold
    zero, zero_lost = h.zero_count, lost.zero_count
    kept = {}
    for side in ("positive", "negative"):
        buckets, losts = getattr(h, side), getattr(lost, side)
        kept[side] = {i: c for i, c in buckets.items() if h.bound(i - 1) >= grown}
        kept[f"lost_{side}"] = {i: losts.get(i, 0.0) for i in kept[side]}
        for index in sorted(set(buckets) - set(kept[side])):
            zero, zero_lost = kahan_inc(buckets[index], zero, zero_lost)
            zero, zero_lost = kahan_inc(losts.get(index, 0.0), zero, zero_lost)
    return (
        h.copy(zero_threshold=grown, zero_count=zero, positive=kept["positive"], negative=kept["negative"]),
        lost.copy(
            zero_threshold=grown, zero_count=zero_lost, positive=kept["lost_positive"], negative=kept["lost_negative"]
        ),
    )


def _by_zero(value: float, zero: float) -> float:
    """``value / zero`` as IEEE 754 (and Go) divide: NaN for 0 or NaN, else an infinity of the
    sign of both."""
    if value == 0 or math.isnan(value):
        return math.nan
    return math.copysign(math.inf, value) * math.copysign(1.0, zero)


def _trim_bucket(bucket: Bucket, value: float, upper: bool, positive: bool, linear: bool) -> tuple[float, float]:
    """What a bucket keeps of its count after a trim at ``value``, and the midpoint of the part
    kept (Prometheus 3's TrimBuckets for one bucket)."""
    lower, high, count = bucket.lower, bucket.upper, bucket.count
    whole = high <= value if upper else lower >= value
    if whole:
        return count, _midpoint(lower, high, positive, linear)
    cut = lower < value if upper else high > value
    if not cut:
        return 0.0, 0.0
    if math.isinf(lower) or math.isinf(high):
        return _trim_infinite_bucket(bucket, value, upper)
    below = count if value >= high else 0.0 if value <= lower else count * _fraction_below(bucket, value, linear)
    if upper:
        return below, _midpoint(lower, value, positive, linear)
    return count - below, _midpoint(value, high, positive, linear)


def _trim_infinite_bucket(bucket: Bucket, value: float, upper: bool) -> tuple[float, float]:
    """A trim through a bucket reaching -Inf or +Inf: kept whole or dropped, except a custom
    first bucket with a positive upper bound, read as starting at 0."""
    lower, high, count = bucket.lower, bucket.upper, bucket.count
    if lower == -math.inf:
        if upper:
            if value >= high:
                return count, 0.0
            if value > 0 and high > 0 and not math.isinf(high):
                return count * value / high, value / 2
            if high <= 0:
                return count, value
            return 0.0, _finite(high)
        if value <= lower:
            return count, 0.0
        if value >= 0 and high > value and not math.isinf(high):
            return count * (1 - value / high), (value + high) / 2
        return 0.0, _finite(high)
    if upper or value < lower:
        return 0.0, _finite(lower)
    return count, value


def _finite(bound: float) -> float:
    return 0.0 if math.isinf(bound) else bound


def _trim_zero_bucket(count: float, lower: float, upper: float, value: float, upper_trim: bool) -> tuple[float, float]:
    """The zero bucket's share after a trim, as a linear bucket from ``lower`` to ``upper``
    (0 on a side without buckets), and the midpoint of the part kept."""
    if upper_trim:
        if value <= lower:
            return 0.0, 0.0
        if value >= upper:
            return count, (lower + upper) / 2
        return count * (value - lower) / (upper - lower), (lower + value) / 2
    if value <= lower:
        return count, (lower + upper) / 2
    if value >= upper:
        return 0.0, 0.0
    return count * (upper - value) / (upper - lower), (value + upper) / 2


def _midpoint(lower: float, upper: float, positive: bool, linear: bool) -> float:
    """The midpoint of what a trimmed bucket keeps: arithmetic for custom buckets, geometric
    (signed) for exponential ones, the finite bound where the other is infinite."""
    if math.isinf(lower):
        if math.isinf(upper):
            return 0.0
        return upper / 2 if upper > 0 else upper
    if math.isinf(upper):
        return lower
    if linear:
        return (lower + upper) / 2
    mean = math.sqrt(abs(lower * upper))
    return mean if positive else -mean


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
