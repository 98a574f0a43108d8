"""The store contract: every driver must pass this same suite."""

import json
import math
import sqlite3
import struct
import time

import numpy as np
import pytest
import pytest_twisted
from prometheus_client import REGISTRY
from twisted.internet import reactor
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from gateway.core import samples
from gateway.core.layout import Layout
from gateway.core.model import SeriesKey, series_set_hash, series_set_text
from gateway.store.blocks import decode_block, encode_block
from gateway.store.calls import StoreCalls
from gateway.store.cassandra import CassandraStore
from gateway.store.contract import (
    CONTRACT_METHODS,
    CreatedTimestamp,
    ExemplarRow,
    HistogramRow,
    MetricMetadata,
    PathNode,
    PendingSet,
    RawPoint,
    Rollup,
    SealedBlock,
    holds_samples,
    time_slot,
    time_slots,
)
from gateway.store.read_path import ReadPath
from gateway.store.sqlite import SQLiteStore
from tests.conftest import read_blocks, read_head

HOUR = 3_600_000
STALE_NAN_BITS = 0x7FF0000000000002


def series(tenant, metric, tags):
    return SeriesKey(tenant, series_set_hash(series_set_text(metric, tags)), metric, tags)


def points(found) -> list[tuple[int, float]]:
    return found.points()


