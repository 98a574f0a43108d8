"""tsgate's benchmark suite, one command: ``bench/run`` (installs what is missing) or ``python -m bench``.

Starts one Cassandra 5.0 (or uses --cassandra HOST:PORT), runs the parts asked for, prints one
table, writes performance-results.json and performance-ingest.png into --out: docs/ (the
published figures) for a full run, a scratch directory for a --quick one. Parts:

  ingest   tsgate (1 worker and N) end to end into Cassandra beside a raw cassandra-driver loader
  receive  tsgate beside carbon-cache, VictoriaMetrics and Prometheus on the same workloads
  query    bench/queries.py (when present)
  memory   bench/memory.py (when present)
  storage  bench/storage.py (when present): disk bytes per sample, render and remote read over sealed
           blocks, ingest against sealing rate, beside VictoriaMetrics, graphite-web and Prometheus

bench/README.rst says what each figure means. A failed measurement is reported and the others
go on; the exit status is then 1.
"""

import argparse
import contextlib
import datetime
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import ingest, receive
from bench.common import REPO, PartialResults, cassandra, connect
from bench.plot import plot_rates
from bench.report import format_table, read_json, write_json

PARTS = ("ingest", "receive", "query", "memory", "storage")
RESULTS = "performance-results.json"
PLOT = "performance-ingest.png"
PUBLISHED = REPO / "docs"
QUICK_OUT = Path(tempfile.gettempdir()) / "tsgate-bench-quick"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small workloads: a smoke run of a few minutes")
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)} (default: all)"
    )
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count(), help="tsgate's N workers, measured beside 1 (default: cores)"
    )
    parser.add_argument("--cassandra", metavar="HOST:PORT", help="use this Cassandra instead of starting one")
    parser.add_argument("--heap", default="2G", help="heap of the Cassandra started here (default 2G)")
    parser.add_argument(
        "--out",
        type=Path,
        help=f"directory of {RESULTS} and {PLOT} (default: docs/, the published figures;"
        f" with --quick {QUICK_OUT}, so that a smoke run never overwrites them)",
    )
    args = parser.parse_args(argv)
    args.out = args.out or (QUICK_OUT if args.quick else PUBLISHED)
    args.parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    if not args.parts or set(args.parts) - set(PARTS):
        parser.error(f"--parts: choose from {', '.join(PARTS)}")
    if args.workers < 1:
        parser.error("--workers must be positive")
    return args


class Suite:
    """Runs measurements, reporting each failure and going on with the others."""

    def __init__(self):
        self.failures: list[str] = []

    def attempt(self, what: str, run):
        try:
            return run()
        except Exception as error:  # any failure of one measurement: report it, measure the rest
            print(f"FAILED: {what}: {type(error).__name__}: {error}", flush=True)
            self.failures.append(what)
            return None


def other_part(name: str, cassandra_at: str, workdir: Path, quick: bool, suite: Suite) -> list:
    """The query, memory and storage parts are bench/queries.py, bench/memory.py and bench/storage.py,
    written separately. A part that raises PartialResults keeps the figures it did measure."""
    module = {"query": "queries", "memory": "memory", "storage": "storage"}[name]
    try:
        part = __import__(f"bench.{module}", fromlist=["run"])
    except ModuleNotFoundError as error:
        if error.name != f"bench.{module}":
            raise
        print(f"skipped: the {name} part (bench/{module}.py is not there)", flush=True)
        return []
    print(f"running: {name} (bench/{module}.py) ...", flush=True)
    (workdir / name).mkdir()
    kept = []

    def run_part() -> list:
        try:
            return part.run(cassandra_at, workdir / name, quick)
        except PartialResults as error:
            kept.extend(error.figures)
            raise

    return suite.attempt(name, run_part) or kept


