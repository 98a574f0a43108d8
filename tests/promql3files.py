"""Prometheus 3's own PromQL test files (promql/promqltest/testdata/*.test of the Go module
github.com/prometheus/prometheus at a pinned version), downloaded once from the Go module proxy,
checked against their pinned SHA-256 and kept in the cache (``~/.cache/tsgate`` or
``$TSGATE_CACHE_DIR``), as tests/compliance.py keeps the remote-write suite. Not in the repository."""

import fcntl
from pathlib import Path

from gateway.app.devservices.cassandra import cache_dir
from tests.compliance import PROXY, _download, _unzip

MODULE = "github.com/prometheus/prometheus"
VERSION = "v0.314.0"  # Prometheus 3.14
SHA256 = "83f7071d8c90703b57144577ad858d48bd9967287d55f4aade0011121a2c546f"
TESTDATA = "promql/promqltest/testdata/"


def testdata() -> Path:
    """The directory of the pinned version's .test files, downloaded on first use."""
    home = cache_dir() / "prometheus-testdata"
    target = home / VERSION
    if (target / "complete").exists():
        return target
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "complete").exists():
            target.mkdir(exist_ok=True)
            archive = home / f"{VERSION}.zip"
            _download(f"{PROXY}/{MODULE}/@v/{VERSION}.zip", SHA256, archive)
            _unzip(archive, f"{MODULE}@{VERSION}/{TESTDATA}", target)
            archive.unlink()
            (target / "complete").write_text(f"{MODULE}@{VERSION}\n")
    return target
