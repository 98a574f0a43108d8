"""Prometheus remote-write receive throughput: tsgate beside Prometheus and VictoriaMetrics.

Every target gets the same POST /api/v1/write bodies (snappy + protobuf WriteRequest 1.0),
all encoded before any timing, over the same keep-alive connections, one target at a time,
so the ratios printed come from one run on one (possibly noisy) box. Targets, in run order:

  prometheus          Debian's prometheus (2.42) with --web.enable-remote-write-receiver
  victoria-metrics    Debian's single-node victoria-metrics
  tsgate (sqlite)     the gateway on its embedded SQLite store
  tsgate (cassandra)  the gateway on a Cassandra 5.0 started here (or --cassandra HOST:PORT)

Each is started on a free loopback port with its data in a temporary directory, and stopped
before the next one starts, so an idle target never takes CPU from a measured one. A target
whose binary is missing shows as "not installed".

The workload has the shape Prometheus sends: --concurrency K connections play K remote-write
shards; each owns S series (--series-per-request) of one metric with 5 labels and sends one
request per scrape round holding one sample of each of its series, rounds 10 s apart and in
order, so the same series get a new sample every round and none arrives out of order.
--requests R per size (default: about 200k samples) is split evenly between the connections.
Before its timed runs every target takes a few untimed warm-up rounds of other series, then
the bench waits until the target's processes are idle (tsgate starts its other workers and query
executors after it answers: their start-up is not ingest CPU). Each timed run is preceded by one
untimed round of its own series, so it measures known series, as a receiver sees them after
Prometheus's first round (a new series costs tsgate its index rows: ten Cassandra rows);
--new-series times that first round too.

Run from the repository root:

    python -m bench.remote_write                        # all targets, S = 500 and 2000
    python -m bench.remote_write --requests 40          # a quick check
    python -m bench.remote_write --cassandra 127.0.0.1:9042 --skip sqlite --skip prometheus

Reading the table: samples/s counts acknowledged (2xx) samples only; errors are non-2xx
answers, failed connections and requests left unsent at the run timeout, detailed below the
table. CPU columns are the CPU seconds a process used during the timed run: the target (for
tsgate its parent and worker processes), the Cassandra under tsgate, and this client ("client",
which must stay well below the target's); "cores" is target CPU / wall time (a Python process
tops out near 1), "us/smp" target CPU microseconds per acknowledged sample (the least noisy
figure on a shared box), "cass us" Cassandra's; with --cassandra 127.0.0.1:PORT Cassandra is the
process listening there, whose CPU includes whatever else uses it meanwhile. "box" is the busy
cores of the whole machine (other people's load included). "vs prom" and "vs VM" divide tsgate's
samples/s by theirs at the same size. The "headline" lines below the table repeat, per tsgate
run, the rate, its ratio to Prometheus's receiver and the CPU per sample of the gateway and of
Cassandra. Prometheus and VictoriaMetrics answer once samples are in memory (and in
Prometheus's WAL), tsgate once its store has them (SQLite: committed).

After its timed runs tsgate is checked, untimed, through GET /api/query: every sample of the
run must read back with its value (at least as many as were acknowledged). Exit status 1 when
a target failed or a check did not pass.
"""

import argparse
import contextlib
import http.client
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from bench.common import (
    BenchError,
    Service,
    box_busy_s,
    cassandra,
    connect,
    drop_keyspace,
    listening_pid,
    process_cpu_s,
    tree_cpu_s,
    tsgate_service,
    wait_until_idle,
)
from gateway.app.devservices.process import free_port
from gateway.core.layout import Layout
from gateway.core.model import now_ms
from gateway.store.cassandra import CassandraStore
from protocols.prometheus import WriteSeries, encode_write_request_v1
from protocols.timespec import format_iso

