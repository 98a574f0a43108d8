"""Bulk writes through acsylla (the C++ driver for asyncio): data_head rows, the ingest hot path
on Cassandra, and every write of many rows (the index rows of new series above all).

cassandra-driver costs 11-13 µs of gateway CPU a row in a batch (building, serializing and
sending each statement in Python); acsylla binds a row in one C call (about 0.5 µs) and does the
rest in C++ threads, 2-3 µs a row in all (docs/performance-log.rst, "Head writes on acsylla").
Reads and single statements stay on cassandra-driver.

acsylla runs on an asyncio loop; this module owns one, in its own thread, with its own session.
The caller binds the rows of each batch (one C call a row: the reactor for head rows, the
store's binder thread for the rest) and hands the batches over; the loop runs them, at most
``max_inflight`` at once, and fires the caller's Deferred back on the reactor thread.
"""

import asyncio
import concurrent.futures
import contextlib
import ipaddress
import logging
import ssl
import threading
from collections.abc import Sequence
from typing import Any

import acsylla
from acsylla import errors
from twisted.internet import defer, reactor

from gateway.store.cassandra_base import DRIVER_ERRORS, BatchWarningFilter, CassandraOptions
from gateway.store.contract import StoreUnavailable

# Faults of the cluster or the connection, not of our statements: the write may work later (503).
CLUSTER_FAULTS = (
    errors.CassErrorServerUnavailable,
    errors.CassErrorServerWriteTimeout,
    errors.CassErrorServerWriteFailure,
    errors.CassErrorServerOverloaded,
    errors.CassErrorServerIsBootstrapping,
    errors.CassErrorServerServerError,
    errors.CassErrorLibNoHostsAvailable,
    errors.CassErrorLibRequestTimedOut,
    errors.CassErrorLibRequestQueueFull,
    errors.CassErrorLibNoStreams,
    errors.CassErrorLibUnableToConnect,
    errors.CassErrorLibWriteError,
    errors.CassErrorLibNoAvailableIoThread,
    errors.CassErrorLibUnableToDetermineProtocol,
    errors.CassExceptionConnectionError,
    errors.CassErrorSourceSsl,
)


