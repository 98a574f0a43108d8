"""The series index in the embedded store: series metadata, the tag and Graphite path indexes."""

import json
import sqlite3
from collections.abc import Iterable, Sequence

import orjson
from twisted.internet.defer import succeed

from gateway.core.layout import INDEX_BUCKET_MS
from gateway.core.model import SeriesKey, now_ms
from gateway.store.contract import Buckets, PathNode
from gateway.store.deletion import INDEX_KEYS
from gateway.store.index import LISTINGS, bucket_index_rows, bucket_table, index_rows
from gateway.store.sqlite_base import SQLiteBase
from gateway.store.sqlite_sql import column_values, single_statement, transaction


def _series_statements(series: list[SeriesKey], bucket: int) -> list[tuple[str, list]]:
    """The all-time rows of the series, seen last (series_set_hashes.last_bucket) in ``bucket`` or later."""
    rows = index_rows(series)
    return [
        ("INSERT OR IGNORE INTO tenants VALUES (?)", rows.tenants),
        ("INSERT OR IGNORE INTO metric_names (tenant, metric_name) VALUES (?, ?)", rows.metric_names),
        (
            "INSERT INTO series_set_hashes (tenant, series_set_hash, metric_name, tags, last_bucket)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET metric_name = excluded.metric_name,"
            " tags = excluded.tags, last_bucket = max(coalesce(last_bucket, 0), excluded.last_bucket)",
            [
                (tenant, hash_, name, json.dumps(tags, sort_keys=True), bucket)
                for tenant, hash_, name, tags in rows.series_set_hashes
            ],
        ),
        ("INSERT OR IGNORE INTO series_sets VALUES (?, ?, ?, ?, ?)", rows.series_sets),
        ("INSERT OR IGNORE INTO tag_keys VALUES (?, ?, ?)", rows.tag_keys),
        ("INSERT OR IGNORE INTO tag_values VALUES (?, ?, ?, ?)", rows.tag_values),
        (
            "INSERT INTO graphite_paths VALUES (?, ?, ?, ?, ?) ON CONFLICT DO UPDATE"
            " SET is_leaf = max(is_leaf, excluded.is_leaf), is_branch = max(is_branch, excluded.is_branch)",
            [(tenant, parent, name, int(leaf), int(not leaf)) for tenant, parent, name, leaf in rows.graphite_paths],
        ),
        ("INSERT OR IGNORE INTO tenant_tag_keys VALUES (?, ?)", rows.tenant_tag_keys),
        ("INSERT OR IGNORE INTO tenant_tag_values VALUES (?, ?, ?)", rows.tenant_tag_values),
        ("INSERT OR IGNORE INTO tag_metrics VALUES (?, ?, ?, ?)", rows.tag_metrics),
    ]


def series_rows(connection: sqlite3.Connection, columns: str, tenant: str, hashes: list[str]):
    """(series_set_hash, *columns) of the series_set_hashes rows of the hashes, 500 a query."""
    for start in range(0, len(hashes), 500):
        chunk = hashes[start : start + 500]
        marks = ",".join("?" * len(chunk))
        query = (
            f"SELECT series_set_hash, {columns} FROM series_set_hashes WHERE tenant=? AND series_set_hash IN ({marks})"
        )
        yield from connection.execute(query, (tenant, *chunk))


def _get_series(connection: sqlite3.Connection, tenant: str, hashes: list[str]) -> dict[str, SeriesKey]:
    return {
        series_set_hash: SeriesKey(tenant, series_set_hash, metric_name, json.loads(tags))
        for series_set_hash, metric_name, tags in series_rows(connection, "metric_name, tags", tenant, hashes)
    }


def _json_listing(
    connection: sqlite3.Connection, query: str, parameters: tuple, most_rows: int | None
) -> list[str] | None:
    """The distinct values, sorted, of a query giving one json_group_array of them; None when
    it gave more than ``most_rows``."""
    values = orjson.loads(connection.execute(query, parameters).fetchone()[0])
    return None if most_rows is not None and len(values) > most_rows else sorted(set(values))


def _each_listing(connection: sqlite3.Connection, query: str, after: tuple, listings: list[tuple], answer) -> list:
    """``answer`` of the rows of ``query`` for each listing's parameters (then ``after``'s)."""
    return [answer(connection.execute(query, (*keys, *after)).fetchall()) for keys in listings]


