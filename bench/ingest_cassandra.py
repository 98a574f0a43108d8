"""Ingest throughput into a real Cassandra 5.0: the gateway's HTTP JSON path against a raw loader.

The raw loader writes the same data_raw rows with cassandra-driver and nothing else, as fast as
one Python process can, so "gateway / raw best" says how much of what Cassandra takes from a
Python client the gateway keeps. bench/README.rst tells how to run it and read the output.
"""

import argparse
import contextlib
import gc
import http.client
import json
import os
import queue
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from cassandra.concurrent import execute_concurrent, execute_concurrent_with_args
from cassandra.query import BatchStatement, BatchType

from bench.common import (
    CONSISTENCY,
    REQUEST_TIMEOUT_S,
    BenchError,
    Service,
    box_busy_s,
    cassandra,
    connect,
    drop_keyspace,
    exit_with,
    post_until_accepted,
    process_cpu_s,
    settle,
    tsgate_service,
)
from gateway.core.layout import Layout, head_shard
from gateway.core.model import now_ms, series_set_hash, series_set_text
from gateway.store.cassandra import CassandraStore
from gateway.store.cassandra_base import ROWS_PER_BATCH
from gateway.store.contract import time_slot
from protocols.timespec import format_iso

METRIC = "bench_metric"
INTERVAL_MS = 10_000
# The gateway's defaults (--slot-width, --raw-retention, ...): schema and raw rows must match what it writes.
LAYOUT = Layout()
# One tenant per path and round (the round number is appended), so no run overwrites another's
# rows and each is verified on its own.
GATEWAY_TENANT = "bench"
ROWS_TENANT = "bench_raw_rows"
BATCHES_TENANT = "bench_raw_batches"
WARMUP_TENANT = "bench_warmup"
TARGET_RATIO = 0.8


class Workload:
    """N series x M points 10 s apart ending now; every path writes exactly these samples."""

    def __init__(self, series: int, points: int, order: str):
        end = now_ms() // INTERVAL_MS * INTERVAL_MS
        self.timestamps = [end - (points - 1 - j) * INTERVAL_MS for j in range(points)]
        self.tags = [{"host": f"h{i}", "dc": "dc1"} for i in range(series)]
        self.hashes = [series_set_hash(series_set_text(METRIC, tags)) for tags in self.tags]
        if order == "series":
            self.samples = [(i, j) for i in range(series) for j in range(points)]
        else:
            self.samples = [(i, j) for j in range(points) for i in range(series)]

    @staticmethod
    def value(i: int, j: int) -> float:
        """Exact in binary and in JSON, so any difference read back is a real one."""
        return i + j / 1024

    def rows(self, tenant: str) -> list[tuple]:
        """data_raw rows (tenant, series_set_hash, time_slot, ts, value) in sample order."""
        rows = []
        for i, j in self.samples:
            ts = self.timestamps[j]
            rows.append((tenant, self.hashes[i], time_slot(ts, LAYOUT.slot_width_ms), ts, self.value(i, j)))
        return rows

    def partitions(self) -> dict[tuple[str, int], dict[int, float]]:
        """What each data_raw partition (series_set_hash, time_slot) of a tenant must hold: {ts: value}."""
        expected = defaultdict(dict)
        for _, hash_, slot, ts, value in self.rows(""):
            expected[(hash_, slot)][ts] = value
        return expected

    def bodies(self, batch: int) -> list[bytes]:
        """POST /api/write bodies, encoded before timing so the client costs next to nothing."""
        bodies = []
        for start in range(0, len(self.samples), batch):
            items = [
                {"metricName": METRIC, "tags": self.tags[i], "ts": self.timestamps[j], "value": self.value(i, j)}
                for i, j in self.samples[start : start + batch]
            ]
            bodies.append(json.dumps(items, separators=(",", ":")).encode())
        return bodies


class Result(NamedTuple):
    path: str
    round: int
    samples: int
    seconds: float
    cpu: dict[str, float]  # CPU seconds used during the run: client, box, and each process measured


