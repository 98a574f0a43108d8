"""Query executors: the processes that run the query routes, so that no query stops the gateway.

The serving process checks the credential and hands a compact description of the request
(method, path, arguments, headers, body, principal) to an idle executor over a pipe; the
executor (gateway/app/executor_process.py) runs the query routes on it and sends the answer back
(status, content type, headers, body). An executor runs one query at a time, so the CPU work of
a query (parsing, regex matching, evaluation, encoding) never holds the serving process's GIL.

The serving process enforces, per query:

- the deadline (``--query-timeout``, counted from arrival): a query still running then has its
  executor killed (SIGKILL) and replaced; the client gets 503 (Prometheus's ``timeout``
  envelope on /api/v1/ routes);
- the memory cap (``--query-max-memory-bytes``: the executor's peak resident memory, checked
  every 100 ms and, as the executor reports it with each answer, before the answer is relayed,
  or a MemoryError in it): 422 naming the setting,
  and the executor is replaced;
- the queue bound (``--query-queue``): 429 with Retry-After;
- fairness: a tenant holds at most half of the executors and half of the queue (rounded up),
  and the tenants waiting are served in turn, so one tenant's slow queries leave room for others.
  An executor that ends with a query (killed at the deadline or the memory cap, or dead) keeps
  counting against that query's tenant until its replacement is ready: a tenant whose queries
  all run to the deadline never holds more than its share, even while replacements start.

An executor once killed gets no more work: an answer it sent just before the kill is dropped.
Admin deletes select their series here too (``select_series``), under the same deadline, queue
and fairness as queries.

A client that goes away takes its query out of the queue; a query already running ends (at the
latest at its deadline) and its answer is dropped. docs/security.rst ("Query isolation").
"""

import collections
import io
import logging
import math
import os
import pickle
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import multiprocess
from twisted.internet import defer, error, protocol, reactor
from twisted.internet.task import LoopingCall
from twisted.web.http_headers import Headers

from gateway.app.config import Config
from gateway.core import metrics
from gateway.core.errors import GatewayError, LimitExceeded, Timeout, Unavailable
from gateway.core.model import DEFAULT_TENANT, SeriesKey
from gateway.core.overrides import Overrides
from gateway.http.errors import ErrorAnswer, HTTPError
from gateway.http.server import Response, error_response

log = logging.getLogger(__name__)

REQUEST_FD = 0  # in an executor, requests arrive on stdin
ANSWER_FD = 3  # and answers leave on this descriptor: stdout stays free for anything that prints
MEMORY_CHECK_S = 0.1
RESTART_DELAY_S = 1.0  # before replacing an executor that died before it was ready (a start-up error),
MAX_RESTART_DELAY_S = 30.0  # doubled at each such death in a row, up to this (the store is down for a while)
PRIVATE_HEADERS = {b"authorization", b"proxy-authorization", b"cookie"}  # checked here, never sent on
SOURCE_ROOT = str(Path(__file__).resolve().parents[2])

_LENGTH = struct.Struct(">I")


