"""The Prometheus remote-write receiver compliance suite (prometheus/compliance, remotewrite/receiver)
run against a receiver URL, its results read case by case.

The suite is Go tests; everything comes from the Go module proxy, pinned: a Go toolchain, the
suite's module zip (both checked against their SHA-256) and its dependencies (checked against the
suite's go.sum). The suite is compiled once into a test binary kept in the cache
(``~/.cache/tsgate`` or ``$TSGATE_CACHE_DIR``) with the toolchain; later runs only execute it.
"""

import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from gateway.app.devservices.cassandra import cache_dir

PROXY = "https://proxy.golang.org"
SUITE_MODULE = "github.com/prometheus/compliance/remotewrite/receiver"
SUITE_VERSION = "v0.0.0-20260806071727-67b8327a2e93"
SUITE_SHA256 = "ff71886a055b1fbf47086b52486c0da40b74839230c5ebd6b0698c0e37ce8a3c"
GO_VERSION = "1.25.14"  # the suite's go.mod asks for 1.25 (it labels cases with testing.T.Attr)
GO_SHA256 = {
    "linux-amd64": "1bb543a7745d4c6e045a1bfdb4c4d5a0b05b71ee8b8ff72c0a351598b26991a4",
    "linux-arm64": "eee0803776a2a3d42f0620d7b0156277350debb5d39c99a9b61c8b12108fd92c",
}
GO_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
RECEIVER_NAME = "tsgate"


@dataclass(frozen=True)
class Case:
    """One case of the suite: its Go test name, RFC level (MUST, SHOULD, MAY) and outcome."""

    name: str
    level: str
    passed: bool
    output: str


def _log(message: str) -> None:
    print(f"remote-write compliance: {message}", file=sys.stderr, flush=True)


def _download(url: str, sha256: str, target: Path) -> None:
    """Fetch url into target, refusing content whose SHA-256 is not the pinned one."""
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=60) as answer, target.open("wb") as out:
            while chunk := answer.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except (urllib.error.URLError, OSError) as error:
        raise RuntimeError(f"cannot download {url}: {error}; the compliance test needs the Go module proxy") from error
    if digest.hexdigest() != sha256:
        raise RuntimeError(f"{url} has SHA-256 {digest.hexdigest()}, expected the pinned {sha256}")


def _unzip(archive: Path, prefix: str, target: Path) -> None:
    """Extract the members under prefix (a module zip's ``path@version/``) into target."""
    with zipfile.ZipFile(archive) as zipped:
        for member in zipped.infolist():
            if member.filename.startswith(prefix) and not member.is_dir():
                path = target / member.filename[len(prefix) :]
                path.parent.mkdir(parents=True, exist_ok=True)
                with zipped.open(member) as source, path.open("wb") as out:
                    shutil.copyfileobj(source, out)


def _go_toolchain(home: Path) -> Path:
    """The pinned Go toolchain's ``go`` binary, downloaded from the proxy on first use."""
    system = f"{sys.platform}-{GO_ARCH.get(platform.machine().lower(), platform.machine())}"
    if system not in GO_SHA256:
        raise RuntimeError(f"no pinned Go toolchain for {system}; add its SHA-256 to tests/compliance.py")
    root = home / f"go{GO_VERSION}"
    if not (root / "complete").exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        version = f"v0.0.1-go{GO_VERSION}.{system}"
        _log(f"downloading Go {GO_VERSION} ({system}) from {PROXY} ...")
        _download(f"{PROXY}/golang.org/toolchain/@v/{version}.zip", GO_SHA256[system], root / "go.zip")
        _unzip(root / "go.zip", f"golang.org/toolchain@{version}/", root)
        (root / "go.zip").unlink()
        # Module zips carry no file modes: make the commands executable, as the go command does.
        for command in [*(root / "bin").iterdir(), *(root / "pkg" / "tool").glob("*/*")]:
            command.chmod(0o755)
        (root / "complete").write_text(f"go{GO_VERSION}\n")
    return root / "bin" / "go"


def go_env(go: Path, build: Path) -> dict[str, str]:
    """The environment of a pinned, offline-reproducible build: modules from the proxy checked
    against go.sum, the module and build caches under ``build``."""
    return {
        "PATH": f"{go.parent}:/usr/bin:/bin",
        "HOME": str(build),
        "GOTOOLCHAIN": "local",
        "GOPROXY": PROXY,
        "GOFLAGS": "-mod=readonly -modcacherw",
        "GOMODCACHE": str(build / "mod"),
        "GOCACHE": str(build / "cache"),
        "GOPATH": str(build / "gopath"),
        "CGO_ENABLED": "0",
        **{name: value for name, value in os.environ.items() if name.lower().endswith("_proxy")},
    }


