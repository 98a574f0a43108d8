"""One mechanism that meters and bounds every store call.

Each public method of a driver (the contract's roles, contract.py) goes through ``StoreCalls.run``:
timed and its failures counted per operation (tsgate_store_operation_duration_seconds,
tsgate_store_errors_total: metrics.observe_store), and at most ``limit`` calls of one store in
flight, the others waiting in FIFO order. Callers call the store and nothing else: before, four
callers each kept a pool of their own and some calls were metered by their caller, others not.

Two kinds of call are metered but not bounded: the Lifecycle's (start, close, ping, identity,
sweep), so that a health check answers while the store is busy, and composite calls
(Store.delete_series, the default Store.write_blocks), made of other store calls that are
bounded (a slot held while waiting on the parts' slots could deadlock the store).
"""

import functools

from twisted.internet.defer import Deferred, DeferredSemaphore, maybeDeferred

from gateway.core import metrics

# Store calls of one store in flight at once. The callers' own pools were 32 each (planner, read
# path, Graphite finder and tag counts); ingest and the downsampler had none. A call is a group of
# requests (Cassandra bounds those apart, max_inflight), so this bounds the fan-out of queries,
# not the store's throughput.
CALLS_IN_FLIGHT = 64


class StoreCalls:
    """The meter and the bound of one store's calls."""

    def __init__(self, limit: int = CALLS_IN_FLIGHT):
        self.limit = limit
        self.in_flight = 0
        self.peak = 0  # the most calls in flight at once (what the tests of the bound read)
        self._semaphore = DeferredSemaphore(limit)

    def run(self, operation: str, call, *args, **kwargs) -> Deferred:
        """``call(*args, **kwargs)`` once a slot is free, metered as ``operation``."""
        return self._semaphore.run(self._started, operation, call, *args, **kwargs)

    def _started(self, operation: str, call, *args, **kwargs) -> Deferred:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        return self.metered(operation, call, *args, **kwargs).addBoth(self._finished)

    def _finished(self, result):
        self.in_flight -= 1
        return result

    @staticmethod
    def metered(operation: str, call, *args, **kwargs) -> Deferred:
        """``call(*args, **kwargs)`` now, metered as ``operation`` (a composite call)."""
        return metrics.observe_store(operation, maybeDeferred(call, *args, **kwargs))


def store_call(method, bounded: bool = True):
    """A driver method that goes through its store's StoreCalls (``self.calls``), named after it."""
    operation = method.__name__

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if bounded:
            return self.calls.run(operation, method, self, *args, **kwargs)
        return StoreCalls.metered(operation, method, self, *args, **kwargs)

    call.store_operation = operation  # type: ignore[attr-defined]  # what the tests look for
    return call