# --skip name -> table name, in run order.
TARGETS = {
    "prometheus": "prometheus",
    "victoria-metrics": "victoria-metrics",
    "sqlite": "tsgate (sqlite)",
    "cassandra": "tsgate (cassandra)",
}
METRIC = "bench_metric"
TENANT = "bench"
INTERVAL_MS = 10_000
SAMPLES_PER_SIZE = 200_000
WARMUP_SERIES_PER_REQUEST = 500
# What Prometheus's remote-write client sends; X-Scope-OrgID names tsgate's tenant, the others ignore it.
HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
    "User-Agent": "tsgate-bench",
    "X-Scope-OrgID": TENANT,
}
REQUEST_TIMEOUT_S = 60
START_TIMEOUT_S = 60
CHECK_TIMEOUT_S = 300


class Workload:
    """K shards x S series of one job, one request per shard and scrape round, encoded up front."""

    def __init__(self, job: str, series_per_request: int, connections: int, rounds: int, end_ms: int):
        self.job = job
        self.series_per_request = series_per_request
        self.series = series_per_request * connections
        self.timestamps = [end_ms - (rounds - 1 - r) * INTERVAL_MS for r in range(rounds)]
        labels = [self.labels(i) for i in range(self.series)]
        # bodies[k][r]: shard k's request of round r; a shard sends its rounds in order.
        self.bodies = [
            [
                encode_write_request_v1(
                    WriteSeries(labels[i], [(ts, self.value(i, r))])
                    for i in range(k * series_per_request, (k + 1) * series_per_request)
                )
                for r, ts in enumerate(self.timestamps)
            ]
            for k in range(connections)
        ]
        self.requests = connections * rounds
        self.samples = self.requests * series_per_request

    def labels(self, i: int) -> dict[str, str]:
        """5 labels as a node exporter's would look; ten series per instance."""
        return {"__name__": METRIC, "job": self.job, "instance": f"host{i // 10}:9100", "i": str(i), "region": "eu-1"}

    def introduction(self) -> "Workload":
        """One round of the same series just before the timed ones, sent untimed: the timed run then
        measures known series, as a receiver sees them after Prometheus's first round."""
        return Workload(self.job, self.series_per_request, len(self.bodies), 1, self.timestamps[0] - INTERVAL_MS)

    @staticmethod
    def value(i: int, r: int) -> float:
        """Exact in binary and in JSON, so any difference read back is a real one."""
        return i + r / 1024


def prometheus_service(binary: str, workdir: Path) -> Service:
    port = free_port()
    config = workdir / "prometheus.yml"
    config.write_text("scrape_configs: []\n")
    command = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-remote-write-receiver",
        "--log.level=warn",
    ]
    return Service("prometheus", command, port, "/-/ready", workdir / "prometheus.log")


def victoria_metrics_service(binary: str, workdir: Path) -> Service:
    port = free_port()
    command = [
        binary,
        f"-storageDataPath={workdir / 'data'}",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-loggerLevel=WARN",
    ]
    return Service("victoria-metrics", command, port, "/health", workdir / "victoria-metrics.log")


@contextlib.contextmanager
def started(target: str, args: argparse.Namespace, workdir: Path, tsgate_args: list[str] = ()):
    """Yield (running service, other pids to measure, tsgate's store URL or None); stop all of it
    on the way out. ``tsgate_args`` go to a tsgate target's command line."""
    workdir.mkdir(parents=True)
    with contextlib.ExitStack() as stack:
        pids: dict[str, int] = {}
        store_url = None
        if target == "prometheus":
            service = prometheus_service(shutil.which("prometheus"), workdir)
        elif target == "victoria-metrics":
            service = victoria_metrics_service(shutil.which("victoria-metrics"), workdir)
        elif target == "sqlite":
            store_url = f"sqlite:///{workdir / 'tsgate.db'}"
            service = tsgate_service(TARGETS[target], ["--store", store_url], workdir / "tsgate.log", tsgate_args)
        else:
            host, port, cassandra_pid = stack.enter_context(cassandra(args.cassandra, workdir / "cassandra", args.heap))
            if cassandra_pid is None and host in ("127.0.0.1", "localhost"):
                # A Cassandra we were given on this box: its CPU counts too (other clients' included).
                cassandra_pid = listening_pid(port)
            if cassandra_pid:
                # The store's CPU time is part of tsgate's cost.
                pids["cassandra"] = cassandra_pid
            keyspace = f"tsgate_bench_rw_{os.getpid()}"
            # Layout() holds the gateway's defaults, which it serves with here.
            CassandraStore.from_url(f"cassandra://{host}:{port}/{keyspace}", Layout()).apply_schema()
            if args.cassandra:
                # Leave a Cassandra we were given as we found it.
                cluster = stack.enter_context(connect(host, port))
                stack.callback(drop_keyspace, cluster.connect(), keyspace)
            store_url = f"cassandra://{host}:{port}/{keyspace}"
            service = tsgate_service(TARGETS[target], ["--store", store_url], workdir / "tsgate.log", tsgate_args)
        stack.callback(service.stop)
        service.start(START_TIMEOUT_S)
        yield service, pids, store_url


