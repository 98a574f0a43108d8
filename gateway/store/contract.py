"""The store contract: one interface, implemented table for table by every driver.

Tables (docs/storage.rst has the layouts and the partition arithmetic):

- ``tenants``            every tenant with data (the index shrinks with the data: docs/storage.rst)
- ``metric_names``       tenant -> metric names
- ``series_set_hashes``  (tenant, hash) -> metric name + tags, and the series' latest created timestamp
                         (remote write 2.0), a column of its own written apart; ``last_bucket``, the
                         newest time-index bucket the series was indexed in
- ``series_sets``        (tenant, metric, tag key, tag value) -> hashes; the intersection index.
                         Every series is also indexed under the pseudo tag ``__name__=<metric>``.
- ``tag_keys``           (tenant, metric) -> tag keys
- ``tag_values``         (tenant, metric, tag key) -> tag values
- ``graphite_paths``     (tenant, parent path) -> child node name, leaf and/or branch: the
                         Graphite tree of every series without tags, one level per partition.
- ``tenant_tag_keys``    tenant -> every tag key (Graphite's /tags, seriesByTag without a name)
- ``tenant_tag_values``  (tenant, tag key) -> every value of it
- ``tag_metrics``        (tenant, tag key, tag value) -> metric names carrying that pair
- ``bucket_<table>``     the time index: the rows of ``metric_names``, ``series_sets``, ``tag_keys``,
                         ``tag_values``, ``tenant_tag_keys``, ``tenant_tag_values`` and ``tag_metrics``
                         again, each keyed by a bucket (an hour, INDEX_BUCKET_MS) as well: the series
                         with samples in that hour (gateway/store/index.py), kept the raw retention.
                         Queries of up to 8 days within it select here; the tables above are the
                         all-time index, for longer and older ranges and for time before the time
                         index existed (``index_state``).
- ``metric_metadata``    (tenant, metric) -> type, help, unit (from Prometheus remote write), so
                         roll-ups can tell counters from gauges.
- head rows              each sample written, kept until the downsampler sealed its slot
                         (Layout.head_ttl_ms). Cassandra: ``data_head`` (tenant, head slice, shard)
                         -> (hash, ts, value), so a request's samples are few mutations, and the
                         legacy ``data_raw`` (tenant, hash, time_slot) -> (ts, value), read and
                         deleted only for rows written before data_head existed. SQLite:
                         ``head_batches`` folded into ``head_chunks`` (sqlite.py).
- ``data_blocks``        (tenant, hash, block partition) -> (time_slot, block): each sealed slot's
                         samples as one compressed block (blocks.py), kept the raw retention; on
                         Cassandra also when the slot's head rows were last written and sealed.
- ``data_{granularity}`` (tenant, hash, time_slot) -> (ts, min, max, sum, count, last, increase):
                         roll-ups, one table per granularity with its own TTL (layout.py).
- ``exemplars``          (tenant, hash, time_slot) -> (ts, labels, value): Prometheus exemplars of a
                         series, kept ``--exemplar-retention``; a read gives at most the newest
                         ``--max-exemplars-per-series`` of each slot (SQLite deletes the older ones
                         as it writes, Cassandra leaves them to their TTL).
- ``histograms``         (tenant, hash, time_slot) -> (ts, data): Prometheus native histogram samples
                         of a series, each the bytes of its prometheus.Histogram message, kept the
                         raw retention.
- ``histograms_{granularity}`` (tenant, hash, time_slot) -> (ts, data): histogram roll-ups, one row
                         an interval (ts its start) holding the histograms the interval keeps
                         (gateway/store/histogram_rollup_rows.py), with the granularity's TTL.
- ``histogram_series``   (tenant, source, time_slot) -> hashes: which series have rows in a partition
                         slot of a histogram table (source), written with them, so that reads skip
                         the float-only series (docs/storage.rst).
- ``pending_downsample_sets`` partition -> (time_slot, tenant, hash, last_touch): series-slots
                         waiting for the downsampler when there is no Redis (docs/downsampling.rst).

Every method returns a Deferred: drivers never block the reactor. Writes are upserts, so
writing the same metadata or the same (series, ts) twice is harmless (the last value wins).
Time ranges are inclusive at both ends, as in Prometheus.
"""

