"""PromQL over the planner and the read path: what gateway/http/promql_api.py asks for once it
has decoded a request. Each selector's series are selected once, their samples read in batches
under --query-max-samples and the query's deadline, native histograms read for the selectors
histogram_count() and histogram_sum() take; docs/promql.rst has the rules."""

import time
from datetime import datetime, timezone

import numpy as np
from twisted.internet import threads

from gateway.promql.engine import HISTOGRAM_FUNCTIONS, Evaluator, Query, histogram_selectors, parse, plan, selector_matchers
from gateway.promql.values import PromQLError, Series, is_stale
from gateway.query import QueryPlanner
from gateway.read_path import READ_BATCH, clamp_range
from gateway.store import Store
from gateway.store.contract import ExemplarRow
from protocols.prometheus import prometheus_labels, prometheus_metric_name, sanitize_label_name
from protocols.prometheus import types_pb2


class PromQLService:
    def __init__(self, store: Store, planner: QueryPlanner, max_samples: int):
        self.store = store
        self.planner = planner
        self.max_samples = max_samples

    async def evaluate(self, tenant: str, text: str, query: Query, times: np.ndarray, deadline: float):
        """The value of the query at ``times``, and the warnings its answer must carry."""
        expr = await threads.deferToThread(parse, text)
        needs = plan(expr, query)
        selected = {key: await self.planner.select_by_matchers(tenant, matchers, prometheus_labels) for key, (matchers, _, _) in needs.items()}
        data = await self._fetch(selected, needs, deadline)
        histograms = await self._fetch_histograms(tenant, selected, {key: needs[key] for key in histogram_selectors(expr)})
        value = await threads.deferToThread(Evaluator(query, data, deadline, histograms).result, expr, times)
        return value, self._rollup_warnings(needs)

    def _rollup_warnings(self, needs: dict) -> list[str]:
        """Say so when samples before the raw retention came from roll-ups (docs/promql.rst)."""
        earliest = min((low for _, low, _ in needs.values()), default=None)
        granularity = self.planner.reader.rollup_for(earliest) if earliest is not None else None
        if granularity is None:
            return []
        boundary = datetime.fromtimestamp(self.planner.reader.clock() / 1000 - self.store.layout.raw_retention_ms / 1000, timezone.utc)
        return [
            f"samples before {boundary:%Y-%m-%dT%H:%M:%SZ} (past --raw-retention) are {granularity.name} roll-ups:"
            " one point per bucket, the average for gauges, the last value for counters"
        ]

    async def _fetch(self, selected: dict, needs: dict, deadline: float) -> dict[tuple, list[Series]]:
        """The samples of every selector's ``selected`` series, through the read path."""
        data, samples = {}, 0
        for key, (_, low, high) in needs.items():
            keys = selected[key]
            found = []
            for start in range(0, len(keys), READ_BATCH):
                if time.monotonic() > deadline:
                    raise PromQLError("query timed out in query execution", "timeout")
                part = keys[start : start + READ_BATCH]
                for series, read in zip(part, await self.planner.reader.read(part, low, high)):
                    samples += len(read.samples)
                    if samples > self.max_samples:
                        raise PromQLError(
                            "query processing would load too many samples into memory in query execution"
                            f" (--query-max-samples {self.max_samples})"
                        )
                    if len(read.samples):
                        labels = prometheus_labels(series.metric_name, series.tags)
                        found.append(Series(labels, read.samples.timestamps, read.samples.values))
            data[key] = found
        return data

    async def _fetch_histograms(self, tenant: str, selected: dict, needs: dict) -> dict[str, dict[tuple, list[Series]]]:
        """The native histograms of the selectors histogram_count() and histogram_sum() read, as
        two series lists each (a stale histogram is a stale marker in both)."""
        found: dict[str, dict[tuple, list[Series]]] = {name: {} for name in HISTOGRAM_FUNCTIONS}
        for key, (_, low, high) in needs.items():
            keys = selected[key]
            start_ms, end_ms = clamp_range(low, high)
            for begin in range(0, len(keys), READ_BATCH):
                part = keys[begin : begin + READ_BATCH]
                rows = await self.store.read_histograms(tenant, [k.series_set_hash for k in part], start_ms, end_ms)
                for series, decoded in zip(part, await threads.deferToThread(_counts_and_sums, rows)):
                    if decoded is not None:
                        labels = prometheus_labels(series.metric_name, series.tags)
                        timestamps, counts, sums = decoded
                        found["histogram_count"].setdefault(key, []).append(Series(labels, timestamps, counts))
                        found["histogram_sum"].setdefault(key, []).append(Series(labels, timestamps, sums))
        return found

    async def matched(self, tenant: str, selectors: list[str]) -> list[dict]:
        """Label sets of the series the selectors select, sorted."""
        found: dict[tuple, dict] = {}
        for text in selectors:
            expr = await threads.deferToThread(parse, text)
            if type(expr).__name__ != "VectorSelector":
                raise PromQLError(f'invalid parameter "match[]": {text!r} is not a series selector', "bad_data")
            for key in await self.planner.select_by_matchers(tenant, selector_matchers(expr), prometheus_labels):
                labels = prometheus_labels(key.metric_name, key.tags)
                found[tuple(sorted(labels.items()))] = labels
        return [found[key] for key in sorted(found)]

    async def label_names(self, tenant: str, selectors: list[str]) -> list[str]:
        """Label names of the series the selectors select, or of the whole tenant without selectors."""
        if not selectors:
            keys = await self.store.list_tenant_tag_keys(tenant)
            return sorted({"__name__", *(sanitize_label_name(k) for k in keys)})
        return sorted({name for labels in await self.matched(tenant, selectors) for name in labels})

    async def label_values(self, tenant: str, name: str, selectors: list[str]) -> list[str]:
        """Values of a label on the series the selectors select, or on the whole tenant without selectors."""
        if selectors:
            values = {labels[name] for labels in await self.matched(tenant, selectors) if name in labels}
        elif name == "__name__":
            values = {prometheus_metric_name(n) for n in await self.store.list_metric_names(tenant)}
        else:
            values = set(await self.store.list_tenant_tag_values(tenant, name))
        return sorted(values)

    async def exemplars(self, tenant: str, text: str, query: Query) -> list[tuple[dict, list[ExemplarRow]]]:
        """The exemplars in [query.start_ms, query.end_ms] of every series the query's selectors
        select, by series labels (sorted), series without exemplars left out."""
        expr = await threads.deferToThread(parse, text)
        selected = {}
        for matchers, _, _ in plan(expr, query).values():
            for key in await self.planner.select_by_matchers(tenant, matchers, prometheus_labels):
                selected[key.series_set_hash] = key
        keys = list(selected.values())
        result = []
        for begin in range(0, len(keys), READ_BATCH):
            part = keys[begin : begin + READ_BATCH]
            found = await self.store.read_exemplars(tenant, [key.series_set_hash for key in part], query.start_ms, query.end_ms)
            result += [(prometheus_labels(key.metric_name, key.tags), rows) for key, rows in zip(part, found) if rows]
        return sorted(result, key=lambda item: sorted(item[0].items()))


def _counts_and_sums(rows_by_series) -> list:
    """(timestamps, counts, sums) of each series' stored histograms, None for a series without."""
    decoded = []
    for rows in rows_by_series:
        if not rows:
            decoded.append(None)
            continue
        histograms = [types_pb2.Histogram.FromString(row.data) for row in rows]
        sums = np.array([h.sum for h in histograms])
        counts = np.array([h.count_float if h.WhichOneof("count") == "count_float" else h.count_int for h in histograms], dtype=np.float64)
        counts = np.where(is_stale(sums), sums, counts)
        decoded.append((np.array([row.timestamp_ms for row in rows], dtype=np.int64), counts, sums))
    return decoded