def go_toolchain() -> Path:
    """The pinned ``go`` binary, shared with the suite's build (downloaded once, under its lock)."""
    home = cache_dir() / "rw-compliance"
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _go_toolchain(home)


def suite_binaries() -> tuple[Path, Path]:
    """(the compiled suite, test2json), built once per pinned version and cached."""
    home = cache_dir() / "rw-compliance"
    target = home / f"{SUITE_VERSION}-go{GO_VERSION}"
    suite, test2json = target / "receiver.test", target / "test2json"
    if (target / "complete").exists():
        return suite, test2json
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "complete").exists():
            return suite, test2json
        started = time.monotonic()
        go = _go_toolchain(home)
        shutil.rmtree(target, ignore_errors=True)
        source, build = target / "src", target / "build"
        source.mkdir(parents=True)
        _log(f"downloading {SUITE_MODULE}@{SUITE_VERSION} ...")
        _download(f"{PROXY}/{SUITE_MODULE}/@v/{SUITE_VERSION}.zip", SUITE_SHA256, target / "suite.zip")
        _unzip(target / "suite.zip", f"{SUITE_MODULE}@{SUITE_VERSION}/", source)
        (target / "suite.zip").unlink()
        env = go_env(go, build)
        _log("building the suite and its dependencies (downloaded from the proxy) ...")
        commands = [
            [str(go), "test", "-c", "-o", str(suite), "."],
            [str(go), "build", "-o", str(test2json), "cmd/test2json"],  # go 1.25 ships it unbuilt
        ]
        for command in commands:
            result = subprocess.run(command, cwd=source, env=env, capture_output=True, text=True, timeout=1200)
            if result.returncode != 0:
                raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
        shutil.rmtree(build)  # about 1 GB of modules and build cache; the two binaries are all we need
        (target / "complete").write_text(f"built in {time.monotonic() - started:.0f}s\n")
        _log(f"ready in {time.monotonic() - started:.0f}s")
    return suite, test2json


def run_suite(write_url: str, workdir: Path, timeout: float = 150) -> list[Case]:
    """Run every case of the suite against the receiver at write_url; their results."""
    suite, test2json = suite_binaries()
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "compliance.yml"
    config.write_text(f"remote_write:\n  - name: {RECEIVER_NAME}\n    url: {json.dumps(write_url)}\n")
    result = subprocess.run(
        [str(test2json), "-p", "receiver", str(suite), "-test.v=test2json", f"-test.timeout={int(timeout)}s"],
        cwd=workdir,
        env={"PATH": "/usr/bin:/bin", "HOME": str(workdir), "PROMETHEUS_RW2_COMPLIANCE_CONFIG_FILE": str(config)},
        capture_output=True,
        text=True,
        timeout=timeout + 30,
    )
    cases = parse_events(result.stdout)
    if not cases:
        raise RuntimeError(
            f"the suite ran no case (exit {result.returncode}):\n{result.stdout[-4000:]}{result.stderr[-4000:]}"
        )
    return cases


def parse_events(stream: str) -> list[Case]:
    """Cases from test2json events. A case is a Go test that sent one request to the receiver (a
    subtest named after it); its level is the nearest ``rfcLevel`` attribute up its test path."""
    attributes: dict[str, dict[str, str]] = {}
    outcomes: dict[str, str] = {}
    outputs: dict[str, list[str]] = {}
    for line in stream.splitlines():
        event = json.loads(line)
        test = event.get("Test")
        if test is None:
            continue
        if event["Action"] == "attr":
            attributes.setdefault(test, {})[event["Key"]] = event["Value"]
        elif event["Action"] == "output":
            outputs.setdefault(test, []).append(event["Output"])
        elif event["Action"] in ("pass", "fail", "skip"):
            outcomes[test] = event["Action"]

    def level(name: str) -> str:
        parts = name.split("/")
        for end in range(len(parts), 0, -1):
            found = attributes.get("/".join(parts[:end]), {}).get("rfcLevel")
            if found:
                return found
        return "unlabelled"

    cases = []
    for test, outcome in sorted(outcomes.items()):
        name, _, leaf = test.rpartition("/")
        if name and leaf == RECEIVER_NAME:
            cases.append(Case(name, level(name), outcome == "pass", "".join(outputs.get(test, []))))
    return cases