import abc
import functools
import json
from collections.abc import Iterable, Iterator, Sequence
from itertools import compress, repeat
from operator import itemgetter
from typing import NamedTuple, overload

import numpy as np
from twisted.internet.defer import Deferred, ensureDeferred, gatherResults

from gateway.core.errors import StoreBusy
from gateway.core.layout import Granularity, Layout, Retentions
from gateway.core.model import SeriesKey
from gateway.core.samples import Samples, SamplesStack, stacked
from gateway.store.blocks import read_header
from gateway.store.calls import StoreCalls, store_call
from gateway.store.deletion import remove_from_index
from gateway.store.index import ALL_TIME_MARGIN_MS, Buckets, DailyRefresh


class RawPoint(NamedTuple):
    tenant: str
    series_set_hash: str
    timestamp_ms: int
    value: float


class RawColumns(Sequence[RawPoint]):
    """RawPoints of one tenant held as columns (ingest's arrays): a Sequence[RawPoint] to any
    write_raw, while a driver that binds columns reads ``hashes`` (a series-set hash a point),
    ``timestamps`` (int64) and ``values`` (float64) as they are, with no object a point."""

    __slots__ = ("tenant", "hashes", "timestamps", "values")

    def __init__(self, tenant: str, hashes: list[str], timestamps: np.ndarray, values: np.ndarray):
        self.tenant = tenant
        self.hashes = hashes
        self.timestamps = timestamps
        self.values = values

    def __len__(self) -> int:
        return len(self.hashes)

    def __iter__(self) -> Iterator[RawPoint]:
        return map(RawPoint, repeat(self.tenant), self.hashes, self.timestamps.tolist(), self.values.tolist())

    @overload
    def __getitem__(self, index: int) -> RawPoint: ...

    @overload
    def __getitem__(self, index: slice) -> "RawColumns": ...

    def __getitem__(self, index: int | slice) -> "RawPoint | RawColumns":
        if isinstance(index, slice):
            return RawColumns(self.tenant, self.hashes[index], self.timestamps[index], self.values[index])
        return RawPoint(self.tenant, self.hashes[index], int(self.timestamps[index]), float(self.values[index]))


def hashes_by_slot(points: "Sequence[RawPoint | HistogramRow]", width: int) -> dict[tuple[str, int], list[str]]:
    """The series-set hash of each point grouped by (tenant, slot): C loops but for points of
    several tenants (the native API's), and RawColumns read as their columns."""
    if isinstance(points, RawColumns):
        tenants, hashes, timestamps = {points.tenant}, points.hashes, points.timestamps
    else:
        tenants, hashes = set(map(itemgetter(0), points)), list(map(itemgetter(1), points))
        timestamps = np.fromiter(map(itemgetter(2), points), dtype=np.int64, count=len(points))
    slots = timestamps - timestamps % width
    if len(tenants) > 1:
        groups: dict[tuple[str, int], list[str]] = {}
        for tenant, hash_, slot in zip(map(itemgetter(0), points), hashes, slots.tolist()):
            groups.setdefault((tenant, slot), []).append(hash_)
        return groups
    if not tenants:
        return {}
    tenant = tenants.pop()
    if slots.min() == slots.max():
        return {(tenant, int(slots[0])): hashes}
    return {(tenant, slot): list(compress(hashes, (slots == slot).tolist())) for slot in np.unique(slots).tolist()}


class ExemplarRow(NamedTuple):
    """One exemplar of a series: its own labels (a trace id, say), value and timestamp."""

    tenant: str
    series_set_hash: str
    timestamp_ms: int
    value: float
    labels: dict[str, str]


class HistogramRow(NamedTuple):
    """One native histogram sample of a series: its timestamp and prometheus.Histogram bytes."""

    tenant: str
    series_set_hash: str
    timestamp_ms: int
    data: bytes


def exemplar_labels_text(labels: dict[str, str]) -> str:
    """The exemplars table's text of a label set: sorted JSON, so the same set is one row."""
    return json.dumps(labels, sort_keys=True, separators=(",", ":"))


