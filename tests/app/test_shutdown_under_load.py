"""SIGTERM while remote write and carbon load a gateway on Cassandra: the gateway stops taking new
work at once, stores what it accepted, and exits within ``--shutdown-timeout`` (plus a second for
the interpreter's own exit); every remote-write sample answered 204 reads back afterwards. Under
writes too large to store within the timeout and a query that outlives it, every process still
ends within the timeout plus the stated margin, and the query gets its 503."""

import http.client
import signal
import threading
import time
import urllib.parse
from datetime import datetime

import pytest

from protocols.prometheus import WriteSeries, encode_write_request_v1
from tests.app.test_lifecycle import LONG_QUERY_FLAGS, STOP_MARGIN_S, CarbonSender, long_query_under_way
from tests.app.test_workers import wait_for
from tests.gatewayproc import GatewayProcess, metric_value

pytestmark = pytest.mark.slow

SHUTDOWN_TIMEOUT_S = 3
SERIES_PER_REQUEST = 2000


class RemoteWriter(threading.Thread):
    """Prometheus's shape: one keep-alive connection, SERIES_PER_REQUEST series of its own, one
    sample of each a request, a second apart; ``acknowledged`` holds the timestamps answered 204."""

    def __init__(self, gateway: GatewayProcess, tenant: str, number: int, start_ms: int):
        super().__init__()
        self.gateway, self.tenant, self.number, self.start_ms = gateway, tenant, number, start_ms
        self.acknowledged: list[int] = []
        self.stop = threading.Event()

    def run(self):
        connection = http.client.HTTPConnection("127.0.0.1", self.gateway.port, timeout=30)
        headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy", "X-Scope-OrgID": self.tenant}
        for step in range(3000):
            if self.stop.is_set():
                break
            timestamp = self.start_ms + step * 1000
            body = encode_write_request_v1(
                WriteSeries(
                    {"__name__": "shutdown_rw", "writer": str(self.number), "s": str(s)}, [(timestamp, float(step))]
                )
                for s in range(SERIES_PER_REQUEST)
            )
            try:
                connection.request("POST", "/api/v1/write", body, headers)
                answer = connection.getresponse()
                answer.read()
                if answer.status == 204:
                    self.acknowledged.append(timestamp)
            except (OSError, http.client.HTTPException):  # closed by the stopping gateway: not acknowledged
                connection.close()
                time.sleep(0.05)
        connection.close()


def stored_timestamps(gateway: GatewayProcess, tenant: str, writer: int, start_s: int) -> dict[str, set[int]]:
    """Every stored timestamp (ms) of each of the writer's series, by series."""
    query = urllib.parse.urlencode(
        {"metricName": "shutdown_rw", "tag": f"writer={writer}", "start": start_s - 10, "granularity": "raw"}
    )
    answer = gateway.get(f"/api/query?{query}", headers={"X-Scope-OrgID": tenant})
    assert answer.status == 200, answer.body
    return {
        series["tags"]["s"]: {int(datetime.fromisoformat(ts).timestamp() * 1000) for ts in series["values"]}
        for series in answer.json()
    }


def test_sigterm_under_remote_write_and_carbon_load_on_cassandra_exits_in_time_and_loses_nothing_acknowledged(
    tmp_path, tenant, cassandra_url, redis_server
):
    store = ("--store", cassandra_url, "--redis", redis_server.url)
    # No downsample role: on the shared test keyspace its round would work for every test's tenants.
    gateway = GatewayProcess(
        tmp_path,
        "--shutdown-timeout",
        f"{SHUTDOWN_TIMEOUT_S}s",
        "--graphite-tenant",
        tenant,
        "--roles",
        "ingest,query",
        *store,
    ).start()
    start_s = int(time.time()) - 1800
    writers = [RemoteWriter(gateway, tenant, number, start_s * 1000) for number in range(8)]
    carbon = [CarbonSender(gateway.graphite_port) for _ in range(4)]
    try:
        for thread in [*writers, *carbon]:
            thread.start()
        wait_for(
            lambda: all(len(w.acknowledged) >= 3 for w in writers) and sum(c.lines for c in carbon) > 20_000,
            timeout=120,
            what="load under way",
        )
        started = time.monotonic()
        code = gateway.stop(timeout=SHUTDOWN_TIMEOUT_S + 30)
        elapsed = time.monotonic() - started
    finally:
        for thread in [*writers, *carbon]:
            thread.stop.set()
            thread.join()
    log = gateway.log()
    print(f"stopped in {elapsed:.2f}s; acknowledged requests: {[len(w.acknowledged) for w in writers]}")
    assert code == 0, log
    assert elapsed < SHUTDOWN_TIMEOUT_S + 1, f"stopping took {elapsed:.1f}s:\n{log[-3000:]}"
    assert "shutdown timeout" not in log, log[-3000:]

    reader = GatewayProcess(tmp_path, "--roles", "ingest,query", *store).start()
    try:
        for writer in writers:
            stored = stored_timestamps(reader, tenant, writer.number, start_s)
            for series in map(str, range(SERIES_PER_REQUEST)):
                lost = set(writer.acknowledged) - stored.get(series, set())
                assert not lost, f"writer {writer.number} series {series}: acknowledged but lost {sorted(lost)[:5]}"
    finally:
        assert reader.stop() == 0


