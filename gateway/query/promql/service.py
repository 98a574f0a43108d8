"""PromQL over the planner and the read path: what gateway/http/promql_api.py asks for once it
has decoded a request. Each selector's series are selected once; their samples and native
histograms are read through the one batched read (gateway/query/read_service.py), counted against
--query-max-samples and checked against the query's deadline (what the evaluation will hold, series x steps, is counted first,
before anything is read); parsing, histogram decoding and evaluation run in threads, off the
reactor, but for the short and recently parsed texts and the small evaluations that cost less
than the hop there and back. docs/promql.rst."""

import functools
import threading
import time
from datetime import UTC, datetime

import numpy as np
from twisted.internet import defer

from gateway.core import blocking
from gateway.core.caches import LRUMap
from gateway.core.layout import INDEX_BUCKET_MS, Granularity
from gateway.core.overrides import PerTenant, per_tenant
from gateway.query.planner import QueryPlanner
from gateway.query.promql.engine import (
    SHORT_TEXT_CHARS,
    Evaluator,
    Query,
    QueryText,
    estimated_samples,
    plan,
    selector_matchers,
)
from gateway.query.promql.values import Guard, PromQLError, Series
from gateway.query.read_service import ReadBudget, Selected, Selection
from gateway.store import Store
from gateway.store.contract import ExemplarRow, time_slot
from protocols.prometheus import utf8_labels
from protocols.prometheus.native_histogram import decode_sample

# An evaluation this small runs at once, not in a thread (_small).
SMALL_VALUES = 64
SMALL_SAMPLES = 1024

# What /api/v1/series first asks the store about: the newest minute of its range (up to now), where
# every live series scraped at least once a minute has a sample; only the series not found there
# are read over the whole range (on both stores reading a range's head is most of the check's cost).
PROBE_MS = 60_000

# A listing of the tenant that was past the serving process's bound (``most_rows``) is not tried
# there again for this long: an executor answers it, and the bounded read before was one more read
# of a thousand rows for nothing (a 1,500-value listing took 2.2 ms of CPU with it, 1.0 without).
# Listings grow with the tenant; one that shrank (a delete) is tried there again once this passed.
OVERSIZED_LISTING_MS = 60_000