def frame(message) -> bytes:
    """One message on a pipe: its length, then its pickle (both ends are this code)."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(payload)) + payload


def send_now(writer, data: bytes) -> None:
    """Write ``data`` to a pipe (a Twisted writer; None once closed: nothing to write to) at once:
    Twisted writes at its next turn of the reactor, one more epoll round per message on each side
    of every query. What the pipe does not take now is written as Twisted would, when it drains
    (a pipe that broke: as Twisted would too)."""
    if writer is None:
        return
    writer.write(data)
    if writer.connected:
        writer.doWrite()


class Frames:
    """Splits a byte stream back into the messages ``frame`` made."""

    def __init__(self):
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list:
        self.buffer += data
        messages = []
        while len(self.buffer) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self.buffer)
            end = _LENGTH.size + length
            if len(self.buffer) < end:
                break
            messages.append(pickle.loads(memoryview(self.buffer)[_LENGTH.size : end]))
            del self.buffer[:end]
        return messages


def describe(request) -> dict:
    """What an executor needs of a request to run its route."""
    body = b""
    if not request.body_too_large:
        request.content.seek(0)
        body = request.content.read()
    return {
        "method": request.method,
        "path": request.path,
        "uri": request.uri,
        "args": request.args,
        "headers": [
            (name.lower(), values)
            for name, values in request.requestHeaders.getAllRawHeaders()
            if name.lower() not in PRIVATE_HEADERS
        ],
        "body": body,
        "body_too_large": request.body_too_large,
        "max_body_bytes": request.channel.site.max_body_bytes,
        "principal": getattr(request, "principal", None),
    }


class ExecutedRequest:
    """What the API handlers use of a twisted.web request, rebuilt from ``describe`` in an executor."""

    client_gone = False

    def __init__(self, description: dict):
        self.method = description["method"]
        self.path = description["path"]
        self.uri = description["uri"]
        self.args = description["args"]
        self.requestHeaders = Headers(dict(description["headers"]))  # noqa: N815 (twisted.web's name)
        self.content = io.BytesIO(description["body"])
        self.body_too_large = description["body_too_large"]
        self.channel = SimpleNamespace(site=SimpleNamespace(max_body_bytes=description["max_body_bytes"]))
        self.principal = description["principal"]

    def getHeader(self, name):  # noqa: N802 (twisted.web's name)
        """The last value of a header, as twisted.web gives it: bytes for a bytes name, else text."""
        values = self.requestHeaders.getRawHeaders(name)
        return values[-1] if values else None


class QueueFull(LimitExceeded):
    """Too many queries wait for an executor (--query-queue); counted in its own metric, not
    as a tenant's rate limit."""

    status = 429
    error_type = "unavailable"
    retry_after_s = 1


def _refusal(request, error: GatewayError) -> Response:
    """An answer the serving process gives for a query: Prometheus's envelope on its routes,
    the gateway's ``{"error": ...}`` elsewhere."""
    return error_response(error, request, prometheus=request.path.startswith(b"/api/v1/"))


def _fairness_key(request) -> str:
    """Whom a query counts against in the queue: the credential's tenant, else the tenant its
    headers or query string name, unchecked and without decoding a form body here (the
    executor resolves the tenant by the rules, and answers a mistake in the route's words)."""
    principal = getattr(request, "principal", None)
    if principal is not None:
        return principal.tenant
    named = (
        request.getHeader(b"x-scope-orgid") or request.getHeader(b"x-tenant") or request.args.get(b"tenant", [b""])[-1]
    )
    return named.decode("utf-8", "replace").strip() or DEFAULT_TENANT


class ExecutorRefusal(HTTPError):
    """An error an executor answered a call with (``select_series``), raised in the serving process."""

    def __init__(self, answer: ErrorAnswer):
        super().__init__(answer.status, answer.message, answer.headers, **answer.details)
        self.error_type = answer.error_type


class Job:
    """One query (or call): waiting in its tenant's queue, then running in an executor. Its
    ``answer`` fires with the executor's answer, or fails with the GatewayError it got instead."""

    def __init__(self, request, tenant: str, message: tuple):
        self.request = request
        self.tenant = tenant
        self.message = message
        self.answer: defer.Deferred = defer.Deferred()
        self.executor: Executor | None = None
        self.timer = None

    def finish(self, result) -> None:
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        if not self.answer.called:
            self.answer.callback(result)

    def fail(self, error: GatewayError) -> None:
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        if not self.answer.called:
            self.answer.errback(error)


