"""Prometheus's own decoder of histogram chunks, for the round-trip test of STREAMED_XOR_CHUNKS.

tests/data/chunkdecode is a small Go program pinned (go.mod, go.sum) to the prometheus/prometheus
module v0.309.1 (Prometheus 3.9.1): it asks a remote read endpoint for STREAMED_XOR_CHUNKS and
decodes every chunk with tsdb/chunkenc. It is built once with the pinned Go toolchain
(tests/compliance.py) and cached, keyed by its sources, under ``~/.cache/tsgate`` or
``$TSGATE_CACHE_DIR``; later runs only execute it.
"""

import fcntl
import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

from gateway.app.devservices.cassandra import cache_dir
from tests.compliance import GO_VERSION, go_env, go_toolchain

SOURCE = Path(__file__).parent / "data" / "chunkdecode"
FILES = ("go.mod", "go.sum", "main.go")


def decoder_binary() -> Path:
    """The built decoder, compiled on first use (a minute: modules from the proxy)."""
    digest = hashlib.sha256(b"".join((SOURCE / name).read_bytes() for name in FILES)).hexdigest()[:16]
    home = cache_dir() / "chunkdecode"
    target = home / f"{digest}-go{GO_VERSION}"
    binary = target / "chunkdecode"
    if (target / "complete").exists():
        return binary
    home.mkdir(parents=True, exist_ok=True)
    go = go_toolchain()
    with open(home / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "complete").exists():
            return binary
        started = time.monotonic()
        shutil.rmtree(target, ignore_errors=True)
        source, build = target / "src", target / "build"
        shutil.copytree(SOURCE, source)
        command = [str(go), "build", "-o", str(binary), "."]
        result = subprocess.run(
            command, cwd=source, env=go_env(go, build), capture_output=True, text=True, timeout=1200
        )
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
        shutil.rmtree(build)  # the module and build caches; the binary is all we need
        (target / "complete").write_text(f"built in {time.monotonic() - started:.0f}s\n")
    return binary


def decode_remote_read(url: str, tenant: str, start_ms: int, end_ms: int, name: str) -> list[dict]:
    """Every chunk of the streamed answer to ``__name__="name"``, as chunkenc decodes it: one
    dict a chunk (labels, encoding, min/max time, counter-reset header, samples; floats as
    the hex of their bits)."""
    result = subprocess.run(
        [str(decoder_binary()), url, tenant, str(start_ms), str(end_ms), name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        raise RuntimeError(f"chunkdecode failed ({result.returncode}): {result.stderr[-4000:]}")
    return [json.loads(line) for line in result.stdout.splitlines()]
