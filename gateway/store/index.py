"""Which metadata rows a batch of new series writes, table by table: one fan-out for every driver.

A driver turns each table's rows into its own statements (SQLite INSERT OR IGNORE, CQL INSERT or
UPDATE); the rows themselves, and so what a series can be found by, are decided here once.
"""

from collections.abc import Sequence
from typing import Any, NamedTuple

from gateway.core.layout import DAY_MS, INDEX_BUCKET_MS
from gateway.core.model import NAME_TAG, SeriesKey


def path_nodes(metric_name: str) -> list[tuple[str, str, bool]]:
    """(parent, name, is_leaf) of every level of a Graphite path: "a.b.c" -> ("", "a", False),
    ("a", "b", False), ("a.b", "c", True)."""
    parts = metric_name.split(".")
    return [(".".join(parts[:i]), part, i == len(parts) - 1) for i, part in enumerate(parts)]


class IndexRows(NamedTuple):
    """Rows per metadata table, each list without repeats, in first-seen order."""

    tenants: list[tuple[str]]
    metric_names: list[tuple[str, str]]
    series_set_hashes: list[tuple[str, str, str, dict[str, str]]]
    series_sets: list[tuple[str, str, str, str, str]]
    tag_keys: list[tuple[str, str, str]]
    tag_values: list[tuple[str, str, str, str]]
    graphite_paths: list[tuple[str, str, str, bool]]  # (tenant, parent, name, is_leaf)
    tenant_tag_keys: list[tuple[str, str]]
    tenant_tag_values: list[tuple[str, str, str]]
    tag_metrics: list[tuple[str, str, str, str]]  # (tenant, tag key, tag value, metric name)


def index_rows(series: Sequence[SeriesKey]) -> IndexRows:
    """Every series is indexed under its tag pairs and under ``__name__=<metric>``; series without
    tags also go into the Graphite path tree, series with tags into the tenant-wide tag tables."""
    tables: dict[str, dict[tuple, object]] = {name: {} for name in IndexRows._fields}
    for s in series:
        tables["tenants"][(s.tenant,)] = None
        tables["metric_names"][(s.tenant, s.metric_name)] = None
        tables["series_set_hashes"][(s.tenant, s.series_set_hash)] = (
            s.tenant,
            s.series_set_hash,
            s.metric_name,
            s.tags,
        )
        tables["series_sets"][(s.tenant, s.metric_name, NAME_TAG, s.metric_name, s.series_set_hash)] = None
        for key, value in s.tags.items():
            tables["series_sets"][(s.tenant, s.metric_name, key, value, s.series_set_hash)] = None
            tables["tag_keys"][(s.tenant, s.metric_name, key)] = None
            tables["tag_values"][(s.tenant, s.metric_name, key, value)] = None
            tables["tenant_tag_keys"][(s.tenant, key)] = None
            tables["tenant_tag_values"][(s.tenant, key, value)] = None
            tables["tag_metrics"][(s.tenant, key, value, s.metric_name)] = None
        if not s.tags:
            for parent, name, leaf in path_nodes(s.metric_name):
                tables["graphite_paths"][(s.tenant, parent, name, leaf)] = None
    rows: dict[str, Any] = {name: list(table) for name, table in tables.items()}
    rows["series_set_hashes"] = list(tables["series_set_hashes"].values())
    return IndexRows(**rows)


# The all-time tables that have a bucketed twin (``bucket_<table>``, the same columns with ``bucket`` after
# ``tenant``): what the planner selects by. series_set_hashes (a series' name and tags by hash),
# tenants and graphite_paths stay all-time only.
BUCKET_TABLES = (
    "metric_names",
    "series_sets",
    "tag_keys",
    "tag_values",
    "tenant_tag_keys",
    "tenant_tag_values",
    "tag_metrics",
)