class Executor(protocol.ProcessProtocol):
    """The serving process's end of one executor process."""

    def __init__(self, pool: "QueryExecutors", index: int, holding: str | None):
        self.pool = pool
        self.index = index
        self.holding = holding  # the tenant whose share this executor's start holds (it replaces one of its)
        self.frames = Frames()
        self.ready = False
        self.job: Job | None = None
        self.kill_reason: str | None = None
        self.pid = 0

    def connectionMade(self):  # noqa: N802 (Twisted's name)
        self.transport.writeToChild(
            REQUEST_FD, frame(("start", self.pool.config, self.index, self.pool.overrides.by_tenant))
        )

    def childDataReceived(self, fd, data):  # noqa: N802 (Twisted's name)
        for message in self.frames.feed(data):
            self.pool.received(self, message)

    def processEnded(self, reason):  # noqa: N802 (Twisted's name)
        self.pool.ended(self, reason.value)

    def run(self, job: Job) -> None:
        self.job = job
        job.executor = self
        metrics.QUERY_RUNNING.inc()
        send_now(self.transport.pipes[REQUEST_FD], frame(job.message))

    def take_job(self) -> Job | None:
        """The query this executor runs, which leaves it (answered, cut or lost); None if idle."""
        job, self.job = self.job, None
        if job is not None:
            metrics.QUERY_RUNNING.dec()
        return job

    def kill(self, reason: str) -> None:
        """SIGKILL: whatever the query is doing, it stops now, and the executor gets no more
        work; ``ended`` replaces it."""
        if self.kill_reason is not None:
            return
        self.kill_reason = reason
        if self in self.pool.idle:
            self.pool.idle.remove(self)
        metrics.QUERY_EXECUTOR_KILLS.labels(reason).inc()
        if self.ready:
            metrics.QUERY_EXECUTORS_READY.dec()
        try:
            self.transport.signalProcess("KILL")
        except error.ProcessExitedAlready:
            pass

    def peak_resident_bytes(self) -> int:
        """The most resident memory the process ever had (VmHWM): a spike between two checks counts."""
        try:
            with open(f"/proc/{self.pid}/status", "rb") as status:
                for line in status:
                    if line.startswith(b"VmHWM:"):
                        return int(line.split()[1]) * 1024
        except (OSError, IndexError, ValueError):  # gone already, or not Linux
            pass
        return 0


