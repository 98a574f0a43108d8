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
