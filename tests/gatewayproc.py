"""Start a real ``tsgate serve`` process on a free loopback port and talk HTTP to it."""

import contextlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_tsgate(*args: str, timeout: float = 120) -> str:
    """A `tsgate` command that must succeed; its output."""
    result = subprocess.run(
        [sys.executable, "-m", "gateway.app.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def downsample_once(*args: str) -> str:
    """`tsgate downsample --once` with no settle delay (and the given store flags); its output."""
    return run_tsgate("downsample", "--once", "--downsample-delay", "0s", *args)


def tsgate_serve(tmp_path: Path, *args: str, timeout: float = 40) -> tuple[subprocess.CompletedProcess, float]:
    """Run `tsgate serve` until it exits by itself (no carbon listeners unless asked); its result and run time."""
    started = time.monotonic()
    command = [
        sys.executable,
        "-m",
        "gateway.app.cli",
        "serve",
        "--graphite",
        "",
        "--pickle",
        "",
        "--data-dir",
        str(tmp_path / "d"),
        *args,
    ]
    result = subprocess.run(
        command,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return result, time.monotonic() - started


def metric_value(gateway, name: str, headers=None) -> float:
    """One sample of the gateway's /metrics, by its full name and labels; 0 when absent.
    ``headers``: an admin credential, with ``--auth-file``."""
    exposition = gateway.get("/metrics", headers=headers).body.decode()
    match = re.search(rf"^{re.escape(name)} (\S+)$", exposition, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


REDIS_LOOKUPS = 'tsgate_metadata_cache_lookups_total{level="redis",result="miss"}'


def wait_until_redis_is_used(gateway, tenant: str, timeout_s: float = 30) -> None:
    """Write new probe series until the gateway looks one up in Redis: after a Redis failure it
    leaves Redis alone for a while (RedisSeenSeries.RETRY_AFTER_S), whatever that while is."""
    before = metric_value(gateway, REDIS_LOOKUPS)
    deadline = time.monotonic() + timeout_s
    for probe in itertools.count():
        body = {"tenant": tenant, "metricName": "redis_probe", "tags": {"n": str(probe)}, "value": 1}
        assert gateway.post("/api/write/single", body).status == 200
        if metric_value(gateway, REDIS_LOOKUPS) > before:
            return
        assert time.monotonic() < deadline, "the gateway did not use Redis again"
        time.sleep(0.2)


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: every probe stays bound until all are chosen, so the kernel
    cannot hand the same port out twice (a gateway's HTTP and carbon ports once collided)."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]


def free_port() -> int:
    return free_ports(1)[0]


class HTTPAnswer:
    def __init__(self, status: int, headers, body: bytes):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):
        return json.loads(self.body)


class GatewayProcess:
    """One gateway process; ``stop()`` sends SIGTERM and returns the exit code."""

    def __init__(self, workdir: Path, *args: str):
        self.workdir = workdir
        self.args = list(args)
        self.port, self.graphite_port, self.pickle_port = free_ports(3)
        self.process = None
        self.log_path = workdir / f"gateway-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> "GatewayProcess":
        command = [
            sys.executable,
            "-m",
            "gateway.app.cli",
            "serve",
            "--http",
            f"127.0.0.1:{self.port}",
            "--graphite",
            f"127.0.0.1:{self.graphite_port}",
            "--graphite-udp",
            f"127.0.0.1:{self.graphite_port}",
            "--pickle",
            f"127.0.0.1:{self.pickle_port}",
            *self.args,
        ]
        if not {"--data-dir", "--store", "--config"} & set(self.args):
            command += ["--data-dir", str(self.workdir / "data")]
        if "--workers" not in self.args:
            command += ["--workers", "1"]  # one process, as before --workers existed, unless asked
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.process = subprocess.Popen(command, cwd=self.workdir, env=env, stderr=self.log_path.open("ab"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.process.returncode}:\n{self.log()}")
            try:
                if self.get("/healthz").status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"gateway did not answer /healthz within {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30, signum: int = signal.SIGTERM) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signum)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise

    def request(self, method: str, path: str, body=None, headers=None, timeout: float = 30) -> HTTPAnswer:
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return HTTPAnswer(answer.status, answer.headers, answer.read())
        except urllib.error.HTTPError as error:
            return HTTPAnswer(error.code, error.headers, error.read())

    def get(self, path: str, **kwargs) -> HTTPAnswer:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, body, **kwargs) -> HTTPAnswer:
        return self.request("POST", path, body, **kwargs)
