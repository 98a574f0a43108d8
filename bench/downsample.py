"""Sealing against ingest, one run: does one ``tsgate downsample --once`` keep up with a gateway?

K connections x S series (half gauges, half cumulative counters) send one full 1 h slot of
samples, 10 s apart and three slots ago, through a real gateway's POST /api/v1/write
(``tsgate serve --roles ingest,query``, as bench.remote_write sends: one request per connection
and scrape round, timed from the first request to the last answer); the gateway is stopped, then
the real CLI ``tsgate downsample --once`` seals and rolls up every series-slot (timed). Printed:
both rates, the CPU of each side, and sealing / ingest (the target is at least 1.5). Roll-ups
are checked exactly afterwards. bench/README.rst tells how to run it and read the output.
"""

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from twisted.internet import defer, task, threads

from bench.common import BenchError, box_busy_s, exit_with, process_cpu_s
from bench.remote_write import Workload as RemoteWriteWorkload
from bench.remote_write import measure, started
from gateway.core.layout import Layout
from gateway.core.model import now_ms, series_set_hash, series_set_text
from gateway.downsample.aggregate import exact_sum
from gateway.store import open_store
from gateway.store.contract import time_slot

REPO = Path(__file__).resolve().parent.parent
TENANT = "bench"  # bench.remote_write.HEADERS' X-Scope-OrgID
GAUGE = "bench_gauge"
COUNTER = "bench_requests_total"
LAYOUT = Layout()
SLOT_MS = LAYOUT.slot_width_ms
INTERVAL_MS = 10_000
ROUNDS = SLOT_MS // INTERVAL_MS  # 360: one full slot
TIMEOUT_S = 900
TARGET_RATIO = 1.5  # issue 23: sealing at least 1.5 x ingest


