"""Resident memory of one gateway process by active series: is it bounded, and where does it plateau?

For each size N (100k and 1M; ``--quick``: 10k and 50k) a fresh ``tsgate serve --workers 1
--roles ingest,query --query-executors 0`` on a fresh store: its RSS once it answers /healthz
(idle), then N distinct series sent by Prometheus remote write 1.0 as Prometheus shapes it (2000
series a request, one sample of each, 2 connections), ROUNDS rounds 10 s apart: the first writes every series' metadata,
the others find the series in the metadata cache, as a steady scrape does. Then VmHWM (peak RSS)
and VmRSS from /proc/<pid>/status. Every request must answer 204, and /metrics must count N
series created and N x ROUNDS samples accepted.

The store is Cassandra. A new series costs the gateway about 8 metadata rows there, which is
slow on a small box: the second size runs on Cassandra only if the first size's duration, scaled
up, fits in --budget (600 s; quick: 60 s), otherwise on the embedded SQLite store (``--data-dir``),
and the figures name the store and say why.

What bounds the gateway's memory (defaults from gateway/app/config.py, named in the figures' notes):

* the metadata cache (gateway/ingest/metadata_cache.py KnownSeries): an LRU from each series' label set
  as decoded, (tenant, metric name, tag pairs), to its hash, at most ``--metadata-cache-size``
  entries (1,000,000); it holds every tag value, so it is most of the growth (about 490 MB at
  1M series of this benchmark's 5 labels);
* the pending roll-up marks still holding a slot open (IngestPipeline._marked): (tenant, hash,
  slot) to a time, capped at the same size, expired entries dropped once per ``--slot-width``
  (1 h) and whenever it is full (about 110 MB at 1M);
* active series per tenant (gateway/ingest/limits.py): kept only when ``--tenant-max-active-series`` is
  set (default 0: off), at most that many, for 20 minutes;
* the Prometheus metadata cache (100,000 entries) and the Graphite storage-schemas step cache
  (100,000 paths) are fixed sizes.

So RSS should grow with active series up to 1M and plateau beyond.
"""

import http.client
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from bench.common import (
    BenchError,
    connect,
    fresh_keyspace,
    post_until_accepted,
    process_tree,
    run_part_alone,
    tsgate_service,
)
from bench.remote_write import HEADERS
from bench.report import Figure
from gateway.app.config import SETTINGS, parse_hostport
from gateway.core.model import now_ms
from protocols.prometheus import WriteSeries, encode_write_request_v1

SECTION = "memory"
FULL_SIZES, QUICK_SIZES = (100_000, 1_000_000), (10_000, 50_000)
FULL_BUDGET_S, QUICK_BUDGET_S = 600, 60
SERIES_PER_REQUEST = 2000
CONNECTIONS = 2
ROUNDS = 3
INTERVAL_MS = 10_000
METADATA_CACHE_SIZE = int(next(s.default for s in SETTINGS if s.name == "metadata-cache-size"))


class Measured(NamedTuple):
    store: str
    series: int
    idle_kib: int
    peak_kib: int
    end_kib: int
    seconds: float


def status_kib(pid: int, field: str) -> int:
    """A memory field of /proc/<pid>/status (VmRSS, VmHWM), in KiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise BenchError(f"no {field} in /proc/{pid}/status")


def labels(i: int) -> dict[str, str]:
    """Five labels as a node exporter's series look; ten series per instance."""
    return {
        "__name__": "bench_memory",
        "job": "bench",
        "instance": f"host{i // 10}:9100",
        "i": str(i),
        "region": "eu-1",
    }


