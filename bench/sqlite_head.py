"""The embedded store's head: what a head row costs to write, and reading head rows against blocks.

Three measurements on SQLite, run from the repository root (``--quick``: smaller, for a check):

    python -m bench.sqlite_head [--quick]

1. Writes. The store's own head-row statements, group commit (``sqlite_base._commit_group``) and
   head-log folds (every FOLD_ROWS rows) on a fresh file, as the writer thread runs them: S
   series (``--series``, default 8000; hashes in random order, as real ones are), one sample each
   a round, 2000 rows a commit (a group of four 500-series requests), rounds 10 s apart; after 6
   untimed rounds, 20 timed rounds. Printed: rows/s, CPU microseconds a row, and the WAL bytes a
   row (automatic checkpoints off, so the WAL holds every page the timed commits wrote).
2. Store reads. The same points as 3, written with the store's statements and folds into a file
   of their own; the CPU time of SQLiteStore.read_raw's work and the read path's stitching for
   all the series at once, best of 5: right after the writes (the last rows still in the head
   log), once the log is folded, and once every slot is sealed.
3. Reads. ``/render`` of 100 [20] series x 24 h at 10 s (``rb.*.cpu``, bench/storage.py's render
   workload) from a ``tsgate serve --workers 1`` on SQLite: written through ``POST /api/write``,
   rendered while every slot is still head rows (after the writes stopped long enough for the
   store to fold its log: measurement 2 has the log's cost), then sealed with ``tsgate downsample
   --once`` and rendered again; p50/p99 over 5 [3] requests after a warm-up (a few untimed
   renders before the head rows' requests, one before each state's), every answer
   checked, and the gateway's CPU ms a request (its processes' CPU time over the requests). Reference:
   graphite-web 1.1.8 over whisper files of the same points (bench/storage.py), when installed.
   The figure to watch is head p50 / sealed p50 (target <= 1: head rows read no slower than blocks).
"""

import argparse
import base64
import hashlib
import os
import shutil
import sqlite3
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

from bench.common import BenchError, tree_cpu_s, tsgate_service
from bench.queries import time_requests, write_json
from bench.storage import (
    INTERVAL_MS,
    RENDER_TENANT,
    SCHEMAS,
    RenderWorkload,
    checked_once,
    downsample_once,
    measure_graphite_web,
    slot_end_before,
)
from gateway.core.layout import Layout
from gateway.core.model import now_ms
from gateway.store import sqlite_base, sqlite_head, sqlite_samples, sqlite_schema, sqlite_sql
from gateway.store.blocks import encode_block
from gateway.store.contract import RawData, RawPoint, SealedBlock
from gateway.store.read_path import stitch_raw

ROWS_PER_COMMIT = 2000
WARMUP_ROUNDS = 6
TIMED_ROUNDS = 20
WARMUP_RENDERS = 3


def log(message: str) -> None:
    print(f"sqlite_head: {message}", file=sys.stderr, flush=True)


def measure_writes(path: Path, series: int) -> dict:
    """Rows/s, CPU us a row and WAL bytes a row of the store's head-row writes (see the docstring)."""
    layout = Layout()
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA synchronous=FULL")
    sqlite_schema.start_writer(connection, layout)
    connection.execute("PRAGMA wal_autocheckpoint=0")
    # series hashes are random, so a request's series land all over the key space
    hashes = [base64.b64encode(hashlib.md5(str(i).encode()).digest()).decode() for i in range(series)]
    start_ms = slot_end_before(now_ms())

    def write(rounds: range) -> int:
        written = 0
        for r in rounds:
            ts = start_ms + r * INTERVAL_MS + 3
            for first in range(0, series, ROWS_PER_COMMIT):
                points = [RawPoint("bench", h, ts, 1.5 + r) for h in hashes[first : first + ROWS_PER_COMMIT]]
                outcome = sqlite_base._commit_group(connection, [(sqlite_head.raw_statements, (points,))])
                if outcome != [None]:
                    raise BenchError(f"head write failed: {outcome}")
                written += len(points)
                if written % sqlite_head.FOLD_ROWS < len(points):  # as SQLiteStore folds, after the commit
                    sqlite_head.fold_head_log(connection, layout.slot_width_ms)
        return written

    write(range(WARMUP_ROUNDS))
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    wall, cpu = time.perf_counter(), time.process_time()
    rows = write(range(WARMUP_ROUNDS, WARMUP_ROUNDS + TIMED_ROUNDS))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    wal = os.path.getsize(f"{path}-wal")
    connection.close()
    figures = {"rows": rows, "rows/s": rows / wall, "cpu us/row": cpu / rows * 1e6, "wal B/row": wal / rows}
    log(
        f"head writes, {series} series: {figures['rows/s']:.0f} rows/s, {figures['cpu us/row']:.1f} us CPU a row,"
        f" {figures['wal B/row']:.0f} B of WAL a row"
    )
    return figures