def bits(value: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", value))[0]


def test_time_slots_cover_an_inclusive_range():
    assert time_slot(-1, HOUR) == -HOUR
    assert time_slot(HOUR, HOUR) == HOUR
    assert list(time_slots(HOUR - 1, HOUR, HOUR)) == [0, HOUR]
    assert list(time_slots(HOUR, HOUR, HOUR)) == [HOUR]


def wal_frames(path) -> int:
    """Frames in a SQLite WAL file: one per page a commit wrote (a 32-byte header, 24 bytes a frame)."""
    size = path.with_name(path.name + "-wal").stat().st_size
    return (size - 32) // (4096 + 24) if size else 0


async def recorded_aggregators(store, tenant: str, metric_name: str) -> list[str]:
    """metric_names.aggregators as cqlsh or sqlite3 shows it."""
    if isinstance(store, CassandraStore):
        query = f"SELECT aggregators FROM {store.keyspace}.metric_names WHERE tenant = %s AND metric_name = %s"
        rows = list(await deferToThread(store.session.execute, query, (tenant, metric_name)))
        return sorted(rows[0].aggregators or ()) if rows else []
    with sqlite3.connect(store.path) as connection:
        row = connection.execute(
            "SELECT aggregators FROM metric_names WHERE tenant=? AND metric_name=?", (tenant, metric_name)
        ).fetchone()
    return sorted(json.loads(row[0])) if row else []


class TestLifecycle:
    """Opening the store, its health and identity (contract.Lifecycle)."""

    @pytest_twisted.ensureDeferred
    async def test_ping(self, store):
        await store.ping()

    @pytest_twisted.ensureDeferred
    async def test_identity_is_stable(self, store):
        """The prefix of the store's Redis keys: the same on every call (and every replica)."""
        identity = await store.identity()
        assert identity and identity == await store.identity()
        assert set(identity) <= set("abcdefghijklmnopqrstuvwxyz0123456789_:-")


def store_calls_counted(operation: str) -> tuple[float, float]:
    """How many calls of an operation were metered so far: (done, failed)."""
    done = REGISTRY.get_sample_value("tsgate_store_operation_duration_seconds_count", {"operation": operation})
    failed = REGISTRY.get_sample_value("tsgate_store_errors_total", {"operation": operation})
    return done or 0.0, failed or 0.0


class TestStoreCalls:
    """Every store call goes through the store's StoreCalls: metered per operation and bounded
    (gateway/store/calls.py)."""

    # a constructor, and the blocking `tsgate schema apply` and `tsgate schema expire-old-index`
    NOT_CALLS = {"from_url", "apply_schema", "expire_old_index"}

    def test_every_public_method_of_every_driver_is_a_store_call(self):
        for driver in (SQLiteStore, CassandraStore):
            public = {name for name in dir(driver) if not name.startswith("_") and callable(getattr(driver, name))}
            assert public - self.NOT_CALLS == set(CONTRACT_METHODS), driver
            for name in CONTRACT_METHODS:
                assert getattr(driver, name).store_operation == name, (driver, name)

    @pytest_twisted.ensureDeferred
    async def test_calls_are_metered_by_operation_and_at_most_the_bound_run_at_once(self, store, tenant):
        await store.write_series([series(tenant, f"bound.n{i}", {}) for i in range(20)])
        store.calls = StoreCalls(3)
        before = store_calls_counted("list_path_children")
        reads = [store.list_path_children(tenant, "bound") for _ in range(20)]
        assert store.calls.in_flight == 3
        assert all(len(nodes) == 20 for nodes in await gatherResults(reads))
        assert store.calls.peak == 3 and store.calls.in_flight == 0
        assert store_calls_counted("list_path_children") == (before[0] + 20, before[1])
        before = store_calls_counted("delete_index_rows")
        with pytest.raises(KeyError):
            await store.delete_index_rows({"no_such_table": [(tenant,)]})
        assert store_calls_counted("delete_index_rows") == (before[0], before[1] + 1)
        assert store.calls.in_flight == 0

    @pytest_twisted.ensureDeferred
    async def test_a_health_check_answers_while_the_bound_is_full(self, store, tenant):
        store.calls = StoreCalls(1)
        held: Deferred = Deferred()
        store.calls.run("held", lambda: held)
        waiting = store.list_tenants()
        before = store_calls_counted("ping")
        await store.ping().addTimeout(30, reactor)  # a bounded ping would wait for ``held``
        assert store_calls_counted("ping") == (before[0] + 1, before[1])
        assert not waiting.called and store.calls.in_flight == 1
        held.callback(None)
        assert isinstance(await waiting, list) and store.calls.in_flight == 0

    @pytest_twisted.ensureDeferred
    async def test_composite_calls_finish_with_a_bound_of_one(self, store, tenant):
        """delete_series and write_blocks are made of other store calls: they hold no slot while
        their parts wait for one (a deadlock at any bound, with enough of them at once)."""
        store.calls = StoreCalls(1)
        key = series(tenant, "composite", {"a": "b"})
        await store.write_series([key])
        block = encode_block(np.array([1, 2]), np.array([1.0, 2.0]))
        await store.write_blocks([SealedBlock(tenant, key.series_set_hash, 0, block, samples.empty(), 0)])
        await store.write_block(tenant, key.series_set_hash, 0, block, samples.empty(), 0)
        await store.delete_series([key])
        assert await store.get_series(tenant, [key.series_set_hash]) == {}
        assert store.calls.peak == 1


class TestIndex:
    """The series index: metadata, tag and Graphite path indexes (contract.IndexStore)."""

    @pytest_twisted.ensureDeferred
    async def test_metadata_tables(self, store, tenant):
        a = series(tenant, "cpu", {"host": "a", "os": "linux"})
        b = series(tenant, "cpu", {"host": "b", "os": "linux"})
        c = series(tenant, "mem", {"host": "a"})
        await store.write_series([a, b, c])
        assert tenant in await store.list_tenants()
        assert await store.list_metric_names(tenant) == ["cpu", "mem"]
        assert await store.list_tag_keys(tenant, "cpu") == ["host", "os"]
        assert await store.list_tag_values(tenant, "cpu", "host") == ["a", "b"]
        assert await store.list_tag_values(tenant, "cpu", "nope") == []
        assert await store.find_series(tenant, "cpu", "os", "linux") == {a.series_set_hash, b.series_set_hash}
        assert await store.find_series(tenant, "cpu", "host", "a") == {a.series_set_hash}
        assert await store.find_series(tenant, "cpu", "__name__", "cpu") == {a.series_set_hash, b.series_set_hash}
        assert await store.find_series(tenant, "mem", "host", "b") == set()
        found = await store.get_series(tenant, [a.series_set_hash, c.series_set_hash, "unknown"])
        assert found == {a.series_set_hash: a, c.series_set_hash: c}

    @pytest_twisted.ensureDeferred
    async def test_metadata_writes_are_idempotent(self, store, tenant):
        a = series(tenant, "cpu", {"host": "a"})
        await store.write_series([a, a])
        await store.write_series([a])
        assert await store.list_metric_names(tenant) == ["cpu"]
        assert await store.find_series(tenant, "cpu", "host", "a") == {a.series_set_hash}

    @pytest_twisted.ensureDeferred
    async def test_awkward_names_round_trip(self, store, tenant):
        tags = {"k,=\\": "v,=\\ ünïcødé", "empty-looking": " "}
        s = series(tenant, "we,ird=name\\", tags)
        await store.write_series([s])
        assert await store.get_series(tenant, [s.series_set_hash]) == {s.series_set_hash: s}
        assert await store.list_tag_keys(tenant, "we,ird=name\\") == sorted(tags)

    @pytest_twisted.ensureDeferred
    async def test_utf8_names_as_prometheus_3_writes_them(self, store, tenant):
        """Metric and label names need not be [a-zA-Z_:] identifiers: dotted OpenTelemetry names
        and any other UTF-8 are stored, listed and found as written by every index, metadata and
        exemplar query (docs/prometheus.rst, UTF-8 names)."""
        name, tags = "http.server.request.duration", {"service.name": "api", "k8s.pod.name": "p-1", "wörk é": "ja"}
        s = series(tenant, name, tags)
        await store.write_series([s])
        assert await store.get_series(tenant, [s.series_set_hash]) == {s.series_set_hash: s}
        assert await store.list_metric_names(tenant) == [name]
        assert await store.list_tag_keys(tenant, name) == sorted(tags)
        assert await store.list_tenant_tag_keys(tenant) == sorted(tags)
        assert await store.list_tag_values(tenant, name, "k8s.pod.name") == ["p-1"]
        assert await store.list_tenant_tag_values(tenant, "wörk é") == ["ja"]
        assert await store.find_series(tenant, name, "service.name", "api") == {s.series_set_hash}
        assert await store.find_series(tenant, name, "__name__", name) == {s.series_set_hash}
        assert list(await store.find_metrics_by_tag(tenant, "k8s.pod.name", "p-1")) == [name]
        await store.write_metric_metadata([MetricMetadata(tenant, name, "histogram", "Duration.", "s")])
        assert await store.get_metric_metadata(tenant, name) == MetricMetadata(
            tenant, name, "histogram", "Duration.", "s"
        )
        now = int(time.time() * 1000)
        await store.write_exemplars([ExemplarRow(tenant, s.series_set_hash, now, 0.5, {"trace.id": "abc"})])
        [rows] = await store.read_exemplars(tenant, [s.series_set_hash], now - 1, now + 1)
        assert [row.labels for row in rows] == [{"trace.id": "abc"}]

    @pytest_twisted.ensureDeferred
    async def test_get_series_with_many_hashes(self, store, tenant):
        many = [series(tenant, "m", {"i": str(i)}) for i in range(1200)]
        await store.write_series(many)
        found = await store.get_series(tenant, [s.series_set_hash for s in many])
        assert len(found) == 1200

    @pytest_twisted.ensureDeferred
    async def test_tenants_are_isolated(self, store, tenant):
        other = tenant + "-other"
        a = series(tenant, "cpu", {"host": "a"})
        await store.write_series([a])
        await store.write_raw([RawPoint(tenant, a.series_set_hash, 1000, 1.0)])
        assert await store.list_metric_names(other) == []
        assert await store.find_series(other, "cpu", "host", "a") == set()
        assert await store.get_series(other, [a.series_set_hash]) == {}
        assert points(await read_head(store, other, a.series_set_hash, 0, 2000)) == []
        await store.write_block(
            tenant, a.series_set_hash, 0, encode_block(np.array([1000]), np.array([1.0])), samples.empty(), 0
        )
        assert await read_blocks(store, other, a.series_set_hash, 0, 2000) == []

    @pytest_twisted.ensureDeferred
    async def test_graphite_path_tree(self, store, tenant):
        await store.write_series(
            [
                series(tenant, "a.b.c", {}),
                series(tenant, "a.b", {}),
                series(tenant, "a.x.c", {}),
                series(tenant, "tagged.m", {"k": "v"}),
            ]
        )
        assert await store.list_path_children(tenant, "") == [PathNode("a", False, True)]
        assert await store.list_path_children(tenant, "a") == [PathNode("b", True, True), PathNode("x", False, True)]
        assert await store.list_path_children(tenant, "a.b") == [PathNode("c", True, False)]
        assert await store.list_path_children(tenant, "tagged") == []
        assert await store.list_path_children(tenant + "-other", "") == []

    @pytest_twisted.ensureDeferred
    async def test_tenant_wide_tag_index(self, store, tenant):
        await store.write_series(
            [
                series(tenant, "cpu", {"host": "a", "dc": "x"}),
                series(tenant, "mem", {"host": "a"}),
                series(tenant, "mem", {"host": "b"}),
            ]
        )
        assert await store.list_tenant_tag_keys(tenant) == ["dc", "host"]
        assert await store.list_tenant_tag_values(tenant, "host") == ["a", "b"]
        assert await store.find_metrics_by_tag(tenant, "host", "a") == ["cpu", "mem"]
        assert await store.find_metrics_by_tag(tenant, "host", "b") == ["mem"]
        assert await store.list_tenant_tag_keys(tenant + "-other") == []


class TestSamples:
    """Head rows, blocks and roll-ups (contract.SampleStore)."""

    @pytest_twisted.ensureDeferred
    async def test_raw_data_in_time_order_across_slots(self, store, tenant):
        h = series(tenant, "cpu", {}).series_set_hash
        timestamps = [5 * HOUR + 1, HOUR - 1, HOUR, 3 * HOUR, 0, -1]
        await store.write_raw([RawPoint(tenant, h, ts, float(ts)) for ts in timestamps])
        everything = await read_head(store, tenant, h, -HOUR, 6 * HOUR)
        assert everything.timestamps.dtype == np.int64 and everything.values.dtype == np.float64
        assert points(everything) == [(ts, float(ts)) for ts in sorted(timestamps)]
        assert points(await read_head(store, tenant, h, HOUR - 1, 3 * HOUR)) == [
            (HOUR - 1, HOUR - 1.0),
            (HOUR, float(HOUR)),
            (3 * HOUR, 3.0 * HOUR),
        ]
        assert points(await read_head(store, tenant, h, 3 * HOUR + 1, 5 * HOUR)) == []
        assert points(await read_head(store, tenant, h, 10, 5)) == []

    @pytest_twisted.ensureDeferred
    async def test_raw_upsert_keeps_the_last_value(self, store, tenant):
        h = series(tenant, "cpu", {}).series_set_hash
        await store.write_raw([RawPoint(tenant, h, 1000, 1.0)])
        await store.write_raw([RawPoint(tenant, h, 1000, 2.0)])
        assert points(await read_head(store, tenant, h, 0, 2000)) == [(1000, 2.0)]

    @pytest_twisted.ensureDeferred
    async def test_special_values_survive_bit_exact(self, store, tenant):
        h = series(tenant, "cpu", {}).series_set_hash
        stale = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]
        values = [math.nan, stale, math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308]
        await store.write_raw([RawPoint(tenant, h, i, v) for i, v in enumerate(values)])
        stored = await read_head(store, tenant, h, 0, len(values))
        assert [bits(v) for _, v in points(stored)] == [bits(v) for v in values]
        await store.write_block(tenant, h, 0, encode_block(stored.timestamps, stored.values), stored, 0)
        (block,) = await read_blocks(store, tenant, h, 0, len(values))
        timestamps, sealed = decode_block(block)
        assert timestamps.tolist() == list(range(len(values)))
        assert [bits(v) for v in sealed.tolist()] == [bits(v) for v in values]

    @pytest_twisted.ensureDeferred
    async def test_read_raw_of_many_series_keeps_their_order(self, store, tenant):
        """Over 64 series (more than one Cassandra request's worth), sealed or not, some unknown."""
        hashes = [f"many{i:03d}" for i in range(150)]
        await store.write_raw([RawPoint(tenant, h, 1000 + i, float(i)) for i, h in enumerate(hashes)])
        for h in hashes[::3]:
            await store.write_block(tenant, h, 0, encode_block(np.array([5]), np.array([-1.0])), samples.empty(), 0)
        asked = ["unknown", *reversed(hashes)]
        found = await store.read_raw(tenant, asked, 0, HOUR - 1)
        assert [f.head.points()[-1:] for f in found] == [[]] + [[(1000 + i, float(i))] for i in reversed(range(150))]
        assert [len(f.blocks) for f in found] == [0] + [int(i % 3 == 0) for i in reversed(range(150))]
        stacked = await store.read_raw_stacked(tenant, asked, 0, HOUR - 1)
        assert [part.points() for part in stacked.head.split()] == [f.head.points() for f in found]
        assert stacked.blocks == {h: f.blocks for h, f in zip(asked, found) if f.blocks}

    @pytest_twisted.ensureDeferred
    async def test_blocks_by_slot(self, store, tenant):
        h = series(tenant, "cpu", {}).series_set_hash
        week = store.layout.block_partition_width_ms
        slots = [-HOUR, 0, 2 * HOUR, week - HOUR, week, 3 * week]
        for slot in slots:
            await store.write_block(
                tenant, h, slot, encode_block(np.array([slot + 5]), np.array([float(slot)])), samples.empty(), 0
            )

        def firsts(blocks):
            return [int(decode_block(b)[0][0]) - 5 for b in blocks]

        assert firsts(await read_blocks(store, tenant, h, -HOUR, 4 * week)) == slots
        assert firsts(await read_blocks(store, tenant, h, 1, week)) == [0, 2 * HOUR, week - HOUR, week]
        assert firsts(await read_blocks(store, tenant, h, week + HOUR, 3 * week - 1)) == []
        assert await read_blocks(store, tenant, h, 10, 5) == []
        await store.write_block(tenant, h, 0, encode_block(np.array([7, 8]), np.array([1.0, 2.0])), samples.empty(), 0)
        (replaced,) = await read_blocks(store, tenant, h, 0, 0)
        assert decode_block(replaced)[0].tolist() == [7, 8]

    @pytest_twisted.ensureDeferred
    async def test_read_path_stitches_blocks_and_head(self, store, tenant):
        """A head row written after its slot was sealed wins over the block's sample of the same
        timestamp; sealing twice is harmless; a series with nothing reads empty."""
        h = series(tenant, "cpu", {})
        await store.write_raw([RawPoint(tenant, h.series_set_hash, ts, float(ts)) for ts in (10, 20, 30, HOUR + 10)])
        head = await read_head(store, tenant, h.series_set_hash, 0, HOUR - 1)
        head_read = int(time.time() * 1000)
        for _ in range(2):
            await store.write_block(
                tenant, h.series_set_hash, 0, encode_block(head.timestamps, head.values), head, head_read
            )
        await store.write_raw(
            [RawPoint(tenant, h.series_set_hash, 20, -1.0), RawPoint(tenant, h.series_set_hash, 25, 2.5)]
        )
        assert {(20, -1.0), (25, 2.5)} <= set(points(await read_head(store, tenant, h.series_set_hash, 0, HOUR - 1)))
        reader = ReadPath(store)
        stitched, empty = await reader.read_raw([h, series(tenant, "none", {})], 0, 2 * HOUR)
        assert points(stitched) == [(10, 10.0), (20, -1.0), (25, 2.5), (30, 30.0), (HOUR + 10, HOUR + 10.0)]
        assert points(empty) == []
        (inside,) = await reader.read_raw([h], 15, 25)
        assert points(inside) == [(20, -1.0), (25, 2.5)]
        recent = ReadPath(store, clock=lambda: 2 * HOUR)  # the range within the retentions: read's too
        for start, end in ((0, 2 * HOUR), (15, 25), (HOUR, 2 * HOUR), (10, 5)):
            both = [h, series(tenant, "none", {})]
            stacked = await recent.read_stacked(both, start, end)
            expected = [points(found.samples) for found in await recent.read(both, start, end)]
            assert [points(part) for part in stacked.split()] == expected
            assert expected[0] or (start, end) == (10, 5)

    @pytest_twisted.ensureDeferred
    async def test_rollups_upsert_and_read(self, store, tenant):
        five = store.layout.granularity("5m")
        h = series(tenant, "cpu", {}).series_set_hash
        gauge = Rollup(tenant, h, 300_000, min=1.0, max=3.0, sum=4.0, count=2)
        counter = Rollup(tenant, h, 600_000, last=10.0, increase=2.5)
        await store.write_rollups(five, [gauge, counter])
        assert await store.read_rollups(five, tenant, h, 0, 10**9) == [gauge, counter]
        replaced = gauge._replace(max=9.0, sum=13.0, count=3)
        await store.write_rollups(five, [replaced])
        assert await store.read_rollups(five, tenant, h, 300_000, 300_000) == [replaced]
        far = Rollup(tenant, h, five.partition_width_ms * 3 + 300_000, sum=1.0, count=1)
        await store.write_rollups(five, [far])
        assert (await store.read_rollups(five, tenant, h, 0, far.timestamp_ms + HOUR))[-1] == far
        assert await store.read_rollups(store.layout.granularity("1h"), tenant, h, 0, far.timestamp_ms + HOUR) == []

    @pytest_twisted.ensureDeferred
    async def test_many_rollup_rows_in_one_write_read_back_bit_exact(self, store, tenant):
        """A seal group's roll-ups in one write (SQLite inserts them many rows a statement, a
        statement of fewer rows last): every row of every series comes back, NaN and -0.0 bit-exact."""
        five = store.layout.granularity("5m")
        hashes = [f"r{i}" for i in range(25)]
        edges = [math.nan, -0.0, 0.0, math.inf, 1e308]
        rows = [
            Rollup(tenant, h, bucket * 300_000, min=edges[bucket % 5], max=float(i), sum=i + bucket / 8, count=bucket)
            for i, h in enumerate(hashes)
            for bucket in range(12)
        ]
        await store.write_rollups(five, rows)
        found = await gatherResults([store.read_rollups(five, tenant, h, 0, HOUR - 1) for h in hashes])

        def fields(rollups: list) -> list[tuple]:
            return [(r.series_set_hash, r.timestamp_ms, bits(r.min), r.max, r.sum, r.count) for r in rollups]

        assert [row for series in found for row in fields(series)] == fields(rows)


