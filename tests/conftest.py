"""Shared fixtures: real Cassandra and Redis for the session, stores for the contract suite, and
real gateway processes for end-to-end tests.

Cassandra and Redis are started by the project's own tooling (gateway.app.devservices) once per
session; nothing is skipped when they cannot start: the session fails and says why.
``TSGATE_TEST_CASSANDRA=host:port`` and ``TSGATE_TEST_REDIS=redis://...`` reuse running servers
instead (handy while developing).
"""

import os
import uuid

import pytest
import pytest_twisted

from gateway.core.layout import Layout
from gateway.store.cassandra import CassandraStore
from gateway.store.sqlite import SQLiteStore

LAYOUT = Layout()

# Fixtures that start, or stand for, a process outside pytest: Java and Cassandra, Redis, tsgate
# gateways, Prometheus and exporters, graphite-web. A test that needs any of them is ``slow``.
PROCESS_FIXTURES = {
    "cassandra_server",
    "cassandra_url",
    "redis_server",
    "start_gateway",
    "gateway",
    "hostile_gateway",
    "tsgate",
    "graphite_web",
    "grafana",
    "exporter",
    "exporters",
    "native_exporter",
}
TEST_KEYSPACE = "tsgate_test"

# "sqlite-folded" folds SQLite's head log into chunks after every commit, so that the contract
# suite reads, seals and deletes head samples from chunks as well as from the log.
STORE_DRIVERS = ["sqlite", "sqlite-folded", "cassandra"]


def pytest_collection_modifyitems(items):
    """Mark each test ``slow`` (see PROCESS_FIXTURES; a test starting such a process itself says
    so with ``@pytest.mark.slow``) or ``fast``: ``pytest -m fast`` needs no Java and no server."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec else {}
        on_cassandra = "cassandra" in (params.get("store"), params.get("backend_args"))
        if item.get_closest_marker("slow") or on_cassandra or PROCESS_FIXTURES.intersection(item.fixturenames):
            item.add_marker(pytest.mark.slow)
        else:
            item.add_marker(pytest.mark.fast)


class SharedServer:
    """A Cassandra this run did not start (``TSGATE_TEST_CASSANDRA``): other runs use it, so a
    test that would stop it is skipped here (CI starts its own, where such tests run)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port

    def stop(self):
        pytest.skip("TSGATE_TEST_CASSANDRA is shared: this test stops the server")

    start = stop


@pytest.fixture(scope="session")
def cassandra_server(tmp_path_factory):
    """A real single-node Cassandra 5.0, assembled from Maven Central by gateway.app.devservices."""
    from gateway.app.devservices.cassandra import CassandraServer

    existing = os.environ.get("TSGATE_TEST_CASSANDRA")
    if existing:
        host, _, port = existing.partition(":")
        yield SharedServer(host, int(port or 9042))
        return
    server = CassandraServer(tmp_path_factory.mktemp("cassandra"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def cassandra_url(cassandra_server) -> str:
    """URL of the test keyspace, its schema applied once with ``schema apply``'s own code."""
    url = f"cassandra://{cassandra_server.host}:{cassandra_server.port}/{TEST_KEYSPACE}"
    CassandraStore.from_url(url, LAYOUT).apply_schema()
    return url


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    from gateway.app.devservices.redis import RedisServer

    existing = os.environ.get("TSGATE_TEST_REDIS")
    if existing:
        yield type("Existing", (), {"url": existing})()
        return
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def tenant() -> str:
    """A tenant of its own for each test, so tests can share one database without clashing."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest_twisted.async_yield_fixture(params=STORE_DRIVERS)
async def store(request, tmp_path):
    if request.param.startswith("sqlite"):
        driver = SQLiteStore(
            tmp_path / "contract.db", LAYOUT, fold_rows=1 if request.param == "sqlite-folded" else None
        )
    else:
        driver = CassandraStore.from_url(request.getfixturevalue("cassandra_url"), LAYOUT)
    await driver.start()
    yield driver
    await driver.close()


@pytest.fixture
def store_layout() -> Layout:
    """The layout of ``sqlite_store``; a test module overrides it for short slots or retentions."""
    return LAYOUT


@pytest_twisted.async_yield_fixture
async def sqlite_store(tmp_path, store_layout):
    """A started SQLite store in a file of the test's own (the unit tests' store)."""
    driver = SQLiteStore(tmp_path / "unit.db", store_layout)
    await driver.start()
    yield driver
    await driver.close()


@pytest.fixture
def start_gateway(tmp_path):
    """Start gateway processes with extra flags; all are stopped (SIGTERM) after the test."""
    from tests.gatewayproc import GatewayProcess

    started = []

    def start(*args: str) -> GatewayProcess:
        process = GatewayProcess(tmp_path, *args).start()
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


@pytest.fixture(params=["sqlite", "cassandra"])
def backend_args(request) -> tuple[str, ...]:
    """Gateway flags for each backend: the embedded store alone, or Cassandra with Redis."""
    if request.param == "sqlite":
        return ()
    return ("--store", request.getfixturevalue("cassandra_url"), "--redis", request.getfixturevalue("redis_server").url)


@pytest.fixture
def gateway(start_gateway, backend_args):
    return start_gateway(*backend_args)


@pytest.fixture
def gateways(start_gateway, cassandra_url, redis_server) -> dict:
    """A gateway on each store, by name, for a test whose one real client (a Prometheus scraping
    for a minute) feeds both: the embedded store alone, and Cassandra with Redis."""
    return {
        "sqlite": start_gateway(),
        "cassandra": start_gateway("--store", cassandra_url, "--redis", redis_server.url),
    }


async def read_head(store, tenant, series_set_hash, start_ms, end_ms):
    """The head rows of one series from store.read_raw (tests of the store contract)."""
    (found,) = await store.read_raw(tenant, [series_set_hash], start_ms, end_ms)
    return found.head


async def read_blocks(store, tenant, series_set_hash, start_ms, end_ms):
    """The blocks of one series from store.read_raw (tests of the store contract)."""
    (found,) = await store.read_raw(tenant, [series_set_hash], start_ms, end_ms)
    return found.blocks
