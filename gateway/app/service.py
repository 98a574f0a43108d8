"""The running gateway: starts what gateway.app.components builds for it (target ``serve``), and stops it cleanly.

Shutdown order (SIGTERM or SIGINT): stop accepting connections; close the open ones (an HTTP
connection once the request under way is answered, carbon ones at once: what they sent is already
queued); wait for accepted writes to reach the store and for a running downsample round, at most
``--shutdown-timeout``, then log what is left; answer 503 to the queries still running or waiting
(their executors are killed) and give those answers ANSWER_GRACE_S to leave before closing what is
still open; close the store (and Redis), waiting until CLOSE_S after the grace (at least
MIN_CLOSE_S); exit 0 at once, without waiting for threads still busy with work the shutdown cut. Nothing is acknowledged before the store has
it, so what is left at the timeout was never acknowledged. What is accepted is bounded by what the
store takes in components.FLUSH_SHARE of the timeout (writes in flight and the carbon backlog,
IngestPipeline.flushable_samples), so the drain fits in it.

So a gateway process ends within ``--shutdown-timeout`` + ANSWER_GRACE_S + CLOSE_S, plus however
late the reactor is to notice the timeout. A reactor held longer by one piece of work (the
admission of a very large write) cannot run those timers at all: a watchdog thread ends the
process OVERDUE_S past the timeout whatever the reactor does. Under ``--workers`` the supervisor
kills a worker still running ``workers.STOP_MARGIN_S`` past the timeout, so every process ends
within the timeout + SHUTDOWN_MARGIN_S (docs/configuration.rst).
"""

import ctypes
import dataclasses
import gc
import logging
import os
import signal
import socket
import sys
import threading

from twisted.internet import defer, reactor
from twisted.internet.error import CannotListenError
from twisted.internet.task import LoopingCall

from gateway import __version__
from gateway.app.components import Components, redact
from gateway.app.config import Config
from gateway.app.workers import CONFIG_ERROR_EXIT, CannotListen, Worker, end_process
from gateway.core.overrides import OverridesWatch

log = logging.getLogger(__name__)


ANSWER_GRACE_S = 0.5  # for the 503s of queries cut by the shutdown to be written before connections close
CLOSE_S = 1.0  # for the store and Redis to close
MIN_CLOSE_S = 0.2  # however late the shutdown is
OVERDUE_S = 2.0  # past --shutdown-timeout, the watchdog ends a stop the reactor could not finish
SHUTDOWN_MARGIN_S = 3.0  # past --shutdown-timeout, the latest any process of the gateway ends
EXECUTORS_START_WAIT_S = 30.0  # the longest the start waits for the query executors before it listens