class PromQLService:
    def __init__(
        self,
        store: Store,
        planner: QueryPlanner,
        max_samples: int | PerTenant,
        lookback_ms: int,
        timeout_ms: int,
        text: QueryText | None = None,
        delayed_name_removal: bool = False,
    ):
        self.store = store
        self.planner = planner
        self.max_samples = per_tenant("query-max-samples", max_samples)
        self.lookback_ms = lookback_ms
        self.timeout_ms = timeout_ms
        self.text = text or QueryText()
        self.delayed_name_removal = delayed_name_removal
        self._oversized = LRUMap(10_000)  # (tenant, label name, buckets) -> until when it is left to executors

    def query(self, start_ms: int, end_ms: int, step_ms: int) -> Query:
        """A query over [start_ms, end_ms] every ``step_ms`` (0: instant), with the configured lookback."""
        return Query(start_ms, end_ms, step_ms, self.lookback_ms)

    async def _parsed(self, text: str, query: Query | None = None):
        """``text`` parsed: here when that costs next to nothing (QueryText.parses_at_once), as
        for a dashboard's texts, else in a thread, off the reactor."""
        if self.text.parses_at_once(text, query):
            return self.text.parse(text, query)
        return await blocking.in_thread(self.text.parse, text, query)

    async def evaluate(self, tenant: str, text: str, query: Query, times: np.ndarray, timeout_ms: int | None):
        """The value of the query at ``times``, and the warnings its answer must carry; the
        deadline is the asked timeout, at most the configured one."""
        allowed = self.timeout_ms if timeout_ms is None else min(timeout_ms, self.timeout_ms)
        guard = Guard(
            time.monotonic() + allowed / 1000,
            self.max_samples(tenant),
            threading.Event(),
            self.max_samples.setting(tenant),
        )
        try:
            return await self._evaluate(tenant, text, query, times, guard)
        except defer.CancelledError:
            guard.cancelled.set()  # type: ignore[union-attr]  # the evaluation thread stops at its next check; this guard was built with its event
            raise
        except RecursionError:
            raise PromQLError(
                'invalid parameter "query": the expression is nested too deeply to evaluate (--query-max-depth, --query-max-terms)',
                "bad_data",
            ) from None

    async def _evaluate(self, tenant: str, text: str, query: Query, times: np.ndarray, guard: Guard):
        expr = await self._parsed(text, query)
        guard.count(estimated_samples(expr, query, lambda key: 1))
        needs = plan(expr, query)
        selected = {
            key: await self.planner.select(tenant, matchers, utf8_labels, low, high)
            for key, (matchers, low, high) in needs.items()
        }
        held = estimated_samples(expr, query, lambda key: len(selected[key]))
        guard.count(held)
        data, histograms = await defer.gatherResults(
            [
                defer.ensureDeferred(self._fetch(selected, needs, guard)),
                defer.ensureDeferred(self._fetch_histograms(tenant, selected, needs, guard)),
            ],
            consumeErrors=True,
        ).addErrback(lambda failure: failure.value.subFailure.raiseException())
        evaluator = Evaluator(
            query,
            data,
            guard.deadline,
            histograms,
            guard.max_samples,
            guard.cancelled,
            guard.setting,
            self.delayed_name_removal,
        )
        if _small(text, held, data, histograms):
            value = evaluator.result(expr, times)
        else:
            value = await blocking.in_thread(evaluator.result, expr, times)
        return value, self._rollup_warnings(tenant, needs) + evaluator.warnings

    def _rollup_warnings(self, tenant: str, needs: dict) -> list[str]:
        """Say so when samples before the raw retention came from roll-ups (docs/promql.rst)."""
        earliest = min((low for _, low, _ in needs.values()), default=None)
        granularity = self.planner.rollup_for(earliest, tenant) if earliest is not None else None
        if granularity is None:
            return []
        raw_retention_ms = self.store.retentions.for_tenant(tenant).raw_retention_ms
        boundary = datetime.fromtimestamp(self.planner.now() / 1000 - raw_retention_ms / 1000, UTC)
        return [
            f"samples before {boundary:%Y-%m-%dT%H:%M:%SZ} (past --raw-retention) are {granularity.name} roll-ups:"
            " one point per bucket, the average for gauges, the last value for counters"
        ]

    async def _fetch(self, selected: dict[tuple, Selection], needs: dict, guard: Guard) -> dict[tuple, list[Series]]:
        """The samples of every selector's ``selected`` series, through the one read."""
        budget = _budget(guard)
        data: dict[tuple, list[Series]] = {}
        for key, (_, low, high) in needs.items():
            series = selected[key]
            data[key] = []
            first = 0
            for stack in await self.planner.stacked_samples([s.key for s in series], low, high, budget):
                timestamps, values, bounds = stack.timestamps, stack.values, stack.bounds
                part = series[first : first + len(bounds) - 1]
                first += len(part)
                data[key] += [
                    Series(s.labels, timestamps[a:b], values[a:b]) for s, a, b in zip(part, bounds, bounds[1:]) if b > a
                ]
        return data

    async def _fetch_histograms(
        self, tenant: str, selected: dict[tuple, Selection], needs: dict, guard: Guard
    ) -> dict[tuple, list[Series]]:
        """The native histograms of every selector's ``selected`` series (raw samples only: the
        read path's roll-ups hold floats), as series of Histogram objects (None: stale); each
        histogram counts as one sample against --query-max-samples."""
        budget = _budget(guard)
        found: dict[tuple, list[Series]] = {}
        for key, (_, low, high) in needs.items():
            series = selected[key]
            rows = await self.planner.histograms(tenant, [s.key.series_set_hash for s in series], low, high, budget)
            if not any(rows):
                continue
            for selected_series, decoded in zip(series, await blocking.in_thread(_decoded_histograms, rows)):
                if decoded is not None:
                    found.setdefault(key, []).append(Series(selected_series.labels, *decoded))
        return found

    async def matched(
        self, tenant: str, selectors: list[str], start_ms: int | None = None, end_ms: int | None = None
    ) -> list[dict]:
        """Label sets of the series the selectors select, sorted: with a start, those with data in
        [start_ms, end_ms] (``_with_data``), as Prometheus lists a series with a chunk in the range;
        without, every series of the tenant."""
        found = await self._selected(tenant, selectors, start_ms, end_ms)
        if start_ms is not None:
            found = await self._with_data(tenant, selectors, found, start_ms, end_ms)
        return [found[key].labels for key in sorted(found)]

    async def _selected(
        self, tenant: str, selectors: list[str], start_ms: int | None, end_ms: int | None
    ) -> dict[tuple, Selected]:
        """The series the selectors select in the time index's buckets of [start_ms, end_ms] (every
        series without a start), by their sorted labels."""
        found: dict[tuple, Selected] = {}
        for text in selectors:
            expr = await self._parsed(text)
            if type(expr).__name__ != "VectorSelector":
                raise PromQLError(f'invalid parameter "match[]": {text!r} is not a series selector', "bad_data")
            selection = await self.planner.select(tenant, selector_matchers(expr), utf8_labels, start_ms, end_ms)
            for selected in selection:
                found[tuple(sorted(selected.labels.items()))] = selected
        return found

    async def _with_data(
        self, tenant: str, selectors: list[str], found: dict[tuple, Selected], start_ms: int, end_ms: int | None
    ) -> dict[tuple, Selected]:
        """Of ``found``, the series with data in [start_ms, end_ms] (to --max-future ahead without an
        end): raw samples or native histograms, or the roll-up the read path reads for a range
        starting past the raw retention. The time index lists a series for its whole hour bucket,
        and the next one when it was written in the last quarter of its bucket (docs/storage.rst,
        "Grain"): the series the index gives for the range's inner buckets (``_inner_buckets``)
        have data in it; the others are asked of the store, first about the range's newest
        PROBE_MS (up to now), where every live series has a sample, then those not found there
        about the whole range; a range within one time slot at once where the store reads its head
        a slot at a time (Store.head_read_by_slot), as a probe there would only ask again about the
        series without data."""
        start_ms, end_ms = self.planner.readable(
            start_ms, self.planner.now() + self.planner.path.max_future_ms if end_ms is None else end_ms
        )
        inner = _inner_buckets(start_ms, end_ms)
        certain: dict[tuple, Selected] = {}
        if inner is not None and self.planner.index_buckets(tenant, *inner) is not None:
            certain = await self._selected(tenant, selectors, *inner)
        unsure = {selected.key.series_set_hash for key, selected in found.items() if key not in certain}
        probe_end = min(end_ms, self.planner.now())
        probe = (max(start_ms, probe_end - PROBE_MS), probe_end)
        checks = [(start_ms, end_ms, self.planner.rollup_for(start_ms, tenant))]
        width = self.store.layout.slot_width_ms
        one_slot = self.store.head_read_by_slot and time_slot(start_ms, width) == time_slot(end_ms, width)
        if probe[0] <= probe[1] and probe != (start_ms, end_ms) and not one_slot:
            checks.insert(0, (*probe, None))
        for low, high, granularity in checks:
            if not unsure:
                break
            unsure -= await self._series_with_data(tenant, list(unsure), low, high, granularity)
        # in the selection's order, which is mostly the labels' order: matched sorts them in one pass
        return {key: selected for key, selected in found.items() if selected.key.series_set_hash not in unsure}

    async def _series_with_data(
        self, tenant: str, hashes: list[str], start_ms: int, end_ms: int, granularity: Granularity | None
    ) -> set[str]:
        """Store.series_with_data, a call a Store.series_with_data_batch of series, the calls at
        once within the store's bound."""
        batch = self.store.series_with_data_batch
        checks = [
            self.store.series_with_data(tenant, hashes[first : first + batch], start_ms, end_ms, granularity)
            for first in range(0, len(hashes), batch)
        ]
        return set().union(*await defer.gatherResults(checks, consumeErrors=True))

    async def label_names(
        self,
        tenant: str,
        selectors: list[str],
        start_ms: int | None = None,
        end_ms: int | None = None,
        most_rows: int | None = None,
    ) -> list[str] | None:
        """Label names of the series the selectors select, or of the whole tenant without
        selectors, in the time index's buckets of [start_ms, end_ms] (as Prometheus reads its
        index, without checking chunks). With ``most_rows``, only a listing of the tenant of at
        most that many index rows, else None: what the serving process answers itself."""
        if not selectors:
            buckets = self.planner.index_buckets(tenant, start_ms, end_ms)
            keys = await self._bounded(
                (tenant, None, buckets), functools.partial(self.store.list_tenant_tag_keys, tenant, buckets), most_rows
            )
            return None if keys is None else sorted({"__name__", *keys})
        if most_rows is not None:
            return None
        selected = await self._selected(tenant, selectors, start_ms, end_ms)
        return sorted({name for s in selected.values() for name in s.labels})

    async def label_values(
        self,
        tenant: str,
        name: str,
        selectors: list[str],
        start_ms: int | None = None,
        end_ms: int | None = None,
        most_rows: int | None = None,
    ) -> list[str] | None:
        """Values of a label on the series the selectors select, or on the whole tenant without
        selectors, in the time index's buckets of [start_ms, end_ms] as ``label_names`` reads them
        (the store's listings come sorted and distinct); ``most_rows`` as ``label_names``'."""
        if selectors:
            if most_rows is not None:
                return None
            selected = await self._selected(tenant, selectors, start_ms, end_ms)
            return sorted({s.labels[name] for s in selected.values() if name in s.labels})
        buckets = self.planner.index_buckets(tenant, start_ms, end_ms)
        if name == "__name__":
            listing = functools.partial(self.store.list_metric_names, tenant, buckets)
        else:
            listing = functools.partial(self.store.list_tenant_tag_values, tenant, name, buckets)
        return await self._bounded((tenant, name, buckets), listing, most_rows)

    async def _bounded(self, key: tuple, listing, most_rows: int | None) -> list[str] | None:
        """``listing(most_rows)``; None at once for a bounded listing found past its bound within
        the last OVERSIZED_LISTING_MS."""
        if most_rows is None:
            return await listing(None)
        if (self._oversized.get(key) or 0) > self.planner.now():
            return None
        found = await listing(most_rows)
        if found is None:
            self._oversized.add_all({key: self.planner.now() + OVERSIZED_LISTING_MS})
        return found

    async def exemplars(
        self, tenant: str, text: str, start_ms: int | None, end_ms: int | None
    ) -> list[tuple[dict, list[ExemplarRow]]]:
        """The exemplars in [start_ms, end_ms] (default: the exemplar retention up to now; a range
        is cut to what can be stored, from the retention's start to --max-future ahead) of every
        series the query's selectors select, by series labels (sorted), series without exemplars
        left out."""
        now = self.planner.now()
        start_ms = now - self.store.layout.exemplar_retention_ms if start_ms is None else start_ms
        end_ms = now if end_ms is None else end_ms
        if end_ms < start_ms:
            raise PromQLError('invalid parameter "end": end timestamp must not be before start time', "bad_data")
        start_ms, end_ms = self.planner.exemplar_range(start_ms, end_ms)
        expr = await self._parsed(text)
        selected = {}
        for matchers, low, high in plan(expr, self.query(start_ms, end_ms, 0)).values():
            for series in await self.planner.select(tenant, matchers, utf8_labels, low, high):
                selected[series.key.series_set_hash] = series.labels
        found = await self.planner.exemplars(tenant, list(selected), start_ms, end_ms)
        result = [(labels, rows) for labels, rows in zip(selected.values(), found) if rows]
        return sorted(result, key=lambda item: sorted(item[0].items()))


