"""What ``tsgate schema expire-old-index`` costs: rows walked and rewritten a second
(docs/storage.rst, "The index shrinks").

Writes ``--series`` (20,000) series of 5 labels into the all-time index of a keyspace of its own
(``bench_expire_old_index``, dropped first if a run before left it) as a gateway older than the
time index did (the store's statements with ``USING TTL 0``: no TTL), 13 rows a series, then
runs ``tsgate schema expire-old-index`` on it (a subprocess, as an operator would) and prints its
output and the rows a second. The keyspace is left for the next run to drop: dropping it at once,
while Cassandra 5.0 was still reclaiming the commit log those writes filled, stopped the dev
node (``Unknown CF`` in its commit-log allocator, commit_failure_policy stop).

    PYTHONPATH=. python -m bench.expire_old_index --cassandra 127.0.0.1:9142
"""

import argparse
import subprocess
import sys
import time

from bench.common import REPO, exit_with, react_until_done
from gateway.core.layout import Layout
from gateway.core.model import SeriesKey, series_set_hash, series_set_text
from gateway.store.cassandra import CassandraStore

TENANT = "bench"
KEYSPACE = "bench_expire_old_index"
WRITE_CHUNK = 2000


def workload(count: int) -> list[SeriesKey]:
    series = []
    for i in range(count):
        name = f"app_requests_{i % 10}_total"
        tags = {
            "job": "api",
            "namespace": "shop",
            "pod": f"api-{i:06d}",
            "instance": f"10.0.{i // 250}.{i % 250}:8080",
            "container": "api",
        }
        series.append(SeriesKey(TENANT, series_set_hash(series_set_text(name, tags)), name, tags))
    return series


async def write_old_index(url: str, series: list[SeriesKey]) -> None:
    store = CassandraStore.from_url(url, Layout())
    store.apply_schema()
    await store.start()
    store._all_time_ttl_s = lambda tenant: 0  # type: ignore[method-assign]  # TTL 0: none, as before the upgrade
    try:
        started = time.monotonic()
        for i in range(0, len(series), WRITE_CHUNK):
            await store.write_series(series[i : i + WRITE_CHUNK])
        print(f"wrote {len(series):,} series without a TTL in {time.monotonic() - started:.1f} s", flush=True)
    finally:
        await store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cassandra", default="127.0.0.1:9042", help="host:port of a running Cassandra")
    parser.add_argument("--series", type=int, default=20_000)
    args = parser.parse_args()
    url = f"cassandra://{args.cassandra}/{KEYSPACE}"
    store = CassandraStore.from_url(url, Layout())
    session = store._connect(None)
    session.execute(f"DROP KEYSPACE IF EXISTS {KEYSPACE}", timeout=120)
    store.cluster.shutdown()
    react_until_done(write_old_index, url, workload(args.series))
    command = [sys.executable, "-m", "gateway.app.cli", "schema", "expire-old-index", "--store", url]
    started = time.monotonic()
    out = subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True).stdout
    elapsed = time.monotonic() - started
    print(out, end="")
    print(f"tsgate schema expire-old-index took {elapsed:.1f} s, the process's start included", flush=True)
    return 0


if __name__ == "__main__":
    exit_with(main)
