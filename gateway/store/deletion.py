"""What deleting samples and series does to the tables, decided once for every driver (docs/operations.rst).

Samples: a block loses the samples in the range (cut_block); a roll-up row goes when its bucket
overlaps the range (the caller recomputes the buckets of slots that still have raw samples);
head rows, exemplars and histograms go by timestamp.

Series: their own rows go (series_set_hashes, series_sets), then the shared index rows that no
series needs any more, level by level (a tag value, then its tag key; a metric's name and its
Prometheus metadata; a Graphite leaf, then each branch above it left without children).
remove_from_index asks the store through the contract's read methods and deletes through the
driver's ``delete_index_rows`` and ``write_path_flags``.
"""

from collections.abc import Sequence

import numpy as np

from gateway.core.model import NAME_TAG, SeriesKey
from gateway.store.blocks import decode_block, encode_block
from gateway.store.index import path_nodes

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


async def remove_from_index(store, series: Sequence[SeriesKey]) -> None:
    """Delete the series' own index rows, then every shared row left without a series."""
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
    unused_names = [name for name in sorted(names) if not await store.find_series(*name, NAME_TAG, name[1])]
    await store.delete_index_rows({"metric_names": unused_names, "metric_metadata": unused_names})
    for tenant, metric_name in sorted(leaves):
        await _drop_path(store, tenant, metric_name)


async def _drop_unused_tags(store, pairs: list[tuple[str, str, str, str]]) -> None:
    gone_values = [pair for pair in pairs if not await store.find_series(*pair)]
    await store.delete_index_rows(
        {
            "tag_values": gone_values,
            "tag_metrics": [(tenant, key, value, name) for tenant, name, key, value in gone_values],
        }
    )
    metric_keys = sorted({(tenant, name, key) for tenant, name, key, _ in gone_values})
    gone_keys = [mk for mk in metric_keys if not await store.list_tag_values(*mk)]
    tenant_values = sorted({(tenant, key, value) for tenant, _, key, value in gone_values})
    gone_tenant_values = [tv for tv in tenant_values if not await store.find_metrics_by_tag(*tv)]
    await store.delete_index_rows({"tag_keys": gone_keys, "tenant_tag_values": gone_tenant_values})
    tenant_keys = sorted({(tenant, key) for tenant, key, _ in gone_tenant_values})
    gone_tenant_keys = [tk for tk in tenant_keys if not await store.list_tenant_tag_values(*tk)]
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