class TestHistograms:
    """Native histograms and their roll-ups (contract.HistogramStore)."""

    @pytest_twisted.ensureDeferred
    async def test_histograms_round_trip_bit_exact_per_series(self, store, tenant):
        """Bytes come back as written; each series gets its own list, oldest first, in the order of
        the hashes asked, over an inclusive range across slots; a rewrite of a timestamp replaces it."""
        a = [
            HistogramRow(tenant, "a", HOUR - 1, bytes(range(256))),
            HistogramRow(tenant, "a", HOUR, b"\x00"),
            HistogramRow(tenant, "a", 3 * HOUR, b""),
        ]
        b = [HistogramRow(tenant, "b", HOUR, b"\x08\x03")]
        await store.write_histograms(list(reversed(a)) + b)
        assert await store.read_histograms(tenant, ["b", "missing", "a"], HOUR - 1, 3 * HOUR) == [b, [], a]
        assert await store.read_histograms(tenant, ["a"], HOUR, 3 * HOUR - 1) == [[a[1]]]
        assert await store.read_histograms(tenant, ["a"], HOUR, HOUR - 1) == [[]]
        await store.write_histograms([HistogramRow(tenant, "a", HOUR, b"\x01")])
        assert await store.read_histograms(tenant, ["a"], HOUR, HOUR) == [[HistogramRow(tenant, "a", HOUR, b"\x01")]]

    @pytest_twisted.ensureDeferred
    async def test_histogram_rollups_per_granularity_across_partitions(self, store, tenant):
        """One row per series and interval start in each granularity's own table; a range reads the
        rows whose starts are in it, across the granularity's partitions (84 h for 5m), oldest first;
        a rewrite of an interval replaces it."""
        fine, coarse = store.layout.granularities
        far = 100 * HOUR
        a = [HistogramRow(tenant, "a", t, bytes([i])) for i, t in enumerate((0, 5 * 60_000, far))]
        b = [HistogramRow(tenant, "b", far, b"\x0a\x00")]
        await store.write_histogram_rollups(fine, list(reversed(a)) + b)
        await store.write_histogram_rollups(coarse, [HistogramRow(tenant, "a", 0, b"hour")])
        assert await store.read_histogram_rollups(fine, tenant, ["b", "missing", "a"], 0, far) == [b, [], a]
        assert await store.read_histogram_rollups(fine, tenant, ["a"], 1, far - 1) == [[a[1]]]
        assert await store.read_histogram_rollups(coarse, tenant, ["a", "b"], 0, far) == [
            [HistogramRow(tenant, "a", 0, b"hour")],
            [],
        ]
        await store.write_histogram_rollups(fine, [HistogramRow(tenant, "a", far, b"again")])
        assert await store.read_histogram_rollups(fine, tenant, ["a"], far, far) == [
            [HistogramRow(tenant, "a", far, b"again")]
        ]
        assert await store.read_histograms(tenant, ["a"], 0, far) == [[]]


