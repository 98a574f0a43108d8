"""Shared fixtures: stores for the contract suite and a real gateway process for end-to-end tests."""

import uuid

import pytest
import pytest_twisted

from gateway.store.sqlite import SQLiteStore

SLOT_WIDTH_MS = 3_600_000

STORE_DRIVERS = ["sqlite"]


@pytest.fixture
def tenant() -> str:
    """A tenant of its own for each test, so tests can share one database without clashing."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest_twisted.async_yield_fixture(params=STORE_DRIVERS)
async def store(request, tmp_path):
    driver = SQLiteStore(tmp_path / "contract.db", SLOT_WIDTH_MS)
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


@pytest.fixture
def gateway(start_gateway):
    return start_gateway()
