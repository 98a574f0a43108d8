"""Kubernetes-style series churn: a dashboard's queries of the last hour, tsgate beside Prometheus 2.42.

Workload: G generations of 500 pods, one generation an hour (a deploy). Generation g's counters
``churn_requests_total{job="api", pod="p<g>-<i>"}`` have a sample every 60 s over the hour
[now - (G-g) h, now - (G-g-1) h), so the last generation ends a minute before ``now`` and 500
series are live at any time: G x 500 series and G x 30,000 samples (G=24: 12,000 series, 720,000
samples; G=168: 84,000 and 5.04M). Values rise by 0.5-8 a minute, multiples of 0.5 (exact in
binary and in text). ``now`` is taken once at the start, rounded down to the minute (``--minute M``: the
last M minutes past an hour at or before it), and every query of every generation count uses it,
so answers are comparable.

Sending: remote write 1.0 (bench.remote_write's encoder and sender), 4 connections, each owning
125 pods of every generation; a request holds its 125 pods x 20 consecutive minutes (2,500
samples). One generation (12 requests) is sent at a time and the next waits until all of them
are answered, so the data arrives in time order within an hour: Prometheus's receiver appends to
its head and refuses ("out of bounds") a sample older than an hour before the newest it holds, or
than the end of the last block it cut (checked on 2.42: after a sample at now, one 50 min older
gets 204, one 70 min older 400 "out of bounds"); in time order it takes all 168 h with its
default configuration (no out-of-order window).
Every request goes to both systems; errors are counted and printed, not fatal.

For each generation count (``--generations``, default 1,2,24,168), a fresh Prometheus
(``--web.enable-remote-write-receiver``, data in a temporary directory) and a fresh ``tsgate
serve`` on SQLite (``--roles ingest,query``: no roll-ups in the background, so nothing competes
with the queries; ``--seal`` runs ``tsgate downsample --once`` after the writes, as data this old
is in production); with ``--cassandra HOST:PORT`` also one on a fresh keyspace of that Cassandra
(dropped at the end) with a redis-server started here on a free loopback port. tsgate keeps its
own default ``--max-series-per-query`` (10000; bench.common's tsgate_service raises it, this bench
sets it back, ``--max-series-per-query`` changes it) and gets ``--max-sample-age`` past G hours.

Timed, after every server is idle: the queries Grafana sends for a dashboard of the last hour, one
warm-up then ``--runs`` (10) rounds of one request to each server in turn (the order reversed every
other round), each on one keep-alive connection per server; p50 and p90 in ms. Whatever the status
(tsgate's 422 "matches more than N series" included), the time to the last byte is a figure and the
status is printed, and each server's CPU a request (``P cpu``, ``T cpu``: the on-CPU time of its
process tree over the timed rounds, divided by the rounds; tsgate's serving process and query
executors together), which leaves out the time a request waits for an idle core to wake (it
still moves with the box: caches, neighbours; compare its ratio). Then, untimed, tsgate's answer is compared with Prometheus's (numbers within
1e-9 relative, series sets and label value lists as sets), and each with the exact answer where the
workload defines one (``exact P/T``): 500 series now, the 500 pods of the last hour, the labels
{__name__, job, pod}. Prometheus answers label and series requests per block (its head holds the
last 2-3 h, whole), so it may list more than the range holds: the note gives both sizes.

Headlines: tsgate's p50 at the largest G over its p50 at the smallest G per query (target <= 1.3:
a query of the last hour costs what the last hour holds) and tsgate / Prometheus at the largest G
(target <= 2). The last hour of G=1 holds 500 series and that of any G >= 2 holds 1,000 (the
generation before the last has samples until a minute before the hour, in the first steps' 5 m
windows), so ``like`` also gives the growth from the smallest G >= 2, the same series in the range
(the history alone), and ``Prometheus growth`` Prometheus's own from the smallest G.

``--long-ranges``: after the largest G, ``count(churn_requests_total{job="api"})`` over the last
1 h, 1 d and 7 d (as far as the data goes; about 720 steps) and ``/api/v1/series`` over the same
ranges, times and sizes of both systems.

Run from the repository root::

    python -m bench.churn --quick
    python -m bench.churn --generations 1,24
    python -m bench.churn --minute 30 --runs 30
    python -m bench.churn --generations 1,24,168 --long-ranges --cassandra 127.0.0.1:9142

Everything started binds 127.0.0.1 and is stopped at the end, failed or not; temporary
directories are removed and keyspaces dropped. Exit status 1 when a server failed to start or took
fewer samples than sent; a slow or different answer is a figure, not a failure.
"""

