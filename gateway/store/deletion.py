"""What deleting samples and series does to the tables, decided once for every driver (docs/operations.rst).

Samples: a block loses the samples in the range (cut_block); a roll-up row goes when its bucket
overlaps the range (the caller recomputes the buckets of slots that still have raw samples);
head rows, exemplars and histograms go by timestamp.

Series: their own rows go (series_set_hashes, series_sets), then the shared index rows that no
series needs any more, level by level (a tag value, then its tag key; a metric's name and its
Prometheus metadata; a Graphite leaf, then each branch above it left without children). The time
index alike, bucket by bucket: in each bucket a series was indexed in, its own bucket_series_sets
rows, then the shared rows no series of that bucket needs (so a listing over those hours no longer
shows a deleted series' values). remove_from_index asks the store through the contract's read
methods and deletes through the driver's ``delete_index_rows`` and ``write_path_flags``.
"""

from collections.abc import Sequence

import numpy as np
from twisted.internet.defer import gatherResults

from gateway.core.layout import INDEX_BUCKET_MS
from gateway.core.model import NAME_TAG, SeriesKey, now_ms
from gateway.store.blocks import decode_block, encode_block
from gateway.store.index import BUCKET_TABLES, Buckets, bucket_table, path_nodes

# Index lookups deleting series keeps in flight at once (of the store's CALLS_IN_FLIGHT).
LOOKUPS_AT_ONCE = 16

# The key columns of each metadata table, in the order delete_index_rows takes them.
INDEX_KEYS = {
    "series_set_hashes": ("tenant", "series_set_hash"),
    "series_sets": ("tenant", "metric_name", "tag_key", "tag_value", "series_set_hash"),
    "tag_values": ("tenant", "metric_name", "tag_key", "tag_value"),
    "tag_keys": ("tenant", "metric_name", "tag_key"),
    "tag_metrics": ("tenant", "tag_key", "tag_value", "metric_name"),
    "tenant_tag_values": ("tenant", "tag_key", "tag_value"),
    "tenant_tag_keys": ("tenant", "tag_key"),
    "metric_names": ("tenant", "metric_name"),
    "metric_metadata": ("tenant", "metric_name"),
    "graphite_paths": ("tenant", "parent", "name"),
}
# The time index's tables: the same keys with the bucket after the tenant.
INDEX_KEYS.update({bucket_table(t): ("tenant", "bucket", *INDEX_KEYS[t][1:]) for t in BUCKET_TABLES})


def cut_block(block: bytes, start_ms: int, end_ms: int) -> bytes | None:
    """The block without its samples in [start_ms, end_ms]: the same bytes when it has none
    there, None when nothing is left."""
    timestamps, values = decode_block(block)
    keep = (timestamps < start_ms) | (timestamps > end_ms)
    if keep.all():
        return block
    if not keep.any():
        return None
    return encode_block(timestamps[keep], values[keep])


def samples_in_block(block: bytes, start_ms: int, end_ms: int) -> int:
    timestamps, _ = decode_block(block)
    return int(np.count_nonzero((timestamps >= start_ms) & (timestamps <= end_ms)))


def bucket_range(start_ms: int, end_ms: int, width_ms: int) -> tuple[int, int]:
    """The bucket starts (ts of roll-up rows) whose bucket overlaps [start_ms, end_ms]."""
    return start_ms - start_ms % width_ms, end_ms


async def remove_from_index(store, series: Sequence[SeriesKey], time_index: bool = True) -> None:
    """Delete the series' own index rows, then every shared row left without a series: in the
    all-time index, then in each bucket of the time index (unless ``time_index`` is false: the
    series' buckets are known to be gone, as those of series whose data expired)."""
    await _remove_from_all_time_index(store, series)
    if not time_index:
        return
    for tenant in sorted({s.tenant for s in series}):
        await _remove_from_buckets(store, [s for s in series if s.tenant == tenant], _time_index_span(store, tenant))


def _time_index_span(store, tenant: str):
    """The buckets the time index may hold for a tenant: from the raw retention's start (or the time
    index's, if later) to the next bucket (ingest indexes series in it ahead of time)."""
    now = now_ms()
    first = max(store.bucket_index_since, now - store.retentions.for_tenant(tenant).raw_retention_ms - INDEX_BUCKET_MS)
    return Buckets.of(first, now + INDEX_BUCKET_MS)


async def _remove_from_all_time_index(store, series: Sequence[SeriesKey]) -> None:
    own: dict[str, list[tuple]] = {"series_set_hashes": [], "series_sets": []}
    pairs, names, leaves = set(), set(), set()
    for s in series:
        own["series_set_hashes"].append((s.tenant, s.series_set_hash))
        own["series_sets"].append((s.tenant, s.metric_name, NAME_TAG, s.metric_name, s.series_set_hash))
        for key, value in s.tags.items():
            own["series_sets"].append((s.tenant, s.metric_name, key, value, s.series_set_hash))
            pairs.add((s.tenant, s.metric_name, key, value))
        names.add((s.tenant, s.metric_name))
        if not s.tags:
            leaves.add((s.tenant, s.metric_name))
    await store.delete_index_rows(own)
    await _drop_unused_tags(store, sorted(pairs))
    unused_names = await _unused(sorted(names), lambda tenant, name: store.find_series(tenant, name, NAME_TAG, name))
    await store.delete_index_rows({"metric_names": unused_names, "metric_metadata": unused_names})
    for tenant, metric_name in sorted(leaves):
        await _drop_path(store, tenant, metric_name)


