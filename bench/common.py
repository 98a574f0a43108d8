"""Helpers every benchmark shares: CPU seconds from /proc, server processes, Cassandra and keyspaces.

One copy of each, so that the suite (``python -m bench``) and the older single-purpose scripts
measure CPU, start servers and clean up the same way.
"""

import contextlib
import http.client
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from cassandra import ConsistencyLevel
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

from gateway.app.config import parse_hostport
from gateway.app.devservices.cassandra import CassandraServer
from gateway.app.devservices.process import free_port, terminate

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The gateway's default write consistency (cassandra URL option write_consistency).
CONSISTENCY = ConsistencyLevel.LOCAL_QUORUM
REQUEST_TIMEOUT_S = 60
CASSANDRA_START_TIMEOUT_S = 240
# Head rows a Cassandra started here takes before it is measured: until its JIT has compiled the
# write path (about 2M rows) it costs 2-3 times the CPU a row of a server that has run a while
# (docs/performance-log.rst, "Write path, end of the fifth session").
CASSANDRA_WARMUP_ROUNDS = 1000  # of 2000 rows (bench.store_write)


class BenchError(Exception):
    """The run failed (an error answer, missing data, a server that would not start): exit 1."""


class PartialResults(BenchError):
    """Some measurements of a part failed and the others did not: the figures of those that did
    (the suite keeps them in its table) and what failed (which makes the run fail)."""

    def __init__(self, figures: list, failures: list[str]):
        super().__init__("; ".join(failures))
        self.figures = figures
        self.failures = failures


def process_cpu_s(pid: int) -> float:
    """utime + stime of a process (fields 14 and 15 of /proc/<pid>/stat) in seconds."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def process_tree(pid: int) -> list[int]:
    """pid and its descendants (/proc/<pid>/task/<tid>/children, recursively): a server's workers."""
    pids, index = [pid], 0
    while index < len(pids):
        with contextlib.suppress(FileNotFoundError):  # a process or thread that just exited
            for task in os.listdir(f"/proc/{pids[index]}/task"):
                with open(f"/proc/{pids[index]}/task/{task}/children") as children:
                    pids.extend(int(child) for child in children.read().split())
        index += 1
    return pids


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and every live descendant: the gateway's parent plus its workers."""
    total = 0.0
    for member in process_tree(pid):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += process_cpu_s(member)
    return total


def tree_run_time_s(pid: int) -> float:
    """Seconds on a CPU of every live thread of a process and its descendants, to the nanosecond
    (the first field of /proc/<pid>/task/<tid>/schedstat): for spans of a few milliseconds, where
    tree_cpu_s's clock ticks (10 ms) are too coarse. Threads that exited are not counted."""
    total_ns = 0
    for member in process_tree(pid):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for task in os.listdir(f"/proc/{member}/task"):
                with (
                    contextlib.suppress(FileNotFoundError, ProcessLookupError),
                    open(f"/proc/{member}/task/{task}/schedstat") as schedstat,
                ):
                    total_ns += int(schedstat.read().split()[0])
    return total_ns / 1e9


def wait_until_idle(pid: int, timeout_s: float = 30.0, idle_cores: float = 0.1) -> None:
    """Wait until a process tree uses less than ``idle_cores`` over a second (or ``timeout_s``
    passed). The gateway answers once its first worker is up; its other workers and their query
    executors start after that, importing modules for 3-4 CPU seconds in all (measured on the
    2-core box, Cassandra store): without this wait that start-up lands in the first timed run."""
    deadline = time.monotonic() + timeout_s
    before = tree_cpu_s(pid)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = tree_cpu_s(pid)
        if now - before < idle_cores:
            return
        before = now


def listening_pid(port: int) -> int:
    """The process listening on a local TCP port (/proc/net/tcp* then the owners' /proc/<pid>/fd)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                        return int(pid)
    raise BenchError(f"no local process listens on port {port}: its CPU or files cannot be measured")


def box_busy_s() -> float:
    """CPU seconds all cores spent busy: on a shared box, other people's load shows up here."""
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in stat.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / CLK_TCK


def settle(pid: int, limit_s: float = 60) -> float:
    """Wait until Cassandra uses under a quarter of a core (JIT compilation, flushes done); seconds waited."""
    started = time.monotonic()
    while time.monotonic() < started + limit_s:
        before = process_cpu_s(pid)
        time.sleep(1)
        if process_cpu_s(pid) - before < 0.25:
            break
    return time.monotonic() - started


