"""Per-tenant ingest limits: a sample rate (token bucket) and a number of active series (series
written in the last 20 minutes, as Mimir counts them). The ingest pipeline applies them to every
protocol; each says no its own way (429 and Retry-After on HTTP, a paused connection on carbon
TCP, dropped and counted datagrams on UDP).

Limits are per gateway process, like Mimir's per-ingester limits: with N replicas behind a
balancer a tenant gets about N times the configured figures. 0 turns a limit off.
"""

import math
import time
from collections import OrderedDict


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

    @property
    def enabled(self) -> bool:
        return bool(self.samples_per_second or self.max_active_series)

    def admit(self, batch: dict[str, tuple[int, set]]) -> None:
        """Take a batch of ``{tenant: (samples, series identities)}`` or refuse all of it with
        RateLimited; nothing is recorded for a refused batch, for any of its tenants."""
        now = self.clock()
        buckets, new_series = {}, {}
        for tenant, (samples, series) in batch.items():
            if self.samples_per_second and samples:
                buckets[tenant] = self._take_tokens(tenant, samples, now)
            if self.max_active_series:
                new_series[tenant] = self._new_series(tenant, series, now)
        self._buckets.update(buckets)
        for tenant, series in new_series.items():
            active = self._active[tenant]
            for key in series:
                active[key] = now
                active.move_to_end(key)

    def _new_series(self, tenant: str, series: set, now: float) -> set:
        """``series`` (to record as active) once past windows are forgotten; RateLimited when the
        new ones would take the tenant past its limit."""
        active = self._active.setdefault(tenant, OrderedDict())
        while active and next(iter(active.values())) < now - self.active_window_s:
            active.popitem(last=False)
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
        return series

    def _take_tokens(self, tenant: str, samples: int, now: float) -> tuple[float, float]:
        """The tenant's bucket after taking ``samples`` tokens, or RateLimited. A batch larger than
        the burst passes when the bucket is full and leaves it in debt, so it is never refused forever."""
        tokens, updated = self._buckets.get(tenant, (self.capacity, now))
        tokens = min(self.capacity, tokens + (now - updated) * self.samples_per_second)
        if tokens < min(samples, self.capacity):
            wait = max(1, math.ceil((min(samples, self.capacity) - tokens) / self.samples_per_second))
            raise RateLimited(
                f"tenant {tenant!r} is over its limit of {self.samples_per_second:g} samples/s"
                " (--tenant-max-samples-per-second)",
                wait,
            )
        return tokens - samples, now
