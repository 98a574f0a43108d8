"""`tsgate dev ...`: run a real Cassandra or Redis in the foreground for local development.

Run it without the tsgate entry point as: python -m gateway.app.devservices.cli dev redis
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

from gateway.app.config import parse_hostport
from gateway.app.devservices.cassandra import CassandraCluster, CassandraServer, ensure_cassandra_jars
from gateway.app.devservices.redis import RedisServer


def register(subparsers) -> None:
    """Add the `dev` command (cassandra, redis, fetch-cassandra) to an argparse subparsers object."""
    dev = subparsers.add_parser("dev", help="run a real Cassandra or Redis for development")
    commands = dev.add_subparsers(dest="dev_command", required=True)

    cassandra = commands.add_parser("cassandra", help="run a Cassandra node, or a local cluster, until interrupted")
    cassandra.add_argument("--dir", type=Path, help="data directory, kept afterwards (default: a temporary one)")
    _add_listen(cassandra, "CQL native protocol address", 9042)
    cassandra.add_argument("--heap", default="1G", help="JVM heap of each node, -Xms and -Xmx (default: 1G)")
    cassandra.add_argument(
        "--nodes",
        type=_node_count,
        default=1,
        help="nodes: more than 1 runs a cluster on 127.0.0.1, 127.0.0.2, ... (same port, data center dc1);"
        " a node that dies leaves the others running, SIGUSR1 starts it again",
    )
    cassandra.set_defaults(func=run_cassandra)

    redis = commands.add_parser("redis", help="run redis-server until interrupted")
    redis.add_argument("--dir", type=Path, help="working directory, kept afterwards (default: a temporary one)")
    _add_listen(redis, "address", 6379)
    redis.set_defaults(func=run_redis)

    fetch = commands.add_parser("fetch-cassandra", help="only download the Cassandra jars into the cache")
    fetch.set_defaults(func=fetch_cassandra)


def _add_listen(parser: argparse.ArgumentParser, what: str, usual_port: int) -> None:
    """``--listen HOST:PORT`` as ``tsgate serve --http`` takes it; ``--port N`` still works."""
    parser.add_argument(
        "--listen",
        type=_loopback_port,
        help=f"{what}, e.g. 127.0.0.1:{usual_port}; the host is always 127.0.0.1 (default: a free port)",
    )
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)


def _loopback_port(text: str) -> int:
    """The port of a ``HOST:PORT`` whose host is 127.0.0.1 (or left out): dev servers are local."""
    try:
        host, port = parse_hostport(text if ":" in text else f":{text}")
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT or PORT") from None
    if host not in ("0.0.0.0", "127.0.0.1", "localhost"):
        raise argparse.ArgumentTypeError(f"{text!r}: development servers listen on 127.0.0.1 only")
    return port


def _node_count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 254:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of nodes from 1 to 254")
    return int(text)


def _port(args: argparse.Namespace) -> int | None:
    return args.listen if args.listen is not None else args.port


def run_cassandra(args: argparse.Namespace) -> int:
    with _workdir(args.dir, "cassandra") as workdir:
        if args.nodes > 1:
            cluster = CassandraCluster(workdir, args.nodes, native_port=_port(args), heap=args.heap)
            return _serve(cluster, f"cassandra cluster (data center {cluster.datacenter})", cluster.contact_points)
        server = CassandraServer(workdir, native_port=_port(args), heap=args.heap)
        return _serve(server, "cassandra", f"{server.host}:{server.port}")


def run_redis(args: argparse.Namespace) -> int:
    with _workdir(args.dir, "redis") as workdir:
        server = RedisServer(workdir, port=_port(args))
        return _serve(server, "redis", server.url)


def fetch_cassandra(args: argparse.Namespace) -> int:
    try:
        print(ensure_cassandra_jars())
    except RuntimeError as error:
        print(error, file=sys.stderr)
        return 1
    return 0


def _workdir(path: Path | None, name: str):
    """The given directory, kept afterwards, or a temporary one removed on exit."""
    if path is not None:
        return contextlib.nullcontext(path)
    return tempfile.TemporaryDirectory(prefix=f"tsgate-dev-{name}-", ignore_cleanup_errors=True)


def _serve(server: CassandraServer | CassandraCluster | RedisServer, name: str, address: str) -> int:
    """Start the server, announce it, and stop it cleanly on SIGINT/SIGTERM; 1 if it dies on its own
    (a cluster: once every node died, see _watch_cluster)."""
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    restarting = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: restarting.set())
    try:
        server.start()
    except RuntimeError as error:
        print(error, file=sys.stderr)
        return 1
    print(f"{name} ready at {address}", flush=True)
    try:
        if isinstance(server, CassandraCluster):
            code = _watch_cluster(server, stopping, restarting)
        else:
            code = _watch(server, name, stopping)
    finally:
        server.stop()
    if code == 0:
        print(f"{name} stopped", flush=True)
    return code


def _watch(server: CassandraServer | RedisServer, name: str, stopping: threading.Event) -> int:
    """Until SIGINT/SIGTERM (0) or the server dies (1)."""
    while not stopping.wait(1):
        if not server.running:
            print(f"{name} exited unexpectedly; log: {server.log_path}", file=sys.stderr)
            return 1
    return 0


def _watch_cluster(cluster: CassandraCluster, stopping: threading.Event, restarting: threading.Event) -> int:
    """Until SIGINT/SIGTERM (0) or every node died (1). A node that dies is said once and the
    others keep running, so that a cluster with a node down can be tried (kill -9 a node's pid);
    SIGUSR1 starts the stopped nodes again, on their own data, when the user wants them back
    (not SIGHUP: a closed terminal sends that, and must not leave the cluster running)."""
    for node in cluster.nodes:
        print(f"node {node.host}: pid {node.pid}, log {node.log_path}", flush=True)
    print(f"a node that dies leaves the others running; kill -USR1 {os.getpid()} starts it again", flush=True)
    reported: set[str] = set()
    while not stopping.wait(1):
        if restarting.is_set():
            restarting.clear()
            try:
                for node in cluster.restart_stopped():
                    reported.discard(node.host)
                    print(f"node {node.host} back: pid {node.pid}", flush=True)
            except RuntimeError as error:
                print(error, file=sys.stderr, flush=True)
        for node in cluster.stopped_nodes():
            if node.host not in reported:
                reported.add(node.host)
                running = len(cluster.nodes) - len(cluster.stopped_nodes())
                print(
                    f"node {node.host} (pid {node.pid}) stopped ({node.exit_status}); {running} of"
                    f" {len(cluster.nodes)} nodes still run; kill -USR1 {os.getpid()} starts it again;"
                    f" log: {node.log_path}",
                    file=sys.stderr,
                    flush=True,
                )
        if not cluster.running:
            print("every node of the cluster stopped", file=sys.stderr, flush=True)
            return 1
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m gateway.app.devservices.cli")
    register(parser.add_subparsers(dest="command", required=True))
    parsed = parser.parse_args()
    sys.exit(parsed.func(parsed))
