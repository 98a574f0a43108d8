"""PromQL query_range latency: tsgate's /api/v1/query_range beside Prometheus 2.42 on the same data.

Workload: ``--series`` (1000) counters ``x{job="jobJ", instance="hostI"}`` (``--jobs`` 10 job
values) x ``--hours`` (24) at ``--interval`` (60 s), ending on a whole hour at least an hour ago,
values multiples of 0.25 (exact in binary and in text) rising by 0.25-2 a sample and going back
to 0 every 500 samples (a restart), at a phase of their own.

* tsgate: ``tsgate serve --workers 1`` on SQLite (and, with ``--cassandra HOST:PORT``, on a fresh
  keyspace of that Cassandra too), loaded untimed through ``POST /api/v1/write`` (remote write
  1.0, 4 connections, 50 series x 1 h a request, each series in time order), then sealed as
  production data of that age is, by ``tsgate downsample --once --downsample-delay 0s``. When it
  seals fewer series-slots than written (seen on Cassandra), the run says so and times the data
  as it is: the read path stitches the head rows left and the blocks.
* Prometheus: the same samples as an OpenMetrics text file, turned into TSDB blocks by Debian's
  ``promtool tsdb create-blocks-from openmetrics`` (2.42 has no other way to take 24 h old data:
  its remote-write receiver refuses samples older than its head), in the data directory of a
  ``prometheus`` started afterwards.

All servers run side by side once loaded (Prometheus left to settle under a quarter of a core).
Timed: ``GET /api/v1/query_range?query=sum by (job) (rate(x[5m]))`` over the whole span at a
``--step`` (60 s), from the request sent to the last byte read, on one keep-alive connection per
server: one warm-up each, then ``--runs`` (10) rounds of one request to each server in turn (the
order reversed every other round), so that the load other processes put on a shared box falls on
every server alike. Printed: p50 and p99 of each, and tsgate p50 / Prometheus p50 (target <= 3).
Untimed, Prometheus's answer must hold ``--jobs`` series with a point at every step but the first
(a rate needs two samples), and tsgate's must equal it (same series and timestamps, values within
1e-9 relative); a difference fails the run (exit 1).

Run from the repository root::

    python -m bench.promql
    python -m bench.promql --series 200 --hours 6 --runs 5 --cassandra 127.0.0.1:9042
"""

import argparse
import contextlib
import http.client
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from bench.common import (
    BenchError,
    Service,
    connect,
    exit_with,
    fresh_keyspace,
    post_until_accepted,
    settle,
    tsgate_service,
    which,
)
from bench.find import percentile
from bench.queries import Timed
from bench.remote_write import HEADERS, TENANT, prometheus_service
from bench.report import Figure, format_table
from bench.storage import SLOT_MS, checked_once, downsample_once, slot_end_before
from gateway.app.config import parse_hostport
from gateway.core.model import now_ms
from protocols.prometheus import WriteSeries, encode_write_request_v1

SECTION = "promql"
QUERY = "sum by (job) (rate(x[5m]))"
SHARDS = 4
SERIES_PER_REQUEST = 50
RESET_EVERY = 500
TARGET_RATIO = 3.0


def log(message: str) -> None:
    print(f"promql: {message}", file=sys.stderr, flush=True)


class Workload:
    """The counters, their remote-write bodies (per shard, each series in time order) and their
    OpenMetrics text."""

    def __init__(self, series: int, jobs: int, hours: int, interval_s: int, end_ms: int):
        self.series, self.jobs, self.interval_s = series, jobs, interval_s
        self.rounds = hours * 3600 // interval_s
        self.start_s = (end_ms - hours * SLOT_MS) // 1000
        self.end_s = self.start_s + (self.rounds - 1) * interval_s
        self.samples = series * self.rounds
        self.series_slots = series * hours
        self.labels = [{"__name__": "x", "job": f"job{i % jobs}", "instance": f"host{i:04d}"} for i in range(series)]
        per_hour = 3600 // interval_s
        groups = [range(g, min(g + SERIES_PER_REQUEST, series)) for g in range(0, series, SERIES_PER_REQUEST)]
        self.bodies = [[] for _ in range(SHARDS)]
        for hour in range(hours):
            rounds = range(hour * per_hour, (hour + 1) * per_hour)
            for g, group in enumerate(groups):
                body = encode_write_request_v1(
                    WriteSeries(self.labels[i], [(self.stamp_ms(r), self.value(i, r)) for r in rounds]) for i in group
                )
                self.bodies[g % SHARDS].append(body)

    def stamp_ms(self, r: int) -> int:
        return (self.start_s + r * self.interval_s) * 1000

    @staticmethod
    def value(i: int, r: int) -> float:
        return ((r + 7 * i) % RESET_EVERY) * 0.25 * (i % 8 + 1)

    def write_openmetrics(self, path: Path) -> None:
        with path.open("w") as out:
            out.write("# TYPE x unknown\n")
            for i, labels in enumerate(self.labels):
                name = f'x{{instance="{labels["instance"]}",job="{labels["job"]}"}}'
                out.write(
                    "".join(
                        f"{name} {self.value(i, r)!r} {self.start_s + r * self.interval_s}\n"
                        for r in range(self.rounds)
                    )
                )
            out.write("# EOF\n")

    def query_path(self, step_s: int) -> str:
        params = {"query": QUERY, "start": self.start_s, "end": self.end_s, "step": step_s}
        return "/api/v1/query_range?" + urllib.parse.urlencode(params)