def measure(path: str, round_: int, samples: int, pids: dict[str, int], run) -> tuple[Result, object]:
    """Time run() and the CPU this process, the named processes and the whole box used meanwhile.

    The driver leaves its requests in reference cycles: collect the last path's garbage first, so
    that its cost (seconds, after 100k requests) does not land on the path measured next.
    """

    def snapshot() -> dict[str, float]:
        return {
            "client": time.process_time(),
            "box": box_busy_s(),
            **{name: process_cpu_s(pid) for name, pid in pids.items()},
        }

    print(f"running: {path}, round {round_} ...", file=sys.stderr, flush=True)
    gc.collect()
    before = snapshot()
    started = time.perf_counter()
    outcome = run()
    seconds = time.perf_counter() - started
    after = snapshot()
    return Result(path, round_, samples, seconds, {name: after[name] - before[name] for name in after}), outcome


def post_all(port: int, bodies: list[bytes], tenant: str, connections: int) -> int:
    """POST every body to /api/write over keep-alive connections; return how many 503s were retried.

    200 means every sample is stored; 503 (overloaded or store unavailable) is retried as a
    sender would, for at most RETRY_503_FOR_S a body; any other answer fails the run.
    """
    pending = queue.SimpleQueue()
    for body in bodies:
        pending.put(body)
    headers = {"Content-Type": "application/json", "X-Tenant": tenant}

    def sender() -> int:
        retried = 0
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
        try:
            while True:
                try:
                    body = pending.get_nowait()
                except queue.Empty:
                    return retried
                retried += post_until_accepted(connection, "/api/write", body, headers, 200)
        finally:
            connection.close()

    with ThreadPoolExecutor(connections) as pool:
        senders = [pool.submit(sender) for _ in range(connections)]
        return sum(sender.result() for sender in senders)


def prepare_insert(session, keyspace: str):
    """The data_raw insert of the gateway before data_head (a partition a series-slot), columns and TTL as it was."""
    return session.prepare(
        f"INSERT INTO {keyspace}.data_raw (tenant, series_set_hash, time_slot, ts, value) "
        f"VALUES (?, ?, ?, ?, ?) USING TTL {LAYOUT.raw_retention_ms // 1000}"
    )


def load_rows(session, insert, rows: list[tuple], inflight: int) -> None:
    """One request per row, `inflight` at a time."""
    execute_concurrent_with_args(session, insert, rows, concurrency=inflight)


def load_batches(session, insert, rows: list[tuple], inflight: int) -> None:
    """Single-partition UNLOGGED batches of up to ROWS_PER_BATCH rows, as the gateway sends them.

    The loader groups the whole workload by partition; the gateway can only group within one request.
    """
    execute_concurrent(session, ((batch, ()) for batch in partition_batches(insert, rows)), concurrency=inflight)


def partition_batches(insert, rows: list[tuple]):
    """Yield UNLOGGED batches of up to ROWS_PER_BATCH rows of one data_raw partition each."""
    partitions = defaultdict(list)
    for row in rows:
        partitions[row[:3]].append(row)
    for partition_rows in partitions.values():
        for start in range(0, len(partition_rows), ROWS_PER_BATCH):
            batch = BatchStatement(BatchType.UNLOGGED, consistency_level=CONSISTENCY)
            for row in partition_rows[start : start + ROWS_PER_BATCH]:
                batch.add(insert, row)
            yield batch


def verify_rows(
    session, keyspace: str, tenant: str, expected: dict[tuple[str, int], dict[int, float]], table: str = "data_raw"
) -> None:
    """Read back every series-slot of the tenant; every row must be there with its value. ``table``
    is data_raw (the raw loader's rows) or data_head (the gateway's: the slot's slices of the
    series' shard)."""
    if table == "data_head":
        select = session.prepare(
            f"SELECT ts, value FROM {keyspace}.data_head WHERE tenant = ? AND slice IN ? AND shard = ? AND series_set_hash = ?"
        )
        layout = Layout()
        parameters = [
            (tenant, layout.head_slices(slot, slot, slot + layout.slot_width_ms - 1), head_shard(hash_), hash_)
            for hash_, slot in expected
        ]
    else:
        select = session.prepare(
            f"SELECT ts, value FROM {keyspace}.data_raw WHERE tenant = ? AND series_set_hash = ? AND time_slot = ?"
        )
        parameters = [(tenant, hash_, slot) for hash_, slot in expected]
    keys = list(expected)
    results = execute_concurrent_with_args(session, select, parameters, concurrency=64)
    found = wrong = 0
    for key, (_, rows) in zip(keys, results):
        stored = {row.ts: row.value for row in rows}
        found += len(stored)
        wrong += sum(1 for ts, value in expected[key].items() if stored.get(ts) != value)
    wanted = sum(len(points) for points in expected.values())
    if found != wanted or wrong:
        raise BenchError(f"tenant {tenant}: {found} of {wanted} rows in {table}, {wrong} missing or with a wrong value")
    print(f"verified: tenant {tenant} has all {wanted} rows in {table}", file=sys.stderr)


