"""Operational endpoints: the gateway's own metrics and a health check (``/``, the version banner
and the web page, is gateway/http/webui.py)."""

import os

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from twisted.internet import defer, reactor
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure

from gateway.http.server import Response, Router, json_response
from gateway.store import Store, StoreUnavailable

HEALTHZ_DEADLINE_S = 0.5  # /healthz waits this long for the store, then answers from what it knows
STORE_STALE_AFTER_S = 30.0  # a store that has not answered a ping for this long is unhealthy


class StoreHealth:
    """The store's health from one ping at a time: /healthz waits for the ping in flight at most
    HEALTHZ_DEADLINE_S, then answers from the last ping that finished. A store that queues the
    ping behind heavy ingest (on Cassandra once for 15 s, and /healthz with it) reads as slow, not
    down, until STORE_STALE_AFTER_S pass without an answer."""

    def __init__(self, store: Store, clock: IReactorTime):
        self.store = store
        self.clock = clock
        self.answered_at = clock.seconds()  # type: ignore[misc]  # the store answered its start; zope interface: see [tool.mypy]
        self.failure: str | None = None  # why the last ping that finished failed
        self.asked_at = 0.0  # when the ping in flight was sent
        self._waiting: dict[defer.Deferred, IDelayedCall] | None = None  # while a ping is in flight

    def check(self) -> defer.Deferred:
        """Fire, within HEALTHZ_DEADLINE_S, with True when the ping in flight has finished (answered
        or failed), False when it is still out."""
        if self._waiting is None:
            self._waiting, self.asked_at = {}, self.clock.seconds()  # type: ignore[misc]  # zope interface: see [tool.mypy]
            defer.maybeDeferred(self.store.ping).addBoth(self._finished)
            if self._waiting is None:  # finished at once
                return defer.succeed(True)
        answered: defer.Deferred = defer.Deferred()
        self._waiting[answered] = self.clock.callLater(HEALTHZ_DEADLINE_S, self._late, self._waiting, answered)  # type: ignore[arg-type]  # zope interface: see [tool.mypy]
        return answered

    def _late(self, waiting: dict, answered: defer.Deferred) -> None:
        """(Firing a Deferred its client's departure cancelled is ignored, as Twisted does after a
        cancel without a canceller.)"""
        del waiting[answered]  # a ping that never ends holds no /healthz request
        answered.callback(False)

    def _finished(self, outcome) -> None:
        if isinstance(outcome, Failure):
            self.failure = str(outcome.value)
        else:
            self.answered_at, self.failure = self.clock.seconds(), None  # type: ignore[misc]  # zope interface: see [tool.mypy]
        waiting, self._waiting = self._waiting or {}, None
        for answered, late in waiting.items():
            late.cancel()  # type: ignore[misc]  # zope interface: see [tool.mypy]
            answered.callback(True)


class OpsAPI:
    def __init__(self, store: Store, clock: IReactorTime = reactor, executors=None):
        self.health = StoreHealth(store, clock)
        self.executors = executors  # gateway.app.executors.QueryExecutors, where this process has them

    def register(self, router: Router) -> None:
        router.add("/metrics", ("GET",), "metrics", self.metrics, access="admin")
        router.add("/healthz", ("GET",), "healthz", self.healthz, access="public")

    async def metrics(self, request):
        return Response(200, generate_latest(metrics_registry()), CONTENT_TYPE_LATEST)

    async def healthz(self, request):
        """Within HEALTHZ_DEADLINE_S: 200 ``ok`` when the store answered a trivial query, 503 when it
        failed; when it has not answered yet, 200 ``ok`` with ``"store": "slow"`` while its last
        answer is under STORE_STALE_AFTER_S old, else 503 ``store slow``. A store that answers
        before the query executors were all ready once: 503 ``starting``."""
        health = self.health
        answered = await health.check()
        if health.failure is not None:
            raise StoreUnavailable(f"store health check failed: {health.failure}")
        starting = self.executors.starting() if self.executors is not None else None
        if starting is not None:
            return json_response(503, {"status": "starting", "error": starting})
        if answered:
            return json_response(200, {"status": "ok"})
        now = health.clock.seconds()
        slow = {"store": "slow", "waiting_s": round(now - health.asked_at, 1)}
        silent_s = round(now - health.answered_at, 1)
        if silent_s < STORE_STALE_AFTER_S:
            return json_response(200, {"status": "ok", **slow, "last_answer_s_ago": silent_s})
        return json_response(
            503, {"status": "store slow", **slow, "error": f"the store has not answered a ping for {silent_s} s"}
        )


def metrics_registry():
    """This process's registry, or under ``--workers N`` (PROMETHEUS_MULTIPROC_DIR set by the
    supervisor) a fresh one reading every worker's files, so any worker answers for all.

    The multiprocess view cannot sum process_* metrics (they describe one process): they come
    from ProcessesCollector, one series a process.
    """
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        return REGISTRY
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    registry.register(ProcessesCollector(os.environ["PROMETHEUS_MULTIPROC_DIR"]))
    return registry


class ProcessesCollector:
    """process_* (CPU, memory, open files, start time) of every live process of a ``--workers``
    gateway, labelled with its ``pid``: the supervisor (this worker's parent) and every process
    with metric files in ``directory`` (the workers and their query executors). Summed over
    ``pid`` they are the gateway's; a process that exited leaves files but no /proc entry and is
    left out."""

    def __init__(self, directory: str):
        self.directory = directory

    def collect(self):
        families: dict[str, Metric] = {}
        for pid in sorted(self._live_pids()):
            for metric in ProcessCollector(pid=lambda pid=pid: pid, registry=None).collect():
                family = families.setdefault(metric.name, Metric(metric.name, metric.documentation, metric.type))
                for sample in metric.samples:
                    family.add_sample(sample.name, {**sample.labels, "pid": str(pid)}, sample.value)
        return list(families.values())

    def _live_pids(self) -> set[int]:
        """The files are named ``<kind>_<pid>.db`` by prometheus_client."""
        named = {name.rpartition("_")[2].removesuffix(".db") for name in os.listdir(self.directory)}
        pids = {int(pid) for pid in named if pid.isdigit()} | {os.getppid()}
        return {pid for pid in pids if os.path.exists(f"/proc/{pid}")}