class Gateway:
    """One gateway process. ``inherited`` maps listener names (``Config.listeners``) to sockets
    already bound by a ``--workers`` supervisor; without it the gateway binds its own."""

    def __init__(self, config: Config, inherited: dict[str, int] | None = None):
        self.config = config
        self.inherited = inherited or {}
        self.components = Components(config).target("serve")
        get = self.components.get
        self.store = get("store")
        self.overrides = get("overrides")
        self.shared_seen = get("shared_seen")
        self.pipeline = get("pipeline")
        self.downsample = get("downsample")
        self.executors = get("executors")
        self.graphs = get("graphs")
        self.connections = get("connections")
        self.site = get("site")
        self.graphite = get("graphite_ingest")
        self.handlers = get("listeners")  # by listener name
        self.overrides_watch = OverridesWatch(self.overrides, self._overrides_reloaded)
        self.ports = []
        self.downsample_loop = LoopingCall(self._downsample) if "downsample" in config.role_set else None
        self.downsample_stopped = defer.succeed(None)  # fires once the loop stopped and its last round ended
        self.serving = False  # start() completed: a stop after a failed start says nothing (the error said it)
        self.watchdog = Watchdog(config.shutdown_timeout / 1000 + OVERDUE_S)

    async def start(self) -> None:
        await self.components.start_store()
        if self.executors is not None:
            self.executors.start()  # after the store: its schema exists when they open it
            # listen once they can take queries: a client (or, under --workers, the worker's share
            # of the connections) never waits for an executor to start
            if not await self.executors.warm(EXECUTORS_START_WAIT_S):
                if self.executors.stopping:
                    return  # stopped while starting
                log.warning("%s after %.0f s; serving anyway", self.executors.starting(), EXECUTORS_START_WAIT_S)
        if self.shared_seen is not None:
            self.shared_seen.start()
        self.overrides_watch.start()
        config = self.config
        if self.downsample_loop is not None:
            self.downsample_stopped = self.downsample_loop.start(config.downsample_interval / 1000, now=False)
        listeners = config.listeners
        if "ingest" not in config.role_set:
            log.info("roles %s: no carbon listeners", config.roles)
        for name, address in listeners.items():
            self.ports.append(self._listen(name, address, self.handlers[name]))
        log.info(
            "tsgate %s: HTTP on %s, graphite %s, graphite-udp %s, pickle %s, store %s, redis %s",
            __version__,
            _address(listeners.get("http")),
            _address(listeners.get("graphite")),
            _address(listeners.get("graphite-udp")),
            _address(listeners.get("pickle")),
            redact(config.store_url),
            redact(config.redis) or "none (in-memory cache only)",
        )
        self.serving = True

    def _listen(self, name: str, address: tuple[str, int], handler):
        """Bind ``address``, or under ``--workers N`` adopt the socket the supervisor bound.

        Twisted duplicates an adopted descriptor, so the inherited one is closed here.
        """
        udp = name == "graphite-udp"
        fd = self.inherited.get(name)
        if fd is None:
            listen = reactor.listenUDP if udp else reactor.listenTCP
            try:
                return listen(address[1], handler, interface=address[0])
            except CannotListenError as error:
                raise CannotListen(name, *address, error.socketError.strerror) from None
        with socket.socket(fileno=fd) as inherited:
            adopt = reactor.adoptDatagramPort if udp else reactor.adoptStreamPort
            return adopt(inherited.fileno(), inherited.family, handler)

    async def stop(self) -> None:
        timeout_s = self.config.shutdown_timeout / 1000
        self.watchdog.arm()  # at the signal already, unless the stop has another cause
        say = log.info if self.serving else log.debug
        say(
            "stopping: no new connections; answering open requests and flushing accepted writes (at most %gs)",
            timeout_s,
        )
        await defer.gatherResults([defer.maybeDeferred(port.stopListening) for port in self.ports])
        self.overrides_watch.stop()
        if self.downsample_loop is not None and self.downsample_loop.running:
            self.downsample_loop.stop()
        finished = defer.gatherResults(
            [self.connections.close_all(), self.graphite.drain(), self.pipeline.drain(), self.downsample_stopped]
        )
        stopping = reactor.seconds()
        drained = await _within(finished, timeout_s)
        if not drained:
            log.warning(
                "shutdown timeout (%gs, --shutdown-timeout) reached: closing %d connections still open"
                " (queries still running are answered 503); not yet stored: %d carbon samples, %d samples"
                " in store writes under way; downsample round %s",
                timeout_s,
                len(self.connections.open),
                self.graphite.pending,
                self.pipeline.inflight_samples,
                "still running (redone after restart)" if not self.downsample_stopped.called else "done",
            )
        cut = self.executors.stop() if self.executors is not None else 0  # queries answered 503
        if not drained and not (cut and await _within(finished, ANSWER_GRACE_S)):
            self.connections.abort_all()
        self.graphs.close()
        closing = reactor.seconds()
        closed = [self.store.close()]
        if self.shared_seen is not None:
            closed.append(self.shared_seen.stop())
        # Until CLOSE_S after the grace would end had every timer fired on time: an event loop
        # late at the timeout (a slice of work under way) takes it from this wait, not from the bound.
        close_s = max(MIN_CLOSE_S, stopping + timeout_s + ANSWER_GRACE_S + CLOSE_S - reactor.seconds())
        if not await _within(defer.gatherResults(closed, consumeErrors=True), close_s):
            log.warning("the store did not close within %.1fs: exiting without it", close_s)
        say("drained in %.2fs, store closed in %.2fs", closing - stopping, reactor.seconds() - closing)
        say("stopped")

    def _overrides_reloaded(self) -> None:
        if self.executors is not None:
            self.executors.send_overrides()

    async def _downsample(self) -> None:
        """One round of the downsample role; a failed round is logged and retried next time."""
        try:
            await self.downsample.run_once()
        except Exception as error:
            log.warning("downsample round failed (%s); retrying next round", error)


class Watchdog:
    """Ends the process ``seconds`` after it is armed (at the stop signal), from a thread of its
    own: the bound on a stop holds even while one piece of work holds the reactor, which then
    runs neither the stop nor its timers. What was acknowledged is stored already."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.timer: threading.Timer | None = None

    def arm(self) -> None:
        if self.timer is None:
            self.timer = threading.Timer(self.seconds, self._overdue)
            self.timer.daemon = True
            self.timer.start()

    def arm_on_stop_signals(self) -> None:
        """Arm at SIGTERM or SIGINT, in the signal handler itself (Twisted's handler, called
        next, only asks the reactor to stop when it next gets a turn)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            installed = signal.getsignal(signum)
            if callable(installed):
                signal.signal(signum, self._arming(installed))

    def _arming(self, handler):
        def arm_then_handle(signum, frame):
            self.arm()
            handler(signum, frame)

        return arm_then_handle

    def _overdue(self) -> None:
        log.warning("still stopping %gs after the stop signal: exiting now", self.seconds)
        end_process(0)


