"""Carbon points decoded in bulk into arrays: a table of distinct paths and, a point each, the
index of its path, its timestamp and value.

A receive buffer or a pickle frame holds thousands of points; as arrays they go through the
ingest pipeline as remote write's do (IngestPipeline.ingest_arrays), with no object and no
Python loop a point. Each distinct path is parsed once per buffer (a buffer of plain paths is
checked at once), values and timestamps go through float() in one C loop each and are checked on
numpy arrays, with carbon's rules exactly (parse_value, parse_timestamp_ms, tags.parse_path).
The decoders name the reject of each bad point with those one-point functions, so details stay
as they were.
"""

from collections.abc import Sequence
from itertools import chain
from typing import Any, NamedTuple

import numpy as np

from protocols.graphite import BAD_PATH, BAD_UTF8, MAX_TIMESTAMP_S, InvalidInput, excerpt
from protocols.graphite.tags import parse_path

# The largest float whose int() is at most MAX_TIMESTAMP_S (floats are 2 apart there, and
# float(MAX_TIMESTAMP_S) rounds up past it).
_LAST_SECOND = float(MAX_TIMESTAMP_S)
if int(_LAST_SECOND) > MAX_TIMESTAMP_S:
    _LAST_SECOND = float(np.nextafter(_LAST_SECOND, 0.0))


# The bytes of plain paths (printable ASCII but space, parse_path refusing it) and newline, which
# joins them in _plain_paths; what a joined run of plain paths never holds.
_PLAIN_PATH_BYTES = bytes(range(0x21, 0x7F)) + b"\n"
_NOT_PLAIN = (b";", b"{", b"..", b"\n\n", b"\n.", b".\n", b"\n~")


Series = str | tuple[str, dict[str, str]]


class Samples(NamedTuple):
    """Decoded points as arrays: ``paths``, the distinct paths as received (text), and
    ``series``, each path's series (name_and_tags gives its metric name and tags); a point each,
    ``path_index`` (its path's position in the table), ``timestamps`` (ms) and ``values``. A path
    may be in the table without points."""

    paths: list[str]
    series: list[Series]
    path_index: np.ndarray  # intp
    timestamps: np.ndarray  # int64
    values: np.ndarray  # float64

    @property
    def size(self) -> int:
        """The number of points."""
        return len(self.values)


def no_samples() -> Samples:
    return Samples([], [], np.empty(0, np.intp), np.empty(0, np.int64), np.empty(0, np.float64))


def concat(parts: Sequence[Samples]) -> Samples:
    """One Samples holding the points of all ``parts`` in order (their tables end to end)."""
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return no_samples()
    offsets = np.cumsum([0] + [len(part.paths) for part in parts[:-1]])
    return Samples(
        list(chain.from_iterable(part.paths for part in parts)),
        list(chain.from_iterable(part.series for part in parts)),
        np.concatenate([part.path_index + offset for part, offset in zip(parts, offsets.tolist())]),
        np.concatenate([part.timestamps for part in parts]),
        np.concatenate([part.values for part in parts]),
    )


def name_and_tags(series: Series) -> tuple[str, dict[str, str]]:
    """The metric name and tags of an entry of Samples.series: a plain path is kept as its text
    alone (no tuple and tags dict each, most paths being plain; ingest needs the tags of a new
    series only), a path with tags or to clean as parse_path's result."""
    return (series, {}) if type(series) is str else series  # type: ignore[return-value]


def path_series(raw: Any) -> tuple[str, tuple[str, dict[str, str]]]:
    """A received path (bytes or text) as its text and (metric name, tags); InvalidInput if bad."""
    if type(raw) is bytes:
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            raise InvalidInput(BAD_UTF8, excerpt(raw)) from None
    elif type(raw) is str:
        text = raw
    else:
        raise InvalidInput(BAD_PATH, "path is not text: " + excerpt(raw))
    return text, parse_path(text)


def decode_points(
    raw_paths: Sequence, raw_timestamps: Sequence, raw_values: Sequence, now_ms: int
) -> tuple[Samples, np.ndarray]:
    """Points given as three columns of raw fields (paths hashable: bytes or str), decoded in
    bulk: the good ones as Samples, and a mask of the bad ones (a bad path, value or timestamp)
    for the caller to name their rejects."""
    values, bad = _floats(raw_values)
    bad |= ~np.isfinite(values)
    stamps, bad_stamps = _floats(raw_timestamps)
    seconds = np.trunc(stamps)  # int(float(ts)), carbon's rule; NaN and inf stay
    bad |= bad_stamps | ~(np.isfinite(seconds) & ((seconds >= 0) | (seconds == -1)) & (seconds <= _LAST_SECOND))
    paths, series, table = _path_table(list(dict.fromkeys(raw_paths)))
    index = np.fromiter(map(table.__getitem__, raw_paths), dtype=np.intp, count=len(raw_paths))
    bad |= index < 0
    kept = ~bad
    kept_seconds = seconds[kept]
    timestamps = kept_seconds.astype(np.int64) * 1000
    timestamps[kept_seconds == -1] = now_ms - now_ms % 1000
    return Samples(paths, series, index[kept], timestamps, values[kept]), bad


def _path_table(distinct: list) -> tuple[list[str], list[Series], dict[Any, int]]:
    """The good paths' texts and (metric name, tags), and each raw path's position among them
    (-1 for a bad one). Plain paths, as most are, are recognized all at once."""
    plain = _plain_paths(distinct)
    if plain is not None:
        return plain, list[Series](plain), dict(zip(distinct, range(len(distinct))))
    paths: list[str] = []
    series: list[Series] = []
    table: dict[Any, int] = {}
    for raw in distinct:
        try:
            text, parsed = path_series(raw)
        except InvalidInput:
            table[raw] = -1
            continue
        table[raw] = len(paths)
        paths.append(text)
        series.append(parsed)
    return paths, series, table


def _plain_paths(raw_paths: list) -> list[str] | None:
    """The texts of the paths when every one is plain: printable ASCII without tags (no ';' or
    '{'), which parse_path takes as is, with nothing for clean_name to drop. Checked on the
    paths joined by newlines (which no good path holds); None when any is not."""
    try:
        joined = b"\n".join(raw_paths)
    except TypeError:
        try:
            joined = "\n".join(raw_paths).encode()
        except (TypeError, UnicodeEncodeError):
            return None
    if (
        not joined
        or joined.translate(None, _PLAIN_PATH_BYTES)
        or any(part in joined for part in _NOT_PLAIN)
        or joined[:1] in b"\n.~"
        or joined[-1:] in b"\n."
    ):
        return None
    texts = joined.decode("ascii").split("\n")
    return texts if len(texts) == len(raw_paths) else None


def _floats(raw: Sequence) -> tuple[np.ndarray, np.ndarray]:
    """float() of each (what carbon takes: text, bytes or a number) and where float() refused
    (NaN there). One C loop unless something is refused."""
    refused = np.zeros(len(raw), dtype=bool)
    try:
        return np.fromiter(map(float, raw), dtype=np.float64, count=len(raw)), refused
    except (ValueError, TypeError, OverflowError):
        pass
    floats = np.full(len(raw), np.nan)
    for position, item in enumerate(raw):
        try:
            floats[position] = float(item)
        except (ValueError, TypeError, OverflowError):
            refused[position] = True
    return floats, refused
