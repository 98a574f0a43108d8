"""What one head row costs the Python cassandra-driver and Cassandra, by how rows are sent.

The same rows (remote-write shaped: requests of S series x one sample, rounds 10 s apart) are
written each way into one keyspace made by ``tsgate schema apply``:

  row a request            data_raw, one INSERT a request (the layout before batching)
  batches of 50            data_raw, UNLOGGED batches of 50 rows of 50 partitions (before data_head)
  data_head S=500          data_head, one single-partition UNLOGGED batch per (slice, shard) of a
                           request, every row bound
  data_head S=2000         the same with requests of 2000 series
  64 shards, S=500         the same with 64 shards instead of HEAD_SHARDS
  values serialized        data_head S=500 as the gateway sends it (first row bound, the others'
                           values serialized directly: gateway.store.cassandra_samples.head_batch)

Printed per way: rows/s, client CPU us/row (this process: binding, batching, the driver's request
path), Cassandra CPU us/row (when it runs on this box: from the start of the way until Cassandra
is idle again, so the flushes and compactions the way set off count, and the keyspace's creation
does not) and mutations per row (partition writes Cassandra applied, from
system_views.local_write_latency). Run from the repository root:

    python -m bench.head_batches --cassandra 127.0.0.1:9042 [--rows 100000] [--concurrency 64] [--only TEXT]
"""

import argparse
import os
import sys
import time
import zlib
from collections import defaultdict

from cassandra.concurrent import execute_concurrent
from cassandra.query import BatchStatement, BatchType

from bench.common import (
    CONSISTENCY,
    BenchError,
    connect,
    exit_with,
    fresh_keyspace,
    listening_pid,
    process_cpu_s,
    settle,
)
from gateway.app.config import parse_hostport
from gateway.core.layout import HEAD_SHARDS, Layout
from gateway.core.model import series_set_hash, series_set_text
from gateway.store.cassandra_samples import head_batch

TENANT = "bench"
INTERVAL_MS = 10_000
TTL_S = 7 * 3600


def requests_of(series: int, rows: int) -> list[list[tuple[str, int, float]]]:
    """Requests of ``series`` (hash, ts, value), one sample a series, rounds INTERVAL_MS apart."""
    hashes = [series_set_hash(series_set_text("bench_metric", {"i": str(i)})) for i in range(series)]
    start = int(time.time() * 1000) // 3_600_000 * 3_600_000 - 3_600_000
    return [[(h, start + r * INTERVAL_MS, float(r)) for h in hashes] for r in range(max(1, rows // series))]


def mutations(session, keyspace: str) -> int:
    rows = session.execute(
        "SELECT count FROM system_views.local_write_latency WHERE keyspace_name = %s ALLOW FILTERING", [keyspace]
    )
    return sum(row.count for row in rows)


def statements_raw_rows(session, keyspace, requests):
    insert = session.prepare(
        f"INSERT INTO {keyspace}.data_raw (tenant, series_set_hash, time_slot, ts, value) VALUES (?, ?, ?, ?, ?) USING TTL ?"
    )
    for request in requests:
        for h, ts, value in request:
            yield insert, (TENANT, h, ts - ts % 3_600_000, ts, value, TTL_S)


def statements_raw_batches(session, keyspace, requests):
    insert = session.prepare(
        f"INSERT INTO {keyspace}.data_raw (tenant, series_set_hash, time_slot, ts, value) VALUES (?, ?, ?, ?, ?) USING TTL ?"
    )
    for request in requests:
        for i in range(0, len(request), 50):
            batch = BatchStatement(BatchType.UNLOGGED)
            for h, ts, value in request[i : i + 50]:
                batch.add(insert, (TENANT, h, ts - ts % 3_600_000, ts, value, TTL_S))
            yield batch, ()


def statements_head(session, keyspace, requests, shards=HEAD_SHARDS, serialized=False):
    """One batch per data_head partition of a request: every row bound, or (``serialized``) as
    the gateway does it (gateway.store.cassandra_samples.head_batch: the first row bound, the others'
    values serialized directly)."""
    insert = session.prepare(
        f"INSERT INTO {keyspace}.data_head (tenant, slice, shard, series_set_hash, ts, value) VALUES (?, ?, ?, ?, ?, ?) USING TTL ?"
    )
    slice_ms = Layout().head_slice_ms
    for request in requests:
        partitions = defaultdict(list)
        for h, ts, value in request:
            slice_start, shard = ts - ts % slice_ms, zlib.crc32(h.encode()) % shards
            partitions[(slice_start, shard)].append((TENANT, slice_start, shard, h, ts, value, TTL_S))
        for rows in partitions.values():
            if serialized:
                yield head_batch(insert, rows, CONSISTENCY), ()
                continue
            batch = BatchStatement(BatchType.UNLOGGED)
            for row in rows:
                batch.add(insert, row)
            yield batch, ()


WAYS = [
    ("row a request (data_raw)", statements_raw_rows, 500),
    ("batches of 50 rows of 50 partitions (data_raw)", statements_raw_batches, 500),
    ("single-partition batches (data_head), S=500", statements_head, 500),
    ("single-partition batches (data_head), S=2000", statements_head, 2000),
    ("data_head, 64 shards, S=500", lambda *a: statements_head(*a, shards=64), 500),
    ("data_head S=500, values serialized (the gateway)", lambda *a: statements_head(*a, serialized=True), 500),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.head_batches", description=__doc__.splitlines()[0])
    parser.add_argument("--cassandra", metavar="HOST:PORT", required=True)
    parser.add_argument("--rows", type=int, default=100_000, help="rows written each way (default 100000)")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight (default 64)")
    parser.add_argument("--only", help="run only the ways whose name contains this")
    args = parser.parse_args(argv)
    host, port = parse_hostport(args.cassandra)
    cassandra_pid = listening_pid(port) if host in ("127.0.0.1", "localhost") else None
    cluster = connect(host, port)
    session = cluster.connect()
    keyspace = f"tsgate_bench_hb_{os.getpid()}"
    print(f"{'way':<48}{'rows':>8}{'rows/s':>9}{'client us/row':>15}{'cass us/row':>13}{'mutations/row':>15}")
    with fresh_keyspace(session, host, port, keyspace):
        if cassandra_pid:
            settle(cassandra_pid)
        for name, statements, series in WAYS:
            if args.only and args.only not in name:
                continue
            requests = requests_of(series, args.rows)
            rows = sum(len(r) for r in requests)
            mutations_before = mutations(session, keyspace)
            cassandra_before = process_cpu_s(cassandra_pid) if cassandra_pid else 0.0
            cpu, wall = time.process_time(), time.perf_counter()
            results = execute_concurrent(
                session,
                statements(session, keyspace, requests),
                concurrency=args.concurrency,
                raise_on_first_error=True,
            )
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            if not all(ok for ok, _ in results):
                raise BenchError(f"{name}: some requests failed")
            if cassandra_pid:
                settle(cassandra_pid)
            cassandra = (
                f"{(process_cpu_s(cassandra_pid) - cassandra_before) / rows * 1e6:.1f}" if cassandra_pid else "-"
            )
            time.sleep(2)  # the virtual table's counters lag a little
            per_row = (mutations(session, keyspace) - mutations_before) / rows
            print(f"{name:<48}{rows:>8}{rows / wall:>9.0f}{cpu / rows * 1e6:>15.1f}{cassandra:>13}{per_row:>15.3f}")
    cluster.shutdown()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    exit_with(main)