class ShardInfoFilter(logging.Filter):
    """acsylla's driver (ScyllaDB's fork of the DataStax C++ driver) logs an error on each new
    connection to a Cassandra (not Scylla) node: it finds no shard information there, which is
    expected. Other messages pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Could not retrieve sharding info" not in record.getMessage()


LOGGER = logging.getLogger("acsylla")
LOGGER.addFilter(ShardInfoFilter())
# acsylla logs each server warning as the driver does: our batches of several data_head partitions
# draw two, counted and logged once in a while by the same filter.
BATCH_WARNING_FILTER = BatchWarningFilter()
LOGGER.addFilter(BATCH_WARNING_FILTER)
LOG_LEVELS = {
    "CRITICAL": logging.CRITICAL,
    "ERROR": logging.ERROR,
    "WARN": logging.WARNING,
    "INFO": logging.INFO,
    "DEBUG": logging.DEBUG,
    "TRACE": logging.DEBUG,
}


def log_message(message: acsylla.LogMessage) -> None:
    """acsylla's log messages to the "acsylla" logger, as its own callback does, but the batch
    warnings that go unlogged are only counted, with no LogRecord made: a request of small head
    partitions draws two (making and filtering their records was 4% of a worker's time at 100
    series a request)."""
    if not BATCH_WARNING_FILTER.drops(message.message):
        LOGGER.log(LOG_LEVELS.get(message.log_level, logging.WARNING), "%s", message.message)


CONNECT_WAIT_S = 10.0  # besides request_timeout: the longest the binder waits for a connection
# Seconds close() waits for the session to close (requests under way finish or time out first).
CLOSE_TIMEOUT_S = 30


def write_error(error: BaseException) -> BaseException:
    """acsylla's errors as cassandra_base.unavailable_error maps the driver's: faults of the
    cluster become StoreUnavailable (503, the sender retries), counted by error."""
    DRIVER_ERRORS.labels(type(error).__name__).inc()
    if isinstance(error, CLUSTER_FAULTS):
        return StoreUnavailable(f"cassandra (acsylla): {type(error).__name__}: {error}")
    return error


def _trusted_certificates(options: CassandraOptions) -> str:
    """PEM text of the CAs to verify Cassandra's certificate with: ``tls_ca``, else the system's
    (as ssl.create_default_context does for the driver). acsylla takes PEM text, not a file."""
    path = options.tls_ca or ssl.get_default_verify_paths().cafile
    if path is None:
        raise ValueError("tls=true: no tls_ca given and no system CA file found")
    with open(path) as file:
        return file.read()


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def cluster_settings(options: CassandraOptions) -> dict:
    """acsylla.create_cluster arguments with the connection semantics of the driver's Cluster
    (cassandra_base.CassandraBase._cluster): contact points and port, local DC, credentials, TLS
    verified against the host's name or address, request and connect timeouts."""
    settings: dict = {
        "contact_points": [host for host, _ in options.hosts],
        "port": options.hosts[0][1],
        "connect_timeout": options.request_timeout_s,
        "request_timeout": options.request_timeout_s,
        "consistency": acsylla.Consistency(options.write_consistency),
        "exponential_reconnect_base_delay_ms": 500,
        "exponential_reconnect_max_delay_ms": 10_000,
        "logging_callback": log_message,
    }
    if options.local_dc:
        settings["load_balance_dc_aware"] = options.local_dc
    if options.username:
        settings["username"], settings["password"] = options.username, options.password or ""
    if options.tls:
        by_name = not all(_is_address(host) for host, _ in options.hosts)
        settings.update(
            ssl_enabled=True,
            ssl_trusted_cert=_trusted_certificates(options),
            ssl_verify_flags=acsylla.SSLVerifyFlags.PEER_IDENTITY_DNS
            if by_name
            else acsylla.SSLVerifyFlags.PEER_IDENTITY,
            hostname_resolution=by_name,
        )
    return settings


