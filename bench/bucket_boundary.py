"""Crossing a time-index bucket at 100k active series: ingest's request latency minute by minute.

Workload: ``--series`` (100,000) counters of one tenant, each with a sample every ``--interval``
(10 s) seconds, sent as requests of ``--per-request`` (2000) series, one sample each, by 4
concurrent senders, through ``IngestPipeline.ingest_arrays`` (remote write's path after decoding)
into SQLite in a temporary file, or a fresh keyspace of ``--cassandra HOST:PORT`` (dropped
after). The pipeline runs on a fake clock that follows the samples: rounds from ``--before``
(18) minutes before an hour bucket's boundary to ``--after`` (2) minutes past it, so the last
quarter of the bucket, where ingest indexes series in the next bucket ahead of time
(``PRE_INDEX_MS``, spread by hash), and the boundary itself are crossed as in production, but
as fast as the store takes it (each request's latency is real).

Printed, a line a minute of sample time: requests, samples refused, series-buckets indexed
(``write_series_buckets`` rows: the registrations), and the p50 / p99 request latency; then the
minute before the boundary beside the minute after (target: nothing refused, p99 within 2x).
The first minute holds the series' creation (their metadata) and is left out of the headline.

    PYTHONPATH=. python -m bench.bucket_boundary
    PYTHONPATH=. python -m bench.bucket_boundary --cassandra 127.0.0.1:9142
"""

import argparse
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
from twisted.internet import defer, threads

from bench.common import exit_with, react_until_done
from gateway.core.layout import INDEX_BUCKET_MS, Layout
from gateway.core.model import Limits, SeriesSamples
from gateway.ingest.metadata_cache import KnownSeries
from gateway.ingest.pipeline import IngestPipeline
from gateway.store.cassandra import CassandraStore
from gateway.store.sqlite import SQLiteStore

TENANT = "bench"
MINUTE_MS = 60_000
SENDERS = 4


class Clock:
    def __init__(self, now: int):
        self.now = now

    def __call__(self) -> int:
        return self.now


class CountedStore:
    """The store, counting the series-buckets ingest registers."""

    def __init__(self, store):
        self._store = store
        self.registered = 0

    def __getattr__(self, name):
        return getattr(self._store, name)

    def write_series_buckets(self, series_buckets):
        self.registered += len(series_buckets)
        return self._store.write_series_buckets(series_buckets)


def requests_of(series: int, per_request: int) -> list[tuple[list, list]]:
    """(keys, labels) of each request: label tuples as the remote-write decoder hands them."""
    groups = []
    for first in range(0, series, per_request):
        labels = [
            ("app_requests_total", (("job", "api"), ("pod", f"pod-{i:06d}"))) for i in range(first, first + per_request)
        ]
        groups.append((labels, labels))
    return groups


def name_and_tags(label: tuple) -> tuple[str, dict[str, str]]:
    name, tags = label
    return name, dict(tags)


async def send_round(pipeline, groups, timestamp: int, value: float, latencies: list, refused: list) -> None:
    async def sender(mine):
        for keys, labels in mine:
            batch = SeriesSamples(
                TENANT,
                keys,
                labels,
                name_and_tags,
                np.arange(len(keys), dtype=np.intp),
                np.full(len(keys), timestamp, dtype=np.int64),
                np.full(len(keys), value),
            )
            began = time.perf_counter()
            result = await pipeline.ingest_arrays("prometheus", batch)
            latencies.append(time.perf_counter() - began)
            refused.append(len(result.rejected))

    await defer.gatherResults(
        [defer.ensureDeferred(sender(groups[i::SENDERS])) for i in range(SENDERS)], consumeErrors=True
    )


async def measure(store, args) -> None:
    now = int(time.time() * 1000)
    boundary = now - now % INDEX_BUCKET_MS + INDEX_BUCKET_MS
    clock = Clock(boundary - args.before * MINUTE_MS)
    counted = CountedStore(store)
    pipeline = IngestPipeline(counted, Limits(), KnownSeries(2 * args.series), 10**8, clock=clock)
    groups = requests_of(args.series, args.per_request)
    interval = args.interval * 1000
    minutes: dict[int, dict] = {}
    value = 0.0
    for timestamp in range(clock.now, boundary + args.after * MINUTE_MS, interval):
        clock.now = timestamp
        minute = (timestamp - boundary) // MINUTE_MS
        figures = minutes.setdefault(minute, {"latencies": [], "refused": [], "registered": counted.registered})
        value += 1.0
        await send_round(pipeline, groups, timestamp, value, figures["latencies"], figures["refused"])
    print(
        f"{args.series} series, {args.per_request} a request, a sample each every {args.interval} s, {SENDERS} senders"
    )
    print(f"  {'minute':>6s} {'requests':>8s} {'refused':>7s} {'indexed':>8s} {'p50 ms':>7s} {'p99 ms':>7s}")
    registered_at = [figures["registered"] for figures in minutes.values()] + [counted.registered]
    for (minute, figures), registered_after in zip(minutes.items(), registered_at[1:]):
        latencies = np.array(figures["latencies"]) * 1000
        figures["p99"] = float(np.percentile(latencies, 99))
        print(
            f"  {minute:+6d} {len(latencies):8d} {sum(figures['refused']):7d} {registered_after - figures['registered']:8d}"
            f" {np.percentile(latencies, 50):7.1f} {figures['p99']:7.1f}"
        )
    before, after = minutes[-1], minutes[0]
    steady = [figures["p99"] for minute, figures in minutes.items() if minute > -args.before and minute < -15]
    print(
        f"  the minute before the boundary: p99 {before['p99']:.1f} ms, refused {sum(before['refused'])};"
        f" the minute after: p99 {after['p99']:.1f} ms ({after['p99'] / before['p99']:.2f}x), refused {sum(after['refused'])}"
    )
    if steady:
        print(f"  before the last quarter (no registration): p99 {max(steady):.1f} ms at most")
    print(f"  series-buckets indexed in all: {counted.registered} ({counted.registered / args.series:.2f} a series)")


async def run(args) -> None:
    if args.cassandra:
        keyspace = f"bench_boundary_{uuid.uuid4().hex[:8]}"
        store = CassandraStore.from_url(f"cassandra://{args.cassandra}/{keyspace}", Layout())
        await threads.deferToThread(store.apply_schema)
        await store.start()
        try:
            await measure(store, args)
        finally:
            await store._execute(f"DROP KEYSPACE {keyspace}")
            await store.close()
        return
    with tempfile.TemporaryDirectory() as directory:
        store = SQLiteStore(Path(directory) / "boundary.db", Layout())
        await store.start()
        try:
            await measure(store, args)
        finally:
            await store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bucket_boundary", description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=100_000)
    parser.add_argument("--per-request", type=int, default=2000)
    parser.add_argument("--interval", type=int, default=10, help="seconds between a series' samples")
    parser.add_argument("--before", type=int, default=18, help="minutes before the boundary to start")
    parser.add_argument("--after", type=int, default=2, help="minutes past the boundary to stop")
    parser.add_argument("--cassandra", metavar="HOST:PORT")
    args = parser.parse_args(argv)
    return react_until_done(run, args)


if __name__ == "__main__":
    exit_with(main)