class Service:
    """A server on a loopback port, ready once ready_path answers 200 (or, with ready_path None, once
    the port accepts connections); its output goes to a log quoted when it fails."""

    def __init__(
        self, name: str, command: list[str], port: int, ready_path: str | None, log_path: Path, env: dict | None = None
    ):
        self.name = name
        self.command = command
        self.port = port
        self.ready_path = ready_path
        self.log_path = log_path
        self.env = env
        self.process: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def start(self, timeout: float = 60) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command,
                cwd=self.log_path.parent,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BenchError(f"{self.name} exited with {self.process.returncode}:\n{self.log()}")
            try:
                if self.ready_path is None:
                    with contextlib.closing(http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)) as probe:
                        probe.connect()
                        return
                if self.get(self.ready_path, 2)[0] == 200:
                    return
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.2)
        raise BenchError(f"{self.name} was not ready within {timeout:.0f}s:\n{self.log()}")

    def stop(self) -> None:
        terminate(self.process, 30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def get(self, path: str, timeout: float = REQUEST_TIMEOUT_S, headers: dict | None = None) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request("GET", path, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()


def tsgate_service(
    name: str, store_args: list[str], log_path: Path, extra_args: list[str] = (), repo: Path = REPO
) -> Service:
    """A real ``tsgate serve`` (of the checkout at ``repo``) on a free HTTP port; the carbon listeners
    are off unless extra_args set them (their default ports may be held by other gateways on the box)."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "gateway.app.cli",
        "serve",
        "--http",
        f"127.0.0.1:{port}",
        "--graphite",
        "",
        "--pickle",
        "",
        *store_args,
        "--log-level",
        "warning",
        "--max-series-per-query",
        "1000000",
        *extra_args,
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])))
    return Service(name, command, port, "/healthz", log_path, env)


@contextlib.contextmanager
def cassandra(given: str | None, workdir: Path, heap: str = "1G"):
    """Yield (host, port, pid) of the Cassandra to use: the given HOST:PORT (pid None: its CPU is not
    measured), or one started here in workdir and stopped on the way out."""
    if given:
        host, port = parse_hostport(given)
        yield host, port, None
        return
    server = CassandraServer(workdir, heap=heap)
    try:
        try:
            server.start(timeout=CASSANDRA_START_TIMEOUT_S)
        except RuntimeError as error:
            raise BenchError(str(error)) from None
        warm_up(server.host, server.port)
        # CassandraServer has no public pid; its CPU time shows where the time goes.
        yield server.host, server.port, server._process.pid
    finally:
        server.stop()


def warm_up(host: str, port: int) -> None:
    """Head rows written by the store into a keyspace of their own (dropped after), so that a
    Cassandra started by a bench is measured as a running one is, not while its JIT warms up."""
    rows = CASSANDRA_WARMUP_ROUNDS * 2000
    print(f"warming up the Cassandra started here: {rows:,} head rows ...", file=sys.stderr, flush=True)
    command = [sys.executable, "-m", "bench.store_write", "--cassandra", f"{host}:{port}"]
    try:
        subprocess.run(
            [*command, "--rounds", str(CASSANDRA_WARMUP_ROUNDS)], cwd=REPO, check=True, stdout=subprocess.DEVNULL
        )
    except subprocess.CalledProcessError as error:
        raise BenchError(f"warming up Cassandra failed (exit {error.returncode})") from None


def connect(host: str, port: int) -> Cluster:
    """A client set up as the gateway's: token-aware, protocol v5, its write consistency."""
    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy()),
        consistency_level=CONSISTENCY,
        request_timeout=REQUEST_TIMEOUT_S,
    )
    return Cluster([host], port=port, protocol_version=5, execution_profiles={EXEC_PROFILE_DEFAULT: profile})


def drop_keyspace(session, keyspace: str) -> None:
    session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)


@contextlib.contextmanager
def fresh_keyspace(session, host: str, port: int, keyspace: str):
    """Create the keyspace with the gateway's defaults through ``tsgate schema apply`` (as an operator
    does), yield its store URL, and drop it on the way out, failed or not."""
    store_url = f"cassandra://{host}:{port}/{keyspace}"
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "gateway.app.cli",
                "schema",
                "apply",
                "--store",
                store_url,
                "--log-level",
                "warning",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if result.returncode:
            raise BenchError(f"tsgate schema apply {store_url} exited {result.returncode}: {result.stderr[-2000:]}")
        yield store_url
    finally:
        drop_keyspace(session, keyspace)


def which(binary: str) -> str:
    """The path of a reference server's binary, or BenchError saying it is not installed (bench/run installs it)."""
    path = shutil.which(binary)
    if path is None:
        raise BenchError(f"{binary} is not installed (bench/run installs it with apt-get)")
    return path


RETRY_503_FOR_S = 120


def post_until_accepted(
    connection: http.client.HTTPConnection, path: str, body: bytes, headers: dict, accepted: int
) -> int:
    """POST like a well-behaved sender: a 503 (the gateway's backpressure) is retried for at most
    RETRY_503_FOR_S; any other answer than ``accepted`` fails the run. Returns the retries."""
    deadline = time.monotonic() + RETRY_503_FOR_S
    retried = 0
    while True:
        connection.request("POST", path, body, headers)
        response = connection.getresponse()
        answer = response.read()
        if response.status == accepted:
            return retried
        if response.status != 503 or time.monotonic() > deadline:
            raise BenchError(f"POST {path} answered {response.status}: {answer[:300]!r}")
        retried += 1
        time.sleep(0.2)


def run_part_alone(run, description: str, argv: list[str] | None = None) -> None:
    """``python -m bench.<part>``: one suite part on its own Cassandra (or ``--cassandra``)."""
    import argparse
    import tempfile

    from bench.report import format_table

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--cassandra", metavar="HOST:PORT", help="use this Cassandra instead of starting one")
    parser.add_argument("--quick", action="store_true", help="small workloads: a smoke run")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="tsgate-bench-part-"))
    try:
        with cassandra(args.cassandra, workdir / "cassandra") as (host, port, _):
            print(format_table(run(f"{host}:{port}", workdir, args.quick)))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def react_until_done(run, *args) -> int:
    """Run the coroutine function ``run(*args)`` under the Twisted reactor to its end; 0, or the
    failure's exit status (task.react always ends with sys.exit)."""
    from twisted.internet import defer, task

    try:
        task.react(lambda reactor: defer.ensureDeferred(run(*args)))
    except SystemExit as exit_:
        if exit_.code:
            raise
    return 0


def exit_with(main) -> None:
    """A script's exit: main's status, or 1 with the reason when a check failed (BenchError)."""
    try:
        sys.exit(main())
    except BenchError as error:
        print(f"tsgate bench: FAILED: {error}", file=sys.stderr)
        sys.exit(1)
