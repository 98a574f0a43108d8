"""The read path and the sealing on the embedded store with a fixed clock: stitching raw and
roll-ups, counters past raw retention, sealing merges, and the SQLite retention sweep."""

import math
import sqlite3
import struct

import numpy as np
import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import deferLater

from gateway.core import samples
from gateway.core.layout import HOUR_MS, Layout, parse_granularities
from gateway.core.model import SeriesKey, series_set_hash, series_set_text
from gateway.core.samples import Samples
from gateway.downsample.processor import Downsampler
from gateway.query.graphite.fetcher import StoreFetcher
from gateway.query.graphite.finder import Finder
from gateway.query.graphite.storage_schemas import StorageSchemas
from gateway.query.planner import QueryPlanner
from gateway.store.blocks import BadBlock, decode_block, encode_block, read_header
from gateway.store.contract import RawPoint, Rollup
from gateway.store.read_path import ReadPath, rollup_samples
from gateway.store.sqlite_schema import SCHEMA_VERSION
from tests.conftest import read_blocks, read_head

MINUTE = 60_000
NOW = 1_000 * HOUR_MS + 17 * MINUTE
LAYOUT = Layout(HOUR_MS, 2 * HOUR_MS, parse_granularities("5m:1d,1h:30d", HOUR_MS), head_retention_ms=HOUR_MS)
STALE = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]


def key(tenant: str, name: str) -> SeriesKey:
    return SeriesKey(tenant, series_set_hash(series_set_text(name, {})), name, {})


@pytest.fixture
def store_layout() -> Layout:
    return LAYOUT


def test_blocks_are_bit_exact_and_versioned():
    timestamps = np.array([-5, 0, 1_700_000_000_123, 1_700_000_010_007], dtype=np.int64)
    values = np.array([STALE, -0.0, np.inf, 0.1 + 0.2])
    block = encode_block(timestamps, values)
    decoded_timestamps, decoded_values = decode_block(block)
    assert decoded_timestamps.tolist() == timestamps.tolist()
    assert decoded_values.view(np.uint64).tolist() == values.view(np.uint64).tolist()
    assert read_header(block)[2:] == (4, -5, 1_700_000_010_007)
    assert [len(part) for part in decode_block(encode_block(np.array([], dtype=np.int64), np.array([])))] == [0, 0]
    with pytest.raises(BadBlock):
        decode_block(b"XX" + block[2:])
    with pytest.raises(ValueError):
        encode_block(timestamps, values[:2])


def test_merge_lets_the_later_source_win():
    block = Samples(np.array([1, 2, 3]), np.array([1.0, 2.0, 3.0]))
    head = Samples(np.array([2, 4]), np.array([20.0, 40.0]))
    assert samples.merge([block, head]).points() == [(1, 1.0), (2, 20.0), (3, 3.0), (4, 40.0)]
    assert samples.from_points([(5, 1.0), (3, 2.0), (5, 3.0)]).points() == [(3, 2.0), (5, 3.0)]
    assert samples.merge([samples.empty(), head]).points() == head.points()


def test_counters_fall_back_to_their_last_value():
    gauge = [Rollup("t", "h", 0, 1.0, 3.0, 4.0, 2), Rollup("t", "h", 300_000, 2.0, 2.0, 2.0, 1)]
    counter = [Rollup("t", "h", 0, last=10.0, increase=4.0)]
    assert rollup_samples(gauge, "avg", "last")[0].points() == [(0, 2.0), (300_000, 2.0)]
    found, used = rollup_samples(counter, "avg", "last")
    assert (found.points(), used) == ([(0, 10.0)], "last")
    assert rollup_samples(counter, "avg")[1] is None


def test_max_and_min_only_series_read_their_own_aggregate():
    """A ``.max`` path keeps only max and count in its roll-ups: asked for avg (Graphite's
    default consolidation), it reads its maxima, as whisper's max-aggregated archive does."""
    highest = [Rollup("t", "h", 0, max=7.0, count=3), Rollup("t", "h", 300_000, max=9.0, count=1)]
    lowest = [Rollup("t", "h", 0, min=-2.0, count=2)]
    found, used = rollup_samples(highest, "avg", "last")
    assert (found.points(), used) == ([(0, 7.0), (300_000, 9.0)], "max")
    found, used = rollup_samples(lowest, "avg", "last")
    assert (found.points(), used) == ([(0, -2.0)], "min")


