"""Delta sums and histograms summed into cumulative ones, as the OpenTelemetry Collector's
deltatocumulative processor (which Prometheus 3 offers for its OTLP receiver) does: each
series' running total is kept in memory, a point adds to it, and the series' first point is its
start (the created timestamp). A point at or before the series' last one is refused (a resent
or out-of-order delta would count twice); a series not seen among the last ``max_series`` is
forgotten and starts again. A gateway replica keeps its own totals: deltas of one series must
reach one replica."""

from collections import OrderedDict


class DeltaOutOfOrder(ValueError):
    """A delta point at or before the last one of its series."""


class DeltaToCumulative:
    def __init__(self, max_series: int = 100_000):
        self.max_series = max_series
        self._state: OrderedDict[tuple, list] = OrderedDict()

    def _key(self, tenant: str, name: str, labels: dict[str, str]) -> tuple:
        return tenant, name, *sorted(labels.items())

    def _get(self, key: tuple, timestamp: int) -> list | None:
        state = self._state.get(key)
        if state is None:
            return None
        if timestamp <= state[1]:
            raise DeltaOutOfOrder(f"a delta point at {timestamp} ms, not after its series' last at {state[1]} ms")
        self._state.move_to_end(key)
        return state

    def _put(self, key: tuple, state: list) -> None:
        self._state[key] = state
        if len(self._state) > self.max_series:
            self._state.popitem(last=False)

    def sum(
        self, tenant: str, name: str, labels: dict[str, str], start: int, timestamp: int, value: float
    ) -> tuple[float, int]:
        """The cumulative value and the created timestamp of a delta sum point."""
        key = self._key(tenant, name, labels)
        state = self._get(key, timestamp)
        if state is None:
            self._put(key, [start or timestamp, timestamp, value])
            return value, start or timestamp
        state[1] = timestamp
        state[2] += value
        return state[2], state[0]

    def histogram(
        self,
        tenant: str,
        name: str,
        labels: dict[str, str],
        start: int,
        timestamp: int,
        total: float | None,
        count: int,
        bounds: list[float],
        counts: list[int],
    ) -> tuple[float | None, int, list[int], int]:
        """The cumulative sum, count and bucket counts, and the created timestamp, of a delta
        histogram point; a point with other bounds than the series' starts it again."""
        key = self._key(tenant, name, labels)
        state = self._get(key, timestamp)
        if state is None or state[5] != bounds:
            self._put(key, [start or timestamp, timestamp, total, count, list(counts), list(bounds)])
            return total, count, list(counts), start or timestamp
        state[1] = timestamp
        state[2] = None if total is None or state[2] is None else state[2] + total
        state[3] += count
        state[4] = [a + b for a, b in zip(state[4], counts)]
        return state[2], state[3], list(state[4]), state[0]
