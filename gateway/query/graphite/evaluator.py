"""Evaluate a Graphite render target against a fetcher, as graphite-web 1.1's evaluator does.

Plain ``async def`` with no event-loop imports, so it runs under Twisted or asyncio alike.
Path expressions and ``seriesByTag`` calls go to the fetcher; other calls go to the function
library after their arguments are evaluated and validated. Functions that need data from another
time range (timeShift, moving windows, ...) evaluate their first argument again under a changed
``RenderContext``.
"""

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, tzinfo
from typing import Protocol

from gateway.query.graphite.errors import EmptyResult, RenderError
from gateway.query.graphite.functions import REGISTRY
from gateway.query.graphite.functions.registry import Request
from gateway.query.graphite.series import TimeSeries
from protocols.graphite import attime
from protocols.graphite.target import (
    MAX_NESTING,
    MAX_TERMS,
    Call,
    Literal,
    PathExpression,
    TargetSyntaxError,
    TargetTooDeep,
    TargetTooLong,
    parse_target,
)

__all__ = ["Fetcher", "RenderContext", "RenderError", "evaluate_target"]


# A target's calls and paths are evaluated at most this many times its --query-max-terms:
# timeShift, timeStack, hitcount, smartSummarize, the moving windows and applyByNode evaluate an
# argument again, so nested they multiply (timeShift nested 20 deep: 2^20 fetches, past any deadline).
EVALUATIONS_PER_TERM = 2


class Evaluations:
    """The calls and paths one target has evaluated so far, re-evaluations included; shared by
    the copies of its RenderContext."""

    def __init__(self, limit: int = EVALUATIONS_PER_TERM * MAX_TERMS):
        self.count = 0
        self.limit = limit

    def add(self) -> None:
        self.count += 1
        if self.count > self.limit:
            raise RenderError(
                f"the target evaluates more than {self.limit} calls and paths (functions such as timeShift"
                f" and movingAverage evaluate theirs again): {EVALUATIONS_PER_TERM} x --query-max-terms"
            )


@dataclass
class RenderContext:
    start: int  # epoch seconds, inclusive
    end: int  # epoch seconds
    now: int
    tz: tzinfo = UTC  # for day references (timeSlice, hitcount alignment, ...)
    x_files_factor: float = 0.0  # the request's xFilesFactor; setXFilesFactor changes it
    max_data_points: int | None = None
    stacks: dict = field(default_factory=dict)  # stacked() running totals, shared by copies
    budget: object = None  # the request's query.PointsBudget, shared by copies; None: unbounded
    offload: Callable | None = None  # runs a function's CPU-bound work elsewhere (deferToThread); None: inline
    max_depth: int = MAX_NESTING  # --query-max-depth: calls nested in a target
    max_terms: int = MAX_TERMS  # --query-max-terms: calls and arguments of a target
    evaluations: Evaluations = field(default_factory=Evaluations)  # of the target being evaluated


class Fetcher(Protocol):
    async def fetch(self, path_expression: str, start: int, end: int) -> list[TimeSeries]:
        """Series whose names match a glob path expression, bucketed to their step."""

    async def fetch_tagged(self, expressions: list[str], start: int, end: int) -> list[TimeSeries]:
        """Series matching all seriesByTag expressions ('name=cpu', 'host=~web.*')."""


async def evaluate_target(target: str, context: RenderContext, fetcher: Fetcher) -> list[TimeSeries]:
    """The series a target produces; RenderError for anything the user got wrong."""
    if not target or not target.strip():
        return []
    node = parse(target, context)
    context = replace(context, evaluations=Evaluations(EVALUATIONS_PER_TERM * context.max_terms))
    result = await _evaluate(node, context, fetcher)
    if isinstance(result, TimeSeries):
        return [result]
    if not isinstance(result, list):
        raise RenderError(f"target {target!r} does not produce series")
    if not all(isinstance(series, TimeSeries) for series in result):
        # mapSeries() alone: lists of series, which only reduceSeries() takes
        raise RenderError(f"target {target!r} produces lists of series, not series: use it inside reduceSeries()")
    for series in result:
        if not attime.EARLIEST <= series.start <= series.end <= attime.LATEST:  # hitcount(x, '99999999y')
            raise RenderError(f"series {series.name!r} reaches out of the years 1 to 9999 (an interval too long?)")
    return result


def parse(target: str, context: RenderContext):
    """The target's tree, within the context's bounds (a RenderError naming the setting past them)."""
    try:
        return parse_target(target, context.max_depth, context.max_terms)
    except TargetTooDeep as error:
        raise RenderError(f"{error} (--query-max-depth)") from None
    except TargetTooLong as error:
        raise RenderError(f"{error} (--query-max-terms)") from None
    except TargetSyntaxError as error:
        raise RenderError(str(error)) from None


async def _evaluate(node, context: RenderContext, fetcher: Fetcher):
    if isinstance(node, Literal):
        return node.value
    context.evaluations.add()
    if isinstance(node, PathExpression):
        found = await fetcher.fetch(node.path, context.start, context.end)
        return _prepare_fetched(found, node.path, context)
    if node.name == "seriesByTag":
        return await _series_by_tag(node, context, fetcher)
    return await _call(node, context, fetcher)


def _prepare_fetched(found: list[TimeSeries], path_expression: str, context: RenderContext) -> list[TimeSeries]:
    """Fetched series as graphite-web hands them to functions: sorted by name, tagged with the query."""
    for series in found:
        series.pathExpression = path_expression
        series.xFilesFactor = context.x_files_factor
    return sorted(found, key=lambda series: series.name)


async def _series_by_tag(node: Call, context: RenderContext, fetcher: Fetcher) -> list[TimeSeries]:
    if node.kwargs or not node.args:
        raise RenderError("seriesByTag takes one or more tag expressions as strings")
    expressions = []
    for argument in node.args:
        if not isinstance(argument, Literal) or not isinstance(argument.value, str):
            raise RenderError("seriesByTag arguments must be quoted tag expressions like 'name=cpu'")
        expressions.append(argument.value)
    found = await fetcher.fetch_tagged(expressions, context.start, context.end)
    return _prepare_fetched(found, node.raw, context)


async def _call(node: Call, context: RenderContext, fetcher: Fetcher):
    function = REGISTRY.get(node.name)
    if function is None:
        raise RenderError(f"Received request for unknown function: {node.name}")
    args = [await _evaluate(argument, context, fetcher) for argument in node.args]
    kwargs = {name: await _evaluate(argument, context, fetcher) for name, argument in node.kwargs.items()}
    args, kwargs = function.validate(args, kwargs)

    async def evaluate(node_or_target, new_context):
        if not attime.EARLIEST <= new_context.start <= new_context.end <= attime.LATEST:
            raise RenderError(f"{node.name}() moves the time range out of the years 1 to 9999")
        if isinstance(node_or_target, str):
            node_or_target = parse(node_or_target, new_context)
        return await _evaluate(node_or_target, new_context, fetcher)

    raw_args = list(node.args)
    if not raw_args and function.params and function.params[0].name in node.kwargs:
        # the first argument given by keyword (movingAverage(seriesList=a.b, windowSize=5)):
        # functions that evaluate it again over another time range find it first all the same
        raw_args = [node.kwargs[function.params[0].name]]
    request = Request(context=context, raw_args=raw_args, evaluate=evaluate)
    try:
        if function.is_async:
            return await function.function(request, *args, **kwargs)
        return await request.compute(function.function, request, *args, **kwargs)
    except EmptyResult:
        return []