class SQLiteIndex(SQLiteBase):
    """The IndexStore role (contract.py)."""

    def write_series(self, series: Sequence[SeriesKey]):
        now = now_ms()
        return self._commit(_series_statements, list(series), now - now % INDEX_BUCKET_MS)

    def write_series_buckets(self, series_buckets: Sequence[tuple[SeriesKey, int]]):
        """The bucket rows; each series' last_bucket; and the all-time rows of the series due a
        refresh (DailyRefresh), which gives them back to a series the sweep had taken out."""
        refresh = self._refresh.due(series_buckets)
        first_bucket = min(bucket for _, bucket in series_buckets) if series_buckets else 0

        def statements():
            # built on the writer's thread: 40,000 new series are 400,000 index rows, a third of a
            # second of Python the reactor would otherwise spend (the GIL is shared in turns)
            last: dict[tuple[str, str], int] = {}
            for key, bucket in series_buckets:
                identity = (key.tenant, key.series_set_hash)
                last[identity] = max(bucket, last.get(identity, bucket))
            return [
                *(_series_statements(refresh, first_bucket) if refresh else []),
                *(
                    (f"INSERT OR IGNORE INTO {table} VALUES ({', '.join('?' * len(keys[0]))})", keys)
                    for table, keys in bucket_index_rows(series_buckets).items()
                    if keys
                ),
                (
                    "UPDATE series_set_hashes SET last_bucket = max(coalesce(last_bucket, 0), ?)"
                    " WHERE tenant = ? AND series_set_hash = ?",
                    [(bucket, tenant, hash_) for (tenant, hash_), bucket in last.items()],
                ),
            ]

        return self._commit(statements)

    def get_series(self, tenant, hashes: Iterable[str]):
        return self._read(_get_series, tenant, list(hashes))

    def series_seen_since(self, tenant, hashes: Iterable[str], bucket: int):
        def seen(connection):
            rows = series_rows(connection, "last_bucket", tenant, list(hashes))
            return {hash_ for hash_, last in rows if last is None or last >= bucket}

        return self._read(seen)

    def _listing(self, name: str, keys: tuple, buckets: Buckets | None, most_rows: int | None = None):
        """One LISTINGS entry, sorted: from the all-time table, or the bucket table over ``buckets``
        (one index seek a bucket), in one query however many buckets. The rows come as one JSON
        array built by SQLite (json_group_array) and are deduplicated and sorted here: a Python
        row a value and SQLite's DISTINCT were most of the cost (1,500 values of two buckets:
        0.42 ms that way, 0.19 ms this way). ``most_rows`` is a LIMIT of one row more."""
        table, column, key_columns = LISTINGS[name]
        where = " AND ".join(f"{c}=?" for c in key_columns)
        if buckets is None:
            rows, parameters = f"SELECT {column} AS listed FROM {table} WHERE {where}", keys
        else:
            starts = list(buckets.starts())
            rows = (
                f"SELECT {column} AS listed FROM {bucket_table(table)} WHERE {where}"
                f" AND bucket IN ({', '.join('?' * len(starts))})"
            )
            parameters = (*keys, *starts)
        if most_rows is not None:
            rows, parameters = f"{rows} LIMIT ?", (*parameters, most_rows + 1)
        return self._read(_json_listing, f"SELECT json_group_array(listed) FROM ({rows})", parameters, most_rows)

    def listings_with_rows(self, name, listings):
        table, _, key_columns = LISTINGS[name]
        query = f"SELECT EXISTS (SELECT 1 FROM {table} WHERE {' AND '.join(f'{c}=?' for c in key_columns)})"
        return self._read(_each_listing, query, (), list(listings), lambda rows: bool(rows[0][0]))

    def listings_buckets(self, name, listings, buckets):
        """One reader call: a query a listing (a thread hop each was most of a delete's time)."""
        listings = list(listings)
        if not listings:
            return succeed([])
        table, column, key_columns = LISTINGS[name]
        starts = tuple(buckets.starts())
        columns = (*key_columns, column)[: len(listings[0])]
        query = (
            f"SELECT DISTINCT bucket FROM {bucket_table(table)} WHERE {' AND '.join(f'{c}=?' for c in columns)}"
            f" AND bucket IN ({', '.join('?' * len(starts))})"
        )
        return self._read(_each_listing, query, starts, listings, lambda rows: {bucket for (bucket,) in rows})

    def list_tenants(self):
        return self._read(column_values, "SELECT tenant FROM tenants ORDER BY tenant", ())

    def list_path_children(self, tenant, parent):
        query = "SELECT name, is_leaf, is_branch FROM graphite_paths WHERE tenant=? AND parent=? ORDER BY name"
        return self._read(
            lambda connection: [
                PathNode(n, bool(leaf), bool(branch)) for n, leaf, branch in connection.execute(query, (tenant, parent))
            ]
        )

    def delete_index_rows(self, rows):
        statements = [
            (f"DELETE FROM {table} WHERE {' AND '.join(f'{c}=?' for c in INDEX_KEYS[table])}", keys)
            for table, keys in rows.items()
            if keys
        ]
        return self._write(transaction, statements)

    def write_path_flags(self, tenant, parent, name, is_leaf, is_branch):
        if is_leaf or is_branch:
            query = "UPDATE graphite_paths SET is_leaf=?, is_branch=? WHERE tenant=? AND parent=? AND name=?"
            rows = [(int(is_leaf), int(is_branch), tenant, parent, name)]
        else:
            query, rows = "DELETE FROM graphite_paths WHERE tenant=? AND parent=? AND name=?", [(tenant, parent, name)]
        return self._commit(single_statement, query, rows)
