"""The Graphite render series: a list of values (float or None) on a regular step.

It behaves as graphite-web 1.1's ``TimeSeries`` because the render functions depend on its
quirks: ``consolidate(n)`` does not touch the stored values but makes *iteration* yield one
value per ``n`` (so ``for v in series`` and ``list(series)`` see consolidated values while
``series[i]`` and ``len(series)`` see raw ones), and tag values are always strings.
"""

import re
from collections.abc import Iterable
from itertools import islice

CONSOLIDATION_FUNCTIONS = ("sum", "average", "avg", "avg_zero", "max", "min", "first", "last")
_FUNCTION_NAME = re.compile(r"^[a-z]+[(].+[)]$", re.IGNORECASE)


class Tags(dict):
    """A dict whose values are stored as strings, like graphite-web's ``Tags``."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.update(*args, **kwargs)

    def __setitem__(self, key, value):
        super().__setitem__(key, str(value))

    def update(self, *args, **kwargs):
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]


def parse_tags(name: str) -> Tags:
    """Tags graphite-web derives from a series name: ``cpu;host=a`` -> name=cpu, host=a.

    Names produced by functions (``sumSeries(...)``) or that are not valid tagged paths only get
    ``{"name": name}``, as graphite-web does when its tag database cannot parse them.
    """
    if _FUNCTION_NAME.match(name):
        return Tags(name=name)
    segments = name.split(";")
    metric = segments[0].lstrip("~")
    if not segments[0] or not metric:
        return Tags(name=name)
    tags = Tags()
    for segment in segments[1:]:
        key, equals, value = segment.partition("=")
        if not equals or not key or not value or value[0] == "~" or any(c in key for c in ";!^="):
            return Tags(name=name)
        tags[key] = value
    tags["name"] = metric
    return tags


class TimeSeries(list):
    """Values from ``start`` (inclusive) to ``end`` (exclusive) every ``step`` seconds."""

    def __init__(
        self,
        name: str,
        start: int,
        end: int,
        step: int,
        values: Iterable,
        tags: dict[str, str] | None = None,
        path_expression: str | None = None,
        x_files_factor: float = 0.0,
        consolidation_func: str = "average",
    ):
        super().__init__(values)
        self.name = name
        self.start = start
        self.end = end
        self.step = step
        self.tags = Tags(tags) if tags else parse_tags(name)
        self.pathExpression = path_expression or name
        self.xFilesFactor = x_files_factor
        self.consolidationFunc = consolidation_func
        self.valuesPerPoint = 1
        self.options: dict = {}

    def __repr__(self):
        return (
            f"TimeSeries(name={self.name!r}, start={self.start}, end={self.end}, step={self.step}, "
            f"valuesPerPoint={self.valuesPerPoint}, values={list.__repr__(self)})"
        )

    def __iter__(self):
        if self.valuesPerPoint > 1:
            return self._consolidated()
        return list.__iter__(self)

    def consolidate(self, values_per_point: int) -> None:
        """Make iteration yield one value per ``values_per_point`` raw values."""
        self.valuesPerPoint = int(values_per_point)

    def _consolidated(self):
        function = self.consolidationFunc
        if function == "avg":
            function = "average"
        if function not in CONSOLIDATION_FUNCTIONS:
            raise ValueError(f"invalid consolidation function {self.consolidationFunc!r}")
        raw = list.__iter__(self)
        per_point = self.valuesPerPoint
        size = list.__len__(self)
        for offset in range(0, size, per_point):
            bucket = [next(raw) for _ in range(min(per_point, size - offset))]
            usable = [v for v in bucket if v is not None]
            if function == "avg_zero":
                usable = [0 if v is None else v for v in bucket]
            non_null = sum(1 for v in bucket if v is not None)
            if non_null and non_null / per_point >= self.xFilesFactor:
                yield _consolidate_bucket(function, usable)
            else:
                yield None

    def datapoints(self) -> list[tuple[float | None, int]]:
        """Consolidated ``(value, timestamp)`` pairs, timestamps from ``start`` by the effective step."""
        timestamps = range(int(self.start), int(self.end) + 1, int(self.step * self.valuesPerPoint))
        return list(zip(self, timestamps))

    def datapoint_chunks(self, size: int):
        """``datapoints()`` in lists of at most ``size`` pairs, made as they are consumed: a large
        series never holds millions of tuples at once (the garbage collector would scan them all)."""
        timestamps = range(int(self.start), int(self.end) + 1, int(self.step * self.valuesPerPoint))
        values = iter(self)
        for first in range(0, len(timestamps), size):
            chunk = list(zip(islice(values, size), timestamps[first : first + size]))
            if not chunk:
                return
            yield chunk

    def copy(
        self,
        name: str | None = None,
        start: int | None = None,
        end: int | None = None,
        step: int | None = None,
        values: list | None = None,
        tags: dict | None = None,
    ) -> "TimeSeries":
        """A new series sharing this one's metadata, as graphite-web's ``TimeSeries.copy``.

        Like graphite-web, the copy's pathExpression is its name and options are not carried.
        """
        return TimeSeries(
            self.name if name is None else name,
            self.start if start is None else start,
            self.end if end is None else end,
            self.step if step is None else step,
            list.__iter__(self) if values is None else values,
            tags=self.tags if tags is None else tags,
            x_files_factor=self.xFilesFactor,
            consolidation_func=self.consolidationFunc,
        )


def _consolidate_bucket(function: str, usable: list):
    if function == "sum":
        return sum(usable)
    if function in ("average", "avg_zero"):
        return sum(usable) / len(usable)
    if function == "max":
        return max(usable)
    if function == "min":
        return min(usable)
    if function == "first":
        return usable[0]
    return usable[-1]