@pytest_twisted.ensureDeferred
async def test_a_range_past_raw_retention_ends_with_the_newest_samples(sqlite_store):
    """Roll-up averages up to the raw retention's start (rounded up to a 5 m bucket), raw samples after."""
    series = key("t", "temp")
    old = [
        Rollup("t", series.series_set_hash, NOW - 3 * HOUR_MS + i * 5 * MINUTE, 0.0, 2.0, 2.0 * i, 2) for i in range(36)
    ]
    await sqlite_store.write_rollups(LAYOUT.granularity("5m"), old)
    recent = [RawPoint("t", series.series_set_hash, NOW - i * MINUTE, float(i)) for i in range(130)]
    await sqlite_store.write_raw(recent)
    reader = ReadPath(sqlite_store, clock=lambda: NOW)
    (found,) = await reader.read([series], NOW - 3 * HOUR_MS, NOW)
    boundary = NOW - 2 * HOUR_MS + 3 * MINUTE
    assert found.aggregate == "avg"
    points = found.samples.points()
    assert [p for p in points if p[0] < boundary] == [
        (r.timestamp_ms, r.sum / r.count) for r in old if r.timestamp_ms < boundary
    ]
    assert [p for p in points if p[0] >= boundary] == sorted(
        (p.timestamp_ms, p.value) for p in recent if p.timestamp_ms >= boundary
    )
    assert points[-1] == (NOW, 0.0)
    (inside,) = await reader.read([series], NOW - HOUR_MS, NOW)
    assert inside.aggregate is None and len(inside.samples) == 61


