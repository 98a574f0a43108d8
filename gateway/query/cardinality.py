"""A tenant's cardinality over a range, from the time index: how many series, which metric names
hold the most, which label names have the most values, which label pairs are on the most series.
Prometheus's ``/api/v1/status/tsdb`` (gateway/http/promql_api.py) and the web page's status view
answer it, so that an operator finds the metric and the label that blew up (docs/promql.rst).

Its cost is bounded before it is paid, by the tenant's --max-series-per-query: at most that many
metric names are counted a series lookup each, and label pairs are counted on at most that many
series' labels. Over either bound the figures come from a uniform sample (series-set hashes and
the order of names carry no meaning) scaled to the whole, and the answer says so in a warning.
"""

from collections import Counter
from typing import NamedTuple

from twisted.internet.defer import gatherResults

from gateway.core.model import NAME_TAG
from gateway.query.planner import QueryPlanner
from protocols.prometheus import utf8_labels


class Cardinality(NamedTuple):
    """Prometheus's TSDB status (``data`` of /api/v1/status/tsdb), and the warnings on how it was counted."""

    data: dict
    warnings: list[str]


def _top(counts: Counter, limit: int) -> list[dict]:
    """The ``limit`` largest counts, largest first, ties by name: Prometheus's [{name, value}]."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [{"name": name, "value": value} for name, value in ranked[:limit]]


def _spread(items: list, at_most: int) -> list:
    """At most ``at_most`` of ``items``, evenly spread over them."""
    if len(items) <= at_most:
        return items
    return [items[i * len(items) // at_most] for i in range(at_most)]


async def tenant_cardinality(planner: QueryPlanner, tenant: str, start_ms: int, end_ms: int, limit: int) -> Cardinality:
    """The cardinality of ``tenant``'s series with data in [start_ms, end_ms] as the time index holds
    them (the all-time index where the planner reads that: a long or old range)."""
    store, budget = planner.store, planner.max_series(tenant)
    setting = planner.max_series.setting(tenant)
    buckets = planner.index_buckets(tenant, start_ms, end_ms)
    warnings = []
    names = await store.list_metric_names(tenant, buckets)
    counted_names = _spread(names, budget)
    found = await gatherResults(
        [store.find_series(tenant, name, NAME_TAG, name, buckets) for name in counted_names], consumeErrors=True
    )
    series_by_name: Counter = Counter()
    for name, name_hashes in zip(counted_names, found):
        series_by_name[name] += len(name_hashes)
    hashes = sorted(set().union(*found))
    series_count = len(hashes)
    if len(counted_names) < len(names):
        series_count = round(series_count * len(names) / len(counted_names))
        warnings.append(
            f"series counted for {len(counted_names)} of {len(names)} metric names ({setting});"
            " the series count is estimated from them"
        )
    tag_keys = await store.list_tenant_tag_keys(tenant, buckets)
    tag_values = await gatherResults(
        [store.list_tenant_tag_values(tenant, key, buckets) for key in tag_keys], consumeErrors=True
    )
    values_by_label = Counter({NAME_TAG: len(names)})
    bytes_by_label = Counter({NAME_TAG: sum(len(name.encode()) for name in names)})
    for key, values in zip(tag_keys, tag_values):
        values_by_label[key] += len(values)
        bytes_by_label[key] += sum(len(value.encode()) for value in values)
    sample = _spread(hashes, budget)
    pairs: Counter = Counter()
    for series in (await store.get_series(tenant, sample)).values():
        pairs.update(f"{label}={value}" for label, value in utf8_labels(series.metric_name, series.tags).items())
    if sample and len(sample) < series_count:
        scale = series_count / len(sample)
        pairs = Counter({pair: round(count * scale) for pair, count in pairs.items()})
        warnings.append(
            f"label pairs counted on {len(sample)} of {series_count} series ({setting}) and scaled to the whole"
        )
    data = {
        "headStats": {
            "numSeries": series_count,
            "numLabelPairs": sum(values_by_label.values()),
            "minTime": start_ms,
            "maxTime": end_ms,
        },
        "seriesCountByMetricName": _top(series_by_name, limit),
        "labelValueCountByLabelName": _top(values_by_label, limit),
        "memoryInBytesByLabelName": _top(bytes_by_label, limit),
        "seriesCountByLabelValuePair": _top(pairs, limit),
    }
    return Cardinality(data, warnings)
