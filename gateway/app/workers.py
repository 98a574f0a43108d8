"""``tsgate serve --workers N``: one supervisor process and N worker processes sharing its sockets.

The supervisor binds every listening socket itself (so a port already in use fails once, here,
with exit 1 and a log line naming the address), then starts each worker as a fresh interpreter
(``python -m gateway.app.cli serve`` with the same settings; no fork, so no reactor or thread state
is copied) that inherits the sockets and adopts them into its own reactor. Each worker has its
own reactor, store connection, caches and tenant limits: with N workers a tenant gets up to N
times ``--tenant-max-samples-per-second`` and ``--tenant-max-active-series``. The kernel hands
each new connection to whichever worker accepts it first, so load spreads by connection, not by
request: a few long-lived keep-alive connections may all land on one worker.

Worker 0 starts alone first (it creates or upgrades the SQLite schema, which is not safe to race,
and an unreachable store fails once instead of N times); the others start once it is ready.
Only worker 0 runs the downsample loop: without Redis partition locks several loops would roll
up the same slots twice, and one loop keeps the rule the same with or without Redis.

A worker that dies is logged (pid, exit code or signal) and restarted, at most once a second per
worker. If worker 0's first start fails and it said why (exit 1: ``could not start: ...``, or
``CONFIG_ERROR_EXIT``: a bad setting), the supervisor exits with its code at once and says
nothing more: the same settings would fail again, and the worker's one line is the whole story
(an unreachable store, a data dir that is a file). A worker that exits before it is ready later
counts as a start-up failure; after ``STARTUP_ATTEMPTS`` of those in a row (a worker becoming
ready resets the count) the supervisor stops the others and exits 1: the worker's own log lines
above say why. A worker that exits with ``CONFIG_ERROR_EXIT`` is never retried.
SIGTERM or SIGINT to
the supervisor sends SIGTERM to every worker, waits for each to drain and exit (killing one
still running ``STOP_MARGIN_S`` past ``--shutdown-timeout``: a worker ends well before, see
gateway.app.service), then exits 0. SIGHUP to the
supervisor is passed on to every worker (each reloads ``--overrides``).

/metrics of any worker shows the sum of all (prometheus-client's multiprocess mode, files in a
temporary directory that the supervisor creates and removes; see gateway.core.metrics).
"""

import dataclasses
import json
import logging
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import NoReturn

from prometheus_client import multiprocess

from gateway.app.config import Config

log = logging.getLogger(__name__)

ENVIRONMENT_KEY = "TSGATE_WORKER"
STARTUP_ATTEMPTS = 3
CONFIG_ERROR_EXIT = 2  # what a worker exits with on a bad setting (gateway.app.service.run)
RESTART_INTERVAL_S = 1.0
LISTEN_BACKLOG = 50  # Twisted's listenTCP default, as with --workers 1
STOP_MARGIN_S = 2.5  # past --shutdown-timeout (a worker's own watchdog ends it 2 s past it: service.OVERDUE_S)


@dataclasses.dataclass(frozen=True)
class Worker:
    """What a worker process learns from its supervisor (through ``TSGATE_WORKER``)."""

    index: int
    supervisor_pid: int
    listeners: dict[str, int]  # listener name (Config.listeners) -> inherited socket descriptor
    ready_fd: int

    @classmethod
    def from_environment(cls) -> "Worker | None":
        """The worker's identity, or None in a process not started by a supervisor."""
        text = os.environ.pop(ENVIRONMENT_KEY, None)
        return cls(**json.loads(text)) if text else None

    def announce_ready(self) -> None:
        """Tell the supervisor the gateway started: one byte on the pipe, then close it."""
        os.write(self.ready_fd, b"R")
        os.close(self.ready_fd)


@dataclasses.dataclass
class _Slot:
    """Worker ``index``: its current process, if any, and whether that process is ready."""

    index: int
    process: subprocess.Popen | None = None
    ready_pipe: int | None = None
    ready: bool = False
    started_at: float = float("-inf")


class CannotListen(Exception):
    """A listener's address cannot be bound; the message names the address and the setting."""

    def __init__(self, name: str, host: str, port: int, reason: str):
        super().__init__(f"cannot listen on {host}:{port} (--{name}): {reason}")


