"""Per-tenant ingest limits answered with 429 and Retry-After: a sample rate (token bucket) and
a number of active series (series written in the last 20 minutes, as Mimir counts them).

Limits are per gateway process, like Mimir's per-ingester limits: with N replicas behind a
balancer a tenant gets about N times the configured figures. 0 turns a limit off.
"""

import math
import time
from collections import OrderedDict
from collections.abc import Iterable


class RateLimited(Exception):
    def __init__(self, message: str, retry_after_s: int, limit: str = "samples_per_second"):
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.limit = limit


class TenantLimits:
    def __init__(
        self,
        samples_per_second: float,
        max_active_series: int = 0,
        burst_seconds: float = 5.0,
        active_window_s: float = 1200.0,
        clock=time.monotonic,
    ):
        self.samples_per_second = samples_per_second
        self.capacity = samples_per_second * burst_seconds
        self.max_active_series = max_active_series
        self.active_window_s = active_window_s
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._active: dict[str, OrderedDict[str, float]] = {}

    def check_series(self, tenant: str, series: Iterable[str]) -> None:
        """Refuse a request that would take the tenant past its active series (nothing recorded)."""
        if not self.max_active_series:
            return
        now = self.clock()
        active = self._active.setdefault(tenant, OrderedDict())
        while active and next(iter(active.values())) < now - self.active_window_s:
            active.popitem(last=False)
        series = set(series)
        new = series.difference(active)
        if new and len(active) + len(new) > self.max_active_series:
            oldest = next(iter(active.values())) if active else now
            wait = max(1, math.ceil(oldest + self.active_window_s - now))
            raise RateLimited(
                f"tenant {tenant!r} would have more than {self.max_active_series} active series"
                " (--tenant-max-active-series)",
                min(wait, 60),
                "active_series",
            )
        for key in series:
            active[key] = now
            active.move_to_end(key)

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