def send(port: int, workload: Workload, timeout_s: float) -> tuple[int, dict[str, list]]:
    """POST every body, one thread and keep-alive connection per shard; return (samples acknowledged, errors).

    errors maps a kind ("HTTP 400", an exception name, "not sent") to [count, first message].
    A failed connection is reopened for the next request; nothing is retried.
    """
    deadline = time.monotonic() + timeout_s
    stop = threading.Event()
    lock = threading.Lock()
    errors: dict[str, list] = {}

    def note(kind: str, message: str, count: int = 1) -> None:
        with lock:
            errors.setdefault(kind, [0, message])[0] += count

    def shard(bodies: list[bytes]) -> int:
        acknowledged = 0
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
        try:
            for sent, body in enumerate(bodies):
                if stop.is_set() or time.monotonic() > deadline:
                    note("not sent", "run timeout or interrupted", len(bodies) - sent)
                    break
                try:
                    connection.request("POST", "/api/v1/write", body, HEADERS)
                    response = connection.getresponse()
                    answer = response.read()
                except (OSError, http.client.HTTPException) as error:
                    note(type(error).__name__, str(error))
                    connection.close()
                    continue
                if 200 <= response.status < 300:
                    acknowledged += workload.series_per_request
                else:
                    note(f"HTTP {response.status}", answer[:300].decode(errors="replace"))
            return acknowledged
        finally:
            connection.close()

    with ThreadPoolExecutor(len(workload.bodies)) as pool:
        futures = [pool.submit(shard, bodies) for bodies in workload.bodies]
        try:
            acknowledged = sum(future.result() for future in futures)
        finally:
            stop.set()
    return acknowledged, errors


class Row(NamedTuple):
    target: str
    size: int
    requests: int
    acknowledged: int = 0
    errors: dict[str, list] = {}
    seconds: float = 0.0
    cpu: dict[str, float] = {}  # CPU seconds during the run: target, cassandra, client, box
    note: str = ""

    @property
    def rate(self) -> float:
        return self.acknowledged / self.seconds if self.seconds else 0.0


def measure(name: str, service: Service, pids: dict[str, int], workload: Workload, timeout_s: float) -> Row:
    """Time one workload against one target, with the CPU every process involved used meanwhile."""

    def snapshot() -> dict[str, float]:
        return {
            "client": time.process_time(),
            "box": box_busy_s(),
            # the gateway's workers are children of the process started
            "target": tree_cpu_s(service.pid),
            **{key: process_cpu_s(pid) for key, pid in pids.items()},
        }

    print(
        f"running: {name}, {workload.requests} x {workload.series_per_request} series ...", file=sys.stderr, flush=True
    )
    before = snapshot()
    started_at = time.perf_counter()
    acknowledged, errors = send(service.port, workload, timeout_s)
    seconds = time.perf_counter() - started_at
    after = snapshot()
    cpu = {key: after[key] - before[key] for key in after}
    return Row(name, workload.series_per_request, workload.requests, acknowledged, errors, seconds, cpu)


