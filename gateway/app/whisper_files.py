"""Whisper files as tsgate data: archives read with numpy, then cut into sealed blocks and roll-up
rows (``tsgate import whisper``, docs/operations.rst).

The header is read by the ``whisper`` package (``whisper.info``, which checks it); the archives,
``points`` big-endian ``(uint32 interval, float64 value)`` pairs each, are read CHUNK_POINTS at a
time, and only the points that count are kept: memory follows the points a file holds, not the
size its header claims (a sparse 1.2 GB file of a few points once took 5.2 GB). The holes of a
sparse file (never written, so no point there) are skipped without reading them.
A stored point counts when whisper's own ``fetch`` would return it: its interval is a multiple of
the archive's step inside the archive's window (the last ``points x step`` seconds before
``now``); older intervals are leftovers of an earlier lap of the ring.

Where each archive goes:

- **raw blocks**: the finest archive within ``--raw-retention``; where it does not reach back that
  far, the next coarser archive fills the time before it (and so on), so raw data holds every
  point the files keep for that time, at the best resolution kept.
- **roll-ups**: each granularity takes the archives whose step divides its width, coarsest first
  (an archive whose step equals the width is copied point for point: one row per point, count 1,
  each aggregate the point's value); finer archives fill only the time before a coarser one's
  window. The rows come from the downsampler's own roll-up arithmetic
  (gateway/downsample/aggregate.py), so a bucket of several finer points gets the min, max, sum and
  count (or the counter's last and increase) of those points. Nothing older than the
  granularity's retention is written.
- An archive no granularity can be built from (its step divides none of their widths) and that raw
  does not need is left out, and counted.
"""

import errno
import os
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import whisper

from gateway.core import samples
from gateway.core.layout import INDEX_BUCKET_MS, Layout
from gateway.core.samples import Samples
from gateway.downsample.aggregate import roll_up
from gateway.store.contract import Rollup
from gateway.store.read_path import LATEST_MS

POINT = np.dtype([("interval", ">u4"), ("value", ">f8")])
CHUNK_POINTS = 1 << 20  # points read at a time: 12 MiB, and about 40 MiB of numpy temporaries


class CorruptFile(ValueError):
    """A file that is not a whisper file this reader can trust (the message says why)."""


class Archive(NamedTuple):
    step_s: int
    retention_s: int
    samples: Samples  # the valid points, in time order (milliseconds)

    def window_start_ms(self, now_s: int) -> int:
        """The first interval whisper's fetch returns from this archive (in ms)."""
        first = now_s - self.retention_s
        return (first - first % self.step_s + self.step_s) * 1000


def read_archives(path: str | os.PathLike, now_s: int) -> list[Archive]:
    """Every archive of a whisper file, finest first, with the points whisper would return at ``now_s``."""
    try:
        info = whisper.info(str(path))
    except (whisper.WhisperException, OSError) as error:
        raise CorruptFile(f"{type(error).__name__}: {error}") from None
    if info is None:
        raise CorruptFile("cannot be opened")
    if not info["archives"]:
        raise CorruptFile("no archives in the header")
    archives = []
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        for number, header in enumerate(info["archives"]):
            step, count, offset = header["secondsPerPoint"], header["points"], header["offset"]
            if step <= 0 or count <= 0 or offset + count * POINT.itemsize > size:
                raise CorruptFile(
                    f"archive {number} ({count} points of {step} s at byte {offset}) does not fit in {size} bytes"
                )
            archives.append(_read_archive(file.fileno(), offset, count, step, now_s))
    steps = [archive.step_s for archive in archives]
    if steps != sorted(set(steps)):
        raise CorruptFile(f"archive steps {steps} are not ascending")
    return archives


