"""Graphite plaintext alone, end to end into SQLite or a running Cassandra: the smallest run.

One ``tsgate serve`` (1 worker, ``--roles ingest,query``) takes the suite's plaintext workload
(bench.workloads, ``--paths`` x ``--points`` lines over 4 TCP connections) twice: first as new
series, then the same lines again as known series. Each pass is timed from the first byte until
/metrics counts every line accepted (stored); the figures are lines/s and the gateway's CPU
microseconds a line (its processes, from /proc). ``--carbon-cache`` first measures Debian's
carbon-cache on the same lines (bench.receive's setup: lines read from its sockets per second).
A quick look beside the full suite (``python -m bench --parts ingest,receive``), which needs
Cassandra and takes far longer.

    python -m bench.plaintext                              # SQLite in a temporary directory
    python -m bench.plaintext --cassandra 127.0.0.1:9142   # a fresh keyspace, dropped after
    python -m bench.plaintext --paths 10000 --points 60 --carbon-cache   # the suite's workload
"""

import argparse
import contextlib
import shutil
import tempfile
import time
from pathlib import Path

from bench.common import connect, exit_with, fresh_keyspace, tree_cpu_s, tsgate_service
from bench.ingest import ACCEPTED, STALL_S, TENANT, keyspace_name
from bench.receive import carbon_cache_service, measure
from bench.workloads import PlaintextWorkload, send_plaintext
from gateway.app.config import parse_hostport
from gateway.app.devservices.process import free_port
from gateway.core.model import now_ms


def accepted_count(gateway) -> float:
    status, body = gateway.get("/metrics")
    for line in body.decode().splitlines() if status == 200 else ():
        if line.startswith(ACCEPTED):
            return float(line.rpartition(" ")[2])
    return 0.0


def timed_pass(gateway, port: int, workload: PlaintextWorkload, expected: int) -> tuple[float, float, float]:
    """(seconds until the sockets were read empty, until all was stored, gateway CPU seconds)."""
    cpu_before = tree_cpu_s(gateway.pid)
    started = time.perf_counter()
    received_s = send_plaintext(port, workload)
    last, last_change = -1.0, time.monotonic()
    while (count := accepted_count(gateway)) < expected:
        if count != last:
            last, last_change = count, time.monotonic()
        elif time.monotonic() - last_change > STALL_S:
            raise SystemExit(f"accepted count stayed at {count:.0f} of {expected}:\n{gateway.log()}")
        time.sleep(0.02)
    return received_s, time.perf_counter() - started, tree_cpu_s(gateway.pid) - cpu_before


@contextlib.contextmanager
def store_url(cassandra: str | None, workdir: Path):
    if cassandra is None:
        yield f"sqlite:///{workdir}/tsgate.db"
        return
    host, port = parse_hostport(cassandra)
    cluster = connect(host, port)
    try:
        with fresh_keyspace(cluster.connect(), host, port, keyspace_name()) as url:
            yield url
    finally:
        cluster.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.plaintext", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cassandra", metavar="HOST:PORT", help="a running Cassandra (default: SQLite)")
    parser.add_argument("--paths", type=int, default=2000)
    parser.add_argument("--points", type=int, default=30)
    parser.add_argument("--carbon-cache", action="store_true", help="measure carbon-cache on the same lines first")
    args = parser.parse_args(argv)
    workload = PlaintextWorkload(args.paths, args.points, 4, now_ms() // 10_000 * 10 - 10)
    workdir = Path(tempfile.mkdtemp(prefix="tsgate-bench-plaintext-"))
    port = free_port()
    try:
        if args.carbon_cache:
            carbon, carbon_port = carbon_cache_service(workdir / "carbon-cache")
            carbon.start()
            try:
                run = measure("carbon-cache", carbon, carbon_port, workload)
            finally:
                carbon.stop()
            print(
                f"carbon-cache: {run.samples / run.seconds:,.0f} lines/s, {run.cpu_s / run.samples * 1e6:.1f} µs CPU/line"
            )
        with store_url(args.cassandra, workdir) as url:
            extra = ["--roles", "ingest,query", "--graphite", f"127.0.0.1:{port}", "--graphite-tenant", TENANT]
            gateway = tsgate_service("tsgate", ["--store", url], workdir / "tsgate.log", [*extra, "--workers", "1"])
            gateway.start()
            try:
                print(f"{'store':<10} {'pass':<6} {'lines':>7} {'received/s':>11} {'stored/s':>9} {'µs CPU/line':>11}")
                for number, name in enumerate(("new", "known"), 1):
                    received, stored, cpu = timed_pass(gateway, port, workload, number * workload.samples)
                    print(
                        f"{url.partition(':')[0]:<10} {name:<6} {workload.samples:>7} {workload.samples / received:>11,.0f}"
                        f" {workload.samples / stored:>9,.0f} {cpu / workload.samples * 1e6:>11.1f}",
                        flush=True,
                    )
            finally:
                gateway.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    exit_with(main)