def bind_listeners(config: Config) -> dict[str, socket.socket]:
    """Bind every configured address (``Config.listeners``); CannotListen names the one that failed."""
    bound = {}
    for name, (host, port) in config.listeners.items():
        try:
            bound[name] = _bind(host, port, udp=name == "graphite-udp")
        except OSError as error:
            for sock in bound.values():
                sock.close()
            raise CannotListen(name, host, port, error.strerror) from None
    return bound


def _bind(host: str, port: int, udp: bool) -> socket.socket:
    """A socket bound as Twisted's listenTCP/listenUDP would bind it, and non-blocking (Twisted
    requires that of adopted sockets; the flag is shared by every process holding the socket,
    and the supervisor never reads from it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM if udp else socket.SOCK_STREAM)
    try:
        if not udp:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        if not udp:
            sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class Supervisor:
    """Starts, watches, restarts and stops the worker processes (see the module docstring)."""

    def __init__(self, config: Config, flags: list[str], sockets: dict[str, socket.socket], metrics_dir: str):
        self.flags = flags
        self.sockets = sockets
        self.metrics_dir = metrics_dir
        self.slots = [_Slot(index) for index in range(config.worker_count)]
        self.selector = selectors.DefaultSelector()
        self.startup_failures = 0
        self.config_error = False
        self.first_start_failed: int | None = None  # worker 0's exit code if its first start failed
        self.first_ready = False  # workers 1..N-1 wait for worker 0's first start
        self.stop_signal = None
        self.stop_wait_s = config.shutdown_timeout / 1000 + STOP_MARGIN_S

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._request_stop)
        signal.signal(signal.SIGHUP, self._pass_on)
        code = self._supervise()
        self._stop_workers()
        return code

    def _request_stop(self, signum, frame) -> None:
        self.stop_signal = signum

    def _pass_on(self, signum, frame) -> None:
        """SIGHUP: every ready worker reloads its overrides file (one still starting reads it anyway)."""
        for slot in self.slots:
            if slot.ready and slot.process is not None and slot.process.poll() is None:
                slot.process.send_signal(signum)

    def _supervise(self) -> int:
        """Run until a stop signal (0) or too many start-up failures in a row (1)."""
        while True:
            for slot in self.slots:
                due = slot.started_at + RESTART_INTERVAL_S <= time.monotonic()
                if slot.process is None and due and (slot.index == 0 or self.first_ready):
                    self._start(slot)
            for key, _ in self.selector.select(timeout=0.1):
                self._read_ready_pipe(key.data)
            if self.stop_signal is not None:  # before reaping: workers may be exiting on the same signal
                log.info("%s: stopping %d workers", signal.Signals(self.stop_signal).name, self._running())
                return 0
            for slot in self.slots:
                if slot.process is not None and slot.process.poll() is not None:
                    self._reap(slot)
            if self.first_start_failed is not None:
                return self.first_start_failed
            if self.config_error:
                log.error("giving up: a worker refused its settings (its error is above); not retried")
                return 1
            if self.startup_failures >= STARTUP_ATTEMPTS:
                log.error(
                    "giving up: workers failed to start %d times in a row (their errors are above)",
                    self.startup_failures,
                )
                return 1

    def _start(self, slot: _Slot) -> None:
        read_end, write_end = os.pipe()
        listeners = {name: sock.fileno() for name, sock in self.sockets.items()}
        identity = {"index": slot.index, "supervisor_pid": os.getpid(), "listeners": listeners, "ready_fd": write_end}
        environment = dict(
            os.environ, PROMETHEUS_MULTIPROC_DIR=self.metrics_dir, **{ENVIRONMENT_KEY: json.dumps(identity)}
        )
        # A process group of its own: a terminal's Ctrl-C reaches the supervisor only, which
        # then stops the workers in order.
        slot.process = subprocess.Popen(
            [sys.executable, "-m", "gateway.app.cli", "serve", *self.flags],
            env=environment,
            pass_fds=(*listeners.values(), write_end),
            process_group=0,
        )
        os.close(write_end)
        slot.ready_pipe, slot.ready, slot.started_at = read_end, False, time.monotonic()
        self.selector.register(read_end, selectors.EVENT_READ, slot)
        log.debug("worker %d started (pid %d)", slot.index, slot.process.pid)

    def _read_ready_pipe(self, slot: _Slot) -> None:
        """A byte: the worker is ready. End of file: it exited first (``_reap`` tells)."""
        if os.read(slot.ready_pipe, 1):
            if not self.first_ready:  # said once serving, so that a failed start is one line
                addresses = ", ".join(f"{name} {_sockname(sock)}" for name, sock in self.sockets.items())
                log.info("supervisor: %d workers on %s", len(self.slots), addresses)
            slot.ready = self.first_ready = True
            self.startup_failures = 0
            log.info("worker %d (pid %d) ready", slot.index, slot.process.pid)
        self._close_ready_pipe(slot)

    def _close_ready_pipe(self, slot: _Slot) -> None:
        if slot.ready_pipe is not None:
            self.selector.unregister(slot.ready_pipe)
            os.close(slot.ready_pipe)
            slot.ready_pipe = None

    def _reap(self, slot: _Slot) -> None:
        """Log a worker that exited unexpectedly and free its slot for a restart."""
        if slot.ready_pipe is not None:
            self._read_ready_pipe(slot)  # it may have become ready just before dying
        pid, how = slot.process.pid, _exit_status(slot.process.returncode)
        multiprocess.mark_process_dead(pid, self.metrics_dir)
        if slot.ready:
            log.error("worker %d (pid %d) died (%s); restarting it", slot.index, pid, how)
        elif not self.first_ready and slot.process.returncode in (1, CONFIG_ERROR_EXIT):
            self.first_start_failed = slot.process.returncode
            log.debug("worker %d (pid %d) failed to start (%s): giving up", slot.index, pid, how)
        else:
            self.startup_failures += 1
            self.config_error = slot.process.returncode == CONFIG_ERROR_EXIT
            log.error("worker %d (pid %d) failed to start (%s)", slot.index, pid, how)
        slot.process, slot.ready = None, False

    def _running(self) -> int:
        return sum(slot.process is not None for slot in self.slots)

    def _stop_workers(self) -> None:
        """SIGTERM every worker and wait for each to drain and exit; one still running
        ``STOP_MARGIN_S`` after its ``--shutdown-timeout`` is killed (and logged).

        The supervisor's copies of the sockets are closed first, so once the workers have
        stopped listening, new connections are refused instead of waiting in a backlog.
        """
        for sock in self.sockets.values():
            sock.close()
        for slot in self.slots:
            if slot.process is not None:
                slot.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_wait_s
        for slot in self.slots:
            if slot.process is not None:
                try:
                    code = slot.process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.error(
                        "worker %d (pid %d) still running %gs after SIGTERM: killing it",
                        slot.index,
                        slot.process.pid,
                        self.stop_wait_s,
                    )
                    slot.process.kill()
                    code = slot.process.wait()
                self._close_ready_pipe(slot)
                multiprocess.mark_process_dead(slot.process.pid, self.metrics_dir)
                level = logging.INFO if code == 0 else logging.WARNING
                log.log(level, "worker %d (pid %d) stopped (%s)", slot.index, slot.process.pid, _exit_status(code))


def _exit_status(returncode: int) -> str:
    return f"exit code {returncode}" if returncode >= 0 else f"killed by {signal.Signals(-returncode).name}"


def supervise(config: Config, flags: list[str]) -> int:
    """Bind the sockets, run ``config.worker_count`` workers until SIGTERM/SIGINT; the exit code."""
    try:
        sockets = bind_listeners(config)
    except CannotListen as error:
        log.error("could not start: %s", error)
        return 1
    metrics_dir = tempfile.mkdtemp(prefix="tsgate-metrics-")
    try:
        code = Supervisor(config, flags, sockets, metrics_dir).run()
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
    end_process(code)


def end_process(code: int) -> NoReturn:
    """Exit now, once the logs and what was printed are written: no wait for threads still busy with work a shutdown
    cut, nor for the interpreter's teardown (the Cassandra driver's exit hooks alone took
    0.6-1.4 s), so a stop ends within its bound (gateway.app.service)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or its reader gone
            pass
    os._exit(code)


def _sockname(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