def _read_archive(fd: int, offset: int, count: int, step: int, now_s: int) -> Archive:
    """The points of an archive whisper's fetch would return, read a chunk at a time."""
    retention = count * step
    first = now_s - retention
    low, high = first - first % step + step, now_s - now_s % step + step
    end = offset + count * POINT.itemsize
    kept_intervals, kept_values = [], []
    position = _next_data(fd, offset, end)
    while position < end:
        position -= (position - offset) % POINT.itemsize  # back to the start of the point it is in
        data = os.pread(fd, min(CHUNK_POINTS * POINT.itemsize, end - position), position)
        if len(data) < POINT.itemsize:
            raise CorruptFile(f"the file ends at byte {position + len(data)}, inside an archive")
        points = np.frombuffer(data, dtype=POINT, count=len(data) // POINT.itemsize)
        intervals = points["interval"].astype(np.int64)
        keep = (intervals >= low) & (intervals < high) & (intervals % step == 0)
        kept_intervals.append(intervals[keep])
        kept_values.append(points["value"][keep].astype(np.float64))
        position = _next_data(fd, position + len(points) * POINT.itemsize, end)
    intervals = np.concatenate(kept_intervals) if kept_intervals else np.empty(0, np.int64)
    values = np.concatenate(kept_values) if kept_values else np.empty(0, np.float64)
    order = np.argsort(intervals, kind="stable")
    return Archive(step, retention, Samples(intervals[order] * 1000, values[order]))


def _next_data(fd: int, position: int, end: int) -> int:
    """The first byte from ``position`` on that the file holds: past the holes of a sparse file
    (``end`` when only a hole is left), ``position`` where the system cannot tell."""
    if position >= end:
        return end
    try:
        return min(os.lseek(fd, position, os.SEEK_DATA), end)
    except OSError as error:
        return end if error.errno == errno.ENXIO else position


def compose(archives: Sequence[Archive], since_ms: int, now_s: int) -> tuple[Samples, set[int]]:
    """The points of ``archives`` (the preferred first) from ``since_ms`` on: each archive gives
    the time from the start of its window (or ``since_ms``) up to the window of the archives
    before it. Also returns the steps of the archives that gave any point."""
    parts, used, until_ms = [], set(), LATEST_MS
    for archive in archives:
        start = max(since_ms, archive.window_start_ms(now_s))
        found = archive.samples.between(start, until_ms - 1)
        if len(found):
            parts.append(found)
            used.add(archive.step_s)
        until_ms = min(until_ms, start)
    return samples.merge(parts[::-1]), used


class FileData(NamedTuple):
    """What one whisper file becomes: raw samples by slot, roll-up rows by granularity name."""

    raw_slots: dict[int, Samples]
    rollups: dict[str, list[Rollup]]
    points: int  # stored points read from the file (what the progress counts)
    unused_archives: int  # archives neither raw nor any granularity takes

    @property
    def raw_buckets(self) -> list[int]:
        """The time-index buckets (gateway/store/index.py) the raw samples fall in."""
        stamps = [slot.timestamps for slot in self.raw_slots.values()]
        if not stamps:
            return []
        timestamps = np.concatenate(stamps)
        return np.unique(timestamps - timestamps % INDEX_BUCKET_MS).tolist()


def file_data(
    tenant: str, series_set_hash: str, kind: str, archives: Sequence[Archive], layout: Layout, now_s: int
) -> FileData:
    """The module's rules applied to one file's archives (finest first)."""
    now_ms = now_s * 1000
    raw, used = compose(archives, now_ms - layout.raw_retention_ms, now_s)
    used.add(archives[0].step_s)
    rollups = {}
    for granularity in layout.granularities:
        width = granularity.width_ms
        sources = sorted((a for a in archives if width % (a.step_s * 1000) == 0), key=lambda a: -a.step_s)
        used.update(a.step_s for a in sources)
        since = now_ms - granularity.retention_ms
        points, _ = compose(sources, since - since % width + width, now_s)
        rollups[granularity.name] = roll_up(tenant, series_set_hash, kind, points, None, [granularity])[
            granularity.name
        ]
    return FileData(
        by_slot(raw, layout.slot_width_ms),
        rollups,
        sum(len(a.samples) for a in archives),
        sum(a.step_s not in used for a in archives),
    )


def by_slot(found: Samples, width_ms: int) -> dict[int, Samples]:
    """Samples cut at slot boundaries, by slot start."""
    slots, firsts = np.unique(found.timestamps - found.timestamps % width_ms, return_index=True)
    ends = np.append(firsts[1:], len(found))
    return {
        slot: Samples(found.timestamps[first:end], found.values[first:end])
        for slot, first, end in zip(slots.tolist(), firsts.tolist(), ends.tolist())
    }
