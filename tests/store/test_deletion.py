"""The store contract's deletes (gateway/store/deletion.py), on every driver: delete_samples cuts a
range out of head rows, blocks, roll-ups, exemplars and histograms (and their roll-ups);
delete_series takes series out of every index and keeps the rows other series still need."""

import time

import numpy as np
import pytest_twisted

from gateway.core import samples
from gateway.core.model import NAME_TAG
from gateway.store.blocks import decode_block, encode_block
from gateway.store.contract import ExemplarRow, HistogramRow, MetricMetadata, PathNode, RawPoint, Rollup, time_slot
from tests.store.test_contract import series

HOUR = 3_600_000
MINUTE = 60_000


def recent_slot(store) -> int:
    """A slot that ended a few hours ago: inside every retention of the default layout."""
    now = int(time.time() * 1000)
    return time_slot(now, store.layout.slot_width_ms) - 3 * HOUR


@pytest_twisted.ensureDeferred
async def test_delete_samples_cuts_every_table(store, tenant):
    slot = recent_slot(store)
    kept, other = series(tenant, "cut", {"k": "a"}), series(tenant, "cut", {"k": "b"})
    await store.write_series([kept, other])
    block_ts = np.arange(slot, slot + HOUR, MINUTE, dtype=np.int64)
    head_ts = [slot + HOUR + m * MINUTE for m in range(60)]
    for key in (kept, other):
        h = key.series_set_hash
        await store.write_block(
            tenant, h, slot, encode_block(block_ts, block_ts / 1000.0), samples.empty(), slot + 2 * HOUR
        )
        await store.write_raw([RawPoint(tenant, h, ts, 1.0) for ts in head_ts])
        await store.write_exemplars([ExemplarRow(tenant, h, ts, 2.0, {"trace": "t"}) for ts in head_ts[::10]])
        await store.write_histograms([HistogramRow(tenant, h, ts, b"\x08\x01") for ts in head_ts[::10]])
        for granularity in store.layout.granularities:
            starts = range(slot, slot + 2 * HOUR, granularity.width_ms)
            await store.write_rollups(granularity, [Rollup(tenant, h, ts, 1.0, 2.0, 3.0, 4) for ts in starts])
            await store.write_histogram_rollups(
                granularity, [HistogramRow(tenant, h, ts, b"\x08\x02") for ts in starts]
            )
    start, end = slot + 30 * MINUTE, slot + HOUR + 29 * MINUTE + 1
    await store.delete_samples(tenant, [kept.series_set_hash], start, end)

    (cut, untouched) = await store.read_raw(
        tenant, [kept.series_set_hash, other.series_set_hash], slot, slot + 2 * HOUR
    )
    (block,) = cut.blocks
    assert decode_block(block)[0].tolist() == block_ts[:30].tolist()
    assert cut.head.timestamps.tolist() == head_ts[30:]
    assert len(untouched.head) == 60 and decode_block(untouched.blocks[0])[0].tolist() == block_ts.tolist()
    exemplars, others = await store.read_exemplars(tenant, [kept.series_set_hash, other.series_set_hash], 0, end + HOUR)
    assert [e.timestamp_ms for e in exemplars] == head_ts[30::10] and len(others) == 6
    histograms, others = await store.read_histograms(
        tenant, [kept.series_set_hash, other.series_set_hash], 0, end + HOUR
    )
    assert [h.timestamp_ms for h in histograms] == head_ts[30::10] and len(others) == 6
    for granularity in store.layout.granularities:
        width = granularity.width_ms
        rows = await store.read_rollups(granularity, tenant, kept.series_set_hash, slot, slot + 2 * HOUR)
        expected = [ts for ts in range(slot, slot + 2 * HOUR, width) if ts + width <= start or ts > end]
        assert [r.timestamp_ms for r in rows] == expected
        (rows,) = await store.read_histogram_rollups(granularity, tenant, [kept.series_set_hash], slot, slot + 2 * HOUR)
        assert [r.timestamp_ms for r in rows] == expected
        assert len(await store.read_rollups(granularity, tenant, other.series_set_hash, slot, slot + 2 * HOUR))

    await store.delete_samples(tenant, [kept.series_set_hash], 0, slot + 3 * HOUR)
    (gone,) = await store.read_raw(tenant, [kept.series_set_hash], slot, slot + 2 * HOUR)
    assert gone.blocks == [] and len(gone.head) == 0


@pytest_twisted.ensureDeferred
async def test_delete_series_keeps_what_other_series_need(store, tenant):
    gone_tagged = series(tenant, "cpu", {"host": "a", "dc": "x"})
    kept_tagged = series(tenant, "cpu", {"host": "b"})
    lone = series(tenant, "mem", {"host": "a"})
    leaf_and_branch, below, sibling = series(tenant, "a.b", {}), series(tenant, "a.b.c", {}), series(tenant, "a.x", {})
    everything = [gone_tagged, kept_tagged, lone, leaf_and_branch, below, sibling]
    await store.write_series(everything)
    await store.write_metric_metadata([MetricMetadata(tenant, "mem", "gauge", "help", "")])

    await store.delete_series([gone_tagged, lone, below])
    found = await store.get_series(tenant, [s.series_set_hash for s in everything])
    assert sorted(found) == sorted(s.series_set_hash for s in (kept_tagged, leaf_and_branch, sibling))
    assert await store.list_metric_names(tenant) == ["a.b", "a.x", "cpu"]
    assert await store.get_metric_metadata(tenant, "mem") is None
    assert await store.list_tag_keys(tenant, "cpu") == ["host"]
    assert await store.list_tag_values(tenant, "cpu", "host") == ["b"]
    assert await store.find_series(tenant, "cpu", NAME_TAG, "cpu") == {kept_tagged.series_set_hash}
    assert await store.list_tenant_tag_keys(tenant) == ["host"]
    assert await store.list_tenant_tag_values(tenant, "host") == ["b"]
    assert await store.find_metrics_by_tag(tenant, "host", "a") == []
    assert await store.list_path_children(tenant, "a") == [PathNode("b", True, False), PathNode("x", True, False)]
    assert await store.list_path_children(tenant, "a.b") == []

    await store.delete_series([leaf_and_branch, sibling])
    assert await store.list_path_children(tenant, "") == []
    await store.write_series([below])  # a series written again is found again
    assert await store.list_path_children(tenant, "a.b") == [PathNode("c", True, False)]
