"""The one read of the query APIs: the series a query selected, read a batch at a time through
the read path (gateway/store/read_path.py: bounded store calls, counted in the store metrics), each
batch spent from the request's ReadBudget before the next is read.

PromQL, Prometheus remote read, Graphite render and the native /api/query all read here. Each API
keeps the limit flag that mirrors its origin (--query-max-samples as Prometheus's
query.max-samples, --max-samples-per-query for remote read, --max-points-per-query for render and
/api/query) and the refusal its clients know; the budget is how every one of them is counted.
So a request over its limit stops after the batch that crossed it, never after reading everything.
"""

import operator
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

from gateway.core.layout import Granularity
from gateway.core.model import Limits, SeriesKey, now_ms
from gateway.core.samples import Samples, SamplesStack
from gateway.store import Store
from gateway.store.contract import ExemplarRow, HistogramRow
from gateway.store.read_path import ReadPath, SeriesData

READ_BATCH = 256  # series read at a time over READ_BATCH_SPAN_MS or more, their samples counted in between
READ_BATCH_SPAN_MS = 6 * 3600_000
MAX_READ_BATCH = 2048


def series_per_read(start_ms: int, end_ms: int) -> int:
    """How many series one store call reads: READ_BATCH over READ_BATCH_SPAN_MS or more, more
    over a shorter range, whose series hold fewer samples each (a dashboard's last hour: 1536,
    one call where 256 a call made six, each a thread hop, a query and, on SQLite, a scan of the
    head's unfolded batches), up to MAX_READ_BATCH (SQLite's IN lists, Cassandra's fan-out)."""
    return min(MAX_READ_BATCH, READ_BATCH * max(1, READ_BATCH_SPAN_MS // max(end_ms - start_ms, 1)))


class Selected(NamedTuple):
    """One series a query selected, with its labels as the query's API shows them (Prometheus
    labels, Graphite tags), built once when the series was matched."""

    key: SeriesKey
    labels: dict[str, str]


Selection = list[Selected]


class ReadBudget:
    """What one request may read: ``limit`` samples or points, spent as the reads proceed.

    Over the limit, ``refusal(count, what)`` is raised: each API's own error and text (``count``
    is what the last step spent, ``what`` names that step). ``check``, when given, runs before each
    batch: PromQL's deadline and cancellation."""

    def __init__(
        self,
        limit: int,
        refusal: Callable[[int, str], Exception],
        check: Callable[[], None] | None = None,
    ):
        self.limit = limit
        self.refusal = refusal
        self._check = check
        self.spent = 0

    def spend(self, count: int, what: str = "") -> None:
        self.spent += count
        if self.spent > self.limit:
            raise self.refusal(count, what)

    def check(self) -> None:
        if self._check is not None:
            self._check()


class ReadService:
    """Samples, roll-ups, native histograms and exemplars of selected series, batched and
    budgeted; the read path's view of time (``now``, the readable part of a range, the roll-up
    a range reads) on one clock."""

    def __init__(self, store: Store, clock=now_ms, max_future_ms: int = Limits.max_future_ms):
        self.store = store
        self.layout = store.layout
        self.path = ReadPath(store, clock, max_future_ms)

    def now(self) -> int:
        return self.path.clock()

    def readable(self, start_ms: int, end_ms: int) -> tuple[int, int]:
        return self.path.readable(start_ms, end_ms)

    def exemplar_range(self, start_ms: int, end_ms: int) -> tuple[int, int]:
        return self.path.exemplar_range(start_ms, end_ms)

    def rollup_for(self, start_ms: int, tenant: str) -> Granularity | None:
        return self.path.rollup_for(start_ms, tenant)

    async def samples(
        self,
        series: Sequence[SeriesKey],
        start_ms: int,
        end_ms: int,
        budget: ReadBudget | None = None,
        what: str = "",
        aggregate: str = "avg",
        fallback: str | None = "last",
        granularity: Granularity | None = None,
        before_raw: Granularity | None = None,
    ) -> list[SeriesData]:
        """Each series' samples, stitched by the read path (``aggregate`` of a roll-up before the
        raw retention, ``fallback`` where a series lacks it; that roll-up ``before_raw`` where
        given); with ``granularity``, that roll-up's aggregate over the whole range."""

        def read(part):
            if granularity is None:
                return self.path.read(part, start_ms, end_ms, aggregate, fallback, before_raw)
            return self.path.read_rollup(part, granularity, aggregate, start_ms, end_ms, fallback)

        return await self._batched(
            series,
            read,
            operator.attrgetter("samples.timestamps.size"),
            budget,
            what,
            series_per_read(start_ms, end_ms),
        )

    async def stacked_samples(
        self, series: Sequence[SeriesKey], start_ms: int, end_ms: int, budget: ReadBudget | None = None, what: str = ""
    ) -> list[SamplesStack]:
        """``samples`` (raw, or a roll-up's average before the raw retention) laid end to end, a
        stack a batch of series in their order, read against the same budget (ReadPath.read_stacked;
        a stack a batch: one of all would copy every sample of the query once more)."""

        async def read(part):
            return [await self.path.read_stacked(part, start_ms, end_ms)]

        return await self._batched(
            series, read, lambda stack: len(stack.timestamps), budget, what, series_per_read(start_ms, end_ms)
        )

    async def raw(
        self, series: Sequence[SeriesKey], start_ms: int, end_ms: int, budget: ReadBudget | None = None, what: str = ""
    ) -> list[Samples]:
        """Each series' raw samples alone (blocks merged with head rows), whatever the retention."""
        return await self._batched(
            series,
            lambda part: self.path.read_raw(part, start_ms, end_ms),
            len,
            budget,
            what,
            series_per_read(start_ms, end_ms),
        )

    async def histograms(
        self, tenant: str, hashes: Sequence[str], start_ms: int, end_ms: int, budget: ReadBudget | None = None
    ) -> list[list[HistogramRow]]:
        """Each series' native histograms, oldest first; each histogram is one sample of the budget."""
        return await self._batched(
            hashes,
            lambda part: self.path.read_histograms(tenant, part, start_ms, end_ms),
            len,
            budget,
            "",
            series_per_read(start_ms, end_ms),
        )

    async def exemplars(
        self, tenant: str, hashes: Sequence[str], start_ms: int, end_ms: int
    ) -> list[list[ExemplarRow]]:
        """Each series' exemplars in a range (cut with ``exemplar_range`` first)."""
        if end_ms < start_ms:
            return [[] for _ in hashes]
        return await self._batched(
            hashes,
            lambda part: self.path.read_exemplars(tenant, part, start_ms, end_ms),
            len,
            None,
            "",
            series_per_read(start_ms, end_ms),
        )

    async def created(self, tenant: str, series: Sequence[SeriesKey]) -> list[int | None]:
        """Each series' created timestamp (remote write 2.0), None where none is stored."""

        async def read(part):
            found = await self.path.read_created(tenant, [key.series_set_hash for key in part])
            return [found.get(key.series_set_hash) for key in part]

        return await self._batched(series, read, len, None, "")

    @staticmethod
    async def _batched(
        series: Sequence,
        read: Callable[[Sequence], Awaitable[list]],
        count: Callable[[Any], int],
        budget: ReadBudget | None,
        what: str,
        batch: int = READ_BATCH,
    ) -> list:
        """The one read loop: ``read`` each ``batch`` of ``series``, spending what each batch
        holds (``count`` of each series' result) before the next is read."""
        found: list = []
        for first in range(0, len(series), batch):
            if budget is not None:
                budget.check()
            part = await read(series[first : first + batch])
            if budget is not None:
                budget.spend(sum(map(count, part)), what)
            found.extend(part)
        return found