def _within(deferred: defer.Deferred, seconds: float) -> defer.Deferred:
    """Fires True once ``deferred`` fired (whatever its result), or False after ``seconds``.
    ``deferred`` itself is left alone: cancelling the drains would break their waiters."""
    outcome = defer.Deferred()
    timer = reactor.callLater(seconds, outcome.callback, False)

    def fired(_):
        if timer.active():
            timer.cancel()
            outcome.callback(True)

    deferred.addBoth(fired)
    return outcome


def _address(hostport: tuple[str, int] | None) -> str:
    return f"{hostport[0]}:{hostport[1]}" if hostport else "off"


REACTOR_GIL_WAIT_S = 0.001
# glibc's allocator: arrays up to 4 MiB come from the heap, and up to 16 MiB of freed heap is kept.
ARRAYS_FROM_HEAP_BYTES = 4 << 20
HEAP_KEPT_BYTES = 16 << 20
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
# A young generation of 10,000 objects (Python's: 700); the older two as Python's.
COLLECTOR_THRESHOLDS = (10_000, 10, 10)


def run(config: Config, worker: Worker | None = None) -> int:
    """Run until a signal stops the reactor, then end the process: 0 after a clean stop, 1 if
    start-up failed; CONFIG_ERROR_EXIT is returned for a bad setting.

    As a ``--workers`` worker: only worker 0 keeps the downsample role (see gateway.app.workers),
    the listening sockets come from the supervisor, the supervisor is told once the gateway
    has started, and the worker stops by itself (draining as on SIGTERM) if the supervisor dies.
    """
    if worker is not None and worker.index != 0:
        config = dataclasses.replace(config, roles=",".join(sorted(config.role_set - {"downsample"})))
    try:
        gateway = Gateway(config, worker.listeners if worker is not None else None)
    except ValueError as error:
        log.error("bad setting: %s", error)
        return CONFIG_ERROR_EXIT
    outcome = {"code": 0}

    def started_or_failed():
        # Registered before starting: whatever start() got running (the store's thread pools
        # above all, which would keep the process alive after the reactor stops) is stopped
        # the same way after a failed start as after SIGTERM.
        reactor.addSystemEventTrigger("before", "shutdown", lambda: defer.ensureDeferred(gateway.stop()))
        gateway.watchdog.arm_on_stop_signals()  # Twisted's handlers are installed by now
        deferred = defer.ensureDeferred(gateway.start())

        def failed(failure):
            log.error("could not start: %s", failure.getErrorMessage())
            outcome["code"] = 1
            reactor.stop()

        def started(_):
            if worker is not None:
                worker.announce_ready()
                LoopingCall(_stop_if_orphaned, worker.supervisor_pid).start(1.0, now=False)

        deferred.addCallbacks(started, failed)

    reactor.callWhenRunning(started_or_failed)
    # A process started in the background by a non-interactive shell inherits SIGINT ignored,
    # and Twisted then leaves it so; SIGINT is documented to stop the gateway like SIGTERM.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Render and encoding work runs in threads; a thread waiting for the GIL gets it after this
    # interval, so the reactor thread waits about 1 ms (not Python's 5 ms) each time it wakes up.
    sys.setswitchinterval(REACTOR_GIL_WAIT_S)
    settle_collector()
    tune_allocator()
    reactor.run()
    end_process(outcome["code"])  # stopped: what was acknowledged is stored


def settle_collector() -> None:
    """Called once start-up is done. The modules and objects built so far live as long as the
    process: frozen, they stay out of the collector's full passes. The thresholds then make full
    passes, which hold the GIL up to 80 ms while a large request's objects pile up, rarer: one
    every million allocations instead of every 70,000. They cost no memory because the store's
    requests leave no cyclic garbage (gateway/store/cassandra_requests.py; docs/performance-log.rst)."""
    gc.freeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


def tune_allocator() -> None:
    """Keep the memory of a query's arrays for the next one. By default glibc maps every array
    over 128 KiB afresh and hands freed memory back to the system at once, so each temporary of
    a query over 1000 series (a (series, steps) array is 0.5 MB) page-faulted on every 4 KiB:
    1,350 faults and about 15 % of a churn query's CPU (docs/performance-log.rst). Arrays up to
    ARRAYS_FROM_HEAP_BYTES now come from the heap and HEAP_KEPT_BYTES of freed heap is kept (an
    arena each thread that computes). Not glibc (musl): nothing to tune."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, ARRAYS_FROM_HEAP_BYTES)
    mallopt(M_TRIM_THRESHOLD, HEAP_KEPT_BYTES)


def _stop_if_orphaned(supervisor_pid: int) -> None:
    """A worker whose supervisor died (SIGKILL) would hold the ports forever: it stops instead."""
    if os.getppid() != supervisor_pid and reactor.running:
        log.warning("supervisor (pid %d) is gone: stopping", supervisor_pid)
        reactor.stop()
