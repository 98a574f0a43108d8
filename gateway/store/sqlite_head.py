"""The embedded store's head: ``head_log``, appended to in commit order, folded by the writer into
``head_chunks`` (one row of numpy bytes a series-slot); reads take both (docs/storage.rst).
"""

import json
import sqlite3

import numpy as np

from gateway.core import samples
from gateway.core.samples import Samples
from gateway.store.contract import RawPoint
from gateway.store.sqlite_sql import decode_value, encode_value, immediate

# The head log is folded into head_chunks once it holds this many rows: a bigger log gives a
# series more samples a chunk (fewer B-tree pages written a sample), and every head read a
# longer scan of the log (docs/storage.rst, "The embedded store").
FOLD_ROWS = 100_000
# Rows a fold moves in one transaction: one fold of a log at FOLD_ROWS, and an upgraded file's
# head in steps whose Python objects stay a few tens of MiB.
FOLD_BATCH_ROWS = 2 * FOLD_ROWS


def raw_statements(points: list[RawPoint]) -> list[tuple[str, list]]:
    """Head rows, appended to the head log; a value that is neither NaN nor zero needs no
    encode_value (most of them)."""
    rows = [
        (tenant, hash_, ts, value if value == value and value else encode_value(value))
        for tenant, hash_, ts, value in points
    ]
    return [("INSERT INTO head_log (tenant, series_set_hash, ts, value) VALUES (?, ?, ?, ?)", rows)]


def fold_head_log(connection: sqlite3.Connection, width: int) -> None:
    """Move the head log's rows into head_chunks, FOLD_BATCH_ROWS a transaction, oldest first: one
    chunk a series-slot, its seq the id of the batch's last row, so that chunks sort in the order
    they were written and before every row still in the log."""
    batch_end = "SELECT max(id), count(*) FROM (SELECT id FROM head_log ORDER BY id LIMIT ?)"
    rows = "SELECT tenant, series_set_hash, ts, value FROM head_log WHERE id <= ? ORDER BY id"
    while True:
        with immediate(connection):
            last_id, count = connection.execute(batch_end, (FOLD_BATCH_ROWS,)).fetchone()
            if not count:
                return
            groups: dict[tuple, tuple[list, list]] = {}
            for tenant, hash_, ts, value in connection.execute(rows, (last_id,)):
                timestamps, values = groups.setdefault((tenant, hash_, ts - ts % width), ([], []))
                timestamps.append(ts)
                values.append(value)
            connection.executemany(
                "INSERT INTO head_chunks VALUES (?, ?, ?, ?, ?, ?)",
                [(*key, last_id, *_chunk_blobs(_log_samples(*columns))) for key, columns in groups.items()],
            )
            connection.execute("DELETE FROM head_log WHERE id <= ?", (last_id,))
        if count < FOLD_BATCH_ROWS:
            return


def _log_samples(timestamps: list[int], values: list) -> Samples:
    """Head log rows of one series in write order -> its samples, the last write of a timestamp winning."""
    if bytes in map(type, values):  # a NaN or -0.0 (encode_value); C-speed, unlike a generator
        values = [decode_value(v) for v in values]
    return samples.merge([Samples(np.array(timestamps, dtype=np.int64), np.array(values, dtype=np.float64))])


def _chunk_blobs(head: Samples) -> tuple[bytes, bytes]:
    """A chunk's two columns: the timestamps as little-endian int64, the values as float64 (bit-exact)."""
    return head.timestamps.astype("<i8").tobytes(), head.values.astype("<f8").tobytes()


def head_slots(connection, tenant: str, hash_: str, first_slot: int, last_slot: int) -> dict[int, tuple[Samples, int]]:
    """Each slot's samples in head_chunks (its chunks merged in write order, the last write of a
    timestamp winning) and the seq of its newest chunk, in slot order."""
    query = (
        "SELECT time_slot, seq, timestamps, vals FROM head_chunks WHERE tenant=? AND series_set_hash=?"
        " AND time_slot BETWEEN ? AND ? ORDER BY time_slot, seq"
    )
    chunks: dict[int, list[tuple[int, Samples]]] = {}
    for slot, seq, timestamps, values in connection.execute(query, (tenant, hash_, first_slot, last_slot)):
        chunk = Samples(np.frombuffer(timestamps, dtype="<i8"), np.frombuffer(values, dtype="<f8"))
        chunks.setdefault(slot, []).append((seq, chunk))
    return {slot: (samples.merge([chunk for _, chunk in found]), found[-1][0]) for slot, found in chunks.items()}


def keep_in_head_slot(connection, tenant: str, hash_: str, slot: int, head: Samples, seq: int, keep) -> None:
    """Keep only the ``keep`` samples of a slot's head (as head_slots gave it): when that drops
    any, its chunks become one chunk of those left (none if none), with the newest chunk's seq."""
    if keep.all():
        return
    connection.execute(
        "DELETE FROM head_chunks WHERE tenant=? AND series_set_hash=? AND time_slot=?", (tenant, hash_, slot)
    )
    if keep.any():
        kept = Samples(head.timestamps[keep], head.values[keep])
        connection.execute(
            "INSERT INTO head_chunks VALUES (?, ?, ?, ?, ?, ?)", (tenant, hash_, slot, seq, *_chunk_blobs(kept))
        )


def read_head(connection, tenant, hashes, first_slot, last_slot, start_ms, end_ms) -> list[Samples]:
    """Each series' head samples in the range: its chunks (one indexed range a series), then its
    rows still in the head log (one scan of the log for all of them), the last write winning."""
    logged: dict[str, tuple[list, list]] = {}
    query = (
        "SELECT series_set_hash, ts, value FROM head_log WHERE tenant=? AND ts BETWEEN ? AND ?"
        " AND series_set_hash IN (SELECT value FROM json_each(?)) ORDER BY id"
    )
    for hash_, ts, value in connection.execute(query, (tenant, start_ms, end_ms, json.dumps(hashes))):
        timestamps, values = logged.setdefault(hash_, ([], []))
        timestamps.append(ts)
        values.append(value)
    found = []
    for hash_ in hashes:
        slots = [
            samples.empty(),
            *(h for h, _ in head_slots(connection, tenant, hash_, first_slot, last_slot).values()),
        ]
        parts = [Samples(np.concatenate([s.timestamps for s in slots]), np.concatenate([s.values for s in slots]))]
        if hash_ in logged:
            parts.append(_log_samples(*logged[hash_]))
        found.append(samples.merge(parts).between(start_ms, end_ms))
    return found