class TestSeriesWithData:
    """Which series hold data in a range (contract.SampleStore.series_with_data): what
    /api/v1/series keeps of the series the time index lists."""

    @pytest_twisted.ensureDeferred
    async def test_head_samples_count_within_the_inclusive_range_only(self, store, tenant):
        early = [RawPoint(tenant, "early", ts, 1.0) for ts in range(0, 20 * 60_000 + 1, 60_000)]
        late = [RawPoint(tenant, "late", ts, math.nan) for ts in (50 * 60_000, HOUR + 10)]
        await store.write_raw(early + late)
        asked = ["early", "late", "none"]
        assert await store.series_with_data(tenant, asked, 30 * 60_000, 40 * 60_000) == set()
        assert await store.series_with_data(tenant, asked, 20 * 60_000, 50 * 60_000) == {"early", "late"}
        assert await store.series_with_data(tenant, asked, 20 * 60_000 + 1, 50 * 60_000 - 1) == set()
        assert await store.series_with_data(tenant, asked, HOUR, 2 * HOUR) == {"late"}
        assert await store.series_with_data(tenant, asked, 10, 5) == set()

    @pytest_twisted.ensureDeferred
    @pytest.mark.parametrize("others", [0, 20], ids=["few series", "many others in the slot"])
    async def test_samples_around_a_range_without_one_inside_do_not_count(self, store, tenant, others):
        """Written together (one head chunk a series on a folded store): samples on both sides of
        a range count only where one is inside it, by its first, last or a middle sample; asked
        of a slot of few series (SQLite scans it) or of many (SQLite looks the series up)."""
        minute = 60_000
        gap = [RawPoint(tenant, "gap", ts * minute, 1.0) for ts in (10, 30)]
        middle = [RawPoint(tenant, "middle", ts * minute, 1.0) for ts in (10, 20, 30)]
        crowd = [RawPoint(tenant, f"other {i}", 20 * minute, 1.0) for i in range(others)]
        await store.write_raw(gap + middle + crowd)
        asked = ["gap", "middle"]
        assert await store.series_with_data(tenant, asked, 15 * minute, 25 * minute) == {"middle"}
        assert await store.series_with_data(tenant, asked, 21 * minute, 29 * minute) == set()
        assert await store.series_with_data(tenant, asked, 5 * minute, 10 * minute) == {"gap", "middle"}
        assert await store.series_with_data(tenant, asked, 30 * minute, 40 * minute) == {"gap", "middle"}
        assert await store.series_with_data(tenant, asked, 11 * minute, 19 * minute) == set()

    @pytest_twisted.ensureDeferred
    async def test_a_block_counts_when_its_first_to_last_time_overlaps_the_range(self, store, tenant):
        """Sealed samples, their head rows gone (as after a seal): the block header's times decide."""
        block = encode_block(np.array([10 * 60_000, 20 * 60_000]), np.array([1.0, 2.0]))
        await store.write_block(tenant, "sealed", 0, block, samples.empty(), int(time.time() * 1000))
        assert await store.series_with_data(tenant, ["sealed"], 21 * 60_000, HOUR - 1) == set()
        assert await store.series_with_data(tenant, ["sealed"], 0, 10 * 60_000 - 1) == set()
        assert await store.series_with_data(tenant, ["sealed"], 15 * 60_000, 16 * 60_000) == {"sealed"}
        assert await store.series_with_data(tenant, ["sealed"], 20 * 60_000, 2 * HOUR) == {"sealed"}

    @pytest_twisted.ensureDeferred
    async def test_native_histograms_count(self, store, tenant):
        await store.write_histograms([HistogramRow(tenant, "histogram", HOUR + 5, b"\x08\x01")])
        assert await store.series_with_data(tenant, ["histogram", "none"], HOUR, HOUR + 5) == {"histogram"}
        assert await store.series_with_data(tenant, ["histogram"], HOUR + 6, 2 * HOUR) == set()

    @pytest_twisted.ensureDeferred
    async def test_rollups_count_only_with_their_granularity(self, store, tenant):
        """A series whose data is only rolled up (its raw data expired) has data where its roll-up
        of the granularity asked has a row, floats or histograms."""
        fine, coarse = store.layout.granularities
        await store.write_rollups(fine, [Rollup(tenant, "rolled", 5 * HOUR, sum=1.0, count=1)])
        await store.write_histogram_rollups(coarse, [HistogramRow(tenant, "histogram", 6 * HOUR, b"\x08\x01")])
        asked = ["rolled", "histogram"]
        assert await store.series_with_data(tenant, asked, 0, 10 * HOUR) == set()
        assert await store.series_with_data(tenant, asked, 0, 10 * HOUR, fine) == {"rolled"}
        assert await store.series_with_data(tenant, asked, 0, 10 * HOUR, coarse) == {"histogram"}
        assert await store.series_with_data(tenant, asked, 5 * HOUR + 1, 6 * HOUR - 1, fine) == set()
        # raw=False: the roll-up's rows alone (what a delete asks over a roll-up's retention)
        await store.write_raw([RawPoint(tenant, "raw only", 5 * HOUR, 1.0)])
        with_raw = ["raw only", *asked]
        assert await store.series_with_data(tenant, with_raw, 0, 10 * HOUR, fine) == {"raw only", "rolled"}
        assert await store.series_with_data(tenant, with_raw, 0, 10 * HOUR, fine, raw=False) == {"rolled"}

    @pytest_twisted.ensureDeferred
    async def test_many_series_at_once(self, store, tenant):
        """More series than one request or query asks about (SQLite: 500; Cassandra: 64)."""
        hashes = [f"many{i:04d}" for i in range(600)]
        await store.write_raw([RawPoint(tenant, h, 1000 * (i % 2), float(i)) for i, h in enumerate(hashes)])
        assert await store.series_with_data(tenant, ["none", *hashes], 500, 1500) == set(hashes[1::2])