class LargeWriter(threading.Thread):
    """Remote writes of ``series`` new series each, back to back, until told to stop."""

    def __init__(self, gateway: GatewayProcess, tenant: str, number: int, series: int):
        super().__init__()
        self.gateway, self.tenant, self.number, self.series = gateway, tenant, number, series
        self.stop = threading.Event()
        self.sent = 0

    def run(self):
        headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy", "X-Scope-OrgID": self.tenant}
        while not self.stop.is_set():
            now_ms = int(time.time() * 1000)
            body = encode_write_request_v1(
                WriteSeries(
                    {"__name__": "shutdown_large", "w": f"{self.number}-{self.sent}", "s": str(s)}, [(now_ms, 1.0)]
                )
                for s in range(self.series)
            )
            connection = http.client.HTTPConnection("127.0.0.1", self.gateway.port, timeout=60)
            try:
                connection.request("POST", "/api/v1/write", body, headers)
                connection.getresponse().read()
            except (OSError, http.client.HTTPException):  # cut by the stopping gateway
                time.sleep(0.05)
            finally:
                connection.close()
            self.sent += 1


def test_sigterm_under_large_writes_and_a_long_query_on_cassandra_ends_every_process_within_the_margin(
    tmp_path, tenant, cassandra_url, redis_server
):
    """Issue 38 item 6: under a 150k-series write a worker used to outlive the timeout by 10 s,
    until its supervisor killed it, and a query running at the timeout got a TCP reset."""
    gateway = GatewayProcess(
        tmp_path,
        "--workers",
        "2",
        "--shutdown-timeout",
        f"{SHUTDOWN_TIMEOUT_S}s",
        "--graphite-tenant",
        tenant,
        "--roles",
        "ingest,query",
        "--query-executors",
        "1",
        *LONG_QUERY_FLAGS,
        "--store",
        cassandra_url,
        "--redis",
        redis_server.url,
    ).start()
    wait_for(lambda: metric_value(gateway, "tsgate_query_executors_ready") == 2, timeout=60, what="executors ready")
    writers = [LargeWriter(gateway, tenant, number, 20_000) for number in range(2)]
    carbon = CarbonSender(gateway.graphite_port)
    try:
        for thread in [*writers, carbon]:
            thread.start()
        wait_for(lambda: all(w.sent >= 1 for w in writers), timeout=120, what="large writes under way")
        connection = long_query_under_way(gateway)
        started = time.monotonic()
        gateway.process.send_signal(signal.SIGTERM)
        try:
            answer = connection.getresponse()
        except (OSError, http.client.HTTPException) as cut:
            gateway.process.wait(SHUTDOWN_TIMEOUT_S + 30)
            raise AssertionError(f"the running query got no answer ({cut!r}):\n{gateway.log()[-6000:]}") from cut
        status, body = answer.status, answer.read()
        code = gateway.process.wait(SHUTDOWN_TIMEOUT_S + 30)
        elapsed = time.monotonic() - started
    finally:
        for thread in [*writers, carbon]:
            thread.stop.set()
            thread.join()
    log = gateway.log()
    print(f"stopped in {elapsed:.2f}s; the query answered {status}")
    assert status == 503 and b"the gateway is stopping" in body, body
    assert code == 0, log[-3000:]
    assert elapsed < SHUTDOWN_TIMEOUT_S + STOP_MARGIN_S, log[-3000:]
    assert "killing it" not in log, log[-3000:]
