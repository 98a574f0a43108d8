"""A query executor process (gateway/app/executors.py has the serving process's end): it builds
the query routes (gateway.app.components, target ``query-executor``), then runs one query, or one
delete's selection, at a time and sends each answer back on its pipe."""

import ctypes
import logging
import os
import resource
import signal
import sys
from types import SimpleNamespace

from twisted.internet import defer, protocol, reactor, stdio
from twisted.internet.interfaces import IHalfCloseableProtocol
from zope.interface import implementer

from gateway.app.components import Components, StoreStartError
from gateway.app.config import Config
from gateway.app.executors import ANSWER_FD, REQUEST_FD, ExecutedRequest, Frames, frame, send_now
from gateway.app.logs import setup_logging
from gateway.app.service import settle_collector, tune_allocator
from gateway.core import blocking
from gateway.core.overrides import Overrides
from gateway.http.errors import error_answer
from gateway.store.contract import StoreUnavailable

log = logging.getLogger(__name__)


@implementer(IHalfCloseableProtocol)
class ExecutorSide(protocol.Protocol):
    """The executor process's end of the pipe: the first message starts it, then one query at a time."""

    def __init__(self):
        self.frames = Frames()
        self.router = None
        self.selection = None
        self.overrides: Overrides | None = None

    def dataReceived(self, data):  # noqa: N802 (Twisted's name)
        for message in self.frames.feed(data):
            if message[0] == "start":
                defer.ensureDeferred(self._start(*message[1:])).addErrback(self._failed_start)
            elif message[0] == "overrides":
                self.overrides.use(message[1])
            elif message[0] == "select":
                defer.ensureDeferred(self._select(*message[1:]))
            else:
                defer.ensureDeferred(self._answer(message[1]))

    def readConnectionLost(self):  # noqa: N802 (Twisted's name)
        """The serving process closed the pipe (it stopped or died): nothing more to do."""
        if reactor.running:
            reactor.stop()

    def writeConnectionLost(self):  # noqa: N802 (Twisted's name)
        self.readConnectionLost()

    async def _start(self, config: Config, index: int, overrides: dict[str, dict]) -> None:
        """Build the query routes, with the gateway's per-tenant overrides (it sends each reload)."""
        setup_logging(config.log_level, f"query executor {index} pid {os.getpid()}")
        self.overrides = Overrides(config)
        self.overrides.use(overrides)
        components = Components(config, given={"overrides": self.overrides}).target("query-executor")
        await components.start_store()
        self.router = components.get("executor_router")
        self.selection = components.get("selection")
        self.transport.write(frame(("ready",)))

    def _failed_start(self, failure) -> None:
        """The store unreachable is one line (the pool retries with backoff); anything else is a bug."""
        if failure.check(StoreStartError) and isinstance(failure.value.__cause__, StoreUnavailable):
            log.warning("query executor could not start: %s", failure.value)
        else:
            log.error("query executor could not start: %s", failure.getTraceback())
        reactor.stop()

    async def _answer(self, description: dict) -> None:
        try:
            response = await self.router.answer(ExecutedRequest(description))
        except MemoryError:
            self.transport.write(frame(("memory",)))
            return
        answer = frame(
            ("answer", peak_resident_bytes(), response.status, response.content_type, response.headers, response.body)
        )
        send_now(self.transport._writer, answer)  # StandardIO's pipe writer: it has no public name

    async def _select(self, kind: str, tenant: str, patterns: list[str]) -> None:
        """An admin delete's selection: the series, or the answer to the error that stopped it."""
        try:
            series = await self.selection.select(kind, tenant, patterns)
        except MemoryError:
            self.transport.write(frame(("memory",)))
            return
        except Exception as error:
            refusal = error_answer(error, SimpleNamespace(uri=f"{kind} delete"))
            self.transport.write(frame(("refused", peak_resident_bytes(), refusal)))
            return
        self.transport.write(frame(("selected", peak_resident_bytes(), series)))


def peak_resident_bytes() -> int:
    """The most resident memory this process ever had (Linux's ru_maxrss, in KiB: VmHWM), sent
    with each answer for the serving process's memory cap: a system call here, where the serving
    process would read /proc (0.07 ms, a sixth of a small request's cost)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _die_with_parent(parent_pid: int) -> None:
    """Linux: the kernel kills this executor when the serving process dies, even mid-query; one
    that died while this process was starting is no longer its parent."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        sys.exit(0)


def main() -> None:
    # The serving process decides when an executor stops: a Ctrl-C or a SIGTERM sent to the whole
    # process group reaches the executors too, and must not cut the queries the drain waits for.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the gateway reloads --overrides and sends them here
    _die_with_parent(int(sys.argv[1]))
    tune_allocator()  # the queries' arrays are computed here
    blocking.run_on_caller()  # one request at a time: a thread would only add its hand-offs
    settle_collector()  # as the serving process: its series and selection caches stay out of full passes
    stdio.StandardIO(ExecutorSide(), stdin=REQUEST_FD, stdout=ANSWER_FD)
    reactor.run(installSignalHandlers=False)


if __name__ == "__main__":
    main()
