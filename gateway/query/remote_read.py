"""Prometheus remote read and metadata over the planner and the read path: what
gateway/http/prometheus_api.py asks for once it has decoded a request.

Each query's series are selected with their Prometheus labels, sorted as Prometheus merges them;
samples and native histograms are read a few series at a time and counted against
--max-samples-per-query. Everything is read before the handler sends a status, so a query over
the limit is a 422 for streamed answers too, never a cut stream. Past raw retention the read
path gives the avg roll-up (the last value for counters, which have no avg, so rate() over them
stays right). docs/prometheus.rst.
"""

from gateway.core.model import SeriesKey
from gateway.core.overrides import PerTenant, per_tenant
from gateway.core.samples import Samples
from gateway.query.planner import QueryPlanner, QueryTooLarge
from gateway.query.read_path import READ_BATCH
from gateway.store import Store
from protocols import prometheus
from protocols.prometheus import prometheus_labels

Selection = list[tuple[dict[str, str], SeriesKey]]


class RemoteRead:
    def __init__(self, store: Store, planner: QueryPlanner, max_samples_per_query: int | PerTenant):
        self.store = store
        self.planner = planner
        self.max_samples_per_query = per_tenant("max-samples-per-query", max_samples_per_query)

    async def read(self, tenant: str, queries, streamed: bool) -> list[list[tuple]]:
        """For each query, its series with samples, native histograms or (unless ``streamed``:
        chunks have no place for them) exemplars: (labels, samples, histograms) when
        ``streamed``, else (labels, samples, exemplars, histograms) as encode_read_response takes them."""
        selections = [await self._select(tenant, query) for query in queries]
        reader = self.planner.reader
        histograms = [
            await self._attached(reader.read_histograms, tenant, s, reader.readable(q.start_ms, q.end_ms))
            for q, s in zip(queries, selections)
        ]
        limit = self.max_samples_per_query
        if sum(len(rows) for found in histograms for rows in found) > limit(tenant):
            raise QueryTooLarge(
                f"the query reads more than {limit(tenant)} native histograms ({limit.setting(tenant)}); narrow it"
            )
        samples = [await self._samples(tenant, selection, query) for query, selection in zip(queries, selections)]
        if streamed:
            return [
                [
                    (labels, found.get(_label_key(labels), ()), _histograms(native_rows))
                    for (labels, _), native_rows in zip(selection, native)
                    if native_rows or _label_key(labels) in found
                ]
                for selection, found, native in zip(selections, samples, histograms)
            ]
        complete = []
        for query, selection, found, native in zip(queries, selections, samples, histograms):
            exemplars = await self._attached(
                self.store.read_exemplars, tenant, selection, reader.exemplar_range(query.start_ms, query.end_ms)
            )
            complete.append(
                [
                    (
                        labels,
                        found.get(_label_key(labels), ()),
                        [prometheus.Exemplar(row.labels, row.value, row.timestamp_ms) for row in rows],
                        _histograms(native_rows),
                    )
                    for (labels, _), rows, native_rows in zip(selection, exemplars, native)
                    if rows or native_rows or _label_key(labels) in found
                ]
            )
        return complete

    async def _select(self, tenant: str, query) -> Selection:
        """The series a query's matchers select, with their Prometheus labels, sorted by labels."""
        series = await self.planner.select_by_matchers(tenant, query.matchers, prometheus_labels)
        labelled = [(prometheus_labels(key.metric_name, key.tags), key) for key in series]
        labelled.sort(key=lambda item: sorted(item[0].items()))
        return labelled

    async def _samples(self, tenant: str, selection: Selection, query) -> dict[tuple, Samples]:
        """The samples of each selected series that has some in the query's range, by label key;
        QueryTooLarge once the query reads more than --max-samples-per-query."""
        found, count, limit = {}, 0, self.max_samples_per_query
        for start in range(0, len(selection), READ_BATCH):
            part = selection[start : start + READ_BATCH]
            data = await self.planner.reader.read([key for _, key in part], query.start_ms, query.end_ms)
            for (labels, _), read in zip(part, data):
                count += len(read.samples)
                if count > limit(tenant):
                    raise QueryTooLarge(
                        f"the query reads more than {limit(tenant)} samples ({limit.setting(tenant)}); narrow it"
                    )
                if len(read.samples):
                    found[_label_key(labels)] = read.samples
        return found

    async def _attached(self, read, tenant: str, selection: Selection, time_range: tuple[int, int]) -> list[list]:
        """What is kept beside the samples of each selected series (``read`` is the store's
        read_exemplars or the read path's read_histograms) in a range the read path cut to what
        the retentions hold, one list a series."""
        found = []
        start_ms, end_ms = time_range
        if end_ms < start_ms:
            return [[] for _ in selection]
        for start in range(0, len(selection), READ_BATCH):
            part = [key.series_set_hash for _, key in selection[start : start + READ_BATCH]]
            found.extend(await read(tenant, part, start_ms, end_ms))
        return found

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


def _histograms(rows) -> list:
    return [prometheus.Histogram(row.timestamp_ms, row.data) for row in rows]


def _label_key(labels: dict[str, str]) -> tuple:
    return tuple(sorted(labels.items()))
