"""Run groups of CQL requests with a store-wide bound on requests in flight, one reactor wake-up per group.

A store call (write these 500 rows, read these 3 slots) is a group of requests. The first
version bridged every request to its own Deferred through a DeferredSemaphore and a
callFromThread: per request that was a Deferred, a semaphore round, and a reactor wake-up, about
a third of the gateway's CPU on ingest (docs/performance-log.rst). Here requests wait in one queue;
the driver's completion callbacks, on its I/O thread, start the next ones (as cassandra-driver's
own execute_concurrent does), and only a finished group goes back to the reactor thread.

The first failure fails its group: its requests not started yet are skipped, and the group
fires with the error once those already running have finished.

A finished request's driver future is released at once (``_release``), so that reference counting
frees it and its statement values: left in reference cycles, thousands of futures a second wait
for the collector's full passes (docs/performance-log.rst, "/healthz and the collector").
"""

import threading
from collections import deque

from cassandra import DriverException
from cassandra.connection import Timer
from twisted.internet import defer, reactor


class _Group:
    __slots__ = ("deferred", "results", "remaining", "error")

    def __init__(self, size: int):
        self.deferred: defer.Deferred = defer.Deferred()
        self.results: list = [None] * size
        self.remaining = size
        self.error: Exception | None = None


class RequestQueue:
    """At most ``limit`` requests in flight across every group; the rest wait in FIFO order."""

    def __init__(self, session, limit: int, translate_error):
        self.session = session
        self.limit = limit
        self.translate_error = translate_error
        self._lock = threading.Lock()
        self._waiting: deque = deque()
        self._inflight = 0

    def run(self, requests: list[tuple[object, tuple]], profile) -> defer.Deferred:
        """Fire with one list of rows per request, in order (every page of each); ``profile`` is
        the driver execution profile to run them with."""
        if not requests:
            return defer.succeed([])
        group = _Group(len(requests))
        with self._lock:
            self._waiting.extend(
                (group, index, statement, parameters, profile) for index, (statement, parameters) in enumerate(requests)
            )
        self._start_more()
        return group.deferred

    def _start_more(self) -> None:
        while True:
            with self._lock:
                if self._inflight >= self.limit or not self._waiting:
                    return
                group, index, statement, parameters, profile = self._waiting.popleft()
                self._inflight += 1
            if group.error is not None:
                self._finished(group, index, None, None)
                continue
            try:
                future = self.session.execute_async(statement, parameters, execution_profile=profile)
            except DriverException as error:
                self._finished(group, index, None, error)
                continue
            rows: list = []
            future.add_callbacks(
                self._page,
                self._failed,
                callback_args=(future, group, index, rows),
                errback_args=(group, index, future),
            )

    def _page(self, page_rows, future, group: _Group, index: int, rows: list) -> None:
        if page_rows:
            rows.extend(page_rows)
        if future.has_more_pages:
            future.start_fetching_next_page()
            return
        _release(future)
        self._finished(group, index, rows, None)
        self._start_more()

    def _failed(self, error: Exception, group: _Group, index: int, future) -> None:
        _release(future)
        self._finished(group, index, None, error)
        self._start_more()

    def _finished(self, group: _Group, index: int, rows, error) -> None:
        with self._lock:
            self._inflight -= 1
            if error is not None and group.error is None:
                group.error = self.translate_error(error)
            group.results[index] = rows
            group.remaining -= 1
            done = group.remaining == 0
        if done:
            if group.error is not None:
                reactor.callFromThread(group.deferred.errback, group.error)
            else:
                reactor.callFromThread(group.deferred.callback, group.results)


def _release(future) -> None:
    """Break the two reference cycles a finished future is in. Ours: its callbacks' arguments
    hold the future. The driver's: the future holds its timeout timer, whose callback is the
    future's bound method (and the event loop's heap holds a cancelled timer until it comes to
    the top). A finished future's timer has fired or is cancelled (the driver cancels it before
    calling back), so its callback is not needed. ``_timer`` is private to cassandra-driver
    (setup.cfg pins the versions); test_finished_requests_leave_no_cyclic_garbage checks this."""
    future.clear_callbacks()
    timer = getattr(future, "_timer", None)
    if isinstance(timer, Timer):
        timer.callback = _spent


def _spent() -> None:
    """The callback of a finished future's timer, which fired or never will: nothing."""
