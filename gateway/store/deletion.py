"""What deleting samples and series does to the tables, decided once for every driver (docs/operations.rst).

Samples: a block loses the samples in the range (cut_block); a roll-up row goes when its bucket
overlaps the range (the caller recomputes the buckets of slots that still have raw samples);
head rows, exemplars and histograms go by timestamp.

Series: their own rows go (series_set_hashes, series_sets), then the shared index rows that no
series needs any more, level by level (a tag value, then its tag key; a metric's name and its
Prometheus metadata; a Graphite leaf, then each branch above it left without children). The time
index alike, bucket by bucket: in each bucket a series was indexed in, its own bucket_series_sets
rows, then the shared rows no series of that bucket needs (so a listing over those hours no longer
shows a deleted series' values). remove_from_index asks the store whether listings still have
rows (``listings_with_rows``, ``listings_buckets``: LISTINGS_A_CALL listings a store call) and
deletes through the driver's ``delete_index_rows`` and ``write_path_flags``.
"""

import functools
from collections.abc import Sequence

import numpy as np

from gateway.core.layout import INDEX_BUCKET_MS
from gateway.core.model import NAME_TAG, SeriesKey, now_ms
from gateway.store.blocks import decode_block, encode_block
from gateway.store.index import BUCKET_TABLES, Buckets, bucket_table, path_nodes

# Index listings deleting series asks about in one store call: a delete of 20,000 series asked
# 100,000 of them, a call each, and those took most of its 30 s on SQLite.
LISTINGS_A_CALL = 500

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
    unused_names = await _unused(store, "find_series", [(t, name, NAME_TAG, name) for t, name in sorted(names)])
    gone_names = [(tenant, name) for tenant, name, _, _ in unused_names]
    await store.delete_index_rows({"metric_names": gone_names, "metric_metadata": gone_names})
    for tenant, metric_name in sorted(leaves):
        await _drop_path(store, tenant, metric_name)


async def _in_parts(ask, listings: list) -> list:
    """``ask`` of LISTINGS_A_CALL listings at a time, the answers of all in their order."""
    found: list = []
    for first in range(0, len(listings), LISTINGS_A_CALL):
        found += await ask(listings[first : first + LISTINGS_A_CALL])
    return found


async def _unused(store, name: str, listings: list[tuple]) -> list[tuple]:
    """The listings (keys of ``name``) without a row in the all-time table."""
    held = await _in_parts(functools.partial(store.listings_with_rows, name), listings)
    return [keys for keys, has_rows in zip(listings, held) if not has_rows]


async def _drop_unused_tags(store, pairs: list[tuple[str, str, str, str]]) -> None:
    gone_values = await _unused(store, "find_series", pairs)
    await store.delete_index_rows(
        {
            "tag_values": gone_values,
            "tag_metrics": [(tenant, key, value, name) for tenant, name, key, value in gone_values],
        }
    )
    metric_keys = sorted({(tenant, name, key) for tenant, name, key, _ in gone_values})
    gone_keys = await _unused(store, "list_tag_values", metric_keys)
    tenant_values = sorted({(tenant, key, value) for tenant, _, key, value in gone_values})
    gone_tenant_values = await _unused(store, "find_metrics_by_tag", tenant_values)
    await store.delete_index_rows({"tag_keys": gone_keys, "tenant_tag_values": gone_tenant_values})
    tenant_keys = sorted({(tenant, key) for tenant, key, _ in gone_tenant_values})
    gone_tenant_keys = await _unused(store, "list_tenant_tag_values", tenant_keys)
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


async def _remove_from_buckets(store, series: Sequence[SeriesKey], span: Buckets) -> None:
    """remove_from_index in the time index: the buckets of ``span`` each series is indexed in, its
    own rows there, then per shared row the buckets no series needs it in any more, level by
    level (LISTINGS_A_CALL listings a store call)."""

    async def gone(name: str, wanted: dict[tuple, set[int]]) -> list[tuple]:
        """(*keys, bucket) of each listing of ``wanted`` and each of its buckets in which it is now
        empty; each asked over its own first to last bucket (a request reads a partition a bucket
        on Cassandra), listings of the same buckets together."""
        by_buckets: dict[Buckets, list[tuple]] = {}
        for keys in sorted(wanted):
            by_buckets.setdefault(Buckets(min(wanted[keys]), max(wanted[keys])), []).append(keys)
        found = []
        for buckets, listings in by_buckets.items():
            left = await _in_parts(functools.partial(store.listings_buckets, name, buckets=buckets), listings)
            found += [(*keys, bucket) for keys, held in zip(listings, left) for bucket in sorted(wanted[keys] - held)]
        return found

    own: list[tuple] = []
    pairs: dict[tuple[str, str, str, str], set[int]] = {}
    names: dict[tuple[str, str], set[int]] = {}
    indexed = [(s.tenant, s.metric_name, NAME_TAG, s.metric_name, s.series_set_hash) for s in series]
    in_span = functools.partial(store.listings_buckets, "find_series", buckets=span)
    for s, found in zip(series, await _in_parts(in_span, indexed)):
        for bucket in sorted(found):
            own.append((s.tenant, bucket, s.metric_name, NAME_TAG, s.metric_name, s.series_set_hash))
            for key, value in s.tags.items():
                own.append((s.tenant, bucket, s.metric_name, key, value, s.series_set_hash))
                pairs.setdefault((s.tenant, s.metric_name, key, value), set()).update(found)
        if found:
            names.setdefault((s.tenant, s.metric_name), set()).update(found)
    await store.delete_index_rows({bucket_table("series_sets"): own})

    values = await gone("find_series", pairs)  # (tenant, name, key, value, bucket)
    metric_keys: dict[tuple[str, str, str], set[int]] = {}
    tenant_values: dict[tuple[str, str, str], set[int]] = {}
    for tenant, name, key, value, bucket in values:
        metric_keys.setdefault((tenant, name, key), set()).add(bucket)
        tenant_values.setdefault((tenant, key, value), set()).add(bucket)
    await store.delete_index_rows(
        {
            bucket_table("tag_values"): [(t, bucket, name, key, value) for t, name, key, value, bucket in values],
            bucket_table("tag_metrics"): [(t, bucket, key, value, name) for t, name, key, value, bucket in values],
        }
    )
    gone_keys = await gone("list_tag_values", metric_keys)  # (tenant, name, key, bucket)
    gone_tenant_values = await gone("find_metrics_by_tag", tenant_values)  # (tenant, key, value, bucket)
    tenant_keys: dict[tuple[str, str], set[int]] = {}
    for tenant, key, _, bucket in gone_tenant_values:
        tenant_keys.setdefault((tenant, key), set()).add(bucket)
    await store.delete_index_rows(
        {
            bucket_table("tag_keys"): [(t, bucket, name, key) for t, name, key, bucket in gone_keys],
            bucket_table("tenant_tag_values"): [
                (t, bucket, key, value) for t, key, value, bucket in gone_tenant_values
            ],
        }
    )
    gone_tenant_keys = await gone("list_tenant_tag_values", tenant_keys)  # (tenant, key, bucket)
    gone_names = await gone("find_series", {(t, name, NAME_TAG, name): b for (t, name), b in names.items()})
    await store.delete_index_rows(
        {
            bucket_table("tenant_tag_keys"): [(t, bucket, key) for t, key, bucket in gone_tenant_keys],
            bucket_table("metric_names"): [(t, bucket, name) for t, name, _, _, bucket in gone_names],
        }
    )
