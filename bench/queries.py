"""Query latency of a real ``tsgate serve --workers 1`` on Cassandra, over HTTP as clients send them.

Three workloads on a fresh keyspace, written untimed; then every query is sent on one keep-alive
connection, 1 untimed warm-up and N timed requests, and every answer is checked (a wrong one
fails the run). Full sizes, ``--quick`` in brackets:

* ``/render`` of 100 [20] series x 24 h at a 10 s step (8640 points each), ``bench.render.*``,
  ``from=-24h``, ``format=json``, 8 [3] requests (one takes seconds). The gateway gets a carbon
  ``storage-schemas.conf`` giving these paths ``10s:1d``: without one every path renders at 60 s.
  Written through ``POST /api/write``.
* ``/metrics/find`` on bench/find.py's tree of 100k [10k] Graphite paths, its ``a.*.c`` and
  ``*.*.leaf`` queries as Grafana's metric browser sends them (treejson), 30 [5] requests. The
  tree is written with bench/find.py's populate (the store's write_series, about 3 times faster
  than one sample per path through the gateway) in a child process, since it needs a Twisted
  reactor, which cannot be restarted in a process that runs several parts (``python -m bench``).
* Prometheus remote read of 1000 [200] series x 1 h at 10 s (360 samples each), one query matching
  them all, answered as SAMPLES and as STREAMED_XOR_CHUNKS, 8 [3] requests each. Written through
  ``POST /api/write``.

Figures are p50 and p99 (nearest rank: under 100 requests p99 is the slowest) in milliseconds,
from the request sent until the last byte of the answer read.
"""

import contextlib
import http.client
import json
import os
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import NamedTuple

from twisted.internet import defer, task

from bench.common import REPO, BenchError, connect, fresh_keyspace, run_part_alone, tsgate_service
from bench.find import DCS, QUERIES, hosts_for, percentile, populate
from bench.ingest_cassandra import post_all
from bench.report import Figure
from gateway.app.config import parse_hostport
from gateway.core.layout import Layout
from gateway.core.model import now_ms
from gateway.store.cassandra import CassandraStore
from protocols import prometheus

SECTION = "query"
STEP_MS = 10_000
RENDER_POINTS = 24 * 3600 * 1000 // STEP_MS  # 8640
READ_POINTS = 3600 * 1000 // STEP_MS  # 360
READ_METRIC = "bench_read"
TENANTS = {"render": "bench-render", "find": "bench-find", "read": "bench-read"}
# carbon's storage-schemas.conf: the bench.render.* paths at 10 s (the first archive gives the step).
SCHEMAS = "[bench_render]\npattern = ^bench\\.render\\.\nretentions = 10s:1d\n"
SAMPLES_PER_BODY = 10_000  # ~0.8 MB of JSON, under the gateway's 10 MiB --max-body-bytes
CONNECTIONS = 2
# Batches of write_series, one at a time, at most 64 CQL requests in flight (the store's default is
# 256): with more, a busy 2-core box answered WriteTimeout (the loader does not retry).
TREE_BATCH, TREE_CONCURRENCY, TREE_INFLIGHT = 5000, 1, 64
WARMUP_REQUESTS = 1
MAX_ANSWER_BYTES = 1 << 30


class Sizes(NamedTuple):
    render_series: int
    render_requests: int
    find_metrics: int
    find_requests: int
    read_series: int
    read_requests: int


# A full render takes ~14 s and a full remote read ~10 s on the shared 2-core box: 8 of each keeps
# the part near 8 minutes; a find takes well under a second.
FULL = Sizes(100, 8, 100_000, 30, 1000, 8)
QUICK = Sizes(20, 3, 10_000, 5, 200, 3)


class Timed(NamedTuple):
    p50: float
    p99: float
    answer_bytes: int


def value(i: int, j: int) -> float:
    """Exact in binary and in JSON, so a difference read back is a real one."""
    return i + j / 1024


