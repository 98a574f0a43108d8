"""Downsampling throughput on a real Cassandra 5.0: does one ``tsgate downsample`` keep up with ingest?

N series x one full hour slot of raw points are written and marked pending (untimed), then the
real CLI ``tsgate downsample --once`` rolls them up as a subprocess (timed). bench/README.rst tells
how to run it and read the output.
"""

import argparse
import contextlib
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cassandra.concurrent import execute_concurrent_with_args
from twisted.internet import defer, task

from bench.common import BenchError, cassandra, connect, drop_keyspace, exit_with, process_cpu_s, settle
from gateway.core.layout import Layout
from gateway.core.model import SeriesKey, now_ms, series_set_hash, series_set_text
from gateway.downsample.partitions import partition_of
from gateway.downsample.pending import StorePending
from gateway.store.cassandra import CassandraStore
from gateway.store.contract import PendingSet, RawPoint, time_slot

REPO = Path(__file__).resolve().parent.parent
TENANT = "bench"
GAUGE = "bench_gauge"
COUNTER = "bench_requests_total"
INTERVAL_MS = 10_000
LAYOUT = Layout()
SLOT_MS = LAYOUT.slot_width_ms
POINTS = SLOT_MS // INTERVAL_MS  # 360: one full slot
BATCH = 5000
IN_FLIGHT = 8
# The gateway's default --downsample-partitions-count: pending rows must land where the CLI looks.
PARTITIONS = 64
# bench/ingest_cassandra.py's best known-series rate (bench/README.rst).
INGEST_RATE = 22900


class Workload:
    """Half gauges, half cumulative counters, with values whose roll-ups are easy to state exactly."""

    def __init__(self, series: int):
        # An old slot, long settled: as the downsampler finds it after an outage or a backlog.
        self.slot = time_slot(now_ms(), SLOT_MS) - 3 * SLOT_MS
        self.keys = []
        for i in range(series):
            metric = GAUGE if i % 2 == 0 else COUNTER
            tags = {"host": f"h{i}", "dc": "dc1"}
            self.keys.append(SeriesKey(TENANT, series_set_hash(series_set_text(metric, tags)), metric, tags))

    @staticmethod
    def value(i: int, j: int) -> float:
        """Gauges repeat 0..29 above i in every 5 m bucket; counters rise by 1 a sample (no reset)."""
        return float(i + (j % 30 if i % 2 == 0 else j))

    def points(self):
        for i, key in enumerate(self.keys):
            for j in range(POINTS):
                yield RawPoint(TENANT, key.series_set_hash, self.slot + j * INTERVAL_MS, self.value(i, j))

    def expected(self, i: int) -> tuple[list[tuple], tuple]:
        """(5 m rows, 1 h row) as (ts, min, max, sum, count, last, increase).

        Counters: no point before the slot, so the first bucket's increase misses one step.
        """
        buckets = range(self.slot, self.slot + SLOT_MS, 300_000)
        if i % 2 == 0:
            five = [(ts, i, i + 29, 30 * i + 435, 30, None, None) for ts in buckets]
            return five, (self.slot, i, i + 29, 360 * i + 12 * 435, 360, None, None)
        five = [(ts, None, None, None, None, i + 30 * k + 29, 29 if k == 0 else 30) for k, ts in enumerate(buckets)]
        return five, (self.slot, None, None, None, None, i + POINTS - 1, POINTS - 1)


def populate(store_url: str, workload: Workload) -> None:
    """Series metadata, raw points and pending marks through the store driver, as ingest writes them."""

    async def run(reactor):
        store = CassandraStore.from_url(store_url, LAYOUT)
        await store.start()
        try:
            for start in range(0, len(workload.keys), 1000):
                await store.write_series(workload.keys[start : start + 1000])
            points = list(workload.points())
            batches = [points[start : start + BATCH] for start in range(0, len(points), BATCH)]
            for start in range(0, len(batches), IN_FLIGHT):
                await defer.gatherResults(
                    [store.write_raw(batch) for batch in batches[start : start + IN_FLIGHT]], consumeErrors=True
                )
            pending = StorePending(store, SLOT_MS, delay_ms=0)
            await pending.track(
                [
                    PendingSet(
                        partition_of(TENANT, k.series_set_hash, PARTITIONS), workload.slot, TENANT, k.series_set_hash
                    )
                    for k in workload.keys
                ],
                now_ms(),
            )
        finally:
            await store.close()

    # task.react always ends with sys.exit (0 on success); the benchmark goes on afterwards.
    try:
        task.react(lambda reactor: defer.ensureDeferred(run(reactor)))
    except SystemExit as exit_:
        if exit_.code:
            raise BenchError(f"populating the store failed (exit {exit_.code})") from None


