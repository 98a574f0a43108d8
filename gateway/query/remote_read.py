"""Prometheus remote read and metadata over the planner and the read path: what
gateway/http/prometheus_api.py asks for once it has decoded a request.

Each query's series are selected with their Prometheus labels (names as written, or mapped for a
Prometheus 2.x reader: protocols/prometheus/names.py), sorted as Prometheus merges them;
samples and native histograms are read through the one batched read (gateway/query/read_service.py),
counted against --max-samples-per-query. Everything is read before the handler sends a status,
so a query over the limit is a 422 for streamed answers too, never a cut stream. Past raw retention the read
path gives the avg roll-up (the last value for counters, which have no avg, so rate() over them
stays right). docs/prometheus.rst.
"""

from gateway.core.overrides import PerTenant, per_tenant
from gateway.core.samples import Samples
from gateway.query.planner import QueryPlanner, QueryTooLarge
from gateway.query.read_service import READ_BATCH, ReadBudget, Selection
from gateway.store import Store
from protocols import prometheus
from protocols.prometheus import utf8_labels


class RemoteRead:
    def __init__(self, store: Store, planner: QueryPlanner, max_samples_per_query: int | PerTenant):
        self.store = store
        self.planner = planner
        self.max_samples_per_query = per_tenant("max-samples-per-query", max_samples_per_query)

    async def read(self, tenant: str, queries, streamed: bool, label_view=utf8_labels) -> list[list[tuple]]:
        """For each query, its series with samples, native histograms or (unless ``streamed``:
        chunks have no place for them) exemplars: (labels, samples, histograms) when
        ``streamed``, else (labels, samples, exemplars, histograms) as encode_read_response takes them.
        Series are matched and answered with their labels as ``label_view`` shows them (names as
        written, or mapped for a Prometheus 2.x reader: protocols/prometheus/names.py)."""
        selections = [await self._select(tenant, query, label_view) for query in queries]
        histogram_budget = self._budget(tenant, "native histograms")  # one for the whole request
        histograms = [
            await self.planner.histograms(tenant, _hashes(s), q.start_ms, q.end_ms, histogram_budget)
            for q, s in zip(queries, selections)
        ]
        samples = [await self._samples(tenant, selection, query) for query, selection in zip(queries, selections)]
        if streamed:
            return [
                [
                    (labels, found.get(_label_key(labels), ()), _histograms(native_rows))
                    for (_, labels), native_rows in zip(selection, native)
                    if native_rows or _label_key(labels) in found
                ]
                for selection, found, native in zip(selections, samples, histograms)
            ]
        complete = []
        for query, selection, found, native in zip(queries, selections, samples, histograms):
            exemplars = await self.planner.exemplars(
                tenant, _hashes(selection), *self.planner.exemplar_range(query.start_ms, query.end_ms)
            )
            complete.append(
                [
                    (
                        labels,
                        found.get(_label_key(labels), ()),
                        [prometheus.Exemplar(row.labels, row.value, row.timestamp_ms) for row in rows],
                        _histograms(native_rows),
                    )
                    for (_, labels), rows, native_rows in zip(selection, exemplars, native)
                    if rows or native_rows or _label_key(labels) in found
                ]
            )
        return complete

    async def _select(self, tenant: str, query, label_view) -> Selection:
        """The series a query's matchers select, with their labels as ``label_view`` shows them, sorted by labels."""
        selection = await self.planner.select(tenant, query.matchers, label_view, query.start_ms, query.end_ms)
        return sorted(selection, key=lambda selected: sorted(selected.labels.items()))

    def _budget(self, tenant: str, what: str) -> ReadBudget:
        """What one query (samples) or the whole request (native histograms) may read: --max-samples-per-query."""
        limit, setting = self.max_samples_per_query(tenant), self.max_samples_per_query.setting(tenant)
        return ReadBudget(
            limit, lambda *_: QueryTooLarge(f"the query reads more than {limit} {what} ({setting}); narrow it")
        )

    async def _samples(self, tenant: str, selection: Selection, query) -> dict[tuple, Samples]:
        """The samples of each selected series that has some in the query's range, by label key;
        QueryTooLarge once the query reads more than --max-samples-per-query."""
        reads = await self.planner.samples(
            [key for key, _ in selection], query.start_ms, query.end_ms, self._budget(tenant, "samples")
        )
        return {_label_key(labels): read.samples for (_, labels), read in zip(selection, reads) if len(read.samples)}

    async def metadata(self, tenant: str, metric: str | None, limit: int | None) -> list:
        """The stored type/help/unit of one metric (None when it has none), or of the tenant's
        first ``limit`` metric families that have some (all without a limit), by name. Remote
        write carries a histogram's or a summary's metadata under its family name, which no
        series bears (``x_bucket``, ``x_sum``, ``x_count``): families are looked up under every
        series name and under that name without such a suffix."""
        if metric:
            return await self.planner.metadata(tenant, [metric])
        names = await self.store.list_metric_names(tenant)
        families = sorted({family for name in names for family in _family_names(name)})
        found: list = []
        for start in range(0, len(families), READ_BATCH):
            found += [row for row in await self.planner.metadata(tenant, families[start : start + READ_BATCH]) if row]
            if limit and len(found) >= limit:
                return found[:limit]
        return found


# the suffixes of the series of a histogram, a summary, a counter or an info metric (OpenMetrics)
_FAMILY_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created", "_info", "_gcount", "_gsum")


def _family_names(name: str) -> list[str]:
    """The metric families a series name may belong to: its own, and without a family suffix."""
    return [name] + [name.removesuffix(suffix) for suffix in _FAMILY_SUFFIXES if name.endswith(suffix)]


def _hashes(selection: Selection) -> list[str]:
    return [key.series_set_hash for key, _ in selection]


def _histograms(rows) -> list:
    return [prometheus.WriteHistogram(row.timestamp_ms, row.data) for row in rows]


def _label_key(labels: dict[str, str]) -> tuple:
    return tuple(sorted(labels.items()))