async def _unused(keys: list, lookup) -> list:
    """The keys whose listing (``lookup(*key)``) is empty, LOOKUPS_AT_ONCE lookups in flight at a
    time: a share of the store's bound on calls, where one at a time left its threads idle."""
    unused = []
    for first in range(0, len(keys), LOOKUPS_AT_ONCE):
        part = keys[first : first + LOOKUPS_AT_ONCE]
        found = await gatherResults([lookup(*key) for key in part], consumeErrors=True)
        unused += [key for key, rows in zip(part, found) if not rows]
    return unused


async def _drop_unused_tags(store, pairs: list[tuple[str, str, str, str]]) -> None:
    gone_values = await _unused(pairs, store.find_series)
    await store.delete_index_rows(
        {
            "tag_values": gone_values,
            "tag_metrics": [(tenant, key, value, name) for tenant, name, key, value in gone_values],
        }
    )
    metric_keys = sorted({(tenant, name, key) for tenant, name, key, _ in gone_values})
    gone_keys = await _unused(metric_keys, store.list_tag_values)
    tenant_values = sorted({(tenant, key, value) for tenant, _, key, value in gone_values})
    gone_tenant_values = await _unused(tenant_values, store.find_metrics_by_tag)
    await store.delete_index_rows({"tag_keys": gone_keys, "tenant_tag_values": gone_tenant_values})
    tenant_keys = sorted({(tenant, key) for tenant, key, _ in gone_tenant_values})
    gone_tenant_keys = await _unused(tenant_keys, store.list_tenant_tag_values)
    await store.delete_index_rows({"tenant_tag_keys": gone_tenant_keys})


async def _drop_path(store, tenant: str, metric_name: str) -> None:
    """The leaf of a Graphite path, then each branch above it that has no child left."""
    nodes = path_nodes(metric_name)
    for parent, name, leaf in reversed(nodes):
        path = f"{parent}.{name}" if parent else name
        found = [node for node in await store.list_path_children(tenant, parent) if node.name == name]
        if not found:
            return
        node = found[0]
        is_leaf = node.is_leaf and not leaf
        is_branch = node.is_branch and (leaf or bool(await store.list_path_children(tenant, path)))
        if (is_leaf, is_branch) == (node.is_leaf, node.is_branch):
            return
        await store.write_path_flags(tenant, parent, name, is_leaf, is_branch)
        if is_leaf or is_branch:
            return


async def _remove_from_buckets(store, series: Sequence[SeriesKey], span) -> None:
    """remove_from_index in the time index: the buckets of ``span`` each series is indexed in (one
    lookup a series), its own rows there, then per shared row the buckets no series needs it in any
    more (one lookup a distinct row a level, over the buckets it may be gone from)."""
    own: list[tuple] = []
    pairs: dict[tuple[str, str, str, str], set[int]] = {}
    names: dict[tuple[str, str], set[int]] = {}
    for s in series:
        found = await store.listing_buckets(
            "find_series", (s.tenant, s.metric_name, NAME_TAG, s.metric_name), span, s.series_set_hash
        )
        for bucket in found:
            own.append((s.tenant, bucket, s.metric_name, NAME_TAG, s.metric_name, s.series_set_hash))
            for key, value in s.tags.items():
                own.append((s.tenant, bucket, s.metric_name, key, value, s.series_set_hash))
                pairs.setdefault((s.tenant, s.metric_name, key, value), set()).update(found)
            names.setdefault((s.tenant, s.metric_name), set()).update(found)
    await store.delete_index_rows({bucket_table("series_sets"): own})

    async def gone(name: str, keys: tuple, buckets: set[int]) -> list[int]:
        """The buckets of ``buckets`` in which a listing is now empty."""
        left = await store.listing_buckets(name, keys, Buckets(min(buckets), max(buckets)))
        return sorted(buckets - set(left))

    values: list[tuple[str, int, str, str, str]] = []
    metric_keys: dict[tuple[str, str, str], set[int]] = {}
    tenant_values: dict[tuple[str, str, str], set[int]] = {}
    for (tenant, name, key, value), buckets in sorted(pairs.items()):
        for bucket in await gone("find_series", (tenant, name, key, value), buckets):
            values.append((tenant, bucket, name, key, value))
            metric_keys.setdefault((tenant, name, key), set()).add(bucket)
            tenant_values.setdefault((tenant, key, value), set()).add(bucket)
    await store.delete_index_rows(
        {
            bucket_table("tag_values"): values,
            bucket_table("tag_metrics"): [
                (tenant, bucket, key, value, name) for tenant, bucket, name, key, value in values
            ],
        }
    )
    keys = [
        (tenant, bucket, name, key)
        for (tenant, name, key), buckets in sorted(metric_keys.items())
        for bucket in await gone("list_tag_values", (tenant, name, key), buckets)
    ]
    gone_tenant_values: list[tuple[str, int, str, str]] = []
    tenant_keys: dict[tuple[str, str], set[int]] = {}
    for (tenant, key, value), buckets in sorted(tenant_values.items()):
        for bucket in await gone("find_metrics_by_tag", (tenant, key, value), buckets):
            gone_tenant_values.append((tenant, bucket, key, value))
            tenant_keys.setdefault((tenant, key), set()).add(bucket)
    await store.delete_index_rows(
        {bucket_table("tag_keys"): keys, bucket_table("tenant_tag_values"): gone_tenant_values}
    )
    gone_tenant_keys = [
        (tenant, bucket, key)
        for (tenant, key), buckets in sorted(tenant_keys.items())
        for bucket in await gone("list_tenant_tag_values", (tenant, key), buckets)
    ]
    gone_names = [
        (tenant, bucket, name)
        for (tenant, name), buckets in sorted(names.items())
        for bucket in await gone("find_series", (tenant, name, NAME_TAG, name), buckets)
    ]
    await store.delete_index_rows(
        {bucket_table("tenant_tag_keys"): gone_tenant_keys, bucket_table("metric_names"): gone_names}
    )
