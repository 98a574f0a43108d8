"""The Cassandra schema as CQL text, rendered from the settings that shape it.

``schema.cql`` at the top of the repository is this text for the default settings (a test keeps
them equal); ``tsgate schema print`` shows it for any settings and ``tsgate schema apply`` runs it.
docs/storage.rst explains the layout and the partition-size arithmetic.
"""

import dataclasses
import math

from gateway.core.layout import INDEX_BUCKET_MS, Layout
from gateway.store.deletion import INDEX_KEYS
from gateway.store.index import LISTINGS, bucket_table

HOUR_MS = 3_600_000
TARGET_COMPACTION_WINDOWS = 30
# data_head's current TWCS window compacts its flushed sstables size-tiered once this many are
# alike (Cassandra's default is 4, max 32): head rows are read by their one-minute slice, which
# lives in the few sstables flushed meanwhile, and leave with their whole window, so rewriting
# them tier after tier bought nothing but was most of Cassandra's CPU per head row
# (docs/performance-log.rst). The closing window is still compacted into one sstable, once.
HEAD_COMPACTION_MIN_THRESHOLD = 32
HEAD_COMPACTION_MAX_THRESHOLD = 64


@dataclasses.dataclass(frozen=True)
class SchemaOptions:
    keyspace: str = "tsdb"
    replication: tuple[tuple[str, int], ...] = (("simple", 1),)
    layout: Layout = Layout()

    @property
    def raw_retention_ms(self) -> int:
        return self.layout.raw_retention_ms

    @property
    def slot_width_ms(self) -> int:
        return self.layout.slot_width_ms


def replication_map(replication: tuple[tuple[str, int], ...]) -> dict[str, str]:
    """``(("simple", 3),)`` -> SimpleStrategy; ``(("dc1", 3), ("dc2", 2))`` -> NetworkTopologyStrategy."""
    if len(replication) == 1 and replication[0][0] == "simple":
        return {"class": "SimpleStrategy", "replication_factor": str(replication[0][1])}
    return {"class": "NetworkTopologyStrategy", **{dc: str(factor) for dc, factor in replication}}


def compaction_window_ms(retention_ms: int, slot_width_ms: int) -> int:
    """A whole number of slots, chosen so that a retention spans about 30 TWCS windows (or fewer)."""
    slots = math.ceil(retention_ms / TARGET_COMPACTION_WINDOWS / slot_width_ms)
    return max(1, slots) * slot_width_ms


def _cql_map(mapping: dict[str, str]) -> str:
    return "{" + ", ".join(f"'{key}': '{value}'" for key, value in mapping.items()) + "}"


