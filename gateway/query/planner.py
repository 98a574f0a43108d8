"""The query planner: tag filters -> intersection of series_sets lookups -> series to read.

The plan (docs/storage.rst): each ``tag=value`` filter is one series_sets lookup, the matching series are the
intersection of the lookups (a metric with no filter is looked up under ``__name__``), their
names and tags come from series_set_hashes. A range the time index does not cover keeps, of what
the all-time index gives, the series indexed in a bucket since its start (last_bucket). Lookups run concurrently, within the store's bound on
calls in flight (gateway/store/calls.py). The planner is the query APIs' read service too
(gateway/query/read_service.py): what it selects is read through the one batched, budgeted read.
"""

from typing import NamedTuple

from twisted.internet.defer import ensureDeferred, gatherResults

from gateway.core.caches import LRUMap, WeightedLRUMap
from gateway.core.errors import LimitExceeded
from gateway.core.layout import INDEX_BUCKET_MS
from gateway.core.model import NAME_TAG, Limits, SeriesKey, now_ms
from gateway.core.overrides import PerTenant, per_tenant
from gateway.core.samples import Samples
from gateway.query.read_service import ReadBudget, ReadService, Selected, Selection
from gateway.store import Store
from gateway.store.contract import Buckets

SERIES_REMEMBERED = 100_000
# Series of the selections remembered (select): a dashboard's panels select the same series at
# every refresh, and a selection's labels, checks and order are built again only when the index
# gives another set of series. About 0.4 KB a series.
SELECTED_SERIES_REMEMBERED = 50_000
# The longest range selected in the time index: a week and a day of hour buckets (169 lookups a
# filter at most, one SQLite query, or as many concurrent Cassandra partition reads); a longer range
# reads the all-time index, whose series then mostly have data in it (docs/storage.rst).
MAX_INDEX_BUCKETS = 8 * 24


class SeriesResult(NamedTuple):
    tenant: str
    metric_name: str
    tags: dict[str, str]
    samples: Samples
    created_ms: int | None = None  # the series' created timestamp (remote write 2.0), when known


class QueryTooLarge(LimitExceeded, ValueError):
    """The query would touch more series than allowed; refuse instead of exhausting memory."""


class PointsBudget(ReadBudget):
    """The points one request may read, generate or bucket (--max-points-per-query). Each step
    spends its points before it builds them, so an oversized request costs nothing but a 422."""

    def __init__(self, limit: int, setting: str = "--max-points-per-query"):
        super().__init__(limit, self._refusal)
        self.setting = setting  # what to name in the refusal: the flag, or the tenant's override

    def _refusal(self, points: int, what: str) -> QueryTooLarge:
        return QueryTooLarge(
            f"{what} needs {points} points, which brings the request over its budget of {self.limit} points"
            f" ({self.setting}); shorten the range or use a coarser step"
        )