def measure(args: argparse.Namespace, suite: Suite, workdir: Path, context: dict) -> list:
    figures = []
    with contextlib.ExitStack() as stack:
        host, port, pid = stack.enter_context(cassandra(args.cassandra, workdir / "cassandra", args.heap))
        cluster = stack.enter_context(connect(host, port))
        session = cluster.connect()
        context["cassandra"] = session.execute("SELECT release_version FROM system.local").one().release_version
        db = ingest.Db(host, port, pid, session)
        workloads = ingest.workloads(args.quick)
        tsgate_runs, raw_runs = [], []
        if {"ingest", "receive"} & set(args.parts):
            suite.attempt("warm-up", lambda: ingest.warm_up(db, workloads[0]))
            for workload in workloads:
                if "ingest" in args.parts:
                    raw_runs.append(
                        suite.attempt(
                            f"ingest, raw loader, {ingest.label(workload)}", lambda: ingest.run_raw(db, workload)
                        )
                    )
                for workers in sorted({1, args.workers}):
                    tsgate_runs.append(
                        suite.attempt(
                            f"ingest, {ingest.workers_name(workers)}, {ingest.label(workload)}",
                            lambda: ingest.run_tsgate(db, workload, workers, workdir),
                        )
                    )
            tsgate_runs = [run for run in tsgate_runs if run]
        if "ingest" in args.parts:
            figures += ingest.figures(tsgate_runs, [run for run in raw_runs if run])
        if "receive" in args.parts:
            references = receive.run_references(workloads, workdir / "receive", suite.attempt)
            figures += receive.figures(references, tsgate_runs)
        for name in ("query", "memory", "storage"):
            if name in args.parts:
                figures += other_part(name, f"{host}:{port}", workdir, args.quick, suite)
    return figures


def earlier_figures(parts: list[str], context: dict, results: Path) -> list:
    """Figures of the parts not run now, kept from the last results file, so that the parts can be
    run one at a time (on a shared box a full run may not fit in one quiet window)."""
    if not results.exists():
        return []
    earlier_context, earlier = read_json(results)
    kept = [figure for figure in earlier if figure.section not in parts]
    if kept:
        context["earlier_runs"] = [
            *earlier_context.pop("earlier_runs", []),
            {**earlier_context, "kept_sections": sorted({figure.section for figure in kept})},
        ]
    return kept


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Multi-partition batches make Cassandra send a warning the driver logs for every request.
    logging.getLogger("cassandra").setLevel(logging.ERROR)
    started = time.monotonic()
    today = datetime.date.today().isoformat()
    context = {
        "date": today,
        "quick": args.quick,
        "parts": args.parts,
        "workers": args.workers,
        "cores": os.cpu_count(),
        "load_average_before": os.getloadavg()[0],
        "python": platform.python_version(),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip(),
    }
    print(
        f"tsgate bench suite: parts {','.join(args.parts)}, {'quick' if args.quick else 'full'} workloads, "
        f"workers 1 and {args.workers}; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    suite = Suite()
    workdir = Path(tempfile.mkdtemp(prefix="tsgate-bench-suite-"))
    try:
        figures = measure(args, suite, workdir, context)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    context.update(
        load_average_after=os.getloadavg()[0],
        minutes=round((time.monotonic() - started) / 60, 1),
        failures=suite.failures,
    )
    results, plot = args.out / RESULTS, args.out / PLOT
    figures = earlier_figures(args.parts, context, results) + figures
    print()
    print(format_table(figures))
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(figures, results, context)
    title = (
        f"tsgate ingest and receive, {today}, {os.cpu_count()} cores, shared box{' (quick run)' if args.quick else ''}"
    )
    plotted = suite.attempt("plot", lambda: plot_rates(figures, plot, title))
    print(f"\nwrote {results}" + (f" and {plot}" if plotted else "") + f"; {context['minutes']} min")
    if suite.failures:
        print(f"FAILED: {', '.join(suite.failures)}")
    return 1 if suite.failures else 0


if __name__ == "__main__":
    sys.exit(main())
