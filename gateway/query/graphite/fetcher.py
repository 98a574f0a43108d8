"""Series for the render engine: glob paths through the path tree, seriesByTag through the tag
index, raw samples bucketed to each series' step as whisper would store them.

Buckets follow whisper: a sample at ``t`` lands in the bucket starting at ``t - t % step`` and the
last sample of a bucket wins; a request for ``[from, until]`` returns buckets from
``from - from % step + step`` up to ``until - until % step + step`` (exclusive), as graphite-web's
whisper reader does. NaN (a Prometheus stale marker, say) reads as null. A range that starts
before raw retention reads, up to the raw retention, the roll-up that covers its start
(docs/downsampling.rst) at its width: the aggregate matching the target's consolidateBy (average
by default; the last value for counters, which have no other), and the raw samples after it are
consolidated into buckets of that width the same way, as whisper's coarser archive would hold them.
"""

import numpy as np
from twisted.internet.defer import ensureDeferred, gatherResults

from gateway.core import blocking
from gateway.core.model import SeriesKey, series_set_hash, series_set_text
from gateway.core.samples import Samples
from gateway.query.graphite import tagdb
from gateway.query.graphite.errors import MAX_POINTS_PER_SERIES, RenderError
from gateway.query.graphite.finder import Finder
from gateway.query.graphite.series import TimeSeries
from gateway.query.graphite.storage_schemas import StorageSchemas
from gateway.query.planner import PointsBudget, QueryPlanner, QueryTooLarge
from protocols.graphite.target import Call, Literal, PathExpression, TargetSyntaxError, parse_target

# consolidateBy's functions -> the roll-up aggregate that answers for them past raw retention.
ROLLUP_FOR_CONSOLIDATION = {"average": "avg", "avg": "avg", "sum": "sum", "min": "min", "max": "max", "last": "last"}


def consolidations(target: str, max_depth: int, max_terms: int) -> dict[str, str]:
    """Path expressions of a target that sit inside ``consolidateBy(..., 'func')``, with func."""
    found: dict[str, str] = {}

    def walk(node, func):
        if isinstance(node, PathExpression) and func:
            found[node.path] = func
        elif isinstance(node, Call):
            if node.name == "consolidateBy" and len(node.args) > 1 and isinstance(node.args[1], Literal):
                func = str(node.args[1].value)
            for argument in [*node.args, *node.kwargs.values()]:
                walk(argument, func)

    try:
        walk(parse_target(target, max_depth, max_terms), None)
    except TargetSyntaxError:
        pass
    return found


