"""Per-tenant ingest limits: a sample rate (token bucket) answered with 429 and Retry-After.

Limits are per gateway process: with N replicas behind a balancer a tenant gets about N times
the configured rate. 0 turns a limit off.
"""

import math
import time


class RateLimited(Exception):
    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TenantLimits:
    def __init__(self, samples_per_second: float, burst_seconds: float = 5.0, clock=time.monotonic):
        self.samples_per_second = samples_per_second
        self.capacity = samples_per_second * burst_seconds
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def check_rate(self, tenant: str, samples: int) -> None:
        """Take ``samples`` tokens or raise RateLimited (nothing taken). A request larger than the
        burst passes when the bucket is full and leaves it in debt, so it is never refused forever."""
        if not self.samples_per_second or not samples:
            return
        now = self.clock()
        tokens, updated = self._buckets.get(tenant, (self.capacity, now))
        tokens = min(self.capacity, tokens + (now - updated) * self.samples_per_second)
        if tokens < min(samples, self.capacity):
            self._buckets[tenant] = (tokens, now)
            wait = max(1, math.ceil((min(samples, self.capacity) - tokens) / self.samples_per_second))
            raise RateLimited(
                f"tenant {tenant!r} is over its limit of {self.samples_per_second:g} samples/s"
                " (--tenant-max-samples-per-second)",
                wait,
            )
        self._buckets[tenant] = (tokens - samples, now)
