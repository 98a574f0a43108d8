"""Series-slots whose seal or roll-up failed: isolated from the rest of the round, retried with
backoff, and watched against ``--head-retention`` (docs/downsampling.rst, "When a series-slot fails").

A failure is kept in memory by the process that saw it: a restarted downsampler (or the next
``tsgate downsample --once``) tries every pending slot again at once.
"""

import logging
from datetime import UTC, datetime
from typing import NamedTuple

from twisted.internet.defer import FirstError

from gateway.core import metrics
from gateway.core.layout import Layout
from gateway.store.contract import StoreUnavailable

log = logging.getLogger(__name__)

FIRST_RETRY_MS = 30_000
LONGEST_RETRY_MS = 15 * 60_000


class RollUpFailed(Exception):
    """The slot's raw block was written, but a roll-up of it failed (the cause says why)."""


class SlotFailure(NamedTuple):
    attempts: int
    retry_at_ms: int
    sealed: bool  # the raw block was written: nothing expires with the head rows
    warned: bool  # its near expiry was logged


def _root(error: BaseException) -> BaseException:
    """The exception behind gatherResults' FirstError wrappers (the store's own error)."""
    while isinstance(error, FirstError):
        error = error.subFailure.value
    return error


def _when(timestamp_ms: int) -> str:
    return datetime.fromtimestamp(timestamp_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class SlotFailures:
    def __init__(self, layout: Layout):
        self.layout = layout
        self._failures: dict[tuple[str, str, int], SlotFailure] = {}

    def due(self, tenant: str, series_set_hash: str, slot: int, now_ms: int) -> bool:
        """Whether the slot may be tried now: it never failed, or its backoff has passed."""
        failure = self._failures.get((tenant, series_set_hash, slot))
        return failure is None or now_ms >= failure.retry_at_ms

    def succeeded(self, tenant: str, series_set_hash: str, slot: int) -> None:
        self._failures.pop((tenant, series_set_hash, slot), None)

    def failed(self, tenant: str, series_set_hash: str, slot: int, error: Exception, now_ms: int) -> None:
        """Count and log one failed attempt; the next waits 30 s, doubling up to 15 minutes. The
        first attempt's traceback is logged, but not for a store that is unavailable (a node
        down is one line, not a stack)."""
        key = (tenant, series_set_hash, slot)
        before = self._failures.get(key)
        attempts = before.attempts + 1 if before else 1
        sealed = isinstance(error, RollUpFailed)
        cause = _root(error.__cause__ if sealed and error.__cause__ is not None else error)
        stage = "rollup" if sealed else "seal"
        metrics.DOWNSAMPLE_SLOT_FAILURES.labels(stage, type(cause).__name__).inc()
        delay = min(FIRST_RETRY_MS << min(attempts - 1, 10), LONGEST_RETRY_MS)
        log.warning(
            "downsample: %s of tenant %s series %s slot %s failed (attempt %d, %s: %s); retried in %d s,"
            " the other slots go on",
            "roll-up (raw block written)" if sealed else "seal",
            tenant,
            series_set_hash,
            _when(slot),
            attempts,
            type(cause).__name__,
            cause,
            delay // 1000,
            exc_info=cause if attempts == 1 and not isinstance(cause, StoreUnavailable) else None,
        )
        self._failures[key] = SlotFailure(attempts, now_ms + delay, sealed, before.warned if before else False)

    def near_expiry(self, now_ms: int) -> int:
        """Failed slots not sealed yet whose head rows have less than half of ``--head-retention``
        left before they expire (and have not expired yet); each is logged once as it gets there."""
        retention, width = self.layout.head_retention_ms, self.layout.slot_width_ms
        count = 0
        for key, failure in self._failures.items():
            tenant, series_set_hash, slot = key
            expires = slot + width + retention
            if failure.sealed or not expires - retention // 2 <= now_ms < expires:
                continue
            count += 1
            if not failure.warned:
                log.error(
                    "downsample: tenant %s series %s slot %s is still unsealed after %d attempts; its head rows"
                    " expire at %s (--head-retention) and their samples are lost unless it is sealed by then",
                    tenant,
                    series_set_hash,
                    _when(slot),
                    failure.attempts,
                    _when(expires),
                )
                self._failures[key] = failure._replace(warned=True)
        return count