def check_tsgate(service: Service, workload: Workload, acknowledged: int) -> str:
    """Read the run's series back through GET /api/query; every stored sample must have its value."""
    query = urllib.parse.urlencode(
        {
            "metricName": METRIC,
            "tag": f"job={workload.job}",
            "start": workload.timestamps[0],
            "end": workload.timestamps[-1],
            "tenant": TENANT,
        }
    )
    started_at = time.perf_counter()
    status, body = service.get(f"/api/query?{query}", CHECK_TIMEOUT_S)
    if status != 200:
        raise BenchError(f"{service.name}: GET /api/query answered {status}: {body[:500]!r}")
    rounds = {format_iso(ts): r for r, ts in enumerate(workload.timestamps)}
    stored = wrong = 0
    for series in json.loads(body):
        i = int(series["tags"]["i"])
        for moment, value in series["values"].items():
            stored += 1
            if moment not in rounds or not 0 <= i < workload.series or value != workload.value(i, rounds[moment]):
                wrong += 1
    if wrong or stored < acknowledged:
        raise BenchError(
            f"{service.name}, S={workload.series_per_request}: {stored} samples read back, {wrong} of them wrong "
            f"or unexpected; {acknowledged} acknowledged of {workload.samples} sent"
        )
    return f"checked: {stored}/{workload.samples} read back in {time.perf_counter() - started_at:.1f}s"


def per_sample_us(cpu_s: float | None, samples: int) -> str:
    return f"{cpu_s / samples * 1e6:.1f}" if cpu_s is not None and samples else "-"


def print_table(rows: list[Row]) -> None:
    rates = {(row.target, row.size): row.rate for row in rows}

    def ratio(row: Row, other: str) -> str:
        theirs = rates.get((other, row.size))
        return f"{row.rate / theirs:.4f}" if row.target.startswith("tsgate") and theirs else "-"

    print(
        f"{'target':<19}{'S':>5}{'reqs':>6}{'acked':>8}{'errors':>7}{'wall s':>8}{'samples/s':>10}"
        f"{'CPU s':>7}{'cores':>6}{'us/smp':>7}{'cass CPU':>9}{'cass us':>8}{'client':>7}{'box':>5}"
        f"{'vs prom':>9}{'vs VM':>8}  note"
    )
    for row in rows:
        if not row.seconds:
            print(f"{row.target:<19}{row.size:>5}{row.requests:>6}  {row.note}")
            continue
        cpu = row.cpu
        cassandra = f"{cpu['cassandra']:.1f}" if "cassandra" in cpu else "-"
        print(
            f"{row.target:<19}{row.size:>5}{row.requests:>6}{row.acknowledged:>8}"
            f"{sum(count for count, _ in row.errors.values()):>7}{row.seconds:>8.2f}{row.rate:>10.0f}"
            f"{cpu['target']:>7.1f}{cpu['target'] / row.seconds:>6.2f}"
            f"{per_sample_us(cpu['target'], row.acknowledged):>7}{cassandra:>9}"
            f"{per_sample_us(cpu.get('cassandra'), row.acknowledged):>8}"
            f"{cpu['client']:>7.1f}{cpu['box'] / row.seconds:>5.1f}"
            f"{ratio(row, 'prometheus'):>9}{ratio(row, 'victoria-metrics'):>8}  {row.note}"
        )
    for row in rows:
        for kind, (count, first) in row.errors.items():
            print(f"errors: {row.target} S={row.size}: {count} x {kind}, first: {first}")
    print_headlines(rows, rates)


def print_headlines(rows: list[Row], rates: dict[tuple[str, int], float]) -> None:
    """One line per tsgate run with the issue's figures: acked rate, its ratio to Prometheus's
    receiver on the same requests, and the CPU microseconds a sample of the gateway and of Cassandra."""
    for row in rows:
        if not (row.target.startswith("tsgate") and row.seconds):
            continue
        prometheus = rates.get(("prometheus", row.size))
        versus = f"{row.rate / prometheus:.3f} of Prometheus's {prometheus:.0f}/s" if prometheus else "no Prometheus"
        cassandra = (
            f", Cassandra {per_sample_us(row.cpu['cassandra'], row.acknowledged)} us CPU/sample"
            if "cassandra" in row.cpu
            else ""
        )
        print(
            f"headline: {row.target}, S={row.size}: {row.rate:.0f} samples/s acked ({versus}); "
            f"gateway {per_sample_us(row.cpu['target'], row.acknowledged)} us CPU/sample{cassandra}"
        )