# Each listing of the index: the table it reads, the column it lists and the key columns it is given.
LISTINGS = {
    "find_series": ("series_sets", "series_set_hash", ("tenant", "metric_name", "tag_key", "tag_value")),
    "list_metric_names": ("metric_names", "metric_name", ("tenant",)),
    "list_tag_keys": ("tag_keys", "tag_key", ("tenant", "metric_name")),
    "list_tag_values": ("tag_values", "tag_value", ("tenant", "metric_name", "tag_key")),
    "list_tenant_tag_keys": ("tenant_tag_keys", "tag_key", ("tenant",)),
    "list_tenant_tag_values": ("tenant_tag_values", "tag_value", ("tenant", "tag_key")),
    "find_metrics_by_tag": ("tag_metrics", "metric_name", ("tenant", "tag_key", "tag_value")),
}


class Buckets(NamedTuple):
    """The time-index buckets (the start of each, ms) a lookup covers, both ends included: a lookup
    given Buckets reads the time index (the series with samples in those buckets), one given None
    the all-time index."""

    first: int
    last: int

    @classmethod
    def of(cls, start_ms: int, end_ms: int) -> "Buckets":
        return cls(start_ms - start_ms % INDEX_BUCKET_MS, end_ms - end_ms % INDEX_BUCKET_MS)

    def starts(self) -> range:
        return range(self.first, self.last + 1, INDEX_BUCKET_MS)


def bucket_table(table: str) -> str:
    return f"bucket_{table}"


def bucket_index_rows(series_buckets: Sequence[tuple[SeriesKey, int]]) -> dict[str, list[tuple]]:
    """Rows per bucket table for series each in a bucket (its start, ms): index_rows' rows of the
    tables in BUCKET_TABLES with the bucket after the tenant, without repeats."""
    by_bucket: dict[int, list[SeriesKey]] = {}
    for key, bucket in series_buckets:
        by_bucket.setdefault(bucket, []).append(key)
    tables: dict[str, list[tuple]] = {bucket_table(table): [] for table in BUCKET_TABLES}
    for bucket, keys in by_bucket.items():
        rows = index_rows(keys)
        for table in BUCKET_TABLES:
            tables[bucket_table(table)] += [(row[0], bucket, *row[1:]) for row in getattr(rows, table)]
    return tables


# How long Cassandra's all-time rows of a series outlive the longest retention of its tenant's data
# counted from their last write: a series rewrites them in the first bucket of each UTC day it is
# indexed in (DailyRefresh), so two rewrites of a series still written are at most two days apart,
# and it may be indexed a bucket ahead. Past that, the TTL takes them (SQLite's sweep needs no
# margin: it reads each series' last bucket): the all-time index shrinks with the data.
ALL_TIME_MARGIN_MS = 2 * DAY_MS + INDEX_BUCKET_MS


class DailyRefresh:
    """The series whose all-time rows this process rewrote, by UTC day of the bucket indexed: a
    series is due again each day (and for any older day, late data), so a series that went away
    and came back after its rows expired is found again, and a series still written never expires.
    Holds the hashes of the newest two days, by tenant (a set entry a series a day, the hash
    text shared with the caller's keys: 1M active series cost about 80 MB)."""

    def __init__(self):
        self._days: dict[int, dict[str, set[str]]] = {}

    def due(self, series_buckets: Sequence[tuple[SeriesKey, int]]) -> list[SeriesKey]:
        due: dict[tuple[str, str], SeriesKey] = {}
        newest = max(self._days, default=None)
        for key, bucket in series_buckets:
            day = bucket - bucket % DAY_MS
            if newest is None or day > newest:
                newest = day
                self._days = {d: done for d, done in self._days.items() if d >= day - DAY_MS}
            if day < newest - DAY_MS:
                due[(key.tenant, key.series_set_hash)] = key
                continue
            done = self._days.setdefault(day, {}).setdefault(key.tenant, set())
            if key.series_set_hash not in done:
                done.add(key.series_set_hash)
                due[(key.tenant, key.series_set_hash)] = key
        return list(due.values())