def exemplars_in_range(rows: Iterable[ExemplarRow], start_ms: int, end_ms: int) -> list[ExemplarRow]:
    """The rows in an inclusive range, oldest first (ties by labels), as read_exemplars returns them."""
    found = [row for row in rows if start_ms <= row.timestamp_ms <= end_ms]
    return sorted(found, key=lambda row: (row.timestamp_ms, exemplar_labels_text(row.labels)))


class CreatedTimestamp(NamedTuple):
    """When a series (a counter, a histogram) was created, as remote write 2.0 says."""

    tenant: str
    series_set_hash: str
    created_ms: int


class PathNode(NamedTuple):
    name: str
    is_leaf: bool
    is_branch: bool


class Rollup(NamedTuple):
    """One roll-up bucket; aggregates a series kind does not have are None."""

    tenant: str
    series_set_hash: str
    timestamp_ms: int
    min: float | None = None
    max: float | None = None
    sum: float | None = None
    count: int | None = None  # type: ignore[assignment]  # a field, shadowing tuple.count on purpose
    last: float | None = None
    increase: float | None = None


ROLLUP_COLUMNS = Rollup._fields[3:]
# The aggregates a roll-up row carries, one set per series kind of gateway/downsample/aggregate.py
# (gauge, delta counter, cumulative counter, _min, _max): drivers prepare a write for each.
ROLLUP_COLUMN_SETS = (
    ("min", "max", "sum", "count"),
    ("sum", "count"),
    ("last", "increase"),
    ("min", "count"),
    ("max", "count"),
)


class PendingSet(NamedTuple):
    """A series with raw data in a slot that has not been rolled up since."""

    partition: int
    time_slot: int
    tenant: str
    series_set_hash: str
    last_touch_ms: int = 0


class RawData(NamedTuple):
    """Raw samples of one series as stored: sealed blocks (bytes, gateway/store/blocks.py) and head
    rows; ``head_keys`` name the head rows read in the driver's own terms (SQLite: its chunks'
    (slot, seq)), for a seal to hand back to write_block (a driver may leave it empty)."""

    blocks: list[bytes]
    head: Samples
    head_keys: tuple = ()


class RawStack(NamedTuple):
    """read_raw of many series at once (read_raw_stacked): their head samples laid end to end, in
    the order asked, and the blocks of the series that have any, by hash."""

    head: SamplesStack
    blocks: dict[str, list[bytes]]


def raw_stack(hashes: Sequence[str], raw: Sequence[RawData]) -> RawStack:
    """The RawStack of read_raw's answer for ``hashes``."""
    return RawStack(
        stacked([data.head for data in raw]), {hash_: data.blocks for hash_, data in zip(hashes, raw) if data.blocks}
    )


def holds_samples(data: RawData, start_ms: int, end_ms: int) -> bool:
    """Whether what read_raw gave for an inclusive range holds a sample in it: a head sample (read_raw
    gives those of the range), or a block whose first to last timestamp overlaps the range, as
    Prometheus checks a chunk's (no block is decoded)."""
    if len(data.head):
        return True
    headers = map(read_header, data.blocks)
    return any(h.count and h.first_ms <= end_ms and h.last_ms >= start_ms for h in headers)


class SealedBlock(NamedTuple):
    """What write_block takes: one series-slot's block and the head samples merged into it."""

    tenant: str
    series_set_hash: str
    slot_ms: int
    block: bytes
    sealed: Samples
    head_read_ms: int
    head_keys: tuple = ()


class MetricMetadata(NamedTuple):
    tenant: str
    metric_name: str
    type: str
    help: str
    unit: str


class StoreUnavailable(StoreBusy):
    """The store cannot take or answer a request right now; the client should retry (503)."""


def time_slot(timestamp_ms: int, slot_width_ms: int) -> int:
    """Start of the slot holding a timestamp (floor, also for negative timestamps)."""
    return timestamp_ms - timestamp_ms % slot_width_ms


def time_slots(start_ms: int, end_ms: int, slot_width_ms: int) -> range:
    """Every slot that overlaps the inclusive range [start_ms, end_ms]."""
    return range(time_slot(start_ms, slot_width_ms), end_ms + 1, slot_width_ms)