def timestamps(points: int) -> list[int]:
    """``points`` timestamps STEP_MS apart, the last one now (rounded down to the step)."""
    end = now_ms() // STEP_MS * STEP_MS
    return [end - (points - 1 - j) * STEP_MS for j in range(points)]


def write_json(port: int, what: str, items: list[dict], tenant: str | None = None) -> float:
    """POST /api/write in bodies of SAMPLES_PER_BODY samples (to ``tenant``, by default the
    workload's own); 200 means stored. Returns the seconds it took."""
    bodies = [
        json.dumps(items[start : start + SAMPLES_PER_BODY], separators=(",", ":")).encode()
        for start in range(0, len(items), SAMPLES_PER_BODY)
    ]
    started = time.perf_counter()
    post_all(port, bodies, tenant or TENANTS[what], CONNECTIONS)
    seconds = time.perf_counter() - started
    print(
        f"query: wrote {what}: {len(items)} samples in {seconds:.1f} s ({len(items) / seconds:.0f}/s)",
        file=sys.stderr,
        flush=True,
    )
    return seconds


def time_requests(port: int, method: str, path: str, body: bytes | None, headers: dict, requests: int, check) -> Timed:
    """Warm up, then time ``requests`` identical requests on one keep-alive connection.

    ``check(answer)`` raises BenchError on a wrong answer; it runs after the clock stopped.
    """
    samples = []
    with contextlib.closing(http.client.HTTPConnection("127.0.0.1", port, timeout=300)) as connection:
        for index in range(WARMUP_REQUESTS + requests):
            started = time.perf_counter()
            connection.request(method, path, body, headers)
            response = connection.getresponse()
            answer = response.read()
            elapsed_ms = (time.perf_counter() - started) * 1000
            if response.status != 200:
                raise BenchError(f"{method} {path[:100]} answered {response.status}: {answer[:300]!r}")
            check(answer)
            if index >= WARMUP_REQUESTS:
                samples.append(elapsed_ms)
    return Timed(percentile(samples, 0.5), percentile(samples, 0.99), len(answer))


def figures(name: str, timed: Timed, note: str) -> list[Figure]:
    return [
        Figure(SECTION, name, timed.p50, "ms p50", note=note),
        Figure(SECTION, name, timed.p99, "ms p99", note=note),
    ]


