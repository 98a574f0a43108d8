"""The suite's receive part: how fast tsgate takes in what senders send, beside Debian's receivers.

The same workloads as the ingest part (bench.workloads), one receiver at a time on this box:
carbon-cache (plaintext), VictoriaMetrics (plaintext via -graphiteListenAddr, and remote write),
Prometheus 2.42 (remote write). The rate is defined the same way for every receiver: lines or
samples consumed per second, from the first byte until the senders have written everything and
the server has consumed it (plaintext: the kernel's socket queues are empty on both sides; remote
write: every request answered 2xx). tsgate's figures come from the ingest part's runs (the same
run notes when its sockets were read empty and when all was stored), on Cassandra: it stops
reading while 200k samples wait for the store, so its receive rate is bounded by its store.
"Per core" divides by the CPU seconds of the receiving process(es) over the same interval
(tsgate: the parent and its workers, not Cassandra).
"""

import contextlib
import shutil
import time
from pathlib import Path
from typing import NamedTuple

from bench.common import Service, box_busy_s, tree_cpu_s, which
from bench.ingest import TsgateRun, label, workers_name
from bench.remote_write import Workload as RemoteWriteWorkload
from bench.remote_write import prometheus_service
from bench.remote_write import send as send_remote_write
from bench.report import Figure
from bench.workloads import PlaintextWorkload, send_plaintext
from gateway.app.devservices.process import free_port
from gateway.core.model import now_ms

RUN_TIMEOUT_S = 600
CARBON_CONF = """[cache]
STORAGE_DIR = {dir}/storage/
LOCAL_DATA_DIR = {dir}/storage/whisper/
WHITELISTS_DIR = {dir}/storage/lists/
CONF_DIR = {dir}/conf/
LOG_DIR = {dir}/log/
PID_DIR = {dir}/
USER =
DATABASE = whisper
ENABLE_LOGROTATION = False
MAX_CACHE_SIZE = inf
MAX_UPDATES_PER_SECOND = 500
MAX_CREATES_PER_MINUTE = 50
LINE_RECEIVER_INTERFACE = 127.0.0.1
LINE_RECEIVER_PORT = {line_port}
ENABLE_UDP_LISTENER = False
PICKLE_RECEIVER_INTERFACE = 127.0.0.1
PICKLE_RECEIVER_PORT = {pickle_port}
CACHE_QUERY_INTERFACE = 127.0.0.1
CACHE_QUERY_PORT = {query_port}
USE_FLOW_CONTROL = True
LOG_UPDATES = False
LOG_CREATES = False
LOG_CACHE_HITS = False
CACHE_WRITE_STRATEGY = sorted
WHISPER_AUTOFLUSH = False
"""
# Debian's /etc/carbon/storage-schemas.conf default; the schema decides only the whisper files'
# size, and carbon creates at most MAX_CREATES_PER_MINUTE of them, so it hardly touches receiving.
STORAGE_SCHEMAS = "[default]\npattern = .*\nretentions = 60s:1d,5m:30d,1h:3y\n"


class ReceiveRun(NamedTuple):
    receiver: str
    workload: str
    samples: int
    seconds: float
    cpu_s: float  # of the receiving process(es)
    box_busy_s: float  # busy cores of the whole box during the run


