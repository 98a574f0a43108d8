"""/metrics/find latency on a big Graphite tree, on SQLite and on Cassandra.

The path index (graphite_paths: (tenant, parent) -> children) is filled by calling the store
driver's write_series directly in big batches (what the ingest pipeline would do for new series,
minus the samples), with a four-level tree ``dc{0..9}.host{0..N-1}.svc{0..9}.metric{0..9}``
(N = metrics / 1000). A real ``tsgate serve`` is then started on that store and each query is
timed over HTTP as Grafana's metric browser sends it (``GET /metrics/find?query=...``, treejson).

Queries, and what the finder reads for them (docs/graphite.rst explains the cost model):

* literal        ``dc3.host7.svc5.metric7``: one read (the children of ``dc3.host7.svc5``);
* ``a.*.c``      ``dc3.*.svc5.metric7``: the children of ``dc3``, then of each ``dc3.hostX.svc5``:
                 N + 1 reads;
* ``*.*.leaf``   ``*.*.svc5.metric7``: the root, the 10 dcs, then every ``dcD.hostX.svc5``:
                 10 N + 11 reads;
* ``{a,b}``      ``dc{1,2}.host{1,2}.svc*.metric7``: root, 2 dcs, 4 hosts, 40 services: 47 reads.

Run (Cassandra is started with gateway.app.devservices unless --cassandra is given)::

    python -m bench.find --sizes 100000,1000000 --stores sqlite,cassandra

Prints the populate rate of each store and size, then one table (store, metrics, query, matches,
p50 ms, p99 ms). ``matches`` counts every node the glob reaches (``format=json``); treejson
shows one entry per name.
"""

import argparse
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
from pathlib import Path

from twisted.internet import defer, task

from gateway.app.config import parse_hostport
from gateway.app.devservices.process import free_port, terminate
from gateway.core.layout import Layout
from gateway.core.model import SeriesKey, series_set_hash, series_set_text
from gateway.store.cassandra import CassandraStore
from gateway.store.sqlite import SQLiteStore

REPO = Path(__file__).resolve().parent.parent
LAYOUT = Layout()
KEYSPACE = "tsgate_bench_find"
DCS, SERVICES, METRICS = 10, 10, 10
QUERIES = [
    ("literal", "dc3.host7.svc5.metric7"),
    ("a.*.c", "dc3.*.svc5.metric7"),
    ("*.*.leaf", "*.*.svc5.metric7"),
    ("{a,b}", "dc{1,2}.host{1,2}.svc*.metric7"),
]


def hosts_for(size: int) -> int:
    return max(1, size // (DCS * SERVICES * METRICS))


def tree_paths(size: int):
    for host in range(hosts_for(size)):
        for dc in range(DCS):
            for service in range(SERVICES):
                for metric in range(METRICS):
                    yield f"dc{dc}.host{host}.svc{service}.metric{metric}"


def series_keys(tenant: str, paths) -> list[SeriesKey]:
    return [SeriesKey(tenant, series_set_hash(series_set_text(path, {})), path, {}) for path in paths]


def tenant_for(size: int) -> str:
    return f"find-{size}"


async def populated(store, tenant: str, size: int) -> bool:
    """Whether an earlier run already wrote this tree (the last host's last leaf exists)."""
    last = f"dc{DCS - 1}.host{hosts_for(size) - 1}.svc{SERVICES - 1}"
    return any(node.name == f"metric{METRICS - 1}" for node in await store.list_path_children(tenant, last))


async def populate(store, tenant: str, size: int, batch: int, concurrency: int) -> tuple[int, float]:
    """Write the tree with write_series in batches, ``concurrency`` batches in flight."""
    started = time.perf_counter()
    written, pending, last_report = 0, [], started
    chunk = []
    for path in tree_paths(size):
        chunk.append(path)
        if len(chunk) == batch:
            pending.append(defer.ensureDeferred(_write(store, tenant, chunk)))
            chunk = []
            if len(pending) >= concurrency:
                written += await pending.pop(0)
        if time.perf_counter() - last_report > 30:
            last_report = time.perf_counter()
            rate = written / (last_report - started)
            print(
                f"  ... {written} series in {last_report - started:.0f} s ({rate:.0f}/s)", file=sys.stderr, flush=True
            )
    if chunk:
        pending.append(defer.ensureDeferred(_write(store, tenant, chunk)))
    for deferred in pending:
        written += await deferred
    return written, time.perf_counter() - started


async def _write(store, tenant: str, paths: list[str]) -> int:
    await store.write_series(series_keys(tenant, paths))
    return len(paths)


class Gateway:
    """A ``tsgate serve`` with only HTTP on, on a given store."""

    def __init__(self, workdir: Path, store_args: list[str]):
        self.port = free_port()
        self.log = (workdir / f"gateway-{self.port}.log").open("ab")
        command = [
            sys.executable,
            "-m",
            "gateway.app.cli",
            "serve",
            "--http",
            f"127.0.0.1:{self.port}",
            "--graphite",
            "",
            "--pickle",
            "",
            *store_args,
        ]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.process = subprocess.Popen(command, cwd=workdir, env=env, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise SystemExit(f"gateway exited with {self.process.returncode}; see {self.log.name}")
            try:
                probe = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                probe.request("GET", "/healthz")
                if probe.getresponse().status == 200:
                    probe.close()
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"gateway did not start; see {self.log.name}")
            time.sleep(0.2)
        self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)

    def get(self, path: str, headers=None) -> tuple[int, bytes]:
        self.connection.request("GET", path, headers=headers or {})
        answer = self.connection.getresponse()
        return answer.status, answer.read()

    def stop(self) -> None:
        terminate(self.process, 30)
        self.log.close()


