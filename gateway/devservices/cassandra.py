"""A real single-node Cassandra 5.0 assembled from Maven Central jars.

There is no Docker and no Apache download site on our machines, but Maven Central
serves cassandra-all and every runtime dependency, which is all CassandraDaemon needs:
we resolve them once into a cache and start the JVM ourselves with a generated
cassandra.yaml and the flags of Cassandra's own conf/jvm17-server.options.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
from cassandra.policies import RoundRobinPolicy

from gateway.devservices.process import free_port, terminate

DEFAULT_CASSANDRA_VERSION = "5.0.9"
POM = Path(__file__).with_name("pom.xml")
MAIN_CLASS = "org.apache.cassandra.service.CassandraDaemon"

# From Cassandra's conf/jvm17-server.options: Cassandra reaches into JDK internals.
JVM17_FLAGS = [
    "-Djdk.attach.allowAttachSelf=true",
    "-Dio.netty.tryReflectionSetAccessible=true",
    *(
        f"--add-exports={target}=ALL-UNNAMED"
        for target in (
            "java.base/jdk.internal.misc",
            "java.management.rmi/com.sun.jmx.remote.internal.rmi",
            "java.rmi/sun.rmi.registry",
            "java.rmi/sun.rmi.server",
            "java.sql/java.sql",
            "java.base/java.lang.ref",
            "jdk.unsupported/sun.misc",
        )
    ),
    *(
        f"--add-opens={target}=ALL-UNNAMED"
        for target in (
            "java.base/java.lang.module",
            "java.base/jdk.internal.loader",
            "java.base/jdk.internal.ref",
            "java.base/jdk.internal.reflect",
            "java.base/jdk.internal.math",
            "java.base/jdk.internal.module",
            "java.base/jdk.internal.util.jar",
            "java.base/sun.nio.ch",
            "java.base/java.io",
            "java.base/java.lang.reflect",
            "java.base/java.lang",
            "java.base/java.util",
            "java.base/java.nio",
            "jdk.management/com.sun.management.internal",
        )
    ),
]

# Cassandra's INFO lines tell why a start is slow or failed; the libraries' INFO noise does not.
LOGBACK_XML = """<configuration>
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%-5level [%thread] %date{ISO8601} %logger{0}:%line - %msg%n</pattern></encoder>
  </appender>
  <logger name="org.apache.cassandra" level="INFO"/>
  <root level="WARN"><appender-ref ref="STDOUT"/></root>
