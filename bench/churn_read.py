"""What the churn workload's last-hour dashboard query costs the gateway on Cassandra, in-process.

bench.churn times the query over HTTP beside Prometheus; this times it without HTTP, workers or
executors, so its CPU is the store's and the engine's alone: a CassandraStore on a fresh keyspace,
G generations of 500 pods (one an hour, ``churn_requests_total{job="api", pod="p<g>-<i>"}`` every
60 s, written through the ingest pipeline, all in head rows: nothing here seals), then per G:

  query     ``sum(rate(churn_requests_total{job="api"}[5m]))`` over the last hour at step 60
            through the PromQL API's handler: wall and CPU p50 and min of --runs, and the
            planner's select, histograms and samples steps (mean wall) and the Cassandra
            requests of one query, by table
  count     ``count(churn_requests_total{job="api"})`` at ``now`` (an instant query: 5 m of
            lookback), the same figures
  read_raw  CassandraStore.read_raw of the live generation's 500 series over that hour and its
            5 m of lookback, in calls of series_per_read as the query's read makes them: wall and CPU

CPU is this process's (process_time: the reactor thread and the driver's I/O thread). Figures in
docs/performance-log.rst ("The churn query on Cassandra"). Run from the repository root:

    python -m bench.churn_read --cassandra 127.0.0.1:9142 [--generations 1,24] [--runs 20]

The keyspace ``bench_churn_read`` is dropped first if a run before left it, and left for the next
run to drop: dropping a keyspace right after heavy writes stopped the dev node once
(bench/expire_old_index.py says how).
"""

import argparse
import collections
import functools
import sys
import time

from twisted.internet import defer, task
from twisted.web.test.requesthelper import DummyRequest

from bench.common import connect, drop_keyspace, exit_with
from gateway.app.config import parse_hostport
from gateway.core.layout import Layout
from gateway.core.model import Limits, Sample, series_set_hash, series_set_text
from gateway.http.promql_api import PromQLAPI, prometheus_errors
from gateway.ingest.metadata_cache import KnownSeries
from gateway.ingest.pipeline import IngestPipeline
from gateway.query.planner import QueryPlanner
from gateway.query.promql.service import PromQLService
from gateway.query.read_service import series_per_read
from gateway.store.cassandra import CassandraStore

KEYSPACE = "bench_churn_read"
PODS = 500
HOUR_MS = 3_600_000
QUERY = b'sum(rate(churn_requests_total{job="api"}[5m]))'
COUNT = b'count(churn_requests_total{job="api"})'
LOOKBACK_MS = 5 * 60_000


def pod_labels(generation: int, pod: int) -> dict[str, str]:
    return {"job": "api", "pod": f"p{generation}-{pod}"}


async def load(store, tenant: str, generations: int, now: int) -> None:
    """Each generation's hour of samples, oldest first, through the ingest pipeline."""
    pipeline = IngestPipeline(
        store,
        Limits(max_sample_age_ms=(generations + 1) * HOUR_MS),
        KnownSeries(1_000_000),
        10_000_000,
        clock=lambda: now,
    )
    for generation in range(generations):
        start = now - (generations - generation) * HOUR_MS
        for minute in range(60):
            batch = [
                Sample(
                    tenant,
                    "churn_requests_total",
                    pod_labels(generation, i),
                    start + minute * 60_000,
                    float(minute * (i % 7 + 1)),
                )
                for i in range(PODS)
            ]
            await pipeline.ingest("prometheus", batch)


def p50_and_min(values: list[float]) -> str:
    values = sorted(values)
    return f"p50 {values[len(values) // 2] * 1000:.1f} ms, min {values[0] * 1000:.1f} ms"


async def timed_runs(run, runs: int) -> tuple[list[float], list[float]]:
    for _ in range(3):  # warm-up: prepared paths, caches, the first pages
        await run()
    walls, cpus = [], []
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        await run()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return walls, cpus