class Lifecycle(abc.ABC):
    """Opening and closing the store, its health and identity, and the sweep of expired data."""

    @abc.abstractmethod
    def start(self) -> Deferred:
        """Connect; the embedded store also creates its schema here."""

    @abc.abstractmethod
    def close(self) -> Deferred:
        """Finish what is in flight and release connections and threads."""

    @abc.abstractmethod
    def ping(self) -> Deferred:
        """Fire when the store answers a trivial query; fail with StoreUnavailable otherwise."""

    @abc.abstractmethod
    def identity(self) -> Deferred:
        """Fire with a text naming this database and no other: two keyspaces, two SQLite files, or
        a keyspace dropped and made again differ. Keys in a shared Redis are prefixed with it."""

    @abc.abstractmethod
    def sweep(self, now_ms: int) -> Deferred:
        """Delete what is past its retention (head rows, blocks, roll-ups, exemplars, histograms and their
        roll-ups); a no-op where the store expires data by itself (Cassandra TTLs)."""


class IndexStore(abc.ABC):
    """The series index: series metadata, the tag and Graphite path indexes, and their deletion."""

    @abc.abstractmethod
    def write_series(self, series: Sequence[SeriesKey]) -> Deferred:
        """Upsert the metadata of these series into every metadata table (series without tags
        also into graphite_paths, series with tags into the tenant-wide tag tables)."""

    @abc.abstractmethod
    def write_series_buckets(self, series_buckets: Sequence[tuple[SeriesKey, int]]) -> Deferred:
        """Index each series in the time index of a bucket (its start, ms): the rows write_series
        writes to the all-time tables, in the bucket tables, kept the tenant's raw retention past
        the bucket's end (Cassandra TTL; SQLite's sweep): older time is selected in the all-time index."""

    @abc.abstractmethod
    def get_series(self, tenant: str, hashes: Iterable[str]) -> Deferred:
        """Fire with {hash: SeriesKey} for the hashes that exist (series_set_hashes)."""

    @abc.abstractmethod
    def series_seen_since(self, tenant: str, hashes: Iterable[str], bucket: int) -> Deferred:
        """Fire with the set of ``hashes`` whose series was indexed in ``bucket`` or a later one
        (series_set_hashes.last_bucket), or has no last bucket (written before it was kept): a
        selection from the all-time index keeps only those that may have data in its range."""

    @abc.abstractmethod
    def _listing(self, name: str, keys: tuple, buckets: Buckets | None, most_rows: int | None = None) -> Deferred:
        """Fire with the sorted values of one index listing (gateway/store/index.py LISTINGS:
        its table, the column listed, the key columns ``keys`` give), read from the all-time
        table or, with ``buckets``, from its bucket table on any of the buckets. The listings
        below are each one of these. With ``most_rows``, fire with None rather than read more
        index rows than that (a value's row in each bucket counts), or than the store reads in
        few requests: the bound of a listing answered in the serving process."""

    @abc.abstractmethod
    def listings_with_rows(self, name: str, listings: Sequence[tuple]) -> Deferred:
        """Fire with, for each listing's keys of ``listings`` (as ``_listing`` takes them), whether
        the all-time table has a row for it: what deleting series asks, many listings a call."""

    @abc.abstractmethod
    def listings_buckets(self, name: str, listings: Sequence[tuple], buckets: Buckets) -> Deferred:
        """Fire with, for each listing of ``listings``, the set of starts of the buckets of
        ``buckets`` in which it has a row: its keys as ``_listing`` takes them, or those and one
        value more, then a row holding that value (every listing of a call alike). What deleting
        series asks of the time index, many listings a call."""

    def find_series(
        self, tenant: str, metric_name: str, tag_key: str, tag_value: str, buckets: Buckets | None = None
    ) -> Deferred:
        """Fire with the set of series-set hashes indexed under one tag pair (series_sets; with
        ``buckets``, those of bucket_series_sets on any of the buckets). Every listing below takes ``buckets`` alike."""
        return self._listing("find_series", (tenant, metric_name, tag_key, tag_value), buckets).addCallback(set)

    @abc.abstractmethod
    def list_tenants(self) -> Deferred:
        """Fire with the sorted list of tenants."""

    def list_metric_names(self, tenant: str, buckets: Buckets | None = None, most_rows: int | None = None) -> Deferred:
        """Fire with the sorted metric names of a tenant (None past ``most_rows``, as ``_listing``)."""
        return self._listing("list_metric_names", (tenant,), buckets, most_rows)

    def list_tag_keys(self, tenant: str, metric_name: str, buckets: Buckets | None = None) -> Deferred:
        """Fire with the sorted tag keys of a metric (never ``__name__``)."""
        return self._listing("list_tag_keys", (tenant, metric_name), buckets)

    def list_tag_values(self, tenant: str, metric_name: str, tag_key: str, buckets: Buckets | None = None) -> Deferred:
        """Fire with the sorted values of a tag key of a metric."""
        return self._listing("list_tag_values", (tenant, metric_name, tag_key), buckets)

    @abc.abstractmethod
    def list_path_children(self, tenant: str, parent: str) -> Deferred:
        """Fire with the sorted [PathNode] directly under a Graphite path ("" is the root)."""

    def list_tenant_tag_keys(
        self, tenant: str, buckets: Buckets | None = None, most_rows: int | None = None
    ) -> Deferred:
        """Fire with every tag key of the tenant, sorted (None past ``most_rows``, as ``_listing``)."""
        return self._listing("list_tenant_tag_keys", (tenant,), buckets, most_rows)

    def list_tenant_tag_values(
        self, tenant: str, tag_key: str, buckets: Buckets | None = None, most_rows: int | None = None
    ) -> Deferred:
        """Fire with every value of a tag key across the tenant's metrics, sorted (None past
        ``most_rows``, as ``_listing``)."""
        return self._listing("list_tenant_tag_values", (tenant, tag_key), buckets, most_rows)

    def find_metrics_by_tag(
        self, tenant: str, tag_key: str, tag_value: str, buckets: Buckets | None = None
    ) -> Deferred:
        """Fire with the sorted metric names that have a series carrying ``tag_key=tag_value``."""
        return self._listing("find_metrics_by_tag", (tenant, tag_key, tag_value), buckets)

    @abc.abstractmethod
    def delete_index_rows(self, rows: dict[str, list[tuple]]) -> Deferred:
        """Delete metadata rows by key: table -> keys in deletion.INDEX_KEYS column order."""

    @abc.abstractmethod
    def write_path_flags(self, tenant: str, parent: str, name: str, is_leaf: bool, is_branch: bool) -> Deferred:
        """Set both flags of a graphite_paths node; a node neither leaf nor branch is deleted."""

    @functools.partial(store_call, bounded=False)
    def delete_series(self, series: Sequence[SeriesKey]) -> Deferred:
        """Remove series from every index (deletion.remove_from_index); their data is left alone."""
        return ensureDeferred(remove_from_index(self, series))


