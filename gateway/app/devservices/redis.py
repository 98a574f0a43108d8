"""A real, throw-away redis-server on loopback for tests and development."""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis

from gateway.app.devservices.process import free_port, terminate

APT_LISTS = Path("/var/lib/apt/lists")


def _find_redis_server() -> str | None:
    """PATH first, then Debian's location, which a trimmed PATH (CI, cron) may leave out."""
    return shutil.which("redis-server") or shutil.which("redis-server", path="/usr/bin")


def ensure_redis_server() -> str:
    """Return the path of redis-server, installing Debian's package when we are root and it is missing."""
    found = _find_redis_server()
    if found:
        return found
    if os.geteuid() != 0:
        raise RuntimeError("redis-server is not installed; install it (Debian: sudo apt-get install -y redis-server)")
    if not any(APT_LISTS.glob("*_Packages*")):
        _apt_get("update")
    _apt_get("install", "-y", "redis-server")
    found = _find_redis_server()
    if not found:
        raise RuntimeError("apt-get installed redis-server but no redis-server binary was found")
    return found


def _apt_get(*args: str) -> None:
    """Wait for another apt run's lock instead of failing (fresh CI machines); apt's chatter goes to stderr."""
    command = ["apt-get", "-o", "DPkg::Lock::Timeout=600", *args]
    print(f"tsgate devservices: {' '.join(command)}", file=sys.stderr, flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    result = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, stdout=2)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed with exit code {result.returncode}")


def _listening(host: str, port: int) -> bool:
    """Checked before starting, so a server already on the port is not mistaken for ours."""
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


class RedisServer:
    """One redis-server without persistence; the port is chosen once so stop() then start() comes back at the same URL."""

    host = "127.0.0.1"

    def __init__(self, workdir: Path, port: int | None = None):
        self.workdir = Path(workdir).resolve()
        self.port = port or free_port()
        self.log_path = self.workdir / "redis.log"
        self._process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self, timeout: float = 30) -> None:
        """Start redis-server and return once it answers PING; raise RuntimeError with the log tail if not."""
        if self.running:
            return
        binary = ensure_redis_server()
        if _listening(self.host, self.port):
            raise RuntimeError(f"cannot start redis-server: something already listens on {self.host}:{self.port}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        command = [
            binary,
            "--bind",
            self.host,
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
            "--daemonize",
            "no",
        ]
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        atexit.register(self.stop)
        client = redis.Redis(host=self.host, port=self.port, socket_connect_timeout=1, socket_timeout=1)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self._process.poll() is not None:
                    code = self._process.returncode
                    self.stop()
                    raise RuntimeError(f"redis-server exited with code {code} while starting:\n{self._log_tail()}")
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    time.sleep(0.05)
        finally:
            client.close()
        self.stop()
        raise RuntimeError(f"redis-server did not answer PING within {timeout:.0f}s:\n{self._log_tail()}")

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM (nothing to save, so it is quick); SIGKILL only if it hangs."""
        atexit.unregister(self.stop)
        process, self._process = self._process, None
        terminate(process, timeout)

    def _log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