import argparse
import contextlib
import http.client
import json
import math
import os
import shlex
import shutil
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import NamedTuple

from bench.common import (
    BenchError,
    Service,
    connect,
    fresh_keyspace,
    settle,
    tree_run_time_s,
    tsgate_service,
    wait_until_idle,
    which,
)
from bench.downsample import run_downsampler
from bench.find import percentile
from bench.remote_write import TENANT, prometheus_service, send
from gateway.app.config import parse_hostport
from gateway.app.devservices.redis import RedisServer
from protocols.prometheus import WriteSeries, encode_write_request_v1

METRIC = "churn_requests_total"
JOB = "api"
PODS = 500
STEP_MS = 60_000
HOUR_MS = 3_600_000
MINUTES = HOUR_MS // STEP_MS
SHARDS = 4
MINUTES_PER_REQUEST = 20
SELECTOR = f'{METRIC}{{job="{JOB}"}}'
QUERY_HEADERS = {"X-Scope-OrgID": TENANT}
QUERY_TIMEOUT_S = 600
SEND_TIMEOUT_S = 1800
TARGET_GROWTH = 1.3
TARGET_RATIO = 2.0
REL_TOLERANCE = 1e-9


def log(message: str) -> None:
    print(f"churn: {message}", file=sys.stderr, flush=True)


def pod(generation: int, i: int) -> str:
    return f"p{generation}-{i}"


def value(i: int, minute: int) -> float:
    return i + (i % 16 + 1) * 0.5 * minute


class Workload:
    """G generations of PODS counters; bodies[g][k]: shard k's requests of generation g, in time order."""

    def __init__(self, generations: int, now_ms: int):
        self.generations = generations
        self.now_ms = now_ms
        self.samples = generations * PODS * MINUTES
        self.series = generations * PODS
        per_shard = PODS // SHARDS
        self.bodies = [
            [
                [
                    encode_write_request_v1(
                        WriteSeries(
                            {"__name__": METRIC, "job": JOB, "pod": pod(g, i)},
                            [
                                (self.start_ms(g) + m * STEP_MS, value(i, m))
                                for m in range(first, first + MINUTES_PER_REQUEST)
                            ],
                        )
                        for i in range(k * per_shard, (k + 1) * per_shard)
                    )
                    for first in range(0, MINUTES, MINUTES_PER_REQUEST)
                ]
                for k in range(SHARDS)
            ]
            for g in range(generations)
        ]
        self.samples_per_request = per_shard * MINUTES_PER_REQUEST

    def start_ms(self, generation: int) -> int:
        return self.now_ms - (self.generations - generation) * HOUR_MS

    def live_pods(self, start_ms: int, end_ms: int) -> set[str]:
        """Pods with a sample in [start_ms, end_ms]."""
        found = set()
        for g in range(self.generations):
            first, last = self.start_ms(g), self.start_ms(g) + (MINUTES - 1) * STEP_MS
            if first <= end_ms and last >= start_ms:
                found.update(pod(g, i) for i in range(PODS))
        return found


class Batch(NamedTuple):
    """What bench.remote_write.send takes: bodies per shard and the samples each acknowledges."""

    bodies: list[list[bytes]]
    series_per_request: int


