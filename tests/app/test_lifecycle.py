"""Start, stop and connections of a real ``tsgate serve``: failures before serving exit 1 promptly
with the reason; SIGTERM or SIGINT under load exits 0 within ``--shutdown-timeout`` and keeps every
acknowledged sample, in one process and under ``--workers`` alike; the connection cap and the
idle and slow-header timeouts."""

import http.client
import json
import os
import pickle
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

from gateway.app import workers as supervisor
from gateway.app.service import SHUTDOWN_MARGIN_S
from tests.app.test_workers import query, ready_workers, wait_for
from tests.gatewayproc import REPO, GatewayProcess, downsample_once, free_port, metric_value, tsgate_serve

pytestmark = pytest.mark.slow  # every test here starts tsgate

PROMPTLY_S = 15  # a hang makes tsgate_serve's timeout fail the test
# Under --workers worker 0 is a fresh interpreter started by the supervisor, which gives up
# at its first failed start: slower on a loaded machine, still bounded.
PROMPTLY_WORKERS_S = 40
# Past --shutdown-timeout: the gateway's stated margin (gateway.app.service.SHUTDOWN_MARGIN_S),
# and 2 s more for this test's own clock on a loaded box.
STOP_MARGIN_S = SHUTDOWN_MARGIN_S + 2
# A query that runs for many seconds: ten subqueries of 86 M steps, one after another. One alone
# took 0.6 s to 9 s, as the executor's allocator had its memory already or had to fault it in.
LONG_QUERY = "/api/v1/query?" + urllib.parse.urlencode(
    {"query": " + ".join(f"count_over_time(vector({k})[1000d:1s])" for k in range(1, 11))}
)
LONG_QUERY_FLAGS = ("--query-timeout=60s", "--query-max-memory-bytes=8000000000", "--query-max-samples=1000000000000")


@pytest.fixture
def taken_port():
    """A port some other process is listening on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def serve_until_exit(tmp_path, workers: str, *args: str) -> str:
    """Run `tsgate serve --workers N` expecting it to fail before serving: exit 1, promptly; its stderr."""
    promptly = PROMPTLY_S if workers == "1" else PROMPTLY_WORKERS_S
    result, elapsed = tsgate_serve(
        tmp_path, "--http", f"127.0.0.1:{free_port()}", "--workers", workers, *args, timeout=promptly
    )
    assert result.returncode == 1, result.stderr
    assert elapsed < promptly
    return result.stderr


@pytest.mark.parametrize("listener", ["http", "graphite", "pickle"])
def test_a_port_in_use_exits_1(tmp_path, taken_port, listener):
    stderr = serve_until_exit(tmp_path, "1", f"--{listener}", f"127.0.0.1:{taken_port}")
    assert f"could not start: cannot listen on 127.0.0.1:{taken_port} (--{listener}): Address already in use" in stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_data_dir_that_cannot_be_created_exits_1(tmp_path, workers):
    blocker = tmp_path / "file"
    blocker.write_text("")
    stderr = serve_until_exit(tmp_path, workers, "--data-dir", str(blocker / "data"))
    assert "could not start" in stderr and "Not a directory" in stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_database_file_that_cannot_be_opened_exits_1(tmp_path, workers):
    """The store's thread pools are running by the time SQLite fails: they are stopped too.
    (A directory where the file should be fails as a read-only data dir does, even as root.)"""
    (tmp_path / "data" / "tsgate.db").mkdir(parents=True)
    stderr = serve_until_exit(tmp_path, workers, "--data-dir", str(tmp_path / "data"))
    assert "could not start: --data-dir " in stderr and ": sqlite: unable to open database file" in stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_file_that_is_not_a_database_exits_1(tmp_path, workers):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tsgate.db").write_bytes(b"not a database " * 100)
    stderr = serve_until_exit(tmp_path, workers, "--data-dir", str(tmp_path / "data"))
    assert "could not start: --data-dir " in stderr and ": file is not a database" in stderr


def test_downsample_once_on_a_file_that_is_not_a_database_exits_1(tmp_path):
    """The store's thread pools, started before SQLite failed, stop with the failed start: the
    command used to print its error and then never exit."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tsgate.db").write_bytes(b"not a database " * 100)
    command = [sys.executable, "-m", "gateway.app.cli", "downsample", "--once", "--data-dir", str(tmp_path / "data")]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "could not start: --data-dir " in result.stderr and ": file is not a database" in result.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_an_unreachable_cassandra_exits_1(tmp_path, workers):
    stderr = serve_until_exit(tmp_path, workers, "--store", f"cassandra://127.0.0.1:{free_port()}/ks")
    assert (
        "could not start: --store cassandra://127.0.0.1:" in stderr and "cannot reach Cassandra (127.0.0.1:" in stderr
    )