class SampleStore(abc.ABC):
    """Float samples: head rows, sealed blocks and roll-ups, and the deletion of a range of samples."""

    @abc.abstractmethod
    def write_raw(self, points: Sequence[RawPoint]) -> Deferred:
        """Upsert raw points as head rows (data_head on Cassandra, the head log on SQLite); fire only once the store has accepted all of them.
        ``points`` may be RawColumns (ingest's samples as arrays): a driver may bind its columns."""

    @abc.abstractmethod
    def read_raw(self, tenant: str, hashes: Sequence[str], start_ms: int, end_ms: int) -> Deferred:
        """Fire with one RawData per series (in the order of ``hashes``) in an inclusive range:
        the blocks of the slots that overlap it, in slot order, and the Samples of the head rows
        in it not sealed into those blocks yet (a driver may return sealed head rows too: the head
        wins, with the same values). Many series at once, so a driver can read them in few requests."""

    @functools.partial(store_call, bounded=False)
    def read_raw_stacked(self, tenant: str, hashes: Sequence[str], start_ms: int, end_ms: int) -> Deferred:
        """Fire with read_raw's answer as one RawStack (what the PromQL read takes: a Samples and a
        RawData a series cost more than a short range's samples); a driver may read it so at once."""
        hashes = list(hashes)
        return self.read_raw(tenant, hashes, start_ms, end_ms).addCallback(lambda raw: raw_stack(hashes, raw))

    @abc.abstractmethod
    def write_block(
        self,
        tenant: str,
        series_set_hash: str,
        slot_ms: int,
        block: bytes,
        sealed: Samples,
        head_read_ms: int,
        head_keys: tuple = (),
    ) -> Deferred:
        """Upsert the block of one series-slot (kept the raw retention). ``sealed`` are the head
        samples merged into it, read at ``head_read_ms`` (``head_keys``: the RawData.head_keys of
        that read): afterwards read_raw needs to return only head rows written since (a driver
        without TTLs deletes the sealed rows that still hold the sealed value; a row rewritten
        meanwhile stays, to be sealed next time)."""

    @functools.partial(store_call, bounded=False)
    def write_blocks(self, blocks: Sequence[SealedBlock]) -> Deferred:
        """write_block of many series-slots (the downsampler seals in bulk); a driver may batch them."""
        return gatherResults([self.write_block(*block) for block in blocks], consumeErrors=True)

    @abc.abstractmethod
    def write_rollups(self, granularity: Granularity, rows: Sequence[Rollup]) -> Deferred:
        """Upsert roll-up rows (with the granularity's TTL): a later write replaces the aggregates."""

    @abc.abstractmethod
    def read_rollups(
        self, granularity: Granularity, tenant: str, series_set_hash: str, start_ms: int, end_ms: int
    ) -> Deferred:
        """Fire with the [Rollup] of one series in an inclusive range, in time order."""

    @abc.abstractmethod
    def series_with_data(
        self,
        tenant: str,
        hashes: Sequence[str],
        start_ms: int,
        end_ms: int,
        granularity: Granularity | None = None,
        raw: bool = True,
    ) -> Deferred:
        """Fire with the set of ``hashes`` that hold data in an inclusive range: a raw sample (a head
        row, or a block overlapping it: ``holds_samples``) or a native histogram, or, with a
        ``granularity``, a row of that roll-up (floats or histograms). What /api/v1/series asks,
        as Prometheus checks a series' chunks against the range: the time index lists a series
        for a whole bucket, and a bucket ahead (docs/storage.rst). With ``raw`` false, only the
        roll-up's rows count (a delete asks so over a roll-up's retention: on Cassandra a raw read
        of a year lists a partition a slot). ``series_with_data_read`` answers it through the
        reads; a driver may answer in fewer requests."""

    @abc.abstractmethod
    def delete_samples(self, tenant: str, hashes: Sequence[str], start_ms: int, end_ms: int) -> Deferred:
        """Delete what these series hold in an inclusive range (gateway/store/deletion.py): head
        rows, the samples of blocks (each block rewritten without them, in a way that a seal
        writing the block meanwhile never loses its samples outside the range), roll-up rows of
        samples and histograms whose bucket overlaps the range, exemplars and histograms. Cassandra
        looks only as far back as each table's retention (older rows are past the read path)."""


