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
balancer a tenant gets about N times the configured figures. 0 turns a limit off. Each tenant's
figures are the flags', or the overrides file's (gateway/core/overrides.py), read at every batch so
that a reload applies at once.
"""

import math
import time
from collections import OrderedDict, deque
from collections.abc import Collection
from itertools import filterfalse, repeat

from gateway.core.errors import LimitExceeded
from gateway.core.overrides import PerTenant, per_tenant


class RateLimited(LimitExceeded):
    """Over a rate or a queue bound: 429 with Retry-After."""

    status = 429
    error_type = "unavailable"

    def __init__(self, message: str, retry_after_s: int, limit: str = "samples_per_second"):
        super().__init__(message)
        self.retry_after_s: int = retry_after_s
        self.limit = limit


class TenantLimits:
    def __init__(
        self,
        samples_per_second: int | PerTenant,
        max_active_series: int | PerTenant = 0,
        burst_seconds: float = 5.0,
        active_window_s: float = 1200.0,
        clock=time.monotonic,
    ):
        self.samples_per_second = per_tenant("tenant-max-samples-per-second", samples_per_second)
        self.burst_seconds = burst_seconds
        self.max_active_series = per_tenant("tenant-max-active-series", max_active_series)
        self.active_window_s = active_window_s
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._active: dict[str, OrderedDict[str, float]] = {}

    @property
    def enabled(self) -> bool:
        return self.samples_per_second.anywhere() or self.max_active_series.anywhere()

    def admit(self, batch: dict[str, dict[str, int]]) -> dict[str, set[str]]:
        """Take a batch of ``{tenant: {series identity: samples}}`` (in arrival order) and return
        the new series refused, by tenant: those beyond the tenant's active-series limit, whose
        samples are not taken from its rate. RateLimited refuses the whole batch over the rate;
        nothing is recorded for a refused batch, for any of its tenants."""
        now = self.clock()
        admitted: dict[str, Collection[str]] = {}
        buckets, refused = {}, {}
        for tenant, series in batch.items():
            limit = self.max_active_series(tenant)
            if limit:
                admitted[tenant], refused[tenant] = self._split_new(tenant, series, limit, now)
            else:
                admitted[tenant], refused[tenant] = series, set()
                self._active.pop(tenant, None)  # off for this tenant (now): nothing to remember
            samples = sum(map(series.__getitem__, admitted[tenant]))
            rate = self.samples_per_second(tenant)
            if rate and samples:
                buckets[tenant] = self._take_tokens(tenant, samples, rate, now)
        self._buckets.update(buckets)
        for tenant, keys in admitted.items():
            active = self._active.get(tenant)
            if active is not None:
                active.update(zip(keys, repeat(now)))
                deque(map(active.move_to_end, keys), maxlen=0)
        return {tenant: keys for tenant, keys in refused.items() if keys}

    def _split_new(self, tenant: str, series: dict[str, int], limit: int, now: float) -> tuple[list[str], set[str]]:
        """``series`` split into those admitted (active ones, and new ones while there is room)
        and the new ones refused, once past windows are forgotten."""
        active = self._active.setdefault(tenant, OrderedDict())
        while active and next(iter(active.values())) < now - self.active_window_s:
            active.popitem(last=False)
        room = max(0, limit - len(active))
        new = list(filterfalse(active.__contains__, series))
        if len(new) <= room:
            return list(series), set()
        refused = set(new[room:])
        return list(filterfalse(refused.__contains__, series)), refused

    def _take_tokens(self, tenant: str, samples: int, rate: int, now: float) -> tuple[float, float]:
        """The tenant's bucket after taking ``samples`` tokens, or RateLimited. A batch larger than
        the burst passes when the bucket is full and leaves it in debt, so it is never refused forever."""
        capacity = rate * self.burst_seconds
        tokens, updated = self._buckets.get(tenant, (capacity, now))
        tokens = min(capacity, tokens + (now - updated) * rate)
        if tokens < min(samples, capacity):
            wait = max(1, math.ceil((min(samples, capacity) - tokens) / rate))
            raise RateLimited(
                f"tenant {tenant!r} is over its limit of {rate:g} samples/s ({self.samples_per_second.setting(tenant)})",
                wait,
            )
        return tokens - samples, now
