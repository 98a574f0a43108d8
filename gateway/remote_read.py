"""Prometheus remote read and metadata over the planner and the read path: what
gateway/http/prometheus_api.py asks for once it has decoded a request.

Each query's series are selected with their Prometheus labels, sorted as Prometheus merges them;
samples are read a few series at a time and counted against --max-samples-per-query, native
histograms too. Past raw retention the read path gives the avg roll-up (the last value for
counters, which have no avg, so rate() over them stays right). docs/prometheus.rst.
"""

from gateway.model import SeriesKey
from gateway.query import QueryPlanner, QueryTooLarge
from gateway.read_path import READ_BATCH, clamp_range
from gateway.samples import Samples
from gateway.store import Store
from protocols.prometheus import prometheus_labels

Selection = list[tuple[dict[str, str], SeriesKey]]


class RemoteRead:
    def __init__(self, store: Store, planner: QueryPlanner, max_samples_per_query: int):
        self.store = store
        self.planner = planner
        self.max_samples_per_query = max_samples_per_query

    async def select(self, tenant: str, query) -> Selection:
        """The series a query's matchers select, with their Prometheus labels, sorted by labels."""
        series = await self.planner.select_by_matchers(tenant, query.matchers, prometheus_labels)
        labelled = [(prometheus_labels(key.metric_name, key.tags), key) for key in series]
        labelled.sort(key=lambda item: sorted(item[0].items()))
        return labelled

    async def samples(self, selection: Selection, query) -> list[tuple[dict[str, str], Samples]]:
        """(labels, samples) of each selected series that has samples in the query's range;
        QueryTooLarge once the query reads more than --max-samples-per-query."""
        found, count = [], 0
        for start in range(0, len(selection), READ_BATCH):
            part = selection[start : start + READ_BATCH]
            data = await self.planner.reader.read([key for _, key in part], query.start_ms, query.end_ms)
            for (labels, _), read in zip(part, data):
                count += len(read.samples)
                if count > self.max_samples_per_query:
                    raise QueryTooLarge(f"the query reads more than {self.max_samples_per_query} samples (--max-samples-per-query); narrow it")
                if len(read.samples):
                    found.append((labels, read.samples))
        return found

    async def histograms(self, tenant: str, queries, selections: list[Selection]) -> list[list[list]]:
        """The native histogram rows of each selected series of each query; QueryTooLarge once the
        request reads more than --max-samples-per-query of them."""
        found = [await self._attached(self.store.read_histograms, tenant, selection, query) for query, selection in zip(queries, selections)]
        if sum(len(rows) for per_query in found for rows in per_query) > self.max_samples_per_query:
            raise QueryTooLarge(f"the query reads more than {self.max_samples_per_query} native histograms (--max-samples-per-query); narrow it")
        return found

    async def exemplars(self, tenant: str, query, selection: Selection) -> list[list]:
        """The exemplar rows of each selected series in the query's range."""
        return await self._attached(self.store.read_exemplars, tenant, selection, query)

    async def _attached(self, read, tenant: str, selection: Selection, query) -> list[list]:
        """What the store keeps beside the samples of each selected series (``read`` is
        read_exemplars or read_histograms) in the query's range, one list a series."""
        found = []
        start_ms, end_ms = clamp_range(query.start_ms, query.end_ms)
        for start in range(0, len(selection), READ_BATCH):
            part = [key.series_set_hash for _, key in selection[start : start + READ_BATCH]]
            found.extend(await read(tenant, part, start_ms, end_ms))
        return found

    async def metadata(self, tenant: str, metric: str | None, limit: int | None) -> list:
        """The stored type/help/unit of one metric, or of the tenant's first ``limit`` metrics (all
        without a limit); None for a metric without."""
        names = [metric] if metric else await self.store.list_metric_names(tenant)
        return await self.planner.metadata(tenant, names[:limit] if limit else names)