@pytest_twisted.ensureDeferred
async def test_a_render_takes_each_bucket_from_one_source_where_the_raw_retention_starts(sqlite_store):
    """A render from just past the 5 m roll-up's retention reads the 1 h roll-up at a 1 h step; its
    first bucket starts inside the 5 m retention, and the read chose the 5 m roll-up from there:
    the hour holding the raw retention's start averaged 5 m rows with raw samples (whisper import,
    #34: 29.738 where whisper holds 42.833). Now every hour is the 1 h row, or raw samples, whole."""
    series = key("t", "boundary.cpu")
    await sqlite_store.write_series([series])
    hour = (NOW - 2 * HOUR_MS) // HOUR_MS * HOUR_MS  # the hour the raw retention starts in
    await sqlite_store.write_rollups(
        LAYOUT.granularity("1h"), [Rollup("t", series.series_set_hash, hour, 10.0, 10.0, 120.0, 12)]
    )
    fives = [Rollup("t", series.series_set_hash, hour + i * 5 * MINUTE, 1.0, 1.0, 1.0, 1) for i in range(12)]
    await sqlite_store.write_rollups(LAYOUT.granularity("5m"), fives)
    await sqlite_store.write_raw(
        [RawPoint("t", series.series_set_hash, hour + i * MINUTE, 100.0) for i in range(17, 120)]
    )
    planner = QueryPlanner(sqlite_store, 100, clock=lambda: NOW)
    fetcher = StoreFetcher("t", Finder(sqlite_store), planner, StorageSchemas.from_file(None), 100)
    start_s = (NOW - 24 * HOUR_MS) // 1000 - 60
    (found,) = await fetcher.fetch("boundary.cpu", start_s, NOW // 1000)
    assert found.step == 3600
    by_hour = dict(zip(range(found.start, found.end, found.step), found))
    assert by_hour[hour // 1000] == 10.0  # the 1 h row, whole
    assert by_hour[hour // 1000 + 3600] == 100.0  # raw samples, whole


@pytest_twisted.ensureDeferred
async def test_sealing_merges_late_data_and_the_sweep_drops_expired_data(sqlite_store):
    """The head rows of a slot become its block (the head row of a rewritten timestamp wins); a
    late sample after sealing is merged into the block next time; the sweep removes blocks,
    head rows and roll-ups past their retention."""
    series = key("t", "jobs_total")
    await sqlite_store.write_series([series])
    slot = NOW - NOW % HOUR_MS - HOUR_MS
    downsampler = Downsampler(sqlite_store, pending=None, layout=LAYOUT, counter_suffixes=())

    async def seal():
        await downsampler.roll_up_series_slot("t", series.series_set_hash, slot)

    await sqlite_store.write_raw([RawPoint("t", series.series_set_hash, slot - MINUTE, 100.0)])
    await sqlite_store.write_raw(
        [RawPoint("t", series.series_set_hash, slot + i * MINUTE, float(i)) for i in range(10)]
    )
    await seal()
    assert (await read_head(sqlite_store, "t", series.series_set_hash, slot, slot + HOUR_MS - 1)).points() == []
    await sqlite_store.write_raw(
        [
            RawPoint("t", series.series_set_hash, slot + 3 * MINUTE, 30.0),
            RawPoint("t", series.series_set_hash, slot + 30 * MINUTE, 31.0),
        ]
    )
    await seal()
    (block,) = await read_blocks(sqlite_store, "t", series.series_set_hash, slot, slot)
    assert Samples(*decode_block(block)).points() == [
        (slot + i * MINUTE, float(v))
        for i, v in [(0, 0), (1, 1), (2, 2), (3, 30), *((i, i) for i in range(4, 10)), (30, 31)]
    ]
    (hourly,) = await sqlite_store.read_rollups(LAYOUT.granularity("1h"), "t", series.series_set_hash, slot, slot)
    assert (hourly.last, hourly.increase) == (31.0, 0.0 + 1 + 1 + 28 + 4 + 1 + 1 + 1 + 1 + 1 + 22)
    await sqlite_store.sweep(NOW + 3 * HOUR_MS)
    with sqlite3.connect(sqlite_store.path) as check:
        assert check.execute("PRAGMA freelist_count").fetchone() == (0,)
    assert await read_blocks(sqlite_store, "t", series.series_set_hash, slot - HOUR_MS, slot) == []
    assert (await read_head(sqlite_store, "t", series.series_set_hash, slot - HOUR_MS, slot)).points() == []
    assert len(await sqlite_store.read_rollups(LAYOUT.granularity("5m"), "t", series.series_set_hash, 0, NOW)) == 3
    await sqlite_store.sweep(NOW + 2 * 86_400_000)
    assert await sqlite_store.read_rollups(LAYOUT.granularity("5m"), "t", series.series_set_hash, 0, NOW) == []
    assert len(await sqlite_store.read_rollups(LAYOUT.granularity("1h"), "t", series.series_set_hash, 0, NOW)) == 1


# The head table of SQLite files before schema version 8: one row a sample, keyed by series.
DATA_RAW_BEFORE_V8 = """
CREATE TABLE data_raw (
    tenant TEXT NOT NULL,
    series_set_hash TEXT NOT NULL,
    time_slot INTEGER NOT NULL,
    ts INTEGER NOT NULL,
    value REAL,
    PRIMARY KEY (tenant, series_set_hash, time_slot, ts)
) WITHOUT ROWID;
"""


def test_a_sqlite_file_of_one_row_a_sample_stays_readable(start_gateway, tmp_path):
    """A file written before blocks existed (schema version 2: no data_blocks, histogram tables
    nor created_ms column) opens, its rows
    read back, and sealing turns them into a block without changing the answer."""
    import json
    import re
    import subprocess
    import sys
    import time
    import urllib.parse

    from gateway.store.sqlite_schema import ROLLUP_TABLE, SCHEMA
    from tests.gatewayproc import REPO

    data = tmp_path / "data"
    data.mkdir()
    old = sqlite3.connect(data / "tsgate.db", isolation_level=None)
    old.execute("PRAGMA journal_mode=WAL")
    old.executescript(
        re.sub(
            r"CREATE TABLE IF NOT EXISTS (data_blocks|head_log|head_batches|head_chunks) \(.*?\);|    (created_ms|last_bucket) INTEGER,\n",
            "",
            SCHEMA,
            flags=re.S,
        )
    )
    old.executescript(
        DATA_RAW_BEFORE_V8
        + "".join(ROLLUP_TABLE.format(table=t) for t in ("data_5m", "data_1h"))
        + "PRAGMA user_version=2;"
    )
    series = key("old", "legacy_temp")
    slot = (int(time.time() * 1000) // HOUR_MS - 2) * HOUR_MS
    old.execute("INSERT INTO tenants VALUES ('old')")
    old.execute("INSERT INTO metric_names (tenant, metric_name) VALUES ('old', 'legacy_temp')")
    old.execute(
        "INSERT INTO series_set_hashes VALUES ('old', ?, 'legacy_temp', ?)", (series.series_set_hash, json.dumps({}))
    )
    old.execute(
        "INSERT INTO series_sets VALUES ('old', 'legacy_temp', '__name__', 'legacy_temp', ?)", (series.series_set_hash,)
    )
    old.executemany(
        "INSERT INTO data_raw VALUES ('old', ?, ?, ?, ?)",
        [(series.series_set_hash, slot, slot + i * MINUTE, float(i)) for i in range(20)],
    )
    old.execute("INSERT INTO pending_downsample_sets VALUES (0, ?, 'old', ?, 0)", (slot, series.series_set_hash))
    old.close()
    store_args = ("--data-dir", str(data), "--downsample-partitions-count", "1")
    gateway = start_gateway(*store_args, "--roles", "ingest,query")
    params = {"tenant": "old", "metricName": "legacy_temp", "start": slot, "end": slot + HOUR_MS - 1}
    before = gateway.get("/api/query?" + urllib.parse.urlencode(params))
    assert before.status == 200 and list(before.json()[0]["values"].values()) == [float(i) for i in range(20)]
    sealed = subprocess.run(
        [sys.executable, "-m", "gateway.app.cli", "downsample", "--once", "--downsample-delay", "0s", *store_args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sealed.returncode == 0 and "rolled up 1 " in sealed.stdout, sealed.stderr
    after = gateway.get("/api/query?" + urllib.parse.urlencode(params))
    assert after.body == before.body
    check = sqlite3.connect(data / "tsgate.db")
    assert check.execute("SELECT count(*) FROM data_blocks").fetchone()[0] == 1
    assert check.execute("SELECT count(*) FROM head_chunks").fetchone()[0] == 0
    assert check.execute("SELECT count(*) FROM sqlite_master WHERE name='data_raw'").fetchone()[0] == 0
    check.close()


@pytest_twisted.ensureDeferred
async def test_a_sqlite_file_with_head_rows_keyed_by_series_is_upgraded_in_place(tmp_path):
    """A file of schema version 7 (head rows in data_raw, one row a sample keyed by series) opens:
    its head rows move into the head log in one transaction and are folded into chunks, data_raw
    goes, and every sample reads back with its value bit for bit (NaN payloads and -0.0 were kept
    as 8-byte blobs), then seals as before."""
    from gateway.store.sqlite import SQLiteStore

    path = tmp_path / "v7.db"
    old = sqlite3.connect(path, isolation_level=None)
    old.executescript(DATA_RAW_BEFORE_V8 + "PRAGMA user_version=7;")
    stale = struct.pack("<Q", 0x7FF0000000000002)
    special = [stale, struct.pack("<d", -0.0), math.inf, -math.inf]
    expected: dict[tuple[str, str], list[tuple[int, bytes | float]]] = {}
    for tenant in ("a", "b"):
        for s in range(3):
            rows = expected.setdefault((tenant, f"h{s}"), [])
            for ts in range(0, 3 * HOUR_MS, 10 * 60_000):
                rows.append((ts + s, special[ts // 600_000 % 4] if ts % HOUR_MS == 0 else ts / 7 + s))
            old.executemany(
                "INSERT INTO data_raw VALUES (?, ?, ?, ?, ?)",
                [(tenant, f"h{s}", ts - ts % HOUR_MS, ts, value) for ts, value in rows],
            )
    old.close()
    store = SQLiteStore(path, Layout())
    await store.start()
    try:
        for (tenant, hash_), rows in expected.items():
            (found,) = await store.read_raw(tenant, [hash_], 0, 3 * HOUR_MS)
            stored = [(ts, v if isinstance(v, bytes) else struct.pack("<d", v)) for ts, v in rows]
            assert [(ts, struct.pack("<d", v)) for ts, v in found.head.points()] == stored
        head = (await store.read_raw("a", ["h1"], 0, HOUR_MS - 1))[0].head
        await store.write_block("a", "h1", 0, encode_block(head.timestamps, head.values), head, 0)
        (sealed,) = await store.read_raw("a", ["h1"], 0, HOUR_MS - 1)
        assert len(sealed.head) == 0 and decode_block(sealed.blocks[0])[0].tolist() == head.timestamps.tolist()
    finally:
        await store.close()
    check = sqlite3.connect(path)
    tables = {name for (name,) in check.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "data_raw" not in tables and check.execute("SELECT count(*) FROM head_log").fetchone()[0] == 0
    assert check.execute("SELECT count(*) FROM head_chunks").fetchone()[0] == 2 * 3 * 3 - 1
    assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    check.close()


@pytest_twisted.ensureDeferred
async def test_a_sqlite_file_whose_chunks_have_no_time_bounds_answers_the_same_after_the_upgrade(tmp_path):
    """A file of schema version 11 (head_chunks without first_ts and last_ts) opens: its chunks,
    whose bounds are unknown, are read by every range that reaches their slot, beside the chunks
    folded since, which have bounds; a range holding none of a chunk's samples answers without it."""
    from gateway.store.sqlite import SQLiteStore

    path = tmp_path / "v11.db"
    store = SQLiteStore(path, Layout(), fold_rows=1)
    await store.start()
    await store.close()
    old = sqlite3.connect(path, isolation_level=None)
    old.executescript(
        "DROP TABLE head_chunks;"
        "CREATE TABLE head_chunks (tenant TEXT NOT NULL, series_set_hash TEXT NOT NULL, time_slot INTEGER NOT NULL,"
        " seq INTEGER NOT NULL, timestamps BLOB NOT NULL, vals BLOB NOT NULL,"
        " PRIMARY KEY (tenant, series_set_hash, time_slot, seq));"
        "CREATE INDEX head_chunks_by_slot ON head_chunks (tenant, time_slot);"
        "UPDATE sqlite_sequence SET seq = 1 WHERE name = 'head_batches';"  # its chunk's seq below
        "PRAGMA user_version=11;"
    )
    minutes = np.arange(0, 10, dtype=np.int64) * 60_000
    old.execute(
        "INSERT INTO head_chunks VALUES ('a', 'h1', 0, 1, ?, ?)",
        (minutes.astype("<i8").tobytes(), minutes.astype("<f8").tobytes()),
    )
    old.close()
    store = SQLiteStore(path, Layout(), fold_rows=1)
    await store.start()
    try:
        await store.write_raw([RawPoint("a", "h1", 30 * 60_000, -1.0)])  # folded at once, with bounds
        while sqlite3.connect(path).execute("SELECT count(*) FROM head_batches").fetchone()[0]:
            await deferLater(reactor, 0.02)
        (found,) = await store.read_raw("a", ["h1"], 0, HOUR_MS - 1)
        assert found.head.points() == [*((int(m), float(m)) for m in minutes), (30 * 60_000, -1.0)]
        (late,) = await store.read_raw("a", ["h1"], 20 * 60_000, HOUR_MS - 1)
        assert late.head.points() == [(30 * 60_000, -1.0)]
        assert set(await store.series_with_data("a", ["h1"], 5 * 60_000, 6 * 60_000)) == {"h1"}
        assert set(await store.series_with_data("a", ["h1"], 40 * 60_000, 50 * 60_000)) == set()
    finally:
        await store.close()
    check = sqlite3.connect(path)
    bounds = check.execute("SELECT seq > 1, first_ts, last_ts FROM head_chunks ORDER BY seq").fetchall()
    assert bounds == [(0, None, None), (1, 30 * 60_000, 30 * 60_000)]
    assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    check.close()


@pytest_twisted.ensureDeferred
async def test_a_sqlite_file_with_a_head_log_of_one_row_a_sample_is_upgraded_to_head_batches(tmp_path):
    """A file of schema version 8 (head rows appended to head_log, one a sample) opens: its log is
    folded into chunks, and samples written since (into head_batches) come after them, so that a
    timestamp written again after the upgrade reads back with its new value, before and after
    the next fold."""
    from gateway.store.sqlite import SQLiteStore

    path = tmp_path / "v8.db"
    store = SQLiteStore(path, Layout())
    await store.start()
    await store.close()
    old = sqlite3.connect(path, isolation_level=None)
    old.execute("DROP TABLE head_batches")
    old.execute("DELETE FROM sqlite_sequence WHERE name = 'head_batches'")
    old.executemany(
        "INSERT INTO head_log (tenant, series_set_hash, ts, value) VALUES ('a', 'h1', ?, ?)",
        [(ts, float(ts)) for ts in range(10, 60, 10)],
    )
    old.execute("PRAGMA user_version=8")
    old.close()
    store = SQLiteStore(path, Layout(), fold_rows=2)
    await store.start()
    try:
        await store.write_raw([RawPoint("a", "h1", 20, -2.0)])
        (found,) = await store.read_raw("a", ["h1"], 0, HOUR_MS)
        assert found.head.points() == [(10, 10.0), (20, -2.0), (30, 30.0), (40, 40.0), (50, 50.0)]
        await store.write_raw([RawPoint("a", "h1", 30, -3.0)])  # the batches reach fold_rows: folded
        while sqlite3.connect(path).execute("SELECT count(*) FROM head_batches").fetchone()[0]:
            await deferLater(reactor, 0.02)
        (found,) = await store.read_raw("a", ["h1"], 0, HOUR_MS)
        assert found.head.points() == [(10, 10.0), (20, -2.0), (30, -3.0), (40, 40.0), (50, 50.0)]
    finally:
        await store.close()
    check = sqlite3.connect(path)
    assert check.execute("SELECT count(*) FROM head_log").fetchone()[0] == 0
    assert check.execute("SELECT count(*) FROM head_batches").fetchone()[0] == 0
    assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    check.close()
