"""Which series already have their metadata in the store, so ingest writes it once per series.

Level one is a bounded in-memory LRU keyed by tenant + series-set hash (seed 002). A false
miss only costs a harmless re-insert of the metadata, never correctness.
"""

from collections import OrderedDict
from collections.abc import Iterable

from gateway import metrics


class SeenSeries:
    """A bounded LRU set of (tenant, series_set_hash)."""

    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str], None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: tuple[str, str]) -> bool:
        if key in self._entries:
            self._entries.move_to_end(key)
            metrics.METADATA_CACHE.labels("memory", "hit").inc()
            return True
        metrics.METADATA_CACHE.labels("memory", "miss").inc()
        return False

    def add_all(self, keys: Iterable[tuple[str, str]]) -> None:
        entries = self._entries
        for key in keys:
            entries[key] = None
            entries.move_to_end(key)
        while len(entries) > self.max_entries:
            entries.popitem(last=False)
