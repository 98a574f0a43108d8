"""Redis memory per active series: what ``--redis`` costs as series grow (docs/scaling.rst).

A real ``tsgate serve --roles ingest,query --redis ...`` on the embedded store (Redis holds the
same keys whichever store is used) and a Redis of its own; N distinct series (5 labels, as
bench/memory.py's) sent by remote write 1.0, 2000 series a request, one sample of each in the
current slot. Every series then has its metadata-cache key (``series|<tenant>|<hash>``, kept
``--redis-key-ttl``) and a member in its slot's pending roll-up set (``pending|<partition>|<slot>``)
until the downsampler seals the slot. Redis's ``used_memory`` before and after, over N, is the
figure; the key counts say what it is made of.

    python -m bench.redis_memory                 # 100k series, about a minute
    python -m bench.redis_memory --series 10000  # a smoke run
"""

import argparse
import http.client
import shutil
import tempfile
import time
from pathlib import Path

import redis

from bench.common import BenchError, exit_with, post_until_accepted, tsgate_service
from gateway.app.devservices.redis import RedisServer
from protocols.prometheus import WriteSeries, encode_write_request_v1

SERIES_PER_REQUEST = 2000


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def key_counts(client: redis.Redis) -> dict[str, int]:
    """Keys by kind (the part after the store-identity prefix), and members of the pending sets."""
    counts = {"series keys": 0, "pending sets": 0, "pending members": 0, "other keys": 0}
    for key in client.scan_iter(match="tsgate|*", count=10_000):
        if b"|series|" in key:
            counts["series keys"] += 1
        elif b"|pending|" in key:
            counts["pending sets"] += 1
            counts["pending members"] += client.scard(key)
        else:
            counts["other keys"] += 1
    return counts


def write_series(port: int, count: int, timestamp_ms: int) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy", "X-Scope-OrgID": "bench"}
    try:
        for first in range(0, count, SERIES_PER_REQUEST):
            body = encode_write_request_v1(
                WriteSeries(
                    {
                        "__name__": "node_cpu_seconds_total",
                        "instance": f"host-{n // 100:05d}:9100",
                        "job": "node",
                        "cpu": str(n % 100),
                        "mode": "user",
                    },
                    [(timestamp_ms, float(n))],
                )
                for n in range(first, min(first + SERIES_PER_REQUEST, count))
            )
            post_until_accepted(connection, "/api/v1/write", body, headers, 204)
    finally:
        connection.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.redis_memory", description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=100_000, help="active series written (default 100000)")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="tsgate-bench-redis-"))
    server = RedisServer(workdir / "redis")
    gateway = None
    try:
        server.start()
        client = redis.Redis.from_url(server.url)
        gateway = tsgate_service(
            "tsgate",
            ["--data-dir", str(workdir / "data"), "--redis", server.url, "--workers", "1", "--roles", "ingest,query"],
            workdir / "tsgate.log",
        )
        gateway.start()
        before = used_memory(client)
        started = time.monotonic()
        write_series(gateway.port, args.series, int(time.time() * 1000))
        after = used_memory(client)
        counts = key_counts(client)
        if counts["series keys"] != args.series:
            raise BenchError(f"{counts['series keys']} series keys in Redis for {args.series} series written")
        print(
            f"{args.series} series written in {time.monotonic() - started:.0f} s; Redis used_memory"
            f" {before / 2**20:.1f} MiB before, {after / 2**20:.1f} MiB after:"
            f" {(after - before) / args.series:.0f} bytes a series; {counts}"
        )
        client.close()
    finally:
        if gateway is not None:
            gateway.stop()
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    exit_with(main)
