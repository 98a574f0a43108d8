"""The suite's ingest part: tsgate end to end into Cassandra, beside a raw cassandra-driver loader.

For each workload (bench.workloads) tsgate runs with 1 worker and with N on a fresh keyspace
each, from the first byte sent until everything is stored: for remote write, every request
answered 2xx (tsgate acknowledges only what its store accepted); for Graphite plaintext, which has
no answers, until /metrics counts every line accepted (tsgate_samples_accepted_total, summed over
the workers by prometheus-client's multiprocess mode). The same run also notes when the sockets
were read empty, which is the receive part's figure for tsgate: one run serves both parts.

The raw loader is the ceiling: the same rows written straight into data_raw with the gateway's
prepared INSERT (same TTL, consistency, hash and slot) by this process, at most RAW_INFLIGHT
requests in flight. It may group rows only within what the gateway gets at once (one remote-write
request; one Graphite batch), and its best strategy counts. Everything written is read back,
untimed, partition by partition and through GET /api/query for a few series: a difference fails.
"""

import gc
import itertools
import json
import os
import time
import urllib.parse
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

from cassandra.concurrent import execute_concurrent
from cassandra.query import BatchStatement, BatchType

from bench.common import (
    CONSISTENCY,
    BenchError,
    box_busy_s,
    fresh_keyspace,
    process_cpu_s,
    settle,
    tree_cpu_s,
    tsgate_service,
)
from bench.ingest_cassandra import load_rows, partition_batches, prepare_insert, verify_rows
from bench.remote_write import Workload as RemoteWriteWorkload
from bench.remote_write import send as send_remote_write
from bench.report import Figure
from bench.workloads import (
    PlaintextWorkload,
    partitions,
    remote_write_label,
    remote_write_rows,
    send_plaintext,
)
from gateway.app.devservices.process import free_port
from gateway.core.model import now_ms
from gateway.store.cassandra_base import ROWS_PER_BATCH
from protocols.timespec import format_iso

TENANT = "bench"  # remote write's X-Scope-OrgID in bench.remote_write.HEADERS, and --graphite-tenant
RAW_INFLIGHT = 256  # the gateway's max_inflight towards Cassandra
GRAPHITE_BATCH = 5000  # GraphiteIngest's batch_size: the most plaintext samples the gateway writes at once
ACCEPTED = 'tsgate_samples_accepted_total{protocol="graphite_plaintext"}'
STALL_S = 120  # the accepted count may stand still this long before the run is failed
RUN_TIMEOUT_S = 600
CHECKED_SERIES = 5
_keyspaces = itertools.count(1)


def keyspace_name() -> str:
    """A keyspace of its own for every run (Cassandra allows 48 characters of [a-z0-9_])."""
    return f"tsgate_bench_{os.getpid()}_{next(_keyspaces)}"


class Db(NamedTuple):
    """The Cassandra every part writes to; pid None when it was given (its CPU is not measured)."""

    host: str
    port: int
    pid: int | None
    session: object


class TsgateRun(NamedTuple):
    workload: str
    workers: int
    samples: int
    received_s: float  # first byte until all was read from the sockets (plaintext) or answered (remote write)
    stored_s: float  # until all was stored
    gateway_cpu_received: float  # CPU seconds of the gateway's processes until received_s
    gateway_cpu_s: float  # ... until stored_s
    cassandra_cpu_s: float | None
    box_busy_s: float


class RawRun(NamedTuple):
    workload: str
    samples: int
    rate: float  # samples/s of the best strategy writing every row
    best: str
    trial_rates: dict[str, float]  # strategy -> samples/s on the first fifth of the rows
    loader_cpu_s: float
    cassandra_cpu_s: float | None


