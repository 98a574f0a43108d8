"""``tsgate serve --workers N``: a supervisor and worker processes sharing its sockets, run for real.

Most tests use the embedded SQLite store with two workers, so both processes write to one file.
"""

import os
import pickle
import re
import signal
import socket
import struct
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.app.cli import build_parser
from gateway.app.config import ConfigError, build_config
from tests.gatewayproc import GatewayProcess, free_port, tsgate_serve

READY = re.compile(r"worker (\d+) \(pid (\d+)\) ready")


def wait_for(check, timeout: float = 20, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def children(pid: int) -> set[int]:
    """Live child processes of ``pid`` (Linux /proc)."""
    return {int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def ready_workers(gateway: GatewayProcess) -> dict[int, int]:
    """Worker index -> pid of the latest process the supervisor logged as ready."""
    return {int(index): int(pid) for index, pid in READY.findall(gateway.log())}


def start_workers(start_gateway, *args: str) -> tuple[GatewayProcess, dict[int, int]]:
    gateway = start_gateway("--workers", "2", *args)
    workers = wait_for(lambda: len(ready_workers(gateway)) == 2 and ready_workers(gateway), what="2 ready workers")
    return gateway, workers


def query(gateway: GatewayProcess, metric: str, start: str = "2h-ago", tenant: str = "default"):
    answer = gateway.get(
        "/api/query?" + urllib.parse.urlencode({"tenant": tenant, "metricName": metric, "start": start})
    )
    assert answer.status == 200, answer.body
    return answer.json()


def counted_by_worker(metrics_dir: Path, name: str) -> dict[int, float]:
    """Counter ``name`` of each worker, from its own multiprocess counter file."""
    totals = {}
    for path in metrics_dir.glob("counter_*.db"):
        samples = [s for m in MultiProcessCollector.merge([str(path)]) for s in m.samples]
        pid = int(path.stem.split("_")[1])
        totals[pid] = sum(s.value for s in samples if s.name == name)
    return totals


def metrics_dir_of(pid: int) -> Path:
    environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    (entry,) = [e for e in environment if e.startswith(b"PROMETHEUS_MULTIPROC_DIR=")]
    return Path(entry.split(b"=", 1)[1].decode())


def test_worker_count_defaults():
    def config(*argv):
        return build_config(build_parser().parse_args(["serve", *argv]))

    assert config().worker_count == 1  # the embedded SQLite store: one writer
    assert config("--store", "cassandra://h/ks").worker_count == len(os.sched_getaffinity(0))
    assert config("--store", "cassandra://h/ks", "--roles", "downsample").worker_count == 1
    assert config("--workers", "3").worker_count == 3
    with pytest.raises(ConfigError, match="--workers"):
        config("--workers", "0")
    with pytest.raises(ConfigError, match="downsample"):
        config("--workers", "2", "--roles", "downsample")


def test_two_workers_share_every_listener_and_metrics(start_gateway):
    gateway, workers = start_workers(start_gateway, "--downsample-delay", "1s", "--downsample-interval", "1s")
    assert children(gateway.process.pid) == set(workers.values())
    now = int(time.time())
    old = now - 7200  # in a slot that has ended, so the downsampler rolls it up within seconds

    def write(i: int) -> int:
        body = {"metricName": "w_http", "tags": {"host": f"h-{i}"}, "ts": old, "value": i}
        return gateway.post("/api/write/single", body).status

    with ThreadPoolExecutor(8) as pool:  # urllib: a new connection for each request
        assert set(pool.map(write, range(200))) == {200}
    with socket.create_connection(("127.0.0.1", gateway.graphite_port)) as tcp:
        tcp.sendall(b"".join(b"w_tcp.h%d %d %d\n" % (i, i, now - 30) for i in range(10)))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        for i in range(10):
            udp.sendto(b"w_udp.h%d %d %d\n" % (i, i, now - 30), ("127.0.0.1", gateway.graphite_port))
    frame = pickle.dumps([(f"w_pickle.h{i}", (now - 30, i)) for i in range(10)], protocol=2)
    with socket.create_connection(("127.0.0.1", gateway.pickle_port)) as tcp:
        tcp.sendall(struct.pack("!L", len(frame)) + frame)

    series = query(gateway, "w_http", start=str(old - 60))
    assert sorted(s["values"][time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(old))] for s in series) == list(
        range(200)
    )
    for prefix in ("w_tcp", "w_udp", "w_pickle"):
        landed = wait_for(lambda: all(query(gateway, f"{prefix}.h{i}") for i in range(10)), what=f"{prefix} samples")
        assert landed
    # Whichever worker answers /metrics, it counts the samples of both.
    for _ in range(6):
        text = gateway.get("/metrics").body.decode()
        total = sum(float(v) for v in re.findall(r"^tsgate_samples_accepted_total\{.*\} (\S+)$", text, re.MULTILINE))
        assert total == 230
    # process_* metrics, which multiprocess mode cannot sum: one series for each process by pid,
    # the supervisor and both workers among them.
    resident = re.findall(r'^process_resident_memory_bytes\{pid="(\d+)"\} (\S+)$', text, re.MULTILINE)
    assert {gateway.process.pid, *workers.values()} <= {int(pid) for pid, _ in resident}, resident
    assert all(float(value) > 0 for _, value in resident)
    assert re.search(rf'^process_cpu_seconds_total\{{pid="{workers[1]}"\}} ', text, re.MULTILINE)
    metrics_dir = metrics_dir_of(workers[0])
    accepted = counted_by_worker(metrics_dir, "tsgate_samples_accepted_total")  # query executors' files too
    assert set(workers.values()) <= set(accepted) and sum(accepted.values()) == 230
    assert all(accepted[pid] for pid in workers.values()), f"one worker took no writes: {accepted}"
    # Both workers marked their series pending; worker 0 alone rolls all of them up.
    rolled = wait_for(
        lambda: (c := counted_by_worker(metrics_dir, "tsgate_downsampled_series_slots_total"))[workers[0]] >= 200 and c,
        what="the roll-up of the 200 HTTP series",
    )
    assert rolled[workers[1]] == 0


def test_a_killed_worker_is_replaced(start_gateway):
    gateway, workers = start_workers(start_gateway)
    os.kill(workers[1], signal.SIGKILL)
    replaced = wait_for(
        lambda: ready_workers(gateway)[1] != workers[1] and ready_workers(gateway), what="a new worker 1"
    )
    assert f"worker 1 (pid {workers[1]}) died (killed by SIGKILL); restarting it" in gateway.log()
    assert children(gateway.process.pid) == {workers[0], replaced[1]}
    for _ in range(10):
        assert gateway.get("/healthz").status == 200


def test_sigterm_drains_every_worker_and_loses_no_acknowledged_write(start_gateway, tmp_path):
    gateway, workers = start_workers(start_gateway)
    now = int(time.time())
    acknowledged: dict[int, list[int]] = {writer: [] for writer in range(4)}
    stop = threading.Event()

    def writer(number: int) -> None:
        for i in range(5000):
            if stop.is_set():
                return
            body = {"metricName": "w_drain", "tags": {"writer": str(number)}, "ts": now - 4000 + i, "value": i}
            try:
                if gateway.post("/api/write/single", body, timeout=10).status == 200:
                    acknowledged[number].append(i)
            except OSError:
                pass  # refused or reset once the workers stopped listening: not acknowledged

    threads = [threading.Thread(target=writer, args=(n,)) for n in acknowledged]
    for thread in threads:
        thread.start()
    wait_for(lambda: all(len(acks) > 20 for acks in acknowledged.values()), what="writes under way")
    code = gateway.stop()
    stop.set()
    for thread in threads:
        thread.join()
    assert code == 0
    assert not [pid for pid in workers.values() if Path(f"/proc/{pid}").exists()]
    assert "worker 0 (pid %d) stopped (exit code 0)" % workers[0] in gateway.log()

    reader = start_gateway("--data-dir", str(tmp_path / "data"))
    series = {s["tags"]["writer"]: s["values"] for s in query(reader, "w_drain", start=str(now - 4100))}
    for number, acks in acknowledged.items():
        stored = {int(v) for v in series[str(number)].values()}
        assert set(acks) <= stored, f"writer {number}: acknowledged but lost {sorted(set(acks) - stored)[:10]}"


@pytest.mark.slow
def test_a_port_in_use_fails_once_in_the_supervisor(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result, elapsed = tsgate_serve(tmp_path, "--workers", "2", "--http", f"127.0.0.1:{port}")
    assert result.returncode == 1 and elapsed < 10
    assert f"cannot listen on 127.0.0.1:{port} (--http): Address already in use" in result.stderr
    assert "worker 0 started" not in result.stderr


@pytest.mark.slow
def test_a_worker_that_cannot_start_makes_the_supervisor_give_up_at_once_in_one_line(tmp_path):
    """Worker 0's first start failing (an unreachable store) is not retried: the same settings
    would fail again. Its own line is the whole output."""
    store = f"cassandra://127.0.0.1:{free_port()}/ks?request_timeout=1s"
    result, elapsed = tsgate_serve(tmp_path, "--workers", "2", "--http", f"127.0.0.1:{free_port()}", "--store", store)
    assert result.returncode == 1 and elapsed < 30, result.stderr
    (line,) = result.stderr.splitlines()
    assert "ERROR [worker 0 pid " in line and f"could not start: --store {store}: cannot reach Cassandra" in line