def send(port: int, workload: Workload) -> float:
    """Every body, one thread and keep-alive connection per shard, each answered 204; seconds."""

    def shard(bodies: list[bytes]) -> None:
        with contextlib.closing(http.client.HTTPConnection("127.0.0.1", port, timeout=300)) as connection:
            for body in bodies:
                post_until_accepted(connection, "/api/v1/write", body, HEADERS, 204)

    started = time.perf_counter()
    with ThreadPoolExecutor(SHARDS) as pool:
        for future in [pool.submit(shard, bodies) for bodies in workload.bodies]:
            future.result()
    return time.perf_counter() - started


def matrix(answer: bytes) -> dict[str, list]:
    body = json.loads(answer)
    if body.get("status") != "success" or body["data"]["resultType"] != "matrix":
        raise BenchError(f"query_range answered {answer[:300]!r}")
    return {item["metric"].get("job"): item["values"] for item in body["data"]["result"]}


def reference_check(workload: Workload, step_s: int, reference: dict):
    """Prometheus's answer: every job at every step whose 5 m window holds two samples (all but
    the first few); kept in ``reference`` for tsgate's check."""
    steps = sum(
        1 for t in range(workload.start_s, workload.end_s + 1, step_s) if t >= workload.start_s + workload.interval_s
    )

    def check(answer: bytes) -> None:
        found = matrix(answer)
        if len(found) != workload.jobs or any(len(values) != steps for values in found.values()):
            raise BenchError(
                f"prometheus: {len(found)} series of {[len(v) for v in found.values()][:3]} points; expected {workload.jobs} of {steps}"
            )
        reference.update(found)

    return checked_once(check)


def same_as(reference: dict):
    def check(answer: bytes) -> None:
        found = matrix(answer)
        if sorted(found) != sorted(reference):
            raise BenchError(f"tsgate: series {sorted(found)} instead of {sorted(reference)}")
        for job, values in reference.items():
            theirs = found[job]
            same = len(theirs) == len(values) and all(
                a == c and math.isclose(float(b), float(d), rel_tol=1e-9) for (a, b), (c, d) in zip(values, theirs)
            )
            if not same:
                raise BenchError(f"tsgate: {job} differs from Prometheus: {theirs[:3]} ... instead of {values[:3]} ...")

    return checked_once(check)


class Target(NamedTuple):
    """A loaded server to time: its port, the headers of its requests, and the check of its answers."""

    port: int
    headers: dict
    check: object


