"""Run Debian's real `prometheus` (2.42) on loopback for end-to-end tests, and query it."""

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from gateway.app.devservices.process import free_port, terminate


def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError(
            "Debian's prometheus is needed for these tests: apt-get install -y prometheus (.ci/run does it)"
        )
    return binary


class PrometheusProcess:
    """A Prometheus on loopback: Debian's 2.42 unless ``binary`` names another (tests/prometheus3.py)."""

    def __init__(self, workdir: Path, config: str, *flags: str, binary: str | None = None):
        self.binary = binary
        self.workdir = workdir
        self.flags = flags
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(config.replace("SELF_PORT", str(self.port)))
        self.log_path = workdir / "prometheus.log"
        self.process = None

    def start(self, timeout: float = 60) -> "PrometheusProcess":
        command = [
            self.binary or prometheus_binary(),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=info",
            *self.flags,
        ]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=self.log_path.open("ab"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready in {timeout}s:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        terminate(self.process, 30)

    def api(self, path: str, **params) -> dict:
        url = f"http://127.0.0.1:{self.port}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return json.loads(error.read())
