"""Graphite's tag queries (seriesByTag, /tags/findSeries) on the store's tag indexes.

Tag expressions are Graphite 1.1's: ``tag=value``, ``tag!=value``, ``tag=~regex``, ``tag!=~regex``.
Regexes (RE2, linear time) are anchored at the start of the value only (Graphite uses ``re.match``); a spec that
matches an empty value also matches series without the tag; at least one spec must require a
non-empty value. The ``name`` tag is the metric name.
"""

import re
from typing import NamedTuple

from gateway.model import NAME_TAG, SeriesKey
from gateway.query import QueryPlanner
from protocols.linear_regex import BadPattern, compile_regex
from protocols.graphite.tags import format_tagged_path

_TAGSPEC_RE = re.compile(r"^([^;!=]+)(!?=~?)([^;]*)$")
_TYPES = {"=": "EQ", "!=": "NEQ", "=~": "RE", "!=~": "NRE"}


class BadTagExpression(ValueError):
    pass


class TagMatcher(NamedTuple):
    name: str
    type: str
    value: str
    regex: object  # a compiled RE2 pattern for =~ and !=~, else None

    def matches(self, value: str) -> bool:
        if self.type == "EQ":
            return value == self.value
        if self.type == "NEQ":
            return value != self.value
        found = self.regex.match(value) is not None
        return found if self.type == "RE" else not found


def parse_expression(expression: str) -> TagMatcher:
    match = _TAGSPEC_RE.match(expression)
    if not match:
        raise BadTagExpression(f"{expression!r} is not a tag expression (tag=value, tag!=value, tag=~regex, tag!=~regex)")
    tag, operator, value = match.groups()
    regex = None
    if operator in ("=~", "!=~"):
        try:
            regex = compile_regex(value)
        except BadPattern as error:
            raise BadTagExpression(f"{expression!r}: bad regex: {error}") from None
    return TagMatcher(NAME_TAG if tag == "name" else tag, _TYPES[operator], value, regex)


def graphite_labels(metric_name: str, tags: dict[str, str]) -> dict[str, str]:
    return {**tags, NAME_TAG: metric_name}


def graphite_path(series: SeriesKey) -> str:
    """How Graphite names a series: the path itself, or the canonical ``name;k=v`` form."""
    return format_tagged_path(series.metric_name, series.tags) if series.tags else series.metric_name


async def find_series(planner: QueryPlanner, tenant: str, expressions: list[str]) -> list[SeriesKey]:
    matchers = [parse_expression(expression) for expression in expressions]
    if not any(not m.matches("") for m in matchers):
        raise BadTagExpression("at least one tag expression must require a non-empty value")
    series = await planner.select_by_matchers(tenant, matchers, graphite_labels)
    return sorted(series, key=graphite_path)
