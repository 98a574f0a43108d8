"""The query planner: tag filters -> intersection of series_sets lookups -> data per series.

Seed 000's plan: each ``tag=value`` filter is one series_sets lookup, the matching series are the
intersection of the lookups (a metric with no filter is looked up under ``__name__``), their
names and tags come from series_set_hashes, and the data of each comes from its own raw
partitions. Lookups and reads run concurrently, with a bound on how many at once.
"""

from typing import NamedTuple

from twisted.internet.defer import DeferredSemaphore, gatherResults

from gateway import metrics
from gateway.model import NAME_TAG, SeriesKey
from gateway.store import Store


class SeriesResult(NamedTuple):
    tenant: str
    metric_name: str
    tags: dict[str, str]
    points: list[tuple[int, float]]


class QueryTooLarge(ValueError):
    """The query would touch more series than allowed; refuse instead of exhausting memory."""


class QueryPlanner:
    def __init__(self, store: Store, max_series: int, concurrency: int = 32):
        self.store = store
        self.max_series = max_series
        self._semaphore = DeferredSemaphore(concurrency)

    def _limited(self, operation: str, call, *args):
        return self._semaphore.run(lambda: metrics.observe_store(operation, call(*args)))

    async def select_series(self, tenant: str, metric_name: str, tag_filters: dict[str, str]) -> list[SeriesKey]:
        """Series of a metric that carry every tag pair of ``tag_filters``, sorted by tags."""
        pairs = sorted(tag_filters.items()) or [(NAME_TAG, metric_name)]
        lookups = [self._limited("find_series", self.store.find_series, tenant, metric_name, k, v) for k, v in pairs]
        found = await gatherResults(lookups, consumeErrors=True)
        hashes = set.intersection(*found)
        if len(hashes) > self.max_series:
            raise QueryTooLarge(
                f"the query matches {len(hashes)} series, over the limit of {self.max_series}; add tag filters"
            )
        series = await self._limited("get_series", self.store.get_series, tenant, sorted(hashes))
        return sorted(series.values(), key=lambda s: sorted(s.tags.items()))

    async def query(self, tenant: str, metric_name: str, tag_filters: dict[str, str], start_ms: int, end_ms: int) -> list[SeriesResult]:
        series = await self.select_series(tenant, metric_name, tag_filters)
        reads = [
            self._limited("read_raw", self.store.read_raw, tenant, s.series_set_hash, start_ms, end_ms) for s in series
        ]
        data = await gatherResults(reads, consumeErrors=True)
        return [SeriesResult(tenant, s.metric_name, s.tags, points) for s, points in zip(series, data)]
