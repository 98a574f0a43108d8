"""Per-tenant ingest limits: a sample rate (token bucket) and a number of active series (series
written in the last 20 minutes, as Mimir counts them). The ingest pipeline applies them to every
protocol and every kind of data.

Over the rate, a whole batch is refused, and each protocol says so its own way (429 and
Retry-After on HTTP, a paused connection on carbon TCP, dropped and counted datagrams on UDP).
Over the active series, only the new series beyond the limit are refused: their samples are
rejected one by one (as invalid ones are, a 400 naming them on HTTP, counted and logged on
carbon) and the samples of every other series are written. Holding the whole batch instead
would stall the tenant's existing series for as long as the 20-minute window takes to free a
place.

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

    def admit(self, batch: dict[str, dict[str, int]]) -> dict[str, set[str]]:
        """Take a batch of ``{tenant: {series identity: samples}}`` (in arrival order) and return
        the new series refused, by tenant: those beyond the tenant's active-series limit, whose
        samples are not taken from its rate. RateLimited refuses the whole batch over the rate;
        nothing is recorded for a refused batch, for any of its tenants."""
        now = self.clock()
        buckets, admitted, refused = {}, {}, {}
        for tenant, series in batch.items():
            admitted[tenant], refused[tenant] = (
                self._split_new(tenant, series, now) if self.max_active_series else (series, set())
            )
            samples = sum(series[key] for key in admitted[tenant])
            if self.samples_per_second and samples:
                buckets[tenant] = self._take_tokens(tenant, samples, now)
        self._buckets.update(buckets)
        if self.max_active_series:
            for tenant, series in admitted.items():
                active = self._active[tenant]
                for key in series:
                    active[key] = now
                    active.move_to_end(key)
        return {tenant: keys for tenant, keys in refused.items() if keys}

    def _split_new(self, tenant: str, series: dict[str, int], now: float) -> tuple[list[str], set[str]]:
        """``series`` split into those admitted (active ones, and new ones while there is room)
        and the new ones refused, once past windows are forgotten."""
        active = self._active.setdefault(tenant, OrderedDict())
        while active and next(iter(active.values())) < now - self.active_window_s:
            active.popitem(last=False)
        room = self.max_active_series - len(active)
        admitted, refused = [], set()
        for key in series:
            if key in active:
                admitted.append(key)
            elif room > 0:
                admitted.append(key)
                room -= 1
            else:
                refused.add(key)
        return admitted, refused

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