class QueryExecutors:
    """The pool of executor processes of one gateway process, with its fair queue."""

    def __init__(self, config: Config, size: int, overrides: Overrides):
        self.config = config
        self.overrides = overrides
        self.size = size
        self.timeout_s = config.query_timeout / 1000
        self.tenant_share = math.ceil(size / 2)
        self.tenant_queue_share = math.ceil(config.query_queue / 2)
        self.executors: set[Executor] = set()
        self.idle: list[Executor] = []
        self.waiting: collections.OrderedDict[str, collections.deque[Job]] = collections.OrderedDict()
        self.queued = 0
        self.running = collections.Counter()  # by tenant
        self.failed_starts = collections.Counter()  # by executor index, in a row
        self.stopping = False
        self.warmed = False  # every executor was ready once: /healthz says "starting" until then
        self._warm_waiters: list[defer.Deferred] = []
        self.memory_watch = LoopingCall(self._check_memory)

    def start(self) -> None:
        """Start every executor at once, in the background: queries wait in the queue meanwhile."""
        for index in range(self.size):
            self._spawn(index, None)
        self.memory_watch.start(MEMORY_CHECK_S, now=False)

    def warm(self, timeout_s: float) -> defer.Deferred:
        """Fire with True once every executor was ready, or with False after ``timeout_s`` (an
        executor that cannot start: the gateway serves anyway, /healthz says why)."""
        if self.warmed:
            return defer.succeed(True)
        waiter: defer.Deferred = defer.Deferred()
        self._warm_waiters.append(waiter)

        def late() -> None:
            if waiter in self._warm_waiters:
                self._warm_waiters.remove(waiter)
                waiter.callback(False)

        reactor.callLater(timeout_s, late)
        return waiter

    def starting(self) -> str | None:
        """Why the gateway cannot answer queries at once yet (None once every executor of the pool
        was ready: a later replacement is no reason): /healthz answers 503 "starting" meanwhile,
        so that a client that waits for it never sends its first query to an empty pool."""
        if self.warmed:
            return None
        ready = sum(executor.ready for executor in self.executors)
        return f"query executors starting: {ready} of {self.size} ready"

    def send_overrides(self) -> None:
        """The per-tenant overrides just reloaded, to every executor (one that starts gets them with
        its start message); an executor takes them between queries or beside a running one."""
        for executor in self.executors:
            if executor.kill_reason is None:
                executor.transport.writeToChild(REQUEST_FD, frame(("overrides", self.overrides.by_tenant)))

    def _spawn(self, index: int, holding: str | None) -> None:
        if self.stopping:
            return
        executor = Executor(self, index, holding)
        path = os.pathsep.join(filter(None, [SOURCE_ROOT, os.environ.get("PYTHONPATH")]))
        process = reactor.spawnProcess(
            executor,
            sys.executable,
            [sys.executable, "-m", "gateway.app.executor_process", str(os.getpid())],
            env=dict(os.environ, PYTHONPATH=path),
            childFDs={REQUEST_FD: "w", 1: 1, 2: 2, ANSWER_FD: "r"},
        )
        executor.pid = process.pid
        self.executors.add(executor)

    async def run(self, request) -> Response:
        """The route handler of every query route: the answer an executor gives for ``request``."""
        try:
            return await self._submit(request, _fairness_key(request), lambda: ("query", describe(request)))
        except GatewayError as error:
            return _refusal(request, error)

    async def select_series(self, request, kind: str, tenant: str, patterns: list[str]) -> list[SeriesKey]:
        """The series an admin delete of ``tenant`` selects (``kind``: "prometheus" selectors or
        "graphite" paths), selected in an executor under the deadline, queue and fairness of
        queries; a GatewayError (the selection's own refusal included) when there is no answer."""
        return await self._submit(request, tenant, lambda: ("select", kind, tenant, patterns))

    async def _submit(self, request, tenant: str, message: Callable[[], tuple]):
        """Queue the message ``message()`` makes (once admitted: a refused request's body is not
        copied) for an executor on behalf of ``request``; the executor's answer."""
        if self.stopping:
            raise Unavailable("the gateway is stopping")
        if self.queued >= self.config.query_queue or len(self.waiting.get(tenant, ())) >= self.tenant_queue_share:
            metrics.QUERY_QUEUE_REJECTED.inc()
            raise QueueFull("too many queries are waiting for a query executor (--query-queue); retry later")
        job = Job(request, tenant, message())
        job.timer = reactor.callLater(self.timeout_s, self._expire, job)
        self.waiting.setdefault(tenant, collections.deque()).append(job)
        self._count_queued(1)
        request.notifyFinish().addErrback(lambda _: self._abandon(job))
        self._dispatch()
        return await job.answer

    def _count_queued(self, change: int) -> None:
        self.queued += change
        metrics.QUERY_QUEUED.inc(change)

    def _dispatch(self) -> None:
        """Give idle executors the next jobs: tenants in turn, none past its share."""
        while self.idle:
            job = self._next_job()
            if job is None:
                return
            self.running[job.tenant] += 1
            self.idle.pop().run(job)

    def _next_job(self) -> Job | None:
        for tenant, jobs in self.waiting.items():  # the tenant served longest ago first
            if self.running[tenant] < self.tenant_share:
                job = jobs.popleft()
                if jobs:
                    self.waiting.move_to_end(tenant)
                else:
                    del self.waiting[tenant]
                self._count_queued(-1)
                return job
        return None

    def _release(self, tenant: str) -> None:
        """One query of ``tenant`` left its executor (tenants without any are forgotten)."""
        self.running[tenant] -= 1
        if not self.running[tenant]:
            del self.running[tenant]

    def _unqueue(self, job: Job) -> bool:
        """Take a job that has not started out of its queue; False when it is not there."""
        jobs = self.waiting.get(job.tenant)
        if jobs is None or job not in jobs:
            return False
        jobs.remove(job)
        if not jobs:
            del self.waiting[job.tenant]
        self._count_queued(-1)
        return True

    def _abandon(self, job: Job) -> None:
        """The client went away: a waiting job leaves the queue (its answer is never sent)."""
        if self._unqueue(job):
            job.fail(Unavailable("the client went away"))

    def _expire(self, job: Job) -> None:
        seconds = f"{self.timeout_s:g}s"
        if job.executor is not None:
            job.executor.kill("timeout")
        else:
            self._unqueue(job)
        job.fail(Timeout(f"query timed out: it ran past --query-timeout ({seconds})"))

    def _memory_refusal(self) -> LimitExceeded:
        limit = self.config.query_max_memory_bytes
        return LimitExceeded(f"the query needed more memory than --query-max-memory-bytes ({limit} bytes) allows")

    def received(self, executor: Executor, message: tuple) -> None:
        kind = message[0]
        if executor.kill_reason is not None:
            return  # sent before the kill (an answer just past the deadline): ``ended`` handles its job
        if kind == "ready":
            executor.ready = True
            self.failed_starts[executor.index] = 0
            metrics.QUERY_EXECUTORS_READY.inc()
            if executor.holding is not None:
                self._release(executor.holding)  # the share its predecessor's query held
                executor.holding = None
            if not self.warmed and sum(e.ready for e in self.executors) >= self.size:
                self.warmed = True
                waiting, self._warm_waiters = self._warm_waiters, []
                for waiter in waiting:
                    waiter.callback(True)
            self.idle.append(executor)
        elif kind == "memory" or message[1] > self.config.query_max_memory_bytes:
            executor.kill("memory")  # a MemoryError, or past the cap between two checks: ``ended`` answers 422
        else:
            job = executor.take_job()
            assert job is not None, f"executor {executor.index} answered {kind!r} without a query"
            self._release(job.tenant)
            if kind == "answer":
                status, content_type, headers, body = message[2:]
                job.finish(Response(status, body, content_type, headers))
            elif kind == "selected":
                job.finish(message[2])
            else:  # "refused"
                job.fail(ExecutorRefusal(message[2]))
            self.idle.append(executor)
        self._dispatch()

    def ended(self, executor: Executor, reason) -> None:
        """An executor process ended (killed, or died): its query is answered, and it is replaced."""
        self.executors.discard(executor)
        if "PROMETHEUS_MULTIPROC_DIR" in os.environ:  # --workers: its live gauges leave the sums
            multiprocess.mark_process_dead(executor.pid)
        if executor in self.idle:
            self.idle.remove(executor)
        if executor.ready and executor.kill_reason is None:
            metrics.QUERY_EXECUTORS_READY.dec()
        job = executor.take_job()
        holding = executor.holding  # one that died starting passes its hold on to the next
        if job is not None:
            holding = job.tenant  # released once the replacement is ready
            if executor.kill_reason == "memory":
                job.fail(self._memory_refusal())
            else:
                job.fail(Unavailable("the query executor running this query died"))
        delay = 0.0
        if not executor.ready:
            self.failed_starts[executor.index] += 1
            delay = min(RESTART_DELAY_S * 2 ** (self.failed_starts[executor.index] - 1), MAX_RESTART_DELAY_S)
        if executor.kill_reason is None and not self.stopping:
            metrics.QUERY_EXECUTOR_KILLS.labels("died").inc()
            log.warning(
                "query executor %d ended %s; starting another in %gs",
                executor.index,
                f"unexpectedly ({reason})" if executor.ready else "before it was ready",
                delay,
            )
        reactor.callLater(delay, self._spawn, executor.index, holding)
        self._dispatch()

    def _check_memory(self) -> None:
        limit = self.config.query_max_memory_bytes
        for executor in list(self.executors):
            if executor.ready and executor.kill_reason is None and executor.peak_resident_bytes() > limit:
                executor.kill("memory")

    def stop(self) -> int:
        """Kill every executor; what waits or runs gets 503 (how many: returned). Called at
        shutdown, after the drain."""
        self.stopping = True
        waiting, self._warm_waiters = self._warm_waiters, []
        for waiter in waiting:
            waiter.callback(False)
        if self.memory_watch.running:
            self.memory_watch.stop()
        cut = [job for jobs in self.waiting.values() for job in jobs]
        self._count_queued(-self.queued)
        self.waiting.clear()
        for executor in list(self.executors):
            job = executor.take_job()
            if job is not None:
                cut.append(job)
            executor.kill("shutdown")
        for job in cut:
            job.fail(Unavailable("the gateway is stopping"))
        return len(cut)
