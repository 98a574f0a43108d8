"""Helpers of the unit tests: the service's parts on a real SQLite store, with time in the
test's hands (twisted.internet.task.Clock for timers, a settable clock for timestamps)."""

import time

from twisted.internet import reactor
from twisted.internet.task import deferLater


class MsClock:
    """A settable clock in milliseconds, as IngestPipeline's ``clock`` reads it."""

    def __init__(self, now_ms: int):
        self.now = now_ms

    def __call__(self) -> int:
        return self.now


async def until(condition, timeout_s: float = 10.0) -> None:
    """Wait on the real reactor until ``condition()`` holds (store calls run on threads)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await deferLater(reactor, 0.005, lambda: None)