class HistogramStore(abc.ABC):
    """Prometheus native histogram samples and their roll-ups."""

    @abc.abstractmethod
    def write_histograms(self, histograms: Sequence[HistogramRow]) -> Deferred:
        """Upsert native histogram samples (one row per series and timestamp; the last wins),
        kept ``layout.raw_retention_ms``; fire once the store has accepted all of them."""

    @abc.abstractmethod
    def read_histograms(self, tenant: str, hashes: Sequence[str], start_ms: int, end_ms: int) -> Deferred:
        """Fire with one list of HistogramRow per series (in the order of ``hashes``) in an
        inclusive range, oldest first."""

    @abc.abstractmethod
    def write_histogram_rollups(self, granularity: Granularity, rows: Sequence[HistogramRow]) -> Deferred:
        """Upsert histogram roll-up rows (one per series and interval start; the last wins), kept
        the granularity's retention; fire once the store has accepted all of them."""

    @abc.abstractmethod
    def read_histogram_rollups(
        self, granularity: Granularity, tenant: str, hashes: Sequence[str], start_ms: int, end_ms: int
    ) -> Deferred:
        """Fire with one list of HistogramRow per series (in the order of ``hashes``) whose interval
        starts are in an inclusive range, oldest first."""


class ExemplarStore(abc.ABC):
    """Prometheus exemplars of series."""

    @abc.abstractmethod
    def write_exemplars(self, exemplars: Sequence[ExemplarRow]) -> Deferred:
        """Upsert exemplars (one row per series, timestamp and label set; the last value wins),
        kept ``layout.exemplar_retention_ms``; fire once the store has accepted all of them."""

    @abc.abstractmethod
    def read_exemplars(self, tenant: str, hashes: Sequence[str], start_ms: int, end_ms: int) -> Deferred:
        """Fire with one list of ExemplarRow per series (in the order of ``hashes``) in an inclusive
        range, oldest first: of each slot, only the newest ``layout.max_exemplars_per_series``
        stored (newest by timestamp, then the smallest label text) are candidates."""