class TestExemplars:
    """Exemplars (contract.ExemplarStore)."""

    @pytest_twisted.ensureDeferred
    async def test_exemplars_round_trip_bit_exact_per_series(self, store, tenant):
        """Values keep their bits (NaN payloads, -0.0), labels their text; each series gets its own
        list, oldest first, in the order of the hashes asked, over an inclusive range across slots."""
        nan = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]
        a = [
            ExemplarRow(tenant, "a", HOUR - 1, nan, {"trace_id": "t1"}),
            ExemplarRow(tenant, "a", HOUR, -0.0, {"trace_id": "t2", "span_id": "é"}),
            ExemplarRow(tenant, "a", 3 * HOUR, 1.5, {}),
        ]
        b = [ExemplarRow(tenant, "b", HOUR, 2.5, {"trace_id": "t3"})]
        await store.write_exemplars(a + b)
        found = await store.read_exemplars(tenant, ["b", "missing", "a"], HOUR - 1, 3 * HOUR)
        assert found[0] == b and found[1] == []
        assert [(r.timestamp_ms, bits(r.value), r.labels) for r in found[2]] == [
            (r.timestamp_ms, bits(r.value), r.labels) for r in a
        ]
        assert await store.read_exemplars(tenant, ["a"], HOUR, 3 * HOUR - 1) == [[a[1]]]
        assert await store.read_exemplars(tenant, ["a"], HOUR, HOUR - 1) == [[]]

    @pytest_twisted.ensureDeferred
    async def test_exemplar_writes_are_upserts_by_timestamp_and_labels(self, store, tenant):
        await store.write_exemplars([ExemplarRow(tenant, "a", 1000, 1.0, {"trace_id": "x", "a": "b"})])
        await store.write_exemplars([ExemplarRow(tenant, "a", 1000, 2.0, {"a": "b", "trace_id": "x"})])
        await store.write_exemplars([ExemplarRow(tenant, "a", 1000, 3.0, {"trace_id": "y"})])
        (found,) = await store.read_exemplars(tenant, ["a"], 0, 2000)
        assert [(r.value, r.labels) for r in found] == [(2.0, {"a": "b", "trace_id": "x"}), (3.0, {"trace_id": "y"})]

    @pytest_twisted.ensureDeferred
    async def test_a_series_keeps_the_newest_exemplars_of_each_slot(self, store, tenant):
        """--max-exemplars-per-series (100 in LAYOUT) per slot: the newest win, in later writes too."""
        cap = store.layout.max_exemplars_per_series
        first = [ExemplarRow(tenant, "a", HOUR + i, float(i), {"n": str(i)}) for i in range(cap)]
        await store.write_exemplars(first)
        await store.write_exemplars([ExemplarRow(tenant, "a", HOUR + cap + i, float(cap + i), {}) for i in range(5)])
        await store.write_exemplars([ExemplarRow(tenant, "a", 2 * HOUR, 9.0, {})])
        (found,) = await store.read_exemplars(tenant, ["a"], 0, 3 * HOUR)
        assert [r.timestamp_ms for r in found] == [HOUR + i for i in range(5, cap + 5)] + [2 * HOUR]
        (older,) = await store.read_exemplars(tenant, ["a"], HOUR, HOUR + 4)
        assert older == []

    @pytest_twisted.ensureDeferred
    async def test_exemplars_of_many_series_over_many_slots(self, store, tenant):
        """Cassandra reads many series-slots a request: each row still lands with its own series."""
        hashes = [f"s{i:03d}" for i in range(300)]
        await store.write_exemplars(
            [
                ExemplarRow(tenant, h, slot * HOUR + i, float(i), {"slot": str(slot)})
                for i, h in enumerate(hashes)
                for slot in (1, 5)
            ]
        )
        found = await store.read_exemplars(tenant, hashes[::-1], HOUR, 5 * HOUR + 299)
        assert [[(r.series_set_hash, r.timestamp_ms, r.value) for r in rows] for rows in found] == [
            [(h, HOUR + i, float(i)), (h, 5 * HOUR + i, float(i))] for i, h in reversed(list(enumerate(hashes)))
        ]


class TestPending:
    """Pending downsample work (contract.PendingStore)."""

    @pytest_twisted.ensureDeferred
    async def test_pending_sets(self, store, tenant):
        rows = [
            PendingSet(7, HOUR, tenant, "h1"),
            PendingSet(7, 0, tenant, "h2"),
            PendingSet(7, 2 * HOUR, tenant, "h3"),
        ]
        await store.mark_pending(rows, 1000)
        pending = [p for p in await store.list_pending(7, 2 * HOUR) if p.tenant == tenant]
        assert pending == [PendingSet(7, 0, tenant, "h2", 1000), PendingSet(7, HOUR, tenant, "h1", 1000)]
        await store.mark_pending([rows[0]], 2000)
        await store.delete_pending(pending)
        left = [p for p in await store.list_pending(7, 3 * HOUR) if p.tenant == tenant]
        assert left == [PendingSet(7, HOUR, tenant, "h1", 2000), PendingSet(7, 2 * HOUR, tenant, "h3", 1000)]

    @pytest_twisted.ensureDeferred
    async def test_deleting_many_pending_sets_keeps_only_those_touched_again(self, store, tenant):
        """Many rows of a partition go together (Cassandra: conditional batches), and one touched
        again among them stays, with the rest of its batch gone."""
        rows = [PendingSet(partition, 0, tenant, f"h{i}") for partition in (8, 9) for i in range(120)]
        await store.mark_pending(rows, 1000)
        pending = [p for partition in (8, 9) for p in await store.list_pending(partition, HOUR) if p.tenant == tenant]
        assert len(pending) == 240
        await store.mark_pending([rows[70]], 2000)
        await store.delete_pending(pending)
        left = [p for partition in (8, 9) for p in await store.list_pending(partition, HOUR) if p.tenant == tenant]
        assert left == [PendingSet(8, 0, tenant, "h70", 2000)]


class TestMetadata:
    """Metric metadata, aggregators and created timestamps (contract.MetadataStore)."""

    @pytest_twisted.ensureDeferred
    async def test_metric_metadata(self, store, tenant):
        assert await store.get_metric_metadata(tenant, "http_requests_total") is None
        first = MetricMetadata(tenant, "http_requests_total", "counter", "Requests.", "")
        await store.write_metric_metadata([first, MetricMetadata(tenant, "temp", "gauge", "", "celsius")])
        assert await store.get_metric_metadata(tenant, "http_requests_total") == first
        changed = first._replace(help="All requests.")
        await store.write_metric_metadata([changed])
        assert await store.get_metric_metadata(tenant, "http_requests_total") == changed
        assert await store.get_metric_metadata(tenant + "-other", "temp") is None

    @pytest_twisted.ensureDeferred
    async def test_metric_aggregators(self, store, tenant):
        """metric_names.aggregators is for operators (docs/downsampling.rst): read here as they would."""
        await store.write_series([series(tenant, "cpu", {})])
        assert await recorded_aggregators(store, tenant, "cpu") == []
        await store.add_metric_aggregators(tenant, "cpu", ["raw", "min"])
        await store.add_metric_aggregators(tenant, "cpu", ["max", "min"])
        assert await recorded_aggregators(store, tenant, "cpu") == ["max", "min", "raw"]
        assert await store.list_metric_names(tenant) == ["cpu"]

    @pytest_twisted.ensureDeferred
    async def test_created_timestamps_per_series_survive_a_metadata_rewrite(self, store, tenant):
        """The latest created timestamp of each series; writing the series' metadata again (a cache
        miss after a restart) leaves it, and series without one are left out."""
        a, b = SeriesKey(tenant, "ha", "jobs_total", {"job": "a"}), SeriesKey(tenant, "hb", "jobs_total", {"job": "b"})
        await store.write_series([a, b])
        assert await store.get_created_timestamps(tenant, ["ha", "hb", "missing"]) == {}
        await store.write_created_timestamps([CreatedTimestamp(tenant, "ha", 1000)])
        await store.write_created_timestamps([CreatedTimestamp(tenant, "ha", 5000), CreatedTimestamp(tenant, "hb", 7)])
        await store.write_series([a, b])
        assert await store.get_created_timestamps(tenant, ["ha", "hb", "missing"]) == {"ha": 5000, "hb": 7}
        assert await store.get_series(tenant, ["ha"]) == {"ha": a}
        assert await store.get_created_timestamps(tenant + "-other", ["ha"]) == {}


