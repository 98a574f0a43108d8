"""CPU of CassandraStore.write_raw alone (no HTTP, no decode): what the store and the driver cost a sample.

Remote-write shaped requests (4 x 500 series, one sample each, rounds 10 s apart), 4 in flight,
after 8 untimed ones; prints samples/s, this process's CPU µs a sample and, when Cassandra runs on
this box, Cassandra's CPU µs a sample over the same time. Run it from a checkout to measure that
checkout's store (before/after a change):

    PYTHONPATH=. python -m bench.store_write --cassandra 127.0.0.1:9142
"""

import argparse
import os
import time

import numpy as np
from twisted.internet import defer, task

from bench.common import connect, exit_with, fresh_keyspace, listening_pid, process_cpu_s
from gateway.app.config import parse_hostport
from gateway.core.layout import Layout
from gateway.core.model import series_set_hash, series_set_text
from gateway.store.cassandra import CassandraStore
from gateway.store.contract import RawColumns

WARMUP = 8
IN_FLIGHT = 4


def requests_of(rounds: int) -> list[RawColumns]:
    """Requests of 500 series, one sample each, as ingest hands them to the store (columns)."""
    hashes = [series_set_hash(series_set_text("store_write", {"i": str(i)})) for i in range(2000)]
    start = int(time.time() * 1000) // 3_600_000 * 3_600_000 - 3_600_000
    return [
        RawColumns("bench", hashes[k * 500 : (k + 1) * 500], np.full(500, start + r * 10_000), np.full(500, float(r)))
        for r in range(rounds)
        for k in range(4)
    ]


async def measure(store_url: str, requests: list[RawColumns], cassandra_pid: int | None) -> None:
    store = CassandraStore.from_url(store_url, Layout())
    await store.start()
    try:
        await defer.gatherResults([store.write_raw(r) for r in requests[:WARMUP]])
        cpu, wall, cassandra_cpu = time.process_time(), time.perf_counter(), cpu_s(cassandra_pid)
        for i in range(WARMUP, len(requests), IN_FLIGHT):
            await defer.gatherResults([store.write_raw(r) for r in requests[i : i + IN_FLIGHT]])
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        cassandra_cpu = cpu_s(cassandra_pid) - cassandra_cpu
    finally:
        await store.close()
    samples = sum(len(r) for r in requests[WARMUP:])
    cassandra = f", Cassandra {cassandra_cpu / samples * 1e6:.1f} µs" if cassandra_pid else ""
    print(
        f"{samples} samples, {samples / wall:.0f} samples/s, {cpu / samples * 1e6:.1f} µs CPU a sample (store + driver)"
        + cassandra
    )


def cpu_s(pid: int | None) -> float:
    return process_cpu_s(pid) if pid else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.store_write", description=__doc__.splitlines()[0])
    parser.add_argument("--cassandra", metavar="HOST:PORT", required=True)
    parser.add_argument("--rounds", type=int, default=50, help="rounds of 2000 series (default 50)")
    args = parser.parse_args(argv)
    host, port = parse_hostport(args.cassandra)
    cluster = connect(host, port)
    try:
        with fresh_keyspace(cluster.connect(), host, port, f"tsgate_bench_sw_{os.getpid()}") as store_url:
            requests = requests_of(args.rounds)
            try:
                pid = listening_pid(port) if host in ("127.0.0.1", "localhost") else None
                task.react(lambda reactor: defer.ensureDeferred(measure(store_url, requests, pid)))
            except SystemExit as exit_:
                if exit_.code:
                    raise
    finally:
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    exit_with(main)
