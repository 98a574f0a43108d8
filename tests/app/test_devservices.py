"""The dev services start real servers that survive a stop/start, as the outage tests rely on."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import pytest
import redis
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
from cassandra.policies import RoundRobinPolicy

from gateway.app.devservices.cassandra import CassandraServer
from gateway.app.devservices.redis import RedisServer
from tests.gatewayproc import REPO

pytestmark = pytest.mark.slow  # every test here starts Cassandra or Redis


@contextlib.contextmanager
def cql_session(server: CassandraServer):
    """A fresh driver per phase, so the test does not depend on the driver's reconnection back-off."""
    cluster = Cluster(
        [server.host],
        port=server.port,
        execution_profiles={EXEC_PROFILE_DEFAULT: ExecutionProfile(load_balancing_policy=RoundRobinPolicy())},
    )
    try:
        yield cluster.connect()
    finally:
        cluster.shutdown()


def test_cassandra_keeps_data_across_restart(tmp_path):
    with CassandraServer(tmp_path / "cassandra") as server:
        port = server.port
        with cql_session(server) as session:
            session.execute(
                "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}"
            )
            session.execute("CREATE TABLE ks.series (id text PRIMARY KEY, name text, value double)")
            session.execute(
                "CREATE CUSTOM INDEX series_name ON ks.series (name) "
                "USING 'org.apache.cassandra.index.sasi.SASIIndex' WITH OPTIONS = {'mode': 'CONTAINS'}"
            )
            session.execute("INSERT INTO ks.series (id, name, value) VALUES ('a', 'cpu.load', 1.5)")
            assert session.execute("SELECT value FROM ks.series WHERE id = 'a'").one().value == 1.5
            assert session.execute("SELECT id FROM ks.series WHERE name LIKE '%load%'").one().id == "a"

        server.stop()
        assert not server.running
        server.start()

        assert server.port == port
        with cql_session(server) as session:
            assert session.execute("SELECT value FROM ks.series WHERE id = 'a'").one().value == 1.5
            assert session.execute("SELECT id FROM ks.series WHERE name LIKE '%load%'").one().id == "a"
    assert not server.running


def test_redis_restarts_on_same_url(tmp_path):
    with RedisServer(tmp_path / "redis") as server:
        url = server.url
        client = redis.Redis.from_url(url)
        client.set("key", "value")
        assert client.get("key") == b"value"

        server.stop()
        assert not server.running
        server.start()

        assert server.url == url
        assert client.ping()
        assert client.get("key") is None  # no persistence: a restart starts empty
        client.close()
    assert not server.running


def test_cli_serves_redis_until_sigterm(tmp_path):
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.app.devservices.cli", "dev", "redis", "--dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": pythonpath},
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("redis ready at redis://127.0.0.1:")
        client = redis.Redis.from_url(line.split()[-1])
        assert client.ping()
        client.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