class PendingStore(abc.ABC):
    """Series-slots waiting for the downsampler (pending_downsample_sets, when there is no Redis)."""

    @abc.abstractmethod
    def mark_pending(self, rows: Sequence[PendingSet], touched_ms: int) -> Deferred:
        """Upsert pending series-slots, setting their last touch."""

    @abc.abstractmethod
    def list_pending(self, partition: int, before_slot: int) -> Deferred:
        """Fire with the [PendingSet] of a partition whose slot starts before ``before_slot``, oldest first."""

    @abc.abstractmethod
    def delete_pending(self, rows: Sequence[PendingSet]) -> Deferred:
        """Remove pending rows, each only if its last touch is still the one given (a series
        touched again meanwhile stays pending)."""


class MetadataStore(abc.ABC):
    """Per-metric metadata (type, help, unit; aggregators) and series created timestamps."""

    @abc.abstractmethod
    def add_metric_aggregators(self, tenant: str, metric_name: str, aggregators: Iterable[str]) -> Deferred:
        """Add to the set of aggregators that exist for a metric (metric_names.aggregators)."""

    @abc.abstractmethod
    def write_metric_metadata(self, rows: Sequence[MetricMetadata]) -> Deferred:
        """Upsert the type, help and unit of metrics (the last write wins)."""

    @abc.abstractmethod
    def get_metric_metadata(self, tenant: str, metric_name: str) -> Deferred:
        """Fire with the MetricMetadata of a metric, or None."""

    @abc.abstractmethod
    def write_created_timestamps(self, rows: Sequence[CreatedTimestamp]) -> Deferred:
        """Set the created timestamp of series whose metadata is written (the last write wins)."""

    @abc.abstractmethod
    def get_created_timestamps(self, tenant: str, hashes: Iterable[str]) -> Deferred:
        """Fire with {hash: created_ms} for the hashes that have one."""


async def series_with_data_read(
    store: "Store",
    tenant: str,
    hashes: Sequence[str],
    start_ms: int,
    end_ms: int,
    granularity: Granularity | None,
    raw: bool = True,
) -> set[str]:
    """Store.series_with_data through read_raw, then the histogram and roll-up reads, each series
    read only until one of them finds data."""
    hashes = list(hashes)
    if end_ms < start_ms:
        return set()
    reads = []
    if raw:
        reads += [
            functools.partial(_raw_with_data, store, tenant, start_ms, end_ms),
            functools.partial(_rows_with_data, store.read_histograms, tenant, start_ms, end_ms),
        ]
    if granularity is not None:
        rollups = functools.partial(_rollups_of_many, store, granularity)
        histogram_rollups = functools.partial(store.read_histogram_rollups, granularity)
        reads += [
            functools.partial(_rows_with_data, rollups, tenant, start_ms, end_ms),
            functools.partial(_rows_with_data, histogram_rollups, tenant, start_ms, end_ms),
        ]
    found: set[str] = set()
    for read in reads:
        rest = [hash_ for hash_ in hashes if hash_ not in found]
        if not rest:
            break
        found.update(await read(rest))
    return found


async def _raw_with_data(store: "Store", tenant: str, start_ms: int, end_ms: int, hashes: list[str]) -> set[str]:
    raw = await store.read_raw(tenant, hashes, start_ms, end_ms)
    return {hash_ for hash_, data in zip(hashes, raw) if holds_samples(data, start_ms, end_ms)}


async def _rows_with_data(read, tenant: str, start_ms: int, end_ms: int, hashes: list[str]) -> set[str]:
    """The hashes for which ``read(tenant, hashes, start_ms, end_ms)`` gives rows."""
    return {hash_ for hash_, rows in zip(hashes, await read(tenant, hashes, start_ms, end_ms)) if rows}