def _small(text: str, held: int, data: dict[tuple, list[Series]], histograms: dict) -> bool:
    """Whether evaluating costs less than a hop to a thread and back (0.1-0.2 ms), so it runs at
    once: a short text (SHORT_TEXT_CHARS: a few terms) holding few values, over few samples of floats."""
    if len(text) > SHORT_TEXT_CHARS or held > SMALL_VALUES or histograms:
        return False
    samples = 0
    for series in data.values():
        samples += sum(len(one.timestamps) for one in series)
        if samples > SMALL_SAMPLES:
            return False
    return True


def _inner_buckets(start_ms: int, end_ms: int) -> tuple[int, int] | None:
    """The time-index buckets of [start_ms, end_ms] whose series all have samples in it (None:
    there are none), as a range: a series indexed in a bucket has samples in it, or in the bucket
    before when it was indexed ahead (gateway/ingest/pipeline.py), so the buckets from the
    second that starts in the range to the last that ends in it."""
    first = -(-start_ms // INDEX_BUCKET_MS) * INDEX_BUCKET_MS + INDEX_BUCKET_MS
    last_end = (end_ms + 1) // INDEX_BUCKET_MS * INDEX_BUCKET_MS - 1
    return (first, last_end) if first < last_end else None


def _budget(guard: Guard) -> ReadBudget:
    """A read's share of the query's guard: --query-max-samples, its deadline and cancellation."""
    return ReadBudget(guard.max_samples, guard.too_many, lambda: guard.check("query execution"))


def _decoded_histograms(rows_by_series) -> list:
    """(timestamps, object array of Histogram or None for a stale marker) of each series' stored
    histograms; None for a series without."""
    decoded: list = []
    for rows in rows_by_series:
        if not rows:
            decoded.append(None)
            continue
        samples = np.full(len(rows), None, dtype=object)
        samples[:] = [decode_sample(row.data) for row in rows]
        decoded.append((np.array([row.timestamp_ms for row in rows], dtype=np.int64), samples))
    return decoded