def started_prometheus(stack: contextlib.ExitStack, workdir: Path, workload: Workload) -> Service:
    """promtool's blocks of the workload, then a Prometheus on them (stopped with the stack)."""
    workdir.mkdir(parents=True)
    text = workdir / "x.om"
    workload.write_openmetrics(text)
    started = time.perf_counter()
    result = subprocess.run(
        [which("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(text), str(workdir / "data")],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if result.returncode:
        raise BenchError(f"promtool exited with {result.returncode}: {result.stderr[-2000:]}")
    log(f"promtool: {workload.samples} samples into blocks in {time.perf_counter() - started:.1f} s")
    text.unlink()
    service = prometheus_service(which("prometheus"), workdir)
    stack.callback(service.stop)
    service.start(120)
    return service


def started_tsgate(
    stack: contextlib.ExitStack, name: str, store_url: str, workdir: Path, workload: Workload
) -> tuple[Service, str]:
    """A gateway on store_url holding the workload, sealed (stopped with the stack), and a note
    saying whether the downsampler sealed every series-slot."""
    gateway = tsgate_service(name, ["--store", store_url], workdir / f"{name}.log", ["--workers", "1"])
    stack.callback(gateway.stop)
    gateway.start(60)
    seconds = send(gateway.port, workload)
    log(f"{name}: wrote {workload.samples} samples in {seconds:.1f} s")
    try:
        downsample_once(store_url, workload.series_slots)
    except BenchError as error:  # the read path stitches head rows and blocks: time it as it is
        log(f"{name}: not all sealed ({error}); timed with the rest in head rows")
        return gateway, f"partly sealed: {error}"
    return gateway, "sealed"


def cassandra_store(stack: contextlib.ExitStack, at: str) -> str:
    """A fresh keyspace of the Cassandra at HOST:PORT, dropped with the stack."""
    host, port = parse_hostport(at)
    cluster = connect(host, port)
    stack.callback(cluster.shutdown)
    return stack.enter_context(fresh_keyspace(cluster.connect(), host, port, f"tsgate_bench_promql_{os.getpid()}"))


def time_interleaved(targets: dict[str, Target], path: str, runs: int) -> dict[str, Timed]:
    """One warm-up request to each target, then ``runs`` rounds of one timed request to each, in
    turn (the order reversed every other round), so that the box's other load falls on all alike."""
    connections = {
        name: http.client.HTTPConnection("127.0.0.1", target.port, timeout=600) for name, target in targets.items()
    }
    samples: dict[str, list[float]] = {name: [] for name in targets}
    sizes = {}
    try:
        for round_number in range(runs + 1):
            names = list(targets) if round_number % 2 == 0 else list(reversed(targets))
            for name in names:
                started = time.perf_counter()
                connections[name].request("GET", path, headers=targets[name].headers)
                response = connections[name].getresponse()
                answer = response.read()
                elapsed_ms = (time.perf_counter() - started) * 1000
                if response.status != 200:
                    raise BenchError(f"{name}: GET {path[:100]} answered {response.status}: {answer[:300]!r}")
                targets[name].check(answer)
                sizes[name] = len(answer)
                if round_number:
                    samples[name].append(elapsed_ms)
    finally:
        for connection in connections.values():
            connection.close()
    return {
        name: Timed(percentile(found, 0.5), percentile(found, 0.99), sizes[name]) for name, found in samples.items()
    }


def figures(timings: dict[str, Timed], notes: dict[str, str], label: str) -> list[Figure]:
    found = []
    reference = f"prometheus 2.42, {label}"
    for name, timed in timings.items():
        measured = reference if name == "prometheus" else f"{name}, {label}"
        ratio = None if name == "prometheus" else timed.p50 / timings["prometheus"].p50
        note = (
            notes[name]
            if ratio is None
            else f"{notes[name]}; target <= {TARGET_RATIO:g} x Prometheus: {'met' if ratio <= TARGET_RATIO else 'missed'}"
        )
        found.append(Figure(SECTION, measured, timed.p50, "ms p50", "" if ratio is None else reference, ratio, note))
        found.append(Figure(SECTION, measured, timed.p99, "ms p99", note=f"{timed.answer_bytes} bytes an answer"))
    return found


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.promql", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--series", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=10, help="distinct job label values (default 10)")
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument(
        "--interval", type=int, default=60, help="seconds between samples (default 60; must divide 3600)"
    )
    parser.add_argument("--step", type=int, default=60, help="query_range step in seconds (default 60)")
    parser.add_argument(
        "--runs", type=int, default=10, help="timed requests per server, after one warm-up (default 10)"
    )
    parser.add_argument(
        "--cassandra", metavar="HOST:PORT", help="also measure tsgate on a fresh keyspace of this Cassandra"
    )
    args = parser.parse_args(argv)
    if min(args.series, args.jobs, args.hours, args.interval, args.step, args.runs) < 1 or 3600 % args.interval:
        parser.error("sizes must be positive and --interval divide 3600")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"tsgate promql bench: {args.series} series x {args.hours} h @{args.interval}s, {QUERY} at step {args.step}s; "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    workload = Workload(args.series, args.jobs, args.hours, args.interval, slot_end_before(now_ms()))
    workdir = Path(tempfile.mkdtemp(prefix="tsgate-bench-promql-"))
    reference: dict = {}
    notes = {"prometheus": "promtool blocks"}
    failed = 0
    try:
        with contextlib.ExitStack() as stack:
            prometheus = started_prometheus(stack, workdir / "prometheus", workload)
            targets = {"prometheus": Target(prometheus.port, {}, reference_check(workload, args.step, reference))}
            stores = {"tsgate sqlite": lambda: f"sqlite:///{workdir / 'tsgate.db'}"}
            if args.cassandra:
                stores["tsgate cassandra"] = lambda: cassandra_store(stack, args.cassandra)
            for name, store in stores.items():
                try:
                    gateway, notes[name] = started_tsgate(stack, name.replace(" ", "-"), store(), workdir, workload)
                except BenchError as error:  # report it, measure the other store
                    print(f"FAILED: promql, {name}: {error}", flush=True)
                    failed += 1
                    continue
                targets[name] = Target(gateway.port, {"X-Scope-OrgID": TENANT}, same_as(reference))
            log(f"prometheus settled in {settle(prometheus.pid):.0f} s; timing {args.runs} rounds")
            timings = time_interleaved(targets, workload.query_path(args.step), args.runs)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        format_table(
            figures(timings, notes, f"{args.series} series x {args.hours}h @{args.interval}s, step {args.step}s")
        )
    )
    return 1 if failed else 0


if __name__ == "__main__":
    exit_with(main)