class Workload(RemoteWriteWorkload):
    """bench.remote_write's requests, with half the series cumulative counters, over one full slot
    long settled (as the downsampler finds a slot after an outage or a backlog)."""

    def __init__(self, series_per_request: int, connections: int):
        self.slot = time_slot(now_ms(), SLOT_MS) - 3 * SLOT_MS
        super().__init__("sealing", series_per_request, connections, ROUNDS, self.slot + SLOT_MS - INTERVAL_MS)
        self.hashes = [
            series_set_hash(series_set_text(labels.pop("__name__"), labels))
            for labels in map(self.labels, range(self.series))
        ]

    def labels(self, i: int) -> dict[str, str]:
        return {"__name__": GAUGE if i % 2 == 0 else COUNTER, "host": f"h{i}", "dc": "dc1"}

    @staticmethod
    def value(i: int, r: int) -> float:
        """Gauges repeat 0..29 above i in every 5 m bucket; counters rise by 1 a sample (no reset)."""
        return float(i + (r % 30 if i % 2 == 0 else r))

    def expected(self, i: int, width_ms: int) -> list[tuple]:
        """Rows of a granularity as (ts, min, max, sum, count, last, increase), from the values
        sent. Counters: no sample before the slot, so the first increase starts at the first value."""
        values = np.array([self.value(i, r) for r in range(ROUNDS)])
        rows = []
        for start in range(0, ROUNDS, width_ms // INTERVAL_MS):
            bucket = values[start : start + width_ms // INTERVAL_MS]
            ts = self.slot + start * INTERVAL_MS
            if i % 2 == 0:
                rows.append((ts, bucket.min(), bucket.max(), exact_sum(bucket), len(bucket), None, None))
            else:
                first = values[start - 1] if start else bucket[0]
                rows.append((ts, None, None, None, None, bucket[-1], bucket[-1] - first))
        return rows


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
    started_at = time.perf_counter()
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
    seconds = time.perf_counter() - started_at
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if finished.returncode != 0:
        raise BenchError(f"tsgate downsample exited with {finished.returncode}:\n{finished.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return finished.stdout.strip(), seconds, cpu


def verify(reactor, store_url: str, workload: Workload) -> None:
    """Every series has its rows in every granularity, each with the exact aggregates of what was
    sent, read back through the store's own read_rollups (on the reactor; this runs in a thread)."""

    async def check():
        store = open_store(store_url, LAYOUT)
        await store.start()
        try:
            for granularity in LAYOUT.granularities:
                found = await defer.gatherResults(
                    [
                        store.read_rollups(granularity, TENANT, hash_, workload.slot, workload.slot + SLOT_MS - 1)
                        for hash_ in workload.hashes
                    ],
                    consumeErrors=True,
                )
                for i, rows in enumerate(found):
                    got = [(r.timestamp_ms, r.min, r.max, r.sum, r.count, r.last, r.increase) for r in rows]
                    want = workload.expected(i, granularity.width_ms)
                    if got != want:
                        raise BenchError(f"series {i} in {granularity.table}: got {got[:2]}..., expected {want[:2]}...")
        finally:
            await store.close()

    threads.blockingCallFromThread(reactor, lambda: defer.ensureDeferred(check()))
    print(f"verified: every series has exact roll-ups in {', '.join(g.table for g in LAYOUT.granularities)}")


def measure_store(reactor, target: str, args: argparse.Namespace, workload: Workload, workdir: Path) -> None:
    """Ingest through the gateway, then seal with the CLI, then check the roll-ups."""
    with started(target, args, workdir / target, ["--roles", "ingest,query"]) as (service, pids, store_url):
        ingest = measure(f"tsgate ({target})", service, pids, workload, TIMEOUT_S)
        if ingest.errors or ingest.acknowledged != workload.samples:
            raise BenchError(f"{ingest.acknowledged} of {workload.samples} samples acknowledged: {ingest.errors}")
        service.stop()  # the gateway's CPU stays out of sealing's, and SQLite has one process on the file
        load, box_before = os.getloadavg()[0], box_busy_s()
        cassandra_before = process_cpu_s(pids["cassandra"]) if "cassandra" in pids else None
        print(f"running: tsgate downsample --once ({target}) ...", file=sys.stderr, flush=True)
        output, seconds, cpu = run_downsampler(store_url, TIMEOUT_S)
        cassandra_cpu = process_cpu_s(pids["cassandra"]) - cassandra_before if cassandra_before is not None else None
        expected = f"rolled up {workload.series} series-slots; 0 left pending for a later round"
        if output != expected:
            raise BenchError(f"tsgate downsample printed {output!r}, expected {expected!r}")
        seal_rate = workload.samples / seconds
        print(
            f"{'tsgate (' + target + ')':<20}{'ingest':<8}{workload.samples:>9}{ingest.seconds:>9.2f}"
            f"{workload.series / ingest.seconds:>8.0f}{ingest.rate:>11.0f}"
            f"{ingest.cpu['target']:>13.1f}{fmt(ingest.cpu.get('cassandra'))}{ingest.cpu['box'] / ingest.seconds:>10.1f}"
        )
        print(
            f"{'tsgate (' + target + ')':<20}{'seal':<8}{workload.samples:>9}{seconds:>9.2f}"
            f"{workload.series / seconds:>8.0f}{seal_rate:>11.0f}{cpu:>13.1f}{fmt(cassandra_cpu)}{(box_busy_s() - box_before) / seconds:>10.1f}"
        )
        ratio = seal_rate / ingest.rate
        print(
            f"headline: tsgate ({target}): sealing {seal_rate:.0f} samples/s / ingest {ingest.rate:.0f} samples/s"
            f" = {ratio:.2f} ({'meets' if ratio >= TARGET_RATIO else 'BELOW'} the {TARGET_RATIO} target);"
            f" load average {load:.1f} before sealing",
            flush=True,
        )
        verify(reactor, store_url, workload)  # before the keyspace is dropped on the way out


def fmt(cpu_s: float | None) -> str:
    return f"{cpu_s:>11.1f}" if cpu_s is not None else f"{'-':>11}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.downsample", description=__doc__.splitlines()[0])
    parser.add_argument("--cassandra", metavar="HOST:PORT", help="use this Cassandra instead of starting one")
    parser.add_argument("--heap", default="1G", help="heap of the Cassandra started here (default 1G)")
    parser.add_argument(
        "--store",
        action="append",
        choices=("cassandra", "sqlite"),
        help="the stores to measure, in this order; repeatable (default: cassandra, then sqlite)",
    )
    parser.add_argument(
        "--series-per-request", type=int, default=2000, help="series (1 sample each) a request (default 2000)"
    )
    parser.add_argument("--concurrency", type=int, default=4, help="connections, each with its own series (default 4)")
    args = parser.parse_args(argv)
    args.store = args.store or ["cassandra", "sqlite"]
    if args.series_per_request < 1 or args.concurrency < 1:
        parser.error("--series-per-request and --concurrency must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print("encoding request bodies ...", file=sys.stderr, flush=True)
    workload = Workload(args.series_per_request, args.concurrency)
    print(
        f"sealing against ingest: {args.concurrency} connections x {args.series_per_request} series (half gauges,"
        f" half counters) x {ROUNDS} rounds = {workload.samples} samples, one 1 h slot each;"
        f" {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    print(
        f"{'store':<20}{'step':<8}{'samples':>9}{'seconds':>9}{'slots/s':>8}{'samples/s':>11}"
        f"{'tsgate CPU s':>13}{'cass CPU s':>11}{'box cores':>10}"
    )
    workdir = Path(tempfile.mkdtemp(prefix="tsgate-bench-ds-"))
    failed: list[BaseException] = []

    def every_store(reactor) -> None:
        for target in args.store:
            measure_store(reactor, target, args, workload, workdir)

    def run(reactor):
        # One reactor for the checks (it cannot restart); the blocking steps run in a thread.
        return threads.deferToThread(every_store, reactor).addErrback(lambda failure: failed.append(failure.value))

    try:
        task.react(run)
    except SystemExit:  # task.react always ends with sys.exit
        pass
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if failed:
        raise failed[0]
    return 0


if __name__ == "__main__":
    exit_with(main)