class KeepAliveWriter(threading.Thread):
    """One keep-alive HTTP connection posting one sample a request until told to stop; reconnects
    when the gateway closes it. ``acknowledged``: the values answered 200."""

    def __init__(self, gateway: GatewayProcess, path: str, number: int, now: int, tenant: str):
        super().__init__()
        self.gateway, self.path, self.number, self.now, self.tenant = gateway, path, number, now, tenant
        self.acknowledged: list[int] = []
        self.stop = threading.Event()

    def body(self, i: int) -> bytes:
        tags = {"writer": str(self.number)}
        if self.path == "/api/put":
            return json.dumps(
                {"metric": "stop_load", "tags": tags, "timestamp": self.now - 3000 + i, "value": i}
            ).encode()
        return json.dumps([{"metricName": "stop_load", "tags": tags, "ts": self.now - 3000 + i, "value": i}]).encode()

    def run(self):
        connection = http.client.HTTPConnection("127.0.0.1", self.gateway.port, timeout=10)
        for i in range(2900):
            if self.stop.is_set():
                break
            try:
                connection.request(
                    "POST", self.path, self.body(i), {"Content-Type": "application/json", "X-Scope-OrgID": self.tenant}
                )
                answer = connection.getresponse()
                answer.read()
                if answer.status == 200:
                    self.acknowledged.append(i)
            except OSError:  # closed by the stopping gateway, or refused: not acknowledged
                connection.close()
                time.sleep(0.05)
        connection.close()


class CarbonSender(threading.Thread):
    """A carbon plaintext sender that never stops on its own (reconnecting when closed)."""

    def __init__(self, port: int):
        super().__init__()
        self.port = port
        self.stop = threading.Event()
        self.lines = 0

    def run(self):
        while not self.stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as connection:
                    while not self.stop.is_set():
                        connection.sendall(f"stop.carbon {self.lines} {int(time.time())}\n".encode())
                        self.lines += 1
            except OSError:
                time.sleep(0.05)


@pytest.mark.parametrize(
    "backend, workers, signum",
    [
        ("sqlite", "1", signal.SIGTERM),
        ("sqlite", "2", signal.SIGTERM),
        ("sqlite", "1", signal.SIGINT),
        ("cassandra", "2", signal.SIGTERM),
    ],
)
def test_a_stop_signal_under_continuous_load_exits_0_in_time_and_keeps_every_acknowledged_sample(
    request, tmp_path, tenant, backend, workers, signum
):
    shutdown_timeout_s = 5
    store = ("--data-dir", str(tmp_path / "data"))
    if backend == "cassandra":
        store = (
            "--store",
            request.getfixturevalue("cassandra_url"),
            "--redis",
            request.getfixturevalue("redis_server").url,
        )
    gateway = GatewayProcess(
        tmp_path, "--workers", workers, "--shutdown-timeout", f"{shutdown_timeout_s}s", *store
    ).start()
    now = int(time.time())
    writers = [
        KeepAliveWriter(gateway, path, number, now, tenant)
        for number, path in enumerate(["/api/put", "/api/write"] * 2)
    ]
    carbon = CarbonSender(gateway.graphite_port)
    idle = socket.create_connection(("127.0.0.1", gateway.port))  # a keep-alive connection between requests
    try:
        for thread in [*writers, carbon]:
            thread.start()
        wait_for(lambda: all(len(w.acknowledged) > 20 for w in writers) and carbon.lines > 1000, what="load under way")
        started = time.monotonic()
        code = gateway.stop(timeout=shutdown_timeout_s + 20, signum=signum)
        elapsed = time.monotonic() - started
    finally:
        for thread in [*writers, carbon]:
            thread.stop.set()
            thread.join()
        idle.close()
    assert code == 0, gateway.log()
    assert elapsed < shutdown_timeout_s + STOP_MARGIN_S, f"stopping took {elapsed:.1f}s"
    assert "Traceback" not in gateway.log()

    reader = GatewayProcess(tmp_path, *store).start()
    try:
        answer = query(reader, "stop_load", start=str(now - 3100), tenant=tenant)
        stored = {s["tags"]["writer"]: {int(v) for v in s["values"].values()} for s in answer}
    finally:
        assert reader.stop() == 0
    for writer in writers:
        lost = set(writer.acknowledged) - stored.get(str(writer.number), set())
        assert not lost, f"writer {writer.number} ({writer.path}): acknowledged but lost {sorted(lost)[:10]}"


