"""What selecting a range's series costs, 1 h to 365 d (docs/storage.rst, "The time index").

Workload: a tenant with a year of daily deploys, ``--pods`` (50) pods a generation, one generation
a UTC day: counters ``churn_requests_total{job="api", pod="p<g>-<i>"}`` of generation g live over
day g (``--days`` generations, 365: 18,250 series). The index holds what a store holds after a
year of that: every series in the all-time tables (their 1 h roll-ups live 365 days), and the
last ``--raw-days`` (7, the raw retention) of hour buckets in the time index (older buckets were
swept or expired).

Timed: ``QueryPlanner.select_series`` of ``{job="api"}`` over the last 1 h, 1 d, 30 d and 365 d,
each run with a fresh planner (no series cache), ``--runs`` (10) times; printed per range: which
index the planner read (buckets, or all-time), the lookups a filter that costs, the series the
range holds, the series selected, and p50 ms. SQLite in a temporary file; with ``--cassandra
HOST:PORT`` also a fresh keyspace there (dropped at the end).

    PYTHONPATH=. python -m bench.selection
    PYTHONPATH=. python -m bench.selection --cassandra 127.0.0.1:9142
"""

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from twisted.internet import threads

from bench.common import exit_with, react_until_done
from gateway.core.layout import DAY_MS, HOUR_MS, INDEX_BUCKET_MS, Layout
from gateway.core.model import SeriesKey, series_set_hash, series_set_text
from gateway.query.planner import QueryPlanner
from gateway.store.cassandra import CassandraStore
from gateway.store.sqlite import SQLiteStore

TENANT = "bench"
METRIC = "churn_requests_total"
RANGES = (("1 h", HOUR_MS), ("1 d", DAY_MS), ("30 d", 30 * DAY_MS), ("365 d", 365 * DAY_MS))


def generation_series(generation: int, pods: int) -> list[SeriesKey]:
    keys = []
    for pod in range(pods):
        tags = {"job": "api", "pod": f"p{generation}-{pod}"}
        keys.append(SeriesKey(TENANT, series_set_hash(series_set_text(METRIC, tags)), METRIC, tags))
    return keys


async def write_workload(store, now: int, days: int, pods: int, raw_days: int) -> None:
    """Generation g (0 = today) lives over the UTC day ``g`` days before today's: indexed in each
    hour of it within the raw retention, and older ones in the last hour of their day alone (their
    earlier buckets would have been swept; the last sets their last_bucket). A series' first
    bucket a day writes its all-time rows too (index.DailyRefresh)."""
    today = now - now % DAY_MS
    for generation in range(days):
        keys = generation_series(generation, pods)
        day = today - generation * DAY_MS
        if generation <= raw_days:
            hours = range(day, min(day + DAY_MS, now + 1), INDEX_BUCKET_MS)
        else:
            hours = range(day + DAY_MS - INDEX_BUCKET_MS, day + DAY_MS, INDEX_BUCKET_MS)
        await store.write_series_buckets([(key, hour) for hour in hours for key in keys])


def held(now: int, width: int, days: int, pods: int) -> int:
    """Series with samples in [now - width, now]: generations whose day overlaps it."""
    today = now - now % DAY_MS
    return pods * sum(1 for g in range(days) if today - g * DAY_MS + DAY_MS > now - width)


async def measure(name: str, store, now: int, args) -> None:
    await write_workload(store, now, args.days, args.pods, args.raw_days)
    print(f"{name}: {args.days} daily generations of {args.pods} pods, hour buckets of the last {args.raw_days} days")
    print(f"  {'range':6s} {'index read':22s} {'lookups/filter':>14s} {'held':>7s} {'selected':>8s} {'p50 ms':>8s}")
    for label, width in RANGES:
        times, selected = [], 0
        planner = QueryPlanner(store, 10**7, clock=lambda: now)
        buckets = planner.index_buckets(TENANT, now - width, now)
        where = "all-time" if buckets is None else f"{len(buckets.starts())} hour buckets"
        lookups = 1 if buckets is None else len(buckets.starts())
        for _ in range(args.runs):
            planner = QueryPlanner(store, 10**7, clock=lambda: now)
            began = time.perf_counter()
            found = await planner.select_series(TENANT, METRIC, {"job": "api"}, now - width, now)
            times.append(time.perf_counter() - began)
            selected = len(found)
        truth = held(now, width, args.days, args.pods)
        p50 = statistics.median(times) * 1000
        print(f"  {label:6s} {where:22s} {lookups:14d} {truth:7d} {selected:8d} {p50:8.1f}")


async def run(args) -> None:
    now = int(time.time() * 1000)
    with tempfile.TemporaryDirectory() as directory:
        store = SQLiteStore(Path(directory) / "selection.db", Layout())
        await store.start()
        try:
            await measure("SQLite", store, now, args)
        finally:
            await store.close()
    if args.cassandra:
        keyspace = f"bench_selection_{uuid.uuid4().hex[:8]}"
        cassandra = CassandraStore.from_url(f"cassandra://{args.cassandra}/{keyspace}", Layout())
        await threads.deferToThread(cassandra.apply_schema)
        await cassandra.start()
        try:
            await measure("Cassandra", cassandra, now, args)
        finally:
            await cassandra._execute(f"DROP KEYSPACE {keyspace}")
            await cassandra.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.selection", description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--pods", type=int, default=50)
    parser.add_argument("--raw-days", type=int, default=7)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--cassandra", metavar="HOST:PORT")
    args = parser.parse_args(argv)
    return react_until_done(run, args)


if __name__ == "__main__":
    exit_with(main)