def sizes(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise ValueError(f"{text!r}: sizes must be positive")
    return values


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.remote_write", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--series-per-request",
        type=sizes,
        action="append",
        metavar="S[,S...]",
        help="series (1 sample each) per request; repeatable or comma-separated (default 500,2000)",
    )
    parser.add_argument("--requests", type=int, help=f"requests per size (default: {SAMPLES_PER_SIZE} samples / S)")
    parser.add_argument("--concurrency", type=int, default=4, help="connections, one per shard (default 4)")
    parser.add_argument(
        "--warmup-rounds",
        type=int,
        default=10,
        help="untimed rounds of other series each target takes first (default 10)",
    )
    parser.add_argument(
        "--new-series",
        action="store_true",
        help="time each series' first sample too (default: one untimed round of them first)",
    )
    parser.add_argument("--skip", action="append", choices=TARGETS, default=[], help="leave a target out; repeatable")
    parser.add_argument("--cassandra", metavar="HOST:PORT", help="use this Cassandra instead of starting one")
    parser.add_argument("--heap", default="1G", help="heap of the Cassandra started here (default 1G)")
    parser.add_argument(
        "--run-timeout",
        type=float,
        default=600,
        help="seconds one timed run may take; the rest is left unsent (default 600)",
    )
    args = parser.parse_args(argv)
    args.series_per_request = [s for group in args.series_per_request or [[500, 2000]] for s in group]
    if args.concurrency < 1 or args.warmup_rounds < 0 or (args.requests is not None and args.requests < 1):
        parser.error("--concurrency and --requests must be positive, --warmup-rounds not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    end_ms = now_ms() // INTERVAL_MS * INTERVAL_MS
    print("encoding request bodies ...", file=sys.stderr, flush=True)
    workloads = []
    for size in args.series_per_request:
        requests = args.requests or math.ceil(SAMPLES_PER_SIZE / size)
        rounds = math.ceil(requests / args.concurrency)
        workloads.append(Workload(f"bench{size}", size, args.concurrency, rounds, end_ms))
    warmup = Workload("warmup", WARMUP_SERIES_PER_REQUEST, args.concurrency, args.warmup_rounds, end_ms)
    shapes = ", ".join(f"{w.requests} x {w.series_per_request}" for w in workloads)
    print(
        f"remote write, {args.concurrency} connections; requests x series per request: {shapes}; "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    rows: list[Row] = []
    failures: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="tsgate-bench-rw-"))
    try:
        for target, name in TARGETS.items():
            if target in args.skip:
                continue
            if target in ("prometheus", "victoria-metrics") and not shutil.which(target):
                rows += [Row(name, w.series_per_request, w.requests, note="not installed") for w in workloads]
                continue
            try:
                with started(target, args, workdir / target) as (service, pids, _):
                    if warmup.requests:
                        acknowledged, errors = send(service.port, warmup, args.run_timeout)
                        if errors:
                            raise BenchError(f"{name}: warm-up errors: {errors}")
                    wait_until_idle(service.pid)
                    for workload in workloads:
                        if not args.new_series:
                            send(service.port, workload.introduction(), args.run_timeout)
                        row = measure(name, service, pids, workload, args.run_timeout)
                        if name.startswith("tsgate"):
                            try:
                                row = row._replace(note=check_tsgate(service, workload, row.acknowledged))
                            except BenchError as error:
                                failures.append(str(error))
                                row = row._replace(note="check FAILED")
                        rows.append(row)
            except BenchError as error:
                failures.append(f"{name}: {error}")
                rows.append(Row(name, 0, 0, note="FAILED (see below)"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_table(rows)
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