def render_check(names: list[str], stamps: list[int], value, buckets: int | None):
    """check(answer) of a /render answer in JSON: every series of ``names`` (path i holds
    ``value(i, j)`` at ``stamps[j]``, in ms), with ``buckets`` points each when given, and every
    sample written inside the answer's window with its value."""
    index = {name: i for i, name in enumerate(names)}
    point_of = {ts // 1000: j for j, ts in enumerate(stamps)}

    def check(answer: bytes) -> None:
        rendered = json.loads(answer)
        if sorted(s["target"] for s in rendered) != sorted(names):
            raise BenchError(f"render returned {len(rendered)} series, not the {len(names)} written")
        for s in rendered:
            i, points = index[s["target"]], s["datapoints"]
            if buckets is not None and len(points) != buckets:
                raise BenchError(f"render: {s['target']} has {len(points)} points, not {buckets}")
            first, last = points[0][1], points[-1][1]
            expected = {t: value(i, j) for t, j in point_of.items() if first <= t <= last}
            got = {t: v for v, t in points if v is not None}
            if got != expected:
                raise BenchError(
                    f"render: {s['target']} has {len(got)} values where {len(expected)} were written, or wrong ones"
                )

    return check


def bench_render(port: int, series: int, requests: int) -> list[Figure]:
    """``series`` paths x 24 h at 10 s, rendered all at once at their 10 s step."""
    stamps = timestamps(RENDER_POINTS)
    names = [f"bench.render.s{i}" for i in range(series)]
    write_json(
        port,
        "render",
        [
            {"metricName": names[i], "ts": ts, "value": value(i, j)}
            for i in range(series)
            for j, ts in enumerate(stamps)
        ],
    )
    check = render_check(names, stamps, value, RENDER_POINTS)
    query = urllib.parse.urlencode({"target": "bench.render.*", "from": "-24h", "format": "json"})
    timed = time_requests(port, "GET", f"/render?{query}", None, {"X-Tenant": TENANTS["render"]}, requests, check)
    note = f"{requests} requests, {series} series x {RENDER_POINTS} points, {timed.answer_bytes / 2**20:.1f} MiB JSON"
    return figures(f"render {series} series x 24h @10s", timed, note)


def write_tree(store_url: str, metrics: int) -> None:
    """bench/find.py's tree through the store's write_series, in a child process (see the docstring)."""
    subprocess.run(
        [sys.executable, "-m", "bench.queries", "--write-tree", store_url, str(metrics)],
        cwd=REPO,
        check=True,
    )


async def write_tree_here(store_url: str, metrics: int) -> None:
    store = CassandraStore.from_url(f"{store_url}?max_inflight={TREE_INFLIGHT}", Layout())
    await store.start()
    try:
        written, seconds = await populate(store, TENANTS["find"], metrics, TREE_BATCH, TREE_CONCURRENCY)
    finally:
        await store.close()
    print(
        f"query: wrote the find tree: {written} paths in {seconds:.1f} s ({written / seconds:.0f}/s)",
        file=sys.stderr,
        flush=True,
    )


def bench_find(port: int, store_url: str, metrics: int, requests: int) -> list[Figure]:
    """bench/find.py's a.*.c and *.*.leaf queries on its tree of ``metrics`` paths."""
    write_tree(store_url, metrics)
    headers = {"X-Tenant": TENANTS["find"]}
    # How many nodes each query reaches (format=json lists every one; treejson one per name).
    matches = {"a.*.c": hosts_for(metrics), "*.*.leaf": DCS * hosts_for(metrics)}
    results = []
    for label, query in QUERIES:
        if label not in matches:
            continue
        with contextlib.closing(http.client.HTTPConnection("127.0.0.1", port, timeout=300)) as connection:
            connection.request(
                "GET", "/metrics/find?" + urllib.parse.urlencode({"query": query, "format": "json"}), headers=headers
            )
            response = connection.getresponse()
            nodes = response.read()
        if response.status != 200 or len(json.loads(nodes)) != matches[label]:
            raise BenchError(f"find {query}: {response.status} {nodes[:200]!r}...: not {matches[label]} nodes")
        first: list[bytes] = []

        def check(answer: bytes) -> None:
            """Every treejson answer must be the first one, byte for byte: the tree does not change."""
            if not first:
                first.append(answer)
            if answer != first[0] or not json.loads(answer):
                raise BenchError(f"find {query}: an empty answer, or answers differ between requests")

        timed = time_requests(
            port, "GET", "/metrics/find?" + urllib.parse.urlencode({"query": query}), None, headers, requests, check
        )
        note = f"{requests} requests, {matches[label]} nodes reached, treejson {timed.answer_bytes} B"
        results += figures(f"find {query} ({label}), {metrics // 1000}k paths", timed, note)
    return results


def remote_read_headers(tenant: str) -> dict:
    """What Prometheus's remote-read client sends; X-Scope-OrgID names tsgate's tenant (others ignore it)."""
    return {
        "Content-Type": "application/x-protobuf",
        "Content-Encoding": "snappy",
        "X-Prometheus-Remote-Read-Version": "0.1.0",
        "X-Scope-OrgID": tenant,
    }


def remote_read_series(answer: bytes, response_type: str) -> list[tuple[dict, list]]:
    """(labels, samples) of each series of a remote-read answer to one query, SAMPLES or
    STREAMED_XOR_CHUNKS; a series spanning several frames (past 1 MiB of chunks) is joined."""
    if response_type == prometheus.SAMPLES:
        (result,) = prometheus.decode_read_response(answer, MAX_ANSWER_BYTES)
        return result
    found: dict[tuple, tuple[dict, list]] = {}
    for query_index, labels, samples in prometheus.decode_chunked_read_response(answer):
        if query_index != 0:
            raise BenchError(f"remote read: a frame of query {query_index}, labels {labels}; only one was asked")
        found.setdefault(tuple(sorted(labels.items())), (labels, []))[1].extend(samples)
    return list(found.values())


def bench_remote_read(port: int, series: int, requests: int) -> list[Figure]:
    """``series`` series x 1 h at 10 s, read back by one query matching them all, in both answer types."""
    stamps = timestamps(READ_POINTS)
    write_json(
        port,
        "read",
        [
            {"metricName": READ_METRIC, "tags": {"job": "bench", "i": str(i)}, "ts": ts, "value": value(i, j)}
            for i in range(series)
            for j, ts in enumerate(stamps)
        ],
    )
    expected = {str(i): [(ts, value(i, j)) for j, ts in enumerate(stamps)] for i in range(series)}
    query = prometheus.ReadQuery(stamps[0], stamps[-1], [prometheus.Matcher("EQ", "__name__", READ_METRIC)])

    def checker(response_type: str):
        def check(answer: bytes) -> None:
            found = {}
            for labels, samples in remote_read_series(answer, response_type):
                if labels["__name__"] != READ_METRIC:
                    raise BenchError(f"remote read: unexpected series {labels}")
                found[labels["i"]] = samples
            if found != expected:
                counts = sorted({len(samples) for samples in found.values()})
                raise BenchError(
                    f"remote read: {len(found)} series of {counts} samples, not {series} x {READ_POINTS} as written"
                )

        return check

    headers = remote_read_headers(TENANTS["read"])
    results = []
    for response_type in (prometheus.SAMPLES, prometheus.STREAMED_XOR_CHUNKS):
        body = prometheus.encode_read_request([query], [response_type])
        timed = time_requests(port, "POST", "/api/v1/read", body, headers, requests, checker(response_type))
        note = f"{requests} requests, {series} x {READ_POINTS} samples, answer {timed.answer_bytes / 2**20:.2f} MiB"
        results += figures(f"remote read {series} series x 1h, {response_type}", timed, note)
    return results


def run(cassandra: str, workdir: Path, quick: bool) -> list[Figure]:
    """Every query figure, on a keyspace of its own in the given Cassandra (dropped afterwards)."""
    sizes = QUICK if quick else FULL
    host, port = parse_hostport(cassandra)
    schemas = workdir / "storage-schemas.conf"
    schemas.write_text(SCHEMAS)
    cluster = connect(host, port)
    try:
        with fresh_keyspace(cluster.connect(), host, port, f"tsgate_bench_query_{os.getpid()}") as store_url:
            gateway = tsgate_service(
                "tsgate",
                ["--store", store_url],
                workdir / "tsgate-query.log",
                ["--workers", "1", "--roles", "ingest,query", "--graphite-storage-schemas", str(schemas)],
            )
            try:
                gateway.start()
                return [
                    *bench_render(gateway.port, sizes.render_series, sizes.render_requests),
                    *bench_find(gateway.port, store_url, sizes.find_metrics, sizes.find_requests),
                    *bench_remote_read(gateway.port, sizes.read_series, sizes.read_requests),
                ]
            finally:
                gateway.stop()
    finally:
        cluster.shutdown()


def main() -> None:
    if sys.argv[1:2] == ["--write-tree"]:  # the child process run() starts to write the find tree
        store_url, metrics = sys.argv[2:4]
        task.react(lambda reactor: defer.ensureDeferred(write_tree_here(store_url, int(metrics))))
    run_part_alone(run, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    main()