def run_downsampler(store_url: str, timeout_s: float | None = None) -> tuple[str, float, float]:
    """The real CLI, once, delay 0 s (every slot that has ended is settled); returns (its output,
    wall seconds, its CPU seconds)."""
    command = [
        sys.executable,
        "-m",
        "gateway.app.cli",
        "downsample",
        "--once",
        "--store",
        store_url,
        "--downsample-delay",
        "0s",
        "--log-level",
        "warning",
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if finished.returncode != 0:
        raise BenchError(f"tsgate downsample exited with {finished.returncode}:\n{finished.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return finished.stdout.strip(), seconds, cpu


def verify(session, keyspace: str, workload: Workload, sampled: list[int]) -> None:
    """12 rows in data_5m and 1 in data_1h per series; exact aggregates for the sampled series."""
    slot_end = workload.slot + SLOT_MS - 1
    for granularity, rows_per_series in zip(LAYOUT.granularities, (12, 1)):
        select = session.prepare(
            f"SELECT ts, min, max, sum, count, last, increase FROM {keyspace}.{granularity.table}"
            " WHERE tenant = ? AND series_set_hash = ? AND time_slot = ? AND ts >= ? AND ts <= ?"
        )
        partition = time_slot(workload.slot, granularity.partition_width_ms)
        parameters = [(TENANT, k.series_set_hash, partition, workload.slot, slot_end) for k in workload.keys]
        results = execute_concurrent_with_args(session, select, parameters, concurrency=64)
        found = [list(rows) for _, rows in results]
        wrong = sum(1 for rows in found if len(rows) != rows_per_series)
        if wrong:
            raise BenchError(f"{wrong} of {len(found)} series lack {rows_per_series} rows in {granularity.table}")
        for i in sampled:
            got = [tuple(row) for row in found[i]]
            five, hour = workload.expected(i)
            want = five if rows_per_series == 12 else [hour]
            if got != want:
                raise BenchError(f"series {i} in {granularity.table}: got {got[:2]}..., expected {want[:2]}...")
    print(
        f"verified: every series has 12 rows in data_5m and 1 in data_1h; series {sampled} have exact aggregates",
        file=sys.stderr,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.downsample", description=__doc__.splitlines()[0])
    parser.add_argument("--cassandra", metavar="HOST:PORT", help="use this Cassandra instead of starting one")
    parser.add_argument("--heap", default="1G", help="heap of the Cassandra started here (default 1G)")
    parser.add_argument(
        "--series", type=int, default=2000, help=f"series, each with one full slot of {POINTS} points (default 2000)"
    )
    parser.add_argument(
        "--ingest-rate",
        type=float,
        default=INGEST_RATE,
        help=f"ingest samples/s to compare with (default {INGEST_RATE}, bench/ingest_cassandra.py's best known-series rate)",
    )
    args = parser.parse_args(argv)
    if args.series < 2 or args.ingest_rate <= 0:
        parser.error("--series must be at least 2 and --ingest-rate positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workload = Workload(args.series)
    keyspace = f"tsgate_bench_ds_{os.getpid()}"
    with contextlib.ExitStack() as cleanup:
        workdir = Path(tempfile.mkdtemp(prefix="tsgate-bench-ds-"))
        cleanup.callback(shutil.rmtree, workdir, ignore_errors=True)
        host, port, cassandra_pid = cleanup.enter_context(cassandra(args.cassandra, workdir / "cassandra", args.heap))
        cluster = connect(host, port)
        cleanup.callback(cluster.shutdown)
        session = cluster.connect()
        cleanup.callback(drop_keyspace, session, keyspace)
        store_url = f"cassandra://{host}:{port}/{keyspace}"
        CassandraStore.from_url(store_url, LAYOUT).apply_schema()
        samples = args.series * POINTS
        print(
            f"tsgate downsample on Cassandra at {host}:{port} ({'given' if args.cassandra else 'started here'}), "
            f"keyspace {keyspace}: {args.series} series (half gauges, half counters) x {POINTS} points = {samples} samples; "
            f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        print("populating (untimed) ...", file=sys.stderr, flush=True)
        populate(store_url, workload)
        if cassandra_pid:
            print(f"cassandra settled after {settle(cassandra_pid):.0f}s", file=sys.stderr)

        print("running: tsgate downsample --once ...", file=sys.stderr, flush=True)
        cassandra_before = process_cpu_s(cassandra_pid) if cassandra_pid else None
        output, seconds, cpu = run_downsampler(store_url)
        cassandra_cpu = f"{process_cpu_s(cassandra_pid) - cassandra_before:.1f}" if cassandra_pid else "-"
        expected = f"rolled up {args.series} series-slots; 0 left pending for a later round"
        if output != expected:
            raise BenchError(f"tsgate downsample printed {output!r}, expected {expected!r}")
        verify(session, keyspace, workload, sorted({0, 1, args.series - 2, args.series - 1}))  # gauges and counters

        rate = samples / seconds
        print(
            f"{'series-slots':>13}{'raw samples':>13}{'seconds':>9}{'series-slots/s':>16}{'raw samples/s':>15}{'downsampler CPU s':>19}{'cassandra CPU s':>17}"
        )
        print(
            f"{args.series:>13}{samples:>13}{seconds:>9.2f}{args.series / seconds:>16.0f}{rate:>15.0f}{cpu:>19.1f}{cassandra_cpu:>17}"
        )
        ratio = rate / args.ingest_rate
        verdict = "keeps up" if ratio >= 1 else f"does NOT keep up: needs {math.ceil(1 / ratio)} downsamplers"
        print(
            f"keeps up: downsample raw samples/s / ingest rate = {rate:.0f} / {args.ingest_rate:.0f} = {ratio:.2f}   one downsampler {verdict}"
        )
    return 0


if __name__ == "__main__":
    exit_with(main)