def workloads(quick: bool) -> list:
    """Graphite plaintext and remote write at 500 and 2000 series per request, 4 connections each."""
    end_ms = now_ms() // 10_000 * 10_000
    paths, points, samples_per_size = (2000, 30, 40_000) if quick else (10_000, 60, 200_000)
    chosen: list = [PlaintextWorkload(paths, points, 4, end_ms // 1000)]
    for size in (500, 2000):
        rounds = -(-samples_per_size // (size * 4))
        chosen.append(RemoteWriteWorkload(f"bench{size}", size, 4, rounds, end_ms))
    return chosen


def label(workload) -> str:
    return workload.label if isinstance(workload, PlaintextWorkload) else remote_write_label(workload)


def rows(workload, tenant: str) -> list[tuple]:
    return workload.rows(tenant) if isinstance(workload, PlaintextWorkload) else remote_write_rows(workload, tenant)


def workers_name(workers: int) -> str:
    return f"tsgate {workers} worker{'s' if workers > 1 else ''}"


def accepted(metrics_text: str) -> float:
    """The plaintext accepted count in /metrics (under --workers N, any worker answers for all)."""
    for line in metrics_text.splitlines():
        if line.startswith(ACCEPTED):
            return float(line.rpartition(" ")[2])
    return 0.0


def run_tsgate(db: Db, workload, workers: int, workdir: Path) -> TsgateRun:
    """One tsgate (1 or N workers) on a fresh keyspace: timed, then checked; stopped and dropped after."""
    keyspace = keyspace_name()
    graphite_port = free_port()
    with fresh_keyspace(db.session, db.host, db.port, keyspace) as store_url:
        gateway = tsgate_service(
            workers_name(workers),
            ["--store", store_url],
            workdir / f"{keyspace}.log",
            [
                # No roll-ups in this process: they would run in the background and blur the figures.
                "--roles",
                "ingest,query",
                "--graphite",
                f"127.0.0.1:{graphite_port}",
                "--graphite-tenant",
                TENANT,
                # Always explicit: the default is one worker per core on Cassandra.
                "--workers",
                str(workers),
            ],
        )
        try:
            gateway.start()
            # New connections, prepared statements and Python's first calls, before the clock starts;
            # its answers do not matter (a cold Cassandra may time out a few of them).
            send_remote_write(
                gateway.port, RemoteWriteWorkload("warmup", 500, 4, 5, now_ms() // 10_000 * 10_000), RUN_TIMEOUT_S
            )
            run = timed_run(db, gateway, workload, workers, graphite_port)
            expected = rows(workload, TENANT)
            verify_rows(db.session, keyspace, TENANT, partitions(expected), "data_head")
            check_queries(gateway, workload)
            return run
        finally:
            gateway.stop()


def timed_run(db: Db, gateway, workload, workers: int, graphite_port: int) -> TsgateRun:
    def cpu() -> tuple[float, float | None, float]:
        return tree_cpu_s(gateway.pid), process_cpu_s(db.pid) if db.pid else None, box_busy_s()

    name = f"{workers_name(workers)}, {label(workload)}"
    print(f"running: ingest, {name} ({workload.samples} samples) ...", flush=True)
    gc.collect()
    gateway_before, cassandra_before, box_before = cpu()
    started = time.perf_counter()
    if isinstance(workload, PlaintextWorkload):
        received_s = send_plaintext(graphite_port, workload)
        gateway_received = tree_cpu_s(gateway.pid)
        stored_s = wait_accepted(gateway, workload.samples, started)
    else:
        acknowledged, errors = send_remote_write(gateway.port, workload, RUN_TIMEOUT_S)
        received_s = stored_s = time.perf_counter() - started
        gateway_received = tree_cpu_s(gateway.pid)
        if errors or acknowledged != workload.samples:
            raise BenchError(f"{name}: {acknowledged} of {workload.samples} samples acknowledged; errors: {errors}")
    gateway_after, cassandra_after, box_after = cpu()
    return TsgateRun(
        label(workload),
        workers,
        workload.samples,
        received_s,
        stored_s,
        gateway_received - gateway_before,
        gateway_after - gateway_before,
        None if cassandra_before is None else cassandra_after - cassandra_before,
        (box_after - box_before) / stored_s,
    )


def wait_accepted(gateway, samples: int, started: float) -> float:
    """Seconds from `started` until /metrics counts every plaintext sample accepted (stored); a
    count that stands still for STALL_S fails the run (with N workers, so would a /metrics that
    showed one worker's count only)."""
    count, last_change, last_count = 0.0, time.monotonic(), -1.0
    while count < samples:
        status, body = gateway.get("/metrics")
        if status != 200:
            raise BenchError(f"GET /metrics answered {status}")
        count = accepted(body.decode())
        if count != last_count:
            last_change, last_count = time.monotonic(), count
        elif time.monotonic() - last_change > STALL_S:
            raise BenchError(f"{ACCEPTED} stayed at {count:.0f} of {samples} for {STALL_S}s:\n{gateway.log()}")
        time.sleep(0.05)
    return time.perf_counter() - started


def check_queries(gateway, workload) -> None:
    """A few series read back through GET /api/query (series index, then data) with every value."""
    if isinstance(workload, PlaintextWorkload):
        step = max(1, len(workload.paths) // CHECKED_SERIES)
        checks = [
            (
                [("metricName", workload.paths[i])],
                {format_iso(ts * 1000): workload.value(i, j) for j, ts in enumerate(workload.timestamps_s)},
            )
            for i in range(0, len(workload.paths), step)
        ]
        start, end = workload.timestamps_s[0] * 1000, workload.timestamps_s[-1] * 1000
    else:
        step = max(1, workload.series // CHECKED_SERIES)
        checks = [
            (
                [("metricName", "bench_metric"), ("tag", f"job={workload.job}"), ("tag", f"i={i}")],
                {format_iso(ts): workload.value(i, r) for r, ts in enumerate(workload.timestamps)},
            )
            for i in range(0, workload.series, step)
        ]
        start, end = workload.timestamps[0], workload.timestamps[-1]
    for params, expected in checks:
        query = urllib.parse.urlencode([*params, ("start", start), ("end", end)])
        status, body = gateway.get(f"/api/query?{query}", headers={"X-Tenant": TENANT})
        found = json.loads(body) if status == 200 else None
        if not found or len(found) != 1 or found[0]["values"] != expected:
            raise BenchError(
                f"GET /api/query?{query} answered {status}: {body[:300]!r}, not the {len(expected)} points written"
            )
    print(f"verified: {len(checks)} series of {label(workload)} read back through GET /api/query", flush=True)


def replica_batches(session, insert, keyspace: str, rows: list[tuple]):
    """Yield multi-partition UNLOGGED batches of up to ROWS_PER_BATCH rows whose partitions have the
    same replicas, so the token-aware driver sends each to a node that owns all of it (with one node:
    any rows). Binding (for the routing key) is part of the loader's timed work."""
    metadata = session.cluster.metadata
    groups = defaultdict(list)
    for row in rows:
        bound = insert.bind(row)
        groups[frozenset(metadata.get_replicas(keyspace, bound.routing_key))].append(bound)
    for statements in groups.values():
        for start in range(0, len(statements), ROWS_PER_BATCH):
            batch = BatchStatement(BatchType.UNLOGGED, consistency_level=CONSISTENCY)
            for statement in statements[start : start + ROWS_PER_BATCH]:
                batch.add(statement)
            yield batch


def windows(rows: list[tuple], size: int):
    return (rows[start : start + size] for start in range(0, len(rows), size))


def load(session, insert, keyspace: str, strategy: str, data: list[tuple], window: int) -> None:
    """Write the rows one strategy's way, at most RAW_INFLIGHT requests in flight."""
    if strategy == "per-row requests":
        load_rows(session, insert, data, RAW_INFLIGHT)
        return
    if strategy == "partition batches":
        batches = (partition_batches(insert, part) for part in windows(data, window))
    else:
        batches = (replica_batches(session, insert, keyspace, part) for part in windows(data, window))
    execute_concurrent(
        session, ((batch, ()) for batch in itertools.chain.from_iterable(batches)), concurrency=RAW_INFLIGHT
    )


def run_raw(db: Db, workload) -> RawRun:
    """The raw loader on a fresh keyspace: each strategy writes the first fifth of the rows (a trial,
    to choose), then data_raw is truncated and the fastest writes all of them, timed and checked.

    Plaintext: per-row requests, single-partition batches (a window of GRAPHITE_BATCH lines holds
    a few points of each path) and replica-grouped batches. Remote write: every row of a request
    is its own partition, so per-row requests and replica-grouped multi-partition batches."""
    if isinstance(workload, PlaintextWorkload):
        window = GRAPHITE_BATCH
        strategies = ["per-row requests", "partition batches", "replica batches"]
    else:
        window = workload.series_per_request
        strategies = ["per-row requests", "replica batches"]
    data = rows(workload, TENANT)
    trial = data[: len(data) // 5]
    keyspace = keyspace_name()
    with fresh_keyspace(db.session, db.host, db.port, keyspace):
        insert = prepare_insert(db.session, keyspace)
        rates = {}
        for strategy in strategies:
            print(f"running: ingest, raw loader trial ({strategy}), {label(workload)} ...", flush=True)
            started = time.perf_counter()
            load(db.session, insert, keyspace, strategy, trial, window)
            rates[strategy] = len(trial) / (time.perf_counter() - started)
        best = max(rates, key=rates.get)
        db.session.execute(f"TRUNCATE {keyspace}.data_raw", timeout=120)
        print(f"running: ingest, raw loader ({best}), {label(workload)} ...", flush=True)
        gc.collect()
        cassandra_before, client_before = process_cpu_s(db.pid) if db.pid else None, time.process_time()
        started = time.perf_counter()
        load(db.session, insert, keyspace, best, data, window)
        seconds = time.perf_counter() - started
        client_cpu = time.process_time() - client_before
        cassandra_cpu = None if cassandra_before is None else process_cpu_s(db.pid) - cassandra_before
        verify_rows(db.session, keyspace, TENANT, partitions(data))
    return RawRun(label(workload), len(data), len(data) / seconds, best, rates, client_cpu, cassandra_cpu)


def cpu_note(gateway_s: float, cassandra_s: float | None, samples: int) -> str:
    cassandra = "-" if cassandra_s is None else f"{cassandra_s:.1f}"
    per_sample = (
        ""
        if cassandra_s is None
        else f" ({gateway_s / samples * 1e6:.0f} + {cassandra_s / samples * 1e6:.0f} us/sample)"
    )
    return f"CPU s gateway {gateway_s:.1f}, cassandra {cassandra}{per_sample}"


def figures(tsgate_runs: list[TsgateRun], raw_runs: list[RawRun]) -> list[Figure]:
    """Per workload: the raw loader, then tsgate by workers with its ratio to the loader, then N vs 1."""
    found = []
    for workload in dict.fromkeys([run.workload for run in raw_runs] + [run.workload for run in tsgate_runs]):
        raw = next((run for run in raw_runs if run.workload == workload), None)
        reference = None
        if raw:
            trials = ", ".join(f"{name} {rate:,.0f}" for name, rate in raw.trial_rates.items())
            cassandra = "-" if raw.cassandra_cpu_s is None else f"{raw.cassandra_cpu_s:.1f}"
            reference = Figure(
                "ingest",
                f"raw loader, {workload}",
                raw.rate,
                "samples/s",
                note=f"{raw.best} won the trial ({trials}/s); CPU s loader {raw.loader_cpu_s:.1f}, cassandra {cassandra}",
            )
            found.append(reference)
        one = None
        for run in sorted((run for run in tsgate_runs if run.workload == workload), key=lambda run: run.workers):
            name = f"{workers_name(run.workers)}, {workload}"
            rate = run.samples / run.stored_s
            note = (
                f"{cpu_note(run.gateway_cpu_s, run.cassandra_cpu_s, run.samples)}; box {run.box_busy_s:.1f} cores busy"
            )
            figure = Figure(
                "ingest",
                name,
                rate,
                "samples/s",
                reference.name if reference else "",
                rate / reference.value if reference else None,
                note,
            )
            found.append(figure)
            if run.workers == 1:
                one = figure
            elif one:
                found.append(
                    Figure(
                        "ingest",
                        f"{workers_name(run.workers)} vs 1, {workload}",
                        rate,
                        "samples/s",
                        one.name,
                        rate / one.value,
                    )
                )
    return found


def warm_up(db: Db, workload) -> None:
    """A fresh Cassandra compiles its hot paths (C2) for tens of seconds: write a fifth of the first
    workload's rows both ways into a throwaway keyspace and let it settle, before anything is timed."""
    data = rows(workload, TENANT)[: workload.samples // 5]
    keyspace = keyspace_name()
    print(f"warming up Cassandra: {len(data)} rows ...", flush=True)
    with fresh_keyspace(db.session, db.host, db.port, keyspace):
        insert = prepare_insert(db.session, keyspace)
        load(db.session, insert, keyspace, "per-row requests", data, GRAPHITE_BATCH)
        load(db.session, insert, keyspace, "replica batches", data, GRAPHITE_BATCH)
    if db.pid:
        print(f"cassandra settled after {settle(db.pid):.0f}s", flush=True)
