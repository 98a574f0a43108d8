"""A Prometheus 3 server built from the Go module proxy, as the live reference beside Debian's 2.42.

Debian ships Prometheus 2.42 only. Prometheus 3 is built here from the pinned module zip of
``github.com/prometheus/prometheus`` (checked against its SHA-256), with its own go.mod and go.sum
(so every dependency is checked too) and the pinned Go toolchain of tests/compliance.py, without
the web UI's built assets. The build takes minutes and a few GB of Go caches (removed afterwards);
the binary is kept in the cache (``~/.cache/tsgate`` or ``$TSGATE_CACHE_DIR``). The differential
tests that compare with it ask ``build()``, which builds it on a machine without it (as the
remote-write compliance suite is built); ``python -m tests.prometheus3`` builds it ahead.
"""

import fcntl
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

from gateway.app.devservices.cassandra import cache_dir
from tests.compliance import PROXY, _download, _unzip, go_env, go_toolchain

MODULE = "github.com/prometheus/prometheus"
VERSION = "v0.314.0"  # Prometheus 3.14
MODULE_SHA256 = "83f7071d8c90703b57144577ad858d48bd9967287d55f4aade0011121a2c546f"


def _log(message: str) -> None:
    print(f"prometheus 3: {message}", file=sys.stderr, flush=True)


def _target() -> Path:
    return cache_dir() / "prometheus3" / VERSION


def cached_binary() -> Path | None:
    """The built Prometheus 3 binary, or None when this machine has not built it."""
    binary = _target() / "prometheus"
    return binary if (_target() / "complete").exists() else None


def module_source() -> Path:
    """The pinned module's source tree (its PromQL test files, its go.mod), unpacked once."""
    source = _target() / "src"
    if (source / "go.mod").exists() and (_target() / "unpacked").exists():
        return source
    _target().mkdir(parents=True, exist_ok=True)
    with open(_target() / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (_target() / "unpacked").exists():
            shutil.rmtree(source, ignore_errors=True)
            archive = _target() / "module.zip"
            _log(f"downloading {MODULE}@{VERSION} ...")
            _download(f"{PROXY}/{MODULE}/@v/{VERSION}.zip", MODULE_SHA256, archive)
            _unzip(archive, f"{MODULE}@{VERSION}/", source)
            archive.unlink()
            (_target() / "unpacked").write_text(f"{VERSION}\n")
    return source


def build() -> Path:
    """Build ``cmd/prometheus`` of the pinned version once; the binary's path."""
    binary = cached_binary()
    if binary is not None:
        return binary
    source = module_source()
    go = go_toolchain()
    with open(_target() / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (_target() / "complete").exists():
            return _target() / "prometheus"
        started = time.monotonic()
        build_dir = _target() / "build"
        command = [str(go), "build", "-o", str(_target() / "prometheus"), "./cmd/prometheus"]
        _log(f"building Prometheus {VERSION} (modules from the proxy, checked against its go.sum) ...")
        result = subprocess.run(
            command,
            cwd=source,
            env={**go_env(go, build_dir), "GOWORK": "off"},
            capture_output=True,
            text=True,
            timeout=3600,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
        shutil.rmtree(build_dir)
        (_target() / "complete").write_text(f"built in {time.monotonic() - started:.0f}s\n")
        _log(f"Prometheus {VERSION} ready in {time.monotonic() - started:.0f}s")
    return _target() / "prometheus"


def answer_getters(gateway, tenant: str, reference):
    """GETs of an API path with its query string, decoded: (tsgate's for ``tenant``, the reference
    PrometheusProcess's), for the differential tests that ask both the same questions."""

    def from_gateway(path: str) -> dict:
        return gateway.get(path, headers={"X-Scope-OrgID": tenant}).json()

    def from_reference(path: str) -> dict:
        base, _, query = path.partition("?")
        return reference.api(base, **dict(urllib.parse.parse_qsl(query)))

    return from_gateway, from_reference


if __name__ == "__main__":
    print(build(), file=sys.stdout)