def percentile(samples: list[float], fraction: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def time_queries(gateway: Gateway, tenant: str, requests: int) -> list[tuple[str, str, int, float, float]]:
    headers = {"X-Tenant": tenant}
    rows = []
    for label, query in QUERIES:
        status, body = gateway.get(
            "/metrics/find?" + urllib.parse.urlencode({"query": query, "format": "json"}), headers
        )
        if status != 200:
            raise SystemExit(f"{query}: {status} {body[:300]!r}")
        matches = len(json.loads(body))
        path = "/metrics/find?" + urllib.parse.urlencode({"query": query})
        for _ in range(3):  # warm-up: connections, prepared statements, page cache
            gateway.get(path, headers)
        samples = []
        for _ in range(requests):
            started = time.perf_counter()
            status, body = gateway.get(path, headers)
            samples.append((time.perf_counter() - started) * 1000)
            if status != 200:
                raise SystemExit(f"{query}: {status} {body[:300]!r}")
        rows.append((label, query, matches, percentile(samples, 0.5), percentile(samples, 0.99)))
    return rows


async def bench_store(
    name: str, make_store, store_args, sizes, args, workdir: Path, results: list, rates: list
) -> None:
    for size in sizes:
        tenant = tenant_for(size)
        store = make_store(size)
        await store.start()
        try:
            if await populated(store, tenant, size):
                print(f"{name} {size}: already populated (tenant {tenant})", file=sys.stderr, flush=True)
            else:
                print(f"{name} {size}: populating ...", file=sys.stderr, flush=True)
                written, seconds = await populate(store, tenant, size, args.batch, args.concurrency)
                rates.append((name, size, written, seconds))
                print(
                    f"{name} {size}: {written} series in {seconds:.1f} s = {written / seconds:.0f} series/s",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            await store.close()
        gateway = Gateway(workdir, store_args(size))
        try:
            for label, query, matches, p50, p99 in time_queries(gateway, tenant, args.requests):
                results.append((name, size, label, query, matches, p50, p99))
        finally:
            gateway.stop()


def start_cassandra(args, workdir: Path):
    if args.cassandra:
        host, port = parse_hostport(args.cassandra if ":" in args.cassandra else args.cassandra + ":9042")
        return None, host, port
    from gateway.app.devservices.cassandra import CassandraServer

    server = CassandraServer(workdir / "cassandra")
    server.start()
    return server, server.host, server.port


async def run(args, workdir: Path) -> None:
    sizes = [int(s) for s in args.sizes.split(",") if s]
    results, rates = [], []
    for name in args.stores.split(","):
        if name == "sqlite":
            data = Path(args.sqlite_dir or workdir / "sqlite")

            def db_dir(size: int) -> Path:
                directory = data / str(size)
                directory.mkdir(parents=True, exist_ok=True)
                return directory

            await bench_store(
                "sqlite",
                lambda size: SQLiteStore(db_dir(size) / "tsgate.db", LAYOUT),
                lambda size: ["--data-dir", str(db_dir(size))],
                sizes,
                args,
                workdir,
                results,
                rates,
            )
        elif name == "cassandra":
            server, host, port = start_cassandra(args, workdir)
            try:
                url = f"cassandra://{host}:{port}/{KEYSPACE}"
                CassandraStore.from_url(url, LAYOUT).apply_schema()
                await bench_store(
                    "cassandra",
                    lambda size: CassandraStore.from_url(url, LAYOUT),
                    lambda size: ["--store", url],
                    sizes,
                    args,
                    workdir,
                    results,
                    rates,
                )
            finally:
                if server is not None:
                    server.stop()
        else:
            raise SystemExit(f"unknown store {name!r}: use sqlite, cassandra")
    print()
    print("populate (write_series, batches of %d, %d in flight)" % (args.batch, args.concurrency))
    for name, size, written, seconds in rates:
        print(f"  {name:<9} {size:>8} series  {seconds:8.1f} s  {written / seconds:8.0f} series/s")
    print()
    header = f"{'store':<9} {'metrics':>8}  {'query':<32} {'matches':>7} {'p50 ms':>8} {'p99 ms':>8}"
    print(header)
    print("-" * len(header))
    for name, size, _label, query, matches, p50, p99 in results:
        print(f"{name:<9} {size:>8}  {query:<32} {matches:>7} {p50:>8.1f} {p99:>8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100000,1000000", help="metrics in the tree, comma-separated")
    parser.add_argument("--stores", default="sqlite,cassandra", help="sqlite, cassandra or both")
    parser.add_argument(
        "--cassandra", help="HOST:PORT of a running Cassandra (default: start one with gateway.app.devservices)"
    )
    parser.add_argument("--requests", type=int, default=50, help="timed requests per query")
    parser.add_argument("--batch", type=int, default=5000, help="series per write_series call")
    parser.add_argument("--concurrency", type=int, default=2, help="write_series calls in flight")
    parser.add_argument("--sqlite-dir", help="keep the SQLite files here (reused when already populated)")
    parser.add_argument("--workdir", help="logs and the started Cassandra's data (default: a temporary directory)")
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="tsgate-bench-find-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        task.react(lambda reactor: defer.ensureDeferred(run(args, workdir)))
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
