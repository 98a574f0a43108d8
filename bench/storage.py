"""Storage efficiency of sealed sample blocks, and the reads and sealing that go with them.

One run, every figure beside its reference measured on the same box in the same run
(bench/README.rst, part ``storage``). Sizes are FULL, ``--quick`` in brackets:

1. Disk bytes per sample. Workload: 1000 [200] series x 6 h [3 h] at a 10 s scrape interval, as
   Prometheus remote write 1.0 (snappy + protobuf) in time order, 500 [100] series a request over
   2 connections (shards). A third are cumulative counters (``*_total``, increasing integers with
   occasional resets), a third gauges with 2 decimals, a third 0/1 flags; timestamps on the 10 s
   grid plus 0-30 ms of scrape jitter, whole 1 h slots ending at least 1 h before now.

   * tsgate on Cassandra (a fresh keyspace, ``tsgate schema apply``; ``tsgate serve --workers 1
     --roles ingest,query``), then ``tsgate downsample --once --downsample-delay 0s`` (seals every
     slot into ``data_blocks`` and writes the roll-ups), ``nodetool flush`` of the keyspace, wait
     for compactions, then the bytes of each table's SSTable directory (every component) over the
     samples written: ``data_blocks`` (sealed; the headline, target <= 2.0), ``data_head`` (head
     rows, left to their TTL), ``data_5m`` and ``data_1h``.
   * tsgate on SQLite (``--store sqlite:///...``): written, gateway stopped, the same downsample,
     then (database + WAL file) / samples and (page_count - freelist_count) x page_size / samples
     (target <= 3.0).
   * Reference: Debian's ``victoria-metrics`` on the same requests at /api/v1/write, then
     ``/internal/force_flush``, then from its /metrics sum(vm_data_size_bytes) / sum(vm_rows).

2. ``/render`` of ``rb.*.cpu``: 100 [20] series x 24 h at 10 s, written through ``POST /api/write``
   into tsgate (both stores; a carbon storage-schemas.conf gives the paths ``10s:2d``), sealed with
   ``tsgate downsample --once``, then p50/p99 over 10 [5] requests of ``/render?target=rb.*.cpu&
   from=..&until=..&format=json`` after a warm-up. Reference: graphite-web 1.1.8 (Debian's, under
   /usr/bin/python3) over whisper files (``10s:2d``) holding the same points, rendering the same
   request in-process through django.test.Client (as tests/graphiteweb.py does). Ratio tsgate p50
   / graphite-web p50 (target <= 0.25).

3. Prometheus remote read (SAMPLES) of workload 1 on Cassandra, one query matching every series
   over the whole span, p50 over 5 [3] requests after a warm-up; reference: Debian's Prometheus 2.42
   (``--web.enable-remote-write-receiver``) sent the same requests, answering the same read at its
   /api/v1/read (target: tsgate <= 1 s).

4. tsgate's ingest rate of workload 1 on Cassandra (samples/s, and in series-slots/s: samples/s over
   the 360 samples of a 1 h slot at 10 s), beside the series-slots/s of ``tsgate downsample --once``
   sealing it: a ratio >= 1 means one downsampler keeps up with one gateway.

Every answer is checked (untimed): render answers hold every written point in their window with its
value (graphite-web's too), remote-read answers every series with every sample and value, and the
downsampler must report every series-slot sealed. Servers listen on 127.0.0.1 only, one at a time.
"""

import argparse
import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.parse
from pathlib import Path
from typing import NamedTuple

import numpy as np

from bench.common import (
    REPO,
    BenchError,
    PartialResults,
    Service,
    cassandra,
    connect,
    exit_with,
    fresh_keyspace,
    listening_pid,
    process_cpu_s,
    tree_cpu_s,
    tsgate_service,
    which,
)
from bench.downsample import run_downsampler
from bench.find import percentile
from bench.queries import (
    Timed,
    remote_read_headers,
    remote_read_series,
    render_check,
    time_requests,
    write_json,
)
from bench.remote_write import TENANT as RW_TENANT
from bench.remote_write import prometheus_service, send, victoria_metrics_service
from bench.report import Figure, format_table
from gateway.app.config import parse_hostport
from gateway.app.devservices.cassandra import JVM17_FLAGS
from gateway.core.model import now_ms
from protocols import prometheus
from protocols.prometheus import WriteSeries, encode_write_request_v1

SECTION = "storage"
INTERVAL_MS = 10_000
SLOT_MS = 3_600_000  # the gateway's default --slot-width
SAMPLES_PER_SLOT = SLOT_MS // INTERVAL_MS  # 360
JITTER_MS = 30
JOB = "storagebench"
RENDER_TENANT = "storage-render"
RENDER_TARGET = "rb.*.cpu"
# carbon's storage-schemas.conf for the rb.* paths: 10 s kept 2 days, so that 24 h ending an hour
# or two ago fits (graphite-web's whisper files get the same archive).
RENDER_RETENTION_S = 2 * 86400
SCHEMAS = "[rb]\npattern = ^rb\\.\nretentions = 10s:2d\n"
# Metric names of each kind, as exporters name them; series i is of kind i % 3.
NAMES = (
    ("node_network_receive_packets_total", "http_requests_total", "node_disk_reads_completed_total"),
    ("node_hwmon_temp_celsius", "node_memory_available_gigabytes", "process_resident_memory_megabytes"),
    ("up", "node_systemd_unit_active", "probe_success"),
)
TIMEOUT_S = 900  # any one send, downsample, graphite-web run or wait
NODETOOL_TIMEOUT_S = 300
GRAPHITE_PYTHON = "/usr/bin/python3"
TARGETS = {"blocks": 2.0, "sqlite": 3.0, "render": 0.25, "read_ms": 1000}