def load(service: Service, workload: Workload) -> str:
    """Send every generation in turn (each waits for the previous one's answers); a summary line."""
    started = time.perf_counter()
    acknowledged, errors = 0, {}
    for g, bodies in enumerate(workload.bodies):
        done, found = send(service.port, Batch(bodies, workload.samples_per_request), SEND_TIMEOUT_S)
        acknowledged += done
        for kind, (count, first) in found.items():
            errors.setdefault(kind, [0, f"generation {g}: {first}"])[0] += count
    seconds = time.perf_counter() - started
    line = (
        f"{service.name}: {acknowledged:,} of {workload.samples:,} samples acknowledged in {seconds:.1f} s "
        f"({acknowledged / seconds:,.0f}/s)"
    )
    for kind, (count, first) in errors.items():
        line += f"; {count} x {kind}, first: {first[:200]}"
    if acknowledged < workload.samples:
        line += " INCOMPLETE"
    log(line)
    return line


class Timed(NamedTuple):
    status: str
    p50: float
    p90: float
    answer: bytes
    cpu_ms: float  # the server's CPU a timed request: its whole process tree, threads included


def time_interleaved(targets: dict[str, Service], path: str, runs: int) -> dict[str, Timed]:
    """One warm-up request to each target, then ``runs`` rounds of one timed request to each in turn
    (the order reversed every other round). Any status is timed; the last answer is kept. Each
    target's CPU over the timed rounds, divided by ``runs``, is its CPU a request: unlike the time
    to the answer, it leaves out the waits for an idle core to wake; it still moves with the box
    (caches, other guests), so its ratio to Prometheus's is the figure to compare across runs
    (docs/performance-log.rst)."""
    connections = {
        name: http.client.HTTPConnection("127.0.0.1", t.port, timeout=QUERY_TIMEOUT_S) for name, t in targets.items()
    }
    times: dict[str, list[float]] = {name: [] for name in targets}
    last: dict[str, tuple[str, bytes]] = {}
    cpu_s: dict[str, float] = {}
    try:
        for round_number in range(runs + 1):
            if round_number == 1:
                cpu_s = {name: tree_run_time_s(t.pid) for name, t in targets.items()}
            for name in list(targets) if round_number % 2 == 0 else list(reversed(targets)):
                started = time.perf_counter()
                try:
                    connections[name].request("GET", path, headers=QUERY_HEADERS)
                    response = connections[name].getresponse()
                    answer = response.read()
                    status = str(response.status)
                except (OSError, http.client.HTTPException) as error:
                    connections[name].close()
                    answer, status = str(error).encode(), type(error).__name__
                elapsed_ms = (time.perf_counter() - started) * 1000
                last[name] = status, answer
                if round_number:
                    times[name].append(elapsed_ms)
        cpu_s = {name: tree_run_time_s(t.pid) - cpu_s[name] for name, t in targets.items()}
    finally:
        for connection in connections.values():
            connection.close()
    return {
        name: Timed(
            last[name][0], percentile(found, 0.5), percentile(found, 0.9), last[name][1], cpu_s[name] * 1000 / runs
        )
        for name, found in times.items()
    }


# -- answers -----------------------------------------------------------------------------------------


def data_of(timed: Timed):
    if timed.status != "200":
        return None
    try:
        return json.loads(timed.answer)["data"]
    except (ValueError, KeyError):
        return None


def same_number(a: str, b: str) -> bool:
    x, y = float(a), float(b)
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return x == y or abs(x - y) <= REL_TOLERANCE * max(abs(x), abs(y))


def error_text(answer: bytes) -> str:
    """The error of a Prometheus-style error answer, shortened, else the answer's start."""
    try:
        text = json.loads(answer)["error"]
    except (ValueError, KeyError, TypeError):
        text = answer.decode(errors="replace")
    return text.partition(" (")[0][:100]


def samples_of(data) -> dict:
    """{labels: [(t, v), ...]} of a vector or matrix answer."""
    found = {}
    for item in data["result"]:
        points = item["values"] if "values" in item else [item["value"]]
        found[frozenset(item["metric"].items())] = [(float(t), v) for t, v in points]
    return found


def same_samples(a, b) -> bool:
    left, right = samples_of(a), samples_of(b)
    if left.keys() != right.keys():
        return False
    for key, points in left.items():
        other = right[key]
        if len(points) != len(other):
            return False
        if any(t != u or not same_number(v, w) for (t, v), (u, w) in zip(points, other, strict=True)):
            return False
    return True


