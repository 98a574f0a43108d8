"""Operational endpoints: the gateway's own metrics and a health check (``/``, the version banner
and the web page, is gateway/http/webui.py)."""

import os

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.http.server import Response, Router, json_response
from gateway.store import Store, StoreUnavailable


class OpsAPI:
    def __init__(self, store: Store):
        self.store = store

    def register(self, router: Router) -> None:
        router.add("/metrics", ("GET",), "metrics", self.metrics, access="admin")
        router.add("/healthz", ("GET",), "healthz", self.healthz, access="public")

    async def metrics(self, request):
        return Response(200, generate_latest(metrics_registry()), CONTENT_TYPE_LATEST)

    async def healthz(self, request):
        """200 when the store answers a trivial query, 503 otherwise."""
        try:
            await self.store.ping()
        except Exception as error:
            raise StoreUnavailable(f"store health check failed: {error}") from error
        return json_response(200, {"status": "ok"})


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