class QueryPlanner(ReadService):
    def __init__(
        self,
        store: Store,
        max_series: int | PerTenant,
        max_future_ms: int = Limits.max_future_ms,
        clock=now_ms,
    ):
        super().__init__(store, clock, max_future_ms)
        self.max_series = per_tenant("max-series-per-query", max_series)
        self._series = LRUMap(SERIES_REMEMBERED)
        self._selections = WeightedLRUMap(SELECTED_SERIES_REMEMBERED)

    def index_buckets(self, tenant: str, start_ms: int | None, end_ms: int | None) -> Buckets | None:
        """The time-index buckets a selection over [start_ms, end_ms] (widened by the caller for
        what it looks back) reads; None, the all-time index: a range open at its start, longer than
        MAX_INDEX_BUCKETS, reaching before the tenant's raw retention (the time index keeps no
        more) or before the store's time index existed."""
        if start_ms is None:
            return None
        start_ms, end_ms = self.readable(start_ms, self.now() + self.path.max_future_ms if end_ms is None else end_ms)
        raw_start = self.now() - self.store.retentions.for_tenant(tenant).raw_retention_ms
        if start_ms < max(self.store.bucket_index_since, raw_start):
            return None
        buckets = Buckets.of(start_ms, max(start_ms, end_ms))
        if (buckets.last - buckets.first) // INDEX_BUCKET_MS >= MAX_INDEX_BUCKETS:
            return None
        return buckets

    def tenants(self):
        """The tenants that have written series."""
        return self.store.list_tenants()

    def metric_names(self, tenant: str):
        return self.store.list_metric_names(tenant)

    def tag_keys(self, tenant: str, metric_name: str):
        return self.store.list_tag_keys(tenant, metric_name)

    def tag_values(self, tenant: str, metric_name: str, tag_key: str):
        return self.store.list_tag_values(tenant, metric_name, tag_key)

    async def select_series(
        self,
        tenant: str,
        metric_name: str,
        tag_filters: dict[str, str],
        start_ms: int | None = None,
        end_ms: int | None = None,
    ) -> list[SeriesKey]:
        """Series of a metric that carry every tag pair of ``tag_filters`` (with samples in
        [start_ms, end_ms] by the time index where given), sorted by tags."""
        pairs = sorted(tag_filters.items()) or [(NAME_TAG, metric_name)]
        buckets = self.index_buckets(tenant, start_ms, end_ms)
        lookups = [self.store.find_series(tenant, metric_name, k, v, buckets) for k, v in pairs]
        found = await gatherResults(lookups, consumeErrors=True)
        hashes = set.intersection(*found)
        if buckets is None and start_ms is not None and hashes:
            # the all-time index holds every series of the retention: keep those seen since the start
            hashes = await self.store.series_seen_since(tenant, hashes, Buckets.of(start_ms, start_ms).first)
        if len(hashes) > self.max_series(tenant):
            raise QueryTooLarge(
                f"the query matches {len(hashes)} series, over the limit of {self.max_series(tenant)}"
                f" ({self.max_series.setting(tenant)}); add tag filters"
            )
        series = await self._get_series(tenant, hashes)
        return sorted(series.values(), key=lambda s: sorted(s.tags.items()))

    async def _get_series(self, tenant: str, hashes) -> dict[str, SeriesKey]:
        """series_set_hashes lookups, through a cache: a series' name and tags never change, and a
        dashboard asks for the same series again and again (on Cassandra a lookup is a request a series)."""
        found, missing = {}, []
        for hash_ in hashes:
            key = self._series.get((tenant, hash_))
            if key is None:
                missing.append(hash_)
            else:
                found[hash_] = key
        if missing:
            fetched = await self.store.get_series(tenant, sorted(missing))
            self._series.add_all({(tenant, hash_): key for hash_, key in fetched.items()})
            found.update(fetched)
        return found

    async def metadata(self, tenant: str, metric_names: list[str]) -> list:
        """Prometheus metadata (type, help, unit) of each metric name, None where there is none;
        the lookups run concurrently, bounded like every store call."""
        lookups = [self.store.get_metric_metadata(tenant, name) for name in metric_names]
        return await gatherResults(lookups, consumeErrors=True)

    async def query(
        self, tenant: str, metric_name: str, tag_filters: dict[str, str], start_ms: int, end_ms: int
    ) -> list[SeriesResult]:
        """Series of a metric matching the filters, with their samples (stitched by the read path)."""
        series = await self.select_series(tenant, metric_name, tag_filters, start_ms, end_ms)
        data = await self.samples(series, start_ms, end_ms)
        return [SeriesResult(tenant, s.metric_name, s.tags, d.samples) for s, d in zip(series, data)]

    async def read_series(
        self,
        tenant: str,
        metric_name: str,
        tag_filters: dict[str, str],
        start_ms: int,
        end_ms: int,
        budget: PointsBudget,
        granularity=None,
        aggregate: str | None = None,
        raw: bool = False,
    ) -> list[SeriesResult]:
        """Series of a metric matching the filters with their samples and created timestamps,
        each batch's points spent from ``budget`` (--max-points-per-query) before the next is read:
        one roll-up aggregate (avg by default) with a granularity, the raw samples alone with
        ``raw``, else the read path's stitched samples."""
        series = await self.select_series(tenant, metric_name, tag_filters, start_ms, end_ms)
        what = f"/api/query of {metric_name!r}"
        if raw:
            data = await self.raw(series, start_ms, end_ms, budget, what)
        else:
            fallback = None if granularity is not None else "last"
            reads = await self.samples(
                series, start_ms, end_ms, budget, what, aggregate or "avg", fallback, granularity
            )
            data = [read.samples for read in reads]
        created = await self.created(tenant, series)
        return [SeriesResult(tenant, s.metric_name, s.tags, d, c) for s, d, c in zip(series, data, created)]

    async def select_by_matchers(
        self, tenant: str, matchers, label_view, start_ms: int | None = None, end_ms: int | None = None
    ) -> list[SeriesKey]:
        """The keys of ``select``'s series."""
        return [selected.key for selected in await self.select(tenant, matchers, label_view, start_ms, end_ms)]

    async def select(
        self, tenant: str, matchers, label_view, start_ms: int | None = None, end_ms: int | None = None
    ) -> Selection:
        """Series whose labels, as ``label_view(metric, tags)`` shows them, satisfy every matcher,
        of those with samples in [start_ms, end_ms] as the time index tells (index_buckets; every
        series the tenant has without a start).

        Matchers have ``name``, ``type`` (EQ, NEQ, RE, NRE), ``value`` and ``matches(text)``, with
        Prometheus semantics (an absent label is ""). The index narrows the candidates: an
        equality or a regex that cannot match "" becomes series_sets lookups (regexes through
        tag_values); everything is then checked on the full labels. Values are counted before
        they are looked up: a matcher whose values outnumber --max-series-per-query (each is at
        least one series) only filters the candidates of the others, and is refused when it is
        the only one that narrows (``{i=~".+"}`` over 100k values took 103 s to refuse). Series
        come by metric name, then by tags, as Prometheus's storage gives them: the same answer (topk
        ties, sums near overflow) on every run. Each comes with the labels it was matched on.
        A metric's matched series are remembered and given again while the index finds the same
        series for the same matchers (callers share those labels: they never change them).
        """
        name_matchers = [m for m in matchers if m.name == NAME_TAG]
        tag_matchers = [m for m in matchers if m.name != NAME_TAG]
        found: Selection = []
        checks = [(m.name, m.matches) for m in matchers]
        asked = tuple((m.name, m.type, m.value) for m in matchers)
        buckets = self.index_buckets(tenant, start_ms, end_ms)
        exact: str | None = next((m.value for m in name_matchers if m.type == "EQ"), None)
        # an exact name's candidates first: found, they are the metric's (no lookup to learn it exists)
        exact_hashes = await self._candidates(tenant, exact, tag_matchers, buckets) if exact is not None else set()
        names: list[str] = [exact] if exact is not None and exact_hashes else []
        if not names:
            names = await self._metric_names(tenant, name_matchers, tag_matchers, label_view, buckets)
        for metric_name in names:
            if metric_name == exact and exact_hashes:
                hashes = exact_hashes
            else:
                hashes = await self._candidates(tenant, metric_name, tag_matchers, buckets)
            if len(found) + len(hashes) > self.max_series(tenant):
                raise QueryTooLarge(
                    f"the query matches more than {self.max_series(tenant)} series"
                    f" ({self.max_series.setting(tenant)}); narrow it"
                )
            remembered = (tenant, metric_name, asked, label_view)
            before = self._selections.get(remembered)
            if before is not None and before[0] == hashes:
                found.extend(before[1])
                continue
            series = await self._get_series(tenant, hashes)
            matched = [
                Selected(key, labels)
                for key in series.values()
                if _matches(checks, labels := label_view(key.metric_name, key.tags))
            ]
            matched.sort(key=lambda selected: sorted(selected.key.tags.items()))
            self._selections.put(remembered, (frozenset(hashes), matched), len(hashes))
            found.extend(matched)
        return found

    async def _metric_names(self, tenant: str, name_matchers, tag_matchers, label_view, buckets) -> list[str]:
        """Metric names to look in (an exact name without candidates of its own being one the
        label view may show otherwise): the names the tenant-wide tag index gives for the tag
        matchers that need a value; else all of the tenant's names."""
        names = None
        for matcher in tag_matchers:
            if matcher.matches(""):
                continue
            values = await self._matching_values(matcher, self.store.list_tenant_tag_values, buckets, tenant)
            if len(values) > self.max_series(tenant):
                continue
            lookups = [self.store.find_metrics_by_tag(tenant, matcher.name, v, buckets) for v in values]
            found = set().union(*await gatherResults(lookups, consumeErrors=True))
            names = found if names is None else names & found
        if names is None:
            names = await self.store.list_metric_names(tenant, buckets)
        return sorted(n for n in names if all(m.matches(label_view(n, {})[NAME_TAG]) for m in name_matchers))

    async def _candidates(self, tenant: str, metric_name: str, tag_matchers, buckets) -> set[str]:
        """The series of a metric the narrowing matchers' values give (see select_by_matchers)."""
        lookups, too_many = [], []
        for matcher in tag_matchers:
            if matcher.matches(""):
                continue
            values = await self._matching_values(matcher, self.store.list_tag_values, buckets, tenant, metric_name)
            if len(values) > self.max_series(tenant):
                too_many.append(f"{matcher.name} matches {len(values)} values of {metric_name!r}")
                continue
            lookups.append(ensureDeferred(self._union(tenant, metric_name, matcher.name, values, buckets)))
        if too_many and not lookups:
            raise QueryTooLarge(
                f"the query matches more than {self.max_series(tenant)} series ({self.max_series.setting(tenant)}):"
                f" {too_many[0]}; narrow it"
            )
        if not lookups:
            lookups.append(ensureDeferred(self._union(tenant, metric_name, NAME_TAG, [metric_name], buckets)))
        found = await gatherResults(lookups, consumeErrors=True)
        return set.intersection(*found)

    async def _matching_values(self, matcher, list_values, buckets, *scope) -> list[str]:
        """The tag values a matcher that needs a value can mean: its own for an equality, the
        listed values (of a metric, or of the tenant) it matches otherwise."""
        if matcher.type == "EQ":
            return [matcher.value]
        return [v for v in await list_values(*scope, matcher.name, buckets) if matcher.matches(v)]

    async def _union(self, tenant: str, metric_name: str, tag_key: str, values: list[str], buckets) -> set[str]:
        lookups = [self.store.find_series(tenant, metric_name, tag_key, v, buckets) for v in values]
        return set().union(*await gatherResults(lookups, consumeErrors=True))


def _matches(checks: list, labels: dict[str, str]) -> bool:
    """Whether ``labels`` satisfy every (label name, matches) check, an absent label being ""."""
    for name, matches in checks:
        if not matches(labels.get(name, "")):
            return False
    return True