def as_set(kind: str, data) -> set:
    if kind == "series":
        return {frozenset(labels.items()) for labels in data}
    return set(data)


def summary(kind: str, data) -> str:
    """What the note shows of an answer: its size, or the count it holds."""
    if data is None:
        return "-"
    if kind in ("vector", "matrix"):
        result = data["result"]
        if kind == "vector" and len(result) == 1:
            return f"={result[0]['value'][1]}"
        points = sum(len(item.get("values", [])) for item in result)
        return f"{len(result)} series" + (f" {points} points" if kind == "matrix" else "")
    return f"{len(data)}"


def equal(kind: str, a, b) -> bool:
    if a is None or b is None:
        return False
    if kind in ("vector", "matrix"):
        return same_samples(a, b)
    return as_set(kind, a) == as_set(kind, b)


class Query(NamedTuple):
    name: str
    kind: str  # matrix, vector, values, series
    path: str
    exact: object = None  # the exact answer (a count, or a set) where the workload defines one


def dashboard_queries(workload: Workload) -> list[Query]:
    now_s = workload.now_ms // 1000
    hour_ago = now_s - 3600
    live = workload.live_pods(workload.now_ms - HOUR_MS, workload.now_ms)
    recent = workload.live_pods(workload.now_ms - 300_000, workload.now_ms)

    def path(endpoint: str, **params) -> str:
        return f"{endpoint}?{urllib.parse.urlencode(params)}"

    return [
        Query(
            "query_range sum(rate[5m]) 1h",
            "matrix",
            path(
                "/api/v1/query_range",
                query=f"sum(rate({SELECTOR}[5m]))",
                start=hour_ago,
                end=now_s,
                step=60,
            ),
        ),
        Query("query count() now", "vector", path("/api/v1/query", query=f"count({SELECTOR})", time=now_s), 500),
        Query("label pod values 1h", "values", path("/api/v1/label/pod/values", start=hour_ago, end=now_s), live),
        Query(
            "series job=api 5m",
            "series",
            path("/api/v1/series", **{"match[]": SELECTOR, "start": now_s - 300, "end": now_s}),
            {frozenset({"__name__": METRIC, "job": JOB, "pod": p}.items()) for p in recent},
        ),
        Query("labels 1h", "values", path("/api/v1/labels", start=hour_ago, end=now_s), {"__name__", "job", "pod"}),
    ]


def is_exact(query: Query, data) -> str:
    if query.exact is None:
        return "-"
    if data is None:
        return "n"
    if query.kind == "vector":
        result = data["result"]
        return "y" if len(result) == 1 and float(result[0]["value"][1]) == query.exact else "n"
    return "y" if as_set(query.kind, data) == query.exact else "n"


class Result(NamedTuple):
    generations: int
    query: str
    target: str
    prometheus: Timed
    tsgate: Timed
    equal: bool
    exact: str
    note: str


def compare(generations: int, query: Query, timings: dict[str, Timed]) -> list[Result]:
    prometheus = timings["prometheus"]
    reference = data_of(prometheus)
    results = []
    for name, timed in timings.items():
        if name == "prometheus":
            continue
        data = data_of(timed)
        note = f"sizes P {summary(query.kind, reference)} / T {summary(query.kind, data)}"
        if timed.status != "200":
            note += f"; tsgate: {error_text(timed.answer)}"
        exact = f"{is_exact(query, reference)}/{is_exact(query, data)}"
        results.append(
            Result(generations, query.name, name, prometheus, timed, equal(query.kind, reference, data), exact, note)
        )
    return results


# -- servers -----------------------------------------------------------------------------------------


def tsgate_args(args: argparse.Namespace, generations: int) -> list[str]:
    return [
        "--roles",
        "ingest,query",
        "--max-series-per-query",
        str(args.max_series_per_query),
        "--max-sample-age",
        f"{generations // 24 + 2}d",
    ]


