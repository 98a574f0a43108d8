"""Fairness across executor replacement (issue 38): does a tenant whose every query runs to the
deadline slow another tenant down?

Tenant ``heavy`` sends one query at a time that runs past ``--query-timeout`` (its executor is
killed at the deadline and replaced, which takes seconds), the next one as soon as it gets its
503; tenant ``light`` asks a cheap query every ``--interval-ms``. The light tenant's latencies
(p50, p99, max) and failed answers, first alone (the baseline), then beside the heavy tenant;
the gateway runs on SQLite in a temporary directory with ``--query-executors`` executors.

    python -m bench.fairness                              # 2 executors, 2 s deadline, 30 s a phase
    python -m bench.fairness --seconds 15

The heavy query takes about 3.4 s alone on the 2-core box: a longer deadline may let some of
them finish (the heavy tenant's answers are printed by status: they should all be 503).
"""

import argparse
import collections
import http.client
import json
import re
import statistics
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from bench.common import BenchError, exit_with, tsgate_service

HEAVY_QUERY = "count_over_time(vector(1)[1000d:1s])"  # 86 M subquery steps: about 3.4 s, 2-3 GB at its peak
LIGHT_QUERY = "up"
HEAVY, LIGHT = "heavy", "light"

Get = Callable[[str, str], int]  # (path, tenant) -> HTTP status


class Phase(NamedTuple):
    """The light tenant's latencies (s) and the statuses of its failed answers; the statuses of
    the heavy tenant's answers meanwhile."""

    latencies: list[float]
    failures: list[int]
    heavy_answers: list[int]

    @property
    def p99(self) -> float:
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[98]

    def row(self, name: str) -> str:
        return (
            f"{name:<9} {len(self.latencies):>5} {statistics.median(self.latencies) * 1000:>8.1f}"
            f" {self.p99 * 1000:>8.1f} {max(self.latencies) * 1000:>8.1f} {len(self.failures):>6}"
            f" {len(self.heavy_answers):>6}"
        )


def query_path(text: str) -> str:
    return "/api/v1/query?" + urllib.parse.urlencode({"query": text})


def run_phase(get: Get, seconds: float, interval_s: float, heavy: bool) -> Phase:
    """The light tenant's queries for ``seconds``, beside the heavy tenant's when ``heavy``."""
    stop = threading.Event()
    heavy_answers: list[int] = []

    def heavy_loop() -> None:
        while not stop.is_set():
            heavy_answers.append(get(query_path(HEAVY_QUERY), HEAVY))

    thread = threading.Thread(target=heavy_loop)
    if heavy:
        thread.start()
    latencies, failures = [], []
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        started = time.monotonic()
        status = get(query_path(LIGHT_QUERY), LIGHT)
        latencies.append(time.monotonic() - started)
        if status != 200:
            failures.append(status)
        time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
    stop.set()
    if heavy:
        thread.join()  # its query under way ends at the deadline
    return Phase(latencies, failures, heavy_answers)


def light_series(now_ms: int) -> list[dict]:
    """The light tenant's one series, for its query (native JSON write)."""
    return [{"metricName": "up", "tags": {"job": "light"}, "timestamp": now_ms - 10_000, "value": 1}]


def executors_ready(metrics: str) -> int:
    """tsgate_query_executors_ready from an exposition of /metrics."""
    found = re.search(r"^tsgate_query_executors_ready (\S+)$", metrics, re.MULTILINE)
    return int(float(found.group(1))) if found else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--query-executors", default="2")
    parser.add_argument("--query-timeout", default="2s")
    parser.add_argument("--seconds", type=float, default=30, help="length of each phase")
    parser.add_argument("--interval-ms", type=float, default=200, help="between the light tenant's queries")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-fairness-") as workdir:
        gateway = tsgate_service(
            "tsgate",
            ["--data-dir", str(Path(workdir) / "data")],
            Path(workdir) / "tsgate.log",
            [
                "--query-executors",
                options.query_executors,
                "--query-timeout",
                options.query_timeout,
                "--query-max-samples",
                "1000000000000",
                "--query-max-memory-bytes",
                "4000000000",
            ],
        )
        gateway.start()
        try:
            _write(gateway.port, LIGHT, light_series(int(time.time() * 1000)))
            deadline = time.monotonic() + 60
            while executors_ready(gateway.get("/metrics")[1].decode()) < int(options.query_executors):
                if time.monotonic() > deadline:
                    raise BenchError(f"the query executors did not start:\n{gateway.log()}")
                time.sleep(0.2)
            get: Get = lambda path, tenant: gateway.get(path, headers={"X-Scope-OrgID": tenant})[0]  # noqa: E731
            interval_s = options.interval_ms / 1000
            baseline = run_phase(get, options.seconds, interval_s, heavy=False)
            beside = run_phase(get, options.seconds, interval_s, heavy=True)
        finally:
            gateway.stop()
    print(
        f"{options.query_executors} executors, --query-timeout {options.query_timeout}, {options.seconds:g} s a phase"
    )
    print(f"{'phase':<9} {'light':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'failed':>6} {'heavy':>6}")
    print(baseline.row("baseline"))
    print(beside.row("beside"))
    print(f"heavy tenant's answers by status: {dict(collections.Counter(beside.heavy_answers))}")
    print(f"light p99 beside the heavy tenant / baseline: {beside.p99 / baseline.p99:.2f}")


def _write(port: int, tenant: str, body: list) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", "/api/write", json.dumps(body), {"X-Scope-OrgID": tenant})
        response = connection.getresponse()
        if response.status != 200:
            raise BenchError(f"POST /api/write answered {response.status}: {response.read()[:300]!r}")
    finally:
        connection.close()


if __name__ == "__main__":
    exit_with(main)