def measure_store_reads(path: Path, render: RenderWorkload) -> dict:
    """CPU ms of the store's part of the render alone (SQLiteStore.read_raw's queries and
    decoding, then the read path's stitching), best of 5, on a busy box steadier than the
    render's wall time: head rows right after the writes (the last up to FOLD_ROWS still in the
    head log), once the log is folded, and sealed."""
    layout = Layout()
    connection = sqlite3.connect(path, isolation_level=None)
    sqlite_schema.start_writer(connection, layout)
    tenant, hashes = "bench", render.names
    rows = [
        RawPoint(tenant, h, ts, render.value(i, j)) for i, h in enumerate(hashes) for j, ts in enumerate(render.stamps)
    ]
    for first in range(0, len(rows), 10_000):  # as POST /api/write bodies of 10,000 samples
        sqlite_base._commit_group(connection, [(sqlite_head.raw_statements, (rows[first : first + 10_000],))])
        if (first + 10_000) % sqlite_head.FOLD_ROWS < 10_000:
            sqlite_head.fold_head_log(connection, layout.slot_width_ms)
    start, end = render.stamps[0], render.stamps[-1]
    slots = (start - start % layout.slot_width_ms, end - end % layout.slot_width_ms)

    def read() -> list:
        heads = sqlite_head.read_head(connection, tenant, hashes, *slots, start, end)
        return [
            stitch_raw(
                RawData(sqlite_sql.column_values(connection, sqlite_samples.BLOCKS_QUERY, (tenant, h, *slots)), head),
                start,
                end,
            )
            for h, (head, _) in zip(hashes, heads)
        ]

    def best_cpu_ms() -> float:
        timings = []
        for _ in range(5):
            cpu = time.process_time()
            found = read()
            timings.append((time.process_time() - cpu) * 1000)
            if sum(len(f) for f in found) != render.samples:
                raise BenchError(f"read {sum(len(f) for f in found)} samples of {render.samples}")
        return min(timings)

    figures = {"head, log not folded": best_cpu_ms()}
    sqlite_head.fold_head_log(connection, layout.slot_width_ms)
    figures["head, folded"] = best_cpu_ms()
    blocks = []
    for h, head in zip(hashes, read()):
        for slot in range(slots[0], slots[1] + 1, layout.slot_width_ms):
            sealed = head.between(slot, slot + layout.slot_width_ms - 1)
            blocks.append(
                SealedBlock(tenant, h, slot, encode_block(sealed.timestamps, sealed.values), sealed, now_ms())
            )
    sqlite_samples._write_blocks(connection, layout.slot_width_ms, blocks)
    figures["sealed"] = best_cpu_ms()
    connection.close()
    log("store reads, CPU ms: " + ", ".join(f"{name} {ms:.0f}" for name, ms in figures.items()))
    return figures