def started_servers(stack: contextlib.ExitStack, args: argparse.Namespace, workdir: Path, generations: int):
    """Yield {name: (service, store URL or None)}: Prometheus, tsgate on SQLite, tsgate on Cassandra
    (with --cassandra), all stopped (keyspace dropped) with the stack."""
    servers = {}
    (workdir / "prometheus").mkdir(parents=True)
    prometheus = prometheus_service(args.prometheus or which("prometheus"), workdir / "prometheus")
    stack.callback(prometheus.stop)
    servers["prometheus"] = prometheus, None
    sqlite_url = f"sqlite:///{workdir / 'tsgate.db'}"
    sqlite = tsgate_service(
        "tsgate sqlite", ["--store", sqlite_url], workdir / "tsgate-sqlite.log", tsgate_args(args, generations)
    )
    stack.callback(sqlite.stop)
    servers["tsgate sqlite"] = sqlite, sqlite_url
    if args.cassandra:
        host, port = parse_hostport(args.cassandra)
        cluster = connect(host, port)
        stack.callback(cluster.shutdown)
        keyspace = f"tsgate_bench_churn_{os.getpid()}_{generations}"
        store_url = stack.enter_context(fresh_keyspace(cluster.connect(), host, port, keyspace))
        redis = RedisServer(workdir / "redis")
        redis.start()
        stack.callback(redis.stop)
        service = tsgate_service(
            "tsgate cassandra",
            ["--store", store_url, "--redis", redis.url],
            workdir / "tsgate-cassandra.log",
            tsgate_args(args, generations),
        )
        stack.callback(service.stop)
        servers["tsgate cassandra"] = service, store_url
    return servers