class TestSQLiteDriver:
    """What only the embedded driver does: its sweep, schema upgrade, group commits and head log."""

    @pytest_twisted.ensureDeferred
    async def test_sqlite_sweep_deletes_exemplars_past_their_retention(self, tmp_path, tenant):
        """Cassandra expires them by TTL (test_cassandra.py); SQLite's sweep, by their timestamp."""
        store = SQLiteStore(tmp_path / "sweep.db", Layout(exemplar_retention_ms=2 * HOUR))
        await store.start()
        try:
            await store.write_exemplars([ExemplarRow(tenant, "a", t, 1.0, {}) for t in (HOUR, 2 * HOUR, 3 * HOUR)])
            await store.sweep(4 * HOUR)
            (found,) = await store.read_exemplars(tenant, ["a"], 0, 4 * HOUR)
            assert [r.timestamp_ms for r in found] == [2 * HOUR, 3 * HOUR]
        finally:
            await store.close()

    @pytest_twisted.ensureDeferred
    async def test_sqlite_sweep_deletes_histograms_past_the_raw_retention(self, tmp_path, tenant):
        """Cassandra expires them by TTL (test_cassandra.py); SQLite's sweep, by slot as blocks, and
        their roll-ups past the granularity's retention (14 days for 5m)."""
        store = SQLiteStore(tmp_path / "sweep.db", Layout(raw_retention_ms=2 * HOUR))
        await store.start()
        try:
            await store.write_histograms([HistogramRow(tenant, "a", t, b"h") for t in (HOUR, 2 * HOUR, 3 * HOUR)])
            await store.sweep(4 * HOUR)
            (found,) = await store.read_histograms(tenant, ["a"], 0, 4 * HOUR)
            assert [r.timestamp_ms for r in found] == [2 * HOUR, 3 * HOUR]
            (fine, coarse) = store.layout.granularities
            await store.write_histogram_rollups(
                fine, [HistogramRow(tenant, "a", t, b"r") for t in (0, 20 * 86_400_000)]
            )
            await store.sweep(15 * 86_400_000)
            assert fine.partition_width_ms == 84 * HOUR
            (rollups,) = await store.read_histogram_rollups(fine, tenant, ["a"], 0, 30 * 86_400_000)
            assert [r.timestamp_ms for r in rollups] == [20 * 86_400_000]
        finally:
            await store.close()
        # the index goes with the raw slots; a roll-up partition (84 h) only once all of it is past
        # the retention, so partition 0 stays at 15 days (it could hold rows of day 1 to 3.5)
        with sqlite3.connect(tmp_path / "sweep.db") as connection:
            indexed = connection.execute("SELECT source, time_slot FROM histogram_series ORDER BY source, time_slot")
            assert list(indexed) == [(fine.histogram_table, 0), (fine.histogram_table, 5 * fine.partition_width_ms)]

    @pytest_twisted.ensureDeferred
    async def test_sqlite_file_without_histogram_index_is_indexed_on_open(self, tmp_path, tenant):
        """A file written before histogram_series existed: opening it indexes the histograms and
        roll-ups already there, so reads, which look only at indexed series, still return them."""
        path = tmp_path / "old.db"
        store = SQLiteStore(path, Layout())
        fine = store.layout.granularities[0]
        await store.start()
        try:
            await store.write_histograms([HistogramRow(tenant, "a", HOUR, b"h")])
            await store.write_histogram_rollups(fine, [HistogramRow(tenant, "b", 0, b"r")])
        finally:
            await store.close()
        with sqlite3.connect(path) as connection:
            connection.execute("DROP TABLE histogram_series")
        store = SQLiteStore(path, Layout())
        await store.start()
        try:
            assert await store.read_histograms(tenant, ["a", "b"], 0, 2 * HOUR) == [
                [HistogramRow(tenant, "a", HOUR, b"h")],
                [],
            ]
            assert await store.read_histogram_rollups(fine, tenant, ["a", "b"], 0, HOUR) == [
                [],
                [HistogramRow(tenant, "b", 0, b"r")],
            ]
        finally:
            await store.close()

    @pytest_twisted.ensureDeferred
    async def test_sqlite_writes_arriving_together_share_a_commit_and_fail_alone(self, tmp_path, tenant):
        """Group commit: writes queued while one commits go into one transaction (a page each write
        touches is written once, not once a write); each Deferred fires once its rows are committed
        (another connection reads them), and a write that fails fails alone."""
        path = tmp_path / "group.db"
        store = SQLiteStore(path, Layout())
        await store.start()
        try:
            h = series(tenant, "cpu", {}).series_set_hash
            await store.write_raw([RawPoint(tenant, h, 0, 0.0)])
            before = wal_frames(path)
            for write in [store.write_raw([RawPoint(tenant, h, ts, float(ts))]) for ts in range(1, 21)]:
                await write
            # 20 separate commits would write the table's leaf page 20 times at least
            assert wal_frames(path) - before <= 6
            good, bad, also_good = (
                store.write_raw([RawPoint(tenant, h, 21, 21.0)]),
                store.write_raw([RawPoint(tenant, h, 99, object())]),
                store.write_raw([RawPoint(tenant, h, 22, 22.0)]),
            )
            await good
            await also_good
            try:
                await bad
            except TypeError as error:
                assert "float" in str(error)
            else:
                raise AssertionError("a value SQLite cannot store was acknowledged")
            (stored,) = await store.read_raw(tenant, [h], 0, 100)
            assert stored.head.timestamps.tolist() == list(range(23))
        finally:
            await store.close()

    @pytest_twisted.ensureDeferred
    async def test_sqlite_head_log_and_chunks_keep_the_last_write(self, tmp_path, tenant):
        """SQLite's head: rows go to head batches, folded into chunks once they hold fold_rows
        rows. The last write of a timestamp wins across chunks and the log; sealing removes from the
        head only the samples the block holds with the same value (not a rewrite that came after the
        read it sealed, and no older write of a sealed timestamp comes back); deleting samples cuts
        chunks."""
        store = SQLiteStore(tmp_path / "head.db", Layout(), fold_rows=3)
        await store.start()
        h = series(tenant, "cpu", {}).series_set_hash
        try:
            await store.write_raw([RawPoint(tenant, h, ts, 1.0) for ts in (10, 20, 30)])  # folded: chunk 1
            await store.write_raw([RawPoint(tenant, h, 10, 2.0), RawPoint(tenant, h, HOUR + 5, 9.0)])  # in the log
            with sqlite3.connect(tmp_path / "head.db") as reader:
                assert reader.execute("SELECT count(*) FROM head_chunks").fetchone()[0] == 1
                assert reader.execute("SELECT sum(samples) FROM head_batches").fetchone()[0] == 2
            assert points(await read_head(store, tenant, h, 0, 2 * HOUR)) == [
                (10, 2.0),
                (20, 1.0),
                (30, 1.0),
                (HOUR + 5, 9.0),
            ]
            await store.write_raw([RawPoint(tenant, h, 20, 3.0)])  # the log reaches 3 rows: chunk 2
            sealed_read = await read_head(store, tenant, h, 0, HOUR - 1)
            assert points(sealed_read) == [(10, 2.0), (20, 3.0), (30, 1.0)]
            await store.write_raw([RawPoint(tenant, h, 30, 4.0)])  # after the seal's read
            block = encode_block(sealed_read.timestamps, sealed_read.values)
            await store.write_block(tenant, h, 0, block, sealed_read, 0)
            assert points(await read_head(store, tenant, h, 0, HOUR - 1)) == [(30, 4.0)]
            (stitched,) = await ReadPath(store).read_raw([series(tenant, "cpu", {})], 0, 2 * HOUR)
            assert points(stitched) == [(10, 2.0), (20, 3.0), (30, 4.0), (HOUR + 5, 9.0)]
            await store.delete_samples(tenant, [h], 25, HOUR + 5)
            assert points(await read_head(store, tenant, h, 0, 2 * HOUR)) == []
            with sqlite3.connect(tmp_path / "head.db") as reader:
                assert reader.execute("SELECT count(*) FROM head_chunks").fetchone()[0] == 0
                assert reader.execute("SELECT count(*) FROM head_batches").fetchone()[0] == 0
        finally:
            await store.close()

    @pytest_twisted.ensureDeferred
    async def test_sqlite_head_batches_fold_samples_out_of_order_and_rewritten(self, tmp_path, tenant):
        """A fold of several batches of two tenants: samples of a series that arrived out of order,
        or rewrote a timestamp, or crossed a slot, become chunks in timestamp order where the last
        write wins (bit for bit, NaN and -0.0 included), before and after the fold."""
        path = tmp_path / "fold.db"
        store = SQLiteStore(path, Layout(), fold_rows=1000)
        await store.start()
        stale = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
        writes = [
            [RawPoint(tenant, "a", 30, 1.0), RawPoint(tenant, "b", 5, 1.0), RawPoint(tenant, "a", 10, 1.0)],
            [RawPoint(tenant, "a", 10, 2.0), RawPoint("other", "a", 10, 7.0), RawPoint(tenant, "a", 20, -0.0)],
            [RawPoint(tenant, "a", 30, stale), RawPoint(tenant, "a", HOUR + 1, 4.0), RawPoint(tenant, "b", 5, 3.0)],
        ]
        expected = {
            (tenant, "a"): [(10, 2.0), (20, -0.0), (30, stale), (HOUR + 1, 4.0)],
            (tenant, "b"): [(5, 3.0)],
            ("other", "a"): [(10, 7.0)],
        }

        async def stored() -> dict:
            found = {}
            for key in expected:
                (raw,) = await store.read_raw(key[0], [key[1]], 0, 2 * HOUR)
                found[key] = [(ts, struct.pack("<d", v)) for ts, v in raw.head.points()]
            return found

        bits = {key: [(ts, struct.pack("<d", v)) for ts, v in rows] for key, rows in expected.items()}
        try:
            await gatherResults([store.write_raw(write) for write in writes])
            assert await stored() == bits
            store._fold()
            while sqlite3.connect(path).execute("SELECT count(*) FROM head_batches").fetchone()[0]:
                await deferLater(reactor, 0.02)
            with sqlite3.connect(path) as reader:
                chunks = reader.execute("SELECT timestamps FROM head_chunks").fetchall()
            assert len(chunks) == 4  # a chunk a series-slot, its timestamps ascending and distinct
            assert all(np.all(np.diff(np.frombuffer(blob, dtype="<i8")) > 0) for (blob,) in chunks)
            assert await stored() == bits
        finally:
            await store.close()

    @pytest.mark.parametrize(
        "hashes",
        [
            [series_set_hash(f"s{n}") for n in range(7)],  # the gateway's own: batches looked up as arrays
            [f"s{n}" for n in range(7)],
            ["a" * 23, "b" * 25, *(series_set_hash(f"s{n}") for n in range(5))],  # widths summing as 24s do
            # first 8 bytes shared: read together through the dict, alone through the array search,
            # which must not take a neighbour with the same first 8 bytes for the series read
            [
                *("AAAAAAAA" + series_set_hash(f"s{n}")[8:] for n in range(3)),
                *(series_set_hash(f"s{n}") for n in range(3, 7)),
            ],
        ],
        ids=["series-set-hashes", "short", "mixed-widths", "shared-prefixes"],
    )
    @pytest_twisted.ensureDeferred
    async def test_sqlite_head_read_of_many_series_at_once_is_each_series_read_alone(self, tmp_path, tenant, hashes):
        """One read of many series (chunks of several slots and seqs, batches not folded yet,
        timestamps rewritten in each) gives each series what reading it alone gives, and what was
        written last of each timestamp within the range: the arrays of all the series are merged
        at once, so one series' samples must never leak into its neighbour's."""
        path = tmp_path / "many.db"
        store = SQLiteStore(path, Layout(), fold_rows=1000)
        await store.start()
        expected: dict[str, dict[int, float]] = {h: {} for h in hashes}

        async def write(round_: int) -> None:
            points = []
            for n, h in enumerate(hashes[:-1]):  # the last series is never written
                for ts in range(n % 3, 3 * HOUR, HOUR // 2 + 7 * n):
                    value = float(round_ * 100 + n)
                    points.append(RawPoint(tenant, h, ts, value))
                    expected[h][ts] = value
            await store.write_raw(points[::-1] if round_ % 2 else points)

        async def folded() -> None:
            store._fold()
            while sqlite3.connect(path).execute("SELECT count(*) FROM head_batches").fetchone()[0]:
                await deferLater(reactor, 0.02)

        try:
            for round_ in range(3):
                await write(round_)
                if round_ < 2:
                    await folded()
            start, end = HOUR // 3, 5 * HOUR // 2
            together = await store.read_raw(tenant, hashes, start, end)
            for h, raw in zip(hashes, together):
                (alone,) = await store.read_raw(tenant, [h], start, end)
                assert raw.head.points() == alone.head.points()
                assert raw.head.points() == sorted((ts, v) for ts, v in expected[h].items() if start <= ts <= end)
                assert raw.head_keys == alone.head_keys
            assert together[-1].head.points() == [] and together[-1].head_keys == ()
            wide = [h for h in hashes if len(h) == len(series_set_hash(""))]
            for h, raw in zip(wide, await store.read_raw(tenant, wide, start, end)):
                assert raw.head.points() == sorted((ts, v) for ts, v in expected[h].items() if start <= ts <= end)
            assert len({key for raw in together for key in raw.head_keys}) > 2  # chunks of several slots and folds
        finally:
            await store.close()

    @pytest_twisted.ensureDeferred
    async def test_sqlite_series_with_data_finds_samples_in_chunks_and_log_alike(self, tmp_path, tenant):
        """series_with_data looks at the head chunks' timestamps first, then reads the rest whole:
        over every range it gives the series whose read_raw holds a sample there, whether that
        sample is in a chunk (folded), still in the log, in both, or rewritten."""
        path = tmp_path / "with-data.db"
        store = SQLiteStore(path, Layout(), fold_rows=1000)
        await store.start()
        hashes = [series_set_hash(f"s{n}") for n in range(6)]
        try:
            # s0-s3 folded into chunks (s3 across two slots), then s2, s4 and s3 again in the log; s5 never written
            await store.write_raw(
                [RawPoint(tenant, hashes[n], ts, float(n)) for n, ts in ((0, 10), (1, 20 * 60_000), (2, 50), (3, 30))]
                + [RawPoint(tenant, hashes[3], HOUR + 30, 1.0)]
            )
            store._fold()
            while sqlite3.connect(path).execute("SELECT count(*) FROM head_batches").fetchone()[0]:
                await deferLater(reactor, 0.02)
            await store.write_raw([RawPoint(tenant, hashes[n], ts, 9.0) for n, ts in ((2, 70), (4, 40), (3, 30))])
            for start, end in [(0, HOUR), (10, 10), (11, 49), (31, HOUR + 29), (40, 70), (HOUR, 2 * HOUR), (5, 4)]:
                raw = await store.read_raw(tenant, hashes, start, end)
                expected = {h for h, data in zip(hashes, raw) if holds_samples(data, start, end)}
                assert await store.series_with_data(tenant, hashes, start, end) == expected, (start, end)
            assert await store.series_with_data(tenant, hashes, 31, HOUR + 29) == {hashes[1], hashes[2], hashes[4]}
        finally:
            await store.close()

    @pytest_twisted.ensureDeferred
    async def test_sqlite_block_write_keeps_only_head_samples_the_block_does_not_hold(self, tmp_path, tenant):
        """A group's block write drops the chunks of each series-slot whose every sample its block
        sealed bit for bit, and keeps in the head what was written after the seal read its head:
        a timestamp rewritten with another value (-0.0 for 0.0 too) and a new late sample. Folds
        lay chunks out in hash order (a seal group of hash neighbours rewrites few pages)."""
        path = tmp_path / "seal.db"
        store = SQLiteStore(path, Layout(), fold_rows=10_000)
        await store.start()
        stale = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
        hashes = ["c", "b", "a", "d"]  # written in this order, folded in hash order
        try:
            for minute in range(10):
                value = stale if minute == 9 else float(minute - 1)  # 0.0 at minute 1
                await store.write_raw([RawPoint(tenant, h, minute * 60_000, value) for h in hashes])
                if minute in (3, 6):
                    store._fold()  # several chunks a series-slot
            read = dict(zip(hashes, await store.read_raw(tenant, hashes, 0, HOUR - 1)))
            late = [(tenant, "b", 60_000, -0.0), (tenant, "b", 120_000, 42.0), (tenant, "c", 30 * 60_000, 7.0)]
            await store.write_raw([RawPoint(*point) for point in late])
            await store.write_blocks(
                [SealedBlock(tenant, h, 0, encode_block(*read[h].head), read[h].head, 0) for h in ("a", "b", "c")]
            )
            expected = {
                "a": [],
                "b": [(60_000, bits(-0.0)), (120_000, bits(42.0))],
                "c": [(30 * 60_000, bits(7.0))],
                "d": [(ts, bits(v)) for ts, v in read["d"].head.points()],  # not sealed
            }
            for h, head in expected.items():
                assert [(ts, bits(v)) for ts, v in points(await read_head(store, tenant, h, 0, HOUR - 1))] == head
            (block,) = await read_blocks(store, tenant, "b", 0, 0)
            (raw,) = await store.read_raw(tenant, ["b"], 0, HOUR - 1)
            merged = samples.merge([samples.Samples(*decode_block(block)), raw.head])  # the head wins
            assert [bits(v) for v in merged.values[:3]] == [bits(-1.0), bits(-0.0), bits(42.0)]
            await store.write_raw([RawPoint(tenant, h, HOUR + 1, 1.0) for h in hashes])
            store._fold()
            while sqlite3.connect(path).execute("SELECT count(*) FROM head_batches").fetchone()[0]:
                await deferLater(reactor, 0.02)
            with sqlite3.connect(path) as reader:
                folded = reader.execute(
                    "SELECT series_set_hash FROM head_chunks WHERE time_slot = ? ORDER BY rowid", (HOUR,)
                ).fetchall()
            assert [h for (h,) in folded] == sorted(hashes)
        finally:
            await store.close()

    @pytest_twisted.ensureDeferred
    async def test_sqlite_block_write_handed_the_chunks_the_seal_read_checks_only_chunks_written_since(
        self, tmp_path, tenant
    ):
        """With the seal read's head_keys, the block write drops the chunks that read saw without
        looking at them again, and checks only chunks written since: samples the read took from
        head_batches and folded after it (held by the block: dropped), a late rewrite folded
        between seal read and block write (-0.0 for 0.0, a new value, a late sample: kept), and a
        chunk a delete cut and wrote back under a seq the read saw (dropped)."""
        store = SQLiteStore(tmp_path / "keys.db", Layout(), fold_rows=10_000)
        await store.start()
        hashes = ["a", "b", "c", "e"]
        try:
            for minute in range(8):
                await store.write_raw([RawPoint(tenant, h, minute * 60_000, float(minute - 1)) for h in hashes])
                if minute == 4:
                    store._fold()  # minutes 5-7 still in head_batches at the seal read
            read = dict(zip(hashes, await store.read_raw(tenant, hashes, 0, HOUR - 1)))
            assert all(read[h].head_keys and len(read[h].head) == 8 for h in hashes)
            await store.delete_samples(tenant, ["e"], 2 * 60_000, 2 * 60_000)  # folds, cuts e's chunk
            late = [(tenant, "b", 60_000, -0.0), (tenant, "b", 6 * 60_000, 50.0), (tenant, "c", 9 * 60_000, 9.0)]
            await store.write_raw([RawPoint(*point) for point in late + [(tenant, "a", 3 * 60_000, 2.0)]])
            store._fold()
            while sqlite3.connect(tmp_path / "keys.db").execute("SELECT count(*) FROM head_batches").fetchone()[0]:
                await deferLater(reactor, 0.02)
            await store.write_blocks(
                [
                    SealedBlock(tenant, h, 0, encode_block(*read[h].head), read[h].head, 0, read[h].head_keys)
                    for h in hashes
                ]
            )
            expected = {"a": [], "b": [(60_000, bits(-0.0)), (6 * 60_000, bits(50.0))], "c": [(9 * 60_000, bits(9.0))]}
            for h, head in {**expected, "e": []}.items():
                assert [(ts, bits(v)) for ts, v in points(await read_head(store, tenant, h, 0, HOUR - 1))] == head
            for h in expected:  # not e: a delete racing a seal is not what this test is about
                (raw,) = await store.read_raw(tenant, [h], 0, HOUR - 1)
                merged = samples.merge([samples.Samples(*decode_block(raw.blocks[0])), raw.head])
                sealed = [(ts, bits(v)) for ts, v in read[h].head.points()]
                assert [(ts, bits(v)) for ts, v in merged.points()] == sorted(
                    dict(sealed + expected.get(h, [])).items()
                )
        finally:
            await store.close()

    @pytest_twisted.ensureDeferred
    async def test_sqlite_head_of_many_series_and_slots_reads_back_from_chunks(self, tmp_path, tenant):
        """Folds of several batches: every series reads back every sample of every slot, in order,
        whether its samples are in one chunk a slot or several, and the sweep removes old slots."""
        store = SQLiteStore(tmp_path / "many.db", Layout(), fold_rows=500)
        await store.start()
        hashes = [f"s{i:03d}" for i in range(40)]
        rounds = range(0, 3 * HOUR, 60_000)
        try:
            for ts in rounds:
                await store.write_raw([RawPoint(tenant, h, ts + i, ts / 1000 + i) for i, h in enumerate(hashes)])
            found = await store.read_raw(tenant, list(reversed(hashes)), 0, 3 * HOUR)
            for i, raw in zip(reversed(range(len(hashes))), found):
                assert points(raw.head) == [(ts + i, ts / 1000 + i) for ts in rounds]
            await store.sweep(HOUR + store.layout.raw_retention_ms)
            (left,) = await store.read_raw(tenant, [hashes[0]], 0, 3 * HOUR)
            assert points(left.head) == [(ts, ts / 1000) for ts in rounds if ts >= HOUR]
        finally:
            await store.close()

    @pytest_twisted.ensureDeferred
    async def test_sqlite_head_log_is_folded_once_writes_stop(self, tmp_path, tenant):
        """A log far from fold_rows is folded once a check finds no head row written since the last
        one: a store that went quiet reads its head from chunks alone."""
        store = SQLiteStore(tmp_path / "quiet.db", Layout(), fold_check_s=0.05)
        await store.start()
        h = series(tenant, "cpu", {}).series_set_hash
        try:
            await store.write_raw([RawPoint(tenant, h, ts, float(ts)) for ts in range(10)])
            deadline = time.monotonic() + 30
            while True:
                with sqlite3.connect(tmp_path / "quiet.db") as reader:
                    logged = reader.execute("SELECT count(*) FROM head_batches").fetchone()[0]
                if not logged or time.monotonic() > deadline:
                    break
                await deferLater(reactor, 0.05)
            assert logged == 0
            assert points(await read_head(store, tenant, h, 0, 100)) == [(ts, float(ts)) for ts in range(10)]
        finally:
            await store.close()