class AcsyllaWriter:
    """One acsylla session for the store's write statements, on an asyncio loop in a thread of its own.

    It connects on the first write, not at the store's start: most processes that open a store
    write nothing in bulk (query executors, the downsampler, ``tsgate`` commands), and those open
    no session and start no thread. The store's start has already connected cassandra-driver
    with the same settings; a connection that fails here fails that write (and the next write
    tries again)."""

    def __init__(self, options: CassandraOptions, statements: Sequence[str], head_cql: str):
        self.options = options
        self.statements = list(statements)  # the CQL of every statement it may be given, prepared at connection
        self.head_cql = head_cql
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="acsylla-writer", daemon=True)
        self._starting = threading.Lock()
        self._session: Any = None
        self._prepared: dict[str, Any] | None = None  # by CQL
        self._connecting: asyncio.Future | None = None
        self._inflight = asyncio.Semaphore(options.max_inflight)  # bound to the loop at its first use
        self._consistency = acsylla.Consistency(options.write_consistency)
        self._closed = False

    def write(self, batches: Sequence[Sequence[tuple]]) -> defer.Deferred:
        """One UNLOGGED batch a sequence of data_head rows (the INSERT's values, of one partition or
        several); fires (on the reactor thread) once every batch succeeded, or with the first
        error once every batch has finished. Once connected, the caller binds the rows (binding
        on the loop thread cost the same CPU but took its GIL from the reactor: fewer samples/s)."""
        if self._closed:
            return defer.fail(StoreUnavailable("cassandra (acsylla): closed"))
        if self._prepared is not None:
            return self.run([self._head_batch(rows) for rows in batches])
        self._start_thread()
        return self._on_loop(self._connect_and_write(batches))

    def bound(self, rows: Sequence[tuple[str, tuple]]):
        """An UNLOGGED batch of (CQL, values) rows, bound here. Connects first if need be, waiting
        for it: only for a thread that may block (the store's binder), never the reactor."""
        if self._prepared is None:
            if self._closed:
                raise StoreUnavailable("cassandra (acsylla): closed")
            self._start_thread()
            wait_s = CONNECT_WAIT_S + self.options.request_timeout_s
            try:
                asyncio.run_coroutine_threadsafe(self._connected(), self._loop).result(wait_s)
            except concurrent.futures.TimeoutError:  # the loop stopped (a close) or the cluster hangs
                raise StoreUnavailable(f"cassandra (acsylla): no connection within {wait_s:g}s") from None
        prepared = self._prepared
        assert prepared is not None
        batch = self._new_batch()
        add = batch.add_statement
        for cql, values in rows:
            add(prepared[cql].bind(values))
        return batch

    def run(self, batches: list) -> defer.Deferred:
        """Run bound batches; fires on the reactor thread as ``write``'s Deferred does."""
        if self._closed:
            return defer.fail(StoreUnavailable("cassandra (acsylla): closed"))
        return self._on_loop(self._run(batches))

    def _start_thread(self) -> None:
        with self._starting:  # the reactor (head rows) and the binder thread may both be first
            if not self._thread.is_alive():
                self._thread.start()

    async def _connect_and_write(self, batches: Sequence[Sequence[tuple]]) -> None:
        await self._connected()
        await self._run([self._head_batch(rows) for rows in batches])

    async def _run(self, batches: list) -> None:
        results = await asyncio.gather(*(self._execute(batch) for batch in batches), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise write_error(result)

    async def _connected(self) -> None:
        """Connect and prepare once; writes that arrive meanwhile wait for the same attempt."""
        if self._prepared is not None:
            return
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        try:
            await asyncio.shield(self._connecting)
        except Exception as error:
            self._connecting = None
            raise write_error(error) from error

    async def _connect(self) -> None:
        session = await acsylla.create_cluster(**cluster_settings(self.options)).create_session()
        try:
            prepared = await asyncio.gather(*(session.create_prepared(cql) for cql in self.statements))
        except Exception:
            await session.close()
            raise
        self._session, self._prepared = session, dict(zip(self.statements, prepared))

    def _new_batch(self):
        batch = acsylla.create_batch_unlogged()
        batch.set_consistency(self._consistency)
        batch.set_is_idempotent(True)
        return batch

    def _head_batch(self, rows: Sequence[tuple]):
        """One C call a row to bind it."""
        assert self._prepared is not None
        batch = self._new_batch()
        bind, add = self._prepared[self.head_cql].bind, batch.add_statement
        for row in rows:
            add(bind(row))
        return batch

    async def _execute(self, batch) -> None:
        async with self._inflight:
            await self._session.execute_batch(batch)

    def close(self) -> defer.Deferred:
        """Close the session (requests under way finish first), then stop the loop and its thread."""
        self._closed = True
        if not self._thread.is_alive():
            return defer.succeed(None)
        return self._on_loop(self._close()).addBoth(self._stop)

    async def _close(self) -> None:
        if self._connecting is not None:
            with contextlib.suppress(Exception):
                await self._connecting
        if self._session is not None:
            await asyncio.wait_for(self._session.close(), CLOSE_TIMEOUT_S)

    def _stop(self, result):
        """The loop stops at once once the session is closed, so the join is short."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CLOSE_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()
        return result

    def _on_loop(self, coroutine) -> defer.Deferred:
        """Run a coroutine on the loop's thread; its outcome fires a Deferred on the reactor thread."""
        deferred: defer.Deferred = defer.Deferred()

        def done(future) -> None:
            error = future.exception()
            if error is not None:
                reactor.callFromThread(deferred.errback, error)
            else:
                reactor.callFromThread(deferred.callback, future.result())

        asyncio.run_coroutine_threadsafe(coroutine, self._loop).add_done_callback(done)
        return deferred
