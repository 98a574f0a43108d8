"""Bounded in-memory caches shared by the write path, the read path and the store drivers."""

from collections import OrderedDict, deque
from itertools import compress


class LRUMap:
    """A bounded map that forgets its least recently used entries."""

    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self._entries: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key):
        """The value, or None; raises TypeError for an unhashable key."""
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def get_many(self, keys: list) -> list:
        """The value of each key, None where there is none, in one pass of C loops (no Python a
        key): a batch of known series costs a few hundred ns each. Values must be truthy."""
        entries = self._entries
        values = list(map(entries.get, keys))
        deque(map(entries.move_to_end, compress(keys, values)), maxlen=0)
        return values

    def add_all(self, items: dict) -> None:
        entries = self._entries
        entries.update(items)
        for key in items:
            entries.move_to_end(key)
        while len(entries) > self.max_entries:
            entries.popitem(last=False)