def verify_query(gateway: Service, tenant: str, workload: Workload) -> None:
    """The gateway's read path (series index, then data) must return every sample it acknowledged."""
    start, end = workload.timestamps[0], workload.timestamps[-1]
    status, body = gateway.get(f"/api/query?metricName={METRIC}&start={start}&end={end}", headers={"X-Tenant": tenant})
    if status != 200:
        raise BenchError(f"GET /api/query answered {status}: {body[:500]!r}")
    got = {series["tags"]["host"]: series["values"] for series in json.loads(body)}
    expected = {
        tags["host"]: {format_iso(ts): workload.value(i, j) for j, ts in enumerate(workload.timestamps)}
        for i, tags in enumerate(workload.tags)
    }
    if got != expected:
        points = sum(len(values) for values in got.values())
        raise BenchError(
            f"GET /api/query returned {len(got)} series and {points} points, not exactly the "
            f"{len(expected)} series and {len(workload.samples)} points written"
        )
    print(
        f"verified: GET /api/query for tenant {tenant} returns all {len(got)} series and {len(workload.samples)} points",
        file=sys.stderr,
    )


def print_report(results: list[Result]) -> None:
    """One line per path and round, then each gateway path's best rate over the best raw rate."""
    rounds = max(result.round for result in results)
    print(
        f"{'path':<36}{'samples':>9}{'seconds':>9}{'samples/s':>11}"
        f"{'client CPU s':>14}{'gateway CPU s':>15}{'cassandra CPU s':>17}{'box busy cores':>16}"
    )
    for result in results:
        label = f"{result.path} #{result.round}" if rounds > 1 else result.path
        cpu = {name: f"{seconds:.1f}" for name, seconds in result.cpu.items()}
        print(
            f"{label:<36}{result.samples:>9}{result.seconds:>9.2f}{result.samples / result.seconds:>11.0f}"
            f"{cpu['client']:>14}{cpu.get('gateway', '-'):>15}{cpu.get('cassandra', '-'):>17}"
            f"{result.cpu['box'] / result.seconds:>16.2f}"
        )
    best: dict[str, float] = {}
    for result in results:
        best[result.path] = max(best.get(result.path, 0), result.samples / result.seconds)
    raw_path = max((path for path in best if path.startswith("raw")), key=best.get, default=None)
    for path in best:
        if path.startswith("gateway") and raw_path:
            ratio = best[path] / best[raw_path]
            verdict = "met" if ratio >= TARGET_RATIO else "MISSED"
            print(
                f"{path} / {raw_path} = {best[path]:.0f} / {best[raw_path]:.0f} = {ratio:.2f}   target >= {TARGET_RATIO}: {verdict}"
            )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest_cassandra", description=__doc__.splitlines()[0])
    parser.add_argument("--cassandra", metavar="HOST:PORT", help="use this Cassandra instead of starting one")
    parser.add_argument("--heap", default="1G", help="heap of the Cassandra started here (default 1G)")
    parser.add_argument("--series", type=int, default=1000, help="series (default 1000)")
    parser.add_argument("--points", type=int, default=100, help="points per series, 10 s apart (default 100)")
    parser.add_argument(
        "--order",
        choices=["series", "time"],
        default="series",
        help="series: a series' points are adjacent (default); time: one point of every series, then the next",
    )
    parser.add_argument("--batch", type=int, default=2000, help="samples per POST /api/write (default 2000)")
    parser.add_argument("--concurrency", type=int, default=4, help="parallel HTTP connections (default 4)")
    parser.add_argument(
        "--raw-inflight",
        type=int,
        default=256,
        help="raw loader requests in flight (default 256, the gateway's max_inflight)",
    )
    parser.add_argument(
        "--warmup", type=int, default=20000, help="samples every path writes first, untimed (default 20000)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every path this many times; the ratio uses the best of each (default 1)",
    )
    parser.add_argument("--skip-gateway", action="store_true", help="measure the raw loader only")
    parser.add_argument("--skip-raw", action="store_true", help="measure the gateway only")
    args = parser.parse_args(argv)
    if (
        min(args.series, args.points, args.batch, args.concurrency, args.raw_inflight, args.rounds) < 1
        or args.warmup < 0
    ):
        parser.error("sizes must be positive")
    if args.skip_gateway and args.skip_raw:
        parser.error("--skip-gateway and --skip-raw leave nothing to measure")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workload = Workload(args.series, args.points, args.order)
    expected = workload.partitions()
    bodies = workload.bodies(args.batch)
    keyspace = f"tsgate_bench_{os.getpid()}"
    results: list[Result] = []
    with contextlib.ExitStack() as cleanup:
        workdir = Path(tempfile.mkdtemp(prefix="tsgate-bench-"))
        cleanup.callback(shutil.rmtree, workdir, ignore_errors=True)
        host, port, cassandra_pid = cleanup.enter_context(cassandra(args.cassandra, workdir / "cassandra", args.heap))
        pids = {"cassandra": cassandra_pid} if cassandra_pid else {}
        cluster = connect(host, port)
        cleanup.callback(cluster.shutdown)
        session = cluster.connect()
        cleanup.callback(drop_keyspace, session, keyspace)
        store_url = f"cassandra://{host}:{port}/{keyspace}"
        CassandraStore.from_url(store_url, LAYOUT).apply_schema()
        insert = prepare_insert(session, keyspace)
        version = session.execute("SELECT release_version FROM system.local").one().release_version
        print(
            f"tsgate ingest into Cassandra {version} at {host}:{port} ({'given' if args.cassandra else 'started here'}), "
            f"keyspace {keyspace}: {args.series} series x {args.points} points = {len(workload.samples)} samples, "
            f"{args.order} order; gateway: {args.batch} samples per POST, {args.concurrency} connections; "
            f"raw: data_raw rows only (no metadata), {args.raw_inflight} requests in flight; "
            f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        gateway = None
        if not args.skip_gateway:
            gateway = tsgate_service(
                "gateway",
                ["--store", store_url],
                workdir / "gateway.log",
                # No roll-ups in this process: they run in the background and would blur the ingest figures.
                ["--roles", "ingest,query", "--max-body-bytes", str(max(10 << 20, max(map(len, bodies))))],
            )
            cleanup.callback(gateway.stop)
            gateway.start()

        # A fresh JVM compiles Cassandra's hot paths (C2) for tens of seconds: without this, that
        # CPU lands on whichever path is measured first, and on 2 cores it slows the gateway too.
        print(f"warming up: {args.warmup} samples through every path ...", file=sys.stderr, flush=True)
        warmup_rows = workload.rows(WARMUP_TENANT)[: args.warmup]
        if gateway:
            post_all(gateway.port, bodies[: -(-args.warmup // args.batch)], WARMUP_TENANT, args.concurrency)
        if not args.skip_raw:
            load_rows(session, insert, warmup_rows, args.raw_inflight)
            load_batches(session, insert, warmup_rows, args.raw_inflight)
        if "cassandra" in pids:
            print(f"cassandra settled after {settle(pids['cassandra']):.0f}s", file=sys.stderr)

        for round_ in range(1, args.rounds + 1):
            if gateway:
                # First the series are new (their metadata is written), then known: the same bodies
                # again, which only (over)write data_raw, as a steady stream of samples does.
                tenant = f"{GATEWAY_TENANT}{round_}"
                for path in ("gateway HTTP JSON, new series", "gateway HTTP JSON, known series"):
                    result, retried = measure(
                        path,
                        round_,
                        len(workload.samples),
                        {**pids, "gateway": gateway.pid},
                        lambda: post_all(gateway.port, bodies, tenant, args.concurrency),
                    )
                    results.append(result)
                    if retried:
                        print(f"note: the gateway answered 503 {retried} times (retried)", file=sys.stderr)
                    verify_rows(session, keyspace, tenant, expected, "data_head")
                verify_query(gateway, tenant, workload)
            if not args.skip_raw:
                for path, tenant, load in (
                    ("raw loader, per-row async", f"{ROWS_TENANT}{round_}", load_rows),
                    ("raw loader, partition batches", f"{BATCHES_TENANT}{round_}", load_batches),
                ):
                    rows = workload.rows(tenant)
                    result, _ = measure(
                        path, round_, len(rows), pids, lambda: load(session, insert, rows, args.raw_inflight)
                    )
                    results.append(result)
                    verify_rows(session, keyspace, tenant, expected)

        print_report(results)
    return 0


if __name__ == "__main__":
    exit_with(main)
