"""Functions of the SQLite driver's threads on a connection, shared by its roles: bit-exact value
codecs, one-column queries, statements and transactions.
"""

import contextlib
import itertools
import math
import sqlite3
import struct
from collections.abc import Sequence

_FLOAT = struct.Struct("<d")
# Variables an INSERT of many rows binds at most: SQLite's limit before 3.32 (since, 32766).
STATEMENT_VARIABLES = 999
# A read of many series' rows scans its slots (slot_rows) when they hold at most this many
# times the rows of the series asked for, and probes each series' key otherwise: reading a row
# of a scan costs about a third of a probe (0.6 µs against 1.6 a series).
SCAN_SPARE = 3
# Tables keyed (tenant, series_set_hash, time_slot, ...) with an index "<table>_by_slot" on
# (tenant, time_slot) for slot_rows' scans. The index has no hash in it, so that its entries
# are appended in write order (a fold of 100,000 samples of 8,000 series inserting 8,000 chunks
# at random places of an index holding the hash cost remote write 17 % more CPU a sample).
SLOT_INDEXED = ("head_chunks", "data_blocks")


def slot_index(table: str) -> str:
    """The CREATE INDEX of ``table``'s ``<table>_by_slot`` (SLOT_INDEXED)."""
    return f"CREATE INDEX IF NOT EXISTS {table}_by_slot ON {table} (tenant, time_slot)"


def encode_value(value: float):
    """SQLite turns NaN into NULL and -0.0 into 0: keep those as their 8 bytes, so that values
    (Prometheus stale markers above all) come back bit-exact."""
    if math.isnan(value) or (value == 0 and math.copysign(1.0, value) < 0):
        return _FLOAT.pack(value)
    return value


def decode_value(stored) -> float:
    return _FLOAT.unpack(stored)[0] if isinstance(stored, bytes) else stored


def nullable(value):
    return None if value is None else encode_value(value)


def decode_nullable(stored):
    return None if stored is None else decode_value(stored)


def column_values(connection: sqlite3.Connection, query: str, parameters: tuple) -> list:
    return [row[0] for row in connection.execute(query, parameters)]


def slot_rows(
    connection: sqlite3.Connection,
    table: str,
    columns: str,
    tenant: str,
    hashes: Sequence[str],
    first_slot: int,
    last_slot: int,
    overlapping: tuple[int, int] | None = None,
    column_parameters: tuple = (),
) -> list:
    """The ``columns`` of ``table``'s rows of ``hashes`` in the slots (the hash first; the
    ``column_parameters`` are those of the columns' expressions), each
    series' rows in slot order; with ``overlapping`` (start_ms, end_ms), only the rows whose
    first_ts to last_ts overlaps it or who have none (head_chunks: a 5-minute read at the top of
    the hour passes over the previous hour's chunks that end before it, without their blobs). Where the slots hold at most SCAN_SPARE times as many rows as
    series asked for, one scan of the slots' rows, those of other series left out here: 0.6 ms
    for the 1,000 chunks of the 1,000 series a last-hour count() of 500 pods a deploy reads
    (half of them with no chunk in the slot), against 1.6 for a probe of the primary key a
    series, and 3 µs for slots holding none (a last-hour read in data_blocks). Else the probes.
    The count of the slots' rows stops past that bound, so a slot of a million series costs the
    count of SCAN_SPARE times the series asked for."""
    if not hashes:
        return []
    bound = SCAN_SPARE * len(hashes)
    span = (tenant, first_slot, last_slot)
    by_slot = f"{table} INDEXED BY {table}_by_slot WHERE tenant=? AND time_slot BETWEEN ? AND ?"
    held = connection.execute(f"SELECT count(*) FROM (SELECT 1 FROM {by_slot} LIMIT ?)", (*span, bound + 1))
    within: str = ""
    bounds: tuple[int, ...] = ()
    if overlapping is not None:
        within = " AND (last_ts IS NULL OR last_ts >= ?) AND (first_ts IS NULL OR first_ts <= ?)"
        bounds = overlapping
    if held.fetchone()[0] <= bound:
        wanted = set(hashes)
        scan = f"SELECT {columns} FROM {by_slot}{within}"
        return [row for row in connection.execute(scan, (*column_parameters, *span, *bounds)) if row[0] in wanted]
    probes = (
        f"SELECT {columns} FROM {table} WHERE tenant=? AND series_set_hash IN ({','.join('?' * len(hashes))})"
        f" AND time_slot BETWEEN ? AND ?{within} ORDER BY series_set_hash, time_slot"
    )
    parameters = (*column_parameters, tenant, *hashes, first_slot, last_slot, *bounds)
    return connection.execute(probes, parameters).fetchall()


@contextlib.contextmanager
def immediate(connection: sqlite3.Connection):
    """One write transaction around the block: committed when it ends, rolled back if it raises."""
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def transaction(connection: sqlite3.Connection, statements: list[tuple[str, list]]) -> None:
    with immediate(connection):
        for query, rows in statements:
            connection.executemany(query, rows)


def single_statement(query: str, rows: list[tuple]) -> list[tuple[str, list]]:
    return [(query, rows)]


def many_rows_statements(insert: str, rows: list[tuple]) -> list[tuple[str, list]]:
    """``insert`` (``INSERT ... VALUES``) of the rows, as many rows a statement as its variables
    allow: a statement is stepped once, where an executemany steps once a row, and each step is a
    round trip of the GIL, which a downsampler's other threads hold most of the time."""
    if not rows:
        return []
    columns = len(rows[0])
    per_statement = max(1, STATEMENT_VARIABLES // columns)
    values = f"({', '.join('?' * columns)})"
    statements: dict[int, list] = {}
    for first in range(0, len(rows), per_statement):
        part = rows[first : first + per_statement]
        statements.setdefault(len(part), []).append(tuple(itertools.chain.from_iterable(part)))
    return [(f"{insert} {', '.join([values] * size)}", bound) for size, bound in statements.items()]
