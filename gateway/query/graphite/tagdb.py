"""Graphite's tag queries (seriesByTag, /tags/findSeries) on the store's tag indexes.

TagDB answers the /tags API; the series of a tag's values are counted all at once,
within the store's bound on calls in flight. Tag expressions are Graphite 1.1's: ``tag=value``, ``tag!=value``, ``tag=~regex``, ``tag!=~regex``.
Regexes (RE2, linear time) are anchored at the start of the value only (Graphite uses ``re.match``); a spec that
matches an empty value also matches series without the tag; at least one spec must require a
non-empty value. The ``name`` tag is the metric name.
"""

import re
from typing import Any, NamedTuple

from twisted.internet.defer import ensureDeferred, gatherResults

from gateway.core.errors import ClientError
from gateway.core.model import NAME_TAG, SeriesKey
from gateway.query.planner import QueryPlanner, QueryTooLarge
from gateway.store import Store
from protocols.graphite.tags import format_tagged_path
from protocols.linear_regex import BadPattern, compile_regex

_TAGSPEC_RE = re.compile(r"^([^;!=]+)(!?=~?)([^;]*)$")
_TYPES = {"=": "EQ", "!=": "NEQ", "=~": "RE", "!=~": "NRE"}


class BadTagExpression(ClientError):
    pass


class TagMatcher(NamedTuple):
    name: str
    type: str
    value: str
    regex: Any  # a compiled RE2 pattern for =~ and !=~, else None

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
        raise BadTagExpression(
            f"{expression!r} is not a tag expression (tag=value, tag!=value, tag=~regex, tag!=~regex)"
        )
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


async def find_series(
    planner: QueryPlanner, tenant: str, expressions: list[str], start_ms: int | None = None, end_ms: int | None = None
) -> list[SeriesKey]:
    """The series the expressions select, of those with samples in [start_ms, end_ms] where given
    (a render's range), else of all the tenant has (/tags/findSeries)."""
    matchers = [parse_expression(expression) for expression in expressions]
    if not any(not m.matches("") for m in matchers):
        raise BadTagExpression("at least one tag expression must require a non-empty value")
    series = await planner.select_by_matchers(tenant, matchers, graphite_labels, start_ms, end_ms)
    return sorted(series, key=graphite_path)


class TagDB:
    """Graphite's tag database over the store's tag indexes and the planner (/tags, /tags/<tag>,
    autocompletion). A tag's values are counted at once, their store calls within the
    store's bound (gateway/store/calls.py): not one count after another (slow for a tag with many
    values), nor a burst on the store."""

    def __init__(self, store: Store, planner: QueryPlanner):
        self.store = store
        self.planner = planner

    async def find_series(self, tenant: str, expressions: list[str]) -> list[SeriesKey]:
        return await find_series(self.planner, tenant, expressions)

    async def tag_keys(self, tenant: str, pattern: TagMatcher | None = None) -> list[str]:
        """Every tag key of the tenant with ``name``, sorted, those ``pattern`` matches."""
        keys = sorted({"name", *await self.store.list_tenant_tag_keys(tenant)})
        return [key for key in keys if pattern is None or pattern.matches(key)]

    async def tag_values(self, tenant: str, tag: str, pattern: TagMatcher | None = None) -> list[str]:
        """Every value of a tag (the metric names for ``name``), sorted, those ``pattern`` matches."""
        if tag == "name":
            values = await self.store.list_metric_names(tenant)
        else:
            values = await self.store.list_tenant_tag_values(tenant, tag)
        return [value for value in values if pattern is None or pattern.matches(value)]

    async def value_counts(
        self, tenant: str, tag: str, pattern: TagMatcher | None = None, limit: int | None = None
    ) -> list[tuple[str, int]]:
        """Each value of a tag (the first ``limit``) with the number of series carrying it. A
        count is a few lookups, and each value at least one series: more values than
        --max-series-per-query are refused before any is counted (``/tags/i`` over 100k
        values took 60 s)."""
        values = (await self.tag_values(tenant, tag, pattern))[:limit]
        max_series = self.planner.max_series
        if len(values) > max_series(tenant):
            raise QueryTooLarge(
                f"tag {tag!r} has {len(values)} values, over {max_series.setting(tenant)} ({max_series(tenant)});"
                " narrow it with filter= or limit="
            )
        counts = await gatherResults(
            [ensureDeferred(self._count(tenant, tag, value)) for value in values], consumeErrors=True
        )
        return list(zip(values, counts))

    async def _count(self, tenant: str, tag: str, value: str) -> int:
        if tag == "name":
            return len(await self.store.find_series(tenant, value, NAME_TAG, value))
        return len(await self.planner.select_by_matchers(tenant, [TagMatcher(tag, "EQ", value, None)], graphite_labels))

    async def autocomplete_tags(self, tenant: str, expressions: list[str], prefix: str, limit: int) -> list[str]:
        """Tag keys starting with ``prefix``; with expressions, the other keys of the series they select."""
        if not expressions:
            keys = await self.tag_keys(tenant)
        else:
            searched = {parse_expression(expression).name for expression in expressions}
            found: set[str] = set()
            for series in await self.find_series(tenant, expressions):
                found.update(graphite_labels(series.metric_name, series.tags))
            keys = sorted("name" if key == NAME_TAG else key for key in found if key not in searched)
        return [key for key in keys if key.startswith(prefix)][:limit]

    async def autocomplete_values(
        self, tenant: str, tag: str, expressions: list[str], prefix: str, limit: int
    ) -> list[str]:
        """Values of ``tag`` starting with ``prefix``; with expressions, those of the series they select."""
        if not expressions:
            values = await self.tag_values(tenant, tag)
        else:
            key = NAME_TAG if tag == "name" else tag
            series = await self.find_series(tenant, [*expressions, f"{tag}!="])
            values = sorted({graphite_labels(s.metric_name, s.tags)[key] for s in series})
        return [value for value in values if value.startswith(prefix)][:limit]
