"""What every read request costs before its work: trivial and dashboard read requests, one at a time.

A ``tsgate serve --roles ingest,query`` on a fresh SQLite store (its query executors as by default)
gets ``--generations`` (4) generations of bench.churn's pods (500 counters an hour, the last one
ending at ``now``), then each request below ``--runs`` (300) times after 10 warm-ups, one at a
time on one keep-alive connection; printed: p10, p50 and p90 in ms and the status. The floor
requests are ``/healthz`` (the HTTP server alone), ``/api/v1/status/buildinfo`` (plus the hop to a
query executor and back), ``query=1`` (plus parse, evaluation and encoding) and a selector that
matches nothing (plus the index lookups); the dashboard's are bench.churn's ``count()``, pod
values, series of the last 5 min and labels.

``--compare DIR`` runs a second gateway from another checkout (DIR is its root: ``PYTHONPATH``)
on the same workload beside this one, the two asked in turn (the order reversed every round), so
a box's load weighs on both alike: an A/B of a change. Run from the repository root::

    python -m bench.read_floor
    python -m bench.read_floor --compare /path/to/other/checkout --runs 500
"""

import argparse
import contextlib
import http.client
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

from bench.churn import QUERY_HEADERS, SELECTOR, Workload, dashboard_queries, load
from bench.common import REPO, Service, tsgate_service, wait_until_idle
from bench.find import percentile

WARM_UP = 10


def floor_paths(now_s: int) -> list[tuple[str, str]]:
    def path(endpoint: str, **params) -> str:
        return f"{endpoint}?{urllib.parse.urlencode(params)}"

    return [
        ("healthz", "/healthz"),
        ("buildinfo", "/api/v1/status/buildinfo"),
        ("query 1", path("/api/v1/query", query="1", time=now_s)),
        ("query of nothing", path("/api/v1/query", query='nothing_here{job="x"}', time=now_s)),
    ]


def dashboard_paths(workload: Workload) -> list[tuple[str, str]]:
    return [(query.name, query.path) for query in dashboard_queries(workload) if query.kind != "matrix"]


def gateway(name: str, root: Path, workdir: Path) -> Service:
    """A gateway of the checkout at ``root`` on SQLite in ``workdir``."""
    store = ["--store", f"sqlite:///{workdir / 'tsgate.db'}"]
    return tsgate_service(
        name, store, workdir / "tsgate.log", ["--roles", "ingest,query", "--max-sample-age", "3d"], root
    )


def timed(services: list[Service], path: str, runs: int) -> list[tuple[str, list[float]]]:
    """Each service's status and times (ms) of ``runs`` requests of ``path``, asked in turn."""
    connections = [http.client.HTTPConnection("127.0.0.1", service.port, timeout=60) for service in services]
    times: list[list[float]] = [[] for _ in services]
    statuses = [""] * len(services)
    try:
        for round_number in range(WARM_UP + runs):
            order = range(len(services)) if round_number % 2 == 0 else reversed(range(len(services)))
            for index in order:
                started = time.perf_counter()
                connections[index].request("GET", path, headers=QUERY_HEADERS)
                response = connections[index].getresponse()
                response.read()
                if round_number >= WARM_UP:
                    times[index].append((time.perf_counter() - started) * 1000)
                statuses[index] = str(response.status)
    finally:
        for connection in connections:
            connection.close()
    return list(zip(statuses, times))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.read_floor", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--generations", type=int, default=4, help="churn generations of 500 pods (default 4)")
    parser.add_argument("--runs", type=int, default=300, help="timed requests of each path (default 300)")
    parser.add_argument("--compare", type=Path, help="the root of another checkout, run beside this one")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    now_ms = int(time.time() * 1000) // 60_000 * 60_000
    workload = Workload(args.generations, now_ms)
    roots = [("this", REPO)] + ([("compared", args.compare.resolve())] if args.compare else [])
    with contextlib.ExitStack() as stack:
        services = []
        for name, root in roots:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tsgate-read-floor-")))
            service = gateway(name, root, workdir)
            stack.callback(service.stop)
            service.start(120)
            load(service, workload)
            services.append(service)
        for service in services:
            wait_until_idle(service.pid, 60)
        print(f"{args.generations} generations ({workload.series:,} series, {SELECTOR}), {args.runs} runs, ms:")
        for label, path in floor_paths(now_ms // 1000) + dashboard_paths(workload):
            for service, (status, found) in zip(services, timed(services, path, args.runs)):
                print(
                    f"{label:28s} {service.name:9s} {status} p10 {percentile(found, 0.1):7.2f}"
                    f" p50 {percentile(found, 0.5):7.2f} p90 {percentile(found, 0.9):7.2f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
