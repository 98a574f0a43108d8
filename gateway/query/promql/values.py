"""The values a PromQL expression evaluates to, over all the steps of a query at once.

An instant vector is a matrix: one row per series, one column per evaluation step, with a
``present`` mask beside the values (NaN is a value in PromQL, so it cannot mean "absent").
Native histogram samples (protocols/prometheus/native_histogram.py) sit beside, in an object matrix that is
None where a row has no histogram: ``present`` is about floats only, so every function that
knows floats only leaves histograms out, as Prometheus does.
A range vector keeps each series' raw samples and, per step, the window they are cut to.
"""

import math
import sys
import threading
import time
from contextvars import ContextVar
from decimal import Decimal
from typing import NamedTuple

import numpy as np

from gateway.core.errors import GatewayError
from protocols.prometheus.xor import STALE_NAN_BITS

NAME = "__name__"


# Prometheus's status of each errorType (its web/api/v1 returnAPIError).
_STATUS_OF_KIND = {"bad_data": 400, "execution": 422, "timeout": 503, "unavailable": 503, "canceled": 499}


class PromQLError(GatewayError):
    """A query Prometheus would refuse: ``kind`` is its errorType (bad_data, execution, timeout,
    unavailable, canceled), which sets the status as Prometheus does."""

    def __init__(self, message: str, kind: str = "execution"):
        super().__init__(message)
        self.kind = kind
        self.error_type = kind
        self.status = _STATUS_OF_KIND[kind]


class Guard(NamedTuple):
    """What one query may spend: its deadline (time.monotonic()) and the values it may hold
    (--query-max-samples), and whether it is still wanted. Checked before each read batch, each node, each series of a range
    function and each window array, so neither a subquery of millions of steps nor windows of
    thousands of samples run past them."""

    deadline: float = math.inf
    max_samples: int = sys.maxsize
    cancelled: threading.Event | None = None  # set when the client went away
    setting: str = "--query-max-samples"  # named in the refusal: the flag, or the tenant's override

    def check(self, during: str = "expression evaluation") -> None:
        if self.cancelled is not None and self.cancelled.is_set():
            raise PromQLError("query cancelled: the client went away", "canceled")
        if time.monotonic() > self.deadline:
            raise PromQLError(f"query timed out in {during}", "timeout")

    def count(self, samples: int) -> None:  # type: ignore[override]  # the guard's sample count, not tuple.count
        if samples > self.max_samples:
            raise self.too_many()

    def too_many(self, *_) -> "PromQLError":
        """The refusal of a query that would hold more than --query-max-samples (also a read budget's)."""
        return PromQLError(
            "query processing would load too many samples into memory in query execution"
            f" ({self.setting} {self.max_samples})"
        )


Labels = dict[str, str]
LabelsKey = frozenset[tuple[str, str]]  # labels_key's


class Vector(NamedTuple):
    labels: list[Labels]
    values: np.ndarray  # (series, steps) float64
    present: np.ndarray  # (series, steps) bool
    sample_ms: np.ndarray | None = None  # (series, steps) int64: the timestamps timestamp() gives
    histograms: np.ndarray | None = None  # (series, steps) object: a Histogram or None

    @classmethod
    def empty(cls, steps: int) -> "Vector":
        return cls([], np.zeros((0, steps)), np.zeros((0, steps), dtype=bool))

    @property
    def histogram_present(self) -> np.ndarray:
        """Where a row holds a histogram sample (all False without histograms)."""
        if self.histograms is None:
            return np.zeros(self.present.shape, dtype=bool)
        return np.not_equal(self.histograms, None)  # type: ignore[call-overload]  # numpy's stubs: None in an object array

    @property
    def sampled(self) -> np.ndarray:
        """Where a row holds a sample, float or histogram."""
        return self.present if self.histograms is None else self.present | self.histogram_present

    def without_absent(self) -> "Vector":
        """Rows with no sample (float or histogram) at any step are left out (a function's
        output has no empty series)."""
        keep = self.sampled.any(axis=1)
        if keep.all():
            return self
        return self.take(np.flatnonzero(keep))

    def take(self, index: np.ndarray) -> "Vector":
        """The rows at ``index``, in that order."""
        stamps = None if self.sample_ms is None else self.sample_ms[index]
        histograms = None if self.histograms is None else self.histograms[index]
        return Vector([self.labels[i] for i in index], self.values[index], self.present[index], stamps, histograms)

    def with_values(
        self, values: np.ndarray | None, present: np.ndarray | None = None, drop_name: bool = True
    ) -> "Vector":
        """These rows with other values (None: the same), without ``__name__`` unless told."""
        labels = [drop_metric_name(labels) for labels in self.labels] if drop_name else self.labels
        values = self.values if values is None else values
        return Vector(labels, values, self.present if present is None else present & self.present)