def start_a_long_downsample_round(tmp_path, shutdown_timeout: str) -> GatewayProcess:
    """A gateway whose first downsample round (4,000 series in each of sixteen settled slots:
    some seconds of work even with grouped sealing and batched reads; three slots of 8,000 were
    once sealed in 0.85 s after the first) is under way: the work of a slot is counted done once
    all of it is, so the round is under way once the oldest slot's is (SQLite seals all
    partitions of a slot together), with fifteen slots still to do. The data is written by a
    gateway without the downsample role first, so that the round finds all of it."""
    writer = GatewayProcess(tmp_path, "--roles", "ingest,query").start()
    last_settled_slot = (int(time.time()) // 3600 - 2) * 3600
    body = [
        {"metricName": "ds_stop", "tags": {"i": str(i)}, "ts": last_settled_slot - 3600 * j + 60, "value": j}
        for i in range(4000)
        for j in range(16)
    ]
    assert writer.post("/api/write", body, timeout=60).status == 200
    assert writer.stop() == 0
    gateway = GatewayProcess(
        tmp_path, "--downsample-delay", "1s", "--downsample-interval", "2s", "--shutdown-timeout", shutdown_timeout
    ).start()

    def series_slots_done() -> float:
        found = re.search(r"^tsgate_downsampled_series_slots_total (\S+)$", gateway.get("/metrics").body.decode(), re.M)
        return found and float(found.group(1))

    wait_for(series_slots_done, timeout=60, what="the downsample round under way")
    return gateway


def test_sigterm_waits_for_the_running_downsample_round(tmp_path):
    gateway = start_a_long_downsample_round(tmp_path, "60s")
    assert gateway.stop(timeout=60) == 0
    assert "downsample round failed" not in gateway.log() and "shutdown timeout" not in gateway.log()
    assert (
        downsample_once("--data-dir", str(tmp_path / "data")).strip()
        == "rolled up 0 series-slots; 0 left pending for a later round"
    )


def test_a_downsample_round_longer_than_the_shutdown_timeout_is_left_and_logged(tmp_path):
    gateway = start_a_long_downsample_round(tmp_path, "1s")
    started = time.monotonic()
    assert gateway.stop(timeout=20) == 0
    assert time.monotonic() - started < 1 + STOP_MARGIN_S
    assert "shutdown timeout (1s, --shutdown-timeout) reached" in gateway.log()
    assert "downsample round still running (redone after restart)" in gateway.log()
    assert int(downsample_once("--data-dir", str(tmp_path / "data")).split()[2]) > 0


def test_a_request_that_never_completes_is_closed_at_the_shutdown_timeout(tmp_path):
    gateway = GatewayProcess(tmp_path, "--shutdown-timeout", "2s").start()
    with socket.create_connection(("127.0.0.1", gateway.port)) as stalled:
        stalled.sendall(b"POST /api/put HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        time.sleep(0.2)
        started = time.monotonic()
        assert gateway.stop(timeout=20) == 0
        assert 2 <= time.monotonic() - started < 2 + STOP_MARGIN_S
    assert "shutdown timeout (2s, --shutdown-timeout) reached: closing 1 connections still open" in gateway.log()


def closed_by_peer(sock: socket.socket, within: float) -> bool:
    """Whether the gateway closed ``sock`` (end of file or reset) within ``within`` seconds."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_at_max_connections_a_new_connection_replaces_the_oldest_idle_one_or_is_closed_at_once(tmp_path):
    gateway = GatewayProcess(tmp_path, "--max-connections", "4").start()
    connect = socket.create_connection
    line = lambda value: b"cap.line %d %d\n" % (value, time.time())  # noqa: E731
    try:
        silent_carbon = connect(("127.0.0.1", gateway.graphite_port))
        carbon = [connect(("127.0.0.1", port)) for port in (gateway.graphite_port, gateway.pickle_port)]
        carbon[0].sendall(line(1))
        frame = pickle.dumps([("cap.pickle", (int(time.time()), 1.0))], protocol=2)
        carbon[1].sendall(struct.pack("!L", len(frame)) + frame)
        idle_http = connect(("127.0.0.1", gateway.port))
        time.sleep(0.3)
        assert gateway.get("/healthz").status == 200  # in place of the oldest idle connection
        assert closed_by_peer(silent_carbon, within=5)
        carbon.append(connect(("127.0.0.1", gateway.graphite_port)))
        carbon[2].sendall(line(2))
        time.sleep(0.3)
        assert gateway.get("/healthz").status == 200  # in place of the idle HTTP connection
        assert closed_by_peer(idle_http, within=5)

        slow_body = connect(("127.0.0.1", gateway.port))  # a request still arriving is not busy yet
        slow_body.sendall(b"POST /api/put HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        time.sleep(0.3)
        assert gateway.get("/healthz").status == 200
        assert closed_by_peer(slow_body, within=5)
        carbon.append(connect(("127.0.0.1", gateway.graphite_port)))
        carbon[3].sendall(line(3))
        time.sleep(0.3)
        for port in (gateway.pickle_port, gateway.port):  # every connection busy
            with connect(("127.0.0.1", port)) as extra:
                assert closed_by_peer(extra, within=5)
        assert not any(closed_by_peer(sock, within=0.1) for sock in carbon)

        for sock in carbon:
            sock.close()
        assert wait_for(lambda: gateway.get("/healthz").status == 200, what="/healthz once the connections are closed")
        metrics = gateway.get("/metrics").body.decode()
        assert 'tsgate_refused_connections_total{listener="graphite_pickle"} 1.0' in metrics
        assert 'tsgate_refused_connections_total{listener="http"} 1.0' in metrics
        assert 'tsgate_idle_closed_connections_total{listener="http"} 2.0' in metrics
        assert 'tsgate_idle_closed_connections_total{listener="graphite_plaintext"} 1.0' in metrics
        log = gateway.log()
        assert "http: closed the oldest idle connection (graphite_plaintext) for a new one from 127.0.0.1:" in log
        assert "4 connections open, the limit (--max-connections)" in log
    finally:
        assert gateway.stop() == 0


def test_idle_sockets_do_not_lock_out_a_gateway_at_1024_open_files(tmp_path):
    """The issue's probe: at the common limit of 1,024 open files (cap auto: 896), 1,100
    connections to the HTTP and carbon ports that never send anything; real requests are still
    answered."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # inherited by the gateway
    try:
        gateway = GatewayProcess(tmp_path).start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    idle = []
    try:
        for i in range(1100):
            port = (gateway.port, gateway.graphite_port, gateway.pickle_port)[i % 3]
            idle.append(socket.create_connection(("127.0.0.1", port)))
        for i in range(20):
            assert (
                gateway.post("/api/put", {"metric": "lockout", "timestamp": int(time.time()), "value": i}).status == 200
            )
            assert gateway.get("/healthz").status == 200
        assert gateway.get("/api/query?metricName=lockout").status == 200
    finally:
        for sock in idle:
            sock.close()
        assert gateway.stop() == 0


def test_idle_and_slow_header_connections_are_closed(tmp_path):
    gateway = GatewayProcess(tmp_path, "--http-idle-timeout", "1s", "--carbon-idle-timeout", "2s").start()
    try:
        idle_http = socket.create_connection(("127.0.0.1", gateway.port))
        slow_headers = socket.create_connection(("127.0.0.1", gateway.port))
        idle_carbon = socket.create_connection(("127.0.0.1", gateway.graphite_port))
        busy_carbon = socket.create_connection(("127.0.0.1", gateway.graphite_port))
        started = time.monotonic()
        try:
            for part in [b"GET /healthz HTTP/1.1\r\n", *(b"X-Slow: %d\r\n" % i for i in range(20))]:
                slow_headers.sendall(part)
                busy_carbon.sendall(b"idle.busy 1 %d\n" % time.time())
                time.sleep(0.3)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert closed_by_peer(slow_headers, within=0.1) and time.monotonic() - started < 1 + 1
        assert closed_by_peer(idle_http, within=0.1)
        assert closed_by_peer(idle_carbon, within=3)
        busy_carbon.sendall(b"idle.busy 1 %d\n" % time.time())
        assert not closed_by_peer(busy_carbon, within=0.5)
        keep_alive = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=5)
        for _ in range(3):  # a connection in use is not idle, whatever its age
            keep_alive.request("GET", "/healthz")
            answer = keep_alive.getresponse()
            assert answer.status == 200 and answer.read()
            assert answer.getheader("Keep-Alive") == "timeout=1"  # how long it may idle: clients can know
            time.sleep(0.6)
        keep_alive.close()
        assert "graphite_plaintext: closing the connection from 127.0.0.1:" in gateway.log()
        assert 'tsgate_idle_closed_connections_total{listener="http"} 2.0' in gateway.get("/metrics").body.decode()
    finally:
        assert gateway.stop() == 0


def test_a_request_under_way_at_sigterm_is_answered_with_connection_close_and_stored(tmp_path):
    gateway = GatewayProcess(tmp_path).start()
    body = json.dumps({"metric": "in_flight", "timestamp": int(time.time()), "value": 7}).encode()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as client:
        client.sendall(b"POST /api/put HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:10])
        time.sleep(0.3)
        gateway.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        client.sendall(body[10:])
        answer = b""
        while chunk := client.recv(4096):
            answer += chunk
    head, _, _ = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head.lower(), answer
    assert gateway.process.wait(20) == 0
    reader = GatewayProcess(tmp_path, "--data-dir", str(tmp_path / "data")).start()
    try:
        assert [s["values"] for s in query(reader, "in_flight")][0]
    finally:
        assert reader.stop() == 0


def test_the_supervisor_kills_a_worker_that_does_not_stop_in_time(tmp_path):
    gateway = GatewayProcess(tmp_path, "--workers", "2", "--shutdown-timeout", "1s").start()
    workers = wait_for(lambda: len(ready_workers(gateway)) == 2 and ready_workers(gateway), what="2 ready workers")
    os.kill(workers[1], signal.SIGSTOP)  # a worker that cannot drain
    started = time.monotonic()
    assert gateway.stop(timeout=30) == 0
    assert 1 + supervisor.STOP_MARGIN_S <= time.monotonic() - started < 1 + STOP_MARGIN_S
    log = gateway.log()
    waited = f"{1 + supervisor.STOP_MARGIN_S:g}s"
    assert f"worker 1 (pid {workers[1]}) still running {waited} after SIGTERM: killing it" in log
    assert f"worker 1 (pid {workers[1]}) stopped (killed by SIGKILL)" in log
    assert f"worker 0 (pid {workers[0]}) stopped (exit code 0)" in log


def long_query_under_way(gateway: GatewayProcess) -> http.client.HTTPConnection:
    """LONG_QUERY sent on a connection of its own, and running in an executor (read by a busy
    gateway, not only sent, and not waiting for an executor)."""
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=60)
    connection.request("GET", LONG_QUERY)
    wait_for(lambda: metric_value(gateway, "tsgate_query_running") == 1, what="the query running")
    return connection


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_query_running_at_the_shutdown_timeout_gets_503_and_the_gateway_exits_within_the_margin(tmp_path, workers):
    """Issue 38 item 6: a query still running at --shutdown-timeout got a TCP reset (its
    connection was aborted before its 503 left); now it gets Prometheus's 503 envelope, and
    every process ends within the timeout plus the stated margin."""
    gateway = GatewayProcess(
        tmp_path, "--workers", workers, "--shutdown-timeout", "2s", "--query-executors=2", *LONG_QUERY_FLAGS
    ).start()
    wait_for(lambda: metric_value(gateway, "tsgate_query_executors_ready") == 2 * int(workers), what="executors ready")
    connection = long_query_under_way(gateway)
    started = time.monotonic()
    gateway.process.send_signal(signal.SIGTERM)
    answer = connection.getresponse()
    answered = time.monotonic() - started
    body = json.loads(answer.read())
    code = gateway.process.wait(30)
    elapsed = time.monotonic() - started
    print(f"--workers {workers}: the query answered {answer.status} after {answered:.2f}s, exit after {elapsed:.2f}s")
    assert answer.status == 503, body
    assert body == {"status": "error", "errorType": "unavailable", "error": "the gateway is stopping"}
    assert 2 <= answered and code == 0
    assert elapsed < 2 + STOP_MARGIN_S, gateway.log()[-3000:]
    assert "killing it" not in gateway.log()


def test_healthz_says_ok_only_once_every_query_executor_is_ready(start_gateway):
    """/healthz answered ok while the query executors were still starting, so the first query of a
    client that waited for it waited up to 5 s more for an executor (#34)."""
    gateway = start_gateway("--query-executors", "2")  # returns once /healthz answered 200
    assert metric_value(gateway, "tsgate_query_executors_ready") == 2
    answer = gateway.get("/api/metadata/metricNames")
    assert answer.status == 200 and json.loads(answer.body) == []