class StoreFetcher:
    """One per render request: knows the tenant, reads through the planner's one batched read
    (the points are spent from the request's budget before, window by window)."""

    def __init__(
        self,
        tenant: str,
        finder: Finder,
        planner: QueryPlanner,
        schemas: StorageSchemas,
        max_series: int,
        consolidation: dict[str, str] | None = None,
        budget: PointsBudget | None = None,
    ):
        self.tenant = tenant
        self.budget = budget
        self.consolidation = consolidation or {}
        self.finder = finder
        self.planner = planner
        self.schemas = schemas
        self.max_series = max_series

    async def fetch(self, path_expression: str, start: int, end: int) -> list[TimeSeries]:
        paths = await self.finder.leaves(self.tenant, path_expression)
        keys = [SeriesKey(self.tenant, series_set_hash(series_set_text(p, {})), p, {}) for p in paths]
        return await self._read(keys, start, end, path_expression)

    async def fetch_tagged(self, expressions: list[str], start: int, end: int) -> list[TimeSeries]:
        try:
            keys = await tagdb.find_series(self.planner, self.tenant, expressions, start * 1000, end * 1000)
        except tagdb.BadTagExpression as error:
            raise RenderError(str(error)) from None
        expression = "seriesByTag(" + ",".join(repr(e) for e in expressions) + ")"
        return await self._read(keys, start, end, expression)

    async def _read(self, keys: list[SeriesKey], start: int, end: int, path_expression: str) -> list[TimeSeries]:
        if len(keys) > self.max_series:
            raise QueryTooLarge(f"{path_expression} matches {len(keys)} series, over the limit of {self.max_series}")
        rollup = self.planner.rollup_for(start * 1000, self.tenant)
        wanted = ROLLUP_FOR_CONSOLIDATION.get(self.consolidation.get(path_expression, "average"), "avg")
        windows = []
        for key in keys:
            step = self.schemas.step_for(tagdb.graphite_path(key))
            if rollup is not None:
                step = max(step, rollup.width_ms // 1000)
            first = start - start % step + step
            stop = max(end - end % step + step, first)  # an empty window when end < start
            if (stop - first) // step > MAX_POINTS_PER_SERIES:
                raise QueryTooLarge(
                    f"{path_expression} over {end - start} s at a {step} s step is more than {MAX_POINTS_PER_SERIES} points a series"
                )
            windows.append((step, first, stop))
        if self.budget is not None:
            self.budget.spend(
                sum((stop - first) // step for step, first, stop in windows), f"reading {path_expression}"
            )
        by_window: dict[tuple[int, int, int], list[int]] = {}
        for index, window in enumerate(windows):
            by_window.setdefault(window, []).append(index)
        reads = [
            ensureDeferred(
                self.planner.samples(
                    [keys[i] for i in indexes], first * 1000, stop * 1000 - 1, aggregate=wanted, before_raw=rollup
                )
            )
            for (_, first, stop), indexes in by_window.items()
        ]
        data: list = [None] * len(keys)
        for indexes, found in zip(by_window.values(), await gatherResults(reads, consumeErrors=True)):
            for index, read in zip(indexes, found):
                data[index] = read
        # Millions of points become Python lists here: in a thread, off the reactor.
        return await blocking.in_thread(_bucketed, keys, windows, data, rollup is not None, wanted, path_expression)


def _bucketed(keys, windows, data, from_rollup: bool, wanted: str, path_expression: str) -> list[TimeSeries]:
    series = []
    for key, (step, first, stop), read in zip(keys, windows, data):
        how = "last" if not from_rollup or read.aggregate == "last" else wanted
        values = bucket(read.samples, first, step, (stop - first) // step, how)
        series.append(TimeSeries(tagdb.graphite_path(key), first, stop, step, values, path_expression=path_expression))
    return series


def bucket(found: Samples, first: int, step: int, count: int, how: str) -> list[float | None]:
    """Samples into ``count`` buckets of ``step`` seconds from ``first`` (aligned to the step), as
    whisper stores them: ``how`` is "last" (the last sample of a bucket wins, NaN included, and
    reads as None) or the roll-up consolidation "avg", "sum", "min", "max" (NaNs left out)."""
    seconds = found.timestamps // 1000
    index = (seconds - seconds % step - first) // step
    inside = (index >= 0) & (index < count)
    index, values = index[inside], found.values[inside]
    out = np.full(count, np.nan)
    if how != "last":
        numbers = ~np.isnan(values)
        index, values = index[numbers], values[numbers]
    if len(index):
        runs = np.flatnonzero(np.diff(index)) + 1
        starts = np.concatenate(([0], runs))
        if how == "last":
            out[index[np.concatenate((runs - 1, [len(index) - 1]))]] = values[
                np.concatenate((runs - 1, [len(index) - 1]))
            ]
        elif how == "avg":
            out[index[starts]] = np.add.reduceat(values, starts) / np.diff(np.concatenate((starts, [len(index)])))
        else:
            reduce = {"sum": np.add, "min": np.minimum, "max": np.maximum}[how]
            out[index[starts]] = reduce.reduceat(values, starts)
    listed = out.tolist()
    if np.isnan(out).any():
        for position in np.flatnonzero(np.isnan(out)).tolist():
            listed[position] = None
    return listed
