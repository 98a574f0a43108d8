"""One series' samples as two numpy arrays, the shape every reader works on.

Timestamps are int64 milliseconds, ascending and unique; values are float64 (NaN included: a
Prometheus stale marker is a NaN with a particular payload, kept bit for bit).
"""

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class Samples(NamedTuple):
    timestamps: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.timestamps)

    def between(self, start_ms: int, end_ms: int) -> "Samples":
        """The samples in the inclusive range [start_ms, end_ms]."""
        first, last = np.searchsorted(self.timestamps, [start_ms, end_ms + 1])
        return Samples(self.timestamps[first:last], self.values[first:last])

    def points(self) -> list[tuple[int, float]]:
        """[(timestamp_ms, value), ...] for the edges that speak lists (protocol encoders)."""
        return list(zip(self.timestamps.tolist(), self.values.tolist()))


class SamplesStack(NamedTuple):
    """Many series' samples laid end to end, as one read gives them: series ``i``'s are
    ``[bounds[i]:bounds[i + 1]]`` of the arrays. A Samples object a series costs more than the
    read of a short range (a dashboard's count() of 1,000 series)."""

    bounds: list[int]
    timestamps: np.ndarray
    values: np.ndarray

    def split(self) -> list[Samples]:
        """Each series' Samples (one shared empty Samples for the series without any)."""
        nothing = empty()
        pairs = zip(self.bounds, self.bounds[1:])
        return [Samples(self.timestamps[a:b], self.values[a:b]) if b > a else nothing for a, b in pairs]


def stacked(parts: Sequence[Samples]) -> SamplesStack:
    """The SamplesStack of ``parts``, in their order."""
    lengths = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
    return SamplesStack(
        np.concatenate([[0], np.cumsum(lengths)]).tolist(),
        np.concatenate([empty().timestamps, *(part.timestamps for part in parts)]),
        np.concatenate([empty().values, *(part.values for part in parts)]),
    )


def empty() -> Samples:
    return Samples(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64))


def from_points(points: Sequence[tuple[int, float]]) -> Samples:
    """[(timestamp_ms, value), ...] in any order, possibly repeating a timestamp (the later one
    in the list wins) -> Samples."""
    if not len(points):
        return empty()
    rows = np.array(points, dtype=[("ts", np.int64), ("value", np.float64)])
    return merge([Samples(rows["ts"], rows["value"])])


def merge(parts: Sequence[Samples]) -> Samples:
    """Samples of several sources, oldest source first: where two hold the same timestamp, the
    later source wins (a head row written after a block was sealed replaces the block's value)."""
    parts = [part for part in parts if len(part)]
    if not parts:
        return empty()
    if len(parts) == 1 and _strictly_ascending(parts[0].timestamps):
        return parts[0]
    timestamps = np.concatenate([part.timestamps for part in parts])
    values = np.concatenate([part.values for part in parts])
    order = np.argsort(timestamps, kind="stable")
    timestamps, values = timestamps[order], values[order]
    keep = np.ones(len(timestamps), dtype=bool)
    keep[:-1] = timestamps[1:] != timestamps[:-1]
    return Samples(timestamps[keep], values[keep])


def _strictly_ascending(timestamps: np.ndarray) -> bool:
    return bool(np.all(timestamps[1:] > timestamps[:-1]))
