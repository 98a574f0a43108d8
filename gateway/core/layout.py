"""How time is cut up in storage: the slot width, raw and head retention, and the roll-up granularities.

Both drivers and the Cassandra schema take one Layout, built from ``--slot-width``,
``--raw-retention``, ``--head-retention``, ``--granularities`` (default ``5m:14d,1h:365d``),
``--exemplar-retention`` and ``--max-exemplars-per-series``.
Raw samples live first as head rows (``data_head``, one row a sample, kept ``head_retention_ms``
past the end of their slot; on Cassandra a partition holds one HEAD_SHARDS-th of a tenant's series
for one head slice, so a request's samples are few mutations) and, once the downsampler sealed
their slot, in a compressed block
(``data_blocks``, kept ``raw_retention_ms``), whose partitions cover ``BLOCK_PARTITION_SLOTS``
slots. Each granularity is a table of its own (``data_5m``, ``data_1h``) with its own TTL; its
partitions cover ``partition_width_ms``, a whole number of slots holding about 1000 roll-up rows
per series; native histograms have their own table of each (``histograms_5m``). docs/storage.rst has the arithmetic.
"""

import dataclasses
import math
import re
import zlib
from typing import NamedTuple

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
# The time index (gateway/store/index.py) indexes each series in every bucket of this width in which
# it has samples: an hour, so that a query of the last hour selects the series of 2-3 buckets
# however many a tenant's deploys replaced before (docs/storage.rst has the measurements).
INDEX_BUCKET_MS = HOUR_MS
ROWS_PER_ROLLUP_PARTITION = 1000
# A data_blocks partition holds this many slots of one series: a week with the default 1 h slots,
# so a 24 h read touches 1-2 partitions and a 30 d read 5-6 (docs/storage.rst).
BLOCK_PARTITION_SLOTS = 168
# A Cassandra data_head partition is (tenant, head slice, shard): HEAD_SLICE_MS of time (less where
# the slot width is not a multiple of it) of the series whose head_shard() is the shard. Both are
# part of the stored format: 1M active series at 15 s make 250k rows (about 15 MB) a partition
# (docs/storage.rst has the arithmetic).
HEAD_SHARDS = 16
HEAD_SLICE_MS = 60_000
_UNITS = {"s": 1000, "m": 60_000, "h": HOUR_MS, "d": DAY_MS, "w": 7 * DAY_MS, "y": 365 * DAY_MS}
_SPAN_RE = re.compile(r"(\d+)([smhdwy])")


def head_shard(series_set_hash: str) -> int:
    """The data_head shard of a series: spread evenly, fixed for the series' lifetime."""
    return zlib.crc32(series_set_hash.encode()) % HEAD_SHARDS


class Granularity(NamedTuple):
    name: str
    width_ms: int
    retention_ms: int
    partition_width_ms: int

    @property
    def table(self) -> str:
        return f"data_{self.name}"

    @property
    def histogram_table(self) -> str:
        return f"histograms_{self.name}"


def _span(text: str, what: str) -> int:
    match = _SPAN_RE.fullmatch(text.strip())
    if not match or int(match.group(1)) <= 0:
        raise ValueError(f"{what} {text!r} is not a positive duration like 5m, 1h, 14d")
    return int(match.group(1)) * _UNITS[match.group(2)]


def parse_granularities(text: str, slot_width_ms: int) -> tuple[Granularity, ...]:
    """``5m:14d,1h:365d`` -> granularities, finest first; refuse what the downsampler cannot do."""
    granularities = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, retention = item.partition(":")
        width = _span(name, "granularity")
        if not retention:
            raise ValueError(f"granularity {item!r} needs a retention, e.g. {name}:30d")
        if slot_width_ms % width:
            raise ValueError(
                f"the slot width ({slot_width_ms // 1000} s) must be a common multiple of the granularities;"
                f" {name} does not divide it"
            )
        partition = math.ceil(width * ROWS_PER_ROLLUP_PARTITION / slot_width_ms) * slot_width_ms
        granularities.append(Granularity(name.strip(), width, _span(retention, "retention"), partition))
    granularities.sort(key=lambda g: g.width_ms)
    for finer, coarser in zip(granularities, granularities[1:]):
        if coarser.width_ms % finer.width_ms:
            raise ValueError(
                f"granularity {coarser.name} is not a multiple of {finer.name}, so it cannot be rolled up from it"
            )
    if len({g.name for g in granularities}) != len(granularities):
        raise ValueError(f"granularities {text!r} repeat a width")
    return tuple(granularities)


@dataclasses.dataclass(frozen=True)
class Layout:
    slot_width_ms: int = HOUR_MS
    raw_retention_ms: int = 7 * DAY_MS
    granularities: tuple[Granularity, ...] = parse_granularities("5m:14d,1h:365d", HOUR_MS)
    head_retention_ms: int = 6 * HOUR_MS
    settle_delay_ms: int = 5 * 60_000  # --downsample-delay: a slot is sealed once it saw no write for this long
    exemplar_retention_ms: int = 7 * DAY_MS  # --exemplar-retention
    max_exemplars_per_series: int = 100  # --max-exemplars-per-series: the newest kept per series and slot

    @property
    def block_partition_width_ms(self) -> int:
        return BLOCK_PARTITION_SLOTS * self.slot_width_ms

    @property
    def head_slice_ms(self) -> int:
        """The time a data_head partition covers: HEAD_SLICE_MS, or a divisor of it that divides the slot."""
        return math.gcd(self.slot_width_ms, HEAD_SLICE_MS)

    def head_slices(self, slot_ms: int, start_ms: int, end_ms: int) -> list[int]:
        """The head slices of a slot that overlap an inclusive range."""
        width = self.head_slice_ms
        first = max(slot_ms, start_ms - start_ms % width)
        last = min(slot_ms + self.slot_width_ms - 1, end_ms)
        return list(range(first, last + 1, width))

    @property
    def longest_retention_ms(self) -> int:
        """The longest any stored row lives: no read needs a range wider than this."""
        retentions = [g.retention_ms for g in self.granularities]
        return max(self.raw_retention_ms, self.exemplar_retention_ms, self.head_retention_ms, *retentions)

    def head_ttl_ms(self, slot_ms: int, now_ms: int) -> int:
        """How long a head row of a slot written now must live: until ``head_retention_ms`` after
        the slot ended, and at least that long from now (late data gets the same time to be sealed)."""
        return max(slot_ms + self.slot_width_ms - now_ms, 0) + self.head_retention_ms

    def granularity(self, name: str) -> Granularity:
        for granularity in self.granularities:
            if granularity.name == name:
                return granularity
        raise KeyError(name)


class Retentions:
    """The layout each tenant's data is written and swept with: the store's own, unless the
    overrides file (gateway/core/overrides.py) gives a tenant its own retentions (``by_tenant``,
    replaced whole on each reload)."""

    def __init__(self, layout: Layout):
        self.layout = layout
        self.by_tenant: dict[str, Layout] = {}

    def for_tenant(self, tenant: str) -> Layout:
        return self.by_tenant.get(tenant, self.layout)

    def widest(self) -> Layout:
        """Each retention at its longest over every tenant: how far back any tenant's data reaches."""
        layouts = [self.layout, *self.by_tenant.values()]
        return dataclasses.replace(
            self.layout,
            raw_retention_ms=max(layout.raw_retention_ms for layout in layouts),
            exemplar_retention_ms=max(layout.exemplar_retention_ms for layout in layouts),
            granularities=tuple(
                g._replace(retention_ms=max(layout.granularity(g.name).retention_ms for layout in layouts))
                for g in self.layout.granularities
            ),
        )
