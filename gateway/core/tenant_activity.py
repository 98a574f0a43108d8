"""What each tenant writes, for the status page (gateway/http/webui.py) and /metrics: samples
accepted (``tsgate_tenant_samples_accepted_total{tenant}``) and active series
(``tsgate_tenant_active_series{tenant}``: series written within the last ``window_s``, 20
minutes as the active-series limit counts them).

A batch costs C-speed work only (map, dict.update), no Python per sample: ingest's hot path
(about 0.1 µs a sample). Memory is about 40 bytes an active series: the hashes are the strings
the known-series cache already holds.
Series past the window are forgotten by a pass every ``prune_every_s``, so a series counts as
active for up to ``window_s + prune_every_s`` after its last sample. Like the tenant limits,
the figures are per process; under ``--workers N`` /metrics sums them, so a series written
through two workers counts twice.
"""

import time
from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import itemgetter

from gateway.core import metrics

_TENANT, _HASH = itemgetter(0), itemgetter(1)


class TenantActivity:
    def __init__(self, window_s: float = 1200.0, prune_every_s: float = 300.0, clock=time.monotonic):
        self.window_s = window_s
        self.prune_every_s = prune_every_s
        self.clock = clock
        self._last_written: dict[str, dict[str, float]] = {}  # tenant -> {series-set hash: when}
        self._pruned = clock()

    def record(self, series: Sequence[tuple]) -> None:
        """Note a stored batch, given as the (tenant, series-set hash, ...) of each sample."""
        if not series:
            return
        now = self.clock()
        tenants = set(map(_TENANT, series))
        by_tenant: dict[str, list[str]]
        if len(tenants) == 1:
            by_tenant = {tenants.pop(): list(map(_HASH, series))}
        else:  # only the native API's items name tenants of their own
            by_tenant = {}
            for tenant, hash_, *_ in series:
                by_tenant.setdefault(tenant, []).append(hash_)
        self._record(by_tenant, now)

    def record_tenant(self, tenant: str, hashes: Sequence[str]) -> None:
        """Note a stored batch of one tenant, given as the series-set hash of each sample."""
        if hashes:
            self._record({tenant: hashes}, self.clock())

    def _record(self, by_tenant: Mapping[str, Sequence[str]], now: float) -> None:
        for tenant, hashes in by_tenant.items():
            self._last_written.setdefault(tenant, {}).update(zip(hashes, repeat(now)))
            metrics.TENANT_SAMPLES.labels(tenant).inc(len(hashes))
        if not self.prune_if_due():
            for tenant in by_tenant:
                metrics.TENANT_ACTIVE_SERIES.labels(tenant).set(len(self._last_written[tenant]))

    def prune_if_due(self) -> bool:
        """Forget the series not written within the window, at most every ``prune_every_s``
        (a pass over every active series); a tenant with none left shows 0. True if it pruned."""
        now = self.clock()
        if now - self._pruned < self.prune_every_s:
            return False
        self._pruned = now
        oldest = now - self.window_s
        for tenant, written in list(self._last_written.items()):
            kept = {hash_: when for hash_, when in written.items() if when >= oldest}
            if kept:
                self._last_written[tenant] = kept
            else:
                del self._last_written[tenant]
            metrics.TENANT_ACTIVE_SERIES.labels(tenant).set(len(kept))
        return True