def measure_reads(workdir: Path, render: RenderWorkload, requests: int) -> dict:
    """p50/p99 ms and the gateway's CPU ms a request of the render while head rows (once the
    store, quiet, folded its log), then once sealed."""
    workdir.mkdir(parents=True, exist_ok=True)
    store_url = f"sqlite:///{workdir / 'render.db'}"
    schemas = workdir / "storage-schemas.conf"
    schemas.write_text(SCHEMAS)
    gateway = tsgate_service(
        "tsgate (sqlite)",
        ["--store", store_url],
        workdir / "tsgate.log",
        ["--workers", "1", "--roles", "ingest,query", "--graphite-storage-schemas", str(schemas)],
    )
    path = "/render?" + urllib.parse.urlencode(render.params)
    headers = {"X-Tenant": RENDER_TENANT}
    timed, cpu_ms = {}, {}
    try:
        gateway.start(60)
        write_json(gateway.port, "render points (sqlite)", render.items(), RENDER_TENANT)
        time.sleep(2 * sqlite_base.FOLD_CHECK_S + 1)  # the quiet store's fold
        # Untimed renders first: a query executor's first requests pay its one-time costs (lazy
        # imports, the store connection's page cache), which the head rows, measured first,
        # were charged with (60-80 ms of CPU a request of the 6).
        time_requests(gateway.port, "GET", path, None, headers, WARMUP_RENDERS, checked_once(render.check))
        for state in ("head", "sealed"):
            if state == "sealed":
                downsample_once(store_url, render.series_slots)
            cpu = tree_cpu_s(gateway.pid)
            timed[state] = time_requests(gateway.port, "GET", path, None, headers, requests, checked_once(render.check))
            cpu_ms[state] = (tree_cpu_s(gateway.pid) - cpu) / (requests + 1) * 1000  # the warm-up too
    finally:
        gateway.stop()
    for state, figures in timed.items():
        log(
            f"render {state}: p50 {figures.p50:.0f} ms, p99 {figures.p99:.0f} ms, gateway CPU {cpu_ms[state]:.0f} ms a request"
        )
    return timed, cpu_ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sqlite_head", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="20 series rendered, 2000 series written")
    parser.add_argument("--series", type=int, help="series of the write measurement (default 8000)")
    parser.add_argument("--skip-graphite-web", action="store_true", help="no graphite-web reference")
    args = parser.parse_args(argv)
    render_series, requests = (20, 3) if args.quick else (100, 5)
    series = args.series or (2000 if args.quick else 8000)
    workdir = Path(tempfile.mkdtemp(prefix="tsgate-bench-sqlite-head-"))
    try:
        writes = measure_writes(workdir / "writes.db", series)
        render = RenderWorkload(render_series, 24, slot_end_before(now_ms()))
        store_reads = measure_store_reads(workdir / "reads.db", render)
        reads, render_cpu = measure_reads(workdir / "render", render, requests)
        graphite = None if args.skip_graphite_web else measure_graphite_web(workdir / "graphite-web", render, requests)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"head writes, {series} series, {ROWS_PER_COMMIT} rows a commit:")
    print(
        f"  {writes['rows/s']:.0f} rows/s, {writes['cpu us/row']:.2f} us CPU a row, {writes['wal B/row']:.0f} B of WAL a row"
    )
    print(f"store reads (read_raw and stitching) of {render_series} series x 24h @10s, best CPU ms of 5:")
    for name, ms in store_reads.items():
        print(f"  {name:21} {ms:7.0f} ms")
    print(f"render {render_series} series x 24h @10s, {requests} requests:")
    for name, timed, cpu in (
        ("head rows", reads["head"], render_cpu["head"]),
        ("sealed", reads["sealed"], render_cpu["sealed"]),
        ("graphite-web", graphite, None),
    ):
        if timed:
            gateway_cpu = f"   gateway CPU {cpu:5.0f} ms a request" if cpu is not None else ""
            print(f"  {name:13} p50 {timed.p50:7.0f} ms   p99 {timed.p99:7.0f} ms{gateway_cpu}")
    print(f"  head / sealed p50: {reads['head'].p50 / reads['sealed'].p50:.2f} (target <= 1)")
    if graphite:
        print(f"  head / graphite-web p50: {reads['head'].p50 / graphite.p50:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