def _rollups_of_many(
    store: "Store", granularity: Granularity, tenant: str, hashes: list[str], start_ms: int, end_ms: int
) -> Deferred:
    """read_rollups of each series, concurrently: a list of rows a series, in order."""
    reads = [store.read_rollups(granularity, tenant, hash_, start_ms, end_ms) for hash_ in hashes]
    return gatherResults(reads, consumeErrors=True)


# bucket_index_since of a store whose time index is as old as its data: every time is in it.
BUCKET_INDEX_ALWAYS = -(2**62)


class Store(Lifecycle, IndexStore, SampleStore, HistogramStore, ExemplarStore, PendingStore, MetadataStore):
    """A read of an inclusive range need not look further back from its end than the layout's
    longest retention (``Layout.longest_retention_ms``): Cassandra cuts wider ranges to their
    newest part rather than list a partition per slot (the read path cuts them before, to the
    retentions before now; gateway/store/read_path.py)."""

    # Sealing groups a tenant's series-slots by head shard, then hash order, over the settled work
    # of 16 partitions at a time (gateway/downsample/processor.py): on Cassandra a group's head
    # rows are then one request. A driver whose head lies in hash order (SQLite's chunks) groups
    # by hash order alone, over all partitions at once (None): the more series sorted together,
    # the closer a group's neighbours lie.
    seal_by_head_shard = True
    seal_partitions_together: int | None = 16
    # Series-slots of one tenant sealed and rolled up together: each step (read the head and
    # blocks, write the blocks, write each granularity's roll-ups) is one store call for all of
    # them, a few requests where one series at a time made about nine (docs/performance-log.rst,
    # "Sealing"). SQLite's single writer takes fewer, larger transactions.
    seal_group = 64
    # Whether series_with_data reads a range's head a slot at a time, whatever its length (SQLite's
    # head chunks): /api/v1/series then asks about a range within one slot at once, where probing
    # its newest minute first would only ask again about the series without data there. Cassandra
    # reads its head a minute's slice at a time, so the probe spares it the rest of the range.
    head_read_by_slot = False
    # Series a series_with_data call of /api/v1/series asks about: Cassandra's calls run at once
    # within the store's bound, and 256 a call spread over its connections (one call of 1,000
    # series took 32 ms where four took 27); SQLite's run one after the other, each scanning the
    # range's head slots once.
    series_with_data_batch = 256
    # How long all-time index rows outlive the data of their series where the store expires them
    # by TTL (index.ALL_TIME_MARGIN_MS; a test shortens it).
    all_time_margin_ms = ALL_TIME_MARGIN_MS

    def __init__(self, layout: Layout):
        self.layout = layout
        # From when (ms) the time index holds every series with samples (set by start()): a store
        # made before it existed answers for earlier times from the all-time index (docs/storage.rst).
        self.bucket_index_since = BUCKET_INDEX_ALWAYS
        self.slot_width_ms = layout.slot_width_ms
        # Each tenant's retentions for what is written from now on and for the sweep (--overrides).
        self.retentions = Retentions(layout)
        # The series whose all-time rows this process rewrote today (write_series_buckets).
        self._refresh = DailyRefresh()
        self.calls = StoreCalls()

    def __init_subclass__(cls, **kwargs):
        """Every contract method a driver implements goes through its StoreCalls (calls.py); the
        Lifecycle's are metered but not bounded: a health check answers while the store is busy."""
        super().__init_subclass__(**kwargs)
        for name in CONTRACT_METHODS:
            method = getattr(cls, name)
            if not hasattr(method, "store_operation") and not getattr(method, "__isabstractmethod__", False):
                setattr(cls, name, store_call(method, bounded=not hasattr(Lifecycle, name)))


ROLES = (Lifecycle, IndexStore, SampleStore, HistogramStore, ExemplarStore, PendingStore, MetadataStore)
# The public methods of the contract, each a store call (calls.py).
CONTRACT_METHODS = tuple(
    name for role in ROLES for name, value in vars(role).items() if callable(value) and not name.startswith("_")
)