class Scalar(NamedTuple):
    values: np.ndarray  # (steps,)


class String(NamedTuple):
    value: str


class Series(NamedTuple):
    """The samples of one series, sorted by time, stale markers removed for range use."""

    labels: Labels
    timestamps: np.ndarray  # int64 ms
    values: np.ndarray


# Samples a (series, step) cell above which a stack's windows are found by a search of each
# cell (a log of the samples a cell) rather than by counting every sample (instant queries,
# windows of many samples)
SEARCHED_SAMPLES_A_CELL = 3  # break-even measured: searching costs 0.7x counting at 8 samples a cell, 1.2x at 2


class RangeVector(NamedTuple):
    """Series with, per step, the window (ref - range, ref] their samples are cut to;
    ``histogram_series`` are those holding native histograms (values: an object array)."""

    series: list[Series]
    refs: np.ndarray  # (steps,) int64 ms: the end of each step's window
    range_ms: int
    histogram_series: tuple = ()
    guard: Guard = Guard()
    modifier: str | None = None  # "anchored" or "smoothed" (Prometheus 3's extended range selectors)
    lookback_ms: int = 0  # how far before a window an anchored or smoothed one looks for its boundary

    def windows(self, series: Series) -> tuple[np.ndarray, np.ndarray]:
        """Per step, the first and one-past-last sample index inside the window (left-open, right
        closed: (ref - range, ref], as Prometheus 3 selects). Functions ask once a series, so the deadline is checked there."""
        self.guard.check()
        return self.window_indexes(series.timestamps, self.refs)

    def window_indexes(self, timestamps: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The windows ending at ``ends`` over the sorted ``timestamps``."""
        return self._windows(lambda bounds: np.searchsorted(timestamps, bounds, side="right"), ends)

    def stacked_windows(self, timestamps: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The windows of many series at once, as (series, step) indexes into ``timestamps``,
        their samples laid end to end (``lengths`` a series). Each series' samples at or before
        a bound are counted (a bincount and a cumulative sum): a pass over the samples and the
        cells, where a search of every cell in all the samples costs a log of them a cell."""
        steps = len(self.refs)
        if len(timestamps) > SEARCHED_SAMPLES_A_CELL * len(lengths) * steps:
            return self._searched_windows(timestamps, lengths)
        owner = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)

        def at_or_before(bounds: np.ndarray) -> np.ndarray:
            order = None if (bounds[1:] >= bounds[:-1]).all() else np.argsort(bounds, kind="stable")
            sorted_bounds = bounds if order is None else bounds[order]
            first_bound = _first_at_or_after(sorted_bounds, timestamps)  # the sample counts from there
            # (series, bound) cells in order: the running count is the samples of the series
            # before and of this one up to the bound, one past its last sample's index
            cells = len(bounds) + 1
            counts = np.bincount(owner * cells + first_bound, minlength=len(lengths) * cells)
            indexes = np.cumsum(counts).reshape(len(lengths), cells)[:, :-1]
            if order is not None:
                indexes[:, order] = indexes.copy()
            return indexes

        return self._windows(at_or_before, self.refs, at_once=True)

    def _searched_windows(self, timestamps: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """stacked_windows by a search of every cell: each series' times are shifted to a span
        of their own, so that one search in all the samples finds the series' windows."""
        base = min(int(timestamps.min()), int(self.refs.min()) - self.range_ms - self.lookback_ms)
        span = max(int(timestamps.max()), int(self.refs.max())) - base + 1
        shift = np.arange(len(lengths), dtype=np.int64) * span
        keys = timestamps - base + np.repeat(shift, lengths)
        return self._windows(
            lambda bounds: np.searchsorted(keys, (bounds - base)[None, :] + shift[:, None], side="right"),
            self.refs,
            at_once=True,
        )

    def _windows(self, at_or_before, ends: np.ndarray, at_once: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The windows ending at ``ends``, from ``at_or_before(bounds)``: one past the index of
        the last sample at or before each bound. An anchored window also holds its anchor, the
        last sample at or before its start within the lookback, and is empty without a sample
        after its start (Prometheus's pickFirstSampleIndices). ``at_once`` (a call over many
        series): where the range is a whole number of evenly spaced steps, as it mostly is, each
        window's start is an earlier step's end, and one call over the ends and the first starts
        gives both."""
        shift = _steps_in(self.range_ms, ends) if at_once else None
        if shift is None:
            lo, hi = at_or_before(ends - self.range_ms), at_or_before(ends)
        else:
            both = at_or_before(np.concatenate([ends[:shift] - self.range_ms, ends]))
            lo, hi = both[..., : len(ends)], both[..., shift:]
        if self.modifier == "anchored":
            in_lookback = at_or_before(ends - self.range_ms - self.lookback_ms)
            lo = np.where(hi > lo, np.maximum(lo - 1, in_lookback), hi)
        return lo, hi


def _steps_in(range_ms: int, ends: np.ndarray) -> int | None:
    """How many steps of the evenly spaced ``ends`` make ``range_ms`` (at most their number), or
    None when it is no whole number of them."""
    if len(ends) < 2:
        return None
    spacing = ends[1:] - ends[:-1]
    step = int(spacing[0])
    if step <= 0 or range_ms % step or not (spacing == step).all():
        return None
    return min(range_ms // step, len(ends))


def _first_at_or_after(bounds: np.ndarray, timestamps: np.ndarray) -> np.ndarray:
    """np.searchsorted(bounds, timestamps, side="left") of sorted ``bounds``, by a division
    where they are evenly spaced (a range query's steps): a third of the search's cost."""
    spacing = bounds[1:] - bounds[:-1]
    if len(spacing) and spacing[0] > 0 and (spacing == spacing[0]).all():
        step = int(spacing[0])
        return np.clip((timestamps - bounds[0] + (step - 1)) // step, 0, len(bounds))
    return np.searchsorted(bounds, timestamps, side="left")


def merge_same_labels(vector: Vector) -> Vector:
    """One row per label set: rows that became the same labels (a function dropped ``__name__``,
    label_replace, the two sides of ``or``) merge, as Prometheus's range results do; two with a
    value at the same step are the error Prometheus gives."""
    rows: dict[LabelsKey, list[int]] = {}
    for index, row_labels in enumerate(vector.labels):
        rows.setdefault(labels_key(row_labels), []).append(index)
    if len(rows) == len(vector.labels):
        return vector
    holds = vector.histogram_present
    labels, values, present, histograms = [], [], [], []
    for indexes in rows.values():
        if (vector.sampled[indexes].sum(axis=0) > 1).any():
            raise PromQLError("vector cannot contain metrics with the same labelset")
        labels.append(vector.labels[indexes[0]])
        values.append(np.where(vector.present[indexes], vector.values[indexes], 0.0).sum(axis=0))
        present.append(vector.present[indexes].any(axis=0))
        if vector.histograms is not None:
            picked = np.argmax(holds[indexes], axis=0)
            histograms.append(vector.histograms[np.asarray(indexes)[picked], np.arange(holds.shape[1])])
    return Vector(labels, np.vstack(values), np.vstack(present), None, np.vstack(histograms) if histograms else None)


def metric_name(labels: Labels) -> str:
    return labels.get(NAME, "")


def go_float(value: float) -> str:
    """A float as Go's %v prints it in Prometheus's messages: the shortest digits, as an
    exponent from 1e+06 up and below 1e-04 (1.5, -2, 1e+06, 9.2e+18, NaN, +Inf)."""
    value = float(value)
    if not math.isfinite(value):
        return "NaN" if math.isnan(value) else "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    sign, digits, exponent = Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)
    decimal_exponent = len(digits) + exponent - 1
    if -4 <= decimal_exponent < 6:
        return repr(value).removesuffix(".0")
    mantissa = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{'-' if decimal_exponent < 0 else '+'}{abs(decimal_exponent):02d}"


RECONCILED = "PromQL info: mismatched custom buckets were reconciled during"  # + the operation


def mixed_schemas_warning(labels: Labels) -> str:
    """Prometheus 3's warning on exponential and custom-bucket histograms met in one operation."""
    return (
        "PromQL warning: vector contains a mix of histograms with exponential and custom buckets schemas"
        f' for metric name "{metric_name(labels)}"'
    )


def quantile_warning(q: np.ndarray) -> str | None:
    """Prometheus 3's warning on quantiles outside [0, 1] (NaN first, then the largest, then the
    smallest), None when all are inside."""
    for bad in (q[np.isnan(q)], q[q > 1], q[q < 0]):
        if len(bad):
            value = bad.max() if (bad > 1).any() else bad.min()
            return f"PromQL warning: quantile value should be between 0 and 1, got {go_float(value)}"
    return None


# The metric's schema labels (Prometheus 3's schema.IsMetadataLabel): the name, and the type and
# unit its type-and-unit-labels feature stores as labels, dropped together.
SCHEMA_LABELS = frozenset((NAME, "__type__", "__unit__"))


class NameToDrop(dict):
    """Labels an operation took the metric's name from while the name removal is delayed
    (Prometheus's promql-delayed-name-removal, --promql-delayed-name-removal): they keep their
    schema labels until the answer, so label_replace/label_join can still read or keep the name
    and ``by (__name__)`` still groups by it; ``answer_labels`` removes them then."""


# Whether the query being evaluated (in this thread) delays the name removal: set for the whole
# evaluation by Evaluator.result, read where drop_metric_name is called, deep in the functions.
DELAYED_NAME_REMOVAL: ContextVar[bool] = ContextVar("delayed_name_removal", default=False)


def drop_metric_name(labels: Labels) -> Labels:
    """The labels without the metric's name, type and unit (where an operation or a function
    changes what the metric is); marked to lose them at the answer where the removal is delayed."""
    if SCHEMA_LABELS.isdisjoint(labels):
        return labels
    if DELAYED_NAME_REMOVAL.get():
        return labels if isinstance(labels, NameToDrop) else NameToDrop(labels)
    dropped = dict(labels)  # a copy less three keys: cheaper than a comprehension, a series a query
    for name in SCHEMA_LABELS:
        dropped.pop(name, None)
    return dropped


def marked_like(original: Labels, labels: Labels) -> Labels:
    """``labels`` (built from ``original``) marked to lose the name at the answer if ``original`` was."""
    if isinstance(original, NameToDrop) and not isinstance(labels, NameToDrop):
        return NameToDrop(labels)
    return labels


def answer_labels(labels: Labels) -> Labels:
    """The labels the answer shows: without the schema labels where their removal was delayed."""
    if isinstance(labels, NameToDrop):
        return {k: v for k, v in labels.items() if k not in SCHEMA_LABELS}
    return labels


def labels_key(labels: Labels) -> LabelsKey:
    """The identity of a label set, to find equal ones (never to order them): a frozenset of the
    pairs, built without sorting (a few times a series a query)."""
    return frozenset(labels.items())


def is_stale(values: np.ndarray) -> np.ndarray:
    return values.view(np.int64) == STALE_NAN_BITS


def gather(series: Series, lo: np.ndarray, hi: np.ndarray, guard: Guard) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The windows' samples as (steps, widest window) arrays of timestamps and values, with the
    mask of real entries; the padding repeats the last sample and is masked out. Their size is
    counted against the guard first: 6 h windows of 1 s samples at 21601 steps are 466 million."""
    width = int((hi - lo).max()) if len(lo) else 0
    guard.count(len(lo) * width)
    index = lo[:, None] + np.arange(max(width, 1))[None, :]
    mask = index < hi[:, None]
    index = np.minimum(index, max(len(series.values) - 1, 0))
    if not len(series.values):
        return np.zeros(index.shape, dtype=np.int64), np.zeros(index.shape), np.zeros(index.shape, dtype=bool)
    return series.timestamps[index], series.values[index], mask


def stacked(first: Vector, second: Vector) -> Vector:
    """The rows of both vectors (e.g. a function's float results and its histogram results)."""
    if not second.labels:
        return first
    if not first.labels:
        return second
    if first.histograms is None and second.histograms is None:
        histograms = None
    else:
        histograms = np.vstack(
            [
                v.histograms if v.histograms is not None else np.full(v.values.shape, None, dtype=object)
                for v in (first, second)
            ]
        )
    return Vector(
        first.labels + second.labels,
        np.vstack([first.values, second.values]),
        np.vstack([first.present, second.present]),
        None,
        histograms,
    )