async def cassandra_requests(store, call) -> str:
    """The requests one ``call`` sends through the store's request queue, by table read."""
    counts: collections.Counter = collections.Counter()
    run = store._requests.run

    def counted(requests, profile):
        counts.update(statement.query_string.partition(" FROM ")[2].split()[0] for statement, _ in requests)
        return run(requests, profile)

    store._requests.run = counted
    try:
        await call()
    finally:
        store._requests.run = run
    return ", ".join(f"{table.partition('.')[2]} {count}" for table, count in counts.most_common())


async def measure(store, tenant: str, generations: int, now: int, runs: int) -> None:
    planner = QueryPlanner(store, max_series=10_000, clock=lambda: now)
    api = PromQLAPI(PromQLService(store, planner, 50_000_000, 300_000, 60_000))
    steps: collections.Counter = collections.Counter()

    def step(name, call):
        @functools.wraps(call)
        async def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return await call(*args, **kwargs)
            finally:
                steps[name] += time.perf_counter() - started

        return timed

    for name in ("select", "histograms", "samples"):
        setattr(planner, name, step(name, getattr(planner, name)))

    async def answer(handler, args: dict[bytes, list[bytes]]) -> None:
        request = DummyRequest([b""])
        request.args = args
        request.requestHeaders.setRawHeaders(b"x-scope-orgid", [tenant.encode()])
        response = await prometheus_errors(handler)(request)
        if response.status != 200:
            raise RuntimeError(f"the query answered {response.status}: {response.body[:300]!r}")

    async def query_range():
        end = str(now / 1000).encode()
        await answer(
            api.query_range,
            {b"query": [QUERY], b"start": [str((now - HOUR_MS) / 1000).encode()], b"end": [end], b"step": [b"60"]},
        )

    async def count_now():
        await answer(api.query, {b"query": [COUNT], b"time": [str(now / 1000).encode()]})

    for name, query in (("query", query_range), ("count", count_now)):
        steps.clear()
        walls, cpus = await timed_runs(query, runs)
        requests = await cassandra_requests(store, query)
        per_step = ", ".join(f"{step} {seconds / (runs + 4) * 1000:.1f} ms" for step, seconds in steps.items())
        print(
            f"G={generations} {name:9s} wall {p50_and_min(walls)}; CPU {p50_and_min(cpus)}; steps (mean wall): {per_step}; Cassandra requests: {requests}"
        )
    live = generations - 1
    hashes = [series_set_hash(series_set_text("churn_requests_total", pod_labels(live, i))) for i in range(PODS)]

    async def read_raw():
        start = now - HOUR_MS - LOOKBACK_MS
        batch = series_per_read(start, now)
        for first in range(0, len(hashes), batch):
            await store.read_raw(tenant, hashes[first : first + batch], start, now)

    walls, cpus = await timed_runs(read_raw, runs)
    print(f"G={generations} read_raw  wall {p50_and_min(walls)}; CPU {p50_and_min(cpus)}")


async def run(args, store_url: str) -> None:
    store = CassandraStore.from_url(store_url, Layout())
    await store.start()
    try:
        now = int(time.time() * 1000) // 60_000 * 60_000
        for generations in args.generations:
            tenant = f"churn{generations}"
            started = time.monotonic()
            await load(store, tenant, generations, now)
            print(
                f"G={generations} loaded {generations * PODS * 60:,} samples in {time.monotonic() - started:.1f} s",
                file=sys.stderr,
            )
            await measure(store, tenant, generations, now, args.runs)
    finally:
        await store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--cassandra", required=True, metavar="HOST:PORT")
    parser.add_argument("--generations", default="1,24", type=lambda text: [int(g) for g in text.split(",")])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    host, port = parse_hostport(args.cassandra)
    cluster = connect(host, port)
    try:
        drop_keyspace(cluster.connect(), KEYSPACE)
    finally:
        cluster.shutdown()
    store_url = f"cassandra://{host}:{port}/{KEYSPACE}"
    CassandraStore.from_url(store_url, Layout()).apply_schema()
    try:
        task.react(lambda reactor: defer.ensureDeferred(run(args, store_url)))
    except SystemExit as finished:
        return int(finished.code or 0)
    return 0


if __name__ == "__main__":
    exit_with(main)