class Sizes(NamedTuple):
    series: int  # workload 1 (disk, remote read, ingest and sealing)
    hours: int
    series_per_request: int  # one request per shard and scrape round; shards = series / this
    render_series: int
    render_hours: int
    render_requests: int
    read_requests: int


FULL = Sizes(1000, 6, 500, 100, 24, 10, 5)
QUICK = Sizes(200, 3, 100, 20, 24, 5, 3)


def log(message: str) -> None:
    print(f"storage: {message}", file=sys.stderr, flush=True)


def slot_end_before(ms: int) -> int:
    """The end of the last whole 1 h slot that ended at least an hour before ``ms``."""
    return (ms - SLOT_MS) // SLOT_MS * SLOT_MS


class ExporterWorkload:
    """Workload 1: series x hours at 10 s, a third counters, gauges and flags, with scrape jitter.

    ``bodies[k][r]`` is shard k's remote-write request of scrape round r (bench.remote_write.send's
    shape), all encoded up front; ``expected`` is what a read of every series must return.
    """

    def __init__(self, series: int, hours: int, series_per_request: int, end_ms: int, seed: int = 20):
        if series % series_per_request:
            raise ValueError(f"{series} series do not split into requests of {series_per_request}")
        self.series, self.hours, self.series_per_request = series, hours, series_per_request
        rounds = hours * SAMPLES_PER_SLOT
        self.start_ms = end_ms - hours * SLOT_MS
        self.end_ms = end_ms
        grid = self.start_ms + INTERVAL_MS * np.arange(rounds, dtype=np.int64)
        rng = np.random.default_rng(seed)
        self.labels = [
            {"__name__": NAMES[i % 3][(i // 3) % 3], "job": JOB, "instance": f"host{i // 30:03d}:9100", "idx": str(i)}
            for i in range(series)
        ]
        stamps = grid + rng.integers(0, JITTER_MS + 1, size=(series, rounds))
        values = np.empty((series, rounds))
        for i in range(series):
            values[i] = (self._counter, self._gauge, self._flag)[i % 3](rng, rounds)
        self.timestamps = stamps.tolist()
        self.values = values.tolist()
        self.samples = series * rounds
        self.series_slots = series * hours
        self.requests = rounds * (series // series_per_request)
        self.bodies = [
            [
                encode_write_request_v1(
                    WriteSeries(self.labels[i], [(self.timestamps[i][r], self.values[i][r])])
                    for i in range(k * series_per_request, (k + 1) * series_per_request)
                )
                for r in range(rounds)
            ]
            for k in range(series // series_per_request)
        ]
        self.body_bytes = sum(len(body) for shard in self.bodies for body in shard)

    @staticmethod
    def _counter(rng, rounds: int) -> np.ndarray:
        """An integer counter: Poisson increments at a rate of 0.05-500 a scrape, from a random
        start, reset to 0 about once in 2000 scrapes (a restarted process)."""
        rate = math.exp(rng.uniform(math.log(0.05), math.log(500)))
        values = float(rng.integers(0, 10**7)) + np.cumsum(rng.poisson(rate, rounds)).astype(np.float64)
        for reset in np.flatnonzero(rng.random(rounds) < 1 / 2000):
            values[reset:] -= values[reset]
        return values

    @staticmethod
    def _gauge(rng, rounds: int) -> np.ndarray:
        """A random walk around a level of 1-1000 (1 % steps), kept positive, with 2 decimals."""
        level = 10 ** rng.uniform(0, 3)
        walk = level + np.cumsum(rng.normal(0, level * 0.01, rounds))
        return np.round(np.abs(walk), 2)

    @staticmethod
    def _flag(rng, rounds: int) -> np.ndarray:
        """0 or 1, mostly 1, flipping about once in 1000 scrapes."""
        start = float(rng.random() < 0.9)
        return (start + np.cumsum(rng.random(rounds) < 1 / 1000)) % 2

    def expected(self) -> dict[str, list]:
        return {str(i): list(zip(self.timestamps[i], self.values[i])) for i in range(self.series)}

    def read_query(self) -> prometheus.ReadQuery:
        """One query matching every series over the whole span (jitter included)."""
        return prometheus.ReadQuery(self.start_ms, self.end_ms - 1, [prometheus.Matcher("EQ", "job", JOB)])


class RenderWorkload:
    """Workload 2: rb.hNNN.cpu paths x hours at 10 s, CPU-like percentages with 2 decimals."""

    def __init__(self, series: int, hours: int, end_ms: int, seed: int = 21):
        rounds = hours * SAMPLES_PER_SLOT
        self.names = [f"rb.h{i:03d}.cpu" for i in range(series)]
        self.stamps = [end_ms - (rounds - j) * INTERVAL_MS for j in range(rounds)]
        rng = np.random.default_rng(seed)
        walks = rng.uniform(5, 95, (series, 1)) + np.cumsum(rng.normal(0, 2, (series, rounds)), axis=1)
        self.values = np.round(np.clip(walks, 0, 100), 2).tolist()
        self.samples = series * rounds
        self.series_slots = series * hours
        # graphite-web: whisper drops a point at exactly `from` (its first interval starts a step
        # after it), so from is one second before the first point; until is the last one.
        self.params = {
            "target": RENDER_TARGET,
            "from": str(self.stamps[0] // 1000 - 1),
            "until": str(self.stamps[-1] // 1000),
            "format": "json",
        }
        self.check = render_check(self.names, self.stamps, self.value, None)

    def value(self, i: int, j: int) -> float:
        return self.values[i][j]

    def items(self) -> list[dict]:
        return [
            {"metricName": name, "ts": ts, "value": self.values[i][j]}
            for i, name in enumerate(self.names)
            for j, ts in enumerate(self.stamps)
        ]


def checked_once(check):
    """check(answer), run once per distinct answer: the same bytes again need no second decoding."""
    seen: set[bytes] = set()

    def wrapped(answer: bytes) -> None:
        digest = hashlib.blake2b(answer, digest_size=16).digest()
        if digest not in seen:
            check(answer)
            seen.add(digest)

    return wrapped


def remote_read_check(workload: ExporterWorkload):
    expected = workload.expected()

    def check(answer: bytes) -> None:
        found = {labels.get("idx"): samples for labels, samples in remote_read_series(answer, prometheus.SAMPLES)}
        if found != expected:
            wrong = sum(1 for key, samples in expected.items() if found.get(key) != samples)
            raise BenchError(
                f"remote read: {len(found)} series, {wrong} of the {workload.series} written missing or different"
            )

    return checked_once(check)


def time_remote_read(port: int, workload: ExporterWorkload, requests: int, check) -> Timed:
    body = prometheus.encode_read_request([workload.read_query()], [prometheus.SAMPLES])
    return time_requests(port, "POST", "/api/v1/read", body, remote_read_headers(RW_TENANT), requests, check)


def send_all(service: Service, workload: ExporterWorkload) -> float:
    """Every request, each answered 2xx, in seconds; anything else fails the measurement."""
    started = time.perf_counter()
    acknowledged, errors = send(service.port, workload, TIMEOUT_S)
    seconds = time.perf_counter() - started
    if errors or acknowledged != workload.samples:
        raise BenchError(f"{service.name}: {acknowledged} of {workload.samples} samples acknowledged; errors: {errors}")
    return seconds


def downsample_once(store_url: str, expected: int) -> tuple[int, float, float]:
    """The real ``tsgate downsample --once`` (delay 0 s: every slot has ended); returns (series-slots
    sealed, wall seconds, its CPU seconds). Fewer series-slots than written fails the measurement."""
    output, seconds, cpu = run_downsampler(store_url, TIMEOUT_S)
    match = re.search(r"rolled up (\d+) series-slots", output)
    if not match or int(match.group(1)) != expected:
        raise BenchError(f"tsgate downsample printed {output!r}; expected {expected} series-slots")
    log(
        f"downsample --once {store_url.partition(':')[0]}: {expected} series-slots in {seconds:.1f} s (CPU {cpu:.1f} s)"
    )
    return expected, seconds, cpu


# -- Cassandra's files ------------------------------------------------------------------------------


class CassandraNode(NamedTuple):
    pid: int
    java: str
    classpath: str
    jmx_port: int
    data_dirs: list[Path]


def cassandra_node(port: int) -> CassandraNode:
    """Where the Cassandra on this port keeps its data and its JMX port, from its command line
    (-Dcassandra.config, -Dcassandra.storagedir, -Dcassandra.jmx.local.port, -cp)."""
    pid = listening_pid(port)
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        args = cmdline.read().decode().split("\0")
    properties = dict(arg[2:].partition("=")[::2] for arg in args if arg.startswith("-D"))
    classpath = next((args[i + 1] for i, arg in enumerate(args[:-1]) if arg in ("-cp", "-classpath")), None)
    if "org.apache.cassandra.service.CassandraDaemon" not in args or not classpath:
        raise BenchError(f"process {pid} on port {port} is not a CassandraDaemon with a -cp: cannot run nodetool")
    data_dirs = []
    config = properties.get("cassandra.config", "")
    if config.startswith("file:"):
        path = Path(urllib.parse.unquote(urllib.parse.urlsplit(config).path))
        for line in path.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "data_file_directories":
                with contextlib.suppress(ValueError):
                    data_dirs = [Path(d) for d in json.loads(value)]
    if not data_dirs and "cassandra.storagedir" in properties:
        data_dirs = [Path(properties["cassandra.storagedir"]) / "data"]
    if not data_dirs:
        raise BenchError(f"Cassandra {pid}: no data_file_directories found")
    jmx = properties.get("cassandra.jmx.local.port") or properties.get("com.sun.management.jmxremote.port") or "7199"
    return CassandraNode(pid, os.readlink(f"/proc/{pid}/exe"), classpath, int(jmx), data_dirs)


def nodetool(node: CassandraNode, workdir: Path, *args: str) -> str:
    """Cassandra's own nodetool (org.apache.cassandra.tools.NodeTool on the server's classpath) over
    its local JMX port; its history file goes to workdir, not ~/.cassandra."""
    logback = workdir / "nodetool-logback.xml"
    logback.write_text('<configuration><root level="WARN"/></configuration>\n')
    command = [
        node.java,
        *JVM17_FLAGS,
        "--add-exports=java.base/sun.nio.ch=ALL-UNNAMED",
        f"-Duser.home={workdir}",
        f"-Dlogback.configurationFile={logback}",
        "-Xmx256m",
        "-cp",
        node.classpath,
        "org.apache.cassandra.tools.NodeTool",
        "-h",
        "127.0.0.1",
        "-p",
        str(node.jmx_port),
        *args,
    ]
    finished = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=NODETOOL_TIMEOUT_S)
    if finished.returncode:
        raise BenchError(
            f"nodetool {' '.join(args)} exited with {finished.returncode}: {(finished.stdout + finished.stderr)[-2000:]}"
        )
    return finished.stdout


def flush_and_settle(node: CassandraNode, workdir: Path, keyspace: str) -> float:
    """nodetool flush, then wait until no compaction is pending or running; returns seconds waited."""
    started = time.monotonic()
    nodetool(node, workdir, "flush", keyspace)
    while time.monotonic() < started + TIMEOUT_S:
        stats = nodetool(node, workdir, "compactionstats")
        pending = re.search(r"pending tasks\s*:?\s*(\d+)", stats)
        if pending and int(pending.group(1)) == 0 and keyspace not in stats:
            return time.monotonic() - started
        time.sleep(2)
    raise BenchError(f"compactions of {keyspace} still running after {TIMEOUT_S} s")


def table_sizes(node: CassandraNode, keyspace: str) -> dict[str, tuple[int, int]]:
    """{table: (bytes, files)} of every SSTable component under data/<keyspace>/<table>-<id>/
    (snapshots and backups left out)."""
    sizes: dict[str, tuple[int, int]] = {}
    for data_dir in node.data_dirs:
        for table_dir in (data_dir / keyspace).glob("*-*"):
            table = table_dir.name.rpartition("-")[0]
            total, files = sizes.get(table, (0, 0))
            for path in table_dir.rglob("*"):
                if path.is_file() and not {"snapshots", "backups"} & set(path.relative_to(table_dir).parts):
                    total, files = total + path.stat().st_size, files + 1
            sizes[table] = (total, files)
    return sizes


# -- the measurements -------------------------------------------------------------------------------


def measure_victoria_metrics(workdir: Path, workload: ExporterWorkload) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    service = victoria_metrics_service(which("victoria-metrics"), workdir)
    try:
        service.start(60)
        seconds = send_all(service, workload)
        status, answer = service.get("/internal/force_flush")
        if status != 200:
            raise BenchError(f"victoria-metrics /internal/force_flush answered {status}")
        time.sleep(1)
        status, answer = service.get("/metrics")
        if status != 200:
            raise BenchError(f"victoria-metrics /metrics answered {status}")
    finally:
        service.stop()
    data, rows = {}, {}
    for line in answer.decode().splitlines():
        match = re.fullmatch(r'(vm_data_size_bytes|vm_rows)\{type="([^"]+)"\} (\S+)', line)
        if match:
            (data if match.group(1) == "vm_data_size_bytes" else rows)[match.group(2)] = float(match.group(3))
    if not data or not rows:
        raise BenchError("victoria-metrics /metrics has no vm_data_size_bytes or vm_rows")
    storage_bytes = sum(v for k, v in data.items() if k.startswith("storage/"))
    storage_rows = sum(v for k, v in rows.items() if k.startswith("storage/"))
    result = {
        "bytes": sum(data.values()),
        "rows": sum(rows.values()),
        "storage_bytes": storage_bytes,
        "storage_rows": storage_rows,
        "seconds": seconds,
    }
    log(f"victoria-metrics: {result}")
    return result


def measure_prometheus(workdir: Path, workload: ExporterWorkload, requests: int) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    service = prometheus_service(which("prometheus"), workdir)
    try:
        service.start(60)
        seconds = send_all(service, workload)
        log(f"prometheus: wrote {workload.samples} samples in {seconds:.1f} s")
        read = time_remote_read(service.port, workload, requests, remote_read_check(workload))
    finally:
        service.stop()
    log(f"prometheus: remote read p50 {read.p50:.0f} ms, p99 {read.p99:.0f} ms")
    return {"seconds": seconds, "read": read}


def measure_tsgate_cassandra(host: str, port: int, workdir: Path, workload: ExporterWorkload, requests: int) -> dict:
    node = cassandra_node(port) if host in ("127.0.0.1", "localhost") else None
    if node is None:
        raise BenchError(f"Cassandra at {host}:{port} is not on this box: its files cannot be measured")
    cluster = connect(host, port)
    try:
        keyspace = f"tsgate_bench_storage_{os.getpid()}"
        with fresh_keyspace(cluster.connect(), host, port, keyspace) as store_url:
            gateway = tsgate_service(
                "tsgate (cassandra)",
                ["--store", store_url],
                workdir / "tsgate-cassandra.log",
                ["--workers", "1", "--roles", "ingest,query"],
            )
            try:
                gateway.start(60)
                cpu_before = tree_cpu_s(gateway.pid)
                cassandra_before = process_cpu_s(node.pid)
                seconds = send_all(gateway, workload)
                ingest_cpu = tree_cpu_s(gateway.pid) - cpu_before
                cassandra_cpu = process_cpu_s(node.pid) - cassandra_before
                log(
                    f"tsgate cassandra: wrote {workload.samples} samples in {seconds:.1f} s ({workload.samples / seconds:.0f}/s)"
                )
                cassandra_before = process_cpu_s(node.pid)
                sealed = downsample_once(store_url, workload.series_slots)
                seal_cassandra_cpu = process_cpu_s(node.pid) - cassandra_before
                waited = flush_and_settle(node, workdir, keyspace)
                sizes = table_sizes(node, keyspace)
                log(f"tsgate cassandra: flushed and settled in {waited:.1f} s; SSTable bytes: {sizes}")
                read = time_remote_read(gateway.port, workload, requests, remote_read_check(workload))
                log(f"tsgate cassandra: remote read p50 {read.p50:.0f} ms, p99 {read.p99:.0f} ms")
            finally:
                gateway.stop()
    finally:
        cluster.shutdown()
    return {
        "seconds": seconds,
        "cpu": ingest_cpu,
        "cassandra_cpu": cassandra_cpu,
        "sealed": sealed,
        "seal_cassandra_cpu": seal_cassandra_cpu,
        "sizes": sizes,
        "read": read,
    }


def sqlite_sizes(path: Path) -> dict:
    """File bytes (database + WAL), used pages, and bytes per table when SQLite has dbstat."""
    files = sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        pages, free, page_size = (
            connection.execute(f"PRAGMA {name}").fetchone()[0] for name in ("page_count", "freelist_count", "page_size")
        )
        tables = {}
        with contextlib.suppress(sqlite3.Error):
            for name, table_bytes in connection.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"):
                table = re.sub(r"^sqlite_autoindex_(.*)_\d+$", r"\1", name)
                tables[table] = tables.get(table, 0) + table_bytes
    finally:
        connection.close()
    return {"files": files, "used": (pages - free) * page_size, "tables": tables}


def measure_tsgate_sqlite(workdir: Path, workload: ExporterWorkload) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "t.db"
    store_url = f"sqlite:///{path}"
    gateway = tsgate_service(
        "tsgate (sqlite)",
        ["--store", store_url],
        workdir / "tsgate-sqlite.log",
        ["--workers", "1", "--roles", "ingest,query"],
    )
    try:
        gateway.start(60)
        cpu_before = tree_cpu_s(gateway.pid)
        seconds = send_all(gateway, workload)
        cpu = tree_cpu_s(gateway.pid) - cpu_before
    finally:
        gateway.stop()
    log(f"tsgate sqlite: wrote {workload.samples} samples in {seconds:.1f} s ({workload.samples / seconds:.0f}/s)")
    before = sqlite_sizes(path)
    sealed = downsample_once(store_url, workload.series_slots)
    sizes = sqlite_sizes(path)
    log(f"tsgate sqlite: before sealing {before}; after {sizes}")
    return {"seconds": seconds, "cpu": cpu, "sealed": sealed, "sizes": sizes, "before": before}


def measure_tsgate_render(
    store: str, workdir: Path, render: RenderWorkload, requests: int, store_args, store_url: str
) -> Timed:
    schemas = workdir / "storage-schemas.conf"
    schemas.write_text(SCHEMAS)
    gateway = tsgate_service(
        f"tsgate ({store})",
        store_args,
        workdir / f"tsgate-render-{store}.log",
        ["--workers", "1", "--roles", "ingest,query", "--graphite-storage-schemas", str(schemas)],
    )
    try:
        gateway.start(60)
        write_json(gateway.port, f"render points ({store})", render.items(), RENDER_TENANT)
        downsample_once(store_url, render.series_slots)
        path = "/render?" + urllib.parse.urlencode(render.params)
        timed = time_requests(
            gateway.port, "GET", path, None, {"X-Tenant": RENDER_TENANT}, requests, checked_once(render.check)
        )
    finally:
        gateway.stop()
    log(f"tsgate {store}: render p50 {timed.p50:.0f} ms, p99 {timed.p99:.0f} ms, {timed.answer_bytes / 2**20:.1f} MiB")
    return timed


def render_cassandra(host: str, port: int, workdir: Path, render: RenderWorkload, requests: int) -> Timed:
    cluster = connect(host, port)
    try:
        with fresh_keyspace(cluster.connect(), host, port, f"tsgate_bench_render_{os.getpid()}") as store_url:
            return measure_tsgate_render("cassandra", workdir, render, requests, ["--store", store_url], store_url)
    finally:
        cluster.shutdown()


def render_sqlite(workdir: Path, render: RenderWorkload, requests: int) -> Timed:
    workdir.mkdir(parents=True, exist_ok=True)
    store_url = f"sqlite:///{workdir / 'render.db'}"
    return measure_tsgate_render("sqlite", workdir, render, requests, ["--store", store_url], store_url)


# graphite-web in its own Python (Debian's, with Debian's Django), as tests/graphiteweb.py runs it:
# a settings module with everything under the job's root, whisper files of one archive, and the
# render view called in-process through django.test.Client, timed around each call.
GRAPHITE_WEB_SCRIPT = textwrap.dedent(
    r'''
    import json, os, sys, time

    job = json.load(open(sys.argv[1]))
    root = job["root"]
    whisper_dir = os.path.join(root, "whisper")
    os.makedirs(whisper_dir, exist_ok=True)
    os.makedirs(os.path.join(root, "log"), exist_ok=True)
    with open(os.path.join(root, "storagebench_graphite_settings.py"), "w") as settings:
        settings.write(f"""
    SECRET_KEY = "tsgate-storage-bench"
    STORAGE_DIR = {root!r}
    WHISPER_DIR = {whisper_dir!r}
    STANDARD_DIRS = [{whisper_dir!r}]
    LOG_DIR = {os.path.join(root, "log")!r}
    INDEX_FILE = {os.path.join(root, "index")!r}
    DATABASES = {{"default": {{"NAME": {os.path.join(root, "graphite.db")!r}, "ENGINE": "django.db.backends.sqlite3",
                               "USER": "", "PASSWORD": "", "HOST": "", "PORT": ""}}}}
    TAGDB = "graphite.tags.localdatabase.LocalDatabaseTagDB"
    CARBONLINK_HOSTS = []
    DEFAULT_XFILES_FACTOR = 0
    TIME_ZONE = "UTC"
    USE_WORKER_POOL = False
    LOG_ROTATION = False
    LOG_RENDERING_PERFORMANCE = False
    LOG_CACHE_PERFORMANCE = False
    LOG_INFO_PERFORMANCE = False
    ALLOWED_HOSTS = ["*"]
    """)
    sys.path.insert(0, root)
    os.environ["GRAPHITE_SETTINGS_MODULE"] = "storagebench_graphite_settings"
    os.environ["DJANGO_SETTINGS_MODULE"] = "graphite.settings"

    import django
    django.setup()
    from django.core.management import call_command
    call_command("migrate", verbosity=0, interactive=False)

    import whisper
    step = job["step"]
    for name, points in job["series"].items():
        path = os.path.join(whisper_dir, *name.split(".")) + ".wsp"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        whisper.create(path, [(step, job["retention"] // step)], xFilesFactor=0.0, aggregationMethod="average")
        whisper.update_many(path, points)

    from django.test import Client
    client = Client()
    seconds, body = [], ""
    for index in range(job["warmup"] + job["requests"]):
        started = time.perf_counter()
        response = client.get("/render", dict(job["params"], noCache="1"))
        content = response.content
        elapsed = time.perf_counter() - started
        if response.status_code != 200:
            sys.exit(f"render answered {response.status_code}: {content[:500]!r}")
        if index >= job["warmup"]:
            seconds.append(elapsed)
        body = content.decode()
    json.dump({"seconds": seconds, "body": body}, open(sys.argv[2], "w"))
    '''
)


def measure_graphite_web(workdir: Path, render: RenderWorkload, requests: int) -> Timed:
    """graphite-web 1.1.8 over whisper files of the same points: p50/p99 of the in-process render."""
    if not Path(GRAPHITE_PYTHON).exists():
        raise BenchError(f"{GRAPHITE_PYTHON} is missing (graphite-web runs under Debian's Python)")
    probe = subprocess.run(
        [GRAPHITE_PYTHON, "-I", "-c", "import graphite, whisper, django"], capture_output=True, timeout=60
    )
    if probe.returncode:
        raise BenchError(
            "graphite-web or python3-whisper is not installed (apt-get install graphite-web python3-whisper)"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    script, job, output = workdir / "graphiteweb_render.py", workdir / "job.json", workdir / "answers.json"
    script.write_text(GRAPHITE_WEB_SCRIPT)
    series = {
        name: [[ts // 1000, render.values[i][j]] for j, ts in enumerate(render.stamps)]
        for i, name in enumerate(render.names)
    }
    job.write_text(
        json.dumps(
            {
                "root": str(workdir / "graphite"),
                "step": INTERVAL_MS // 1000,
                "retention": RENDER_RETENTION_S,
                "series": series,
                "params": render.params,
                "warmup": 1,
                "requests": requests,
            }
        )
    )
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTHON", "DJANGO", "GRAPHITE", "VIRTUAL_ENV"))
    }
    finished = subprocess.run(
        [GRAPHITE_PYTHON, "-I", str(script), str(job), str(output)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    if finished.returncode or not output.exists():
        raise BenchError(f"graphite-web exited with {finished.returncode}: {finished.stderr[-3000:]}")
    result = json.loads(output.read_text())
    body = result["body"].encode()
    render.check(body)
    milliseconds = [s * 1000 for s in result["seconds"]]
    timed = Timed(percentile(milliseconds, 0.5), percentile(milliseconds, 0.99), len(body))
    log(f"graphite-web: render p50 {timed.p50:.0f} ms, p99 {timed.p99:.0f} ms, {timed.answer_bytes / 2**20:.1f} MiB")
    return timed


# -- figures ----------------------------------------------------------------------------------------


def figures_of(results: dict, sizes: Sizes, workload_label: str, render_label: str) -> list[Figure]:
    found: list[Figure] = []

    def add(name, value, unit, reference="", reference_value=None, note=""):
        ratio = value / reference_value if reference_value and not math.isnan(value) else None
        found.append(Figure(SECTION, name, value, unit, reference if reference_value else "", ratio, note))

    # 1. disk bytes per sample
    samples = sizes.series * sizes.hours * SAMPLES_PER_SLOT
    vm_name = "victoria-metrics, disk bytes/sample"
    vm = results.get("victoria-metrics")
    vm_value = None
    if vm:
        vm_value = vm["bytes"] / vm["rows"]
        add(
            vm_name,
            vm_value,
            "B/sample",
            note=(
                f"{workload_label}; sum(vm_data_size_bytes) {vm['bytes']:.0f} / sum(vm_rows) {vm['rows']:.0f} after force_flush; "
                f"storage/* only {vm['storage_bytes'] / max(vm['storage_rows'], 1):.2f}, "
                f"all bytes / samples sent {vm['bytes'] / samples:.2f}"
            ),
        )
    cass = results.get("tsgate cassandra")
    if cass:
        tables = cass["sizes"]
        for table, label, target in (
            ("data_blocks", "sealed (data_blocks)", f"target <= {TARGETS['blocks']}"),
            ("data_head", "head rows (data_head)", "left to their TTL after sealing"),
            ("data_5m", "roll-ups (data_5m)", ""),
            ("data_1h", "roll-ups (data_1h)", ""),
        ):
            name = f"tsgate cassandra, {label} bytes/sample"
            if table not in tables:
                add(name, float("nan"), "B/sample", note="n/a: no such table on this code")
                continue
            size, files = tables[table]
            add(
                name,
                size / samples,
                "B/sample",
                vm_name,
                vm_value,
                "; ".join(
                    filter(
                        None,
                        [
                            target,
                            f"{size} bytes in {files} files / {samples} samples",
                            workload_label,
                        ],
                    )
                ),
            )
        total = sum(size for size, _ in tables.values())
        add(
            "tsgate cassandra, whole keyspace bytes/sample",
            total / samples,
            "B/sample",
            vm_name,
            vm_value,
            f"{total} bytes, every table (metadata and pending marks too)",
        )
    lite = results.get("tsgate sqlite")
    if lite:
        now, before = lite["sizes"], lite["before"]
        tables = ", ".join(f"{t} {b / samples:.2f}" for t, b in sorted(now["tables"].items()) if t.startswith("data_"))
        add(
            "tsgate sqlite, file (db + wal) bytes/sample",
            now["files"] / samples,
            "B/sample",
            vm_name,
            vm_value,
            f"target <= {TARGETS['sqlite']}; {now['files']} bytes after sealing ({before['files'] / samples:.1f}/sample before)",
        )
        add(
            "tsgate sqlite, used pages bytes/sample",
            now["used"] / samples,
            "B/sample",
            vm_name,
            vm_value,
            f"(page_count - freelist_count) x page_size = {now['used']}; per table (B/sample): {tables or 'no dbstat'}",
        )
    # 2. render
    graphite = results.get("graphite-web")
    graphite_name = f"graphite-web 1.1.8, render {render_label}"
    if graphite:
        for kind, value in (("p50", graphite.p50), ("p99", graphite.p99)):
            add(
                graphite_name,
                value,
                f"ms {kind}",
                note=(
                    f"in-process (django.test.Client), whisper 10s:2d; {sizes.render_requests} requests, "
                    f"{graphite.answer_bytes / 2**20:.1f} MiB JSON"
                ),
            )
    for store in ("cassandra", "sqlite"):
        timed = results.get(f"render {store}")
        if timed:
            add(
                f"tsgate {store}, render {render_label}",
                timed.p50,
                "ms p50",
                f"{graphite_name}",
                graphite.p50 if graphite else None,
                f"target ratio <= {TARGETS['render']}; sealed; {sizes.render_requests} requests over HTTP, {timed.answer_bytes / 2**20:.1f} MiB JSON",
            )
            add(
                f"tsgate {store}, render {render_label}",
                timed.p99,
                "ms p99",
                f"{graphite_name}",
                graphite.p99 if graphite else None,
            )
    # 3. remote read
    prom = results.get("prometheus")
    read_label = f"remote read {sizes.series} series x {sizes.hours}h, SAMPLES"
    prom_name = f"prometheus 2.42, {read_label}"
    if prom:
        for kind, value in (("p50", prom["read"].p50), ("p99", prom["read"].p99)):
            add(
                prom_name,
                value,
                f"ms {kind}",
                note=f"{sizes.read_requests} requests, answer {prom['read'].answer_bytes / 2**20:.1f} MiB",
            )
    if cass:
        read = cass["read"]
        add(
            f"tsgate cassandra, {read_label}",
            read.p50,
            "ms p50",
            prom_name,
            prom["read"].p50 if prom else None,
            f"target <= {TARGETS['read_ms']} ms; sealed blocks; answer {read.answer_bytes / 2**20:.1f} MiB",
        )
        add(f"tsgate cassandra, {read_label}", read.p99, "ms p99", prom_name, prom["read"].p99 if prom else None)
    # 4. ingest against sealing
    for store in ("cassandra", "sqlite"):
        run = results.get(f"tsgate {store}")
        if not run:
            continue
        rate = samples / run["seconds"]
        ingest_name = f"tsgate {store}, ingest as series-slots/s"
        extra = f"; Cassandra CPU s {run['cassandra_cpu']:.1f}" if "cassandra_cpu" in run else ""
        add(
            f"tsgate {store}, ingest {workload_label}",
            rate,
            "samples/s",
            note=(
                f"remote write, {sizes.series_per_request} series/request; {samples} samples in {run['seconds']:.1f} s; "
                f"gateway CPU s {run['cpu']:.1f} ({run['cpu'] / samples * 1e6:.0f} us/sample){extra}"
            ),
        )
        add(
            ingest_name,
            rate / SAMPLES_PER_SLOT,
            "series-slots/s",
            note=f"samples/s / {SAMPLES_PER_SLOT} (a 1 h slot at 10 s)",
        )
        done, seconds, cpu = run["sealed"]
        extra = f"; Cassandra CPU s {run['seal_cassandra_cpu']:.1f}" if "seal_cassandra_cpu" in run else ""
        add(
            f"tsgate {store}, downsample --once sealing",
            done / seconds,
            "series-slots/s",
            ingest_name,
            rate / SAMPLES_PER_SLOT,
            f">= 1: one downsampler keeps up; {done} series-slots in {seconds:.1f} s, downsampler CPU s {cpu:.1f}{extra}",
        )
    return found


def run(cassandra_at: str, workdir: Path, quick: bool, sizes: Sizes | None = None) -> list[Figure]:
    """Every storage figure; on a keyspace of its own in the given Cassandra (dropped afterwards).

    A failed measurement is reported and the others go on; then PartialResults carries the
    figures that were measured."""
    sizes = sizes or (QUICK if quick else FULL)
    host, port = parse_hostport(cassandra_at)
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    end_ms = slot_end_before(now_ms())
    workload = ExporterWorkload(sizes.series, sizes.hours, sizes.series_per_request, end_ms)
    render = RenderWorkload(sizes.render_series, sizes.render_hours, end_ms)
    log(
        f"encoded {workload.samples} samples ({sizes.series} series x {sizes.hours} h) in {workload.requests} requests of "
        f"{sizes.series_per_request} series ({workload.body_bytes / 2**20:.1f} MiB) in {time.perf_counter() - started:.1f} s; "
        f"render {render.samples} points; data ends {(now_ms() - end_ms) / 60000:.0f} min ago"
    )
    results: dict = {}
    failures: list[str] = []

    def attempt(what: str, measure) -> None:
        log(f"running: {what} ...")
        try:
            results[what] = measure()
        except Exception as error:  # report, measure the rest
            print(f"FAILED: storage, {what}: {type(error).__name__}: {error}", flush=True)
            failures.append(f"storage, {what}")

    attempt("victoria-metrics", lambda: measure_victoria_metrics(workdir / "victoria-metrics", workload))
    attempt("prometheus", lambda: measure_prometheus(workdir / "prometheus", workload, sizes.read_requests))
    attempt("tsgate cassandra", lambda: measure_tsgate_cassandra(host, port, workdir, workload, sizes.read_requests))
    attempt("tsgate sqlite", lambda: measure_tsgate_sqlite(workdir / "sqlite", workload))
    attempt("render cassandra", lambda: render_cassandra(host, port, workdir, render, sizes.render_requests))
    attempt("render sqlite", lambda: render_sqlite(workdir / "render-sqlite", render, sizes.render_requests))
    attempt("graphite-web", lambda: measure_graphite_web(workdir / "graphite-web", render, sizes.render_requests))
    workload_label = f"{sizes.series} series x {sizes.hours}h @10s"
    render_label = f"{RENDER_TARGET} {sizes.render_series} series x {sizes.render_hours}h @10s"
    found = figures_of(results, sizes, workload_label, render_label)
    log(f"done in {(time.perf_counter() - started) / 60:.1f} min")
    if failures:
        raise PartialResults(found, failures)
    return found


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.storage", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cassandra", metavar="HOST:PORT", help="use this Cassandra (on this box) instead of starting one"
    )
    parser.add_argument("--heap", default="2G", help="heap of the Cassandra started here (default 2G)")
    parser.add_argument("--quick", action="store_true", help="small workloads (the bracketed sizes above)")
    for field in Sizes._fields:
        parser.add_argument(
            f"--{field.replace('_', '-')}",
            type=int,
            help=f"default {FULL._asdict()[field]} ({QUICK._asdict()[field]} with --quick)",
        )
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL
    args.sizes = Sizes(*(getattr(args, field) or getattr(base, field) for field in Sizes._fields))
    if min(args.sizes) < 1 or args.sizes.series % args.sizes.series_per_request:
        parser.error("sizes must be positive, and --series a multiple of --series-per-request")
    if args.sizes.render_hours > RENDER_RETENTION_S // 3600 - 2:
        parser.error(
            f"--render-hours: at most {RENDER_RETENTION_S // 3600 - 2} (the 10s:2d archive, data ending 1-2 h ago)"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    git = lambda *command: subprocess.run(["git", *command], cwd=REPO, capture_output=True, text=True).stdout.strip()  # noqa: E731
    commit = git("rev-parse", "--short", "HEAD") or "an unknown commit"
    if git("status", "--porcelain", "--", "gateway", "protocols"):
        commit += " (gateway/ or protocols/ changed since)"
    print(
        f"tsgate storage bench at {commit}: {args.sizes}; {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    workdir = Path(tempfile.mkdtemp(prefix="tsgate-bench-storage-"))
    try:
        with cassandra(args.cassandra, workdir / "cassandra", args.heap) as (host, port, _):
            try:
                found, failures = run(f"{host}:{port}", workdir / "storage", args.quick, args.sizes), []
            except PartialResults as partial:
                found, failures = partial.figures, partial.failures
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(format_table(found))
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    exit_with(main)
