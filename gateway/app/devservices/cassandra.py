"""A real Cassandra 5.0, one node or a local cluster, assembled from Maven Central jars.

There is no Docker and no Apache download site on our machines, but Maven Central
serves cassandra-all and every runtime dependency, which is all CassandraDaemon needs:
we resolve them once into a cache and start the JVM ourselves with a generated
cassandra.yaml and the flags of Cassandra's own conf/jvm17-server.options.

A cluster (CassandraCluster) runs its nodes on loopback aliases, 127.0.0.1, 127.0.0.2, ...,
all on the same ports, as nodes on separate machines would: Linux routes all of 127.0.0.0/8
to the loopback interface, so no setup is needed.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from cassandra import ConsistencyLevel
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
from cassandra.policies import RoundRobinPolicy, WhiteListRoundRobinPolicy
from cassandra.query import SimpleStatement

from gateway.app.devservices.process import free_port, terminate

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
    A node of a cluster gets its address, the cluster's ports and seed, its token and a data
    center from CassandraCluster; a lone node makes up its own.
    """

    def __init__(
        self,
        workdir: Path,
        native_port: int | None = None,
        heap: str = "1G",
        version: str | None = None,
        *,
        host: str = "127.0.0.1",
        storage_port: int | None = None,
        seed: str | None = None,
        initial_token: int | None = None,
        datacenter: str | None = None,
    ):
        self.workdir = Path(workdir).resolve()
        self.heap = heap
        self.version = cassandra_version(version)
        self.host = host
        self.native_port = native_port or free_port()
        self.storage_port = storage_port or free_port()
        self.jmx_port = free_port()
        self.seed = seed or f"{host}:{self.storage_port}"
        self.initial_token = initial_token
        self.datacenter = datacenter
        self.log_path = self.workdir / "cassandra.log"
        self._process: subprocess.Popen | None = None
        self._log_offset = 0
        self._started = 0.0

    @property
    def port(self) -> int:
        return self.native_port

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """The JVM's process id (kill it to try a node going down), None before launch()."""
        return self._process.pid if self._process is not None else None

    @property
    def exit_status(self) -> str:
        """How the JVM ended, for a log line: ``exit code 1``, ``killed by SIGKILL``."""
        code = self._process.poll() if self._process is not None else None
        if code is None:
            return "not started" if self._process is None else "running"
        return f"exit code {code}" if code >= 0 else f"killed by {signal.Signals(-code).name}"

    def __enter__(self) -> CassandraServer:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self, timeout: float = 240) -> None:
        """Start the JVM and return once a CQL query succeeds; raise RuntimeError quoting the log if not."""
        self.launch()
        self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the JVM and return at once (a cluster launches its nodes side by side)."""
        if self.running:
            return
        lib = ensure_cassandra_jars(self.version)
        if self._port_open():
            raise RuntimeError(f"cannot start Cassandra: something already listens on {self.host}:{self.port}")
        self._write_config()
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._started = time.monotonic()
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

    def wait_ready(self, timeout: float = 240) -> None:
        """Return once the launched node answers CQL; stop it and raise RuntimeError if it does not."""
        assert self._process is not None, "launch() first"
        deadline = self._started + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                code = self._process.returncode
                self.stop()
                raise RuntimeError(f"Cassandra exited with code {code} while starting.\n{self._log_report()}")
            if self._port_open() and self._query_ok():
                _log(
                    f"cassandra {self.version} ready at {self.host}:{self.port}"
                    f" in {time.monotonic() - self._started:.1f}s"
                )
                return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"Cassandra did not answer CQL within {timeout:.0f}s.\n{self._log_report()}")

    def kill(self) -> None:
        """SIGKILL, as a crashed machine: no flush, no goodbye to the peers. The data dir is kept."""
        atexit.unregister(self.stop)
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM lets Cassandra flush and close cleanly; SIGKILL only if it hangs. The data dir is kept."""
        atexit.unregister(self.stop)
        process, self._process = self._process, None
        terminate(process, timeout)

    def ask_to_stop(self) -> None:
        """SIGTERM without waiting, so that several nodes shut down side by side (stop() waits)."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()

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
        return self.query("SELECT release_version FROM system.local") is not None

    def query(self, cql: str, consistency: int = ConsistencyLevel.ONE) -> list | None:
        """The rows of one query coordinated by this node (no other node is tried); None on any error."""
        policy = WhiteListRoundRobinPolicy([self.host]) if self.datacenter else RoundRobinPolicy()
        cluster = Cluster(
            [self.host],
            port=self.port,
            connect_timeout=5,
            protocol_version=5,
            execution_profiles={EXEC_PROFILE_DEFAULT: ExecutionProfile(load_balancing_policy=policy)},
        )
        try:
            return list(cluster.connect().execute(SimpleStatement(cql, consistency_level=consistency), timeout=10))
        except Exception:
            return None
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
            *self._node_flags(),
            # Cassandra sizes memtable rows by measuring 100000 sample rows at boot (1.5-3 s here);
            # 1000 gives the same estimate (180-182 bytes) in a tenth of the time.
            "-Dcassandra.memtable_row_overhead_computation_step=1000",
            "-cp",
            classpath,
            MAIN_CLASS,
        ]

    def _node_flags(self) -> list[str]:
        if self.datacenter is None:
            # A single node has no peers to tell it is leaving; the default waits 2 s for them on every stop.
            return ["-Dcassandra.shutdown_announce_in_ms=0"]
        # A node of a cluster announces its shutdown (peers mark it down at once, not after the
        # failure detector's ~10 s) and reads its data center from its own rackdc file.
        return [f"-Dcassandra-rackdc.properties={(self.workdir / 'cassandra-rackdc.properties').as_uri()}"]

    def _commitlog_sync(self) -> dict[str, str]:
        """A lone node syncs its commit log every 10 s, Cassandra's default. A node of a cluster
        syncs before it acknowledges (batch): a write acknowledged at QUORUM then survives the
        kill -9 of every replica that has it, where periodic sync replays only what was synced
        and the tests kill two nodes of three (docs/configuration.rst)."""
        if self.datacenter is None:
            return {"commitlog_sync": "periodic", "commitlog_sync_period": "10000ms"}
        return {"commitlog_sync": "batch"}

    def _write_config(self) -> None:
        """Write cassandra.yaml (as JSON values, which YAML accepts) sized for a small test box."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "cluster_name": "tsgate-dev",
            "num_tokens": 1,
            "auto_bootstrap": False,
            "partitioner": "org.apache.cassandra.dht.Murmur3Partitioner",
            "endpoint_snitch": "GossipingPropertyFileSnitch" if self.datacenter else "SimpleSnitch",
            "seed_provider": [
                {
                    "class_name": "org.apache.cassandra.locator.SimpleSeedProvider",
                    "parameters": [{"seeds": self.seed}],
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
            **self._commitlog_sync(),
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
            # A cluster keeps Cassandra's default: reads avoid a replica that stopped answering.
            "dynamic_snitch": self.datacenter is not None,
            "auto_snapshot": False,
            "sasi_indexes_enabled": True,
            "storage_compatibility_mode": "NONE",
        }
        if self.initial_token is not None:
            config["initial_token"] = str(self.initial_token)
        text = "".join(f"{key}: {json.dumps(value)}\n" for key, value in config.items())
        (self.workdir / "cassandra.yaml").write_text(text)
        if self.datacenter:
            (self.workdir / "cassandra-rackdc.properties").write_text(f"dc={self.datacenter}\nrack=rack1\n")
        (self.workdir / "logback.xml").write_text(LOGBACK_XML)


def port_free_on(hosts: list[str]) -> int:
    """A port nobody listens on at any of ``hosts``: every node of a cluster uses the same ports."""
    while True:
        port = free_port()
        probes = []
        try:
            for host in hosts:
                probe = socket.socket()
                probes.append(probe)
                probe.bind((host, port))
            return port
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()


class CassandraCluster:
    """Nodes on 127.0.0.1, 127.0.0.2, ... sharing the native and storage ports, one data center.

    Each node owns an equal share of the token ring (one evenly spaced token a node, no vnodes,
    no bootstrap streaming): a dev cluster starts empty, so nothing has to move, and data spreads
    evenly by construction. The first node is the seed; it starts first, the others then start
    side by side, and start() returns once every node sees every other one as a normal member.
    """

    def __init__(
        self,
        workdir: Path,
        nodes: int = 3,
        native_port: int | None = None,
        heap: str = "1G",
        datacenter: str = "dc1",
        version: str | None = None,
    ):
        if nodes < 1 or nodes > 254:
            raise ValueError("a local cluster has 1 to 254 nodes")
        hosts = [f"127.0.0.{index}" for index in range(1, nodes + 1)]
        native_port = native_port or port_free_on(hosts)
        storage_port = port_free_on(hosts)
        self.datacenter = datacenter
        self.nodes = [
            CassandraServer(
                Path(workdir) / f"node{index + 1}",
                native_port,
                heap,
                version,
                host=host,
                storage_port=storage_port,
                seed=f"{hosts[0]}:{storage_port}",
                initial_token=-(2**63) + index * (2**64 // nodes),
                datacenter=datacenter,
            )
            for index, host in enumerate(hosts)
        ]

    @property
    def host(self) -> str:
        return self.nodes[0].host

    @property
    def port(self) -> int:
        return self.nodes[0].port

    @property
    def contact_points(self) -> str:
        """``host:port,host:port,...``: the host list of a cassandra:// URL."""
        return ",".join(f"{node.host}:{node.port}" for node in self.nodes)

    @property
    def running(self) -> bool:
        """Some node runs: a cluster with a node down is still a cluster (the dev command keeps
        the others running and says which node stopped)."""
        return any(node.running for node in self.nodes)

    def stopped_nodes(self) -> list[CassandraServer]:
        """The nodes whose JVM is not running (killed, crashed, or never started)."""
        return [node for node in self.nodes if not node.running]

    def restart_stopped(self, timeout: float = 300) -> list[CassandraServer]:
        """Start the stopped nodes again on their own data (as machines back from a crash) and
        wait until every node sees every other one as normal; the others keep running whatever
        happens, and a node that fails to start raises RuntimeError. The nodes restarted."""
        started = time.monotonic()
        stopped = self.stopped_nodes()
        for node in stopped:
            node.launch()
        for node in stopped:
            node.wait_ready(timeout - (time.monotonic() - started))
        self.wait_until_all_normal(timeout - (time.monotonic() - started))
        return stopped

    @property
    def log_path(self) -> Path:
        """The directory of the nodes' directories, each with its cassandra.log."""
        return self.nodes[0].log_path.parent.parent

    def __enter__(self) -> CassandraCluster:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self, timeout: float = 300) -> None:
        """Start the nodes that are not running and wait until all of them are up and normal."""
        started = time.monotonic()
        try:
            seed, *others = self.nodes
            if not seed.running:
                seed.start(timeout)
            waiting = [node for node in others if not node.running]
            for node in waiting:
                node.launch()
            for node in waiting:
                node.wait_ready(timeout - (time.monotonic() - started))
            self.wait_until_all_normal(timeout - (time.monotonic() - started))
        except BaseException:
            self.stop()
            raise
        _log(f"{len(self.nodes)}-node cluster ready at {self.contact_points} in {time.monotonic() - started:.1f}s")

    def wait_until_all_normal(self, timeout: float = 120) -> None:
        """Until every node answers CQL and lists every other one, with its token, as a NORMAL
        member in gossip (what ``nodetool status`` shows as UN); RuntimeError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            lagging = [node.host for node in self.nodes if not self._sees_all_normal(node)]
            if not lagging:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodes {', '.join(lagging)} do not see the whole cluster up after {timeout:.0f}s")
            time.sleep(1)

    def _sees_all_normal(self, node: CassandraServer) -> bool:
        """Gossip says every node is NORMAL (it owns its token), and a read of a keyspace
        replicated to every node (system_distributed, RF 3) at consistency ALL succeeds with this
        node coordinating, so its failure detector holds the others (up to 3) up."""
        rows = node.query("SELECT address, status_with_port FROM system_views.gossip_info")
        if rows is None:
            return False
        normal = {row.address for row in rows if (row.status_with_port or "").startswith("NORMAL")}
        if not normal >= {other.host for other in self.nodes}:
            return False
        return node.query("SELECT * FROM system_distributed.repair_history LIMIT 1", ConsistencyLevel.ALL) is not None

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM every node at once (each flushes on its own), then wait for all of them."""
        for node in self.nodes:
            node.ask_to_stop()
        for node in self.nodes:
            node.stop(timeout)
