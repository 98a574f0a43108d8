"""Functions of the SQLite driver's threads on a connection, shared by its roles: bit-exact value
codecs, one-column queries, statements and transactions.
"""

import contextlib
import itertools
import math
import sqlite3
import struct

_FLOAT = struct.Struct("<d")
# Variables an INSERT of many rows binds at most: SQLite's limit before 3.32 (since, 32766).
STATEMENT_VARIABLES = 999


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