def _twcs(window_ms: int, thresholds: dict[str, str] | None = None) -> str:
    if window_ms % HOUR_MS == 0:
        unit, size = "HOURS", window_ms // HOUR_MS
    else:
        unit, size = "MINUTES", max(1, window_ms // 60_000)
    return _cql_map(
        {
            "class": "TimeWindowCompactionStrategy",
            "compaction_window_unit": unit,
            "compaction_window_size": str(size),
            **(thresholds or {}),
        }
    )


def _head_twcs(options: SchemaOptions) -> str:
    """data_head's compaction: windows of one slot, flushed sstables merged HEAD_COMPACTION_MIN_THRESHOLD at a time."""
    thresholds = {
        "min_threshold": str(HEAD_COMPACTION_MIN_THRESHOLD),
        "max_threshold": str(HEAD_COMPACTION_MAX_THRESHOLD),
    }
    return _twcs(options.slot_width_ms, thresholds)


def keyspace_statement(options: SchemaOptions) -> str:
    return (
        f"CREATE KEYSPACE IF NOT EXISTS {options.keyspace}\n"
        f"    WITH replication = {_cql_map(replication_map(options.replication))}"
    )


def table_statements(options: SchemaOptions) -> list[str]:
    ks = options.keyspace
    window = compaction_window_ms(options.raw_retention_ms, options.slot_width_ms)
    ttl_s = options.raw_retention_ms // 1000
    head_ttl_s = (options.slot_width_ms + options.layout.head_retention_ms) // 1000
    return [
        f"CREATE TABLE IF NOT EXISTS {ks}.tenants (\n    tenant text PRIMARY KEY\n)",
        f"CREATE TABLE IF NOT EXISTS {ks}.metric_names (\n"
        "    tenant text,\n"
        "    metric_name text,\n"
        "    aggregators set<text>,\n"
        "    PRIMARY KEY ((tenant), metric_name)\n"
        ")",
        f"CREATE TABLE IF NOT EXISTS {ks}.pending_downsample_sets (\n"
        "    partition int,\n"
        "    time_slot bigint,\n"
        "    tenant text,\n"
        "    series_set_hash text,\n"
        "    last_touch bigint,\n"
        "    PRIMARY KEY ((partition), time_slot, tenant, series_set_hash)\n"
        ")",
        f"CREATE TABLE IF NOT EXISTS {ks}.series_set_hashes (\n"
        "    tenant text,\n"
        "    series_set_hash text,\n"
        "    metric_name text,\n"
        "    tags map<text, text>,\n"
        "    created_ms bigint,\n"
        "    PRIMARY KEY ((tenant, series_set_hash))\n"
        ")",
        f"CREATE TABLE IF NOT EXISTS {ks}.series_sets (\n"
        "    tenant text,\n"
        "    metric_name text,\n"
        "    tag_key text,\n"
        "    tag_value text,\n"
        "    series_set_hash text,\n"
        "    PRIMARY KEY ((tenant, metric_name, tag_key, tag_value), series_set_hash)\n"
        ")",
        f"CREATE TABLE IF NOT EXISTS {ks}.tag_keys (\n"
        "    tenant text,\n"
        "    metric_name text,\n"
        "    tag_key text,\n"
        "    PRIMARY KEY ((tenant, metric_name), tag_key)\n"
        ")",
        f"CREATE TABLE IF NOT EXISTS {ks}.tag_values (\n"
        "    tenant text,\n"
        "    metric_name text,\n"
        "    tag_key text,\n"
        "    tag_value text,\n"
        "    PRIMARY KEY ((tenant, metric_name, tag_key), tag_value)\n"
        ")",
        f"CREATE TABLE IF NOT EXISTS {ks}.graphite_paths (\n"
        "    tenant text,\n"
        "    parent text,\n"
        "    name text,\n"
        "    is_leaf boolean,\n"
        "    is_branch boolean,\n"
        "    PRIMARY KEY ((tenant, parent), name)\n"
        ")",
        f"CREATE TABLE IF NOT EXISTS {ks}.tenant_tag_keys (\n"
        "    tenant text,\n"
        "    tag_key text,\n"
        "    PRIMARY KEY ((tenant), tag_key)\n"
        ")",
        f"CREATE TABLE IF NOT EXISTS {ks}.tenant_tag_values (\n"
        "    tenant text,\n"
        "    tag_key text,\n"
        "    tag_value text,\n"
        "    PRIMARY KEY ((tenant, tag_key), tag_value)\n"
        ")",
        f"CREATE TABLE IF NOT EXISTS {ks}.tag_metrics (\n"
        "    tenant text,\n"
        "    tag_key text,\n"
        "    tag_value text,\n"
        "    metric_name text,\n"
        "    PRIMARY KEY ((tenant, tag_key, tag_value), metric_name)\n"
        ")",
        f"CREATE TABLE IF NOT EXISTS {ks}.metric_metadata (\n"
        "    tenant text,\n"
        "    metric_name text,\n"
        "    type text,\n"
        "    help text,\n"
        "    unit text,\n"
        "    PRIMARY KEY ((tenant, metric_name))\n"
        ")",
        f"CREATE TABLE IF NOT EXISTS {ks}.data_raw (\n"
        "    tenant text,\n"
        "    series_set_hash text,\n"
        "    time_slot bigint,\n"
        "    ts bigint,\n"
        "    value double,\n"
        "    PRIMARY KEY ((tenant, series_set_hash, time_slot), ts)\n"
        ") WITH CLUSTERING ORDER BY (ts ASC)\n"
        f"    AND compaction = {_twcs(options.slot_width_ms)}\n"
        f"    AND default_time_to_live = {head_ttl_s}\n"
        "    AND gc_grace_seconds = 10800",
        f"CREATE TABLE IF NOT EXISTS {ks}.data_head (\n"
        "    tenant text,\n"
        "    slice bigint,\n"
        "    shard int,\n"
        "    series_set_hash text,\n"
        "    ts bigint,\n"
        "    value double,\n"
        "    PRIMARY KEY ((tenant, slice, shard), series_set_hash, ts)\n"
        ") WITH CLUSTERING ORDER BY (series_set_hash ASC, ts ASC)\n"
        f"    AND compaction = {_head_twcs(options)}\n"
        f"    AND default_time_to_live = {head_ttl_s}\n"
        "    AND gc_grace_seconds = 10800",
        f"CREATE TABLE IF NOT EXISTS {ks}.data_blocks (\n"
        "    tenant text,\n"
        "    series_set_hash text,\n"
        "    block_partition bigint,\n"
        "    time_slot bigint,\n"
        "    block blob,\n"
        "    written_at bigint,\n"
        "    head_written_at bigint,\n"
        "    sealed_at bigint,\n"
        "    PRIMARY KEY ((tenant, series_set_hash, block_partition), time_slot)\n"
        ") WITH CLUSTERING ORDER BY (time_slot ASC)\n"
        f"    AND compaction = {_twcs(window)}\n"
        f"    AND default_time_to_live = {ttl_s}\n"
        "    AND gc_grace_seconds = 10800",
        _histogram_table(ks, "histograms", window, ttl_s),
        f"CREATE TABLE IF NOT EXISTS {ks}.exemplars (\n"
        "    tenant text,\n"
        "    series_set_hash text,\n"
        "    time_slot bigint,\n"
        "    ts bigint,\n"
        "    labels text,\n"
        "    value double,\n"
        "    PRIMARY KEY ((tenant, series_set_hash, time_slot), ts, labels)\n"
        ") WITH CLUSTERING ORDER BY (ts DESC, labels ASC)\n"
        f"    AND compaction = {_twcs(_exemplar_window(options))}\n"
        f"    AND default_time_to_live = {options.layout.exemplar_retention_ms // 1000}\n"
        "    AND gc_grace_seconds = 10800",
        *(_bucket_table(options, table, column, keys) for table, column, keys in LISTINGS.values()),
        f"CREATE TABLE IF NOT EXISTS {ks}.index_state (\n    name text PRIMARY KEY,\n    value bigint\n)",
        *(_rollup_table(options, g) for g in options.layout.granularities),
        *(_histogram_rollup_table(options, g) for g in options.layout.granularities),
        _histogram_series_table(options),
    ]


def _bucket_table(options: SchemaOptions, table: str, column: str, keys: tuple[str, ...]) -> str:
    """The bucketed twin of an index table: a partition per tenant, bucket and the keys a listing is
    given, its rows the values listed. Rows carry their TTL (the tenant's raw retention past
    the bucket), so windows of whole buckets leave whole."""
    partition = ("tenant", "bucket", *keys[1:])
    columns = "".join(
        f"    {c} {'bigint' if c == 'bucket' else 'text'},\n" for c in ("tenant", "bucket", *INDEX_KEYS[table][1:])
    )
    window = compaction_window_ms(options.raw_retention_ms, INDEX_BUCKET_MS)
    return (
        f"CREATE TABLE IF NOT EXISTS {options.keyspace}.{bucket_table(table)} (\n"
        f"{columns}"
        f"    PRIMARY KEY (({', '.join(partition)}), {column})\n"
        f") WITH compaction = {_twcs(window)}\n"
        "    AND gc_grace_seconds = 10800"
    )


def _exemplar_window(options: SchemaOptions) -> int:
    return compaction_window_ms(options.layout.exemplar_retention_ms, options.slot_width_ms)


def _rollup_table(options: SchemaOptions, granularity) -> str:
    window = compaction_window_ms(granularity.retention_ms, granularity.partition_width_ms)
    return (
        f"CREATE TABLE IF NOT EXISTS {options.keyspace}.{granularity.table} (\n"
        "    tenant text,\n"
        "    series_set_hash text,\n"
        "    time_slot bigint,\n"
        "    ts bigint,\n"
        "    min double,\n"
        "    max double,\n"
        "    sum double,\n"
        "    count bigint,\n"
        "    last double,\n"
        "    increase double,\n"
        "    PRIMARY KEY ((tenant, series_set_hash, time_slot), ts)\n"
        ") WITH CLUSTERING ORDER BY (ts ASC)\n"
        f"    AND compaction = {_twcs(window)}\n"
        f"    AND default_time_to_live = {granularity.retention_ms // 1000}\n"
        "    AND gc_grace_seconds = 10800"
    )


def _histogram_table(keyspace: str, table: str, window_ms: int, ttl_s: int) -> str:
    """Native histograms (``histograms``) and their roll-ups (``histograms_5m``...): one row a
    timestamp, or an interval's start, holding protobuf bytes."""
    return (
        f"CREATE TABLE IF NOT EXISTS {keyspace}.{table} (\n"
        "    tenant text,\n"
        "    series_set_hash text,\n"
        "    time_slot bigint,\n"
        "    ts bigint,\n"
        "    data blob,\n"
        "    PRIMARY KEY ((tenant, series_set_hash, time_slot), ts)\n"
        ") WITH CLUSTERING ORDER BY (ts ASC)\n"
        f"    AND compaction = {_twcs(window_ms)}\n"
        f"    AND default_time_to_live = {ttl_s}\n"
        "    AND gc_grace_seconds = 10800"
    )


def _histogram_rollup_table(options: SchemaOptions, granularity) -> str:
    window = compaction_window_ms(granularity.retention_ms, granularity.partition_width_ms)
    return _histogram_table(options.keyspace, granularity.histogram_table, window, granularity.retention_ms // 1000)


def histogram_retention_ms(layout: Layout) -> int:
    """The longest any histogram table keeps its rows: what the histogram_series index must cover."""
    return max([layout.raw_retention_ms, *(g.retention_ms for g in layout.granularities)])


def _histogram_series_table(options: SchemaOptions) -> str:
    """Which series have rows in a partition time slot of a histogram table (``source``): reads look
    here, one partition a slot, and read only those series' histograms (float-only series cost nothing)."""
    retention = histogram_retention_ms(options.layout)
    window = compaction_window_ms(retention, options.slot_width_ms)
    return (
        f"CREATE TABLE IF NOT EXISTS {options.keyspace}.histogram_series (\n"
        "    tenant text,\n"
        "    source text,\n"
        "    time_slot bigint,\n"
        "    series_set_hash text,\n"
        "    PRIMARY KEY ((tenant, source, time_slot), series_set_hash)\n"
        ") WITH compaction = " + _twcs(window) + "\n"
        f"    AND default_time_to_live = {retention // 1000}\n"
        "    AND gc_grace_seconds = 10800"
    )


def upgrade_statements(options: SchemaOptions) -> list[str]:
    """Statements that bring existing tables to the current settings (safe to repeat)."""
    window = compaction_window_ms(options.raw_retention_ms, options.slot_width_ms)
    head_ttl_s = (options.slot_width_ms + options.layout.head_retention_ms) // 1000
    statements = [
        *(
            f"ALTER TABLE {options.keyspace}.{table}\n"
            f"    WITH compaction = {compaction}\n"
            f"    AND default_time_to_live = {head_ttl_s}"
            for table, compaction in (("data_raw", _twcs(options.slot_width_ms)), ("data_head", _head_twcs(options)))
        ),
        f"ALTER TABLE {options.keyspace}.data_blocks\n"
        f"    WITH compaction = {_twcs(window)}\n"
        f"    AND default_time_to_live = {options.raw_retention_ms // 1000}",
        f"ALTER TABLE {options.keyspace}.histograms\n"
        f"    WITH compaction = {_twcs(window)}\n"
        f"    AND default_time_to_live = {options.raw_retention_ms // 1000}",
        f"ALTER TABLE {options.keyspace}.exemplars\n"
        f"    WITH compaction = {_twcs(_exemplar_window(options))}\n"
        f"    AND default_time_to_live = {options.layout.exemplar_retention_ms // 1000}",
    ]
    for granularity in options.layout.granularities:
        window = compaction_window_ms(granularity.retention_ms, granularity.partition_width_ms)
        for table in (granularity.table, granularity.histogram_table):
            statements.append(
                f"ALTER TABLE {options.keyspace}.{table}\n"
                f"    WITH compaction = {_twcs(window)}\n"
                f"    AND default_time_to_live = {granularity.retention_ms // 1000}"
            )
    retention = histogram_retention_ms(options.layout)
    statements.append(
        f"ALTER TABLE {options.keyspace}.histogram_series\n"
        f"    WITH compaction = {_twcs(compaction_window_ms(retention, options.slot_width_ms))}\n"
        f"    AND default_time_to_live = {retention // 1000}"
    )
    return statements


def schema_text(options: SchemaOptions) -> str:
    """The readable schema file: header, keyspace, tables."""
    granularities = ", ".join(f"{g.name} kept {g.retention_ms // 1000} s" for g in options.layout.granularities)
    header = (
        "-- tsgate Cassandra schema (generated by `tsgate schema print`; do not edit by hand).\n"
        f"-- Settings: keyspace {options.keyspace}, raw retention {options.raw_retention_ms // 1000} s,"
        f" head retention {options.layout.head_retention_ms // 1000} s, slot width {options.slot_width_ms // 1000} s,"
        f" roll-ups {granularities}, exemplar retention {options.layout.exemplar_retention_ms // 1000} s.\n"
        "-- Timestamps (ts, time_slot) are milliseconds since the Unix epoch.\n"
    )
    statements = [keyspace_statement(options), *table_statements(options)]
    return header + "\n" + "".join(f"{statement};\n\n" for statement in statements).rstrip("\n") + "\n"
