"""What a delete selects (docs/operations.rst): the series of Prometheus selectors or of Graphite
paths and globs. The deleting itself is gateway/ingest/deletes.py; the gateway runs the selection
in a query executor, ``tsgate delete`` in place."""

from collections.abc import Sequence

from gateway.core import blocking
from gateway.core.model import SeriesKey, series_set_hash, series_set_text
from gateway.query.graphite.finder import Finder
from gateway.query.planner import QueryPlanner
from gateway.query.promql.engine import parse, selector_matchers
from gateway.query.promql.values import PromQLError
from gateway.store import Store
from protocols.prometheus import utf8_labels


def parse_selector(text: str):
    """The parsed series selector; PromQLError bad_data for a text that is not one."""
    expr = parse(text)
    if type(expr).__name__ != "VectorSelector":
        raise PromQLError(f'invalid parameter "match[]": {text!r} is not a series selector', "bad_data")
    return expr


class SeriesSelection:
    """What a delete selects. The gateway runs it in a query executor (its CPU work on a
    tenant's selectors stays off the serving process); ``tsgate delete`` runs it in place."""

    def __init__(self, store: Store, planner: QueryPlanner):
        self.store = store
        self.planner = planner
        self.finder = Finder(store)

    async def select(self, kind: str, tenant: str, patterns: Sequence[str]) -> list[SeriesKey]:
        """``select_prometheus`` ("prometheus") or ``select_graphite`` ("graphite")."""
        if kind == "prometheus":
            return await self.select_prometheus(tenant, patterns)
        return await self.select_graphite(tenant, patterns)

    async def select_prometheus(self, tenant: str, selectors: Sequence[str]) -> list[SeriesKey]:
        """The series any of the selectors selects (PromQLError bad_data for one that is not a selector)."""
        found: dict[str, SeriesKey] = {}
        for text in selectors:
            expr = await blocking.in_thread(parse_selector, text)
            matchers = selector_matchers(expr)
            for key in await self.planner.select_by_matchers(tenant, matchers, utf8_labels):
                found[key.series_set_hash] = key
        return sorted(found.values(), key=_order)

    async def select_graphite(self, tenant: str, patterns: Sequence[str]) -> list[SeriesKey]:
        """The Graphite series (paths without tags) whose path a pattern (a path or a glob) names."""
        hashes: set[str] = set()
        for pattern in patterns:
            for path in await self.finder.leaves(tenant, pattern):
                hashes.add(series_set_hash(series_set_text(path, {})))
        found = await self.store.get_series(tenant, sorted(hashes))
        return sorted(found.values(), key=_order)


def _order(key: SeriesKey):
    return key.tenant, key.metric_name, sorted(key.tags.items())
