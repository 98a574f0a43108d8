"""What the time index costs a series a bucket: rows written and bytes kept (docs/storage.rst, "The time index").

Workload: Kubernetes-shaped series, ``--metrics`` (10) metric names x ``--pods`` (500) pods, each
series with the labels job, namespace, pod, instance and container, indexed in ``--buckets`` (24)
hour buckets, new pods in every bucket (an hourly deploy: a bucket's rows are the same whether its
pods are new or not). Prints, per series and bucket:

- the index rows written (gateway/store/index.py ``bucket_index_rows``: what every driver writes),
  by table;
- SQLite: the bytes the bucket tables take in the file (``dbstat``, pages in use), after writing
  the workload through SQLiteStore.write_series_buckets;
- Cassandra: the rows' logical bytes (key columns as the driver sends them, before Cassandra's
  own overhead and compression), since what a memtable holds is not on disk yet;
- the whole index of the tenant in the SQLite file (all-time and bucket tables, rows and bytes)
  before and after the sweep once its data expired (the workload's buckets are of November 2023,
  past the default retentions): it shrinks to nothing, and how long the sweep took.

    PYTHONPATH=. python -m bench.index_size
"""

import argparse
import sqlite3
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.common import exit_with, react_until_done
from gateway.core.layout import INDEX_BUCKET_MS, Layout
from gateway.core.model import SeriesKey, series_set_hash, series_set_text
from gateway.store.deletion import INDEX_KEYS
from gateway.store.index import bucket_index_rows
from gateway.store.sqlite import SQLiteStore

TENANT = "bench"
START_MS = 1_700_000_000_000 // INDEX_BUCKET_MS * INDEX_BUCKET_MS


def workload(metrics: int, pods: int, buckets: int) -> list[tuple[SeriesKey, int]]:
    pairs = []
    for bucket in range(buckets):
        generation = bucket
        for metric in range(metrics):
            name = f"app_requests_{metric}_total"
            for pod in range(pods):
                tags = {
                    "job": "api",
                    "namespace": "shop",
                    "pod": f"api-7f9c{generation:04d}-{pod:05d}",
                    "instance": f"10.{generation % 250}.{pod // 250}.{pod % 250}:8080",
                    "container": "api",
                }
                key = SeriesKey(TENANT, series_set_hash(series_set_text(name, tags)), name, tags)
                pairs.append((key, START_MS + bucket * INDEX_BUCKET_MS))
    return pairs


def logical_bytes(row: tuple) -> int:
    """A row's key columns as sent: text as UTF-8, the bucket as 8 bytes."""
    return sum(8 if isinstance(value, int) else len(str(value).encode()) for value in row)


INDEX_TABLES = ("tenants", *INDEX_KEYS)


def index_size(path: Path) -> tuple[int, int]:
    """Rows and bytes in use (dbstat) of every index table of the file, the bucket tables' part."""
    with sqlite3.connect(path) as connection:
        rows = sum(connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in INDEX_TABLES)
        names = ", ".join(f"'{table}'" for table in INDEX_TABLES)
        (used,) = connection.execute(
            f"SELECT SUM(pgsize - unused) FROM dbstat WHERE name IN ({names}) OR name LIKE 'sqlite_autoindex_%'"
            " OR name = 'series_set_hashes_last_bucket'"
        ).fetchone()
    return rows, used or 0


def bucket_bytes(path: Path) -> int:
    with sqlite3.connect(path) as connection:
        (used,) = connection.execute(
            "SELECT SUM(pgsize - unused) FROM dbstat WHERE name LIKE 'bucket_%' OR name LIKE 'sqlite_autoindex_bucket_%'"
        ).fetchone()
    return used or 0


async def sqlite_sizes(pairs: list[tuple[SeriesKey, int]], path: Path) -> dict[str, float]:
    """Write the workload's buckets (which write the all-time rows too, as the first of a day does),
    then sweep as the downsampler does once their data expired."""
    store = SQLiteStore(path, Layout())
    await store.start()
    try:
        for start in range(0, len(pairs), 5000):
            await store.write_series_buckets(pairs[start : start + 5000])
        sizes: dict[str, float] = {"bucket_bytes": bucket_bytes(path)}
        sizes["rows_before"], sizes["bytes_before"] = index_size(path)
        began = time.perf_counter()
        await store.sweep(int(time.time() * 1000))
        sizes["sweep_s"] = time.perf_counter() - began
    finally:
        await store.close()
    sizes["rows_after"], sizes["bytes_after"] = index_size(path)
    return sizes


async def report(pairs: list[tuple[SeriesKey, int]]) -> None:
    rows = bucket_index_rows(pairs)
    series_buckets = len(pairs)
    by_table = Counter({table: len(keys) for table, keys in rows.items()})
    total_rows = sum(by_table.values())
    logical = sum(logical_bytes(row) for keys in rows.values() for row in keys)
    with tempfile.TemporaryDirectory() as directory:
        sizes = await sqlite_sizes(pairs, Path(directory) / "index.db")
    print(f"{series_buckets} series-buckets")
    print(f"  rows a series a bucket: {total_rows / series_buckets:.2f}")
    for table, count in sorted(by_table.items()):
        print(f"    {table:28s} {count / series_buckets:.3f}")
    print(f"  SQLite bytes a series a bucket (dbstat, bucket tables): {sizes['bucket_bytes'] / series_buckets:.0f}")
    print(f"  Cassandra logical bytes a series a bucket (key columns as sent): {logical / series_buckets:.0f}")
    print(
        "  the index of a tenant whose data expired, SQLite: "
        f"{sizes['rows_before']:.0f} rows, {sizes['bytes_before'] / 1e6:.1f} MB before the sweep;"
        f" {sizes['rows_after']:.0f} rows, {sizes['bytes_after'] / 1e6:.1f} MB after (sweep {sizes['sweep_s']:.1f} s)"
    )


async def run(args) -> None:
    await report(workload(args.metrics, args.pods, args.buckets))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.index_size", description=__doc__.splitlines()[0])
    parser.add_argument("--metrics", type=int, default=10)
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--buckets", type=int, default=24)
    args = parser.parse_args(argv)
    return react_until_done(run, args)


if __name__ == "__main__":
    exit_with(main)