</configuration>
"""


def _log(message: str) -> None:
    print(f"tsgate devservices: {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """Where resolved artifacts live; shared by every run on the machine so jars are fetched once."""
    return Path(os.environ.get("TSGATE_CACHE_DIR") or Path.home() / ".cache" / "tsgate")


def cassandra_version(version: str | None = None) -> str:
    return version or os.environ.get("TSGATE_CASSANDRA_VERSION") or DEFAULT_CASSANDRA_VERSION


def ensure_cassandra_jars(version: str | None = None) -> Path:
    """Return a directory holding cassandra-all and its runtime jars, resolving them with Maven if needed.

    A marker file written after a successful copy makes an interrupted resolve start over
    instead of leaving a half-filled lib dir that would fail later with class-not-found errors.
    A file lock keeps concurrent test processes from resolving into the same directory at once.
    """
    version = cassandra_version(version)
    home = cache_dir() / f"cassandra-{version}"
    lib = home / "lib"
    marker = home / "complete"
    if marker.exists():
        return lib
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError(
            "Maven ('mvn') is needed to fetch Cassandra from Maven Central but is not on PATH; "
            "install it (Debian: apt-get install -y maven)"
        )
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return lib
        shutil.rmtree(lib, ignore_errors=True)
        shutil.copyfile(POM, home / "pom.xml")
        _log(f"resolving cassandra-all {version} and its runtime dependencies from Maven Central into {lib} ...")
        started = time.monotonic()
        result = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                "dependency:copy-dependencies",
                f"-Dcassandra.version={version}",
                f"-DoutputDirectory={lib}",
            ],
            cwd=home,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if result.returncode != 0 or not (lib / f"cassandra-all-{version}.jar").exists():
            tail = "\n".join(result.stdout.splitlines()[-30:])
            raise RuntimeError(f"mvn could not resolve cassandra-all {version} (exit {result.returncode}):\n{tail}")
        jars = len(list(lib.glob("*.jar")))
        marker.write_text(f"{jars} jars\n")
        _log(f"resolved {jars} jars in {time.monotonic() - started:.0f}s")
    return lib


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        raise RuntimeError("Java 11 or 17 ('java') is needed to run Cassandra 5.0 but was not found")
    return java


class CassandraServer:
    """One Cassandra node whose data lives in workdir, so stop() then start() brings the same node back.

    Ports are chosen once, in the constructor, so clients keep their contact point across restarts.
    """

    host = "127.0.0.1"

    def __init__(self, workdir: Path, native_port: int | None = None, heap: str = "1G", version: str | None = None):
        self.workdir = Path(workdir).resolve()
        self.heap = heap
        self.version = cassandra_version(version)
        self.native_port = native_port or free_port()
        self.storage_port = free_port()
        self.jmx_port = free_port()
        self.log_path = self.workdir / "cassandra.log"
        self._process: subprocess.Popen | None = None
        self._log_offset = 0

    @property
    def port(self) -> int:
        return self.native_port

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __enter__(self) -> CassandraServer:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self, timeout: float = 240) -> None:
        """Start the JVM and return once a CQL query succeeds; raise RuntimeError quoting the log if not."""
        if self.running:
            return
        lib = ensure_cassandra_jars(self.version)
        if self._port_open():
            raise RuntimeError(f"cannot start Cassandra: something already listens on {self.host}:{self.port}")
        self._write_config()
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                self._command(lib),
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        atexit.register(self.stop)
        deadline = started + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                code = self._process.returncode
                self.stop()
                raise RuntimeError(f"Cassandra exited with code {code} while starting.\n{self._log_report()}")
            if self._port_open() and self._query_ok():
                _log(f"cassandra {self.version} ready at {self.host}:{self.port} in {time.monotonic() - started:.1f}s")
                return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"Cassandra did not answer CQL within {timeout:.0f}s.\n{self._log_report()}")

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM lets Cassandra flush and close cleanly; SIGKILL only if it hangs. The data dir is kept."""
        atexit.unregister(self.stop)
        process, self._process = self._process, None
        terminate(process, timeout)

    def _log_report(self, tail: int = 30) -> str:
        """Errors of this run first (Cassandra logs a lot while shutting down after one), then the log's tail."""
        with open(self.log_path, "rb") as log:
            log.seek(self._log_offset)
            lines = log.read().decode(errors="replace").splitlines()
        errors = [line for line in lines if line.startswith("ERROR") or "Exception" in line or "Caused by" in line]
        return "\n".join([f"Errors in {self.log_path}:", *errors[:20], f"Last {tail} lines:", *lines[-tail:]])

    def _port_open(self) -> bool:
        """Used before starting too, so a server already on the port is not mistaken for ours."""
        try:
            socket.create_connection((self.host, self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def _query_ok(self) -> bool:
        """Any driver error only means "not ready yet": the caller keeps polling until its deadline."""
        cluster = Cluster(
            [self.host],
            port=self.port,
            connect_timeout=5,
            execution_profiles={EXEC_PROFILE_DEFAULT: ExecutionProfile(load_balancing_policy=RoundRobinPolicy())},
        )
        try:
            cluster.connect().execute("SELECT release_version FROM system.local", timeout=10)
            return True
        except Exception:
            return False
        finally:
            cluster.shutdown()

    def _command(self, lib: Path) -> list[str]:
        classpath = ":".join(str(jar) for jar in sorted(lib.glob("*.jar")))
        return [
            _java(),
            f"-Xms{self.heap}",
            f"-Xmx{self.heap}",
            "-XX:+ExitOnOutOfMemoryError",
            *JVM17_FLAGS,
            "-Djava.net.preferIPv4Stack=true",
            f"-Dcassandra.config={(self.workdir / 'cassandra.yaml').as_uri()}",
            f"-Dcassandra.storagedir={self.workdir}",
            f"-Dlogback.configurationFile={self.workdir / 'logback.xml'}",
            "-Dcassandra-foreground=yes",
            f"-Dcassandra.jmx.local.port={self.jmx_port}",
            "-Dcassandra.skip_wait_for_gossip_to_settle=0",
            # A single node has no peers to tell it is leaving; the default waits 2 s for them on every stop.
            "-Dcassandra.shutdown_announce_in_ms=0",
            # Cassandra sizes memtable rows by measuring 100000 sample rows at boot (1.5-3 s here);
            # 1000 gives the same estimate (180-182 bytes) in a tenth of the time.
            "-Dcassandra.memtable_row_overhead_computation_step=1000",
            "-cp",
            classpath,
            MAIN_CLASS,
        ]

    def _write_config(self) -> None:
        """Write cassandra.yaml (as JSON values, which YAML accepts) sized for a small test box."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "cluster_name": "tsgate-dev",
            "num_tokens": 1,
            "auto_bootstrap": False,
            "partitioner": "org.apache.cassandra.dht.Murmur3Partitioner",
            "endpoint_snitch": "SimpleSnitch",
            "seed_provider": [
                {
                    "class_name": "org.apache.cassandra.locator.SimpleSeedProvider",
                    "parameters": [{"seeds": f"{self.host}:{self.storage_port}"}],
                }
            ],
            "listen_address": self.host,
            "rpc_address": self.host,
            "storage_port": self.storage_port,
            "native_transport_port": self.native_port,
            "start_native_transport": True,
            "data_file_directories": [str(self.workdir / "data")],
            "commitlog_directory": str(self.workdir / "commitlog"),
            "saved_caches_directory": str(self.workdir / "saved_caches"),
            "hints_directory": str(self.workdir / "hints"),
            "cdc_raw_directory": str(self.workdir / "cdc_raw"),
            "commitlog_sync": "periodic",
            "commitlog_sync_period": "10000ms",
            "commitlog_total_space": "256MiB",
            "memtable_heap_space": "64MiB",
            "memtable_offheap_space": "64MiB",
            "memtable_flush_writers": 1,
            "concurrent_reads": 8,
            "concurrent_writes": 8,
            "concurrent_counter_writes": 8,
            "concurrent_compactors": 1,
            "key_cache_size": "16MiB",
            "counter_cache_size": "8MiB",
            "row_cache_size": "0MiB",
            "prepared_statements_cache_size": "16MiB",
            "file_cache_size": "64MiB",
            "networking_cache_size": "32MiB",
            "dynamic_snitch": False,
            "auto_snapshot": False,
            "sasi_indexes_enabled": True,
            "storage_compatibility_mode": "NONE",
        }
        text = "".join(f"{key}: {json.dumps(value)}\n" for key, value in config.items())
        (self.workdir / "cassandra.yaml").write_text(text)
        (self.workdir / "logback.xml").write_text(LOGBACK_XML)
