"""The SQLite head read's choice of samples (gateway/store/sqlite_head.py): of each series'
timestamp the last written, by series then time, whether the samples come in that order
already (the usual head), the series and timestamps fit one sortable number or (timestamps
spanning more than any stored range) need a two-key sort; the rows of many series read by a
scan of their slots or a probe a series (slot_rows); and the chunks outside a read's range
passed over on their first and last timestamps."""

import sqlite3

import numpy as np
import pytest

from gateway.core.layout import Layout
from gateway.store import sqlite_sql
from gateway.store.sqlite_head import INSERT_CHUNK, _last_writes, fold_head_log, stacked_head
from gateway.store.sqlite_schema import start_writer
from gateway.store.sqlite_sql import slot_rows


def expected(owner: np.ndarray, timestamps: np.ndarray) -> list[tuple[int, int, int]]:
    """(series, timestamp, index) of the last write of each series' timestamp, in order."""
    last: dict[tuple[int, int], int] = {}
    for index, key in enumerate(zip(owner.tolist(), timestamps.tolist())):
        last[key] = index
    return sorted((series, ts, index) for (series, ts), index in last.items())


@pytest.mark.parametrize("span", [3_900_000, 2**61], ids=["an-hour", "beyond-any-range"])
def test_the_last_write_of_each_series_timestamp_in_order(span):
    rng = np.random.default_rng(7)
    owner = rng.integers(0, 300, 5_000)
    timestamps = rng.choice(np.linspace(-span // 2, span // 2, 40, dtype=np.int64), 5_000)
    kept = _last_writes(owner, timestamps)
    assert [(int(owner[i]), int(timestamps[i]), int(i)) for i in kept] == expected(owner, timestamps)
    assert len(_last_writes(owner[:0], timestamps[:0])) == 0


@pytest.mark.parametrize("rewritten", [None, 0, 4_999], ids=["none", "first", "last"])
def test_samples_in_series_and_time_order_are_kept_as_they_are_unless_a_timestamp_comes_again(rewritten):
    """The usual head (each series' chunks in time order, none overlapping) needs no sort by
    timestamp; one timestamp written twice anywhere, and the later write wins as before."""
    owner = np.repeat(np.arange(100), 50)
    timestamps = np.tile(np.arange(50) * 15_000, 100) + 1_795_980_000_000
    if rewritten is not None:
        owner = np.r_[owner, owner[rewritten]]
        timestamps = np.r_[timestamps, timestamps[rewritten]]
    kept = _last_writes(owner, timestamps)
    assert [(int(owner[i]), int(timestamps[i]), int(i)) for i in kept] == expected(owner, timestamps)
    if rewritten is None:
        assert kept.tolist() == list(range(len(owner)))


@pytest.mark.parametrize("spare", [0, 1_000], ids=["probes", "scan"])
def test_slot_rows_gives_the_rows_of_the_series_asked_for_in_the_slots_in_slot_order(tmp_path, monkeypatch, spare):
    """slot_rows probes each series' key or scans the slots (SCAN_SPARE decides): either way,
    the rows of the series asked for within the slots, of the tenant asked for, each series' in
    slot order; none for slots holding none."""
    monkeypatch.setattr(sqlite_sql, "SCAN_SPARE", spare)
    connection = store_file(tmp_path)
    rng = np.random.default_rng(3)
    rows = [
        (tenant, f"h{n}", slot, seq, None, None, b"", b"")
        for tenant in "tu"
        for n in range(8)
        for slot in range(4)
        for seq in range(3)
    ]
    connection.executemany(INSERT_CHUNK, [rows[i] for i in rng.permutation(len(rows))])
    wanted = ["h5", "h1", "h6", "missing"]
    found = slot_rows(connection, "head_chunks", "series_set_hash, time_slot, seq", "t", wanted, 1, 2)
    assert sorted(found) == [(h, slot, seq) for h in ("h1", "h5", "h6") for slot in (1, 2) for seq in range(3)]
    for h in wanted:
        slots = [slot for owner, slot, _ in found if owner == h]
        assert slots == sorted(slots)
    assert slot_rows(connection, "head_chunks", "seq", "t", wanted, 7, 9) == []
    assert slot_rows(connection, "data_blocks", "block", "t", wanted, 0, 9) == []


@pytest.mark.parametrize("spare", [0, 1_000], ids=["probes", "scan"])
def test_the_head_read_takes_the_last_written_chunk_whatever_order_its_rows_were_inserted_in(
    tmp_path, monkeypatch, spare
):
    """A chunk's seq, not where its row lies in the file, says when it was written: of two chunks
    of a series-slot holding the same timestamp, the head read keeps the higher seq's value."""
    monkeypatch.setattr(sqlite_sql, "SCAN_SPARE", spare)
    connection = store_file(tmp_path)
    for seq, timestamps, value in ((2, [10, 20], 2.0), (1, [10, 30], 1.0)):  # the later write first
        blobs = (np.array(timestamps, dtype="<i8").tobytes(), np.full(len(timestamps), value, dtype="<f8").tobytes())
        connection.execute(INSERT_CHUNK, ("t", "h0", 0, seq, min(timestamps), max(timestamps), *blobs))
    stack, keys = stacked_head(connection, "t", ["h0", "h1"], 0, 0, 0, 100)
    head, _ = stack.split()
    assert head.points() == [(10, 2.0), (20, 2.0), (30, 1.0)]
    assert keys == [((0, 1), (0, 2)), ()]


@pytest.mark.parametrize("spare", [0, 1_000], ids=["probes", "scan"])
def test_a_read_passes_over_the_chunks_outside_its_range_and_reads_those_without_bounds(tmp_path, monkeypatch, spare):
    """A fold gives each chunk its first and last timestamps; a read of a range takes only the
    chunks overlapping it (its keys name only those), and every chunk of a file upgraded to the
    bounds (NULL: unknown); what it answers is the same as a read of every chunk."""
    monkeypatch.setattr(sqlite_sql, "SCAN_SPARE", spare)
    connection = store_file(tmp_path)
    hour = Layout().slot_width_ms
    for seq, (first, last) in enumerate([(0, 10), (20, 30), (40, 50)], start=1):  # three folds of h0
        minutes = np.arange(first, last + 1, dtype=np.int64) * 60_000
        blobs = (minutes.astype("<i8").tobytes(), (minutes / 60_000).astype("<f8").tobytes())
        connection.execute(
            INSERT_CHUNK,
            ("t", "h0", 0, seq, int(minutes[0]) if seq < 3 else None, int(minutes[-1]) if seq < 3 else None, *blobs),
        )
    stack, keys = stacked_head(connection, "t", ["h0", "h1"], 0, 0, 25 * 60_000, 35 * 60_000)
    head, _ = stack.split()
    assert head.points() == [(m * 60_000, float(m)) for m in range(25, 31)]
    assert keys == [((0, 2), (0, 3)), ()]
    stack, _ = stacked_head(connection, "t", ["h0", "h1"], 0, 0, 0, hour - 1)
    assert stack.bounds == [0, 33, 33]
    assert slot_rows(connection, "head_chunks", "series_set_hash, seq", "t", ["h0"], 0, 0, (55 * 60_000, hour)) == [
        ("h0", 3)
    ]


def test_a_fold_writes_each_chunk_first_and_last_timestamps(tmp_path):
    connection = store_file(tmp_path)
    hour = Layout().slot_width_ms
    timestamps = np.array([hour + 5_000, 7_000, hour - 1, 3_000, hour + 9_000], dtype=np.int64)
    connection.execute(
        "INSERT INTO head_batches (tenant, first_ts, last_ts, samples, hashes, timestamps, vals) VALUES (?, ?, ?, ?, ?, ?, ?)",
        ("t", 3_000, hour + 9_000, 5, "h0\nh0\nh0\nh1\nh0", timestamps.astype("<i8").tobytes(), np.ones(5).tobytes()),
    )
    fold_head_log(connection, hour)
    chunks = connection.execute("SELECT series_set_hash, time_slot, first_ts, last_ts FROM head_chunks ORDER BY 1, 2")
    assert chunks.fetchall() == [
        ("h0", 0, 7_000, hour - 1),
        ("h0", hour, hour + 5_000, hour + 9_000),
        ("h1", 0, 3_000, 3_000),
    ]


def store_file(tmp_path) -> sqlite3.Connection:
    connection = sqlite3.connect(tmp_path / "rows.db", isolation_level=None)
    start_writer(connection, Layout())
    return connection