def send(port: int, series: int) -> float:
    """ROUNDS rounds of one sample of every series, each round fully answered before the next; seconds taken.

    Bodies are encoded as they are sent (1M series would not fit up front); 503 is retried as
    Prometheus does, any other answer than 204 fails the run.
    """
    end = now_ms() // INTERVAL_MS * INTERVAL_MS
    stamps = [end - (ROUNDS - 1 - r) * INTERVAL_MS for r in range(ROUNDS)]
    connections = [http.client.HTTPConnection("127.0.0.1", port, timeout=120) for _ in range(CONNECTIONS)]
    # At most CONNECTIONS posts run at once (one per pool thread), so one is always free; list
    # pop and append are atomic.
    free = list(connections)

    def post(first: int, ts: int) -> None:
        body = encode_write_request_v1(
            WriteSeries(labels(i), [(ts, float(i))]) for i in range(first, min(first + SERIES_PER_REQUEST, series))
        )
        connection = free.pop()
        try:
            post_until_accepted(connection, "/api/v1/write", body, HEADERS, 204)
        finally:
            free.append(connection)

    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(CONNECTIONS) as pool:
            for ts in stamps:
                requests = [pool.submit(post, first, ts) for first in range(0, series, SERIES_PER_REQUEST)]
                try:
                    for request in requests:
                        request.result()
                finally:
                    for request in requests:  # after a failure, send no more
                        request.cancel()
                print(
                    f"memory: {series} series, round at {ts} done after {time.perf_counter() - started:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        for connection in connections:
            connection.close()
    return time.perf_counter() - started


def check_counts(gateway, series: int) -> None:
    """/metrics must count every series created once and every sample accepted."""
    status, body = gateway.get("/metrics")
    counters = {}
    for line in body.decode().splitlines():
        name, _, number = line.rpartition(" ")
        counters[name] = number
    created = float(counters.get("tsgate_series_metadata_writes_total", "nan"))
    accepted = float(counters.get('tsgate_samples_accepted_total{protocol="prometheus"}', "nan"))
    if status != 200 or created != series or accepted != series * ROUNDS:
        raise BenchError(
            f"/metrics: {created} series created, {accepted} samples accepted; {series} and {series * ROUNDS} expected"
        )


def measure(store: str, store_args: list[str], series: int, log_path: Path) -> Measured:
    """One fresh gateway, its idle RSS, ROUNDS rounds of ``series`` series, then its peak and final RSS."""
    # No query executor processes (they run queries, which this bench sends none of): the
    # worker is the one process whose RSS is measured.
    extra_args = ["--workers", "1", "--roles", "ingest,query", "--query-executors", "0"]
    gateway = tsgate_service(f"tsgate ({store})", store_args, log_path, extra_args)
    try:
        gateway.start()
        if len(process_tree(gateway.pid)) != 1:
            raise BenchError("tsgate serve --workers 1 started more than one process: its RSS would not be all of it")
        idle = status_kib(gateway.pid, "VmRSS")
        seconds = send(gateway.port, series)
        peak, end = status_kib(gateway.pid, "VmHWM"), status_kib(gateway.pid, "VmRSS")
        check_counts(gateway, series)
    finally:
        gateway.stop()
    return Measured(store, series, idle, peak, end, seconds)


def figures(measured: Measured, why: str) -> list[Figure]:
    size = f"{measured.series // 1000}k series ({measured.store})"
    idle = f"gateway RSS idle, before {size}"
    per_series = (measured.peak_kib - measured.idle_kib) * 1024 / measured.series
    note = (
        f"{ROUNDS} samples a series by remote write in {measured.seconds:.0f} s; {per_series:.0f} B a series over idle; "
        f"bounded by --metadata-cache-size {METADATA_CACHE_SIZE:,} (LRU of label sets) and the current slot's pending marks (same cap)"
    )
    if why:
        note += f"; {why}"
    return [
        Figure(SECTION, idle, measured.idle_kib / 1024, "MiB"),
        Figure(
            SECTION,
            f"gateway peak RSS (VmHWM), {size}",
            measured.peak_kib / 1024,
            "MiB",
            idle,
            measured.peak_kib / measured.idle_kib,
            note,
        ),
        Figure(
            SECTION,
            f"gateway RSS at end (VmRSS), {size}",
            measured.end_kib / 1024,
            "MiB",
            idle,
            measured.end_kib / measured.idle_kib,
        ),
    ]


def run(cassandra: str, workdir: Path, quick: bool) -> list[Figure]:
    """Both sizes, the second on SQLite when Cassandra would take longer than the budget."""
    sizes, budget = (QUICK_SIZES, QUICK_BUDGET_S) if quick else (FULL_SIZES, FULL_BUDGET_S)
    host, port = parse_hostport(cassandra)
    cluster = connect(host, port)
    found: list[Figure] = []
    try:
        first: Measured | None = None
        for series in sizes:
            estimate = None if first is None else first.seconds * series / first.series
            if estimate is None or estimate <= budget:
                keyspace = f"tsgate_bench_memory_{os.getpid()}_{series}"
                with fresh_keyspace(cluster.connect(), host, port, keyspace) as store_url:
                    measured = measure("cassandra", ["--store", store_url], series, workdir / f"{keyspace}.log")
                why = ""
            else:
                data = workdir / f"sqlite-{series}"
                try:
                    measured = measure("sqlite", ["--data-dir", str(data)], series, workdir / f"sqlite-{series}.log")
                finally:
                    shutil.rmtree(data, ignore_errors=True)
                why = (
                    f"on SQLite: on Cassandra it would take about {estimate:.0f} s "
                    f"(scaled from {first.series // 1000}k series in {first.seconds:.0f} s), over the {budget} s budget"
                )
            first = first or measured
            found += figures(measured, why)
    finally:
        cluster.shutdown()
    return found


def main() -> None:
    run_part_alone(run, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    main()
