"""Bounded in-memory caches shared by the write path, the read path and the store drivers."""

from collections import OrderedDict, deque
from collections.abc import Iterable
from itertools import compress, repeat


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


class WeightedLRUMap:
    """A map that forgets its least recently used entries once their weights (what each entry
    holds, e.g. a number of series) add up to more than ``max_weight``; an entry heavier than
    that is not kept."""

    def __init__(self, max_weight: int):
        self.max_weight = max_weight
        self.weight = 0
        self._entries: OrderedDict = OrderedDict()

    def get(self, key):
        """The value, or None."""
        found = self._entries.get(key)
        if found is None:
            return None
        self._entries.move_to_end(key)
        return found[0]

    def put(self, key, value, weight: int) -> None:
        if key in self._entries:
            self.weight -= self._entries.pop(key)[1]
        if weight > self.max_weight:
            return
        self._entries[key] = (value, weight)
        self.weight += weight
        while self.weight > self.max_weight:
            self.weight -= self._entries.popitem(last=False)[1][1]


class SlotHolds:
    """Until when (ms) a series' slot needs no more work, by (tenant, slot) then series-set hash:
    the hashes of a batch are checked in C loops (no tuple a sample), and a slot leaves once its
    holds have all passed. At most ``max_entries`` holds; past that a hold is not remembered
    (holding only saves the work of doing it again)."""

    def __init__(self, max_entries: int, slot_width_ms: int):
        self.max_entries, self.slot_width_ms = max_entries, slot_width_ms
        self._held: dict[tuple[str, int], dict[str, int]] = {}
        self._count = 0
        self._swept_slot = 0

    def unheld(self, tenant: str, slot: int, hashes: Iterable[str], now: int) -> list[str]:
        """The distinct ``hashes`` whose hold in the slot has passed at ``now``, or that have none."""
        held = self._held.get((tenant, slot))
        if held is None:
            return list(dict.fromkeys(hashes))
        hashes = list(hashes)
        return list(dict.fromkeys(compress(hashes, map(now.__ge__, map(held.get, hashes, repeat(0))))))

    def hold(self, tenant: str, slot: int, hashes: list[str], until: int, now: int) -> None:
        """Hold the slot of these series until ``until``; the passed holds are swept once a slot
        or when full."""
        if self._count + len(hashes) > self.max_entries or now // self.slot_width_ms != self._swept_slot:
            self._held = {
                key: kept
                for key, held in self._held.items()
                if (kept := {hash_: until for hash_, until in held.items() if until > now})
            }
            self._count = sum(map(len, self._held.values()))
            self._swept_slot = now // self.slot_width_ms
        if self._count + len(hashes) > self.max_entries:
            return
        held = self._held.setdefault((tenant, slot), {})
        before = len(held)
        held.update(dict.fromkeys(hashes, until))
        self._count += len(held) - before