def run_generations(args: argparse.Namespace, generations: int, now_ms: int, workdir: Path, long_ranges: bool):
    """Load G generations into fresh servers, time the dashboard's queries; (results, long-range
    lines, servers that took fewer samples than sent)."""
    log(f"G={generations}: encoding {generations * PODS * MINUTES:,} samples ...")
    workload = Workload(generations, now_ms)
    with contextlib.ExitStack() as stack:
        servers = started_servers(stack, args, workdir, generations)
        problems = []
        for name, (service, store_url) in servers.items():
            service.start(120)
            line = load(service, workload)
            print(f"G={generations} load: {line}", flush=True)
            if line.endswith("INCOMPLETE"):
                problems.append(f"G={generations}: {line}")
            if store_url and args.seal:
                output, seconds, cpu = run_downsampler(store_url, SEND_TIMEOUT_S)
                print(f"G={generations} seal: {name}: {output} in {seconds:.1f} s (CPU {cpu:.1f} s)", flush=True)
        for name, (service, _) in servers.items():
            if name == "prometheus":
                settle(service.pid, 60)
            else:
                wait_until_idle(service.pid, 60)
        targets = {name: service for name, (service, _) in servers.items()}
        results = []
        for query in dashboard_queries(workload):
            log(f"G={generations}: {query.name} ...")
            results += compare(generations, query, time_interleaved(targets, query.path, args.runs))
        lines = long_range_lines(workload, targets, max(3, args.runs // 3)) if long_ranges else []
    return results, lines, problems


# -- long ranges ---------------------------------------------------------------------------------


def long_range_lines(workload: Workload, targets: dict[str, Service], runs: int) -> list[str]:
    now_s = workload.now_ms // 1000
    lines = [
        f"long ranges at G={workload.generations} (p50 of {runs} after a warm-up; "
        f"sizes: series in the answer, max count for count()):",
        f"  {'request':<34}{'range':>6}{'system':>18}{'status':>7}{'p50 ms':>10}{'size':>24}{'expected':>10}  equal",
    ]
    for hours in [h for h in (1, 24, 168) if h == 1 or h <= workload.generations]:
        start_s = now_s - hours * 3600
        step = max(60, hours * 3600 // 720 // 60 * 60)
        expected_series = len(workload.live_pods(start_s * 1000, workload.now_ms))
        requests = [
            (
                f"count() step {step}s",
                "matrix",
                "/api/v1/query_range?"
                + urllib.parse.urlencode({"query": f"count({SELECTOR})", "start": start_s, "end": now_s, "step": step}),
                None,
            ),
            (
                "series job=api",
                "series",
                "/api/v1/series?" + urllib.parse.urlencode({"match[]": SELECTOR, "start": start_s, "end": now_s}),
                expected_series,
            ),
        ]
        for label, kind, path, expected in requests:
            log(f"long range {hours} h: {label} ...")
            timings = time_interleaved(targets, path, runs)
            reference = data_of(timings["prometheus"])
            for name, timed in timings.items():
                data = data_of(timed)
                if kind == "matrix" and data is not None:
                    counts = [float(v) for item in data["result"] for _, v in item["values"]]
                    size = f"{len(data['result'])} series, max {max(counts, default=0):g}"
                else:
                    size = summary(kind, data)
                same = "-" if name == "prometheus" else ("yes" if equal(kind, reference, data) else "no")
                lines.append(
                    f"  {label:<34}{hours:>5}h{name:>18}{timed.status:>7}{timed.p50:>10.1f}{size:>24}"
                    f"{expected if expected is not None else '-':>10}  {same}"
                )
    return lines


# -- output --------------------------------------------------------------------------------------


def print_table(generations: int, results: list[Result]) -> None:
    print(f"\nG={generations}: {generations * PODS:,} series, {generations * PODS * MINUTES:,} samples")
    print(
        f"{'query':<30}{'tsgate':>17}{'P p50':>9}{'P p90':>9}{'T p50':>9}{'T p90':>9}{'T/P':>7}"
        f"{'P cpu':>8}{'T cpu':>8}{'T/P':>7}{'status P/T':>12}{'equal':>7}{'exact P/T':>11}  note"
    )
    for r in results:
        ratio = r.tsgate.p50 / r.prometheus.p50 if r.prometheus.p50 else math.nan
        cpu_ratio = r.tsgate.cpu_ms / r.prometheus.cpu_ms if r.prometheus.cpu_ms else math.nan
        print(
            f"{r.query:<30}{r.target.removeprefix('tsgate '):>17}{r.prometheus.p50:>9.1f}{r.prometheus.p90:>9.1f}"
            f"{r.tsgate.p50:>9.1f}{r.tsgate.p90:>9.1f}{ratio:>7.2f}"
            f"{r.prometheus.cpu_ms:>8.2f}{r.tsgate.cpu_ms:>8.2f}{cpu_ratio:>7.2f}"
            f"{r.prometheus.status + '/' + r.tsgate.status:>12}{'yes' if r.equal else 'no':>7}{r.exact:>11}  {r.note}"
        )


def print_headlines(results: list[Result]) -> None:
    """The issue's headlines at the largest G, and beside the growth from G=1 the growth from the
    smallest G >= 2, whose last hour holds the same 1,000 series (``like``), and Prometheus's own."""
    counts = sorted({r.generations for r in results})
    smallest, largest = counts[0], counts[-1]
    like_for_like = next((g for g in counts if 2 <= g < largest), None)
    by_count = {(r.generations, r.query, r.target): r for r in results}
    print(
        f"\nheadlines: tsgate p50 at G={largest} / at G={smallest} (target <= {TARGET_GROWTH}); "
        f"tsgate / Prometheus p50 at G={largest} (target <= {TARGET_RATIO:g}); "
        f"like: tsgate p50 at G={largest} / at G={like_for_like or '-'} (the same series in the last hour); "
        f"Prometheus's own growth from G={smallest}; CPU a request, tsgate / Prometheus, at G={largest}"
    )
    for r in results:
        if r.generations != largest:
            continue
        base = by_count.get((smallest, r.query, r.target))
        like = by_count.get((like_for_like, r.query, r.target)) if like_for_like else None
        growth = r.tsgate.p50 / base.tsgate.p50 if base else math.nan
        like_growth = r.tsgate.p50 / like.tsgate.p50 if like else math.nan
        prometheus_growth = r.prometheus.p50 / base.prometheus.p50 if base else math.nan
        ratio = r.tsgate.p50 / r.prometheus.p50
        cpu_ratio = r.tsgate.cpu_ms / r.prometheus.cpu_ms if r.prometheus.cpu_ms else math.nan
        answered = r.tsgate.status == "200" and base is not None and base.tsgate.status == "200"
        line = (
            f"headline: {r.query:<30} {r.target:<17} growth {growth:6.2f} {verdict(answered, growth, TARGET_GROWTH)}"
            f"  vs Prometheus {ratio:6.2f} {verdict(r.tsgate.status == '200', ratio, TARGET_RATIO)}"
            f"  like {like_growth:5.2f}  Prometheus growth {prometheus_growth:5.2f}  CPU vs Prometheus {cpu_ratio:5.2f}"
        )
        print(line.rstrip() + ("" if r.tsgate.status == "200" else f"  (tsgate answered {r.tsgate.status})"))


def verdict(answered: bool, figure: float, target: float) -> str:
    """met / MISSED; a time of an error answer (a 422, say) meets nothing."""
    if not answered:
        return f"{'no answer':<9}"
    return f"{'met' if figure <= target else 'MISSED':<9}"


def generation_counts(text: str) -> list[int]:
    values = sorted({int(part) for part in text.split(",") if part.strip()})
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: generation counts must be positive")
    return values


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.churn", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--generations", type=generation_counts, help="generation counts, comma-separated (default 1,2,24,168)"
    )
    parser.add_argument("--runs", type=int, help="timed requests per query and server, after one warm-up (default 10)")
    parser.add_argument("--quick", action="store_true", help="generations 1,4 and 3 runs: a smoke run")
    parser.add_argument(
        "--cassandra", metavar="HOST:PORT", help="also run tsgate on a fresh keyspace of this Cassandra"
    )
    parser.add_argument("--long-ranges", action="store_true", help="after the largest G, time 1h/1d/7d ranges too")
    parser.add_argument("--seal", action="store_true", help="run tsgate downsample --once after the writes")
    parser.add_argument(
        "--minute",
        type=int,
        choices=range(60),
        metavar="M",
        help="take as now the last minute M of an hour, at or before the start (default: the start's minute)",
    )
    parser.add_argument(
        "--max-series-per-query", type=int, default=10000, help="tsgate's --max-series-per-query (default 10000)"
    )
    parser.add_argument(
        "--prometheus",
        metavar="BINARY",
        help="the Prometheus to compare with (default: prometheus on PATH, 2.42 here; tsgate answers as 3.x"
        " where the two differ: python -m tests.prometheus3 builds 3.14)",
    )
    args = parser.parse_args(argv)
    args.generations = args.generations or ([1, 4] if args.quick else [1, 2, 24, 168])
    args.runs = args.runs or (3 if args.quick else 10)
    return args


def now_at_minute(now_ms: int, minute: int | None) -> int:
    """``now_ms`` (a whole minute), or the last time at or before it at ``minute`` past an hour:
    the time index registers series by the hour, so the cost of a last-hour query depends on the
    minute it is asked at (docs/storage.rst, "Grain"), and runs at different hours compare only
    at the same minute."""
    if minute is None:
        return now_ms
    return now_ms - (now_ms // STEP_MS - minute) % MINUTES * STEP_MS


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print("command: python -m bench.churn " + shlex.join(sys.argv[1:] if argv is None else argv), flush=True)
    now_ms = now_at_minute(int(time.time()) // 60 * 60 * 1000, args.minute)
    print(
        f"now = {now_ms // 1000} ({time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(now_ms // 1000))}); "
        f"generations {','.join(map(str, args.generations))}; {args.runs} runs; "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    results: list[Result] = []
    failures = []
    workdir = Path(tempfile.mkdtemp(prefix="tsgate-bench-churn-"))
    try:
        for generations in args.generations:
            long_ranges = args.long_ranges and generations == args.generations[-1]
            try:
                found, lines, problems = run_generations(
                    args, generations, now_ms, workdir / f"g{generations}", long_ranges
                )
                failures += problems
            except BenchError as error:
                failures.append(f"G={generations}: {error}")
                print(f"FAILED: G={generations}: {error}", flush=True)
                continue
            results += found
            print_table(generations, found)
            for line in lines:
                print(line)
            sys.stdout.flush()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if results:
        print_headlines(results)
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