def carbon_cache_service(workdir: Path) -> tuple[Service, int]:
    """Debian's carbon-cache in the foreground with everything under workdir (MAX_CACHE_SIZE inf, the
    Debian defaults otherwise); returns it and its plaintext port."""
    for sub in ("conf", "storage/whisper", "storage/lists", "log"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    line_port = free_port()
    conf = workdir / "conf" / "carbon.conf"
    conf.write_text(
        CARBON_CONF.format(dir=workdir, line_port=line_port, pickle_port=free_port(), query_port=free_port())
    )
    (workdir / "conf" / "storage-schemas.conf").write_text(STORAGE_SCHEMAS)
    command = [
        which("carbon-cache"),
        f"--config={conf}",
        f"--pidfile={workdir / 'carbon-cache.pid'}",
        "--debug",
        "start",
    ]
    return Service("carbon-cache", command, line_port, None, workdir / "carbon-cache.log"), line_port


def victoria_metrics_service(workdir: Path) -> tuple[Service, int]:
    """Debian's single-node victoria-metrics with its Graphite listener on; returns it and that port."""
    workdir.mkdir(parents=True, exist_ok=True)
    port, graphite_port = free_port(), free_port()
    command = [
        which("victoria-metrics"),
        f"-storageDataPath={workdir / 'data'}",
        f"-httpListenAddr=127.0.0.1:{port}",
        f"-graphiteListenAddr=127.0.0.1:{graphite_port}",
        "-loggerLevel=WARN",
    ]
    return Service("victoria-metrics", command, port, "/health", workdir / "victoria-metrics.log"), graphite_port


def receivers(workdir: Path):
    """(name, start() -> (service, plaintext port or None), workload kinds it takes), in run order."""
    return [
        ("carbon-cache", lambda: carbon_cache_service(workdir / "carbon-cache"), {PlaintextWorkload}),
        (
            "victoria-metrics",
            lambda: victoria_metrics_service(workdir / "victoria-metrics"),
            {PlaintextWorkload, RemoteWriteWorkload},
        ),
        (
            "prometheus",
            lambda: (prometheus_service(which("prometheus"), mkdir(workdir / "prometheus")), None),
            {RemoteWriteWorkload},
        ),
    ]


def mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_references(workloads: list, workdir: Path, attempt) -> list[ReceiveRun]:
    """Every reference receiver on the workloads it takes, one server at a time (an idle one never
    takes CPU from a measured one). attempt(what, fn) runs fn, reporting and counting a failure."""
    runs = []
    for name, start, kinds in receivers(workdir):
        chosen = [workload for workload in workloads if type(workload) in kinds]
        if not chosen:
            continue
        with contextlib.ExitStack() as stack:
            warm = RemoteWriteWorkload in kinds
            started = attempt(f"receive, starting {name}", lambda: start_service(stack, start, warm))
            if started is None:
                continue
            service, plaintext_port = started
            for workload in chosen:
                run = attempt(
                    f"receive, {name}, {label(workload)}", lambda: measure(name, service, plaintext_port, workload)
                )
                if run:
                    runs.append(run)
    shutil.rmtree(workdir, ignore_errors=True)
    return runs


def start_service(stack: contextlib.ExitStack, start, warm: bool) -> tuple[Service, int | None]:
    service, plaintext_port = start()
    stack.callback(service.stop)
    service.start()
    if warm:
        # Untimed rounds of other series first, as every remote-write receiver gets (tsgate too).
        warmup = RemoteWriteWorkload("warmup", 500, 4, 5, now_ms() // 10_000 * 10_000)
        send_remote_write(service.port, warmup, RUN_TIMEOUT_S)
    return service, plaintext_port


def measure(name: str, service: Service, plaintext_port: int | None, workload) -> ReceiveRun:
    print(f"running: receive, {name}, {label(workload)} ({workload.samples} samples) ...", flush=True)
    cpu_before, box_before = tree_cpu_s(service.pid), box_busy_s()
    started = time.perf_counter()
    if isinstance(workload, PlaintextWorkload):
        seconds = send_plaintext(plaintext_port, workload)
    else:
        acknowledged, errors = send_remote_write(service.port, workload, RUN_TIMEOUT_S)
        seconds = time.perf_counter() - started
        if errors or acknowledged != workload.samples:
            raise RuntimeError(f"{acknowledged} of {workload.samples} samples acknowledged; errors: {errors}")
    return ReceiveRun(
        name,
        label(workload),
        workload.samples,
        seconds,
        tree_cpu_s(service.pid) - cpu_before,
        (box_busy_s() - box_before) / seconds,
    )


def from_tsgate(run: TsgateRun) -> ReceiveRun:
    return ReceiveRun(
        workers_name(run.workers), run.workload, run.samples, run.received_s, run.gateway_cpu_received, run.box_busy_s
    )


def figures(references: list[ReceiveRun], tsgate_runs: list[TsgateRun]) -> list[Figure]:
    """Per workload: each reference's rate, tsgate's rate against each of them; then the same per CPU-second."""
    runs = references + [from_tsgate(run) for run in sorted(tsgate_runs, key=lambda run: run.workers)]
    found = []
    for workload in dict.fromkeys(run.workload for run in runs):
        unit = "lines" if workload.startswith("graphite") else "samples"
        these = [run for run in runs if run.workload == workload]
        ours = [run for run in these if run.receiver.startswith("tsgate")]
        theirs = [run for run in these if not run.receiver.startswith("tsgate")]
        for per_core in (False, True):

            def value(run: ReceiveRun) -> float:
                return run.samples / (run.cpu_s if per_core else run.seconds)

            suffix = ", per core" if per_core else ""
            for run in theirs:
                found.append(
                    Figure(
                        "receive",
                        f"{run.receiver}, {workload}{suffix}",
                        value(run),
                        f"{unit}/{'cpu-s' if per_core else 's'}",
                        note=f"CPU s {run.cpu_s:.1f} in {run.seconds:.1f} s; box {run.box_busy_s:.1f} cores busy",
                    )
                )
            for run in ours:
                bound = "reading pauses while 200k lines wait for" if unit == "lines" else "answers once stored in"
                note = (
                    f"gateway CPU s {run.cpu_s:.1f} in {run.seconds:.1f} s (Cassandra's not counted); "
                    f"box {run.box_busy_s:.1f} cores busy; store-bound: {bound} Cassandra"
                )
                for reference in theirs or [None]:
                    found.append(
                        Figure(
                            "receive",
                            f"{run.receiver}, {workload}{suffix}",
                            value(run),
                            f"{unit}/{'cpu-s' if per_core else 's'}",
                            f"{reference.receiver}, {workload}{suffix}" if reference else "",
                            value(run) / value(reference) if reference else None,
                            note,
                        )
                    )
    return found
