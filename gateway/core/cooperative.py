"""Long loops on the reactor thread, cut into slices so that the reactor serves everyone else
(other requests, /healthz, carbon sockets) between them.

Decoding, validating and hashing a large request is per-item Python: 150,000 series of 64
labels took 12 s, and a thread would not help (it holds the GIL as long). So such loops run on
the reactor, and every few hundred items they ask ``Slices.due()``; once a slice has run for
``SLICE_S`` they ``await Slices.pause()``, which lets the reactor run once before they go on.
A sans-I/O decoder that yields between steps (protocols.prometheus.decode_write_request_steps)
is run the same way by ``run_steps``.
"""

import time
from collections.abc import Generator
from typing import TypeVar

from twisted.internet import reactor
from twisted.internet.task import deferLater

T = TypeVar("T")

# How long a loop may hold the reactor at a time: short beside a 100 ms p99 target, long beside
# the cost of a pause (one reactor turn, ~20 us).
SLICE_S = 0.005
# How many items a loop handles between two looks at the clock (a look costs ~0.1 us).
CHECK_EVERY = 64


class Slices:
    def __init__(self, slice_s: float = SLICE_S):
        self.slice_s = slice_s
        self.started = time.perf_counter()

    def due(self) -> bool:
        """True once the current slice has run its time."""
        return time.perf_counter() - self.started >= self.slice_s

    async def pause(self) -> None:
        """Let the reactor run once (I/O, timers, other requests), then start a new slice."""
        await deferLater(reactor, 0, lambda: None)
        self.started = time.perf_counter()

    async def maybe_pause(self) -> None:
        if self.due():
            await self.pause()


async def run_steps(steps: Generator[None, None, T]) -> T:
    """Run a generator that yields between bounded steps of work (a sans-I/O decoder's, say)
    to its return value, pausing for the reactor whenever a slice has run its time."""
    slices = Slices()
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        if slices.due():
            await slices.pause()
